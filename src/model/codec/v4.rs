//! The records of format version 4: varint integers (bincode's `standard` config), and
//! wall-clock instants as deltas where that pays. `first_claimed_wall_ms` is the record's
//! one absolute instant (8 bytes LE: a varint of a ms timestamp takes 9); every other
//! instant is the wrapping difference from an earlier one, zigzag-encoded (a wall clock may
//! step back), so every `u64` round-trips exactly:
//! - completed: from first claimed; expires: from completed (the retention);
//! - attempt started: from first claimed; lease deadline: from attempt started.
//!
//! The head's fields are a prefix of the record's (the response comes last), so recovery
//! decodes the head from the same bytes.

use super::{Blob, Checkpoint, HeadState, KeyBuf, Record, RecordHead, RecordKey, RecordState};
use serde::{Deserialize, Serialize};

/// `to - from` as a zigzag-encoded signed delta.
fn delta(from: u64, to: u64) -> i64 {
    to.wrapping_sub(from) as i64
}

/// The instant `delta` after `from` (the inverse of [`delta`]).
fn after(from: u64, delta: i64) -> u64 {
    from.wrapping_add(delta as u64)
}

/// An InFlight state's instants from its deltas: the attempt's start is relative to the
/// first claim, the lease deadline to the attempt's start (as `R4` writes them).
/// Returns `(attempt_started_wall_ms, lease_deadline_wall_ms)`.
fn attempt_instants(first: u64, started_delta_ms: i64, deadline_delta_ms: i64) -> (u64, u64) {
    let started = after(first, started_delta_ms);
    (started, after(started, deadline_delta_ms))
}

/// A completion's instants from its deltas: the completion is relative to the first
/// claim, the expiry to the completion. Returns `(completed_wall_ms, expires_wall_ms)`.
fn completion_instants(first: u64, completed_delta_ms: i64, expires_delta_ms: i64) -> (u64, u64) {
    let completed = after(first, completed_delta_ms);
    (completed, after(completed, expires_delta_ms))
}

#[derive(Serialize)]
pub(super) struct R4<'a> {
    key: &'a RecordKey,
    fingerprint: Option<u128>,
    first_claimed_wall_ms: [u8; 8],
    retention_ms: Option<u64>,
    state: S4<'a>,
}

#[derive(Serialize)]
enum S4<'a> {
    InFlight {
        lease_deadline_delta_ms: i64,
        attempt: u32,
        attempt_started_delta_ms: i64,
        failed: bool,
        checkpoint: &'a Option<Checkpoint>,
        lease_ms: Option<u64>,
        claim_id: Option<u128>,
    },
    Completed {
        attempt: u32,
        completed_delta_ms: i64,
        expires_delta_ms: i64,
        response: &'a Blob,
    },
}

