//! Runs the built `idemkv` binary's operator subcommands (stats, inspect, get, verify,
//! release, sweep, export, import, bench) on files prepared through the library, including
//! the error cases: a missing file (never created), a file locked by another engine, a
//! corrupted file and a foreign file, each a one-line error with a meaningful exit code.
//!
//! JSON is checked with plain string search (serde_json is a dependency of the binary only).

use idemkv::admin::{RecordInfo, RecordInfoState};
use idemkv::{Claim, ClaimOptions, Clock, Engine, KeyState, MockClock, Recovery};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_idemkv");

/// Every subcommand that reads or changes an existing file.
const FILE_COMMANDS: [&[&str]; 8] = [
    &["stats"],
    &["abandoned"],
    &["inspect"],
    &["get", "order-0"],
    &["verify"],
    &["release", "order-1"],
    &["sweep"],
    &["export"],
];

/// The lease deadline of `stuck-job`: claimed at the mock clock's start
/// (2024-01-01T00:00:00Z) with a lease of ten years and 30 s, a claim stuck behind a long
/// lease. (A claim whose lease ended then would be an abandoned claim, reaped a retention
/// after its end by any live open.)
const STUCK_DEADLINE_MS: u64 = 2_019_686_430_000;
/// Ten years (three leap days) and 30 s.
const STUCK_LEASE: Duration = Duration::from_secs(3653 * 86_400 + 30);

fn idemkv(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the idemkv binary runs")
}

fn idemkv_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the idemkv binary runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write stdin");
    child.wait_with_output().expect("idemkv finishes")
}

/// `idemkv` with FILE inserted after the subcommand words.
fn on(file: &Path, cmd: &[&str], extra: &[&str]) -> Output {
    let file = file.to_str().expect("utf-8 path");
    let mut args: Vec<&str> = vec![cmd[0], file];
    args.extend_from_slice(&cmd[1..]);
    args.extend_from_slice(extra);
    idemkv(&args)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    )
}

#[track_caller]
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(out.status.code(), Some(code), "{}", show(out));
}

/// Exit 2 and exactly one line on stderr that contains `needle`, and no panic.
#[track_caller]
fn assert_one_line_error(out: &Output, code: i32, needle: &str) {
    assert_exit(out, code);
    let err = stderr(out);
    assert_eq!(err.lines().count(), 1, "one line expected: {}", show(out));
    assert!(err.starts_with("idemkv: error: "), "{}", show(out));
    assert!(err.contains(needle), "{needle:?} expected: {}", show(out));
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{}",
        show(out)
    );
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// A file with every kind of record:
/// - live (real clock): `order-0`, `order-2`, `order-4` completed with a fingerprint;
///   `order-1`, `order-3` in flight with a 1 h lease and checkpoint (2, "card authorised");
///   the binary key `bin\0\xffkey` completed with response [0, 1, 2, 255];
/// - old (a mock clock at 2024-01-01, retention 1 h): `old-0..2` completed, past their
///   retention now; `stuck-job` in flight with fingerprint 42, lease ending at
///   [`STUCK_DEADLINE_MS`].
fn sample(dir: &Path) -> PathBuf {
    let path = dir.join("sample.redb");
    {
        let e = Engine::builder()
            .path(&path)
            .tuning(idemkv::Tuning::default().sweep_interval(None))
            .open()
            .expect("open");
        let mut held = Vec::new();
        for i in 0..5u32 {
            let key = format!("order-{i}");
            let opts = ClaimOptions::default().payload(key.as_bytes());
            let Claim::Acquired(mut lease) = e.claim(key.as_bytes(), &opts).expect("claim") else {
                panic!("a fresh key is acquired")
            };
            if i % 2 == 0 {
                let response = format!("{{\"receipt\":\"charged order {i}\"}}");
                lease.complete(response.as_bytes()).expect("complete");
            } else {
                lease
                    .set_checkpoint(2, b"card authorised")
                    .expect("checkpoint");
                lease.extend(Duration::from_secs(3600)).expect("extend");
                held.push(lease);
            }
        }
        let Claim::Acquired(lease) = e
            .claim(b"bin\x00\xffkey", &ClaimOptions::default())
            .expect("claim")
        else {
            panic!("a fresh key is acquired")
        };
        lease.complete(&[0, 1, 2, 255]).expect("complete");
        e.close().expect("close");
        // The claims stay in flight in the file (the engine is closed, so nothing is sent).
        held.into_iter().for_each(|lease| {
            lease.detach();
        });
    }
    {
        let e = Engine::builder()
            .path(&path)
            .clock(MockClock::new())
            .retention(Duration::from_secs(3600))
            .tuning(idemkv::Tuning::default().sweep_interval(None))
            .open()
            .expect("open");
        for i in 0..3 {
            let key = format!("old-{i}");
            let Claim::Acquired(lease) = e
                .claim(key.as_bytes(), &ClaimOptions::default())
                .expect("claim")
            else {
                panic!("a fresh key is acquired")
            };
            lease.complete(b"old response").expect("complete");
        }
        let Claim::Acquired(lease) = e
            .claim(
                b"stuck-job",
                &ClaimOptions::default().fingerprint(42).lease(STUCK_LEASE),
            )
            .expect("claim")
        else {
            panic!("a fresh key is acquired")
        };
        e.close().expect("close");
        lease.detach();
    }
    path
}

