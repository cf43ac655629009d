//! `run` with K waiting losers per key: the hand-off latency from the winner's call to
//! `complete` to the return of the last waiter, which must receive the winner's bytes.
//!
//! `cargo bench --bench handoff`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use idemkv::{Claim, ClaimOptions, Durability, Engine};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const LOSERS: [usize; 3] = [1, 8, 32];

fn engine(durability: Durability, dir: &std::path::Path) -> Engine {
    let builder = Engine::builder()
        .durability(durability)
        .tuning(idemkv::Tuning::default().sweep_interval(None));
    // A memory-only engine keeps no file and refuses a path.
    let builder = match durability {
        Durability::None => builder,
        _ => builder.path(dir.join("handoff.redb")),
    };
    builder.open().expect("open")
}

/// One hand-off: the winner holds `key`, `k` callers wait in `run`, the winner completes.
fn handoff(engine: &Engine, key: &[u8], k: usize) -> Duration {
    let opts = ClaimOptions::default().wait(Duration::from_secs(30));
    let Ok(Claim::Acquired(lease)) = engine.claim(key, &opts) else {
        panic!("the winner must acquire a fresh key")
    };
    let waits_before = engine.stats().waits;
    let ready = Arc::new(Barrier::new(k + 1));
    let losers: Vec<_> = (0..k)
        .map(|_| {
            let (engine, key, opts, ready) =
                (engine.clone(), key.to_vec(), opts.clone(), ready.clone());
            std::thread::spawn(move || {
                ready.wait();
                let out = engine
                    .run(&key, &opts, |_| {
                        Ok::<_, ()>(b"a loser must never run".to_vec())
                    })
                    .expect("run");
                assert!(out.replayed() && out.response() == b"the winner's bytes");
                Instant::now()
            })
        })
        .collect();
    ready.wait();
    // Every loser is asleep in its wait before the winner completes.
    while engine.stats().waits < waits_before + k as u64 {
        std::thread::yield_now();
    }
    let t0 = Instant::now();
    lease.complete(b"the winner's bytes").expect("complete");
    let last = losers
        .into_iter()
        .map(|h| h.join().expect("loser"))
        .max()
        .unwrap_or(t0);
    last.duration_since(t0)
}

fn handoffs(c: &mut Criterion) {
    let mut group = c.benchmark_group("handoff");
    group.measurement_time(Duration::from_secs(4));
    group.sample_size(20);
    for (name, durability) in [
        ("none", Durability::None),
        ("buffered", Durability::buffered()),
        ("immediate", Durability::Immediate),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = engine(durability, dir.path());
        let mut round = 0u64;
        for &k in &LOSERS {
            group.bench_with_input(BenchmarkId::new(name, k), &k, |b, &k| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            round += 1;
                            handoff(&engine, &round.to_le_bytes(), k)
                        })
                        .sum()
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, handoffs);
criterion_main!(benches);
