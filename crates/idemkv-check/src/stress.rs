//! The real-thread stress test: many threads, few keys, real parking_lot and crossbeam (and
//! the real writer thread under `Buffered` and `Immediate`), no scheduler. Each round gives
//! every thread a random script (the `concurrent_claims` step types) on fresh keys, starts
//! them together at a barrier, and the recorded history of every batch of rounds is checked
//! by the same checker as the shuttle runs.
//!
//! The mock clock does not move here (the per-key histories would have to include every
//! clock step of the whole run); zero leases give takeovers and stale tokens instead.

use crate::concurrent::{self, run_script, Scenario};
use crate::history::{Recorder, Summary};
use crate::Bug;
use arbitrary::Unstructured;
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::{Durability, MockClock};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct StressConfig {
    /// Durability mode (`Buffered`/`Immediate` run on a simulated in-memory disk).
    pub mode: Durability,
    /// Threads.
    pub threads: usize,
    /// Seed of the scripts (the interleaving is the machine's).
    pub seed: u64,
    /// Stop after this long...
    pub duration: Duration,
    /// ...or after this many rounds.
    pub rounds_max: u64,
    /// Rounds per checked batch.
    pub batch: u64,
    /// Sabotage to switch on.
    pub bug: Bug,
}

impl Default for StressConfig {
    fn default() -> Self {
        StressConfig {
            mode: Durability::None,
            threads: 8,
            seed: 1,
            duration: Duration::from_secs(2),
            rounds_max: u64::MAX,
            batch: 64,
            bug: Bug::None,
        }
    }
}

/// What a stress run did.
#[derive(Debug, Clone, Default)]
pub struct StressReport {
    /// Rounds run.
    pub rounds: u64,
    /// Totals of the checks.
    pub checked: Summary,
    /// The first violation found, with the round it was found in and the time it took.
    pub violation: Option<(u64, Duration, String)>,
}

/// Runs the stress test; stops at the first violation.
pub fn run(cfg: &StressConfig) -> StressReport {
    let start = Instant::now();
    let clock = MockClock::new();
    let mut b = concurrent::builder(cfg.mode, &clock);
    if cfg.mode != Durability::None {
        b = b.path("stress.redb").backend(FaultyStorage::memory());
    }
    let engine = match b.open() {
        Ok(e) => e,
        Err(e) => {
            return StressReport {
                violation: Some((0, start.elapsed(), format!("open failed: {e}"))),
                ..StressReport::default()
            }
        }
    };
    crate::sabotage(&engine, cfg.bug);
    let init = concurrent::initial(&clock);
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let mut report = StressReport::default();
    let mut max_before = 0u64;
    while report.rounds < cfg.rounds_max && start.elapsed() < cfg.duration {
        let batch = cfg.batch.min(cfg.rounds_max - report.rounds);
        let first = report.rounds;
        // Scripts for every (round, thread) of the batch, from the seed.
        let scenarios: Vec<Scenario> = (0..batch)
            .map(|_| {
                let bytes = crate::bytes(&mut rng, 256);
                let mut u = Unstructured::new(&bytes);
                let mut s = Scenario::from_bytes(&mut u).unwrap_or(Scenario { threads: vec![] });
                s.threads
                    .resize(cfg.threads, concurrent::Script { steps: vec![] });
                for t in &mut s.threads {
                    if t.steps.is_empty() {
                        let bytes = crate::bytes(&mut rng, 64);
                        let mut u = Unstructured::new(&bytes);
                        if let Ok(script) = u.arbitrary::<concurrent::Script>() {
                            *t = script;
                            t.steps.truncate(concurrent::STEPS_MAX);
                        }
                    }
                }
                s
            })
            .collect();
        let rec = Recorder::new();
        let barrier = Barrier::new(cfg.threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..cfg.threads)
                .map(|t| {
                    let (engine, clock, rec, barrier, scenarios) =
                        (&engine, &clock, &rec, &barrier, &scenarios);
                    scope.spawn(move || {
                        for (r, s) in scenarios.iter().enumerate() {
                            barrier.wait();
                            let prefix = format!("r{}-", first + r as u64);
                            run_script(engine, clock, rec, t, &s.threads[t], &prefix, false);
                        }
                    })
                })
                .collect();
            for h in handles {
                if h.join().is_err() {
                    panic!("a stress thread panicked");
                }
            }
        });
        report.rounds += batch;
        let events = rec.events();
        // Token order across batches: every token of this batch is above the last one's.
        let tokens = events.iter().filter_map(|e| match e.ret {
            crate::spec::KeyRet::Acquired { token, .. } => Some(token),
            _ => None,
        });
        if let Some(min) = tokens.clone().min() {
            if min <= max_before {
                report.violation = Some((
                    report.rounds,
                    start.elapsed(),
                    format!("token {min} issued after token {max_before} of an earlier batch"),
                ));
                break;
            }
        }
        max_before = max_before.max(tokens.max().unwrap_or(0));
        match concurrent::check_events(cfg.mode, &init, &events) {
            Ok(s) => {
                report.checked.keys += s.keys;
                report.checked.ops += s.ops;
                report.checked.acquisitions += s.acquisitions;
            }
            Err(why) => {
                report.violation = Some((report.rounds, start.elapsed(), why));
                break;
            }
        }
    }
    let _ = engine.close();
    report
}