/// Flips a byte of every copy of the sample's responses: the records no longer match their
/// checksums (and redb's own page checksums fail).
fn corrupt(path: &Path) {
    let mut data = std::fs::read(path).expect("read");
    let marker = b"charged order";
    let mut hits = 0;
    let mut i = 0;
    while let Some(at) = data[i..].windows(marker.len()).position(|w| w == marker) {
        data[i + at] ^= 0xff;
        hits += 1;
        i += at + 1;
    }
    assert!(hits > 0, "the responses are stored in the file");
    std::fs::write(path, data).expect("write");
}

/// Every record of a file exactly as persisted: a clock frozen at the epoch keeps every
/// record and reports every deadline unchanged (the trick `idemkv export` uses too).
fn persisted_records(path: &Path) -> Vec<RecordInfo> {
    #[derive(Debug)]
    struct Frozen;
    impl Clock for Frozen {
        fn monotonic(&self) -> Duration {
            Duration::ZERO
        }
        fn wall(&self) -> SystemTime {
            UNIX_EPOCH
        }
    }
    let e = Engine::builder()
        .path(path)
        .clock(Frozen)
        .recovery(Recovery::HonourLeases)
        .lease(Duration::MAX)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .expect("open");
    let records = e.admin().records();
    e.close().expect("close");
    records
}

fn live(records: Vec<RecordInfo>) -> Vec<RecordInfo> {
    let now = UNIX_EPOCH + Duration::from_millis(now_ms());
    records
        .into_iter()
        .filter(|r| {
            !matches!(r.state, RecordInfoState::Completed { expires_at, .. } if expires_at <= now)
        })
        .collect()
}

/// The table row of `key` in `text`.
fn row<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no row for {key} in\n{text}"))
}

#[test]
fn every_subcommand_has_help() {
    let top = idemkv(&["--help"]);
    assert_exit(&top, 0);
    for sub in [
        "stats",
        "inspect",
        "get",
        "verify",
        "release",
        "sweep",
        "export",
        "import",
        "bench",
        "abandoned",
    ] {
        assert!(stdout(&top).contains(sub), "{sub} in {}", stdout(&top));
        let out = idemkv(&[sub, "--help"]);
        assert_exit(&out, 0);
        assert!(
            stdout(&out).contains(&format!("Usage: idemkv {sub}")),
            "{}",
            show(&out)
        );
        assert!(stdout(&out).contains("Exit codes"), "{}", show(&out));
    }
    // A usage error is one line too.
    let out = idemkv(&["inspect"]);
    assert_one_line_error(&out, 2, "see 'idemkv inspect --help'");
}

#[test]
fn stats_prints_counts_per_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out = on(&file, &["stats"], &[]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .split_whitespace()
            .last()
            .map(str::to_string)
    };
    assert_eq!(line("keys in flight").as_deref(), Some("3"), "{text}");
    // No service has the file open: its claims belong to a process that is gone.
    assert_eq!(line("  of which abandoned").as_deref(), Some("3"), "{text}");
    // Read-only: the three old completions are shown as expired, not reclaimed.
    assert_eq!(line("keys completed").as_deref(), Some("4"), "{text}");
    assert_eq!(
        line("expired, not yet swept").as_deref(),
        Some("3"),
        "{text}"
    );
    let out = on(&file, &["stats"], &["--json"]);
    assert_exit(&out, 0);
    let json = stdout(&out);
    for field in [
        "\"inflight\":3",
        "\"abandoned\":3",
        "\"completed\":4",
        "\"expired_unswept\":3",
        "\"records\":10",
        "\"token_next\":",
        "\"token_hwm\":",
        "\"live\":false",
    ] {
        assert!(json.contains(field), "{field} in {json}");
    }
}

