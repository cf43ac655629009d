//! Failing an attempt keeps its progress (`Lease::fail`, `Engine::fail`, the `run` choice
//! between release and fail), the key's first-claimed and attempt-started instants, and the
//! completer's scan of abandoned claims (`Admin::abandoned`, `FileReader::abandoned`).
//!
//! Every test runs in each durability mode (`None`, `Buffered`, `Immediate`; the restart
//! tests in the two durable ones, under both `Recovery` modes) with an injected
//! `MockClock`: time moves only when a test moves it.

use idemkv::admin::{AbandonedClaim, AbandonedQuery, FileReader, RecordInfo, RecordInfoState};
use idemkv::*;
use idemkv_check::backend::{acquired, completed, wait_until};
use idemkv_check::modes;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tempfile::TempDir;

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);
const SEC: Duration = Duration::from_secs(1);

/// One engine under test, its clock and its file's directory.
struct Env {
    engine: Engine,
    clock: MockClock,
    mode: Durability,
    dir: TempDir,
}

impl Env {
    fn builder(mode: Durability, clock: &MockClock, path: PathBuf) -> EngineBuilder {
        let b = Engine::builder()
            .durability(mode)
            .clock(clock.clone())
            .lease(LEASE)
            .retention(RETENTION)
            // Sweeps happen when a test says so.
            .tuning(idemkv::Tuning::default().sweep_interval(None));
        if mode == Durability::None {
            b
        } else {
            b.path(path)
        }
    }

    fn open(mode: Durability) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let engine = Self::builder(mode, &clock, dir.path().join("idem.redb"))
            .open()
            .unwrap();
        Env {
            engine,
            clock,
            mode,
            dir,
        }
    }

    /// Closes the engine (everything acknowledged durable) and opens the file again with
    /// `recovery`; the clock keeps running.
    fn restart(&mut self, recovery: Recovery) {
        self.engine.flush().unwrap();
        self.engine.close().unwrap();
        self.engine = Self::builder(self.mode, &self.clock, self.dir.path().join("idem.redb"))
            .recovery(recovery)
            .open()
            .unwrap();
    }

    fn claim(&self, key: &[u8], opts: &ClaimOptions) -> Claim {
        self.engine.claim(key, opts).unwrap()
    }

    fn get(&self, key: &[u8]) -> Option<KeyState> {
        self.engine.get(key).unwrap()
    }

    /// The mock clock's wall time now, to the millisecond the engine keeps.
    fn now(&self) -> SystemTime {
        ms(self.clock.wall())
    }

    fn record(&self, key: &[u8]) -> RecordInfo {
        self.engine
            .admin()
            .records()
            .into_iter()
            .find(|r| r.key == key)
            .unwrap_or_else(|| panic!("no record of {}", String::from_utf8_lossy(key)))
    }
}

/// `t` to the millisecond.
fn ms(t: SystemTime) -> SystemTime {
    let ms = t.duration_since(UNIX_EPOCH).unwrap().as_millis();
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap())
}

fn each_mode(f: impl Fn(&mut Env)) {
    for mode in modes() {
        let mut env = Env::open(mode);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(&mut env))) {
            eprintln!("--> failed in durability mode {mode:?}");
            resume_unwind(panic);
        }
    }
}

/// The durable modes under each recovery mode.
fn each_restart(f: impl Fn(&mut Env, Recovery)) {
    for mode in modes().into_iter().filter(|m| *m != Durability::None) {
        for recovery in [Recovery::TakeOver, Recovery::HonourLeases] {
            let mut env = Env::open(mode);
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(&mut env, recovery))) {
                eprintln!("--> failed in durability mode {mode:?}, recovery {recovery:?}");
                resume_unwind(panic);
            }
        }
    }
}

fn payload(p: &[u8]) -> ClaimOptions {
    ClaimOptions::default().payload(p)
}

