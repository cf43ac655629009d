//! The typed answers of the backend's statements: how a call failed, what a claim, a
//! completion or a read found, and the decoding of their rows (a column that does not
//! decode is a failure of the call, never a panic).

use super::error::DatabaseError;
use crate::api::lease::Stored;
use crate::model::codec::Checkpoint;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Row;

/// How a call failed.
#[derive(Debug, Clone)]
pub(crate) enum Fail {
    /// Nothing changed: the server refused the statement, or nothing was sent.
    Refused(DatabaseError),
    /// The statement was sent and its answer lost (the connection broke, the server went
    /// away, no answer in time): it may or may not have committed.
    Unknown(Arc<str>),
}

/// A claim statement's answer.
#[derive(Debug)]
pub(crate) enum ClaimRow {
    Acquired {
        token: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
        /// The claim presented its holder's identity and resumed the lease.
        resumed: bool,
        /// The server's lifetime token as the claim's own statement read it (an early
        /// claim; `None`: none, or a claim that commits with the flush).
        life: Option<i64>,
    },
    /// The key is InFlight under another holder, `remaining` left on its lease (zero: the
    /// lease is over, but the row was not taken over: see `Db::claim`).
    Held {
        attempt: u32,
        fingerprint: Option<u128>,
        remaining: Duration,
    },
    Completed {
        stored: Stored,
        fingerprint: Option<u128>,
        remaining: Duration,
    },
    /// A completion past its retention whose marker is kept for `remaining` more.
    Forgotten {
        attempt: u32,
        fingerprint: Option<u128>,
        completed_wall_ms: u64,
        remaining: Duration,
    },
    /// The claim function used up its passes, each lost to another caller's commit: ask
    /// again.
    Again,
}

/// A completion's answer.
#[derive(Debug)]
pub(crate) enum CompleteRow {
    /// Stored now, or stored before under the same token (a repeat).
    Done {
        /// Stored before: the row keeps the first completion's response, not this call's.
        repeat: bool,
        attempt: u32,
        fingerprint: Option<u128>,
        remaining: Duration,
        /// A listening connection may wait for it: send the notification.
        heard: bool,
    },
    Lost,
}

/// A key's row as `get` reads it.
#[derive(Debug)]
pub(crate) enum GetRow {
    InFlight {
        token: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
        remaining: Duration,
        /// The holder failed the attempt.
        failed: bool,
        /// The database's instants, in ms since the epoch (`None`: not recorded, as for a
        /// row claimed under schema version 1).
        first_claimed_wall_ms: Option<u64>,
        attempt_started_wall_ms: Option<u64>,
    },
    Completed {
        stored: Stored,
        expires_wall_ms: u64,
    },
}

/// A row of an application table: its row key (table prefix and key) and value.
pub(crate) type TableRow = (Vec<u8>, Vec<u8>);

/// How a completion with the application's own statements failed.
pub(crate) enum HookFail {
    Db(Fail),
    /// The application's statement failed: everything was rolled back.
    Hook(tokio_postgres::Error),
}

pub(crate) fn remaining(us: Option<i64>) -> Duration {
    Duration::from_micros(us.unwrap_or(0).max(0).unsigned_abs())
}

pub(crate) fn fingerprint_of(bytes: Option<Vec<u8>>) -> Option<u128> {
    let b: [u8; 16] = bytes?.try_into().ok()?;
    Some(u128::from_be_bytes(b))
}

pub(crate) fn token_of(t: i64) -> u64 {
    t.max(0).unsigned_abs()
}

pub(crate) fn attempt_of(a: i32) -> u32 {
    u32::try_from(a).unwrap_or(0)
}

pub(crate) fn checkpoint_of(phase: Option<i64>, data: Option<Vec<u8>>) -> Option<Checkpoint> {
    let phase = u32::try_from(phase?).unwrap_or(u32::MAX);
    Some(Checkpoint::new(phase, &data.unwrap_or_default()))
}

