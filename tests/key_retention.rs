//! A key's own retention (`ClaimOptions::retention`, `CompleteOptions::retention`) and the
//! expiry instant replays report (`Stored::expires_at`, `Outcome::expires_at`), in every
//! durability mode, across takeovers and restarts. Every test drives a `MockClock`; none
//! sleeps.

use idemkv::*;
use idemkv_check::fixture;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// The engine's retention; keys choose shorter and longer ones.
const RETENTION: Duration = Duration::from_secs(3600);
const MIN: Duration = Duration::from_secs(60);
const NS: Duration = Duration::from_nanos(1);

const MODES: [Durability; 3] = [
    Durability::None,
    Durability::Buffered {
        max_delay: Duration::from_millis(10),
    },
    Durability::Immediate,
];

fn builder(path: &Path, clock: &MockClock, mode: Durability) -> EngineBuilder {
    fixture::builder(path, clock, mode).retention(RETENTION)
}

fn open(path: &Path, clock: &MockClock, mode: Durability) -> Engine {
    builder(path, clock, mode).open().unwrap()
}

fn acquire(engine: &Engine, key: &str, opts: &ClaimOptions) -> Lease {
    fixture::acquire(engine, key.as_bytes(), opts)
}

/// The key's stored answer if it is Completed; `None` if a claim acquires it (the claim is
/// released again).
fn replay(engine: &Engine, key: &str) -> Option<Stored> {
    match engine
        .claim(key.as_bytes(), &ClaimOptions::default())
        .unwrap()
    {
        Claim::Completed(stored) => Some(stored),
        Claim::Acquired(lease) => {
            lease.release().unwrap();
            None
        }
        Claim::InProgress(busy) => panic!("{key} unexpectedly in progress: {busy:?}"),
        Claim::Forgotten(f) => panic!("{key} unexpectedly forgotten (markers are off): {f:?}"),
    }
}

fn kept(d: Duration) -> CompleteOptions {
    CompleteOptions::default().retention(d)
}

/// Asserts the key is replayed one tick before `at` (after `at - now - 1ns` more) and
/// Absent from `at` on, without a sweep removing it a tick early.
fn expires_exactly(engine: &Engine, clock: &MockClock, key: &str, left: Duration, what: &str) {
    clock.advance(left - NS);
    assert_eq!(
        engine.admin().sweep_now().unwrap(),
        0,
        "{what}: a tick early"
    );
    assert!(replay(engine, key).is_some(), "{what}: served a tick early");
    clock.advance(NS);
    assert_eq!(
        engine.get(key.as_bytes()).unwrap(),
        None,
        "{what}: at the instant"
    );
    assert_eq!(
        engine.admin().sweep_now().unwrap(),
        1,
        "{what}: swept at the instant"
    );
}

#[test]
fn a_claims_and_a_completions_own_retention_end_exactly_at_their_instant() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let engine = open(&dir.path().join("k.redb"), &clock, mode);
        // The claim's retention, shorter than the engine's.
        let opts = ClaimOptions::default().retention(10 * MIN);
        acquire(&engine, "claim", &opts).complete(b"c").unwrap();
        engine.flush().unwrap();
        expires_exactly(
            &engine,
            &clock,
            "claim",
            10 * MIN,
            &format!("{mode:?} claim"),
        );
        // The completion's retention wins over the claim's, longer than the engine's.
        let lease = acquire(&engine, "both", &opts);
        lease
            .complete_with_options(b"b", &kept(2 * RETENTION))
            .unwrap();
        engine.flush().unwrap();
        clock.advance(RETENTION);
        assert!(
            replay(&engine, "both").is_some(),
            "{mode:?}: past the claim's"
        );
        expires_exactly(
            &engine,
            &clock,
            "both",
            RETENTION,
            &format!("{mode:?} completion"),
        );
        // A retention of its own is kept to the millisecond, rounded up: 1.5 ms is 2 ms.
        let lease = acquire(&engine, "sub-ms", &ClaimOptions::default());
        lease
            .complete_with_options(b"s", &kept(Duration::from_micros(1500)))
            .unwrap();
        engine.flush().unwrap();
        expires_exactly(
            &engine,
            &clock,
            "sub-ms",
            Duration::from_millis(2),
            &format!("{mode:?} rounded up"),
        );
    }
}

