//! Files written by release 0.1 open under the durable default (`Durability::Immediate`,
//! which now writes a commit log beside every file) with nothing acknowledged lost.
//!
//! Release 0.1 made each group commit durable in one of two ways: by default a durable
//! two-phase redb commit, with no file beside the database; with `commit_log(true)` a
//! durable append to `<path>-log`, the batch reaching the redb file in a non-durable commit
//! and a checkpoint (a durable redb commit) making the file complete again only when the
//! log was full, at close and at open. A crash of such an engine leaves acknowledged
//! commits in the log alone. The current engine keeps a log for every file, applied by
//! durable commits, and must take over all three kinds of file an upgrade finds. This test
//! keeps that upgrade path working: each fixture is opened with
//! `Engine::builder().path(..).open()` and must yield every acknowledged completion (bytes,
//! token, attempt, fingerprint), every held claim taken over with attempt 2 and its
//! checkpoint, a log beside the file, and the same records after a clean close, a reopen
//! and a read of the closed file.
//!
//! The fixtures were written once by the engine of release 0.1 (commit 1629eae), through
//! its public API, by a throwaway program (not kept) that ran each crashing engine in a
//! child process (itself, executed again) and copied the files once that child had died.
//! The engines used the system clock, retention and lease set to the longest retention
//! the engine accepts (ten years: the completions stay unexpired until December 2036; the
//! fixtures must be written again before then), and the default `Durability::Immediate`,
//! `durable_claims(true)` and `Recovery::TakeOver`. The same workload wrote each one: for
//! `i` in 0..24, the key `k{i:02}` claimed with `payload(b"req{i}")` and completed with the
//! response `r{i}` followed by the bytes `0, 0xff, i`; then for `j` in 0..3, the key `f{j}`
//! claimed with `payload(b"f{j}")` and its own ten-year lease, given the checkpoint of phase
//! `j + 1` with the payload `cp-f{j}`, and never settled. Tokens were issued from 1 in that
//! order.
//!
//! - `release-0.1-clean.redb`: the workload, the leases of `f0..f2` dropped, the engine
//!   closed cleanly. No log.
//! - `release-0.1-crashed.redb`: the workload in a child process that printed `ready` once
//!   its last call (the checkpoint of `f2`) returned, then called `std::process::abort()`
//!   with the three leases held (as a SIGKILL at that point would). No log; redb's recovery
//!   runs at the next open.
//! - `release-0.1-crashed-log.redb` and its `-log`: an engine opened with
//!   `commit_log(true)` completed `k00..k11`, claimed `f0` with its checkpoint (tokens 1
//!   to 13) and closed cleanly; a child process then reopened it with `commit_log(true)`,
//!   completed `k12..k23` and claimed `f1` and `f2` with their checkpoints (tokens from
//!   4 194 305, the next reserved block), printed `ready` and aborted. Those fourteen
//!   acknowledged calls are in the log alone: the release-0.1 engine, reading the file
//!   beside a log of zeros, found `k00..k11` and `f0` only; it refused a read-only open of
//!   the file and its log with `UnappliedLog`, and an open of the file without its log as
//!   damaged (its log missing). Its log was 16 MiB, zeros after the first 112 KiB
//!   (28 blocks of 4 KiB, the frames); the fixture keeps those 112 KiB, and the test puts
//!   the zeros back (`LOG_BYTES`), so the engine reads the very image the crash left.
//!
//! Each test works on copies in a temporary directory; the fixtures are never written.

use idemkv::admin::{FileReader, RecordInfoState};
use idemkv::error::OpenErrorKind;
use idemkv::{Claim, ClaimError, ClaimOptions, Engine, KeyState};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
/// The length of a release-0.1 commit log (written in full when it was created).
const LOG_BYTES: u64 = 16 << 20;
const COMPLETIONS: usize = 24;
const HELD: usize = 3;
/// The first token of the block the crashed `commit_log(true)` engine reserved at reopen.
const SECOND_BLOCK: u64 = 4_194_305;

