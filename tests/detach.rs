//! `Lease::detach`: a lease let go on purpose keeps its key until the lease ends, and no
//! longer keeps the engine (and its file) alive.

use idemkv::*;
use idemkv_check::fixture;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);

fn open(path: &std::path::Path, clock: &MockClock) -> Engine {
    fixture::open_builder(
        fixture::builder(path, clock, Durability::Immediate)
            .lease(LEASE)
            .recovery(Recovery::HonourLeases),
    )
}

fn acquire(engine: &Engine, key: &[u8]) -> Lease {
    fixture::acquire(engine, key, &ClaimOptions::default())
}

#[test]
fn a_detached_lease_keeps_its_key_in_flight_until_the_lease_ends() {
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .lease(LEASE)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .unwrap();
    let lease = acquire(&engine, b"k");
    let token = lease.token();
    let detached = lease.detach();
    assert_eq!(
        (detached.key(), detached.token(), detached.attempt()),
        (&b"k"[..], token, 1)
    );
    // Not released: another caller sees the claim in progress.
    assert!(matches!(
        engine.claim(b"k", &ClaimOptions::default()).unwrap(),
        Claim::InProgress(_)
    ));
    clock.advance(LEASE + Duration::from_millis(1));
    let next = acquire(&engine, b"k");
    assert_eq!(
        next.attempt(),
        2,
        "the first claim after the lease takes the key over"
    );
    assert!(next.token() > token);
}

#[test]
fn a_detached_lease_can_still_be_settled_with_its_token() {
    let engine = Engine::builder()
        .durability(Durability::None)
        .open()
        .unwrap();
    let detached = acquire(&engine, b"k").detach();
    engine
        .complete(detached.key(), detached.token(), b"done")
        .unwrap();
    match engine.claim(b"k", &ClaimOptions::default()).unwrap() {
        Claim::Completed(stored) => assert_eq!(stored.response(), b"done"),
        other => panic!("the key is completed: {other:?}"),
    }
}

#[test]
fn detaching_drops_the_engine_handle_so_the_file_can_be_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.redb");
    let clock = MockClock::new();
    let engine = open(&path, &clock);
    let lease = acquire(&engine, b"k");
    let token = lease.token();
    lease.detach();
    // The last handle goes: the engine shuts down and unlocks the file. (A forgotten lease
    // would keep a handle alive, and this open would find the file locked.)
    drop(engine);
    let engine = open(&path, &clock);
    match engine.get(b"k").unwrap() {
        Some(KeyState::InFlight { token: t, .. }) => assert_eq!(t, token),
        other => panic!("the detached claim is still in flight in the file: {other:?}"),
    }
}
