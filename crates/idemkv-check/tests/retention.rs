//! Retention at scale: the sweeper, the key budget, and expiry across restarts. Every test
//! drives a MockClock; none sleeps.

use idemkv::error::Limit;
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::*;
use idemkv_check::fixture;
use std::time::Duration;

const RETENTION: Duration = Duration::from_secs(3600);

fn builder(path: &std::path::Path, clock: &MockClock) -> EngineBuilder {
    // Fills commit in groups; the tests flush before they look.
    fixture::builder(path, clock, Durability::buffered()).retention(RETENTION)
}

fn complete(engine: &Engine, key: &str, response: &[u8]) -> u64 {
    // `Buffered` admits claims by the writer's measured rate: a fill faster than the writer
    // is refused, and waits for it, as any producer should.
    let lease = loop {
        match engine.claim(key.as_bytes(), &ClaimOptions::default()) {
            Ok(Claim::Acquired(lease)) => break lease,
            Err(ClaimError::Overloaded(Limit::WriterQueue)) => engine.flush().unwrap(),
            other => panic!("{key} must be acquired: {other:?}"),
        }
    };
    let token = lease.token();
    lease.complete(response).unwrap();
    token
}

fn replay(engine: &Engine, key: &str) -> Option<Vec<u8>> {
    idemkv_check::backend::stored_response(engine, key)
}

#[test]
fn served_until_the_expiry_instant_and_absent_from_it_in_every_mode() {
    for mode in [
        Durability::None,
        Durability::buffered(),
        Durability::Immediate,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        // A memory-only engine keeps no file and refuses a path.
        let engine = match mode {
            Durability::None => Engine::builder()
                .clock(clock.clone())
                .retention(RETENTION)
                .durability(mode)
                .tuning(idemkv::Tuning::default().sweep_interval(None)),
            _ => builder(&dir.path().join("r.redb"), &clock).durability(mode),
        }
        .open()
        .unwrap();
        let token = complete(&engine, "k", b"v");
        engine.flush().unwrap();
        clock.advance(RETENTION - Duration::from_nanos(1));
        assert_eq!(
            engine.admin().sweep_now().unwrap(),
            0,
            "{mode:?}: nothing is due a tick early"
        );
        assert_eq!(replay(&engine, "k").as_deref(), Some(&b"v"[..]), "{mode:?}");
        clock.advance(Duration::from_nanos(1));
        assert_eq!(
            engine.get(b"k").unwrap(),
            None,
            "{mode:?}: absent at the instant"
        );
        let Claim::Acquired(lease) = engine.claim(b"k", &ClaimOptions::default()).unwrap() else {
            panic!("{mode:?}: an expired key is new again")
        };
        assert!(
            lease.token() > token,
            "{mode:?}: a re-claim gets a larger token"
        );
        lease.complete(b"second").unwrap();
        engine.flush().unwrap();
        assert_eq!(
            replay(&engine, "k").as_deref(),
            Some(&b"second"[..]),
            "{mode:?}"
        );
    }
}

#[test]
fn a_live_lease_survives_any_number_of_sweeps() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let engine = builder(&dir.path().join("r.redb"), &clock).open().unwrap();
    let opts = ClaimOptions::default().lease(Duration::from_secs(1_000_000));
    let Claim::Acquired(lease) = engine.claim(b"lease", &opts).unwrap() else {
        panic!()
    };
    for _ in 0..50 {
        clock.advance(RETENTION);
        engine.admin().sweep_now().unwrap();
        assert!(matches!(
            engine.get(b"lease").unwrap(),
            Some(KeyState::InFlight { .. })
        ));
    }
    lease.complete(b"done").unwrap();
    engine.flush().unwrap();
    assert_eq!(replay(&engine, "lease").as_deref(), Some(&b"done"[..]));
}

