//! Markers, the second tier of retention (docs/retention.md, "Markers: the second tier"):
//! a late duplicate within the marker window is answered `Forgotten` and never runs again,
//! in every durability mode, across restarts and under concurrent duplicates. Every test
//! drives a `MockClock`; none sleeps.

use idemkv::{
    Claim, ClaimError, ClaimOptions, Clock, Durability, Engine, EngineBuilder, MockClock, RunError,
};
use idemkv_check::fixture;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

const RETENTION: Duration = Duration::from_secs(3600);
const MARKER: Duration = Duration::from_secs(7 * 24 * 3600);
const NS: Duration = Duration::from_nanos(1);

const MODES: [Durability; 3] = [
    Durability::Immediate,
    Durability::Buffered {
        max_delay: Duration::from_millis(1),
    },
    Durability::None,
];

fn builder(path: &Path, clock: &MockClock, mode: Durability) -> EngineBuilder {
    fixture::builder(path, clock, mode)
        .retention(RETENTION)
        .marker_retention(Some(MARKER))
}

/// Completes `key` (with `payload`'s fingerprint) and makes it durable; returns the wall
/// time of the completion.
fn complete(engine: &Engine, clock: &MockClock, key: &[u8], payload: &[u8]) -> SystemTime {
    let opts = ClaimOptions::default().payload(payload);
    let Claim::Acquired(lease) = engine.claim(key, &opts).unwrap() else {
        panic!("a new key is acquired")
    };
    let at = clock.wall();
    lease.complete(b"charged").unwrap();
    engine.flush().unwrap();
    at
}

/// Whether a claim of `key` with `opts` is answered `Forgotten`; its answer if so.
fn forgotten(engine: &Engine, key: &[u8], opts: &ClaimOptions) -> Option<idemkv::Forgotten> {
    match engine.claim(key, opts).unwrap() {
        Claim::Forgotten(f) => Some(f),
        Claim::Acquired(lease) => {
            lease.release().unwrap();
            None
        }
        other => panic!("unexpected answer {other:?}"),
    }
}

/// Sweeps and makes the sweep durable.
fn sweep(engine: &Engine) -> u64 {
    let removed = engine.admin().sweep_now().unwrap();
    engine.flush().unwrap();
    removed
}

#[test]
fn a_late_duplicate_within_the_window_is_forgotten_with_its_completion_time() {
    for mode in MODES {
        // Swept before the duplicate arrives, or found expired by the duplicate itself.
        for swept in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let clock = MockClock::new();
            let engine = builder(&dir.path().join("m.redb"), &clock, mode)
                .open()
                .unwrap();
            let at = complete(&engine, &clock, b"order-42", b"pay 42");
            clock.advance(RETENTION + Duration::from_secs(2 * 24 * 3600));
            if swept {
                assert_eq!(sweep(&engine), 1, "{mode:?}");
                assert_eq!(
                    engine.stats().markers,
                    1,
                    "{mode:?}: the sweep left a marker"
                );
            }
            let opts = ClaimOptions::default().payload(b"pay 42");
            let f = forgotten(&engine, b"order-42", &opts)
                .unwrap_or_else(|| panic!("{mode:?} swept {swept}: the duplicate ran again"));
            assert_eq!(f.completed_at(), at, "{mode:?} swept {swept}");
            assert_eq!(f.attempt(), 1);
            assert_eq!(f.kept_until(), at + RETENTION + MARKER, "{mode:?}");
            // Every entry point refuses to run the handler.
            let ran = AtomicU64::new(0);
            let run = engine.run(b"order-42", &opts, |_| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(b"again".to_vec())
            });
            assert!(
                matches!(&run, Err(RunError::Forgotten(g)) if *g == f),
                "{mode:?}: {run:?}"
            );
            let typed = engine.run_typed(b"order-42", &opts, |_| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(7u32)
            });
            assert!(matches!(typed, Err(RunError::Forgotten(_))), "{mode:?}");
            let run_async =
                futures::executor::block_on(engine.run_async(b"order-42", &opts, |_| async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(b"again".to_vec())
                }));
            assert!(matches!(run_async, Err(RunError::Forgotten(_))), "{mode:?}");
            let waited = engine.claim_or_wait(b"order-42", &opts).unwrap();
            assert!(matches!(waited, Claim::Forgotten(_)), "{mode:?}");
            assert_eq!(ran.load(Ordering::SeqCst), 0, "{mode:?}: no handler ran");
            let stats = engine.stats();
            assert_eq!(
                (stats.markers, stats.forgotten),
                (1, 5),
                "{mode:?} {stats:?}"
            );
            assert_eq!(stats.completed, 0);
        }
    }
}