/// The InFlight parts of `get` that these tests look at.
fn inflight(state: Option<KeyState>) -> (u64, u32, Duration, Option<Checkpoint>, bool) {
    match state {
        Some(KeyState::InFlight {
            token,
            attempt,
            lease_remaining,
            checkpoint,
            failed,
            ..
        }) => (token, attempt, lease_remaining, checkpoint, failed),
        other => panic!("expected InFlight, got {other:?}"),
    }
}

/// `first_claimed_at` and `attempt_started_at` of an InFlight key.
fn instants(state: Option<KeyState>) -> (Option<SystemTime>, Option<SystemTime>) {
    match state {
        Some(KeyState::InFlight {
            first_claimed_at,
            attempt_started_at,
            ..
        }) => (first_claimed_at, attempt_started_at),
        other => panic!("expected InFlight, got {other:?}"),
    }
}

/// Joins a thread that must finish soon; closes the engine (waking every waiter) if not,
/// so that a lost wake-up fails the test instead of hanging it.
#[track_caller]
fn join_soon<T>(engine: &Engine, handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    let give_up = Instant::now() + Duration::from_secs(10);
    while !handle.is_finished() {
        if Instant::now() >= give_up {
            let _ = engine.close();
            panic!("a thread did not finish: closed the engine to unblock it");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    handle.join().unwrap()
}

// ---------------------------------------------------------------------------------------
// Lease::fail
// ---------------------------------------------------------------------------------------

#[test]
fn fail_ends_the_attempt_and_the_next_claim_resumes_from_the_checkpoint() {
    each_mode(|e| {
        let opts = payload(b"order 42");
        let mut first = acquired(e.claim(b"k", &opts));
        first.set_checkpoint(1, b"card charged").unwrap();
        let old = first.token();
        e.clock.advance(5 * SEC);
        let failed_at = e.now();
        assert_eq!(first.fail(), Ok(true));
        // Still InFlight under the old token, its lease over, its progress kept.
        assert_eq!(
            inflight(e.get(b"k")),
            (
                old,
                1,
                Duration::ZERO,
                Some(Checkpoint::new(1, b"card charged")),
                true
            )
        );
        let r = e.record(b"k");
        assert!(
            matches!(r.state, RecordInfoState::InFlight { lease_deadline, failed: true, .. }
                if lease_deadline == failed_at),
            "the record shows when the lease ended: {r:?}"
        );
        assert_eq!(r.fingerprint, e.record(b"k").fingerprint);
        assert!(r.fingerprint.is_some());
        let stats = e.engine.stats();
        assert_eq!((stats.failures, stats.releases), (1, 0));

        // Taken over at once, without the clock moving: attempt 2, the checkpoint.
        let second = acquired(e.claim(b"k", &opts));
        assert!(second.token() > old);
        assert_eq!(second.attempt(), 2);
        assert_eq!(
            second.checkpoint(),
            Some(&Checkpoint::new(1, b"card charged"))
        );
        assert!(!inflight(e.get(b"k")).4, "the new attempt is not failed");
        assert_eq!(e.engine.stats().takeovers, 1);
        // The failed token is fenced off.
        assert_eq!(
            e.engine.complete(b"k", old, b"late"),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(e.engine.fail(b"k", old), Ok(false));
        second.complete(b"done").unwrap();
        e.engine.flush().unwrap();
        let stored = completed(e.claim(b"k", &opts));
        assert_eq!((stored.response(), stored.attempt()), (&b"done"[..], 2));
    });
}

#[test]
fn a_failed_key_is_guarded_by_its_fingerprint_and_a_released_one_is_not() {
    each_mode(|e| {
        // Failed: the fingerprint still guards the key.
        let mut lease = acquired(e.claim(b"failed", &payload(b"A")));
        lease.set_checkpoint(1, b"half").unwrap();
        lease.fail().unwrap();
        assert_eq!(
            e.engine.claim(b"failed", &payload(b"B")).err(),
            Some(ClaimError::FingerprintMismatch)
        );
        // Without a fingerprint the claim is not checked, and takes it over.
        let over = acquired(e.claim(b"failed", &ClaimOptions::default()));
        assert_eq!(over.attempt(), 2);
        assert_eq!(over.checkpoint(), Some(&Checkpoint::new(1, b"half")));
        over.complete(b"x").unwrap();

        // Released: forgotten, another payload starts afresh.
        let mut lease = acquired(e.claim(b"released", &payload(b"A")));
        lease.set_checkpoint(1, b"half").unwrap();
        assert_eq!(lease.release(), Ok(true));
        assert_eq!(e.get(b"released"), None);
        let fresh = acquired(e.claim(b"released", &payload(b"B")));
        assert_eq!((fresh.attempt(), fresh.checkpoint()), (1, None));
        fresh.complete(b"y").unwrap();
    });
}

#[test]
fn fail_after_the_lease_ran_out_keeps_its_end_and_only_the_holder_can_fail() {
    each_mode(|e| {
        let claimed = e.now();
        let lease = acquired(e.claim(b"k", &ClaimOptions::default()));
        e.clock.advance(LEASE + 7 * SEC);
        assert_eq!(e.engine.fail(b"k", lease.token()), Ok(true));
        // The lease ended at its deadline, not at the fail.
        let r = e.record(b"k");
        assert!(
            matches!(r.state, RecordInfoState::InFlight { lease_deadline, failed: true, .. }
                if lease_deadline == claimed + LEASE),
            "{r:?}"
        );
        // Repeated: still held, no change.
        assert_eq!(e.engine.fail(b"k", lease.token()), Ok(true));
        // Not the holder, absent, completed: nothing to fail.
        assert_eq!(e.engine.fail(b"k", lease.token() + 1), Ok(false));
        assert_eq!(e.engine.fail(b"absent", 1), Ok(false));
        let next = acquired(e.claim(b"k", &ClaimOptions::default()));
        let token = next.token();
        next.complete(b"v").unwrap();
        assert_eq!(e.engine.fail(b"k", token), Ok(false));
        assert_eq!(e.engine.stats().failures, 2);
        drop(lease);
    });
}

/// A failed attempt is never revived, not even by a keep-alive renewal racing the fail;
/// until someone takes it over, its holder may still complete it.
#[test]
fn a_failed_lease_is_never_extended_but_can_still_be_completed() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k", &ClaimOptions::default()));
        let token = lease.token();
        assert_eq!(e.engine.fail(b"k", token), Ok(true));
        assert_eq!(
            e.engine.extend(b"k", token, LEASE),
            Err(LeaseError::LeaseLost)
        );
        let (_, _, left, _, failed) = inflight(e.get(b"k"));
        assert_eq!((left, failed), (Duration::ZERO, true));
        lease.complete(b"finished after all").unwrap();
        e.engine.flush().unwrap();
        let stored = completed(e.claim(b"k", &ClaimOptions::default()));
        assert_eq!(stored.response(), b"finished after all");
    });
}

