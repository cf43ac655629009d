//! A stripe's expiry order: beside its table, each stripe keeps the order in which its
//! slots fall due, so that no caller walks the table to find work. The queues are fields of
//! the stripe's shard (`shard/`, which keeps them up to date); this module has their
//! entries, the min-heap of `kept`, and the rules that match an entry to its slot.
//!
//! - `done`: the completed slots kept for the engine's retention, by end of retention. Their
//!   deadline is `now + retention`, read under the stripe lock, so they arrive in deadline
//!   order and a deque suffices. Recovery loads out of order and sorts once.
//! - `kept`: every other completed slot — one with its own retention longer than the
//!   engine's (whose deadline would break the deque's order for every later completion), or
//!   one that arrives out of order (an import, a key with a shorter retention of its own) —
//!   by end of retention, in a min-heap: O(log n) to enter or leave, O(1) for the next due.
//! - `leases`: every InFlight slot whose end has not been seen yet, by lease end. Leases
//!   have per-claim durations (and `extend`), so this is a heap.
//! - `ended`: every abandoned slot — its lease was seen to end and nobody took it over —
//!   by the instant it is reaped.
//!
//! Entries are deleted lazily: a slot that changes leaves its old entry behind, and the
//! entry is recognised as stale when it comes up (no slot matches it any more) and dropped.
//! A queue is compacted when its stale entries outnumber its live ones by
//! `EXPIRY_COMPACT_SLACK` (`done` and `kept` count together, as they hold one kind of
//! slot), so every stale entry costs O(1) amortized. Per-stripe counts and the boards (kept
//! in `shard::Common`, read by `stripes.rs`) say what is due without a walk.

use crate::base::sabotage::fault_point;
use crate::model::slot::Slot;
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};

/// What only the expiry order asks of a slot.
impl Slot {
    /// Same token, same kind, same deadline: the slot keeps its place in the expiry order.
    pub(super) fn same_place(&self, other: &Slot) -> bool {
        self.token == other.token
            && self.is_inflight() == other.is_inflight()
            && self.deadline_ns == other.deadline_ns
    }
}

/// A completed slot's place in `done` or `kept`: its retention deadline and its key's table
/// hash (the key itself is not copied; the slot is found by hash and deadline, and its tag
/// rules out most neighbours in the same probe sequence: one with the same tag and the same
/// deadline to the nanosecond is due at the same instant, so removing it first is as right,
/// and the entry of the other then finds the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DoneEntry {
    pub(super) deadline_ns: u64,
    pub(super) hash: u64,
}

/// A min-heap of completions by deadline, laid out as the usual implicit binary tree in a
/// vector (children of `i` at `2i + 1` and `2i + 2`), so that the entries due at `now` —
/// a subtree around the root — can be counted without looking at the others.
#[derive(Debug, Default)]
pub(super) struct DueHeap {
    v: Vec<DoneEntry>,
}

impl DueHeap {
    /// The entries in heap order.
    #[cfg(test)]
    pub(super) fn entries(&self) -> &[DoneEntry] {
        &self.v
    }

    pub(super) fn len(&self) -> usize {
        self.v.len()
    }

    pub(super) fn capacity(&self) -> usize {
        self.v.capacity()
    }

    pub(super) fn peek(&self) -> Option<&DoneEntry> {
        self.v.first()
    }

    pub(super) fn push(&mut self, e: DoneEntry) {
        self.v.push(e);
        self.sift_up(self.v.len() - 1);
    }

