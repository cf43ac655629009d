//! The shared backend across real OS processes (feature `postgres`; docs/shared.md, "The
//! multi-process tests").
//!
//! The test binary runs itself as 4 child processes of 16 threads each, all on one
//! PostgreSQL database. 10 000 keys are each delivered 8 times: twice to every process, on
//! two of its threads, and every thread walks its keys in the same order as its peers in
//! the other processes, so the 8 copies of a key reach 4 processes and 8 threads within
//! moments of each other (the test counts how many keys saw claims of different processes
//! overlap in time). The winner of a key runs its side effect (a line appended to its own
//! file and fsynced, before it completes), then completes with bytes naming itself; every
//! delivery logs the bytes it ended with. The parent then reads every file, replays every
//! key through a fresh engine, and checks:
//!
//! - a clean run: every key's side effect ran exactly once, every delivery got the
//!   winner's bytes and token, and the histories of the 4 processes, merged on one clock,
//!   are linearizable per key against the spec of `idemkv-check` and keep the global token
//!   order;
//! - one process SIGKILLed mid-run (short leases, renewed by `keep_alive` while a holder
//!   lives): its keys are taken over by the others after their leases, every completion
//!   any process was told had succeeded is replayed with its bytes, and a side effect ran
//!   twice only for a key whose holder was killed between its side effect and its
//!   completion, the retry being an attempt ≥ 2;
//! - the server restarted mid-run, cleanly or by a crash (an immediate stop, then crash
//!   recovery, which loses claims committed early and not yet flushed): calls in flight
//!   answer `OutcomeUnknown` or a typed `Database` error, callers retry as a service would
//!   (the same key; a completion with the same token), and every key still completed
//!   exactly once with one response for all its deliveries.
//!
//! Every completion also emits its response as an outbox message, committed with it, and
//! every process runs a relay that takes pending messages (several relays share the outbox
//! through `FOR UPDATE SKIP LOCKED`), writes each to its own file, fsyncs it, then marks
//! it sent; the parent drains what is left at the end. In every mode each key has exactly
//! one message, whose bytes are the key's final response (none lost, none for a
//! completion that did not commit), and no message was published by two relays unless
//! the first was killed, its `mark_sent` failed, or it marked the message only after its
//! hold on it (the engine's lease) had run out, when the outbox hands it to another relay.
//!
//! Timestamps come from `CLOCK_MONOTONIC`, which is one clock for every process of a
//! machine (a `std::time::Instant` cannot be handed to another process).
//!
//! Run with `scripts/pg.sh test` (it sets `IDEMKV_PG_URL`; the restart and crash tests
//! restart the server with `scripts/pg.sh restart` and `scripts/pg.sh crash`). `IDEMKV_MP_KEYS` changes the number of keys.
#![cfg(all(feature = "postgres", target_os = "linux", target_pointer_width = "64"))]

mod pg;

use idemkv::error::{DatabaseErrorKind, TableError};
use idemkv::{Claim, ClaimError, ClaimOptions, Engine, LeaseError, PostgresConfig, WriteSet};
use idemkv_check::history::{self, Event};
use idemkv_check::spec::{ns, KeyOp, KeyRet, KeySpec, SpecConfig};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const PROCESSES: usize = 4;
const THREADS: usize = 16;
/// Copies of each key delivered to each process (on two different threads).
const COPIES_PER_PROCESS: usize = 2;
const DELIVERIES: usize = PROCESSES * COPIES_PER_PROCESS;
/// Thread pairs per process: pair `c` of process `p` delivers the keys `k` with
/// `(k + p) % PAIRS == c`.
const PAIRS: usize = THREADS / COPIES_PER_PROCESS;
const KEYS_DEFAULT: usize = 10_000;
/// The process killed in the kill run.
const VICTIM: usize = 1;
/// How long `claim_or_wait` waits for another holder before it answers `InProgress`.
const WAIT: Duration = Duration::from_secs(60);
/// Keep-alive renewals never carry a lease further than this from its claim.
const KEEP_ALIVE_MAX: Duration = Duration::from_secs(120);
/// Pause of a caller before it retries a call that failed with the database unreachable:
/// a service's back-off while the server restarts, not a wait for time to pass (every
/// retry asks the database again).
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// A child reports its progress every this many deliveries.
const PROGRESS_EVERY: usize = 500;
/// The parent gives up on a run whose children say nothing for this long.
const SILENCE_MAX: Duration = Duration::from_secs(180);

const CHILD_ENV: &str = "IDEMKV_MP_CHILD";
/// Starts every line a child prints for the parent (the test harness prints
/// `test <name> ... ` before it without a newline, so lines are parsed from the marker).
const MARK: &str = "@idemkv-mp@ ";

// ---------------------------------------------------------------------------------------
// What a run is

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Long leases, nothing goes wrong.
    Clean,
    /// Process `VICTIM` is SIGKILLed while one of its threads sits between a side effect
    /// and its completion.
    Kill,
    /// The server restarts once about a third of the deliveries are done.
    Restart,
    /// The server crashes (`pg_ctl restart -m immediate`: no WAL flush, no checkpoint) once
    /// about a third of the deliveries are done and starts again through crash recovery,
    /// which loses commits not yet flushed (claims commit early) and empties unlogged
    /// tables.
    Crash,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Clean => "clean",
            Mode::Kill => "kill",
            Mode::Restart => "restart",
            Mode::Crash => "crash",
        }
    }

    /// The server goes away mid-run: callers retry what failed, as a service would.
    fn restarts(self) -> bool {
        matches!(self, Mode::Restart | Mode::Crash)
    }

    fn parse(s: &str) -> Mode {
        match s {
            "clean" => Mode::Clean,
            "kill" => Mode::Kill,
            "restart" => Mode::Restart,
            "crash" => Mode::Crash,
            other => panic!("unknown mode {other}"),
        }
    }

    /// The lease of every claim: long where nothing should expire, short where a dead
    /// holder's keys must be taken over quickly (a live holder renews with keep-alive),
    /// and long enough to outlast the restart where the server goes away.
    fn lease(self) -> Duration {
        match self {
            Mode::Clean => Duration::from_secs(300),
            Mode::Kill => Duration::from_secs(2),
            Mode::Restart | Mode::Crash => Duration::from_secs(10),
        }
    }
}

/// A child's orders, passed in `CHILD_ENV` as space-separated fields.
#[derive(Debug, Clone)]
struct Plan {
    process: usize,
    keys: usize,
    mode: Mode,
    prefix: String,
    dir: PathBuf,
    /// The victim parks after this many side effects (the kill run only).
    park_after: usize,
}

impl Plan {
    fn encode(&self) -> String {
        let dir = self.dir.to_str().expect("a UTF-8 temporary directory");
        assert!(!dir.contains(' '), "the run directory has no spaces");
        format!(
            "{} {} {} {} {} {}",
            self.process,
            self.keys,
            self.mode.name(),
            self.prefix,
            dir,
            self.park_after
        )
    }