#[test]
fn fail_async_keeps_the_progress() {
    each_mode(|e| {
        let mut lease = acquired(e.claim(b"k", &ClaimOptions::default()));
        lease.set_checkpoint(3, b"three").unwrap();
        assert_eq!(futures::executor::block_on(lease.fail_async()), Ok(true));
        let next = acquired(e.claim(b"k", &ClaimOptions::default()));
        assert_eq!(next.attempt(), 2);
        assert_eq!(next.checkpoint(), Some(&Checkpoint::new(3, b"three")));
        next.complete(b"v").unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// run: release or fail on a handler error
// ---------------------------------------------------------------------------------------

/// A handler that saves a checkpoint, then fails.
fn fail_after_step_one(engine: &Engine, lease: &Lease) -> Result<Vec<u8>, String> {
    engine
        .checkpoint(lease.key(), lease.token(), 1, b"step 1")
        .map_err(|e| e.to_string())?;
    Err("step 2 failed".into())
}

#[test]
fn run_on_a_handler_error_releases_by_default_and_fails_when_asked() {
    each_mode(|e| {
        let engine = &e.engine;
        // Release (the default): the key is Absent, progress and fingerprint forgotten.
        let opts = payload(b"A");
        let out = engine.run(b"released", &opts, |l| fail_after_step_one(engine, l));
        assert!(matches!(out, Err(RunError::Handler(_))), "{out:?}");
        assert_eq!(e.get(b"released"), None);
        let out = engine
            .run(b"released", &payload(b"B"), |l| {
                assert_eq!((l.attempt(), l.checkpoint()), (1, None));
                Ok::<_, String>(b"B done".to_vec())
            })
            .unwrap();
        assert!(!out.replayed());

        // Fail: the record stays, guarded by its fingerprint; the next run resumes.
        let opts = payload(b"A").on_handler_error(OnHandlerError::Fail);
        let out = engine.run(b"failed", &opts, |l| fail_after_step_one(engine, l));
        assert!(matches!(out, Err(RunError::Handler(_))), "{out:?}");
        let (_, attempt, _, checkpoint, failed) = inflight(e.get(b"failed"));
        assert_eq!(
            (attempt, checkpoint, failed),
            (1, Some(Checkpoint::new(1, b"step 1")), true)
        );
        let other = engine.run(b"failed", &payload(b"B"), |_| {
            Ok::<_, String>(b"wrong".to_vec())
        });
        assert!(
            matches!(other, Err(RunError::Claim(ClaimError::FingerprintMismatch))),
            "{other:?}"
        );
        let out = engine
            .run(b"failed", &opts, |l| {
                assert_eq!(l.attempt(), 2);
                assert_eq!(l.checkpoint(), Some(&Checkpoint::new(1, b"step 1")));
                Ok::<_, String>(b"A done".to_vec())
            })
            .unwrap();
        assert_eq!((out.response(), out.replayed()), (&b"A done"[..], false));
        let stats = engine.stats();
        assert_eq!((stats.releases, stats.failures), (1, 1));
    });
}

#[test]
fn run_typed_and_run_async_make_the_same_choice() {
    each_mode(|e| {
        let engine = &e.engine;
        let fail = payload(b"A").on_handler_error(OnHandlerError::Fail);
        // run_typed
        let out = engine.run_typed::<u32, String>(b"typed", &fail, |l| {
            fail_after_step_one(engine, l).map(|_| 0)
        });
        assert!(matches!(out, Err(RunError::Handler(_))));
        assert!(inflight(e.get(b"typed")).4);
        let out = engine
            .run_typed::<u32, String>(b"typed", &fail, |l| {
                assert_eq!(l.checkpoint(), Some(&Checkpoint::new(1, b"step 1")));
                Ok(l.attempt())
            })
            .unwrap();
        assert_eq!(out.value, 2);
        let out = engine.run_typed::<u32, String>(b"typed-released", &payload(b"A"), |l| {
            fail_after_step_one(engine, l).map(|_| 0)
        });
        assert!(matches!(out, Err(RunError::Handler(_))));
        assert_eq!(e.get(b"typed-released"), None);

        // run_async
        let out = futures::executor::block_on(engine.run_async(b"async", &fail, |l| async move {
            l.set_checkpoint(1, b"async step 1")
                .await
                .map_err(|e| e.to_string())?;
            Err::<Vec<u8>, String>("step 2 failed".into())
        }));
        assert!(matches!(out, Err(RunError::Handler(_))));
        let out = futures::executor::block_on(engine.run_async(b"async", &fail, |l| async move {
            assert_eq!(l.attempt(), 2);
            assert_eq!(l.checkpoint(), Some(&Checkpoint::new(1, b"async step 1")));
            Ok::<_, String>(b"async done".to_vec())
        }))
        .unwrap();
        assert_eq!(out.response(), b"async done");
        let out = futures::executor::block_on(engine.run_async(
            b"async-released",
            &payload(b"A"),
            |_| async { Err::<Vec<u8>, String>("nothing done".into()) },
        ));
        assert!(matches!(out, Err(RunError::Handler(_))));
        assert_eq!(e.get(b"async-released"), None);
    });
}

/// Threads racing on one key through `run` with the fail choice; the first attempt fails
/// after its first step. Whatever the interleaving: the handler runs twice (the failed
/// attempt, then one that resumes from its checkpoint), one success is stored, and every
/// other caller gets its bytes. The clock never moves, so the waiters can only take the key
/// over because the fail ended the lease (and woke them).
#[test]
fn run_under_contention_resumes_from_the_checkpoint_after_a_failed_attempt() {
    const THREADS: usize = 6;
    each_mode(|e| {
        let engine = &e.engine;
        let opts = payload(b"job")
            .on_handler_error(OnHandlerError::Fail)
            .wait(Duration::from_secs(3600));
        let runs = AtomicUsize::new(0);
        let barrier = Barrier::new(THREADS);
        let outs: Vec<Result<Outcome, RunError<String>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        engine.run(b"job", &opts, |lease| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            match lease.attempt() {
                                1 => fail_after_step_one(engine, lease),
                                attempt => {
                                    assert_eq!(attempt, 2);
                                    assert_eq!(
                                        lease.checkpoint(),
                                        Some(&Checkpoint::new(1, b"step 1"))
                                    );
                                    Ok(b"resumed and done".to_vec())
                                }
                            }
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| join_soon(engine, h)).collect()
        });
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{outs:?}");
        let failed = outs
            .iter()
            .filter(|o| matches!(o, Err(RunError::Handler(_))))
            .count();
        assert_eq!(failed, 1, "{outs:?}");
        let ok: Vec<&Outcome> = outs.iter().filter_map(|o| o.as_ref().ok()).collect();
        assert_eq!(ok.len(), THREADS - 1, "{outs:?}");
        assert!(ok.iter().all(|o| o.response() == b"resumed and done"));
        assert_eq!(ok.iter().filter(|o| !o.replayed()).count(), 1);
        assert_eq!(e.engine.stats().failures, 1);
    });
}

#[test]
fn a_waiter_is_woken_by_a_fail_and_takes_the_key_over() {
    each_mode(|e| {
        let engine = &e.engine;
        let mut holder = acquired(e.claim(b"k", &ClaimOptions::default()));
        holder.set_checkpoint(2, b"two").unwrap();
        let waits = engine.stats().waits;
        let got = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                engine.claim_or_wait(
                    b"k",
                    &ClaimOptions::default().wait(Duration::from_secs(3600)),
                )
            });
            // The waiter sleeps on the key, whose lease (on the mock clock) never ends.
            wait_until("the waiter to sleep", || engine.stats().waits > waits);
            assert_eq!(holder.fail(), Ok(true));
            join_soon(engine, waiter)
        });
        let lease = acquired(got.unwrap());
        assert_eq!(lease.attempt(), 2);
        assert_eq!(lease.checkpoint(), Some(&Checkpoint::new(2, b"two")));
        lease.complete(b"v").unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// reaping