#[test]
fn inspect_lists_every_record_as_persisted_and_filters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out = on(&file, &["inspect"], &[]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("10 of 10 matching records shown"), "{text}");
    let stuck = row(&text, "stuck-job");
    assert!(stuck.contains("inflight"), "{stuck}");
    assert!(stuck.contains("000000000000002a"), "fingerprint: {stuck}");
    // The exact persisted deadline, not "now" (nothing is taken over by inspecting).
    assert!(stuck.contains("2034-01-01T00:00:30Z"), "{stuck}");
    assert!(!stuck.contains("ago"), "{stuck}");
    let order1 = row(&text, "order-1");
    assert!(
        order1.contains("inflight") && order1.contains("2/15"),
        "{order1}"
    );
    assert!(row(&text, "order-0").contains("29 B"), "{text}");
    assert!(row(&text, "old-0").contains("expired"), "{text}");
    // A binary key is escaped.
    assert!(row(&text, "bin\\x00\\xffkey").contains("4 B"), "{text}");

    let count = |extra: &[&str]| {
        let out = on(&file, &["inspect"], extra);
        assert_exit(&out, 0);
        let text = stdout(&out);
        let summary = text
            .lines()
            .find(|l| l.contains("matching records shown"))
            .unwrap_or_else(|| panic!("no summary in {text}"))
            .to_string();
        (summary, text)
    };
    let (s, _) = count(&["--state", "inflight"]);
    assert!(s.starts_with("3 of 3 matching"), "{s}");
    let (s, _) = count(&["--state", "completed"]);
    assert!(s.starts_with("4 of 4 matching"), "{s}");
    let (s, t) = count(&["--state", "expired"]);
    assert!(s.starts_with("3 of 3 matching"), "{s}");
    assert!(t.contains("2024-01-01T01:00:00Z"), "{t}");
    let (s, _) = count(&["--prefix", "order-"]);
    assert!(s.starts_with("5 of 5 matching"), "{s}");
    let (s, t) = count(&["--prefix", "62696e00", "--hex"]);
    assert!(s.starts_with("1 of 1 matching"), "{s}");
    assert!(t.contains("bin\\x00\\xffkey"), "{t}");
    // Within 2 h: the two 1 h leases, and everything already past its deadline (not the
    // ten-year lease).
    let (s, _) = count(&["--expiring-within", "2h"]);
    assert!(s.starts_with("5 of 5 matching"), "{s}");
    let (s, _) = count(&[
        "--expiring-within",
        "1d",
        "--state",
        "completed",
        "--limit",
        "2",
    ]);
    assert!(s.starts_with("2 of 4 matching"), "{s}");
    let (s, t) = count(&["--limit", "2"]);
    assert!(s.starts_with("2 of 10 matching"), "{s}");
    assert!(
        t.contains("order-0") && !t.contains("order-2"),
        "token order: {t}"
    );

    let out = on(&file, &["inspect"], &["--state", "inflight", "--json"]);
    assert_exit(&out, 0);
    let json = stdout(&out);
    assert!(json.contains("\"matching\":3"), "{json}");
    assert!(
        json.contains(&format!("\"lease_deadline_ms\":{STUCK_DEADLINE_MS}")),
        "{json}"
    );
    assert!(json.contains("\"key\":\"737475636b2d6a6f62\""), "{json}");

    let out = on(&file, &["inspect"], &["--expiring-within", "10"]);
    assert_one_line_error(&out, 2, "needs a unit");
}

/// A file with claims a completer would look for: written with a mock clock at
/// 2024-01-01T00:00:00Z, `lapsed` (its 10 s lease ran out, checkpoint 1 "paid") and
/// `failed` (claimed at +20 s, failed at +25 s); `held` has a ten-year lease; and, on the
/// real clock, `just-failed` failed a moment ago.
fn abandoned_sample(dir: &Path) -> PathBuf {
    let path = dir.join("abandoned.redb");
    let clock = MockClock::new();
    let e = Engine::builder()
        .path(&path)
        .clock(clock.clone())
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .expect("open");
    let Claim::Acquired(mut lapsed) = e
        .claim(
            b"lapsed",
            &ClaimOptions::default().lease(Duration::from_secs(10)),
        )
        .expect("claim")
    else {
        panic!("a fresh key is acquired")
    };
    lapsed.set_checkpoint(1, b"paid").expect("checkpoint");
    clock.advance(Duration::from_secs(20));
    let Claim::Acquired(failed) = e
        .claim(b"failed", &ClaimOptions::default().payload(b"job"))
        .expect("claim")
    else {
        panic!("a fresh key is acquired")
    };
    clock.advance(Duration::from_secs(5));
    assert_eq!(failed.fail(), Ok(true));
    let Claim::Acquired(held) = e
        .claim(b"held", &ClaimOptions::default().lease(STUCK_LEASE))
        .expect("claim")
    else {
        panic!("a fresh key is acquired")
    };
    e.close().expect("close");
    lapsed.detach();
    held.detach();
    let e = Engine::builder()
        .path(&path)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        // The old claims' retention has not run out on the real clock.
        .retention(Duration::from_secs(100 * 365 * 86_400))
        .recovery(Recovery::HonourLeases)
        .lease(STUCK_LEASE)
        .open()
        .expect("open");
    let Claim::Acquired(fresh) = e
        .claim(b"just-failed", &ClaimOptions::default())
        .expect("claim")
    else {
        panic!("a fresh key is acquired")
    };
    assert_eq!(fresh.fail(), Ok(true));
    e.close().expect("close");
    path
}

