//! Single-thread latency of the claim path. Criterion's median is over samples (each the
//! mean of many calls, so preemption on a busy machine inflates it); the per-call
//! percentiles (p50, p99, ...) are printed to stderr after each bench.
//!
//! - `claim_complete_new_key`: claim of a never-seen key + complete with a 64-byte response,
//!   with 10k completed keys live, in `Durability::None` and `Durability::buffered()` (a
//!   file in a temporary directory). `IDEMKV_BENCH_BIG=1` adds both at 1M live keys. One
//!   thread's `Immediate` claim latency is in `group_commit` (C = 1): it is an fsync.
//! - `replay`: claim of a completed key (answered with the stored response).
//! - `in_progress`: claim of a key whose lease is held (answered `InProgress`).
//!
//! Two things are kept out of the timed sections:
//! - The live-key count is kept near its nominal value: each new-key iteration adds a live
//!   key, so once max(live/2, 10k) keys were added the engine is rebuilt (untimed) and
//!   refilled: 10k live keys stay within [10k, 20k], 1M within [1M, 1.5M].
//! - `Buffered` acknowledges at once, but the writer must keep up: the writer queue (16Ki
//!   operations by default) refuses new claims above 7/8 of it. The bench times chunks of
//!   `CHUNK` claim+complete pairs (2 queued operations each, below the claim limit) and
//!   calls `engine.flush()` between chunks, untimed. An `Overloaded` answer would also be
//!   handled by an untimed flush and a retry; their number is printed to stderr.
//!
//! Run: `cargo bench --bench claim` (add `IDEMKV_BENCH_BIG=1` for the 1M-key variant).

mod common;

use common::{
    big, clock_cost_ns, key, response, tempdir, threads_named, Latencies, Rng, Sched, SEED,
};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use idemkv::{Claim, ClaimError, ClaimOptions, Durability, Engine, Lease, LeaseError};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Size of every stored response.
const RESPONSE_LEN: usize = 64;
/// Longer than any bench run, so no lease expires during one.
const LEASE: Duration = Duration::from_secs(3600);
/// Claim+complete pairs timed between two untimed flushes (2 queued ops each: 8Ki ops,
/// below the 14Ki claim limit of the default 16Ki queue, and within one writer batch).
const CHUNK: u64 = 4096;
/// Leases held for the `in_progress` bench.
const HELD: u64 = 1024;
/// The name of the engine's writer thread (src/runtime/writer.rs), for its CPU accounting.
const WRITER_THREAD: &str = "idemkv-writer";
/// Request fingerprint passed with every claim (exercises the fingerprint compare).
const FINGERPRINT: u64 = 0xF1A9_E2B3_C4D5_0617;

fn opts() -> ClaimOptions {
    ClaimOptions::default().fingerprint(FINGERPRINT)
}

fn mode_name(d: Durability) -> &'static str {
    match d {
        Durability::None => "none",
        Durability::Buffered { .. } => "buffered",
        Durability::Immediate => "immediate",
        _ => "other",
    }
}

fn live_name(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M_live", n / 1_000_000)
    } else {
        format!("{}k_live", n / 1000)
    }
}

/// An engine with `base` completed keys, rebuilt once `growth` more keys were added.
struct Fixture {
    durability: Durability,
    base: u64,
    growth: u64,
    engine: Engine,
    _dir: Option<TempDir>,
    /// Keys `[first, first + base)` were completed by the fill.
    first: u64,
    /// Keys added since the fill.
    added: u64,
    /// Next never-used key number (over every engine this fixture built).
    next_key: u64,
    response: Vec<u8>,
    /// `Overloaded` answers met (each followed by an untimed flush and a retry).
    overloads: u64,
    /// Untimed time spent in flushes after an `Overloaded`.
    paused: Duration,
    rebuilds: u64,
    /// Per-pair latencies of the timed new-key pairs.
    lat: Latencies,
    /// Time spent in the untimed flushes between chunks (the writer catching up).
    flush_time: Duration,
    /// The bench thread's scheduler accounting over the timed chunks.
    sched: Option<Sched>,
    /// The writer thread's accounting over the timed chunks and the flushes after them.
    writer: Option<Sched>,
}

