//! The records of format version 1, read (never written) so that files written by an older
//! format keep working; each converts to its version-3 form.

use super::{Blob, Checkpoint, HeadState, KeyBuf, Record, RecordHead, RecordKey, RecordState};
use serde::Deserialize;

#[derive(Deserialize)]
pub(super) struct Record1 {
    key: Blob,
    fingerprint: Option<u64>,
    state: State1,
}

#[derive(Deserialize)]
enum State1 {
    InFlight {
        lease_deadline_wall_ms: u64,
        attempt: u32,
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
pub(super) struct Head1 {
    key: KeyBuf,
    fingerprint: Option<u64>,
    state: HeadState1,
}

#[derive(Deserialize)]
enum HeadState1 {
    InFlight {
        lease_deadline_wall_ms: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
    },
    Completed {
        attempt: u32,
        completed_wall_ms: u64,
        expires_wall_ms: u64,
    },
}

impl From<Record1> for Record {
    fn from(r: Record1) -> Self {
        let state = match r.state {
            State1::InFlight {
                lease_deadline_wall_ms,
                attempt,
                checkpoint,
            } => RecordState::InFlight {
                lease_deadline_wall_ms,
                attempt,
                attempt_started_wall_ms: 0,
                failed: false,
                checkpoint,
                lease_ms: None,
                claim_id: None,
            },
            State1::Completed {
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
            key: RecordKey::unscoped(&r.key.0),
            fingerprint: r.fingerprint.map(u128::from),
            first_claimed_wall_ms: 0,
            retention_ms: None,
            state,
        }
    }
}

impl From<Head1> for RecordHead {
    fn from(h: Head1) -> Self {
        let state = match h.state {
            HeadState1::InFlight {
                lease_deadline_wall_ms,
                attempt,
                checkpoint,
            } => HeadState::InFlight {
                lease_deadline_wall_ms,
                attempt,
                attempt_started_wall_ms: 0,
                failed: false,
                checkpoint,
                lease_ms: None,
                claim_id: None,
            },
            HeadState1::Completed {
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
            scope: KeyBuf(Box::default()),
            fingerprint: h.fingerprint.map(u128::from),
            first_claimed_wall_ms: 0,
            retention_ms: None,
            state,
        }
    }
}

/// Encodes a version-1 record, as the previous format wrote it: the tests' fixture
/// for reading old files.
#[cfg(test)]
pub(crate) fn encode(token: u64, r: &Record) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct R1<'a> {
        key: &'a Blob,
        fingerprint: Option<u64>,
        state: S1<'a>,
    }
    #[derive(serde::Serialize)]
    enum S1<'a> {
        InFlight {
            lease_deadline_wall_ms: u64,
            attempt: u32,
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
            checkpoint,
            ..
        } => S1::InFlight {
            lease_deadline_wall_ms: *lease_deadline_wall_ms,
            attempt: *attempt,
            checkpoint,
        },
        RecordState::Completed {
            attempt,
            completed_wall_ms,
            expires_wall_ms,
            response,
        } => S1::Completed {
            attempt: *attempt,
            completed_wall_ms: *completed_wall_ms,
            expires_wall_ms: *expires_wall_ms,
            response,
        },
    };
    let key = Blob(std::sync::Arc::from(r.key.key()));
    let body = R1 {
        key: &key,
        // A version-1 fingerprint is 64 bits wide.
        fingerprint: r.fingerprint.map(|f| f as u64),
        state,
    };
    super::frame(token, 1, &body)
}
