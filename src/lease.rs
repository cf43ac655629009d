//! What a claim returns: the lease of a winner, the stored response of a replay, the
//! "in progress" answer of a loser, or the "completed, response no longer kept" answer of a
//! late duplicate.

use crate::codec::Checkpoint;
use crate::engine::Engine;
use crate::error::LeaseError;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The answer to a claim.
///
/// Exhaustive on purpose: a key is Absent, InFlight or Completed (or, with markers, was
/// completed and its response is no longer kept), and a claim answers with one of the
/// outcomes of that state machine. A new answer would change what every caller must do, so
/// it would be a breaking change whether or not a wildcard arm compiled.
#[derive(Debug)]
#[must_use = "an Acquired lease is released when dropped; complete it"]
pub enum Claim {
    /// The caller owns the key: do the work, then [`Lease::complete`] it.
    Acquired(Lease),
    /// Another holder's lease is live (or its completion is not yet durable).
    InProgress(Busy),
    /// The key was completed: here is the stored response.
    Completed(Stored),
    /// The key was completed, but its retention ended and its response is no longer kept:
    /// only a marker of the completion is (`EngineBuilder::marker_retention`). The work must
    /// not run again; a caller that really wants it to asks with
    /// [`crate::ClaimOptions::rerun_forgotten`].
    Forgotten(Forgotten),
}

/// The exclusive right to act for one key, fenced by a token. Dropping a lease on which
/// neither `complete` nor `release` was called releases it (a retryable failure: the work
/// was abandoned, e.g. the handler panicked), so the next caller can run it at once. Once
/// `complete` was called the lease never releases the key, even if the completion was
/// refused (see [`Lease::complete`]).
pub struct Lease {
    pub(crate) engine: Engine,
    pub(crate) key: Box<[u8]>,
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    pub(crate) checkpoint: Option<Checkpoint>,
    /// The lease length it was claimed with (what a keep-alive renews by).
    pub(crate) lease: Duration,
    pub(crate) settled: bool,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("token", &self.token)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl Lease {
    /// The fencing token: strictly larger than every token issued before it. Pass it to
    /// downstream systems so they can refuse writes from a superseded holder.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// 1 for a fresh claim; one more for each takeover of the key.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The key this lease is for.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The checkpoint a previous holder saved, if this claim took over its key.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// Stores `response` as the key's outcome. Under `Immediate` it returns once durable.
    ///
    /// While the writer queue is full the call waits for room as long as the lease lasts.
    /// Whatever the result, the consumed lease does **not** release the key: the work is
    /// done, and releasing would let a waiting caller run it again. If the engine refused
    /// the response (`ResponseTooLarge`, or `Overloaded` because the queue stayed full until
    /// the lease ended), the key stays InFlight under [`Lease::token`] until the lease ends:
    /// other callers see `InProgress` until then, and the first claim after it takes the key
    /// over (attempt + 1). Within the lease [`crate::Engine::complete`] (a response that
    /// fits) or [`crate::Engine::release`] with the token still settle it.
    pub fn complete(self, response: &[u8]) -> Result<(), LeaseError> {
        self.complete_arc(Arc::from(response))
    }

    /// Like [`Lease::complete`], sharing the caller's bytes.
    pub(crate) fn complete_arc(mut self, response: Arc<[u8]>) -> Result<(), LeaseError> {
        // Settled whatever happens: a refused completion keeps the key until the lease ends.
        self.settled = true;
        self.engine.complete_arc(&self.key, self.token, response)
    }

    /// Lets the lease go on purpose **without** releasing the key, as if its holder had
    /// crashed: the key stays InFlight under this token until the lease ends, then the first
    /// claim takes it over (attempt + 1, checkpoint kept). Unlike `std::mem::forget`, the
    /// lease's handle on the engine is dropped, so closing the engine still closes the file.
    ///
    /// The returned [`Detached`] keeps what is needed to settle the key later from anywhere
    /// that holds the engine ([`crate::Engine::complete`], [`crate::Engine::release`] and
    /// [`crate::Engine::extend`] take the key and token), e.g. after handing the work to
    /// another thread or process step.
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine, KeyState};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let Claim::Acquired(lease) = engine.claim(b"k", &ClaimOptions::default())? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// let detached = lease.detach();
    /// assert!(matches!(engine.get(b"k")?, Some(KeyState::InFlight { .. })));
    /// engine.complete(detached.key(), detached.token(), b"done")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn detach(mut self) -> Detached {
        self.settled = true;
        Detached {
            key: std::mem::take(&mut self.key),
            token: self.token,
            attempt: self.attempt,
        }
    }

    /// Gives the key up after a retryable failure: it becomes Absent, and the next claim
    /// (or a waiting caller) acquires it. Returns whether this lease still owned the key.
    pub fn release(mut self) -> Result<bool, LeaseError> {
        self.settled = true;
        self.engine.release(&self.key, self.token)
    }

    /// Sets the lease to end `lease` from now (zero and very large values are valid).
    pub fn extend(&self, lease: Duration) -> Result<(), LeaseError> {
        self.engine.extend(&self.key, self.token, lease)
    }

    /// Saves progress so that a takeover after a crash or expiry can resume from it.
    pub fn set_checkpoint(&mut self, phase: u32, data: &[u8]) -> Result<(), LeaseError> {
        self.engine.checkpoint(&self.key, self.token, phase, data)?;
        self.checkpoint = Some(Checkpoint::new(phase, data));
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.settled {
            self.engine.release_on_drop(&self.key, self.token);
        }
    }
}