#[test]
fn the_window_ends_at_its_instant_and_the_key_is_new_from_then() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let engine = builder(&dir.path().join("m.redb"), &clock, mode)
            .open()
            .unwrap();
        complete(&engine, &clock, b"k", b"p");
        clock.advance(RETENTION);
        let opts = ClaimOptions::default();
        assert!(
            forgotten(&engine, b"k", &opts).is_some(),
            "{mode:?}: forgotten from the retention's end on"
        );
        clock.advance(MARKER - NS);
        assert!(
            forgotten(&engine, b"k", &opts).is_some(),
            "{mode:?}: a tick early"
        );
        clock.advance(NS);
        let Claim::Acquired(lease) = engine.claim(b"k", &opts).unwrap() else {
            panic!("{mode:?}: the key is new at the marker's end")
        };
        assert_eq!(lease.attempt(), 1);
        assert_eq!(engine.stats().markers, 0, "{mode:?}: the claim dropped it");
        lease.complete(b"second").unwrap();
        engine.flush().unwrap();
        let Claim::Completed(stored) = engine.claim(b"k", &opts).unwrap() else {
            panic!("{mode:?}: the new completion is replayed")
        };
        assert_eq!(stored.response(), b"second");
    }
}

#[test]
fn without_markers_a_late_duplicate_runs_again_as_before() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let engine = builder(&dir.path().join("m.redb"), &clock, mode)
            .marker_retention(None)
            .open()
            .unwrap();
        complete(&engine, &clock, b"k", b"p");
        clock.advance(RETENTION);
        assert_eq!(sweep(&engine), 1);
        let stats = engine.stats();
        assert_eq!((stats.markers, stats.forgotten), (0, 0));
        let Claim::Acquired(lease) = engine.claim(b"k", &ClaimOptions::default()).unwrap() else {
            panic!("{mode:?}: without markers an expired key is new")
        };
        assert_eq!(lease.attempt(), 1);
    }
}

#[test]
fn markers_survive_a_restart() {
    for mode in [MODES[0], MODES[1]] {
        // Swept before the restart, or past retention only while the engine was closed.
        for swept in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("m.redb");
            let clock = MockClock::new();
            let engine = builder(&path, &clock, mode).open().unwrap();
            let at = complete(&engine, &clock, b"order-7", b"seven");
            clock.advance(RETENTION + Duration::from_secs(60));
            if swept {
                assert_eq!(sweep(&engine), 1);
            }
            engine.close().unwrap();
            drop(engine);
            let engine = builder(&path, &clock, mode).open().unwrap();
            assert_eq!(engine.stats().markers, 1, "{mode:?} swept {swept}");
            let opts = ClaimOptions::default().payload(b"seven");
            let f = forgotten(&engine, b"order-7", &opts)
                .unwrap_or_else(|| panic!("{mode:?} swept {swept}: ran again after a restart"));
            assert_eq!(f.completed_at(), at);
            assert_eq!(f.kept_until(), at + RETENTION + MARKER);
            // The converted completion's row was written: a second restart still has it.
            engine.close().unwrap();
            drop(engine);
            let engine = builder(&path, &clock, mode).open().unwrap();
            assert!(forgotten(&engine, b"order-7", &opts).is_some(), "{mode:?}");
            // Reopened after the window, the key is new and the row is gone.
            engine.close().unwrap();
            drop(engine);
            clock.advance(MARKER);
            let engine = builder(&path, &clock, mode).open().unwrap();
            assert_eq!(engine.stats().markers, 0);
            assert!(forgotten(&engine, b"order-7", &opts).is_none(), "{mode:?}");
        }
    }
}

