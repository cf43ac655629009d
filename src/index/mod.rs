//! The in-memory index: stripes, expiry order, publication, wake-ups, counters. Imports `base`, `model` and `store` types only; does no I/O.

pub(crate) mod constants;
mod expiry;
pub(crate) mod key;
pub(crate) mod metrics;
pub(crate) mod publication;
pub(crate) mod shard;
pub(crate) mod stats;
pub(crate) mod stripes;
pub(crate) mod wake;