/// What remains of a lease let go with [`Lease::detach`]: the key and the fencing token
/// that still own it until the lease ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached {
    key: Box<[u8]>,
    token: u64,
    attempt: u32,
}

impl Detached {
    /// The key the lease was for.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The lease's fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lease's attempt number.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// The answer to a loser while the winner still works.
#[derive(Debug, Clone)]
pub struct Busy {
    pub(crate) retry_after: Duration,
    pub(crate) attempt: u32,
    /// The holder has completed; the engine is making it durable and will wake waiters.
    pub(crate) completing: bool,
}

impl Busy {
    /// How long until the holder's lease ends (or a short time, if its completion is being
    /// made durable). Retry then, or use `claim_or_wait`.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// The holder's attempt number.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// A completed key's stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    pub(crate) response: Arc<[u8]>,
    pub(crate) token: u64,
    pub(crate) attempt: u32,
}

impl Stored {
    /// The response bytes the winner stored.
    pub fn response(&self) -> &[u8] {
        &self.response
    }

    /// The token of the claim that completed the key.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The attempt that completed the key.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// A late duplicate's answer: the key was completed at [`Forgotten::completed_at`], and its
/// response is no longer kept (docs/retention.md, "Markers: the second tier").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forgotten {
    pub(crate) completed_wall_ms: u64,
    pub(crate) attempt: u32,
    pub(crate) kept_until_wall_ms: u64,
}

impl Forgotten {
    /// When the key was completed (wall clock, to the millisecond). Zero (the epoch) for a
    /// completion whose record did not say.
    pub fn completed_at(&self) -> SystemTime {
        crate::clock::wall_time(self.completed_wall_ms)
    }

    /// The attempt that completed the key.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the marker ends: from then on the key is new and a claim runs it again.
    pub fn kept_until(&self) -> SystemTime {
        crate::clock::wall_time(self.kept_until_wall_ms)
    }
}

impl fmt::Display for Forgotten {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the key was completed at {} ms since the epoch (attempt {}); its response is no \
             longer kept",
            self.completed_wall_ms, self.attempt
        )
    }
}

/// What [`Engine::run`] hands back to every caller of a key: the same bytes, and whether
/// they are a replay of someone else's run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub(crate) response: Arc<[u8]>,
    pub(crate) replayed: bool,
    pub(crate) token: u64,
}

impl Outcome {
    /// The winner's own outcome.
    pub(crate) fn fresh(response: Arc<[u8]>, token: u64) -> Self {
        Outcome {
            response,
            replayed: false,
            token,
        }
    }

    /// Another caller's stored outcome.
    pub(crate) fn replay(stored: Stored) -> Self {
        Outcome {
            response: stored.response,
            replayed: true,
            token: stored.token,
        }
    }
}

impl Outcome {
    /// The response bytes, identical for every caller of the key.
    pub fn response(&self) -> &[u8] {
        &self.response
    }

    /// False for the caller whose handler ran; true for everyone who got its result.
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// The token of the claim whose handler produced the response.
    pub fn token(&self) -> u64 {
        self.token
    }
}

/// What [`Engine::run_typed`] hands back: the value, and whether it is a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedOutcome<T> {
    /// The handler's value (decoded from storage for a replay).
    pub value: T,
    /// False for the caller whose handler ran.
    pub replayed: bool,
}

/// A key's visible state, as [`Engine::get`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyState {
    /// A holder owns the key.
    InFlight {
        /// Its token.
        token: u64,
        /// Its attempt.
        attempt: u32,
        /// Time left on its lease (zero: it can be taken over).
        lease_remaining: Duration,
        /// The latest checkpoint saved for the key.
        checkpoint: Option<Checkpoint>,
    },
    /// A completion is written but not yet durable; it is not replayed until it is.
    Completing {
        /// The completing token.
        token: u64,
    },
    /// The key is completed.
    Completed {
        /// The completing token.
        token: u64,
        /// The completing attempt.
        attempt: u32,
        /// The stored response.
        response: Arc<[u8]>,
        /// Wall-clock end of retention (stored to the millisecond).
        expires_at: SystemTime,
    },
}