#[test]
fn sweeping_reclaims_memory_and_disk_earliest_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let clock = MockClock::new();
    let engine = builder(&path, &clock).open().unwrap();
    for i in 0..300 {
        complete(&engine, &format!("early-{i}"), b"x");
    }
    clock.advance(Duration::from_secs(60));
    for i in 0..300 {
        complete(&engine, &format!("late-{i}"), b"y");
    }
    engine.flush().unwrap();
    let before = engine.stats();
    assert_eq!(before.completed, 600);
    clock.advance(RETENTION - Duration::from_secs(30));
    let stats = engine.stats();
    assert_eq!((stats.completed, stats.expired_unswept), (300, 300));
    assert_eq!(
        engine.admin().sweep_now().unwrap(),
        300,
        "only the early ones are due"
    );
    let stats = engine.stats();
    assert_eq!(
        (stats.completed, stats.expired_unswept, stats.expirations),
        (300, 0, 300)
    );
    assert!(stats.index_bytes < before.index_bytes || stats.index_bytes > 0);
    for i in (0..300).step_by(37) {
        assert_eq!(
            replay(&engine, &format!("late-{i}")).as_deref(),
            Some(&b"y"[..])
        );
    }
    engine.close().unwrap();
    // The sweep's deletions went through the writer: reopening with the wall clock turned
    // back by a day must not bring the swept records back.
    clock.set_wall(clock.wall() - Duration::from_secs(24 * 3600));
    let engine = builder(&path, &clock).open().unwrap();
    assert!(engine
        .admin()
        .records()
        .iter()
        .all(|r| r.key.starts_with(b"late-")));
    assert_eq!(engine.admin().records().len(), 300);
}

#[test]
fn a_crash_in_the_middle_of_a_sweep_neither_resurrects_nor_loses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let clock = MockClock::new();
    let engine = builder(&path, &clock)
        .durability(Durability::buffered())
        .open()
        .unwrap();
    for i in 0..2000 {
        complete(&engine, &format!("old-{i}"), b"old");
    }
    clock.advance(RETENTION / 2);
    for i in 0..500 {
        complete(&engine, &format!("young-{i}"), b"young");
    }
    engine.flush().unwrap();
    clock.advance(RETENTION / 2);
    // Sweep without waiting for the writer, then "crash": the process image is gone, and
    // the file holds whatever part of the sweep's deletions was committed.
    assert_eq!(engine.admin().sweep_now().unwrap(), 2000);
    drop(engine);
    let engine = builder(&path, &clock).open().unwrap();
    for i in (0..2000).step_by(97) {
        assert_eq!(
            replay(&engine, &format!("old-{i}")),
            None,
            "never resurrected"
        );
    }
    for i in 0..500 {
        assert_eq!(
            replay(&engine, &format!("young-{i}")).as_deref(),
            Some(&b"young"[..]),
            "never lost"
        );
    }
}

#[test]
fn the_key_budget_refuses_new_keys_and_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let engine = builder(&dir.path().join("r.redb"), &clock)
        .keys_max(100)
        .open()
        .unwrap();
    for i in 0..99 {
        complete(&engine, &format!("k{i}"), format!("v{i}").as_bytes());
    }
    let Claim::Acquired(held) = engine.claim(b"held", &ClaimOptions::default()).unwrap() else {
        panic!()
    };
    engine.flush().unwrap();
    assert_eq!(
        engine
            .claim(b"one-too-many", &ClaimOptions::default())
            .unwrap_err(),
        ClaimError::Overloaded(Limit::Keys)
    );
    // Every earlier record is intact and the engine still serves.
    for i in 0..99 {
        assert_eq!(
            replay(&engine, &format!("k{i}")),
            Some(format!("v{i}").into_bytes())
        );
    }
    held.complete(b"held-done").unwrap();
    engine.flush().unwrap();
    assert_eq!(replay(&engine, "held").as_deref(), Some(&b"held-done"[..]));
    // Once records expire, room comes back without an explicit sweep.
    clock.advance(RETENTION);
    let Claim::Acquired(lease) = engine
        .claim(b"one-too-many", &ClaimOptions::default())
        .unwrap()
    else {
        panic!("expired records make room")
    };
    lease.complete(b"ok").unwrap();
}

#[test]
fn the_background_sweeper_reclaims_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let engine = builder(&dir.path().join("r.redb"), &clock)
        .tuning(idemkv::Tuning::default().sweep_interval(Some(Duration::from_millis(10))))
        .open()
        .unwrap();
    for i in 0..100 {
        complete(&engine, &format!("k{i}"), b"v");
    }
    clock.advance(RETENTION);
    // The clock's jump nudges the sweeper; wait for it by polling the engine's own counter
    // (bounded), not by sleeping for time to pass in the engine's sense.
    let mut spins = 0;
    while engine.stats().expirations < 100 {
        spins += 1;
        assert!(spins < 2000, "the sweeper never ran");
        std::thread::yield_now();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(engine.stats().completed, 0);
}

/// Opens an engine on `backend` at `clock`'s time, in `Buffered` mode, sweeping on demand.
fn open_on(backend: &FaultyStorage, clock: &MockClock) -> Result<Engine, OpenError> {
    Engine::builder()
        .backend(backend.clone())
        .clock(clock.clone())
        .retention(RETENTION)
        .durability(Durability::buffered())
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
}

