//! The async API on three executors (tokio multi-thread, tokio current-thread, futures'
//! block_on), in every durability mode: one handler run per key under contention, waiting
//! without blocking a thread, deadlines on the engine's (mock) clock, cancellation at every
//! await point, and keep-alive.

use idemkv::*;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The modes, each with the directory that keeps its file alive.
fn engines(clock: &MockClock) -> Vec<(Engine, Option<tempfile::TempDir>)> {
    let mut out = Vec::new();
    for durability in [
        Durability::None,
        Durability::buffered(),
        Durability::Immediate,
    ] {
        let mut b = Engine::builder()
            .durability(durability)
            .clock(clock.clone())
            .tuning(idemkv::Tuning::default().sweep_interval(None));
        let dir = (durability != Durability::None).then(|| tempfile::tempdir().unwrap());
        if let Some(dir) = &dir {
            b = b.path(dir.path().join("async.redb"));
        }
        out.push((b.open().unwrap(), dir));
    }
    out
}

/// A future that is pending once (waking itself), so other tasks run in between.
async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// `tasks` concurrent `run_async` calls on one key; returns (handler runs, outcomes).
async fn race(engine: &Engine, key: &[u8], tasks: usize) -> (usize, Vec<Outcome>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let opts = ClaimOptions::default().payload(b"body");
    let calls = (0..tasks).map(|_| {
        let runs = runs.clone();
        let opts = opts.clone();
        async move {
            engine
                .run_async(key, &opts, |lease| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Let the others arrive while the winner works.
                    for _ in 0..3 {
                        yield_once().await;
                    }
                    Ok::<_, std::io::Error>(format!("token {}", lease.token()).into_bytes())
                })
                .await
                .unwrap()
        }
    });
    let outcomes = futures::future::join_all(calls).await;
    (runs.load(Ordering::SeqCst), outcomes)
}

fn check_race(runs: usize, outcomes: &[Outcome]) {
    assert_eq!(runs, 1, "the handler ran once");
    let first = outcomes[0].response();
    assert!(outcomes.iter().all(|o| o.response() == first));
    let fresh = outcomes.iter().filter(|o| !o.replayed()).count();
    assert_eq!(fresh, 1, "exactly one caller ran the handler");
}

#[test]
fn concurrent_runs_on_futures_block_on_run_the_handler_once() {
    let clock = MockClock::new();
    for (engine, _dir) in engines(&clock) {
        let (runs, outcomes) = futures::executor::block_on(race(&engine, b"k", 64));
        check_race(runs, &outcomes);
    }
}

#[test]
fn concurrent_runs_on_a_current_thread_runtime_run_the_handler_once() {
    let clock = MockClock::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (engine, _dir) in engines(&clock) {
        let (runs, outcomes) = rt.block_on(race(&engine, b"k", 64));
        check_race(runs, &outcomes);
    }
}

#[test]
fn spawned_runs_on_a_multi_thread_runtime_run_the_handler_once_per_key() {
    let clock = MockClock::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    for (engine, _dir) in engines(&clock) {
        let runs = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(32));
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (engine, runs, barrier) = (engine.clone(), runs.clone(), barrier.clone());
                rt.spawn(async move {
                    barrier.wait().await;
                    let key = format!("key-{}", i % 4);
                    let bytes = key.clone().into_bytes();
                    engine
                        .run_async(key.as_bytes(), &ClaimOptions::default(), |_| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            Ok::<_, std::io::Error>(bytes)
                        })
                        .await
                        .unwrap()
                })
            })
            .collect();
        let outcomes: Vec<Outcome> = rt.block_on(async {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        assert_eq!(runs.load(Ordering::SeqCst), 4, "one run per key");
        assert_eq!(outcomes.iter().filter(|o| !o.replayed()).count(), 4);
    }
}

