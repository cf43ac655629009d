//! The `idemkv` command line: argument parsing, dispatch to one module per subcommand, and
//! the mapping of failures to one-line messages and exit codes.
//!
//! Shared helpers: `error.rs` (exit codes), `output.rs` (tables, numbers), `file.rs`
//! (opening a user's file, with one-line errors), `records.rs` (hex, keys, times, the
//! export line).
//!
//! Adding a subcommand: a module `src/cli/<name>.rs` with a `clap::Args` struct and a
//! `run(&Args) -> Result<(), CliError>`, a variant in [`Command`], and a line in [`dispatch`].

mod abandoned;
mod bench;
mod demo;
pub(crate) mod error;
mod export;
pub(crate) mod file;
mod get;
mod import;
mod inspect;
pub(crate) mod output;
mod records;
mod release;
mod stats;
mod sweep;
mod verify;

use clap::{Parser, Subcommand};
use error::{CliError, EXIT_ERROR, EXIT_OK};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// idemkv: an embedded idempotency engine. This tool demonstrates the race it closes and
/// looks inside an idemkv file.
///
/// Exit codes: 0 ok; 1 the command ran and its answer is no (see each command's help);
/// 2 usage, I/O or file error (missing, locked by a running service, corrupted, foreign).
#[derive(Debug, Parser)]
#[command(
    name = "idemkv",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = "Exit codes: 0 ok; 1 the command ran and its answer is no (idemkv broke its \
                  contract in the demo, verify found damage, get found no record, release found \
                  nothing to release, import refused records); 2 usage, I/O or file error \
                  (missing, locked by a running service, corrupted, not an idemkv file)."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Reproduce the duplicate-delivery race: naive check-then-act vs idemkv, side by side
    ///
    /// Consumer threads receive bursty concurrent duplicates (redeliveries while the first copy
    /// still works, rebalances, retry storms) and charge a card once per message. The same
    /// seeded plan runs through a naive handler (check a processed-set, work, then record it)
    /// and through the same handler guarded by idemkv's Engine::run on a temporary redb file.
    /// The naive handler double-charges; idemkv must not.
    ///
    /// Exit codes: 0 ok, 1 idemkv let a side effect run twice, 2 usage or I/O error.
    Demo(demo::DemoArgs),

    /// Print what an idemkv file holds: keys per state, file size, next token
    ///
    /// Read-only: nothing in the file changes, and the file of a running service can be read
    /// (its last commit is shown). Exit codes: 0 ok, 2 error.
    Stats(stats::StatsArgs),

    /// List the records of an idemkv file, filtered by key prefix, state and deadline
    ///
    /// Shows each record's key (escaped if binary), state, fencing token, attempt,
    /// fingerprint, deadline (end of the lease or of retention) and time left, checkpoint
    /// and response size. Records are listed as persisted; read-only: nothing in the file
    /// changes, and a running service's file shows its last commit. Exit codes: 0 ok,
    /// 2 error.
    Inspect(inspect::InspectArgs),

    /// Show one key's state and stored response
    ///
    /// Read-only: nothing in the file changes, and a running service's file shows its last
    /// commit. Exit codes: 0 the key has a live record, 1 it is absent (or past its retention),
    /// 2 error.
    Get(get::GetArgs),

    /// Check an idemkv file: redb page checksums, record checksums, responses, consistency
    ///
    /// Checks every redb page checksum (when no service has the file open), every record's
    /// checksum, reads every response back, and checks that tokens are unique and below the
    /// durable token mark and keys unique. Read-only: nothing in the file changes.
    ///
    /// Exit codes: 0 clean, 1 damaged (the reason on stderr), 2 could not verify (missing,
    /// locked, not an idemkv file, I/O error).
    Verify(verify::VerifyArgs),

    /// Force-release a stuck claim: the key becomes absent, and the record before is printed
    ///
    /// For a claim whose holder died with a long lease. The next claim of the key starts
    /// afresh (attempt 1, no checkpoint). A completed key is never released. Exit codes:
    /// 0 released, 1 nothing to release (absent or completed), 2 error.
    Release(release::ReleaseArgs),

    /// List abandoned claims (lease over, not completed, failed ones included) for a completer
    ///
    /// Shows each claim whose key was first claimed at least --older-than ago and whose lease
    /// ended at least --idle ago: key, token, attempt, whether its holder failed it, when it
    /// was first claimed, when its lease ended, its checkpoint. A completer finishes one by
    /// claiming its key (a takeover, with the checkpoint) and completing it. Read-only:
    /// nothing in the file changes, and a running service's file shows its last commit.
    /// Exit codes: 0 ok, 2 error.
    Abandoned(abandoned::AbandonedArgs),

    /// Reclaim every completion past its retention now, and print how many
    ///
    /// Exit codes: 0 ok, 2 error.
    Sweep(sweep::SweepArgs),

    /// Write every live record as JSON lines, in token order, for backup and migration
    ///
    /// One JSON object per line: key (hex) and key_text, scope (hex) and scope_text for a
    /// scoped key, token, fingerprint (16 or 32 hex digits, or null), attempt, state; then
    /// response (hex) and expires_at_ms for a completed record, or lease_deadline_ms and
    /// checkpoint ({phase, data (hex)} or null) for an inflight one. `idemkv import` reads
    /// it back exactly. Read-only; the output file is
    /// created owner-only (0600). Exit codes: 0 ok, 2 error.
    Export(export::ExportArgs),

    /// Add the records of an export to a fresh idemkv file (created if missing)
    ///
    /// Fencing tokens are kept: records are imported in token order, and only into a file
    /// that has issued no token at or above the smallest imported one. Every line is parsed
    /// first; a malformed line imports nothing. Exit codes: 0 all imported, 1 some records
    /// refused (listed by line number), 2 error.
    Import(import::ImportArgs),

    /// A quick throughput run: threads claim and complete distinct keys, with a progress bar
    ///
    /// Prints operations per second and latency percentiles. Exit codes: 0 ok, 2 error.
    Bench(bench::BenchArgs),
}

