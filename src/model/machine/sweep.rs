//! The sweeper's transitions: a completion past its retention expires, an abandoned claim
//! is reaped at its lease end plus retention.

use super::{Change, Deltas, Step, Write, NONE};
use crate::model::slot::Slot;

/// The sweeper removes a completion past its retention. `None` if `slot` is not one: a
/// live lease or an unexpired completion is never removed. The deletion is queued whatever
/// the durability (a memory-only engine has no queue and drops it).
pub(crate) fn expire(slot: &Slot, now_ns: u64) -> Option<Step<()>> {
    if !slot.is_expired(now_ns) {
        return None;
    }
    debug_assert!(!slot.is_inflight(), "a lease never expires");
    let deltas = Deltas {
        completed: -1,
        expirations: 1,
        ..NONE
    };
    Some(removal(slot, deltas))
}

/// The sweeper reaps an abandoned claim — its lease ended and nobody took it over — at its
/// reap instant `reap_ns` (its lease end plus retention). `None` if `slot` is not one.
pub(crate) fn reap(slot: &Slot, reap_ns: u64, now_ns: u64) -> Option<Step<()>> {
    if !(slot.is_inflight() && slot.is_abandoned() && now_ns >= reap_ns) {
        return None;
    }
    debug_assert!(now_ns >= slot.deadline_ns, "a live lease is never evicted");
    let deltas = Deltas {
        abandoned_reaped: 1,
        ..NONE
    };
    Some(removal(slot, deltas))
}

fn removal(slot: &Slot, deltas: Deltas) -> Step<()> {
    Step {
        change: Change::Remove,
        write: Some(Write::Delete { token: slot.token }),
        answer: (),
        deltas,
    }
}