/// A row that does not decode: the statement ran, so what it changed is unknown.
pub(crate) fn undecodable(e: tokio_postgres::Error) -> Fail {
    Fail::Unknown(Arc::from(format!(
        "the database's answer does not decode ({e}); is the table of another schema version?"
    )))
}

/// A completing statement's answer, its columns from `at` on; no row: the token no longer
/// held the key.
pub(crate) fn complete_row(rows: &[Row], at: usize) -> Result<CompleteRow, Fail> {
    match rows.first() {
        Some(row) => done_row(row, at),
        None => Ok(CompleteRow::Lost),
    }
}

/// A flush that found another lifetime token than its claim's, or none: the server
/// crash-restarted (or another took over) after the claim was sent, so the claim may be
/// lost although this commit succeeded.
pub(crate) fn restarted() -> Fail {
    Fail::Unknown(Arc::from(
        "the server restarted after a crash, or another server took over, since the claim \
         was sent: whether its commit survived is unknown",
    ))
}

/// The `life` column of a row (the lifetime token a statement read), where the statement
/// has one: looked up by name without building an error for the statements that do not.
pub(crate) fn life_column(row: &Row) -> Option<i64> {
    let at = row.columns().iter().position(|c| c.name() == "life")?;
    row.try_get::<_, Option<i64>>(at).ok().flatten()
}

/// A row of a completing statement, its columns from `at` on.
pub(crate) fn done_row(row: &Row, at: usize) -> Result<CompleteRow, Fail> {
    let kind: &str = row.try_get(at).map_err(undecodable)?;
    Ok(CompleteRow::Done {
        repeat: kind == "repeat",
        attempt: attempt_of(row.try_get(at + 1).map_err(undecodable)?),
        fingerprint: fingerprint_of(row.try_get(at + 2).map_err(undecodable)?),
        remaining: remaining(row.try_get(at + 3).map_err(undecodable)?),
        heard: row.try_get(at + 4).map_err(undecodable)?,
    })
}

/// The claim function's row, its columns from `at` on.
pub(crate) fn claim_row(row: &Row, at: usize) -> Result<ClaimRow, Fail> {
    let kind: String = row.try_get(at).map_err(undecodable)?;
    let token = token_of(row.try_get(at + 1).map_err(undecodable)?);
    let attempt = attempt_of(row.try_get(at + 2).map_err(undecodable)?);
    Ok(match kind.as_str() {
        "a" | "r" => ClaimRow::Acquired {
            token,
            attempt,
            checkpoint: checkpoint_of(
                row.try_get(at + 3).map_err(undecodable)?,
                row.try_get(at + 4).map_err(undecodable)?,
            ),
            resumed: kind == "r",
            // Only the early claim statements have the column.
            life: life_column(row),
        },
        state => {
            let response: Option<Vec<u8>> = row.try_get(at + 5).map_err(undecodable)?;
            let fingerprint = fingerprint_of(row.try_get(at + 6).map_err(undecodable)?);
            let left: Option<i64> = row.try_get(at + 7).map_err(undecodable)?;
            match (state, response) {
                ("m", _) => ClaimRow::Forgotten {
                    attempt,
                    fingerprint,
                    completed_wall_ms: wall_ms_of(row.try_get(at + 8).map_err(undecodable)?)
                        .unwrap_or(0),
                    remaining: remaining(left),
                },
                ("c", Some(response)) => ClaimRow::Completed {
                    stored: Stored {
                        response: Arc::from(response),
                        token,
                        attempt,
                        expires_wall_ms: crate::shared::core::expires_wall_ms(remaining(left)),
                    },
                    fingerprint,
                    remaining: remaining(left),
                },
                _ => ClaimRow::Held {
                    attempt,
                    fingerprint,
                    remaining: remaining(left),
                },
            }
        }
    })
}

/// An instant read as ms since the epoch; one before the epoch reads as the epoch.
pub(crate) fn wall_ms_of(ms: Option<i64>) -> Option<u64> {
    ms.map(|ms| ms.max(0).unsigned_abs())
}
