//! Teeth: the checkers must catch a broken engine. Each deliberate bug
//! (`idemkv::testkit::Bug`) is switched on and the stress test (real threads) must report a
//! violation within seconds; with `Bug::None` it must not. The same proof under shuttle
//! (`concurrent_claims`) runs with `--features shuttle`:
//! `cargo test --features shuttle --test shuttle_model --test teeth`.

use idemkv::testkit::stress::{self, StressConfig};
use idemkv::testkit::Bug;
use idemkv::Durability;
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

#[cfg(feature = "shuttle")]
mod under_shuttle {
    use super::*;
    use arbitrary::Unstructured;
    use idemkv::testkit::concurrent::{check_under_shuttle, Scenario};
    use idemkv::testkit::stress::SplitMix;
    use std::time::Instant;

    /// Runs random (scenario, schedule) inputs, as the fuzzer would, until one fails.
    fn search(bug: Bug, budget: Duration) -> Option<(u64, usize, String)> {
        let start = Instant::now();
        let mut tried = 0;
        for seed in 0u64.. {
            if start.elapsed() > budget {
                return None;
            }
            let bytes = SplitMix(seed).bytes(512);
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
