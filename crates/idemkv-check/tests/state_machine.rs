//! The per-key state machine of docs/design.md, one test per transition, each run in every
//! durability mode (`None`, `Buffered`, `Immediate`) with an injected `MockClock`.
//!
//! Time never passes by itself here: tests move the mock clock. The only real-time waits are
//! bounded polls for a condition another thread must reach (a waiter going to sleep, a
//! completion being queued), never for a duration to elapse.

use common::{acquired, completed, in_progress, wait_until};
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::*;
use idemkv_check::backend as common;
use idemkv_check::modes;
use serde::{Deserialize, Serialize};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tempfile::TempDir;

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);
const NS: Duration = Duration::from_nanos(1);

/// One engine under test. Fields drop in order: the engine first, then its file's directory.
struct Env {
    engine: Engine,
    clock: MockClock,
    mode: Durability,
    _dir: TempDir,
}

impl Env {
    fn open(mode: Durability, tune: &dyn Fn(EngineBuilder) -> EngineBuilder) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let builder = Engine::builder()
            .durability(mode)
            .clock(clock.clone())
            .lease(LEASE)
            .retention(RETENTION);
        // A memory-only engine keeps no file and refuses a path.
        let builder = match mode {
            Durability::None => builder,
            _ => builder.path(dir.path().join("idem.redb")),
        };
        let engine = tune(builder).open().unwrap();
        Env {
            engine,
            clock,
            mode,
            _dir: dir,
        }
    }

    fn claim(&self, key: &[u8]) -> Claim {
        self.engine.claim(key, &ClaimOptions::default()).unwrap()
    }

    fn claim_with(&self, key: &[u8], opts: &ClaimOptions) -> Claim {
        self.engine.claim(key, opts).unwrap()
    }

    /// Makes every acknowledged call durable, hence visible to other callers.
    fn settle(&self) {
        self.engine.flush().unwrap();
    }

    fn get(&self, key: &[u8]) -> Option<KeyState> {
        self.engine.get(key).unwrap()
    }

    /// The mock clock's wall time now, to the millisecond the engine keeps.
    fn wall_ms(&self) -> SystemTime {
        let ms = self
            .clock
            .wall()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap())
    }
}

/// Runs `f` once per durability mode; a failure names the mode.
fn each_mode(f: impl Fn(&Env)) {
    each_mode_with(|b| b, f)
}

fn each_mode_with(tune: impl Fn(EngineBuilder) -> EngineBuilder, f: impl Fn(&Env)) {
    for mode in modes() {
        let env = Env::open(mode, &tune);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(&env))) {
            eprintln!("--> failed in durability mode {mode:?}");
            resume_unwind(panic);
        }
    }
}

/// Joins a thread that must finish soon. If it does not (a regression that leaves a waiter
/// blocked), closes the engine, which wakes every waiter with `Closed`, so that the test
/// fails instead of hanging.
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
// claim
// ---------------------------------------------------------------------------------------

#[test]
fn claim_on_absent_acquires_a_fresh_lease() {
    each_mode(|e| {
        assert_eq!(e.get(b"k"), None);
        let before = e.engine.stats().token_next;
        let t0 = e.wall_ms();
        let lease = acquired(e.claim(b"k"));
        assert!(lease.token() >= before, "token below token_next");
        assert!(lease.token() > 0);
        assert_eq!(lease.attempt(), 1);
        assert!(lease.checkpoint().is_none());
        assert_eq!(lease.key(), b"k");
        assert!(e.engine.stats().token_next > lease.token());
        assert_eq!(
            e.get(b"k"),
            Some(KeyState::InFlight {
                token: lease.token(),
                attempt: 1,
                lease_remaining: LEASE,
                checkpoint: None,
                first_claimed_at: Some(t0),
                attempt_started_at: Some(t0),
                failed: false,
            })
        );
        // Distinct keys are independent: each gets its own, larger token.
        let other = acquired(e.claim(b"other"));
        assert!(other.token() > lease.token());
        assert_eq!(e.engine.stats().inflight, 2);
    });
}

#[test]
fn claim_on_live_lease_is_in_progress_with_remaining_lease() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let busy = in_progress(e.claim(b"k"));
        assert_eq!(busy.retry_after(), LEASE);
        assert_eq!(busy.attempt(), 1);

        e.clock.advance(Duration::from_secs(7));
        let busy = in_progress(e.claim(b"k"));
        assert_eq!(busy.retry_after(), LEASE - Duration::from_secs(7));

        // The last nanosecond of the lease is still the holder's.
        e.clock.advance(LEASE - Duration::from_secs(7) - NS);
        assert_eq!(in_progress(e.claim(b"k")).retry_after(), NS);

        // A per-claim lease overrides the engine default.
        let short = acquired(e.claim_with(
            b"short",
            &ClaimOptions::default().lease(Duration::from_secs(5)),
        ));
        assert_eq!(
            in_progress(e.claim(b"short")).retry_after(),
            Duration::from_secs(5)
        );
        // Losing claims changed nothing.
        assert!(
            matches!(e.get(b"k"), Some(KeyState::InFlight { token, .. }) if token == lease.token())
        );
        drop(short);
        drop(lease);
    });
}

