//! Model checking under shuttle, built only with `--cfg shuttle --cfg idemkv_sabotage` (the
//! real-writer checks read the file through the engine's test hooks; docs/testing.md):
//! `RUSTFLAGS="--cfg shuttle --cfg idemkv_sabotage" CARGO_TARGET_DIR=target/shuttle
//! cargo test -p idemkv-check --test shuttle_model`.
//!
//! - `concurrent_claims` inside `cargo test`: random scripts and schedules (arbtest), and the
//!   committed corpus replayed.
//! - The claim critical section of the real engine (`Durability::None`, every lock and atomic
//!   a shuttle one): one winner among racing claims, and waiters that all get the winner's
//!   bytes, under PCT and random schedules; a failed attempt (the fail choice of `run`) is
//!   taken over by one waiter, woken by the fail, which resumes from its checkpoint.
//! - The real writer (`src/runtime/writer.rs`: gather, commit, publish, acknowledge) of an engine on
//!   a simulated disk, its thread, queue and acknowledgements all shuttle's (`src/base/sync.rs`),
//!   redb running on memory: three `run` callers and a `get` caller of one key, under PCT
//!   and random schedules from fixed seeds. Checked: an acknowledged write is committed
//!   (invariant 4), no caller is shown a completion that is not committed (invariant 5),
//!   one handler run and the same bytes for all; and the writer sabotaged to acknowledge or
//!   to publish before its commit returns is shown to be caught. (This replaces a separate
//!   model of the protocol, which a regression in the real writer could not fail.)
#![cfg(all(shuttle, idemkv_sabotage))]

use arbtest::arbitrary::Unstructured;
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::sabotage::CommittedRecord;
use idemkv::{Claim, ClaimOptions, Durability, Engine, KeyState, OnHandlerError, RunError};
use idemkv_check::concurrent::{check_under_shuttle, Scenario};
use idemkv_check::{faults, sabotage, Bug};
use shuttle::scheduler::{PctScheduler, RandomScheduler};
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

/// Inputs of the committed corpus the replay must run, at least: about nine tenths of the
/// 66 files `fuzz/corpus/concurrent_claims` holds, so that a corpus that went missing or
/// stopped decoding fails the test instead of passing it empty.
const CORPUS_REPLAYED_MIN: usize = 60;

#[test]
fn concurrent_claims_corpus_replays_clean() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/concurrent_claims");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let (mut replayed, mut undecodable) = (0, Vec::new());
    for e in entries {
        let path = e.expect("corpus entry").path();
        let bytes = std::fs::read(&path).expect("read corpus file");
        // Decoded as the fuzz target decodes it (which skips what does not decode).
        let mut u = Unstructured::new(&bytes);
        let Ok(scenario) = Scenario::from_bytes(&mut u) else {
            undecodable.push(path);
            continue;
        };
        if let Err(why) = check_under_shuttle(&scenario, u.take_rest(), Bug::None) {
            panic!("{}: {why}", path.display());
        }
        replayed += 1;
    }
    assert!(
        replayed >= CORPUS_REPLAYED_MIN,
        "{}: {replayed} inputs replayed, at least {CORPUS_REPLAYED_MIN} expected; \
         undecodable: {undecodable:?}",
        dir.display()
    );
}

