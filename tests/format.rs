//! Files written by the previous record formats (versions 1 and 2) keep working: their
//! records are read, replayed, matched against fingerprints and taken over; the first
//! writable open moves the file's format marker on, and a reader leaves an old file
//! untouched.
//!
//! `tests/fixtures/format-v1.redb` was written by the engine of the previous format, with a
//! mock clock at 1 800 000 000 000 ms since the epoch, a 30 s lease and 30 days of
//! retention: four completions (`done-payload` with `payload(b"{\"amount\":42}")`,
//! `done-u64` with `fingerprint(0xfeed)`, `done-none` without a fingerprint, `done-big` with
//! a 100 000-byte response) and one claim left held (`held`, `payload(b"job")`, checkpoint
//! phase 2 `step-2`).
//!
//! `tests/fixtures/format-v2.redb` was written by the engine of format 2, with a mock clock
//! at the same instant, a 30 s lease, 30 days of retention and `Durability::Immediate`: one
//! completion (`done`, `payload(b"{\"amount\":42}")`, response `ok-done`) and two claims
//! left held: `held-long` (`payload(b"job")`, its own lease of 600 s, checkpoint phase 1
//! `step-1`) and `held-default` (no payload, the engine's lease).

use idemkv::admin::FileReader;
use idemkv::admin::RecordInfoState;
use idemkv::Recovery;
use idemkv::{Claim, ClaimError, ClaimOptions, Durability, Engine, MockClock};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

const WRITTEN_AT_MS: u64 = 1_800_000_000_000;
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/format-v1.redb");
const FIXTURE_V2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/format-v2.redb");
const MAGIC_V1: &[u8] = b"idemkv\0\x01";
const MAGIC_V2: &[u8] = b"idemkv\0\x02";
const MAGIC_V3: &[u8] = b"idemkv\0\x03";
/// Format 4's marker: the compact record encoding, one record per row.
const MAGIC_V4: &[u8] = b"idemkv\0\x04";
/// The current marker (format 5: records packed into chunks; `tests/chunks.rs`).
const MAGIC_V5: &[u8] = b"idemkv\0\x05";

fn copy_of_fixture(dir: &Path) -> PathBuf {
    copy_of(FIXTURE, dir)
}

fn copy_of(fixture: &str, dir: &Path) -> PathBuf {
    let path = dir.join("old.redb");
    std::fs::copy(fixture, &path).unwrap();
    path
}

fn clock_after(ms: u64) -> MockClock {
    let clock = MockClock::new();
    clock.set_wall(UNIX_EPOCH + Duration::from_millis(WRITTEN_AT_MS + ms));
    clock
}

fn open(path: &Path, clock: &MockClock, durability: Durability) -> Engine {
    open_with(
        path,
        clock,
        durability,
        Recovery::TakeOver,
        Duration::from_secs(30),
    )
}