#[test]
fn claim_after_lease_over_takes_over_with_new_token_attempt_and_checkpoint() {
    each_mode(|e| {
        let t0 = e.wall_ms();
        let mut first = acquired(e.claim(b"k"));
        first.set_checkpoint(3, b"half done").unwrap();
        assert_eq!(first.checkpoint(), Some(&Checkpoint::new(3, b"half done")));

        // Exactly at the deadline the lease is over.
        e.clock.advance(LEASE - NS);
        in_progress(e.claim(b"k"));
        e.clock.advance(NS);
        let t1 = e.wall_ms();
        let mut second = acquired(e.claim(b"k"));
        assert!(second.token() > first.token());
        assert_eq!(second.attempt(), 2);
        assert_eq!(second.checkpoint(), Some(&Checkpoint::new(3, b"half done")));
        assert_eq!(e.engine.stats().takeovers, 1);
        assert_eq!(
            e.get(b"k"),
            Some(KeyState::InFlight {
                token: second.token(),
                attempt: 2,
                lease_remaining: LEASE,
                checkpoint: Some(Checkpoint::new(3, b"half done")),
                // The key's first claim is kept; the attempt started at the takeover.
                first_claimed_at: Some(t0),
                attempt_started_at: Some(t1),
                failed: false,
            })
        );
        // The new holder is live: others are told to wait.
        assert_eq!(in_progress(e.claim(b"k")).attempt(), 2);

        // The new holder's own checkpoint is what the next takeover gets.
        second.set_checkpoint(4, b"three quarters").unwrap();
        e.clock.advance(LEASE);
        let third = acquired(e.claim(b"k"));
        assert!(third.token() > second.token());
        assert_eq!(third.attempt(), 3);
        assert_eq!(
            third.checkpoint(),
            Some(&Checkpoint::new(4, b"three quarters"))
        );

        // Every superseded holder is fenced off.
        assert_eq!(first.extend(LEASE), Err(LeaseError::LeaseLost));
        assert_eq!(second.extend(LEASE), Err(LeaseError::LeaseLost));
        assert_eq!(
            first.set_checkpoint(9, b"stale"),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(first.release(), Ok(false));
        assert_eq!(second.complete(b"stale"), Err(LeaseError::LeaseLost));

        let token = third.token();
        third.complete(b"done").unwrap();
        e.settle();
        let stored = completed(e.claim(b"k"));
        assert_eq!(stored.response(), b"done");
        assert_eq!(stored.token(), token);
        assert_eq!(stored.attempt(), 3);
    });
}

#[test]
fn claim_on_completed_returns_the_stored_response() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        lease.complete(b"the response").unwrap();
        e.settle();
        for _ in 0..3 {
            let stored = completed(e.claim(b"k"));
            assert_eq!(stored.response(), b"the response");
            assert_eq!(stored.token(), token);
            assert_eq!(stored.attempt(), 1);
        }
        // Replays do not hold a lease and do not move the clock of the record.
        assert_eq!(e.engine.stats().inflight, 0);
        assert_eq!(e.engine.stats().replays, 3);
        // An empty response is a response too.
        acquired(e.claim(b"empty")).complete(b"").unwrap();
        e.settle();
        assert_eq!(completed(e.claim(b"empty")).response(), b"");
    });
}

/// Invariant 5: in `Buffered` mode a completion is acknowledged at once, but becomes visible
/// to other callers only after it is durable. The writer commits within 10 ms on its own, so
/// without control over the disk we can only say: before `flush`, another caller sees
/// InProgress or the right response; after `flush`, always the response.
/// (`completion_is_invisible_until_its_commit_is_durable` below stalls the disk to make the
/// "before" case deterministic.)
#[test]
fn buffered_completion_is_visible_after_flush() {
    let env = Env::open(Durability::buffered(), &|b| b);
    for i in 0..20u32 {
        let key = format!("k{i}");
        let lease = acquired(env.claim(key.as_bytes()));
        lease.complete(&i.to_le_bytes()).unwrap();
        match env.claim(key.as_bytes()) {
            Claim::InProgress(busy) => assert!(busy.retry_after() <= Duration::from_millis(10)),
            Claim::Completed(stored) => assert_eq!(stored.response(), i.to_le_bytes()),
            Claim::Acquired(lease) => panic!("a completed key was acquired again: {lease:?}"),
            Claim::Forgotten(forgotten) => {
                panic!("unexpected Forgotten without markers: {forgotten:?}")
            }
        }
        match env.get(key.as_bytes()) {
            Some(KeyState::Completing { .. }) => {}
            Some(KeyState::Completed { response, .. }) => {
                assert_eq!(&response[..], i.to_le_bytes())
            }
            other => panic!("unexpected state {other:?}"),
        }
        env.settle();
        assert_eq!(
            completed(env.claim(key.as_bytes())).response(),
            i.to_le_bytes()
        );
    }
}

// ---------------------------------------------------------------------------------------
// A storage backend whose fsync can be held, to observe the window between a completion
// being written and being durable.
// ---------------------------------------------------------------------------------------

fn gated_engine(mode: Durability, clock: &MockClock) -> (Engine, FaultyStorage) {
    let backend = FaultyStorage::memory();
    let engine = Engine::builder()
        .backend(backend.clone())
        .durability(mode)
        .clock(clock.clone())
        .lease(LEASE)
        .retention(RETENTION)
        .open()
        .unwrap();
    (engine, backend)
}

/// Invariant 5, deterministic: while the disk holds the completion's fsync, no other caller
/// replays it (it could still vanish in a crash); `get` reports it as Completing.
#[test]
fn completion_is_invisible_until_its_commit_is_durable() {
    for mode in [Durability::buffered(), Durability::Immediate] {
        let clock = MockClock::new();
        let (engine, backend) = gated_engine(mode, &clock);
        let opts = ClaimOptions::default();
        let lease = acquired(engine.claim(b"k", &opts).unwrap());
        let token = lease.token();
        engine.flush().unwrap();
        // Holds every fsync until dropped (also when the test fails).
        let gate = backend.close_gate();
        std::thread::scope(|s| {
            // Under Immediate, `complete` blocks until durable; under Buffered it returns at once.
            let completer = s.spawn(move || lease.complete(b"resp"));
            wait_until("the completion to be queued", || {
                matches!(engine.get(b"k").unwrap(), Some(KeyState::Completing { .. }))
            });
            assert_eq!(
                engine.get(b"k").unwrap(),
                Some(KeyState::Completing { token }),
                "{mode:?}"
            );
            let busy = in_progress(engine.claim(b"k", &opts).unwrap());
            assert!(busy.retry_after() > Duration::ZERO);
            assert!(busy.retry_after() <= Duration::from_millis(10));
            // Stays invisible however long the disk takes (it is not a lease that runs out).
            clock.advance(LEASE * 2);
            in_progress(engine.claim(b"k", &opts).unwrap());
            if mode == Durability::Immediate {
                common::wait_sync_held(&backend);
                assert!(!completer.is_finished(), "Immediate acked before fsync");
            }
            drop(gate);
            assert_eq!(join_soon(&engine, completer), Ok(()));
        });
        engine.flush().unwrap();
        let stored = completed(engine.claim(b"k", &opts).unwrap());
        assert_eq!(stored.response(), b"resp");
        assert_eq!(stored.token(), token);
    }
}

