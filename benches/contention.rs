//! Contention: claim throughput with 1, 2, 4, 8 and 64 threads, on distinct keys and on a
//! small hot set of keys. `Durability::None`, so the index and its stripe locks are what is
//! measured, not the disk.
//!
//! `cargo bench --bench contention`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idemkv::{Claim, ClaimOptions, Durability, Engine};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const THREADS: [usize; 5] = [1, 2, 4, 8, 64];
const HOT_KEYS: u64 = 8;

fn engine() -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .sweep_interval(None)
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
                        }
                    }),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, contention);
criterion_main!(benches);
