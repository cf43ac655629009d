//! A panic on the writer thread, as a bug in the writer would cause, poisons the engine and
//! fails every waiter promptly. The panic is injected through the engine's test hook, so
//! this file is built only with `--cfg idemkv_sabotage` (docs/testing.md).
#![cfg(idemkv_sabotage)]

use idemkv::error::FlushError;
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::*;
use idemkv_check::backend::{acquired, wait_sync_held, wait_until};
use std::sync::mpsc;
use std::time::Duration;

/// Real-time bound for another thread to answer: a hang detector, never a pace.
const HANG: Duration = Duration::from_secs(20);

#[test]
fn a_writer_panic_poisons_the_engine_and_fails_every_waiter_promptly() {
    let clock = MockClock::new();
    let backend = FaultyStorage::memory();
    let engine = Engine::builder()
        .backend(backend.clone())
        .durability(Durability::buffered())
        .clock(clock.clone())
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .unwrap();
    let o = ClaimOptions::default().wait(Duration::from_secs(3600));
    let lease = acquired(engine.claim(b"k", &o).unwrap());
    engine.flush().unwrap();
    // Hold the writer in a commit, then queue a completion (acknowledged at once, not yet
    // published) and make callers wait on it and on a flush.
    let gate = backend.close_gate();
    let _hold = acquired(engine.claim(b"hold", &o).unwrap());
    wait_sync_held(&backend);
    lease.complete(b"v").unwrap();
    let (tx, waiter) = mpsc::channel();
    let e = engine.clone();
    let opts = o.clone();
    std::thread::spawn(move || {
        let _ = tx.send(e.claim_or_wait(b"k", &opts).map(|_| ()));
    });
    wait_until("the waiter to wait", || engine.stats().waits > 0);
    let (tx, flusher) = mpsc::channel();
    let e = engine.clone();
    std::thread::spawn(move || {
        let _ = tx.send(e.flush());
    });
    // Queued behind the held commit: the completion and the flush's barrier.
    wait_until("the flush to be queued", || engine.stats().queue_depth == 2);

    engine.panic_writer_at_next_batch();
    drop(gate); // the held commit ends; the next batch panics
    match waiter.recv_timeout(HANG).expect("the waiter returned") {
        Err(ClaimError::OutcomeUnknown(_)) => {}
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    assert!(matches!(
        flusher.recv_timeout(HANG).expect("the flush returned"),
        Err(FlushError::Poisoned(_))
    ));
    assert!(engine.stats().poisoned);
    assert!(matches!(
        engine.claim(b"other", &o),
        Err(ClaimError::Poisoned(_))
    ));
    assert!(matches!(engine.close(), Err(FlushError::Poisoned(_))));
}
