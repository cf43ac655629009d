//! Test-only switches: the bugs a test can switch on to prove that the checkers catch them,
//! and the gate that holds the writer at one point of its cycle. The enum exists in every
//! build (each check of one compiles to `false` without `--cfg idemkv_sabotage`); the gate
//! only in a sabotage build.

#[cfg(idemkv_sabotage)]
use std::sync::{Condvar, Mutex, PoisonError};

/// Bugs a test can switch on, to prove that the checkers catch them. Each one breaks a
/// promise the engine makes (docs/testing.md, "Teeth"). Only a build with
/// `--cfg idemkv_sabotage` can switch one on (`sabotage::switch`); in any other build every
/// check of one compiles to `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(idemkv_sabotage), allow(dead_code))]
pub enum Sabotage {
    /// Claims look the key up, drop the lock, then insert: check-then-act.
    CheckThenAct = 1,
    /// `complete` does not compare tokens.
    NoFencing = 2,
    /// The writer acknowledges a batch before its commit returns.
    AckBeforeCommit = 3,
    /// The writer shows a batch's completions (a watermark every stripe lock reads) before
    /// its commit returns.
    PublishBeforeCommit = 4,
    /// Commits never write the token high-water mark (the engine believes they did).
    SkipTokenHwm = 5,
    /// A write that replaces a key's record leaves the previous record in the file.
    DropOldRemoval = 6,
    /// A replay decodes the stored record without checking its checksum.
    SkipReplayChecksum = 7,
    /// With the commit log, the writer acknowledges a batch as applied (a flush's barrier
    /// alone), or commits to the file itself, without waiting for the applier to apply the
    /// batches handed to it before.
    SkipApplierDrain = 8,
    /// A keep-alive renewal extends whoever holds the key now, not the lease it was
    /// registered for.
    RenewCurrentHolder = 9,
    /// `Outbox::mark_sent` returns under `Immediate` before the removal is durable.
    MarkSentBeforeDurable = 10,
}

/// Holds the writer at one point of its cycle while closed (see `Engine::hold_commits`,
/// `Engine::hold_after_commits`).
/// It uses std's lock even in model-checking builds: no shuttle test closes it.
#[derive(Debug, Default)]
#[cfg(idemkv_sabotage)]
pub(crate) struct CommitGate {
    state: Mutex<GateState>,
    pub(crate) changed: Condvar,
}

#[derive(Debug, Default)]
#[cfg(idemkv_sabotage)]
pub(crate) struct GateState {
    pub(crate) closed: bool,
    /// Commits waiting at the gate now.
    pub(crate) held: usize,
}

#[cfg(idemkv_sabotage)]
impl CommitGate {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn close(&self) {
        self.lock().closed = true;
    }

    pub(crate) fn open(&self) {
        self.lock().closed = false;
        self.changed.notify_all();
    }

    /// Called by the writer at the gate's point of each cycle: waits while it is closed.
    pub(crate) fn pass(&self) {
        let mut s = self.lock();
        if !s.closed {
            return;
        }
        s.held += 1;
        self.changed.notify_all();
        while s.closed {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.held -= 1;
    }
}
