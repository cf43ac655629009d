//! Expiry at scale: what the sweeper, `stats()` and the key budget cost with 10 M live keys.
//!
//! Each stripe keeps its slots in the order they fall due, so none of these walks the keys:
//!
//! - `claim_sweeper_idle`: a claim of a new key while the background sweeper runs a pass
//!   every millisecond with nothing due (each pass reads the head of each stripe's queues);
//! - `claim_sweeper_working`: the same while keys keep expiring — the mock clock advances
//!   so that about one completion falls due per claim — and the sweeper reclaims them;
//! - `stats_idle`, `stats_sweeper_working`: one `Engine::stats()` call (O(stripes));
//! - `claim_refused_at_budget`: a claim of a new key refused with `Overloaded(Keys)` when the
//!   key budget is full and nothing is due anywhere.
//!
//! Mixed retentions (`mixed_retention`): the same engine filled twice, once with every key
//! kept for the engine's retention and once with half the keys choosing their own
//! (uniform in 0.1 to 2 retentions, through `CompleteOptions::retention`), so that half the
//! completions wait in each stripe's heap instead of its FIFO:
//!
//! - `claim_sweeper_working_{default,mixed}`: a claim while keys keep expiring and the
//!   background sweeper reclaims them (as `claim_sweeper_working`);
//! - the sweep's cost per expired key: `Admin::sweep_now` on an engine without a background
//!   sweeper, after the clock moved by 1/20 of the retention, divided by the keys it
//!   removed (printed as `expiry: sweep` lines).
//!
//! The engine is memory-only (`Durability::None`): the index is what is measured, and
//! filling a file with 10 M records would take minutes. Completion deadlines are spread over
//! the retention window (the clock advances while the keys are filled), as in a service.
//!
//! Criterion reports means; the p50/p99 of each phase are measured over every timed call
//! and printed as `expiry:` lines, since criterion does not report tails.
//!
//! `cargo bench --bench expiry` (10 M keys; `IDEMKV_BENCH_KEYS=1000000` for a quick run).

mod common;

use common::{key, percentile_us, rss_bytes, Latencies};
use criterion::{criterion_group, criterion_main, Criterion};
use idemkv::error::Limit;
use idemkv::{Claim, ClaimError, ClaimOptions, CompleteOptions, Durability, Engine, MockClock};
use std::time::{Duration, Instant};

/// Retention of the bench engine; the fill spreads completion deadlines over it.
const RETENTION: Duration = Duration::from_secs(1000);
/// Keys completed between two clock steps (the granularity of deadlines).
const STEP_KEYS: u64 = 1000;
/// Room above the filled keys for the claims the idle phase adds (the working phase expires
/// as many keys as it adds) before the budget is filled.
const HEADROOM: u64 = 6_000_000;

