//! The engine's lifecycle under concurrency: a close during a sweep, a poison that lands
//! between a claim's first check and its transition, and a builder whose backend was
//! already used. (A panic on the writer thread: `writer_panic.rs`.)
//!
//! The interleavings are made deterministic with [`PausingClock`]: the engine reads its
//! clock under the stripe lock in every transition, so pausing one thread's next clock read
//! stops it at a known point (inside the lock, after its checks at entry) while the test
//! makes the other side happen.

use common::{acquired, wait_until};
use idemkv::error::FlushError;
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::*;
use idemkv_check::backend as common;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

/// Real-time bound for another thread to answer: a hang detector, never a pace.
const HANG: Duration = Duration::from_secs(20);

#[derive(Debug, Default)]
struct PauseState {
    /// The thread whose next monotonic reading pauses.
    armed_for: Option<ThreadId>,
    paused: bool,
    resume: bool,
}

/// A [`MockClock`] that can stop one chosen thread at its next monotonic reading until the
/// test resumes it.
#[derive(Debug, Clone, Default)]
struct PausingClock {
    time: MockClock,
    state: Arc<(Mutex<PauseState>, Condvar)>,
}

impl PausingClock {
    fn new() -> Self {
        Self {
            time: MockClock::new(),
            state: Arc::default(),
        }
    }

    fn arm(&self, thread: ThreadId) {
        self.state.0.lock().unwrap().armed_for = Some(thread);
    }

    /// Waits (bounded) until the armed thread is paused.
    fn wait_paused(&self) {
        let (lock, cond) = &*self.state;
        let (state, timeout) = cond
            .wait_timeout_while(lock.lock().unwrap(), HANG, |s| !s.paused)
            .unwrap();
        assert!(
            !timeout.timed_out(),
            "the armed thread never read the clock"
        );
        drop(state);
    }

    fn resume(&self) {
        let (lock, cond) = &*self.state;
        lock.lock().unwrap().resume = true;
        cond.notify_all();
    }
}

impl Clock for PausingClock {
    fn monotonic(&self) -> Duration {
        let (lock, cond) = &*self.state;
        let mut s = lock.lock().unwrap();
        if s.armed_for == Some(std::thread::current().id()) {
            s.armed_for = None;
            s.paused = true;
            cond.notify_all();
            s = cond.wait_while(s, |s| !s.resume).unwrap();
            s.paused = false;
            s.resume = false;
        }
        drop(s);
        self.time.monotonic()
    }

    fn wall(&self) -> std::time::SystemTime {
        self.time.wall()
    }

    fn mock_clock(&self) -> Option<&MockClock> {
        Some(&self.time)
    }
}

/// Runs `f` on a new thread that first pauses at its next clock reading; returns the
/// receiver of `f`'s result once the thread is paused.
fn paused<T: Send + 'static>(
    clock: &PausingClock,
    f: impl FnOnce() -> T + Send + 'static,
) -> mpsc::Receiver<T> {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        go_rx.recv().unwrap();
        let _ = tx.send(f());
    });
    clock.arm(t.thread().id());
    go_tx.send(()).unwrap();
    clock.wait_paused();
    rx
}

/// One stripe (so the paused thread holds the only stripe lock), a `Buffered` engine on a
/// memory backend, no background sweeper, 1 s retention.
fn builder(clock: &PausingClock, backend: &FaultyStorage) -> EngineBuilder {
    Engine::builder()
        .backend(backend.clone())
        .durability(Durability::buffered())
        .clock(clock.clone())
        .tuning(idemkv::Tuning::default().stripes(1).sweep_interval(None))
        .retention(Duration::from_secs(1))
}

/// Completes `n` keys, makes them durable, and lets their retention run out.
fn expired_keys(engine: &Engine, clock: &PausingClock, n: u32) {
    for i in 0..n {
        let key = format!("old-{i}");
        acquired(
            engine
                .claim(key.as_bytes(), &ClaimOptions::default())
                .unwrap(),
        )
        .complete(b"v")
        .unwrap();
    }
    engine.flush().unwrap();
    clock.time.advance(Duration::from_secs(2));
}

