//! The `tracing` and `metrics` features (docs/observability.md): the spans and events of each
//! operation and their fields, keys kept out of logs by default, and metrics that equal
//! `Engine::stats()` after a mixed workload. The dev-dependency on the library itself turns
//! both features on for this file.
//!
//! A subscriber and a recorder are installed per test and per thread
//! (`tracing::subscriber::with_default`, `metrics::with_local_recorder`), so tests running
//! in parallel do not see each other's output. Time is a `MockClock`.

use idemkv::admin::key_hash;
use idemkv::error::Limit;
use idemkv::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

const LEASE: Duration = Duration::from_secs(10);
const RETENTION: Duration = Duration::from_secs(3600);
/// A key whose bytes are easy to look for in every recorded field.
const KEY: &[u8] = b"customer-4711-order";

// ---- a subscriber layer that keeps every event with its span ----

type Fields = BTreeMap<String, String>;

/// One event: its level, its fields, and the name and fields of the span it happened in.
#[derive(Debug, Clone)]
struct Seen {
    level: Level,
    target: String,
    fields: Fields,
    span: Option<(String, Fields)>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
    fn span_name(&self) -> Option<&str> {
        self.span.as_ref().map(|(name, _)| name.as_str())
    }
    fn span_field(&self, name: &str) -> Option<&str> {
        self.span.as_ref()?.1.get(name).map(String::as_str)
    }
    /// Every recorded text: field names and values, the span's included.
    fn texts(&self) -> Vec<String> {
        let span = self.span.iter().flat_map(|(n, f)| {
            std::iter::once(n.clone()).chain(f.iter().flat_map(|(k, v)| [k.clone(), v.clone()]))
        });
        self.fields
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .chain(span)
            .collect()
    }
}

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Seen>>>);

impl Capture {
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(&mut Visitor(fields));
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        let span = ctx.event_span(event).map(|span| {
            let fields = span
                .extensions()
                .get::<Fields>()
                .cloned()
                .unwrap_or_default();
            (span.name().to_string(), fields)
        });
        self.0.lock().unwrap().push(Seen {
            level: *event.metadata().level(),
            target: event.metadata().target().to_string(),
            fields,
            span,
        });
    }
}

/// Runs `f` with a capturing subscriber on this thread; returns what it saw.
fn traced(f: impl FnOnce()) -> Vec<Seen> {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, f);
    capture.take()
}

fn memory_engine(clock: &MockClock, raw_keys: bool) -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .lease(LEASE)
        .retention(RETENTION)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .log_raw_keys(raw_keys)
        .open()
        .unwrap()
}

fn hash_hex(key: &[u8]) -> String {
    format!("{:016x}", key_hash(key))
}

/// The single answer event of one call: exactly one event, in the call's span.
fn answer(seen: &[Seen], span: &str) -> Seen {
    assert_eq!(seen.len(), 1, "one event per call, got {seen:#?}");
    let event = seen[0].clone();
    assert_eq!(event.span_name(), Some(span), "{event:#?}");
    assert_eq!(event.target, "idemkv");
    event
}

