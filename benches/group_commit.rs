//! Group commit under `Durability::Immediate`: throughput of C concurrent claimers, each
//! doing claim + complete on distinct new keys (C = 1, 8, 64; 256 with `IDEMKV_BENCH_BIG=1`).
//!
//! One criterion iteration is one claim+complete pair (two durable operations); a sample is
//! a fixed number of pairs spread over C threads, timed from a barrier to the last thread's
//! end (`iter_custom`; thread start-up is not timed). Throughput is in pairs per second.
//!
//! Next to each idemkv run, in the same group, the naive baseline: one redb write
//! transaction per operation, each with redb's default `Immediate` durability — claim =
//! begin_write, open table, get(key), insert if absent, commit; complete = a second
//! transaction that stores the response. redb serializes write transactions, so C threads
//! only queue on its writer lock.
//!
//! At the end of each idemkv run the writer's batch formation (`Engine::stats`: committed
//! ops / commits, batch_max) and the per-operation latency percentiles are printed to
//! stderr. The group `redb_commit_1_insert` measures one redb commit of a single insert
//! (`Immediate`, `Immediate` + two-phase commit as idemkv's writer uses, and `None`), the
//! reference for the idemkv p50 under load.
//!
//! The disk and the two CPUs may be shared with other work, and their latency drifts between
//! criterion runs. So after each group both contenders also run in alternating 0.7 s blocks
//! (pairs/s per round and the ratio on stderr), and at C = 1 a loop alternating single
//! pairs gives both latency distributions under the same conditions; the single-insert
//! commits are likewise alternated after their group.
//!
//! Run: `cargo bench --bench group_commit` (add `IDEMKV_BENCH_BIG=1` for C = 256).

mod common;

use common::{big, key, response, tempdir, Latencies};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idemkv::{Claim, ClaimOptions, Durability, Engine};
use redb::{Database, ReadableTable, TableDefinition};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};
use tempfile::TempDir;

const RESPONSE_LEN: usize = 64;
/// Longer than any bench run, so no lease expires during one.
const LEASE: Duration = Duration::from_secs(3600);
/// redb page cache, as idemkv configures for its own file.
const CACHE_BYTES: usize = 64 << 20;

/// The naive baseline's table: client key → record.
const NAIVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("naive");
/// The single-insert commit table: a counter → 64-byte value.
const SINGLE: TableDefinition<u64, &[u8]> = TableDefinition::new("single");

fn claimer_counts() -> Vec<usize> {
    let mut counts = vec![1, 8, 64];
    if big() {
        counts.push(256);
    }
    counts
}

/// What one contender (idemkv or naive redb) accumulates over criterion's calls.
#[derive(Default)]
struct Run {
    next_key: AtomicU64,
    claim: Mutex<Latencies>,
    complete: Mutex<Latencies>,
}

impl Run {
    fn summary(&self) -> String {
        let claim = self.claim.lock().expect("lock").summary();
        let complete = self.complete.lock().expect("lock").summary();
        format!("claim {claim}\n    complete {complete}")
    }
}

/// Runs `pairs` operations spread over `threads` threads, each on its own new keys; returns
/// the time from the start barrier to the end of the last thread's last pair. `op` returns
/// the latencies of the claim and of the complete.
fn run_concurrent<F>(threads: usize, pairs: u64, run: &Run, op: &F) -> Duration
where
    F: Fn(&[u8]) -> (Duration, Duration) + Sync,
{
    let barrier = Barrier::new(threads + 1);
    let end = Mutex::new(None::<Instant>);
    let per = pairs / threads as u64;
    let extra = pairs % threads as u64;
    let start = std::thread::scope(|s| {
        for t in 0..threads {
            let n = per + u64::from((t as u64) < extra);
            let (barrier, end) = (&barrier, &end);
            s.spawn(move || {
                let first = run.next_key.fetch_add(n, Ordering::Relaxed);
                let mut claim = Vec::with_capacity(n as usize);
                let mut complete = Vec::with_capacity(n as usize);
                barrier.wait();
                for i in 0..n {
                    let (a, b) = op(&key(first + i));
                    claim.push(a.as_nanos() as u64);
                    complete.push(b.as_nanos() as u64);
                }
                let done = Instant::now();
                {
                    let mut end = end.lock().expect("lock");
                    *end = Some(end.map_or(done, |e| e.max(done)));
                }
                run.claim.lock().expect("lock").extend(claim);
                run.complete.lock().expect("lock").extend(complete);
            });
        }
        barrier.wait();
        Instant::now()
    });
    let end = end.into_inner().expect("lock").expect("a thread ran");
    end.saturating_duration_since(start)
}

fn open_engine() -> (Engine, TempDir) {
    let dir = tempdir();
    let engine = Engine::builder()
        .path(dir.path().join("bench.redb"))
        .durability(Durability::Immediate)
        .lease(LEASE)
        .open()
        .expect("open engine");
    (engine, dir)
}

fn open_redb() -> (Database, TempDir) {
    let dir = tempdir();
    let db = Database::builder()
        .set_cache_size(CACHE_BYTES)
        .create(dir.path().join("naive.redb"))
        .expect("create redb");
    (db, dir)
}

