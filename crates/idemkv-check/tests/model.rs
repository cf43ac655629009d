//! The fuzz targets' operation types inside `cargo test` (bounded), the committed seed
//! corpus replayed, and exhaustive power loss at every I/O point of a small workload. See
//! docs/testing.md.
//!
//! A failing arbtest case prints its seed; replay it with
//! `ARBTEST_SEED=0x... cargo test --test model <test name>`.

use idemkv::fault::WithStorage;
use idemkv::{Durability, Engine};
use idemkv_check::faults::{self, FaultCase};
use idemkv_check::ops::{self, OpsCase};
use std::path::Path;
use std::time::Duration;

/// Inputs of each committed corpus that the replays below must run, at least: about nine
/// tenths of what `fuzz/corpus/` holds (66 or 67 files per target), so that a corpus that
/// went missing or stopped decoding fails the test instead of passing it empty.
const CORPUS_REPLAYED_MIN: usize = 60;

/// Files of a committed corpus, sorted by name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    // The corpus sits at the repository root, two levels above this crate.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
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
    assert!(cov.log_io_points > 0, "the commit log is swept: {cov:?}");
    assert_eq!(cov.lost_acknowledged, 0, "{cov:?}");
    println!("Immediate: {cov:?}");
}

/// The same on a custom backend without a log, whose group commits are durable redb
/// commits (custom backends, and a disk without room for the log).
#[test]
fn storage_faults_every_io_point_immediate_unlogged() {
    let mode = faults::Mode::unlogged(Durability::Immediate);
    let cov = faults::exhaustive(mode, &faults::small_workload()).unwrap_or_else(|e| panic!("{e}"));
    assert!(cov.io_points > 10, "the workload makes I/O: {cov:?}");
    assert_eq!(cov.lost_acknowledged, 0, "{cov:?}");
    println!("Immediate without a log: {cov:?}");
}

#[test]
fn storage_faults_every_io_point_buffered() {
    let mode = Durability::Buffered {
        max_delay: Duration::from_millis(1),
    };
    let cov = faults::exhaustive(mode, &faults::small_workload()).unwrap_or_else(|e| panic!("{e}"));
    println!("Buffered: {cov:?}");
}

/// A fixed finding (docs/testing.md): a power loss while redb created the file left a file
/// that neither redb nor the engine would open again. redb writes its magic last, so a file
/// whose magic is still zero never held a commit and is now started afresh.
#[test]
fn power_loss_during_file_creation_leaves_an_openable_file() {
    use idemkv::fault::{Fault, FaultyStorage};
    for at in 1..=6 {
        let disk = FaultyStorage::memory();
        disk.set_fault(Some(Fault::PowerLoss { at }));
        let _ = Engine::builder()
            .path("x.redb")
            .backend(disk.clone())
            .open();
        let image = disk.crash_image(|_| true);
        let reopened = Engine::builder()
            .path("x.redb")
            .backend(FaultyStorage::from_image(image))
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
    use idemkv::fault::FaultyStorage;
    use idemkv::{Claim, ClaimError, ClaimOptions};
    let engine = Engine::builder()
        .path("x.redb")
        .backend(FaultyStorage::memory())
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

/// A fixed finding (docs/testing.md): a claim taken over by a restart and then extended by
/// zero at the restart's instant kept the reap instant of its recorded lease end, instead of
/// being reaped `retention` after its new end. In every mode with a file: the model checks
/// the records after the flush that follows the new reap instant.
#[test]
fn an_extension_by_zero_at_a_takeover_restart_reaps_after_the_new_end() {
    use idemkv_check::ops::{AdvanceSel, FpSel, KeySel, LeaseSel, Op, TokenSel};
    let key = KeySel(0);
    let case = OpsCase {
        ops: vec![
            // "k0", a 20 ms lease: recorded to end at 20 ms, so reaped at 120 ms by the
            // record, and at 100 ms once its lease ends at 0 ms.
            Op::Claim {
                key,
                fingerprint: FpSel(206),
                lease: LeaseSel(252),
                wait: true,
            },
            Op::Restart { power_loss: true },
            Op::Extend {
                key,
                token: TokenSel(105),
                lease: LeaseSel(105),
            },
            Op::Advance { by: AdvanceSel(11) },
            Op::Flush,
        ],
    };
    for mode in [
        Durability::Immediate,
        Durability::Buffered {
            max_delay: Duration::from_millis(1),
        },
    ] {
        if let Err(e) = ops::run_case(mode, &case) {
            panic!("{e}");
        }
    }
}

/// The records of an engine holding one completion (`k` → `r`) that is not yet durable: a
/// `Buffered` engine whose writer waits an hour before it commits.
fn records_with_an_unpublished_completion() -> Vec<idemkv::admin::RecordInfo> {
    use idemkv::fault::FaultyStorage;
    use idemkv::{Claim, ClaimOptions};
    let engine = Engine::builder()
        .path("x.redb")
        .backend(FaultyStorage::memory())
        .durability(Durability::Buffered {
            max_delay: Duration::from_secs(3600),
        })
        .open()
        .expect("open");
    match engine.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::Acquired(lease) => lease.complete(b"r").expect("complete"),
        other => panic!("{other:?}"),
    }
    engine.admin().records()
}

/// A fixed finding (docs/testing.md): `Engine::records()` listed a completion that was not
/// yet durable with `expires_at_ms: 0` instead of its end of retention. Found by the
/// `ops_model` fuzz target.
#[test]
fn records_show_the_retention_of_a_completion_not_yet_durable() {
    use idemkv::admin::RecordInfoState;
    let records = records_with_an_unpublished_completion();
    match &records[0].state {
        RecordInfoState::Completed {
            expires_at,
            published: false,
            ..
        } => {
            assert!(*expires_at > std::time::UNIX_EPOCH, "{records:?}")
        }
        other => panic!("{other:?}"),
    }
}

/// A fixed finding (docs/testing.md): `Engine::records()` listed a completion that was not
/// yet durable with an empty response. Found by the `ops_model` fuzz target.
#[test]
fn records_show_the_response_of_a_completion_not_yet_durable() {
    use idemkv::admin::RecordInfoState;
    let records = records_with_an_unpublished_completion();
    match &records[0].state {
        RecordInfoState::Completed { response, .. } => assert_eq!(response, b"r", "{records:?}"),
        other => panic!("{other:?}"),
    }
}
