//! The testing kit (feature `testkit`): switches that break the engine on purpose, so that
//! a checker can prove it catches the bug; the machinery of the fuzz targets and model tests
//! (operation types, the sequential spec, a history recorder and a linearizability checker,
//! a simulated disk that fails or loses power at any I/O); and helpers for users' own tests
//! ([`duplicates()`]: run duplicate deliveries of one message at once and count the side
//! effects). `docs/testing.md` explains each part.

use crate::engine::{Engine, Sabotage};
use crate::sync::Ordering;

pub mod concurrent;
pub mod disk;
pub mod duplicates;
pub mod faults;
pub mod history;
pub mod linearizability;
pub mod ops;
pub mod spec;
pub mod stress;

pub use self::duplicates::{duplicates, CopyOutcome, DuplicateReport, Duplicates, Pattern};

/// The retry hint the engine gives while a completion is not yet durable.
pub(crate) const RETRY_AFTER_UNPUBLISHED: std::time::Duration =
    crate::constants::RETRY_AFTER_UNPUBLISHED;

/// A bug to switch on in an engine, for proving that a checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Bug {
    /// No bug: the engine as shipped.
    None,
    /// Claims check, drop the lock, then insert: the check-then-act race.
    CheckThenAct,
    /// `complete` skips the fencing-token comparison.
    NoFencing,
}

impl Engine {
    /// Switches a deliberate bug on (or off with [`Bug::None`]). Test builds only.
    pub fn sabotage(&self, bug: Bug) {
        let code = match bug {
            Bug::None => 0,
            Bug::CheckThenAct => Sabotage::CheckThenAct as u8,
            Bug::NoFencing => Sabotage::NoFencing as u8,
        };
        self.shared().sabotage.store(code, Ordering::Relaxed);
    }
}