/// docs/design.md: a claim whose fingerprint differs from the stored one is refused "whatever
/// the state" — including while the completion is being made durable (`Completing`). The
/// fingerprint is known then: it is in the queued record.
#[test]
fn fingerprint_mismatch_is_refused_while_the_completion_is_made_durable() {
    for mode in [Durability::buffered(), Durability::Immediate] {
        let clock = MockClock::new();
        let (engine, backend) = gated_engine(mode, &clock);
        let a = ClaimOptions::default().payload(b"amount=42");
        let b = ClaimOptions::default().payload(b"amount=43");
        let lease = acquired(engine.claim(b"k", &a).unwrap());
        engine.flush().unwrap();
        let gate = backend.close_gate();
        let during = std::thread::scope(|s| {
            let completer = s.spawn(move || lease.complete(b"charged 42"));
            wait_until("the completion to be queued", || {
                matches!(engine.get(b"k").unwrap(), Some(KeyState::Completing { .. }))
            });
            let during = engine.claim(b"k", &b).map(|c| format!("{c:?}"));
            drop(gate);
            assert_eq!(join_soon(&engine, completer), Ok(()));
            during
        });
        engine.flush().unwrap();
        assert_eq!(
            engine.claim(b"k", &b).err(),
            Some(ClaimError::FingerprintMismatch),
            "{mode:?}: after the completion is durable"
        );
        assert_eq!(
            during,
            Err(ClaimError::FingerprintMismatch),
            "{mode:?}: while the completion is made durable"
        );
    }
}

// ---------------------------------------------------------------------------------------
// complete
// ---------------------------------------------------------------------------------------

#[test]
fn complete_on_absent_is_lease_lost() {
    each_mode(|e| {
        assert_eq!(
            e.engine.complete(b"never", 1, b"x"),
            Err(LeaseError::LeaseLost)
        );
        let next = e.engine.stats().token_next;
        assert_eq!(
            e.engine.complete(b"never", next, b"x"),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(e.get(b"never"), None);
        // Released: Absent again, the old token cannot complete it.
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        assert_eq!(lease.release(), Ok(true));
        assert_eq!(
            e.engine.complete(b"k", token, b"x"),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(e.get(b"k"), None);
        assert_eq!(e.engine.stats().completions, 0);
        assert!(e.engine.stats().leases_lost >= 3);
    });
}

#[test]
fn complete_with_matching_token_completes() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        e.clock.advance(Duration::from_secs(5));
        let wall = e.clock.wall();
        lease.complete(b"ok").unwrap();
        e.settle();
        assert_eq!(
            e.get(b"k"),
            Some(KeyState::Completed {
                token,
                attempt: 1,
                response: Arc::from(&b"ok"[..]),
                expires_at: wall + RETENTION,
            })
        );
        assert_eq!(e.engine.stats().inflight, 0);
        assert_eq!(e.engine.stats().completed, 1);
        // The token form on the engine works the same.
        let lease = acquired(e.claim(b"k2"));
        e.engine.complete(b"k2", lease.token(), b"ok2").unwrap();
        e.settle();
        assert_eq!(completed(e.claim(b"k2")).response(), b"ok2");
        // The Lease was settled by the engine-level call; dropping it must not undo anything.
        drop(lease);
        assert_eq!(completed(e.claim(b"k2")).response(), b"ok2");
    });
}

#[test]
fn complete_with_superseded_token_is_lease_lost_and_never_overwrites() {
    each_mode(|e| {
        // Old holder tries after the new holder completed.
        let old = acquired(e.claim(b"k"));
        e.clock.advance(LEASE);
        let new = acquired(e.claim(b"k"));
        let new_token = new.token();
        new.complete(b"new").unwrap();
        e.settle();
        assert_eq!(old.complete(b"old"), Err(LeaseError::LeaseLost));
        e.settle();
        let stored = completed(e.claim(b"k"));
        assert_eq!(stored.response(), b"new");
        assert_eq!(stored.token(), new_token);

        // Old holder tries while the new holder still works: refused, and the new holder
        // completes normally afterwards.
        let old = acquired(e.claim(b"j"));
        let old_token = old.token();
        e.clock.advance(LEASE);
        let new = acquired(e.claim(b"j"));
        assert_eq!(
            e.engine.complete(b"j", old_token, b"old"),
            Err(LeaseError::LeaseLost)
        );
        assert!(
            matches!(e.get(b"j"), Some(KeyState::InFlight { token, .. }) if token == new.token())
        );
        drop(old); // its drop-release must not release the new holder's key either
        assert!(
            matches!(e.get(b"j"), Some(KeyState::InFlight { token, .. }) if token == new.token())
        );
        new.complete(b"new-j").unwrap();
        e.settle();
        assert_eq!(completed(e.claim(b"j")).response(), b"new-j");
    });
}

#[test]
fn complete_twice_with_same_token_is_idempotent() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        lease.complete(b"first").unwrap();
        // Repeat at once (under Buffered, possibly before the first is durable: the repeat
        // then waits for it, so afterwards the completion is visible without a flush).
        assert_eq!(e.engine.complete(b"k", token, b"first"), Ok(()));
        let stored = completed(e.claim(b"k"));
        assert_eq!(stored.response(), b"first");
        assert_eq!(stored.token(), token);
        // A repeat never replaces the stored response.
        assert_eq!(e.engine.complete(b"k", token, b"second"), Ok(()));
        e.settle();
        assert_eq!(completed(e.claim(b"k")).response(), b"first");
        assert_eq!(e.engine.stats().completions, 1);
        // Another token is refused on a Completed key.
        assert_eq!(
            e.engine.complete(b"k", token + 1, b"x"),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(
            e.engine.complete(b"k", token - 1, b"x"),
            Err(LeaseError::LeaseLost)
        );
    });
}

// ---------------------------------------------------------------------------------------
// release
// ---------------------------------------------------------------------------------------

#[test]
fn release_with_matching_token_makes_the_key_absent() {
    each_mode(|e| {
        let mut lease = acquired(e.claim(b"k"));
        lease.set_checkpoint(1, b"cp").unwrap();
        let token = lease.token();
        assert_eq!(lease.release(), Ok(true));
        assert_eq!(e.get(b"k"), None);
        assert_eq!(e.engine.stats().inflight, 0);
        assert_eq!(e.engine.stats().releases, 1);
        // The next claim is a fresh one, not a takeover: attempt 1, no checkpoint.
        let next = acquired(e.claim(b"k"));
        assert!(next.token() > token);
        assert_eq!(next.attempt(), 1);
        assert!(next.checkpoint().is_none());
        // The engine-level form returns the same answers.
        let t = next.token();
        assert_eq!(e.engine.release(b"k", t), Ok(true));
        assert_eq!(e.engine.release(b"k", t), Ok(false));
        assert_eq!(e.get(b"k"), None);
        drop(next); // already released by token: nothing more happens
        assert_eq!(e.engine.stats().releases, 2);
    });
}

