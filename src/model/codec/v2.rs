//! The records of format version 2, read (never written) so that files written by the
//! previous format keep working; each converts to its version-3 form, the InFlight fields
//! version 3 added unknown (`lease_ms` and `claim_id` are `None`: an honoured lease is then
//! capped by the engine's lease at reopen, and no claim resumes it).

use super::{Blob, Checkpoint, HeadState, KeyBuf, Record, RecordHead, RecordKey, RecordState};
use serde::Deserialize;

#[derive(Deserialize)]
pub(super) struct Record2 {
    key: RecordKey,
    fingerprint: Option<u128>,
    first_claimed_wall_ms: u64,
    retention_ms: Option<u64>,
    state: State2,
}

#[derive(Deserialize)]
enum State2 {
    InFlight {
        lease_deadline_wall_ms: u64,
        attempt: u32,
        attempt_started_wall_ms: u64,
        failed: bool,
        checkpoint: Option<Checkpoint>,
    },
    Completed {
        attempt: u32,
        completed_wall_ms: u64,
        expires_wall_ms: u64,
        response: Blob,
    },
}

#[derive(Deserialize)]
pub(super) struct Head2 {
    key: KeyBuf,
    scope: KeyBuf,
    fingerprint: Option<u128>,
    first_claimed_wall_ms: u64,
    retention_ms: Option<u64>,
    state: HeadState2,
}

#[derive(Deserialize)]
enum HeadState2 {
    InFlight {
        lease_deadline_wall_ms: u64,
        attempt: u32,
        attempt_started_wall_ms: u64,
        failed: bool,
        checkpoint: Option<Checkpoint>,
    },
    Completed {
        attempt: u32,
        completed_wall_ms: u64,
        expires_wall_ms: u64,
    },
}

impl From<Record2> for Record {
    fn from(r: Record2) -> Self {
        let state = match r.state {
            State2::InFlight {
                lease_deadline_wall_ms,
                attempt,
                attempt_started_wall_ms,
                failed,
                checkpoint,
            } => RecordState::InFlight {
                lease_deadline_wall_ms,
                attempt,
                attempt_started_wall_ms,
                failed,
                checkpoint,
                lease_ms: None,
                claim_id: None,
            },
            State2::Completed {
                attempt,
                completed_wall_ms,
                expires_wall_ms,
                response,
            } => RecordState::Completed {
                attempt,
                completed_wall_ms,
                expires_wall_ms,
                response,
            },
        };
        Record {
            key: r.key,
            fingerprint: r.fingerprint,
            first_claimed_wall_ms: r.first_claimed_wall_ms,
            retention_ms: r.retention_ms,
            state,
        }
    }
}

impl From<Head2> for RecordHead {
    fn from(h: Head2) -> Self {
        let state = match h.state {
            HeadState2::InFlight {
                lease_deadline_wall_ms,
                attempt,
                attempt_started_wall_ms,
                failed,
                checkpoint,
            } => HeadState::InFlight {
                lease_deadline_wall_ms,
                attempt,
                attempt_started_wall_ms,
                failed,
                checkpoint,
                lease_ms: None,
                claim_id: None,
            },
            HeadState2::Completed {
                attempt,
                completed_wall_ms,
                expires_wall_ms,
            } => HeadState::Completed {
                attempt,
                completed_wall_ms,
                expires_wall_ms,
            },
        };
        RecordHead {
            key: h.key,
            scope: h.scope,
            fingerprint: h.fingerprint,
            first_claimed_wall_ms: h.first_claimed_wall_ms,
            retention_ms: h.retention_ms,
            state,
        }
    }
}

/// Encodes a version-2 record, as the previous format wrote it: the tests' fixture for
/// reading old files.
#[cfg(test)]
pub(crate) fn encode(token: u64, r: &Record) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct R2<'a> {
        key: &'a RecordKey,
        fingerprint: Option<u128>,
        first_claimed_wall_ms: u64,
        retention_ms: Option<u64>,
        state: S2<'a>,
    }
    #[derive(serde::Serialize)]
    enum S2<'a> {
        InFlight {
            lease_deadline_wall_ms: u64,
            attempt: u32,
            attempt_started_wall_ms: u64,
            failed: bool,
            checkpoint: &'a Option<Checkpoint>,
        },
        Completed {
            attempt: u32,
            completed_wall_ms: u64,
            expires_wall_ms: u64,
            response: &'a Blob,
        },
    }
    let state = match &r.state {
        RecordState::InFlight {
            lease_deadline_wall_ms,
            attempt,
            attempt_started_wall_ms,
            failed,
            checkpoint,
            ..
        } => S2::InFlight {
            lease_deadline_wall_ms: *lease_deadline_wall_ms,
            attempt: *attempt,
            attempt_started_wall_ms: *attempt_started_wall_ms,
            failed: *failed,
            checkpoint,
        },
        RecordState::Completed {
            attempt,
            completed_wall_ms,
            expires_wall_ms,
            response,
        } => S2::Completed {
            attempt: *attempt,
            completed_wall_ms: *completed_wall_ms,
            expires_wall_ms: *expires_wall_ms,
            response,
        },
    };
    let body = R2 {
        key: &r.key,
        fingerprint: r.fingerprint,
        first_claimed_wall_ms: r.first_claimed_wall_ms,
        retention_ms: r.retention_ms,
        state,
    };
    super::frame(token, 2, &body)
}
