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

use crate::api::lease::Claim;
use crate::api::options::EngineBuilder;
use crate::base::sync::{AtomicU64, Ordering};
use crate::model::error::{ClaimError, LeaseError};
use crate::runtime::shared::Shared;

/// The `tracing` target of every span and event of the engine.
#[cfg(feature = "tracing")]
const TARGET: &str = "idemkv";

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
    pub(crate) fn new(b: &EngineBuilder) -> Self {
        #[cfg(not(feature = "tracing"))]
        let _ = b;
        Observer {
            #[cfg(feature = "tracing")]
            raw_keys: b.log_raw_keys,
            #[cfg(feature = "metrics")]
            metrics: Metrics::register(),
        }
    }

    /// Runs a claim (`wait`: `claim_or_wait`) in its span and reports its answer.
    #[inline]
    pub(crate) fn claim(
        &self,
        key: &[u8],
        wait: bool,
        call: impl FnOnce() -> Result<Claim, ClaimError>,
    ) -> Result<Claim, ClaimError> {
        #[cfg(feature = "tracing")]
        {
            let span = if wait {
                tracing::debug_span!(target: TARGET, "claim_or_wait", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty)
            } else {
                tracing::debug_span!(target: TARGET, "claim", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty)
            };
            if !span.is_disabled() {
                self.record_key(&span, key);
                let answer = span.in_scope(call);
                span.in_scope(|| claim_event(&answer));
                return answer;
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, wait);
        call()
    }

    /// Runs a holder's `complete` of `token` in its span and reports its answer.
    #[inline]
    pub(crate) fn complete(
        &self,
        key: &[u8],
        token: u64,
        call: impl FnOnce() -> Result<(), LeaseError>,
    ) -> Result<(), LeaseError> {
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!(target: TARGET, "complete", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty, token);
            if !span.is_disabled() {
                self.record_key(&span, key);
                let answer = span.in_scope(call);
                let outcome = match &answer {
                    Ok(()) => Ok("completed"),
                    Err(e) => Err(e),
                };
                span.in_scope(|| lease_event("complete answered", token, outcome));
                return answer;
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, token);
        call()
    }

    /// Runs a holder's `release` of `token` in its span and reports its answer.
    #[inline]
    pub(crate) fn release(
        &self,
        key: &[u8],
        token: u64,
        call: impl FnOnce() -> Result<bool, LeaseError>,
    ) -> Result<bool, LeaseError> {
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!(target: TARGET, "release", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty, token);
            if !span.is_disabled() {
                self.record_key(&span, key);
                let answer = span.in_scope(call);
                let outcome = match &answer {
                    Ok(true) => Ok("released"),
                    Ok(false) => Ok("not_held"),
                    Err(e) => Err(e),
                };
                span.in_scope(|| lease_event("release answered", token, outcome));
                return answer;
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, token);
        call()
    }

    /// Runs a holder's `fail` of `token` in its span and reports its answer.
    #[inline]
    pub(crate) fn fail(
        &self,
        key: &[u8],
        token: u64,
        call: impl FnOnce() -> Result<bool, LeaseError>,
    ) -> Result<bool, LeaseError> {
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!(target: TARGET, "fail", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty, token);
            if !span.is_disabled() {
                self.record_key(&span, key);
                let answer = span.in_scope(call);
                let outcome = match &answer {
                    Ok(true) => Ok("failed"),
                    Ok(false) => Ok("not_held"),
                    Err(e) => Err(e),
                };
                span.in_scope(|| lease_event("fail answered", token, outcome));
                return answer;
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, token);
        call()
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
    fn record_key(&self, span: &tracing::Span, key: &[u8]) {
        if self.raw_keys {
            span.record("key", tracing::field::display(key.escape_ascii()));
        }
    }
}

/// A commit of `ops` writes succeeded in `took` (the span `Stats::commit_max_us` is the
/// longest of): records its latency and size, and sets the gauges. Called by the writer
/// thread, which holds no stripe lock.
pub(crate) fn committed(s: &Shared, took: std::time::Duration, ops: usize) {
    #[cfg(feature = "metrics")]
    {
        let m = &s.observe.metrics;
        m.commit_seconds.record(took.as_secs_f64());
        m.commit_batch_ops.record(ops as f64);
        gauges(s);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (s, took, ops);
}

/// Sets the gauges from the engine's counters: the writer queue's length, the leases
/// counted live and abandoned, the completed keys held (those past retention that the
/// sweeper has not reclaimed yet included). Called after each commit and by `stats`.
pub(crate) fn gauges(s: &Shared) {
    #[cfg(feature = "metrics")]
    {
        let m = &s.observe.metrics;
        let c = &s.counters;
        let queued = s.tx.as_ref().map_or(0, |tx| tx.len());
        m.queue_depth.set(queued as f64);
        m.inflight_keys
            .set(c.gauges.inflight.load(Ordering::Relaxed) as f64);
        m.abandoned_keys
            .set(c.gauges.abandoned.load(Ordering::Relaxed) as f64);
        m.completed_keys
            .set(c.gauges.completed.load(Ordering::Relaxed) as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = s;
}

/// A storage failure poisoned the engine (a failed commit or fsync, a failed read, a panic
/// on the writer thread): nothing more is acknowledged until the file is reopened.
pub(crate) fn poisoned(why: &str) {
    #[cfg(feature = "tracing")]
    tracing::error!(target: TARGET, reason = why, "storage failure: the engine is poisoned and acknowledges nothing more; reopen the file to recover");
    #[cfg(not(feature = "tracing"))]
    let _ = why;
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
struct Hex(u64);

#[cfg(feature = "tracing")]
impl std::fmt::Display for Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The event of a claim's answer. The answers a caller must act on beyond retrying
/// (`OutcomeUnknown`, `Corrupted`) are warnings; every other answer is debug.
#[cfg(feature = "tracing")]
fn claim_event(answer: &Result<Claim, ClaimError>) {
    const MSG: &str = "claim answered";
    match answer {
        Ok(Claim::Acquired(lease)) => {
            // Only a takeover raises the attempt above one (docs/design.md).
            let outcome = if lease.attempt() > 1 {
                "takeover"
            } else {
                "acquired"
            };
            tracing::debug!(target: TARGET, outcome, token = lease.token(), attempt = lease.attempt(), MSG);
        }
        Ok(Claim::InProgress(busy)) => {
            let retry_after_ms = u64::try_from(busy.retry_after().as_millis()).unwrap_or(u64::MAX);
            tracing::debug!(target: TARGET, outcome = "in_progress", attempt = busy.attempt(), retry_after_ms, MSG);
        }
        Ok(Claim::Completed(stored)) => {
            tracing::debug!(target: TARGET, outcome = "replay", token = stored.token(), attempt = stored.attempt(), MSG);
        }
        Ok(Claim::Forgotten(forgotten)) => {
            tracing::debug!(target: TARGET, outcome = "forgotten", attempt = forgotten.attempt(), MSG);
        }
        Err(e @ (ClaimError::OutcomeUnknown(_) | ClaimError::Corrupted(_))) => {
            tracing::warn!(target: TARGET, outcome = claim_error_label(e), error = %e, MSG);
        }
        Err(e) => {
            tracing::debug!(target: TARGET, outcome = claim_error_label(e), error = %e, MSG);
        }
    }
}

/// The event of a holder's answer (`OutcomeUnknown` is a warning, as for claims).
#[cfg(feature = "tracing")]
fn lease_event(msg: &'static str, token: u64, outcome: Result<&'static str, &LeaseError>) {
    match outcome {
        Ok(outcome) => tracing::debug!(target: TARGET, outcome, token, "{msg}"),
        Err(e @ LeaseError::OutcomeUnknown(_)) => {
            tracing::warn!(target: TARGET, outcome = lease_error_label(e), token, error = %e, "{msg}")
        }
        Err(e) => {
            tracing::debug!(target: TARGET, outcome = lease_error_label(e), token, error = %e, "{msg}")
        }
    }
}

#[cfg(feature = "tracing")]
fn claim_error_label(e: &ClaimError) -> &'static str {
    match e {
        ClaimError::FingerprintMismatch => "fingerprint_mismatch",
        ClaimError::Overloaded(_) => "overloaded",
        ClaimError::KeyTooLong { .. } | ClaimError::KeyEmpty | ClaimError::ScopeTooLong { .. } => {
            "invalid_key"
        }
        ClaimError::TokensExhausted => "tokens_exhausted",
        ClaimError::Poisoned(_) => "poisoned",
        ClaimError::OutcomeUnknown(_) => "outcome_unknown",
        ClaimError::Corrupted(_) => "corrupted",
        ClaimError::Contended => "contended",
        ClaimError::Closed => "closed",
        ClaimError::RetentionTooLong { .. } => "invalid_retention",
        #[allow(unreachable_patterns)]
        _ => "error",
    }
}

#[cfg(feature = "tracing")]
fn lease_error_label(e: &LeaseError) -> &'static str {
    match e {
        LeaseError::LeaseLost => "lease_lost",
        LeaseError::ResponseTooLarge { .. } => "response_too_large",
        LeaseError::CheckpointTooLarge { .. } => "checkpoint_too_large",
        LeaseError::KeyTooLong { .. } | LeaseError::ScopeTooLong { .. } => "invalid_key",
        LeaseError::Overloaded(_) => "overloaded",
        LeaseError::Poisoned(_) => "poisoned",
        LeaseError::OutcomeUnknown(_) => "outcome_unknown",
        LeaseError::Closed => "closed",
        LeaseError::WriteSet(_) => "write_set_refused",
        LeaseError::Settled => "settled",
        LeaseError::RetentionTooLong { .. } => "invalid_retention",
        #[allow(unreachable_patterns)]
        _ => "error",
    }
}
