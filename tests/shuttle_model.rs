//! Model checking under shuttle (feature `shuttle`):
//! `cargo test --features shuttle --test shuttle_model`.
//!
//! - `concurrent_claims` inside `cargo test`: random scripts and schedules (arbtest), and the
//!   committed corpus replayed.
//! - The claim critical section of the real engine (`Durability::None`, every lock and atomic
//!   a shuttle one): one winner among racing claims, and waiters that all get the winner's
//!   bytes, under PCT and random schedules.
//! - The acknowledge-after-commit handoff, as a standalone model of the protocol (the real
//!   writer thread blocks on crossbeam, which shuttle cannot schedule): a caller queues its
//!   operation under the key's lock, the writer commits, publishes under the lock, then
//!   acknowledges. Checked: an acknowledged write is durable (invariant 4) and no caller is
//!   shown a completion that is not durable (invariant 5); and two broken orders of the same
//!   protocol are shown to be caught.
#![cfg(feature = "shuttle")]

use arbtest::arbitrary::Unstructured;
use idemkv::testkit::concurrent::{check_under_shuttle, Scenario};
use idemkv::testkit::Bug;
use idemkv::{Claim, ClaimOptions, Durability, Engine};
use std::path::Path;
use std::time::Duration;

#[test]
fn concurrent_claims_random_scripts_and_schedules() {
    arbtest::arbtest(|u| {
        let scenario = Scenario::from_bytes(u)?;
        let schedule = u.bytes(u.len())?;
        if let Err(why) = check_under_shuttle(&scenario, schedule, Bug::None) {
            panic!("{why}\nscenario: {scenario:?}");
        }
        Ok(())
    })
    .size_max(2048)
    .budget_ms(5_000);
}

#[test]
fn concurrent_claims_corpus_replays_clean() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/concurrent_claims");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let bytes = std::fs::read(e.path()).expect("read corpus file");
        let mut u = Unstructured::new(&bytes);
        let Ok(scenario) = Scenario::from_bytes(&mut u) else {
            continue;
        };
        if let Err(why) = check_under_shuttle(&scenario, u.take_rest(), Bug::None) {
            panic!("{}: {why}", e.path().display());
        }
    }
}

fn engine() -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .stripes(1)
        .sweep_interval(None)
        .open()
        .expect("open")
}

/// Three racing claims of one key: exactly one acquires; the others see it in progress.
fn one_winner() {
    let engine = engine();
    let opts = ClaimOptions::default().lease(Duration::from_secs(60));
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let (engine, opts) = (engine.clone(), opts.clone());
            shuttle::thread::spawn(move || match engine.claim(b"k", &opts).expect("claim") {
                Claim::Acquired(lease) => {
                    let token = lease.token();
                    std::mem::forget(lease);
                    Some(token)
                }
                Claim::InProgress(_) => None,
                Claim::Completed(s) => panic!("nothing completed the key: {s:?}"),
            })
        })
        .collect();
    let winners: Vec<u64> = handles
        .into_iter()
        .filter_map(|h| h.join().expect("join"))
        .collect();
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
}

#[test]
fn claim_critical_section_one_winner_pct() {
    shuttle::check_pct(one_winner, 2_000, 3);
}

#[test]
fn claim_critical_section_one_winner_random() {
    shuttle::check_random(one_winner, 2_000);
}

#[test]
fn claim_critical_section_check_then_act_is_caught() {
    let caught = std::panic::catch_unwind(|| {
        shuttle::check_random(
            || {
                let engine = engine();
                engine.sabotage(Bug::CheckThenAct);
                let handles: Vec<_> = (0..2)
                    .map(|_| {
                        let engine = engine.clone();
                        shuttle::thread::spawn(move || {
                            let opts = ClaimOptions::default().lease(Duration::from_secs(60));
                            match engine.claim(b"k", &opts).expect("claim") {
                                Claim::Acquired(lease) => {
                                    std::mem::forget(lease);
                                    1
                                }
                                _ => 0,
                            }
                        })
                    })
                    .collect();
                let winners: usize = handles.into_iter().map(|h| h.join().expect("join")).sum();
                assert_eq!(winners, 1, "two winners");
            },
            2_000,
        )
    });
    assert!(caught.is_err(), "check-then-act went unnoticed");
}

/// Losers that wait get the winner's bytes (indistinguishable losers), and the handler
/// runs once.
fn waiters_get_the_winners_bytes() {
    let engine = engine();
    let runs = std::sync::Arc::new(shuttle::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..3u8)
        .map(|i| {
            let (engine, runs) = (engine.clone(), runs.clone());
            shuttle::thread::spawn(move || {
                let opts = ClaimOptions::default().wait(Duration::from_secs(3600));
                let out = engine
                    .run(b"k", &opts, |_| {
                        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        Ok::<_, String>(vec![i; 4])
                    })
                    .expect("run");
                (out.response().to_vec(), out.replayed())
            })
        })
        .collect();
    let outs: Vec<(Vec<u8>, bool)> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(outs.iter().all(|(r, _)| *r == outs[0].0), "{outs:?}");
    assert_eq!(
        outs.iter().filter(|(_, replayed)| !replayed).count(),
        1,
        "{outs:?}"
    );
}

#[test]
fn claim_or_wait_losers_get_the_winners_bytes_pct() {
    shuttle::check_pct(waiters_get_the_winners_bytes, 1_000, 3);
}

