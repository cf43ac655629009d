//! The answers a claim gives besides a lease: "in progress" ([`Busy`]), the stored
//! response of a replay ([`Stored`]), and "completed, response no longer kept"
//! ([`Forgotten`]); and a key's state as a read reports it ([`KeyState`]). Plain values:
//! the state machine makes them, the API hands them out.

use crate::base::clock::wall_time;
use crate::model::codec::Checkpoint;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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
    /// Wall-clock end of retention, ms since the epoch.
    pub(crate) expires_wall_ms: u64,
}

impl Stored {
    /// The response bytes the winner stored.
    pub fn response(&self) -> &[u8] {
        &self.response
    }

    /// The token of the claim that completed the key (unique and increasing, not dense: see
    /// [`Lease::token`](crate::Lease::token); never an identifier).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The attempt that completed the key.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the key stops being remembered (wall clock, stored to the millisecond): the
    /// completion's instant plus the retention in effect for the key (the completion's own,
    /// else its claim's, else the engine's; an imported record keeps its own), rounded up to
    /// the next whole millisecond, so never before the exact end. From then on
    /// a claim of the key acquires it afresh. The same instant whether the response is
    /// replayed from memory or from the file, before or after a restart.
    pub fn expires_at(&self) -> SystemTime {
        wall_time(self.expires_wall_ms)
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
        crate::base::clock::wall_time(self.completed_wall_ms)
    }

    /// The attempt that completed the key.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the marker ends: from then on the key is new and a claim runs it again.
    pub fn kept_until(&self) -> SystemTime {
        crate::base::clock::wall_time(self.kept_until_wall_ms)
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

/// A key's visible state, as [`Engine::get`](crate::Engine::get) reports it.
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
        /// When the key was first claimed (kept across takeovers and fails); `None`:
        /// unknown (a record of the first file format).
        first_claimed_at: Option<SystemTime>,
        /// When the current attempt started; `None`: unknown.
        attempt_started_at: Option<SystemTime>,
        /// The holder failed the attempt ([`Lease::fail`](crate::Lease::fail)): the lease is over, the
        /// progress kept, and the next claim takes the key over at once.
        failed: bool,
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