impl Fixture {
    fn new(durability: Durability, base: u64) -> Self {
        let (engine, dir) = open(durability);
        let mut fx = Fixture {
            durability,
            base,
            growth: (base / 2).max(10_000),
            engine,
            _dir: dir,
            first: 0,
            added: 0,
            next_key: 0,
            response: response(RESPONSE_LEN),
            overloads: 0,
            paused: Duration::ZERO,
            rebuilds: 0,
            lat: Latencies::default(),
            flush_time: Duration::ZERO,
            sched: None,
            writer: None,
        };
        fx.fill();
        fx
    }

    fn fill(&mut self) {
        let t = Instant::now();
        self.first = self.next_key;
        for i in 0..self.base {
            self.claim_complete_new();
            if (i + 1) % CHUNK == 0 {
                self.flush();
            }
        }
        self.flush();
        self.added = 0;
        if self.base >= 100_000 {
            eprintln!(
                "[claim] filled {} keys ({}) in {:.1?}",
                self.base,
                mode_name(self.durability),
                t.elapsed()
            );
        }
    }

    fn rebuild(&mut self) {
        // Close the old engine (and delete its file) before opening the next one.
        let (engine, dir) = open(self.durability);
        let old = std::mem::replace(&mut self.engine, engine);
        drop(old);
        self._dir = dir;
        self.rebuilds += 1;
        self.fill();
    }

    fn flush(&self) {
        self.engine.flush().expect("flush");
    }

    /// Untimed flush after an `Overloaded` answer.
    fn back_off(&mut self) {
        let t = Instant::now();
        self.overloads += 1;
        self.flush();
        self.paused += t.elapsed();
    }

    /// Claims a never-seen key and completes it; retries (after an untimed flush) if the
    /// writer queue refuses.
    fn claim_complete_new(&mut self) {
        let k = key(self.next_key);
        self.next_key += 1;
        let opts = opts();
        let token = loop {
            match self.engine.claim(&k, &opts) {
                Ok(Claim::Acquired(lease)) => {
                    let token = lease.token();
                    match lease.complete(&self.response) {
                        Ok(()) => return,
                        Err(LeaseError::Overloaded(_)) => break token,
                        Err(e) => panic!("complete of a new key failed: {e}"),
                    }
                }
                Err(ClaimError::Overloaded(_)) => self.back_off(),
                Ok(other) => panic!("claim of a new key answered {other:?}"),
                Err(e) => panic!("claim of a new key failed: {e}"),
            }
        };
        // `Lease::complete` consumed the lease; the engine-level call retries it by token.
        loop {
            self.back_off();
            match self.engine.complete(&k, token, &self.response) {
                Ok(()) => return,
                Err(LeaseError::Overloaded(_)) => {}
                Err(e) => panic!("complete retry failed: {e}"),
            }
        }
    }

    /// `iters` new-key claim+complete pairs in chunks; returns the timed total.
    fn run_new_keys(&mut self, iters: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut done = 0;
        while done < iters {
            if self.added >= self.growth {
                self.rebuild();
            }
            let n = (iters - done).min(CHUNK).min(self.growth - self.added);
            // One clock read per pair: each pair's latency is the time since the previous
            // read, minus any untimed back-off inside it; the chunk total is their sum.
            let writer0 = threads_named(WRITER_THREAD);
            let sched0 = Sched::now();
            let mut prev = Instant::now();
            for _ in 0..n {
                self.paused = Duration::ZERO;
                self.claim_complete_new();
                let now = Instant::now();
                let d = (now - prev).saturating_sub(self.paused);
                prev = now;
                total += d;
                self.lat.push(d);
            }
            self.added += n;
            done += n;
            // Let the writer catch up, untimed (a no-op under `None`).
            if let (Some(end), Some(start)) = (Sched::now(), sched0) {
                self.sched
                    .get_or_insert_with(Sched::default)
                    .add(end.since(start));
            }
            let t = Instant::now();
            self.flush();
            self.flush_time += t.elapsed();
            if let (Some(end), Some(start)) = (threads_named(WRITER_THREAD), writer0) {
                self.writer
                    .get_or_insert_with(Sched::default)
                    .add(end.since(start));
            }
        }
        total
    }

