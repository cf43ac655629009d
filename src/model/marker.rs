//! Markers: the second tier of retention (docs/retention.md, "Markers: the second tier").
//!
//! When markers are on, a completion whose retention ends leaves a marker behind for
//! `marker_retention` more: the key's keyed hash, a second independent hash of it, the
//! completion's fingerprint, attempt and wall-clock time, and the marker's end. No key
//! bytes and no response. A claim of the key that finds no slot but a live marker is
//! answered `Forgotten` ("completed at T, response no longer kept") instead of running the
//! work again.
//!
//! Each stripe keeps its markers here, apart from its slots and their expiry order: a hash
//! table by keyed hash and a min-heap of ends. Markers are found by hash, never by walking,
//! and leave at their end from the head of the heap (O(log n) each). Entries of the heap
//! are deleted lazily, as the slots' expiry queues do: a marker that is dropped or replaced
//! leaves its entry behind, recognised as stale when it comes up, and the heap is compacted
//! when stale entries outnumber live ones by `EXPIRY_COMPACT_SLACK`.

use crate::model::constants::EXPIRY_COMPACT_SLACK;
use hashbrown::HashTable;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const HAS_FINGERPRINT: u8 = 1;
/// A durable engine's marker whose commit has not been published yet: the writer fills its
/// fingerprint and completion time from the record it deletes (see `Shard::settle_marker`).
const PENDING: u8 = 2;

/// What is left of a completion after its retention: 64 bytes in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marker {
    /// The completion's fingerprint, when `HAS_FINGERPRINT` is set.
    fingerprint: u128,
    /// The key's keyed hash: the table's hash here and the row's key in the file.
    pub(crate) hash: u64,
    /// A second keyed hash of the key, with an independent key: a key whose `hash` equals a
    /// marker's is taken for the marker's key only if this matches too.
    pub(crate) check: u64,
    /// The token of the completion the marker stands for. A later marker of the same key
    /// has a larger one, which orders the marker's writes with the key's other writes.
    pub(crate) token: u64,
    /// Wall-clock instant of the completion, ms since the epoch (0 while pending).
    pub(crate) completed_wall_ms: u64,
    /// Monotonic end, ns: the key is new from this instant on.
    pub(crate) end_ns: u64,
    pub(crate) attempt: u32,
    flags: u8,
}

const _: () = assert!(std::mem::size_of::<Marker>() == 64);

/// The two keyed hashes of a key that identify its marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MarkerId {
    pub(crate) hash: u64,
    pub(crate) check: u64,
}

impl Marker {
    /// A marker with everything known (a memory-only engine's, or one loaded from the file).
    pub(crate) fn kept(
        id: MarkerId,
        token: u64,
        attempt: u32,
        fingerprint: Option<u128>,
        completed_wall_ms: u64,
        end_ns: u64,
    ) -> Self {
        Self {
            fingerprint: fingerprint.unwrap_or(0),
            hash: id.hash,
            check: id.check,
            token,
            completed_wall_ms,
            end_ns,
            attempt,
            flags: if fingerprint.is_some() {
                HAS_FINGERPRINT
            } else {
                0
            },
        }
    }

    /// A durable engine's marker whose record the writer has yet to turn into a row: its
    /// fingerprint and completion time come with the commit.
    pub(crate) fn pending(id: MarkerId, token: u64, attempt: u32, end_ns: u64) -> Self {
        Self {
            fingerprint: 0,
            hash: id.hash,
            check: id.check,
            token,
            completed_wall_ms: 0,
            end_ns,
            attempt,
            flags: PENDING,
        }
    }

    pub(crate) fn fingerprint(&self) -> Option<u128> {
        (self.flags & HAS_FINGERPRINT != 0).then_some(self.fingerprint)
    }

    pub(crate) fn is_pending(&self) -> bool {
        self.flags & PENDING != 0
    }

    /// Whether the marker is over at `now_ns`: the key is new again.
    pub(crate) fn is_ended(&self, now_ns: u64) -> bool {
        now_ns >= self.end_ns
    }
}

/// What [`Markers::end_head`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkerEnded {
    /// No marker ends by now.
    Nothing,
    /// A stale entry was dropped.
    Stale,
    /// A marker at its end was removed.
    Ended,
    /// Its deletion could not be queued; nothing changed.
    Refused,
}

