//! What the holder of a token does to its key: rows `complete`, `release`, `fail`,
//! `extend` and `checkpoint` of the state table.

use super::record::{inflight_record, with_progress, KeyRef};
use super::{lease_ms, Change, Deltas, Now, Rules, Step, View, Write, NONE};
use crate::base::clock::duration_ns;
use crate::model::codec::{Blob, Checkpoint, Record, RecordState};
use crate::model::slot::{Extra, Slot};
use std::sync::Arc;
use std::time::Duration;

/// What the holder of a token does to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Store the response; the key is Completed for `retention_ms` if given, else for the
    /// retention its claim chose, else for the engine's.
    Complete {
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
    },
    /// Give the key up: it is Absent.
    Release,
    /// Set the lease to end `lease` from now.
    Extend { lease: Duration },
    /// Save a checkpoint, which a takeover receives.
    Checkpoint(Checkpoint),
    /// End the attempt and keep the key: the lease ends now (or stays ended), the record
    /// stays InFlight and marked failed, with its checkpoint and fingerprint, so the next
    /// claim takes it over at once.
    Fail,
}

/// What a holder's call answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HolderAnswer {
    /// The call changed the key (completed, released, failed, extended, checkpointed).
    Done,
    /// A repeated completion with the same token: the first stands. Settled once everything
    /// queued is, so an unpublished one waits for a flush.
    Repeat { published: bool },
    /// `release` or `fail` of a key the token does not hold as InFlight: `Ok(false)`.
    NotHeld,
    /// The token does not hold the key.
    LeaseLost,
}

/// A holder's call with `token` on the key: rows `complete`, `release`, `extend` and
/// `checkpoint` of the table. Fencing: only the key's current token acts, also after its
/// lease ended as long as nobody took the key over.
pub(crate) fn hold(
    view: View<'_>,
    key: KeyRef<'_>,
    token: u64,
    op: Holder,
    now: Now,
    rules: &Rules,
) -> Step<HolderAnswer> {
    let lost = || {
        let deltas = Deltas {
            leases_lost: 1,
            ..NONE
        };
        Step::answer(HolderAnswer::LeaseLost, deltas)
    };
    let held = view.slot.filter(|slot| slot.token == token);
    match op {
        Holder::Complete {
            response,
            retention_ms,
        } => {
            let Some(slot) = held.filter(|slot| !slot.is_expired(now.mono_ns)) else {
                return lost();
            };
            if !slot.is_inflight() {
                let published = slot.is_published();
                return Step::answer(HolderAnswer::Repeat { published }, NONE);
            }
            complete(view, key, slot, response, retention_ms, now, rules)
        }
        Holder::Release => {
            let Some(slot) = held.filter(Slot::is_inflight) else {
                return Step::answer(HolderAnswer::NotHeld, NONE);
            };
            let deltas = Deltas {
                inflight: -1,
                releases: 1,
                ..NONE
            };
            Step {
                change: Change::Remove,
                write: rules.durable.then_some(Write::Delete { token: slot.token }),
                answer: HolderAnswer::Done,
                deltas,
            }
        }
        Holder::Extend { lease } => {
            // A failed attempt is over for good: nothing revives it (not even a keep-alive
            // renewal racing the fail), and the next claim takes it over.
            let failed = view.extra.is_some_and(|e| e.failed);
            let Some(mut slot) = held.filter(|slot| slot.is_inflight() && !failed) else {
                return lost();
            };
            let unmoved = slot.deadline_ns;
            slot.deadline_ns = now.mono_ns.saturating_add(duration_ns(lease));
            let mut extra = view.extra.cloned().unwrap_or_default();
            // A live lease again: its end is its deadline, and its length the one given now.
            extra.set_ended_wall_ms(0);
            extra.lease_ms = Some(lease_ms(lease));
            let reap_ns = reap_after(slot.deadline_ns, &extra, rules);
            let mut step = update(key, slot, extra, now, rules);
            // An extension that leaves the deadline where it was keeps the slot's place in
            // the expiry order, but not its reap instant: one loaded from a record (reaped
            // `retention` after the recorded end) is reaped after this end from now on.
            if slot.deadline_ns == unmoved {
                if let Change::Put { reap_ns: r, .. } = &mut step.change {
                    *r = Some(reap_ns);
                }
            }
            step
        }
        Holder::Fail => {
            let Some(mut slot) = held.filter(Slot::is_inflight) else {
                return Step::answer(HolderAnswer::NotHeld, NONE);
            };
            // A lease already over keeps its end, and so its reap instant.
            slot.deadline_ns = slot.deadline_ns.min(now.mono_ns);
            let mut extra = view.extra.cloned().unwrap_or_default();
            extra.failed = true;
            let mut step = update(key, slot, extra, now, rules);
            step.deltas.failures = 1;
            step
        }
        Holder::Checkpoint(checkpoint) => {
            let Some(slot) = held.filter(Slot::is_inflight) else {
                return lost();
            };
            let mut extra = view.extra.cloned().unwrap_or_default();
            extra.set_checkpoint(Some(checkpoint));
            update(key, slot, extra, now, rules)
        }
    }
}