#[test]
fn abandoned_lists_lapsed_and_failed_claims_for_a_completer() {
    const START_MS: u64 = 1_704_067_200_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = abandoned_sample(dir.path());
    let out = on(
        &file,
        &["abandoned"],
        &["--older-than", "10m", "--idle", "5m"],
    );
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("2 abandoned claims"), "{text}");
    assert!(row(&text, "lapsed").contains(" no "), "{text}");
    assert!(row(&text, "lapsed").contains("1/4"), "checkpoint: {text}");
    assert!(row(&text, "failed").contains("yes"), "{text}");
    assert!(
        !text.contains("just-failed") && !text.contains("held"),
        "{text}"
    );
    // Earliest first claimed first.
    assert!(text.find("lapsed") < text.find("failed"), "{text}");

    let out = on(&file, &["abandoned"], &["--json"]);
    assert_exit(&out, 0);
    let json = stdout(&out);
    assert!(json.contains("\"shown\":3"), "{json}");
    assert!(
        json.contains(&format!("\"lease_ended_ms\":{}", START_MS + 10_000)),
        "{json}"
    );
    assert!(
        json.contains(&format!("\"lease_ended_ms\":{}", START_MS + 25_000)),
        "{json}"
    );
    assert!(
        json.contains(&format!("\"first_claimed_ms\":{}", START_MS + 20_000)),
        "{json}"
    );
    assert!(
        json.contains("\"checkpoint\":{\"data\":\"70616964\",\"phase\":1}"),
        "{json}"
    );
    assert!(json.contains("\"failed\":true"), "{json}");
    // The limit keeps the earliest first claimed.
    let out = on(&file, &["abandoned"], &["--limit", "1", "--json"]);
    let json = stdout(&out);
    assert!(
        json.contains("\"shown\":1") && json.contains("\"key_text\":\"lapsed\""),
        "{json}"
    );
    // inspect and get show the instants and the failure too.
    let out = on(&file, &["inspect"], &["--json"]);
    let json = stdout(&out);
    assert!(
        json.contains(&format!("\"first_claimed_ms\":{START_MS}")),
        "{json}"
    );
    assert!(row(&stdout(&on(&file, &["inspect"], &[])), "failed").contains("inflight, failed"));
    let out = on(&file, &["get", "failed"], &[]);
    let text = stdout(&out);
    assert!(
        text.contains("failed (its holder ended the attempt"),
        "{text}"
    );
    assert!(
        text.contains("lease ended") && text.contains("2024-01-01T00:00:25.000Z"),
        "{text}"
    );

    // A completer takes the listed claims over and completes them: nothing is left.
    let e = Engine::builder()
        .path(&file)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .retention(Duration::from_secs(100 * 365 * 86_400))
        .open()
        .expect("open");
    for key in [&b"lapsed"[..], b"failed"] {
        let Claim::Acquired(lease) = e.claim(key, &ClaimOptions::default()).expect("claim") else {
            panic!("an abandoned claim is taken over")
        };
        assert_eq!(lease.attempt(), 2);
        lease.complete(b"finished").expect("complete");
    }
    e.close().expect("close");
    let out = on(&file, &["abandoned"], &["--older-than", "10m"]);
    assert!(
        stdout(&out).contains("no abandoned claims"),
        "{}",
        show(&out)
    );
}

