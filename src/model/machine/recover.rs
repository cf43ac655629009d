//! Recovery's transitions: what each record of a reopened file becomes in memory.

use super::{Change, Deltas, Now, Step, Write, NONE};
use crate::base::clock::{duration_ms, duration_ns};
use crate::model::codec::HeadState;
use crate::model::settings::Recovery;
use crate::model::slot::{Extra, Slot};
use std::time::Duration;

/// How recovery treats the InFlight records a previous process left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reopen {
    pub(crate) recovery: Recovery,
    /// The configured lease, which caps an honoured lease whose record does not keep its
    /// own length (a record of format 1 or 2).
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
}

/// What recovery does with one record of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one record's verdict lives on the stack for one call; boxing its side data \
              would allocate per record"
)]
pub(crate) enum Recovered {
    /// A completion past its retention: its record is deleted.
    Expired,
    /// An abandoned claim past its reap instant: its record is deleted, the claim counted
    /// as reaped.
    Reaped,
    /// Loaded into the index (see [`load`]).
    Load {
        slot: Slot,
        extra: Extra,
        reap_ns: Option<u64>,
    },
}

/// Recovery classifies the record under `token`, decoded to its head, at `now`. An InFlight
/// record with its own `retention_ms` is reaped that long after its lease end, and keeps it
/// for its completion and takeover. `first_claimed_wall_ms` is the record's first-claimed
/// instant (0: unknown).
pub(crate) fn recover(
    token: u64,
    head: HeadState,
    fingerprint: Option<u128>,
    own_retention_ms: Option<u64>,
    now: Now,
    reopen: &Reopen,
    first_claimed_wall_ms: u64,
) -> Recovered {
    let retention_ms = own_retention_ms.unwrap_or_else(|| duration_ms(reopen.retention));
    match head {
        HeadState::Completed {
            expires_wall_ms, ..
        } if expires_wall_ms <= now.wall_ms => Recovered::Expired,
        HeadState::Completed {
            attempt,
            expires_wall_ms,
            ..
        } => {
            let left_ns = now.ns_until_wall_ms(expires_wall_ms);
            let slot = Slot::completed(token, now.mono_ns.saturating_add(left_ns), attempt, true);
            Recovered::Load {
                slot,
                extra: Extra::default(),
                reap_ns: None,
            }
        }
        HeadState::InFlight {
            lease_deadline_wall_ms,
            ..
        } if lease_deadline_wall_ms.saturating_add(retention_ms) <= now.wall_ms => {
            Recovered::Reaped
        }
        HeadState::InFlight {
            lease_deadline_wall_ms,
            attempt,
            checkpoint,
            attempt_started_wall_ms,
            failed,
            lease_ms,
            claim_id,
        } => {
            // Reaped `retention` after the recorded lease end, as a completion expires
            // `retention` after it was made; taken from the file, not from the in-memory
            // deadline (which `TakeOver` sets to now), so that restarts never postpone it.
            let reap_left_ms = lease_deadline_wall_ms
                .saturating_add(retention_ms)
                .saturating_sub(now.wall_ms);
            let reap_ns = now
                .mono_ns
                .saturating_add(reap_left_ms.saturating_mul(1_000_000));
            let deadline_ns = match reopen.recovery {
                // The owner is dead: redb locks the file to one process. A failed claim's
                // lease ended when its holder failed it.
                Recovery::TakeOver => now.mono_ns,
                _ if failed => now.mono_ns,
                // What is left of the recorded lease, capped by the length its holder was
                // given (a wall clock that jumped back must not keep a dead claim alive
                // longer than one of its leases); a record without it: the engine's lease.
                Recovery::HonourLeases => {
                    let cap_ns = lease_ms
                        .map_or(duration_ns(reopen.lease), |ms| ms.saturating_mul(1_000_000));
                    let left_ns = now.ns_until_wall_ms(lease_deadline_wall_ms).min(cap_ns);
                    now.mono_ns.saturating_add(left_ns)
                }
            };
            // A lease already over when the file recorded it keeps that end for reports (a
            // failed one's record holds the instant of the fail, whatever the clock says).
            let over =
                deadline_ns <= now.mono_ns && (failed || lease_deadline_wall_ms <= now.wall_ms);
            let extra = Extra {
                retention_ms: own_retention_ms,
                first_claimed_wall_ms,
                attempt_started_wall_ms,
                failed,
                lease_ms,
                ..Extra::default()
            }
            .with_fingerprint(fingerprint)
            .with_checkpoint(checkpoint)
            .with_ended_wall_ms(if over { lease_deadline_wall_ms } else { 0 })
            .with_claim_id(claim_id);
            Recovered::Load {
                slot: Slot::inflight(token, deadline_ns, attempt),
                extra,
                reap_ns: Some(reap_ns),
            }
        }
    }
}

/// Recovery loads a record's `slot` over `existing`, what an earlier record of the same key
/// left. Two records of one key are never committed together, but if a damaged history
/// left both the newer wins; the write deletes the older.
pub(crate) fn load(
    existing: Option<Slot>,
    slot: Slot,
    extra: Extra,
    reap_ns: Option<u64>,
) -> Step<()> {
    let count = |slot: &Slot, sign: i64| Deltas {
        inflight: if slot.is_inflight() { sign } else { 0 },
        completed: if slot.is_inflight() { 0 } else { sign },
        ..NONE
    };
    if let Some(existing) = existing.filter(|e| e.token > slot.token) {
        debug_assert!(existing.token != slot.token);
        return Step {
            change: Change::Keep,
            write: Some(Write::Delete { token: slot.token }),
            answer: (),
            deltas: NONE,
        };
    }
    let mut deltas = count(&slot, 1);
    let mut write = None;
    if let Some(existing) = existing {
        let gone = count(&existing, -1);
        deltas.inflight += gone.inflight;
        deltas.completed += gone.completed;
        write = Some(Write::Delete {
            token: existing.token,
        });
    }
    Step {
        change: Change::Put {
            slot,
            extra,
            reap_ns,
            adopt: false,
        },
        write,
        answer: (),
        deltas,
    }
}