// ---------------------------------------------------------------------------------------

#[test]
fn a_failed_claim_is_reaped_at_its_fail_plus_retention() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k", &ClaimOptions::default()));
        e.clock.advance(5 * SEC);
        lease.fail().unwrap();
        e.clock.advance(RETENTION - Duration::from_nanos(1));
        assert_eq!(e.engine.admin().sweep_now(), Ok(0));
        assert!(
            inflight(e.get(b"k")).4,
            "still there until fail + retention"
        );
        assert_eq!(e.engine.stats().abandoned, 1);
        e.clock.advance(Duration::from_nanos(1));
        assert_eq!(e.engine.admin().sweep_now(), Ok(1));
        assert_eq!(e.get(b"k"), None);
        let stats = e.engine.stats();
        assert_eq!((stats.abandoned_reaped, stats.abandoned), (1, 0));
        // Reaped: the key is new again.
        assert_eq!(
            acquired(e.claim(b"k", &ClaimOptions::default())).attempt(),
            1
        );
    });
}

// ---------------------------------------------------------------------------------------
// instants
// ---------------------------------------------------------------------------------------

#[test]
fn first_claimed_is_kept_across_takeovers_and_fails_and_attempt_started_moves() {
    each_mode(|e| {
        let t0 = e.now();
        let first = acquired(e.claim(b"k", &ClaimOptions::default()));
        assert_eq!(instants(e.get(b"k")), (Some(t0), Some(t0)));
        e.clock.advance(10 * SEC);
        first.fail().unwrap();
        e.clock.advance(5 * SEC);
        let t1 = e.now();
        let second = acquired(e.claim(b"k", &ClaimOptions::default()));
        assert_eq!(instants(e.get(b"k")), (Some(t0), Some(t1)));
        // Its lease runs out; a takeover starts attempt 3.
        e.clock.advance(LEASE);
        let t2 = e.now();
        let third = acquired(e.claim(b"k", &ClaimOptions::default()));
        assert_eq!(third.attempt(), 3);
        assert_eq!(instants(e.get(b"k")), (Some(t0), Some(t2)));
        let r = e.record(b"k");
        assert_eq!(r.first_claimed_at, Some(t0));
        assert!(
            matches!(r.state, RecordInfoState::InFlight { attempt_started_at, .. }
            if attempt_started_at == Some(t2))
        );
        // The completion keeps the first claim, in memory and in the file.
        third.complete(b"v").unwrap();
        assert_eq!(e.record(b"k").first_claimed_at, Some(t0));
        e.engine.flush().unwrap();
        assert_eq!(e.record(b"k").first_claimed_at, Some(t0));
        // After its retention, the key is new: a new first claim.
        e.clock.advance(RETENTION);
        let t3 = e.now();
        let again = acquired(e.claim(b"k", &ClaimOptions::default()));
        assert_eq!(instants(e.get(b"k")), (Some(t3), Some(t3)));
        again.release().unwrap();
        // Released: the key is new too.
        e.clock.advance(SEC);
        let t4 = e.now();
        let _fresh = acquired(e.claim(b"k", &ClaimOptions::default()));
        assert_eq!(instants(e.get(b"k")), (Some(t4), Some(t4)));
        drop(second);
    });
}