#[test]
fn get_shows_state_and_response() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out = on(&file, &["get", "order-0"], &[]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("completed"), "{text}");
    assert!(text.contains("{\"receipt\":\"charged order 0\"}"), "{text}");

    let out = on(&file, &["get", "order-0"], &["--raw"]);
    assert_exit(&out, 0);
    assert_eq!(out.stdout, b"{\"receipt\":\"charged order 0\"}");
    let out = on(&file, &["get", "62696e00ff6b6579"], &["--hex", "--raw"]);
    assert_exit(&out, 0);
    assert_eq!(out.stdout, [0, 1, 2, 255]);

    let out = on(&file, &["get", "order-1"], &[]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("inflight"), "{text}");
    assert!(
        text.contains("phase 2, 15 bytes: card authorised"),
        "{text}"
    );
    let out = on(&file, &["get", "order-1"], &["--raw"]);
    assert_one_line_error(&out, 1, "no response");

    let out = on(&file, &["get", "stuck-job"], &["--json"]);
    assert_exit(&out, 0);
    let json = stdout(&out);
    assert!(json.contains("\"state\":\"inflight\""), "{json}");
    assert!(
        json.contains(&format!("\"lease_deadline_ms\":{STUCK_DEADLINE_MS}")),
        "{json}"
    );

    let out = on(&file, &["get", "old-0"], &[]);
    assert_exit(&out, 1);
    assert!(stdout(&out).contains("expired"), "{}", show(&out));
    assert!(stderr(&out).is_empty(), "{}", show(&out));
    let out = on(&file, &["get", "never-seen"], &["--json"]);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains("\"state\":\"absent\""),
        "{}",
        show(&out)
    );
    let out = on(&file, &["get", "zz"], &["--hex"]);
    assert_one_line_error(&out, 2, "not hex");
}

#[test]
fn verify_passes_a_clean_file_and_fails_a_damaged_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out = on(&file, &["verify"], &[]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains(": ok"), "{text}");
    assert!(
        text.contains("10 (3 inflight, 4 completed, 3 expired"),
        "{text}"
    );
    // Verifying reclaims nothing and takes nothing over.
    let out = on(&file, &["verify"], &["--json"]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("\"ok\":true"), "{}", show(&out));
    assert!(stdout(&out).contains("\"records\":10"), "{}", show(&out));

    corrupt(&file);
    let out = on(&file, &["verify"], &[]);
    assert_one_line_error(&out, 1, "corrupted");
    assert!(stdout(&out).contains("DAMAGED"), "{}", show(&out));
}

#[test]
fn release_frees_a_stuck_claim_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out = on(&file, &["release", "stuck-job"], &[]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("released stuck-job"), "{text}");
    assert!(text.contains("2034-01-01T00:00:30.000Z"), "{text}");

    let out = on(&file, &["get", "stuck-job"], &[]);
    assert_exit(&out, 1);
    let out = on(&file, &["release", "stuck-job"], &[]);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains("nothing to release"),
        "{}",
        show(&out)
    );
    let out = on(&file, &["release", "order-0"], &[]);
    assert_exit(&out, 1);
    assert!(stdout(&out).contains("completed"), "{}", show(&out));

    let out = on(&file, &["release", "order-1"], &["--json"]);
    assert_exit(&out, 0);
    let json = stdout(&out);
    assert!(json.contains("\"released\":true"), "{json}");
    assert!(json.contains("\"phase\":2"), "{json}");

    // Through the library: the released keys are absent, the rest untouched.
    let e = Engine::open(&file).expect("open");
    assert_eq!(e.get(b"stuck-job").expect("get"), None);
    assert_eq!(e.get(b"order-1").expect("get"), None);
    assert!(matches!(
        e.get(b"order-3").expect("get"),
        Some(KeyState::InFlight { .. })
    ));
    assert!(matches!(
        e.get(b"order-0").expect("get"),
        Some(KeyState::Completed { .. })
    ));
    e.close().expect("close");
}

#[test]
fn sweep_reclaims_expired_completions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out = on(&file, &["sweep"], &[]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("reclaimed 3 records"), "{text}");
    assert!(
        text.contains("7 remain (3 inflight, 4 completed)"),
        "{text}"
    );
    let out = on(&file, &["inspect"], &["--state", "expired"]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("no matching records"),
        "{}",
        show(&out)
    );
    let out = on(&file, &["sweep"], &["--json"]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("\"reclaimed\":0"), "{}", show(&out));
}

#[test]
fn export_import_round_trips_every_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out1 = dir.path().join("out1.jsonl");
    let out = on(&file, &["export"], &["-o", out1.to_str().expect("utf-8")]);
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains("exported 7 records (3 inflight, 4 completed)"),
        "{}",
        show(&out)
    );
    let exported = std::fs::read_to_string(&out1).expect("export written");
    assert_eq!(exported.lines().count(), 7, "{exported}");
    assert!(exported.contains("\"key_text\":\"order-0\""), "{exported}");
    assert!(
        exported.contains(&format!("\"lease_deadline_ms\":{STUCK_DEADLINE_MS}")),
        "{exported}"
    );

    // Into a fresh file, from a file argument.
    let target = dir.path().join("target.redb");
    let out = idemkv(&[
        "import",
        target.to_str().expect("utf-8"),
        "-i",
        out1.to_str().expect("utf-8"),
    ]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("imported 7 records (3 inflight, 4 completed)"),
        "{}",
        show(&out)
    );
    // The export of the copy is the same, byte for byte ...
    let out = on(&target, &["export"], &[]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), exported);
    // ... and so is every record, field by field (expired completions are not exported).
    let source = live(persisted_records(&file));
    assert_eq!(source.len(), 7);
    assert_eq!(persisted_records(&target), source);

    // From stdin, into another fresh file.
    let target2 = dir.path().join("target2.redb");
    let out = idemkv_stdin(
        &["import", target2.to_str().expect("utf-8")],
        exported.as_bytes(),
    );
    assert_exit(&out, 0);
    assert_eq!(persisted_records(&target2), source);
}

