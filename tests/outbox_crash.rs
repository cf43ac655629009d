//! The outbox consumer (`examples/outbox_consumer.rs`, compiled in here as a module) under
//! `kill -9`: the test binary runs itself as the child, which consumes a log of payments
//! with redeliveries (each payment claimed by its id; balance, applied count, offset and a
//! confirmation in one completion) while a relay thread publishes confirmations to a file.
//! The parent kills it at a random point (during a completion's commit, or anywhere in a
//! payment's handling) after a few payments, round after round (seeded; 21 rounds on one
//! file, two in three under `Immediate`, the others `Buffered`), then lets it finish.
//!
//! After every kill the file must be consistent: a payment's completion is there exactly
//! when its writes are (applied once, in the balance, its confirmation recorded under one
//! outbox id, published or pending). At the end every payment is applied exactly once and
//! every confirmation published at least once and recorded exactly once. Writes committed
//! apart from their completion fail this within a few rounds (a kill between the two
//! commits leaves one without the other, and the retry applies the payment twice).

#![cfg(unix)]

#[allow(dead_code)]
#[path = "../examples/outbox_consumer.rs"]
mod consumer;

use consumer::Step;
use idemkv::{Durability, KeyState};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "IDEMKV_OUTBOX_CRASH_CHILD";
const MODE_ENV: &str = "IDEMKV_OUTBOX_CRASH_MODE";
const TEST_NAME: &str = "kill_9_during_consume_applies_each_payment_once";
/// Starts every protocol line (the test harness prints without a newline before a test).
const MARK: &str = "@idemkv-outbox-crash@ ";
const ROUNDS: usize = 21;
const PAYMENTS: u64 = 120;
const SEED: u64 = 0x0b0c_5eed;
/// A hang detector for the child, not a pace.
const CHILD_LIMIT: Duration = Duration::from_secs(30);

/// Two rounds in three under `Immediate`: a kill there can land between any two fsyncs.
fn mode(round: usize) -> Durability {
    if round % 3 == 2 {
        Durability::buffered()
    } else {
        Durability::Immediate
    }
}

fn mode_name(d: Durability) -> &'static str {
    if d == Durability::Immediate {
        "immediate"
    } else {
        "buffered"
    }
}

fn child(dir: &Path) -> ! {
    // Any failure ends the child at once, so the parent sees an exit that is not its kill.
    std::panic::set_hook(Box::new(|info| {
        let _ = writeln!(std::io::stderr(), "outbox crash child: {info}");
        std::process::abort();
    }));
    let durability = match std::env::var(MODE_ENV).as_deref() {
        Ok("buffered") => Durability::buffered(),
        _ => Durability::Immediate,
    };
    let emit = |line: String| {
        let mut out = std::io::stdout().lock();
        out.write_all(line.as_bytes()).expect("stdout");
        out.flush().expect("flush");
    };
    consumer::run(dir, durability, |step| match step {
        Step::Staged(i) => emit(format!("{MARK}STAGED {i}\n")),
        Step::Applied(i) => emit(format!("{MARK}APPLIED {i}\n")),
    })
    .expect("child run");
    emit(format!("{MARK}DONE\n"));
    std::process::exit(0);
}

/// Where a round kills its child: `fraction` of a measured span after its `nth` protocol
/// line of a kind. After the nth `STAGED` line the span is the last payment's time from its
/// staging to its acknowledgement (the kill lands in the completion's commit); after the
/// nth `APPLIED` line it is the last time between two acknowledgements (the kill lands
/// anywhere: the next claim, its handler, its commit, the relay). Measured, so the kills
/// spread the same way whatever the disk's speed.
#[derive(Debug, Clone, Copy)]
struct Kill {
    at_commit: bool,
    nth: usize,
    fraction: f64,
}