/// `complete` of the InFlight `slot`. The response and fingerprint stay beside the slot
/// until the completion is published (a mismatch is refused and `records` reports it
/// meanwhile); a memory-only engine keeps them and publishes at once. The retention is the
/// completion's own (`retention_ms`), else the claim's, else the engine's; a key's own
/// retention is whole milliseconds, so memory and file agree on its end to the ns.
fn complete(
    view: View<'_>,
    key: KeyRef<'_>,
    slot: Slot,
    response: Arc<[u8]>,
    retention_ms: Option<u64>,
    now: Now,
    rules: &Rules,
) -> Step<HolderAnswer> {
    let fingerprint = view.fingerprint();
    let own_ms = retention_ms.or(view.extra.and_then(|e| e.retention_ms));
    let keep_ns = keep_ns(own_ms, rules);
    let (expires_wall_ms, expires_ns) = now.end_on_wall_grid(keep_ns);
    let first_claimed_wall_ms = view.extra.map_or(0, |e| e.first_claimed_wall_ms);
    let write = rules.durable.then(|| Write::Put {
        token: slot.token,
        old: None,
        record: Record {
            key: key.record_key(),
            fingerprint,
            first_claimed_wall_ms,
            retention_ms: own_ms,
            state: RecordState::Completed {
                attempt: slot.attempt,
                completed_wall_ms: now.wall_ms,
                expires_wall_ms,
                response: Blob(response.clone()),
            },
        },
    });
    let extra = Extra {
        response: Some(response),
        expires_wall_ms,
        retention_ms: own_ms,
        first_claimed_wall_ms,
        completed_wall_ms: now.wall_ms,
        ..Extra::default()
    }
    .with_fingerprint(fingerprint);
    let deltas = Deltas {
        inflight: -1,
        completed: 1,
        completions: 1,
        ..NONE
    };
    Step {
        change: Change::Put {
            slot: Slot::completed(slot.token, expires_ns, slot.attempt, !rules.durable),
            extra,
            reap_ns: None,
            adopt: false,
        },
        write,
        answer: HolderAnswer::Done,
        deltas,
    }
}

/// How long the key is kept: its own retention (ms), or the engine's.
fn keep_ns(own_ms: Option<u64>, rules: &Rules) -> u64 {
    match own_ms {
        Some(ms) => ms.saturating_mul(1_000_000),
        None => duration_ns(rules.retention),
    }
}

/// The instant an InFlight slot ending at `deadline_ns` is reaped if abandoned: the key's
/// own retention after its end, or the engine's.
fn reap_after(deadline_ns: u64, extra: &Extra, rules: &Rules) -> u64 {
    deadline_ns.saturating_add(keep_ns(extra.retention_ms, rules))
}

/// `extend` or `checkpoint`: the InFlight slot changes and its record is rewritten with the
/// lease's own end, also when it is already over (a holder may act until someone takes
/// over), so that recovery reaps the claim `retention` after it, as the sweeper would have.
fn update(
    key: KeyRef<'_>,
    slot: Slot,
    extra: Extra,
    now: Now,
    rules: &Rules,
) -> Step<HolderAnswer> {
    let write = rules.durable.then(|| Write::Put {
        token: slot.token,
        old: None,
        record: Record {
            retention_ms: extra.retention_ms,
            ..with_progress(
                inflight_record(
                    key,
                    extra.fingerprint(),
                    slot.attempt,
                    extra.checkpoint().cloned(),
                    // Rounded up: the stored end is never before the real one.
                    now.wall_ms_ceil_at(slot.deadline_ns),
                ),
                &extra,
                rules,
            )
        },
    });
    Step {
        change: Change::Put {
            slot,
            extra,
            reap_ns: None,
            adopt: false,
        },
        write,
        answer: HolderAnswer::Done,
        deltas: NONE,
    }
}
