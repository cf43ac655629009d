//! Teeth: the checkers must catch a broken engine. Each deliberate bug
//! (`idemkv_check::Bug`) is switched on and the stress test (real threads) must report a
//! violation within seconds; with `Bug::None` it must not. The model of `ops_model` and the
//! users' duplicate-delivery kit must catch one too. Built only with
//! `--cfg idemkv_sabotage`; the same proof under shuttle (`concurrent_claims`) also needs
//! `--cfg shuttle` (docs/testing.md):
//! `RUSTFLAGS="--cfg shuttle --cfg idemkv_sabotage" CARGO_TARGET_DIR=target/shuttle
//! cargo test -p idemkv-check --test shuttle_model --test teeth`.
#![cfg(idemkv_sabotage)]

use idemkv::testing::duplicates;
use idemkv::{Durability, Engine};
use idemkv_check::ops::{self, Op};
use idemkv_check::stress::{self, StressConfig};
use idemkv_check::{sabotage, Bug};
use std::time::Duration;

/// How long the stress test may take to find a bug before the test fails.
const BUDGET: Duration = Duration::from_secs(10);

fn stress(bug: Bug, mode: Durability) -> stress::StressReport {
    stress::run(&StressConfig {
        mode,
        bug,
        threads: 8,
        seed: 42,
        duration: BUDGET,
        batch: 16,
        ..StressConfig::default()
    })
}

fn caught(bug: Bug, mode: Durability) {
    let report = stress(bug, mode);
    match &report.violation {
        Some((round, after, why)) => {
            let first = why.lines().take(12).collect::<Vec<_>>().join("\n");
            println!("{bug:?} ({mode:?}) caught by the stress test in round {round}, after {after:?}:\n{first}");
        }
        None => panic!(
            "{bug:?} ({mode:?}) was NOT caught in {BUDGET:?} ({} rounds): the stress test has lost its teeth",
            report.rounds
        ),
    }
}

#[test]
fn stress_catches_check_then_act() {
    caught(Bug::CheckThenAct, Durability::None);
}

#[test]
fn stress_catches_missing_fencing() {
    caught(Bug::NoFencing, Durability::None);
}

#[test]
fn stress_catches_check_then_act_with_the_writer() {
    caught(Bug::CheckThenAct, Durability::Immediate);
}

#[test]
fn stress_passes_without_a_bug() {
    let report = stress::run(&StressConfig {
        bug: Bug::None,
        duration: Duration::from_secs(1),
        ..StressConfig::default()
    });
    assert!(report.violation.is_none(), "{:?}", report.violation);
}

/// With the fencing comparison switched off, a sequential stale completion is caught by
/// the model.
#[test]
fn ops_model_catches_a_missing_fence() {
    use idemkv_check::ops::{BytesSel, FpSel, KeySel, LeaseSel, TokenSel};
    let ops = [
        Op::Claim {
            key: KeySel(0),
            fingerprint: FpSel(0),
            lease: LeaseSel(1),
            wait: false,
        },
        Op::Claim {
            key: KeySel(0),
            fingerprint: FpSel(0),
            lease: LeaseSel(0),
            wait: false,
        },
        Op::Complete {
            key: KeySel(0),
            token: TokenSel(1),
            response: BytesSel(2),
        },
    ];
    for mode in idemkv_check::modes() {
        let mut h = ops::Harness::open(mode).expect("open");
        sabotage(&h.engine, Bug::NoFencing);
        let failed = ops.iter().map(|op| h.apply(op)).find_map(Result::err);
        assert!(
            failed.is_some(),
            "{mode:?}: the stale completion went unnoticed"
        );
        let _ = h.engine.close();
    }
}

/// The users' kit shows a check-then-act engine running a side effect twice.
#[test]
fn the_kit_catches_check_then_act() {
    let engine = Engine::builder()
        .durability(Durability::None)
        .open()
        .expect("open");
    sabotage(&engine, Bug::CheckThenAct);
    let mut worst = 0;
    for i in 0..200 {
        let key = format!("cta-{i}");
        let report = duplicates(&engine, key.as_bytes()).copies(4).run(|_| {
            std::thread::sleep(Duration::from_millis(1));
            Ok::<_, String>(b"x".to_vec())
        });
        worst = worst.max(report.side_effects());
        if worst > 1 {
            break;
        }
    }
    assert!(worst > 1, "a check-then-act engine ran a side effect twice");
}