#[test]
fn an_ended_lease_is_reported_with_the_instant_it_ended() {
    each_mode(|e| {
        let claimed = e.now();
        let lease = acquired(e.claim(b"k", &ClaimOptions::default()));
        e.clock.advance(LEASE + 90 * SEC);
        let r = e.record(b"k");
        assert!(
            matches!(r.state, RecordInfoState::InFlight { lease_deadline, .. }
                if lease_deadline == claimed + LEASE),
            "not now, but when it ended: {r:?}"
        );
        // force_release reports the same record, fingerprint included.
        let before = e.engine.admin().force_release(b"k").unwrap().unwrap();
        assert_eq!(before, r);
        drop(lease);
    });
}

// ---------------------------------------------------------------------------------------
// restarts
// ---------------------------------------------------------------------------------------

#[test]
fn a_failed_claim_survives_a_restart_and_is_taken_over_at_once() {
    each_restart(|e, recovery| {
        let t0 = e.now();
        let mut lease = acquired(e.claim(b"k", &payload(b"A")));
        lease.set_checkpoint(1, b"step 1").unwrap();
        e.clock.advance(3 * SEC);
        let failed_at = e.now();
        lease.fail().unwrap();
        // A completion's first claim, and a lease that runs out before the restart.
        let done = acquired(e.claim(b"done", &ClaimOptions::default()));
        done.complete(b"v").unwrap();
        let lapsed = acquired(e.claim(
            b"lapsed",
            &ClaimOptions::default().lease(Duration::from_secs(2)),
        ));
        e.clock.advance(3 * SEC);
        e.restart(recovery);
        e.clock.advance(SEC);
        drop(lapsed);

        let (_, attempt, left, checkpoint, failed) = inflight(e.get(b"k"));
        assert_eq!(
            (attempt, left, checkpoint, failed),
            (1, Duration::ZERO, Some(Checkpoint::new(1, b"step 1")), true)
        );
        assert_eq!(instants(e.get(b"k")), (Some(t0), Some(t0)));
        let r = e.record(b"k");
        assert!(
            matches!(r.state, RecordInfoState::InFlight { lease_deadline, failed: true, .. }
                if lease_deadline == failed_at),
            "{r:?}"
        );
        assert_eq!(e.record(b"done").first_claimed_at, Some(t0 + 3 * SEC));
        // A lease that had ended before the restart reports when it ended.
        let r = e.record(b"lapsed");
        assert!(
            matches!(r.state, RecordInfoState::InFlight { lease_deadline, .. }
                if lease_deadline == failed_at + Duration::from_secs(2)),
            "{r:?}"
        );
        let listed = e.engine.admin().abandoned(&AbandonedQuery::default());
        let keys: Vec<&[u8]> = listed.iter().map(|c| &c.key[..]).collect();
        assert_eq!(keys, [&b"k"[..], &b"lapsed"[..]]);
        assert_eq!(listed[0].lease_ended_at, failed_at);

        assert_eq!(
            e.engine.claim(b"k", &payload(b"B")).err(),
            Some(ClaimError::FingerprintMismatch)
        );
        let next = acquired(e.claim(b"k", &payload(b"A")));
        assert_eq!(next.attempt(), 2);
        assert_eq!(next.checkpoint(), Some(&Checkpoint::new(1, b"step 1")));
        assert_eq!(instants(e.get(b"k")), (Some(t0), Some(e.now())));
        // Restarted once more, the new attempt keeps the first claim.
        e.restart(recovery);
        drop(next);
        assert_eq!(e.record(b"k").first_claimed_at, Some(t0));
    });
}

