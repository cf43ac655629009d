//! Contention: claim throughput with 1, 2, 4, 8 and 64 threads, on distinct keys and on a
//! small hot set of keys. `Durability::None`, so the index and its stripe locks are what is
//! measured, not the disk.
//!
//! - `distinct_keys/T`: T threads claim and complete fresh keys on one engine that keeps
//!   every key (it grows by millions over the run, so its tables grow and rehash as they go).
//! - `hot_keys/T`: T threads claim eight keys; after their first completion every claim is a
//!   replay.
//! - `claim_complete_none/64`: the memory-only goal's figure. 64 threads claim and complete
//!   fresh 32-byte keys (no allocation to make one) on a new engine per sample (opened
//!   untimed), every sample the same size (about 0.8 s of work), so every sample starts from
//!   the same state; stderr gets the median claim+complete/s over the samples and the
//!   process CPU time per pair (on a shared machine the rate drops with other load; the CPU
//!   per pair much less).
//!
//! `cargo bench --bench contention`

mod common;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use idemkv::{Claim, ClaimOptions, Durability, Engine};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const THREADS: [usize; 5] = [1, 2, 4, 8, 64];
const HOT_KEYS: u64 = 8;
/// Threads of the memory-only goal's figure.
const GOAL_THREADS: usize = 64;

fn engine() -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .expect("open")
}

/// Runs `ops` operations spread over `threads` threads started together; returns the time
/// from the start signal to the last thread's end.
fn spread(threads: usize, ops: u64, op: Arc<dyn Fn(usize, u64) + Send + Sync>) -> Duration {
    let per = ops.div_ceil(threads as u64);
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (start, op) = (start.clone(), op.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..per {
                    op(t, i);
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    for h in handles {
        h.join().expect("bench thread");
    }
    t0.elapsed()
}

fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("contention");
    group.measurement_time(Duration::from_secs(4));
    group.sample_size(20);
    let round = Arc::new(AtomicU64::new(0));
    for &threads in &THREADS {
        group.throughput(Throughput::Elements(1));
        // Distinct keys: every claim acquires a fresh key and completes it.
        group.bench_with_input(
            BenchmarkId::new("distinct_keys", threads),
            &threads,
            |b, &t| {
                let engine = engine();
                b.iter_custom(|iters| {
                    let r = round.fetch_add(1, Ordering::Relaxed);
                    let engine = engine.clone();
                    spread(
                        t,
                        iters,
                        Arc::new(move |thread, i| {
                            let key = format!("{r}-{thread}-{i}");
                            match engine.claim(key.as_bytes(), &ClaimOptions::default()) {
                                Ok(Claim::Acquired(lease)) => {
                                    lease.complete(b"ok").expect("complete")
                                }
                                other => panic!("fresh key answered {other:?}"),
                            }
                        }),
                    )
                })
            },
        );
        // A hot set: all threads claim the same eight keys; after the first completion of
        // each, every claim is a replay served under the same eight stripe locks.
        group.bench_with_input(BenchmarkId::new("hot_keys", threads), &threads, |b, &t| {
            let engine = engine();
            b.iter_custom(|iters| {
                let engine = engine.clone();
                spread(
                    t,
                    iters,
                    Arc::new(move |thread, i| {
                        let key = ((thread as u64 + i) % HOT_KEYS).to_le_bytes();
                        match engine.claim(&key, &ClaimOptions::default()) {
                            Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
                            Ok(Claim::Completed(_) | Claim::InProgress(_)) => {}
                            Err(e) => panic!("claim: {e}"),
                            Ok(Claim::Forgotten(forgotten)) => {
                                panic!("unexpected Forgotten without markers: {forgotten:?}")
                            }
                        }
                    }),
                )
            })
        });
    }
    group.finish();
}

/// `claim_complete_none/64`: see the module docs.
fn claim_complete_none(c: &mut Criterion) {
    const SAMPLES: usize = 10;
    let mut group = c.benchmark_group("claim_complete_none");
    group.sample_size(SAMPLES);
    group.sampling_mode(SamplingMode::Flat);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Elements(1));
    // Per sample: claim+complete/s (wall), and process CPU ns per pair.
    let rates = Arc::new(std::sync::Mutex::new(Vec::<(f64, f64)>::new()));
    let seen = rates.clone();
    group.bench_function(BenchmarkId::from_parameter(GOAL_THREADS), |b| {
        b.iter_custom(|iters| {
            let engine = engine();
            let per_thread = iters.div_ceil(GOAL_THREADS as u64);
            let e = engine.clone();
            let cpu0 = common::process_cpu_ns();
            let took = spread(
                GOAL_THREADS,
                iters,
                Arc::new(move |thread, i| {
                    let k = common::key(thread as u64 * per_thread + i);
                    match e.claim(&k, &ClaimOptions::default()) {
                        Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
                        other => panic!("fresh key answered {other:?}"),
                    }
                }),
            );
            let pairs = (per_thread * GOAL_THREADS as u64) as f64;
            let cpu = match (cpu0, common::process_cpu_ns()) {
                (Some(a), Some(b)) => (b - a) as f64 / pairs,
                _ => f64::NAN,
            };
            seen.lock()
                .expect("rates")
                .push((pairs / took.as_secs_f64(), cpu));
            drop(engine);
            took
        })
    });
    group.finish();
    // The last calls are the measured samples; the ones before them were the warm-up.
    let all = rates.lock().expect("rates").clone();
    let measured = &all[all.len().saturating_sub(SAMPLES)..];
    let mut rates: Vec<f64> = measured.iter().map(|m| m.0).collect();
    let mut cpu: Vec<f64> = measured.iter().map(|m| m.1).collect();
    if !rates.is_empty() {
        rates.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        eprintln!(
            "[contention] Durability::None, {GOAL_THREADS} threads, fresh keys: median {:.0} \
             claim+complete/s over {} samples (min {:.0}, max {:.0}); process CPU per pair: \
             median {:.0} ns (min {:.0})",
            rates[rates.len() / 2],
            rates.len(),
            rates[0],
            rates[rates.len() - 1],
            cpu[cpu.len() / 2],
            cpu[0],
        );
    }
}

criterion_group!(benches, contention, claim_complete_none);
criterion_main!(benches);