    fn decode(s: &str) -> Plan {
        let f: Vec<&str> = s.split(' ').collect();
        assert_eq!(f.len(), 6, "a plan has six fields: {s:?}");
        Plan {
            process: f[0].parse().expect("process"),
            keys: f[1].parse().expect("keys"),
            mode: Mode::parse(f[2]),
            prefix: f[3].to_string(),
            dir: PathBuf::from(f[4]),
            park_after: f[5].parse().expect("park_after"),
        }
    }
}

fn url() -> String {
    pg::env("IDEMKV_PG_URL", "shared_processes")
}

fn keys_wanted() -> usize {
    match std::env::var("IDEMKV_MP_KEYS") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|&n| n >= PAIRS)
            .unwrap_or_else(|| panic!("IDEMKV_MP_KEYS={v:?}: a number of at least {PAIRS}")),
        Err(_) => KEYS_DEFAULT,
    }
}

fn key_name(k: usize) -> String {
    format!("k{k:06}")
}

fn key_index(key: &str) -> usize {
    key.strip_prefix('k')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a key of this test: {key:?}"))
}

/// The request fingerprint of key `k` (every delivery of a key is the same request).
fn fingerprint(k: usize) -> u64 {
    k as u64 + 1
}

/// The keys thread `thread` of process `process` delivers, in order.
fn keys_of(process: usize, thread: usize, keys: usize) -> impl Iterator<Item = usize> {
    let pair = thread / COPIES_PER_PROCESS;
    let first = (pair + PAIRS - process % PAIRS) % PAIRS;
    (first..keys).step_by(PAIRS)
}

/// `CLOCK_MONOTONIC` in ns: one clock for every process of this machine.
fn mono_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_MONOTONIC: i32 = 1;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec with the C layout on 64-bit Linux.
    let rc = unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK}{line}").expect("write to the parent");
    out.flush().expect("flush to the parent");
}

// ---------------------------------------------------------------------------------------
// The child

/// One thread's log: history events and deliveries are buffered; a side effect is written
/// and fsynced before the completion is sent, and an acknowledged completion is written
/// at once (a SIGKILL loses nothing the kernel has).
struct Log {
    out: BufWriter<File>,
    thread: usize,
}

impl Log {
    fn line(&mut self, line: std::fmt::Arguments<'_>) {
        self.out.write_fmt(line).expect("write the log");
        self.out.write_all(b"\n").expect("write the log");
    }

    fn history(&mut self, invoke: u64, key: &str, what: std::fmt::Arguments<'_>) {
        let ret_at = mono_ns().max(invoke + 1);
        let thread = self.thread;
        self.line(format_args!("H {thread} {invoke} {ret_at} {key} {what}"));
    }

    fn effect(&mut self, key: &str, token: u64, attempt: u32) {
        self.line(format_args!("E {key} {token} {attempt}"));
        self.out.flush().expect("flush the log");
        self.out.get_ref().sync_data().expect("fsync the log");
    }

    fn acknowledged(&mut self, key: &str, token: u64) {
        self.line(format_args!("A {key} {token}"));
        self.out.flush().expect("flush the log");
    }
}

#[derive(Default)]
struct ChildCounts {
    deliveries: AtomicUsize,
    effects: AtomicUsize,
    unknown: AtomicU64,
    refused: AtomicU64,
}

struct Ctx {
    plan: Plan,
    engine: Engine,
    counts: ChildCounts,
}

/// Whether a claim's failure is one a service retries: the database went away mid-call
/// (`OutcomeUnknown`) or could not be reached (nothing was sent).
fn claim_retryable(ctx: &Ctx, e: &ClaimError) -> bool {
    match e {
        ClaimError::OutcomeUnknown(_) => {
            ctx.counts.unknown.fetch_add(1, Ordering::Relaxed);
            true
        }
        ClaimError::Database(d) if d.kind() == DatabaseErrorKind::Unavailable => {
            ctx.counts.refused.fetch_add(1, Ordering::Relaxed);
            true
        }
        _ => false,
    }
}

fn lease_retryable(ctx: &Ctx, e: &LeaseError) -> bool {
    match e {
        LeaseError::OutcomeUnknown(_) => {
            ctx.counts.unknown.fetch_add(1, Ordering::Relaxed);
            true
        }
        LeaseError::Database(d) if d.kind() == DatabaseErrorKind::Unavailable => {
            ctx.counts.refused.fetch_add(1, Ordering::Relaxed);
            true
        }
        _ => false,
    }
}

/// One delivery of key `k`: claim (waiting for another holder), and if this delivery won,
/// the side effect and the completion; logs the bytes the delivery ended with.
fn deliver(ctx: &Ctx, log: &mut Log, k: usize, victim_park: &AtomicUsize) {
    let key = key_name(k);
    let opts = ClaimOptions::default()
        .fingerprint(fingerprint(k))
        .wait(WAIT);
    let fp = fingerprint(k);
    let claim_op = format!("C {fp}");
    loop {
        let invoke = mono_ns();
        let claimed = ctx.engine.claim_or_wait(key.as_bytes(), &opts);
        match claimed {
            Ok(Claim::Completed(s)) => {
                let response = String::from_utf8_lossy(s.response()).into_owned();
                log.history(
                    invoke,
                    &key,
                    format_args!("{claim_op} R {} {} {response}", s.token(), s.attempt()),
                );
                log.line(format_args!("D {key} {} {response}", s.token()));
                return;
            }
            Ok(Claim::Forgotten(f)) => panic!("{key}: forgotten without markers: {f:?}"),
            Ok(Claim::InProgress(b)) => {
                // The wait ran out (a holder slower than `WAIT`): deliver again.
                log.history(
                    invoke,
                    &key,
                    format_args!("{claim_op} P {} {}", ns(b.retry_after()), b.attempt()),
                );
            }
            Ok(Claim::Acquired(lease)) => {
                let (token, attempt) = (lease.token(), lease.attempt());
                log.history(invoke, &key, format_args!("{claim_op} A {token} {attempt}"));
                let renewals =
                    (ctx.plan.mode != Mode::Clean).then(|| lease.keep_alive(KEEP_ALIVE_MAX));
                log.effect(&key, token, attempt);
                let effects = ctx.counts.effects.fetch_add(1, Ordering::SeqCst) + 1;
                if ctx.plan.mode == Mode::Kill
                    && ctx.plan.process == VICTIM
                    && effects >= ctx.plan.park_after
                    && victim_park.fetch_add(1, Ordering::SeqCst) == 0
                {
                    // The side effect ran and nothing completes it: the parent kills this
                    // process now, with its other threads wherever they are.
                    log.out.flush().expect("flush the log");
                    say(&format!("parked {key} {token}"));
                    loop {
                        std::thread::park();
                    }
                }
                let response = format!("{key}:{token}:p{}t{}", ctx.plan.process, log.thread);
                // The completion's message: committed with it or not at all.
                let mut writes = WriteSet::new();
                writes.emit(response.as_bytes()).expect("a small message");
                let mut done = {
                    let invoke = mono_ns();
                    let r = lease.complete_with(response.as_bytes(), &writes);
                    (invoke, r)
                };
                loop {
                    match done.1 {
                        Ok(()) => {
                            log.history(done.0, &key, format_args!("K {token} {response} ok"));
                            log.acknowledged(&key, token);
                            log.line(format_args!("D {key} {token} {response}"));
                            drop(renewals);
                            return;
                        }
                        Err(LeaseError::LeaseLost) => {
                            log.history(done.0, &key, format_args!("K {token} {response} lost"));
                            log.line(format_args!("L {key} {token}"));
                            drop(renewals);
                            break;
                        }
                        Err(ref e) if ctx.plan.mode.restarts() && lease_retryable(ctx, e) => {
                            if matches!(e, LeaseError::OutcomeUnknown(_)) {
                                log.line(format_args!("U {key}"));
                            }
                            std::thread::sleep(RETRY_PAUSE);
                            let invoke = mono_ns();
                            let r = ctx.engine.complete_with(
                                key.as_bytes(),
                                token,
                                response.as_bytes(),
                                &writes,
                            );
                            done = (invoke, r);
                        }
                        Err(e) => {
                            log.line(format_args!("F complete {key} {token}: {e:?}"));
                            log.out.flush().expect("flush the log");
                            return;
                        }
                    }
                }
            }
            Err(ref e) if ctx.plan.mode.restarts() && claim_retryable(ctx, e) => {
                if matches!(e, ClaimError::OutcomeUnknown(_)) {
                    log.line(format_args!("U {key}"));
                }
                std::thread::sleep(RETRY_PAUSE);
            }
            Err(e) => {
                log.line(format_args!("F claim {key}: {e:?}"));
                log.out.flush().expect("flush the log");
                return;
            }
        }
    }
}

