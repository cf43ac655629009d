//! The engine never turns its own limit into a second execution. A holder whose work is done
//! and whose result the engine refuses (a response over the limit, a value that cannot be
//! encoded, a writer queue that stays full) keeps the key InFlight until its lease ends:
//! every other caller sees `InProgress` until then, and only a claim after the lease ended
//! takes the key over. A handler's own failure, or an explicit release, still hands the key
//! on at once.

use common::{acquired, in_progress, wait_until};
use idemkv::error::{Limit, NotStoredReason};
use idemkv::fault::{FaultyStorage, Gate, WithStorage};
use idemkv::*;
use idemkv_check::backend as common;
use idemkv_check::modes;
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);
/// Real-time bound for another thread to answer: a hang detector, never a pace.
const HANG: Duration = Duration::from_secs(20);

fn open(
    mode: Durability,
    clock: &MockClock,
    tune: impl Fn(EngineBuilder) -> EngineBuilder,
) -> Engine {
    let mut b = Engine::builder()
        .durability(mode)
        .clock(clock.clone())
        .lease(LEASE)
        .tuning(idemkv::Tuning::default().sweep_interval(None));
    if mode != Durability::None {
        b = b.backend(FaultyStorage::memory());
    }
    tune(b).open().unwrap()
}

#[test]
fn a_too_large_response_keeps_the_key_until_the_lease_ends() {
    for mode in modes() {
        let clock = MockClock::new();
        let engine = open(mode, &clock, |b| b.response_len_max(8));
        let o = ClaimOptions::default();
        let lease = acquired(engine.claim(b"k", &o).unwrap());
        let token = lease.token();
        assert_eq!(
            lease.complete(b"far too long"),
            Err(LeaseError::ResponseTooLarge { len: 12, max: 8 })
        );
        // Not released: the next caller is told to wait for the lease, not handed the work.
        let busy = in_progress(engine.claim(b"k", &o).unwrap());
        assert_eq!((busy.retry_after(), busy.attempt()), (LEASE, 1));
        assert!(matches!(
            engine.get(b"k").unwrap(),
            Some(KeyState::InFlight { token: t, lease_remaining, .. })
                if t == token && lease_remaining == LEASE
        ));
        assert_eq!(engine.stats().releases, 0);
        clock.advance(LEASE - Duration::from_millis(1));
        in_progress(engine.claim(b"k", &o).unwrap());
        // Once the lease has ended, the next claim takes the key over.
        clock.advance(Duration::from_millis(1));
        let retry = acquired(engine.claim(b"k", &o).unwrap());
        assert_eq!(retry.attempt(), 2, "{mode:?}");
        assert!(retry.token() > token);
        retry.complete(b"short").unwrap();
    }
}

#[test]
fn an_explicit_release_after_a_refusal_still_hands_the_key_on() {
    let clock = MockClock::new();
    let engine = open(Durability::None, &clock, |b| b.response_len_max(8));
    let o = ClaimOptions::default();
    let lease = acquired(engine.claim(b"k", &o).unwrap());
    let token = lease.token();
    assert!(lease.complete(b"far too long").is_err());
    assert_eq!(engine.release(b"k", token), Ok(true));
    assert_eq!(acquired(engine.claim(b"k", &o).unwrap()).attempt(), 1);
}