// ---------------------------------------------------------------------------------------
// Durability: each sabotage of the write path is caught by the durability checks, within a
// fixed, deterministic budget; the same checks pass on the engine as shipped.
// ---------------------------------------------------------------------------------------

mod durability {
    use super::*;
    use arbtest::arbitrary::Unstructured;
    use idemkv_check::faults::{self, FaultCase};
    use std::time::Instant;

    /// Seeded `storage_faults` cases (seeds 0..N) a bug must be caught within. The slowest
    /// to show is a kept old record: it needs a takeover whose new record is then removed.
    const CASES: u64 = 600;

    fn buffered() -> Durability {
        Durability::Buffered {
            max_delay: Duration::from_millis(1),
        }
    }

    /// The case of seed `seed`: a full workload drawn from seeded bytes.
    fn case(seed: u64) -> Option<FaultCase> {
        let bytes = idemkv_check::bytes(&mut fastrand::Rng::with_seed(seed), 1024);
        faults::dense_case(&mut Unstructured::new(&bytes)).ok()
    }

    /// Runs the cases of seeds `0..CASES` with `bug`; the first that fails, with how many ran.
    fn first_failing_case(bug: Bug) -> Option<(u64, usize, String)> {
        let mut ran = 0;
        for seed in 0..CASES {
            let Some(case) = case(seed) else { continue };
            ran += 1;
            if let Err(why) = faults::run_case_with(&case, bug) {
                return Some((seed, ran, why));
            }
        }
        None
    }

    fn first_lines(why: &str) -> String {
        why.lines().take(6).collect::<Vec<_>>().join("\n")
    }

    fn caught_by_cases(bug: Bug) {
        let start = Instant::now();
        match first_failing_case(bug) {
            Some((seed, ran, why)) => println!(
                "{bug:?} caught by storage_faults at case seed {seed} ({ran} cases, {:?}):\n{}",
                start.elapsed(),
                first_lines(&why)
            ),
            None => panic!("{bug:?} was NOT caught by {CASES} storage_faults cases"),
        }
    }

    /// The sweep under `Immediate`, by default with the commit log.
    fn caught_by_sweep(bug: Bug) {
        caught_by_sweep_in(faults::Mode::from(Durability::Immediate), bug);
    }

    fn caught_by_sweep_in(mode: faults::Mode, bug: Bug) {
        let start = Instant::now();
        match faults::exhaustive_with(mode, &faults::small_workload(), bug) {
            Err(why) => println!(
                "{bug:?} caught by the exhaustive sweep in {:?}:\n{}",
                start.elapsed(),
                first_lines(&why)
            ),
            Ok(cov) => {
                panic!("{bug:?} was NOT caught by the exhaustive sweep in {mode:?} ({cov:?})")
            }
        }
    }

    #[test]
    fn storage_faults_cases_pass_without_a_bug() {
        if let Some((seed, _, why)) = first_failing_case(Bug::None) {
            panic!("case seed {seed}: {why}");
        }
    }

    #[test]
    fn storage_faults_cases_catch_ack_before_commit() {
        caught_by_cases(Bug::AckBeforeCommit);
    }

    #[test]
    fn storage_faults_cases_catch_a_missing_token_mark() {
        caught_by_cases(Bug::SkipTokenHwm);
    }

    #[test]
    fn storage_faults_cases_catch_a_kept_old_record() {
        caught_by_cases(Bug::DropOldRemoval);
    }

    #[test]
    fn exhaustive_sweep_catches_ack_before_commit() {
        caught_by_sweep(Bug::AckBeforeCommit);
    }

    /// The durable path without a log (a custom backend), which the sweep runs too.
    #[test]
    fn exhaustive_sweep_without_a_log_catches_ack_before_commit() {
        caught_by_sweep_in(
            faults::Mode::unlogged(Durability::Immediate),
            Bug::AckBeforeCommit,
        );
    }

    #[test]
    fn exhaustive_sweep_catches_a_missing_token_mark() {
        caught_by_sweep(Bug::SkipTokenHwm);
    }

    #[test]
    fn exhaustive_sweep_catches_a_kept_old_record() {
        caught_by_sweep(Bug::DropOldRemoval);
    }