/// Whether a relay's failure is one it retries (the server went away).
fn table_retryable(e: &TableError) -> bool {
    match e {
        TableError::OutcomeUnknown(_) => true,
        TableError::Database(d) => d.kind() == DatabaseErrorKind::Unavailable,
        _ => false,
    }
}

/// A relay: takes pending messages, "publishes" each (a line in `out`, fsynced), then
/// marks them sent, until `stop` is set and the outbox had nothing to offer. A failed
/// `mark_sent` is logged (`X id`) and retried. Once marked, each message is logged with
/// whether its take and its mark were further apart than `hold`, the engine's lease
/// (`L id 1`, else `L id 0`): only then may another relay have been handed it meanwhile.
fn relay(
    engine: &Engine,
    out: &mut BufWriter<File>,
    stop: &std::sync::atomic::AtomicBool,
    hold: Duration,
) {
    let outbox = engine.outbox();
    loop {
        // Before the take: the message is held from a later instant on.
        let taking = Instant::now();
        let batch = match outbox.pending(64) {
            Ok(batch) => batch,
            Err(e) if table_retryable(&e) => {
                std::thread::sleep(RETRY_PAUSE);
                continue;
            }
            Err(e) => panic!("pending: {e:?}"),
        };
        if batch.is_empty() {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(RETRY_PAUSE);
            continue;
        }
        for m in &batch {
            let payload = std::str::from_utf8(m.payload()).expect("an ASCII message");
            writeln!(out, "O {} {payload}", m.id()).expect("write the relay log");
        }
        out.flush().expect("flush the relay log");
        out.get_ref().sync_data().expect("fsync the relay log");
        let ids: Vec<u64> = batch.iter().map(|m| m.id()).collect();
        loop {
            match outbox.mark_sent(&ids) {
                Ok(()) => {
                    // After the mark: the message was deleted at an earlier instant.
                    let outlasted = u8::from(taking.elapsed() >= hold);
                    for id in &ids {
                        writeln!(out, "L {id} {outlasted}").expect("write the relay log");
                    }
                    out.flush().expect("flush the relay log");
                    break;
                }
                Err(e) if table_retryable(&e) => {
                    for id in &ids {
                        writeln!(out, "X {id}").expect("write the relay log");
                    }
                    out.flush().expect("flush the relay log");
                    std::thread::sleep(RETRY_PAUSE);
                }
                Err(e) => panic!("mark_sent: {e:?}"),
            }
        }
    }
}