/// Eight concurrent `run` calls of one key whose handler returns 1 KiB, on an engine that
/// stores at most 16 bytes: the side effect runs once within the lease, every other caller
/// keeps waiting, and after the lease one of them takes over (attempt 2).
#[test]
fn concurrent_runs_with_a_too_large_response_run_the_side_effect_once_per_lease() {
    const COPIES: usize = 8;
    for mode in modes() {
        let clock = MockClock::new();
        let engine = open(mode, &clock, |b| b.response_len_max(16));
        let ran: Arc<Mutex<Vec<u32>>> = Arc::default();
        let barrier = Arc::new(Barrier::new(COPIES));
        let (tx, rx) = mpsc::channel();
        let threads: Vec<_> = (0..COPIES)
            .map(|_| {
                let (engine, ran, barrier, tx) =
                    (engine.clone(), ran.clone(), barrier.clone(), tx.clone());
                std::thread::spawn(move || {
                    let opts = ClaimOptions::default().wait(Duration::from_secs(3600));
                    barrier.wait();
                    let r = engine.run(b"k", &opts, |lease| {
                        ran.lock().unwrap().push(lease.attempt());
                        // The first attempt's response can never be stored.
                        let len = if lease.attempt() == 1 { 1024 } else { 5 };
                        Ok::<_, ()>(vec![7u8; len])
                    });
                    tx.send(r).unwrap();
                })
            })
            .collect();
        let first = rx.recv_timeout(HANG).expect("the winner's run returned");
        let token = match first {
            Err(RunError::NotStored {
                reason: NotStoredReason::ResponseTooLarge { len: 1024, max: 16 },
                token,
                retry_after,
            }) => {
                assert_eq!(retry_after, LEASE);
                token
            }
            other => panic!("{mode:?}: expected NotStored, got {other:?}"),
        };
        assert_eq!(*ran.lock().unwrap(), vec![1], "{mode:?}: one side effect");
        // The key is still the winner's; the others get a defined answer, not the work.
        assert!(matches!(
            engine.get(b"k").unwrap(),
            Some(KeyState::InFlight { token: t, attempt: 1, .. }) if t == token
        ));
        let busy = in_progress(engine.claim(b"k", &ClaimOptions::default()).unwrap());
        assert_eq!(busy.retry_after(), LEASE);
        let quick = ClaimOptions::default().wait(Duration::ZERO);
        match engine.run(b"k", &quick, |_| Ok::<_, ()>(b"never".to_vec())) {
            Err(RunError::StillInProgress { retry_after }) => assert_eq!(retry_after, LEASE),
            other => panic!("{mode:?}: expected StillInProgress, got {other:?}"),
        }
        assert!(rx.try_recv().is_err(), "{mode:?}: a waiter returned early");

        // The lease ends: exactly one waiter takes over and runs; the rest replay its bytes.
        clock.advance(LEASE);
        let rest: Vec<_> = (1..COPIES)
            .map(|_| rx.recv_timeout(HANG).expect("a waiter returned"))
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*ran.lock().unwrap(), vec![1, 2], "{mode:?}");
        let outs: Vec<Outcome> = rest
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{mode:?}: {e:?}")))
            .collect();
        assert_eq!(outs.iter().filter(|o| !o.replayed()).count(), 1);
        assert!(outs.iter().all(|o| o.response() == [7u8; 5]));
        assert!(outs.iter().all(|o| o.token() > token));
    }
}

/// A value whose `Serialize` always fails.
#[derive(Debug, PartialEq, serde::Deserialize)]
struct Unencodable;

impl serde::Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom(
            "this value refuses to be encoded",
        ))
    }
}

#[test]
fn run_typed_with_an_unencodable_value_keeps_the_key() {
    for mode in modes() {
        let clock = MockClock::new();
        let engine = open(mode, &clock, |b| b);
        let o = ClaimOptions::default();
        let token = match engine.run_typed(b"k", &o, |_| Ok::<_, ()>(Unencodable)) {
            Err(RunError::NotStored {
                reason: NotStoredReason::Encode(_),
                token,
                retry_after,
            }) => {
                assert_eq!(retry_after, LEASE);
                token
            }
            other => panic!("{mode:?}: expected NotStored(Encode), got {other:?}"),
        };
        assert!(matches!(
            engine.get(b"k").unwrap(),
            Some(KeyState::InFlight { token: t, .. }) if t == token
        ));
        let quick = o.clone().wait(Duration::ZERO);
        assert!(matches!(
            engine.run_typed(b"k", &quick, |_| Ok::<_, ()>(1u32)),
            Err(RunError::StillInProgress { .. })
        ));
        clock.advance(LEASE);
        let out = engine.run_typed(b"k", &o, |_| Ok::<_, ()>(1u32)).unwrap();
        assert_eq!((out.value, out.replayed), (1, false));
    }
}

