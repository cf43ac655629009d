//! `idemkv bench`: a quick throughput run. Threads claim and complete distinct keys for a
//! few seconds (every claim wins, so this measures the write path: the claim, the
//! completion and, under `Immediate`, two group-committed fsyncs per operation), then
//! print operations per second and latency percentiles.
//!
//! The criterion benches (`cargo bench`, docs/benchmarks.md) measure more carefully; this
//! is the number an operator can get on the target machine and disk in seconds.

use crate::cli::demo::DurabilityArg;
use crate::cli::error::CliError;
use crate::cli::file::temp_dir;
use crate::cli::output::{self, count, duration, Table};
use idemkv::{Claim, ClaimError, ClaimOptions, Durability, Engine, Stats};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Pause before retrying a claim the engine refused for back-pressure.
const RETRY_BACKOFF: Duration = Duration::from_micros(200);

/// Options of `idemkv bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Threads claiming and completing keys concurrently
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,

    /// How long to run, in seconds (fractions allowed)
    #[arg(long, value_name = "S", default_value_t = 5.0, value_parser = parse_seconds)]
    seconds: f64,

    /// Durability of the engine
    #[arg(long, value_enum, default_value_t = DurabilityArg::Immediate)]
    durability: DurabilityArg,

    /// The file to create for the run (must not exist; kept afterwards) [default: a
    /// temporary file, removed at exit]
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,

    /// Bytes of each stored response
    #[arg(long, value_name = "BYTES", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    response_bytes: u32,

    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,

    /// Do not draw the progress bar (it is never drawn when stderr is not a terminal)
    #[arg(long)]
    no_progress: bool,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() || !(0.1..=3600.0).contains(&v) {
        return Err(format!("must be between 0.1 and 3600 seconds, got {s}"));
    }
    Ok(v)
}

struct Outcome {
    ops: u64,
    retries: u64,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
    max: Duration,
    stats: Stats,
}

pub(crate) fn run(args: &BenchArgs) -> Result<(), CliError> {
    let durability = args.durability.mode();
    let mut temp = None;
    let file: Option<PathBuf> = match (&args.file, durability) {
        (Some(_), Durability::None) => {
            return Err(CliError::usage(
                "--file needs a durable mode, but --durability none keeps everything in memory",
            ))
        }
        (_, Durability::None) => None,
        (Some(path), _) => {
            if path.exists() {
                return Err(CliError::usage(format!(
                    "{} exists; bench writes records, so give a path that does not exist",
                    path.display()
                )));
            }
            Some(path.clone())
        }
        (None, _) => {
            let base = std::env::temp_dir();
            let dir = temp_dir(&base, "idemkv-bench", false).map_err(|e| {
                CliError::io(format!("creating a directory in {}", base.display()), e)
            })?;
            let path = dir.path().join("bench.redb");
            temp = Some(dir);
            Some(path)
        }
    };
    let mut builder = Engine::builder().durability(durability);
    if let Some(path) = &file {
        builder = builder.path(path);
    }
    let engine = builder.open().map_err(|e| match &file {
        Some(path) => crate::cli::file::open_error(path, e),
        None => CliError::io("opening the engine", e),
    })?;
    let outcome = measure(args, &engine);
    let closed = engine.close();
    drop(engine);
    let outcome = outcome?;
    closed.map_err(|e| CliError::io("closing the engine", e))?;

    let file_note = match (&file, &temp) {
        (None, _) => "none (memory only)".to_string(),
        (Some(p), Some(_)) => format!("{} (removed)", p.display()),
        (Some(p), None) => format!("{} (kept)", p.display()),
    };
    if args.json {
        let s = &outcome.stats;
        let out = json!({
            "threads": args.threads,
            "seconds": outcome.elapsed.as_secs_f64(),
            "durability": args.durability.name(),
            "file": file.as_deref().map(|p: &Path| p.display().to_string()),
            "response_bytes": args.response_bytes,
            "operations": outcome.ops,
            "ops_per_sec": outcome.ops as f64 / outcome.elapsed.as_secs_f64().max(1e-9),
            "p50_us": outcome.p50.as_secs_f64() * 1e6,
            "p99_us": outcome.p99.as_secs_f64() * 1e6,
            "max_us": outcome.max.as_secs_f64() * 1e6,
            "retries": outcome.retries,
            "commits": s.commits,
            "committed_ops": s.committed_ops,
            "batch_max": s.batch_max,
            "commit_max_us": s.commit_max_us,
        });
        drop(temp);
        return output::print(&format!("{out}\n"));
    }
    let s = &outcome.stats;
    let mut t = Table::new(&["", "value"]);
    let mut row = |name: &str, value: String| t.row(vec![name.to_string(), value]);
    row("operations", count(outcome.ops));
    row("throughput", output::rate(outcome.ops, outcome.elapsed));
    row("latency p50", duration(outcome.p50));
    row("latency p99", duration(outcome.p99));
    row("latency max", duration(outcome.max));
    row("retries (back-pressure)", count(outcome.retries));
    if s.commits > 0 {
        row("group commits", count(s.commits));
        row(
            "operations per commit",
            format!(
                "{:.1} avg, {} max",
                s.committed_ops as f64 / s.commits as f64,
                count(s.batch_max)
            ),
        );
        row(
            "longest commit",
            duration(std::time::Duration::from_micros(s.commit_max_us)),
        );
    }
    let text = format!(
        "idemkv bench: {} threads, {}, durability {}, file {}\n\
         one operation = claim a new key + complete it with a {}-byte response\n\n{}",
        args.threads,
        duration(outcome.elapsed),
        args.durability.name(),
        file_note,
        args.response_bytes,
        t.render()
    );
    drop(temp);
    output::print(&text)
}

