//! Counters reported by [`crate::Engine::stats`].

use crate::machine::Deltas;
use crate::sync::{Arc, AtomicU64, Ordering};

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
    /// Bytes held by the in-memory index: table buckets at capacity, keys and side data.
    pub index_bytes: u64,
    /// Claims answered (any outcome).
    pub claims: u64,
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
    /// Largest number of operations in one commit.
    pub batch_max: u64,
    /// Operations waiting in the writer queue now.
    pub queue_depth: u64,
    /// The next fencing token to be issued.
    pub token_next: u64,
    /// Whether a storage failure has poisoned the engine.
    pub poisoned: bool,
}

/// The engine-wide counters: the gauges that admission compares with a limit, and the
/// events counted where no stripe lock is held. Every event counted under a stripe lock is
/// in that stripe's [`Events`] instead, so the hot path writes no shared cache line for it.
///
/// Aligned to its own cache lines, apart from the engine's read-mostly settings.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Counters {
    /// Replays read from the file (after the stripe lock is dropped).
    pub(crate) replays: AtomicU64,
    /// Fingerprint mismatches found reading the file.
    pub(crate) fingerprint_mismatches: AtomicU64,
    pub(crate) corrupt_reads: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) overloaded: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) committed_ops: AtomicU64,
    pub(crate) batch_max: AtomicU64,
    /// Leases counted live; shared with the index, which moves ended leases out of it.
    pub(crate) inflight: Arc<AtomicU64>,
    /// Abandoned leases; kept by the index.
    pub(crate) abandoned: Arc<AtomicU64>,
    /// Abandoned claims reaped on open.
    pub(crate) abandoned_reaped: AtomicU64,
    /// Completed slots in the index (expired ones included until swept): with `inflight`
    /// and `abandoned`, the key count that `keys_max` admission compares.
    pub(crate) completed: AtomicU64,
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
    }
}

/// Adds one to a counter. Relaxed: counters order nothing.
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn read(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}