/// One fixture and the tokens the release-0.1 engine returned when it wrote it.
struct Fixture {
    name: &'static str,
    /// A release-0.1 commit log beside the file.
    log: bool,
    /// The token of `k{i:02}`'s completion, index `i`.
    completions: [u64; COMPLETIONS],
    /// The token of `f{j}`'s claim, index `j`.
    held: [u64; HELD],
}

/// Tokens 1..=24 for the completions, 25..=27 for the claims held.
const fn in_order() -> [u64; COMPLETIONS] {
    let mut tokens = [0; COMPLETIONS];
    let mut i = 0;
    while i < COMPLETIONS {
        tokens[i] = i as u64 + 1;
        i += 1;
    }
    tokens
}

/// `k00..k11` in the checkpointed file (tokens 1..=12), `k12..k23` in the log alone.
const fn split_at_crash() -> [u64; COMPLETIONS] {
    let mut tokens = in_order();
    let mut i = 12;
    while i < COMPLETIONS {
        tokens[i] = SECOND_BLOCK + (i as u64 - 12);
        i += 1;
    }
    tokens
}

const CLEAN: Fixture = Fixture {
    name: "release-0.1-clean.redb",
    log: false,
    completions: in_order(),
    held: [25, 26, 27],
};

const CRASHED: Fixture = Fixture {
    name: "release-0.1-crashed.redb",
    log: false,
    completions: in_order(),
    held: [25, 26, 27],
};

const CRASHED_LOG: Fixture = Fixture {
    name: "release-0.1-crashed-log.redb",
    log: true,
    completions: split_at_crash(),
    held: [13, SECOND_BLOCK + 12, SECOND_BLOCK + 13],
};

fn key(i: usize) -> Vec<u8> {
    format!("k{i:02}").into_bytes()
}

fn response(i: usize) -> Vec<u8> {
    let mut response = format!("r{i}").into_bytes();
    response.extend_from_slice(&[0, 0xff, i as u8]);
    response
}

fn request(i: usize) -> ClaimOptions {
    ClaimOptions::default().payload(format!("req{i}").as_bytes())
}

fn held_key(j: usize) -> Vec<u8> {
    format!("f{j}").into_bytes()
}

fn held_request(j: usize) -> ClaimOptions {
    ClaimOptions::default().payload(&held_key(j))
}

fn checkpoint(j: usize) -> (u32, Vec<u8>) {
    (j as u32 + 1, format!("cp-f{j}").into_bytes())
}

/// What the takeover of `f{j}` completes it with.
fn takeover_response(j: usize) -> Vec<u8> {
    format!("done-f{j}").into_bytes()
}

fn log_of(path: &Path) -> PathBuf {
    let mut log = path.as_os_str().to_owned();
    log.push("-log");
    PathBuf::from(log)
}

/// Copies the fixture (and its log, zeros put back to the full length) into `dir`.
fn copy_of(fixture: &Fixture, dir: &Path, with_log: bool) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(fixture.name);
    std::fs::copy(Path::new(FIXTURES).join(fixture.name), &path).unwrap();
    if with_log {
        let log = log_of(&path);
        std::fs::copy(log_of(&Path::new(FIXTURES).join(fixture.name)), &log).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        file.set_len(LOG_BYTES).unwrap();
        file.sync_all().unwrap();
    }
    path
}