fn open_with(
    path: &Path,
    clock: &MockClock,
    durability: Durability,
    recovery: Recovery,
    lease: Duration,
) -> Engine {
    Engine::builder()
        .path(path)
        .durability(durability)
        .clock(clock.clone())
        .lease(lease)
        .retention(Duration::from_secs(30 * 86_400))
        .recovery(recovery)
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
    assert!(!contains(&bytes, MAGIC_V3));
    assert!(!contains(&bytes, MAGIC_V4));
    assert!(!contains(&bytes, MAGIC_V5));
    let bytes = std::fs::read(FIXTURE_V2).unwrap();
    assert!(contains(&bytes, MAGIC_V2));
    assert!(!contains(&bytes, MAGIC_V3));
    assert!(!contains(&bytes, MAGIC_V4));
    assert!(!contains(&bytes, MAGIC_V5));
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
        assert!(contains(&std::fs::read(&path).unwrap(), MAGIC_V5));
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

/// `Recovery::HonourLeases` on a file of format 2: its InFlight records do not keep their
/// holder's lease length, so what is left of each lease is capped by the engine's lease at
/// reopen (30 s here, then 5 s), as before format 3. Completions replay, fingerprints guard,
/// checkpoints are handed to the takeover, and the marker moves on to the current format.
#[test]
fn a_format_2_file_is_honoured_replayed_and_taken_over() {
    for durability in [Durability::Immediate, Durability::buffered()] {
        let dir = tempfile::tempdir().unwrap();
        let path = copy_of(FIXTURE_V2, dir.path());
        let clock = clock_after(10_000);
        let lease = Duration::from_secs(30);
        let engine = open_with(&path, &clock, durability, Recovery::HonourLeases, lease);
        let payload = ClaimOptions::default().payload(b"{\"amount\":42}");
        assert_eq!(replayed(&engine, b"done", &payload), b"ok-done");
        assert!(matches!(
            engine.claim(b"done", &ClaimOptions::default().payload(b"{}")),
            Err(ClaimError::FingerprintMismatch)
        ));
        let job = ClaimOptions::default().payload(b"job");
        assert!(matches!(
            engine.claim(b"held-long", &ClaimOptions::default().payload(b"other")),
            Err(ClaimError::FingerprintMismatch)
        ));
        // 590 s left of its 600 s lease, capped by the engine's 30 s; 20 s left of the other.
        let busy = |key: &[u8], opts: &ClaimOptions| match engine.claim(key, opts).unwrap() {
            Claim::InProgress(busy) => busy.retry_after(),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(key)),
        };
        assert_eq!(busy(b"held-long", &job), lease);
        let any = ClaimOptions::default();
        assert_eq!(busy(b"held-default", &any), Duration::from_secs(20));
        clock.advance(Duration::from_secs(20));
        assert_eq!(busy(b"held-long", &job), Duration::from_secs(10));
        let taken = match engine.claim(b"held-default", &any).unwrap() {
            Claim::Acquired(lease) => lease,
            other => panic!("held-default: {other:?}"),
        };
        assert_eq!(taken.attempt(), 2);
        clock.advance(Duration::from_secs(10));
        let lease_long = match engine.claim(b"held-long", &job).unwrap() {
            Claim::Acquired(lease) => lease,
            other => panic!("held-long: {other:?}"),
        };
        assert_eq!(lease_long.attempt(), 2);
        let cp = lease_long.checkpoint().unwrap();
        assert_eq!((cp.phase(), cp.data()), (1, &b"step-1"[..]));
        lease_long.complete(b"long-done").unwrap();
        taken.complete(b"default-done").unwrap();
        engine.close().unwrap();
        drop(engine);
        assert!(contains(&std::fs::read(&path).unwrap(), MAGIC_V5));
        let engine = open(&path, &clock, durability);
        assert_eq!(replayed(&engine, b"done", &payload), b"ok-done");
        assert_eq!(replayed(&engine, b"held-long", &job), b"long-done");
        assert_eq!(replayed(&engine, b"held-default", &any), b"default-done");
        engine.close().unwrap();
    }
    // Another engine lease at reopen is the cap of a record that does not keep its own.
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of(FIXTURE_V2, dir.path());
    let clock = clock_after(10_000);
    let five = Duration::from_secs(5);
    let engine = open_with(
        &path,
        &clock,
        Durability::Immediate,
        Recovery::HonourLeases,
        five,
    );
    match engine
        .claim(b"held-long", &ClaimOptions::default())
        .unwrap()
    {
        Claim::InProgress(busy) => assert_eq!(busy.retry_after(), five),
        other => panic!("held-long: {other:?}"),
    }
    engine.close().unwrap();
}

#[test]
fn a_reader_reads_a_format_2_file_without_changing_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of(FIXTURE_V2, dir.path());
    let before = std::fs::read(&path).unwrap();
    let reader = FileReader::open(&path).unwrap();
    let snapshot = reader.snapshot().unwrap();
    let mut keys: Vec<_> = snapshot.records.iter().map(|r| r.key.clone()).collect();
    keys.sort();
    assert_eq!(keys, [&b"done"[..], b"held-default", b"held-long"]);
    let held = snapshot
        .records
        .iter()
        .find(|r| r.key == b"held-long")
        .unwrap();
    match &held.state {
        RecordInfoState::InFlight {
            checkpoint,
            lease_deadline,
            lease,
            claim_id,
            ..
        } => {
            assert_eq!(checkpoint.as_ref(), Some(&(1, b"step-1".to_vec())));
            assert_eq!(
                *lease_deadline,
                UNIX_EPOCH + Duration::from_millis(WRITTEN_AT_MS + 600_000)
            );
            // Format 2 did not keep them.
            assert_eq!((*lease, *claim_id), (None, None));
        }
        other => panic!("held-long: {other:?}"),
    }
    drop(snapshot);
    drop(reader);
    assert_eq!(std::fs::read(&path).unwrap(), before);
}
