//! The bottom layer: time and clocks, the sync shim, limits. Imports nothing from the crate.

pub(crate) mod clock;
pub(crate) mod hash;
pub(crate) mod limits;
pub(crate) mod sabotage;
pub(crate) mod sync;