/// Completions with mixed retentions, made in an order unrelated to their deadlines: after
/// every step exactly the keys whose deadline has passed are gone, and a sweep removes
/// exactly those, never one before its instant.
#[test]
fn mixed_retentions_expire_in_deadline_order_whatever_the_completion_order() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let engine = open(&dir.path().join("k.redb"), &clock, mode);
        let mut rng = fastrand::Rng::with_seed(7);
        // (key, deadline from the start, in whole minutes)
        let mut keys = Vec::new();
        for i in 0..120u32 {
            let key = format!("k{i}");
            let lease = acquire(&engine, &key, &ClaimOptions::default());
            let made = u64::from(i / 40); // completed at minutes 0, 1 and 2
            let keep_min = match rng.u8(0..3) {
                0 => None,
                _ => Some(rng.u64(1..180)),
            };
            match keep_min {
                None => lease.complete(b"v").unwrap(),
                Some(m) => lease
                    .complete_with_options(b"v", &kept(MIN * m as u32))
                    .unwrap(),
            }
            keys.push((key, made + keep_min.unwrap_or(60)));
            if i % 40 == 39 {
                clock.advance(MIN);
            }
        }
        engine.flush().unwrap();
        let mut now_min = 3;
        let mut gone = 0;
        while now_min <= 183 {
            let due = keys.iter().filter(|(_, d)| *d <= now_min).count();
            let stats = engine.stats();
            assert_eq!(
                stats.expired_unswept as usize,
                due - gone,
                "{mode:?} at minute {now_min}"
            );
            let swept = engine.admin().sweep_now().unwrap() as usize;
            assert_eq!(swept, due - gone, "{mode:?} at minute {now_min}");
            gone = due;
            for (key, deadline) in &keys {
                let state = engine.get(key.as_bytes()).unwrap();
                assert_eq!(
                    state.is_none(),
                    *deadline <= now_min,
                    "{mode:?}: {key} due at minute {deadline}, now {now_min}"
                );
            }
            // One tick before the next minute, nothing more is due.
            clock.advance(MIN - NS);
            assert_eq!(engine.admin().sweep_now().unwrap(), 0, "{mode:?}");
            clock.advance(NS);
            now_min += 1;
        }
        assert_eq!(gone, keys.len());
    }
}

#[test]
fn a_takeover_keeps_the_claims_retention_unless_it_asks_for_its_own() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let engine = open(&dir.path().join("k.redb"), &clock, mode);
        let first = ClaimOptions::default()
            .retention(10 * MIN)
            .lease(Duration::from_secs(1));
        for key in ["kept", "asked"] {
            acquire(&engine, key, &first).detach();
        }
        clock.advance(Duration::from_secs(1));
        let lease = acquire(&engine, "kept", &ClaimOptions::default());
        assert_eq!(lease.attempt(), 2);
        lease.complete(b"k").unwrap();
        let asked = ClaimOptions::default().retention(20 * MIN);
        let lease = acquire(&engine, "asked", &asked);
        assert_eq!(lease.attempt(), 2);
        lease.complete(b"a").unwrap();
        engine.flush().unwrap();
        expires_exactly(&engine, &clock, "kept", 10 * MIN, &format!("{mode:?} kept"));
        expires_exactly(
            &engine,
            &clock,
            "asked",
            10 * MIN,
            &format!("{mode:?} asked"),
        );
    }
}