fn keys() -> u64 {
    std::env::var("IDEMKV_BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000)
}

/// Hands out fresh keys.
struct Keys(u64);

impl Keys {
    fn next(&mut self) -> [u8; common::KEY_LEN] {
        self.0 += 1;
        key(self.0)
    }
}

fn acquire_and_complete(engine: &Engine, k: &[u8]) {
    match engine.claim(k, &ClaimOptions::default()) {
        Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
        other => panic!("fresh key answered {other:?}"),
    }
}

fn summary(label: &str, lat: &mut Latencies) -> (f64, f64) {
    eprintln!("expiry: {label}: {}", lat.summary());
    (percentile_us(&lat.ns, 50.0), percentile_us(&lat.ns, 99.0))
}

fn expiry(c: &mut Criterion) {
    let n = keys();
    let clock = MockClock::new();
    let rss_before = rss_bytes();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .retention(RETENTION)
        .keys_max((n + HEADROOM) as usize)
        .tuning(idemkv::Tuning::default().sweep_interval(Some(Duration::from_millis(1))))
        .open()
        .expect("open");
    // The clock moves by this much per `STEP_KEYS` keys: the fill spans one retention, so
    // the first deadline falls due right after it.
    let step = RETENTION / (n / STEP_KEYS).max(1) as u32;
    let mut keys = Keys(0);
    let start = Instant::now();
    for i in 0..n {
        if i > 0 && i % STEP_KEYS == 0 {
            clock.advance(step);
        }
        acquire_and_complete(&engine, &keys.next());
    }
    let stats = engine.stats();
    assert_eq!((stats.completed, stats.expired_unswept), (n, 0));
    eprintln!(
        "expiry: {n} completed keys of {} B filled in {:.1?}; index {} B/key; process RSS \
         grew {} B/key",
        common::KEY_LEN,
        start.elapsed(),
        stats.index_bytes / n,
        rss_bytes().saturating_sub(rss_before) / n,
    );

    let mut group = c.benchmark_group("expiry");
    group.sample_size(20);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));

    // Nothing due: the sweeper's passes find nothing at the head of any stripe.
    let mut stats_idle = Latencies::default();
    group.bench_function("stats_idle", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                criterion::black_box(engine.stats());
                let d = t.elapsed();
                stats_idle.push(d);
                total += d;
            }
            total
        })
    });
    let mut idle = Latencies::default();
    group.bench_function("claim_sweeper_idle", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let k = keys.next();
                let t = Instant::now();
                let claim = engine.claim(&k, &ClaimOptions::default());
                let d = t.elapsed();
                // Completed, untimed, as in the working phase: only expiry differs.
                match claim {
                    Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
                    other => panic!("fresh key answered {other:?}"),
                }
                idle.push(d);
                total += d;
            }
            total
        })
    });
    assert_eq!(engine.stats().expired_unswept, 0);

    // Keys keep expiring: before every `STEP_KEYS` claims the clock moves so that as many
    // completions fall due, and the sweeper reclaims them while the claims run. The live
    // count stays near `n` (each claim completes a key, each step expires as many).
    let mut working = Latencies::default();
    let mut swept_during = 0u64;
    let mut claims_during = 0u64;
    let mut since_step = 0u64;
    group.bench_function("claim_sweeper_working", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let before = engine.stats().expirations;
            for _ in 0..iters {
                if since_step == 0 {
                    clock.advance(step);
                }
                since_step = (since_step + 1) % STEP_KEYS;
                let k = keys.next();
                let t = Instant::now();
                let claim = engine.claim(&k, &ClaimOptions::default());
                let d = t.elapsed();
                match claim {
                    Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
                    other => panic!("fresh key answered {other:?}"),
                }
                working.push(d);
                total += d;
            }
            swept_during += engine.stats().expirations - before;
            claims_during += iters;
            total
        })
    });
    let mut stats_working = Latencies::default();
    group.bench_function("stats_sweeper_working", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                // About one completion falls due per call, as in the claim phase.
                if i % 64 == 0 {
                    clock.advance(step * 64 / STEP_KEYS as u32);
                }
                let t = Instant::now();
                criterion::black_box(engine.stats());
                let d = t.elapsed();
                stats_working.push(d);
                total += d;
            }
            total
        })
    });
    let stats = engine.stats();
    eprintln!(
        "expiry: while working the sweeper reclaimed {swept_during} keys during {claims_during} \
         timed claims; now {} live completed keys, {} expired and not yet reclaimed",
        stats.completed, stats.expired_unswept
    );

    // The budget: let the sweeper finish, fill to the budget, then time refusals. Nothing is
    // due anywhere, so a refusal reads each stripe's board and gives up.
    while engine.stats().expired_unswept > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let opts = ClaimOptions::default();
    loop {
        match engine.claim(&keys.next(), &opts) {
            Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
            Err(ClaimError::Overloaded(Limit::Keys)) => break,
            other => panic!("filling the budget: {other:?}"),
        }
    }
    let full = engine.stats();
    let mut refused = Latencies::default();
    group.bench_function("claim_refused_at_budget", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let k = keys.next();
                let t = Instant::now();
                let r = engine.claim(&k, &opts);
                let d = t.elapsed();
                assert_eq!(r.unwrap_err(), ClaimError::Overloaded(Limit::Keys));
                refused.push(d);
                total += d;
            }
            total
        })
    });
    group.finish();

    eprintln!(
        "expiry: budget full at {} keys ({} completed, {} in flight)",
        full.completed + full.inflight + full.abandoned + full.expired_unswept,
        full.completed,
        full.inflight
    );
    summary("stats() idle", &mut stats_idle);
    summary("stats() while the sweeper works", &mut stats_working);
    let (i50, i99) = summary("claim, sweeper idle", &mut idle);
    let (w50, w99) = summary("claim, sweeper working", &mut working);
    eprintln!(
        "expiry: claim while the sweeper works / idle: p50 {:.2}x, p99 {:.2}x",
        w50 / i50,
        w99 / i99
    );
    let (_, r99) = summary("claim refused at the key budget", &mut refused);
    let mean = refused.ns.iter().sum::<u64>() as f64 / refused.ns.len().max(1) as f64;
    eprintln!(
        "expiry: refused claim mean {:.2}us, p99 {r99:.2}us",
        mean / 1000.0
    );
    engine.close().expect("close");
}

