//! The lock-striped in-memory index: the single arbiter of every claim.
//!
//! Architecture invariant: the index never does I/O. A stripe lock is held only for a map
//! lookup, a state transition, and a non-blocking `try_send` to the writer queue (which keeps
//! the queue in per-key order).

use crate::codec::Checkpoint;
use crate::sync::{Condvar, Mutex, MutexGuard};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

/// One key's state in memory. Absent keys have no slot.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    /// Fencing token of the claim that owns (or completed) the key.
    pub(crate) token: u64,
    pub(crate) fingerprint: Option<u64>,
    pub(crate) attempt: u32,
    pub(crate) state: SlotState,
}

#[derive(Debug, Clone)]
pub(crate) enum SlotState {
    InFlight {
        /// Monotonic end of the lease, in ns.
        deadline_ns: u64,
        checkpoint: Option<Box<Checkpoint>>,
    },
    Completed {
        response: Arc<[u8]>,
        /// Monotonic end of retention, in ns. The key is Absent from this instant on.
        expires_ns: u64,
        /// Wall-clock end of retention as persisted, in ms (reported by `get`).
        expires_wall_ms: u64,
        /// False until the record is durable under the configured mode. An unpublished
        /// completion is never shown to another caller (invariant 5).
        published: bool,
    },
}

impl Slot {
    /// True when retention has run out at `now_ns`: the key is Absent to every call.
    pub(crate) fn is_expired(&self, now_ns: u64) -> bool {
        matches!(self.state, SlotState::Completed { expires_ns, .. } if now_ns >= expires_ns)
    }

    pub(crate) fn is_inflight(&self) -> bool {
        matches!(self.state, SlotState::InFlight { .. })
    }
}

pub(crate) type Map = HashMap<Box<[u8]>, Slot, RandomState>;

/// A lock and the condition variable its waiters sleep on.
pub(crate) struct Stripe {
    pub(crate) map: Mutex<Map>,
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
                    map: Mutex::new(HashMap::with_hasher(hasher.clone())),
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

    pub(crate) fn lock(&self, key: &[u8]) -> (MutexGuard<'_, Map>, &Condvar) {
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
}
