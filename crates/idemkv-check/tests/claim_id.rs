//! A claim whose answer is unknown can be retried with its claim identity
//! (`ClaimOptions::claim_id`): the engine failed after queueing the claim, the caller has no
//! token, and after a reopen with `Recovery::HonourLeases` the retry presenting the same
//! identity gets the lease back (same token and attempt), while any other claim finds the
//! key held and a different payload is refused.

use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::*;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);
const ID: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;

fn open(backend: &FaultyStorage, clock: &MockClock, recovery: Recovery) -> Engine {
    Engine::builder()
        .backend(backend.clone())
        .durability(Durability::Immediate)
        .clock(clock.clone())
        .lease(LEASE)
        .recovery(recovery)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .unwrap()
}

fn opts(id: u128) -> ClaimOptions {
    ClaimOptions::default()
        .payload(b"charge 42")
        .lease(Duration::from_secs(600))
        .claim_id(id)
}

#[test]
fn a_claim_with_an_unknown_outcome_is_resumed_by_its_identity_after_a_reopen() {
    let clock = MockClock::new();
    let backend = FaultyStorage::memory();
    let engine = open(&backend, &clock, Recovery::TakeOver);
    let token_before = match engine.claim(b"warm", &ClaimOptions::default()).unwrap() {
        Claim::Acquired(lease) => {
            let token = lease.token();
            lease.complete(b"ok").unwrap();
            token
        }
        other => panic!("{other:?}"),
    };
    // The claim's commit syncs its pages, writes the header that commits it, and then that
    // header's sync fails: the engine is poisoned and the caller cannot know whether the
    // claim holds the key (it does, once the written header is read back).
    backend.fail_sync_in(2);
    match engine.claim(b"pay", &opts(ID)) {
        Err(ClaimError::OutcomeUnknown(_)) => {}
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    assert!(engine.stats().poisoned);
    let _ = engine.close();
    drop(engine);

    // The process restarts; the operating system kept every write.
    let backend = FaultyStorage::from_image(backend.live_image());
    clock.advance(Duration::from_secs(10));
    let engine = open(&backend, &clock, Recovery::HonourLeases);
    let held = match engine.get(b"pay").unwrap() {
        Some(KeyState::InFlight {
            token,
            attempt,
            lease_remaining,
            ..
        }) => {
            assert_eq!(attempt, 1);
            // The claim's own 600 s lease is honoured, not the engine's 30 s.
            assert_eq!(lease_remaining, Duration::from_secs(590));
            token
        }
        other => panic!("the claim's record is in the file: {other:?}"),
    };
    assert!(held > token_before);

    // Another identity, or none: the key is held.
    for other in [opts(ID ^ 1), ClaimOptions::default().payload(b"charge 42")] {
        assert!(matches!(
            engine.claim(b"pay", &other).unwrap(),
            Claim::InProgress(_)
        ));
    }
    // The same identity with another payload: refused.
    assert!(matches!(
        engine.claim(
            b"pay",
            &ClaimOptions::default().payload(b"charge 43").claim_id(ID)
        ),
        Err(ClaimError::FingerprintMismatch)
    ));
    // The same identity: the lease, same token and attempt, renewed for the claim's lease.
    let lease = match engine.claim(b"pay", &opts(ID)).unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("expected the lease back, got {other:?}"),
    };
    assert_eq!((lease.token(), lease.attempt()), (held, 1));
    assert!(matches!(
        engine.get(b"pay").unwrap(),
        Some(KeyState::InFlight { lease_remaining, .. }) if lease_remaining == Duration::from_secs(600)
    ));
    lease.complete(b"charged").unwrap();
    match engine.claim(b"pay", &opts(ID)).unwrap() {
        Claim::Completed(stored) => assert_eq!(stored.response(), b"charged"),
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.stats().takeovers, 0);
    engine.close().unwrap();
}

/// The identity is kept across a restart, live or over: under `Recovery::TakeOver` a
/// lease nobody took over yet is resumed too, while a failed one never is.
#[test]
fn a_lease_is_resumed_until_it_is_taken_over_and_never_after_a_fail() {
    let clock = MockClock::new();
    let backend = FaultyStorage::memory();
    let engine = open(&backend, &clock, Recovery::TakeOver);
    let first = match engine.claim(b"a", &opts(ID)).unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    let token = first.token();
    std::mem::forget(first);
    let failed = match engine.claim(b"b", &opts(ID)).unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    assert!(failed.fail().unwrap());
    engine.close().unwrap();
    drop(engine);
    let engine = open(&backend, &clock, Recovery::TakeOver);
    match engine.claim(b"a", &opts(ID)).unwrap() {
        Claim::Acquired(lease) => {
            assert_eq!((lease.token(), lease.attempt()), (token, 1));
            // Its holder dies again.
            std::mem::forget(lease);
        }
        other => panic!("{other:?}"),
    }
    match engine.claim(b"b", &opts(ID)).unwrap() {
        Claim::Acquired(lease) => assert_eq!(lease.attempt(), 2),
        other => panic!("{other:?}"),
    }
    // Taken over by another identity: the old one no longer resumes anything.
    clock.advance(Duration::from_secs(601));
    let taken = match engine.claim(b"a", &opts(7)).unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    assert_eq!(taken.attempt(), 2);
    assert!(matches!(
        engine.claim(b"a", &opts(ID)).unwrap(),
        Claim::InProgress(_)
    ));
    drop(taken);
    engine.close().unwrap();
}
