//! `idemkv verify FILE`: checks a file end to end.
//!
//! 1. redb's integrity check: every page checksum of the file (`verify_on_open`).
//! 2. Every record's checksum: the engine verifies each record in full as it opens.
//! 3. Every completed record's response read back from the file (`Engine::records`), which
//!    verifies its checksum again, and the count compared with what the open found.
//! 4. Consistency: tokens unique and below the next token, keys unique, attempts above 0.
//!
//! The file is opened as a snapshot (see `file.rs`), so nothing is reclaimed or taken over.
//! Exit codes: 0 clean, 1 damaged (with the reason), 2 could not verify (missing, locked,
//! not an idemkv file, I/O error).

use crate::cli::error::CliError;
use crate::cli::file::{self, How};
use crate::cli::output::{self, count, duration};
use crate::cli::records::{printable, state_name};
use crate::cli::stats::bytes;
use idemkv::{OpenError, RecordInfoState};
use serde_json::json;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `idemkv verify`.
#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// The idemkv file (never created)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Print one JSON object instead of text
    #[arg(long)]
    json: bool,
}

/// Problems listed one by one (the count covers them all).
const PROBLEMS_SHOWN: usize = 10;

pub(crate) fn run(args: &VerifyArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    file::check_exists(&args.file)?;
    let started = Instant::now();
    let engine = match file::open_unchecked(&args.file, How::SnapshotVerified) {
        Ok(engine) => engine,
        Err(OpenError::Corrupted { detail }) => {
            let why = format!("{} is corrupted: {detail}", args.file.display());
            report_damage(args, std::slice::from_ref(&why))?;
            return Err(CliError::negative(why));
        }
        Err(e) => return Err(file::open_error(&args.file, e)),
    };
    let records = engine.records();
    let stats = engine.stats();
    file::close(engine, &args.file)?;
    let elapsed = started.elapsed();

    let now = file::now_ms();
    let mut problems = Vec::new();
    let (mut inflight, mut completed, mut expired, mut response_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut tokens = HashSet::with_capacity(records.len());
    let mut keys = HashSet::with_capacity(records.len());
    for r in &records {
        match &r.state {
            RecordInfoState::InFlight { .. } => inflight += 1,
            RecordInfoState::Completed { response, .. } => {
                response_bytes += response.len() as u64;
                if state_name(r, now) == "expired" {
                    expired += 1;
                } else {
                    completed += 1;
                }
            }
            _ => problems.push(format!(
                "{} (token {}) is {}, which a file just opened cannot hold",
                printable(&r.key),
                r.token,
                r.state_name()
            )),
        }
        if r.token >= stats.token_next {
            problems.push(format!(
                "{} has token {}, not below the next token {}: fencing would repeat it",
                printable(&r.key),
                r.token,
                stats.token_next
            ));
        }
        if !tokens.insert(r.token) {
            problems.push(format!("token {} is used by two records", r.token));
        }
        if !keys.insert(r.key.as_slice()) {
            problems.push(format!("{} has two live records", printable(&r.key)));
        }
        if r.attempt == 0 {
            problems.push(format!(
                "{} (token {}) has attempt 0",
                printable(&r.key),
                r.token
            ));
        }
    }
    // The snapshot clock never moves, so nothing expired between the two calls: every
    // record the open indexed must have been read back.
    let indexed = stats.inflight + stats.completed + stats.expired_unswept;
    let read_back = records.len() as u64;
    if read_back < indexed {
        problems.push(format!(
            "{} of {} completed records could not be read back from the file",
            count(indexed - read_back),
            count(stats.completed + stats.expired_unswept)
        ));
    }
    if !problems.is_empty() {
        report_damage(args, &problems)?;
        let first = problems[0].clone();
        let more = match problems.len() {
            1 => String::new(),
            n => format!(" (and {} more problems)", n - 1),
        };
        return Err(CliError::negative(format!(
            "{} is damaged: {first}{more}",
            args.file.display()
        )));
    }

    if args.json {
        let out = json!({
            "file": args.file.display().to_string(),
            "ok": true,
            "records": records.len(),
            "inflight": inflight,
            "completed": completed,
            "expired": expired,
            "response_bytes": response_bytes,
            "token_next": stats.token_next,
            "elapsed_ms": elapsed.as_millis() as u64,
        });
        return output::print(&format!("{out}\n"));
    }
    let mut out = format!("verify {}: ok\n", args.file.display());
    let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<17} {v}\n"));
    line("redb pages", "every page checksum verified".into());
    line(
        "records",
        format!(
            "{} ({} inflight, {} completed, {} expired not yet reclaimed)",
            count(records.len() as u64),
            count(inflight),
            count(completed),
            count(expired)
        ),
    );
    line("record checksums", "every record verified".into());
    line(
        "responses",
        format!(
            "{} read back and verified, {}",
            count(completed + expired),
            bytes(response_bytes)
        ),
    );
    line(
        "consistency",
        "tokens unique and below the next token, keys unique".into(),
    );
    line("next token", count(stats.token_next));
    line("time", duration(elapsed));
    output::print(&out)
}

/// Prints what is wrong (stdout); the one-line reason goes to stderr with exit code 1.
fn report_damage(args: &VerifyArgs, problems: &[String]) -> Result<(), CliError> {
    if args.json {
        let out = json!({
            "file": args.file.display().to_string(),
            "ok": false,
            "problems": problems,
        });
        return output::print(&format!("{out}\n"));
    }
    let mut out = format!("verify {}: DAMAGED\n", args.file.display());
    for p in problems.iter().take(PROBLEMS_SHOWN) {
        let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push_str(&format!("  {p}\n"));
    }
    if problems.len() > PROBLEMS_SHOWN {
        out.push_str(&format!(
            "  ... and {} more\n",
            count((problems.len() - PROBLEMS_SHOWN) as u64)
        ));
    }
    output::print(&out)
}