fn child(plan: Plan) -> ! {
    let pool = THREADS;
    let engine = Engine::builder()
        .postgres(
            PostgresConfig::new(url())
                .table_prefix(&plan.prefix)
                .pool_size(pool),
        )
        .lease(plan.mode.lease())
        .open()
        .expect("open the shared engine");
    let ctx = Arc::new(Ctx {
        plan: plan.clone(),
        engine,
        counts: ChildCounts::default(),
    });
    say("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("read go");
    assert_eq!(go.trim(), "go", "the parent starts the run");
    let park = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let relay_thread = {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        std::thread::spawn(move || {
            let path = ctx.plan.dir.join(format!("r{}.log", ctx.plan.process));
            let mut out = BufWriter::new(File::create(path).expect("create the relay log"));
            relay(&ctx.engine, &mut out, &stop, ctx.plan.mode.lease());
        })
    };
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (ctx, park) = (ctx.clone(), park.clone());
            std::thread::spawn(move || {
                let path = ctx.plan.dir.join(format!("p{}t{t}.log", ctx.plan.process));
                let mut log = Log {
                    out: BufWriter::with_capacity(
                        64 << 10,
                        File::create(path).expect("create the log"),
                    ),
                    thread: ctx.plan.process * THREADS + t,
                };
                for k in keys_of(ctx.plan.process, t, ctx.plan.keys) {
                    deliver(&ctx, &mut log, k, &park);
                    let n = ctx.counts.deliveries.fetch_add(1, Ordering::Relaxed) + 1;
                    if n % PROGRESS_EVERY == 0 {
                        say(&format!("progress {n}"));
                    }
                }
                log.out.flush().expect("flush the log");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a delivery thread panicked");
    }
    stop.store(true, Ordering::SeqCst);
    relay_thread.join().expect("the relay panicked");
    let s = ctx.engine.stats();
    let c = &ctx.counts;
    say(&format!(
        "done {} {} {} {} {} {} {} {} {}",
        c.deliveries.load(Ordering::Relaxed),
        s.db_round_trips,
        s.acquired,
        s.takeovers,
        s.replays,
        s.waits,
        s.in_progress,
        c.unknown.load(Ordering::Relaxed),
        c.refused.load(Ordering::Relaxed),
    ));
    drop(ctx);
    std::process::exit(0)
}

// ---------------------------------------------------------------------------------------
// The parent

/// What a child reported at its end.
#[derive(Debug, Clone, Copy, Default)]
struct Done {
    deliveries: u64,
    round_trips: u64,
    acquired: u64,
    takeovers: u64,
    replays: u64,
    waits: u64,
    in_progress: u64,
    unknown: u64,
    refused: u64,
}

impl Done {
    fn parse(s: &str) -> Done {
        let v: Vec<u64> = s.split(' ').map(|x| x.parse().expect("a number")).collect();
        assert_eq!(v.len(), 9, "done carries nine numbers: {s}");
        Done {
            deliveries: v[0],
            round_trips: v[1],
            acquired: v[2],
            takeovers: v[3],
            replays: v[4],
            waits: v[5],
            in_progress: v[6],
            unknown: v[7],
            refused: v[8],
        }
    }
}

/// What the parent saw while the run went on.
struct Observed {
    done: Vec<Option<Done>>,
    /// The key (and token) the victim parked on before it was killed.
    parked: Option<(String, u64)>,
    restart: Option<Duration>,
    /// The server's lifetime token just before the restart, and just after the run.
    life: Option<(String, String)>,
    wall: Duration,
}

struct Running {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Running {
    fn stderr_tails(&self) -> String {
        let mut s = String::new();
        for p in 0..PROCESSES {
            let text =
                std::fs::read_to_string(self.dir.join(format!("p{p}.err"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            if !tail.is_empty() {
                s.push_str(&format!("--- process {p} stderr (last lines) ---\n"));
                for l in tail.into_iter().rev() {
                    s.push_str(l);
                    s.push('\n');
                }
            }
        }
        s
    }
}

/// `scripts/pg.sh restart` (a clean restart) or `scripts/pg.sh crash`.
/// The lifetime token of the tables of `prefix` (empty: none).
fn life_token(prefix: &str) -> String {
    pg::psql(
        &url(),
        &format!("SELECT token FROM \"{prefix}life\" WHERE id = 1"),
    )
}

fn restart_server(mode: Mode) -> Duration {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/pg.sh");
    let how = match mode {
        Mode::Crash => "crash",
        _ => "restart",
    };
    let t = Instant::now();
    let out = Command::new(&script)
        .arg(how)
        .output()
        .expect("run scripts/pg.sh");
    assert!(
        out.status.success(),
        "scripts/pg.sh {how} failed (the test needs the server scripts/pg.sh started, with \
         the same PG_PORT and PG_DIR): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed()
}

/// Starts the children, runs them to their end (killing the victim or restarting the
/// server on the way), and returns what they reported.
fn run_children(mode: Mode, keys: usize, prefix: &str, dir: &Path) -> Observed {
    let exe = std::env::current_exe().expect("current_exe");
    let test_name = match mode {
        Mode::Clean => "four_processes_run_each_key_once_and_every_delivery_gets_the_winners_bytes",
        Mode::Kill => "a_killed_process_keys_are_taken_over_and_nothing_acknowledged_is_lost",
        Mode::Restart => "a_server_restart_mid_run_loses_nothing_acknowledged",
        Mode::Crash => "a_server_crash_mid_run_loses_nothing_acknowledged",
    };
    let mut running = Running {
        children: Vec::new(),
        dir: dir.to_path_buf(),
    };
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    for p in 0..PROCESSES {
        let plan = Plan {
            process: p,
            keys,
            mode,
            prefix: prefix.to_string(),
            dir: dir.to_path_buf(),
            park_after: (keys / 16).max(1),
        };
        let err = File::create(dir.join(format!("p{p}.err"))).expect("stderr file");
        let mut child = Command::new(&exe)
            .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, plan.encode())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn a child");
        let stdout = child.stdout.take().expect("child stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find(MARK) {
                    if tx.send((p, line[at + MARK.len()..].to_string())).is_err() {
                        break;
                    }
                }
            }
            let _ = tx.send((p, "eof".into()));
        });
        running.children.push(child);
    }
    drop(tx);
    let next = |what: &str, running: &Running| -> (usize, String) {
        rx.recv_timeout(SILENCE_MAX).unwrap_or_else(|_| {
            panic!(
                "no word from the children for {SILENCE_MAX:?} while {what}\n{}",
                running.stderr_tails()
            )
        })
    };
    let mut ready = 0;
    while ready < PROCESSES {
        match next("opening", &running) {
            (_, l) if l == "ready" => ready += 1,
            (p, l) => panic!(
                "process {p} said {l:?} before it was ready\n{}",
                running.stderr_tails()
            ),
        }
    }
    let started = Instant::now();
    for c in &mut running.children {
        let stdin = c.stdin.as_mut().expect("child stdin");
        stdin.write_all(b"go\n").expect("start a child");
        stdin.flush().expect("start a child");
    }
    let total = keys * DELIVERIES;
    let mut progress = [0u64; PROCESSES];
    let mut observed = Observed {
        done: vec![None; PROCESSES],
        parked: None,
        restart: None,
        life: None,
        wall: Duration::ZERO,
    };
    let mut ended = [false; PROCESSES];
    while ended.iter().any(|e| !e) {
        let (p, line) = next("running", &running);
        let (word, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match word {
            "progress" => {
                progress[p] = rest.parse().expect("progress");
                let sum: u64 = progress.iter().sum();
                if mode.restarts() && observed.restart.is_none() && sum as usize >= total * 3 / 10 {
                    let before = life_token(prefix);
                    observed.restart = Some(restart_server(mode));
                    observed.life = Some((before, String::new()));
                }
            }
            "parked" => {
                assert_eq!((mode, p), (Mode::Kill, VICTIM), "only the victim parks");
                let (key, token) = rest.split_once(' ').expect("parked key token");
                observed.parked = Some((key.to_string(), token.parse().expect("token")));
                // SIGKILL: the process ends at once, its other threads wherever they are.
                running.children[p].kill().expect("SIGKILL the victim");
            }
            "done" => observed.done[p] = Some(Done::parse(rest)),
            "eof" => ended[p] = true,
            other => panic!("process {p} said {other:?}"),
        }
    }
    observed.wall = started.elapsed();
    for (p, c) in running.children.iter_mut().enumerate() {
        let status = c.wait().expect("wait for a child");
        if mode == Mode::Kill && p == VICTIM {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "the victim died of SIGKILL");
        } else {
            assert!(
                status.success() && observed.done[p].is_some(),
                "process {p} ended with {status} before it was done\n{}",
                running.stderr_tails()
            );
        }
    }
    running.children.clear();
    observed
}

/// One line of a child's log.
#[derive(Debug, Clone)]
struct Effect {
    process: usize,
    token: u64,
    attempt: u32,
}

/// Everything the children's logs hold, by key.
#[derive(Default)]
struct Logs {
    effects: BTreeMap<String, Vec<Effect>>,
    /// (process, token) of every acknowledged completion.
    acknowledged: BTreeMap<String, Vec<(usize, u64)>>,
    /// (process, token, response) of every delivery's final answer.
    deliveries: BTreeMap<String, Vec<(usize, u64, String)>>,
    /// Keys on which some call's outcome was unknown.
    unknown: BTreeSet<String>,
    lost: Vec<String>,
    failures: Vec<String>,
    events: Vec<Event>,
}

fn parse_history(thread: usize, invoke: u64, ret_at: u64, key: &str, f: &[&str]) -> Event {
    let num = |i: usize| -> u64 { f[i].parse().expect("a number in a history line") };
    let (op, ret) = match f[0] {
        "C" => {
            let op = KeyOp::Claim {
                fingerprint: Some(num(1)),
                lease_ns: None,
                wait: true,
                retention_ms: None,
            };
            let ret = match f[2] {
                "A" => KeyRet::Acquired {
                    token: num(3),
                    attempt: num(4) as u32,
                    checkpoint: None,
                },
                "R" => KeyRet::Replayed {
                    token: num(3),
                    attempt: num(4) as u32,
                    response: f[5].as_bytes().to_vec(),
                },
                "P" => KeyRet::InProgress {
                    retry_after_ns: num(3),
                    attempt: num(4) as u32,
                },
                other => panic!("claim result {other:?}"),
            };
            (op, ret)
        }
        "K" => {
            let op = KeyOp::Complete {
                token: num(1),
                response: f[2].as_bytes().to_vec(),
                retention_ms: None,
            };
            let ret = match f[3] {
                "ok" => KeyRet::Done,
                _ => KeyRet::LeaseErr(LeaseError::LeaseLost),
            };
            (op, ret)
        }
        other => panic!("history op {other:?}"),
    };
    Event {
        thread,
        key: Some(key.as_bytes().to_vec()),
        invoke,
        ret_at,
        op,
        ret,
    }
}

fn read_logs(dir: &Path) -> Logs {
    let mut logs = Logs::default();
    for p in 0..PROCESSES {
        for t in 0..THREADS {
            let path = dir.join(format!("p{p}t{t}.log"));
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            // A SIGKILL may cut the last line short: only lines with their newline count.
            let whole = text.rfind('\n').map_or("", |end| &text[..end]);
            for line in whole.lines() {
                let f: Vec<&str> = line.split(' ').collect();
                let num = |i: usize| -> u64 { f[i].parse().expect("a number in a log") };
                match f[0] {
                    "H" => logs.events.push(parse_history(
                        num(1) as usize,
                        num(2),
                        num(3),
                        f[4],
                        &f[5..],
                    )),
                    "E" => logs.effects.entry(f[1].into()).or_default().push(Effect {
                        process: p,
                        token: num(2),
                        attempt: num(3) as u32,
                    }),
                    "A" => logs
                        .acknowledged
                        .entry(f[1].into())
                        .or_default()
                        .push((p, num(2))),
                    "D" => logs.deliveries.entry(f[1].into()).or_default().push((
                        p,
                        num(2),
                        f[3].to_string(),
                    )),
                    "U" => {
                        logs.unknown.insert(f[1].to_string());
                    }
                    "L" => logs.lost.push(line.to_string()),
                    _ => logs
                        .failures
                        .push(format!("process {p} thread {t}: {line}")),
                }
            }
        }
    }
    logs
}

/// A key's outcome as a fresh engine replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Final {
    token: u64,
    attempt: u32,
    response: String,
}

/// Replays every key through a new engine (16 threads); panics on a key not completed.
fn replay_all(prefix: &str, keys: usize) -> Vec<Final> {
    let engine = Engine::builder()
        .postgres(PostgresConfig::new(url()).table_prefix(prefix))
        .open()
        .expect("open the checking engine");
    let out: Vec<Mutex<Option<Final>>> = (0..keys).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= keys {
                    return;
                }
                let opts = ClaimOptions::default().fingerprint(fingerprint(k));
                match engine.claim(key_name(k).as_bytes(), &opts) {
                    Ok(Claim::Completed(s)) => {
                        *out[k].lock().expect("slot") = Some(Final {
                            token: s.token(),
                            attempt: s.attempt(),
                            response: String::from_utf8_lossy(s.response()).into_owned(),
                        })
                    }
                    other => panic!("key {} is not completed: {other:?}", key_name(k)),
                }
            });
        }
    });
    out.into_iter()
        .map(|m| m.into_inner().expect("slot").expect("replayed"))
        .collect()
}