/// Starts `close` on another thread and waits until it has begun (the engine refuses new
/// work); it then waits for the paused thread's stripe lock.
fn closing(engine: &Engine) -> mpsc::Receiver<Result<(), FlushError>> {
    let (tx, rx) = mpsc::channel();
    let e = engine.clone();
    std::thread::spawn(move || {
        let _ = tx.send(e.close());
    });
    wait_until("close to begin", || {
        engine.flush() == Err(FlushError::Closed)
    });
    rx
}

#[test]
fn sweep_now_returns_when_close_runs_concurrently() {
    let clock = PausingClock::new();
    let backend = FaultyStorage::memory();
    let engine = builder(&clock, &backend).open().unwrap();
    expired_keys(&engine, &clock, 20);
    // The sweep stops inside its pass, holding the stripe with expired keys in it.
    let e = engine.clone();
    let sweep = paused(&clock, move || e.admin().sweep_now());
    let close = closing(&engine);
    clock.resume();
    // Every deletion it tries now is refused: it must stop, not spin.
    assert_eq!(
        sweep.recv_timeout(HANG).expect("sweep_now returned"),
        Err(ClaimError::Closed)
    );
    assert_eq!(close.recv_timeout(HANG).expect("close returned"), Ok(()));
}

#[test]
fn a_claim_at_the_key_budget_returns_when_close_runs_concurrently() {
    let clock = PausingClock::new();
    let backend = FaultyStorage::memory();
    let engine = builder(&clock, &backend).keys_max(4).open().unwrap();
    expired_keys(&engine, &clock, 4);
    // The claim of a new key passed its entry checks and stops inside the transition; the
    // budget is full of expired keys, so it will have to sweep (`NeedRoom`).
    let e = engine.clone();
    let claim = paused(&clock, move || {
        e.claim(b"new", &ClaimOptions::default()).map(|_| ())
    });
    let close = closing(&engine);
    clock.resume();
    assert_eq!(
        claim.recv_timeout(HANG).expect("the claim returned"),
        Err(ClaimError::Closed)
    );
    assert_eq!(close.recv_timeout(HANG).expect("close returned"), Ok(()));
}

#[test]
fn a_buffered_claim_that_passed_its_checks_before_a_poison_is_refused() {
    let clock = PausingClock::new();
    let backend = FaultyStorage::memory();
    let engine = builder(&clock, &backend)
        .response_len_max(1)
        .open()
        .unwrap();
    engine.flush().unwrap();
    // The writer commits one claim and is held in its fsync.
    let gate = backend.close_gate();
    let held = acquired(engine.claim(b"x", &ClaimOptions::default()).unwrap());
    common::wait_sync_held(&backend);
    // A claim passes `check_open` and stops inside its transition, under the stripe lock.
    let e = engine.clone();
    let claim = paused(&clock, move || {
        e.claim(b"k", &ClaimOptions::default()).map(|_| ())
    });
    // The held fsync fails: the engine is poisoned (its writer then waits for the stripe
    // lock to wake waiters).
    backend.fail_all(true);
    drop(gate);
    // Observe the poison without taking a stripe lock: the key and size checks come first.
    wait_until("the poison", || {
        matches!(
            engine.complete(b"probe", 1, b"too long"),
            Err(LeaseError::Poisoned(_))
        )
    });
    clock.resume();
    match claim.recv_timeout(HANG).expect("the claim returned") {
        Err(ClaimError::Poisoned(_)) => {}
        other => panic!("a claim decided after the poison was acknowledged: {other:?}"),
    }
    drop(held);
}

#[test]
fn a_cloned_builder_cannot_open_its_backend_twice() {
    // The placeholder path a backend engine uses in messages; it must never become a file.
    let stray = std::path::Path::new("<backend>");
    let _ = std::fs::remove_file(stray);
    let builder = Engine::builder()
        .backend(FaultyStorage::memory())
        .clock(MockClock::new())
        .tuning(idemkv::Tuning::default().sweep_interval(None));
    let first = builder.clone().open().unwrap();
    let second = builder.open();
    let created = stray.exists();
    let _ = std::fs::remove_file(stray);
    match second {
        Err(OpenError::InvalidConfig { detail }) => assert!(detail.contains("backend")),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    assert!(!created, "the second open created a file named <backend>");
    // The first engine is unaffected.
    acquired(first.claim(b"k", &ClaimOptions::default()).unwrap())
        .complete(b"v")
        .unwrap();
}