#[test]
fn an_abandoned_claim_is_reaped_by_its_own_retention() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let engine = open(&dir.path().join("k.redb"), &clock, mode);
        let lease = Duration::from_secs(1);
        let short = ClaimOptions::default().retention(10 * MIN).lease(lease);
        let long = ClaimOptions::default()
            .retention(2 * RETENTION)
            .lease(lease);
        acquire(&engine, "short", &short).detach();
        acquire(&engine, "long", &long).detach();
        acquire(&engine, "engine", &ClaimOptions::default().lease(lease)).detach();
        engine.flush().unwrap();
        for (key, reap_at) in [
            ("short", lease + 10 * MIN),
            ("engine", lease + RETENTION),
            ("long", lease + 2 * RETENTION),
        ] {
            let now = clock.monotonic();
            clock.advance(reap_at - now - NS);
            assert_eq!(engine.admin().sweep_now().unwrap(), 0, "{mode:?} {key}");
            assert!(
                matches!(
                    engine.get(key.as_bytes()).unwrap(),
                    Some(KeyState::InFlight { .. })
                ),
                "{mode:?}: {key} still there a tick early"
            );
            clock.advance(NS);
            assert_eq!(engine.admin().sweep_now().unwrap(), 1, "{mode:?} {key}");
            assert_eq!(engine.get(key.as_bytes()).unwrap(), None, "{mode:?} {key}");
        }
        assert_eq!(engine.stats().abandoned_reaped, 3, "{mode:?}");
    }
}

#[test]
fn own_retentions_and_expiries_survive_a_restart() {
    for mode in [MODES[1], MODES[2]] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.redb");
        let clock = MockClock::new();
        let engine = open(&path, &clock, mode);
        let lease = Duration::from_secs(1);
        let opts = ClaimOptions::default().retention(10 * MIN).lease(lease);
        // A claim left behind (its retention is in its record), an abandoned one, and a
        // completion kept longer than the engine keeps keys.
        acquire(&engine, "taken", &opts).detach();
        acquire(&engine, "abandoned", &opts).detach();
        acquire(&engine, "done", &ClaimOptions::default())
            .complete_with_options(b"d", &kept(3 * RETENTION))
            .unwrap();
        engine.flush().unwrap();
        let done_at = replay(&engine, "done").unwrap().expires_at();
        engine.close().unwrap();
        drop(engine);
        clock.advance(lease);
        let engine = open(&path, &clock, mode);
        // The completion is reported and expires at the instant stored before.
        assert_eq!(replay(&engine, "done").unwrap().expires_at(), done_at);
        // The takeover completes with the claim's retention, read from its record.
        let took = acquire(&engine, "taken", &ClaimOptions::default());
        assert_eq!(took.attempt(), 2);
        took.complete(b"t").unwrap();
        engine.flush().unwrap();
        let stored = replay(&engine, "taken").unwrap();
        assert_eq!(stored.expires_at(), wall(&clock) + 10 * MIN, "{mode:?}");
        // The abandoned claim is reaped 10 min after its recorded lease end, not the
        // engine's hour; restarting does not postpone it. (A record's instants are stored
        // to the millisecond, so across a restart the tick is one.)
        engine.close().unwrap();
        drop(engine);
        let ms = Duration::from_millis(1);
        clock.advance(10 * MIN - ms);
        let engine = open(&path, &clock, mode);
        assert_eq!(engine.admin().sweep_now().unwrap(), 0, "{mode:?}");
        assert!(matches!(
            engine.get(b"abandoned").unwrap(),
            Some(KeyState::InFlight { .. })
        ));
        clock.advance(ms);
        assert_eq!(
            engine.admin().sweep_now().unwrap(),
            2,
            "{mode:?}: with taken"
        );
        assert_eq!(engine.get(b"abandoned").unwrap(), None);
        // The long completion outlives the engine's retention across the restart.
        clock.advance(2 * RETENTION);
        assert!(replay(&engine, "done").is_some(), "{mode:?}");
        engine.close().unwrap();
        drop(engine);
        let now = clock.monotonic();
        let engine = open(&path, &clock, mode);
        expires_exactly(
            &engine,
            &clock,
            "done",
            3 * RETENTION - now,
            &format!("{mode:?} after restarts"),
        );
    }
}

fn wall(clock: &MockClock) -> SystemTime {
    clock.wall()
}

