//! One stripe's contents: its table of slots, their side data and their expiry order
//! (`expiry.rs`), and every change to them, made under the stripe's lock.
//!
//! Memory: a key costs one table entry (its boxed bytes, a 24-byte [`Slot`] and a pointer to
//! its side data) and one entry in its stripe's expiry order (16 bytes for a completion). The
//! side data — the instants, lease length, fingerprint and checkpoint of an InFlight key,
//! the wall-clock instants and response of a memory-only engine's key — lives in a box
//! beside the slot in the same entry, so a completed key in a durable engine carries nothing else once the file holds
//! it (`publication.rs`): its response stays in the file. A transition reads and replaces
//! the side data through the entry it looks up anyway (no second table, no second miss);
//! replacing side data reuses its box, and a stripe keeps a few emptied boxes for the next
//! key that needs one.

use crate::base::hash::KeyHasher;
use crate::base::sync::{Arc, AtomicBool, AtomicU64, Ordering};
use crate::index::constants::{EXPIRY_TRIM_MAX, SPARE_EXTRAS_PER_STRIPE};
use crate::index::expiry::{
    done_matches, due_prefix, lease_matches, rewrite, ByEnd, ByReap, DoneEntry, DueHeap, LeaseEntry,
};
#[cfg(test)]
use crate::index::key::{table_hash, tag_of};
use crate::index::key::{tag_bytes, Key};
use crate::index::publication::{Marks, Side, Unpublished};
use crate::index::stats::{Events, Gauges};
use crate::model::constants::EXPIRY_COMPACT_SLACK;
use crate::model::machine::{Change, MarkerRules, View};
use crate::model::marker::Markers;
use crate::model::slot::{Extra, Slot, ABANDONED, HAS_EXTRA, PUBLISHED};
use hashbrown::HashTable;
use std::collections::{BinaryHeap, VecDeque};

mod markers;
mod reclaim;
#[cfg(test)]
mod tests;

pub(crate) use markers::Forgot;
pub(crate) use reclaim::Reclaimed;

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

/// What every stripe shares: the engine-wide gauges it keeps current, and the boards.
pub(crate) struct Common {
    pub(super) retention_ns: u64,
    /// The keyed hashes, for the marker a completion leaves (its key's hashes).
    pub(super) hasher: KeyHasher,
    /// Markers of completions past their retention, if the engine keeps them.
    pub(super) markers: Option<MarkerRules>,
    /// The engine's gauges: its `inflight` counter holds the leases counted against the
    /// in-flight limit, its `abandoned` counter the abandoned leases.
    pub(super) gauges: Arc<Gauges>,
    /// Per stripe: no lease of the stripe ends before this instant (ns). Written under the
    /// stripe's lock, read without it; a lower bound, since stale entries may hold it down.
    pub(super) lease_due: Box<[AtomicU64]>,
    /// Per stripe: no completion expires and no abandoned lease is due to be reaped before
    /// this instant (ns).
    pub(super) reclaim_due: Box<[AtomicU64]>,
    /// The writer's watermarks, by which each stripe publishes its completions when locked.
    pub(super) marks: Arc<Marks>,
    /// Per stripe: whether it may hold completions not yet published. Written under the
    /// stripe's lock, read without it.
    pub(super) unpublished: Box<[AtomicBool]>,
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
    /// Every other completed slot (see `expiry.rs`), and stale entries (all due, as in
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
    pub(super) fn new(hasher: &KeyHasher, common: Arc<Common>, id: usize) -> Self {
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

    /// `Shard::publish` of the slot filed under the table hash `hash`.
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
    /// hidden, and so do `stripes::unlocked` and `stripes::wait` when they take it again.
    pub(super) fn catch_up(&mut self) {
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
    pub(super) fn begin_load(&mut self) {
        self.loading = true;
    }

    /// Recovery is done: order `done` once (dropping what a deduplicated record left), and
    /// move the completions due after `now + retention` (kept longer than the engine keeps
    /// a key, by their own retention or an earlier, longer engine retention) to `kept`, so
    /// that every completion made from now on still finds `done` in order.
    pub(super) fn finish_load(&mut self, now: u64) {
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
