//! Retention at scale: bytes per key and reopen time at 1 M completed records, and claim
//! latency in steady state against claim latency while 1 M keys expire at once.
//!
//! `cargo bench --bench retention` (1 M keys; `IDEMKV_BENCH_KEYS=100000` for a quick run).
//! Criterion reports the median (p50); the p99 of each phase is measured over every call
//! of the phase and printed as `p99` lines, since criterion does not report tails.

mod common;

use common::{percentile, rss_bytes};
use criterion::{criterion_group, criterion_main, Criterion};
use idemkv::{Claim, ClaimError, ClaimOptions, Durability, Engine, MockClock};
use std::path::Path;
use std::time::{Duration, Instant};

const RETENTION: Duration = Duration::from_secs(24 * 3600);

fn keys() -> u64 {
    std::env::var("IDEMKV_BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn open(path: &Path, clock: &MockClock, sweep: Option<Duration>) -> Engine {
    Engine::builder()
        .path(path)
        .durability(Durability::buffered())
        .clock(clock.clone())
        .retention(RETENTION)
        .tuning(
            idemkv::Tuning::default()
                .queue_depth(1 << 18)
                .sweep_interval(sweep),
        )
        .open()
        .expect("open")
}

/// Claims and completes `key`, backing off (flush) while the writer queue is full.
fn claim_complete(engine: &Engine, key: &[u8], opts: &ClaimOptions) {
    loop {
        match engine.claim(key, opts) {
            Ok(Claim::Acquired(lease)) => {
                lease
                    .complete(b"a typical 32-byte stored response")
                    .expect("complete");
                return;
            }
            Ok(other) => panic!("fresh key answered {other:?}"),
            Err(ClaimError::Overloaded(_)) => engine.flush().expect("flush"),
            Err(e) => panic!("claim: {e}"),
        }
    }
}

fn fill(engine: &Engine, n: u64, prefix: &str) {
    let opts = ClaimOptions::default();
    for i in 0..n {
        claim_complete(engine, format!("{prefix}-{i:016}").as_bytes(), &opts);
    }
    engine.flush().expect("flush");
}

/// Runs `n` claim+complete calls of new keys and returns their latencies, sorted.
fn sample(engine: &Engine, prefix: &str, n: u64) -> Vec<Duration> {
    let opts = ClaimOptions::default();
    let mut lat = Vec::with_capacity(n as usize);
    for i in 0..n {
        let key = format!("{prefix}-{i:016}");
        let start = Instant::now();
        claim_complete(engine, key.as_bytes(), &opts);
        lat.push(start.elapsed());
    }
    lat.sort_unstable();
    lat
}

fn retention(c: &mut Criterion) {
    let n = keys();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("retention.redb");
    let clock = MockClock::new();

    // Bytes per key: the index's own accounting and the process's resident memory.
    let rss_before = rss_bytes();
    let engine = open(&path, &clock, None);
    let start = Instant::now();
    fill(&engine, n, "live");
    let fill_time = start.elapsed();
    let stats = engine.stats();
    let rss_after = rss_bytes();
    let key_len = format!("live-{:016}", 0).len() as u64;
    eprintln!(
        "retention: {n} completed keys of {key_len} B filled in {fill_time:.2?}; index {} B/key \
         ({:.0} B/key beyond the key bytes); process RSS grew {} B/key (includes redb's page cache)",
        stats.index_bytes / n,
        (stats.index_bytes / n) as f64 - key_len as f64,
        rss_after.saturating_sub(rss_before) / n,
    );
    engine.close().expect("close");
    drop(engine);

    // Reopen time at n records.
    let mut group = c.benchmark_group("retention");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function(format!("reopen_{n}_records"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let engine = open(&path, &clock, None);
                total += start.elapsed();
                assert_eq!(engine.stats().completed, n);
                engine.close().expect("close");
            }
            total
        })
    });

    // Claim latency in steady state (n live keys), then while all n expire at once and the
    // background sweeper reclaims them.
    let engine = open(&path, &clock, Some(Duration::from_millis(1)));
    let mut round = 0u64;
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(5));
    let mut steady = Vec::new();
    group.bench_function("claim_complete_steady", |b| {
        b.iter_custom(|iters| {
            round += 1;
            let lat = sample(&engine, &format!("steady{round}"), iters);
            steady.extend_from_slice(&lat);
            lat.iter().sum()
        })
    });
    engine.flush().expect("flush");
    clock.advance(RETENTION);
    let sweep_start = Instant::now();
    let mut expiring = Vec::new();
    group.bench_function("claim_complete_while_expiring", |b| {
        b.iter_custom(|iters| {
            round += 1;
            let lat = sample(&engine, &format!("expiring{round}"), iters);
            if engine.stats().expired_unswept > 0 {
                expiring.extend_from_slice(&lat);
            }
            lat.iter().sum()
        })
    });
    group.finish();
    while engine.stats().expired_unswept > 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let sweep_time = sweep_start.elapsed();
    steady.sort_unstable();
    expiring.sort_unstable();
    if !steady.is_empty() && !expiring.is_empty() {
        let q = |sorted: &[Duration], q: f64| percentile(sorted, q).unwrap_or_default();
        let (s50, s99) = (q(&steady, 0.5), q(&steady, 0.99));
        let (e50, e99) = (q(&expiring, 0.5), q(&expiring, 0.99));
        eprintln!(
            "retention: claim+complete steady p50 {s50:?} p99 {s99:?}; while {n} keys expire p50 \
             {e50:?} p99 {e99:?} ({} samples during the sweep); ratio p50 {:.2}x p99 {:.2}x; the \
             sweeper reclaimed all {n} in {sweep_time:.2?}",
            expiring.len(),
            e50.as_secs_f64() / s50.as_secs_f64(),
            e99.as_secs_f64() / s99.as_secs_f64(),
        );
    } else {
        eprintln!("retention: the sweep finished before any expiring sample was taken");
    }
    engine.close().expect("close");
}

criterion_group!(benches, retention);
criterion_main!(benches);
