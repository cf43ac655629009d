//! Counters reported by [`crate::Engine::stats`].

use crate::base::sync::{Arc, AtomicU64, Ordering};
use crate::model::machine::Deltas;
use crate::runtime::observe::{name, Counted, EventMetrics};

/// A snapshot of the engine's counters. Counts since open unless noted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Keys InFlight with a live lease: what counts against `inflight_max`.
    pub inflight: u64,
    /// Keys InFlight whose lease has ended and that nobody took over yet (a client that gave
    /// up after a crash). They do not count against `inflight_max`; a claim of the key takes
    /// it over, and the sweeper reaps it `retention` after its lease ended.
    pub abandoned: u64,
    /// Abandoned claims reaped since open (by the sweeper, or on open for records found
    /// past their bound).
    pub abandoned_reaped: u64,
    /// Keys Completed now and within their retention.
    pub completed: u64,
    /// Keys past their retention (Absent to every call) not yet reclaimed by the sweeper.
    pub expired_unswept: u64,
    /// Keys reclaimed by the sweeper since open.
    pub expirations: u64,
    /// Markers held now: completions past their retention whose marker has not ended
    /// (`EngineBuilder::marker_retention`; 0 without markers).
    pub markers: u64,
    /// Claims answered `Forgotten` from a marker: late duplicates that did not run again.
    pub forgotten: u64,
    /// Bytes held by the in-memory index: table buckets at capacity, keys and side data.
    pub index_bytes: u64,
    /// Claims answered (any outcome).
    pub claims: u64,
    /// Claims won by a future that was dropped before it returned the lease (it waited for
    /// the claim's durability); each was released.
    pub claims_cancelled: u64,
    /// Claims that acquired a lease (new or takeover).
    pub acquired: u64,
    /// Claims that took over an expired or dead lease.
    pub takeovers: u64,
    /// Claims answered with a stored response.
    pub replays: u64,
    /// Claims answered with InProgress.
    pub in_progress: u64,
    /// Claims refused for a fingerprint mismatch.
    pub fingerprint_mismatches: u64,
    /// Replays and reads refused with `Corrupted`: a stored record failed its checks, or was
    /// missing although the index named it.
    pub corrupt_reads: u64,
    /// Completions accepted.
    pub completions: u64,
    /// Leases released.
    pub releases: u64,
    /// Attempts failed by their holder ([`crate::Lease::fail`]): the lease ended, the record
    /// kept for the next claim to take over.
    pub failures: u64,
    /// Lease operations refused with LeaseLost.
    pub leases_lost: u64,
    /// Times a caller slept waiting for another holder.
    pub waits: u64,
    /// Calls refused by a limit.
    pub overloaded: u64,
    /// Group commits made by the writer.
    pub commits: u64,
    /// Operations written by those commits.
    pub committed_ops: u64,
    /// Of those commits, the checkpoints that made the file complete and restarted the
    /// commit log (under [`crate::Durability::Immediate`]; at close and whenever the log
    /// filled up). Every other commit of such an engine was made durable by the log.
    pub log_checkpoints: u64,
    /// Largest number of operations in one commit.
    pub batch_max: u64,
    /// The longest one group commit took since open, in microseconds: from the start of
    /// its write (to the commit log, or to the file) to the return of its last fsync, on
    /// the writer's real-time clock. Under `Buffered` an acknowledged operation can wait
    /// behind such a commit, so a disk that stalls longer than `max_delay` shows here
    /// and in `ack_to_fsync_max_us` together.
    pub commit_max_us: u64,
    /// Operations waiting in the writer queue now.
    pub queue_depth: u64,
    /// Queue length below which new claims are admitted now: under `Buffered`, three
    /// quarters of what the writer commits in one `max_delay` at its measured rate (timed
    /// over its whole cycle, on the engine's clock); otherwise the count limit.
    pub queue_claims_max: u64,
    /// `Buffered`: the longest an acknowledged operation waited for its fsync since open,
    /// in microseconds (the writer's measurement, on its own real-time clock).
    pub ack_to_fsync_max_us: u64,
    /// The next fencing token to be issued.
    pub token_next: u64,
    /// Whether a storage failure has poisoned the engine.
    pub poisoned: bool,
    /// A shared (PostgreSQL) engine: statements its calls sent to the database (the
    /// sweeper's and the listener's not counted). Concurrent local duplicates of a key
    /// share one; a cached completion is replayed without one. Zero for a file engine.
    pub db_round_trips: u64,
    /// A shared engine: claims that queued behind its busy claim lanes
    /// (`PostgresConfig::batch_lanes`); such a claim goes in the statement the next leader
    /// sends, or leads it. Zero for a file engine.
    pub db_claims_batched: u64,
    /// A shared engine: wake-up notifications its listening connection received. It
    /// listens only while a claim of the engine waits, so an engine whose claims never
    /// wait receives none. Zero for a file engine.
    pub db_notifications: u64,
}

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