/// On a current-thread runtime a waiter that blocked its thread would keep the holder's task
/// from ever running: the holder completes only if waiting never blocks.
#[test]
fn a_thousand_waiters_share_one_thread_with_the_holder() {
    let clock = MockClock::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (engine, _dir) in engines(&clock) {
        rt.block_on(async {
            let opts = ClaimOptions::default();
            let Claim::Acquired(lease) = engine.claim_async(b"busy", &opts).await.unwrap() else {
                panic!("a fresh key is acquired")
            };
            let waiters: Vec<_> = (0..1000)
                .map(|_| {
                    let engine = engine.clone();
                    tokio::spawn(async move {
                        engine
                            .claim_or_wait_async(b"busy", &ClaimOptions::default())
                            .await
                    })
                })
                .collect();
            while engine.stats().waits < 1000 {
                tokio::task::yield_now().await;
            }
            lease.complete_async(b"done").await.unwrap();
            for w in waiters {
                match w.await.unwrap().unwrap() {
                    Claim::Completed(stored) => assert_eq!(stored.response(), b"done"),
                    other => panic!("a waiter got {other:?}"),
                }
            }
        });
    }
}

/// Polls `f` on this thread until it is ready, with a waker that unparks it; fails the test
/// after `limit` of real time instead of hanging.
fn block_on_timeout<F: Future>(f: F, limit: Duration) -> F::Output {
    let mut f = pin!(f);
    let thread = std::thread::current();
    let waker = Waker::from(Arc::new(Unpark(thread)));
    let mut cx = Context::from_waker(&waker);
    let start = Instant::now();
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(start.elapsed() < limit, "the future was never woken");
        std::thread::park_timeout(limit);
    }
}

struct Unpark(std::thread::Thread);
impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

#[test]
fn a_waiter_is_woken_by_the_end_of_the_holders_lease_on_the_engine_clock() {
    let clock = MockClock::new();
    for (engine, _dir) in engines(&clock) {
        let short = ClaimOptions::default().lease(Duration::from_secs(2));
        let Claim::Acquired(lease) = engine.claim(b"k", &short).unwrap() else {
            panic!("a fresh key is acquired")
        };
        let _abandoned = lease.detach();
        let before = engine.stats().waits;
        let waiter = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                block_on_timeout(
                    engine.claim_or_wait_async(b"k", &ClaimOptions::default()),
                    Duration::from_secs(30),
                )
            });
            while engine.stats().waits == before {
                std::thread::yield_now();
            }
            // Nothing announces a lease's end: only the engine's timer can wake the waiter.
            clock.advance(Duration::from_secs(3));
            waiter.join().unwrap()
        });
        match waiter.unwrap() {
            Claim::Acquired(lease) => assert_eq!(lease.attempt(), 2, "a takeover"),
            other => panic!("expected a takeover, got {other:?}"),
        }
    }
}

#[test]
fn a_waiter_gives_up_when_its_wait_runs_out_on_the_engine_clock() {
    let clock = MockClock::new();
    for (engine, _dir) in engines(&clock) {
        let Claim::Acquired(_lease) = engine.claim(b"k", &ClaimOptions::default()).unwrap() else {
            panic!("a fresh key is acquired")
        };
        let opts = ClaimOptions::default().wait(Duration::from_secs(5));
        let before = engine.stats().waits;
        let answer = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                block_on_timeout(
                    engine.claim_or_wait_async(b"k", &opts),
                    Duration::from_secs(30),
                )
            });
            while engine.stats().waits == before {
                std::thread::yield_now();
            }
            clock.advance(Duration::from_secs(6));
            waiter.join().unwrap()
        });
        assert!(matches!(answer, Ok(Claim::InProgress(_))), "{answer:?}");
    }
}

#[test]
fn the_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let engine = Engine::builder()
        .durability(Durability::None)
        .open()
        .unwrap();
    let opts = ClaimOptions::default();
    send(&engine.claim_async(b"k", &opts));
    send(&engine.claim_or_wait_async(b"k", &opts));
    send(&engine.flush_async());
    send(&engine.run_async(b"k", &opts, |_| async {
        Ok::<_, std::io::Error>(Vec::new())
    }));
}

