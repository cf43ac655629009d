//! The lock-striped in-memory index: the single arbiter of every claim.
//!
//! Architecture invariant: the index never does I/O. A stripe lock is held only for a map
//! lookup, a state transition, and a non-blocking `try_send` to the writer queue (which keeps
//! the queue in per-key order).
//!
//! Memory: a key costs one table entry (its boxed bytes, a 24-byte [`Slot`] and a pointer to
//! its side data) and one entry in its stripe's expiry order (16 bytes for a completion). The
//! rare parts — a fingerprint or checkpoint of an InFlight key, the wall-clock instants and
//! response of a memory-only engine's key — live in a box beside the slot in the same
//! entry, so a completed key in a durable engine carries nothing else once the file holds
//! it (`publication.rs`): its response stays in the file. A transition reads and replaces
//! the side data through the entry it looks up anyway (no second table, no second miss);
//! replacing side data reuses its box, and a stripe keeps a few emptied boxes for the next
//! key that needs one.
//!
//! Expiry order: beside its table, each stripe keeps the order in which its slots fall due,
//! so that no caller walks the table to find work:
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
//! slot), so every stale entry costs O(1) amortized. Per-stripe counts and two lock-free
//! boards ("nothing of this stripe is due before t", the minimum over every queue's head)
//! let the engine answer "what is due, where" without a walk.

use crate::base::hash::KeyHasher;
#[cfg(test)]
use crate::base::limits::HASH_SECRET_LEN;
use crate::base::sabotage::fault_point;
use crate::base::sync::{Arc, AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::index::constants::{EXPIRY_TRIM_MAX, SPARE_EXTRAS_PER_STRIPE};
use crate::index::publication::{Marks, Side, Unpublished};
use crate::index::stats::{Events, Gauges};
use crate::index::wake::Changed;
use crate::model::constants::EXPIRY_COMPACT_SLACK;
use crate::model::machine::{self, Change, MarkerRules, Step, View};
use crate::model::marker::{Marker, MarkerEnded, MarkerId, Markers};
use crate::model::slot::{Extra, Slot, ABANDONED, HAS_EXTRA, PUBLISHED};
use hashbrown::HashTable;
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

/// What only the index asks of a slot: its place in the table and the expiry order.
impl Slot {
    /// The hash the table files this slot under (see [`Key`]).
    fn table_hash(&self) -> u64 {
        let [a, b, c] = self.tag;
        table_hash(u32::from_le_bytes([a, b, c, 0]))
    }

    /// Whether this slot's key has the table tag `tag` (see [`Key::is`]).
    fn has_tag(&self, tag: u32) -> bool {
        self.tag == tag_bytes(tag)
    }

    /// Same token, same kind, same deadline: the slot keeps its place in the expiry order.
    fn same_place(&self, other: &Slot) -> bool {
        self.token == other.token
            && self.is_inflight() == other.is_inflight()
            && self.deadline_ns == other.deadline_ns
    }
}

/// A stripe's emptied side-data boxes, kept for reuse.
#[allow(
    clippy::vec_box,
    reason = "the boxes themselves are what is kept: a slot's side data is a box"
)]
type Spare = Vec<Box<Extra>>;

/// `extra` in one of a stripe's kept boxes if it has one, else in a new box.
fn boxed(extra: Extra, spare: &mut Spare) -> Box<Extra> {
    match spare.pop() {
        Some(mut b) => {
            *b = extra;
            b
        }
        None => Box::new(extra),
    }
}

/// Empties a side-data box that left its slot (its response and checkpoint are freed
/// now: memory promised back goes back) and keeps it among the stripe's `spare` boxes for
/// the next slot that needs one, or frees it when the stripe keeps enough.
fn keep_spare(spare: &mut Spare, mut b: Box<Extra>) {
    if spare.len() < SPARE_EXTRAS_PER_STRIPE {
        *b = Extra::default();
        spare.push(b);
    }
}

/// Heap bytes of a boxed side data: the box and what it holds.
fn boxed_bytes(extra: &Extra) -> usize {
    std::mem::size_of::<Extra>() + extra.heap_bytes()
}

/// A table entry: the key's bytes, its slot, and its side data, if any.
type Entry = (Box<[u8]>, Slot, Option<Box<Extra>>);

/// A completed slot's place in `done` or `kept`: its retention deadline and its key's table
/// hash (the
/// key itself is not copied; the slot is found by hash and deadline, and its tag rules out
/// most neighbours in the same probe sequence: one with the same tag and the same deadline
/// to the nanosecond is due at the same instant, so removing it first is as right, and the
/// entry of the other then finds the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DoneEntry {
    deadline_ns: u64,
    hash: u64,
}

/// A min-heap of completions by deadline, laid out as the usual implicit binary tree in a
/// vector (children of `i` at `2i + 1` and `2i + 2`), so that the entries due at `now` —
/// a subtree around the root — can be counted without looking at the others.
#[derive(Debug, Default)]
struct DueHeap {
    v: Vec<DoneEntry>,
}

impl DueHeap {
    fn len(&self) -> usize {
        self.v.len()
    }

    fn capacity(&self) -> usize {
        self.v.capacity()
    }

    fn peek(&self) -> Option<&DoneEntry> {
        self.v.first()
    }

    fn push(&mut self, e: DoneEntry) {
        self.v.push(e);
        self.sift_up(self.v.len() - 1);
    }

