//! A durable completion is published by the writer's durability watermark: hidden from
//! other callers until then, shown to them from then on, and its response leaves memory
//! once the file holds it, whether or not anyone calls on its key again.

use idemkv::*;
use std::time::Duration;

const KEYS: usize = 256;
const RESPONSE_BYTES: usize = 8 * 1024;

fn durable_configurations() -> Vec<(&'static str, EngineBuilder)> {
    let buffered = Durability::Buffered {
        max_delay: Duration::from_millis(1),
    };
    vec![
        // Made durable by the commit log, then applied to the file by the applier.
        (
            "Immediate",
            Engine::builder().durability(Durability::Immediate),
        ),
        ("Buffered", Engine::builder().durability(buffered)),
    ]
}

#[test]
fn a_committed_completions_response_leaves_memory_without_another_call_on_its_key() {
    for (name, builder) in durable_configurations() {
        let dir = tempfile::tempdir().unwrap();
        let engine = builder
            .path(dir.path().join("p.redb"))
            .clock(MockClock::new())
            .tuning(idemkv::Tuning::default().sweep_interval(None))
            .open()
            .unwrap();
        let opts = ClaimOptions::default();
        let empty = engine.stats().index_bytes;
        for i in 0..KEYS {
            let key = format!("key-{i}");
            let Claim::Acquired(lease) = engine.claim(key.as_bytes(), &opts).unwrap() else {
                panic!("{name}: a fresh key is acquired");
            };
            lease.complete(&vec![i as u8; RESPONSE_BYTES]).unwrap();
        }
        // With the commit log a flush returns once the log holds the batch, which then goes
        // on to the file; the writer applies it before it commits the next flush.
        engine.flush().unwrap();
        engine.flush().unwrap();
        // Every key keeps its slot; no response stays beside one.
        let held = engine.stats().index_bytes - empty;
        assert!(
            held < (KEYS * RESPONSE_BYTES / 8) as u64,
            "{name}: {held} bytes held for {KEYS} committed completions"
        );
        // And each is replayed from the file.
        for i in [0, KEYS / 2, KEYS - 1] {
            match engine.claim(format!("key-{i}").as_bytes(), &opts).unwrap() {
                Claim::Completed(stored) => {
                    assert_eq!(stored.response(), &vec![i as u8; RESPONSE_BYTES][..])
                }
                other => panic!("{name}: key {i} is {other:?}"),
            }
        }
        engine.close().unwrap();
    }
}

/// Holds the writer after the commit of a completion, before its watermark moves: other
/// callers, blocked and async, still see the key as being completed; once the watermark
/// moves they all get the response.
#[cfg(idemkv_sabotage)]
#[test]
fn a_completion_is_hidden_until_its_watermark_moves_and_then_wakes_every_waiter() {
    let buffered = Durability::Buffered {
        max_delay: Duration::from_millis(1),
    };
    for mode in [Durability::Immediate, buffered] {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::builder()
            .path(dir.path().join("p.redb"))
            .durability(mode)
            .clock(MockClock::new())
            .tuning(idemkv::Tuning::default().sweep_interval(None))
            .open()
            .unwrap();
        let opts = ClaimOptions::default();
        let Claim::Acquired(lease) = engine.claim(b"k", &opts).unwrap() else {
            panic!("{mode:?}: a fresh key is acquired");
        };
        engine.flush().unwrap();
        let waits = engine.stats().waits;
        let blocked = {
            let engine = engine.clone();
            std::thread::spawn(move || engine.claim_or_wait(b"k", &ClaimOptions::default()))
        };
        let future = {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(engine.claim_or_wait_async(b"k", &ClaimOptions::default()))
            })
        };
        // Both waiters are asleep on the InFlight key.
        while engine.stats().waits < waits + 2 {
            std::thread::yield_now();
        }

        let held = engine.hold_after_commits();
        let completer = std::thread::spawn(move || lease.complete(b"done"));
        assert!(held.wait_until_held(Duration::from_secs(30)));
        // Committed, but its watermark has not moved: not shown to anyone yet.
        match engine.claim(b"k", &opts).unwrap() {
            Claim::InProgress(_) => {}
            other => panic!("{mode:?}: a completion was shown before its watermark: {other:?}"),
        }
        assert!(!blocked.is_finished() && !future.is_finished());

        drop(held);
        completer.join().unwrap().unwrap();
        for waiter in [blocked, future] {
            match waiter.join().unwrap().unwrap() {
                Claim::Completed(stored) => assert_eq!(stored.response(), b"done"),
                other => panic!("{mode:?}: a waiter got {other:?}"),
            }
        }
        match engine.claim(b"k", &opts).unwrap() {
            Claim::Completed(stored) => assert_eq!(stored.response(), b"done"),
            other => panic!("{mode:?}: {other:?}"),
        }
        engine.close().unwrap();
    }
}