/// Drops a `run_async` future after each number of polls it can take, in every mode, and
/// checks what the contract says: a claim dropped before it returned its lease is released,
/// a handler cut off while it ran keeps its key (attempt 1, lease live) until the lease
/// ends, then the key is taken over; and every run that returned is replayed with its bytes
/// after a restart.
#[test]
fn dropping_run_futures_at_every_await_point_keeps_cut_off_keys_and_loses_nothing() {
    let noop = Waker::noop();
    let mut cx = Context::from_waker(noop);
    for durability in [
        Durability::None,
        Durability::buffered(),
        Durability::Immediate,
    ] {
        let clock = MockClock::new();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cancel.redb");
        let open = || {
            let b = Engine::builder()
                .durability(durability)
                .clock(clock.clone())
                .tuning(idemkv::Tuning::default().sweep_interval(None));
            match durability {
                Durability::None => b.open().unwrap(),
                _ => b.path(&path).open().unwrap(),
            }
        };
        let engine = open();
        let mut returned = Vec::new();
        let mut kept = Vec::new();
        let opts = ClaimOptions::default();
        for polls in 0..12usize {
            for round in 0..5 {
                let key = format!("k-{polls}-{round}");
                let mut fut =
                    Box::pin(engine.run_async(key.as_bytes(), &opts, |lease| async move {
                        yield_once().await;
                        yield_once().await;
                        Ok::<_, std::io::Error>(format!("{}", lease.token()).into_bytes())
                    }));
                let mut out = None;
                for _ in 0..polls {
                    if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                        out = Some(r);
                        break;
                    }
                    // Makes any durability wait ready for the next poll.
                    engine.flush().unwrap();
                }
                drop(fut);
                if let Some(r) = out {
                    returned.push((key.clone(), r.unwrap().response().to_vec()));
                }
                match engine.get(key.as_bytes()).unwrap() {
                    None | Some(KeyState::Completed { .. }) | Some(KeyState::Completing { .. }) => {
                    }
                    // Cut off while its handler ran: the dropped lease keeps the key.
                    Some(KeyState::InFlight {
                        attempt: 1,
                        failed: false,
                        lease_remaining,
                        ..
                    }) if lease_remaining > Duration::ZERO => kept.push(key.clone()),
                    Some(state) => {
                        panic!("{durability:?}: {key} after {polls} polls: {state:?}")
                    }
                }
            }
        }
        assert!(!returned.is_empty(), "some runs finished");
        assert!(!kept.is_empty(), "some handlers were cut off");
        engine.flush().unwrap();
        assert_eq!(engine.stats().inflight, kept.len() as u64);
        for key in &kept {
            assert!(matches!(
                engine.claim(key.as_bytes(), &opts).unwrap(),
                Claim::InProgress(_)
            ));
        }
        // Past the leases (30 s by default), each kept key is taken over.
        clock.advance(Duration::from_secs(31));
        for key in &kept {
            let Claim::Acquired(next) = engine.claim(key.as_bytes(), &opts).unwrap() else {
                panic!("{durability:?}: {key} is taken over once its lease ended")
            };
            assert_eq!(next.attempt(), 2);
            next.release().unwrap();
        }
        engine.flush().unwrap();
        assert_eq!(engine.stats().inflight, 0);
        if durability == Durability::Immediate {
            assert!(
                engine.stats().claims_cancelled > 0,
                "some claims were dropped while durable-waiting"
            );
        }
        let engine = if durability == Durability::None {
            engine
        } else {
            engine.close().unwrap();
            drop(engine);
            open()
        };
        for (key, bytes) in returned {
            let out = engine
                .run(key.as_bytes(), &ClaimOptions::default(), |_| {
                    Ok::<_, std::io::Error>(b"ran again".to_vec())
                })
                .unwrap();
            assert!(out.replayed(), "{durability:?}: {key} ran again");
            assert_eq!(out.response(), &bytes[..]);
        }
    }
}

/// A waiter dropped while it waits changes nothing: the holder still owns the key and
/// completes it.
#[test]
fn dropping_a_waiting_claim_changes_nothing() {
    let noop = Waker::noop();
    let mut cx = Context::from_waker(noop);
    let clock = MockClock::new();
    for (engine, _dir) in engines(&clock) {
        let Claim::Acquired(lease) = engine.claim(b"k", &ClaimOptions::default()).unwrap() else {
            panic!("a fresh key is acquired")
        };
        let opts = ClaimOptions::default();
        for _ in 0..10 {
            let mut fut = Box::pin(engine.claim_or_wait_async(b"k", &opts));
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            drop(fut);
        }
        assert!(
            matches!(engine.get(b"k").unwrap(), Some(KeyState::InFlight { token, .. }) if token == lease.token())
        );
        lease.complete(b"done").unwrap();
        engine.flush().unwrap();
        assert!(matches!(
            engine.claim(b"k", &ClaimOptions::default()).unwrap(),
            Claim::Completed(_)
        ));
    }
}

