//! The lock-striped in-memory index: the single arbiter of every claim.
//!
//! Architecture invariant: the index never does I/O. A stripe lock is held only for a map
//! lookup, a state transition, and a non-blocking `try_send` to the writer queue (which keeps
//! the queue in per-key order).
//!
//! A key's keyed hash picks its stripe (`key.rs`); a stripe is a lock over one shard (its
//! table and expiry order, `shard/`) and the condition variable its waiters sleep on.
//! Two lock-free boards ("nothing of this stripe is due before t", the minimum over every
//! queue's head of its expiry order) let the engine answer "what is due, where" without
//! taking every lock.

use crate::base::hash::KeyHasher;
use crate::base::sync::{Arc, AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::index::key::Key;
use crate::index::publication::Marks;
use crate::index::shard::{Common, Shard};
use crate::index::stats::Gauges;
use crate::index::wake::Changed;
use crate::model::machine::MarkerRules;
use crate::model::marker::MarkerId;
use std::time::Duration;

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