#[test]
fn an_open_without_markers_leaves_the_rows_for_the_next_open_with_markers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let clock = MockClock::new();
    let mode = Durability::Immediate;
    let engine = builder(&path, &clock, mode).open().unwrap();
    complete(&engine, &clock, b"k", b"p");
    clock.advance(RETENTION);
    assert_eq!(sweep(&engine), 1);
    engine.close().unwrap();
    drop(engine);
    // An operator's tool opens the file with the defaults: no markers, the old behaviour...
    let plain = builder(&path, &clock, mode)
        .marker_retention(None)
        .open()
        .unwrap();
    assert_eq!(plain.stats().markers, 0);
    plain.close().unwrap();
    drop(plain);
    // ...and the row is still there for the service.
    let engine = builder(&path, &clock, mode).open().unwrap();
    assert!(forgotten(&engine, b"k", &ClaimOptions::default()).is_some());
}

#[test]
fn the_sweeper_removes_a_marker_at_its_end_and_not_a_tick_before() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let clock = MockClock::new();
        let engine = builder(&path, &clock, mode).open().unwrap();
        let at = complete(&engine, &clock, b"k", b"p");
        clock.advance(RETENTION);
        assert_eq!(sweep(&engine), 1);
        clock.advance(MARKER - NS);
        sweep(&engine);
        assert_eq!(engine.stats().markers, 1, "{mode:?}: a tick early");
        clock.advance(NS);
        sweep(&engine);
        assert_eq!(engine.stats().markers, 0, "{mode:?}: removed at its end");
        if mode == Durability::None {
            continue;
        }
        // The row left the file too: reopened with the wall clock set back inside the
        // window, nothing is loaded.
        engine.close().unwrap();
        drop(engine);
        clock.set_wall(at + RETENTION + Duration::from_secs(1));
        let engine = builder(&path, &clock, mode).open().unwrap();
        assert_eq!(engine.stats().markers, 0, "{mode:?}: the row was deleted");
    }
}

#[test]
fn a_row_not_swept_is_found_again_with_the_wall_clock_set_back() {
    // The converse of the sweeper test: without the sweep the row is still in the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let clock = MockClock::new();
    let engine = builder(&path, &clock, Durability::Immediate)
        .open()
        .unwrap();
    let at = complete(&engine, &clock, b"k", b"p");
    clock.advance(RETENTION);
    assert_eq!(sweep(&engine), 1);
    clock.advance(MARKER);
    engine.close().unwrap();
    drop(engine);
    clock.set_wall(at + RETENTION + Duration::from_secs(1));
    let engine = builder(&path, &clock, Durability::Immediate)
        .open()
        .unwrap();
    assert_eq!(engine.stats().markers, 1);
}

#[test]
fn a_fingerprint_that_differs_from_the_marker_s_is_refused() {
    for mode in MODES {
        for swept in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let clock = MockClock::new();
            let engine = builder(&dir.path().join("m.redb"), &clock, mode)
                .open()
                .unwrap();
            complete(&engine, &clock, b"order-9", b"amount 10");
            clock.advance(RETENTION);
            if swept {
                sweep(&engine);
            }
            let other = ClaimOptions::default().payload(b"amount 99");
            let refused = engine.claim(b"order-9", &other);
            assert!(
                matches!(refused, Err(ClaimError::FingerprintMismatch)),
                "{mode:?} swept {swept}: {refused:?}"
            );
            // Asking to run again does not lift the check.
            let refused = engine.claim(b"order-9", &other.clone().rerun_forgotten());
            assert!(matches!(refused, Err(ClaimError::FingerprintMismatch)));
            let same = ClaimOptions::default().payload(b"amount 10");
            assert!(forgotten(&engine, b"order-9", &same).is_some(), "{mode:?}");
            assert!(
                forgotten(&engine, b"order-9", &ClaimOptions::default()).is_some(),
                "{mode:?}: no fingerprint, no check"
            );
            assert_eq!(engine.stats().fingerprint_mismatches, 2);
        }
    }
}

