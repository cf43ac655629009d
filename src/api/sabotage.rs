//! Switches that break the engine on purpose, so that a checker can prove it catches the
//! bug, and hooks that reach behind the engine's back (hold the writer before a commit,
//! damage or read a stored record, panic the writer, lose a record). Compiled only with
//! `--cfg idemkv_sabotage` (set through RUSTFLAGS by the commands in `docs/testing.md`), so
//! no feature of a user's build can turn them on; hidden from the documentation.

use crate::api::engine::Engine;
use crate::api::options::EngineBuilder;
use crate::base::sabotage::CommitGate;
use crate::model::error::ClaimError;
use std::time::{Duration, Instant};

pub use crate::base::sabotage::Sabotage;

/// Switches a deliberate bug on in a running engine (off with `None`).
/// [`Sabotage::SkipTokenHwm`] acts only when armed on the builder ([`arm`]).
pub fn switch(engine: &Engine, bug: Option<Sabotage>) {
    engine.shared().faults().switch(bug);
}

/// The builder with a deliberate bug switched on from the start, so that it also acts
/// during the open (the first commit writes the token mark).
pub fn arm(mut builder: EngineBuilder, bug: Option<Sabotage>) -> EngineBuilder {
    builder.sabotage = bug.map_or(0, |b| b as u8);
    builder
}

impl Engine {
    /// Holds the writer before its next commit until the returned guard is dropped: the
    /// window between a call queueing its write and the write being durable, made as long
    /// as a test needs. Drop the guard before closing the engine (`close` waits for the
    /// writer).
    #[doc(hidden)]
    pub fn hold_commits(&self) -> HeldCommits {
        self.shared().faults().commit_gate.close();
        HeldCommits(self.clone(), Gate::Commit)
    }

    /// Holds the writer after its next commit (with the commit log, its next frame's
    /// sync), before it moves its watermarks, until the returned guard is dropped: the
    /// batch is durable and nobody has been told, and the writer's cycle lasts as long as a
    /// test needs (on a mock clock, as far as the test advances it).
    #[doc(hidden)]
    pub fn hold_after_commits(&self) -> HeldCommits {
        self.shared().faults().after_commit_gate.close();
        HeldCommits(self.clone(), Gate::AfterCommit)
    }

    /// Overwrites the stored value of the record under `token` with `damage` applied to its
    /// raw bytes, bypassing the encoder (as bit rot would). The index is left as it is.
    /// Returns false if the file holds no record under `token`.
    #[doc(hidden)]
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
    /// file), read and verified as a replay reads it.
    #[doc(hidden)]
    pub fn committed_record(&self, token: u64) -> Result<Option<CommittedRecord>, String> {
        let Some(store) = self.shared().store() else {
            return Ok(None);
        };
        let Some(record) = store.get(token)? else {
            return Ok(None);
        };
        let record = record.map_err(|e| format!("record under token {token}: {e}"))?;
        let key = record.key.key().to_vec();
        Ok(Some(match record.state {
            crate::model::codec::RecordState::InFlight { attempt, .. } => {
                CommittedRecord::InFlight { key, attempt }
            }
            crate::model::codec::RecordState::Completed { response, .. } => {
                CommittedRecord::Completed {
                    key,
                    response: response.0.to_vec(),
                }
            }
        }))
    }
}

/// Where the writer is held.
#[derive(Debug, Clone, Copy)]
enum Gate {
    /// Before its next commit.
    Commit,
    /// After its next commit, before moving its watermarks.
    AfterCommit,
}

/// The writer is held at a gate until this is dropped.
#[must_use = "the writer is released when this guard is dropped"]
pub struct HeldCommits(Engine, Gate);

impl HeldCommits {
    fn gate(&self) -> &CommitGate {
        let faults = self.0.shared().faults();
        match self.1 {
            Gate::Commit => &faults.commit_gate,
            Gate::AfterCommit => &faults.after_commit_gate,
        }
    }

    /// Waits until a commit is held at the gate, at most `limit` of real time (a safety net
    /// for a writer that never commits); returns whether one is.
    pub fn wait_until_held(&self, limit: Duration) -> bool {
        self.gate().wait_until_held(Instant::now() + limit)
    }
}

impl Drop for HeldCommits {
    fn drop(&mut self) {
        self.gate().open();
    }
}

impl crate::api::lease::Busy {
    /// Whether the holder has completed and the engine is making the completion durable
    /// (what a held commit shows a loser).
    #[doc(hidden)]
    pub fn completing(&self) -> bool {
        self.completing
    }
}
