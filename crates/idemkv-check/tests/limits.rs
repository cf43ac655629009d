//! Every limit refuses with its typed error before anything changes, in every durability
//! mode; invalid builder settings are refused at open; a closed engine refuses everything.

use common::wait_until;
use idemkv::error::{FlushError, Limit, NotStoredReason};
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::*;
use idemkv_check::backend as common;
use idemkv_check::modes;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use std::time::Duration;
use tempfile::TempDir;

const LEASE: Duration = Duration::from_secs(30);

struct Env {
    engine: Engine,
    clock: MockClock,
    mode: Durability,
    dir: TempDir,
}

impl Env {
    fn open(mode: Durability, tune: &dyn Fn(EngineBuilder) -> EngineBuilder) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let builder = Engine::builder()
            .durability(mode)
            .clock(clock.clone())
            .lease(LEASE);
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
            dir,
        }
    }

    fn claim(&self, key: &[u8]) -> Result<Claim, ClaimError> {
        self.engine.claim(key, &ClaimOptions::default())
    }
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

#[track_caller]
fn acquired(claim: Result<Claim, ClaimError>) -> Lease {
    match claim {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[track_caller]
fn completed(claim: Result<Claim, ClaimError>) -> Stored {
    match claim {
        Ok(Claim::Completed(stored)) => stored,
        other => panic!("expected Completed, got {other:?}"),
    }
}

#[track_caller]
fn claim_err(claim: Result<Claim, ClaimError>) -> ClaimError {
    match claim {
        Err(e) => e,
        Ok(other) => panic!("expected an error, got {other:?}"),
    }
}

#[track_caller]
fn run_claim_err<E: std::fmt::Debug>(r: Result<Outcome, RunError<E>>) -> ClaimError {
    match r {
        Err(RunError::Claim(e)) => e,
        other => panic!("expected RunError::Claim, got {other:?}"),
    }
}

/// Counters that a refused call must not move.
fn footprint(engine: &Engine) -> (u64, u64, u64, u64) {
    let s = engine.stats();
    (s.inflight, s.completed, s.acquired, s.token_next)
}

// ---------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------

#[test]
fn key_of_256_bytes_is_refused_and_255_accepted_by_default() {
    each_mode_with(
        |b| b,
        |e| {
            let long = vec![b'x'; 256];
            let max = vec![b'y'; 255];
            let refused = ClaimError::KeyTooLong { len: 256, max: 255 };
            let before = footprint(&e.engine);
            assert_eq!(claim_err(e.claim(&long)), refused);
            assert_eq!(
                claim_err(e.engine.claim_or_wait(&long, &ClaimOptions::default())),
                refused
            );
            assert_eq!(e.engine.get(&long), Err(refused.clone()));
            let ran = std::cell::Cell::new(false);
            let r = e.engine.run(&long, &ClaimOptions::default(), |_| {
                ran.set(true);
                Ok::<_, ()>(vec![])
            });
            assert_eq!(run_claim_err(r), refused);
            assert!(!ran.get(), "the handler ran for a refused key");
            match e
                .engine
                .run_typed::<u32, ()>(&long, &ClaimOptions::default(), |_| Ok(1))
            {
                Err(RunError::Claim(err)) => assert_eq!(err, refused),
                other => panic!("{other:?}"),
            }
            let lease_refused = LeaseError::KeyTooLong { len: 256, max: 255 };
            assert_eq!(
                e.engine.complete(&long, 1, b"r"),
                Err(lease_refused.clone())
            );
            assert_eq!(e.engine.release(&long, 1), Err(lease_refused.clone()));
            assert_eq!(e.engine.extend(&long, 1, LEASE), Err(lease_refused.clone()));
            assert_eq!(
                e.engine.checkpoint(&long, 1, 0, b""),
                Err(lease_refused.clone())
            );
            assert_eq!(footprint(&e.engine), before, "a refused key changed state");
            assert_eq!(e.engine.stats().claims, 0);

            // 255 bytes go through the whole life cycle.
            let lease = acquired(e.claim(&max));
            assert_eq!(lease.key(), &max[..]);
            lease.complete(b"ok").unwrap();
            e.engine.flush().unwrap();
            assert_eq!(completed(e.claim(&max)).response(), b"ok");
            // Keys are bytes: anything non-empty within the limit, including NUL and 0xFF.
            let odd = [0u8, 0xFF, b'\n', 0];
            acquired(e.claim(&odd)).complete(b"odd").unwrap();
            e.engine.flush().unwrap();
            assert_eq!(completed(e.claim(&odd)).response(), b"odd");
        },
    );
}

#[test]
fn builder_key_len_max_sets_the_limit() {
    each_mode_with(
        |b| b.key_len_max(16),
        |e| {
            assert_eq!(
                claim_err(e.claim(&[7u8; 17])),
                ClaimError::KeyTooLong { len: 17, max: 16 }
            );
            assert_eq!(e.engine.get(&[7u8; 16]), Ok(None));
            acquired(e.claim(&[7u8; 16])).complete(b"v").unwrap();
            assert_eq!(e.engine.stats().completions, 1);
        },
    );
    // The hard ceiling is 4096 bytes.
    each_mode_with(
        |b| b.key_len_max(4096),
        |e| {
            assert_eq!(
                claim_err(e.claim(&[1u8; 4097])),
                ClaimError::KeyTooLong {
                    len: 4097,
                    max: 4096
                }
            );
            acquired(e.claim(&[1u8; 4096])).complete(b"v").unwrap();
            e.engine.flush().unwrap();
            assert_eq!(completed(e.claim(&[1u8; 4096])).response(), b"v");
        },
    );
    each_mode_with(
        |b| b.key_len_max(1),
        |e| {
            assert!(matches!(
                claim_err(e.claim(b"ab")),
                ClaimError::KeyTooLong { len: 2, max: 1 }
            ));
            drop(acquired(e.claim(b"a")));
        },
    );
}

#[test]
fn empty_key_is_refused() {
    each_mode_with(
        |b| b,
        |e| {
            let before = footprint(&e.engine);
            assert_eq!(claim_err(e.claim(b"")), ClaimError::KeyEmpty);
            assert_eq!(
                claim_err(e.engine.claim_or_wait(b"", &ClaimOptions::default())),
                ClaimError::KeyEmpty
            );
            assert_eq!(e.engine.get(b""), Err(ClaimError::KeyEmpty));
            let r = e
                .engine
                .run(b"", &ClaimOptions::default(), |_| Ok::<_, ()>(vec![]));
            assert_eq!(run_claim_err(r), ClaimError::KeyEmpty);
            // No lease can own an empty key.
            assert_eq!(e.engine.complete(b"", 1, b"r"), Err(LeaseError::LeaseLost));
            assert_eq!(e.engine.extend(b"", 1, LEASE), Err(LeaseError::LeaseLost));
            assert_eq!(e.engine.release(b"", 1), Err(LeaseError::LeaseLost));
            assert_eq!(
                e.engine.checkpoint(b"", 1, 0, b""),
                Err(LeaseError::LeaseLost)
            );
            assert_eq!(footprint(&e.engine), before);
        },
    );
}

// ---------------------------------------------------------------------------------------
// Responses and checkpoints
// ---------------------------------------------------------------------------------------

#[test]
fn response_too_large_is_refused_and_the_lease_stays_usable() {
    each_mode_with(
        |b| b.response_len_max(100),
        |e| {
            let refused = LeaseError::ResponseTooLarge { len: 101, max: 100 };

            // Through the engine while the Lease is kept: the Lease can complete afterwards.
            let lease = acquired(e.claim(b"k"));
            let token = lease.token();
            assert_eq!(
                e.engine.complete(b"k", token, &[0u8; 101]),
                Err(refused.clone())
            );
            assert!(matches!(
                e.engine.get(b"k").unwrap(),
                Some(KeyState::InFlight { token: t, attempt: 1, .. }) if t == token
            ));
            assert_eq!(e.engine.stats().completions, 0);
            assert!(matches!(e.claim(b"k"), Ok(Claim::InProgress(_))));
            lease.complete(&[9u8; 100]).unwrap(); // exactly the limit
            e.engine.flush().unwrap();
            assert_eq!(completed(e.claim(b"k")).response(), &[9u8; 100][..]);

            // Through `Lease::complete`, which consumes the lease: nothing is stored, and the
            // key is not released (the work is done): it stays InFlight under the token until
            // the lease ends, and the token form can still settle it meanwhile.
            let lease = acquired(e.claim(b"j"));
            let token = lease.token();
            assert_eq!(lease.complete(&[0u8; 101]), Err(refused.clone()));
            assert!(matches!(
                e.engine.get(b"j").unwrap(),
                Some(KeyState::InFlight { token: t, lease_remaining, .. })
                    if t == token && lease_remaining == LEASE
            ));
            assert!(matches!(e.claim(b"j"), Ok(Claim::InProgress(_))));
            e.engine.complete(b"j", token, b"small").unwrap();
            e.engine.flush().unwrap();
            let s = completed(e.claim(b"j"));
            assert_eq!((s.response(), s.token()), (&b"small"[..], token));

            // Through `run`: `NotStored`, nothing stored, the key still held by the run's
            // token; the next run after the lease ended takes it over.
            let (token, retry_after) = match e.engine.run(b"r", &ClaimOptions::default(), |_| {
                Ok::<_, ()>(vec![1; 101])
            }) {
                Err(RunError::NotStored {
                    reason: NotStoredReason::ResponseTooLarge { len: 101, max: 100 },
                    token,
                    retry_after,
                }) => (token, retry_after),
                other => panic!("expected NotStored(ResponseTooLarge), got {other:?}"),
            };
            assert_eq!(retry_after, LEASE);
            assert!(matches!(
                e.engine.get(b"r").unwrap(),
                Some(KeyState::InFlight { token: t, .. }) if t == token
            ));
            e.clock.advance(LEASE);
            let out = e
                .engine
                .run(b"r", &ClaimOptions::default(), |lease| {
                    assert_eq!(lease.attempt(), 2, "a takeover after the lease ended");
                    Ok::<_, ()>(vec![1; 100])
                })
                .unwrap();
            assert!(!out.replayed());
            assert!(out.token() > token);
            match e.engine.run_typed(b"t", &ClaimOptions::default(), |_| {
                Ok::<_, ()>(vec![0u64; 100])
            }) {
                Err(RunError::NotStored {
                    reason: NotStoredReason::ResponseTooLarge { max: 100, len },
                    ..
                }) => assert!(len > 100),
                other => panic!("expected NotStored(ResponseTooLarge), got {other:?}"),
            }
        },
    );
    // Zero allows only the empty response.
    each_mode_with(
        |b| b.response_len_max(0),
        |e| {
            let lease = acquired(e.claim(b"k"));
            assert_eq!(
                e.engine.complete(b"k", lease.token(), b"x"),
                Err(LeaseError::ResponseTooLarge { len: 1, max: 0 })
            );
            lease.complete(b"").unwrap();
        },
    );
}

#[test]
fn checkpoint_too_large_is_refused_and_the_old_checkpoint_kept() {
    each_mode_with(
        |b| b.checkpoint_len_max(8),
        |e| {
            let mut lease = acquired(e.claim(b"k"));
            lease.set_checkpoint(1, &[1u8; 8]).unwrap(); // exactly the limit
            let refused = LeaseError::CheckpointTooLarge { len: 9, max: 8 };
            assert_eq!(lease.set_checkpoint(2, &[2u8; 9]), Err(refused.clone()));
            assert_eq!(
                e.engine.checkpoint(b"k", lease.token(), 2, &[2u8; 9]),
                Err(refused)
            );
            assert_eq!(lease.checkpoint(), Some(&Checkpoint::new(1, &[1u8; 8])));
            assert!(matches!(
                e.engine.get(b"k").unwrap(),
                Some(KeyState::InFlight { checkpoint: Some(c), .. }) if c == Checkpoint::new(1, &[1u8; 8])
            ));
            // Still usable.
            lease.set_checkpoint(3, b"small").unwrap();
            lease.extend(LEASE).unwrap();
            lease.complete(b"done").unwrap();
            e.engine.flush().unwrap();
            assert_eq!(completed(e.claim(b"k")).response(), b"done");
        },
    );
    // The default is 64 KiB.
    each_mode_with(
        |b| b,
        |e| {
            let mut lease = acquired(e.claim(b"k"));
            lease.set_checkpoint(1, &vec![0u8; 64 << 10]).unwrap();
            assert_eq!(
                lease.set_checkpoint(1, &vec![0u8; (64 << 10) + 1]),
                Err(LeaseError::CheckpointTooLarge {
                    len: (64 << 10) + 1,
                    max: 64 << 10
                })
            );
        },
    );
}

// ---------------------------------------------------------------------------------------
// In-flight claims
// ---------------------------------------------------------------------------------------

#[test]
fn inflight_max_refuses_the_next_claim_until_one_settles() {
    each_mode_with(
        |b| b.inflight_max(3),
        |e| {
            let a = acquired(e.claim(b"a"));
            let b = acquired(e.claim(b"b"));
            let c = acquired(e.claim(b"c"));
            let before = footprint(&e.engine);
            let full = ClaimError::Overloaded(Limit::InFlightClaims);
            assert_eq!(claim_err(e.claim(b"d")), full);
            assert_eq!(
                claim_err(e.engine.claim_or_wait(b"d", &ClaimOptions::default())),
                full
            );
            let r = e
                .engine
                .run(b"d", &ClaimOptions::default(), |_| Ok::<_, ()>(vec![]));
            assert_eq!(run_claim_err(r), full);
            assert_eq!(e.engine.get(b"d"), Ok(None));
            assert_eq!(
                footprint(&e.engine),
                before,
                "a refused claim changed state"
            );
            assert_eq!(e.engine.stats().overloaded, 3);
            // Claims of held keys are answered as usual.
            assert!(matches!(e.claim(b"a"), Ok(Claim::InProgress(_))));

            // Completing one frees a place.
            a.complete(b"A").unwrap();
            let d = acquired(e.claim(b"d"));
            assert_eq!(claim_err(e.claim(b"e")), full);
            // Releasing one too; dropping one does not: its lease keeps the key, and its
            // place, until it ends (or its token settles it).
            b.release().unwrap();
            let e2 = acquired(e.claim(b"e"));
            let c_token = c.token();
            drop(c);
            assert_eq!(claim_err(e.claim(b"f")), full);
            assert_eq!(e.engine.release(b"c", c_token), Ok(true));
            let f = acquired(e.claim(b"f"));
            assert_eq!(claim_err(e.claim(b"g")), full);
            assert_eq!(e.engine.stats().inflight, 3);

            // A replay of a completed key is not a claim on a place.
            e.engine.flush().unwrap();
            assert_eq!(completed(e.claim(b"a")).response(), b"A");

            // A takeover of an ended lease inherits its place: it does not count twice.
            e.clock.advance(LEASE);
            let d2 = acquired(e.claim(b"d"));
            assert_eq!(d2.attempt(), 2);
            let e3 = acquired(e.claim(b"e"));
            assert_eq!(e3.attempt(), 2);
            // "f"'s lease ended too and nobody took it over: only live leases count, so it
            // holds no place any more and a new key is admitted.
            let stats = e.engine.stats();
            assert_eq!((stats.inflight, stats.abandoned), (2, 1));
            let g = acquired(e.claim(b"g"));
            assert_eq!(claim_err(e.claim(b"h")), full);
            // The superseded leases do not give places back when dropped or refused.
            assert_eq!(d.complete(b"stale"), Err(LeaseError::LeaseLost));
            drop(e2);
            assert_eq!(e.engine.stats().inflight, 3);
            assert_eq!(claim_err(e.claim(b"h")), full);
            // Taking over the abandoned "f" makes a lease live again: it needs a place.
            assert_eq!(claim_err(e.claim(b"f")), full);
            d2.complete(b"D").unwrap();
            let f2 = acquired(e.claim(b"f"));
            assert_eq!(f2.attempt(), 2);
            let stats = e.engine.stats();
            assert_eq!((stats.inflight, stats.abandoned), (3, 0));
            // Only a decision gives the places back: dropped, they would stay live.
            for lease in [e3, f, g, f2] {
                lease.release().unwrap();
            }
            assert_eq!(e.engine.stats().inflight, 0);
        },
    );
}

#[test]
fn keys_max_refuses_new_keys_until_one_expires() {
    each_mode_with(
        |b| {
            b.keys_max(3)
                .retention(Duration::from_secs(100))
                .tuning(idemkv::Tuning::default().sweep_interval(None))
        },
        |e| {
            acquired(e.claim(b"a")).complete(b"A").unwrap();
            e.clock.advance(Duration::from_secs(10));
            acquired(e.claim(b"b")).complete(b"B").unwrap();
            let c = acquired(e.claim(b"c"));
            e.engine.flush().unwrap();
            let before = footprint(&e.engine);
            let full = ClaimError::Overloaded(Limit::Keys);
            assert_eq!(claim_err(e.claim(b"d")), full);
            assert_eq!(e.engine.get(b"d"), Ok(None));
            assert_eq!(footprint(&e.engine), before, "a refused key changed state");
            // Known keys are served as usual: replays, and a takeover of the held one.
            assert_eq!(completed(e.claim(b"a")).response(), b"A");
            e.clock.advance(LEASE);
            let c2 = acquired(e.claim(b"c"));
            assert_eq!(c2.attempt(), 2);
            assert_eq!(claim_err(e.claim(b"d")), full);
            drop(c);
            // Now at 40 s. "a" expires at 100 s: from then on its place is free, never
            // earlier.
            e.clock
                .advance(Duration::from_secs(60) - Duration::from_nanos(1));
            assert_eq!(claim_err(e.claim(b"d")), full);
            e.clock.advance(Duration::from_nanos(1));
            let d = acquired(e.claim(b"d"));
            assert_eq!(e.engine.get(b"a"), Ok(None));
            assert_eq!(completed(e.claim(b"b")).response(), b"B");
            drop((c2, d));
        },
    );
}

// ---------------------------------------------------------------------------------------
// Builder settings
// ---------------------------------------------------------------------------------------

#[test]
fn invalid_builder_settings_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.redb");
    let base = || Engine::builder().path(&path).clock(MockClock::new());
    let cases: Vec<(&str, EngineBuilder)> = vec![
        (
            "stripes 0",
            base().tuning(idemkv::Tuning::default().stripes(0)),
        ),
        (
            "stripes 3",
            base().tuning(idemkv::Tuning::default().stripes(3)),
        ),
        (
            "stripes 96",
            base().tuning(idemkv::Tuning::default().stripes(96)),
        ),
        (
            "stripes 2^17",
            base().tuning(idemkv::Tuning::default().stripes(1 << 17)),
        ),
        (
            "queue_depth 0",
            base().tuning(idemkv::Tuning::default().queue_depth(0)),
        ),
        (
            "queue_depth 15",
            base().tuning(idemkv::Tuning::default().queue_depth(15)),
        ),
        (
            "queue_depth 2^20+1",
            base().tuning(idemkv::Tuning::default().queue_depth((1 << 20) + 1)),
        ),
        ("key_len_max 0", base().key_len_max(0)),
        ("key_len_max 4097", base().key_len_max(4097)),
        (
            "response_len_max 64 MiB + 1",
            base().response_len_max((64 << 20) + 1),
        ),
        (
            "checkpoint_len_max 16 MiB + 1",
            base().checkpoint_len_max((16 << 20) + 1),
        ),
        ("inflight_max 0", base().inflight_max(0)),
        ("keys_max 0", base().keys_max(0)),
        (
            "Immediate without a path",
            Engine::builder().durability(Durability::Immediate),
        ),
        (
            "Buffered without a path",
            Engine::builder().durability(Durability::buffered()),
        ),
        ("default builder without a path", Engine::builder()),
    ];
    for (what, builder) in cases {
        match builder.open() {
            Err(OpenError::InvalidConfig { detail }) => {
                assert!(!detail.is_empty(), "{what}: empty detail")
            }
            other => panic!("{what}: expected InvalidConfig, got {other:?}"),
        }
        assert!(!path.exists(), "{what}: a refused config created the file");
    }
    // Every case refused above only for its one setting: the edges are accepted.
    let ok: Vec<(&str, EngineBuilder)> = vec![
        (
            "stripes 1",
            base().tuning(idemkv::Tuning::default().stripes(1)),
        ),
        (
            "stripes 2^16",
            base().tuning(idemkv::Tuning::default().stripes(1 << 16)),
        ),
        (
            "queue_depth 16",
            base().tuning(idemkv::Tuning::default().queue_depth(16)),
        ),
        (
            "queue_depth 2^20",
            base().tuning(idemkv::Tuning::default().queue_depth(1 << 20)),
        ),
        ("key_len_max 1", base().key_len_max(1)),
        ("key_len_max 4096", base().key_len_max(4096)),
        ("response_len_max 64 MiB", base().response_len_max(64 << 20)),
        ("response_len_max 0", base().response_len_max(0)),
        (
            "checkpoint_len_max 16 MiB",
            base().checkpoint_len_max(16 << 20),
        ),
        ("inflight_max 1", base().inflight_max(1)),
        ("keys_max 1", base().keys_max(1)),
        (
            "None without a path",
            Engine::builder().durability(Durability::None),
        ),
    ];
    for (what, builder) in ok {
        match builder.open() {
            Ok(engine) => engine.close().unwrap(),
            Err(e) => panic!("{what}: refused: {e}"),
        }
    }
    assert!(Engine::open(dir.path().join("default.redb")).is_ok());
}

// ---------------------------------------------------------------------------------------
// Closed engine
// ---------------------------------------------------------------------------------------

#[test]
fn a_closed_engine_refuses_every_call() {
    each_mode_with(
        |b| b,
        |e| {
            let mut held = acquired(e.claim(b"held"));
            let token = held.token();
            let unsettled = acquired(e.claim(b"unsettled"));
            acquired(e.claim(b"done")).complete(b"v").unwrap();
            let clone = e.engine.clone();
            e.engine.close().unwrap();
            assert_eq!(e.engine.close(), Ok(()), "close is idempotent");

            for engine in [&e.engine, &clone] {
                assert_eq!(
                    claim_err(engine.claim(b"new", &ClaimOptions::default())),
                    ClaimError::Closed
                );
                assert_eq!(
                    claim_err(engine.claim(b"done", &ClaimOptions::default())),
                    ClaimError::Closed
                );
                assert_eq!(
                    claim_err(engine.claim_or_wait(b"held", &ClaimOptions::default())),
                    ClaimError::Closed
                );
                assert_eq!(engine.get(b"held"), Err(ClaimError::Closed));
                let r = engine.run(b"new", &ClaimOptions::default(), |_| Ok::<_, ()>(vec![]));
                assert_eq!(run_claim_err(r), ClaimError::Closed);
                assert_eq!(
                    engine.complete(b"held", token, b"x"),
                    Err(LeaseError::Closed)
                );
                assert_eq!(engine.release(b"held", token), Err(LeaseError::Closed));
                assert_eq!(
                    engine.extend(b"held", token, LEASE),
                    Err(LeaseError::Closed)
                );
                assert_eq!(
                    engine.checkpoint(b"held", token, 1, b"x"),
                    Err(LeaseError::Closed)
                );
                assert_eq!(engine.flush(), Err(FlushError::Closed));
            }
            assert_eq!(held.extend(LEASE), Err(LeaseError::Closed));
            assert_eq!(held.set_checkpoint(1, b"x"), Err(LeaseError::Closed));
            assert_eq!(held.complete(b"x"), Err(LeaseError::Closed));
            // Dropping an unsettled lease after close is quiet and changes nothing.
            drop(unsettled);

            // The file is free again: a new engine recovers what the closed one left.
            if e.mode != Durability::None {
                let engine = Engine::builder()
                    .path(e.dir.path().join("idem.redb"))
                    .durability(e.mode)
                    .clock(e.clock.clone())
                    .open()
                    .unwrap();
                assert_eq!(
                    completed(engine.claim(b"done", &ClaimOptions::default())).response(),
                    b"v"
                );
                let l = acquired(engine.claim(b"held", &ClaimOptions::default()));
                assert_eq!(l.attempt(), 2);
                assert!(l.token() > token);
                let l = acquired(engine.claim(b"unsettled", &ClaimOptions::default()));
                assert_eq!(l.attempt(), 2, "the drop after close released the key");
            }
        },
    );
}

#[test]
fn close_wakes_waiters_with_closed() {
    each_mode_with(
        |b| b,
        |e| {
            let lease = acquired(e.claim(b"k"));
            std::thread::scope(|s| {
                let waiter = s.spawn(|| e.engine.claim_or_wait(b"k", &ClaimOptions::default()));
                wait_until("the waiter to block", || e.engine.stats().waits >= 1);
                e.engine.close().unwrap();
                assert_eq!(claim_err(waiter.join().unwrap()), ClaimError::Closed);
            });
            drop(lease);
        },
    );
}

// ---------------------------------------------------------------------------------------
// Writer queue: a disk that holds its fsync lets the queue fill deterministically.
// ---------------------------------------------------------------------------------------

#[test]
fn full_writer_queue_refuses_claims_and_holders_wait_for_room() {
    let backend = FaultyStorage::memory();
    let engine = Engine::builder()
        .backend(backend.clone())
        .durability(Durability::buffered())
        .clock(MockClock::new())
        // Claims may use 14 places, counting what the writer is committing (`Buffered`
        // admits by what is not yet durable); the rest is kept for holders.
        .tuning(idemkv::Tuning::default().queue_depth(16))
        .open()
        .unwrap();
    let opts = ClaimOptions::default();

    // Holds every fsync until dropped (also when the test fails).
    let gate = backend.close_gate();
    let first = acquired(engine.claim(b"first", &opts));
    common::wait_sync_held(&backend);

    let mut held = Vec::new();
    for i in 0..13u32 {
        held.push(acquired(engine.claim(&i.to_be_bytes(), &opts)));
    }
    assert_eq!(engine.stats().queue_depth, 13);
    let full = ClaimError::Overloaded(Limit::WriterQueue);
    assert_eq!(claim_err(engine.claim(b"one more", &opts)), full);
    assert_eq!(engine.get(b"one more"), Ok(None));
    assert_eq!(engine.stats().inflight, 14);
    // Holders can still settle in the headroom.
    let t0 = held[0].token();
    held.remove(0).complete(b"done").unwrap();
    assert_eq!(held.remove(0).release(), Ok(true));
    held.pop().unwrap().complete(b"last").unwrap();
    assert_eq!(engine.stats().queue_depth, 16);
    // Past the headroom a holder's completion waits for room (while its lease lasts)
    // instead of failing; meanwhile the key stays as it was.
    let l = held.remove(0);
    let token = l.token();
    let key = l.key().to_vec();
    let waiter = {
        let engine = engine.clone();
        let key = key.clone();
        std::thread::spawn(move || engine.complete(&key, token, b"after"))
    };
    assert!(matches!(
        engine.get(&key).unwrap(),
        Some(KeyState::InFlight { token: t, .. }) if t == token
    ));

    drop(gate);
    assert_eq!(waiter.join().unwrap(), Ok(()));
    drop(l); // settled through the token form; the drop changes nothing
    engine.flush().unwrap();
    assert_eq!(engine.stats().queue_depth, 0);
    assert_eq!(
        completed(engine.claim(&2u32.to_be_bytes(), &opts)).response(),
        b"after"
    );
    let s = completed(engine.claim(&0u32.to_be_bytes(), &opts));
    assert_eq!((s.response(), s.token()), (&b"done"[..], t0));
    drop(acquired(engine.claim(b"one more", &opts)));
    drop(first);
    drop(held);
}