#[test]
fn each_operation_has_a_span_and_an_answer_event_with_its_fields() {
    let clock = MockClock::new();
    let engine = memory_engine(&clock, false);
    let opts = ClaimOptions::default().fingerprint(7);
    let hash = hash_hex(KEY);

    let mut lease = None;
    let seen = traced(|| match engine.claim(KEY, &opts).unwrap() {
        Claim::Acquired(l) => lease = Some(l),
        _ => panic!("a new key is acquired"),
    });
    let first = lease.unwrap();
    let e = answer(&seen, "claim");
    assert_eq!(e.level, Level::DEBUG);
    assert_eq!(e.field("outcome"), Some("acquired"));
    assert_eq!(e.field("token"), Some(first.token().to_string().as_str()));
    assert_eq!(e.field("attempt"), Some("1"));
    assert_eq!(e.span_field("key_hash"), Some(hash.as_str()));

    let seen = traced(|| {
        assert!(matches!(engine.claim(KEY, &opts), Ok(Claim::InProgress(_))));
    });
    let e = answer(&seen, "claim");
    assert_eq!(e.field("outcome"), Some("in_progress"));
    assert_eq!(e.field("attempt"), Some("1"));
    assert_eq!(e.field("retry_after_ms"), Some("10000"));

    let seen = traced(|| {
        let other = ClaimOptions::default().fingerprint(8);
        assert!(matches!(
            engine.claim(KEY, &other),
            Err(ClaimError::FingerprintMismatch)
        ));
    });
    let e = answer(&seen, "claim");
    assert_eq!(e.field("outcome"), Some("fingerprint_mismatch"));
    assert_eq!(e.level, Level::DEBUG);

    // The lease ends without a word from its holder: the next claim takes it over.
    let stale = first.detach();
    clock.advance(LEASE + Duration::from_millis(1));
    let mut lease = None;
    let seen = traced(|| match engine.claim_or_wait(KEY, &opts).unwrap() {
        Claim::Acquired(l) => lease = Some(l),
        _ => panic!("an ended lease is taken over"),
    });
    let second = lease.unwrap();
    let e = answer(&seen, "claim_or_wait");
    assert_eq!(e.field("outcome"), Some("takeover"));
    assert_eq!(e.field("attempt"), Some("2"));
    assert_eq!(e.field("token"), Some(second.token().to_string().as_str()));
    assert_eq!(e.span_field("key_hash"), Some(hash.as_str()));

    // The superseded holder is fenced off.
    let seen = traced(|| {
        let refused = engine.complete(KEY, stale.token(), b"late");
        assert!(matches!(refused, Err(LeaseError::LeaseLost)));
    });
    let e = answer(&seen, "complete");
    assert_eq!(e.field("outcome"), Some("lease_lost"));
    assert_eq!(e.field("token"), Some(stale.token().to_string().as_str()));
    assert_eq!(
        e.span_field("token"),
        Some(stale.token().to_string().as_str())
    );

    let token = second.token();
    let seen = traced(|| second.complete(b"done").unwrap());
    let e = answer(&seen, "complete");
    assert_eq!(e.field("outcome"), Some("completed"));
    assert_eq!(e.field("token"), Some(token.to_string().as_str()));
    assert_eq!(e.span_field("key_hash"), Some(hash.as_str()));

    let seen = traced(|| {
        assert!(matches!(engine.claim(KEY, &opts), Ok(Claim::Completed(_))));
    });
    let e = answer(&seen, "claim");
    assert_eq!(e.field("outcome"), Some("replay"));
    assert_eq!(e.field("token"), Some(token.to_string().as_str()));
    assert_eq!(e.field("attempt"), Some("2"));

    // Release, by the holder and then again by a token that no longer holds the key.
    let other = b"customer-4712-order";
    let Claim::Acquired(lease) = engine.claim(other, &opts).unwrap() else {
        panic!("a new key is acquired")
    };
    let token = lease.token();
    let seen = traced(|| assert!(lease.release().unwrap()));
    let e = answer(&seen, "release");
    assert_eq!(e.field("outcome"), Some("released"));
    assert_eq!(e.field("token"), Some(token.to_string().as_str()));
    assert_eq!(e.span_field("key_hash"), Some(hash_hex(other).as_str()));
    let seen = traced(|| assert!(!engine.release(other, token).unwrap()));
    assert_eq!(answer(&seen, "release").field("outcome"), Some("not_held"));

    // A lease dropped unsettled says so: it keeps its key.
    let Claim::Acquired(lease) = engine.claim(other, &opts).unwrap() else {
        panic!("a released key is acquired")
    };
    let token = lease.token();
    let seen = traced(|| drop(lease));
    let e = answer(&seen, "drop");
    assert_eq!(e.field("outcome"), Some("kept"));
    assert_eq!(e.field("token"), Some(token.to_string().as_str()));
    assert!(matches!(
        engine.claim(other, &opts).unwrap(),
        Claim::InProgress(_)
    ));
}

