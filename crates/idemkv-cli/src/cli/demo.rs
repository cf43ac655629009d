//! `idemkv demo`: the race idemkv exists to close, reproduced live.
//!
//! Many consumer threads receive bursty concurrent duplicates (redeliveries while the first
//! copy still works, rebalances handing in-flight messages to another consumer, retry storms)
//! and "charge a card" once per message. The same seeded plan runs twice: through a naive
//! handler that checks a shared processed-set, works, then records the message (the
//! time-of-check to time-of-use window), and through the same handler guarded by idemkv's
//! `Engine::run` on a temporary redb file. The table shows the double charges of the first
//! and none in the second; the command fails (exit 1) if idemkv ever let a charge run twice.

mod workload;

use crate::cli::error::{CliError, EXIT_VIOLATION};
use crate::cli::file::TempDir;
use crate::cli::output::{self, count, duration, Table};
use idemkv::{ClaimError, ClaimOptions, Durability, Engine, LeaseError, RunError, Stats};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use workload::{Broker, Delivery, Kind, Pattern, Plan};

/// Most violations explained one by one (the count covers them all).
const VIOLATIONS_SHOWN: usize = 10;
/// Pause before a consumer retries a delivery the engine asked to retry later.
const RETRY_BACKOFF: Duration = Duration::from_millis(1);
/// Most retries of one delivery before the demo gives up on the engine.
const RETRIES_MAX: u32 = 1_000;

/// Options of `idemkv demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Consumer threads delivering messages concurrently
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,

    /// Distinct messages (each is delivered one or more times)
    #[arg(long, value_name = "N", default_value_t = 20_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    messages: u32,

    /// Expected copies delivered per message (1 = no duplicates, at most 64)
    #[arg(long, value_name = "COPIES", default_value_t = 3.0, value_parser = parse_dup_rate)]
    dup_rate: f64,

    /// How duplicates arrive: redelivery (visibility timeout expires mid-work), rebalance
    /// (in-flight messages handed to another consumer), storm (all copies at once), or mixed
    #[arg(long, value_enum, default_value_t = Pattern::Mixed)]
    pattern: Pattern,

    /// Durability of the idemkv engine
    #[arg(long, value_enum, default_value_t = DurabilityArg::Immediate)]
    durability: DurabilityArg,

    /// Seed of the delivery plan [default: random, printed with the results]
    #[arg(long, value_name = "SEED")]
    seed: Option<u64>,

    /// Keep the temporary idemkv file and print its path instead of removing it
    #[arg(long)]
    keep_file: bool,

    /// Directory for the temporary idemkv file [default: the system temp directory]
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,

    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,

    /// Do not draw the progress bar (it is never drawn when stderr is not a terminal)
    #[arg(long)]
    no_progress: bool,

    /// Sabotage builds only: switch a deliberate engine bug on, to prove the demo catches it.
    #[cfg(idemkv_sabotage)]
    #[arg(long, value_enum, hide = true)]
    sabotage: Option<SabotageArg>,
}

/// `--sabotage` (builds with `--cfg idemkv_sabotage` only).
#[cfg(idemkv_sabotage)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SabotageArg {
    /// Claims check, drop the lock, then insert.
    CheckThenAct,
    /// Completions skip the fencing-token comparison.
    NoFencing,
}

/// `--durability` (of `demo` and `bench`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DurabilityArg {
    /// Every claim and completion is fsynced (in group commits) before it returns
    Immediate,
    /// Returns at once; fsynced within 10 ms
    Buffered,
    /// Memory only, no file
    None,
}

impl DurabilityArg {
    pub(crate) fn mode(self) -> Durability {
        match self {
            DurabilityArg::Immediate => Durability::Immediate,
            DurabilityArg::Buffered => Durability::buffered(),
            DurabilityArg::None => Durability::None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            DurabilityArg::Immediate => "immediate",
            DurabilityArg::Buffered => "buffered",
            DurabilityArg::None => "none",
        }
    }
}