#[test]
fn release_with_stale_token_has_no_effect() {
    each_mode(|e| {
        let t0 = e.wall_ms();
        let old = acquired(e.claim(b"k"));
        e.clock.advance(LEASE);
        let new = acquired(e.claim(b"k"));
        assert_eq!(old.release(), Ok(false));
        assert_eq!(
            e.get(b"k"),
            Some(KeyState::InFlight {
                token: new.token(),
                attempt: 2,
                lease_remaining: LEASE,
                checkpoint: None,
                first_claimed_at: Some(t0),
                attempt_started_at: Some(t0 + LEASE),
                failed: false,
            })
        );
        assert_eq!(e.engine.release(b"k", new.token() + 1), Ok(false));
        assert_eq!(e.engine.release(b"absent", 1), Ok(false));
        in_progress(e.claim(b"k"));
        assert_eq!(e.engine.stats().releases, 0);
        new.complete(b"v").unwrap();
        e.settle();
        assert_eq!(completed(e.claim(b"k")).response(), b"v");
    });
}

#[test]
fn release_on_completed_has_no_effect() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        lease.complete(b"v").unwrap();
        e.settle();
        assert_eq!(e.engine.release(b"k", token), Ok(false));
        let stored = completed(e.claim(b"k"));
        assert_eq!(stored.response(), b"v");
        assert_eq!(stored.token(), token);
        assert_eq!(e.engine.stats().releases, 0);
    });
}

/// Only a decision gives a key back: a lease dropped unsettled keeps its key InFlight
/// until the lease ends, as after a crash of its holder, then the key is taken over.
#[test]
fn dropping_an_unfinished_lease_keeps_its_key_until_the_lease_ends() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        drop(lease);
        assert!(
            matches!(e.get(b"k"), Some(KeyState::InFlight { token: t, attempt: 1, .. }) if t == token)
        );
        assert_eq!(e.engine.stats().inflight, 1);
        in_progress(e.claim(b"k"));
        e.clock.advance(LEASE - NS);
        in_progress(e.claim(b"k"));
        e.clock.advance(NS);
        let next = acquired(e.claim(b"k"));
        assert!(next.token() > token);
        assert_eq!(next.attempt(), 2);
        // A lease dropped during a panic (the usual "handler crashed" case) keeps it too.
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _held = next;
            panic!("handler crashed");
        }));
        assert!(r.is_err());
        assert!(matches!(
            e.get(b"k"),
            Some(KeyState::InFlight { attempt: 2, .. })
        ));
        in_progress(e.claim(b"k"));
        e.clock.advance(LEASE);
        let last = acquired(e.claim(b"k"));
        assert_eq!(last.attempt(), 3);
        last.complete(b"v").unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// extend / checkpoint
// ---------------------------------------------------------------------------------------

#[test]
fn extend_with_matching_token_pushes_the_deadline() {
    each_mode(|e| {
        let opts = ClaimOptions::default().lease(Duration::from_secs(10));
        let lease = acquired(e.claim_with(b"k", &opts));
        e.clock.advance(Duration::from_secs(8));
        lease.extend(Duration::from_secs(10)).unwrap(); // deadline: 8 + 10 = 18 s
        e.clock.advance(Duration::from_secs(4)); // 12 s: past the old deadline
        let busy = in_progress(e.claim(b"k"));
        assert_eq!(busy.retry_after(), Duration::from_secs(6));
        assert!(matches!(
            e.get(b"k"),
            Some(KeyState::InFlight { lease_remaining, .. }) if lease_remaining == Duration::from_secs(6)
        ));
        e.clock.advance(Duration::from_secs(6) - NS);
        in_progress(e.claim(b"k"));
        // Extending can also shorten: zero hands the key over at once.
        lease.extend(Duration::ZERO).unwrap();
        let next = acquired(e.claim(b"k"));
        assert_eq!(next.attempt(), 2);
        assert!(next.token() > lease.token());
        // The engine-level form.
        e.engine
            .extend(b"k", next.token(), Duration::from_secs(100))
            .unwrap();
        e.clock.advance(Duration::from_secs(99));
        assert_eq!(
            in_progress(e.claim(b"k")).retry_after(),
            Duration::from_secs(1)
        );
    });
}

#[test]
fn checkpoint_with_matching_token_is_saved_and_replaced() {
    each_mode(|e| {
        let mut lease = acquired(e.claim(b"k"));
        lease.set_checkpoint(1, b"one").unwrap();
        assert!(matches!(
            e.get(b"k"),
            Some(KeyState::InFlight { checkpoint: Some(c), .. }) if c == Checkpoint::new(1, b"one")
        ));
        lease.set_checkpoint(2, b"").unwrap();
        assert_eq!(lease.checkpoint(), Some(&Checkpoint::new(2, b"")));
        e.engine
            .checkpoint(b"k", lease.token(), 7, b"seven")
            .unwrap();
        assert!(matches!(
            e.get(b"k"),
            Some(KeyState::InFlight { checkpoint: Some(c), .. }) if c == Checkpoint::new(7, b"seven")
        ));
        // A checkpoint does not touch the lease deadline.
        e.clock.advance(LEASE - NS);
        in_progress(e.claim(b"k"));
        e.clock.advance(NS);
        let next = acquired(e.claim(b"k"));
        assert_eq!(next.checkpoint(), Some(&Checkpoint::new(7, b"seven")));
        assert_eq!(next.checkpoint().unwrap().phase(), 7);
        assert_eq!(next.checkpoint().unwrap().data(), b"seven");
    });
}

