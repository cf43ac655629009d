//! A clean close compacts a file with enough unused pages: the file at rest shrinks to about
//! the pages its records take, and holds every record it held before; a live read
//! transaction keeps the close from compacting without failing it; and a failure at any
//! write or sync of a compaction leaves a file that opens with every acknowledged record.
//!
//! The fixture: one batch of completions (`OLD`) ends its retention while a later batch
//! (`NEW`) keeps its own, so deleting the old batch frees the pages at the start of the file
//! while the new batch's pages stay at its end, which no commit can cut off.

use idemkv::admin::FileReader;
use idemkv::fault::WithStorage;
use idemkv::fault::{Fault, FaultyStorage};
use idemkv::{ClaimOptions, Engine, EngineBuilder, MockClock, Tuning};
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

const RETENTION: Duration = Duration::from_secs(60);
/// Responses of 1 KiB: a few records per 4 KiB page, so that a mebibyte of freed pages
/// (the least a close compacts) takes a thousand-odd records.
const RESPONSE_BYTES: usize = 1024;
const OLD: usize = 1_100;
const NEW: usize = 100;

fn builder(clock: &MockClock) -> EngineBuilder {
    Engine::builder()
        .clock(clock.clone())
        .retention(RETENTION)
        .tuning(Tuning::default().sweep_interval(None))
}

fn key(batch: &str, i: usize) -> Vec<u8> {
    format!("{batch}-{i:05}").into_bytes()
}

/// Completes `n` keys of `batch` from four threads (so that they share group commits).
fn complete(engine: &Engine, batch: &str, n: usize) {
    let opts = ClaimOptions::default();
    std::thread::scope(|s| {
        for t in 0..4 {
            let opts = &opts;
            s.spawn(move || {
                for i in (t..n).step_by(4) {
                    engine
                        .run(&key(batch, i), opts, |_| {
                            Ok::<_, Infallible>(vec![b'r'; RESPONSE_BYTES])
                        })
                        .unwrap();
                }
            });
        }
    });
}

/// Completes the old batch, then (40 s later) the new one, and moves the clock on until only
/// the new batch is within its retention.
fn fill(engine: &Engine, clock: &MockClock) {
    complete(engine, "old", OLD);
    clock.advance(Duration::from_secs(40));
    complete(engine, "new", NEW);
    clock.advance(Duration::from_secs(30));
}

/// [`fill`], then deletes the expired old batch and makes it durable, leaving its pages
/// unused in the live file; returns how many records the sweep deleted.
fn fill_and_sweep(engine: &Engine, clock: &MockClock) -> u64 {
    fill(engine, clock);
    let swept = engine.admin().sweep_now().unwrap();
    engine.flush().unwrap();
    swept
}

fn new_keys() -> BTreeSet<Vec<u8>> {
    (0..NEW).map(|i| key("new", i)).collect()
}

/// The keys of the completions a reader finds in the file at `path`.
fn completed(path: &Path) -> BTreeSet<Vec<u8>> {
    let reader = FileReader::open(path).unwrap();
    let records = reader.snapshot().unwrap().records;
    records
        .into_iter()
        .filter(|r| r.state_name() == "completed")
        .map(|r| r.key)
        .collect()
}

/// The share of the file at `path` that no page of redb uses.
fn unused_share(path: &Path) -> f64 {
    let db = redb::Database::open(path).unwrap();
    let stats = db.begin_write().unwrap().stats().unwrap();
    let used = stats.allocated_pages() * stats.page_size() as u64;
    let file = std::fs::metadata(path).unwrap().len();
    1.0 - used as f64 / file as f64
}

