//! Observability: every call into `tracing` and `metrics` is here (docs/observability.md).
//!
//! Both are optional cargo features of the library, off by default. With a feature off its
//! functions compile to nothing but the call they wrap, so the engine calls them without any
//! `cfg` of its own.
//!
//! - `tracing`: a debug span per `claim`, `claim_or_wait`, `complete` and `release`, named
//!   after the call, carrying the key's hash (never the raw key unless
//!   [`crate::EngineBuilder::log_raw_keys`] asks for it), and one debug event in it with the
//!   answer (`outcome`, `token`, `attempt`). A storage failure that poisons the engine is an
//!   error event. Events are emitted after the stripe lock is dropped: a subscriber may do
//!   I/O.
//! - `metrics`: the counters of [`crate::Stats`] mirrored one to one ([`Counted`] updates
//!   its metric with its atomic, so the two cannot drift), a histogram of commit latency and
//!   batch size recorded by the writer, and gauges of the queue depth and the keys held.
//!   Every handle is registered once, when the engine opens, with static names and label
//!   values: a counted event costs one more atomic add in the recorder, never an allocation
//!   or a lookup.

#[cfg(feature = "tracing")]
use crate::base::hash::key_hash;
#[cfg(feature = "metrics")]
use crate::base::sync::Ordering;
#[cfg(feature = "metrics")]
use crate::index::metrics::name;
use crate::index::stats::Counters;

/// The `tracing` target of every span and event of the engine.
#[cfg(feature = "tracing")]
pub(crate) const TARGET: &str = "idemkv";

/// The engine's observability state, fixed at open: the tracing setting and the handles of
/// the metrics the writer and `stats` update (the counters' handles are in [`Counted`]).
pub(crate) struct Observer {
    #[cfg(feature = "tracing")]
    raw_keys: bool,
    #[cfg(feature = "metrics")]
    metrics: Metrics,
}

#[cfg(feature = "metrics")]
struct Metrics {
    commit_seconds: metrics::Histogram,
    commit_batch_ops: metrics::Histogram,
    queue_depth: metrics::Gauge,
    inflight_keys: metrics::Gauge,
    abandoned_keys: metrics::Gauge,
    completed_keys: metrics::Gauge,
}

impl Observer {
    /// Registers the metrics with the recorder in place now; reads the tracing setting.
    pub(crate) fn new(raw_keys: bool) -> Self {
        #[cfg(not(feature = "tracing"))]
        let _ = raw_keys;
        Observer {
            #[cfg(feature = "tracing")]
            raw_keys,
            #[cfg(feature = "metrics")]
            metrics: Metrics::register(),
        }
    }

    /// A lease dropped unsettled (a handler that panicked or returned early, a dropped
    /// future): the key is kept until its lease ends, as after a crash of its holder.
    pub(crate) fn dropped(&self, key: &[u8], token: u64) {
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!(target: TARGET, "drop", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty, token);
            if !span.is_disabled() {
                self.record_key(&span, key);
                span.in_scope(|| {
                    tracing::debug!(target: TARGET, outcome = "kept", token, "lease dropped unsettled; the key is kept until its lease ends")
                });
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, token);
    }

    #[cfg(feature = "tracing")]
    pub(crate) fn record_key(&self, span: &tracing::Span, key: &[u8]) {
        if self.raw_keys {
            span.record("key", tracing::field::display(key.escape_ascii()));
        }
    }
}

