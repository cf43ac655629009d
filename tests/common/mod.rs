//! Helpers shared by the integration tests (each test file that needs them declares
//! `mod common;`). Every file uses its own subset, so the unused rest is allowed.
#![allow(dead_code)]

use idemkv::{Durability, Engine, MockClock};
use idemkv_check::fixture;
use std::path::Path;
use std::time::Duration;

/// An engine on a [`MockClock`] in one durability mode, with a temporary file for the
/// durable ones and no background sweeps: time moves only when a test moves it.
pub struct MockEngine {
    pub engine: Engine,
    pub clock: MockClock,
    pub mode: Durability,
    _dir: Option<tempfile::TempDir>,
}

impl MockEngine {
    /// Opens one in `mode`, with `lease` as the engine's lease.
    pub fn open(mode: Durability, lease: Duration) -> MockEngine {
        let clock = MockClock::new();
        let dir = (mode != Durability::None).then(|| tempfile::tempdir().unwrap());
        let path = dir.as_ref().map(|d| d.path().join("engine.redb"));
        let builder = fixture::builder(path.as_deref().unwrap_or(Path::new("")), &clock, mode);
        MockEngine {
            engine: fixture::open_builder(builder.lease(lease)),
            clock,
            mode,
            _dir: dir,
        }
    }

    /// Runs `f` on a fresh engine in each durability mode.
    pub fn each_mode(lease: Duration, f: impl Fn(&MockEngine)) {
        for mode in idemkv_check::modes() {
            f(&MockEngine::open(mode, lease));
        }
    }
}