/// The state every power-loss run starts from: 300 old keys, 50 young ones, all durable,
/// at the instant the young ones were completed.
fn sweep_base() -> Vec<u8> {
    let backend = FaultyStorage::memory();
    let clock = MockClock::new();
    let engine = open_on(&backend, &clock).unwrap();
    for i in 0..300 {
        complete(&engine, &format!("old-{i}"), b"old");
    }
    clock.advance(RETENTION / 2);
    for i in 0..50 {
        complete(&engine, &format!("young-{i}"), b"young");
    }
    engine.close().unwrap();
    backend.durable_image()
}

/// A clock at the base's instant: the old keys' retention ends in half a retention.
fn sweep_clock() -> MockClock {
    let clock = MockClock::new();
    clock.advance(RETENTION / 2);
    clock
}

#[test]
fn power_loss_at_every_write_and_sync_of_a_sweep_neither_resurrects_nor_loses() {
    let base = sweep_base();
    // A clean run counts the I/O the sweep makes.
    let clock = sweep_clock();
    let backend = FaultyStorage::from_image(&base);
    let engine = open_on(&backend, &clock).unwrap();
    let (writes0, syncs0) = (backend.writes(), backend.syncs());
    clock.advance(RETENTION / 2 + Duration::from_secs(1));
    assert_eq!(engine.admin().sweep_now().unwrap(), 300);
    engine.flush().unwrap();
    let (writes, syncs) = (backend.writes() - writes0, backend.syncs() - syncs0);
    engine.close().unwrap();
    assert!(
        writes > 0 && syncs > 0,
        "the sweep wrote through the writer"
    );

    let faults = (1..=writes)
        .map(|n| (true, n))
        .chain((1..=syncs).map(|n| (false, n)));
    for (is_write, n) in faults {
        let clock = sweep_clock();
        let backend = FaultyStorage::from_image(&base);
        let engine = open_on(&backend, &clock).unwrap();
        backend.set_sticky(true);
        if is_write {
            backend.fail_write_in(n);
        } else {
            backend.fail_sync_in(n);
        }
        clock.advance(RETENTION / 2 + Duration::from_secs(1));
        // The sweep and its commits stop at the failure; the engine is poisoned.
        let _ = engine.admin().sweep_now();
        let _ = engine.flush();
        let _ = engine.close();
        drop(engine);
        // Power comes back with what was synced, or with every write that reached the disk.
        for image in [backend.durable_image(), backend.crash_image(|_| true)] {
            let reopened =
                open_on(&FaultyStorage::from_image(&image), &clock).unwrap_or_else(|e| {
                    panic!(
                        "fault at {} {n}: reopen: {e}",
                        if is_write { "write" } else { "sync" }
                    )
                });
            for i in (0..300).step_by(7) {
                assert_eq!(
                    replay(&reopened, &format!("old-{i}")),
                    None,
                    "resurrected old-{i}"
                );
            }
            for i in 0..50 {
                assert_eq!(
                    replay(&reopened, &format!("young-{i}")).as_deref(),
                    Some(&b"young"[..]),
                    "lost young-{i} (fault at write? {is_write}, n {n})"
                );
            }
            reopened.close().unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Abandoned claims: an InFlight key whose lease ended and that nobody claims again.
// ---------------------------------------------------------------------------------------

const LEASE: Duration = Duration::from_secs(30);

/// Claims `key` with a checkpoint and a fingerprint, and returns the lease (never
/// completed: its client "gave up").
fn abandon(engine: &Engine, key: &str) -> Lease {
    let opts = ClaimOptions::default().fingerprint(7);
    let Claim::Acquired(mut lease) = engine.claim(key.as_bytes(), &opts).unwrap() else {
        panic!("{key} must be acquired")
    };
    lease.set_checkpoint(1, b"half-done").unwrap();
    lease
}

fn stats_of(engine: &Engine) -> (u64, u64, u64) {
    let s = engine.stats();
    (s.inflight, s.abandoned, s.abandoned_reaped)
}

#[test]
fn abandoned_claims_hold_no_in_flight_place_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let clock = MockClock::new();
    let open = || {
        builder(&path, &clock)
            .lease(LEASE)
            .inflight_max(2)
            .open()
            .unwrap()
    };
    let engine = open();
    let held = (abandon(&engine, "crashed-1"), abandon(&engine, "crashed-2"));
    // The process dies: its leases are never completed nor released.
    engine.close().unwrap();
    drop(held);
    // Recovery takes both over at once (`Recovery::TakeOver`): they are abandoned, not live.
    let engine = open();
    for key in ["new-1", "new-2"] {
        let Claim::Acquired(lease) = engine
            .claim(key.as_bytes(), &ClaimOptions::default())
            .unwrap()
        else {
            panic!("{key}: a new key is admitted while the only InFlight keys are abandoned")
        };
        lease.detach();
    }
    assert_eq!(stats_of(&engine), (2, 2, 0));
    // Two live leases fill the limit; the abandoned ones never did.
    assert_eq!(
        engine
            .claim(b"new-3", &ClaimOptions::default())
            .unwrap_err(),
        ClaimError::Overloaded(Limit::InFlightClaims)
    );
    engine.close().unwrap();
}

#[test]
fn an_abandoned_claim_is_reaped_exactly_retention_after_its_lease_ended() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let clock = MockClock::new();
    let engine = builder(&path, &clock).lease(LEASE).open().unwrap();
    let lease = abandon(&engine, "gone");
    assert_eq!(stats_of(&engine), (1, 0, 0));
    clock.advance(LEASE);
    complete(&engine, "kept", b"v");
    engine.flush().unwrap();
    // Its lease is over: no longer live, not yet reaped.
    assert_eq!(engine.admin().sweep_now().unwrap(), 0);
    assert_eq!(stats_of(&engine), (0, 1, 0));
    clock.advance(RETENTION - Duration::from_nanos(1));
    assert_eq!(
        engine.admin().sweep_now().unwrap(),
        0,
        "not one nanosecond early"
    );
    assert!(matches!(
        engine.get(b"gone").unwrap(),
        Some(KeyState::InFlight { .. })
    ));
    assert_eq!(stats_of(&engine), (0, 1, 0));
    clock.advance(Duration::from_nanos(1));
    // The completion made as the lease ended expires at the same instant.
    assert_eq!(engine.admin().sweep_now().unwrap(), 2);
    assert_eq!(engine.get(b"gone").unwrap(), None);
    assert_eq!(stats_of(&engine), (0, 0, 1));
    assert_eq!(engine.stats().expirations, 1);
    assert!(engine.admin().records().is_empty());
    // Its holder is fenced out; a new claim starts afresh.
    assert_eq!(lease.complete(b"late"), Err(LeaseError::LeaseLost));
    engine.flush().unwrap();
    engine.close().unwrap();
    // The deletion reached the file: reopening with the wall clock turned back a day (so
    // that recovery itself would not delete the record) does not bring it back.
    clock.set_wall(clock.wall() - Duration::from_secs(24 * 3600));
    let engine = builder(&path, &clock).lease(LEASE).open().unwrap();
    assert!(engine.admin().records().is_empty());
    let Claim::Acquired(lease) = engine.claim(b"gone", &ClaimOptions::default()).unwrap() else {
        panic!("a reaped key is new again")
    };
    assert_eq!((lease.attempt(), lease.checkpoint()), (1, None));
}

#[test]
fn an_abandoned_claim_is_taken_over_with_its_checkpoint_until_it_is_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let engine = builder(&dir.path().join("r.redb"), &clock)
        .lease(LEASE)
        .open()
        .unwrap();
    let first = abandon(&engine, "k");
    clock.advance(LEASE + RETENTION - Duration::from_millis(1));
    assert_eq!(engine.admin().sweep_now().unwrap(), 0);
    assert_eq!(stats_of(&engine), (0, 1, 0));
    // The fingerprint guard still holds.
    assert_eq!(
        engine
            .claim(b"k", &ClaimOptions::default().fingerprint(8))
            .unwrap_err(),
        ClaimError::FingerprintMismatch
    );
    let Claim::Acquired(retry) = engine
        .claim(b"k", &ClaimOptions::default().fingerprint(7))
        .unwrap()
    else {
        panic!("the retry takes the abandoned claim over")
    };
    assert_eq!(retry.attempt(), 2);
    assert_eq!(
        retry.checkpoint().map(|c| c.data()),
        Some(&b"half-done"[..])
    );
    assert_eq!(stats_of(&engine), (1, 0, 0));
    // The old bound passes: the new lease is live and is not reaped.
    clock.advance(Duration::from_millis(1));
    assert_eq!(engine.admin().sweep_now().unwrap(), 0);
    assert_eq!(stats_of(&engine), (1, 0, 0));
    assert_eq!(first.complete(b"stale"), Err(LeaseError::LeaseLost));
    retry.complete(b"done").unwrap();
    engine.flush().unwrap();
    assert_eq!(replay(&engine, "k").as_deref(), Some(&b"done"[..]));
    assert_eq!(stats_of(&engine), (0, 0, 0));
}