#[test]
fn the_raw_key_is_never_recorded_by_default_and_is_with_log_raw_keys() {
    let key_text = String::from_utf8(KEY.to_vec()).unwrap();
    for raw_keys in [false, true] {
        let clock = MockClock::new();
        let engine = memory_engine(&clock, raw_keys);
        let opts = ClaimOptions::default().fingerprint(1);
        let seen = traced(|| {
            let Claim::Acquired(lease) = engine.claim(KEY, &opts).unwrap() else {
                panic!("a new key is acquired")
            };
            let _ = engine.claim(KEY, &opts).unwrap();
            let _ = engine.claim(KEY, &ClaimOptions::default().fingerprint(2));
            let token = lease.token();
            lease.complete(b"ok").unwrap();
            let _ = engine.claim_or_wait(KEY, &opts).unwrap();
            let _ = engine.release(KEY, token).unwrap();
            let _ = engine.complete(KEY, token + 1, b"x");
        });
        assert_eq!(seen.len(), 7, "one event per call: {seen:#?}");
        let holding_key: Vec<&Seen> = seen
            .iter()
            .filter(|e| e.texts().iter().any(|t| t.contains(&key_text)))
            .collect();
        if raw_keys {
            assert_eq!(holding_key.len(), seen.len(), "every span names the key");
            for e in &seen {
                assert_eq!(e.span_field("key"), Some(key_text.as_str()));
                assert_eq!(e.span_field("key_hash"), Some(hash_hex(KEY).as_str()));
            }
        } else {
            assert!(
                holding_key.is_empty(),
                "the raw key was logged: {holding_key:#?}"
            );
            assert!(seen.iter().all(|e| e.span_field("key").is_none()));
        }
    }
}

#[test]
fn raw_keys_are_escaped() {
    let clock = MockClock::new();
    let engine = memory_engine(&clock, true);
    let mut claim = None;
    let seen = traced(|| claim = Some(engine.claim(b"a\nb\xff", &ClaimOptions::default())));
    assert!(matches!(claim, Some(Ok(Claim::Acquired(_)))));
    assert_eq!(answer(&seen, "claim").span_field("key"), Some("a\\nb\\xff"));
}