/// A commit of `ops` writes succeeded in `took` (the span `Stats::commit_max_us` is the
/// longest of): records its latency and size, and sets the gauges. Called by the writer
/// thread, which holds no stripe lock.
pub(crate) fn committed(
    o: &Observer,
    c: &Counters,
    queued: impl FnOnce() -> usize,
    took: std::time::Duration,
    ops: usize,
) {
    #[cfg(feature = "metrics")]
    {
        let m = &o.metrics;
        m.commit_seconds.record(took.as_secs_f64());
        m.commit_batch_ops.record(ops as f64);
        gauges(o, c, queued);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (o, c, queued, took, ops);
}

/// Sets the gauges from the engine's counters: the writer queue's length, the leases
/// counted live and abandoned, the completed keys held (those past retention that the
/// sweeper has not reclaimed yet included). Called after each commit and by `stats`.
pub(crate) fn gauges(o: &Observer, c: &Counters, queued: impl FnOnce() -> usize) {
    #[cfg(feature = "metrics")]
    {
        let m = &o.metrics;
        m.queue_depth.set(queued() as f64);
        m.inflight_keys
            .set(c.gauges.inflight.load(Ordering::Relaxed) as f64);
        m.abandoned_keys
            .set(c.gauges.abandoned.load(Ordering::Relaxed) as f64);
        m.completed_keys
            .set(c.gauges.completed.load(Ordering::Relaxed) as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (o, c, queued);
}

/// A storage failure poisoned the engine (a failed commit or fsync, a failed read, a panic
/// on the writer thread): nothing more is acknowledged until the file is reopened.
pub(crate) fn poisoned(why: &str) {
    #[cfg(feature = "tracing")]
    tracing::error!(target: TARGET, reason = why, "storage failure: the engine is poisoned and acknowledges nothing more; reopen the file to recover");
    #[cfg(not(feature = "tracing"))]
    let _ = why;
}

/// What a clean close did about the file's unused pages: an info event when it compacted
/// the file or a live reader kept it from compacting, a warning when a compaction failed
/// (the close succeeded either way), a debug event when none was needed.
pub(crate) fn closed_file(outcome: &crate::store::storage::Compaction) {
    #[cfg(feature = "tracing")]
    {
        use crate::store::storage::Compaction;
        match outcome {
            Compaction::Done { .. } => {
                tracing::info!(target: TARGET, outcome = %outcome, "file closed");
            }
            Compaction::NotNeeded { .. } => {
                tracing::debug!(target: TARGET, outcome = %outcome, "file closed");
            }
            Compaction::Refused { .. } => {
                tracing::info!(target: TARGET, outcome = %outcome, "file closed without compaction");
            }
            Compaction::Failed { .. } => {
                tracing::warn!(target: TARGET, outcome = %outcome, "file closed without compaction");
            }
        }
    }
    #[cfg(not(feature = "tracing"))]
    let _ = outcome;
}

#[cfg(feature = "metrics")]
impl Metrics {
    fn register() -> Self {
        use metrics::Unit;
        describe();
        let h = |name: &'static str, unit: Unit, what: &'static str| {
            metrics::describe_histogram!(name, unit, what);
            metrics::histogram!(name)
        };
        let g = |name: &'static str, what: &'static str| {
            metrics::describe_gauge!(name, Unit::Count, what);
            metrics::gauge!(name)
        };
        Metrics {
            commit_seconds: h(
                name::COMMIT_SECONDS,
                Unit::Seconds,
                "Time of one group commit (write and sync), in seconds",
            ),
            commit_batch_ops: h(
                name::COMMIT_BATCH_OPS,
                Unit::Count,
                "Records written by one group commit",
            ),
            queue_depth: g(name::QUEUE_DEPTH, "Operations waiting in the writer queue"),
            inflight_keys: g(name::INFLIGHT_KEYS, "Leases counted live"),
            abandoned_keys: g(
                name::ABANDONED_KEYS,
                "Leases ended that nobody took over yet",
            ),
            completed_keys: g(
                name::COMPLETED_KEYS,
                "Completed keys held, those past retention not yet swept included",
            ),
        }
    }
}

/// Describes the counters (their unit and help text) to the recorder.
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{describe_counter, Unit};
    let counters = [
        (name::CLAIM_CALLS, "Claim calls answered, any outcome"),
        (
            name::CLAIMS,
            "Claim answers by outcome (acquired includes takeovers)",
        ),
        (
            name::CORRUPT_READS,
            "Replays and reads refused as corrupted",
        ),
        (name::COMPLETIONS, "Completions accepted"),
        (name::RELEASES, "Leases released"),
        (name::LEASES_LOST, "Lease operations refused with LeaseLost"),
        (
            name::WAITS,
            "Times a caller slept waiting for another holder",
        ),
        (name::OVERLOADED, "Calls refused by a limit"),
        (name::COMMITS, "Group commits made by the writer"),
        (name::COMMITTED_OPS, "Records written by group commits"),
        (
            name::LOG_CHECKPOINTS,
            "Group commits that were commit-log checkpoints",
        ),
        (name::ABANDONED_REAPED, "Abandoned claims reaped"),
        (
            name::FAILURES,
            "Attempts failed by their holder, the record kept",
        ),
        (
            name::EXPIRATIONS,
            "Completed keys reclaimed after retention",
        ),
    ];
    for (name, what) in counters {
        describe_counter!(name, Unit::Count, what);
    }
}

/// A `u64` written as 16 hex digits, without allocating.
#[cfg(feature = "tracing")]
pub(crate) struct Hex(pub(crate) u64);

#[cfg(feature = "tracing")]
impl std::fmt::Display for Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}