#[test]
fn restarts_never_postpone_the_reaping_of_an_abandoned_claim() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let clock = MockClock::new();
    let open = || builder(&path, &clock).lease(LEASE).open().unwrap();
    let engine = open();
    let held = (abandon(&engine, "a"), abandon(&engine, "b"));
    engine.close().unwrap();
    drop(held);
    // Restart after half the bound: the bound still counts from the recorded lease end.
    clock.advance((LEASE + RETENTION) / 2);
    let engine = open();
    assert_eq!(stats_of(&engine), (0, 2, 0));
    clock.advance((LEASE + RETENTION) / 2 - Duration::from_millis(1));
    assert_eq!(engine.admin().sweep_now().unwrap(), 0);
    engine.close().unwrap();
    // Restart a millisecond before the bound: both are still there, and taken over with
    // their checkpoints.
    let engine = open();
    assert_eq!(engine.admin().records().len(), 2);
    let Claim::Acquired(lease) = engine
        .claim(b"a", &ClaimOptions::default().fingerprint(7))
        .unwrap()
    else {
        panic!("taken over")
    };
    assert_eq!(lease.attempt(), 2);
    assert_eq!(
        lease.checkpoint().map(|c| c.data()),
        Some(&b"half-done"[..])
    );
    lease.complete(b"A").unwrap();
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        engine.admin().sweep_now().unwrap(),
        1,
        "b is reaped at its bound"
    );
    assert_eq!(stats_of(&engine), (0, 0, 1));
    engine.close().unwrap();
    // A claim found on open already past its bound is deleted there, and counted.
    let engine = open();
    let held = abandon(&engine, "c");
    engine.close().unwrap();
    drop(held);
    clock.advance(LEASE + RETENTION);
    let engine = open();
    assert_eq!(engine.get(b"c").unwrap(), None);
    assert_eq!(stats_of(&engine), (0, 0, 1));
    engine.close().unwrap();
    clock.set_wall(clock.wall() - Duration::from_secs(24 * 3600));
    let engine = open();
    assert_eq!(engine.get(b"c").unwrap(), None, "deleted from the file");
}

