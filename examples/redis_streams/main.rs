//! Consumers of a real Redis stream, naive against idemkv, under Redis Streams' own
//! redelivery: a consumer group, XREADGROUP, and a reclaimer running XAUTOCLAIM with a
//! 100 ms min-idle time, so an entry whose work takes longer (5% take 200-400 ms) is
//! redelivered to another consumer while the first one still works on it.
//!
//! ```text
//! cargo run --example redis_streams -- naive     # check a processed set, work, mark, XACK
//! cargo run --example redis_streams -- idemkv    # Engine::run keyed by the message id, XACK
//! cargo run --example redis_streams -- kill      # idemkv, the consumer process aborted and killed
//! cargo run --example redis_streams --features postgres -- idemkv-pg   # processes, PostgreSQL
//! ```
//!
//! Options: `--redis host:port` (default `$IDEMKV_REDIS_URL` or 127.0.0.1:63799),
//! `--messages N` (2000), `--consumers N` (8), `--seed N`. `scripts/broker.sh run` starts a
//! throwaway Redis and runs every mode; `eval "$(scripts/broker.sh start)"` starts one for
//! running the example by hand. `kill` and `idemkv-pg` run their consumers in child
//! processes (this program's `consumer` subcommand). Every count of the report is kept in
//! Redis, so a killed consumer loses none. The exit code is non-zero when an idemkv mode
//! leaves a message not done or runs a side effect twice.

mod resp;
mod scenario;

use idemkv::Engine;
use resp::{Error, Result};
use scenario::{Config, Mode, Report};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The consumer process aborts right after its k-th completion, before that XACK.
const ABORT_ENV: &str = "IDEMKV_DEMO_ABORT_AT";

