//! Files written by the previous record format (version 1) keep working: their records are
//! read, replayed, matched against fingerprints and taken over; the first writable open
//! moves the file's format marker on, and a reader leaves an old file untouched.
//!
//! `tests/fixtures/format-v1.redb` was written by the engine of the previous format, with a
//! mock clock at 1 800 000 000 000 ms since the epoch, a 30 s lease and 30 days of
//! retention: four completions (`done-payload` with `payload(b"{\"amount\":42}")`,
//! `done-u64` with `fingerprint(0xfeed)`, `done-none` without a fingerprint, `done-big` with
//! a 100 000-byte response) and one claim left held (`held`, `payload(b"job")`, checkpoint
//! phase 2 `step-2`).

use idemkv::{Claim, ClaimError, ClaimOptions, Durability, Engine, FileReader, MockClock};
use idemkv::{RecordInfoState, Recovery};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

const WRITTEN_AT_MS: u64 = 1_800_000_000_000;
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/format-v1.redb");
const MAGIC_V1: &[u8] = b"idemkv\0\x01";
const MAGIC_V2: &[u8] = b"idemkv\0\x02";

fn copy_of_fixture(dir: &Path) -> PathBuf {
    let path = dir.join("old.redb");
    std::fs::copy(FIXTURE, &path).unwrap();
    path
}

fn clock_after(ms: u64) -> MockClock {
    let clock = MockClock::new();
    clock.set_wall(UNIX_EPOCH + Duration::from_millis(WRITTEN_AT_MS + ms));
    clock
}

fn open(path: &Path, clock: &MockClock, durability: Durability) -> Engine {
    Engine::builder()
        .path(path)
        .durability(durability)
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(30 * 86_400))
        .recovery(Recovery::TakeOver)
        .open()
        .unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn replayed(engine: &Engine, key: &[u8], opts: &ClaimOptions) -> Vec<u8> {
    match engine.claim(key, opts).unwrap() {
        Claim::Completed(stored) => stored.response().to_vec(),
        other => panic!(
            "{}: expected a replay, got {other:?}",
            String::from_utf8_lossy(key)
        ),
    }
}

#[test]
fn the_fixture_is_a_file_of_the_previous_format() {
    let bytes = std::fs::read(FIXTURE).unwrap();
    assert!(contains(&bytes, MAGIC_V1));
    assert!(!contains(&bytes, MAGIC_V2));
}

#[test]
fn a_previous_format_file_is_replayed_matched_and_taken_over_in_every_durable_mode() {
    for durability in [Durability::Immediate, Durability::buffered()] {
        let dir = tempfile::tempdir().unwrap();
        let path = copy_of_fixture(dir.path());
        let clock = clock_after(60_000);
        let engine = open(&path, &clock, durability);

        // Completions replay, and their 64-bit fingerprints still guard them: the payload's
        // old FNV-1a, a caller's u64, none at all.
        let payload = ClaimOptions::default().payload(b"{\"amount\":42}");
        assert_eq!(replayed(&engine, b"done-payload", &payload), b"ok-payload");
        assert!(matches!(
            engine.claim(
                b"done-payload",
                &ClaimOptions::default().payload(b"{\"amount\":43}")
            ),
            Err(ClaimError::FingerprintMismatch)
        ));
        let u64_fp = ClaimOptions::default().fingerprint(0xfeed);
        assert_eq!(replayed(&engine, b"done-u64", &u64_fp), b"ok-u64");
        assert!(matches!(
            engine.claim(b"done-u64", &ClaimOptions::default().fingerprint(0xbeef)),
            Err(ClaimError::FingerprintMismatch)
        ));
        let any = ClaimOptions::default();
        assert_eq!(replayed(&engine, b"done-none", &any), b"ok-none");
        assert_eq!(replayed(&engine, b"done-big", &any), vec![7u8; 100_000]);

        // The held claim's owner is gone: taken over at attempt 2 with its checkpoint, and
        // its fingerprint still guards it.
        assert!(matches!(
            engine.claim(b"held", &ClaimOptions::default().payload(b"other job")),
            Err(ClaimError::FingerprintMismatch)
        ));
        let lease = match engine.claim(b"held", &ClaimOptions::default().payload(b"job")) {
            Ok(Claim::Acquired(lease)) => lease,
            other => panic!("expected a takeover, got {other:?}"),
        };
        assert_eq!(lease.attempt(), 2);
        let cp = lease.checkpoint().unwrap();
        assert_eq!((cp.phase(), cp.data()), (2, &b"step-2"[..]));
        lease.complete(b"held-done").unwrap();
        engine.close().unwrap();
        drop(engine);

        // The marker moved on at open; the old records and the new one live side by side.
        assert!(contains(&std::fs::read(&path).unwrap(), MAGIC_V2));
        let engine = open(&path, &clock, durability);
        assert_eq!(replayed(&engine, b"done-payload", &payload), b"ok-payload");
        assert_eq!(replayed(&engine, b"held", &any), b"held-done");
        assert_eq!(engine.stats().completed, 5);
        engine.close().unwrap();
    }
}

#[test]
fn old_records_expire_by_their_stored_retention() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of_fixture(dir.path());
    // One millisecond before the completions' stored end, and at it.
    let retention_ms = 30 * 86_400_000;
    let clock = clock_after(retention_ms - 1);
    let engine = open(&path, &clock, Durability::Immediate);
    assert_eq!(
        replayed(&engine, b"done-none", &ClaimOptions::default()),
        b"ok-none"
    );
    engine.close().unwrap();
    drop(engine);
    let clock = clock_after(retention_ms);
    let engine = open(&path, &clock, Durability::Immediate);
    assert!(matches!(
        engine.claim(b"done-none", &ClaimOptions::default()),
        Ok(Claim::Acquired(_))
    ));
    engine.close().unwrap();
}

#[test]
fn a_reader_reads_a_previous_format_file_without_changing_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of_fixture(dir.path());
    let before = std::fs::read(&path).unwrap();
    let reader = FileReader::open(&path).unwrap();
    let snapshot = reader.snapshot().unwrap();
    let mut keys: Vec<_> = snapshot.records.iter().map(|r| r.key.clone()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            &b"done-big"[..],
            b"done-none",
            b"done-payload",
            b"done-u64",
            b"held"
        ]
    );
    let held = snapshot.records.iter().find(|r| r.key == b"held").unwrap();
    match &held.state {
        RecordInfoState::InFlight { checkpoint, .. } => {
            assert_eq!(checkpoint.as_ref(), Some(&(2, b"step-2".to_vec())))
        }
        other => panic!("held: {other:?}"),
    }
    let u64_fp = snapshot
        .records
        .iter()
        .find(|r| r.key == b"done-u64")
        .unwrap();
    assert_eq!(u64_fp.fingerprint, Some(0xfeed));
    drop(snapshot);
    drop(reader);
    assert_eq!(std::fs::read(&path).unwrap(), before);
}