/// While the handler's future lives its lease is renewed (others see it in flight long past
/// one lease), never past the maximum; dropping the future ends the renewals and releases.
#[test]
fn keep_alive_renews_while_the_handler_lives_and_stops_at_its_maximum() {
    let clock = MockClock::new();
    for (engine, _dir) in engines(&clock) {
        let opts = ClaimOptions::default()
            .lease(Duration::from_secs(3))
            .keep_alive(Duration::from_secs(10));
        let Claim::Acquired(lease) = engine.claim(b"k", &opts).unwrap() else {
            panic!("a fresh key is acquired")
        };
        let guard = lease.keep_alive(Duration::from_secs(10));
        let remaining = || match engine.get(b"k").unwrap() {
            Some(KeyState::InFlight {
                lease_remaining, ..
            }) => lease_remaining,
            other => panic!("expected InFlight, got {other:?}"),
        };
        // Each step passes a renewal point (every third of the lease); the timer thread
        // renews the lease to a full 3 s from then.
        for _ in 0..3 {
            clock.advance(Duration::from_secs(2));
            let start = Instant::now();
            while remaining() != Duration::from_secs(3) {
                assert!(start.elapsed() < Duration::from_secs(30), "never renewed");
                std::thread::yield_now();
            }
            assert!(matches!(
                engine.claim(b"k", &ClaimOptions::default()).unwrap(),
                Claim::InProgress(_)
            ));
        }
        // At 8 s the renewal may only move the end to 10 s after the claim, the maximum.
        clock.advance(Duration::from_secs(2));
        let start = Instant::now();
        while remaining() != Duration::from_secs(2) {
            assert!(start.elapsed() < Duration::from_secs(30), "never renewed");
            std::thread::yield_now();
        }
        // Past the maximum nothing renews it: at 11 s the lease has ended (and stays so).
        clock.advance(Duration::from_secs(3));
        assert_eq!(remaining(), Duration::ZERO);
        drop(guard);
        match engine.claim(b"k", &ClaimOptions::default()).unwrap() {
            Claim::Acquired(l) => assert_eq!(l.attempt(), 2),
            other => panic!("expected a takeover, got {other:?}"),
        }
        drop(lease);
    }
}

#[test]
fn a_dropped_keep_alive_guard_stops_renewing() {
    let clock = MockClock::new();
    for (engine, _dir) in engines(&clock) {
        let opts = ClaimOptions::default().lease(Duration::from_secs(3));
        let Claim::Acquired(lease) = engine.claim(b"k", &opts).unwrap() else {
            panic!("a fresh key is acquired")
        };
        drop(lease.keep_alive(Duration::from_secs(60)));
        clock.advance(Duration::from_secs(4));
        match engine.claim(b"k", &ClaimOptions::default()).unwrap() {
            Claim::Acquired(l) => assert_eq!(l.attempt(), 2, "the lease ended unrenewed"),
            other => panic!("expected a takeover, got {other:?}"),
        }
        drop(lease);
    }
}

#[test]
fn lease_handle_checkpoints_reach_a_takeover() {
    let clock = MockClock::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (engine, _dir) in engines(&clock) {
        rt.block_on(async {
            let opts = ClaimOptions::default().lease(Duration::from_secs(1));
            let Claim::Acquired(lease) = engine.claim_async(b"k", &opts).await.unwrap() else {
                panic!("a fresh key is acquired")
            };
            let handle = lease.handle();
            handle.set_checkpoint(7, b"half").await.unwrap();
            handle.extend(Duration::from_secs(1)).await.unwrap();
            let _gone = lease.detach();
            clock.advance(Duration::from_secs(2));
            let Claim::Acquired(next) = engine.claim_async(b"k", &opts).await.unwrap() else {
                panic!("the ended lease is taken over")
            };
            let cp = next.checkpoint().expect("the checkpoint is handed on");
            assert_eq!((cp.phase(), cp.data()), (7, &b"half"[..]));
            assert!(matches!(
                handle.extend(Duration::from_secs(1)).await,
                Err(LeaseError::LeaseLost)
            ));
            next.release_async().await.unwrap();
        });
    }
}