    /// The held commit's modes: `Buffered` and `Immediate`.
    fn held_modes() -> [Durability; 2] {
        [buffered(), Durability::Immediate]
    }

    #[test]
    fn held_commit_passes_without_a_bug() {
        for mode in held_modes() {
            faults::held_commit(mode, Bug::None).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    fn caught_by_held_commit(bug: Bug) {
        for mode in held_modes() {
            match faults::held_commit(mode, bug) {
                Err(why) => println!("{bug:?} ({mode:?}) caught by held_commit:\n{why}"),
                Ok(()) => panic!("{bug:?} ({mode:?}) was NOT caught by held_commit"),
            }
        }
    }

    #[test]
    fn held_commit_catches_publish_before_commit() {
        caught_by_held_commit(Bug::PublishBeforeCommit);
    }

    #[test]
    fn held_commit_catches_a_missing_token_mark() {
        caught_by_held_commit(Bug::SkipTokenHwm);
    }

    /// A stored response damaged in the file while the engine runs is refused, never
    /// replayed, by `claim`, `claim_or_wait`, `run` and `get`.
    #[test]
    fn damaged_response_is_refused_on_every_replay() {
        for mode in [buffered(), Durability::Immediate] {
            faults::damaged_response(mode, Bug::None).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn damaged_response_catches_a_replay_without_checksum() {
        for mode in [buffered(), Durability::Immediate] {
            match faults::damaged_response(mode, Bug::SkipReplayChecksum) {
                Err(why) => println!("SkipReplayChecksum ({mode:?}) caught:\n{why}"),
                Ok(()) => panic!("{mode:?}: a replay without its checksum was NOT caught"),
            }
        }
    }
}

#[cfg(shuttle)]
mod under_shuttle {
    use super::*;
    use arbitrary::Unstructured;
    use idemkv_check::concurrent::{check_under_shuttle, Scenario};
    use std::time::Instant;

    /// Runs random (scenario, schedule) inputs, as the fuzzer would, until one fails.
    fn search(bug: Bug, budget: Duration) -> Option<(u64, usize, String)> {
        let start = Instant::now();
        let mut tried = 0;
        for seed in 0u64.. {
            if start.elapsed() > budget {
                return None;
            }
            let bytes = idemkv_check::bytes(&mut fastrand::Rng::with_seed(seed), 512);
            let mut u = Unstructured::new(&bytes);
            let Ok(scenario) = Scenario::from_bytes(&mut u) else {
                continue;
            };
            tried += 1;
            if let Err(why) = check_under_shuttle(&scenario, u.take_rest(), bug) {
                return Some((seed, tried, why));
            }
        }
        None
    }

    fn caught(bug: Bug) {
        let start = Instant::now();
        match search(bug, BUDGET) {
            Some((seed, tried, why)) => {
                let first = why.lines().take(12).collect::<Vec<_>>().join("\n");
                println!(
                    "{bug:?} caught by concurrent_claims (shuttle) at input seed {seed}, after {tried} inputs and {:?}:\n{first}",
                    start.elapsed()
                );
            }
            None => panic!("{bug:?} was NOT caught by concurrent_claims within {BUDGET:?}"),
        }
    }

    #[test]
    fn concurrent_claims_catches_check_then_act() {
        caught(Bug::CheckThenAct);
    }

    #[test]
    fn concurrent_claims_catches_missing_fencing() {
        caught(Bug::NoFencing);
    }

    #[test]
    fn concurrent_claims_passes_without_a_bug() {
        assert!(search(Bug::None, Duration::from_secs(2)).is_none());
    }
}

/// `mark_sent` under `Immediate` returning before its removal is durable: the disk a power
/// loss leaves right after the call returned still holds the message as pending.
#[test]
fn mark_sent_power_loss_catches_an_early_return() {
    idemkv_check::faults::mark_sent_then_power_loss(Bug::None).unwrap_or_else(|e| panic!("{e}"));
    match idemkv_check::faults::mark_sent_then_power_loss(Bug::MarkSentBeforeDurable) {
        Err(why) => println!("MarkSentBeforeDurable caught: {why}"),
        Ok(()) => panic!("MarkSentBeforeDurable was NOT caught"),
    }
}