#[test]
fn extend_and_checkpoint_with_stale_token_are_lease_lost() {
    each_mode(|e| {
        let t0 = e.wall_ms();
        let mut old = acquired(e.claim(b"k"));
        old.set_checkpoint(1, b"old").unwrap();
        e.clock.advance(LEASE);
        let new = acquired(e.claim(b"k"));
        assert_eq!(old.extend(LEASE), Err(LeaseError::LeaseLost));
        assert_eq!(old.set_checkpoint(2, b"stale"), Err(LeaseError::LeaseLost));
        // The failed call did not change the lease's own view either.
        assert_eq!(old.checkpoint(), Some(&Checkpoint::new(1, b"old")));
        assert_eq!(
            e.engine.extend(b"k", old.token(), LEASE),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(
            e.engine.checkpoint(b"k", old.token(), 2, b"stale"),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(
            e.get(b"k"),
            Some(KeyState::InFlight {
                token: new.token(),
                attempt: 2,
                lease_remaining: LEASE,
                checkpoint: Some(Checkpoint::new(1, b"old")),
                first_claimed_at: Some(t0),
                attempt_started_at: Some(t0 + LEASE),
                failed: false,
            })
        );
        // On an absent key too.
        assert_eq!(
            e.engine.extend(b"absent", 1, LEASE),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(
            e.engine.checkpoint(b"absent", 1, 0, b""),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(e.get(b"absent"), None);
    });
}

#[test]
fn extend_and_checkpoint_on_completed_are_lease_lost() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        lease.complete(b"v").unwrap();
        e.settle();
        assert_eq!(
            e.engine.extend(b"k", token, LEASE),
            Err(LeaseError::LeaseLost)
        );
        assert_eq!(
            e.engine.checkpoint(b"k", token, 1, b"x"),
            Err(LeaseError::LeaseLost)
        );
        let stored = completed(e.claim(b"k"));
        assert_eq!(stored.response(), b"v");
        assert_eq!(stored.token(), token);
    });
}

/// DESIGN NOTE (deliberate, documented here): a lease whose time has run out is not dead
/// until another claim actually takes the key over. Until then its token is still the key's
/// current token, so `complete`, `extend`, `set_checkpoint` and `release` by that holder
/// succeed. Fencing still holds: the moment a claim takes over, the key gets a larger token
/// and every call with the old one is refused with `LeaseLost` (checked at the end).
#[test]
fn expired_lease_not_yet_taken_over_still_owns_the_key() {
    each_mode(|e| {
        let opts = ClaimOptions::default().lease(Duration::from_secs(10));

        // complete after the lease ran out, nobody took over: accepted.
        let t0 = e.wall_ms();
        let lease = acquired(e.claim_with(b"complete", &opts));
        let token = lease.token();
        e.clock.advance(Duration::from_secs(20));
        assert_eq!(
            e.get(b"complete"),
            Some(KeyState::InFlight {
                token,
                attempt: 1,
                lease_remaining: Duration::ZERO,
                checkpoint: None,
                first_claimed_at: Some(t0),
                attempt_started_at: Some(t0),
                failed: false,
            })
        );
        lease.complete(b"late but current").unwrap();
        e.settle();
        let stored = completed(e.claim(b"complete"));
        assert_eq!(stored.response(), b"late but current");
        assert_eq!(stored.token(), token);

        // extend and checkpoint after the lease ran out: accepted, and the lease is live again.
        let mut lease = acquired(e.claim_with(b"extend", &opts));
        e.clock.advance(Duration::from_secs(20));
        lease.set_checkpoint(5, b"resumed").unwrap();
        lease.extend(Duration::from_secs(5)).unwrap();
        assert_eq!(
            in_progress(e.claim(b"extend")).retry_after(),
            Duration::from_secs(5)
        );

        // release after the lease ran out: accepted (the key becomes Absent).
        let late = acquired(e.claim_with(b"release", &opts));
        e.clock.advance(Duration::from_secs(20));
        assert_eq!(late.release(), Ok(true));
        assert_eq!(e.get(b"release"), None);

        // Once a claim takes over, the old token is fenced off.
        e.clock.advance(Duration::from_secs(5));
        let new = acquired(e.claim(b"extend"));
        assert_eq!(new.attempt(), 2);
        assert_eq!(new.checkpoint(), Some(&Checkpoint::new(5, b"resumed")));
        assert_eq!(lease.extend(LEASE), Err(LeaseError::LeaseLost));
        assert_eq!(lease.complete(b"too late"), Err(LeaseError::LeaseLost));
        new.complete(b"winner").unwrap();
        e.settle();
        assert_eq!(completed(e.claim(b"extend")).response(), b"winner");
    });
}

// ---------------------------------------------------------------------------------------
// fingerprints
// ---------------------------------------------------------------------------------------

#[test]
fn fingerprint_mismatch_is_refused_on_inflight_and_completed() {
    each_mode(|e| {
        let a = ClaimOptions::default().payload(b"{\"amount\":42}");
        let b = ClaimOptions::default().payload(b"{\"amount\":43}");
        let lease = acquired(e.claim_with(b"k", &a));
        let token = lease.token();
        let next_before = e.engine.stats().token_next;

        // InFlight, lease live.
        assert_eq!(
            e.engine.claim(b"k", &b).err(),
            Some(ClaimError::FingerprintMismatch)
        );
        assert_eq!(
            e.engine.claim_or_wait(b"k", &b).err(),
            Some(ClaimError::FingerprintMismatch)
        );
        assert_eq!(in_progress(e.claim_with(b"k", &a)).attempt(), 1);

        // InFlight, lease over: the mismatching claim does not take over.
        e.clock.advance(LEASE);
        assert_eq!(
            e.engine.claim(b"k", &b).err(),
            Some(ClaimError::FingerprintMismatch)
        );
        assert!(
            matches!(e.get(b"k"), Some(KeyState::InFlight { token: t, attempt: 1, .. }) if t == token)
        );
        assert_eq!(
            e.engine.stats().token_next,
            next_before,
            "a refusal issued a token"
        );
        let lease = acquired(e.claim_with(b"k", &a)); // matching fingerprint takes over
        assert_eq!(lease.attempt(), 2);

        // Completed.
        lease.complete(b"charged 42").unwrap();
        e.settle();
        assert_eq!(
            e.engine.claim(b"k", &b).err(),
            Some(ClaimError::FingerprintMismatch)
        );
        match e
            .engine
            .run(b"k", &b, |_| Ok::<_, ()>(b"charged 43".to_vec()))
        {
            Err(RunError::Claim(ClaimError::FingerprintMismatch)) => {}
            other => panic!("expected a fingerprint mismatch, got {other:?}"),
        }
        assert_eq!(completed(e.claim_with(b"k", &a)).response(), b"charged 42");
        // `fingerprint` and `payload` are the same check.
        assert_eq!(
            e.engine
                .claim(b"k", &ClaimOptions::default().fingerprint(1))
                .err(),
            Some(ClaimError::FingerprintMismatch)
        );
        assert!(e.engine.stats().fingerprint_mismatches >= 6);
    });
}

#[test]
fn claims_without_a_fingerprint_are_not_checked() {
    each_mode(|e| {
        let a = ClaimOptions::default().fingerprint(0xA);
        let b = ClaimOptions::default().fingerprint(0xB);
        let none = ClaimOptions::default();

        // Stored with a fingerprint, claimed without one: no check.
        let lease = acquired(e.claim_with(b"k", &a));
        in_progress(e.claim_with(b"k", &none));
        // A takeover without a fingerprint keeps the stored one: a different one is still
        // refused afterwards.
        e.clock.advance(LEASE);
        let lease2 = acquired(e.claim_with(b"k", &none));
        assert!(lease2.token() > lease.token());
        assert_eq!(
            e.engine.claim(b"k", &b).err(),
            Some(ClaimError::FingerprintMismatch)
        );
        lease2.complete(b"v").unwrap();
        e.settle();
        assert_eq!(completed(e.claim_with(b"k", &none)).response(), b"v");
        assert_eq!(completed(e.claim_with(b"k", &a)).response(), b"v");
        assert_eq!(
            e.engine.claim(b"k", &b).err(),
            Some(ClaimError::FingerprintMismatch)
        );

        // Stored without a fingerprint: any claim is served.
        acquired(e.claim_with(b"j", &none)).complete(b"w").unwrap();
        e.settle();
        assert_eq!(completed(e.claim_with(b"j", &a)).response(), b"w");
        assert_eq!(completed(e.claim_with(b"j", &b)).response(), b"w");
        drop(lease);
    });
}

// ---------------------------------------------------------------------------------------
// Extreme durations
// ---------------------------------------------------------------------------------------

#[test]
fn zero_lease_is_taken_over_at_once() {
    each_mode_with(
        |b| b.lease(Duration::ZERO),
        |e| {
            let mut first = acquired(e.claim(b"k"));
            first.set_checkpoint(1, b"cp").unwrap();
            assert!(matches!(
                e.get(b"k"),
                Some(KeyState::InFlight {
                    lease_remaining: Duration::ZERO,
                    ..
                })
            ));
            let second = acquired(e.claim(b"k"));
            assert!(second.token() > first.token());
            assert_eq!(second.attempt(), 2);
            assert_eq!(second.checkpoint(), Some(&Checkpoint::new(1, b"cp")));
            assert_eq!(first.complete(b"x"), Err(LeaseError::LeaseLost));
            second.complete(b"y").unwrap();
            e.settle();
            assert_eq!(completed(e.claim(b"k")).response(), b"y");
            // Per-claim zero lease on an engine with a normal default.
            let z = ClaimOptions::default().lease(Duration::ZERO);
            let a = acquired(e.claim_with(b"z", &z));
            let b = acquired(e.claim_with(b"z", &z));
            assert_eq!(b.attempt(), 2);
            assert!(b.token() > a.token());
        },
    );
}

#[test]
fn max_lease_never_expires_and_does_not_overflow() {
    each_mode_with(
        |b| b.lease(Duration::MAX),
        |e| {
            let lease = acquired(e.claim(b"k"));
            let busy = in_progress(e.claim(b"k"));
            assert!(busy.retry_after() > Duration::from_secs(100 * 365 * 24 * 3600));
            // Centuries later, still the holder's.
            e.clock.advance(Duration::from_secs(300 * 365 * 24 * 3600));
            in_progress(e.claim(b"k"));
            assert!(matches!(
                e.get(b"k"),
                Some(KeyState::InFlight { lease_remaining, attempt: 1, .. })
                    if lease_remaining > Duration::from_secs(100 * 365 * 24 * 3600)
            ));
            lease.extend(Duration::MAX).unwrap();
            in_progress(e.claim(b"k"));
            lease.complete(b"v").unwrap();
            e.settle();
            assert_eq!(completed(e.claim(b"k")).response(), b"v");
            // Per-claim MAX, then extending by MAX again.
            let l = acquired(e.claim_with(b"j", &ClaimOptions::default().lease(Duration::MAX)));
            l.extend(Duration::MAX).unwrap();
            e.clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
            in_progress(e.claim(b"j"));
            assert_eq!(l.release(), Ok(true));
        },
    );
}

#[test]
fn zero_retention_makes_the_key_absent_on_completion() {
    each_mode_with(
        |b| b.retention(Duration::ZERO),
        |e| {
            let lease = acquired(e.claim(b"k"));
            let token = lease.token();
            lease.complete(b"gone").unwrap();
            assert_eq!(e.get(b"k"), None);
            e.settle();
            assert_eq!(e.get(b"k"), None);
            let next = acquired(e.claim(b"k"));
            assert!(next.token() > token);
            assert_eq!(next.attempt(), 1);
            assert!(next.checkpoint().is_none());
            // The old token can neither re-complete nor touch the new claim.
            assert_eq!(
                e.engine.complete(b"k", token, b"gone"),
                Err(LeaseError::LeaseLost)
            );
            next.complete(b"again").unwrap();
            e.settle();
            assert_eq!(e.get(b"k"), None);
            assert_eq!(e.engine.stats().inflight, 0);
        },
    );
}

#[test]
fn max_retention_keeps_the_key_and_does_not_overflow() {
    each_mode_with(
        |b| b.retention(Duration::MAX),
        |e| {
            let lease = acquired(e.claim(b"k"));
            lease.complete(b"forever").unwrap();
            e.settle();
            e.clock.advance(Duration::from_secs(400 * 365 * 24 * 3600));
            assert_eq!(completed(e.claim(b"k")).response(), b"forever");
            match e.get(b"k") {
                Some(KeyState::Completed { expires_at, .. }) => {
                    assert!(
                        expires_at > e.clock.wall() + Duration::from_secs(100 * 365 * 24 * 3600)
                    )
                }
                other => panic!("expected Completed, got {other:?}"),
            }
        },
    );
}

#[test]
fn retention_expiry_is_exact_and_the_key_is_new_again() {
    each_mode_with(
        |b| b.retention(Duration::from_secs(100)),
        |e| {
            let lease = acquired(e.claim(b"k"));
            let token = lease.token();
            e.clock.advance(Duration::from_secs(3));
            let wall_at_completion = e.clock.wall();
            lease.complete(b"old").unwrap();
            e.settle();
            match e.get(b"k") {
                Some(KeyState::Completed { expires_at, .. }) => {
                    assert_eq!(expires_at, wall_at_completion + Duration::from_secs(100))
                }
                other => panic!("expected Completed, got {other:?}"),
            }

            // Served up to the last nanosecond before expiry...
            e.clock.advance(Duration::from_secs(100) - NS);
            assert_eq!(completed(e.claim(b"k")).response(), b"old");
            assert!(matches!(e.get(b"k"), Some(KeyState::Completed { .. })));
            // ...and Absent exactly at it.
            e.clock.advance(NS);
            assert_eq!(e.get(b"k"), None);
            assert_eq!(
                e.engine.complete(b"k", token, b"old"),
                Err(LeaseError::LeaseLost)
            );
            let next = acquired(e.claim(b"k"));
            assert!(next.token() > token);
            assert_eq!(next.attempt(), 1);
            in_progress(e.claim(b"k")); // never the old response
            next.complete(b"new").unwrap();
            e.settle();
            let stored = completed(e.claim(b"k"));
            assert_eq!(stored.response(), b"new");
            assert!(stored.token() > token);
            assert_eq!(e.engine.stats().completed, 1);
        },
    );
}

// ---------------------------------------------------------------------------------------
// get
// ---------------------------------------------------------------------------------------

#[test]
fn get_reports_each_state() {
    each_mode(|e| {
        assert_eq!(e.get(b"k"), None);
        let at = e.wall_ms();
        let mut lease = acquired(e.claim(b"k"));
        let t1 = lease.token();
        lease.set_checkpoint(2, b"cp").unwrap();
        e.clock.advance(Duration::from_secs(10));
        assert_eq!(
            e.get(b"k"),
            Some(KeyState::InFlight {
                token: t1,
                attempt: 1,
                lease_remaining: LEASE - Duration::from_secs(10),
                checkpoint: Some(Checkpoint::new(2, b"cp")),
                first_claimed_at: Some(at),
                attempt_started_at: Some(at),
                failed: false,
            })
        );
        // Lease over, not yet taken over: still InFlight, nothing remaining.
        e.clock.advance(LEASE);
        assert_eq!(
            e.get(b"k"),
            Some(KeyState::InFlight {
                token: t1,
                attempt: 1,
                lease_remaining: Duration::ZERO,
                checkpoint: Some(Checkpoint::new(2, b"cp")),
                first_claimed_at: Some(at),
                attempt_started_at: Some(at),
                failed: false,
            })
        );
        // `get` is a read: it took nothing over.
        assert_eq!(e.engine.stats().takeovers, 0);
        let second = acquired(e.claim(b"k"));
        let t2 = second.token();
        assert!(matches!(
            e.get(b"k"),
            Some(KeyState::InFlight { token, attempt: 2, .. }) if token == t2
        ));
        let wall = e.clock.wall();
        second.complete(b"resp").unwrap();
        // Immediate acknowledges once durable (so visible), None has nothing to wait for;
        // only Buffered may still show the completion as Completing.
        match e.get(b"k") {
            Some(KeyState::Completing { token }) => {
                assert!(
                    matches!(e.mode, Durability::Buffered { .. }),
                    "acked but not visible"
                );
                assert_eq!(token, t2);
            }
            Some(KeyState::Completed { token, .. }) => assert_eq!(token, t2),
            other => panic!("unexpected state {other:?}"),
        }
        e.settle();
        assert_eq!(
            e.get(b"k"),
            Some(KeyState::Completed {
                token: t2,
                attempt: 2,
                response: Arc::from(&b"resp"[..]),
                expires_at: wall + RETENTION,
            })
        );
        e.clock.advance(RETENTION);
        assert_eq!(e.get(b"k"), None);
        drop(lease);
        // Released: Absent.
        let l = acquired(e.claim(b"r"));
        l.release().unwrap();
        assert_eq!(e.get(b"r"), None);
    });
}

// ---------------------------------------------------------------------------------------
// claim_or_wait
// ---------------------------------------------------------------------------------------

#[test]
fn claim_or_wait_returns_the_winners_response_when_it_completes() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| e.engine.claim_or_wait(b"k", &ClaimOptions::default()));
            wait_until("the waiter to block", || e.engine.stats().waits >= 1);
            assert!(!waiter.is_finished());
            lease.complete(b"winner's bytes").unwrap();
            let stored = completed(join_soon(&e.engine, waiter).unwrap());
            assert_eq!(stored.response(), b"winner's bytes");
            assert_eq!(stored.token(), token);
        });
        assert_eq!(e.engine.stats().acquired, 1);
    });
}

