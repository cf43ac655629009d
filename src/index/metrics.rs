//! The engine's event counters: each one an atomic and, with the `metrics` feature, the
//! metric it mirrors (registered once at open; the metric equals the counter at all times).

use crate::base::sync::{AtomicU64, Ordering};

/// An event counter of [`crate::Stats`] and, with the `metrics` feature, its metric. Only
/// `fetch_add` changes it, and it changes both: the metric equals the counter at all times
/// (from the open on; counters start at zero).
pub(crate) struct Counted {
    value: AtomicU64,
    #[cfg(feature = "metrics")]
    metric: metrics::Counter,
}

impl Counted {
    /// A counter reported as the metric `name`, with the label `outcome` if given. Registers
    /// the metric with the recorder in place now (the thread's local one, or the global one).
    pub(crate) fn new(name: &'static str, outcome: Option<&'static str>) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (name, outcome);
        Counted {
            value: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            metric: match outcome {
                Some(outcome) => metrics::counter!(name, "outcome" => outcome),
                None => metrics::counter!(name),
            },
        }
    }

    #[inline]
    pub(crate) fn fetch_add(&self, n: u64, order: Ordering) -> u64 {
        #[cfg(feature = "metrics")]
        self.metric.increment(n);
        self.value.fetch_add(n, order)
    }

    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.value.load(order)
    }
}

/// The metrics of the events each stripe counts under its lock (`stats::Events`): plain
/// integers on the hot path, so their metrics are incremented here, at the same points and
/// by the same amounts. Without the `metrics` feature it holds nothing and does nothing.
pub(crate) struct EventMetrics {
    #[cfg(feature = "metrics")]
    m: [metrics::Counter; 13],
}

impl EventMetrics {
    /// Registers the handles with the recorder in place now.
    pub(crate) fn new() -> Self {
        EventMetrics {
            #[cfg(feature = "metrics")]
            m: [
                metrics::counter!(name::CLAIM_CALLS),
                metrics::counter!(name::CLAIMS, "outcome" => "acquired"),
                metrics::counter!(name::CLAIMS, "outcome" => "takeover"),
                metrics::counter!(name::CLAIMS, "outcome" => "replay"),
                metrics::counter!(name::CLAIMS, "outcome" => "in_progress"),
                metrics::counter!(name::CLAIMS, "outcome" => "fingerprint_mismatch"),
                metrics::counter!(name::COMPLETIONS),
                metrics::counter!(name::RELEASES),
                metrics::counter!(name::LEASES_LOST),
                metrics::counter!(name::EXPIRATIONS),
                metrics::counter!(name::ABANDONED_REAPED),
                metrics::counter!(name::FAILURES),
                metrics::counter!(name::CLAIMS, "outcome" => "forgotten"),
            ],
        }
    }

    /// A claim call, counted by its stripe.
    #[inline]
    pub(crate) fn claim(&self) {
        #[cfg(feature = "metrics")]
        self.m[0].increment(1);
    }

    /// A state machine's events, counted by their stripe.
    #[inline]
    pub(crate) fn add(&self, d: &crate::model::machine::Deltas) {
        #[cfg(feature = "metrics")]
        {
            let counts = [
                d.acquired,
                d.takeovers,
                d.replays,
                d.in_progress,
                d.fingerprint_mismatches,
                d.completions,
                d.releases,
                d.leases_lost,
                d.expirations,
                d.abandoned_reaped,
                d.failures,
                d.forgotten,
            ];
            for (metric, n) in self.m[1..].iter().zip(counts) {
                if n > 0 {
                    metric.increment(n);
                }
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = d;
    }
}

impl std::fmt::Debug for EventMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventMetrics")
    }
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.load(Ordering::Relaxed).fmt(f)
    }
}

/// Metric names (docs/observability.md has the table).
pub(crate) mod name {
    #[cfg(feature = "metrics")]
    pub(crate) const CLAIM_CALLS: &str = "idemkv_claim_calls_total";
    pub(crate) const CLAIMS: &str = "idemkv_claims_total";
    pub(crate) const CLAIMS_CANCELLED: &str = "idemkv_claims_cancelled_total";
    pub(crate) const CORRUPT_READS: &str = "idemkv_corrupt_reads_total";
    #[cfg(feature = "metrics")]
    pub(crate) const COMPLETIONS: &str = "idemkv_completions_total";
    #[cfg(feature = "metrics")]
    pub(crate) const RELEASES: &str = "idemkv_releases_total";
    #[cfg(feature = "metrics")]
    pub(crate) const LEASES_LOST: &str = "idemkv_leases_lost_total";
    pub(crate) const WAITS: &str = "idemkv_waits_total";
    pub(crate) const OVERLOADED: &str = "idemkv_overloaded_total";
    pub(crate) const COMMITS: &str = "idemkv_commits_total";
    pub(crate) const COMMITTED_OPS: &str = "idemkv_committed_ops_total";
    pub(crate) const LOG_CHECKPOINTS: &str = "idemkv_log_checkpoints_total";
    pub(crate) const ABANDONED_REAPED: &str = "idemkv_abandoned_reaped_total";
    #[cfg(feature = "metrics")]
    pub(crate) const FAILURES: &str = "idemkv_failures_total";
    #[cfg(feature = "metrics")]
    pub(crate) const EXPIRATIONS: &str = "idemkv_expirations_total";
    #[cfg(feature = "metrics")]
    pub(crate) const COMMIT_SECONDS: &str = "idemkv_commit_seconds";
    #[cfg(feature = "metrics")]
    pub(crate) const COMMIT_BATCH_OPS: &str = "idemkv_commit_batch_ops";
    #[cfg(feature = "metrics")]
    pub(crate) const QUEUE_DEPTH: &str = "idemkv_queue_depth";
    #[cfg(feature = "metrics")]
    pub(crate) const INFLIGHT_KEYS: &str = "idemkv_inflight_keys";
    #[cfg(feature = "metrics")]
    pub(crate) const ABANDONED_KEYS: &str = "idemkv_abandoned_keys";
    #[cfg(feature = "metrics")]
    pub(crate) const COMPLETED_KEYS: &str = "idemkv_completed_keys";
}
