//! The sweeper's work on a stripe: ending leases that are over, removing completions past
//! their retention (leaving markers where the engine keeps them) and reaping abandoned
//! claims.

use super::{Common, Shard};
use crate::base::sync::Ordering;
use crate::index::expiry::{done_matches, lease_matches, ByEnd, ByReap};
use crate::model::machine::{self, Step};
use crate::model::marker::{Marker, MarkerId};
use crate::model::slot::{Extra, Slot, ABANDONED};

/// What [`Shard::end_leases`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ended {
    /// Leases moved out of the live count into the abandoned set.
    pub(crate) moved: u64,
    /// Entries looked at (moved or stale).
    pub(crate) examined: usize,
    /// Whether ended leases remain (the examination budget ran out).
    pub(crate) more: bool,
}

/// What [`Shard::reclaim`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reclaimed {
    /// Nothing is due.
    Nothing,
    /// A stale entry was dropped; nothing was removed.
    Stale,
    /// A completion past its retention was removed.
    Expired,
    /// An abandoned lease past its reap instant was removed.
    Reaped,
    /// The deletion could not be queued; nothing changed.
    Refused,
}

impl Shard {
    /// Moves the leases that have ended by `now` out of the live count into the abandoned
    /// set, looking at most at `max` entries. Amortized O(1) per lease: each entry is
    /// looked at once.
    pub(crate) fn end_leases(&mut self, now: u64, max: usize) -> Ended {
        let mut out = Ended::default();
        while out.examined < max {
            if self.leases.peek().is_none_or(|e| e.0.deadline_ns > now) {
                break;
            }
            let Some(ByEnd(e)) = self.leases.pop() else {
                break;
            };
            out.examined += 1;
            if let Some((_, slot, _)) = self
                .slots
                .find_mut(e.hash, |(_, s, _)| lease_matches(s, &e, false))
            {
                slot.flags |= ABANDONED;
                self.live -= 1;
                self.abandoned += 1;
                // Abandoned first: a concurrent reader of the key budget may count the lease
                // twice for an instant, never zero times.
                self.common.gauges.abandoned.fetch_add(1, Ordering::AcqRel);
                self.common.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
                self.ended.push(ByReap(e));
                out.moved += 1;
            }
        }
        out.more = self.leases.peek().is_some_and(|e| e.0.deadline_ns <= now);
        if out.examined > 0 {
            self.compact_if_stale();
            self.refresh_due();
        }
        out
    }

    /// Removes the earliest slot due at `now` — a completion past its retention, or an
    /// abandoned lease past its reap instant — once `send` has queued the state machine's
    /// step (the deletion of its record, by token). A stale entry at the head is dropped
    /// instead. Only slots the state machine finds due at `now` are ever removed
    /// ([`machine::expire`], [`machine::reap`]): a live lease or an unexpired completion
    /// never is.
    pub(crate) fn reclaim(
        &mut self,
        now: u64,
        send: &mut dyn FnMut(&Step<()>) -> bool,
    ) -> Reclaimed {
        let fifo_at = self.done.front().map(|e| e.deadline_ns);
        let kept_at = self.kept.peek().map(|e| e.deadline_ns);
        // The earlier completion of the two queues' heads; the deque's on a tie.
        let (done_at, from_kept) = match (fifo_at, kept_at) {
            (Some(f), Some(k)) if k < f => (Some(k), true),
            (None, Some(k)) => (Some(k), true),
            (f, _) => (f, false),
        };
        let done_at = done_at.filter(|&d| d <= now);
        let reap_at = self.ended.peek().map(|e| e.0.reap_ns).filter(|&r| r <= now);
        let out = match (done_at, reap_at) {
            (None, None) => return Reclaimed::Nothing,
            (Some(d), Some(r)) if r < d => self.reap_head(now, send),
            (Some(_), _) => self.expire_head(now, send, from_kept),
            (None, Some(_)) => self.reap_head(now, send),
        };
        if out != Reclaimed::Refused {
            self.refresh_due();
        }
        out
    }

    /// Removes the completion at the head of `done`, or of `kept` if `from_kept`.
    fn expire_head(
        &mut self,
        now: u64,
        send: &mut dyn FnMut(&Step<()>) -> bool,
        from_kept: bool,
    ) -> Reclaimed {
        let head = if from_kept {
            self.kept.peek().copied()
        } else {
            self.done.front().copied()
        };
        let Some(e) = head else {
            return Reclaimed::Nothing;
        };
        let pop = |shard: &mut Self| {
            if from_kept {
                shard.kept.pop();
            } else {
                shard.done.pop_front();
            }
        };
        let common = &self.common;
        let found = self
            .slots
            .find_entry(e.hash, |(_, s, _)| done_matches(s, &e))
            .ok()
            .and_then(|entry| {
                let (key, slot, side) = entry.get();
                expiry(common, side.as_deref(), key, slot, now).map(|step| (entry, step))
            });
        let Some((entry, (step, marker))) = found else {
            pop(self);
            return Reclaimed::Stale;
        };
        if !send(&step) {
            return Reclaimed::Refused;
        }
        let ((key, _, side), _) = entry.remove();
        pop(self);
        self.drop_entry(&key, side);
        self.completed -= 1;
        if let Some(marker) = marker {
            self.markers.insert(marker);
        }
        Reclaimed::Expired
    }

    fn reap_head(&mut self, now: u64, send: &mut dyn FnMut(&Step<()>) -> bool) -> Reclaimed {
        let Some(e) = self.ended.peek().map(|e| e.0) else {
            return Reclaimed::Nothing;
        };
        let found = self
            .slots
            .find_entry(e.hash, |(_, s, _)| lease_matches(s, &e, true))
            .ok()
            .and_then(|entry| {
                machine::reap(&entry.get().1, e.reap_ns, now).map(|step| (entry, step))
            });
        let Some((entry, step)) = found else {
            self.ended.pop();
            return Reclaimed::Stale;
        };
        if !send(&step) {
            return Reclaimed::Refused;
        }
        let ((key, _, side), _) = entry.remove();
        self.ended.pop();
        self.drop_entry(&key, side);
        self.abandoned -= 1;
        self.common.gauges.abandoned.fetch_sub(1, Ordering::AcqRel);
        Reclaimed::Reaped
    }
}

/// The step that removes the expired completion `slot` of `key`, and the marker it leaves
/// when the engine keeps markers and the marker's window is not over yet
/// ([`machine::forget`]); a plain expiry otherwise ([`machine::expire`]). `None` if the slot
/// is not a completion past its retention at `now`.
pub(super) fn expiry(
    common: &Common,
    extra: Option<&Extra>,
    key: &[u8],
    slot: &Slot,
    now: u64,
) -> Option<(Step<()>, Option<Marker>)> {
    let Some(rules) = &common.markers else {
        return machine::expire(slot, now).map(|step| (step, None));
    };
    let id = MarkerId {
        hash: common.hasher.hash(key),
        check: common.hasher.check(key),
    };
    let step = machine::forget(slot, extra, id, rules, now)?;
    let marker = step.answer;
    let step = Step {
        change: step.change,
        write: step.write,
        answer: (),
        deltas: step.deltas,
    };
    Some((step, marker))
}