#[test]
fn a_failing_handler_still_releases_at_once() {
    for mode in modes() {
        let clock = MockClock::new();
        let engine = open(mode, &clock, |b| b);
        let o = ClaimOptions::default();
        assert!(matches!(
            engine.run(b"k", &o, |_| Err::<Vec<u8>, _>("retryable")),
            Err(RunError::Handler("retryable"))
        ));
        assert_eq!(engine.get(b"k").unwrap(), None);
        let out = engine.run(b"k", &o, |lease| {
            assert_eq!(lease.attempt(), 1, "a fresh claim, not a takeover");
            Ok::<_, ()>(b"ok".to_vec())
        });
        assert_eq!(out.unwrap().response(), b"ok");
        // A lease dropped without complete or release (a panicking handler) is no decision:
        // it keeps its key until the lease ends.
        drop(acquired(engine.claim(b"j", &o).unwrap()));
        in_progress(engine.claim(b"j", &o).unwrap());
        clock.advance(LEASE);
        assert_eq!(acquired(engine.claim(b"j", &o).unwrap()).attempt(), 2);
    }
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

// ---------------------------------------------------------------------------------------
// A full writer queue: the holder waits for room while its lease lasts, never releases.
// ---------------------------------------------------------------------------------------

/// A `Buffered` engine with a 16-place writer queue, on a simulated disk whose fsync a test
/// can hold.
fn sixteen_place_engine(clock: &MockClock) -> (Engine, FaultyStorage) {
    let backend = FaultyStorage::memory();
    let engine = Engine::builder()
        .backend(backend.clone())
        .durability(Durability::buffered())
        .clock(clock.clone())
        .lease(LEASE)
        .tuning(
            idemkv::Tuning::default()
                .sweep_interval(None)
                .queue_depth(16),
        )
        .open()
        .unwrap();
    (engine, backend)
}

/// A `Buffered` engine on a backend whose fsync is held, with its 16-place queue full: one
/// claim stuck in the writer's commit, 13 more claims (seven eighths not yet durable), and
/// three completions. Returns the engine, the held gate and the leases still open.
fn full_queue(clock: &MockClock) -> (Engine, FaultyStorage, Gate, Vec<Lease>) {
    let (engine, backend) = sixteen_place_engine(clock);
    let o = ClaimOptions::default();
    let gate = backend.close_gate();
    let mut leases = vec![acquired(engine.claim(b"first", &o).unwrap())];
    common::wait_sync_held(&backend);
    // `Buffered` admits claims while fewer than 14 are not yet durable, the one in the
    // commit included: 13 more; holders' completions fill the rest.
    for i in 0..13u32 {
        leases.push(acquired(engine.claim(&i.to_be_bytes(), &o).unwrap()));
    }
    for _ in 0..3 {
        leases.pop().unwrap().complete(b"done").unwrap();
    }
    assert_eq!(engine.stats().queue_depth, 16);
    (engine, backend, gate, leases)
}

/// Completes `lease` with `after` on a thread of its own and returns once the holder waits for
/// room in the full queue (and has not returned): its key, its token, and its answer to come.
fn complete_waiting_for_room(
    engine: &Engine,
    lease: Lease,
) -> (Vec<u8>, u64, mpsc::Receiver<Result<(), LeaseError>>) {
    let (key, token) = (lease.key().to_vec(), lease.token());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(lease.complete(b"after")).unwrap());
    wait_until("the holder to wait for room", || {
        engine.stats().overloaded > 0
    });
    assert!(rx.try_recv().is_err());
    (key, token, rx)
}

