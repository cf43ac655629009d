//! The commit log (every `Immediate` engine's): acknowledged commits survive a power loss
//! before any checkpoint, a full log checkpoints and goes on, a log left by a crash is
//! applied at the next open (under any durability) and refused by read-only opens, a
//! damaged acknowledged frame is refused rather than dropped, and claims stay atomic.

use idemkv::admin::{FileReader, RecordInfoState};
use idemkv::error::OpenErrorKind;
use idemkv::fault::{Fault, FaultyStorage, WithStorage};
use idemkv::*;
use idemkv_check::backend::{acquired, completed, stored_response};
use idemkv_check::{armed, Bug};
use std::path::Path;
use std::sync::{Arc, Barrier};

fn open(file: &FaultyStorage, log: &FaultyStorage) -> Result<Engine, OpenError> {
    open_with(file, log, Bug::None)
}

fn open_with(file: &FaultyStorage, log: &FaultyStorage, bug: Bug) -> Result<Engine, OpenError> {
    armed(
        Engine::builder()
            .backend(file.clone())
            .log_backend(log.clone()),
        bug,
    )
    .open()
}

/// What a power loss leaves of both storages now: the log's image first, so that nothing
/// the file holds is newer than the log (as when power goes at one instant).
fn power_loss(file: &FaultyStorage, log: &FaultyStorage) -> (FaultyStorage, FaultyStorage) {
    let log = FaultyStorage::from_image(log.durable_image());
    let file = FaultyStorage::from_image(file.durable_image());
    (file, log)
}

fn complete(engine: &Engine, key: &str, response: &[u8]) {
    let lease = acquired(
        engine
            .claim(key.as_bytes(), &ClaimOptions::default())
            .unwrap(),
    );
    lease.complete(response).unwrap();
}

/// An engine on fresh storages with the log on, keys `k0..k{keys}` completed as `r{i}`.
fn with_completions(keys: usize) -> (FaultyStorage, FaultyStorage, Engine) {
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let engine = open(&file, &log).unwrap();
    for i in 0..keys {
        complete(&engine, &format!("k{i}"), format!("r{i}").as_bytes());
    }
    (file, log, engine)
}

#[test]
fn acknowledged_completions_survive_a_power_loss_before_any_checkpoint() {
    const KEYS: usize = 20;
    let (file, log, engine) = with_completions(KEYS);
    assert_eq!(engine.stats().log_checkpoints, 0);
    let (file_image, log_image) = power_loss(&file, &log);
    drop(engine);

    // The file alone holds at most a prefix of them (what the applier committed before
    // the power loss): the rest were durable in the log only.
    let alone = open(
        &FaultyStorage::from_image(file_image.durable_image()),
        &FaultyStorage::memory(),
    )
    .unwrap();
    let held: Vec<bool> = (0..KEYS)
        .map(|i| stored_response(&alone, &format!("k{i}")).is_some())
        .collect();
    assert!(
        held.windows(2).all(|w| w[0] || !w[1]),
        "the file alone holds a prefix of the completions: {held:?}"
    );
    drop(alone);

    let engine = open(&file_image, &log_image).unwrap();
    for i in 0..KEYS {
        let key = format!("k{i}");
        assert_eq!(
            stored_response(&engine, &key).as_deref(),
            Some(format!("r{i}").as_bytes()),
            "{key}"
        );
    }
    // The open applied the log and checkpointed it: the file alone now holds them.
    engine.close().unwrap();
    let applied = Engine::builder()
        .backend(FaultyStorage::from_image(file_image.durable_image()))
        .log_backend(FaultyStorage::memory())
        .open()
        .unwrap();
    assert_eq!(
        stored_response(&applied, "k0").as_deref(),
        Some(b"r0".as_slice())
    );
}