fn parse_dup_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() || !(1.0..=64.0).contains(&v) {
        return Err(format!(
            "must be between 1 and 64 copies per message, got {s}"
        ));
    }
    Ok(v)
}

fn pattern_name(p: Pattern) -> &'static str {
    match p {
        Pattern::Redelivery => "redelivery",
        Pattern::Rebalance => "rebalance",
        Pattern::Storm => "storm",
        Pattern::Mixed => "mixed",
    }
}

/// Runs the demo: both handlers on one plan, then the report.
pub(crate) fn run(args: &DemoArgs) -> Result<(), CliError> {
    if args.keep_file && args.durability == DurabilityArg::None {
        return Err(CliError::usage(
            "--keep-file needs a file, but --durability none keeps everything in memory",
        ));
    }
    let seed = args.seed.unwrap_or_else(random_seed);
    let plan = Plan::new(args.messages, args.dup_rate, args.pattern, seed);
    let durability = args.durability.mode();

    let mut temp = None;
    let engine = if durability == Durability::None {
        Engine::builder().durability(Durability::None).open()
    } else {
        let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
        let dir = TempDir::create(&base, "idemkv-demo", args.keep_file)
            .map_err(|e| CliError::io(format!("creating a directory in {}", base.display()), e))?;
        let path = dir.path.join("demo.redb");
        temp = Some(dir);
        Engine::builder().path(&path).durability(durability).open()
    }
    .map_err(|e| CliError::io("opening the idemkv engine", e))?;
    let file = temp.as_ref().map(|d| d.path.join("demo.redb"));
    #[cfg(idemkv_sabotage)]
    if let Some(bug) = args.sabotage {
        idemkv::sabotage::switch(
            &engine,
            Some(match bug {
                SabotageArg::CheckThenAct => idemkv::sabotage::Sabotage::CheckThenAct,
                SabotageArg::NoFencing => idemkv::sabotage::Sabotage::NoFencing,
            }),
        );
    }

    let naive = run_mode(&plan, args, Mode::naive(args.messages))?;
    let guarded = run_mode(&plan, args, Mode::Guarded(&engine))?;
    let stats = engine.stats();
    engine
        .close()
        .map_err(|e| CliError::io("closing the idemkv engine", e))?;
    drop(engine);

    let report = Report {
        args,
        seed,
        plan: &plan,
        file: file.as_deref(),
        naive,
        guarded,
        stats,
    };
    if args.json {
        output::print(&format!("{}\n", report.json()))?;
    } else {
        output::print(&report.text())?;
    }
    drop(temp); // removes the file unless --keep-file
    match report.guarded.failure_summary() {
        None => Ok(()),
        Some(summary) => Err(CliError::violation(format!(
            "idemkv broke its contract in the demo: {summary} (explained in the report); \
             this is a bug in idemkv"
        ))),
    }
}

fn random_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // Mixed so that two runs in the same millisecond still differ; kept short to retype.
    workload::Rng::new(nanos ^ u64::from(std::process::id())).next_u64() % 1_000_000
}

/// A directory of our own for the demo's file, removed on drop unless kept.
enum Mode<'e> {
    /// Check a processed-set, work, charge, then record: the race.
    Naive(Mutex<HashSet<u32>>),
    /// The same work and charge inside `Engine::run`.
    Guarded(&'e Engine),
}

impl Mode<'_> {
    fn naive(messages: u32) -> Self {
        Mode::Naive(Mutex::new(HashSet::with_capacity(messages as usize)))
    }

    fn label(&self) -> &'static str {
        match self {
            Mode::Naive(_) => "naive",
            Mode::Guarded(_) => "idemkv",
        }
    }
}

/// One execution of the side effect.
#[derive(Debug, Clone)]
struct Charge {
    msg: u32,
    /// Which copy of the message (0 = the first delivered).
    copy: u32,
    token: u64,
    attempt: u32,
    thread: u32,
    start: Duration,
    end: Duration,
}

/// The card processor: counts the charges of every message.
struct Ledger {
    charges: Vec<AtomicU32>,
    /// Token of the first charge of each message (guarded mode).
    winner: Vec<AtomicU64>,
    /// Every charge in detail (guarded mode: one per message, if all goes well).
    log: Mutex<Vec<Charge>>,
}