/// How long the `mixed` fill keeps key `i`: the engine's retention for half the keys (and
/// for every key when `!mixed`), else its own, uniform in 0.1 to 2 retentions.
fn own_retention(mixed: bool, rng: &mut fastrand::Rng) -> Option<Duration> {
    (mixed && rng.bool()).then(|| {
        let ms = RETENTION.as_millis() as u64;
        Duration::from_millis(rng.u64(ms / 10..2 * ms))
    })
}

fn complete_kept(engine: &Engine, k: &[u8], own: Option<Duration>) {
    match engine.claim(k, &ClaimOptions::default()) {
        Ok(Claim::Acquired(lease)) => match own {
            None => lease.complete(b"ok").expect("complete"),
            Some(d) => lease
                .complete_with_options(b"ok", &CompleteOptions::default().retention(d))
                .expect("complete"),
        },
        other => panic!("fresh key answered {other:?}"),
    }
}

/// A memory-only engine filled with `n` keys over one retention, each kept by
/// [`own_retention`].
fn filled(n: u64, mixed: bool, sweep: Option<Duration>) -> (Engine, MockClock, Keys, Duration) {
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .retention(RETENTION)
        .keys_max((n + HEADROOM) as usize)
        .tuning(idemkv::Tuning::default().sweep_interval(sweep))
        .open()
        .expect("open");
    let step = RETENTION / (n / STEP_KEYS).max(1) as u32;
    let mut rng = fastrand::Rng::with_seed(common::SEED);
    let mut keys = Keys(if mixed { 1 << 40 } else { 1 << 41 });
    for i in 0..n {
        if i > 0 && i % STEP_KEYS == 0 {
            clock.advance(step);
        }
        complete_kept(&engine, &keys.next(), own_retention(mixed, &mut rng));
    }
    (engine, clock, keys, step)
}

fn mixed_retention(c: &mut Criterion) {
    let n = keys();
    let mut group = c.benchmark_group("expiry");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    let mut report = Vec::new();
    for (label, mixed) in [("default", false), ("mixed", true)] {
        // Claims while keys keep expiring and the background sweeper reclaims them.
        let (engine, clock, mut keys, step) = filled(n, mixed, Some(Duration::from_millis(1)));
        let mut rng = fastrand::Rng::with_seed(common::SEED ^ 1);
        let mut working = Latencies::default();
        let mut since_step = 0u64;
        let before = engine.stats().expirations;
        group.bench_function(format!("claim_sweeper_working_{label}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    if since_step == 0 {
                        clock.advance(step);
                    }
                    since_step = (since_step + 1) % STEP_KEYS;
                    let k = keys.next();
                    let own = own_retention(mixed, &mut rng);
                    let t = Instant::now();
                    let claim = engine.claim(&k, &ClaimOptions::default());
                    let d = t.elapsed();
                    match (claim, own) {
                        (Ok(Claim::Acquired(lease)), None) => {
                            lease.complete(b"ok").expect("complete")
                        }
                        (Ok(Claim::Acquired(lease)), Some(d)) => lease
                            .complete_with_options(b"ok", &CompleteOptions::default().retention(d))
                            .expect("complete"),
                        (other, _) => panic!("fresh key answered {other:?}"),
                    }
                    working.push(d);
                    total += d;
                }
                total
            })
        });
        let swept = engine.stats().expirations - before;
        engine.close().expect("close");
        drop(engine);
        // The sweep alone: nothing else runs, the clock moves 1/20 retention per round.
        let (engine, clock, _, _) = filled(n, mixed, None);
        let (mut removed, mut spent) = (0u64, Duration::ZERO);
        for _ in 0..20 {
            clock.advance(RETENTION / 20);
            let t = Instant::now();
            removed += engine.admin().sweep_now().expect("sweep");
            spent += t.elapsed();
        }
        let (p50, p99) = summary(&format!("claim, sweeper working, {label}"), &mut working);
        report.push((label, p50, p99, swept, removed, spent));
        engine.close().expect("close");
    }
    group.finish();
    for (label, p50, p99, swept, removed, spent) in &report {
        eprintln!(
            "expiry: {label}: {n} keys; claim p50 {p50:.2}us p99 {p99:.2}us while the \
             sweeper reclaimed {swept}; sweep {removed} keys in {spent:.1?} = {:.0} ns per \
             expired key",
            spent.as_nanos() as f64 / (*removed).max(1) as f64
        );
    }
    if let [d, m] = &report[..] {
        eprintln!(
            "expiry: mixed / default: claim p50 {:.2}x, p99 {:.2}x; sweep per key {:.2}x",
            m.1 / d.1,
            m.2 / d.2,
            (m.5.as_nanos() as f64 / m.4.max(1) as f64)
                / (d.5.as_nanos() as f64 / d.4.max(1) as f64)
        );
    }
}

criterion_group!(benches, expiry, mixed_retention);
criterion_main!(benches);