/// The same key, `order-1`, three times: completed in scope `acme` ("a"), in flight in
/// scope `globex` (a 1 h lease), completed unscoped ("u").
fn scoped_sample(dir: &Path) -> PathBuf {
    let path = dir.join("scoped.redb");
    let e = Engine::builder()
        .path(&path)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .expect("open");
    let claim = |scope: &[u8]| {
        let opts = ClaimOptions::default()
            .scope(scope)
            .lease(Duration::from_secs(3600));
        match e.claim(b"order-1", &opts).expect("claim") {
            Claim::Acquired(lease) => lease,
            other => panic!("a fresh key is acquired: {other:?}"),
        }
    };
    claim(b"acme").complete(b"a").expect("complete");
    let held = claim(b"globex");
    claim(b"").complete(b"u").expect("complete");
    e.close().expect("close");
    held.detach();
    path
}

#[test]
fn scoped_keys_are_exported_imported_read_and_released_in_their_scope() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = scoped_sample(dir.path());

    let out = on(&file, &["export"], &[]);
    assert_exit(&out, 0);
    let exported = stdout(&out);
    assert_eq!(exported.lines().count(), 3, "{exported}");
    assert!(
        exported.contains(r#""key_text":"order-1","scope":"61636d65","scope_text":"acme","#),
        "{exported}"
    );
    // The unscoped key's line is as before scopes existed.
    let unscoped: Vec<&str> = exported.lines().filter(|l| !l.contains("scope")).collect();
    assert_eq!(unscoped.len(), 1, "{exported}");
    let target = dir.path().join("target.redb");
    let out = idemkv_stdin(
        &["import", target.to_str().expect("utf-8")],
        exported.as_bytes(),
    );
    assert_exit(&out, 0);
    assert_eq!(persisted_records(&target), persisted_records(&file));

    for path in [&file, &target] {
        let out = on(path, &["get", "order-1"], &["--scope", "acme", "--raw"]);
        assert_exit(&out, 0);
        assert_eq!(out.stdout, b"a");
        let out = on(path, &["get", "order-1"], &["--raw"]);
        assert_exit(&out, 0);
        assert_eq!(out.stdout, b"u");
        // With --hex both the key and the scope are hex.
        let out = on(
            path,
            &["get", "6f726465722d31"],
            &["--scope", "676c6f626578", "--hex"],
        );
        assert_exit(&out, 0);
        let text = stdout(&out);
        assert!(text.contains("scope       globex"), "{text}");
        assert!(text.contains("inflight"), "{text}");
        let out = on(path, &["get", "order-1"], &["--scope", "initech", "--json"]);
        assert_exit(&out, 1);
    }

    // A release names the scope: the unscoped key is completed, nothing to release.
    let out = on(&file, &["release", "order-1"], &[]);
    assert_exit(&out, 1);
    let out = on(
        &file,
        &["release", "order-1"],
        &["--scope", "globex", "--json"],
    );
    assert_exit(&out, 0);
    let json = stdout(&out);
    assert!(
        json.contains(r#""released":true"#) && json.contains(r#""scope":"676c6f626578""#),
        "{json}"
    );
    let e = Engine::open(&file).expect("open");
    assert_eq!(e.get_scoped(b"globex", b"order-1").expect("get"), None);
    assert!(matches!(
        e.get_scoped(b"acme", b"order-1").expect("get"),
        Some(KeyState::Completed { .. })
    ));
    e.close().expect("close");
}

#[test]
fn import_reports_bad_lines_and_refused_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out = on(&file, &["export"], &[]);
    assert_exit(&out, 0);
    let exported = stdout(&out);
    let lines: Vec<&str> = exported.lines().collect();
    let input = |text: &str| {
        let p = dir.path().join("in.jsonl");
        std::fs::write(&p, text).expect("write");
        p
    };

    // A file that has issued tokens already: fencing refuses it, no record changes (the
    // open reclaims the expired completions, as any open does).
    let before = live(persisted_records(&file));
    let p = input(&exported);
    let out = idemkv(&[
        "import",
        file.to_str().expect("utf-8"),
        "-i",
        p.to_str().expect("utf-8"),
    ]);
    assert_one_line_error(&out, 2, "fresh file");
    assert_eq!(persisted_records(&file), before);

    // A malformed line: nothing imported, the target not even created.
    let mut broken = lines.clone();
    broken[2] = "{\"key\":\"6b\",\"token\":\"x\"}";
    let p = input(&broken.join("\n"));
    let target = dir.path().join("never.redb");
    let out = idemkv(&[
        "import",
        target.to_str().expect("utf-8"),
        "-i",
        p.to_str().expect("utf-8"),
    ]);
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("in.jsonl:3:"), "{}", show(&out));
    assert!(
        stderr(&out).contains("nothing was imported"),
        "{}",
        show(&out)
    );
    assert!(!target.exists());

    // The same key twice (the copy with a larger token): the copy is refused by line
    // number, the others are imported.
    let dup = lines[0].replacen("\"token\":1,", "\"token\":999999999,", 1);
    assert_ne!(dup, lines[0], "the first record has token 1");
    let p = input(&format!("{exported}{dup}\n"));
    let target = dir.path().join("dup.redb");
    let out = idemkv(&[
        "import",
        target.to_str().expect("utf-8"),
        "-i",
        p.to_str().expect("utf-8"),
    ]);
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("in.jsonl:8:"), "{}", show(&out));
    assert!(
        stderr(&out).contains("already has a live record"),
        "{}",
        show(&out)
    );
    assert!(
        stdout(&out).contains("imported 7 records"),
        "{}",
        show(&out)
    );
}