#[test]
fn a_full_log_checkpoints_and_keeps_every_completion() {
    // 24 responses of 1 MiB overflow the 16 MiB log at least once.
    const KEYS: usize = 24;
    let big = |i: usize| vec![i as u8; 1 << 20];
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let engine = Engine::builder()
        .backend(file.clone())
        .log_backend(log.clone())
        .response_len_max(1 << 20)
        .open()
        .unwrap();
    for i in 0..KEYS {
        complete(&engine, &format!("k{i}"), &big(i));
    }
    let checkpoints = engine.stats().log_checkpoints;
    assert!(checkpoints >= 1, "{checkpoints} checkpoints");
    let (file_image, log_image) = power_loss(&file, &log);
    drop(engine);
    let engine = Engine::builder()
        .backend(file_image)
        .log_backend(log_image)
        .response_len_max(1 << 20)
        .open()
        .unwrap();
    for i in 0..KEYS {
        assert_eq!(
            stored_response(&engine, &format!("k{i}")),
            Some(big(i)),
            "k{i}"
        );
    }
}

#[test]
fn a_damaged_acknowledged_frame_is_refused_not_dropped() {
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let engine = open(&file, &log).unwrap();
    complete(&engine, "a", b"1");
    complete(&engine, "b", b"2");
    let (file_image, log_image) = power_loss(&file, &log);
    drop(engine);
    // A byte inside the first frame's payload (its 32-byte header comes first); later
    // frames are whole, so this frame was acknowledged and is not a torn tail.
    let mut damaged = log_image.durable_image();
    damaged[40] ^= 0x20;
    let err = open(
        &FaultyStorage::from_image(file_image.durable_image()),
        &FaultyStorage::from_image(&damaged),
    )
    .unwrap_err();
    assert_eq!(err.kind(), OpenErrorKind::Corrupted, "{err}");
    assert!(err.to_string().contains("commit log"), "{err}");
    // Nothing was changed: with the log restored the open applies everything.
    let engine = open(&file_image, &log_image).unwrap();
    assert_eq!(
        stored_response(&engine, "b").as_deref(),
        Some(b"2".as_slice())
    );
}

#[test]
fn a_log_left_by_a_crash_is_refused_by_readers_and_applied_and_removed_by_an_open_that_writes_none()
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    let crashed = tempfile::tempdir().unwrap();
    let copy = crashed.path().join("idem.redb");
    let log_of = |p: &Path| {
        let mut name = p.as_os_str().to_os_string();
        name.push("-log");
        std::path::PathBuf::from(name)
    };
    let engine = Engine::builder().path(&path).open().unwrap();
    assert!(log_of(&path).exists());
    // What a process crash leaves when the applier had not yet taken any of the batches
    // below to the file: the file as the open left it (the engine is idle), and the log
    // with every acknowledged frame.
    std::fs::copy(&path, &copy).unwrap();
    for i in 0..5 {
        complete(&engine, &format!("k{i}"), format!("r{i}").as_bytes());
    }
    engine.flush().unwrap();
    std::fs::copy(log_of(&path), log_of(&copy)).unwrap();
    engine.close().unwrap();
    drop(engine);

    // A clean close leaves nothing to apply.
    let reader = FileReader::open(&path).unwrap();
    assert!(reader.get(b"k4").unwrap().is_some());
    drop(reader);

    let err = FileReader::open(&copy).unwrap_err();
    assert_eq!(err.kind(), OpenErrorKind::UnappliedLog, "{err}");
    // Without the log beside it, a reader and an engine both refuse the file.
    let bare = tempfile::tempdir().unwrap();
    let bare_copy = bare.path().join("idem.redb");
    std::fs::copy(&copy, &bare_copy).unwrap();
    for err in [
        FileReader::open(&bare_copy).unwrap_err(),
        Engine::builder().path(&bare_copy).open().unwrap_err(),
    ] {
        assert_eq!(err.kind(), OpenErrorKind::Corrupted, "{err}");
        assert!(err.to_string().contains("missing"), "{err}");
    }
    assert!(matches!(&err, OpenError::UnappliedLog { path } if *path == log_of(&copy)));

    // Opened under a durability that writes no log: the log is applied, then removed.
    let engine = Engine::builder()
        .path(&copy)
        .durability(Durability::Buffered {
            max_delay: std::time::Duration::from_millis(10),
        })
        .open()
        .unwrap();
    for i in 0..5 {
        assert_eq!(
            stored_response(&engine, &format!("k{i}")).as_deref(),
            Some(format!("r{i}").as_bytes()),
            "k{i}"
        );
    }
    assert!(!log_of(&copy).exists());
    engine.close().unwrap();
    drop(engine);
    let reader = FileReader::open(&copy).unwrap();
    assert!(reader.get(b"k0").unwrap().is_some());
}