#[test]
fn claim_or_wait_acquires_when_the_winner_releases() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let token = lease.token();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| e.engine.claim_or_wait(b"k", &ClaimOptions::default()));
            wait_until("the waiter to block", || e.engine.stats().waits >= 1);
            assert!(!waiter.is_finished());
            assert_eq!(lease.release(), Ok(true));
            let next = acquired(join_soon(&e.engine, waiter).unwrap());
            assert!(next.token() > token);
            assert_eq!(next.attempt(), 1);
            next.complete(b"second").unwrap();
        });
    });
}

#[test]
fn claim_or_wait_takes_over_when_the_clock_passes_the_lease() {
    each_mode(|e| {
        let mut lease = acquired(e.claim(b"k"));
        lease.set_checkpoint(1, b"cp").unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| e.engine.claim_or_wait(b"k", &ClaimOptions::default()));
            wait_until("the waiter to block", || e.engine.stats().waits >= 1);
            // Still within the lease: the waiter keeps waiting.
            e.clock.advance(LEASE - NS);
            let waits = e.engine.stats().waits;
            wait_until("the waiter to look again", || {
                e.engine.stats().waits > waits
            });
            assert!(!waiter.is_finished());
            e.clock.advance(NS);
            let next = acquired(join_soon(&e.engine, waiter).unwrap());
            assert!(next.token() > lease.token());
            assert_eq!(next.attempt(), 2);
            assert_eq!(next.checkpoint(), Some(&Checkpoint::new(1, b"cp")));
        });
        assert_eq!(lease.complete(b"x"), Err(LeaseError::LeaseLost));
    });
}

