//! The testing kit (feature `testkit`): switches that break the engine on purpose, so that
//! a checker can prove it catches the bug; the machinery of the fuzz targets and model tests
//! (operation types, the sequential spec, a history recorder and a linearizability checker,
//! a simulated disk that fails or loses power at any I/O); and helpers for users' own tests
//! ([`duplicates()`]: run duplicate deliveries of one message at once and count the side
//! effects). `docs/testing.md` explains each part.

use crate::engine::{Engine, Sabotage};
use crate::error::ClaimError;
use crate::options::EngineBuilder;
use crate::sync::Ordering;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    /// The writer acknowledges a batch before its commit returns (a crash then loses an
    /// acknowledged call).
    AckBeforeCommit,
    /// The writer publishes a batch's completions before its commit returns (another caller
    /// can be shown a completion a crash still erases).
    PublishBeforeCommit,
    /// Commits leave the token high-water mark out of the file (tokens issued but never
    /// written are issued again after a crash). Arm it with [`EngineBuilder::sabotage`]:
    /// the mark is first written when the file is opened.
    SkipTokenHwm,
    /// A write that replaces a key's record (a takeover, a claim of an expired key) leaves
    /// the previous record in the file, where it comes back after a restart.
    DropOldRemoval,
    /// A replay reads the stored response without checking its checksum.
    SkipReplayChecksum,
}

impl Bug {
    /// Every bug (not [`Bug::None`]).
    pub const ALL: [Bug; 7] = [
        Bug::CheckThenAct,
        Bug::NoFencing,
        Bug::AckBeforeCommit,
        Bug::PublishBeforeCommit,
        Bug::SkipTokenHwm,
        Bug::DropOldRemoval,
        Bug::SkipReplayChecksum,
    ];

    fn code(self) -> u8 {
        let s = match self {
            Bug::None => return 0,
            Bug::CheckThenAct => Sabotage::CheckThenAct,
            Bug::NoFencing => Sabotage::NoFencing,
            Bug::AckBeforeCommit => Sabotage::AckBeforeCommit,
            Bug::PublishBeforeCommit => Sabotage::PublishBeforeCommit,
            Bug::SkipTokenHwm => Sabotage::SkipTokenHwm,
            Bug::DropOldRemoval => Sabotage::DropOldRemoval,
            Bug::SkipReplayChecksum => Sabotage::SkipReplayChecksum,
        };
        s as u8
    }
}

impl Engine {
    /// Switches a deliberate bug on (or off with [`Bug::None`]). Test builds only.
    /// [`Bug::SkipTokenHwm`] acts only when armed on the builder ([`EngineBuilder::sabotage`]).
    pub fn sabotage(&self, bug: Bug) {
        self.shared().sabotage.store(bug.code(), Ordering::Relaxed);
    }

    /// Holds the writer before its next commit until the returned guard is dropped: the
    /// window between a call queueing its write and the write being durable, made as long
    /// as a test needs. Drop the guard before closing the engine (`close` waits for the
    /// writer). Test builds only.
    pub fn hold_commits(&self) -> HeldCommits {
        self.shared().commit_gate.close();
        HeldCommits(self.clone())
    }

    /// Overwrites the stored value of the record under `token` with `damage` applied to its
    /// raw bytes, bypassing the encoder (as bit rot would). The index is left as it is.
    /// Returns false if the file holds no record under `token`. Test builds only.
    pub fn damage_stored_value(
        &self,
        token: u64,
        damage: impl FnOnce(&mut Vec<u8>),
    ) -> Result<bool, ClaimError> {
        let store = self.shared().store().ok_or(ClaimError::Closed)?;
        store
            .damage(token, damage)
            .map_err(|why| ClaimError::Corrupted(why.into()))
    }
}

/// A record as the engine's file holds it now: committed, so a crash now keeps it (commits
/// are fsynced before they become visible). See [`Engine::committed_record`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommittedRecord {
    /// An InFlight record.
    InFlight {
        /// The key.
        key: Vec<u8>,
        /// The attempt.
        attempt: u32,
    },
    /// A completion.
    Completed {
        /// The key.
        key: Vec<u8>,
        /// The stored response.
        response: Vec<u8>,
    },
}

impl Engine {
    /// The committed record under `token` (`None`: there is none, or the engine has no
    /// file), read and verified as a replay reads it. Test builds only.
    pub fn committed_record(&self, token: u64) -> Result<Option<CommittedRecord>, String> {
        let Some(store) = self.shared().store() else {
            return Ok(None);
        };
        let Some(record) = store.get(token)? else {
            return Ok(None);
        };
        let record = record.map_err(|e| format!("record under token {token}: {e}"))?;
        let key = record.key.0.to_vec();
        Ok(Some(match record.state {
            crate::codec::RecordState::InFlight { attempt, .. } => {
                CommittedRecord::InFlight { key, attempt }
            }
            crate::codec::RecordState::Completed { response, .. } => CommittedRecord::Completed {
                key,
                response: response.0.to_vec(),
            },
        }))
    }
}

impl EngineBuilder {
    /// Opens the engine with a deliberate bug switched on from the start, so that it also
    /// acts during the open (the first commit writes the token mark). Test builds only.
    pub fn sabotage(mut self, bug: Bug) -> Self {
        self.sabotage = bug.code();
        self
    }
}

/// Holds the writer before its next commit while closed (see [`Engine::hold_commits`]).
/// It uses std's lock even in model-checking builds: no shuttle test closes it.
#[derive(Debug, Default)]
pub(crate) struct CommitGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    /// Commits waiting at the gate now.
    held: usize,
}

impl CommitGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn close(&self) {
        self.lock().closed = true;
    }

    fn open(&self) {
        self.lock().closed = false;
        self.changed.notify_all();
    }

    /// Called by the writer before each commit: waits while the gate is closed.
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

/// The writer is held before its next commit until this is dropped.
#[must_use = "the writer is released when this guard is dropped"]
pub struct HeldCommits(Engine);

impl HeldCommits {
    /// Waits until a commit is held at the gate, at most `limit` of real time (a safety net
    /// for a writer that never commits); returns whether one is.
    pub fn wait_until_held(&self, limit: Duration) -> bool {
        let gate = &self.0.shared().commit_gate;
        let deadline = Instant::now() + limit;
        let mut s = gate.lock();
        while s.held == 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            s = gate
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

impl Drop for HeldCommits {
    fn drop(&mut self) {
        self.0.shared().commit_gate.open();
    }
}
