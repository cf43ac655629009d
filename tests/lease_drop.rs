//! Only a decision gives a key back. A lease dropped without `complete`, `release`, `fail`
//! or `detach` (an early `?` return, a panicking handler, a future dropped by a timeout)
//! keeps its key InFlight under its token until the lease ends, exactly as if its holder
//! had crashed: the engine cannot know whether the holder's side effect already happened.
//! The first claim after the lease ends takes the key over (attempt + 1, checkpoint kept).

mod common;
use common::MockEngine;
use idemkv::{
    Claim, ClaimOptions, Engine, KeyState, Lease, LeaseError, OnHandlerError, RunError, WriteSet,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_millis(1);
const CHECKPOINT: &[u8] = b"charged";

type Env = MockEngine;

fn each_mode(f: impl Fn(&Env)) {
    MockEngine::each_mode(LEASE, f);
}

/// Claims `key` and saves the checkpoint a takeover must be handed.
fn claim_with_checkpoint(e: &Env, key: &[u8]) -> Lease {
    let Claim::Acquired(mut lease) = e.engine.claim(key, &ClaimOptions::default()).unwrap() else {
        panic!("{:?}: a fresh key is acquired", e.mode)
    };
    lease.set_checkpoint(1, CHECKPOINT).unwrap();
    lease
}

/// The time left on the lease holding `key`.
fn remaining(e: &Env, key: &[u8]) -> Duration {
    match e.engine.get(key).unwrap() {
        Some(KeyState::InFlight {
            lease_remaining, ..
        }) => lease_remaining,
        other => panic!("{:?}: expected InFlight, got {other:?}", e.mode),
    }
}

/// `key`'s first holder is gone without a decision, `left` before its lease ends: the key
/// answers InProgress until then (a tick before too), and the first claim after takes it
/// over with attempt 2 and the checkpoint.
fn assert_kept_then_taken_over(e: &Env, key: &[u8], left: Duration) {
    let mode = e.mode;
    let opts = ClaimOptions::default();
    match e.engine.claim(key, &opts).unwrap() {
        Claim::InProgress(busy) => assert_eq!(busy.attempt(), 1, "{mode:?}"),
        other => panic!("{mode:?}: the key must stay held, got {other:?}"),
    }
    assert!(
        matches!(
            e.engine.get(key).unwrap(),
            Some(KeyState::InFlight {
                attempt: 1,
                failed: false,
                ..
            })
        ),
        "{mode:?}"
    );
    e.clock.advance(left - TICK);
    assert!(
        matches!(e.engine.claim(key, &opts).unwrap(), Claim::InProgress(_)),
        "{mode:?}: a tick before the lease ends the key is still held"
    );
    e.clock.advance(TICK);
    match e.engine.claim(key, &opts).unwrap() {
        Claim::Acquired(next) => {
            assert_eq!(next.attempt(), 2, "{mode:?}");
            let cp = next.checkpoint().expect("the checkpoint is handed over");
            assert_eq!((cp.phase(), cp.data()), (1, CHECKPOINT), "{mode:?}");
            next.complete(b"done").unwrap();
        }
        other => panic!("{mode:?}: expected a takeover at the lease end, got {other:?}"),
    }
}

#[test]
fn a_dropped_lease_keeps_its_key_until_the_lease_ends_and_drops_its_staged_writes() {
    each_mode(|e| {
        let lease = claim_with_checkpoint(e, b"k");
        let mut staged = WriteSet::new();
        staged.put("t", b"row", b"staged").unwrap();
        lease.stage(staged).unwrap();
        drop(lease);
        assert_kept_then_taken_over(e, b"k", LEASE);
        e.engine.flush().unwrap();
        assert_eq!(
            e.engine.table_get("t", b"row").unwrap(),
            None,
            "{:?}",
            e.mode
        );
    });
}

/// A holder's own code that leaves with `?` after its side effect drops the lease.
fn charge(engine: &Engine, key: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    let Claim::Acquired(mut lease) = engine.claim(key, &ClaimOptions::default())? else {
        return Err("the key is busy".into());
    };
    lease.set_checkpoint(1, CHECKPOINT)?;
    Err(std::io::Error::other("the receipt could not be written"))?;
    lease.complete(b"receipt")?;
    Ok(())
}

#[test]
fn an_early_question_mark_return_keeps_the_key_until_the_lease_ends() {
    each_mode(|e| {
        assert!(charge(&e.engine, b"k").is_err());
        assert_kept_then_taken_over(e, b"k", LEASE);
    });
}

/// Inside `run`, a `?` in the handler *returns* an error: that is a decision, and
/// `on_handler_error` applies at once (the contrast to a panic).
#[test]
fn a_handler_that_returns_an_error_through_question_mark_still_decides_at_once() {
    each_mode(|e| {
        for (key, choice) in [
            (&b"released"[..], OnHandlerError::Release),
            (b"failed", OnHandlerError::Fail),
        ] {
            let opts = ClaimOptions::default().on_handler_error(choice);
            let out = e
                .engine
                .run(key, &opts, |lease| -> Result<Vec<u8>, LeaseError> {
                    e.engine.checkpoint(key, lease.token(), 1, CHECKPOINT)?;
                    Err(LeaseError::LeaseLost)?;
                    Ok(b"never".to_vec())
                });
            assert!(matches!(out, Err(RunError::Handler(_))), "{:?}", e.mode);
            let Claim::Acquired(next) = e.engine.claim(key, &opts).unwrap() else {
                panic!("{:?}: a returned error gives the key back at once", e.mode)
            };
            let expected = match choice {
                OnHandlerError::Release => (1, None),
                _ => (2, Some(CHECKPOINT)),
            };
            assert_eq!(
                (next.attempt(), next.checkpoint().map(|c| c.data())),
                expected,
                "{:?} {choice:?}",
                e.mode
            );
            next.release().unwrap();
        }
    });
}

#[test]
fn a_panicking_handler_in_run_keeps_the_key_whatever_on_handler_error_says() {
    each_mode(|e| {
        let settings = [
            ClaimOptions::default(),
            ClaimOptions::default().on_handler_error(OnHandlerError::Fail),
            // The handler's keep-alive stops with it, so the lease does end.
            ClaimOptions::default().keep_alive(Duration::from_secs(3600)),
        ];
        for (i, opts) in settings.iter().enumerate() {
            let key = format!("k{i}");
            let key = key.as_bytes();
            let panicked = catch_unwind(AssertUnwindSafe(|| {
                e.engine
                    .run(key, opts, |lease| -> Result<Vec<u8>, std::io::Error> {
                        e.engine
                            .checkpoint(key, lease.token(), 1, CHECKPOINT)
                            .unwrap();
                        panic!("the handler panics after its side effect")
                    })
            }));
            assert!(panicked.is_err());
            assert_kept_then_taken_over(e, key, LEASE);
        }
    });
}

#[test]
fn a_panicking_handler_in_run_typed_keeps_the_key() {
    each_mode(|e| {
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            e.engine.run_typed(
                b"k",
                &ClaimOptions::default(),
                |lease| -> Result<u64, std::io::Error> {
                    e.engine
                        .checkpoint(b"k", lease.token(), 1, CHECKPOINT)
                        .unwrap();
                    panic!("the typed handler panics after its side effect")
                },
            )
        }));
        assert!(panicked.is_err());
        assert_kept_then_taken_over(e, b"k", LEASE);
    });
}

