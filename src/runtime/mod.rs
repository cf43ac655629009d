//! The running engine: shared state, the writer queue, the writer, the applier, recovery, the sweeper, timers. Imports the layers below.

pub(crate) mod admission;
pub(crate) mod apply;
pub(crate) mod constants;
pub(crate) mod gather;
pub(crate) mod keep_alive;
pub(crate) mod observe;
pub(crate) mod progress;
pub(crate) mod queue;
pub(crate) mod recovery;
pub(crate) mod shared;
pub(crate) mod sweep;
pub(crate) mod sweeper;
pub(crate) mod tables;
pub(crate) mod timer;
pub(crate) mod writer;
