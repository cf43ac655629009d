//! `Buffered` admission measures the writer's rate over its whole cycle: the commit and the
//! work after it (publishing, settling, freeing the batch), on the engine's clock. Needs
//! `--cfg idemkv_sabotage` for the hook that holds the writer after its commit.
#![cfg(idemkv_sabotage)]

use idemkv::*;
use std::time::Duration;

/// Fewer than the floor, more than the smallest batch the rate is measured on.
const CLAIMS: usize = 600;

#[test]
fn the_writers_rate_counts_the_work_after_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let engine = Engine::builder()
        .path(dir.path().join("a.redb"))
        .clock(clock.clone())
        .durability(Durability::Buffered {
            max_delay: Duration::from_secs(1),
        })
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .unwrap();
    let floor = engine.stats().queue_claims_max;

    // One batch of claims ended by a flush's barrier; the writer is held after its commit
    // while the test moves the engine's clock by 100 ms.
    let held = engine.hold_after_commits();
    let claimer = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let leases: Vec<Lease> = (0..CLAIMS)
                .map(
                    |i| match engine.claim(format!("k{i}").as_bytes(), &ClaimOptions::default()) {
                        Ok(Claim::Acquired(lease)) => lease,
                        other => panic!("claim {i}: {other:?}"),
                    },
                )
                .collect();
            engine.flush().unwrap();
            leases
        })
    };
    assert!(held.wait_until_held(Duration::from_secs(30)));
    clock.advance(Duration::from_millis(100));
    drop(held);
    let leases = claimer.join().unwrap();
    assert_eq!(leases.len(), CLAIMS);
    // The writer measures its cycle after it has woken the flush (the work after the commit
    // counts), so the claimer can return first: a second flush is taken only once the
    // writer has finished that cycle, measurement included.
    engine.flush().unwrap();

    // 600 operations in 100 ms: 6,000 a second, and admission holds new claims to three
    // quarters of one `max_delay` of that. A rate measured over the commit alone would not
    // see the held time, and the limit would stay at the floor (mock time did not move
    // during the commit) or rise to the cap (real time).
    let limit = engine.stats().queue_claims_max;
    assert_eq!(limit, 4_500, "the floor was {floor}");
    assert!(limit > floor, "the limit moved off its floor");
    drop(leases);
    engine.close().unwrap();
}