#[test]
fn bench_runs_and_reports_throughput() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = idemkv(&[
        "bench",
        "--seconds",
        "0.3",
        "--threads",
        "2",
        "--durability",
        "none",
        "--json",
    ]);
    assert_exit(&out, 0);
    let json = stdout(&out);
    assert!(json.contains("\"ops_per_sec\":"), "{json}");
    assert!(!json.contains("\"operations\":0,"), "{json}");

    let file = dir.path().join("bench.redb");
    let path = file.to_str().expect("utf-8");
    let args = [
        "bench",
        "--seconds",
        "0.3",
        "--threads",
        "2",
        "--durability",
        "buffered",
        "--file",
        path,
    ];
    let out = idemkv(&args);
    assert_exit(&out, 0);
    let text = stdout(&out);
    for what in ["throughput", "latency p50", "latency p99", "(kept)"] {
        assert!(text.contains(what), "{what} in {text}");
    }
    // The file it wrote is a sound idemkv file.
    let out = on(&file, &["verify"], &[]);
    assert_exit(&out, 0);
    // It never writes into an existing file.
    let out = idemkv(&args);
    assert_one_line_error(&out, 2, "exists");
}

#[test]
fn a_missing_file_is_an_error_and_is_not_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("missing.redb");
    for cmd in FILE_COMMANDS {
        let out = on(&file, cmd, &[]);
        assert_one_line_error(&out, 2, "no such file");
        assert!(!file.exists(), "{cmd:?} created the file");
    }
}

#[test]
fn a_file_open_in_another_process_is_an_error_for_the_commands_that_change_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let holder = Engine::open(&file).expect("open");
    for cmd in [&["release", "order-1"][..], &["sweep"], &["import"]] {
        let out = if cmd[0] == "import" {
            idemkv_stdin(&["import", file.to_str().expect("utf-8")], b"")
        } else {
            on(&file, cmd, &[])
        };
        assert_one_line_error(&out, 2, "another process has it open");
    }
    holder.close().expect("close");
    // Once it is closed, the file opens.
    assert_exit(&on(&file, &["sweep"], &[]), 0);
}

/// Bytes and modification time of a file.
fn fingerprint_of(path: &Path) -> (Vec<u8>, SystemTime) {
    let bytes = std::fs::read(path).expect("read");
    let mtime = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .expect("mtime");
    (bytes, mtime)
}

/// The commands that only look at a file.
const READ_COMMANDS: [&[&str]; 7] = [
    &["stats"],
    &["abandoned"],
    &["inspect"],
    &["get", "order-0"],
    &["get", "old-0"],
    &["verify"],
    &["export"],
];