#[test]
fn claim_or_wait_losers_get_the_winners_bytes_random() {
    shuttle::check_random(waiters_get_the_winners_bytes, 1_000);
}

// ---------------------------------------------------------------------------------------
// The acknowledge-after-commit handoff, as a model of the protocol.
// ---------------------------------------------------------------------------------------

mod handoff {
    use shuttle::sync::mpsc::{channel, Receiver, Sender};
    use shuttle::sync::{Arc, Condvar, Mutex};

    /// Which order the writer uses; only `Correct` is the engine's.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Order {
        /// Commit, then publish under the lock, then acknowledge (the engine).
        Correct,
        /// Publish before the commit is durable (breaks invariant 5).
        PublishBeforeCommit,
        /// Acknowledge before the commit is durable (breaks invariant 4).
        AckBeforeCommit,
    }

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Slot {
        InFlight(u64),
        Completed {
            token: u64,
            response: u8,
            published: bool,
        },
    }

    struct Op {
        token: u64,
        response: u8,
        ack: Sender<()>,
    }

    struct Model {
        slot: Mutex<Slot>,
        changed: Condvar,
        /// What a crash now would keep: the committed (token, response) records.
        durable: Mutex<Vec<(u64, u8)>>,
    }

    fn writer(m: Arc<Model>, rx: Receiver<Op>, order: Order) {
        while let Ok(first) = rx.recv() {
            // Group commit: take everything queued.
            let mut batch = vec![first];
            while let Ok(op) = rx.try_recv() {
                batch.push(op);
            }
            let publish = |m: &Model, batch: &[Op]| {
                for op in batch {
                    let mut slot = m.slot.lock().unwrap();
                    if let Slot::Completed {
                        token, published, ..
                    } = &mut *slot
                    {
                        if *token == op.token {
                            *published = true;
                        }
                    }
                    drop(slot);
                    m.changed.notify_all();
                }
            };
            if order == Order::PublishBeforeCommit {
                publish(&m, &batch);
            }
            if order == Order::AckBeforeCommit {
                for op in &batch {
                    let _ = op.ack.send(());
                }
            }
            {
                let mut durable = m.durable.lock().unwrap();
                for op in &batch {
                    durable.push((op.token, op.response));
                }
            }
            if order != Order::PublishBeforeCommit {
                publish(&m, &batch);
            }
            if order != Order::AckBeforeCommit {
                for op in &batch {
                    let _ = op.ack.send(());
                }
            }
        }
    }

    /// One holder completes `token` with `response` while two callers wait for the key.
    pub fn run(order: Order) {
        let m = Arc::new(Model {
            slot: Mutex::new(Slot::InFlight(7)),
            changed: Condvar::new(),
            durable: Mutex::new(Vec::new()),
        });
        let (tx, rx) = channel::<Op>();
        let w = {
            let m = m.clone();
            shuttle::thread::spawn(move || writer(m, rx, order))
        };
        let holder = {
            let m = m.clone();
            shuttle::thread::spawn(move || {
                let (ack, acked) = channel();
                {
                    // Under the key's lock: change the state and queue the write, in one step.
                    let mut slot = m.slot.lock().unwrap();
                    assert_eq!(*slot, Slot::InFlight(7));
                    *slot = Slot::Completed {
                        token: 7,
                        response: 42,
                        published: false,
                    };
                    tx.send(Op {
                        token: 7,
                        response: 42,
                        ack,
                    })
                    .unwrap();
                }
                acked.recv().unwrap();
                // Invariant 4: an acknowledged completion survives a crash now.
                assert!(
                    m.durable.lock().unwrap().contains(&(7, 42)),
                    "acknowledged before it was durable"
                );
            })
        };
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                shuttle::thread::spawn(move || {
                    let mut slot = m.slot.lock().unwrap();
                    loop {
                        match &*slot {
                            Slot::Completed {
                                token,
                                response,
                                published: true,
                            } => {
                                // Invariant 5: what a caller is shown survives a crash now.
                                assert!(
                                    m.durable.lock().unwrap().contains(&(*token, *response)),
                                    "replayed a completion that a crash could still erase"
                                );
                                return *response;
                            }
                            _ => slot = m.changed.wait(slot).unwrap(),
                        }
                    }
                })
            })
            .collect();
        holder.join().unwrap();
        for h in waiters {
            assert_eq!(h.join().unwrap(), 42);
        }
        drop(m.slot.lock().unwrap());
        // The holder's sender is gone: the writer ends.
        w.join().unwrap();
    }
}

#[test]
fn handoff_acknowledges_after_commit_and_publishes_only_durable_completions() {
    shuttle::check_pct(|| handoff::run(handoff::Order::Correct), 3_000, 3);
    shuttle::check_random(|| handoff::run(handoff::Order::Correct), 3_000);
}

#[test]
fn handoff_model_catches_publish_before_commit() {
    let r = std::panic::catch_unwind(|| {
        shuttle::check_random(|| handoff::run(handoff::Order::PublishBeforeCommit), 3_000)
    });
    assert!(r.is_err(), "publishing before the commit went unnoticed");
}

#[test]
fn handoff_model_catches_ack_before_commit() {
    let r = std::panic::catch_unwind(|| {
        shuttle::check_random(|| handoff::run(handoff::Order::AckBeforeCommit), 3_000)
    });
    assert!(r.is_err(), "acknowledging before the commit went unnoticed");
}
