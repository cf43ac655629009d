//! `idemkv abandoned FILE`: lists the claims whose lease is over and that nobody completed
//! (their holder crashed, gave up, or failed them), old enough and idle long enough for a
//! background completer to finish them, with their checkpoints.
//!
//! Read-only (see `file.rs`): the records as persisted, a running service's last commit.
//! The library's way to the same list is `Admin::abandoned` on the engine itself (which
//! also sees what the service holds only in memory) or `FileReader::abandoned`.

use crate::cli::error::CliError;
use crate::cli::file;
use crate::cli::output::{self, count, Table};
use crate::cli::records::{self, printable, truncate};
use idemkv::admin::{AbandonedClaim, AbandonedQuery};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

/// Longest key shown in the table (the JSON has every byte).
const KEY_WIDTH: usize = 48;

/// Options of `idemkv abandoned`.
#[derive(Debug, clap::Args)]
pub(crate) struct AbandonedArgs {
    /// The idemkv file (never created)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Only claims whose key was first claimed at least this long ago (an unknown first
    /// claim counts as old enough): 30s, 10m, 2h, 1d, 1h30m
    #[arg(long, value_name = "DURATION", value_parser = records::parse_duration, default_value = "0s")]
    older_than: Duration,

    /// Only claims whose lease ended at least this long ago
    #[arg(long, value_name = "DURATION", value_parser = records::parse_duration, default_value = "0s")]
    idle: Duration,

    /// Show at most N claims, the earliest first claimed first
    #[arg(long, value_name = "N", default_value_t = 1000)]
    limit: usize,

    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &AbandonedArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    let query = AbandonedQuery::default()
        .older_than(args.older_than)
        .idle_for(args.idle)
        .limit(args.limit);
    let now = file::now_ms();
    let claims = file::read(&args.file, false)?
        .abandoned(&query, records::wall_time(now))
        .map_err(|e| file::open_error(&args.file, e))?;

    if args.json {
        let list: Vec<serde_json::Value> = claims.iter().map(|c| claim_json(c, now)).collect();
        let out = json!({
            "file": args.file.display().to_string(),
            "now_ms": now,
            "older_than_ms": millis(args.older_than),
            "idle_ms": millis(args.idle),
            "shown": claims.len(),
            "claims": list,
        });
        return output::print(&format!("{out}\n"));
    }
    let mut out = String::new();
    if claims.is_empty() {
        out.push_str("no abandoned claims\n");
    } else {
        let mut t = Table::new(&[
            "KEY",
            "TOKEN",
            "ATTEMPT",
            "FAILED",
            "FIRST CLAIMED",
            "LEASE ENDED",
            "CHECKPOINT",
        ])
        .left_align(&[3, 4, 5, 6]);
        for c in &claims {
            t.row(row(c, now));
        }
        out.push_str(&t.render());
    }
    out.push_str(&format!(
        "\n{} abandoned claims in {} (first claimed at least {} ago, idle at least {}).\n",
        count(claims.len() as u64),
        args.file.display(),
        output::duration(args.older_than),
        output::duration(args.idle),
    ));
    if !claims.is_empty() {
        out.push_str(
            "A completer finishes one by claiming its key (a takeover: attempt + 1, the \
             checkpoint handed over) and completing it. CHECKPOINT is phase/bytes.\n",
        );
    }
    output::print(&out)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn ago(t: Option<std::time::SystemTime>, now: u64) -> String {
    t.map_or("unknown".into(), |t| {
        records::left(records::wall_ms(t), now)
    })
}

fn row(c: &AbandonedClaim, now: u64) -> Vec<String> {
    vec![
        truncate(&printable(&c.key), KEY_WIDTH),
        c.token.to_string(),
        c.attempt.to_string(),
        if c.failed { "yes" } else { "no" }.into(),
        ago(c.first_claimed_at, now),
        ago(Some(c.lease_ended_at), now),
        c.checkpoint.as_ref().map_or("-".into(), |cp| {
            format!("{}/{}", cp.phase(), cp.data().len())
        }),
    ]
}

fn claim_json(c: &AbandonedClaim, now: u64) -> serde_json::Value {
    let ended = records::wall_ms(c.lease_ended_at);
    json!({
        "key": records::hex(&c.key),
        "key_text": String::from_utf8_lossy(&c.key),
        "token": c.token,
        "attempt": c.attempt,
        "fingerprint": records::fingerprint(c.fingerprint),
        "failed": c.failed,
        "first_claimed_ms": records::opt_ms(c.first_claimed_at),
        "attempt_started_ms": records::opt_ms(c.attempt_started_at),
        "lease_ended_ms": ended,
        "idle_ms": now.saturating_sub(ended),
        "checkpoint": c.checkpoint.as_ref().map(|cp| json!({
            "phase": cp.phase(),
            "data": records::hex(cp.data()),
        })),
    })
}
