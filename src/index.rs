//! The lock-striped in-memory index: the single arbiter of every claim.
//!
//! Architecture invariant: the index never does I/O. A stripe lock is held only for a map
//! lookup, a state transition, and a non-blocking `try_send` to the writer queue (which keeps
//! the queue in per-key order).
//!
//! Memory: a key costs one map entry (its boxed bytes and a 24-byte [`Slot`]). The rare
//! parts — a fingerprint or checkpoint of an InFlight key, the response of a memory-only
//! engine — live in a side table keyed by token, so a completed key in a durable engine
//! carries nothing else: its response stays in the file.

use crate::codec::Checkpoint;
use crate::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

const INFLIGHT: u8 = 1;
const PUBLISHED: u8 = 2;
const HAS_EXTRA: u8 = 4;

/// One key's state in memory. Absent keys have no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Fencing token of the claim that owns (or completed) the key.
    pub(crate) token: u64,
    /// InFlight: monotonic end of the lease. Completed: monotonic end of retention; the key
    /// is Absent from this instant on. In ns.
    pub(crate) deadline_ns: u64,
    pub(crate) attempt: u32,
    flags: u8,
}

impl Slot {
    pub(crate) fn inflight(token: u64, deadline_ns: u64, attempt: u32) -> Self {
        Self {
            token,
            deadline_ns,
            attempt,
            flags: INFLIGHT,
        }
    }

    /// A completed slot; `published` once the completion is durable under the mode. An
    /// unpublished completion is never shown to another caller (invariant 5).
    pub(crate) fn completed(token: u64, expires_ns: u64, attempt: u32, published: bool) -> Self {
        Self {
            token,
            deadline_ns: expires_ns,
            attempt,
            flags: if published { PUBLISHED } else { 0 },
        }
    }

    pub(crate) fn is_inflight(&self) -> bool {
        self.flags & INFLIGHT != 0
    }

    pub(crate) fn is_published(&self) -> bool {
        self.flags & PUBLISHED != 0
    }

    pub(crate) fn has_extra(&self) -> bool {
        self.flags & HAS_EXTRA != 0
    }

    /// True when retention has run out at `now_ns`: the key is Absent to every call. A live
    /// lease never expires this way; only completed keys do.
    pub(crate) fn is_expired(&self, now_ns: u64) -> bool {
        !self.is_inflight() && now_ns >= self.deadline_ns
    }
}

/// The rare parts of a slot, kept beside it by token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Extra {
    pub(crate) fingerprint: Option<u64>,
    pub(crate) checkpoint: Option<Checkpoint>,
    /// The response of a completed key in a memory-only engine.
    pub(crate) response: Option<Arc<[u8]>>,
    /// Wall-clock end of retention of a completion whose record is not in the file (memory
    /// only, or not yet published), for reports.
    pub(crate) expires_wall_ms: u64,
}

impl Extra {
    fn is_empty(&self) -> bool {
        self.fingerprint.is_none()
            && self.checkpoint.is_none()
            && self.response.is_none()
            && self.expires_wall_ms == 0
    }

    fn heap_bytes(&self) -> usize {
        self.checkpoint.as_ref().map_or(0, |c| c.data().len())
            + self.response.as_ref().map_or(0, |r| r.len())
    }
}

/// Hashes the side table's tokens. Tokens are issued by the engine, never chosen by
/// clients, so a keyed hash buys nothing there; a Fibonacci multiply spreads sequential
/// tokens over the table's control bits.
#[derive(Default)]
pub(crate) struct TokenHasher(u64);

impl Hasher for TokenHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// One stripe's maps. Every method keeps `slots`, `extras` and the byte count consistent.
pub(crate) struct Shard {
    slots: HashMap<Box<[u8]>, Slot, RandomState>,
    extras: HashMap<u64, Extra, BuildHasherDefault<TokenHasher>>,
    /// Heap bytes of keys and extras, for the memory estimate.
    heap_bytes: usize,
}

