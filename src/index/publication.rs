//! Publication of committed completions, off the writer's thread.
//!
//! A completion in a durable engine is hidden from other callers until its record is
//! durable (a replay of a completion a crash could lose would show an outcome that never
//! happened). The writer does not make it visible itself: it only moves two watermarks
//! ([`Marks`]), and whoever locks the completion's stripe next applies them
//! ([`Unpublished::due`], called by `index::Stripe::lock`). So the writer's single thread —
//! the bound on `Buffered` throughput — touches no stripe for a completion, and the
//! callers, who lock the stripe anyway, do the publishing under a lock they already hold.
//!
//! Each stripe queues its unpublished completions with the sequence number of their queued
//! operation. Numbers are issued under the stripe lock, so each stripe's queue is in number
//! order and the watermarks release a prefix of it.
//!
//! Architecture invariant: a completion numbered at or below the durable watermark is
//! visible to every caller that holds its stripe's lock (the lock catches the stripe up
//! before handing it out); one above it is visible to none.
//! Architecture invariant: a completion's response stays in memory until the applied
//! watermark passes it (the file holds its record then); a replay never reads the file
//! for a record that is only in the commit log.

use crate::base::sync::{AtomicU64, Ordering};
use std::collections::VecDeque;

/// The writer's two watermarks, as the index reads them: every operation numbered at or
/// below `durable` is durable, and every one at or below `applied` is in the file too.
/// Without the commit log the two move together; with it, `durable` moves when a batch's
/// log frame is synced and `applied` when the batch reaches the file.
pub(crate) struct Marks {
    durable: AtomicU64,
    applied: AtomicU64,
    /// Test-only sabotage: completions numbered at or below this are shown before their
    /// commit, so the checkers can show they catch a writer that publishes too early.
    #[cfg(idemkv_sabotage)]
    shown_early: AtomicU64,
}

impl Marks {
    pub(crate) fn new() -> Self {
        Self {
            durable: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            #[cfg(idemkv_sabotage)]
            shown_early: AtomicU64::new(0),
        }
    }

    pub(crate) fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Raises the durable watermark; returns the one before.
    pub(crate) fn raise_durable(&self, watermark: u64) -> u64 {
        self.durable.fetch_max(watermark, Ordering::AcqRel)
    }

    /// Raises the applied watermark. Only the thread that applied the batch calls this
    /// (the writer, or with the commit log the applier), after the apply.
    /// Sequentially consistent: see `index::shard::Shard::await_watermark`.
    pub(crate) fn raise_applied(&self, watermark: u64) {
        self.applied.fetch_max(watermark, Ordering::SeqCst);
    }

    /// The applied watermark, read sequentially consistent (`index::shard::Shard::await_watermark`).
    pub(crate) fn applied_now(&self) -> u64 {
        self.applied.load(Ordering::SeqCst)
    }

    /// What a stripe catching up may do: show what is durable, drop the side data of what
    /// is applied. What is applied is durable too (the writer may raise `applied` just
    /// before `durable`), so durable is taken as at least applied.
    pub(crate) fn read(&self) -> (u64, u64) {
        let applied = self.applied.load(Ordering::Acquire);
        #[allow(unused_mut)]
        let mut durable = self.durable();
        #[cfg(idemkv_sabotage)]
        {
            durable = durable.max(self.shown_early.load(Ordering::Acquire));
        }
        (durable.max(applied), applied)
    }

    /// Test-only sabotage: shows the completions numbered up to `seq` before their commit.
    #[cfg(idemkv_sabotage)]
    pub(crate) fn show_early(&self, seq: u64) {
        self.shown_early.fetch_max(seq, Ordering::AcqRel);
    }
}

/// One completion waiting for its watermark: its queued operation's number, and what finds
/// its slot (the table hash and the token, which no other slot carries).
#[derive(Debug, Clone, Copy)]
struct Waiting {
    seq: u64,
    hash: u64,
    token: u64,
}

/// What publishing a completion does with its side data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Drop it: the file holds the record, and replays read it there.
    Drop,
    /// Keep it until the record reaches the file.
    Keep,
}

/// A stripe's unpublished completions, in number order.
#[derive(Default)]
pub(crate) struct Unpublished {
    queue: VecDeque<Waiting>,
    /// How many at the front are shown already (durable, not yet applied).
    shown: usize,
}

