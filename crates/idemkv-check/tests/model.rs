//! The fuzz targets' operation types inside `cargo test` (bounded), the committed seed
//! corpus replayed, exhaustive power loss at every I/O point of a small workload, and the
//! users' duplicate-delivery kit. See docs/testing.md.
//!
//! A failing arbtest case prints its seed; replay it with
//! `ARBTEST_SEED=0x... cargo test --test model <test name>`.

use idemkv::testkit::faults::{self, FaultCase};
use idemkv::testkit::ops::{self, Op, OpsCase};
use idemkv::testkit::{duplicates, CopyOutcome, Pattern};
use idemkv::{Durability, Engine};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Inputs of each committed corpus that the replays below must run, at least: about nine
/// tenths of what `fuzz/corpus/` holds (66 or 67 files per target), so that a corpus that
/// went missing or stopped decoding fails the test instead of passing it empty.
const CORPUS_REPLAYED_MIN: usize = 60;

/// Files of a committed corpus, sorted by name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut out: Vec<(String, Vec<u8>)> = entries
        .map(|e| {
            let e = e.expect("corpus entry");
            let bytes = std::fs::read(e.path()).expect("read corpus file");
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    out.sort();
    out
}

/// Replays every input of `target`'s corpus that decodes as the fuzz target decodes it
/// (`arbitrary_take_rest`, as libfuzzer-sys does for a typed target), and checks that at
/// least [`CORPUS_REPLAYED_MIN`] did.
fn replay_corpus<T: for<'a> arbtest::arbitrary::Arbitrary<'a>>(
    target: &str,
    check: impl Fn(&T) -> Result<(), String>,
) {
    let mut replayed = 0;
    let mut undecodable = Vec::new();
    for (name, bytes) in corpus(target) {
        let u = arbtest::arbitrary::Unstructured::new(&bytes);
        match T::arbitrary_take_rest(u) {
            Ok(case) => {
                if let Err(e) = check(&case) {
                    panic!("fuzz/corpus/{target}/{name}: {e}");
                }
                replayed += 1;
            }
            Err(_) => undecodable.push(name),
        }
    }
    assert!(
        replayed >= CORPUS_REPLAYED_MIN,
        "fuzz/corpus/{target}: {replayed} inputs replayed, at least {CORPUS_REPLAYED_MIN} \
         expected; undecodable: {undecodable:?}"
    );
}

#[test]
fn ops_model_random_cases() {
    arbtest::arbtest(|u| {
        let case: OpsCase = u.arbitrary()?;
        if let Err(e) = ops::run_case_all_modes(&case) {
            panic!("{e}");
        }
        Ok(())
    })
    .size_max(1024)
    .budget_ms(4_000);
}

#[test]
fn ops_model_corpus_replays_clean() {
    replay_corpus::<OpsCase>("ops_model", |case| {
        ops::run_case_all_modes(case).map_err(|e| e.to_string())
    });
}

#[test]
fn storage_faults_random_cases() {
    arbtest::arbtest(|u| {
        let case = faults::dense_case(u)?;
        if let Err(e) = faults::run_case(&case) {
            panic!("{case:?}\n{e}");
        }
        Ok(())
    })
    .size_max(1024)
    .budget_ms(3_000);
}

#[test]
fn storage_faults_corpus_replays_clean() {
    replay_corpus::<FaultCase>("storage_faults", |case| faults::run_case(case).map(drop));
}

/// Power loss (synced bytes only, and with every unsynced write) and a failing call at
/// every I/O point of a small workload, exhaustively.
#[test]
fn storage_faults_every_io_point_immediate() {
    let cov = faults::exhaustive(Durability::Immediate, &faults::small_workload())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(cov.io_points > 10, "the workload makes I/O: {cov:?}");
    println!("Immediate: {cov:?}");
}

#[test]
fn storage_faults_every_io_point_buffered() {
    let mode = Durability::Buffered {
        max_delay: Duration::from_millis(1),
    };
    let cov = faults::exhaustive(mode, &faults::small_workload()).unwrap_or_else(|e| panic!("{e}"));
    println!("Buffered: {cov:?}");
}

/// With the fencing comparison switched off, a sequential stale completion is caught by
/// the model.
#[test]
fn ops_model_catches_a_missing_fence() {
    use idemkv::testkit::ops::{BytesSel, FpSel, KeySel, LeaseSel, TokenSel};
    let ops = [
        Op::Claim {
            key: KeySel(0),
            fingerprint: FpSel(0),
            lease: LeaseSel(1),
            wait: false,
        },
        Op::Claim {
            key: KeySel(0),
            fingerprint: FpSel(0),
            lease: LeaseSel(0),
            wait: false,
        },
        Op::Complete {
            key: KeySel(0),
            token: TokenSel(1),
            response: BytesSel(2),
        },
    ];
    for mode in ops::modes() {
        let mut h = ops::Harness::open(mode).expect("open");
        h.engine.sabotage(idemkv::testkit::Bug::NoFencing);
        let failed = ops.iter().map(|op| h.apply(op)).find_map(Result::err);
        assert!(
            failed.is_some(),
            "{mode:?}: the stale completion went unnoticed"
        );
        let _ = h.engine.close();
    }
}

// ---------------------------------------------------------------------------------------
// The duplicate-delivery kit.
// ---------------------------------------------------------------------------------------

fn engine() -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .open()
        .expect("open")
}