/// One idemkv claim + complete of a new key, `Immediate`.
fn idemkv_pair(
    engine: &Engine,
    opts: &ClaimOptions,
    resp: &[u8],
    k: &[u8],
) -> (Duration, Duration) {
    let t0 = Instant::now();
    let lease = match engine.claim(k, opts) {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("claim of a new key answered {other:?}"),
    };
    let t1 = Instant::now();
    lease.complete(resp).expect("complete");
    (t1 - t0, t1.elapsed())
}

/// The naive baseline: one redb write transaction for the claim (check, then insert), one
/// for the complete, each committed with redb's default durability (`Immediate`).
fn naive_pair(db: &Database, inflight: &[u8], done: &[u8], k: &[u8]) -> (Duration, Duration) {
    let t0 = Instant::now();
    let txn = db.begin_write().expect("begin_write");
    {
        let mut table = txn.open_table(NAIVE).expect("open_table");
        let absent = table.get(k).expect("get").is_none();
        assert!(absent, "new key already present");
        table.insert(k, inflight).expect("insert");
    }
    txn.commit().expect("commit");
    let t1 = Instant::now();
    let txn = db.begin_write().expect("begin_write");
    {
        let mut table = txn.open_table(NAIVE).expect("open_table");
        table.insert(k, done).expect("insert");
    }
    txn.commit().expect("commit");
    (t1 - t0, t1.elapsed())
}

fn immediate_claimers(c: &mut Criterion) {
    let resp = response(RESPONSE_LEN);
    let opts = ClaimOptions::default().fingerprint(0xF1A9_E2B3_C4D5_0617);
    // The naive records: an in-flight marker (token, deadline, fingerprint), then the
    // completed record (the same plus the response), sized like idemkv's.
    let inflight = vec![1u8; 40];
    let done = [inflight.as_slice(), resp.as_slice()].concat();
    for threads in claimer_counts() {
        let mut group = c.benchmark_group(format!("immediate_{threads}_claimers"));
        group
            .throughput(Throughput::Elements(1))
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));

        let mut engine: Option<(Engine, TempDir)> = None;
        let run = Run::default();
        group.bench_function(BenchmarkId::new("idemkv", threads), |b| {
            let (engine, _) = engine.get_or_insert_with(open_engine);
            let op = |k: &[u8]| idemkv_pair(engine, &opts, &resp, k);
            b.iter_custom(|pairs| run_concurrent(threads, pairs, &run, &op));
        });
        let ran = engine.is_some();
        if let Some((engine, _dir)) = &engine {
            let s = engine.stats();
            let avg = s.committed_ops as f64 / s.commits.max(1) as f64;
            eprintln!(
                "[group_commit] idemkv C={threads}: commits={} committed_ops={} \
                 avg_batch={avg:.1} batch_max={} overloaded={} (over the whole run, warm-up \
                 included)\n    {}",
                s.commits,
                s.committed_ops,
                s.batch_max,
                s.overloaded,
                run.summary()
            );
        }

        let mut db: Option<(Database, TempDir)> = None;
        let run = Run::default();
        group.bench_function(BenchmarkId::new("redb_txn_per_op", threads), |b| {
            let (db, _) = db.get_or_insert_with(open_redb);
            let op = |k: &[u8]| naive_pair(db, &inflight, &done, k);
            b.iter_custom(|pairs| run_concurrent(threads, pairs, &run, &op));
        });
        if db.is_some() {
            eprintln!(
                "[group_commit] redb_txn_per_op C={threads}:\n    {}",
                run.summary()
            );
        }
        group.finish();
        if let (Some((engine, _)), Some((db, _))) = (&engine, &db) {
            let idemkv = |k: &[u8]| idemkv_pair(engine, &opts, &resp, k);
            let naive = |k: &[u8]| naive_pair(db, &inflight, &done, k);
            interleaved_throughput(threads, &idemkv, &naive);
        }
        if let Some((engine, _dir)) = engine {
            engine.close().expect("close");
        }
        // Only when the bench was selected (a filter may skip it).
        if threads == 1 && ran {
            interleaved_single_claimer(&opts, &resp, &inflight, &done);
        }
    }
}

/// Rounds of the interleaved throughput pass, and the length of each contender's block.
const ROUNDS: usize = 3;
const BLOCK: Duration = Duration::from_millis(700);