fn open(path: &Path) -> Engine {
    Engine::builder()
        .path(path)
        .open()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every completion of the fixture is replayed with its bytes, token and attempt, and its
/// fingerprint still refuses another payload.
fn assert_completions(engine: &Engine, fixture: &Fixture) {
    for i in 0..COMPLETIONS {
        let name = String::from_utf8(key(i)).unwrap();
        match engine.get(&key(i)).unwrap() {
            Some(KeyState::Completed {
                token,
                attempt,
                response: stored,
                expires_at,
            }) => {
                assert_eq!(token, fixture.completions[i], "{name}");
                assert_eq!(attempt, 1, "{name}");
                assert_eq!(&stored[..], &response(i)[..], "{name}");
                assert!(expires_at > SystemTime::now(), "{name}");
            }
            other => panic!("{}: {name} is {other:?}", fixture.name),
        }
        match engine.claim(&key(i), &request(i)).unwrap() {
            Claim::Completed(stored) => {
                assert_eq!(stored.response(), &response(i)[..], "{name}");
                assert_eq!(stored.token(), fixture.completions[i], "{name}");
                assert_eq!(stored.attempt(), 1, "{name}");
            }
            other => panic!("{}: {name} claimed: {other:?}", fixture.name),
        }
        let other_request = request(i + 100);
        assert!(
            matches!(
                engine.claim(&key(i), &other_request),
                Err(ClaimError::FingerprintMismatch)
            ),
            "{name}"
        );
    }
}

/// The claims held when the fixture was written are InFlight with their checkpoints; each
/// is taken over at once (attempt 2, its checkpoint, a token above every token the file
/// holds), although its ten-year lease is live, and completed.
fn take_over_held(engine: &Engine, fixture: &Fixture) {
    let highest = fixture
        .completions
        .iter()
        .chain(&fixture.held)
        .max()
        .copied();
    for j in 0..HELD {
        let name = String::from_utf8(held_key(j)).unwrap();
        match engine.get(&held_key(j)).unwrap() {
            Some(KeyState::InFlight {
                token,
                attempt,
                checkpoint: Some(saved),
                failed,
                ..
            }) => {
                assert_eq!(token, fixture.held[j], "{name}");
                assert_eq!(attempt, 1, "{name}");
                assert_eq!(
                    (saved.phase(), saved.data().to_vec()),
                    checkpoint(j),
                    "{name}"
                );
                assert!(!failed, "{name}");
            }
            other => panic!("{}: {name} is {other:?}", fixture.name),
        }
        // Recovery::TakeOver: the holder died with the engine that wrote the file.
        let Claim::Acquired(lease) = engine.claim(&held_key(j), &held_request(j)).unwrap() else {
            panic!("{}: {name} not taken over", fixture.name);
        };
        assert_eq!(lease.attempt(), 2, "{name}");
        assert!(
            Some(lease.token()) > highest,
            "{name}: token {}",
            lease.token()
        );
        let saved = lease.checkpoint().expect("the checkpoint is kept");
        assert_eq!(
            (saved.phase(), saved.data().to_vec()),
            checkpoint(j),
            "{name}"
        );
        lease.complete(&takeover_response(j)).unwrap();
    }
}

/// After the takeovers: every key is Completed, as the engine and a reader of the closed
/// file both see it.
fn assert_all_completed(engine: &Engine, fixture: &Fixture) -> Vec<(Vec<u8>, u64, u32, Vec<u8>)> {
    assert_completions(engine, fixture);
    let mut seen = Vec::new();
    for i in 0..COMPLETIONS {
        seen.push((key(i), fixture.completions[i], 1, response(i)));
    }
    for j in 0..HELD {
        let Some(KeyState::Completed {
            token,
            attempt,
            response: stored,
            ..
        }) = engine.get(&held_key(j)).unwrap()
        else {
            panic!("{}: f{j} not completed", fixture.name);
        };
        assert_eq!(attempt, 2);
        assert_eq!(&stored[..], &takeover_response(j)[..]);
        match engine.claim(&held_key(j), &held_request(j)).unwrap() {
            Claim::Completed(again) => assert_eq!(again.token(), token),
            other => panic!("{}: f{j} claimed: {other:?}", fixture.name),
        }
        seen.push((held_key(j), token, attempt, stored.to_vec()));
    }
    seen
}

fn migrates(fixture: &Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of(fixture, dir.path(), fixture.log);
    assert_eq!(log_of(&path).exists(), fixture.log);
    migrates_at(fixture, &path);
}

/// Opens the copy of `fixture` at `path` under the default, checks every record, takes the
/// held claims over, closes, reopens and reads the closed file.
fn migrates_at(fixture: &Fixture, path: &Path) {
    let log = log_of(path);
    let engine = open(path);
    // The durable default writes its log beside the file, whatever the file came with.
    assert_eq!(std::fs::metadata(&log).unwrap().len(), LOG_BYTES);
    assert_completions(&engine, fixture);
    take_over_held(&engine, fixture);
    let expected = assert_all_completed(&engine, fixture);
    engine.close().unwrap();
    drop(engine);

    // A clean close, then a reopen: the same records.
    let engine = open(path);
    assert!(log.exists());
    assert_eq!(assert_all_completed(&engine, fixture), expected);
    engine.close().unwrap();
    drop(engine);

    // A reader of the closed file sees the same records, the log applied.
    let reader = FileReader::open(path).unwrap();
    assert!(!reader.is_live());
    let snapshot = reader.snapshot().unwrap();
    let mut records: Vec<_> = snapshot
        .records
        .iter()
        .map(|r| {
            assert!(r.scope.is_empty());
            let RecordInfoState::Completed {
                response,
                expires_at,
                published,
            } = &r.state
            else {
                panic!("{}: {:?} is {:?}", fixture.name, r.key, r.state);
            };
            assert!(published);
            assert!(*expires_at > SystemTime::now());
            (r.key.clone(), r.token, r.attempt, response.clone())
        })
        .collect();
    records.sort();
    let mut expected = expected;
    expected.sort();
    assert_eq!(records, expected);
    for (key, token, _, response) in &expected {
        let info = reader.get(key).unwrap().unwrap();
        assert_eq!(info.token, *token);
        assert!(
            matches!(&info.state, RecordInfoState::Completed { response: r, .. } if r == response)
        );
    }
}

#[test]
fn a_file_closed_cleanly_by_release_0_1_migrates() {
    migrates(&CLEAN);
}

#[test]
fn a_file_left_by_a_crash_of_release_0_1_migrates() {
    migrates(&CRASHED);
}

#[test]
fn a_file_and_its_log_left_by_a_crash_of_release_0_1_replays_the_log() {
    migrates(&CRASHED_LOG);
}

/// Before any engine applied it, the log holds acknowledged commits the file does not: a
/// reader refuses to read the file alone, and changes nothing.
#[test]
fn a_reader_refuses_the_release_0_1_log_left_unapplied() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of(&CRASHED_LOG, dir.path(), true);
    let (file, log) = (
        std::fs::read(&path).unwrap(),
        std::fs::read(log_of(&path)).unwrap(),
    );
    let err = FileReader::open(&path).unwrap_err();
    assert_eq!(err.kind(), OpenErrorKind::UnappliedLog, "{err}");
    assert!(std::fs::read(&path).unwrap() == file, "the file changed");
    assert!(
        std::fs::read(log_of(&path)).unwrap() == log,
        "the log changed"
    );
}

/// The file whose log holds acknowledged commits is never opened without it: the engine
/// refuses it as damaged, names the missing log and creates none (a fresh log would
/// let the file be opened with the commits of the old one lost). The refused open loses
/// nothing: with its log put back, the file migrates as a whole. (redb's recovery of the
/// crashed file runs before the engine finds the log missing, and may rewrite the file's
/// pages and shorten it: the file is not left byte for byte as it was, its commits are.)
#[test]
fn the_release_0_1_file_without_its_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of(&CRASHED_LOG, dir.path(), false);
    let err = Engine::builder().path(&path).open().unwrap_err();
    assert_eq!(err.kind(), OpenErrorKind::Corrupted, "{err}");
    let message = err.to_string();
    assert!(message.contains("missing"), "{message}");
    assert!(
        message.contains(&log_of(&path).display().to_string()),
        "{message}"
    );
    assert!(!log_of(&path).exists());

    let full = copy_of(&CRASHED_LOG, &dir.path().join("full"), true);
    std::fs::rename(log_of(&full), log_of(&path)).unwrap();
    migrates_at(&CRASHED_LOG, &path);
}