// ---------------------------------------------------------------------------------------
// the completer's scan
// ---------------------------------------------------------------------------------------

/// At `t0 + 60 s`: `a` first claimed at t0, its lease ended at t0 + 10 s; `b` first claimed
/// at t0 + 20 s, failed at t0 + 25 s; `live` holds a live lease; `done` is completed; `c`
/// ended at t0 + 40 s but was taken over since (live again).
fn scan_fixture(e: &Env) -> SystemTime {
    let t0 = e.now();
    let short = ClaimOptions::default().lease(Duration::from_secs(10));
    let mut a = acquired(e.claim(b"a", &short));
    a.set_checkpoint(1, b"a-1").unwrap();
    a.detach();
    e.clock.advance(20 * SEC);
    let b = acquired(e.claim(b"b", &ClaimOptions::default()));
    e.clock.advance(5 * SEC);
    b.fail().unwrap();
    let c = acquired(e.claim(b"c", &ClaimOptions::default().lease(15 * SEC)));
    c.detach();
    let done = acquired(e.claim(b"done", &short));
    done.complete(b"v").unwrap();
    e.clock.advance(30 * SEC);
    acquired(e.claim(b"c", &ClaimOptions::default())).detach();
    acquired(e.claim(b"live", &ClaimOptions::default())).detach();
    e.clock.advance(5 * SEC);
    t0
}