/// The instant a replay reports is the same from memory, from the file, after a restart,
/// through `run`, `run_typed` and `get`, and for the caller whose handler ran.
#[test]
fn expires_at_is_the_same_from_memory_from_the_file_and_after_a_restart() {
    let mut seen = Vec::new();
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.redb");
        let clock = MockClock::new();
        clock.advance(Duration::from_micros(1_234_567));
        let engine = open(&path, &clock, mode);
        assert_eq!(engine.retention(), RETENTION);
        let start = wall(&clock);
        let fresh = engine
            .run(b"run", &ClaimOptions::default(), |_| {
                Ok::<_, ()>(b"r".to_vec())
            })
            .unwrap();
        let own = ClaimOptions::default().retention(Duration::from_millis(90_001));
        let typed = engine
            .run_typed(b"typed", &own, |_| Ok::<_, ()>(7u32))
            .unwrap();
        assert!(!fresh.replayed() && !typed.replayed);
        // On the wall clock's millisecond grid, rounded up: the mock wall reads 1.234567 s
        // past its start, so the end is at ….235 ms, never before the exact end.
        let ms = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis()
        };
        assert_eq!(
            ms(fresh.expires_at()),
            ms(start + RETENTION) + 1,
            "{mode:?}"
        );
        assert!(fresh.expires_at() >= start + RETENTION, "{mode:?}");
        assert_eq!(
            fresh.expires_at(),
            typed.expires_at - Duration::from_millis(90_001) + RETENTION
        );
        engine.flush().unwrap();
        clock.advance(MIN);
        let again = engine
            .run(b"run", &ClaimOptions::default(), |_| Ok::<_, ()>(vec![]))
            .unwrap();
        assert!(again.replayed());
        assert_eq!(again.expires_at(), fresh.expires_at(), "{mode:?} run");
        let typed_again = engine
            .run_typed(b"typed", &ClaimOptions::default(), |_| Ok::<_, ()>(0u32))
            .unwrap();
        assert_eq!(typed_again.expires_at, typed.expires_at, "{mode:?} typed");
        assert_eq!(
            replay(&engine, "run").unwrap().expires_at(),
            fresh.expires_at()
        );
        let Some(KeyState::Completed { expires_at, .. }) = engine.get(b"typed").unwrap() else {
            panic!("{mode:?}: completed")
        };
        assert_eq!(expires_at, typed.expires_at, "{mode:?} get");
        if mode != Durability::None {
            engine.close().unwrap();
            drop(engine);
            let engine = open(&path, &clock, mode);
            assert_eq!(
                replay(&engine, "run").unwrap().expires_at(),
                fresh.expires_at()
            );
            assert_eq!(
                replay(&engine, "typed").unwrap().expires_at(),
                typed.expires_at
            );
        }
        seen.push((fresh.expires_at(), typed.expires_at));
    }
    // Every mode reports the same instants for the same clock.
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}

#[test]
fn the_async_completion_takes_options_too() {
    let clock = MockClock::new();
    let engine = open(Path::new("unused"), &clock, Durability::None);
    let lease = acquire(&engine, "k", &ClaimOptions::default());
    futures::executor::block_on(lease.complete_with_options_async(b"a", &kept(5 * MIN))).unwrap();
    assert_eq!(
        replay(&engine, "k").unwrap().expires_at(),
        wall(&clock) + 5 * MIN
    );
    let lease = acquire(&engine, "long", &ClaimOptions::default());
    let too_long = kept(Duration::from_secs(20 * 365 * 24 * 3600));
    assert!(matches!(
        futures::executor::block_on(lease.complete_with_options_async(b"a", &too_long)),
        Err(LeaseError::RetentionTooLong { .. })
    ));
    assert!(matches!(
        engine.get(b"long").unwrap(),
        Some(KeyState::InFlight { .. })
    ));
}