fn main() {
    if let Err(e) = real_main() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn real_main() -> Result<()> {
    let mut argv = std::env::args().skip(1);
    let command = argv.next().unwrap_or_else(|| "idemkv".into());
    let redis = std::env::var("IDEMKV_REDIS_URL").unwrap_or_else(|_| "127.0.0.1:63799".into());
    let prefix = format!("demo-{}-{}", std::process::id(), now_tag());
    let mut cfg = Config::new(&redis, &prefix);
    let mut child = ChildArgs::default();
    while let Some(flag) = argv.next() {
        let mut value = || {
            argv.next()
                .ok_or_else(|| Error::from(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--redis" => cfg.redis = value()?,
            "--messages" => cfg.messages = value()?.parse()?,
            "--consumers" => cfg.consumers = value()?.parse()?,
            "--seed" => cfg.seed = value()?.parse()?,
            "--config" => cfg = serde_json::from_str(&value()?)?,
            "--name" => child.name = value()?,
            "--threads" => child.threads = value()?.parse()?,
            "--engine" => child.engine = value()?,
            _ => return Err(format!("unknown argument {flag}").into()),
        }
    }
    match command.as_str() {
        "naive" => finish(&cfg, run_threads(&cfg, Mode::Naive)?, false),
        "idemkv" => finish(&cfg, run_threads(&cfg, Mode::Idemkv)?, true),
        "kill" => finish(&cfg, run_kill(&cfg)?, true),
        #[cfg(feature = "postgres")]
        "idemkv-pg" => finish(&cfg, run_pg(&cfg)?, true),
        #[cfg(not(feature = "postgres"))]
        "idemkv-pg" => Err("idemkv-pg needs `--features postgres`".into()),
        "consumer" => consumer(&cfg, &child),
        _ => Err(format!("unknown mode {command} (naive, idemkv, kill, idemkv-pg)").into()),
    }
}

fn now_tag() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Prints the report, deletes the run's keys and fails an idemkv run that was not exactly
/// once. Naive runs are expected (not required) to show doubles.
fn finish(cfg: &Config, report: Report, strict: bool) -> Result<()> {
    report.print();
    scenario::cleanup(cfg)?;
    if strict && !report.exactly_once() {
        return Err(format!("{}: not every message done exactly once", report.title).into());
    }
    Ok(())
}

fn run_threads(cfg: &Config, mode: Mode) -> Result<Report> {
    let title = match mode {
        Mode::Naive => format!(
            "naive: processed set in Redis, {} consumer threads",
            cfg.consumers
        ),
        Mode::Idemkv => format!("idemkv: file engine, {} consumer threads", cfg.consumers),
    };
    match mode {
        Mode::Naive => scenario::run_in_process(cfg, mode, None, &title),
        Mode::Idemkv => {
            let dir = tempfile::Builder::new()
                .prefix("idemkv-streams-")
                .tempdir()?;
            let engine = Engine::builder()
                .path(dir.path().join("consumers.redb"))
                .open()?;
            let report = scenario::run_in_process(cfg, mode, Some(&engine), &title);
            engine.close()?;
            report
        }
    }
}

/// The arguments of a consumer process.
#[derive(Default)]
struct ChildArgs {
    name: String,
    threads: usize,
    /// `file:<path>` or `pg:<url>`.
    engine: String,
}

/// The `consumer` subcommand: this process's consumers, until the stop key is set.
fn consumer(cfg: &Config, args: &ChildArgs) -> Result<()> {
    let abort_at = std::env::var(ABORT_ENV)
        .ok()
        .map(|k| k.parse())
        .transpose()?;
    let engine = if let Some(path) = args.engine.strip_prefix("file:") {
        // Default durability (Immediate): a completion is on disk before `run` returns.
        Engine::builder().path(path).open()?
    } else if let Some(url) = args.engine.strip_prefix("pg:") {
        open_pg(url)?
    } else {
        return Err(format!("unknown engine {:?}", args.engine).into());
    };
    let result = scenario::consume(
        cfg,
        Mode::Idemkv,
        Some(&engine),
        &args.name,
        args.threads,
        abort_at,
    );
    engine.close()?;
    result
}

#[cfg(feature = "postgres")]
fn open_pg(url: &str) -> Result<Engine> {
    use idemkv::PostgresConfig;
    // Tables of their own: the demo's keys never meet another user's of the database.
    let pg = PostgresConfig::new(url)
        .pool_size(4)
        .table_prefix("idemkv_streams_");
    Ok(Engine::builder().postgres(pg).open()?)
}

#[cfg(not(feature = "postgres"))]
fn open_pg(_: &str) -> Result<Engine> {
    Err("the PostgreSQL engine needs `--features postgres`".into())
}

fn spawn(
    cfg: &Config,
    name: &str,
    threads: usize,
    engine: &str,
    abort_at: Option<usize>,
) -> Result<Child> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["consumer", "--config", &serde_json::to_string(cfg)?])
        .args([
            "--name",
            name,
            "--threads",
            &threads.to_string(),
            "--engine",
            engine,
        ]);
    match abort_at {
        Some(k) => cmd.env(ABORT_ENV, k.to_string()),
        None => cmd.env_remove(ABORT_ENV),
    };
    Ok(cmd.spawn()?)
}

/// Waits for the child to exit; kills it if it has not by the deadline.
fn wait_until(
    child: &mut Child,
    started: Instant,
    deadline: Duration,
) -> Result<std::process::ExitStatus> {
    while started.elapsed() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill()?;
    child.wait()?;
    Err("the consumer process did not end before the deadline".into())
}

/// Acknowledged entries so far.
fn acked(cfg: &Config) -> Result<i64> {
    resp::Conn::connect(&cfg.redis)?
        .cmd(&["HLEN", &format!("{}:acked", cfg.prefix)])?
        .int()
}

/// The consumers in one child process on a file engine. The child aborts right after its
/// k-th completion, k being 40% of the messages (completed, not acknowledged); it is
/// restarted on the
/// same file, killed with SIGKILL at a random point later, and restarted again.
fn run_kill(cfg: &Config) -> Result<Report> {
    let dir = tempfile::Builder::new()
        .prefix("idemkv-streams-kill-")
        .tempdir()?;
    let engine = format!("file:{}", dir.path().join("consumers.redb").display());
    scenario::setup(cfg)?;
    let started = Instant::now();
    let abort_at = (cfg.messages * 2 / 5).max(1);
    let mut kills = Vec::new();
    let mut child = spawn(cfg, "k1", cfg.consumers, &engine, Some(abort_at))?;
    scenario::produce(cfg)?;
    let status = wait_until(&mut child, started, cfg.deadline)?;
    if status.success() {
        return Err("the consumer process ended without aborting".into());
    }
    kills.push(format!(
        "consumer process aborted itself after its completion #{abort_at}, before XACK ({status}); restarted on the same file"
    ));
    child = spawn(cfg, "k2", cfg.consumers, &engine, None)?;
    // SIGKILL at a random point between 55% and 85% of the entries acknowledged.
    let entries = resp::Conn::connect(&cfg.redis)?
        .cmd(&["XLEN", &format!("{}:stream", cfg.prefix)])?
        .int()?;
    // Not seeded: each run kills at another moment (the report says which).
    let mut rng = fastrand::Rng::new();
    let target = entries * i64::from(rng.u32(55..=85)) / 100;
    while acked(cfg)? < target && started.elapsed() < cfg.deadline {
        if let Some(status) = child.try_wait()? {
            return Err(format!("consumer process ended early: {status}").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let at = acked(cfg)?;
    child.kill()?;
    child.wait()?;
    kills.push(format!("consumer process killed with SIGKILL at {at} of {entries} entries acked; restarted on the same file"));
    child = spawn(cfg, "k3", cfg.consumers, &engine, None)?;
    let done = scenario::await_done(cfg, started)?;
    scenario::signal_stop(cfg)?;
    let status = wait_until(&mut child, Instant::now(), Duration::from_secs(30))?;
    if !status.success() {
        return Err(format!("consumer process failed: {status}").into());
    }
    let mut report = scenario::report(
        cfg,
        &format!(
            "kill: file engine, {} consumer threads in a child process, crashed twice",
            cfg.consumers
        ),
        done,
    )?;
    report.kills = kills;
    Ok(report)
}

/// Consumers as separate processes (4, sharing the consumer count) on PostgreSQL.
#[cfg(feature = "postgres")]
fn run_pg(cfg: &Config) -> Result<Report> {
    let url = std::env::var("IDEMKV_PG_URL").map_err(|_| "idemkv-pg needs IDEMKV_PG_URL")?;
    let processes = cfg.consumers.clamp(1, 4);
    scenario::setup(cfg)?;
    let started = Instant::now();
    let children: Vec<Child> = (0..processes)
        .map(|i| {
            let threads = cfg.consumers / processes + usize::from(i < cfg.consumers % processes);
            spawn(cfg, &format!("p{i}"), threads, &format!("pg:{url}"), None)
        })
        .collect::<Result<_>>()?;
    scenario::produce(cfg)?;
    let done = scenario::await_done(cfg, started)?;
    scenario::signal_stop(cfg)?;
    for mut child in children {
        let status = wait_until(&mut child, Instant::now(), Duration::from_secs(30))?;
        if !status.success() {
            return Err(format!("consumer process failed: {status}").into());
        }
    }
    scenario::report(
        cfg,
        &format!(
            "idemkv-pg: PostgreSQL engine, {} consumers in {processes} processes",
            cfg.consumers
        ),
        done,
    )
}