/// One stripe's markers.
#[derive(Default)]
pub(crate) struct Markers {
    table: HashTable<Marker>,
    /// Every marker's `(end_ns, hash)`, earliest first, and stale entries.
    ends: BinaryHeap<Reverse<(u64, u64)>>,
}

impl Markers {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn get(&self, hash: u64) -> Option<&Marker> {
        self.table.find(hash, |m| m.hash == hash)
    }

    /// Adds `marker`, replacing the marker of its hash unless that one stands for a later
    /// completion (a larger token). Returns whether it was added.
    pub(crate) fn insert(&mut self, marker: Marker) -> bool {
        let hash = marker.hash;
        match self.table.find_mut(hash, |m| m.hash == hash) {
            Some(old) if old.token > marker.token => return false,
            Some(old) => *old = marker,
            None => {
                self.table.insert_unique(hash, marker, |m| m.hash);
            }
        }
        self.ends.push(Reverse((marker.end_ns, hash)));
        self.compact_if_stale();
        true
    }

    /// Removes the marker of `hash` if it stands for the completion `token`.
    pub(crate) fn remove(&mut self, hash: u64, token: u64) -> Option<Marker> {
        let entry = self
            .table
            .find_entry(hash, |m| m.hash == hash && m.token == token)
            .ok()?;
        let (marker, _) = entry.remove();
        if self.ends.peek() == Some(&Reverse((marker.end_ns, hash))) {
            self.ends.pop();
        }
        self.compact_if_stale();
        Some(marker)
    }

    /// The pending marker of `hash` for `token`, for the writer to settle.
    pub(crate) fn pending_mut(&mut self, hash: u64, token: u64) -> Option<&mut Marker> {
        self.table
            .find_mut(hash, |m| m.hash == hash && m.token == token)
            .filter(|m| m.is_pending())
    }

    /// Fills a pending marker from its committed row.
    pub(crate) fn settle(
        marker: &mut Marker,
        fingerprint: Option<u128>,
        completed_wall_ms: u64,
        attempt: u32,
    ) {
        marker.fingerprint = fingerprint.unwrap_or(0);
        marker.completed_wall_ms = completed_wall_ms;
        marker.attempt = attempt;
        marker.flags = if fingerprint.is_some() {
            HAS_FINGERPRINT
        } else {
            0
        };
    }

    /// No marker of this stripe ends before this instant (a lower bound: the head may be
    /// stale).
    pub(crate) fn next_end(&self) -> Option<u64> {
        self.ends.peek().map(|e| e.0 .0)
    }

    /// Removes the earliest marker if it has ended by `now`, once `send` has queued its
    /// deletion; drops a stale head entry instead.
    pub(crate) fn end_head(
        &mut self,
        now: u64,
        send: &mut dyn FnMut(&Marker) -> bool,
    ) -> MarkerEnded {
        let Some(&Reverse((end, hash))) = self.ends.peek() else {
            return MarkerEnded::Nothing;
        };
        if end > now {
            return MarkerEnded::Nothing;
        }
        let live = self
            .table
            .find(hash, |m| m.hash == hash)
            .filter(|m| m.end_ns == end)
            .copied();
        let Some(marker) = live else {
            self.ends.pop();
            return MarkerEnded::Stale;
        };
        if !send(&marker) {
            return MarkerEnded::Refused;
        }
        self.ends.pop();
        if let Ok(entry) = self.table.find_entry(hash, |m| m.hash == hash) {
            entry.remove();
        }
        MarkerEnded::Ended
    }

    /// Drops the heap's stale entries once they outnumber the live ones by the slack:
    /// O(heap) work paid for by at least as many stale entries.
    fn compact_if_stale(&mut self) {
        if self.ends.len() > 2 * self.table.len() + EXPIRY_COMPACT_SLACK {
            let table = &self.table;
            self.ends.retain(|Reverse((end, hash))| {
                table
                    .find(*hash, |m| m.hash == *hash)
                    .is_some_and(|m| m.end_ns == *end)
            });
        }
    }

