//! What [`crate::Engine::stats`] reports: a plain value, the same for both backends.

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
    /// A shared engine: statements sent only to make acquisitions durable (counted in
    /// `db_round_trips` too). Its claims commit without waiting for the disk, and an
    /// acquiring claim is answered once a commit of the same server lifetime flushed the
    /// WAL past it: a batch of completions that stores a response, or else one of these.
    /// Zero for a file engine, and for a shared engine whose role may not force the flush
    /// (its claims then commit as any statement does).
    pub db_flushes: u64,
    /// A shared engine: completions that queued behind its busy completion lanes
    /// (`PostgresConfig::complete_lanes`); such a completion commits in the statement the
    /// next leader sends, or leads it. Zero for a file engine.
    pub db_completions_batched: u64,
    /// A shared engine: wake-up notifications its listening connection received. It
    /// listens only while a claim of the engine waits, so an engine whose claims never
    /// wait receives none. Zero for a file engine.
    pub db_notifications: u64,
}