/// Keys on which claims of at least two processes were under way at one instant.
fn keys_with_overlap(events: &[Event]) -> usize {
    let mut by_key: HashMap<&[u8], Vec<(u64, u64, usize)>> = HashMap::new();
    for e in events {
        if let (Some(k), KeyOp::Claim { .. }) = (&e.key, &e.op) {
            by_key
                .entry(k.as_slice())
                .or_default()
                .push((e.invoke, e.ret_at, e.thread / THREADS));
        }
    }
    by_key
        .values()
        .filter(|claims| {
            claims
                .iter()
                .any(|a| claims.iter().any(|b| a.2 != b.2 && a.0 < b.1 && b.0 < a.1))
        })
        .count()
}

fn spec_config(mode: Mode) -> SpecConfig {
    SpecConfig {
        durability: idemkv::Durability::Immediate,
        lease_ns: ns(mode.lease()),
        retention_ns: ns(Duration::from_secs(24 * 3600)),
        response_len_max: 1 << 20,
        checkpoint_len_max: 64 << 10,
        check_wall: false,
        marker_retention_ns: None,
    }
}

/// The whole run's summary, printed for the docs (`--nocapture`).
fn report(mode: Mode, keys: usize, o: &Observed) {
    let sum = |f: fn(&Done) -> u64| -> u64 { o.done.iter().flatten().map(f).sum() };
    let deliveries = sum(|d| d.deliveries);
    eprintln!(
        "[{}] {PROCESSES} processes x {THREADS} threads, {keys} keys x {DELIVERIES} deliveries: \
         {deliveries} deliveries in {:.1} s ({:.0}/s); round trips {} ({:.3}/delivery), \
         acquired {}, takeovers {}, replays {}, waits {}, in progress {}, unknown {}, \
         refused {}{}",
        mode.name(),
        o.wall.as_secs_f64(),
        deliveries as f64 / o.wall.as_secs_f64(),
        sum(|d| d.round_trips),
        sum(|d| d.round_trips) as f64 / deliveries.max(1) as f64,
        sum(|d| d.acquired),
        sum(|d| d.takeovers),
        sum(|d| d.replays),
        sum(|d| d.waits),
        sum(|d| d.in_progress),
        sum(|d| d.unknown),
        sum(|d| d.refused),
        o.restart
            .map(|r| format!(", server restart took {:.2} s", r.as_secs_f64()))
            .unwrap_or_default()
    );
}

/// The tests share one server (and the restart test restarts it): one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Checked {
    keys: usize,
    finals: Vec<Final>,
    logs: Logs,
    observed: Observed,
    relayed: Relayed,
}

/// What the relays published: by message id, (relay, payload) of each publication; the
/// ids whose `mark_sent` failed at least once; the (relay, id) whose take and mark were
/// further apart than the relay's hold on it.
#[derive(Default)]
struct Relayed {
    published: BTreeMap<u64, Vec<(String, String)>>,
    mark_failed: BTreeSet<u64>,
    outlasted: BTreeSet<(String, u64)>,
}

fn read_relay(relayed: &mut Relayed, name: &str, path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    for line in whole.lines() {
        let f: Vec<&str> = line.splitn(3, ' ').collect();
        let id: u64 = f[1].parse().expect("a message id");
        match f[0] {
            "O" => relayed
                .published
                .entry(id)
                .or_default()
                .push((name.to_string(), f[2].to_string())),
            "X" => {
                relayed.mark_failed.insert(id);
            }
            "L" => {
                if f[2] == "1" {
                    relayed.outlasted.insert((name.to_string(), id));
                }
            }
            other => panic!("unknown relay line {other}"),
        }
    }
}

