//! The testing kit (feature `testkit`): switches that break the engine on purpose, so that
//! a checker can prove it catches the bug, and helpers for users' own tests.

use crate::engine::{Engine, Sabotage};
use crate::sync::Ordering;

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