fn keys(claims: &[AbandonedClaim]) -> Vec<String> {
    claims
        .iter()
        .map(|c| String::from_utf8_lossy(&c.key).into_owned())
        .collect()
}

#[test]
fn the_abandoned_scan_filters_by_age_idle_time_and_limit() {
    each_mode(|e| {
        let t0 = scan_fixture(e);
        let scan = |older_than: u64, idle_for: u64, limit: usize| {
            e.engine.admin().abandoned(
                &AbandonedQuery::default()
                    .older_than(Duration::from_secs(older_than))
                    .idle_for(Duration::from_secs(idle_for))
                    .limit(limit),
            )
        };
        let all = scan(0, 0, 100);
        assert_eq!(keys(&all), ["a", "b"], "earliest first claimed first");
        let a = &all[0];
        assert_eq!(
            (a.token, a.attempt, a.failed, a.checkpoint.clone()),
            (a.token, 1, false, Some(Checkpoint::new(1, b"a-1")))
        );
        assert_eq!(
            (a.first_claimed_at, a.attempt_started_at, a.lease_ended_at),
            (Some(t0), Some(t0), t0 + 10 * SEC)
        );
        let b = &all[1];
        assert_eq!(
            (b.failed, b.first_claimed_at, b.lease_ended_at),
            (true, Some(t0 + 20 * SEC), t0 + 25 * SEC)
        );
        // Older than: a is 60 s old, b 40 s (the bound is inclusive).
        assert_eq!(keys(&scan(60, 0, 100)), ["a"]);
        assert_eq!(keys(&scan(61, 0, 100)), Vec::<String>::new());
        assert_eq!(keys(&scan(40, 0, 100)), ["a", "b"]);
        assert_eq!(keys(&scan(41, 0, 100)), ["a"]);
        // Idle for: a's lease ended 50 s ago, b's 35 s ago.
        assert_eq!(keys(&scan(0, 35, 100)), ["a", "b"]);
        assert_eq!(keys(&scan(0, 36, 100)), ["a"]);
        assert_eq!(keys(&scan(0, 51, 100)), Vec::<String>::new());
        // Limit: the earliest first claimed.
        assert_eq!(keys(&scan(0, 0, 1)), ["a"]);
        assert_eq!(keys(&scan(0, 0, 0)), Vec::<String>::new());
        // The clock moves on: both qualify.
        e.clock.advance(SEC);
        assert_eq!(keys(&scan(41, 36, 100)), ["a", "b"]);
    });
}

