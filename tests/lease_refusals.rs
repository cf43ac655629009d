//! A lease whose completion is refused before anything changed must not leave its key
//! stuck InFlight: the consumed lease releases the key as it drops, so a retry can run.

use idemkv::*;
use std::time::Duration;

#[test]
fn a_too_large_response_releases_the_key_for_a_retry() {
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock)
        .response_len_max(8)
        .lease(Duration::from_secs(3600))
        .open()
        .unwrap();
    let o = ClaimOptions::default();
    let Claim::Acquired(lease) = engine.claim(b"k", &o).unwrap() else {
        panic!()
    };
    let token = lease.token();
    assert_eq!(
        lease.complete(b"far too long"),
        Err(LeaseError::ResponseTooLarge { len: 12, max: 8 })
    );
    // Not stuck behind the hour-long lease: the next claim acquires at once.
    let Claim::Acquired(retry) = engine.claim(b"k", &o).unwrap() else {
        panic!("the refused lease must have been released")
    };
    assert!(retry.token() > token);
    retry.complete(b"short").unwrap();
}

#[test]
fn run_with_a_too_large_response_does_not_strand_waiters() {
    let engine = Engine::builder()
        .durability(Durability::None)
        .response_len_max(4)
        .open()
        .unwrap();
    let o = ClaimOptions::default().wait(Duration::from_secs(5));
    let err = engine
        .run(b"k", &o, |_| Ok::<_, ()>(b"toolong".to_vec()))
        .unwrap_err();
    assert!(matches!(
        err,
        RunError::Lease(LeaseError::ResponseTooLarge { .. })
    ));
    let out = engine
        .run(b"k", &o, |_| Ok::<_, ()>(b"ok".to_vec()))
        .unwrap();
    assert_eq!(out.response(), b"ok");
    assert!(!out.replayed());
}

#[test]
fn a_lost_lease_is_settled_and_does_not_release_the_new_holder() {
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .lease(Duration::from_secs(1))
        .open()
        .unwrap();
    let o = ClaimOptions::default();
    let Claim::Acquired(old) = engine.claim(b"k", &o).unwrap() else {
        panic!()
    };
    clock.advance(Duration::from_secs(2));
    let Claim::Acquired(new) = engine.claim(b"k", &o).unwrap() else {
        panic!()
    };
    assert_eq!(old.complete(b"late"), Err(LeaseError::LeaseLost));
    assert!(matches!(
        engine.get(b"k").unwrap(),
        Some(KeyState::InFlight { token, .. }) if token == new.token()
    ));
    new.complete(b"fresh").unwrap();
}
