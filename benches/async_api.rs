//! The async API against the blocking one: claim+complete throughput of 10 000 concurrent
//! tasks on a tokio runtime with 2 worker threads (`claim_async` + `complete_async`) next
//! to 64 OS threads doing the same with `claim` + `complete`, in the same group.
//!
//! One group per mode (`async_vs_sync_immediate`, `async_vs_sync_buffered_10ms`), each
//! contender on its own fresh file, every pair on a new key:
//!
//! - `async_10000_tasks`: one iteration is one pair per task (10 000 pairs); the tasks are
//!   spawned and parked at a start gate before the clock starts.
//! - `sync_64_threads`: one iteration is one pair per thread (64 pairs), from a barrier.
//!
//! Throughput is in pairs per second. Under `Buffered` the last task or thread of each
//! timed sample flushes before the clock stops (sustained durable throughput), and a claim
//! refused with `Overloaded` flushes and retries (counted as `backoffs`).
//!
//! The machine may be shared, so after each group the two contenders also run in
//! alternating 0.7 s blocks, with the ratio async ÷ sync per round on stderr: the figure to
//! read on a noisy machine. The writer's batch formation and per-operation latency
//! percentiles of each contender follow.
//!
//! Run: `cargo bench --bench async_api` (about a minute on a quiet 2-core machine).

mod common;
#[path = "common/throughput.rs"]
mod throughput;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use std::sync::Arc;
use std::time::Duration;
use throughput::{
    run_tasks, run_tasks_for, run_threads, run_threads_for, runtime, show_rounds, Idem, Mode,
    BLOCK, ROUNDS, TASKS,
};

/// OS threads of the blocking contender.
const THREADS: usize = 64;

fn async_vs_sync(c: &mut Criterion) {
    let rt = runtime();
    let modes = [Mode::Buffered, Mode::Immediate];
    let async_name = format!("async_{TASKS}_tasks");
    let sync_name = format!("sync_{THREADS}_threads");
    for mode in modes {
        let mut group = c.benchmark_group(format!("async_vs_sync_{}", mode.name()));
        // Each sample runs the same number of pairs per task or thread.
        group.sampling_mode(SamplingMode::Flat);

        let mut tasks: Option<Arc<Idem>> = None;
        group.throughput(Throughput::Elements(TASKS as u64));
        group.bench_function(&async_name, |b| {
            let idem = tasks.get_or_insert_with(|| Arc::new(Idem::open(mode)));
            b.iter_custom(|per| run_tasks(&rt, TASKS, per, idem));
        });

        let mut threads: Option<Idem> = None;
        group.throughput(Throughput::Elements(THREADS as u64));
        group.bench_function(&sync_name, |b| {
            let idem = threads.get_or_insert_with(|| Idem::open(mode));
            let op = |k: &[u8]| idem.pair(k);
            let finish = || idem.finish();
            b.iter_custom(|per| run_threads(THREADS, per, &idem.run, &op, &finish));
        });
        group.finish();

        if let (Some(tasks), Some(threads)) = (&tasks, &threads) {
            let rounds: Vec<Vec<f64>> = (0..ROUNDS)
                .map(|_| {
                    let a = run_tasks_for(&rt, TASKS, BLOCK, tasks);
                    let op = |k: &[u8]| threads.pair(k);
                    let finish = || threads.finish();
                    let s = run_threads_for(THREADS, BLOCK, &op, &finish);
                    vec![a, s]
                })
                .collect();
            eprintln!(
                "[async_api] {}: pairs/s in alternating {BLOCK:?} blocks (ratio to the \
                 blocking API):{}",
                mode.name(),
                show_rounds(&[&async_name, &sync_name], &rounds, Some(1))
            );
        }
        let name = mode.name();
        if let Some(idem) = tasks {
            eprintln!(
                "{}",
                idem.report(&format!("[async_api] {name} {async_name}"))
            );
            idem.close();
        }
        if let Some(idem) = threads {
            eprintln!(
                "{}",
                idem.report(&format!("[async_api] {name} {sync_name}"))
            );
            idem.close();
        }
    }
}

criterion_group! {
    name = benches;
    // Set on the `Criterion`, not the groups, so the command line's timing options apply.
    config = common::criterion()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    targets = async_vs_sync
}
criterion_main!(benches);