#[test]
fn key_hash_is_fnv1a_64() {
    // The published FNV-1a 64 test vectors: the hash must never change between versions,
    // since log lines are correlated by it across restarts and upgrades.
    assert_eq!(key_hash(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(key_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(key_hash(b"foobar"), 0x8594_4171_f739_67e8);
}

// ---- metrics ----

/// Opens with `recorder` as this thread's recorder: the engine registers its metrics at
/// open, so the handles keep recording into it from any thread afterwards.
fn open_recorded(recorder: &DebuggingRecorder, builder: EngineBuilder) -> Engine {
    metrics::with_local_recorder(recorder, || builder.open().unwrap())
}

/// Counters by (name, outcome label), gauges by name, histograms by name. A snapshot resets
/// the recorder's counters, so each test takes one.
#[derive(Debug, Default)]
struct Metrics {
    counters: BTreeMap<(String, Option<String>), u64>,
    gauges: BTreeMap<String, f64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

impl Metrics {
    fn take(snapshotter: &Snapshotter) -> Self {
        let mut m = Metrics::default();
        for (key, _unit, _desc, value) in snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let name = key.name().to_string();
            let outcome = key
                .labels()
                .find(|l| l.key() == "outcome")
                .map(|l| l.value().to_string());
            assert!(name.starts_with("idemkv_"), "{name}");
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    m.counters.insert((name, outcome), n);
                }
                (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                    m.gauges.insert(name, v.into_inner());
                }
                (MetricKind::Histogram, DebugValue::Histogram(vs)) => {
                    m.histograms
                        .insert(name, vs.into_iter().map(|v| v.into_inner()).collect());
                }
                other => panic!("unexpected metric {other:?}"),
            }
        }
        m
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters
            .get(&(name.to_string(), None))
            .copied()
            .unwrap_or(0)
    }

    fn claims(&self, outcome: &str) -> u64 {
        let key = ("idemkv_claims_total".to_string(), Some(outcome.to_string()));
        self.counters.get(&key).copied().unwrap_or(0)
    }
}

/// Acquire, in-progress, mismatch, takeover, a fenced-off completion, completion, replay,
/// release, a refusal at the key budget, an expiry and an abandoned claim reaped.
fn mixed_workload(engine: &Engine, clock: &MockClock) {
    let opts = ClaimOptions::default().fingerprint(1);
    let mismatch = ClaimOptions::default().fingerprint(2);
    let acquire = |key: &[u8]| match engine.claim(key, &opts).unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    let a = acquire(b"a");
    assert!(matches!(
        engine.claim(b"a", &opts),
        Ok(Claim::InProgress(_))
    ));
    assert!(matches!(
        engine.claim(b"a", &mismatch),
        Err(ClaimError::FingerprintMismatch)
    ));
    let stale = a.detach();
    clock.advance(LEASE + Duration::from_millis(1));
    let a = acquire(b"a");
    assert_eq!(a.attempt(), 2, "a takeover");
    assert!(matches!(
        engine.complete(b"a", stale.token(), b"late"),
        Err(LeaseError::LeaseLost)
    ));
    a.complete(b"A").unwrap();
    for _ in 0..3 {
        assert!(matches!(engine.claim(b"a", &opts), Ok(Claim::Completed(_))));
    }
    // A completed key's fingerprint is checked too (read from the file when durable).
    assert!(matches!(
        engine.claim(b"a", &mismatch),
        Err(ClaimError::FingerprintMismatch)
    ));
    // A failed attempt, taken over at once, then released.
    assert!(acquire(b"b").fail().unwrap());
    assert!(acquire(b"b").release().unwrap());
    // The key budget is 4: a, c, d, e fill it; f is refused.
    acquire(b"c").complete(b"C").unwrap();
    let _d = acquire(b"d").detach();
    let _e = acquire(b"e");
    assert!(matches!(
        engine.claim(b"f", &opts),
        Err(ClaimError::Overloaded(Limit::Keys))
    ));
    let opts_wait = opts.clone().wait(Duration::ZERO);
    assert!(matches!(
        engine.claim_or_wait(b"e", &opts_wait),
        Ok(Claim::InProgress(_))
    ));
    // Past the retention of a and c, and of the lease ends of d and e plus retention: the
    // sweep expires two completions and reaps two abandoned claims.
    clock.advance(RETENTION + LEASE);
    assert_eq!(engine.admin().sweep_now().unwrap(), 4);
    engine.flush().unwrap();
}

#[test]
fn fail_has_a_span_and_an_answer_event() {
    let clock = MockClock::new();
    let engine = memory_engine(&clock, false);
    let lease = match engine.claim(KEY, &ClaimOptions::default()).unwrap() {
        Claim::Acquired(l) => l,
        _ => panic!("a new key is acquired"),
    };
    let token = lease.token();
    let seen = traced(|| assert_eq!(lease.fail(), Ok(true)));
    let e = answer(&seen, "fail");
    assert_eq!(e.level, Level::DEBUG);
    assert_eq!(e.field("outcome"), Some("failed"));
    assert_eq!(e.field("token"), Some(token.to_string().as_str()));
    assert_eq!(e.span_field("key_hash"), Some(hash_hex(KEY).as_str()));
    let seen = traced(|| assert_eq!(engine.fail(KEY, token + 1), Ok(false)));
    assert_eq!(answer(&seen, "fail").field("outcome"), Some("not_held"));
}

fn assert_mirrors_stats(m: &Metrics, s: &Stats) {
    assert_eq!(m.counter("idemkv_claim_calls_total"), s.claims);
    assert_eq!(m.claims("acquired"), s.acquired);
    assert_eq!(m.claims("takeover"), s.takeovers);
    assert_eq!(m.claims("replay"), s.replays);
    assert_eq!(m.claims("in_progress"), s.in_progress);
    assert_eq!(m.claims("fingerprint_mismatch"), s.fingerprint_mismatches);
    assert_eq!(m.counter("idemkv_completions_total"), s.completions);
    assert_eq!(m.counter("idemkv_releases_total"), s.releases);
    assert_eq!(m.counter("idemkv_failures_total"), s.failures);
    assert_eq!(m.counter("idemkv_leases_lost_total"), s.leases_lost);
    assert_eq!(m.counter("idemkv_expirations_total"), s.expirations);
    assert_eq!(
        m.counter("idemkv_abandoned_reaped_total"),
        s.abandoned_reaped
    );
    assert_eq!(m.counter("idemkv_overloaded_total"), s.overloaded);
    assert_eq!(m.counter("idemkv_waits_total"), s.waits);
    assert_eq!(m.counter("idemkv_corrupt_reads_total"), s.corrupt_reads);
    assert_eq!(m.counter("idemkv_commits_total"), s.commits);
    assert_eq!(m.counter("idemkv_committed_ops_total"), s.committed_ops);
    // Set by `stats()` from the same counters.
    assert_eq!(m.gauges["idemkv_inflight_keys"], s.inflight as f64);
    assert_eq!(m.gauges["idemkv_abandoned_keys"], s.abandoned as f64);
    assert_eq!(
        m.gauges["idemkv_completed_keys"],
        (s.completed + s.expired_unswept) as f64
    );
    assert_eq!(m.gauges["idemkv_queue_depth"], s.queue_depth as f64);
}

/// The workload's expected counts, so that a mirror of a counter stuck at zero on both
/// sides cannot pass.
fn assert_workload_counted(s: &Stats) {
    assert_eq!(s.acquired, 7);
    assert_eq!(s.takeovers, 2);
    assert_eq!(s.failures, 1);
    assert_eq!(s.replays, 3);
    assert_eq!(s.in_progress, 2);
    assert_eq!(s.fingerprint_mismatches, 2);
    assert_eq!(s.completions, 2);
    assert_eq!(s.releases, 1);
    assert_eq!(s.leases_lost, 1);
    assert_eq!(s.overloaded, 1);
    assert_eq!(s.expirations, 2);
    assert_eq!(s.abandoned_reaped, 2);
}

fn builder(clock: &MockClock) -> EngineBuilder {
    Engine::builder()
        .clock(clock.clone())
        .lease(LEASE)
        .retention(RETENTION)
        .keys_max(4)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
}

#[test]
fn metrics_equal_stats_after_a_mixed_workload_in_memory() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let clock = MockClock::new();
    let engine = open_recorded(&recorder, builder(&clock).durability(Durability::None));
    mixed_workload(&engine, &clock);
    let stats = engine.stats();
    assert_workload_counted(&stats);
    let m = Metrics::take(&snapshotter);
    assert_mirrors_stats(&m, &stats);
    assert_eq!(stats.commits, 0, "a memory-only engine never commits");
    assert_eq!(stats.commit_max_us, 0, "and has no longest commit");
}