#[test]
fn a_clean_close_compacts_a_file_with_unused_pages_and_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compaction.redb");
    let clock = MockClock::new();
    let engine = builder(&clock).path(&path).open().unwrap();
    assert_eq!(fill_and_sweep(&engine, &clock), OLD as u64);
    let live = std::fs::metadata(&path).unwrap().len();
    engine.close().unwrap();
    let at_rest = std::fs::metadata(&path).unwrap().len();
    // The old batch took over a mebibyte, eleven times the new one: its pages are gone.
    assert!(
        at_rest * 4 < live,
        "the file was {live} bytes open and is {at_rest} closed"
    );
    let unused = unused_share(&path);
    assert!(
        unused < 0.05,
        "{:.1} % of the closed file is unused",
        unused * 100.0
    );
    assert_eq!(completed(&path), new_keys());
    // And an engine serves them again from the compacted file.
    let engine = builder(&clock).path(&path).open().unwrap();
    for i in 0..NEW {
        match engine
            .claim(&key("new", i), &ClaimOptions::default())
            .unwrap()
        {
            idemkv::Claim::Completed(stored) => assert_eq!(stored.response().len(), RESPONSE_BYTES),
            other => panic!("new-{i}: {other:?}"),
        }
    }
    engine.close().unwrap();
}

/// redb compacts only a file no transaction reads: a reader of the live file that holds a
/// read transaction through the close leaves the file as it is, and the close succeeds.
/// (On the platforms where a reader can follow a live file; elsewhere the engine locks it.)
#[cfg(any(target_os = "linux", target_vendor = "apple", windows))]
#[test]
fn a_live_read_transaction_keeps_the_close_from_compacting_and_the_close_succeeds() {
    use redb::ReadableDatabase;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compaction.redb");
    let clock = MockClock::new();
    let engine = builder(&clock).path(&path).open().unwrap();
    fill_and_sweep(&engine, &clock);
    let reader = redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::SingleWriter)
        .open_read_only(&path)
        .unwrap();
    let txn = reader.begin_read().unwrap();
    engine.close().unwrap();
    drop(txn);
    drop(reader);
    assert_eq!(completed(&path), new_keys());
    // The next clean close compacts it: the first did not. (Its free pages are not counted
    // as unused: those the reader kept are still on redb's list of pages to free.)
    let before = std::fs::metadata(&path).unwrap().len();
    builder(&clock).path(&path).open().unwrap().close().unwrap();
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(after * 4 < before, "{before} bytes, then {after}");
    assert_eq!(completed(&path), new_keys());
}

/// A power loss, or a single failed I/O, at each write, `set_len` and sync of a close that
/// compacts: the close succeeds (what it acknowledged was durable before the compaction
/// began), and the file as the disk then holds it opens with every completion.
#[test]
fn a_fault_at_any_io_of_a_compaction_leaves_a_file_that_opens_whole() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    // The fixture: both batches in the file, the old one not yet deleted.
    let disk = FaultyStorage::memory();
    let engine = builder(&clock)
        .path("compaction.redb")
        .backend(disk.clone())
        .open()
        .unwrap();
    fill(&engine, &clock);
    engine.close().unwrap();
    let image = disk.durable_image();
    // An open deletes the expired batch in its own commit; the close then compacts.
    let open = |disk: &FaultyStorage| {
        builder(&clock)
            .path("compaction.redb")
            .backend(disk.clone())
            .open()
            .unwrap()
    };
    let check = |image: &[u8], what: &str| {
        let path = dir.path().join("after.redb");
        std::fs::write(&path, image).unwrap();
        assert_eq!(completed(&path), new_keys(), "{what}");
        // And an engine opens it (recovering redb's allocator state where it must).
        open(&FaultyStorage::from_image(image)).close().unwrap();
    };
    let reference = FaultyStorage::from_image(&image);
    let engine = open(&reference);
    let opened = reference.ios();
    let before = reference.durable_image().len();
    engine.close().unwrap();
    let closed = reference.ios();
    let after = reference.durable_image().len();
    assert!(
        after * 4 < before,
        "not compacted: {before} bytes, then {after}"
    );
    check(&reference.durable_image(), "no fault");
    for at in opened + 1..=closed {
        for fault in [Fault::PowerLoss { at }, Fault::Error { at }] {
            let disk = FaultyStorage::from_image(&image);
            let engine = open(&disk);
            assert_eq!(disk.ios(), opened, "the open's I/O is the same each time");
            disk.set_fault(Some(fault));
            engine.close().unwrap();
            assert_eq!(disk.struck_at(), Some(at), "{fault:?}");
            check(&disk.durable_image(), &format!("{fault:?}, durable"));
            check(&disk.live_image(), &format!("{fault:?}, live"));
        }
    }
}
