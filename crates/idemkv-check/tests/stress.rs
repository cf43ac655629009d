//! Real-thread stress: many threads, few keys, real parking_lot and crossbeam and the real
//! writer thread; every batch's history checked per key for linearizability and globally for
//! token order (see docs/testing.md). Durations are short so `cargo test` stays quick; run
//! longer with `IDEMKV_STRESS_SECS=60 cargo test --release --test stress`.

use idemkv::Durability;
use idemkv_check::stress::{self, StressConfig};
use std::time::Duration;

fn secs() -> Duration {
    let s = std::env::var("IDEMKV_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(s)
}

fn run(mode: Durability, seed: u64) {
    let cfg = StressConfig {
        mode,
        seed,
        threads: 8,
        duration: secs(),
        ..StressConfig::default()
    };
    let report = stress::run(&cfg);
    if let Some((round, after, why)) = &report.violation {
        panic!("{mode:?}, seed {seed}: violation in round {round} after {after:?}:\n{why}");
    }
    println!(
        "{mode:?}: {} rounds, {} keys, {} operations, {} acquisitions checked",
        report.rounds, report.checked.keys, report.checked.ops, report.checked.acquisitions
    );
    assert!(
        report.rounds > 0 && report.checked.acquisitions > 0,
        "{report:?}"
    );
}

#[test]
fn stress_none() {
    run(Durability::None, 11);
}

#[test]
fn stress_buffered() {
    run(
        Durability::Buffered {
            max_delay: Duration::from_millis(1),
        },
        12,
    );
}

#[test]
fn stress_immediate() {
    run(Durability::Immediate, 13);
}