impl<'a> From<&'a Record> for R4<'a> {
    fn from(r: &'a Record) -> Self {
        let first = r.first_claimed_wall_ms;
        let state = match &r.state {
            RecordState::InFlight {
                lease_deadline_wall_ms,
                attempt,
                attempt_started_wall_ms,
                failed,
                checkpoint,
                lease_ms,
                claim_id,
            } => S4::InFlight {
                lease_deadline_delta_ms: delta(*attempt_started_wall_ms, *lease_deadline_wall_ms),
                attempt: *attempt,
                attempt_started_delta_ms: delta(first, *attempt_started_wall_ms),
                failed: *failed,
                checkpoint,
                lease_ms: *lease_ms,
                claim_id: *claim_id,
            },
            RecordState::Completed {
                attempt,
                completed_wall_ms,
                expires_wall_ms,
                response,
            } => S4::Completed {
                attempt: *attempt,
                completed_delta_ms: delta(first, *completed_wall_ms),
                expires_delta_ms: delta(*completed_wall_ms, *expires_wall_ms),
                response,
            },
        };
        R4 {
            key: &r.key,
            fingerprint: r.fingerprint,
            first_claimed_wall_ms: first.to_le_bytes(),
            retention_ms: r.retention_ms,
            state,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct Record4 {
    key: RecordKey,
    fingerprint: Option<u128>,
    first_claimed_wall_ms: [u8; 8],
    retention_ms: Option<u64>,
    state: State4,
}

#[derive(Deserialize)]
enum State4 {
    InFlight {
        lease_deadline_delta_ms: i64,
        attempt: u32,
        attempt_started_delta_ms: i64,
        failed: bool,
        checkpoint: Option<Checkpoint>,
        lease_ms: Option<u64>,
        claim_id: Option<u128>,
    },
    Completed {
        attempt: u32,
        completed_delta_ms: i64,
        expires_delta_ms: i64,
        response: Blob,
    },
}

#[derive(Deserialize)]
pub(super) struct Head4 {
    key: KeyBuf,
    scope: KeyBuf,
    fingerprint: Option<u128>,
    first_claimed_wall_ms: [u8; 8],
    retention_ms: Option<u64>,
    state: HeadState4,
}

#[derive(Deserialize)]
enum HeadState4 {
    InFlight {
        lease_deadline_delta_ms: i64,
        attempt: u32,
        attempt_started_delta_ms: i64,
        failed: bool,
        checkpoint: Option<Checkpoint>,
        lease_ms: Option<u64>,
        claim_id: Option<u128>,
    },
    Completed {
        attempt: u32,
        completed_delta_ms: i64,
        expires_delta_ms: i64,
    },
}

impl From<Record4> for Record {
    fn from(r: Record4) -> Self {
        let first = u64::from_le_bytes(r.first_claimed_wall_ms);
        let state = match r.state {
            State4::InFlight {
                lease_deadline_delta_ms,
                attempt,
                attempt_started_delta_ms,
                failed,
                checkpoint,
                lease_ms,
                claim_id,
            } => {
                let (started, deadline) =
                    attempt_instants(first, attempt_started_delta_ms, lease_deadline_delta_ms);
                RecordState::InFlight {
                    lease_deadline_wall_ms: deadline,
                    attempt,
                    attempt_started_wall_ms: started,
                    failed,
                    checkpoint,
                    lease_ms,
                    claim_id,
                }
            }
            State4::Completed {
                attempt,
                completed_delta_ms,
                expires_delta_ms,
                response,
            } => {
                let (completed, expires) =
                    completion_instants(first, completed_delta_ms, expires_delta_ms);
                RecordState::Completed {
                    attempt,
                    completed_wall_ms: completed,
                    expires_wall_ms: expires,
                    response,
                }
            }
        };
        Record {
            key: r.key,
            fingerprint: r.fingerprint,
            first_claimed_wall_ms: first,
            retention_ms: r.retention_ms,
            state,
        }
    }
}

impl From<Head4> for RecordHead {
    fn from(h: Head4) -> Self {
        let first = u64::from_le_bytes(h.first_claimed_wall_ms);
        let state = match h.state {
            HeadState4::InFlight {
                lease_deadline_delta_ms,
                attempt,
                attempt_started_delta_ms,
                failed,
                checkpoint,
                lease_ms,
                claim_id,
            } => {
                let (started, deadline) =
                    attempt_instants(first, attempt_started_delta_ms, lease_deadline_delta_ms);
                HeadState::InFlight {
                    lease_deadline_wall_ms: deadline,
                    attempt,
                    attempt_started_wall_ms: started,
                    failed,
                    checkpoint,
                    lease_ms,
                    claim_id,
                }
            }
            HeadState4::Completed {
                attempt,
                completed_delta_ms,
                expires_delta_ms,
            } => {
                let (completed, expires) =
                    completion_instants(first, completed_delta_ms, expires_delta_ms);
                HeadState::Completed {
                    attempt,
                    completed_wall_ms: completed,
                    expires_wall_ms: expires,
                }
            }
        };
        RecordHead {
            key: h.key,
            scope: h.scope,
            fingerprint: h.fingerprint,
            first_claimed_wall_ms: first,
            retention_ms: h.retention_ms,
            state,
        }
    }
}