    fn report(&mut self, what: &str) {
        let s = self.engine.stats();
        let avg = if s.commits > 0 {
            s.committed_ops as f64 / s.commits as f64
        } else {
            0.0
        };
        eprintln!(
            "[claim] {what}: rebuilds={} overloaded_answers={} (this engine: commits={} \
             avg_batch={avg:.0} batch_max={} completed={} inflight={})",
            self.rebuilds, self.overloads, s.commits, s.batch_max, s.completed, s.inflight
        );
        eprintln!("[claim] {what}: per pair {}", self.lat.summary());
        let pairs = self.lat.ns.len().max(1) as f64;
        if let Some(s) = self.sched {
            eprintln!(
                "[claim] {what}: bench thread on CPU {:.2} us per pair on average; runnable \
                 but waiting for a CPU {:.0}% of the timed time",
                s.on_cpu_ns as f64 / pairs / 1000.0,
                100.0 * s.waiting_ns as f64 / (s.on_cpu_ns + s.waiting_ns).max(1) as f64
            );
        }
        if let Some(w) = self.writer {
            eprintln!(
                "[claim] {what}: writer thread on CPU {:.2} us per pair on average (encode + \
                 commit + publish)",
                w.on_cpu_ns as f64 / pairs / 1000.0
            );
        }
        if self.durability != Durability::None && !self.lat.ns.is_empty() {
            let timed: u64 = self.lat.ns.iter().sum();
            let pairs = self.lat.ns.len() as f64;
            let sustained = pairs / (timed as f64 / 1e9 + self.flush_time.as_secs_f64());
            eprintln!(
                "[claim] {what}: with the untimed flushes counted ({:.2?} waiting for the \
                 writer), the sustained rate is {sustained:.0} pairs/s",
                self.flush_time
            );
        }
    }
}

fn open(durability: Durability) -> (Engine, Option<TempDir>) {
    let builder = Engine::builder().durability(durability).lease(LEASE);
    match durability {
        Durability::None => (builder.open().expect("open engine"), None),
        _ => {
            let dir = tempdir();
            let engine = builder
                .path(dir.path().join("bench.redb"))
                .open()
                .expect("open engine");
            (engine, Some(dir))
        }
    }
}

fn claim_complete_new_key(c: &mut Criterion) {
    let mut cases = vec![(Durability::None, 10_000), (Durability::buffered(), 10_000)];
    if big() {
        cases.push((Durability::None, 1_000_000));
        cases.push((Durability::buffered(), 1_000_000));
    }
    let mut group = c.benchmark_group("claim_complete_new_key");
    group.measurement_time(Duration::from_secs(3));
    for (durability, live) in cases {
        let name = format!("{}/{}", mode_name(durability), live_name(live));
        let id = BenchmarkId::new(mode_name(durability), live_name(live));
        let mut fixture: Option<Fixture> = None;
        group.bench_function(id, |b| {
            let fx = fixture.get_or_insert_with(|| Fixture::new(durability, live));
            b.iter_custom(|iters| fx.run_new_keys(iters));
        });
        if let Some(mut fx) = fixture {
            fx.report(&format!("claim_complete_new_key/{name}"));
        }
    }
    group.finish();
}