impl Unpublished {
    /// Queues the completion `token` (of the key with table hash `hash`), whose operation
    /// is numbered `seq`. Called under the stripe lock that issued `seq`.
    pub(crate) fn push(&mut self, seq: u64, hash: u64, token: u64) {
        assert!(seq > 0, "a durable completion has a sequence number");
        debug_assert!(
            self.queue.back().is_none_or(|w| w.seq < seq),
            "a stripe's numbers are issued in order under its lock"
        );
        self.queue.push_back(Waiting { seq, hash, token });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Hands `publish` every completion the watermarks ([`Marks::read`]) reached, once per
    /// side: [`Side::Drop`] for those applied, [`Side::Keep`] for those only durable. O(1)
    /// when nothing is due, amortized O(1) per completion otherwise.
    pub(crate) fn due(
        &mut self,
        durable: u64,
        applied: u64,
        mut publish: impl FnMut(u64, u64, Side),
    ) {
        debug_assert!(
            applied <= durable,
            "nothing reaches the file before it is durable"
        );
        if self.queue.front().is_none_or(|w| w.seq > durable) {
            return;
        }
        while let Some(w) = self.queue.front().copied().filter(|w| w.seq <= applied) {
            self.queue.pop_front();
            self.shown = self.shown.saturating_sub(1);
            publish(w.hash, w.token, Side::Drop);
        }
        while let Some(w) = self
            .queue
            .get(self.shown)
            .copied()
            .filter(|w| w.seq <= durable)
        {
            self.shown += 1;
            publish(w.hash, w.token, Side::Keep);
        }
        debug_assert!(
            self.queue.front().is_none_or(|w| w.seq > applied)
                && self.queue.get(self.shown).is_none_or(|w| w.seq > durable),
            "everything the watermarks reached was published"
        );
    }

    /// The number of the completion `token` if it is waiting and not yet shown: what a
    /// caller that finds it hidden waits for on the durability progress.
    pub(crate) fn seq_of(&self, token: u64) -> Option<u64> {
        // Search from the back: a waiter usually looks for a recent completion.
        self.queue
            .range(self.shown..)
            .rev()
            .find(|w| w.token == token)
            .map(|w| w.seq)
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.queue.capacity() * std::mem::size_of::<Waiting>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caught_up(u: &mut Unpublished, marks: &Marks) -> Vec<(u64, Side)> {
        let mut seen = Vec::new();
        let (durable, applied) = marks.read();
        u.due(durable, applied, |_, token, side| seen.push((token, side)));
        seen
    }

    #[test]
    fn nothing_is_shown_above_the_durable_watermark() {
        let marks = Marks::new();
        let mut u = Unpublished::default();
        u.push(3, 30, 1);
        u.push(5, 50, 2);
        marks.raise_durable(2);
        marks.raise_applied(2);
        assert!(caught_up(&mut u, &marks).is_empty());
        assert_eq!(u.seq_of(1), Some(3));
        marks.raise_applied(4);
        marks.raise_durable(4);
        assert_eq!(caught_up(&mut u, &marks), vec![(1, Side::Drop)]);
        assert_eq!(u.seq_of(1), None);
        assert_eq!(u.seq_of(2), Some(5));
    }

    #[test]
    fn durable_but_not_applied_is_shown_once_then_settled_once() {
        let marks = Marks::new();
        let mut u = Unpublished::default();
        for (seq, token) in [(1, 10), (2, 11), (4, 12)] {
            u.push(seq, seq * 100, token);
        }
        // The log synced the batch up to 2; the file has none of it yet.
        marks.raise_durable(2);
        assert_eq!(
            caught_up(&mut u, &marks),
            vec![(10, Side::Keep), (11, Side::Keep)]
        );
        assert!(caught_up(&mut u, &marks).is_empty(), "shown only once");
        assert_eq!(u.seq_of(11), None, "a shown completion is not waited for");
        // The batch reached the file, and the next one is synced.
        marks.raise_applied(2);
        marks.raise_durable(4);
        assert_eq!(
            caught_up(&mut u, &marks),
            vec![(10, Side::Drop), (11, Side::Drop), (12, Side::Keep)]
        );
        marks.raise_applied(4);
        assert_eq!(caught_up(&mut u, &marks), vec![(12, Side::Drop)]);
        assert!(u.is_empty());
    }

    #[test]
    fn a_watermark_that_covers_both_settles_without_showing_first() {
        let marks = Marks::new();
        let mut u = Unpublished::default();
        u.push(7, 70, 1);
        marks.raise_applied(9);
        marks.raise_durable(9);
        assert_eq!(caught_up(&mut u, &marks), vec![(1, Side::Drop)]);
    }
}