/// The children's relays' logs, then the rest of the outbox drained by the parent: every
/// relay that took messages is gone, so their time is over (set so in the table rather
/// than waited for).
fn drain_outbox(prefix: &str, dir: &Path) -> Relayed {
    let mut relayed = Relayed::default();
    for p in 0..PROCESSES {
        read_relay(
            &mut relayed,
            &format!("p{p}"),
            &dir.join(format!("r{p}.log")),
        );
    }
    pg::psql(
        &url(),
        &format!("UPDATE \"{prefix}outbox\" SET taken_until = NULL"),
    );
    let engine = Engine::builder()
        .postgres(PostgresConfig::new(url()).table_prefix(prefix))
        .open()
        .expect("open the draining engine");
    let path = dir.join("parent.log");
    {
        let mut out = BufWriter::new(File::create(&path).expect("create the relay log"));
        // The only relay left: no other can be handed its messages.
        let alone = Duration::MAX;
        relay(
            &engine,
            &mut out,
            &std::sync::atomic::AtomicBool::new(true),
            alone,
        );
    }
    read_relay(&mut relayed, "parent", &path);
    assert_eq!(
        pg::psql(&url(), &format!("SELECT count(*) FROM \"{prefix}outbox\"")),
        "0",
        "the outbox is empty once drained"
    );
    relayed
}

/// Each key has exactly one message, whose bytes are its final response, and a message
/// published twice was first taken by a relay that may not have marked it in time: one of
/// `killed` (a process killed mid-run), one whose `mark_sent` failed, or one that marked
/// it only after its hold on it had run out (`pending` hands a message held past the
/// engine's lease to another relay, docs/outbox.md).
fn outbox_once(c: &Checked, killed: &[&str]) {
    let mut by_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut twice = 0;
    for (id, pubs) in &c.relayed.published {
        let payload = &pubs[0].1;
        assert!(
            pubs.iter().all(|p| &p.1 == payload),
            "message {id} published with different bytes: {pubs:?}"
        );
        if pubs.len() > 1 {
            twice += 1;
            // The publications are in the order the relays' logs were read, not the order
            // they happened in: every publication but one must be excused, whichever
            // relay's came first.
            let unexcused = pubs
                .iter()
                .filter(|p| {
                    !killed.contains(&p.0.as_str())
                        && !c.relayed.outlasted.contains(&(p.0.clone(), *id))
                })
                .count();
            let excused = c.relayed.mark_failed.contains(id) || unexcused <= 1;
            assert!(excused, "message {id} published by two relays: {pubs:?}");
        }
        let key = payload.split(':').next().expect("a key");
        by_key.entry(key).or_default().push(*id);
    }
    for k in 0..c.keys {
        let key = key_name(k);
        let ids = by_key.get(key.as_str()).map_or(&[][..], Vec::as_slice);
        assert_eq!(ids.len(), 1, "{key}: one message, got ids {ids:?}");
        let payload = &c.relayed.published[&ids[0]][0].1;
        assert_eq!(
            payload, &c.finals[k].response,
            "{key}: the message is the committed completion's"
        );
    }
    assert_eq!(by_key.len(), c.keys, "no message names another key");
    eprintln!(
        "[outbox] {} messages, one per key; {twice} published twice (by a killed relay, \
         after a failed mark_sent, or by a relay slower than its hold)",
        c.relayed.published.len()
    );
}

fn run(mode: Mode) -> Checked {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let keys = keys_wanted();
    let prefix = format!("mp{:08x}_{}_", fastrand::u32(..), mode.name());
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut observed = run_children(mode, keys, &prefix, dir.path());
    if let Some((_, after)) = observed.life.as_mut() {
        *after = life_token(&prefix);
    }
    report(mode, keys, &observed);
    let logs = read_logs(dir.path());
    assert!(
        logs.failures.is_empty(),
        "calls failed in the children: {:#?}",
        &logs.failures[..logs.failures.len().min(10)]
    );
    let finals = replay_all(&prefix, keys);
    let relayed = drain_outbox(&prefix, dir.path());
    if std::env::var_os("IDEMKV_MP_KEEP").is_some() {
        eprintln!("[{}] logs kept in {}", mode.name(), dir.keep().display());
    }
    Checked {
        keys,
        finals,
        logs,
        observed,
        relayed,
    }
}

/// Every acknowledged completion is the key's outcome, with its token and bytes, and every
/// key but at most `unlogged` has one (a process killed between its completion and its
/// log line leaves a key completed without the line).
fn nothing_acknowledged_lost(c: &Checked, unlogged: usize) {
    for (key, acks) in &c.logs.acknowledged {
        let f = &c.finals[key_index(key)];
        for (p, token) in acks {
            assert_eq!(
                *token, f.token,
                "{key}: process {p} was told its completion (token {token}) succeeded, but \
                 the key holds {f:?}"
            );
        }
    }
    let keys = c.logs.acknowledged.len();
    assert!(
        keys + unlogged >= c.keys,
        "{keys} of {} keys have an acknowledged completion",
        c.keys
    );
}

/// Every delivery of `processes` ended with the key's one response and token.
fn every_delivery_got_the_winners_bytes(c: &Checked, processes: &[usize]) {
    for k in 0..c.keys {
        let key = key_name(k);
        let f = &c.finals[k];
        let got = c.logs.deliveries.get(&key).map_or(&[][..], Vec::as_slice);
        for (p, token, response) in got {
            assert_eq!(
                (*token, response),
                (f.token, &f.response),
                "{key}: a delivery of process {p} got other bytes than the winner's"
            );
        }
        let mine = got.iter().filter(|d| processes.contains(&d.0)).count();
        assert_eq!(
            mine,
            processes.len() * COPIES_PER_PROCESS,
            "{key}: every delivery of processes {processes:?} ended"
        );
    }
}

/// Per-key linearizability and global token order of the histories, over the keys
/// `keep` accepts; returns how many keys were checked.
fn linearizable(c: &Checked, mode: Mode, keep: impl Fn(&str) -> bool) -> usize {
    let events: Vec<Event> = c
        .logs
        .events
        .iter()
        .filter(|e| {
            e.key
                .as_deref()
                .is_some_and(|k| keep(std::str::from_utf8(k).expect("an ASCII key")))
        })
        .cloned()
        .collect();
    // Tokens come from one sequence: their order holds across every key and process.
    let mut all = history::Summary::default();
    history::check_tokens(&c.logs.events, &mut all).unwrap_or_else(|v| panic!("{v}"));
    let summary = history::check(&spec_config(mode), &KeySpec::default(), &events)
        .unwrap_or_else(|v| panic!("not linearizable: {v}"));
    eprintln!(
        "[{}] linearizable: {} keys, {} operations; token order over {} acquisitions",
        mode.name(),
        summary.keys,
        summary.ops,
        all.acquisitions
    );
    summary.keys
}