    fn pop(&mut self) -> Option<DoneEntry> {
        let last = self.v.pop()?;
        if self.v.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.v[0], last);
        self.sift_down(0);
        Some(top)
    }

    /// Keeps the entries `keep` accepts and restores the heap order: O(n).
    fn retain(&mut self, keep: impl FnMut(&DoneEntry) -> bool) {
        self.v.retain(keep);
        for i in (0..self.v.len() / 2).rev() {
            self.sift_down(i);
        }
    }

    /// How many entries are due at `now`: every due entry's parent is due, so the walk
    /// visits the due entries and at most two others for each: O(due).
    fn count_due(&self, now: u64) -> usize {
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
struct LeaseEntry {
    deadline_ns: u64,
    reap_ns: u64,
    token: u64,
    hash: u64,
}

/// Orders `leases` as a min-heap on lease end (ties by token).
#[derive(Debug, PartialEq, Eq)]
struct ByEnd(LeaseEntry);

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
struct ByReap(LeaseEntry);

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
fn lease_matches(slot: &Slot, e: &LeaseEntry, abandoned: bool) -> bool {
    slot.token == e.token
        && slot.is_inflight()
        && (slot.deadline_ns == e.deadline_ns || fault_point!(thread TOKEN_ONLY_LEASE_ENTRIES))
        && slot.is_abandoned() == abandoned
}

/// Sets `reap_ns` on the entries of `heap` that `is_old` picks, and rebuilds the heap (its
/// order may depend on the reap instant).
fn rewrite<T: Ord>(
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
fn done_matches(slot: &Slot, e: &DoneEntry) -> bool {
    !slot.is_inflight() && slot.deadline_ns == e.deadline_ns && slot.table_hash() == e.hash
}

/// How many entries of `done` are due at `now` (deadline at or before it): a galloping
/// search from the head, so a few due entries cost a few probes.
fn due_prefix(done: &VecDeque<DoneEntry>, now: u64) -> usize {
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

/// What every stripe shares: the engine-wide gauges it keeps current, and the boards.
pub(crate) struct Common {
    retention_ns: u64,
    /// The keyed hashes, for the marker a completion leaves (its key's hashes).
    hasher: KeyHasher,
    /// Markers of completions past their retention, if the engine keeps them.
    markers: Option<MarkerRules>,
    /// The engine's gauges: its `inflight` counter holds the leases counted against the
    /// in-flight limit, its `abandoned` counter the abandoned leases.
    gauges: Arc<Gauges>,
    /// Per stripe: no lease of the stripe ends before this instant (ns). Written under the
    /// stripe's lock, read without it; a lower bound, since stale entries may hold it down.
    lease_due: Box<[AtomicU64]>,
    /// Per stripe: no completion expires and no abandoned lease is due to be reaped before
    /// this instant (ns).
    reclaim_due: Box<[AtomicU64]>,
    /// The writer's watermarks, by which each stripe publishes its completions when locked.
    marks: Arc<Marks>,
    /// Per stripe: whether it may hold completions not yet published. Written under the
    /// stripe's lock, read without it.
    unpublished: Box<[AtomicBool]>,
}

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

/// One stripe's map and expiry order. Every method keeps `slots`, the side data, the byte
/// count, the per-kind counts, the queues and the engine-wide gauges consistent.
pub(crate) struct Shard {
    /// Each key's bytes, its slot and the slot's side data (boxed, so a key without any
    /// costs one pointer): kept in the key's own entry, so a transition that reads or
    /// writes side data touches the entry it already holds for the slot.
    slots: HashTable<Entry>,
    /// The index's hasher, for tests that make keys from a shard.
    #[cfg(test)]
    hasher: KeyHasher,
    /// Heap bytes of keys and side data (their boxes included), for the memory estimate.
    heap_bytes: usize,
    /// Completed slots kept for the engine's retention, earliest deadline first, and stale
    /// entries (all of them already due: a completion leaves before its deadline only
    /// through recovery's deduplication, which compacts).
    done: VecDeque<DoneEntry>,
    /// Every other completed slot (see the module docs), and stale entries (all due, as in
    /// `done`). Every completed slot is in exactly one of `done` and `kept`.
    kept: DueHeap,
    /// Every InFlight slot not yet seen to end, and stale entries.
    leases: BinaryHeap<ByEnd>,
    /// Every abandoned slot, and stale entries.
    ended: BinaryHeap<ByReap>,
    /// What completions past their retention left behind, when the engine keeps markers:
    /// apart from the slots and their expiry order (`marker.rs`).
    markers: Markers,
    /// InFlight slots counted live, abandoned slots, completed slots.
    live: usize,
    abandoned: usize,
    completed: usize,
    /// Recovery is loading the file: `done` is sorted once at the end.
    loading: bool,
    /// Completions waiting for the writer's watermarks (`publication.rs`).
    unpublished: Unpublished,
    /// Emptied side-data boxes kept for the next slot that needs one, at most
    /// `SPARE_EXTRAS_PER_STRIPE`: a box then moves between the publication that empties it
    /// and the claim that fills it without a free and a malloc under the lock.
    spare: Spare,
    common: Arc<Common>,
    id: usize,
    /// Events counted under this stripe's lock (see [`Events`]).
    pub(crate) events: Events,
}

impl Shard {
    fn new(hasher: &KeyHasher, common: Arc<Common>, id: usize) -> Self {
        #[cfg(not(test))]
        let _ = hasher;
        Self {
            slots: HashTable::new(),
            #[cfg(test)]
            hasher: hasher.clone(),
            heap_bytes: 0,
            done: VecDeque::new(),
            kept: DueHeap::default(),
            leases: BinaryHeap::new(),
            ended: BinaryHeap::new(),
            markers: Markers::default(),
            live: 0,
            abandoned: 0,
            completed: 0,
            loading: false,
            unpublished: Unpublished::default(),
            spare: Vec::new(),
            common,
            id,
            events: Events::default(),
        }
    }

    /// `bytes` with its hash under this index's hasher (the one every stripe shares).
    #[cfg(test)]
    pub(crate) fn key<'a>(&self, bytes: &'a [u8]) -> Key<'a> {
        Key::new(&self.hasher, bytes)
    }

    pub(crate) fn get(&self, key: Key<'_>) -> Option<Slot> {
        let hash = key.hash;
        self.slots
            .find(hash, |(k, s, _)| key.is(k, s))
            .map(|(_, s, _)| *s)
    }

    /// The side data of `slot` (one this stripe holds): found by the slot's table hash and
    /// its token, which no other key's slot carries.
    pub(crate) fn extra(&self, slot: &Slot) -> Option<&Extra> {
        if !slot.has_extra() {
            return None;
        }
        self.slots
            .find(slot.table_hash(), |(_, s, _)| s.token == slot.token)
            .and_then(|(_, _, extra)| extra.as_deref())
    }

    /// The key's state, as the state machine reads it: one lookup for the slot and its
    /// side data.
    pub(crate) fn view(&self, key: Key<'_>) -> View<'_> {
        let hash = key.hash;
        match self.slots.find(hash, |(k, s, _)| key.is(k, s)) {
            Some((_, slot, extra)) => View {
                slot: Some(*slot),
                extra: extra.as_deref(),
            },
            None => View {
                slot: None,
                extra: None,
            },
        }
    }

    /// Applies a state machine's change to the key, whose write was queued as operation
    /// `seq` (0: nothing was queued). A completion of a durable engine is published when the
    /// writer's watermark passes `seq`.
    pub(crate) fn apply(&mut self, key: Key<'_>, change: Change, seq: u64) {
        let unpublished = match &change {
            Change::Put { slot, .. } if seq != 0 && !slot.is_inflight() && !slot.is_published() => {
                Some(slot.token)
            }
            _ => None,
        };
        self.change(key, change);
        if let Some(token) = unpublished {
            self.await_watermark(key, token, seq);
        }
    }

    /// Queues the completion `token` of `key` (just put) for publication at `seq`. The
    /// writer may have committed and applied `seq` already, and looked for stripes to
    /// publish before this flag was set: then nobody would come back for it, so the
    /// completion is published here. (The flag's store and the applied watermark's load
    /// here, and the writer's store of the watermark and load of the flags, are
    /// sequentially consistent: one side sees the other.)
    fn await_watermark(&mut self, key: Key<'_>, token: u64, seq: u64) {
        self.unpublished.push(seq, key.hash, token);
        let flag = &self.common.unpublished[self.id];
        if !flag.load(Ordering::Relaxed) {
            flag.store(true, Ordering::SeqCst);
        }
        if self.common.marks.applied_now() >= seq {
            self.catch_up();
        }
    }

    fn change(&mut self, key: Key<'_>, change: Change) {
        match change {
            Change::Keep => {}
            Change::Remove => {
                self.remove(key);
            }
            Change::Put {
                slot,
                extra,
                reap_ns,
                adopt,
            } => {
                if adopt {
                    self.adopt(key);
                }
                self.put_with(key, slot, extra, reap_ns);
            }
        }
    }

    /// Sets the key's slot and side data, replacing whatever it had (and its side data). An
    /// InFlight slot is reaped `retention` after its lease ends, unless it is taken over,
    /// settled or extended first. (The engine goes through [`Shard::apply`].)
    #[cfg(test)]
    pub(crate) fn put(&mut self, key: Key<'_>, slot: Slot, extra: Extra) {
        self.put_with(key, slot, extra, None);
    }

    /// [`Shard::put`] of an InFlight slot found in the file (or imported), whose reap
    /// instant comes from its recorded lease end rather than its in-memory deadline.
    #[cfg(test)]
    pub(crate) fn put_reaped_at(&mut self, key: Key<'_>, slot: Slot, extra: Extra, reap_ns: u64) {
        self.put_with(key, slot, extra, Some(reap_ns));
    }

    fn put_with(&mut self, key: Key<'_>, mut slot: Slot, extra: Extra, reap_ns: Option<u64>) {
        let hash = key.hash;
        let has_extra = !extra.is_empty();
        let own_retention_ns = extra.retention_ms.map(|ms| ms.saturating_mul(1_000_000));
        // The caller's copy may carry stale flags and no tag; this table decides them.
        slot.flags &= !(HAS_EXTRA | ABANDONED);
        slot.tag = tag_bytes(key.tag);
        if has_extra {
            slot.flags |= HAS_EXTRA;
        }
        // Heap bytes the change adds and frees (a side-data box counts its size).
        let mut added = if has_extra { extra.heap_bytes() } else { 0 };
        let mut freed = 0;
        // One lookup when the key exists (every transition but a first claim).
        let old = match self.slots.find_mut(hash, |(k, s, _)| key.is(k, s)) {
            Some((_, existing, side)) => {
                let old = *existing;
                // A checkpoint of an abandoned lease leaves it abandoned.
                if old.is_abandoned() && old.same_place(&slot) {
                    slot.flags |= ABANDONED;
                }
                *existing = slot;
                // The old side data goes; its box carries the new side data, if any.
                match (side.as_deref_mut(), has_extra) {
                    (Some(held), true) => freed = std::mem::replace(held, extra).heap_bytes(),
                    (Some(_), false) => {
                        if let Some(b) = side.take() {
                            freed = boxed_bytes(&b);
                            keep_spare(&mut self.spare, b);
                        }
                    }
                    (None, true) => {
                        added += std::mem::size_of::<Extra>();
                        *side = Some(boxed(extra, &mut self.spare));
                    }
                    (None, false) => {}
                }
                Some(old)
            }
            None => {
                added += key.bytes.len();
                let side = has_extra.then(|| {
                    added += std::mem::size_of::<Extra>();
                    boxed(extra, &mut self.spare)
                });
                self.slots
                    .insert_unique(hash, (Box::from(key.bytes), slot, side), |(_, s, _)| {
                        s.table_hash()
                    });
                None
            }
        };
        self.heap_bytes = (self.heap_bytes + added).saturating_sub(freed);
        match old {
            Some(old) if old.same_place(&slot) => {
                if let (Some(reap_ns), true) = (reap_ns, slot.is_inflight()) {
                    self.set_reap(hash, &old, reap_ns);
                }
            }
            _ => {
                if let Some(old) = old {
                    self.leave(hash, &old);
                }
                self.enter(hash, &slot, reap_ns, own_retention_ns);
                self.compact_if_stale();
                self.refresh_due();
            }
        }
    }

    /// Gives the InFlight slot `old`, which keeps its place, the reap instant `reap_ns`: its
    /// entry is rewritten where it is (`ended` if the lease is abandoned, else `leases`) and
    /// that heap rebuilt. Only an extension that leaves the deadline where it was asks this
    /// (rare), so the linear rebuild costs nothing on the common paths.
    fn set_reap(&mut self, hash: u64, old: &Slot, reap_ns: u64) {
        let is_old = |e: &LeaseEntry| {
            e.hash == hash && e.token == old.token && e.deadline_ns == old.deadline_ns
        };
        if old.is_abandoned() {
            rewrite(&mut self.ended, |e| &mut e.0, is_old, reap_ns);
        } else {
            rewrite(&mut self.leases, |e| &mut e.0, is_old, reap_ns);
        }
        self.refresh_due();
    }

    /// The slot stops being what it was: its queue entry goes stale. An abandoned lease
    /// settled by its holder (completed, released, extended) is counted live again first,
    /// since the holder's bookkeeping settles it as a live lease.
    fn leave(&mut self, hash: u64, old: &Slot) {
        if !old.is_inflight() {
            self.completed -= 1;
            let is_old = |e: &DoneEntry| e.hash == hash && e.deadline_ns == old.deadline_ns;
            if self.done.front().is_some_and(is_old) {
                self.done.pop_front();
            } else if self.kept.peek().is_some_and(is_old) {
                self.kept.pop();
            }
        } else if old.is_abandoned() {
            self.abandoned -= 1;
            self.common.gauges.inflight.fetch_add(1, Ordering::AcqRel);
            self.common.gauges.abandoned.fetch_sub(1, Ordering::AcqRel);
            if self.ended.peek().is_some_and(|e| e.0.token == old.token) {
                self.ended.pop();
            }
        } else {
            self.live -= 1;
            self.trim_leases(old);
        }
    }

    /// Pops the settled lease's entry if it is on top of `leases`, and then a few stale
    /// entries below it (one lookup each). Leases mostly settle in the order they began, so
    /// this keeps the heap near its live size without waiting for a compaction; each entry
    /// is popped once, and the work per call is bounded.
    fn trim_leases(&mut self, settled: &Slot) {
        let top_is =
            |e: &LeaseEntry| e.token == settled.token && e.deadline_ns == settled.deadline_ns;
        if !self.leases.peek().is_some_and(|e| top_is(&e.0)) {
            return;
        }
        self.leases.pop();
        for _ in 0..EXPIRY_TRIM_MAX {
            let Some(e) = self.leases.peek().map(|e| e.0) else {
                break;
            };
            if self
                .slots
                .find(e.hash, |(_, s, _)| lease_matches(s, &e, false))
                .is_some()
            {
                break;
            }
            self.leases.pop();
        }
    }

    /// The slot takes its place in the expiry order. `own_retention_ns` is the key's own
    /// retention, if it has one: an abandoned lease is reaped that long after its end, and a
    /// completion that keeps the key longer than the engine does waits in `kept`.
    fn enter(
        &mut self,
        hash: u64,
        slot: &Slot,
        reap_ns: Option<u64>,
        own_retention_ns: Option<u64>,
    ) {
        if slot.is_inflight() {
            self.live += 1;
            let retention_ns = own_retention_ns.unwrap_or(self.common.retention_ns);
            let reap_ns = reap_ns.unwrap_or_else(|| slot.deadline_ns.saturating_add(retention_ns));
            self.leases.push(ByEnd(LeaseEntry {
                deadline_ns: slot.deadline_ns,
                reap_ns,
                token: slot.token,
                hash,
            }));
        } else {
            self.completed += 1;
            let e = DoneEntry {
                deadline_ns: slot.deadline_ns,
                hash,
            };
            // A completion kept no longer than the engine's retention and not before the
            // deque's last entry never holds back a later completion of the engine's
            // retention (whose deadline is `now + retention`): the deque stays ordered.
            let fits = own_retention_ns.is_none_or(|r| r <= self.common.retention_ns)
                && self
                    .done
                    .back()
                    .is_none_or(|b| b.deadline_ns <= e.deadline_ns);
            if self.loading || fits {
                self.done.push_back(e);
            } else {
                self.kept.push(e);
            }
        }
    }

    /// Drops the stale entries of a queue whose stale entries outnumber its live ones by
    /// the slack: O(queue) work paid for by at least as many stale entries.
    fn compact_if_stale(&mut self) {
        let slack = EXPIRY_COMPACT_SLACK;
        let slots = &self.slots;
        if self.leases.len() > 2 * self.live + slack {
            self.leases.retain(|e| {
                slots
                    .find(e.0.hash, |(_, s, _)| lease_matches(s, &e.0, false))
                    .is_some()
            });
        }
        if self.ended.len() > 2 * self.abandoned + slack {
            self.ended.retain(|e| {
                slots
                    .find(e.0.hash, |(_, s, _)| lease_matches(s, &e.0, true))
                    .is_some()
            });
        }
        if !self.loading && self.done.len() + self.kept.len() > 2 * self.completed + slack {
            self.done
                .retain(|e| slots.find(e.hash, |(_, s, _)| done_matches(s, e)).is_some());
            self.kept
                .retain(|e| slots.find(e.hash, |(_, s, _)| done_matches(s, e)).is_some());
        }
    }

    /// Publishes where nothing of this stripe falls due before (see [`Common`]).
    fn refresh_due(&self) {
        let lease = self.leases.peek().map_or(u64::MAX, |e| e.0.deadline_ns);
        let done = self.done.front().map_or(u64::MAX, |e| e.deadline_ns);
        let kept = self.kept.peek().map_or(u64::MAX, |e| e.deadline_ns);
        let reap = self.ended.peek().map_or(u64::MAX, |e| e.0.reap_ns);
        let marker = self.markers.next_end().unwrap_or(u64::MAX);
        let set = |cell: &AtomicU64, v: u64| {
            // Read first: the boards are shared by many stripes and rarely change.
            if cell.load(Ordering::Relaxed) != v {
                cell.store(v, Ordering::Relaxed);
            }
        };
        set(&self.common.lease_due[self.id], lease);
        set(
            &self.common.reclaim_due[self.id],
            done.min(kept).min(reap).min(marker),
        );
    }

    /// Marks the completion by `token` of the key whose keyed hash is `keyed` durable. With
    /// [`Side::Drop`] its side data goes too (the file holds all of it now). With
    /// [`Side::Keep`] (a batch acknowledged by its commit-log frame before it reached the
    /// file) its side data, which holds the response, stays so that replays answer from
    /// memory until a later [`Side::Drop`]. Does nothing if the key has moved on.
    /// The slot is found by its table hash and its token, which no other key's slot
    /// carries, so the key's bytes are neither needed nor hashed again.
    #[cfg(test)]
    pub(crate) fn publish(&mut self, keyed: u64, token: u64, side: Side) {
        self.publish_at(table_hash(tag_of(keyed)), token, side);
    }

    /// [`Shard::publish`] of the slot filed under the table hash `hash`.
    fn publish_at(&mut self, hash: u64, token: u64, side: Side) {
        let Some((_, slot, extra)) = self.slots.find_mut(hash, |(_, s, _)| s.token == token) else {
            return;
        };
        if slot.is_inflight() {
            return;
        }
        match side {
            Side::Keep => {
                // Every unpublished completion keeps its response until the file holds it
                // (an import's included): a Keep that shows nothing would leave a waiter
                // that looked up its number waiting for a wake that never comes.
                debug_assert!(
                    extra.as_ref().is_some_and(|e| e.response.is_some()),
                    "an unpublished completion holds its response"
                );
                if extra.as_ref().is_some_and(|e| e.response.is_some()) {
                    slot.flags |= PUBLISHED;
                }
            }
            Side::Drop => {
                slot.flags |= PUBLISHED;
                slot.flags &= !HAS_EXTRA;
                if let Some(b) = extra.take() {
                    self.heap_bytes = self.heap_bytes.saturating_sub(boxed_bytes(&b));
                    keep_spare(&mut self.spare, b);
                }
            }
        }
    }

    /// Publishes the completions the writer's watermarks have reached: the stripe's lock
    /// calls this before handing the shard out, so no holder sees a durable completion
    /// hidden, and so do [`unlocked`] and [`wait`] when they take it again.
    fn catch_up(&mut self) {
        if self.unpublished.is_empty() {
            return;
        }
        let (durable, applied) = self.common.marks.read();
        let mut unpublished = std::mem::take(&mut self.unpublished);
        unpublished.due(durable, applied, |hash, token, side| {
            self.publish_at(hash, token, side);
        });
        self.unpublished = unpublished;
        if self.unpublished.is_empty() {
            self.common.unpublished[self.id].store(false, Ordering::Relaxed);
        }
    }

    /// The number of the queued operation whose durability publishes `key`'s completion,
    /// if the key holds one not visible yet: what a caller waits for on the durability
    /// progress, since no notification on the stripe announces it.
    pub(crate) fn published_at(&self, key: Key<'_>) -> Option<u64> {
        let slot = self.get(key)?;
        if slot.is_inflight() || slot.is_published() {
            return None;
        }
        self.unpublished.seq_of(slot.token)
    }

    /// Removes the key and its side data; returns the slot it had.
    pub(crate) fn remove(&mut self, key: Key<'_>) -> Option<Slot> {
        let hash = key.hash;
        let entry = self.slots.find_entry(hash, |(k, s, _)| key.is(k, s)).ok()?;
        let ((k, slot, side), _) = entry.remove();
        self.drop_entry(&k, side);
        self.leave(hash, &slot);
        self.compact_if_stale();
        self.refresh_due();
        Some(slot)
    }

    /// Frees a removed entry's heap bytes from the count.
    fn drop_entry(&mut self, key: &[u8], side: Option<Box<Extra>>) {
        let freed = key.len() + side.map_or(0, |b| boxed_bytes(&b));
        self.heap_bytes = self.heap_bytes.saturating_sub(freed);
    }

    /// A takeover of an abandoned lease, whose claim has reserved a place in the live count:
    /// the slot leaves the abandoned set without being counted live a second time. The
    /// caller replaces the slot right after, under the same lock.
    pub(crate) fn adopt(&mut self, key: Key<'_>) {
        let hash = key.hash;
        if let Some((_, slot, _)) = self.slots.find_mut(hash, |(k, s, _)| key.is(k, s)) {
            if slot.is_abandoned() {
                slot.flags &= !ABANDONED;
                self.abandoned -= 1;
                self.live += 1;
                self.common.gauges.abandoned.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

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

    /// The key's marker, if it has one: found by the key's keyed hash, and taken for this
    /// key's only if the second, independent hash matches too (computed only on a hit).
    pub(crate) fn marker(&self, key: Key<'_>) -> Option<Marker> {
        let m = self.markers.get(key.keyed)?;
        (m.check == self.common.hasher.check(key.bytes)).then_some(*m)
    }

    /// Markers held by this stripe.
    pub(crate) fn markers_len(&self) -> usize {
        self.markers.len()
    }

    /// A claim found `key`'s completion past its retention while markers are on: it is
    /// expired now, as the sweeper would expire it, once `send` has queued the step, and
    /// leaves its marker. Nothing is done if the key has no such completion, or if the
    /// marker's window is over too (the claim then replaces the completion as it would
    /// without markers).
    pub(crate) fn forget(
        &mut self,
        key: Key<'_>,
        now: u64,
        send: &mut dyn FnMut(&Step<()>) -> bool,
    ) -> Forgot {
        let View {
            slot: Some(slot),
            extra,
        } = self.view(key)
        else {
            return Forgot::Nothing;
        };
        let step = expiry(&self.common, extra, key.bytes, &slot, now);
        let Some((step, Some(marker))) = step else {
            return Forgot::Nothing;
        };
        if !send(&step) {
            return Forgot::Refused;
        }
        self.remove(key);
        self.markers.insert(marker);
        self.refresh_due();
        Forgot::Marked(marker)
    }

    /// Drops the marker of `hash` left by the completion `token` (a claim acquires its key).
    pub(crate) fn drop_marker(&mut self, hash: u64, token: u64) {
        if self.markers.remove(hash, token).is_some() {
            self.refresh_due();
        }
    }

    /// The writer committed the row of the marker `hash` left by `token`: a pending marker
    /// takes the row's fingerprint, completion time and attempt (`None`: the record was not
    /// in the file, so no row was written and the marker goes). Returns whether a pending
    /// marker was there.
    pub(crate) fn settle_marker(
        &mut self,
        hash: u64,
        token: u64,
        row: Option<&crate::model::codec::MarkerRecord>,
    ) -> bool {
        let Some(marker) = self.markers.pending_mut(hash, token) else {
            return false;
        };
        match row {
            Some(r) => Markers::settle(marker, r.fingerprint, r.completed_wall_ms, r.attempt),
            None => {
                self.markers.remove(hash, token);
                self.refresh_due();
            }
        }
        true
    }

    /// Recovery loads a marker from the file (or from a completion it found past its
    /// retention). The later of two markers of one hash wins.
    pub(crate) fn load_marker(&mut self, marker: Marker) {
        self.markers.insert(marker);
        self.refresh_due();
    }

    /// Removes this stripe's earliest marker if it has ended by `now`, once `send` has
    /// queued the deletion of its row (the state machine's [`machine::end_marker`]).
    pub(crate) fn end_marker(
        &mut self,
        now: u64,
        send: &mut dyn FnMut(&Step<()>) -> bool,
    ) -> MarkerEnded {
        let durable = self.common.markers.is_some_and(|r| r.durable);
        let out = self.markers.end_head(now, &mut |m| {
            machine::end_marker(m, now, durable).is_some_and(|step| send(&step))
        });
        if out != MarkerEnded::Nothing && out != MarkerEnded::Refused {
            self.refresh_due();
        }
        out
    }

    /// Whether anything is due at `now`: a lease to end, a completion or an abandoned lease
    /// to remove (possibly a stale entry).
    pub(crate) fn has_due(&self, now: u64) -> bool {
        self.leases.peek().is_some_and(|e| e.0.deadline_ns <= now)
            || self.done.front().is_some_and(|e| e.deadline_ns <= now)
            || self.kept.peek().is_some_and(|e| e.deadline_ns <= now)
            || self.ended.peek().is_some_and(|e| e.0.reap_ns <= now)
            || self.markers.next_end().is_some_and(|end| end <= now)
    }

    /// Completed keys past their retention at `now` and not yet removed: O(log due) from
    /// the head of `done`, O(due) from the root of `kept` (only entries that are due are
    /// looked at, none when the sweeper keeps up). Every stale entry of either queue is
    /// due, so they are subtracted.
    pub(crate) fn expired_unswept(&self, now: u64) -> u64 {
        let due = due_prefix(&self.done, now) + self.kept.count_due(now);
        let stale = (self.done.len() + self.kept.len()).saturating_sub(self.completed);
        due.saturating_sub(stale) as u64
    }

    /// Recovery begins loading the file: completions are not ordered one by one.
    fn begin_load(&mut self) {
        self.loading = true;
    }

    /// Recovery is done: order `done` once (dropping what a deduplicated record left), and
    /// move the completions due after `now + retention` (kept longer than the engine keeps
    /// a key, by their own retention or an earlier, longer engine retention) to `kept`, so
    /// that every completion made from now on still finds `done` in order.
    fn finish_load(&mut self, now: u64) {
        self.loading = false;
        if self.done.len() != self.completed {
            let slots = &self.slots;
            self.done
                .retain(|e| slots.find(e.hash, |(_, s, _)| done_matches(s, e)).is_some());
        }
        self.done
            .make_contiguous()
            .sort_unstable_by_key(|e| e.deadline_ns);
        let horizon = now.saturating_add(self.common.retention_ns);
        let at = self.done.partition_point(|e| e.deadline_ns <= horizon);
        for e in self.done.drain(at..) {
            self.kept.push(e);
        }
        self.compact_if_stale();
        self.refresh_due();
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &Slot)> {
        self.slots.iter().map(|(k, s, _)| (&**k, s))
    }

    /// Pre-sizes the markers (recovery); a failed reservation only means growing later.
    pub(crate) fn reserve_markers(&mut self, additional: usize) -> bool {
        self.markers.try_reserve(additional)
    }

    /// Pre-sizes the table and the completion order; a failed reservation only means
    /// growing later.
    pub(crate) fn try_reserve(&mut self, additional: usize) -> bool {
        let table = self
            .slots
            .try_reserve(additional, |(_, s, _)| s.table_hash())
            .is_ok();
        table && self.done.try_reserve(additional).is_ok()
    }

    /// Bytes this shard holds: table buckets and queue entries at their capacity, plus
    /// heap allocations.
    pub(crate) fn memory_bytes(&self) -> usize {
        let slot_bucket = std::mem::size_of::<Entry>() + 1;
        self.slots.capacity() * slot_bucket
            + (self.done.capacity() + self.kept.capacity()) * std::mem::size_of::<DoneEntry>()
            + (self.leases.capacity() + self.ended.capacity()) * std::mem::size_of::<LeaseEntry>()
            + self.markers.memory_bytes()
            + self.unpublished.memory_bytes()
            + self.spare.capacity() * std::mem::size_of::<Box<Extra>>()
            + self.spare.len() * std::mem::size_of::<Extra>()
            + self.heap_bytes
    }
}

/// The step that removes the expired completion `slot` of `key`, and the marker it leaves
/// when the engine keeps markers and the marker's window is not over yet
/// ([`machine::forget`]); a plain expiry otherwise ([`machine::expire`]). `None` if the slot
/// is not a completion past its retention at `now`.
fn expiry(
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

/// What [`Shard::forget`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forgot {
    /// The key has no completion past its retention with a marker window left.
    Nothing,
    /// The completion was removed and left this marker.
    Marked(Marker),
    /// Its step could not be queued; nothing changed.
    Refused,
}

/// A key with its keyed hash. Made once per operation ([`Index::lock`]), so the key is
/// hashed once whether the operation picks a stripe, looks a slot up or inserts one.
///
/// One keyed hash gives two independent parts: bits 32 and up pick the stripe, and the low
/// `TAG_BITS` are the key's tag, from which the stripe's table derives the hash it files the
/// key under. The tag is kept in the slot, so the table grows (rehashes every entry) without
/// reading a key or computing a keyed hash. A table of more than 2^`TAG_BITS` buckets (over
/// eight million keys in one stripe) would have more buckets than tags, and probe longer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key<'a> {
    bytes: &'a [u8],
    /// The whole keyed hash: a marker's name for the key.
    keyed: u64,
    /// The table hash: `table_hash(tag)`.
    hash: u64,
    tag: u32,
    /// Bits 32 to 63 of the keyed hash.
    stripe_bits: u32,
}

/// Bits of the keyed hash kept in a slot (the padding holds three bytes).
const TAG_BITS: u32 = 24;

/// The table tag of a key whose keyed hash is `keyed`: its low `TAG_BITS` bits.
fn tag_of(keyed: u64) -> u32 {
    (keyed as u32) & ((1 << TAG_BITS) - 1)
}

/// The hash a stripe's table files a key of tag `tag` under: a multiply spreads the tag
/// over the table's bucket bits (the low ones) and its control bits (the top seven).
fn table_hash(tag: u32) -> u64 {
    u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The three bytes of a 24-bit table tag, as a slot stores them.
fn tag_bytes(tag: u32) -> [u8; 3] {
    let [a, b, c, _] = tag.to_le_bytes();
    [a, b, c]
}

impl<'a> Key<'a> {
    /// Whether the table entry (`k`, `s`) is this key. The tag is compared first: a
    /// control-byte match of another key then costs no read of its boxed key (a cache
    /// miss), and only keys with equal 24-bit tags are compared byte by byte.
    fn is(&self, k: &[u8], s: &Slot) -> bool {
        debug_assert!(
            s.has_tag(self.tag) || k != self.bytes,
            "a key's slot carries its tag"
        );
        s.has_tag(self.tag) && k == self.bytes
    }

    fn new(hasher: &KeyHasher, bytes: &'a [u8]) -> Self {
        let keyed = hasher.hash(bytes);
        let tag = tag_of(keyed);
        Key {
            bytes,
            keyed,
            hash: table_hash(tag),
            tag,
            stripe_bits: (keyed >> 32) as u32,
        }
    }

    pub(crate) fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// A lock and the condition variable its waiters sleep on.
pub(crate) struct Stripe {
    /// Locked through [`Stripe::lock`] only, which publishes what is due first.
    map: Mutex<Shard>,
    /// Notified on every state change that could settle a waiter: a memory-only
    /// completion, release, takeover, settled marker, poison, close, clock jump. (A durable
    /// completion is published by the writer's watermark, which waiters watch instead.)
    changed: Changed,
}

impl Stripe {
    /// Wakes the stripe's waiters to look again (see `changed`).
    pub(crate) fn notify_changed(&self) {
        self.changed.notify_all();
    }

    /// Locks the stripe, first publishing the completions the writer's watermarks reached.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Shard> {
        let mut shard = self.map.lock();
        shard.catch_up();
        shard
    }
}

/// Lets the stripe go while `f` runs, then takes it again and publishes what came due
/// meanwhile: a holder that lets go of its stripe and comes back does it through this or
/// [`wait`], as a new holder goes through [`Stripe::lock`].
pub(crate) fn unlocked<U>(shard: &mut MutexGuard<'_, Shard>, f: impl FnOnce() -> U) -> U {
    let out = MutexGuard::unlocked(shard, f);
    shard.catch_up();
    out
}

/// Sleeps on the stripe's change signal until notified or `timeout` passes, then publishes
/// what came due meanwhile (see [`unlocked`]).
pub(crate) fn wait(changed: &Changed, shard: &mut MutexGuard<'_, Shard>, timeout: Duration) {
    changed.wait_for(shard, timeout);
    shard.catch_up();
}

/// Aligns each stripe to its own cache lines, so that stripes do not false-share.
#[repr(align(128))]
struct Padded(Stripe);

/// How the index hashes keys and whether it keeps markers.
pub(crate) struct Keying {
    pub(crate) hasher: KeyHasher,
    pub(crate) markers: Option<MarkerRules>,
    /// The writer's watermarks, by which stripes publish completions.
    pub(crate) marks: Arc<Marks>,
}

pub(crate) struct Index {
    stripes: Box<[Padded]>,
    mask: u64,
    /// Keyed with a secret (see [`KeyHasher`]): clients choose keys, and must not be able to
    /// aim them all at one stripe.
    hasher: KeyHasher,
    common: Arc<Common>,
}

impl Index {
    /// An index of `stripes` stripes (a power of two) that reaps an abandoned lease
    /// `retention_ns` after its end and keeps the engine's `live` and `abandoned` gauges,
    /// hashing keys and keeping markers as `keying` says.
    pub(crate) fn new(
        stripes: usize,
        retention_ns: u64,
        gauges: Arc<Gauges>,
        keying: Keying,
    ) -> Self {
        assert!(
            stripes.is_power_of_two(),
            "stripe count must be a power of two"
        );
        let board =
            || -> Box<[AtomicU64]> { (0..stripes).map(|_| AtomicU64::new(u64::MAX)).collect() };
        let hasher = keying.hasher;
        let common = Arc::new(Common {
            retention_ns,
            hasher: hasher.clone(),
            markers: keying.markers,
            gauges,
            lease_due: board(),
            reclaim_due: board(),
            marks: keying.marks,
            unpublished: (0..stripes).map(|_| AtomicBool::new(false)).collect(),
        });
        let stripes: Box<[Padded]> = (0..stripes)
            .map(|id| {
                Padded(Stripe {
                    map: Mutex::new(Shard::new(&hasher, common.clone(), id)),
                    changed: Changed::new(),
                })
            })
            .collect();
        let mask = (stripes.len() as u64) - 1;
        Self {
            stripes,
            mask,
            hasher,
            common,
        }
    }

    /// `bytes` with its keyed hash, computed once per operation: it picks the stripe and
    /// then finds the key in the stripe's table.
    pub(crate) fn key<'a>(&self, bytes: &'a [u8]) -> Key<'a> {
        Key::new(&self.hasher, bytes)
    }

    pub(crate) fn stripe(&self, key: Key<'_>) -> &Stripe {
        &self.stripes[self.stripe_index(key)].0
    }

    /// The hashes that name `bytes`'s marker.
    pub(crate) fn marker_id(&self, bytes: &[u8]) -> MarkerId {
        MarkerId {
            hash: self.hasher.hash(bytes),
            check: self.hasher.check(bytes),
        }
    }

    /// The position of the stripe of the key whose keyed hash is `keyed` (a marker's).
    pub(crate) fn stripe_of_hash(&self, keyed: u64) -> usize {
        ((keyed >> 32) & self.mask) as usize
    }

    /// The position of `key`'s stripe, for callers that group keys by stripe.
    pub(crate) fn stripe_index(&self, key: Key<'_>) -> usize {
        // Bits 32 and up of the keyed hash; the table inside the stripe derives its hash from
        // the low bits (the tag), so the two uses stay independent.
        (u64::from(key.stripe_bits) & self.mask) as usize
    }

    pub(crate) fn stripe_at(&self, i: usize) -> Option<&Stripe> {
        self.stripes.get(i).map(|p| &p.0)
    }

    /// Locks the stripe of `bytes`; returns the key with its hash for the shard's calls.
    pub(crate) fn lock<'a>(&self, bytes: &'a [u8]) -> (MutexGuard<'_, Shard>, &Changed, Key<'a>) {
        let key = self.key(bytes);
        let stripe = self.stripe(key);
        (stripe.lock(), &stripe.changed, key)
    }

    /// Wakes every waiter of every stripe (poison, close, clock jumps).
    pub(crate) fn wake_all(&self) {
        for s in self.stripes.iter() {
            // Taking the lock orders the wake after any waiter's check of the state.
            drop(s.0.map.lock());
            s.0.changed.notify_all();
        }
    }

    /// Publishes what is due in every stripe that holds unpublished completions (the
    /// writer or the applier, when the queue is idle, and the sweeper): a completion's
    /// response leaves memory even if nobody locks its stripe again.
    pub(crate) fn catch_up(&self) {
        for (p, flag) in self.stripes.iter().zip(self.common.unpublished.iter()) {
            // Sequentially consistent with the store in `Shard::await_watermark`.
            if flag.load(Ordering::SeqCst) {
                drop(p.0.lock());
            }
        }
    }

    pub(crate) fn stripes(&self) -> impl Iterator<Item = &Stripe> {
        self.stripes.iter().map(|p| &p.0)
    }

    /// Stripes where a lease may have ended by `now`. Reads one word per stripe; takes no
    /// lock.
    pub(crate) fn leases_due(&self, now: u64) -> impl Iterator<Item = &Stripe> {
        self.stripes
            .iter()
            .zip(self.common.lease_due.iter())
            .filter(move |(_, due)| due.load(Ordering::Relaxed) <= now)
            .map(|(p, _)| &p.0)
    }

    /// Stripes where anything may be due by `now`: a lease to end, a completion to expire,
    /// an abandoned lease to reap. Reads two words per stripe; takes no lock.
    pub(crate) fn any_due(&self, now: u64) -> impl Iterator<Item = &Stripe> {
        let c = &self.common;
        self.stripes
            .iter()
            .enumerate()
            .filter(move |(i, _)| {
                c.lease_due[*i].load(Ordering::Relaxed) <= now
                    || c.reclaim_due[*i].load(Ordering::Relaxed) <= now
            })
            .map(|(_, p)| &p.0)
    }

    /// Whether a stripe (by position) may have a completion or abandoned lease due.
    pub(crate) fn reclaim_may_be_due(&self, i: usize, now: u64) -> bool {
        self.common.reclaim_due[i].load(Ordering::Relaxed) <= now
    }

    /// Whether a stripe (by position) may have a lease that ended by `now`.
    pub(crate) fn lease_may_be_due(&self, i: usize, now: u64) -> bool {
        self.common.lease_due[i].load(Ordering::Relaxed) <= now
    }

    /// Recovery starts loading the file into the index.
    pub(crate) fn begin_load(&self) {
        for s in self.stripes() {
            s.lock().begin_load();
        }
    }

    /// Recovery is done (at `now`): every stripe orders its completions once.
    pub(crate) fn finish_load(&self, now: u64) {
        for s in self.stripes() {
            s.lock().finish_load(now);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.stripes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::codec::Checkpoint;

    const RETENTION: u64 = 1_000;
    const GOLDEN_HASH: u64 = 14064908793807524591;
    const GOLDEN_CHECK: u64 = 2102196403203803230;

    struct Fixture {
        shard: Shard,
        gauges: Arc<Gauges>,
        common: Arc<Common>,
    }

    /// The change that puts `slot` with `extra`, as the state machine hands it over.
    fn put(slot: Slot, extra: Extra) -> Change {
        Change::Put {
            slot,
            extra,
            reap_ns: None,
            adopt: false,
        }
    }

    fn fixture() -> Fixture {
        fixture_with(None)
    }

    fn fixture_with(markers: Option<MarkerRules>) -> Fixture {
        let gauges = Arc::new(Gauges::default());
        let board = || -> Box<[AtomicU64]> { vec![AtomicU64::new(u64::MAX)].into() };
        let hasher = KeyHasher::random();
        let common = Arc::new(Common {
            retention_ns: RETENTION,
            hasher: hasher.clone(),
            markers,
            gauges: gauges.clone(),
            lease_due: board(),
            reclaim_due: board(),
            marks: Arc::new(Marks::new()),
            unpublished: vec![AtomicBool::new(false)].into(),
        });
        Fixture {
            shard: Shard::new(&hasher, common.clone(), 0),
            gauges,
            common,
        }
    }

    impl Fixture {
        /// A new lease, counted live as a claim's reservation would.
        fn claim(&mut self, key: &str, token: u64, deadline: u64) {
            self.gauges.inflight.fetch_add(1, Ordering::AcqRel);
            self.shard.put(
                self.shard.key(key.as_bytes()),
                Slot::inflight(token, deadline, 1),
                Extra::default(),
            );
        }

        /// Completes a lease, with the holder's bookkeeping.
        fn complete(&mut self, key: &str, token: u64, expires: u64) {
            self.shard.put(
                self.shard.key(key.as_bytes()),
                Slot::completed(token, expires, 1, true),
                Extra::default(),
            );
            self.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
        }

        /// Completes a lease with the key's own retention, if any.
        fn complete_kept(&mut self, key: &str, token: u64, expires: u64, own_ms: Option<u64>) {
            self.shard.put(
                self.shard.key(key.as_bytes()),
                Slot::completed(token, expires, 1, true),
                Extra {
                    retention_ms: own_ms,
                    ..Extra::default()
                },
            );
            self.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
        }

        fn gauges(&self) -> (u64, u64) {
            (
                self.gauges.inflight.load(Ordering::Relaxed),
                self.gauges.abandoned.load(Ordering::Relaxed),
            )
        }

        /// Reclaims everything due at `now`; the tokens removed, in order.
        fn reclaim_all(&mut self, now: u64) -> Vec<(Reclaimed, u64)> {
            let mut out = Vec::new();
            loop {
                let mut sent = 0;
                let r = self.shard.reclaim(now, &mut |step| {
                    sent = step.write.as_ref().map_or(0, |w| w.token());
                    true
                });
                match r {
                    Reclaimed::Nothing => return out,
                    Reclaimed::Stale => out.push((r, 0)),
                    _ => out.push((r, sent)),
                }
            }
        }

        fn boards(&self) -> (u64, u64) {
            (
                self.common.lease_due[0].load(Ordering::Relaxed),
                self.common.reclaim_due[0].load(Ordering::Relaxed),
            )
        }
    }

    /// Hashes are persisted (marker rows are keyed by them): for a given secret they must
    /// never change, on any platform or version. The values were computed once, and agree
    /// with an independent SipHash-1-3 of the same bytes (the length as a little-endian u64,
    /// then the key).
    #[test]
    fn keyed_hashes_are_fixed_by_the_secret() {
        let mut secret = [0u8; HASH_SECRET_LEN];
        for (i, b) in secret.iter_mut().enumerate() {
            *b = i as u8;
        }
        let h = KeyHasher::from_secret(&secret);
        assert_eq!(h.hash(b"order-42"), GOLDEN_HASH);
        assert_eq!(h.check(b"order-42"), GOLDEN_CHECK);
        assert_ne!(
            h.hash(b"order-42"),
            h.check(b"order-42"),
            "independent keys"
        );
        // Length first: a key is not confused with its prefix padded by zeros.
        assert_ne!(h.hash(b"k"), h.hash(b"k\0"));
        let other = KeyHasher::random();
        assert_ne!(
            other.hash(b"order-42"),
            GOLDEN_HASH,
            "another secret, another hash"
        );
    }

    /// A memory-only stripe keeping markers for 500 ns after a completion's retention.
    fn marking() -> Fixture {
        fixture_with(Some(MarkerRules {
            retention: std::time::Duration::from_nanos(500),
            durable: false,
        }))
    }

    fn complete_with(f: &mut Fixture, key: &str, token: u64, expires: u64, fingerprint: u128) {
        f.claim(key, token, 1);
        let extra = Extra {
            fingerprint: Some(fingerprint),
            response: Some(Arc::from(&b"r"[..])),
            expires_wall_ms: 77,
            completed_wall_ms: 66,
            ..Extra::default()
        };
        f.shard.put(
            f.shard.key(key.as_bytes()),
            Slot::completed(token, expires, 1, true),
            extra,
        );
        f.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
    }

    #[test]
    fn an_expired_completion_leaves_a_marker_that_ends_at_its_instant() {
        let mut f = marking();
        complete_with(&mut f, "k", 1, 10, 9);
        assert_eq!(f.reclaim_all(10), vec![(Reclaimed::Expired, 1)]);
        assert_eq!(f.shard.get(f.shard.key(b"k")), None, "the slot went");
        let m = f.shard.marker(f.shard.key(b"k")).expect("a marker");
        assert_eq!(
            (m.token, m.fingerprint(), m.completed_wall_ms, m.end_ns),
            (1, Some(9), 66, 510)
        );
        assert!(!m.is_pending(), "a memory-only marker is complete at once");
        assert_eq!(f.shard.marker(f.shard.key(b"other")), None);
        assert_eq!(f.boards().1, 510, "the sweeper is told when it ends");
        let mut ended = |now| {
            let mut sent = Vec::new();
            let r = f.shard.end_marker(now, &mut |step| {
                sent.push(step.write.clone());
                true
            });
            (r, sent)
        };
        assert_eq!(ended(509), (MarkerEnded::Nothing, vec![]));
        assert_eq!(
            ended(510),
            (MarkerEnded::Ended, vec![None]),
            "memory only: no row"
        );
        assert_eq!(f.shard.markers_len(), 0);
        assert_eq!(f.boards().1, u64::MAX);
    }

    #[test]
    fn a_claim_forgets_an_expired_completion_only_within_its_marker_window() {
        let mut f = marking();
        complete_with(&mut f, "in", 1, 10, 9);
        complete_with(&mut f, "over", 2, 10, 9);
        let mut sent = 0;
        let forgot = f.shard.forget(f.shard.key(b"in"), 509, &mut |_| {
            sent += 1;
            true
        });
        assert!(matches!(forgot, Forgot::Marked(m) if m.token == 1 && m.end_ns == 510));
        assert_eq!(f.shard.completed, 1);
        // Past the window too: nothing changes, the claim replaces the completion itself.
        let forgot = f.shard.forget(f.shard.key(b"over"), 510, &mut |_| {
            sent += 1;
            true
        });
        assert_eq!(forgot, Forgot::Nothing);
        assert!(f.shard.get(f.shard.key(b"over")).is_some());
        // Refused: nothing changes either.
        complete_with(&mut f, "refused", 3, 10, 9);
        let key = f.shard.key(b"refused");
        assert_eq!(f.shard.forget(key, 11, &mut |_| false), Forgot::Refused);
        assert!(f.shard.get(key).is_some());
        assert_eq!(f.shard.marker(key), None);
        assert_eq!(sent, 1);
    }

    #[test]
    fn a_completed_key_costs_a_48_byte_entry_and_a_16_byte_place_in_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
        // The key's bytes (a fat pointer), the slot, and the pointer to its side data.
        assert_eq!(std::mem::size_of::<Entry>(), 48);
        assert_eq!(std::mem::size_of::<DoneEntry>(), 16);
    }

    #[test]
    fn publish_finds_the_completion_by_keyed_hash_and_token_and_frees_its_side_data() {
        let mut f = fixture();
        let shard = &mut f.shard;
        let done = Extra {
            response: Some(Arc::from(&b"resp"[..])),
            ..Extra::default()
        };
        shard.put(
            shard.key(b"a"),
            Slot::completed(1, 10, 1, false),
            done.clone(),
        );
        shard.put(
            shard.key(b"b"),
            Slot::completed(2, 10, 1, false),
            done.clone(),
        );
        shard.put(shard.key(b"c"), Slot::inflight(3, 10, 1), done.clone());
        let (a, b, c) = (shard.key(b"a"), shard.key(b"b"), shard.key(b"c"));
        // A token the key no longer holds, or a lease's: nothing is published.
        shard.publish(a.keyed, 7, Side::Drop);
        shard.publish(c.keyed, 3, Side::Drop);
        assert!(!shard.get(a).unwrap().is_published());
        assert!(!shard.get(c).unwrap().is_published());
        shard.publish(a.keyed, 1, Side::Drop);
        let slot = shard.get(a).unwrap();
        assert!(slot.is_published());
        assert_eq!(shard.extra(&slot), None, "the file holds it now");
        let other = shard.get(b).unwrap();
        assert!(!other.is_published());
        assert_eq!(shard.extra(&other), Some(&done));
        assert_eq!(shard.heap_bytes, 3 + 2 * boxed_bytes(&done));

        // Published before the file holds it: the side data stays until dropped.
        shard.publish(b.keyed, 2, Side::Keep);
        let kept = shard.get(b).unwrap();
        assert!(kept.is_published());
        assert_eq!(
            shard.extra(&kept),
            Some(&done),
            "replays answer from memory"
        );
        shard.publish(b.keyed, 2, Side::Drop);
        assert_eq!(shard.extra(&shard.get(b).unwrap()), None);
        assert_eq!(shard.heap_bytes, 3 + boxed_bytes(&done));
    }

    #[test]
    fn a_settled_completions_box_is_emptied_and_filled_again_by_the_next_side_data() {
        let mut f = fixture();
        let response: Arc<[u8]> = Arc::from(&b"resp"[..]);
        let shard = &mut f.shard;
        let done = || Extra {
            response: Some(response.clone()),
            ..Extra::default()
        };
        let names: Vec<Vec<u8>> = (0..SPARE_EXTRAS_PER_STRIPE + 2)
            .map(|i| format!("k{i}").into_bytes())
            .collect();
        let keys: Vec<Key<'_>> = names.iter().map(|n| shard.key(n)).collect();
        for (i, &k) in keys.iter().enumerate() {
            let seq = i as u64 + 1;
            shard.apply(k, put(Slot::completed(seq, 10, 1, false), done()), seq);
        }
        let heap_before = shard.heap_bytes;
        let last = keys.len() as u64;
        f.common.marks.raise_applied(last);
        f.common.marks.raise_durable(last);
        shard.catch_up();

        // Settled: every response is freed (the boxes kept hold no reference), the slots
        // have no side data, and the stripe keeps no more boxes than its limit.
        assert_eq!(
            Arc::strong_count(&response),
            1,
            "every response left memory"
        );
        assert_eq!(shard.spare.len(), SPARE_EXTRAS_PER_STRIPE);
        assert!(shard.spare.iter().all(|b| **b == Extra::default()));
        assert!(keys.iter().all(|&k| {
            let slot = shard.get(k).unwrap();
            shard.extra(&slot).is_none()
        }));
        assert_eq!(
            shard.heap_bytes,
            heap_before - keys.len() * boxed_bytes(&done()),
            "the boxes left the slots' count"
        );
        assert!(
            shard.memory_bytes()
                >= shard.heap_bytes + SPARE_EXTRAS_PER_STRIPE * std::mem::size_of::<Extra>(),
            "the kept boxes count in the stripe's memory"
        );

        // The next side data takes a kept box, and holds exactly what it was given.
        let claim = Extra {
            first_claimed_wall_ms: 7,
            ..Extra::default()
        };
        let fresh = shard.key(b"fresh");
        shard.apply(
            fresh,
            put(Slot::inflight(99, 10, 1), claim.clone()),
            last + 1,
        );
        assert_eq!(shard.spare.len(), SPARE_EXTRAS_PER_STRIPE - 1);
        let slot = shard.get(fresh).unwrap();
        assert_eq!(shard.extra(&slot), Some(&claim));
    }

    #[test]
    fn a_queued_completion_is_shown_by_the_durable_watermark_and_settled_by_the_applied_one() {
        let mut f = fixture();
        let done = Extra {
            response: Some(Arc::from(&b"resp"[..])),
            ..Extra::default()
        };
        let complete = |token| put(Slot::completed(token, 10, 1, false), done.clone());
        let shard = &mut f.shard;
        let (a, b) = (shard.key(b"a"), shard.key(b"b"));
        shard.apply(a, complete(1), 4);
        shard.apply(b, complete(2), 6);
        assert_eq!(shard.published_at(a), Some(4));
        assert_eq!(shard.published_at(b), Some(6));
        assert!(f.common.unpublished[0].load(Ordering::Relaxed));
        let marks = &f.common.marks;

        // The commit log synced up to 5: `a` is shown, its response kept for replays.
        marks.raise_durable(5);
        shard.catch_up();
        let slot = shard.get(a).unwrap();
        assert!(slot.is_published());
        assert_eq!(
            shard.extra(&slot),
            Some(&done),
            "the file does not hold it yet"
        );
        assert_eq!(shard.published_at(a), None);
        assert!(!shard.get(b).unwrap().is_published(), "6 is not durable");

        // Applied up to 6 (and so durable): both settle, and nothing is left to publish.
        marks.raise_applied(6);
        marks.raise_durable(6);
        shard.catch_up();
        for k in [a, b] {
            let slot = shard.get(k).unwrap();
            assert!(slot.is_published());
            assert_eq!(shard.extra(&slot), None, "the file holds it now");
        }
        assert_eq!(shard.heap_bytes, 2);
        assert!(!f.common.unpublished[0].load(Ordering::Relaxed));

        // A memory-only completion (nothing queued, 0) or a claim is not queued for
        // publication.
        let c = shard.key(b"c");
        shard.apply(c, put(Slot::inflight(3, 10, 1), Extra::default()), 7);
        shard.apply(shard.key(b"d"), complete(4), 0);
        assert!(!f.common.unpublished[0].load(Ordering::Relaxed));
        assert_eq!(shard.published_at(c), None);

        // A completion whose operation the writer applied before the completion reached
        // its stripe (the writer may have looked for stripes to publish in between) is
        // published by its own call, not left for a lock that may never come.
        let e = shard.key(b"e");
        shard.apply(e, complete(5), 6);
        let slot = shard.get(e).unwrap();
        assert!(slot.is_published());
        assert_eq!(shard.extra(&slot), None);
        assert!(!f.common.unpublished[0].load(Ordering::Relaxed));
    }

    #[test]
    fn side_data_follows_the_token() {
        let mut f = fixture();
        let shard = &mut f.shard;
        let extra = Extra {
            fingerprint: Some(1),
            ..Extra::default()
        };
        shard.put(shard.key(b"k"), Slot::inflight(1, 10, 1), extra.clone());
        let slot = shard.get(shard.key(b"k")).unwrap();
        assert_eq!(shard.extra(&slot), Some(&extra));
        // Same token, new side data (a completion): the old side data is gone.
        let done = Extra {
            response: Some(Arc::from(&b"resp"[..])),
            ..Extra::default()
        };
        shard.put(
            shard.key(b"k"),
            Slot::completed(1, 10, 1, true),
            done.clone(),
        );
        let slot = shard.get(shard.key(b"k")).unwrap();
        assert_eq!(shard.extra(&slot), Some(&done));
        assert_eq!(shard.heap_bytes, 1 + std::mem::size_of::<Extra>() + 4);
        // A new token replaces the old side data.
        shard.put(shard.key(b"k"), Slot::inflight(2, 10, 2), Extra::default());
        let slot = shard.get(shard.key(b"k")).unwrap();
        assert_eq!(shard.extra(&slot), None);
        assert!(shard.slots.iter().all(|(_, _, side)| side.is_none()));
        assert_eq!(shard.remove(shard.key(b"k")).map(|s| s.token), Some(2));
        assert_eq!(shard.heap_bytes, 0);
        assert_eq!((shard.live, shard.abandoned, shard.completed), (0, 0, 0));
    }

    #[test]
    fn only_completed_slots_expire() {
        assert!(!Slot::inflight(1, 5, 1).is_expired(100));
        assert!(Slot::completed(1, 5, 1, true).is_expired(5));
        assert!(!Slot::completed(1, 5, 1, true).is_expired(4));
    }

    /// The table rehashes from the tags kept in the slots, without the keys: after many
    /// doublings every key is still found under the hash a fresh lookup computes, and every
    /// completion is still found by its expiry entry, in deadline order.
    #[test]
    fn a_growing_table_keeps_finding_every_key_by_its_tag() {
        let mut f = fixture();
        let n = 5_000u64;
        for t in 1..=n {
            let key = format!("key-{t}");
            f.claim(&key, t, 10_000);
            f.complete(&key, t, 2 * t);
        }
        assert!(f.shard.slots.capacity() >= n as usize);
        for t in 1..=n {
            let slot = f.shard.get(f.shard.key(format!("key-{t}").as_bytes()));
            assert_eq!(slot, Some(Slot::completed(t, 2 * t, 1, true)), "key-{t}");
        }
        let removed = f.reclaim_all(n);
        let expected: Vec<_> = (1..=n / 2).map(|t| (Reclaimed::Expired, t)).collect();
        assert_eq!(removed, expected);
        assert_eq!(f.shard.get(f.shard.key(b"key-1")), None);
        assert!(f
            .shard
            .get(f.shard.key(format!("key-{n}").as_bytes()))
            .is_some());
    }

    #[test]
    fn due_prefix_counts_the_due_head_of_any_length() {
        for len in 0..70u64 {
            let done: VecDeque<DoneEntry> = (0..len)
                .map(|i| DoneEntry {
                    deadline_ns: i * 2,
                    hash: 0,
                })
                .collect();
            for now in 0..(2 * len + 2) {
                let expected = done.iter().filter(|e| e.deadline_ns <= now).count();
                assert_eq!(due_prefix(&done, now), expected, "len {len}, now {now}");
            }
        }
    }

    #[test]
    fn completions_are_reclaimed_earliest_first_and_a_lease_never_is() {
        let mut f = fixture();
        for i in 0..10u64 {
            f.claim(&format!("c{i}"), i + 1, 50);
            f.complete(&format!("c{i}"), i + 1, 91 + i);
        }
        f.claim("lease", 50, 0);
        assert_eq!(f.shard.expired_unswept(95), 5, "deadlines 91..=95");
        assert_eq!(f.boards(), (0, 91));
        let got = f.reclaim_all(95);
        let tokens: Vec<u64> = got.iter().map(|g| g.1).collect();
        assert_eq!(tokens, vec![1, 2, 3, 4, 5]);
        assert!(got.iter().all(|g| g.0 == Reclaimed::Expired));
        assert_eq!(f.shard.expired_unswept(95), 0);
        assert_eq!(f.shard.completed, 5);
        assert_eq!(f.boards(), (0, 96));
        // The lease ended long ago but is only reaped `RETENTION` after its end.
        f.shard.end_leases(95, usize::MAX);
        assert_eq!(f.reclaim_all(RETENTION - 1).len(), 5, "only completions");
        assert!(f.shard.get(f.shard.key(b"lease")).is_some());
        assert_eq!(f.reclaim_all(RETENTION), vec![(Reclaimed::Reaped, 50)]);
        assert!(f.shard.get(f.shard.key(b"lease")).is_none());
        assert_eq!(f.boards(), (u64::MAX, u64::MAX));
    }

    #[test]
    fn a_slot_that_changes_leaves_a_stale_entry_that_is_skipped() {
        let mut f = fixture();
        f.claim("j", 1, 5);
        f.complete("j", 1, 8);
        f.claim("k", 2, 5);
        f.complete("k", 2, 10);
        assert_eq!(f.shard.expired_unswept(10), 2);
        // "k" is claimed again after its retention: its entry in `done` is stale.
        f.claim("k", 3, 500);
        assert_eq!(
            f.shard.expired_unswept(10),
            1,
            "the stale entry is not counted"
        );
        assert_eq!(f.shard.done.len(), 2);
        assert_eq!(
            f.reclaim_all(10),
            vec![(Reclaimed::Expired, 1), (Reclaimed::Stale, 0)]
        );
        assert!(f.shard.done.is_empty());
        assert_eq!(
            f.shard.get(f.shard.key(b"k")).map(|s| s.token),
            Some(3),
            "never removed"
        );
        // An entry at the head is popped at once when its slot changes.
        f.claim("i", 4, 5);
        f.complete("i", 4, 20);
        f.claim("i", 5, 400);
        assert!(f.shard.done.is_empty());
        // A lease that settles while another lease ends first leaves its entry stale below
        // the top: ending leases skips it.
        f.complete("k", 3, 2000);
        assert_eq!(f.shard.leases.len(), 2);
        assert_eq!(f.shard.end_leases(1000, usize::MAX).moved, 1, "only i's");
        assert!(f.shard.leases.is_empty());
        assert!(f.shard.get(f.shard.key(b"i")).unwrap().is_abandoned());
        assert_eq!(
            f.shard.get(f.shard.key(b"k")).map(|s| s.is_inflight()),
            Some(false)
        );
    }

    #[test]
    fn leases_settled_in_order_never_pile_up() {
        let mut f = fixture();
        for i in 0..1000u64 {
            let key = format!("k{i}");
            f.claim(&key, i + 1, 100 + i / 10);
            f.complete(&key, i + 1, 5000);
            assert!(f.shard.leases.is_empty());
        }
    }

    #[test]
    fn out_of_order_completions_wait_in_the_heap_and_leave_in_deadline_order() {
        let mut f = fixture();
        let deadlines = [50u64, 30, 70, 10, 30];
        for (i, deadline) in deadlines.into_iter().enumerate() {
            let key = format!("k{i}");
            f.shard.put(
                f.shard.key(key.as_bytes()),
                Slot::completed(i as u64 + 1, deadline, 1, true),
                Extra::default(),
            );
        }
        // 50 and 70 arrived in order; 30, 10 and 30 would have broken it.
        assert_eq!((f.shard.done.len(), f.shard.kept.len()), (2, 3));
        assert_eq!(
            f.boards().1,
            10,
            "the board is the earlier of the two heads"
        );
        let got: Vec<u64> = f
            .reclaim_all(100)
            .iter()
            .map(|g| deadlines[g.1 as usize - 1])
            .collect();
        assert_eq!(got, vec![10, 30, 30, 50, 70]);
        assert_eq!(f.boards().1, u64::MAX);
    }

    /// Per-key retention: a completion kept longer than the engine's retention waits in the
    /// heap, so the completions of the engine's retention made after it still append to the
    /// deque; removal follows deadlines across both, never before one.
    #[test]
    fn a_key_kept_longer_than_the_engine_never_holds_back_the_deque() {
        let mut f = fixture();
        let ms = 1_000_000;
        // Completed at 0 and kept 2 ms; the engine keeps keys 1,000 ns.
        f.claim("long", 1, 0);
        f.complete_kept("long", 1, 2 * ms, Some(2));
        f.claim("short", 2, 0);
        // A retention of its own no longer than the engine's, in order: the deque.
        f.complete_kept("short", 2, 500, Some(0));
        for i in 0..100u64 {
            let key = format!("d{i}");
            f.claim(&key, 10 + i, i * 10);
            f.complete(&key, 10 + i, i * 10 + RETENTION);
        }
        assert_eq!(f.shard.kept.len(), 1, "only the long one");
        assert_eq!(f.shard.done.len(), 101);
        assert_eq!(f.boards().1, 500);
        assert_eq!(f.shard.expired_unswept(2 * ms - 1), 101);
        let got = f.reclaim_all(2 * ms - 1);
        assert_eq!(got.len(), 101);
        assert!(got.iter().all(|g| g.0 == Reclaimed::Expired && g.1 != 1));
        assert_eq!(f.boards().1, 2 * ms, "only the long one is left");
        assert_eq!(f.shard.expired_unswept(2 * ms - 1), 0);
        assert_eq!(f.reclaim_all(2 * ms), vec![(Reclaimed::Expired, 1)]);
        assert_eq!(f.shard.completed, 0);
    }

    #[test]
    fn an_abandoned_lease_is_reaped_by_its_own_retention() {
        let mut f = fixture();
        let ms = 1_000_000;
        f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
        f.shard.put(
            f.shard.key(b"own"),
            Slot::inflight(1, 10, 1),
            Extra {
                retention_ms: Some(3),
                ..Extra::default()
            },
        );
        f.claim("engine", 2, 10);
        f.shard.end_leases(10, usize::MAX);
        assert_eq!(f.boards().1, 10 + RETENTION);
        assert_eq!(f.reclaim_all(10 + RETENTION), vec![(Reclaimed::Reaped, 2)]);
        assert_eq!(f.boards().1, 10 + 3 * ms);
        assert_eq!(f.reclaim_all(10 + 3 * ms - 1), vec![]);
        assert_eq!(f.reclaim_all(10 + 3 * ms), vec![(Reclaimed::Reaped, 1)]);
    }

    /// An extension leaves the lease's old entry behind when it is not on top of the heap;
    /// that entry must not match the slot (it compares the deadline, not the token alone),
    /// or the sweep would end the lease at its old deadline while its holder still holds it.
    fn extended_lease_check() -> Result<(), String> {
        let mut f = fixture();
        // "a" ends first, so the entry of "b" is below the top when "b" is extended.
        f.claim("a", 1, 5);
        f.claim("b", 2, 10);
        f.shard.put(
            f.shard.key(b"b"),
            Slot::inflight(2, 50, 1),
            Extra::default(),
        );
        if f.shard.leases.len() != 3 {
            return Err("the old entry of b was not left behind".into());
        }
        let ended = f.shard.end_leases(20, usize::MAX).moved;
        let b = f.shard.get(f.shard.key(b"b")).ok_or("b is gone")?;
        if ended != 1 || b.is_abandoned() || f.gauges() != (1, 1) {
            return Err(format!(
                "b (extended from 10 to 50) was ended at 20 by its old entry: {ended} leases \
                 ended, b abandoned: {}, gauges (inflight, abandoned) {:?}",
                b.is_abandoned(),
                f.gauges()
            ));
        }
        if f.shard.end_leases(49, usize::MAX).moved != 0
            || f.shard.end_leases(50, usize::MAX).moved != 1
            || f.gauges() != (0, 2)
        {
            return Err("b did not end at its new deadline".into());
        }
        Ok(())
    }

    #[test]
    fn an_extended_lease_is_not_ended_at_its_old_deadline() {
        extended_lease_check().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Teeth: the check catches lease entries that match their slot by token alone.
    #[cfg(idemkv_sabotage)]
    #[test]
    fn teeth_extended_lease_check_catches_token_only_entries() {
        crate::base::sabotage::TOKEN_ONLY_LEASE_ENTRIES.with(|on| on.set(true));
        let caught = extended_lease_check();
        crate::base::sabotage::TOKEN_ONLY_LEASE_ENTRIES.with(|on| on.set(false));
        assert!(caught.is_err(), "token-only lease entries were not caught");
    }

    /// Lazy deletion in the heap: a completion that leaves pops its entry if it is on top,
    /// and otherwise leaves it stale, to be dropped when it comes up or by a compaction that
    /// keeps the heap within twice its keys plus the slack.
    #[test]
    fn stale_entries_of_the_heap_are_skipped_and_compacted() {
        let mut f = fixture();
        let ms = 1_000_000;
        f.claim("a", 1, 0);
        f.complete_kept("a", 1, 5 * ms, Some(5));
        f.claim("b", 2, 0);
        f.complete_kept("b", 2, 9 * ms, Some(9));
        // "b" is claimed again after its retention: its entry, below the top, goes stale.
        f.claim("b", 3, 20 * ms);
        assert_eq!(f.shard.kept.len(), 2);
        assert_eq!(
            f.shard.expired_unswept(20 * ms),
            1,
            "the stale entry is not counted"
        );
        assert_eq!(
            f.reclaim_all(20 * ms),
            vec![(Reclaimed::Expired, 1), (Reclaimed::Stale, 0)]
        );
        assert_eq!(f.shard.kept.len(), 0);
        // An entry on top is popped at once when its slot leaves.
        f.complete_kept("b", 3, 30 * ms, Some(10));
        f.claim("b", 4, 30 * ms);
        assert_eq!(f.shard.kept.len(), 0);
        // Keys completed again and again after their retention without a sweep: one stale
        // entry per key and round, far more than the 100 keys; the heap stays bounded.
        let mut f = fixture();
        let mut token = 0;
        for round in 0..60u64 {
            let now = round * 10 * ms;
            for i in 0..100u64 {
                let key = format!("k{i}");
                token += 1;
                f.claim(&key, token, now);
                // Kept 10 ms, minus a little per key: out of order, so in the heap.
                f.complete_kept(&key, token, now + 10 * ms - i, Some(10));
                let total = f.shard.done.len() + f.shard.kept.len();
                assert!(total <= 2 * 100 + EXPIRY_COMPACT_SLACK + 1, "{total}");
            }
        }
        assert_eq!(f.shard.completed, 100);
        assert_eq!(f.shard.expired_unswept(u64::MAX), 100);
        let removed = f.reclaim_all(u64::MAX);
        let expired = removed.iter().filter(|g| g.0 == Reclaimed::Expired).count();
        assert_eq!(expired, 100);
        assert_eq!(f.shard.completed, 0);
        assert_eq!(f.boards().1, u64::MAX);
    }

    /// The heap against a sorted list: every push, pop, count of the due entries and
    /// compaction, on pseudo-random deadlines with many ties.
    #[test]
    fn the_heap_pops_earliest_first_and_counts_what_is_due() {
        let mut heap = DueHeap::default();
        let mut model: Vec<u64> = Vec::new();
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..5_000u64 {
            let r = next();
            match r % 4 {
                0 | 1 => {
                    let d = next() % 500;
                    heap.push(DoneEntry {
                        deadline_ns: d,
                        hash: step,
                    });
                    model.push(d);
                }
                2 => {
                    model.sort_unstable();
                    let expected = (!model.is_empty()).then(|| model.remove(0));
                    assert_eq!(heap.pop().map(|e| e.deadline_ns), expected);
                }
                _ => {
                    let now = next() % 600;
                    let due = model.iter().filter(|&&d| d <= now).count();
                    assert_eq!(heap.count_due(now), due, "now {now}");
                }
            }
            if step % 1000 == 999 {
                // Compaction keeps what it is told to, in heap order.
                heap.retain(|e| e.hash % 3 != 0);
                model = heap.v.iter().map(|e| e.deadline_ns).collect();
            }
            assert_eq!(
                heap.peek().map(|e| e.deadline_ns),
                model.iter().min().copied()
            );
        }
    }

    /// After a restart, completions due after `now + retention` (a key's own longer
    /// retention) wait in the heap, so new completions still find the deque in order.
    #[test]
    fn recovery_moves_what_outlives_the_engine_retention_to_the_heap() {
        let mut f = fixture();
        f.shard.begin_load();
        for (i, deadline) in [5_000u64, 300, 2_000, 100].into_iter().enumerate() {
            let key = format!("k{i}");
            f.shard.put(
                f.shard.key(key.as_bytes()),
                Slot::completed(i as u64 + 1, deadline, 1, true),
                Extra::default(),
            );
        }
        f.shard.finish_load(500);
        let fifo: Vec<u64> = f.shard.done.iter().map(|e| e.deadline_ns).collect();
        assert_eq!(fifo, vec![100, 300]);
        assert_eq!(f.shard.kept.len(), 2);
        // A completion of the engine's retention made at the reopen goes to the deque.
        f.claim("new", 10, 500);
        f.complete("new", 10, 500 + RETENTION);
        assert_eq!(f.shard.done.len(), 3);
        let got: Vec<u64> = f.reclaim_all(u64::MAX).iter().map(|g| g.1).collect();
        assert_eq!(got, vec![4, 2, 10, 3, 1]);
    }

    #[test]
    fn recovery_sorts_once_and_drops_what_deduplication_left() {
        let mut f = fixture();
        f.shard.begin_load();
        for (i, deadline) in [9u64, 3, 7, 1, 5].into_iter().enumerate() {
            let key = format!("k{i}");
            f.shard.put(
                f.shard.key(key.as_bytes()),
                Slot::completed(i as u64 + 1, deadline, 1, true),
                Extra::default(),
            );
        }
        // A newer record of k0 replaces the older one before its deadline.
        f.shard.put(
            f.shard.key(b"k0"),
            Slot::completed(9, 4, 1, true),
            Extra::default(),
        );
        f.shard.finish_load(0);
        assert_eq!(f.shard.done.len(), 5, "the replaced entry is gone");
        let deadlines: Vec<u64> = f.shard.done.iter().map(|e| e.deadline_ns).collect();
        assert_eq!(deadlines, vec![1, 3, 4, 5, 7]);
        assert_eq!(f.shard.expired_unswept(4), 3);
        assert_eq!(f.boards().1, 1);
    }

    #[test]
    fn stale_entries_are_compacted_when_they_dominate() {
        let mut f = fixture();
        // A lease that ends first and stays: every lease completed behind it leaves a stale
        // entry that trimming cannot reach.
        f.claim("blocker", 100_000, 10);
        for i in 0..10_000u64 {
            let key = format!("k{i}");
            f.claim(&key, i + 1, 1_000_000);
            f.complete(&key, i + 1, 2_000_000 + i);
            assert!(f.shard.leases.len() <= 2 * f.shard.live + EXPIRY_COMPACT_SLACK + 1);
        }
        assert!(f.shard.leases.len() <= 2 + EXPIRY_COMPACT_SLACK + 1);
        assert!(
            f.shard.leases.len() > 2,
            "trimming alone cannot get past the blocker"
        );
        // Completions re-claimed after their retention without a sweep: each round leaves
        // a stale entry per key in `done`, far more than the 100 current ones.
        let mut f = fixture();
        for i in 0..100u64 {
            let key = format!("k{i}");
            f.claim(&key, i + 1, 0);
            f.complete(&key, i + 1, 10);
        }
        let mut token = 1000;
        for round in 0..100u64 {
            let now = 10 + round * 10;
            for i in 0..100u64 {
                let key = format!("k{i}");
                assert!(f
                    .shard
                    .get(f.shard.key(key.as_bytes()))
                    .unwrap()
                    .is_expired(now));
                token += 1;
                f.claim(&key, token, now);
                f.complete(&key, token, now + 10);
                assert!(f.shard.done.len() <= 2 * 100 + EXPIRY_COMPACT_SLACK + 1);
            }
        }
        // Without compaction `done` would now hold 10,100 entries.
        assert_eq!(f.shard.completed, 100);
        // Order and counts survive compaction.
        let d: Vec<u64> = f.shard.done.iter().map(|e| e.deadline_ns).collect();
        assert!(d.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(f.shard.expired_unswept(u64::MAX), 100);
        let removed = f.reclaim_all(u64::MAX);
        assert_eq!(
            removed.iter().filter(|g| g.0 == Reclaimed::Expired).count(),
            100
        );
        assert_eq!(f.shard.completed, 0);
    }

    #[test]
    fn an_ended_lease_leaves_the_live_count_and_is_reaped_at_end_plus_retention() {
        let mut f = fixture();
        f.claim("a", 1, 10);
        f.claim("b", 2, 20);
        assert_eq!(f.boards(), (10, u64::MAX));
        assert_eq!(f.shard.end_leases(9, usize::MAX).moved, 0);
        let ended = f.shard.end_leases(10, usize::MAX);
        assert_eq!((ended.moved, ended.more), (1, false));
        assert!(f.shard.get(f.shard.key(b"a")).unwrap().is_abandoned());
        assert_eq!(f.gauges(), (1, 1));
        assert_eq!(f.boards(), (20, 10 + RETENTION));
        // A budget of one entry leaves the rest for later.
        f.claim("c", 3, 15);
        let ended = f.shard.end_leases(30, 1);
        assert_eq!((ended.moved, ended.more), (1, true));
        assert_eq!(f.shard.end_leases(30, usize::MAX).moved, 1);
        assert_eq!(f.gauges(), (0, 3));
        assert_eq!(f.reclaim_all(10 + RETENTION - 1), vec![]);
        assert_eq!(f.reclaim_all(10 + RETENTION), vec![(Reclaimed::Reaped, 1)]);
        assert_eq!(f.gauges(), (0, 2));
        assert!(f.shard.get(f.shard.key(b"a")).is_none());
        assert_eq!((f.shard.live, f.shard.abandoned), (0, 2));
    }

    #[test]
    fn an_abandoned_lease_settled_by_its_holder_counts_as_live_for_its_bookkeeping() {
        let mut f = fixture();
        f.claim("a", 1, 10);
        f.shard.end_leases(10, usize::MAX);
        assert_eq!(f.gauges(), (0, 1));
        // A checkpoint keeps it abandoned (same lease).
        let slot = f.shard.get(f.shard.key(b"a")).unwrap();
        let extra = Extra {
            checkpoint: Some(Checkpoint::new(1, b"half")),
            ..Extra::default()
        };
        f.shard.put(f.shard.key(b"a"), slot, extra);
        assert!(f.shard.get(f.shard.key(b"a")).unwrap().is_abandoned());
        assert_eq!(f.gauges(), (0, 1));
        // An extend revives it: counted live, its reap entry stale.
        let mut slot = f.shard.get(f.shard.key(b"a")).unwrap();
        slot.deadline_ns = 50;
        f.shard.put(f.shard.key(b"a"), slot, Extra::default());
        assert!(!f.shard.get(f.shard.key(b"a")).unwrap().is_abandoned());
        assert_eq!(f.gauges(), (1, 0));
        assert!(f.shard.ended.is_empty(), "its entry, on top, went with it");
        assert_eq!(f.reclaim_all(10 + RETENTION), vec![]);
        assert!(f.shard.get(f.shard.key(b"a")).is_some());
        // Ended again, then completed: the holder's decrement balances the revival.
        f.shard.end_leases(50, usize::MAX);
        assert_eq!(f.gauges(), (0, 1));
        f.complete("a", 1, 5000);
        assert_eq!(f.gauges(), (0, 0));
        assert_eq!(
            (f.shard.live, f.shard.abandoned, f.shard.completed),
            (0, 0, 1)
        );
        // Released after ending: the same.
        f.claim("b", 2, 60);
        f.shard.end_leases(60, usize::MAX);
        f.shard.remove(f.shard.key(b"b"));
        f.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
        assert_eq!(f.gauges(), (0, 0));
    }

    #[test]
    fn a_takeover_adopts_an_abandoned_lease_without_counting_it_twice() {
        let mut f = fixture();
        f.claim("a", 1, 10);
        f.shard.end_leases(10, usize::MAX);
        assert_eq!(f.gauges(), (0, 1));
        // The claim reserves its place, adopts the slot, and replaces it.
        f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
        f.shard.adopt(f.shard.key(b"a"));
        f.shard.put(
            f.shard.key(b"a"),
            Slot::inflight(2, 100, 2),
            Extra::default(),
        );
        assert_eq!(f.gauges(), (1, 0));
        assert_eq!((f.shard.live, f.shard.abandoned), (1, 0));
        // The old reap entry is stale; the new lease ends at 100.
        assert_eq!(f.reclaim_all(10 + RETENTION), vec![(Reclaimed::Stale, 0)]);
        assert_eq!(f.shard.end_leases(100, usize::MAX).moved, 1);
        assert_eq!(f.gauges(), (0, 1));
    }

    #[test]
    fn a_recovered_lease_is_reaped_at_the_instant_it_was_given() {
        let mut f = fixture();
        f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
        f.shard.put_reaped_at(
            f.shard.key(b"r"),
            Slot::inflight(7, 0, 1),
            Extra::default(),
            5,
        );
        f.shard.end_leases(0, usize::MAX);
        assert_eq!(f.reclaim_all(4), vec![]);
        assert_eq!(f.reclaim_all(5), vec![(Reclaimed::Reaped, 7)]);
    }

    #[test]
    fn a_slot_that_keeps_its_place_takes_the_reap_instant_it_is_given() {
        // Abandoned: the entry in `ended` moves from 50 to 20.
        let mut f = fixture();
        f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
        let slot = Slot::inflight(7, 0, 1);
        f.shard
            .put_reaped_at(f.shard.key(b"r"), slot, Extra::default(), 50);
        f.shard.end_leases(0, usize::MAX);
        f.shard
            .put_reaped_at(f.shard.key(b"r"), slot, Extra::default(), 20);
        assert_eq!(f.reclaim_all(19), vec![]);
        assert_eq!(f.reclaim_all(20), vec![(Reclaimed::Reaped, 7)]);

        // Live: the entry in `leases` carries the new instant into `ended` when it ends.
        let mut f = fixture();
        f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
        let slot = Slot::inflight(8, 10, 1);
        f.shard
            .put_reaped_at(f.shard.key(b"s"), slot, Extra::default(), 90);
        f.shard
            .put_reaped_at(f.shard.key(b"s"), slot, Extra::default(), 40);
        f.shard.end_leases(10, usize::MAX);
        assert_eq!(f.reclaim_all(39), vec![]);
        assert_eq!(f.reclaim_all(40), vec![(Reclaimed::Reaped, 8)]);
    }

    #[test]
    fn a_refused_deletion_changes_nothing() {
        let mut f = fixture();
        f.claim("k", 1, 5);
        f.complete("k", 1, 10);
        assert_eq!(f.shard.reclaim(10, &mut |_| false), Reclaimed::Refused);
        assert!(f.shard.get(f.shard.key(b"k")).is_some());
        assert_eq!(f.shard.expired_unswept(10), 1);
        assert_eq!(f.reclaim_all(10), vec![(Reclaimed::Expired, 1)]);
    }
}
