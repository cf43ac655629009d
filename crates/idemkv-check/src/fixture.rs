//! The engines and leases the integration tests of both crates start from, written once:
//! a test states only what it sets beyond them.

use idemkv::{Claim, ClaimOptions, Durability, Engine, EngineBuilder, Lease, MockClock};
use std::path::Path;

/// A builder on `clock` in `mode` with no background sweeps (time moves, and sweeps
/// happen, only when the test says so), on the file at `path` unless `mode` is memory only
/// (which refuses a path).
pub fn builder(path: &Path, clock: &MockClock, mode: Durability) -> EngineBuilder {
    let builder = Engine::builder()
        .durability(mode)
        .clock(clock.clone())
        .tuning(idemkv::Tuning::default().sweep_interval(None));
    match mode {
        Durability::None => builder,
        _ => builder.path(path),
    }
}

/// [`builder`] on a file in the default (`Immediate`) mode, opened.
///
/// # Panics
/// If the engine does not open: the test's set-up failed.
pub fn open(path: &Path, clock: &MockClock) -> Engine {
    open_builder(builder(path, clock, Durability::Immediate))
}

/// Opens `builder`, naming the error if it fails.
///
/// # Panics
/// If the engine does not open: the test's set-up failed.
pub fn open_builder(builder: EngineBuilder) -> Engine {
    builder
        .open()
        .unwrap_or_else(|e| panic!("the test's engine must open: {e}"))
}

/// Claims `key`, which the test expects to be free, and returns its lease.
///
/// # Panics
/// If the claim fails or the key is not acquired.
pub fn acquire(engine: &Engine, key: &[u8], opts: &ClaimOptions) -> Lease {
    match engine.claim(key, opts) {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!(
            "{} must be acquired: {other:?}",
            String::from_utf8_lossy(key)
        ),
    }
}
