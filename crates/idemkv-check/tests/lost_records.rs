//! A storage inconsistency must end in `Corrupted`, never in a retry loop: when the index
//! names a published completion whose record the file no longer holds, every replay path
//! (`claim`, `claim_or_wait`, `run`, `get`) refuses at once and counts it, because no retry
//! could ever read the record. The record is lost through the engine's test hook, so this
//! file is built only with `--cfg idemkv_sabotage` (docs/testing.md).
#![cfg(idemkv_sabotage)]

use common::acquired;
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::*;
use idemkv_check::backend as common;
use std::sync::mpsc;
use std::time::Duration;

/// Real-time bound for the calls to answer: a hang detector, never a pace.
const HANG: Duration = Duration::from_secs(20);

#[track_caller]
fn corrupted<T: std::fmt::Debug>(r: Result<T, ClaimError>) {
    match r {
        Err(ClaimError::Corrupted(why)) => assert!(why.contains("missing"), "{why}"),
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn a_record_the_file_lost_is_refused_as_corrupted_by_every_replay() {
    for mode in [Durability::buffered(), Durability::Immediate] {
        let engine = Engine::builder()
            .backend(FaultyStorage::memory())
            .durability(mode)
            .clock(MockClock::new())
            .tuning(idemkv::Tuning::default().sweep_interval(None))
            .open()
            .unwrap();
        let o = ClaimOptions::default().wait(Duration::from_secs(3600));
        acquired(engine.claim(b"k", &o).unwrap())
            .complete(b"v")
            .unwrap();
        engine.flush().unwrap();
        assert_eq!(engine.lose_record(b"k"), Ok(true));

        // On another thread: a call that retries forever is caught by the bound below.
        let (tx, rx) = mpsc::channel();
        let (e, o2) = (engine.clone(), o.clone());
        std::thread::spawn(move || {
            let o = o2;
            corrupted(e.claim(b"k", &o));
            corrupted(e.claim_or_wait(b"k", &o));
            corrupted(e.get(b"k"));
            let mut ran = false;
            match e.run(b"k", &o, |_| {
                ran = true;
                Ok::<_, ()>(b"again".to_vec())
            }) {
                Err(RunError::Claim(err)) => corrupted(Err::<(), _>(err)),
                other => panic!("expected Corrupted, got {other:?}"),
            }
            assert!(!ran, "the side effect ran again");
            let _ = tx.send(());
        });
        rx.recv_timeout(HANG)
            .unwrap_or_else(|_| panic!("{mode:?}: a replay of a lost record did not return"));
        assert_eq!(engine.stats().corrupt_reads, 4);
        // Nothing was acknowledged over the damaged key, and the engine still serves others.
        assert!(!engine.stats().poisoned);
        acquired(engine.claim(b"other", &o).unwrap())
            .complete(b"w")
            .unwrap();
    }
}
