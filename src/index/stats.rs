//! Counters reported by [`crate::Engine::stats`].

use crate::base::sync::{Arc, AtomicU64, Ordering};
use crate::index::metrics::{name, Counted, EventMetrics};
use crate::model::machine::Deltas;
pub(crate) use crate::model::stats::Stats;

/// The engine-wide counters: the gauges that admission compares with a limit, and the
/// events counted where no stripe lock is held. Every event counted under a stripe lock is
/// in that stripe's [`Events`] instead, so the hot path writes no shared cache line for it.
/// The event counters here are [`Counted`]: with the `metrics` feature each one is also a
/// metric, updated with it; the stripes' events reach their metrics through `metrics`
/// (docs/observability.md).
///
/// Aligned to its own cache lines, apart from the engine's read-mostly settings.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Counters {
    /// Replays read from the file (after the stripe lock is dropped).
    pub(crate) replays: Counted,
    /// Fingerprint mismatches found reading the file.
    pub(crate) fingerprint_mismatches: Counted,
    pub(crate) claims_cancelled: Counted,
    pub(crate) corrupt_reads: Counted,
    pub(crate) waits: Counted,
    pub(crate) overloaded: Counted,
    pub(crate) commits: Counted,
    pub(crate) committed_ops: Counted,
    pub(crate) log_checkpoints: Counted,
    pub(crate) batch_max: AtomicU64,
    pub(crate) commit_max_us: AtomicU64,
    /// The key-count gauges admission compares with its limits; shared with the index.
    pub(crate) gauges: Arc<Gauges>,
    /// Abandoned claims reaped on open.
    pub(crate) abandoned_reaped: Counted,
    /// The metrics of the events the stripes count (nothing without the feature).
    pub(crate) metrics: EventMetrics,
}

impl Default for Counters {
    /// Zeroed counters; their metrics are registered with the recorder in place now.
    fn default() -> Self {
        let claims = |outcome| Counted::new(name::CLAIMS, Some(outcome));
        Counters {
            replays: claims("replay"),
            fingerprint_mismatches: claims("fingerprint_mismatch"),
            claims_cancelled: Counted::new(name::CLAIMS_CANCELLED, None),
            corrupt_reads: Counted::new(name::CORRUPT_READS, None),
            waits: Counted::new(name::WAITS, None),
            overloaded: Counted::new(name::OVERLOADED, None),
            commits: Counted::new(name::COMMITS, None),
            committed_ops: Counted::new(name::COMMITTED_OPS, None),
            log_checkpoints: Counted::new(name::LOG_CHECKPOINTS, None),
            batch_max: AtomicU64::new(0),
            commit_max_us: AtomicU64::new(0),
            gauges: Arc::default(),
            abandoned_reaped: Counted::new(name::ABANDONED_REAPED, None),
            metrics: EventMetrics::new(),
        }
    }
}

/// The engine-wide gauges that admission compares with `inflight_max` and `keys_max`, on one
/// cache line of their own: a claim reads all three and moves `inflight`, its completion
/// moves `inflight` and `completed`, so keeping them together moves one line between cores
/// per step instead of three.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Gauges {
    /// Leases counted live; the index moves ended leases out of it.
    pub(crate) inflight: AtomicU64,
    /// Abandoned leases; kept by the index.
    pub(crate) abandoned: AtomicU64,
    /// Completed slots in the index (expired ones included until swept): with `inflight`
    /// and `abandoned`, the key count that `keys_max` admission compares.
    pub(crate) completed: AtomicU64,
}

impl Gauges {
    /// The keys the index holds, as `keys_max` admission counts them.
    pub(crate) fn keys(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
            + self.abandoned.load(Ordering::Relaxed)
            + self.completed.load(Ordering::Relaxed)
    }
}

/// The events one stripe counted under its lock: plain integers on the stripe's own cache
/// lines. [`crate::Engine::stats`] adds them up while it locks each stripe.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Events {
    pub(crate) claims: u64,
    pub(crate) acquired: u64,
    pub(crate) takeovers: u64,
    pub(crate) replays: u64,
    pub(crate) in_progress: u64,
    pub(crate) fingerprint_mismatches: u64,
    pub(crate) completions: u64,
    pub(crate) releases: u64,
    pub(crate) leases_lost: u64,
    pub(crate) expirations: u64,
    pub(crate) abandoned_reaped: u64,
    pub(crate) failures: u64,
    pub(crate) forgotten: u64,
}

impl Events {
    /// Counts a state machine's events.
    pub(crate) fn add(&mut self, d: &Deltas) {
        self.acquired += d.acquired;
        self.takeovers += d.takeovers;
        self.replays += d.replays;
        self.in_progress += d.in_progress;
        self.fingerprint_mismatches += d.fingerprint_mismatches;
        self.completions += d.completions;
        self.releases += d.releases;
        self.leases_lost += d.leases_lost;
        self.expirations += d.expirations;
        self.abandoned_reaped += d.abandoned_reaped;
        self.failures += d.failures;
        self.forgotten += d.forgotten;
    }

    /// Adds another stripe's (or a batch's) events.
    pub(crate) fn merge(&mut self, o: &Events) {
        self.claims += o.claims;
        self.acquired += o.acquired;
        self.takeovers += o.takeovers;
        self.replays += o.replays;
        self.in_progress += o.in_progress;
        self.fingerprint_mismatches += o.fingerprint_mismatches;
        self.completions += o.completions;
        self.releases += o.releases;
        self.leases_lost += o.leases_lost;
        self.expirations += o.expirations;
        self.abandoned_reaped += o.abandoned_reaped;
        self.failures += o.failures;
        self.forgotten += o.forgotten;
    }
}

/// Adds one to an event counter (and its metric). Relaxed: counters order nothing.
pub(crate) fn bump(c: &Counted) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Reads a counter or a gauge.
pub(crate) fn read(c: &impl Load) -> u64 {
    c.load_relaxed()
}

/// What [`read`] reads.
pub(crate) trait Load {
    fn load_relaxed(&self) -> u64;
}

impl Load for AtomicU64 {
    fn load_relaxed(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

impl Load for Arc<AtomicU64> {
    fn load_relaxed(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

impl Load for Counted {
    fn load_relaxed(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}