/// A keep-alive guard that outlives its lease stops renewing it once the lease is dropped.
/// Two renewals fall due at the same instant, the dropped lease's first: once the control
/// lease is seen renewed, the dropped one's turn has passed.
#[test]
fn a_keep_alive_stops_renewing_a_dropped_lease() {
    each_mode(|e| {
        let dropped = claim_with_checkpoint(e, b"k");
        let guard = dropped.keep_alive(Duration::from_secs(3600));
        let Claim::Acquired(control) = e
            .engine
            .claim(b"control", &ClaimOptions::default())
            .unwrap()
        else {
            panic!("a fresh key is acquired")
        };
        let control_guard = control.keep_alive(Duration::from_secs(3600));
        drop(dropped);
        e.clock.advance(LEASE / 3 + TICK);
        let start = Instant::now();
        while remaining(e, b"control") != LEASE {
            assert!(start.elapsed() < Duration::from_secs(30), "never renewed");
            std::thread::yield_now();
        }
        let left = LEASE - LEASE / 3 - TICK;
        assert_eq!(remaining(e, b"k"), left, "{:?}: not renewed", e.mode);
        assert_kept_then_taken_over(e, b"k", left);
        drop((guard, control_guard));
        control.release().unwrap();
    });
}

/// A caller waiting in `run` is woken by the lease's end (no release announces it) and
/// takes the key over.
#[test]
fn a_waiting_caller_takes_a_dropped_lease_over_when_it_ends() {
    each_mode(|e| {
        drop(claim_with_checkpoint(e, b"k"));
        let waits = e.engine.stats().waits;
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let opts = ClaimOptions::default().wait(Duration::from_secs(3600));
                e.engine.run(b"k", &opts, |lease| {
                    let cp = lease.checkpoint().map(|c| c.data().to_vec());
                    Ok::<_, std::io::Error>(cp.unwrap_or_default())
                })
            });
            let start = Instant::now();
            while e.engine.stats().waits == waits {
                assert!(start.elapsed() < Duration::from_secs(30), "never waited");
                std::thread::yield_now();
            }
            e.clock.advance(LEASE);
            let out = waiter.join().unwrap().unwrap();
            assert_eq!((out.response(), out.replayed()), (CHECKPOINT, false));
        });
        e.engine.flush().unwrap();
        assert!(
            matches!(
                e.engine.get(b"k").unwrap(),
                Some(KeyState::Completed { attempt: 2, .. })
            ),
            "{:?}",
            e.mode
        );
    });
}