fn measure(args: &BenchArgs, engine: &Engine) -> Result<Outcome, CliError> {
    let run_for = Duration::from_secs_f64(args.seconds);
    let response = vec![b'r'; args.response_bytes as usize];
    let opts = ClaimOptions::default();
    let done = AtomicU64::new(0);
    let finished = AtomicBool::new(false);
    let pb = progress_bar(args, run_for);
    let started = Instant::now();
    let deadline = started + run_for;

    let joined: Vec<Result<(Vec<u64>, u64), CliError>> = std::thread::scope(|s| {
        let ticker = s.spawn(|| {
            while !finished.load(Ordering::Acquire) {
                let n = done.load(Ordering::Relaxed);
                pb.set_message(output::rate(n, started.elapsed()));
                pb.set_position(started.elapsed().as_millis() as u64);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let (response, opts, done) = (&response, &opts, &done);
                s.spawn(move || worker(engine, t, deadline, response, opts, done))
            })
            .collect();
        let results = handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CliError::io(
                        "a bench thread",
                        crate::cli::last_panic().unwrap_or_else(|| "panicked".into()),
                    ))
                })
            })
            .collect();
        finished.store(true, Ordering::Release);
        let _ = ticker.join();
        results
    });
    let elapsed = started.elapsed();
    pb.finish_and_clear();
    let mut latencies = Vec::new();
    let mut retries = 0;
    for r in joined {
        let (l, n) = r?;
        latencies.extend(l);
        retries += n;
    }
    latencies.sort_unstable();
    let pick = |q: f64| super::percentile(&latencies, q);
    Ok(Outcome {
        ops: latencies.len() as u64,
        retries,
        elapsed,
        p50: pick(0.50),
        p99: pick(0.99),
        max: pick(1.0),
        stats: engine.stats(),
    })
}

/// Claims and completes `bench-<thread>-<i>` until `deadline`; returns the latency of each
/// operation in ns and the number of back-pressure retries.
fn worker(
    engine: &Engine,
    thread: u32,
    deadline: Instant,
    response: &[u8],
    opts: &ClaimOptions,
    done: &AtomicU64,
) -> Result<(Vec<u64>, u64), CliError> {
    let mut latencies = Vec::new();
    let mut retries = 0u64;
    let mut i = 0u64;
    while Instant::now() < deadline {
        let key = format!("bench-{thread}-{i}");
        i += 1;
        let t0 = Instant::now();
        loop {
            match engine.claim(key.as_bytes(), opts) {
                Ok(Claim::Acquired(lease)) => {
                    lease
                        .complete(response)
                        .map_err(|e| CliError::io(format!("completing {key}"), e))?;
                    break;
                }
                Ok(_) => {
                    return Err(CliError::io(
                        format!("claiming {key}"),
                        "a new key was not acquired; the bench file must be fresh",
                    ))
                }
                Err(ClaimError::Overloaded(_)) => {
                    retries += 1;
                    std::thread::sleep(RETRY_BACKOFF);
                }
                Err(e) => return Err(CliError::io(format!("claiming {key}"), e)),
            }
        }
        latencies.push(t0.elapsed().as_nanos() as u64);
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok((latencies, retries))
}

fn progress_bar(args: &BenchArgs, run_for: Duration) -> ProgressBar {
    if args.no_progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(
        Some(run_for.as_millis() as u64),
        ProgressDrawTarget::stderr(),
    );
    let template = format!(
        "  bench [{{bar:32}}] {{elapsed}} of {:.0}s  {{msg:>12}}",
        run_for.as_secs_f64()
    );
    let style = ProgressStyle::with_template(&template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb
}