impl Shard {
    fn new(hasher: RandomState) -> Self {
        Self {
            slots: HashMap::with_hasher(hasher),
            extras: HashMap::default(),
            heap_bytes: 0,
        }
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<Slot> {
        self.slots.get(key).copied()
    }

    pub(crate) fn extra(&self, slot: &Slot) -> Option<&Extra> {
        if slot.has_extra() {
            self.extras.get(&slot.token)
        } else {
            None
        }
    }

    /// Sets the key's slot and side data, replacing whatever it had (and its side data).
    pub(crate) fn put(&mut self, key: &[u8], mut slot: Slot, extra: Extra) {
        let has_extra = !extra.is_empty();
        slot.flags &= !HAS_EXTRA;
        if has_extra {
            slot.flags |= HAS_EXTRA;
        }
        // One lookup when the key exists (every transition but a first claim).
        let old = match self.slots.get_mut(key) {
            Some(existing) => Some(std::mem::replace(existing, slot)),
            None => {
                self.heap_bytes += key.len();
                self.slots.insert(Box::from(key), slot);
                None
            }
        };
        if let Some(old) = old {
            self.drop_extra(&old);
        }
        if has_extra {
            self.heap_bytes += extra.heap_bytes();
            self.extras.insert(slot.token, extra);
        }
    }

    /// Marks the completion of `key` by `token` durable, dropping its side data (the file
    /// holds all of it now). Does nothing if the key has moved on.
    pub(crate) fn publish(&mut self, key: &[u8], token: u64) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        if slot.token != token || slot.is_inflight() {
            return;
        }
        slot.flags |= PUBLISHED;
        let old = *slot;
        slot.flags &= !HAS_EXTRA;
        self.drop_extra(&old);
    }

    /// Removes the key and its side data; returns the slot it had.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<Slot> {
        let slot = self.slots.remove(key)?;
        self.heap_bytes -= key.len();
        self.drop_extra(&slot);
        Some(slot)
    }

    fn drop_extra(&mut self, old: &Slot) {
        if old.has_extra() {
            if let Some(extra) = self.extras.remove(&old.token) {
                self.heap_bytes -= extra.heap_bytes();
            }
        }
    }

    /// Removes the key if its slot is expired at `now_ns`; returns its token.
    pub(crate) fn remove_expired(&mut self, key: &[u8], now_ns: u64) -> Option<u64> {
        match self.slots.get(key) {
            Some(slot) if slot.is_expired(now_ns) => self.remove(key).map(|s| s.token),
            _ => None,
        }
    }

    /// Keys expired at `now`, earliest deadline first, at most `max`, with their tokens.
    pub(crate) fn due(&self, now: u64, max: usize) -> Vec<(Box<[u8]>, u64)> {
        if max == 0 {
            return Vec::new();
        }
        let mut deadlines: Vec<u64> = self
            .slots
            .values()
            .filter(|s| s.is_expired(now))
            .map(|s| s.deadline_ns)
            .collect();
        if deadlines.is_empty() {
            return Vec::new();
        }
        let cutoff = if deadlines.len() > max {
            *deadlines.select_nth_unstable(max - 1).1
        } else {
            u64::MAX
        };
        let mut due: Vec<(u64, Box<[u8]>, u64)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.is_expired(now) && s.deadline_ns <= cutoff)
            .map(|(k, s)| (s.deadline_ns, k.clone(), s.token))
            .collect();
        due.sort_unstable_by_key(|d| d.0);
        due.truncate(max);
        due.into_iter().map(|(_, k, t)| (k, t)).collect()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &Slot)> {
        self.slots.iter().map(|(k, s)| (&**k, s))
    }

    /// Pre-sizes the table; a failed reservation only means growing later.
    pub(crate) fn try_reserve(&mut self, additional: usize) -> bool {
        self.slots.try_reserve(additional).is_ok()
    }

    /// Bytes this shard holds: table buckets at their capacity plus heap allocations.
    pub(crate) fn memory_bytes(&self) -> usize {
        let slot_bucket = std::mem::size_of::<(Box<[u8]>, Slot)>() + 1;
        let extra_bucket = std::mem::size_of::<(u64, Extra)>() + 1;
        self.slots.capacity() * slot_bucket
            + self.extras.capacity() * extra_bucket
            + self.heap_bytes
    }
}

/// A lock and the condition variable its waiters sleep on.
pub(crate) struct Stripe {
    pub(crate) map: Mutex<Shard>,
    /// Notified on every state change that could settle a waiter: completion published,
    /// release, takeover, poison, close, clock jump.
    pub(crate) changed: Condvar,
}

/// Aligns each stripe to its own cache lines, so that stripes do not false-share.
#[repr(align(128))]
struct Padded(Stripe);

