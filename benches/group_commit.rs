//! Claim+complete throughput against the number of concurrent claimers, in every durability
//! mode, next to a naive redb baseline; and the same with 10 000 async tasks.
//!
//! Groups `claimers_C` (C = 1, 8, 64, 256 OS threads): each thread does claim + complete on
//! distinct new keys with the blocking API, in each mode, on a fresh file per mode:
//!
//! - `immediate`: `Durability::Immediate`; the claim and the completion each wait for a
//!   durable group commit.
//! - `buffered_10ms`: `Durability::buffered()`; the last thread of each timed sample flushes
//!   before the clock stops, so the figure is sustained durable throughput, not the burst the
//!   writer queue absorbs. A claim refused with `Overloaded` (the writer queue is full)
//!   flushes and retries, counted as `backoffs`.
//! - `none`: `Durability::None`, memory only.
//! - `redb_txn_per_op`: the naive baseline, one redb write transaction per operation, each
//!   with redb's default `Immediate` durability — claim = begin_write, open table, get(key),
//!   insert if absent, commit; complete = a second transaction that stores the response.
//!   redb serializes write transactions, so C threads only queue on its writer lock.
//!
//! One criterion iteration is one pair per thread (C pairs; throughput is in pairs per
//! second); a sample is timed from a barrier to the end of the last thread (`iter_custom`,
//! flat sampling; thread start-up is not timed).
//!
//! Groups `async_64_tasks` and `async_10000_tasks`: 64 (next to `claimers_64`) and 10 000
//! tasks on a tokio runtime with 2 worker threads, each doing `claim_async` +
//! `complete_async` on its own new keys, in each mode (one iteration is one pair per task;
//! `Buffered` flushes at the end of each sample, with `flush_async`).
//!
//! After each run the writer's batch formation (`Engine::stats`: committed ops / commits,
//! batch_max), the back-offs and the per-operation latency percentiles are printed to
//! stderr. The group `redb_commit_1_insert` measures one redb commit of a single insert
//! (`Immediate`, `Immediate` + two-phase commit as idemkv's writer uses, and `None`), the
//! reference for the idemkv p50 under load.
//!
//! The disk and the two CPUs may be shared with other work, and their latency drifts between
//! criterion runs. So after each `claimers_C` group every contender also runs in alternating
//! 0.7 s blocks (pairs/s per round, and each round's ratio to the naive baseline, on
//! stderr), and at C = 1 a loop alternating single pairs gives the latency distributions of
//! idemkv `Immediate` and of the baseline under the same conditions; the single-insert
//! commits are likewise alternated after their group.
//!
//! Run: `cargo bench --bench group_commit` (a few minutes on a quiet 2-core machine).

mod common;
#[path = "common/throughput.rs"]
mod throughput;

use common::{key, response, tempdir, Latencies};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use redb::{Database, ReadableTable, TableDefinition};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use throughput::{
    run_tasks, run_threads, run_threads_for, runtime, show_rounds, Idem, Mode, Run, BLOCK,
    RESPONSE_LEN, ROUNDS, TASKS,
};

/// redb page cache, as idemkv configures for its own file.
const CACHE_BYTES: usize = 64 << 20;

/// The naive baseline's table: client key → record.
const NAIVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("naive");
/// The single-insert commit table: a counter → 64-byte value.
const SINGLE: TableDefinition<u64, &[u8]> = TableDefinition::new("single");

/// Concurrent claimers (OS threads) of the `claimers_C` groups.
const CLAIMERS: [usize; 4] = [1, 8, 64, 256];
/// Task counts of the async groups.
const ASYNC_TASKS: [usize; 2] = [64, TASKS];