#[test]
fn a_completer_finishes_what_the_scan_lists() {
    each_mode(|e| {
        scan_fixture(e);
        let query = AbandonedQuery::default()
            .older_than(Duration::from_secs(30))
            .idle_for(Duration::from_secs(30));
        let listed = e.engine.admin().abandoned(&query);
        assert_eq!(keys(&listed), ["a", "b"]);
        for claim in &listed {
            let lease = acquired(e.claim(&claim.key, &ClaimOptions::default()));
            assert_eq!(lease.attempt(), claim.attempt + 1);
            assert_eq!(lease.checkpoint(), claim.checkpoint.as_ref());
            assert!(lease.token() > claim.token);
            let done = format!("finished attempt {}", lease.attempt());
            lease.complete(done.as_bytes()).unwrap();
        }
        e.engine.flush().unwrap();
        assert!(e
            .engine
            .admin()
            .abandoned(&AbandonedQuery::default())
            .is_empty());
        // The original client's retry gets the completer's answer.
        let stored = completed(e.claim(b"a", &ClaimOptions::default()));
        assert_eq!(stored.response(), b"finished attempt 2");
        // The others were left alone.
        assert!(matches!(
            e.claim(b"live", &ClaimOptions::default()),
            Claim::InProgress(_)
        ));
        assert!(matches!(
            e.claim(b"c", &ClaimOptions::default()),
            Claim::InProgress(_)
        ));
    });
}

#[test]
fn a_file_reader_lists_the_abandoned_claims_of_a_file() {
    for mode in modes().into_iter().filter(|m| *m != Durability::None) {
        let e = Env::open(mode);
        let t0 = scan_fixture(&e);
        e.engine.flush().unwrap();
        e.engine.close().unwrap();
        let reader = FileReader::open(e.dir.path().join("idem.redb")).unwrap();
        let now = e.clock.wall();
        let listed = reader
            .abandoned(
                &AbandonedQuery::default().older_than(Duration::from_secs(41)),
                now,
            )
            .unwrap();
        assert_eq!(keys(&listed), ["a"], "{mode:?}");
        assert_eq!(listed[0].lease_ended_at, t0 + 10 * SEC);
        assert_eq!(listed[0].checkpoint, Some(Checkpoint::new(1, b"a-1")));
        let all = reader.abandoned(&AbandonedQuery::default(), now).unwrap();
        assert_eq!(keys(&all), ["a", "b"], "{mode:?}");
        assert!(all[1].failed);
    }
}