impl Ledger {
    fn new(messages: usize) -> Self {
        Ledger {
            charges: (0..messages).map(|_| AtomicU32::new(0)).collect(),
            winner: (0..messages).map(|_| AtomicU64::new(0)).collect(),
            log: Mutex::new(Vec::new()),
        }
    }

    fn charge(&self, charge: Option<Charge>, msg: u32) {
        self.charges[msg as usize].fetch_add(1, Ordering::AcqRel);
        if let Some(charge) = charge {
            let _ = self.winner[msg as usize].compare_exchange(
                0,
                charge.token,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            self.log.lock().push(charge);
        }
    }
}

/// A copy that received a response other than the winner's.
#[derive(Debug, Clone)]
struct WrongResponse {
    msg: u32,
    winner: u64,
    got_token: u64,
    got: Vec<u8>,
}

/// What one consumer thread saw.
#[derive(Debug, Default)]
struct ThreadOut {
    latencies_ns: Vec<u64>,
    absorbed: u64,
    retries: u64,
    /// Handler runs whose completion was refused with `LeaseLost`.
    lease_lost: u64,
    wrong: Vec<WrongResponse>,
}

/// The results of one handler over the plan.
#[derive(Debug)]
struct ModeResult {
    label: &'static str,
    deliveries: u64,
    messages: u64,
    side_effects: u64,
    double_charged: u64,
    extra_charges: u64,
    double_by_kind: [u64; 3],
    absorbed: u64,
    retries: u64,
    lease_lost: u64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    elapsed: Duration,
    /// Copies whose response was not the winner's (guarded mode only).
    wrong_responses: u64,
    /// Messages whose side effect never ran.
    never_charged: u64,
    /// Explanations of the first violations (guarded mode only).
    violations: Vec<String>,
}

impl ModeResult {
    /// What went wrong, in one phrase, if anything did (guarded mode).
    fn failure_summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.double_charged > 0 {
            parts.push(format!(
                "{} messages charged more than once ({} extra charges)",
                count(self.double_charged),
                count(self.extra_charges)
            ));
        }
        if self.wrong_responses > 0 {
            parts.push(format!(
                "{} copies answered with a response other than the winner's",
                count(self.wrong_responses)
            ));
        }
        if self.never_charged > 0 {
            parts.push(format!(
                "{} messages never charged",
                count(self.never_charged)
            ));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

fn key_of(msg: u32) -> String {
    format!("payment-{msg:08}")
}

fn receipt(msg: u32, amount_cents: u32, token: u64) -> Vec<u8> {
    format!(
        "receipt payment-{msg:08}: charged {}.{:02} (token {token})",
        amount_cents / 100,
        amount_cents % 100
    )
    .into_bytes()
}

fn progress_bar(args: &DemoArgs, label: &str, len: u64) -> ProgressBar {
    if args.no_progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{prefix:>7} [{bar:32}] {human_pos}/{human_len} deliveries  {msg:>10}  eta {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_prefix(label.to_string());
    pb
}

/// Delivers the whole plan through `mode` with `args.threads` consumers.
fn run_mode(plan: &Plan, args: &DemoArgs, mode: Mode<'_>) -> Result<ModeResult, CliError> {
    let n = plan.messages.len();
    let ledger = Ledger::new(n);
    let broker = Broker::new(plan);
    let done = AtomicU64::new(0);
    let finished = AtomicBool::new(false);
    let pb = progress_bar(args, mode.label(), plan.deliveries);
    let started = Instant::now();

    let joined: Result<Vec<ThreadOut>, CliError> = std::thread::scope(|s| {
        let ticker = s.spawn(|| {
            while !finished.load(Ordering::Acquire) {
                let n = done.load(Ordering::Relaxed);
                pb.set_message(output::rate(n, started.elapsed()));
                pb.set_position(n);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let mut handles = Vec::new();
        let mut spawn_error = None;
        for t in 0..args.threads {
            let (broker, ledger, done, mode) = (&broker, &ledger, &done, &mode);
            let spawned = std::thread::Builder::new()
                .name(format!("consumer-{t}"))
                .spawn_scoped(s, move || {
                    let out = consume(t, plan, broker, mode, ledger, done, started);
                    if out.is_err() {
                        broker.stop();
                    }
                    out
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    broker.stop();
                    spawn_error = Some(CliError::io("starting consumer threads", e));
                    break;
                }
            }
        }
        let mut outs = Vec::new();
        let mut first_error = spawn_error;
        for h in handles {
            match h.join() {
                Ok(Ok(out)) => outs.push(out),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error
                        .get_or_insert(CliError::io("a consumer thread", "panicked (see above)"));
                }
            }
        }
        finished.store(true, Ordering::Release);
        let _ = ticker.join();
        match first_error {
            Some(e) => Err(e),
            None => Ok(outs),
        }
    });
    let elapsed = started.elapsed();
    pb.finish_and_clear();
    let outs = joined?;
    Ok(summarize(plan, &mode, ledger, outs, elapsed))
}

/// One consumer: takes deliveries until the broker runs dry.
fn consume(
    thread: u32,
    plan: &Plan,
    broker: &Broker<'_>,
    mode: &Mode<'_>,
    ledger: &Ledger,
    done: &AtomicU64,
    started: Instant,
) -> Result<ThreadOut, CliError> {
    let mut out = ThreadOut::default();
    while let Some(Delivery { msg, copy }) = broker.next() {
        let m = &plan.messages[msg as usize];
        let t0 = Instant::now();
        match mode {
            Mode::Naive(processed) => {
                // Check ...
                let seen = processed.lock().contains(&msg);
                if seen {
                    out.absorbed += 1;
                } else {
                    // ... then act: another copy can pass the same check meanwhile.
                    std::thread::sleep(m.work);
                    ledger.charge(None, msg);
                    processed.lock().insert(msg);
                }
            }
            Mode::Guarded(engine) => {
                let key = key_of(msg);
                let payload = format!("charge {} to the card of payment {msg}", m.amount_cents);
                let opts = ClaimOptions::default().payload(payload.as_bytes());
                let mut tries = 0u32;
                loop {
                    tries += 1;
                    if tries > RETRIES_MAX {
                        return Err(CliError::io(
                            format!("idemkv failed on {key} during the demo"),
                            format!("no outcome after {RETRIES_MAX} retries"),
                        ));
                    }
                    let result = engine.run(key.as_bytes(), &opts, |lease| {
                        let start = started.elapsed();
                        std::thread::sleep(m.work);
                        let charge = Charge {
                            msg,
                            copy,
                            token: lease.token(),
                            attempt: lease.attempt(),
                            thread,
                            start,
                            end: started.elapsed(),
                        };
                        ledger.charge(Some(charge), msg);
                        Ok::<_, Infallible>(receipt(msg, m.amount_cents, lease.token()))
                    });
                    match result {
                        Ok(outcome) => {
                            if outcome.replayed() {
                                out.absorbed += 1;
                            }
                            let winner = ledger.winner[msg as usize].load(Ordering::Acquire);
                            if outcome.token() != winner
                                || outcome.response() != receipt(msg, m.amount_cents, winner)
                            {
                                out.wrong.push(WrongResponse {
                                    msg,
                                    winner,
                                    got_token: outcome.token(),
                                    got: outcome.response().to_vec(),
                                });
                            }
                            break;
                        }
                        // Back-pressure: the engine refused before doing anything. Retry,
                        // as a queue consumer would after a nack.
                        Err(RunError::StillInProgress { .. })
                        | Err(RunError::Claim(ClaimError::Overloaded(_))) => {
                            out.retries += 1;
                            std::thread::sleep(RETRY_BACKOFF);
                        }
                        // The handler ran (the card was charged) but another token owns the
                        // key now. Not fatal to the demo: it is evidence, and the ledger will
                        // show the double charge. A real consumer would see the delivery fail
                        // and get it again, so retry.
                        Err(RunError::Lease(LeaseError::LeaseLost)) => {
                            out.lease_lost += 1;
                            out.retries += 1;
                        }
                        Err(e) => {
                            return Err(CliError::io(
                                format!("idemkv failed on {key} during the demo"),
                                e,
                            ))
                        }
                    }
                }
            }
        }
        out.latencies_ns.push(t0.elapsed().as_nanos() as u64);
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(out)
}

fn percentile(sorted: &[u64], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Duration::from_nanos(sorted[rank - 1])
}

fn summarize(
    plan: &Plan,
    mode: &Mode<'_>,
    ledger: Ledger,
    outs: Vec<ThreadOut>,
    elapsed: Duration,
) -> ModeResult {
    let mut latencies: Vec<u64> = Vec::with_capacity(plan.deliveries as usize);
    let (mut absorbed, mut retries, mut lease_lost) = (0, 0, 0);
    let mut wrong = Vec::new();
    for out in outs {
        latencies.extend(out.latencies_ns);
        absorbed += out.absorbed;
        retries += out.retries;
        lease_lost += out.lease_lost;
        wrong.extend(out.wrong);
    }
    latencies.sort_unstable();
    let mut side_effects = 0u64;
    let mut double_charged = 0u64;
    let mut extra_charges = 0u64;
    let mut double_by_kind = [0u64; 3];
    let mut doubles = Vec::new();
    let mut never = Vec::new();
    for (i, c) in ledger.charges.iter().enumerate() {
        let c = u64::from(c.load(Ordering::Acquire));
        side_effects += c;
        if c > 1 {
            double_charged += 1;
            extra_charges += c - 1;
            double_by_kind[plan.messages[i].kind as usize] += 1;
            doubles.push(i as u32);
        } else if c == 0 {
            never.push(i as u32);
        }
    }

    let mut violations = Vec::new();
    let guarded = matches!(mode, Mode::Guarded(_));
    if guarded {
        let violation_count = doubles.len() as u64 + wrong.len() as u64 + never.len() as u64;
        let log = ledger.log.into_inner();
        for &msg in doubles.iter().take(VIOLATIONS_SHOWN) {
            let mut runs: Vec<&Charge> = log.iter().filter(|c| c.msg == msg).collect();
            runs.sort_by_key(|c| c.start);
            violations.push(explain_double(msg, &runs));
        }
        for w in wrong
            .iter()
            .take(VIOLATIONS_SHOWN.saturating_sub(violations.len()))
        {
            violations.push(format!(
                "{} got the response of token {} ({:?}), but token {} ran the handler: \
                 every copy must get the winner's bytes",
                key_of(w.msg),
                w.got_token,
                String::from_utf8_lossy(&w.got),
                w.winner
            ));
        }
        for &msg in never
            .iter()
            .take(VIOLATIONS_SHOWN.saturating_sub(violations.len()))
        {
            violations.push(format!(
                "{} was never charged: every delivery returned, but no handler ran",
                key_of(msg)
            ));
        }
        if violation_count > violations.len() as u64 {
            violations.push(format!(
                "... and {} more",
                violation_count - violations.len() as u64
            ));
        }
    }

    ModeResult {
        label: mode.label(),
        deliveries: latencies.len() as u64,
        messages: plan.messages.len() as u64,
        side_effects,
        double_charged,
        extra_charges,
        double_by_kind,
        absorbed,
        retries,
        lease_lost,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        max: percentile(&latencies, 1.0),
        elapsed,
        wrong_responses: if guarded { wrong.len() as u64 } else { 0 },
        never_charged: never.len() as u64,
        violations,
    }
}

/// Why a message was charged more than once, from the runs of its handler.
fn explain_double(msg: u32, runs: &[&Charge]) -> String {
    const RUNS_SHOWN: usize = 3;
    let mut list: Vec<String> = runs
        .iter()
        .take(RUNS_SHOWN)
        .map(|c| {
            format!(
                "copy {} under token {} (attempt {}, consumer-{}) ran {}..{}",
                c.copy,
                c.token,
                c.attempt,
                c.thread,
                duration(c.start),
                duration(c.end)
            )
        })
        .collect();
    if runs.len() > RUNS_SHOWN {
        list.push(format!("{} more", runs.len() - RUNS_SHOWN));
    }
    let overlapped = runs.windows(2).any(|w| w[1].start < w[0].end);
    let tokens: HashSet<u64> = runs.iter().map(|c| c.token).collect();
    let why = if tokens.len() < runs.len() {
        "one lease ran the handler twice"
    } else if overlapped {
        "the runs overlapped, so two leases were live at once (the one-winner invariant broke)"
    } else {
        "the runs did not overlap, so a later claim did not see the earlier run's outcome"
    };
    format!(
        "{} was charged {} times: {}; {why}",
        key_of(msg),
        runs.len(),
        list.join(", ")
    )
}

/// Everything the report needs.
struct Report<'a> {
    args: &'a DemoArgs,
    seed: u64,
    plan: &'a Plan,
    file: Option<&'a Path>,
    naive: ModeResult,
    guarded: ModeResult,
    stats: Stats,
}

impl Report<'_> {
    fn file_note(&self) -> String {
        match self.file {
            None => "no file (durability none: memory only)".into(),
            Some(p) if self.args.keep_file => format!("{} (kept)", p.display()),
            Some(p) => format!("{} (removed at exit; --keep-file keeps it)", p.display()),
        }
    }

    fn text(&self) -> String {
        let (n, g) = (&self.naive, &self.guarded);
        let mut out = String::new();
        out.push_str(&format!(
            "idemkv demo: {} messages, {:.1} copies each on average ({} pattern), {} deliveries \
             over {} consumer threads, seed {}\n",
            count(self.plan.messages.len() as u64),
            self.plan.deliveries as f64 / self.plan.messages.len().max(1) as f64,
            pattern_name(self.args.pattern),
            count(self.plan.deliveries),
            self.args.threads,
            self.seed
        ));
        out.push_str(&format!(
            "each message charges a card once. naive: check a processed-set, work ({} to {}), \
             charge, then record it; idemkv: the same work and charge inside Engine::run.\n",
            duration(Duration::from_secs_f64(workload::WORK_MIN_US / 1e6)),
            duration(Duration::from_secs_f64(workload::WORK_MAX_US / 1e6)),
        ));
        out.push_str(&format!(
            "idemkv engine: durability {}, file {}\n\n",
            self.args.durability.name(),
            self.file_note()
        ));

        let mut t = Table::new(&["", "naive check-then-act", "idemkv Engine::run"]);
        let both = |f: &dyn Fn(&ModeResult) -> String| vec![f(n), f(g)];
        let mut row = |name: &str, cells: Vec<String>| {
            let mut r = vec![name.to_string()];
            r.extend(cells);
            t.row(r);
        };
        row("deliveries", both(&|r| count(r.deliveries)));
        row("distinct messages", both(&|r| count(r.messages)));
        row("side effects executed", both(&|r| count(r.side_effects)));
        row("double charges", both(&|r| count(r.double_charged)));
        if self.args.pattern == Pattern::Mixed {
            for kind in Kind::ALL {
                row(
                    &format!("  during a {}", kind.name()),
                    both(&|r| count(r.double_by_kind[kind as usize])),
                );
            }
        }
        row("extra charges", both(&|r| count(r.extra_charges)));
        row("duplicates absorbed", both(&|r| count(r.absorbed)));
        row("latency p50 / delivery", both(&|r| duration(r.p50)));
        row("latency p99 / delivery", both(&|r| duration(r.p99)));
        row(
            "throughput (deliveries)",
            both(&|r| output::rate(r.deliveries, r.elapsed)),
        );
        row("wall time", both(&|r| duration(r.elapsed)));
        out.push_str(&t.render());
        out.push('\n');

        if n.double_charged > 0 {
            out.push_str(&format!(
                "naive:  {} of {} messages ({:.1}%) were charged more than once ({} extra \
                 charges): copies that arrived while the first was still working checked the \
                 processed-set, found nothing, and charged again.\n",
                count(n.double_charged),
                count(n.messages),
                100.0 * n.double_charged as f64 / n.messages.max(1) as f64,
                count(n.extra_charges)
            ));
        } else {
            out.push_str(
                "naive:  no double charge this time; the race needs overlapping copies (try more \
                 --threads or --messages, or a higher --dup-rate).\n",
            );
        }
        let s = &self.stats;
        if g.failure_summary().is_none() {
            out.push_str(&format!(
                "idemkv: every message was charged exactly once; {} duplicate deliveries got the \
                 winner's stored receipt (claim and record are one atomic step).\n",
                count(g.absorbed)
            ));
        } else {
            out.push_str(&format!(
                "idemkv: FAILED: {}. This must never happen; the first cases:\n",
                g.failure_summary().unwrap_or_default()
            ));
            for v in &g.violations {
                out.push_str(&format!("  - {v}\n"));
            }
        }
        if g.lease_lost > 0 {
            out.push_str(&format!(
                "        {} handler runs had their completion refused (lease lost): another \
                 token had taken their key while they worked.\n",
                count(g.lease_lost)
            ));
        }
        if s.commits > 0 {
            out.push_str(&format!(
                "        {} group commits wrote {} records ({:.1} per commit, at most {}); {} \
                 waits for a winner; {} retries after back-pressure.\n",
                count(s.commits),
                count(s.committed_ops),
                s.committed_ops as f64 / s.commits as f64,
                count(s.batch_max),
                count(s.waits),
                count(g.retries)
            ));
        }
        out
    }

    fn json(&self) -> Value {
        let mode = |r: &ModeResult| {
            let by_kind: serde_json::Map<String, Value> = Kind::ALL
                .iter()
                .map(|k| (k.name().to_string(), json!(r.double_by_kind[*k as usize])))
                .collect();
            json!({
                "deliveries": r.deliveries,
                "distinct_messages": r.messages,
                "side_effects": r.side_effects,
                "double_charges": r.double_charged,
                "double_charges_by_pattern": by_kind,
                "extra_charges": r.extra_charges,
                "duplicates_absorbed": r.absorbed,
                "retries": r.retries,
                "leases_lost": r.lease_lost,
                "wrong_responses": r.wrong_responses,
                "never_charged": r.never_charged,
                "latency_us": {
                    "p50": micros(r.p50),
                    "p99": micros(r.p99),
                    "max": micros(r.max),
                },
                "throughput_per_s": (r.deliveries as f64 / r.elapsed.as_secs_f64().max(1e-9)).round(),
                "elapsed_s": (r.elapsed.as_secs_f64() * 1e3).round() / 1e3,
                "handler": r.label,
            })
        };
        let s = &self.stats;
        let ok = self.guarded.failure_summary().is_none();
        let mut guarded = mode(&self.guarded);
        guarded["engine"] = json!({
            "commits": s.commits,
            "committed_records": s.committed_ops,
            "batch_max": s.batch_max,
            "claims": s.claims,
            "acquired": s.acquired,
            "takeovers": s.takeovers,
            "replays": s.replays,
            "waits": s.waits,
        });
        json!({
            "ok": ok,
            "exit_code": if ok { 0 } else { EXIT_VIOLATION },
            "failure": self.guarded.failure_summary(),
            "config": {
                "threads": self.args.threads,
                "messages": self.args.messages,
                "dup_rate": self.args.dup_rate,
                "pattern": pattern_name(self.args.pattern),
                "durability": self.args.durability.name(),
                "seed": self.seed,
                "planned_deliveries": self.plan.deliveries,
                "file": self.file.map(|p| p.display().to_string()),
                "file_kept": self.file.is_some() && self.args.keep_file,
            },
            "naive": mode(&self.naive),
            "idemkv": guarded,
            "violations": self.guarded.violations,
        })
    }
}

/// Microseconds with one decimal, for JSON.
fn micros(d: Duration) -> f64 {
    (d.as_nanos() as f64 / 100.0).round() / 10.0
}