#[test]
fn the_settings_that_cannot_work_are_refused() {
    let refused = |b: EngineBuilder| match b.open() {
        Err(e) => assert_eq!(e.kind(), OpenErrorKind::InvalidConfig, "{e}"),
        Ok(_) => panic!("opened"),
    };
    refused(
        Engine::builder()
            .path("unused.redb")
            .log_backend(FaultyStorage::memory()),
    );
}

#[test]
fn copies_of_one_message_run_once_with_the_log_on() {
    const COPIES: usize = 16;
    let engine = open(&FaultyStorage::memory(), &FaultyStorage::memory()).unwrap();
    for round in 0..8 {
        let key = format!("msg-{round}");
        let barrier = Arc::new(Barrier::new(COPIES));
        let results: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..COPIES)
                .map(|copy| {
                    let (engine, barrier, key) = (&engine, barrier.clone(), key.clone());
                    s.spawn(move || {
                        barrier.wait();
                        let out = engine
                            .run(key.as_bytes(), &ClaimOptions::default(), |_lease| {
                                Ok::<_, std::io::Error>(format!("ran by {copy}").into_bytes())
                            })
                            .unwrap();
                        out.response().to_vec()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
        let stored = completed(
            engine
                .claim(key.as_bytes(), &ClaimOptions::default())
                .unwrap(),
        );
        assert_eq!(stored.response(), results[0].as_slice());
    }
    assert_eq!(engine.stats().completions, 8);
}

/// Claims and completes keys `k0..k{KEYS}` one at a time (two writers' worth: each key's
/// claim and completion are separate group commits); returns the keys whose completion
/// returned `Ok`.
fn sweep_workload(engine: &Engine, keys: usize) -> Vec<usize> {
    let mut acked = Vec::new();
    for i in 0..keys {
        let key = format!("k{i}");
        let Ok(Claim::Acquired(lease)) = engine.claim(key.as_bytes(), &ClaimOptions::default())
        else {
            continue;
        };
        if lease.complete(format!("r{i}").as_bytes()).is_ok() {
            acked.push(i);
        }
    }
    acked
}

/// `fault` at every I/O of either storage, with `bug` armed: every acknowledged completion
/// must be there after the reopen. After a power loss the storages keep what they synced;
/// after a failed I/O (the process lives on, poisoned, and closes) they keep every write
/// too, and both are checked. The first violation, if any.
fn fault_sweep(bug: Bug, fault: fn(u64) -> Fault) -> Result<(), String> {
    const KEYS: usize = 3;
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let engine = open_with(&file, &log, bug).map_err(|e| e.to_string())?;
    sweep_workload(&engine, KEYS);
    let _ = engine.close();
    for (struck, total) in [file.ios(), log.ios()].into_iter().enumerate() {
        for at in 1..=total {
            let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
            [&file, &log][struck].set_fault(Some(fault(at)));
            let acked = match open_with(&file, &log, bug) {
                Ok(engine) => {
                    let acked = sweep_workload(&engine, KEYS);
                    let _ = engine.close();
                    acked
                }
                Err(_) => Vec::new(),
            };
            let mut images = vec![power_loss(&file, &log)];
            if let Fault::Error { .. } = fault(at) {
                images.push((
                    FaultyStorage::from_image(file.live_image()),
                    FaultyStorage::from_image(log.live_image()),
                ));
            }
            for (file, log) in images {
                let what = format!("{:?} of the {}", fault(at), ["file", "log"][struck]);
                let Ok(engine) = open(&file, &log) else {
                    if acked.is_empty() {
                        continue;
                    }
                    return Err(format!("{what}: the reopen failed"));
                };
                for &i in &acked {
                    let got = stored_response(&engine, &format!("k{i}"));
                    if got.as_deref() != Some(format!("r{i}").as_bytes()) {
                        return Err(format!("{what}: acknowledged k{i} reads {got:?}"));
                    }
                }
            }
        }
    }
    Ok(())
}

fn power_loss_sweep(bug: Bug) -> Result<(), String> {
    fault_sweep(bug, |at| Fault::PowerLoss { at })
}

#[test]
fn a_power_loss_at_any_io_keeps_every_acknowledged_completion() {
    power_loss_sweep(Bug::None).unwrap();
}

/// A failed write, `set_len` or sync of either storage (a full disk, an I/O error) poisons
/// the engine and loses nothing acknowledged, whether the machine then stays up or not.
#[test]
fn a_failed_io_of_the_file_or_its_log_loses_nothing_acknowledged() {
    fault_sweep(Bug::None, |at| Fault::Error { at }).unwrap();
}

/// Teeth: acknowledging before the log's fdatasync is caught by the same sweep.
#[cfg(idemkv_sabotage)]
#[test]
fn sabotaged_the_power_loss_sweep_catches_ack_before_the_log_is_synced() {
    let caught = power_loss_sweep(Bug::AckBeforeCommit);
    assert!(
        caught.is_err(),
        "acknowledging before the log's sync survived the sweep"
    );
    eprintln!("caught: {}", caught.unwrap_err());
}

#[test]
fn a_file_missing_its_log_after_a_crash_is_refused_and_stands_alone_after_a_close() {
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let engine = open(&file, &log).unwrap();
    complete(&engine, "a", b"1");
    let (crashed, _log) = power_loss(&file, &log);
    drop(engine);
    // Its completion is in the log alone: without the log the open is refused.
    let err = Engine::builder()
        .backend(FaultyStorage::from_image(crashed.durable_image()))
        .open()
        .unwrap_err();
    assert_eq!(err.kind(), OpenErrorKind::Corrupted, "{err}");
    assert!(err.to_string().contains("missing"), "{err}");

    // After a clean close the file needs no log, whether the log was written or not.
    for writes in [true, false] {
        let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
        let engine = open(&file, &log).unwrap();
        if writes {
            complete(&engine, "a", b"1");
        }
        engine.close().unwrap();
        drop(engine);
        let alone = Engine::builder()
            .backend(FaultyStorage::from_image(file.durable_image()))
            .open()
            .unwrap();
        let expected = writes.then(|| b"1".to_vec());
        assert_eq!(stored_response(&alone, "a"), expected);
    }
}

#[test]
fn a_poisoned_engine_closed_without_a_checkpoint_keeps_every_acknowledged_completion() {
    let (file, log, engine) = with_completions(3);
    // The next log sync fails: the engine is poisoned, and its close cannot checkpoint.
    log.fail_sync_in(1);
    assert!(engine.claim(b"k3", &ClaimOptions::default()).is_err());
    assert!(engine.stats().poisoned);
    let _ = engine.close();
    drop(engine);
    // redb makes its non-durable commits durable when the database closes, so the file
    // may hold the log's frames already; a reopen with the log applies none twice.
    let reopened = open(
        &FaultyStorage::from_image(file.durable_image()),
        &FaultyStorage::from_image(log.durable_image()),
    )
    .unwrap();
    for i in 0..3 {
        assert_eq!(
            stored_response(&reopened, &format!("k{i}")).as_deref(),
            Some(format!("r{i}").as_bytes())
        );
    }
    assert_eq!(stored_response(&reopened, "k3"), None);
}

/// With the log a completion is acknowledged once its frame is synced, before the batch
/// reaches the file; its response must already answer a claim of the key when `complete`
/// returns (from memory, until the file holds it), from any thread.
#[test]
fn a_completion_answers_claims_as_soon_as_complete_returns() {
    const THREADS: usize = 8;
    const KEYS: usize = 100;
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let engine = open(&file, &log).unwrap();
    let start = Arc::new(Barrier::new(THREADS));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (engine, start) = (&engine, start.clone());
            s.spawn(move || {
                start.wait();
                for i in 0..KEYS {
                    let key = format!("t{t}-k{i}");
                    let response = format!("r{t}-{i}");
                    complete(engine, &key, response.as_bytes());
                    let again = engine.claim(key.as_bytes(), &ClaimOptions::default());
                    assert_eq!(completed(again.unwrap()).response(), response.as_bytes());
                }
            });
        }
    });
    assert_eq!(engine.stats().completions, (THREADS * KEYS) as u64);
    engine.close().unwrap();
    let engine = open(&file, &log).unwrap();
    for t in 0..THREADS {
        let got = stored_response(&engine, &format!("t{t}-k{}", KEYS - 1));
        assert_eq!(
            got.as_deref(),
            Some(format!("r{t}-{}", KEYS - 1).as_bytes())
        );
    }
}