#[test]
fn an_extended_ended_lease_counts_again_and_takeovers_are_admitted_by_live_leases_only() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let engine = builder(&dir.path().join("r.redb"), &clock)
        .lease(LEASE)
        .inflight_max(1)
        .open()
        .unwrap();
    let opts = ClaimOptions::default();
    let Claim::Acquired(a) = engine.claim(b"a", &opts).unwrap() else {
        panic!()
    };
    clock.advance(LEASE);
    // "a" ended and holds no place.
    let Claim::Acquired(b) = engine.claim(b"b", &opts).unwrap() else {
        panic!("an ended lease holds no place")
    };
    // Its holder extends it (nobody took over): live again, without a check.
    a.extend(LEASE).unwrap();
    assert_eq!(stats_of(&engine), (2, 0, 0));
    let full = ClaimError::Overloaded(Limit::InFlightClaims);
    assert_eq!(engine.claim(b"c", &opts).unwrap_err(), full);
    // Both end, unseen by any sweep: a takeover is admitted because no other lease is live.
    clock.advance(LEASE);
    let Claim::Acquired(a2) = engine.claim(b"a", &opts).unwrap() else {
        panic!("no other live lease")
    };
    assert_eq!(a2.attempt(), 2);
    // Now "a" is live again: taking "b" over needs a place.
    assert_eq!(engine.claim(b"b", &opts).unwrap_err(), full);
    assert_eq!(stats_of(&engine), (1, 1, 0));
    assert_eq!(a.complete(b"stale"), Err(LeaseError::LeaseLost));
    a2.complete(b"A").unwrap();
    let Claim::Acquired(b2) = engine.claim(b"b", &opts).unwrap() else {
        panic!("a place is free")
    };
    assert_eq!(b2.attempt(), 2);
    // Only a decision frees the place: a dropped lease would keep it until its end.
    drop(b);
    assert_eq!(b2.release(), Ok(true));
    assert_eq!(stats_of(&engine), (0, 0, 0));
}
