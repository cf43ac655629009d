//! A key's record as an operator sees it (listing, export, import), and why an import
//! refused a record.

use crate::model::error::ClaimError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, SystemTime};

/// One key's record as an operator sees it (and as `export`/`import` move it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordInfo {
    /// The key.
    pub key: Vec<u8>,
    /// The scope the key lives in ([`crate::ClaimOptions::scope`]); empty: unscoped.
    #[serde(default)]
    pub scope: Vec<u8>,
    /// The fencing token of the claim that owns or completed the key.
    pub token: u64,
    /// The request fingerprint, if the claim gave one (128 bits; one whose high half is
    /// zero is a 64-bit fingerprint).
    pub fingerprint: Option<u128>,
    /// The attempt number (1 + takeovers).
    pub attempt: u32,
    /// The state.
    pub state: RecordInfoState,
    /// When the key was first claimed (kept across takeovers and fails, to the
    /// millisecond); `None`: unknown (a record written by the first file format).
    #[serde(default)]
    pub first_claimed_at: Option<SystemTime>,
}

impl RecordInfo {
    /// A short name of the state: `inflight`, `completing` or `completed`.
    pub fn state_name(&self) -> &'static str {
        match &self.state {
            RecordInfoState::InFlight { .. } => "inflight",
            RecordInfoState::Completed {
                published: false, ..
            } => "completing",
            RecordInfoState::Completed { .. } => "completed",
        }
    }
}

/// The state part of a [`RecordInfo`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RecordInfoState {
    /// Claimed, not completed.
    InFlight {
        /// Wall-clock end of the lease (stored rounded up to the millisecond, so never
        /// before the real end): when it ends, or for a lease that is over, when it ended.
        lease_deadline: SystemTime,
        /// The saved checkpoint: phase and payload.
        checkpoint: Option<(u32, Vec<u8>)>,
        /// When the current attempt started (to the millisecond); `None`: unknown.
        #[serde(default)]
        attempt_started_at: Option<SystemTime>,
        /// The holder ended the attempt with `Lease::fail`: the lease is over, the
        /// progress kept, and the next claim takes the key over at once.
        #[serde(default)]
        failed: bool,
        /// The lease length the holder was given (whole milliseconds): its claim's, or its
        /// last extension's or renewal's; it caps the lease `Recovery::HonourLeases`
        /// honours. `None`: unknown (a record of an older format, or an export without
        /// it): the engine's lease.
        #[serde(default)]
        lease: Option<Duration>,
        /// The claim identity the holder presented ([`crate::ClaimOptions::claim_id`]).
        #[serde(default)]
        claim_id: Option<u128>,
    },
    /// Completed (a completion not yet durable is listed too, as `published: false`).
    Completed {
        /// The stored response.
        response: Vec<u8>,
        /// Wall-clock end of retention (stored to the millisecond).
        expires_at: SystemTime,
        /// Whether the completion is durable and replayed to other callers.
        published: bool,
    },
}

/// Why [`crate::admin::Admin::import`] refused a record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImportError {
    /// The key already has a live record in this engine; nothing changed.
    KeyExists,
    /// The record's token is not above every token this engine issued, so importing it
    /// would break fencing. Import into a fresh file, in token order.
    TokenTooSmall {
        /// The record's token.
        token: u64,
        /// The smallest token accepted now.
        min: u64,
    },
    /// The record is malformed (empty key, a completion not yet durable, oversized parts).
    Invalid(String),
    /// The claim-side checks refused it (closed, poisoned, overloaded).
    Engine(ClaimError),
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::KeyExists => f.write_str("the key already has a live record"),
            ImportError::TokenTooSmall { token, min } => write!(
                f,
                "token {token} is below {min}, the next token of this engine; import into a fresh file in token order"
            ),
            ImportError::Invalid(why) => write!(f, "invalid record: {why}"),
            ImportError::Engine(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ImportError {}