#[test]
fn a_holder_waits_for_room_in_a_full_queue_and_completes() {
    let clock = MockClock::new();
    let (engine, _backend, gate, mut leases) = full_queue(&clock);
    // Waiting, not failing and not releasing: the key is still the holder's.
    let (key, token, rx) = complete_waiting_for_room(&engine, leases.pop().unwrap());
    assert!(matches!(
        engine.get(&key).unwrap(),
        Some(KeyState::InFlight { token: t, .. }) if t == token
    ));
    drop(gate);
    assert_eq!(rx.recv_timeout(HANG).expect("the holder returned"), Ok(()));
    engine.flush().unwrap();
    let s = common::completed(engine.claim(&key, &ClaimOptions::default()).unwrap());
    assert_eq!((s.response(), s.token()), (&b"after"[..], token));
    drop(leases);
}

#[test]
fn a_holder_whose_lease_ends_in_a_full_queue_keeps_the_key() {
    let clock = MockClock::new();
    let (engine, _backend, gate, mut leases) = full_queue(&clock);
    let (key, token, rx) = complete_waiting_for_room(&engine, leases.pop().unwrap());
    // The lease ends while the writer is still held: the holder gives up with a typed
    // error at once, and the key is not released (other callers would run the work now).
    clock.advance(LEASE);
    assert_eq!(
        rx.recv_timeout(HANG)
            .expect("the holder returned at the lease's end"),
        Err(LeaseError::Overloaded(Limit::WriterQueue))
    );
    assert!(matches!(
        engine.get(&key).unwrap(),
        Some(KeyState::InFlight { token: t, lease_remaining: Duration::ZERO, .. }) if t == token
    ));
    assert_eq!(engine.stats().releases, 0);
    drop(gate);
    engine.flush().unwrap();
    // The lease has ended, so the next claim takes the key over.
    let next = acquired(engine.claim(&key, &ClaimOptions::default()).unwrap());
    assert_eq!(next.attempt(), 2);
    assert!(next.token() > token);
    drop(leases);
}

#[test]
fn run_reports_a_queue_that_stayed_full_for_the_whole_lease() {
    let clock = MockClock::new();
    let (engine, backend) = sixteen_place_engine(&clock);
    let o = ClaimOptions::default();
    let gate = backend.close_gate();
    let first = acquired(engine.claim(b"first", &o).unwrap());
    common::wait_sync_held(&backend);
    // The run's claim takes one place; its handler waits until the queue is full.
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (tx, rx) = mpsc::channel();
    let runner = engine.clone();
    std::thread::spawn(move || {
        let r = runner.run(b"r", &ClaimOptions::default(), |_| {
            go_rx.recv().unwrap();
            Ok::<_, ()>(b"done".to_vec())
        });
        tx.send(r).unwrap();
    });
    wait_until("the run's claim", || engine.stats().inflight == 2);
    let mut held = Vec::new();
    for i in 0..12u32 {
        held.push(acquired(engine.claim(&i.to_be_bytes(), &o).unwrap()));
    }
    for _ in 0..3 {
        held.pop().unwrap().complete(b"x").unwrap();
    }
    assert_eq!(engine.stats().queue_depth, 16);
    go_tx.send(()).unwrap();
    wait_until("the run to wait for room", || engine.stats().overloaded > 0);
    assert!(rx.try_recv().is_err());
    clock.advance(LEASE);
    match rx.recv_timeout(HANG).expect("the run returned") {
        Err(RunError::NotStored {
            reason: NotStoredReason::QueueFull,
            retry_after: Duration::ZERO,
            ..
        }) => {}
        other => panic!("expected NotStored(QueueFull), got {other:?}"),
    }
    assert!(matches!(
        engine.get(b"r").unwrap(),
        Some(KeyState::InFlight { attempt: 1, .. })
    ));
    drop(gate);
    drop((first, held));
}