#[test]
fn retry_storm_runs_the_side_effect_once() {
    let engine = engine();
    let effects = AtomicUsize::new(0);
    let report = duplicates(&engine, b"storm")
        .copies(8)
        .pattern(Pattern::RetryStorm)
        .run(|_| {
            effects.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            Ok::<_, String>(b"done".to_vec())
        });
    assert_eq!(report.side_effects(), 1, "{report}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(report.committed(), 1);
    assert!(report.all_got(b"done"), "{report}");
}

#[test]
fn redelivery_while_working_waits_for_the_first_copy() {
    let engine = engine();
    let report = duplicates(&engine, b"redelivered")
        .copies(4)
        .pattern(Pattern::RedeliveryWhileWorking)
        .run(|_| Ok::<_, String>(b"once".to_vec()));
    assert_eq!(report.side_effects(), 1, "{report}");
    assert!(
        matches!(report.outcomes()[0], CopyOutcome::Ran { .. }),
        "{report}"
    );
    assert!(
        report.outcomes()[1..]
            .iter()
            .all(|o| matches!(o, CopyOutcome::Replayed { .. })),
        "{report}"
    );
}

#[test]
fn rebalance_shows_the_takeover_and_fences_the_first_copy() {
    let engine = engine();
    let tokens = std::sync::Mutex::new(Vec::new());
    let report = duplicates(&engine, b"rebalanced")
        .copies(3)
        .pattern(Pattern::Rebalance)
        .run(|lease| {
            tokens.lock().unwrap().push(lease.token());
            Ok::<_, String>(format!("by {}", lease.token()).into_bytes())
        });
    // Both consumers ran the side effect, but only the newer token's result was stored;
    // the first copy learned that its lease was lost.
    assert_eq!(report.side_effects(), 2, "{report}");
    assert_eq!(report.committed(), 1, "{report}");
    assert!(
        matches!(&report.outcomes()[0], CopyOutcome::Failed(why) if why.contains("lease lost")),
        "{report}"
    );
    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens[0] < tokens[1],
        "the takeover has the larger token: {tokens:?}"
    );
    match &report.outcomes()[1] {
        CopyOutcome::Ran { token, .. } => assert_eq!(*token, tokens[1]),
        other => panic!("copy 1: {other:?}\n{report}"),
    }
    assert!(
        matches!(report.outcomes()[2], CopyOutcome::Replayed { .. }),
        "{report}"
    );
}

#[test]
fn the_kit_catches_check_then_act() {
    let engine = engine();
    engine.sabotage(idemkv::testkit::Bug::CheckThenAct);
    let mut worst = 0;
    for i in 0..200 {
        let key = format!("cta-{i}");
        let report = duplicates(&engine, key.as_bytes()).copies(4).run(|_| {
            std::thread::sleep(Duration::from_millis(1));
            Ok::<_, String>(b"x".to_vec())
        });
        worst = worst.max(report.side_effects());
        if worst > 1 {
            break;
        }
    }
    assert!(worst > 1, "a check-then-act engine ran a side effect twice");
}