    pub(super) fn pop(&mut self) -> Option<DoneEntry> {
        let last = self.v.pop()?;
        if self.v.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.v[0], last);
        self.sift_down(0);
        Some(top)
    }

    /// Keeps the entries `keep` accepts and restores the heap order: O(n).
    pub(super) fn retain(&mut self, keep: impl FnMut(&DoneEntry) -> bool) {
        self.v.retain(keep);
        for i in (0..self.v.len() / 2).rev() {
            self.sift_down(i);
        }
    }

    /// How many entries are due at `now`: every due entry's parent is due, so the walk
    /// visits the due entries and at most two others for each: O(due).
    pub(super) fn count_due(&self, now: u64) -> usize {
        let mut count = 0;
        let mut stack = Vec::new();
        if self.v.first().is_some_and(|e| e.deadline_ns <= now) {
            stack.push(0);
        }
        while let Some(i) = stack.pop() {
            count += 1;
            for child in [2 * i + 1, 2 * i + 2] {
                if self.v.get(child).is_some_and(|e| e.deadline_ns <= now) {
                    stack.push(child);
                }
            }
        }
        count
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.v[parent].deadline_ns <= self.v[i].deadline_ns {
                break;
            }
            self.v.swap(parent, i);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let len = self.v.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if l < len && self.v[l].deadline_ns < self.v[least].deadline_ns {
                least = l;
            }
            if r < len && self.v[r].deadline_ns < self.v[least].deadline_ns {
                least = r;
            }
            if least == i {
                break;
            }
            self.v.swap(i, least);
            i = least;
        }
    }
}

/// A lease's place in `leases` (by end) or `ended` (by reap instant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LeaseEntry {
    pub(super) deadline_ns: u64,
    pub(super) reap_ns: u64,
    pub(super) token: u64,
    pub(super) hash: u64,
}

/// Orders `leases` as a min-heap on lease end (ties by token).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ByEnd(pub(super) LeaseEntry);

impl Ord for ByEnd {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.0.deadline_ns, other.0.token).cmp(&(self.0.deadline_ns, self.0.token))
    }
}

impl PartialOrd for ByEnd {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

/// Orders `ended` as a min-heap on reap instant (ties by token).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ByReap(pub(super) LeaseEntry);

impl Ord for ByReap {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.0.reap_ns, other.0.token).cmp(&(self.0.reap_ns, self.0.token))
    }
}

impl PartialOrd for ByReap {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

/// Whether `slot` is the lease `e` stands for, in the queue that holds abandoned leases
/// (`abandoned`) or live ones.
pub(super) fn lease_matches(slot: &Slot, e: &LeaseEntry, abandoned: bool) -> bool {
    slot.token == e.token
        && slot.is_inflight()
        && (slot.deadline_ns == e.deadline_ns || fault_point!(thread TOKEN_ONLY_LEASE_ENTRIES))
        && slot.is_abandoned() == abandoned
}

/// Sets `reap_ns` on the entries of `heap` that `is_old` picks, and rebuilds the heap (its
/// order may depend on the reap instant).
pub(super) fn rewrite<T: Ord>(
    heap: &mut BinaryHeap<T>,
    entry: impl Fn(&mut T) -> &mut LeaseEntry,
    is_old: impl Fn(&LeaseEntry) -> bool,
    reap_ns: u64,
) {
    let mut entries = std::mem::take(heap).into_vec();
    for e in entries.iter_mut().map(&entry).filter(|e| is_old(e)) {
        e.reap_ns = reap_ns;
    }
    *heap = BinaryHeap::from(entries);
}

/// Whether `(key, slot)` is the completion `e` stands for.
pub(super) fn done_matches(slot: &Slot, e: &DoneEntry) -> bool {
    !slot.is_inflight() && slot.deadline_ns == e.deadline_ns && slot.table_hash() == e.hash
}

/// How many entries of `done` are due at `now` (deadline at or before it): a galloping
/// search from the head, so a few due entries cost a few probes.
pub(super) fn due_prefix(done: &VecDeque<DoneEntry>, now: u64) -> usize {
    let due = |i: usize| done[i].deadline_ns <= now;
    let len = done.len();
    if len == 0 || !due(0) {
        return 0;
    }
    let mut hi = 1;
    while hi < len && due(hi) {
        hi = hi.saturating_mul(2);
    }
    let mut lo = hi / 2;
    let mut hi = hi.min(len);
    // Invariant: due(lo), and `hi` is `len` or not due.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if due(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo + 1
}
