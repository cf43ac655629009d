//! Slow is not dead. `run`, `run_typed` and `run_async` renew their handler's lease while it
//! runs (up to ten minutes after the claim by default), so a handler slower than its lease
//! keeps its key and its duplicates wait for its response; the lease length only says how
//! soon a dead holder's key is taken over. `keep_alive(Duration::ZERO)` turns the renewals
//! off and the lease bounds the handler again.
//!
//! Time is a mock clock moved by hand; the renewals run on the engine's timer thread, which
//! a clock step wakes, so each step waits (without sleeping) until the renewal is seen.

mod common;
use common::MockEngine;
use idemkv::{Claim, ClaimOptions, Durability, KeyState, LeaseError, RunError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(3);
/// Two thirds of the lease: each step passes one renewal point (every third of the lease).
const STEP: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(1);
/// The documented default bound of a handler's keep-alive.
const KEEP_ALIVE_MAX_DEFAULT: Duration = Duration::from_secs(600);

type Env = MockEngine;

fn each_mode(f: impl Fn(&Env)) {
    MockEngine::each_mode(LEASE, f);
}

/// The lease left on `key` (zero once it ended, or once the key is no longer InFlight).
fn remaining(e: &Env, key: &[u8]) -> Duration {
    match e.engine.get(key).unwrap() {
        Some(KeyState::InFlight {
            lease_remaining, ..
        }) => lease_remaining,
        _ => Duration::ZERO,
    }
}

/// Moves the clock one step and waits until the timer thread has renewed `key`'s lease to
/// `expected` (a renewal is asynchronous: the step only wakes the timer).
fn step_and_see_renewal(e: &Env, key: &[u8], expected: Duration) {
    e.clock.advance(STEP);
    let start = Instant::now();
    while remaining(e, key) != expected {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}: the lease was never renewed to {expected:?} (left: {:?})",
            e.mode,
            remaining(e, key)
        );
        std::thread::yield_now();
    }
}

fn busy(e: &Env, key: &[u8]) -> bool {
    matches!(
        e.engine.claim(key, &ClaimOptions::default()).unwrap(),
        Claim::InProgress(_)
    )
}

#[test]
fn a_handler_slower_than_its_lease_keeps_its_key_by_default() {
    each_mode(|e| {
        let out = e
            .engine
            .run(b"k", &ClaimOptions::default(), |lease| {
                // Five leases' worth of work: every step passes a renewal point, and a
                // duplicate arriving meanwhile finds the key held.
                for _ in 0..8 {
                    step_and_see_renewal(e, b"k", LEASE);
                    assert!(busy(e, b"k"), "{:?}: a live holder lost its key", e.mode);
                }
                assert_eq!(lease.attempt(), 1);
                Ok::<_, std::io::Error>(b"charged once".to_vec())
            })
            .unwrap();
        assert!(!out.replayed());
        e.engine.flush().unwrap();
        match e.engine.claim(b"k", &ClaimOptions::default()).unwrap() {
            Claim::Completed(c) => assert_eq!(c.response(), b"charged once"),
            other => panic!("{:?}: expected Completed, got {other:?}", e.mode),
        }
    });
}

#[test]
fn without_keep_alive_the_lease_bounds_the_handler() {
    each_mode(|e| {
        let opts = ClaimOptions::default().keep_alive(Duration::ZERO);
        let out = e.engine.run(b"k", &opts, |_lease| {
            e.clock.advance(LEASE + TICK);
            // Nothing renewed the lease: a duplicate takes the key over.
            match e.engine.claim(b"k", &ClaimOptions::default()).unwrap() {
                Claim::Acquired(next) => {
                    assert_eq!(next.attempt(), 2);
                    next.complete(b"second").unwrap();
                }
                other => panic!("{:?}: expected a takeover, got {other:?}", e.mode),
            }
            Ok::<_, std::io::Error>(b"first".to_vec())
        });
        assert!(
            matches!(out, Err(RunError::Lease(LeaseError::LeaseLost))),
            "{:?}: the first handler's result must be refused, got {out:?}",
            e.mode
        );
    });
}

/// The default keep-alive ends ten minutes after the claim: the renewal due past that point
/// moves the lease's end to exactly the bound, and a hung handler loses its key there.
#[test]
fn the_default_keep_alive_ends_ten_minutes_after_the_claim() {
    let e = MockEngine::open(Durability::None, LEASE);
    let lease = Duration::from_secs(180);
    let step = Duration::from_secs(120);
    let opts = ClaimOptions::default().lease(lease);
    let out = e.engine.run(b"k", &opts, |_lease| {
        let mut at = Duration::ZERO;
        while at + step < KEEP_ALIVE_MAX_DEFAULT {
            at += step;
            e.clock.advance(step);
            let expected = lease.min(KEEP_ALIVE_MAX_DEFAULT - at);
            let start = Instant::now();
            while remaining(&e, b"k") != expected {
                assert!(start.elapsed() < Duration::from_secs(30), "never renewed");
                std::thread::yield_now();
            }
        }
        // The last renewal capped the end at the bound; nothing renews it past that.
        e.clock.advance(KEEP_ALIVE_MAX_DEFAULT - at - TICK);
        assert!(busy(&e, b"k"), "held until the bound");
        e.clock.advance(TICK);
        assert_eq!(remaining(&e, b"k"), Duration::ZERO);
        assert!(
            matches!(
                e.engine.claim(b"k", &ClaimOptions::default()).unwrap(),
                Claim::Acquired(_)
            ),
            "past the bound the key is taken over"
        );
        Ok::<_, std::io::Error>(b"too late".to_vec())
    });
    assert!(matches!(out, Err(RunError::Lease(LeaseError::LeaseLost))));
}

#[test]
fn run_async_keeps_a_slow_handlers_key_by_default() {
    each_mode(|e| {
        let out = futures::executor::block_on(e.engine.run_async(
            b"k",
            &ClaimOptions::default(),
            |_handle| async {
                for _ in 0..5 {
                    step_and_see_renewal(e, b"k", LEASE);
                    assert!(busy(e, b"k"), "{:?}: a live holder lost its key", e.mode);
                }
                Ok::<_, std::io::Error>(b"async once".to_vec())
            },
        ))
        .unwrap();
        assert!(!out.replayed());
    });
}

/// Many copies of one message at once, the winner's work five leases long: the work runs
/// once and every copy gets its response.
#[test]
fn concurrent_copies_wait_out_a_slow_winner_and_get_its_response() {
    const COPIES: usize = 16;
    each_mode(|e| {
        let runs = AtomicUsize::new(0);
        let barrier = Barrier::new(COPIES);
        let outcomes: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..COPIES)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let opts = ClaimOptions::default().wait(Duration::from_secs(3600));
                        e.engine.run(b"msg", &opts, |_lease| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            for _ in 0..5 {
                                step_and_see_renewal(e, b"msg", LEASE);
                            }
                            Ok::<_, std::io::Error>(b"receipt".to_vec())
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{:?}", e.mode);
        let mut fresh = 0;
        for out in outcomes {
            let out = out.unwrap_or_else(|err| panic!("{:?}: {err}", e.mode));
            assert_eq!(out.response(), b"receipt");
            fresh += usize::from(!out.replayed());
        }
        assert_eq!(fresh, 1, "{:?}", e.mode);
    });
}