/// An imported completion, too, answers as soon as `import` returns, though its batch is
/// acknowledged at the log's sync, before it reaches the file.
#[test]
fn an_imported_completion_answers_as_soon_as_import_returns() {
    const KEYS: usize = 300;
    let (_, _, source) = with_completions(KEYS);
    let records = source.admin().records();
    assert_eq!(records.len(), KEYS);
    source.close().unwrap();

    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let target = open(&file, &log).unwrap();
    for r in &records {
        target.admin().import(r).unwrap();
        let Some(KeyState::Completed { response, .. }) = target.get(&r.key).unwrap() else {
            panic!("an imported completion must answer at once");
        };
        let RecordInfoState::Completed { response: want, .. } = &r.state else {
            panic!("only completions were exported");
        };
        assert_eq!(&*response, want.as_slice());
    }
    assert_eq!(target.stats().corrupt_reads, 0);
}

/// The default engine on tmpfs (`/dev/shm`), which refuses `O_DIRECT` before Linux 6.6
/// and takes it after: either way every acknowledged completion survives a reopen (the
/// fallback itself is `src/store/log_file.rs`'s unit test). Skipped, with the reason printed,
/// where `/dev/shm` is not a writable directory.
#[test]
fn the_default_engine_works_on_tmpfs() {
    let shm = Path::new("/dev/shm");
    let dir = match tempfile::tempdir_in(shm) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("skipped: no writable /dev/shm ({e})");
            return;
        }
    };
    let path = dir.path().join("idem.redb");
    let engine = Engine::builder().path(&path).open().unwrap();
    for i in 0..5 {
        complete(&engine, &format!("k{i}"), format!("r{i}").as_bytes());
    }
    drop(engine);
    let engine = Engine::builder().path(&path).open().unwrap();
    for i in 0..5 {
        assert_eq!(
            stored_response(&engine, &format!("k{i}")).as_deref(),
            Some(format!("r{i}").as_bytes()),
            "k{i}"
        );
    }
}

/// A disk too full for the log's 16 MiB: the engine opens without the log (its group
/// commits are durable redb commits, as without a log), loses nothing, and a later open
/// with room writes the log again.
#[test]
fn a_log_that_finds_no_room_is_done_without() {
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    log.fail_write_in(1);
    let engine = open(&file, &log).unwrap();
    let log_writes = log.writes();
    for i in 0..5 {
        complete(&engine, &format!("k{i}"), format!("r{i}").as_bytes());
    }
    assert_eq!(log.writes(), log_writes, "the log is not written");
    assert_eq!(engine.stats().log_checkpoints, 0);
    drop(engine);
    // The file alone holds everything (a power loss now keeps it all).
    let image = FaultyStorage::from_image(file.durable_image());
    let healthy = FaultyStorage::memory();
    let engine = open(&image, &healthy).unwrap();
    for i in 0..5 {
        assert_eq!(
            stored_response(&engine, &format!("k{i}")).as_deref(),
            Some(format!("r{i}").as_bytes()),
            "k{i}"
        );
    }
    let before = healthy.writes();
    complete(&engine, "k5", b"r5");
    assert!(
        healthy.writes() > before,
        "with room, the log is written again"
    );
}