#[test]
fn metrics_equal_stats_after_a_mixed_workload_on_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let clock = MockClock::new();
    let engine = open_recorded(&recorder, builder(&clock).path(dir.path().join("o.redb")));
    mixed_workload(&engine, &clock);
    let stats = engine.stats();
    assert_workload_counted(&stats);
    let m = Metrics::take(&snapshotter);
    assert_mirrors_stats(&m, &stats);

    // The writer records each commit, on its own thread, into the recorder of the open.
    assert!(stats.commits > 0);
    let seconds = &m.histograms["idemkv_commit_seconds"];
    let sizes = &m.histograms["idemkv_commit_batch_ops"];
    assert_eq!(seconds.len() as u64, stats.commits);
    assert_eq!(sizes.len() as u64, stats.commits);
    assert!(seconds.iter().all(|s| *s >= 0.0 && s.is_finite()));
    assert_eq!(sizes.iter().sum::<f64>(), stats.committed_ops as f64);
    assert_eq!(
        sizes.iter().copied().fold(0.0, f64::max),
        stats.batch_max as f64
    );
    // The longest commit in stats is the longest the latency histogram holds (the same
    // span, in whole microseconds there).
    let longest_us = seconds.iter().copied().fold(0.0, f64::max) * 1e6;
    assert!(
        stats.commit_max_us > 0 && (longest_us - stats.commit_max_us as f64).abs() <= 1.0,
        "commit_max_us {} against the histogram's longest {longest_us:.1} us",
        stats.commit_max_us
    );
}

#[test]
fn counters_recovered_at_open_are_counted() {
    // An abandoned claim found past its reap bound on open is reaped by recovery, and
    // counted in `Stats::abandoned_reaped`: the metric of the new engine says the same.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let clock = MockClock::new();
    {
        let engine = builder(&clock).path(&path).open().unwrap();
        let Claim::Acquired(lease) = engine.claim(b"k", &ClaimOptions::default()).unwrap() else {
            panic!("a new key is acquired")
        };
        let _ = lease.detach();
        engine.close().unwrap();
    }
    clock.advance(LEASE + RETENTION + Duration::from_secs(1));
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let engine = open_recorded(&recorder, builder(&clock).path(&path));
    let stats = engine.stats();
    assert_eq!(stats.abandoned_reaped, 1);
    let m = Metrics::take(&snapshotter);
    assert_mirrors_stats(&m, &stats);
}