/// Short runs: 4 modes and a baseline at 4 claimer counts, on two shared cores. Set on the
/// `Criterion` rather than on the groups, so `--warm-up-time`, `--measurement-time` and
/// `--sample-size` on the command line still apply.
fn config() -> Criterion {
    common::criterion()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

/// Each sample runs the same number of pairs per claimer: criterion's linear sampling would
/// make the first samples of a slow contender a handful of pairs over hundreds of claimers.
fn configure<M: criterion::measurement::Measurement>(group: &mut criterion::BenchmarkGroup<'_, M>) {
    group.sampling_mode(SamplingMode::Flat);
}

fn open_redb() -> (Database, TempDir) {
    let dir = tempdir();
    let db = Database::builder()
        .set_cache_size(CACHE_BYTES)
        .create(dir.path().join("naive.redb"))
        .expect("create redb");
    (db, dir)
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

/// The naive records: an in-flight marker (token, deadline, fingerprint), then the
/// completed record (the same plus the response), sized like idemkv's.
fn naive_records() -> (Vec<u8>, Vec<u8>) {
    let inflight = vec![1u8; 40];
    let done = [inflight.as_slice(), response(RESPONSE_LEN).as_slice()].concat();
    (inflight, done)
}

fn claimers(c: &mut Criterion) {
    let (inflight, done) = naive_records();
    let nothing = || {};
    for threads in CLAIMERS {
        let mut group = c.benchmark_group(format!("claimers_{threads}"));
        configure(&mut group);
        group.throughput(Throughput::Elements(threads as u64));

        let mut idems: Vec<Option<Idem>> = Mode::ALL.iter().map(|_| None).collect();
        for (mode, slot) in Mode::ALL.into_iter().zip(&mut idems) {
            group.bench_function(mode.name(), |b| {
                let idem = slot.get_or_insert_with(|| Idem::open(mode));
                let op = |k: &[u8]| idem.pair(k);
                let finish = || idem.finish();
                b.iter_custom(|per| run_threads(threads, per, &idem.run, &op, &finish));
            });
        }

        let mut db: Option<(Database, TempDir)> = None;
        let naive_run = Run::default();
        group.bench_function("redb_txn_per_op", |b| {
            let (db, _) = db.get_or_insert_with(open_redb);
            let op = |k: &[u8]| naive_pair(db, &inflight, &done, k);
            b.iter_custom(|per| run_threads(threads, per, &naive_run, &op, &nothing));
        });
        group.finish();

        for idem in idems.iter().flatten() {
            let label = format!("[group_commit] idemkv {} C={threads}", idem.mode.name());
            eprintln!("{}", idem.report(&label));
        }
        if db.is_some() {
            eprintln!(
                "[group_commit] redb_txn_per_op C={threads}:\n    {}",
                naive_run.summary()
            );
        }
        interleaved_throughput(threads, &idems, db.as_ref().map(|(db, _)| db));
        let immediate_ran = idems[0].is_some();
        for idem in idems.iter().flatten() {
            idem.close();
        }
        drop(idems);
        // Only when the bench was selected (a filter may skip it).
        if threads == 1 && immediate_ran && db.is_some() {
            interleaved_single_claimer(&inflight, &done);
        }
    }
}

/// Every contender that ran (idemkv in each mode, the naive baseline) in alternating blocks,
/// so that all see the same disk and CPU conditions (this machine is shared); prints pairs/s
/// per round and each round's ratio to the baseline.
fn interleaved_throughput(threads: usize, idems: &[Option<Idem>], db: Option<&Database>) {
    let (inflight, done) = naive_records();
    let nothing = || {};
    let mut names: Vec<&str> = Vec::new();
    let mut blocks: Vec<Box<dyn Fn() -> f64 + '_>> = Vec::new();
    for idem in idems.iter().flatten() {
        names.push(idem.mode.name());
        blocks.push(Box::new(move || {
            let op = |k: &[u8]| idem.pair(k);
            let finish = || idem.finish();
            run_threads_for(threads, BLOCK, &op, &finish)
        }));
    }
    let base = db.map(|db| {
        names.push("redb_txn_per_op");
        let (inflight, done) = (&inflight, &done);
        blocks.push(Box::new(move || {
            let op = |k: &[u8]| naive_pair(db, inflight, done, k);
            run_threads_for(threads, BLOCK, &op, &nothing)
        }));
        names.len() - 1
    });
    if blocks.len() < 2 {
        return;
    }
    let rounds: Vec<Vec<f64>> = (0..ROUNDS)
        .map(|_| blocks.iter().map(|block| block()).collect())
        .collect();
    eprintln!(
        "[group_commit] interleaved C={threads}, pairs/s in alternating {BLOCK:?} blocks \
         (ratio to redb_txn_per_op):{}",
        show_rounds(&names, &rounds, base)
    );
}

/// Async tasks on a 2-worker runtime, async API, each mode on a fresh file: 64 tasks (the
/// async point next to `claimers_64`, one outstanding call per task) and 10 000.
fn async_tasks(c: &mut Criterion) {
    let rt = runtime();
    for tasks in ASYNC_TASKS {
        let mut group = c.benchmark_group(format!("async_{tasks}_tasks"));
        configure(&mut group);
        group.throughput(Throughput::Elements(tasks as u64));
        for mode in Mode::ALL {
            let mut idem: Option<Arc<Idem>> = None;
            group.bench_function(mode.name(), |b| {
                let idem = idem.get_or_insert_with(|| Arc::new(Idem::open(mode)));
                b.iter_custom(|per| run_tasks(&rt, tasks, per, idem));
            });
            if let Some(idem) = idem {
                let label = format!("[group_commit] idemkv async {} {tasks} tasks", mode.name());
                eprintln!("{}", idem.report(&label));
                idem.close();
            }
        }
        group.finish();
    }
}

/// Pairs alternated in one loop for the interleaved passes: the disk is shared, and its
/// latency drifts; alternating puts both contenders under the same conditions.
const INTERLEAVED: usize = 400;

/// One thread alternating an idemkv `Immediate` pair and a naive redb pair, so their p50s
/// are compared under the same disk conditions (printed to stderr).
fn interleaved_single_claimer(inflight: &[u8], done: &[u8]) {
    let idem = Idem::open(Mode::Immediate);
    let (db, _db_dir) = open_redb();
    let (mut ic, mut ie, mut nc, mut ne) = Default::default();
    for i in 0..INTERLEAVED as u64 {
        let k = key(u64::MAX / 2 + i);
        let (a, b) = idem.pair(&k);
        Latencies::push(&mut ic, a);
        Latencies::push(&mut ie, b);
        let (a, b) = naive_pair(&db, inflight, done, &k);
        Latencies::push(&mut nc, a);
        Latencies::push(&mut ne, b);
    }
    idem.close();
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
    config = config();
    targets = claimers, async_tasks, redb_commit_1_insert
}
criterion_main!(benches);