/// Operations timed one by one after a criterion run, for percentiles.
const PASS: usize = 200_000;

/// Runs `op` `PASS` times, timing each, and prints the percentiles to stderr.
fn percentile_pass(label: &str, mut op: impl FnMut()) {
    let mut lat = Latencies::default();
    lat.ns.reserve(PASS);
    let sched0 = Sched::now();
    let mut prev = Instant::now();
    for _ in 0..PASS {
        op();
        let now = Instant::now();
        lat.push(now - prev);
        prev = now;
    }
    let on_cpu = match (Sched::now(), sched0) {
        (Some(end), Some(start)) => format!(
            "; on CPU {:.0} ns per claim on average",
            end.since(start).on_cpu_ns as f64 / PASS as f64
        ),
        _ => String::new(),
    };
    eprintln!(
        "[claim] {label}: per claim {} (includes one clock read, ~{:.0} ns){on_cpu}",
        lat.summary(),
        clock_cost_ns()
    );
}

fn replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    group.measurement_time(Duration::from_secs(2));
    for durability in [Durability::None, Durability::buffered()] {
        let live = 10_000;
        let name = format!("{}/{}", mode_name(durability), live_name(live));
        let id = BenchmarkId::new(mode_name(durability), live_name(live));
        let mut fixture: Option<Fixture> = None;
        let mut rng = Rng::with_seed(SEED);
        let opts = opts();
        let replay_one = |fx: &Fixture, rng: &mut Rng| {
            let k = key(fx.first + rng.u64(0..fx.base));
            match fx.engine.claim(black_box(&k), &opts) {
                Ok(Claim::Completed(stored)) => stored,
                other => panic!("replay answered {other:?}"),
            }
        };
        group.bench_function(id, |b| {
            let fx = fixture.get_or_insert_with(|| Fixture::new(durability, live));
            b.iter(|| replay_one(fx, &mut rng));
        });
        if let Some(fx) = &fixture {
            percentile_pass(&format!("replay/{name}"), || {
                black_box(replay_one(fx, &mut rng));
            });
        }
    }
    group.finish();
}

fn in_progress(c: &mut Criterion) {
    let mut group = c.benchmark_group("in_progress");
    group.measurement_time(Duration::from_secs(2));
    for durability in [Durability::None, Durability::buffered()] {
        let live = 10_000;
        let id = BenchmarkId::new(mode_name(durability), live_name(live));
        let name = format!("{}/{}", mode_name(durability), live_name(live));
        let mut fixture: Option<(Fixture, Vec<Lease>, u64)> = None;
        let mut rng = Rng::with_seed(SEED);
        let opts = opts();
        let busy_one = |fx: &Fixture, first_held: u64, rng: &mut Rng| {
            let k = key(first_held + rng.u64(0..HELD));
            match fx.engine.claim(black_box(&k), &opts) {
                Ok(Claim::InProgress(busy)) => busy,
                other => panic!("claim of a held key answered {other:?}"),
            }
        };
        group.bench_function(id, |b| {
            let (fx, _held, first_held) = fixture.get_or_insert_with(|| {
                let mut fx = Fixture::new(durability, live);
                let first_held = fx.next_key;
                let held: Vec<Lease> = (0..HELD)
                    .map(|i| match fx.engine.claim(&key(first_held + i), &opts) {
                        Ok(Claim::Acquired(lease)) => lease,
                        other => panic!("claim to hold answered {other:?}"),
                    })
                    .collect();
                fx.next_key += HELD;
                fx.flush();
                (fx, held, first_held)
            });
            b.iter(|| busy_one(fx, *first_held, &mut rng));
        });
        if let Some((fx, _held, first_held)) = &fixture {
            percentile_pass(&format!("in_progress/{name}"), || {
                black_box(busy_one(fx, *first_held, &mut rng));
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = claim_complete_new_key, replay, in_progress
}
criterion_main!(benches);