#[test]
fn four_processes_run_each_key_once_and_every_delivery_gets_the_winners_bytes() {
    if let Ok(plan) = std::env::var(CHILD_ENV) {
        child(Plan::decode(&plan));
    }
    let c = run(Mode::Clean);
    for k in 0..c.keys {
        let key = key_name(k);
        let f = &c.finals[k];
        let effects = c.logs.effects.get(&key).map_or(&[][..], Vec::as_slice);
        assert_eq!(effects.len(), 1, "{key}: one side effect, got {effects:?}");
        assert_eq!(
            (effects[0].token, effects[0].attempt, f.attempt),
            (f.token, 1, 1),
            "{key}: the side effect is the completing claim's"
        );
        // The response names its winner, the process that ran the side effect.
        let winner = format!("{key}:{}:p{}t", f.token, effects[0].process);
        assert!(f.response.starts_with(&winner), "{key}: {f:?}");
    }
    every_delivery_got_the_winners_bytes(&c, &[0, 1, 2, 3]);
    nothing_acknowledged_lost(&c, 0);
    assert!(c.logs.lost.is_empty(), "no lease lost: {:?}", c.logs.lost);
    assert!(c.logs.unknown.is_empty());
    // The copies of a key met: claims of two processes were under way at once.
    let overlapping = keys_with_overlap(&c.logs.events);
    eprintln!(
        "[clean] {overlapping} of {} keys had claims of two processes under way at once",
        c.keys
    );
    assert!(
        overlapping * 2 >= c.keys,
        "only {overlapping} of {} keys had concurrent claims from different processes",
        c.keys
    );
    assert_eq!(linearizable(&c, Mode::Clean, |_| true), c.keys);
    outbox_once(&c, &[]);
}

#[test]
fn a_killed_process_keys_are_taken_over_and_nothing_acknowledged_is_lost() {
    if let Ok(plan) = std::env::var(CHILD_ENV) {
        child(Plan::decode(&plan));
    }
    let c = run(Mode::Kill);
    let (parked, parked_token) = c.observed.parked.clone().expect("the victim parked");
    let survivors: Vec<usize> = (0..PROCESSES).filter(|&p| p != VICTIM).collect();
    let mut doubled = BTreeSet::new();
    for k in 0..c.keys {
        let key = key_name(k);
        let f = &c.finals[k];
        let effects = c.logs.effects.get(&key).map_or(&[][..], Vec::as_slice);
        let completing: Vec<_> = effects.iter().filter(|e| e.token == f.token).collect();
        assert_eq!(
            completing.len(),
            1,
            "{key}: the completing claim ran the side effect once: {effects:?}, {f:?}"
        );
        assert_eq!(completing[0].attempt, f.attempt, "{key}");
        for e in effects.iter().filter(|e| e.token != f.token) {
            // A side effect whose claim did not complete the key: only the killed process
            // may have run it, never completed it, and the key was then taken over.
            assert_eq!(
                e.process, VICTIM,
                "{key}: a live process's side effect was not the key's completion: {e:?}"
            );
            let acked = c
                .logs
                .acknowledged
                .get(&key)
                .is_some_and(|a| a.iter().any(|(_, t)| *t == e.token));
            assert!(!acked, "{key}: an acknowledged completion was replaced");
            assert!(e.token < f.token, "{key}: the takeover's token is higher");
            assert!(f.attempt >= 2, "{key}: the retry is a takeover: {f:?}");
            doubled.insert(key.clone());
        }
    }
    assert!(
        doubled.contains(&parked),
        "the key the victim died holding ({parked}, token {parked_token}) was taken over \
         and run again: {:?}",
        c.finals[key_index(&parked)]
    );
    assert!(
        doubled.len() <= THREADS,
        "at most one key per thread of the victim ran twice: {doubled:?}"
    );
    // The takeover came after the lease, on the database's clock: not before the victim's
    // claim plus one lease. Both instants are CLOCK_MONOTONIC; the database's clock is this
    // machine's wall clock, whose rate NTP may slew by at most 0.05% (1 ms over the lease):
    // 10 ms of tolerance.
    let acquired = |key: &str, token: u64| {
        c.logs
            .events
            .iter()
            .find(|e| {
                e.key.as_deref() == Some(key.as_bytes())
                    && matches!(e.ret, KeyRet::Acquired { token: t, .. } if t == token)
            })
            .unwrap_or_else(|| panic!("{key}: the acquisition of token {token} is in a history"))
            .clone()
    };
    let held = acquired(&parked, parked_token);
    let takeover = acquired(&parked, c.finals[key_index(&parked)].token);
    assert!(
        takeover.ret_at + 10_000_000 >= held.invoke + ns(Mode::Kill.lease()),
        "{parked}: taken over {:?} after the victim's claim, within its lease",
        Duration::from_nanos(takeover.ret_at.saturating_sub(held.invoke))
    );
    let taken_over = c.finals.iter().filter(|f| f.attempt >= 2).count();
    eprintln!(
        "[kill] {} keys ran their side effect twice (the victim's, then the takeover's); \
         {taken_over} keys taken over; parked on {parked}",
        doubled.len()
    );
    every_delivery_got_the_winners_bytes(&c, &survivors);
    nothing_acknowledged_lost(&c, THREADS);
    // The spec has no lease expiry on the database's clock: the keys the victim ran a side
    // effect on, and every key taken over, are left out; the rest are checked.
    let victim_touched: BTreeSet<&String> = c
        .logs
        .effects
        .iter()
        .filter(|(_, es)| es.iter().any(|e| e.process == VICTIM))
        .map(|(k, _)| k)
        .collect();
    let checked = linearizable(&c, Mode::Kill, |key| {
        !victim_touched.contains(&key.to_string()) && c.finals[key_index(key)].attempt == 1
    });
    assert!(checked * 2 >= c.keys, "most keys are checked ({checked})");
    outbox_once(&c, &[&format!("p{VICTIM}")]);
}

#[test]
fn a_server_restart_mid_run_loses_nothing_acknowledged() {
    if let Ok(plan) = std::env::var(CHILD_ENV) {
        child(Plan::decode(&plan));
    }
    restarted_server_lost_nothing(&run(Mode::Restart), Mode::Restart);
}

/// As the restart, with the server crashed: what crash recovery loses (claims committed
/// without waiting for the disk and not yet flushed) was never given out, so nothing
/// acknowledged is lost and no side effect runs twice.
#[test]
fn a_server_crash_mid_run_loses_nothing_acknowledged() {
    if let Ok(plan) = std::env::var(CHILD_ENV) {
        child(Plan::decode(&plan));
    }
    restarted_server_lost_nothing(&run(Mode::Crash), Mode::Crash);
}

