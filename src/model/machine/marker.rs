//! Markers, the second tier of retention: a completion past its retention leaves a marker
//! that answers late duplicates `Forgotten` until the marker's own end.

use super::sweep::expire;
use super::{Change, Deltas, Now, Step, Write, NONE};
use crate::base::clock::{duration_ms, duration_ns, wall_ms_at};
use crate::model::answer::{Busy, Forgotten};
use crate::model::codec::HeadState;
use crate::model::constants::RETRY_AFTER_UNPUBLISHED;
use crate::model::marker::{Marker, MarkerId};
use crate::model::settings::AskedFingerprint;
use crate::model::slot::{Extra, Slot};
use std::time::Duration;

/// The second tier of retention: after a completion's retention, a marker of it is kept
/// for `retention` more (docs/retention.md, "Markers: the second tier").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MarkerRules {
    pub(crate) retention: Duration,
    /// A file backs the engine: the writer builds the marker's row from the completion's
    /// record in the commit that deletes it, and settles the marker in memory after it.
    pub(crate) durable: bool,
}

/// A completion past its retention is removed (as [`expire`] removes it) and leaves a
/// marker `id` until its end of retention plus the marker retention. The marker is `None`
/// when that end has passed too: the removal is then a plain expiry. A durable engine's
/// marker is pending until the writer has committed its row (its fingerprint and completion
/// time come from the record); a memory-only engine's comes from the side data, which holds
/// the response, the fingerprint and the completion time. `None` if `slot` is not a
/// completion past its retention.
pub(crate) fn forget(
    slot: &Slot,
    extra: Option<&Extra>,
    id: MarkerId,
    rules: &MarkerRules,
    now_ns: u64,
) -> Option<Step<Option<Marker>>> {
    let expired = expire(slot, now_ns)?;
    let end_ns = slot
        .deadline_ns
        .saturating_add(duration_ns(rules.retention));
    if end_ns <= now_ns {
        return Some(Step {
            change: expired.change,
            write: expired.write,
            answer: None,
            deltas: expired.deltas,
        });
    }
    let marker = if rules.durable {
        Marker::pending(id, slot.token, slot.attempt, end_ns)
    } else {
        Marker::kept(
            id,
            slot.token,
            slot.attempt,
            extra.and_then(|e| e.fingerprint()),
            extra.map_or(0, |e| e.completed_wall_ms),
            end_ns,
        )
    };
    let write = Write::Forget {
        token: slot.token,
        hash: id.hash,
        check: id.check,
        marker_retention_ms: duration_ms(rules.retention),
    };
    Some(Step {
        change: Change::Remove,
        write: Some(write),
        answer: Some(marker),
        deltas: expired.deltas,
    })
}

/// The sweeper removes a marker at its end (`None` before it). The key's slot, if any, is
/// not touched.
pub(crate) fn end_marker(marker: &Marker, now_ns: u64, durable: bool) -> Option<Step<()>> {
    if !marker.is_ended(now_ns) {
        return None;
    }
    let write = durable.then_some(Write::DropMarker {
        hash: marker.hash,
        token: marker.token,
    });
    Some(Step {
        change: Change::Keep,
        write,
        answer: (),
        deltas: NONE,
    })
}

/// What a claim of a key without a slot decides on the key's marker.
#[derive(Debug, Clone)]
pub(crate) enum MarkerAnswer {
    /// The key was completed and its response is no longer kept.
    Forgotten(Forgotten),
    /// The marker's row is not committed yet (a durable engine, for one commit).
    Busy(Busy),
    FingerprintMismatch,
    /// The key is new (the marker ended), or the caller asked to run it again: the claim
    /// acquires it as a new key, dropping the marker with its write.
    Acquire,
}

/// A claim looks at the marker of a key that has no slot: `Forgotten` while the marker
/// lasts, unless the claim's fingerprint differs (`FingerprintMismatch`, as for a
/// completion) or it asks to run a forgotten key again (`rerun`).
pub(crate) fn claim_marker(
    marker: &Marker,
    asked: Option<AskedFingerprint>,
    rerun: bool,
    now: Now,
) -> Step<MarkerAnswer> {
    if marker.is_ended(now.mono_ns) {
        return Step::answer(MarkerAnswer::Acquire, NONE);
    }
    if marker.is_pending() {
        let busy = Busy {
            retry_after: RETRY_AFTER_UNPUBLISHED,
            attempt: marker.attempt,
            completing: true,
        };
        let deltas = Deltas {
            in_progress: 1,
            ..NONE
        };
        return Step::answer(MarkerAnswer::Busy(busy), deltas);
    }
    if let (Some(asked), Some(stored)) = (asked, marker.fingerprint()) {
        if !asked.matches(stored) {
            let deltas = Deltas {
                fingerprint_mismatches: 1,
                ..NONE
            };
            return Step::answer(MarkerAnswer::FingerprintMismatch, deltas);
        }
    }
    if rerun {
        return Step::answer(MarkerAnswer::Acquire, NONE);
    }
    let forgotten = Forgotten {
        completed_wall_ms: marker.completed_wall_ms,
        attempt: marker.attempt,
        kept_until_wall_ms: wall_ms_at(now.wall_ms, now.mono_ns, marker.end_ns),
    };
    let deltas = Deltas {
        forgotten: 1,
        ..NONE
    };
    Step::answer(MarkerAnswer::Forgotten(forgotten), deltas)
}

/// Recovery finds a completion past its retention: with markers on and its marker's window
/// still open at `now`, it leaves the marker it would have left had the sweeper removed it
/// before the restart (the writer builds the same row from the record, with
/// [`Write::Forget`]). `None`: no marker.
pub(crate) fn recover_marker(
    token: u64,
    head: &HeadState,
    fingerprint: Option<u128>,
    id: MarkerId,
    rules: &MarkerRules,
    now: Now,
) -> Option<Marker> {
    let HeadState::Completed {
        attempt,
        completed_wall_ms,
        expires_wall_ms,
    } = *head
    else {
        return None;
    };
    let end_wall_ms = expires_wall_ms.saturating_add(duration_ms(rules.retention));
    loaded_marker(
        id,
        token,
        attempt,
        fingerprint,
        completed_wall_ms,
        end_wall_ms,
        now,
    )
}

/// A marker row read from the file at `now`, in memory: `None` if it has ended.
pub(crate) fn loaded_marker(
    id: MarkerId,
    token: u64,
    attempt: u32,
    fingerprint: Option<u128>,
    completed_wall_ms: u64,
    end_wall_ms: u64,
    now: Now,
) -> Option<Marker> {
    if end_wall_ms <= now.wall_ms {
        return None;
    }
    let left_ns = (end_wall_ms - now.wall_ms).saturating_mul(1_000_000);
    Some(Marker::kept(
        id,
        token,
        attempt,
        fingerprint,
        completed_wall_ms,
        now.mono_ns.saturating_add(left_ns),
    ))
}