#[test]
fn read_only_commands_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    // A copy of a file and its commit log taken while an engine had them open: what a
    // crash leaves (not closed cleanly). The commands recover it in memory only. (The
    // engine's open reclaims the three old completions: 7 records remain.)
    let crashed = dir.path().join("crashed.redb");
    {
        let e = Engine::open(&file).expect("open");
        std::fs::copy(&file, &crashed).expect("copy");
        let log_of = |p: &Path| PathBuf::from(format!("{}-log", p.display()));
        std::fs::copy(log_of(&file), log_of(&crashed)).expect("copy the log");
        e.close().expect("close");
    }
    for path in [&file, &crashed] {
        let before = fingerprint_of(path);
        for cmd in READ_COMMANDS {
            for extra in [&[][..], &["--json"][..]] {
                if cmd[0] == "export" && !extra.is_empty() {
                    continue;
                }
                let out = on(path, cmd, extra);
                let expected = if cmd == ["get", "old-0"] { 1 } else { 0 };
                assert_exit(&out, expected);
                assert!(
                    fingerprint_of(path) == before,
                    "{cmd:?} {extra:?} changed {}",
                    path.display()
                );
            }
        }
        let out = on(path, &["inspect"], &["--json"]);
        assert!(
            stdout(&out).contains("\"records_in_file\":7"),
            "{}",
            show(&out)
        );
    }
}

#[test]
fn read_only_commands_follow_a_live_engine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let engine = Engine::builder()
        .path(&file)
        .durability(idemkv::Durability::Buffered {
            max_delay: Duration::from_secs(3600),
        })
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .expect("open");
    // Committed while the engine runs: visible to a reader at once.
    let Claim::Acquired(lease) = engine
        .claim(b"live-1", &ClaimOptions::default())
        .expect("claim")
    else {
        panic!("a fresh key is acquired")
    };
    lease.complete(b"live response").expect("complete");
    engine.flush().expect("flush");
    // Acknowledged under Buffered but not committed yet: invisible to a reader.
    let Claim::Acquired(lease) = engine
        .claim(b"live-2", &ClaimOptions::default())
        .expect("claim")
    else {
        panic!("a fresh key is acquired")
    };
    lease.complete(b"not yet durable").expect("complete");
    let before = fingerprint_of(&file);

    let out = on(&file, &["get", "live-1"], &["--raw"]);
    assert_exit(&out, 0);
    assert_eq!(out.stdout, b"live response");
    let out = on(&file, &["get", "live-2"], &["--json"]);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains("\"state\":\"absent\""),
        "{}",
        show(&out)
    );
    let out = on(&file, &["stats"], &["--json"]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("\"live\":true"), "{}", show(&out));
    // The open recovered the file: the old completions are gone, the stuck claim kept.
    assert!(stdout(&out).contains("\"completed\":5"), "{}", show(&out));
    assert!(
        stdout(&out).contains("\"expired_unswept\":0"),
        "{}",
        show(&out)
    );
    let out = on(&file, &["inspect"], &[]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("live-1"), "{}", show(&out));
    let out = on(&file, &["verify"], &[]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("not checked"), "{}", show(&out));
    let out = on(&file, &["export"], &[]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("\"key_text\":\"live-1\""),
        "{}",
        show(&out)
    );
    assert!(!stdout(&out).contains("live-2"), "{}", show(&out));
    // The readers wrote nothing; the engine did not commit meanwhile either.
    assert!(fingerprint_of(&file) == before, "a reader changed the file");

    // Once committed, the reader sees it.
    engine.flush().expect("flush");
    let out = on(&file, &["get", "live-2"], &["--raw"]);
    assert_exit(&out, 0);
    assert_eq!(out.stdout, b"not yet durable");
    engine.close().expect("close");
}

#[cfg(unix)]
#[test]
fn export_output_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    let out_path = dir.path().join("backup.jsonl");
    // An existing output with a wide mode is replaced by an owner-only one.
    std::fs::write(&out_path, b"old").expect("write");
    std::fs::set_permissions(&out_path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = on(
        &file,
        &["export"],
        &["-o", out_path.to_str().expect("utf-8")],
    );
    assert_exit(&out, 0);
    let mode = std::fs::metadata(&out_path)
        .expect("metadata")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "export mode {mode:o}");
}

#[test]
fn a_corrupted_file_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = sample(dir.path());
    corrupt(&file);
    for cmd in FILE_COMMANDS {
        let out = on(&file, cmd, &[]);
        // verify's answer is "damaged" (1); the others cannot work on it (2).
        let code = if cmd[0] == "verify" { 1 } else { 2 };
        assert_one_line_error(&out, code, "corrupted");
    }
}

#[test]
fn a_foreign_file_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("random.bin");
    let mut bytes = vec![0u8; 64 * 1024];
    fastrand::Rng::with_seed(0x9E37_79B9_7F4A_7C15).fill(&mut bytes);
    std::fs::write(&file, &bytes).expect("write");
    for cmd in FILE_COMMANDS {
        let out = on(&file, cmd, &[]);
        assert_one_line_error(&out, 2, "not an idemkv file");
    }
    let out = idemkv_stdin(&["import", file.to_str().expect("utf-8")], b"");
    assert_one_line_error(&out, 2, "not an idemkv file");
    assert_eq!(std::fs::read(&file).expect("read"), bytes, "left untouched");
}
