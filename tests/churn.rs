//! The file does not grow without bound under steady churn: with a constant stream of new
//! keys, each completed and forgotten one retention period later, the space of the deleted
//! records is reused, so the file stops growing once a retention period's worth of records
//! is live. Time is a mock clock: each period (half a retention) the test completes a batch
//! of new keys, moves the clock on and sweeps what has expired.

use idemkv::{Claim, ClaimOptions, Durability, Engine, MockClock};
use std::time::Duration;

const RETENTION: Duration = Duration::from_secs(60);
const KEYS_PER_PERIOD: usize = 400;
const PERIODS: usize = 20;
const RESPONSE: [u8; 64] = [7; 64];

#[test]
fn steady_churn_over_ten_retention_periods_keeps_the_file_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("churn.redb");
    let clock = MockClock::new();
    let engine = Engine::builder()
        .path(&path)
        .durability(Durability::Immediate)
        .clock(clock.clone())
        .retention(RETENTION)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .unwrap();
    let opts = ClaimOptions::default();
    let mut sizes = Vec::new();
    for period in 0..PERIODS {
        std::thread::scope(|s| {
            for t in 0..4 {
                let (engine, opts) = (&engine, &opts);
                s.spawn(move || {
                    for i in (t..KEYS_PER_PERIOD).step_by(4) {
                        let key = format!("p{period}-k{i}");
                        match engine.claim(key.as_bytes(), opts).unwrap() {
                            Claim::Acquired(lease) => lease.complete(&RESPONSE).unwrap(),
                            other => panic!("{key}: {other:?}"),
                        }
                    }
                });
            }
        });
        // A period is half a retention: the keys of two periods ago end their retention
        // now, and one period's keys stay live.
        clock.advance(RETENTION / 2);
        engine.admin().sweep_now().unwrap();
        engine.flush().unwrap();
        sizes.push(std::fs::metadata(&path).unwrap().len());
    }
    let stats = engine.stats();
    assert_eq!(
        stats.completed, KEYS_PER_PERIOD as u64,
        "one period's keys are live"
    );
    // After two retentions the file holds its working set; from then on it may only grow
    // by redb's allocation slack, not by another period's records each period. redb grows
    // a file by doubling it, so one growth can double it (pages a commit freed are reused
    // only by a later one, and when the commits fall depends on the load); sixteen more
    // periods' records kept would be four times the working set.
    let settled = sizes[3];
    let last = sizes[PERIODS - 1];
    eprintln!("file sizes after each period (bytes): {sizes:?}");
    assert!(
        last <= 2 * settled,
        "the file grew from {settled} bytes after 4 periods to {last} after {PERIODS}: {sizes:?}"
    );
}