fn dispatch(cli: &Cli) -> Result<(), CliError> {
    match &cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Stats(args) => stats::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Get(args) => get::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Release(args) => release::run(args),
        Command::Abandoned(args) => abandoned::run(args),
        Command::Sweep(args) => sweep::run(args),
        Command::Export(args) => export::run(args),
        Command::Import(args) => import::run(args),
        Command::Bench(args) => bench::run(args),
    }
}

/// Set by the subcommands that open a user's file: the library turns a panic inside redb on
/// a damaged file into an error (`OpenError::Corrupted`), so the hook must not print it as
/// an internal error. A panic that does reach `main` is still printed there, once.
static QUIET_PANICS: AtomicBool = AtomicBool::new(false);
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Panics are recorded, not printed, from now on (see [`QUIET_PANICS`]).
pub(crate) fn quiet_panics() {
    QUIET_PANICS.store(true, Ordering::Relaxed);
}

/// The message of the latest panic, if any.
pub(crate) fn last_panic() -> Option<String> {
    LAST_PANIC.lock().ok().and_then(|last| last.clone())
}

/// Parses the arguments, runs the subcommand, and turns the result into an exit code.
pub(crate) fn main() -> ExitCode {
    // A bug must still end in one line and a meaningful code, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let line = format!("{}{at}", one_line(&what));
        if !QUIET_PANICS.load(Ordering::Relaxed) {
            eprintln!("idemkv: internal error: {line}");
        }
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(line);
        }
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_error(e),
    };
    match std::panic::catch_unwind(|| dispatch(&cli)) {
        Ok(Ok(())) => ExitCode::from(EXIT_OK),
        Ok(Err(e)) => {
            if !e.is_silent() {
                eprintln!("idemkv: error: {e}");
            }
            e.exit_code()
        }
        Err(_) => {
            if QUIET_PANICS.load(Ordering::Relaxed) {
                let what = last_panic().unwrap_or_else(|| "unknown panic".into());
                eprintln!("idemkv: internal error: {what}");
            }
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// `--help` and `--version` print in full; a usage error is one line, then a pointer to help.
fn clap_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(EXIT_ERROR)
            } else {
                ExitCode::from(EXIT_OK)
            }
        }
        _ => {
            let rendered = e.render().to_string();
            eprintln!(
                "idemkv: error: {}",
                usage_error_line(&rendered, subcommand_used().as_deref())
            );
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Condenses clap's multi-line usage error to one line: the error, the possible values or a
/// tip if clap gave one, and where to find help for the (sub)command that was used.
fn usage_error_line(rendered: &str, subcommand: Option<&str>) -> String {
    let lines: Vec<&str> = rendered.lines().map(str::trim).collect();
    let first = lines
        .iter()
        .find(|l| !l.is_empty())
        .copied()
        .unwrap_or("invalid arguments");
    let mut out = first.trim_start_matches("error: ").to_string();
    for extra in lines.iter().skip(1) {
        if extra.starts_with("[possible values:") || extra.starts_with("tip:") {
            out.push_str(&format!(" {extra}"));
        }
    }
    // "Usage: idemkv demo [OPTIONS]" -> "idemkv demo".
    let command = lines
        .iter()
        .find_map(|l| l.strip_prefix("Usage: "))
        .map(|u| {
            u.split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| match subcommand {
            Some(sub) => format!("idemkv {sub}"),
            None => "idemkv".into(),
        });
    format!("{out}; see '{command} --help'")
}

/// The subcommand named on the command line, if any (for pointing at its help).
fn subcommand_used() -> Option<String> {
    use clap::CommandFactory;
    let first = std::env::args().skip(1).find(|a| !a.starts_with('-'))?;
    Cli::command()
        .get_subcommands()
        .any(|c| c.get_name() == first)
        .then_some(first)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `q` quantile (0..=1) of sorted nanoseconds, by nearest rank; zero if there are none.
/// The one percentile of the command (`bench` and `demo`).
pub(crate) fn percentile(sorted_ns: &[u64], q: f64) -> Duration {
    if sorted_ns.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted_ns.len() as f64).ceil() as usize).clamp(1, sorted_ns.len());
    Duration::from_nanos(sorted_ns[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn usage_errors_are_one_line_and_point_to_the_right_help() {
        let e = Cli::try_parse_from(["idemkv", "demo", "--pattern", "foo"]).unwrap_err();
        let line = usage_error_line(&e.render().to_string(), Some("demo"));
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("possible values"), "{line}");
        assert!(line.ends_with("see 'idemkv demo --help'"), "{line}");
        let e = Cli::try_parse_from(["idemkv", "demo", "--bogus"]).unwrap_err();
        let line = usage_error_line(&e.render().to_string(), None);
        assert!(line.ends_with("see 'idemkv demo --help'"), "{line}");
        let e = Cli::try_parse_from(["idemkv", "demox"]).unwrap_err();
        let line = usage_error_line(&e.render().to_string(), None);
        assert!(line.ends_with("see 'idemkv --help'"), "{line}");
    }
}