    /// Pre-sizes the table (recovery); a failed reservation only means growing later.
    pub(crate) fn try_reserve(&mut self, additional: usize) -> bool {
        self.table.try_reserve(additional, |m| m.hash).is_ok()
            && self.ends.try_reserve(additional).is_ok()
    }

    /// Bytes held: table buckets and heap entries at their capacity.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.table.capacity() * (std::mem::size_of::<Marker>() + 1)
            + self.ends.capacity() * std::mem::size_of::<(u64, u64)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(hash: u64) -> MarkerId {
        MarkerId { hash, check: !hash }
    }

    fn ended(m: &mut Markers, now: u64) -> Vec<(MarkerEnded, u64)> {
        let mut out = Vec::new();
        loop {
            let mut hash = 0;
            let r = m.end_head(now, &mut |marker| {
                hash = marker.hash;
                true
            });
            match r {
                MarkerEnded::Nothing => return out,
                _ => out.push((r, hash)),
            }
        }
    }

    #[test]
    fn markers_end_earliest_first_at_their_end_and_not_before() {
        let mut m = Markers::default();
        for (hash, end) in [(1u64, 30u64), (2, 10), (3, 20)] {
            assert!(m.insert(Marker::kept(id(hash), hash, 1, None, 5, end)));
        }
        assert_eq!(m.next_end(), Some(10));
        assert_eq!(ended(&mut m, 9), vec![]);
        assert_eq!(
            ended(&mut m, 20),
            vec![(MarkerEnded::Ended, 2), (MarkerEnded::Ended, 3)]
        );
        assert_eq!(m.len(), 1);
        assert!(m.get(1).is_some());
    }

    #[test]
    fn a_later_completion_replaces_an_earlier_marker_and_never_the_reverse() {
        let mut m = Markers::default();
        assert!(m.insert(Marker::kept(id(7), 5, 1, Some(9), 100, 50)));
        assert!(!m.insert(Marker::kept(id(7), 4, 1, None, 90, 40)), "older");
        assert!(m.insert(Marker::kept(id(7), 6, 2, None, 200, 60)));
        assert_eq!(m.get(7).map(|x| x.token), Some(6));
        // The replaced marker's entry is stale: the one marker ends once, at its own end.
        assert_eq!(ended(&mut m, 55), vec![(MarkerEnded::Stale, 0)]);
        assert_eq!(ended(&mut m, 60), vec![(MarkerEnded::Ended, 7)]);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn removal_is_by_token_and_a_refused_deletion_changes_nothing() {
        let mut m = Markers::default();
        m.insert(Marker::kept(id(1), 5, 1, None, 1, 10));
        assert_eq!(m.remove(1, 4), None, "another completion's marker");
        assert_eq!(m.end_head(10, &mut |_| false), MarkerEnded::Refused);
        assert_eq!(m.len(), 1);
        assert_eq!(m.remove(1, 5).map(|x| x.token), Some(5));
        assert!(m.ends.is_empty(), "its entry, on top, went with it");
    }

    #[test]
    fn a_pending_marker_is_settled_in_place() {
        let mut m = Markers::default();
        m.insert(Marker::pending(id(3), 8, 2, 40));
        let p = m.pending_mut(3, 8).expect("pending");
        assert_eq!(p.fingerprint(), None);
        Markers::settle(p, Some(77), 1234, 2);
        let got = *m.get(3).expect("kept");
        assert!(!got.is_pending());
        assert_eq!(
            (got.fingerprint(), got.completed_wall_ms, got.attempt),
            (Some(77), 1234, 2)
        );
        assert!(m.pending_mut(3, 8).is_none(), "settled once");
    }

    #[test]
    fn stale_entries_are_compacted_when_they_dominate() {
        let mut m = Markers::default();
        for token in 1..=10_000u64 {
            m.insert(Marker::kept(id(1), token, 1, None, 1, 1_000_000 - token));
            assert!(m.ends.len() <= 2 + EXPIRY_COMPACT_SLACK + 1);
        }
        let out = ended(&mut m, u64::MAX);
        assert_eq!(out.iter().filter(|e| e.0 == MarkerEnded::Ended).count(), 1);
        assert!(out.len() <= 2 + EXPIRY_COMPACT_SLACK + 1);
        assert_eq!(m.len(), 0);
    }
}
