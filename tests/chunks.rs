//! The chunked layout (file format 5): a writable open converts the records table of a file
//! of an older format into chunks in one commit and moves the marker on; a read-only open
//! reads an old file in place without changing a byte; a failure at any I/O of the
//! conversion leaves a file that opens with every record; and the chunks of a busy file
//! stay full.

use idemkv::admin::{FileReader, RecordInfo};
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::{ClaimOptions, Engine, MockClock};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

const CHUNKS: TableDefinition<u64, &[u8]> = TableDefinition::new("idemkv_chunks");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemkv_meta");
const MAGIC_V5: &[u8] = b"idemkv\0\x05";
/// Files of formats 1 and 2 and of release 0.1 (`tests/format.rs`, `tests/migration.rs`).
const FIXTURES: [&str; 3] = ["format-v1.redb", "format-v2.redb", "release-0.1-clean.redb"];
/// A moment after every fixture was written and before any of its completions expires.
const OPENED_AT_MS: u64 = 1_800_000_001_000;
/// One chunk's budget (`CHUNK_BYTES_MAX`: a 4 KiB redb leaf holding one entry).
const CHUNK_BYTES: usize = 4096 - 16;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn clock() -> MockClock {
    let clock = MockClock::new();
    clock.set_wall(UNIX_EPOCH + Duration::from_millis(OPENED_AT_MS));
    clock
}

fn open(path: &Path) -> Engine {
    Engine::builder()
        .path(path)
        .clock(clock())
        .retention(Duration::from_secs(30 * 86_400))
        .open()
        .unwrap()
}

/// The completions a reader finds in the file at `path`.
fn completions(path: &Path) -> Vec<RecordInfo> {
    let reader = FileReader::open(path).unwrap();
    let mut records = reader.snapshot().unwrap().records;
    records.retain(|r| r.state_name() == "completed");
    records.sort_by_key(|r| r.token);
    records
}

/// The names of the file's tables and its format marker.
fn layout(path: &Path) -> (Vec<String>, Vec<u8>) {
    use redb::TableHandle;
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let names = txn
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .collect();
    let meta = txn.open_table(META).unwrap();
    let marker = meta.get("format").unwrap().unwrap().value().to_vec();
    (names, marker)
}

/// The encoded size of every chunk of the file at `path`, in token order.
fn chunk_sizes(path: &Path) -> Vec<usize> {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(CHUNKS).unwrap();
    table
        .iter()
        .unwrap()
        .map(|e| e.unwrap().1.value().len())
        .collect()
}

#[test]
fn a_writable_open_converts_an_old_file_into_chunks_and_a_reader_leaves_it_as_it_is() {
    for name in FIXTURES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::copy(fixture(name), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let before = completions(&path);
        assert!(!before.is_empty(), "{name}");
        // The reader read the old layout in place.
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}");
        let (tables, marker) = layout(&path);
        assert!(tables.iter().any(|t| t == "idemkv_records"), "{name}");
        assert_ne!(marker, MAGIC_V5, "{name}");

        open(&path).close().unwrap();
        let (tables, marker) = layout(&path);
        assert!(tables.iter().any(|t| t == "idemkv_chunks"), "{name}");
        assert!(!tables.iter().any(|t| t == "idemkv_records"), "{name}");
        assert_eq!(marker, MAGIC_V5, "{name}");
        assert_eq!(completions(&path), before, "{name}");
        // And an engine serves them again.
        let engine = open(&path);
        for r in &before {
            let opts = ClaimOptions::default().scope(&r.scope);
            match engine.claim(&r.key, &opts) {
                Ok(idemkv::Claim::Completed(_)) => {}
                other => panic!("{name}: {:?}: {other:?}", r.key),
            }
        }
        engine.close().unwrap();
    }
}

/// A failure at each write and at each sync of the open that converts a file: the open fails
/// (or succeeds), and what is durable then opens with every completion, converted or not.
#[test]
fn a_conversion_cut_short_at_any_io_leaves_a_file_that_opens_whole() {
    let original = std::fs::read(fixture("format-v1.redb")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("reference.redb");
    std::fs::write(&reference, &original).unwrap();
    let want = completions(&reference);
    let open_on = |disk: &FaultyStorage| {
        Engine::builder()
            .path("fixture.redb")
            .backend(disk.clone())
            .clock(clock())
            .retention(Duration::from_secs(30 * 86_400))
            .open()
    };
    let mut cut = 0;
    for fail_sync in [false, true] {
        for n in 0..64u64 {
            let disk = FaultyStorage::from_image(&original);
            if fail_sync {
                disk.fail_sync_in(n);
            } else {
                disk.fail_write_in(n);
            }
            let opened = open_on(&disk);
            let failed = opened.is_err();
            if let Ok(engine) = opened {
                let _ = engine.close();
            }
            // What a power loss then leaves.
            let after = dir.path().join(format!("after-{fail_sync}-{n}.redb"));
            std::fs::write(&after, disk.durable_image()).unwrap();
            assert_eq!(completions(&after), want, "sync {fail_sync}, I/O {n}");
            let engine = open_on(&FaultyStorage::from_image(disk.durable_image())).unwrap();
            engine.close().unwrap();
            if !failed {
                break;
            }
            cut += 1;
        }
    }
    assert!(cut >= 2, "no open was cut short");
}

/// Completions from many threads, each claim and its completion two commits: every chunk
/// but a few is full, so the file holds its records at about the density of their bytes.
#[test]
fn the_chunks_of_a_busy_file_stay_full() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.redb");
    let engine = Engine::builder().path(&path).clock(clock()).open().unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let engine = &engine;
            s.spawn(move || {
                for i in 0..1500 {
                    let key = format!("key-{t}-{i:05}");
                    engine
                        .run(key.as_bytes(), &ClaimOptions::default(), |_| {
                            Ok::<_, std::convert::Infallible>(vec![b'r'; 64])
                        })
                        .unwrap();
                }
            });
        }
    });
    engine.close().unwrap();
    let sizes = chunk_sizes(&path);
    assert!(sizes.iter().all(|&n| n <= CHUNK_BYTES), "{sizes:?}");
    let bytes: usize = sizes.iter().sum();
    let fill = bytes as f64 / (sizes.len() * CHUNK_BYTES) as f64;
    assert!(fill > 0.9, "chunks {:.0} % full: {sizes:?}", fill * 100.0);
}