#[test]
fn a_retention_past_the_limit_is_refused_and_zero_forgets_at_once() {
    let ten_years = Duration::from_secs(10 * 365 * 24 * 3600);
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let engine = open(&dir.path().join("k.redb"), &clock, mode);
        let too_long = ClaimOptions::default().retention(ten_years + NS);
        match engine.claim(b"k", &too_long) {
            Err(ClaimError::RetentionTooLong { asked, max }) => {
                assert_eq!((asked, max), (ten_years + NS, ten_years), "{mode:?}");
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!(engine.get(b"k").unwrap(), None, "{mode:?}: nothing changed");
        // The limit itself is accepted, by a claim and by a completion.
        let lease = acquire(&engine, "k", &ClaimOptions::default().retention(ten_years));
        let token = lease.token();
        match lease.complete_with_options(b"v", &kept(ten_years + NS)) {
            Err(LeaseError::RetentionTooLong { asked, max }) => {
                assert_eq!((asked, max), (ten_years + NS, ten_years), "{mode:?}");
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        // The refused completion keeps the key held; its holder can still complete it.
        assert!(matches!(
            engine.get(b"k").unwrap(),
            Some(KeyState::InFlight { token: t, .. }) if t == token
        ));
        engine.complete(b"k", token, b"v").unwrap();
        engine.flush().unwrap();
        clock.advance(RETENTION * 24 * 365);
        assert!(
            replay(&engine, "k").is_some(),
            "{mode:?}: kept a year and more"
        );
        // Zero: the completion is forgotten at once, and the key is new again.
        let lease = acquire(&engine, "zero", &ClaimOptions::default());
        lease
            .complete_with_options(b"z", &kept(Duration::ZERO))
            .unwrap();
        engine.flush().unwrap();
        assert_eq!(engine.get(b"zero").unwrap(), None, "{mode:?}");
        assert!(replay(&engine, "zero").is_none(), "{mode:?}");
    }
}

/// An operator's import keeps a record's own expiry, whatever the importing engine's
/// retention.
#[test]
fn an_import_keeps_the_records_own_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let from = open(&dir.path().join("a.redb"), &clock, Durability::Immediate);
    acquire(&from, "k", &ClaimOptions::default())
        .complete_with_options(b"v", &kept(5 * RETENTION))
        .unwrap();
    let expires = replay(&from, "k").unwrap().expires_at();
    let records = from.admin().records();
    drop(from);
    for mode in MODES {
        let into = open(&dir.path().join(format!("{mode:?}.redb")), &clock, mode);
        for r in &records {
            into.admin().import(r).unwrap();
        }
        into.flush().unwrap();
        assert_eq!(
            replay(&into, "k").unwrap().expires_at(),
            expires,
            "{mode:?}"
        );
    }
}

/// An end that falls inside a wall millisecond is kept to the next whole one, in memory and
/// in the file alike: never forgotten before `completed_at + retention`, before or after a
/// restart, and `expires_at` is the instant the key is forgotten, whatever the durability.
#[test]
fn an_end_inside_a_millisecond_is_kept_to_the_next_one_in_memory_and_after_a_restart() {
    for own in [false, true] {
        for mode in MODES {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("k.redb");
            let clock = MockClock::new();
            clock.advance(Duration::from_micros(900));
            let retention = Duration::from_micros(1_000_500);
            let (builder, opts) = if own {
                (
                    builder(&path, &clock, mode),
                    ClaimOptions::default().retention(Duration::from_secs(1)),
                )
            } else {
                (
                    builder(&path, &clock, mode).retention(retention),
                    ClaimOptions::default(),
                )
            };
            let engine = builder.open().unwrap();
            let completed = wall(&clock);
            acquire(&engine, "k", &opts).complete(b"r").unwrap();
            engine.flush().unwrap();
            let expires_at = replay(&engine, "k").unwrap().expires_at();
            let kept = if own {
                Duration::from_secs(1)
            } else {
                retention
            };
            assert!(expires_at >= completed + kept, "{mode:?} own {own}");
            assert!(
                expires_at < completed + kept + Duration::from_millis(1),
                "{mode:?} own {own}"
            );
            let left = expires_at.duration_since(completed).unwrap();
            let restart = |engine: Engine| -> Engine {
                if mode == Durability::None {
                    return engine;
                }
                engine.close().unwrap();
                drop(engine);
                open(&path, &clock, mode)
            };
            // Just before the end: still kept, also after a restart.
            clock.advance(left - NS);
            let engine = restart(engine);
            assert!(replay(&engine, "k").is_some(), "{mode:?} own {own}: kept");
            // At `expires_at`: forgotten, as it says.
            clock.advance(NS);
            assert!(replay(&engine, "k").is_none(), "{mode:?} own {own}: gone");
        }
    }
}