#[test]
fn rerun_forgotten_acquires_the_key_and_the_marker_is_gone_for_good() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let clock = MockClock::new();
        let engine = builder(&path, &clock, mode).open().unwrap();
        let first = complete(&engine, &clock, b"k", b"p");
        clock.advance(RETENTION);
        sweep(&engine);
        let rerun = ClaimOptions::default().payload(b"p").rerun_forgotten();
        let Claim::Acquired(lease) = engine.claim(b"k", &rerun).unwrap() else {
            panic!("{mode:?}: a rerun acquires")
        };
        assert_eq!(lease.attempt(), 1);
        assert_eq!(engine.stats().markers, 0);
        // Released: the key is plain Absent, not forgotten again.
        lease.release().unwrap();
        engine.flush().unwrap();
        assert!(forgotten(&engine, b"k", &ClaimOptions::default()).is_none());
        if mode == Durability::None {
            continue;
        }
        // Nor after a restart inside the old window: the row went with the rerun's claim.
        engine.close().unwrap();
        drop(engine);
        clock.set_wall(first + RETENTION + Duration::from_secs(1));
        let engine = builder(&path, &clock, mode).open().unwrap();
        assert_eq!(engine.stats().markers, 0, "{mode:?}");
        assert!(forgotten(&engine, b"k", &ClaimOptions::default()).is_none());
    }
}

#[test]
fn rerun_forgotten_changes_nothing_for_a_key_that_is_not_forgotten() {
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .retention(RETENTION)
        .marker_retention(Some(MARKER))
        .open()
        .unwrap();
    complete(&engine, &clock, b"k", b"p");
    let rerun = ClaimOptions::default().rerun_forgotten();
    assert!(matches!(
        engine.claim(b"k", &rerun).unwrap(),
        Claim::Completed(_)
    ));
}

#[test]
fn concurrent_late_duplicates_all_see_forgotten_and_none_runs() {
    const THREADS: usize = 8;
    for mode in MODES {
        for swept in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let clock = MockClock::new();
            let engine = builder(&dir.path().join("m.redb"), &clock, mode)
                .open()
                .unwrap();
            let at = complete(&engine, &clock, b"order-1", b"p");
            clock.advance(RETENTION + Duration::from_secs(5));
            if swept {
                sweep(&engine);
            }
            let barrier = Arc::new(Barrier::new(THREADS));
            let ran = Arc::new(AtomicU64::new(0));
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (engine, barrier, ran) = (engine.clone(), barrier.clone(), ran.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        let opts = ClaimOptions::default().payload(b"p");
                        engine.run(b"order-1", &opts, |_| {
                            ran.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, std::io::Error>(b"again".to_vec())
                        })
                    })
                })
                .collect();
            for h in handles {
                match h.join().unwrap() {
                    Err(RunError::Forgotten(f)) => assert_eq!(f.completed_at(), at),
                    other => panic!("{mode:?} swept {swept}: {other:?}"),
                }
            }
            assert_eq!(ran.load(Ordering::SeqCst), 0, "{mode:?} swept {swept}");
            let stats = engine.stats();
            assert_eq!((stats.markers, stats.forgotten), (1, THREADS as u64));
        }
    }
}

#[test]
fn a_marker_retention_of_zero_or_over_the_limit_is_refused() {
    for window in [Duration::ZERO, Duration::from_secs(401 * 24 * 3600)] {
        let opened = Engine::builder()
            .durability(Durability::None)
            .marker_retention(Some(window))
            .open();
        assert!(
            matches!(opened, Err(idemkv::OpenError::InvalidConfig { .. })),
            "{window:?}"
        );
    }
}
