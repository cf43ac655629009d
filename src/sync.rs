//! The only module that names lock and atomic types. A model-checking build swaps these for
//! shuttle's or loom's in one place.

pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(feature = "testkit")]
pub(crate) use std::sync::atomic::AtomicU8;
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
pub(crate) use std::sync::{Arc, Weak};
