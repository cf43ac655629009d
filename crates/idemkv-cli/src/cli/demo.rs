//! `idemkv demo`: the race idemkv exists to close, reproduced live, with the price of
//! closing it.
//!
//! Many consumer threads receive bursty concurrent duplicates (redeliveries while the first
//! copy still works, rebalances handing in-flight messages to another consumer, retry storms)
//! and "charge a card" once per message. The same seeded plan runs three times, one column
//! each: a naive handler that checks a shared processed-set, works, then records the message
//! (the time-of-check to time-of-use window), in memory; the same handler inside idemkv's
//! `Engine::run` at the same durability (`Durability::None`, memory only); and the same again
//! durable (`Immediate` by default) on a temporary redb file. The first two differ only in
//! correctness, the last two only in durability, so each has its visible price. The command
//! fails (exit 1) if idemkv ever let a charge run twice.
//!
//! `workload` makes the traffic, `handler` runs it through a column's handler, `accounting`
//! counts what the card processor saw, and `render` prints the report.

mod accounting;
mod handler;
mod render;
mod workload;

use crate::cli::error::CliError;
use crate::cli::file::temp_dir;
use crate::cli::output;
use accounting::ColumnResult;
use handler::{run_column, Handler};
use idemkv::{Durability, Engine};
use render::Report;
use std::path::PathBuf;
use workload::{Pattern, Plan};

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

    /// Durability of the third column's idemkv engine (the second is always memory only);
    /// none drops the third column
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

/// One column of the report: a handler and the durability it runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    /// Check-then-act over an in-memory processed-set.
    Naive,
    /// `Engine::run` at this durability.
    Idemkv(DurabilityArg),
}

impl Column {
    /// The column's heading in the table (and the progress bar's label).
    fn heading(self) -> &'static str {
        match self {
            Column::Naive => "naive check-then-act",
            Column::Idemkv(DurabilityArg::None) => "idemkv memory only",
            Column::Idemkv(DurabilityArg::Immediate) => "idemkv immediate",
            Column::Idemkv(DurabilityArg::Buffered) => "idemkv buffered",
        }
    }

    /// Whether the column keeps its records in a file.
    fn durable(self) -> bool {
        matches!(self, Column::Idemkv(d) if d != DurabilityArg::None)
    }

    fn handler(self) -> &'static str {
        match self {
            Column::Naive => "naive",
            Column::Idemkv(_) => "idemkv",
        }
    }

    fn durability_name(self) -> &'static str {
        match self {
            Column::Naive => DurabilityArg::None.name(),
            Column::Idemkv(d) => d.name(),
        }
    }

    /// The table's durability cell.
    fn durability_cell(self) -> &'static str {
        match self {
            Column::Naive | Column::Idemkv(DurabilityArg::None) => "memory only",
            Column::Idemkv(DurabilityArg::Immediate) => "fsynced on return",
            Column::Idemkv(DurabilityArg::Buffered) => "fsync within 10 ms",
        }
    }

    /// What the durability means, in a phrase.
    fn durability_note(self) -> &'static str {
        match self {
            Column::Naive | Column::Idemkv(DurabilityArg::None) => "nothing survives a crash",
            Column::Idemkv(DurabilityArg::Immediate) => "each call fsynced before returning",
            Column::Idemkv(DurabilityArg::Buffered) => {
                "each call fsynced within 10 ms of its return"
            }
        }
    }
}

/// Runs the demo: the three columns on one plan, then the report.
pub(crate) fn run(args: &DemoArgs) -> Result<(), CliError> {
    if args.keep_file && args.durability == DurabilityArg::None {
        return Err(CliError::usage(
            "--keep-file needs a file, but --durability none keeps everything in memory",
        ));
    }
    let seed = args.seed.unwrap_or_else(random_seed);
    let plan = Plan::new(args.messages, args.dup_rate, args.pattern, seed);

    let mut columns = vec![run_column(
        &plan,
        args,
        Column::Naive,
        Handler::naive(args.messages),
    )?];
    let memory = Engine::builder()
        .durability(Durability::None)
        .open()
        .map_err(|e| CliError::io("opening the in-memory idemkv engine", e))?;
    columns.push(run_engine(&plan, args, DurabilityArg::None, memory)?);

    // The durable column runs last, on a file of its own; `--durability none` drops it (the
    // memory-only column already shows that durability).
    let mut temp = None;
    if args.durability != DurabilityArg::None {
        let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
        let dir = temp_dir(&base, "idemkv-demo", args.keep_file)
            .map_err(|e| CliError::io(format!("creating a directory in {}", base.display()), e))?;
        let path = dir.path().join("demo.redb");
        temp = Some(dir);
        let engine = Engine::builder()
            .path(&path)
            .durability(args.durability.mode())
            .open()
            .map_err(|e| CliError::io("opening the idemkv engine", e))?;
        columns.push(run_engine(&plan, args, args.durability, engine)?);
    }
    let file = temp.as_ref().map(|d| d.path().join("demo.redb"));

    let report = Report {
        args,
        seed,
        plan: &plan,
        file: file.as_deref(),
        columns,
    };
    if args.json {
        output::print(&format!("{}\n", report.json()))?;
    } else {
        output::print(&report.text())?;
    }
    drop(temp); // removes the file unless --keep-file
    match report.failure_summary() {
        None => Ok(()),
        Some(summary) => Err(CliError::violation(format!(
            "idemkv broke its contract in the demo: {summary} (explained in the report); \
             this is a bug in idemkv"
        ))),
    }
}

/// Runs the plan through `Engine::run` on `engine`, then closes it.
fn run_engine(
    plan: &Plan,
    args: &DemoArgs,
    durability: DurabilityArg,
    engine: Engine,
) -> Result<ColumnResult, CliError> {
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
    let mut result = run_column(
        plan,
        args,
        Column::Idemkv(durability),
        Handler::Guarded(&engine),
    )?;
    result.engine = Some(engine.stats());
    engine
        .close()
        .map_err(|e| CliError::io("closing the idemkv engine", e))?;
    Ok(result)
}

fn random_seed() -> u64 {
    // `fastrand`'s global generator is seeded per process; kept short to retype.
    fastrand::u64(0..1_000_000)
}