/// Runs one child; kills it as `kill` says (`None`: lets it finish).
fn run_child(dir: &Path, durability: Durability, kill: Option<Kill>) {
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .env(MODE_ENV, mode_name(durability))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    // The span to scale by once the kill point is reached (zero: the child finished).
    let (tx, rx) = mpsc::channel::<Duration>();
    let reader = thread::spawn(move || {
        let (mut staged, mut applied) = (0, 0);
        let (mut last_staged, mut last_applied) = (Instant::now(), Instant::now());
        let mut commit_span = Duration::ZERO;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let Some(at) = line.find(MARK) else { continue };
            let words: Vec<&str> = line[at + MARK.len()..].split_whitespace().collect();
            match words.as_slice() {
                ["DONE"] => {
                    let _ = tx.send(Duration::ZERO);
                }
                ["STAGED", _] => {
                    staged += 1;
                    last_staged = Instant::now();
                    if kill.is_some_and(|k| k.at_commit && k.nth == staged) {
                        let _ = tx.send(commit_span);
                    }
                }
                ["APPLIED", _] => {
                    applied += 1;
                    let cycle_span = last_applied.elapsed();
                    if last_staged > last_applied {
                        commit_span = last_staged.elapsed();
                    }
                    last_applied = Instant::now();
                    if kill.is_some_and(|k| !k.at_commit && k.nth == applied) {
                        let _ = tx.send(cycle_span);
                    }
                }
                _ => panic!("unreadable protocol line {line:?}"),
            }
        }
    });
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let signal = rx.recv_timeout(CHILD_LIMIT);
    if let (Some(k), Ok(span)) = (kill, &signal) {
        thread::sleep(span.mul_f64(k.fraction));
    }
    if kill.is_some() {
        let _ = child.kill(); // SIGKILL
    }
    let status = match signal {
        Ok(_) => child.wait().expect("wait"),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child neither reached its kill point nor finished in {CHILD_LIMIT:?}");
        }
    };
    reader.join().expect("reader");
    let err = err_reader.join().expect("stderr reader");
    match kill {
        Some(k) => assert_eq!(
            status.signal(),
            Some(9),
            "the child ended by itself ({status:?}) before its kill point {k:?}; stderr:\n{err}"
        ),
        None => assert!(
            status.success(),
            "the child failed ({status:?}); stderr:\n{err}"
        ),
    }
}

/// The file after a kill: each payment's completion is there exactly when its writes are.
fn check_after_kill(dir: &Path, round: usize, durability: Durability) {
    let input = consumer::read_input(&dir.join(consumer::INPUT)).expect("input");
    let engine = consumer::open_engine(dir, durability).expect("reopen after kill");
    let read = |table: &str, key: &[u8]| {
        engine
            .table_get(table, key)
            .expect("table_get")
            .map_or(0, |b| {
                u64::from_le_bytes(b.as_slice().try_into().expect("u64"))
            })
    };
    let mut balances: BTreeMap<&str, u64> = BTreeMap::new();
    let mut applied_ids = BTreeSet::new();
    for p in &input {
        if !applied_ids.insert(p.id.as_str()) {
            continue;
        }
        let applied = read(consumer::APPLIED, p.id.as_bytes());
        let state = engine.get(p.id.as_bytes()).expect("get");
        let completed = matches!(state, Some(KeyState::Completed { .. }));
        assert!(
            applied == u64::from(completed),
            "round {round}: {} applied {applied} times, its claim is {state:?}",
            p.id
        );
        if completed {
            *balances.entry(p.account.as_str()).or_default() += p.amount;
        } else {
            applied_ids.remove(p.id.as_str());
        }
    }
    for account in (0..8).map(|a| format!("acct-{a}")) {
        let expected = balances.get(account.as_str()).copied().unwrap_or(0);
        assert_eq!(
            read(consumer::BALANCES, account.as_bytes()),
            expected,
            "round {round}: {account}'s balance is not the sum of its applied payments"
        );
    }
    // Each applied payment's confirmation is recorded under one outbox id: published, or
    // still pending (committed with its completion); nothing else is.
    let mut recorded: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let text = std::fs::read_to_string(dir.join(consumer::OUTPUT)).unwrap_or_default();
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        recorded
            .entry(parts[1].to_string())
            .or_default()
            .insert(parts[0].parse().expect("outbox id"));
    }
    let pending = engine.outbox().pending(10_000).expect("pending");
    for m in &pending {
        let payload = String::from_utf8_lossy(m.payload()).into_owned();
        let payment = payload
            .split_whitespace()
            .next()
            .expect("payment")
            .to_string();
        recorded.entry(payment).or_default().insert(m.id());
    }
    let confirmed: BTreeSet<&str> = recorded.keys().map(String::as_str).collect();
    assert_eq!(
        confirmed, applied_ids,
        "round {round}: confirmations recorded for other payments than those applied"
    );
    for (payment, ids) in &recorded {
        assert_eq!(ids.len(), 1, "round {round}: {payment} recorded as {ids:?}");
    }
    engine.close().expect("close");
}

#[test]
fn kill_9_during_consume_applies_each_payment_once() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    consumer::generate_input(&dir.path().join(consumer::INPUT), PAYMENTS, SEED).expect("input");
    let mut rng = fastrand::Rng::with_seed(SEED);
    for round in 0..ROUNDS {
        let kill = Kill {
            at_commit: rng.bool(),
            nth: rng.usize(2..=6),
            fraction: rng.f64() * 1.2,
        };
        run_child(dir.path(), mode(round), Some(kill));
        check_after_kill(dir.path(), round, mode(round));
    }
    run_child(dir.path(), Durability::Immediate, None);
    let report = consumer::verify(dir.path(), Durability::Immediate)
        .unwrap_or_else(|e| panic!("after {ROUNDS} kills and a full run: {e}"));
    assert_eq!(report.distinct, PAYMENTS as usize);
}