#[test]
fn claim_or_wait_gives_up_after_its_wait() {
    each_mode(|e| {
        let lease = acquired(e.claim(b"k"));
        let opts = ClaimOptions::default().wait(Duration::from_secs(5));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| e.engine.claim_or_wait(b"k", &opts));
            wait_until("the waiter to block", || e.engine.stats().waits >= 1);
            e.clock.advance(Duration::from_secs(5));
            let busy = in_progress(join_soon(&e.engine, waiter).unwrap());
            assert_eq!(busy.retry_after(), LEASE - Duration::from_secs(5));
        });
        // A zero wait never blocks.
        let busy = in_progress(
            e.engine
                .claim_or_wait(b"k", &ClaimOptions::default().wait(Duration::ZERO))
                .unwrap(),
        );
        assert_eq!(busy.retry_after(), LEASE - Duration::from_secs(5));
        drop(lease);
    });
}

// ---------------------------------------------------------------------------------------
// run / run_typed
// ---------------------------------------------------------------------------------------

#[test]
fn run_winner_is_fresh_and_later_callers_replay_identical_bytes() {
    each_mode(|e| {
        let calls = AtomicUsize::new(0);
        let opts = ClaimOptions::default().payload(b"req");
        let first = e
            .engine
            .run(b"k", &opts, |lease| {
                calls.fetch_add(1, Ordering::SeqCst);
                assert_eq!(lease.attempt(), 1);
                Ok::<_, String>(format!("token {}", lease.token()).into_bytes())
            })
            .unwrap();
        assert!(!first.replayed());
        assert_eq!(
            first.response(),
            format!("token {}", first.token()).as_bytes()
        );
        for _ in 0..3 {
            let again = e
                .engine
                .run(b"k", &opts, |_| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(b"must not run".to_vec())
                })
                .unwrap();
            assert!(again.replayed());
            assert_eq!(again.response(), first.response());
            assert_eq!(again.token(), first.token());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn run_concurrent_callers_get_the_same_bytes_and_one_handler_runs() {
    each_mode(|e| {
        let calls = AtomicUsize::new(0);
        let opts = ClaimOptions::default();
        let outcomes: Vec<Outcome> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|i| {
                    let (calls, opts) = (&calls, &opts);
                    s.spawn(move || {
                        e.engine
                            .run(b"k", opts, |_| {
                                calls.fetch_add(1, Ordering::SeqCst);
                                Ok::<_, ()>(format!("ran in {i}").into_bytes())
                            })
                            .unwrap()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| join_soon(&e.engine, h))
                .collect()
        });
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(outcomes.iter().filter(|o| !o.replayed()).count(), 1);
        for o in &outcomes {
            assert_eq!(o.response(), outcomes[0].response());
            assert_eq!(o.token(), outcomes[0].token());
        }
    });
}

#[test]
fn run_handler_error_releases_and_the_next_run_runs_its_handler() {
    each_mode(|e| {
        let opts = ClaimOptions::default();
        match e.engine.run(b"k", &opts, |_| Err::<Vec<u8>, _>("boom")) {
            Err(RunError::Handler("boom")) => {}
            other => panic!("expected the handler's error, got {other:?}"),
        }
        assert_eq!(e.get(b"k"), None);
        assert_eq!(e.engine.stats().inflight, 0);
        let out = e
            .engine
            .run(b"k", &opts, |lease| {
                assert_eq!(lease.attempt(), 1);
                Ok::<_, &str>(b"second try".to_vec())
            })
            .unwrap();
        assert!(!out.replayed());
        assert_eq!(out.response(), b"second try");
    });
}

#[test]
fn run_waiter_runs_its_own_handler_when_the_winner_fails() {
    each_mode(|e| {
        let opts = ClaimOptions::default();
        let opts = &opts;
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let winner = s.spawn(move || {
                e.engine.run(b"k", opts, |_| {
                    go_rx.recv().unwrap();
                    Err::<Vec<u8>, _>("winner failed")
                })
            });
            wait_until("the winner to hold the key", || {
                matches!(e.get(b"k"), Some(KeyState::InFlight { .. }))
            });
            let loser = s.spawn(|| {
                e.engine
                    .run(b"k", opts, |_| Ok::<_, &str>(b"loser ran".to_vec()))
            });
            wait_until("the loser to wait", || e.engine.stats().waits >= 1);
            go_tx.send(()).unwrap();
            assert!(matches!(
                join_soon(&e.engine, winner),
                Err(RunError::Handler("winner failed"))
            ));
            let out = join_soon(&e.engine, loser).unwrap();
            assert!(!out.replayed());
            assert_eq!(out.response(), b"loser ran");
        });
    });
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u64,
    amount_cents: i64,
    currency: String,
    lines: Vec<(String, u32)>,
    refund_of: Option<u64>,
}

#[test]
fn run_typed_winner_is_fresh_and_replays_decode_an_equal_value() {
    each_mode(|e| {
        let opts = ClaimOptions::default().payload(b"order-42");
        let receipt = Receipt {
            id: 42,
            amount_cents: -1250,
            currency: "EUR".into(),
            lines: vec![("coffee".into(), 2), ("croissant".into(), 1)],
            refund_of: Some(7),
        };
        let first = e
            .engine
            .run_typed(b"order-42", &opts, |_| Ok::<_, ()>(receipt.clone()))
            .unwrap();
        assert_eq!(
            (&first.value, first.replayed, first.expires_at),
            (&receipt, false, first.expires_at)
        );
        let calls = AtomicUsize::new(0);
        let again = e
            .engine
            .run_typed(b"order-42", &opts, |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ()>(Receipt {
                    id: 0,
                    amount_cents: 0,
                    currency: String::new(),
                    lines: vec![],
                    refund_of: None,
                })
            })
            .unwrap();
        assert_eq!(
            (&again.value, again.replayed, again.expires_at),
            // The replay tells the winner's expiry, to the millisecond.
            (&receipt, true, first.expires_at)
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // The raw form replays the same stored bytes.
        let raw = e
            .engine
            .run(b"order-42", &opts, |_| Ok::<_, ()>(b"no".to_vec()))
            .unwrap();
        assert!(raw.replayed());
        assert!(!raw.response().is_empty());

        // A typed handler error releases the key too.
        match e
            .engine
            .run_typed::<Receipt, _>(b"t2", &opts, |_| Err("nope"))
        {
            Err(RunError::Handler("nope")) => {}
            other => panic!("expected the handler's error, got {other:?}"),
        }
        assert_eq!(e.get(b"t2"), None);
        let ok = e
            .engine
            .run_typed(b"t2", &opts, |_| Ok::<_, &str>(receipt.clone()))
            .unwrap();
        assert!(!ok.replayed);
    });
}