/// The checks of a run whose server went away mid-run (`Mode::restarts`).
fn restarted_server_lost_nothing(c: &Checked, mode: Mode) {
    assert!(c.observed.restart.is_some(), "the server was restarted");
    // Crash recovery emptied the lifetime table, and an engine wrote a new token; a clean
    // restart keeps it (nothing was lost).
    let (before, after) = c.observed.life.clone().expect("the token was read");
    assert!(!before.is_empty(), "a token before the restart");
    match mode {
        Mode::Crash => assert!(
            !after.is_empty() && after != before,
            "a new lifetime token after the crash: {before} then {after}"
        ),
        _ => assert_eq!(after, before, "the token survives a clean restart"),
    }
    let failed: u64 = c
        .observed
        .done
        .iter()
        .flatten()
        .map(|d| d.unknown + d.refused)
        .sum();
    assert!(
        failed > 0,
        "the restart reached calls: some answered OutcomeUnknown or Unavailable"
    );
    for k in 0..c.keys {
        let key = key_name(k);
        let f = &c.finals[k];
        let effects = c.logs.effects.get(&key).map_or(&[][..], Vec::as_slice);
        assert_eq!(
            effects.len(),
            1,
            "{key}: one side effect across the restart: {effects:?}, {f:?}"
        );
        assert_eq!(
            (effects[0].token, effects[0].attempt),
            (f.token, f.attempt),
            "{key}: the side effect is the completing claim's"
        );
    }
    assert!(
        c.logs.lost.is_empty(),
        "no holder lost its lease: {:?}",
        c.logs.lost
    );
    every_delivery_got_the_winners_bytes(c, &[0, 1, 2, 3]);
    nothing_acknowledged_lost(c, 0);
    let taken_over = c.finals.iter().filter(|f| f.attempt >= 2).count();
    eprintln!(
        "[{}] {} keys saw an unknown outcome; {taken_over} keys taken over (a claim \
         whose answer was lost had acquired them)",
        mode.name(),
        c.logs.unknown.len()
    );
    // Keys a lost answer touched, or taken over after a lease, are left out (the spec has
    // neither unknown outcomes nor the database's clock); the rest are checked.
    let checked = linearizable(c, mode, |key| {
        !c.logs.unknown.contains(key) && c.finals[key_index(key)].attempt == 1
    });
    assert!(checked * 2 >= c.keys, "most keys are checked ({checked})");
    outbox_once(c, &[]);
}

// ---------------------------------------------------------------------------------------
// Connections within PostgreSQL's defaults

/// The child of the connections test: its URL, table prefix and process number.
const CONN_CHILD_ENV: &str = "IDEMKV_MP_CONN_CHILD";
/// PostgreSQL's defaults: `max_connections = 100`, of which
/// `superuser_reserved_connections = 3` are kept for superusers.
const DEFAULT_CONNECTIONS_FOR_ROLES: usize = 100 - 3;
const CONN_PROCESSES: usize = 8;
const CONN_KEYS: usize = 1_500;

/// A child: an engine with the default settings, 16 threads running every key in the same
/// order as the other processes (so copies wait for each other's holders: the listening
/// connection opens too), each holder holding its connection-hungry completion back until
/// many are ready at once.
fn conn_child(plan: &str) -> ! {
    let f: Vec<&str> = plan.split(' ').collect();
    let (url, prefix) = (f[0], f[1]);
    let engine = Engine::builder()
        .postgres(PostgresConfig::new(url).table_prefix(prefix))
        .open()
        .expect("open with the default settings");
    let failures = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (engine, failures) = (&engine, &failures);
            s.spawn(move || {
                for k in (t..CONN_KEYS).step_by(THREADS) {
                    let key = key_name(k);
                    let opts = ClaimOptions::default().wait(WAIT);
                    let ran = engine.run(key.as_bytes(), &opts, |_| {
                        Ok::<_, std::io::Error>(key.clone().into_bytes())
                    });
                    match ran {
                        Ok(out) => assert_eq!(out.response(), key.as_bytes()),
                        Err(e) => {
                            eprintln!("{key}: {e:?}");
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let s = engine.stats();
    say(&format!(
        "done {} {}",
        failures.load(Ordering::Relaxed),
        s.db_notifications
    ));
    std::process::exit(0)
}

/// Eight processes, each an engine with the default settings (its pool and its listening
/// connection), fit in PostgreSQL's default connection limit: they run against a role
/// limited to the 97 connections a server with `max_connections = 100` leaves to
/// non-superusers (the limit the server enforces on the role), every call succeeds, and the
/// most connections seen open at once stays within it.
#[test]
fn eight_processes_with_default_settings_fit_in_the_default_max_connections() {
    if let Ok(plan) = std::env::var(CONN_CHILD_ENV) {
        conn_child(&plan);
    }
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tag = format!("{:08x}", fastrand::u32(..));
    let (role, db) = (format!("idemkv_conn_{tag}"), format!("idemkv_conn_{tag}"));
    pg::psql(
        &url(),
        &format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT {DEFAULT_CONNECTIONS_FOR_ROLES}"),
    );
    pg::psql(&url(), &format!("CREATE DATABASE {db} OWNER {role}"));
    let base = url();
    let at = base.find('@').expect("a URL with a user");
    let slash = base.rfind('/').expect("a URL with a database");
    let child_url = format!("postgres://{role}{}/{db}", &base[at..slash]);
    let exe = std::env::current_exe().expect("current_exe");
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut children: Vec<Child> = (0..CONN_PROCESSES)
        .map(|p| {
            let mut child = Command::new(&exe)
                .args([
                    "--exact",
                    "eight_processes_with_default_settings_fit_in_the_default_max_connections",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CONN_CHILD_ENV, format!("{child_url} c{tag}_"))
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a child");
            let stdout = child.stdout.take().expect("child stdout");
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(at) = line.find(MARK) {
                        let _ = tx.send((p, line[at + MARK.len()..].to_string()));
                    }
                }
                let _ = tx.send((p, "eof".into()));
            });
            child
        })
        .collect();
    drop(tx);
    // The most connections of the role open at once, sampled while the children run.
    let count = format!("SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'");
    let mut most = 0usize;
    let mut done = Vec::new();
    let mut ended = 0;
    let started = Instant::now();
    while ended < CONN_PROCESSES {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((_, line)) if line == "eof" => ended += 1,
            Ok((p, line)) => done.push((p, line)),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        let n: usize = pg::psql(&url(), &count).parse().expect("a count");
        most = most.max(n);
        assert!(
            started.elapsed() < SILENCE_MAX,
            "the children did not finish in {SILENCE_MAX:?}"
        );
    }
    for c in &mut children {
        assert!(c.wait().expect("wait").success(), "a child failed");
    }
    assert_eq!(done.len(), CONN_PROCESSES, "every child reported: {done:?}");
    let mut notified = 0;
    for (p, line) in &done {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[..2], ["done", "0"], "process {p}: every call succeeded");
        notified += f[2].parse::<u64>().expect("a number");
    }
    eprintln!(
        "[connections] {CONN_PROCESSES} processes with the default settings: at most {most} \
         connections open at once (limit {DEFAULT_CONNECTIONS_FOR_ROLES}); {notified} \
         wake-ups heard"
    );
    assert!(most <= DEFAULT_CONNECTIONS_FOR_ROLES, "{most} connections");
    assert!(
        most > CONN_PROCESSES,
        "the processes ran at once ({most} connections)"
    );
    pg::psql(&url(), &format!("DROP DATABASE {db} WITH (FORCE)"));
    pg::psql(&url(), &format!("DROP ROLE {role}"));
}