/// `run_async` dropped by `tokio::time::timeout` while its handler runs (after its side
/// effect): the key is kept; an async waiter is woken by the lease's end and takes it over.
#[tokio::test]
async fn a_run_async_future_dropped_by_a_timeout_keeps_the_key_until_the_lease_ends() {
    for mode in idemkv_check::modes() {
        let e = MockEngine::open(mode, LEASE);
        let (started, started_rx) = tokio::sync::oneshot::channel();
        let opts = ClaimOptions::default();
        let run = e.engine.run_async(b"k", &opts, |h| async move {
            h.set_checkpoint(1, CHECKPOINT).await?;
            let _ = started.send(());
            std::future::pending::<()>().await;
            Ok::<_, LeaseError>(b"never".to_vec())
        });
        let mut run = Box::pin(tokio::time::timeout(Duration::from_secs(3600), run));
        tokio::select! {
            _ = &mut run => panic!("{mode:?}: the handler never ends"),
            _ = started_rx => {}
        }
        // The timeout fires while the handler is suspended.
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!((&mut run).await.is_err(), "{mode:?}: timed out");
        drop(run);
        tokio::time::resume();

        match e.engine.claim(b"k", &ClaimOptions::default()).unwrap() {
            Claim::InProgress(busy) => assert_eq!(busy.attempt(), 1, "{mode:?}"),
            other => panic!("{mode:?}: the key must stay held, got {other:?}"),
        }
        let waits = e.engine.stats().waits;
        let opts = ClaimOptions::default().wait(Duration::from_secs(3600));
        let waiter = e.engine.run_async(b"k", &opts, |h| async move {
            let cp = h.checkpoint().map(|c| (c.phase(), c.data().to_vec()));
            Ok::<_, LeaseError>(format!("{} {cp:?}", h.attempt()).into_bytes())
        });
        let mut waiter = Box::pin(waiter);
        while e.engine.stats().waits == waits {
            assert!(futures::poll!(&mut waiter).is_pending(), "{mode:?}");
            tokio::task::yield_now().await;
        }
        e.clock.advance(LEASE);
        let out = waiter.await.unwrap();
        let expected = format!("2 {:?}", Some((1, CHECKPOINT.to_vec())));
        assert_eq!(out.response(), expected.as_bytes(), "{mode:?}");
    }
}

/// Many threads race for one key, round after round; each round's winner drops its lease
/// or panics in `run`. While the dropped holder's lease is live no other thread acquires
/// the key, and after its end exactly one takes it over with the next attempt.
#[test]
fn contending_threads_never_share_a_key_a_dropped_holder_still_holds() {
    const THREADS: usize = 8;
    const ROUNDS: u32 = 6;
    each_mode(|e| {
        let barrier = Barrier::new(THREADS);
        let winners = AtomicUsize::new(0);
        let violations = Mutex::new(Vec::<String>::new());
        let no_wait = ClaimOptions::default().wait(Duration::ZERO);
        let violation = |what: String| violations.lock().unwrap().push(what);
        std::thread::scope(|s| {
            for thread in 0..THREADS {
                let (barrier, winners, no_wait) = (&barrier, &winners, &no_wait);
                let violation = &violation;
                s.spawn(move || {
                    for round in 0..ROUNDS {
                        let attempt = round + 1;
                        barrier.wait();
                        if round % 2 == 0 {
                            if let Ok(Claim::Acquired(mut lease)) = e.engine.claim(b"k", no_wait) {
                                winners.fetch_add(1, Ordering::SeqCst);
                                if lease.attempt() != attempt {
                                    violation(format!("round {round}: {lease:?}"));
                                }
                                let _ = lease.set_checkpoint(1, CHECKPOINT);
                                drop(lease);
                            }
                        } else {
                            let _ = catch_unwind(AssertUnwindSafe(|| {
                                e.engine.run(b"k", no_wait, |lease| -> Result<Vec<u8>, ()> {
                                    winners.fetch_add(1, Ordering::SeqCst);
                                    if lease.attempt() != attempt {
                                        violation(format!("round {round}: {lease:?}"));
                                    }
                                    panic!("round {round}: the winner panics")
                                })
                            }));
                        }
                        barrier.wait();
                        // The dropped holder's lease is live: nobody may acquire the key.
                        match e.engine.claim(b"k", no_wait) {
                            Ok(Claim::InProgress(_)) => {}
                            other => violation(format!(
                                "round {round}, thread {thread}: {other:?} while the \
                                 dropped holder's lease is live"
                            )),
                        }
                        barrier.wait();
                        if thread == 0 {
                            let won = winners.swap(0, Ordering::SeqCst);
                            if won != 1 {
                                violation(format!("round {round}: {won} winners"));
                            }
                            e.clock.advance(LEASE);
                        }
                        barrier.wait();
                    }
                });
            }
        });
        let violations = violations.into_inner().unwrap();
        assert!(violations.is_empty(), "{:?}: {violations:#?}", e.mode);
        let Claim::Acquired(last) = e.engine.claim(b"k", &no_wait).unwrap() else {
            panic!("{:?}: the last lease ended", e.mode)
        };
        assert_eq!(last.attempt(), ROUNDS + 1);
        assert_eq!(last.checkpoint().map(|c| c.data()), Some(CHECKPOINT));
        last.complete(b"done").unwrap();
    });
}