fn engine() -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .tuning(idemkv::Tuning::default().stripes(1).sweep_interval(None))
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
                    lease.detach();
                    Some(token)
                }
                Claim::InProgress(_) => None,
                Claim::Completed(s) => panic!("nothing completed the key: {s:?}"),
                Claim::Forgotten(f) => panic!("nothing completed the key: {f:?}"),
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
                sabotage(&engine, Bug::CheckThenAct);
                let handles: Vec<_> = (0..2)
                    .map(|_| {
                        let engine = engine.clone();
                        shuttle::thread::spawn(move || {
                            let opts = ClaimOptions::default().lease(Duration::from_secs(60));
                            match engine.claim(b"k", &opts).expect("claim") {
                                Claim::Acquired(lease) => {
                                    lease.detach();
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
/// runs once. With `asynk`, through `run_async`, each caller on a shuttle thread driving
/// its future with `shuttle::future::block_on`: woken through the stripe's change signal and
/// the futures' wakers, never by a timer (shuttle has no time).
fn waiters_get_the_winners_bytes(asynk: bool) {
    let engine = engine();
    let runs = std::sync::Arc::new(shuttle::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..3u8)
        .map(|i| {
            let (engine, runs) = (engine.clone(), runs.clone());
            shuttle::thread::spawn(move || {
                let opts = ClaimOptions::default().wait(Duration::from_secs(3600));
                let handler = || {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, String>(vec![i; 4])
                };
                let out = if asynk {
                    shuttle::future::block_on(engine.run_async(b"k", &opts, |_| {
                        let out = handler();
                        async move { out }
                    }))
                } else {
                    engine.run(b"k", &opts, |_| handler())
                }
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
fn async_losers_get_the_winners_bytes_pct() {
    shuttle::check_pct(|| waiters_get_the_winners_bytes(true), 1_000, 3);
}

#[test]
fn async_losers_get_the_winners_bytes_random() {
    shuttle::check_random(|| waiters_get_the_winners_bytes(true), 1_000);
}

#[test]
fn claim_or_wait_losers_get_the_winners_bytes_pct() {
    shuttle::check_pct(|| waiters_get_the_winners_bytes(false), 1_000, 3);
}

#[test]
fn claim_or_wait_losers_get_the_winners_bytes_random() {
    shuttle::check_random(|| waiters_get_the_winners_bytes(false), 1_000);
}

/// What a `run` caller got: the bytes and whether they were replayed, or the error.
type RunAnswer = Result<(Vec<u8>, bool), RunError<String>>;

/// A failed attempt against racing callers: three `run` callers of one key with the fail
/// choice; the first attempt saves a checkpoint and fails. On every schedule the handler runs
/// twice (the failed attempt, then a takeover that resumes from its checkpoint), every
/// other caller gets the second attempt's bytes, and nobody waits forever: shuttle has no
/// time, so a waiter can only take the key over because the fail woke it.
fn a_failed_attempt_is_resumed_by_a_waiter(asynk: bool) {
    let engine = engine();
    let runs = std::sync::Arc::new(shuttle::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..3u8)
        .map(|_| {
            let (engine, runs) = (engine.clone(), runs.clone());
            shuttle::thread::spawn(move || {
                let opts = ClaimOptions::default()
                    .wait(Duration::from_secs(3600))
                    .on_handler_error(OnHandlerError::Fail);
                let step = |attempt: u32, checkpoint: Option<Vec<u8>>| {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if attempt == 1 {
                        return Err("the first attempt fails".to_string());
                    }
                    assert_eq!(checkpoint.as_deref(), Some(&b"step 1"[..]));
                    Ok(format!("done by attempt {attempt}").into_bytes())
                };
                if asynk {
                    shuttle::future::block_on(engine.run_async(b"k", &opts, |lease| async move {
                        if lease.attempt() == 1 {
                            lease
                                .set_checkpoint(1, b"step 1")
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                        step(
                            lease.attempt(),
                            lease.checkpoint().map(|c| c.data().to_vec()),
                        )
                    }))
                } else {
                    engine.run(b"k", &opts, |lease| {
                        if lease.attempt() == 1 {
                            engine
                                .checkpoint(lease.key(), lease.token(), 1, b"step 1")
                                .map_err(|e| e.to_string())?;
                        }
                        step(
                            lease.attempt(),
                            lease.checkpoint().map(|c| c.data().to_vec()),
                        )
                    })
                }
                .map(|out| (out.response().to_vec(), out.replayed()))
            })
        })
        .collect();
    let outs: Vec<RunAnswer> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "{outs:?}"
    );
    let ok: Vec<&(Vec<u8>, bool)> = outs.iter().filter_map(|o| o.as_ref().ok()).collect();
    assert_eq!(ok.len(), 2, "{outs:?}");
    assert!(
        ok.iter().all(|(r, _)| r == b"done by attempt 2"),
        "{outs:?}"
    );
    assert_eq!(ok.iter().filter(|(_, replayed)| !replayed).count(), 1);
}

#[test]
fn a_failed_attempt_is_resumed_by_a_waiter_pct() {
    shuttle::check_pct(|| a_failed_attempt_is_resumed_by_a_waiter(false), 1_000, 3);
}

#[test]
fn a_failed_attempt_is_resumed_by_a_waiter_random() {
    shuttle::check_random(|| a_failed_attempt_is_resumed_by_a_waiter(false), 1_000);
}

#[test]
fn a_failed_async_attempt_is_resumed_by_a_waiter_pct() {
    shuttle::check_pct(|| a_failed_attempt_is_resumed_by_a_waiter(true), 1_000, 3);
}

// ---------------------------------------------------------------------------------------
// The real writer (src/runtime/writer.rs) under the scheduler: gather, commit, publish, acknowledge.
// ---------------------------------------------------------------------------------------

/// An engine on a simulated disk: redb runs on memory, its I/O is synchronous, so each
/// redb call is one step of the model; the writer thread, its queue and the acknowledgement
/// channels are shuttle's. (Under `Buffered` the writer's wait for more operations is
/// modelled as a delay that has already passed.)
fn durable_engine(setup: faults::Mode, bug: Bug) -> Engine {
    let engine = Engine::builder()
        .path("shuttle.redb")
        .backend(FaultyStorage::memory())
        .durability(setup.durability)
        .tuning(idemkv::Tuning::default().stripes(1).sweep_interval(None))
        .open()
        .expect("open");
    sabotage(&engine, bug);
    engine
}

/// The committed record under `token`, which a crash now would keep.
fn committed(engine: &Engine, token: u64) -> Option<CommittedRecord> {
    engine.committed_record(token).expect("read the file")
}

/// Three `run` callers of one key on the real writer, and a fourth caller that looks at
/// the key with `get`. Checked at every schedule:
/// - `Immediate`: an acknowledged claim is committed when the handler starts, and an
///   acknowledged completion is committed when `run` returns it (invariant 4);
/// - a caller is shown only a completion that is committed (invariant 5), by `run` and by
///   `get`;
/// - one handler run, every caller the same bytes, one of them not replayed.
fn real_writer_handoff(setup: faults::Mode, bug: Bug, asynk: bool) {
    let immediate = setup.durability == Durability::Immediate;
    let engine = durable_engine(setup, bug);
    let runs = std::sync::Arc::new(shuttle::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..3u8)
        .map(|i| {
            let (engine, runs) = (engine.clone(), runs.clone());
            shuttle::thread::spawn(move || {
                let opts = ClaimOptions::default().wait(Duration::from_secs(3600));
                let acquired = |token: u64| {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    assert!(
                        !immediate
                            || matches!(
                                committed(&engine, token),
                                Some(CommittedRecord::InFlight { .. })
                            ),
                        "the claim of token {token} was acknowledged before it was committed"
                    );
                    Ok::<_, String>(vec![i; 4])
                };
                let out = if asynk {
                    // The same callers through the async API: its waits are futures woken
                    // by the writer's watermark and the stripe's signal.
                    shuttle::future::block_on(engine.run_async(b"k", &opts, |lease| {
                        let out = acquired(lease.token());
                        async move { out }
                    }))
                } else {
                    engine.run(b"k", &opts, |lease| acquired(lease.token()))
                }
                .unwrap_or_else(|e| panic!("run: {e}"));
                let on_file = committed(&engine, out.token());
                let expected = Some(CommittedRecord::Completed {
                    key: b"k".to_vec(),
                    response: out.response().to_vec(),
                });
                if out.replayed() {
                    assert_eq!(
                        on_file, expected,
                        "replayed a completion that is not committed"
                    );
                } else if immediate {
                    assert_eq!(
                        on_file, expected,
                        "acknowledged a completion that is not committed"
                    );
                }
                (out.response().to_vec(), out.replayed())
            })
        })
        .collect();
    let observer = {
        let engine = engine.clone();
        shuttle::thread::spawn(move || {
            for _ in 0..3 {
                match engine.get(b"k").unwrap_or_else(|e| panic!("get: {e}")) {
                    Some(KeyState::Completed {
                        token, response, ..
                    }) => assert_eq!(
                        committed(&engine, token),
                        Some(CommittedRecord::Completed {
                            key: b"k".to_vec(),
                            response: response.to_vec(),
                        }),
                        "get showed a completion that is not committed"
                    ),
                    None | Some(_) => shuttle::thread::yield_now(),
                }
            }
        })
    };
    let outs: Vec<(Vec<u8>, bool)> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    observer.join().expect("observer");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(outs.iter().all(|(r, _)| *r == outs[0].0), "{outs:?}");
    assert_eq!(
        outs.iter().filter(|(_, replayed)| !replayed).count(),
        1,
        "{outs:?}"
    );
    engine.close().expect("close");
}

/// Fixed seeds: the schedules, and so the result, are the same on every run.
const PCT_SEED: u64 = 0x1DE3_5EED;
const RANDOM_SEED: u64 = 0x5EED_1DE3;
/// Schedules tried per scheduler.
const REAL_WRITER_SCHEDULES: usize = 300;

/// Shuttle runs each thread on a stack of its own; redb's open and commit paths need more
/// than its 32 KiB default.
const REAL_WRITER_STACK_BYTES: usize = 4 << 20;

fn check_real_writer(mode: impl Into<faults::Mode>, bug: Bug) {
    check_real_writer_with(mode, bug, false);
}

fn check_real_writer_with(mode: impl Into<faults::Mode>, bug: Bug, asynk: bool) {
    let mode = mode.into();
    under_schedules(REAL_WRITER_SCHEDULES, move || {
        real_writer_handoff(mode, bug, asynk)
    });
}

/// Runs `test` under PCT (depth 3) and random schedules, `schedules` of each from the fixed
/// seeds, on stacks large enough for redb.
fn under_schedules(schedules: usize, test: impl Fn() + Send + Sync + Clone + 'static) {
    let config = || {
        let mut config = shuttle::Config::default();
        config.stack_size = REAL_WRITER_STACK_BYTES;
        config
    };
    shuttle::Runner::new(
        PctScheduler::new_from_seed(PCT_SEED, 3, schedules),
        config(),
    )
    .run(test.clone());
    shuttle::Runner::new(
        RandomScheduler::new_from_seed(RANDOM_SEED, schedules),
        config(),
    )
    .run(test);
}

fn buffered() -> Durability {
    Durability::Buffered {
        max_delay: Duration::from_millis(1),
    }
}

#[test]
fn real_writer_acknowledges_and_publishes_only_committed_writes() {
    check_real_writer(Durability::Immediate, Bug::None);
}

#[test]
fn real_writer_async_callers_are_acknowledged_and_shown_only_committed_writes() {
    for mode in [Durability::Immediate, buffered()] {
        check_real_writer_with(mode, Bug::None, true);
    }
}

#[test]
fn real_writer_model_catches_ack_before_commit_for_async_callers() {
    let caught = std::panic::catch_unwind(|| {
        check_real_writer_with(Durability::Immediate, Bug::AckBeforeCommit, true)
    })
    .is_err();
    assert!(caught, "acknowledging before the commit went unnoticed");
}

#[test]
fn real_writer_buffered_publishes_only_committed_writes() {
    check_real_writer(buffered(), Bug::None);
}

fn caught(mode: Durability, bug: Bug) -> bool {
    std::panic::catch_unwind(|| check_real_writer(mode, bug)).is_err()
}

#[test]
fn real_writer_model_catches_ack_before_commit() {
    assert!(
        caught(Durability::Immediate, Bug::AckBeforeCommit),
        "acknowledging before the commit went unnoticed"
    );
}

#[test]
fn real_writer_model_catches_publish_before_commit() {
    for mode in [Durability::Immediate, buffered()] {
        assert!(
            caught(mode, Bug::PublishBeforeCommit),
            "{mode:?}: publishing before the commit went unnoticed"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The commit log's writer and applier under the scheduler (src/runtime/writer.rs, src/runtime/apply.rs).
// ---------------------------------------------------------------------------------------

/// Three callers complete a key each with the commit log on: the writer acknowledges each
/// batch when its frame is synced and hands it to the applier, which takes it to the file
/// while the writer syncs the next frame. Checked at every schedule:
/// - a power loss (what both storages synced) and a kill (everything both were given)
///   right after the acknowledgements, while the applier may still be applying, keep every
///   acknowledged completion. After a kill the file holds the batches the applier
///   committed and says which frames they were, so a batch applied out of frame order, or
///   recorded as applied without being so, loses a completion at the reopen;
/// - once a flush with nothing else queued returns (its barrier is a batch of its own,
///   acknowledged as applied), the file holds every completion acknowledged before it, and
///   a claim of each key replays its response (such a batch is acknowledged only once the
///   applier has applied every batch handed to it; otherwise the applied watermark would
///   drop a response from memory that the file does not hold yet);
/// - the writer, the applier and the callers never wait for each other in a cycle
///   (shuttle reports a deadlock).
fn commit_log_handoff(bug: Bug) {
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let open = |file: &FaultyStorage, log: &FaultyStorage| {
        Engine::builder()
            .backend(file.clone())
            .log_backend(log.clone())
            .tuning(idemkv::Tuning::default().stripes(1).sweep_interval(None))
            .open()
            .expect("open")
    };
    let engine = open(&file, &log);
    sabotage(&engine, bug);
    let handles: Vec<_> = (0..3u8)
        .map(|i| {
            let engine = engine.clone();
            shuttle::thread::spawn(move || {
                let key = vec![b'k', i];
                let Claim::Acquired(lease) = engine
                    .claim(&key, &ClaimOptions::default())
                    .unwrap_or_else(|e| panic!("claim: {e}"))
                else {
                    panic!("a fresh key is acquired");
                };
                let token = lease.token();
                lease
                    .complete(&[i; 4])
                    .unwrap_or_else(|e| panic!("complete: {e}"));
                (key, token)
            })
        })
        .collect();
    let acked: Vec<(Vec<u8>, u64)> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    // The file's images first: the log's, taken after, then holds every frame the file
    // applied (and maybe more), as when both stop at one instant.
    let (file_synced, file_given) = (file.durable_image(), file.live_image());
    let lost_power = (
        FaultyStorage::from_image(file_synced),
        FaultyStorage::from_image(log.durable_image()),
    );
    let killed = (
        FaultyStorage::from_image(file_given),
        FaultyStorage::from_image(log.live_image()),
    );
    engine.flush().unwrap_or_else(|e| panic!("flush: {e}"));
    for (key, token) in &acked {
        let response = vec![key[1]; 4];
        assert_eq!(
            committed(&engine, *token),
            Some(CommittedRecord::Completed {
                key: key.clone(),
                response: response.clone(),
            }),
            "a flush returned before the file held an acknowledged completion"
        );
        match engine.claim(key, &ClaimOptions::default()) {
            Ok(Claim::Completed(stored)) => assert_eq!(stored.response(), &response[..]),
            other => panic!("an acknowledged completion replays as {other:?}"),
        }
    }
    engine.close().expect("close");
    for (what, (file, log)) in [("a power loss", lost_power), ("a kill", killed)] {
        let reopened = open(&file, &log);
        for (key, _) in &acked {
            match reopened.claim(key, &ClaimOptions::default()) {
                Ok(Claim::Completed(stored)) => {
                    assert_eq!(stored.response(), &[key[1]; 4][..])
                }
                other => panic!("after {what}, an acknowledged completion is {other:?}"),
            }
        }
        reopened.close().expect("close");
    }
}

/// Schedules tried per scheduler: each one opens two engines and replays a log, about
/// 0.15 s in a debug build.
const COMMIT_LOG_SCHEDULES: usize = 60;

fn check_commit_log(bug: Bug) {
    under_schedules(COMMIT_LOG_SCHEDULES, move || commit_log_handoff(bug));
}

#[test]
fn commit_log_applier_applies_in_order_and_a_flush_waits_for_it() {
    check_commit_log(Bug::None);
}

#[test]
fn commit_log_model_catches_a_flush_that_does_not_wait_for_the_applier() {
    let caught = std::panic::catch_unwind(|| check_commit_log(Bug::SkipApplierDrain))
        .expect_err("a flush that left the applier behind went unnoticed");
    let why = caught
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| caught.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        why.contains("a flush returned before the file held an acknowledged completion"),
        "caught for another reason: {why}"
    );
}