/// A fixed finding (docs/testing.md): a power loss while redb created the file left a file
/// that neither redb nor the engine would open again. redb writes its magic last, so a file
/// whose magic is still zero never held a commit and is now started afresh.
#[test]
fn power_loss_during_file_creation_leaves_an_openable_file() {
    use idemkv::testkit::disk::{Fault, SimDisk};
    for at in 1..=6 {
        let disk = SimDisk::new();
        disk.set_fault(Some(Fault::PowerLoss { at }));
        let _ = Engine::builder()
            .path("x.redb")
            .backend(disk.clone())
            .open();
        let image = disk.crash_image(|_| true);
        let reopened = Engine::builder()
            .path("x.redb")
            .backend(SimDisk::from_image(image))
            .open();
        assert!(
            reopened.is_ok(),
            "power loss at I/O {at}: {:?}",
            reopened.err()
        );
    }
}

/// A fixed finding (docs/testing.md): under `Buffered`, while a completion was not yet
/// durable, a claim with a different fingerprint got `InProgress` instead of
/// `FingerprintMismatch` (docs/design.md: refused "whatever the state").
#[test]
fn fingerprint_mismatch_is_refused_while_a_completion_is_not_yet_durable() {
    use idemkv::testkit::disk::SimDisk;
    use idemkv::{Claim, ClaimError, ClaimOptions};
    let engine = Engine::builder()
        .path("x.redb")
        .backend(SimDisk::new())
        .durability(Durability::Buffered {
            max_delay: Duration::from_secs(3600),
        })
        .open()
        .expect("open");
    match engine
        .claim(b"k", &ClaimOptions::default().fingerprint(1))
        .expect("claim")
    {
        Claim::Acquired(lease) => lease.complete(b"r").expect("complete"),
        other => panic!("{other:?}"),
    }
    let other = engine.claim(b"k", &ClaimOptions::default().fingerprint(2));
    assert!(
        matches!(other, Err(ClaimError::FingerprintMismatch)),
        "{other:?}"
    );
}

/// A fixed finding (docs/testing.md): `Engine::records()` listed a completion that was not
/// yet durable with `expires_at_ms: 0` instead of its end of retention. Found by the
/// `ops_model` fuzz target.
#[test]
fn records_show_the_retention_of_a_completion_not_yet_durable() {
    use idemkv::testkit::disk::SimDisk;
    use idemkv::{Claim, ClaimOptions, RecordInfoState};
    let engine = Engine::builder()
        .path("x.redb")
        .backend(SimDisk::new())
        .durability(Durability::Buffered {
            max_delay: Duration::from_secs(3600),
        })
        .open()
        .expect("open");
    match engine.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::Acquired(lease) => lease.complete(b"r").expect("complete"),
        other => panic!("{other:?}"),
    }
    let records = engine.records();
    match &records[0].state {
        RecordInfoState::Completed {
            expires_at_ms,
            published: false,
            ..
        } => {
            assert!(*expires_at_ms > 0, "{records:?}")
        }
        other => panic!("{other:?}"),
    }
}

/// A fixed finding (docs/testing.md): `Engine::records()` listed a completion that was not
/// yet durable with an empty response. Found by the `ops_model` fuzz target.
#[test]
fn records_show_the_response_of_a_completion_not_yet_durable() {
    use idemkv::testkit::disk::SimDisk;
    use idemkv::{Claim, ClaimOptions, RecordInfoState};
    let engine = Engine::builder()
        .path("x.redb")
        .backend(SimDisk::new())
        .durability(Durability::Buffered {
            max_delay: Duration::from_secs(3600),
        })
        .open()
        .expect("open");
    match engine.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::Acquired(lease) => lease.complete(b"r").expect("complete"),
        other => panic!("{other:?}"),
    }
    let records = engine.records();
    match &records[0].state {
        RecordInfoState::Completed { response, .. } => assert_eq!(response, b"r", "{records:?}"),
        other => panic!("{other:?}"),
    }
}
