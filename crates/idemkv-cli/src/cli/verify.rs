//! `idemkv verify FILE`: checks a file end to end, without changing it.
//!
//! 1. redb's integrity check: every page checksum of the file, when no service has the file
//!    open (redb runs it in a copy-on-write view: see `idemkv::admin::FileReader`).
//! 2. Every record read back in full from one snapshot, its checksum (which covers its
//!    token) verified and its response decoded.
//! 3. Consistency: tokens unique and below the durable token mark, keys unique, attempts
//!    above 0.
//!
//! Nothing is recovered, reclaimed or taken over in the file. Exit codes: 0 clean,
//! 1 damaged (with the reason), 2 could not verify (missing, locked, not an idemkv file,
//! I/O error).

use crate::cli::error::CliError;
use crate::cli::file;
use crate::cli::output::{self, count, duration};
use crate::cli::records::{printable, state_name};
use crate::cli::stats::bytes;
use idemkv::admin::RecordInfoState;
use idemkv::OpenError;
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
    let damaged = |e: OpenError| -> Result<(), CliError> {
        let detail = match e {
            OpenError::Corrupted { detail } => detail,
            other => other.to_string(),
        };
        let why = format!("{} is corrupted: {detail}", args.file.display());
        report_damage(args, std::slice::from_ref(&why))?;
        Err(CliError::negative(why))
    };
    let reader = match file::read_unchecked(&args.file, true) {
        Ok(reader) => reader,
        Err(e @ (OpenError::Corrupted { .. } | OpenError::HeaderDamaged { .. })) => {
            return damaged(e)
        }
        Err(e) => return Err(file::open_error(&args.file, e)),
    };
    let (live, pages_verified) = (reader.is_live(), reader.pages_verified());
    let snapshot = match reader.snapshot() {
        Ok(snapshot) => snapshot,
        Err(e @ OpenError::Corrupted { .. }) => return damaged(e),
        Err(e) => return Err(file::open_error(&args.file, e)),
    };
    drop(reader);
    let records = snapshot.records;
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
                "{} (token {}) is {}, which a file cannot hold",
                printable(&r.key),
                r.token,
                r.state_name()
            )),
        }
        if r.token >= snapshot.token_hwm {
            problems.push(format!(
                "{} has token {}, not below the durable token mark {}: fencing could repeat it",
                printable(&r.key),
                r.token,
                snapshot.token_hwm
            ));
        }
        if !tokens.insert(r.token) {
            problems.push(format!("token {} is used by two records", r.token));
        }
        if !keys.insert(r.key.as_slice()) {
            problems.push(format!("{} has two records", printable(&r.key)));
        }
        if r.attempt == 0 {
            problems.push(format!(
                "{} (token {}) has attempt 0",
                printable(&r.key),
                r.token
            ));
        }
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
            "token_next": snapshot.token_next,
            "token_hwm": snapshot.token_hwm,
            "pages_verified": pages_verified,
            "live": live,
            "elapsed_ms": elapsed.as_millis() as u64,
        });
        return output::print(&format!("{out}\n"));
    }
    let mut out = format!("verify {}: ok\n", args.file.display());
    let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<17} {v}\n"));
    line(
        "redb pages",
        if pages_verified {
            "every page checksum verified".into()
        } else {
            "not checked: a service has the file open (stop it for a full check)".into()
        },
    );
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
        "tokens unique and below the durable token mark, keys unique".into(),
    );
    line("next token", count(snapshot.token_next));
    if live {
        line(
            "seen",
            "the last commit of the service that has the file open".into(),
        );
    }
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