pub(crate) struct Index {
    stripes: Box<[Padded]>,
    mask: u64,
    /// Keyed with per-process random keys: clients choose keys, and must not be able to aim
    /// them all at one stripe.
    hasher: RandomState,
}

impl Index {
    /// An index of `stripes` stripes; `stripes` must be a power of two.
    pub(crate) fn new(stripes: usize) -> Self {
        assert!(
            stripes.is_power_of_two(),
            "stripe count must be a power of two"
        );
        let hasher = RandomState::new();
        let stripes: Box<[Padded]> = (0..stripes)
            .map(|_| {
                Padded(Stripe {
                    map: Mutex::new(Shard::new(hasher.clone())),
                    changed: Condvar::new(),
                })
            })
            .collect();
        let mask = (stripes.len() as u64) - 1;
        Self {
            stripes,
            mask,
            hasher,
        }
    }

    pub(crate) fn stripe(&self, key: &[u8]) -> &Stripe {
        // High bits: the map inside the stripe uses the same hasher's low bits for buckets.
        let h = self.hasher.hash_one(key);
        let i = (h >> 32) & self.mask;
        &self.stripes[i as usize].0
    }

    pub(crate) fn lock(&self, key: &[u8]) -> (MutexGuard<'_, Shard>, &Condvar) {
        let stripe = self.stripe(key);
        (stripe.map.lock(), &stripe.changed)
    }

    /// Wakes every waiter of every stripe (poison, close, clock jumps).
    pub(crate) fn wake_all(&self) {
        for s in self.stripes.iter() {
            // Taking the lock orders the wake after any waiter's check of the state.
            drop(s.0.map.lock());
            s.0.changed.notify_all();
        }
    }

    pub(crate) fn stripes(&self) -> impl Iterator<Item = &Stripe> {
        self.stripes.iter().map(|p| &p.0)
    }

    pub(crate) fn len(&self) -> usize {
        self.stripes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completed_key_costs_a_24_byte_slot() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn side_data_follows_the_token() {
        let mut shard = Shard::new(RandomState::new());
        let extra = Extra {
            fingerprint: Some(1),
            ..Extra::default()
        };
        shard.put(b"k", Slot::inflight(1, 10, 1), extra.clone());
        let slot = shard.get(b"k").unwrap();
        assert_eq!(shard.extra(&slot), Some(&extra));
        // Same token, new side data (a completion): the old side data is gone.
        let done = Extra {
            response: Some(Arc::from(&b"resp"[..])),
            ..Extra::default()
        };
        shard.put(b"k", Slot::completed(1, 10, 1, true), done.clone());
        let slot = shard.get(b"k").unwrap();
        assert_eq!(shard.extra(&slot), Some(&done));
        assert_eq!(shard.heap_bytes, 1 + 4);
        // A new token replaces the old side data.
        shard.put(b"k", Slot::inflight(2, 10, 2), Extra::default());
        let slot = shard.get(b"k").unwrap();
        assert_eq!(shard.extra(&slot), None);
        assert!(shard.extras.is_empty());
        assert_eq!(shard.remove(b"k").map(|s| s.token), Some(2));
        assert_eq!(shard.heap_bytes, 0);
    }

    #[test]
    fn only_completed_slots_expire() {
        assert!(!Slot::inflight(1, 5, 1).is_expired(100));
        assert!(Slot::completed(1, 5, 1, true).is_expired(5));
        assert!(!Slot::completed(1, 5, 1, true).is_expired(4));
    }

    #[test]
    fn due_lists_expired_keys_earliest_first_and_never_a_lease() {
        let mut shard = Shard::new(RandomState::new());
        for i in 0..10u64 {
            let key = format!("c{i}");
            shard.put(
                key.as_bytes(),
                Slot::completed(i + 1, 100 - i, 1, true),
                Extra::default(),
            );
        }
        shard.put(b"lease", Slot::inflight(50, 0, 1), Extra::default());
        let due = shard.due(95, 3);
        let tokens: Vec<u64> = due.iter().map(|d| d.1).collect();
        assert_eq!(tokens, vec![10, 9, 8], "deadlines 91, 92, 93 first");
        assert_eq!(shard.due(95, 100).len(), 5, "deadlines 91..=95");
        assert!(shard.due(1000, 100).iter().all(|d| d.1 != 50));
    }
}
