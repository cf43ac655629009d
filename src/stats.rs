//! Counters reported by [`crate::Engine::stats`].

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

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) claims: AtomicU64,
    pub(crate) claims_cancelled: AtomicU64,
    pub(crate) acquired: AtomicU64,
    pub(crate) takeovers: AtomicU64,
    pub(crate) replays: AtomicU64,
    pub(crate) in_progress: AtomicU64,
    pub(crate) fingerprint_mismatches: AtomicU64,
    pub(crate) corrupt_reads: AtomicU64,
    pub(crate) completions: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) leases_lost: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) overloaded: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) committed_ops: AtomicU64,
    pub(crate) batch_max: AtomicU64,
    /// Leases counted live; shared with the index, which moves ended leases out of it.
    pub(crate) inflight: Arc<AtomicU64>,
    /// Abandoned leases; kept by the index.
    pub(crate) abandoned: Arc<AtomicU64>,
    pub(crate) abandoned_reaped: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) expirations: AtomicU64,
}

/// Adds one to a counter. Relaxed: counters order nothing.
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn read(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}