/// Runs `threads` threads doing pairs on new keys until `block` has passed; returns the
/// pairs done per second.
fn run_for<F>(threads: usize, block: Duration, op: &F) -> f64
where
    F: Fn(&[u8]) -> (Duration, Duration) + Sync,
{
    // Keys far from the criterion runs' (which count up from 0), distinct per block.
    static NEXT: AtomicU64 = AtomicU64::new(1 << 62);
    let barrier = Barrier::new(threads + 1);
    let done = AtomicU64::new(0);
    let start = std::thread::scope(|s| {
        for _ in 0..threads {
            let (barrier, done) = (&barrier, &done);
            s.spawn(move || {
                barrier.wait();
                let deadline = Instant::now() + block;
                while Instant::now() < deadline {
                    op(&key(NEXT.fetch_add(1, Ordering::Relaxed)));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    done.into_inner() as f64 / start.elapsed().as_secs_f64()
}

/// idemkv and the naive baseline in alternating blocks, so that both see the same disk and
/// CPU conditions (this machine is shared); prints pairs/s per round and their ratio.
fn interleaved_throughput<A, B>(threads: usize, idemkv: &A, naive: &B)
where
    A: Fn(&[u8]) -> (Duration, Duration) + Sync,
    B: Fn(&[u8]) -> (Duration, Duration) + Sync,
{
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        rounds.push((
            run_for(threads, BLOCK, idemkv),
            run_for(threads, BLOCK, naive),
        ));
    }
    let shown: Vec<String> = rounds
        .iter()
        .map(|(a, b)| format!("{a:.0} vs {b:.0} ({:.1}x)", a / b))
        .collect();
    eprintln!(
        "[group_commit] interleaved C={threads}, idemkv vs redb_txn_per_op pairs/s in \
         alternating {BLOCK:?} blocks: {}",
        shown.join(", ")
    );
}

/// Pairs alternated in one loop for the interleaved passes: the disk is shared, and its
/// latency drifts; alternating puts both contenders under the same conditions.
const INTERLEAVED: usize = 400;

/// One thread alternating an idemkv pair and a naive redb pair, so their p50s are compared
/// under the same disk conditions (printed to stderr).
fn interleaved_single_claimer(opts: &ClaimOptions, resp: &[u8], inflight: &[u8], done: &[u8]) {
    let (engine, _engine_dir) = open_engine();
    let (db, _db_dir) = open_redb();
    let (mut ic, mut ie, mut nc, mut ne) = Default::default();
    for i in 0..INTERLEAVED as u64 {
        let k = key(u64::MAX / 2 + i);
        let (a, b) = idemkv_pair(&engine, opts, resp, &k);
        Latencies::push(&mut ic, a);
        Latencies::push(&mut ie, b);
        let (a, b) = naive_pair(&db, inflight, done, &k);
        Latencies::push(&mut nc, a);
        Latencies::push(&mut ne, b);
    }
    let show = |name: &str, l: &mut Latencies| eprintln!("    {name} {}", l.summary());
    eprintln!("[group_commit] interleaved C=1, {INTERLEAVED} pairs each:");
    show("idemkv claim   ", &mut ic);
    show("idemkv complete", &mut ie);
    show("redb   claim   ", &mut nc);
    show("redb   complete", &mut ne);
}

/// One redb commit holding a single 64-byte insert: the cost group commit amortizes.
fn redb_commit_1_insert(c: &mut Criterion) {
    let mut group = c.benchmark_group("redb_commit_1_insert");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let value = response(64);
    let cases = [
        ("immediate", redb::Durability::Immediate, false),
        ("immediate_2pc", redb::Durability::Immediate, true),
        ("none", redb::Durability::None, false),
    ];
    let mut ran = false;
    for (name, durability, two_phase) in cases {
        let mut db: Option<(Database, TempDir)> = None;
        let mut next = 0u64;
        let mut lat = Latencies::default();
        group.bench_function(name, |b| {
            let (db, _) = db.get_or_insert_with(open_redb);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t0 = Instant::now();
                    let mut txn = db.begin_write().expect("begin_write");
                    txn.set_durability(durability).expect("durability");
                    txn.set_two_phase_commit(two_phase);
                    {
                        let mut table = txn.open_table(SINGLE).expect("open_table");
                        table.insert(next, value.as_slice()).expect("insert");
                    }
                    txn.commit().expect("commit");
                    let d = t0.elapsed();
                    next += 1;
                    total += d;
                    lat.push(d);
                }
                total
            });
        });
        if db.is_some() {
            ran = true;
            eprintln!(
                "[group_commit] redb commit of 1 insert, {name}: {}",
                lat.summary()
            );
        }
    }
    group.finish();
    if !ran {
        return;
    }

    // The same commits alternated in one loop, under the same disk conditions.
    let (db, _dir) = open_redb();
    let mut lats: Vec<Latencies> = cases.iter().map(|_| Latencies::default()).collect();
    for i in 0..INTERLEAVED as u64 {
        for (n, (_, durability, two_phase)) in cases.iter().enumerate() {
            let t0 = Instant::now();
            let mut txn = db.begin_write().expect("begin_write");
            txn.set_durability(*durability).expect("durability");
            txn.set_two_phase_commit(*two_phase);
            {
                let mut table = txn.open_table(SINGLE).expect("open_table");
                table
                    .insert(i * 4 + n as u64, value.as_slice())
                    .expect("insert");
            }
            txn.commit().expect("commit");
            lats[n].push(t0.elapsed());
        }
    }
    eprintln!("[group_commit] redb commit of 1 insert, interleaved, {INTERLEAVED} each:");
    for ((name, _, _), lat) in cases.iter().zip(&mut lats) {
        eprintln!("    {name:<13} {}", lat.summary());
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = immediate_claimers, redb_commit_1_insert
}
criterion_main!(benches);
