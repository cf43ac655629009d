//! `idemkv inspect FILE`: lists the records of a file, filtered by key prefix, state and
//! deadline, as a table or JSON.
//!
//! The file is read without being changed (see `file.rs`; a running service's file shows
//! its last commit): every record is listed as persisted, including completions past their
//! retention that no sweep has reclaimed yet (state `expired`), with their exact deadlines.

use crate::cli::error::CliError;
use crate::cli::file;
use crate::cli::output::{self, count, Table};
use crate::cli::records::{self, deadline_ms, printable, state_name, truncate, unhex};
use idemkv::admin::{RecordInfo, RecordInfoState};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

/// Longest key shown in the table (the JSON has every byte).
const KEY_WIDTH: usize = 48;

/// Options of `idemkv inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct InspectArgs {
    /// The idemkv file (never created)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Only keys that start with this prefix
    #[arg(long, value_name = "P")]
    prefix: Option<String>,

    /// The prefix is hex (for binary keys)
    #[arg(long, requires = "prefix")]
    hex: bool,

    /// Only records in this state (expired: completions past their retention, still in the
    /// file until a sweep or an open reclaims them)
    #[arg(long, value_enum)]
    state: Option<StateArg>,

    /// Only records whose deadline (end of the lease, or of retention) comes within this
    /// duration, or has passed: 30s, 10m, 2h, 1d, 1h30m
    #[arg(long, value_name = "DURATION", value_parser = records::parse_duration)]
    expiring_within: Option<Duration>,

    /// Show at most N records (the first in token order)
    #[arg(long, value_name = "N")]
    limit: Option<usize>,

    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,
}

/// `--state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StateArg {
    /// Claimed, not completed
    Inflight,
    /// Completed, within retention
    Completed,
    /// Completed, past retention, not yet reclaimed
    Expired,
}

impl StateArg {
    fn name(self) -> &'static str {
        match self {
            StateArg::Inflight => "inflight",
            StateArg::Completed => "completed",
            StateArg::Expired => "expired",
        }
    }
}

pub(crate) fn run(args: &InspectArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    let prefix = match (&args.prefix, args.hex) {
        (None, _) => None,
        (Some(p), false) => Some(p.as_bytes().to_vec()),
        (Some(p), true) => {
            Some(unhex(p).map_err(|e| CliError::usage(format!("--prefix is not hex: {e}")))?)
        }
    };
    let all = file::read(&args.file, false)?
        .snapshot()
        .map_err(|e| file::open_error(&args.file, e))?
        .records;

    let now = file::now_ms();
    let horizon = args
        .expiring_within
        .map(|d| now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
    let matching: Vec<&RecordInfo> = all
        .iter()
        .filter(|r| prefix.as_ref().is_none_or(|p| r.key.starts_with(p)))
        .filter(|r| args.state.is_none_or(|s| state_name(r, now) == s.name()))
        .filter(|r| horizon.is_none_or(|h| deadline_ms(r) <= h))
        .collect();
    let shown = &matching[..args.limit.unwrap_or(usize::MAX).min(matching.len())];

    if args.json {
        let list: Vec<serde_json::Value> = shown.iter().map(|r| record_json(r, now)).collect();
        let out = json!({
            "file": args.file.display().to_string(),
            "now_ms": now,
            "records_in_file": all.len(),
            "matching": matching.len(),
            "shown": shown.len(),
            "records": list,
        });
        return output::print(&format!("{out}\n"));
    }

    let mut out = String::new();
    if shown.is_empty() {
        out.push_str("no matching records\n");
    } else {
        let mut t = Table::new(&[
            "KEY",
            "STATE",
            "TOKEN",
            "ATTEMPT",
            "FINGERPRINT",
            "DEADLINE (UTC)",
            "LEFT",
            "CHECKPOINT",
            "RESPONSE",
        ])
        .left_align(&[1, 4, 5]);
        for r in shown {
            t.row(row(r, now));
        }
        out.push_str(&t.render());
    }
    out.push_str(&format!(
        "\n{} of {} matching records shown; {} records in {} (by state: {}).\n",
        count(shown.len() as u64),
        count(matching.len() as u64),
        count(all.len() as u64),
        args.file.display(),
        by_state(&all, now)
    ));
    if !shown.is_empty() {
        out.push_str(
            "DEADLINE is the end of the lease (inflight) or of retention (completed); \
             CHECKPOINT is phase/bytes.\n",
        );
    }
    output::print(&out)
}

fn by_state(all: &[RecordInfo], now: u64) -> String {
    let mut counts: Vec<(&str, u64)> = Vec::new();
    for r in all {
        let name = state_name(r, now);
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => counts.push((name, 1)),
        }
    }
    if counts.is_empty() {
        return "none".into();
    }
    counts.sort();
    counts
        .iter()
        .map(|(n, c)| format!("{} {n}", count(*c)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn row(r: &RecordInfo, now: u64) -> Vec<String> {
    let deadline = deadline_ms(r);
    let (checkpoint, response) = match &r.state {
        RecordInfoState::InFlight { checkpoint, .. } => (
            checkpoint.as_ref().map_or("-".into(), |(phase, data)| {
                format!("{phase}/{}", data.len())
            }),
            "-".into(),
        ),
        RecordInfoState::Completed { response, .. } => {
            ("-".into(), format!("{} B", count(response.len() as u64)))
        }
        _ => ("-".into(), "-".into()),
    };
    // A scoped key shows its scope in brackets before it (the JSON has them apart).
    let key = if r.scope.is_empty() {
        printable(&r.key)
    } else {
        format!("[{}] {}", printable(&r.scope), printable(&r.key))
    };
    let state = match &r.state {
        RecordInfoState::InFlight { failed: true, .. } => format!("{}, failed", state_name(r, now)),
        _ => state_name(r, now).into(),
    };
    vec![
        truncate(&key, KEY_WIDTH),
        state,
        r.token.to_string(),
        r.attempt.to_string(),
        records::fingerprint(r.fingerprint).unwrap_or_else(|| "-".into()),
        records::utc(deadline, false),
        records::left(deadline, now),
        checkpoint,
        response,
    ]
}

/// One record in `inspect --json`: the export fields without the response bytes, plus
/// what the table shows.
fn record_json(r: &RecordInfo, now: u64) -> serde_json::Value {
    let deadline = deadline_ms(r);
    let mut v = json!({
        "key": records::hex(&r.key),
        "key_text": String::from_utf8_lossy(&r.key),
        "scope": records::hex(&r.scope),
        "state": state_name(r, now),
        "token": r.token,
        "attempt": r.attempt,
        "fingerprint": records::fingerprint(r.fingerprint),
        "deadline_utc": records::utc(deadline, true),
        "left_ms": records::signed_left_ms(deadline, now),
    });
    v["first_claimed_ms"] = json!(records::opt_ms(r.first_claimed_at));
    match &r.state {
        RecordInfoState::InFlight {
            lease_deadline,
            checkpoint,
            attempt_started_at,
            failed,
            ..
        } => {
            v["attempt_started_ms"] = json!(records::opt_ms(*attempt_started_at));
            v["failed"] = json!(failed);
            v["lease_deadline_ms"] = json!(records::wall_ms(*lease_deadline));
            v["checkpoint"] = match checkpoint {
                Some((phase, data)) => json!({ "phase": phase, "bytes": data.len() }),
                None => serde_json::Value::Null,
            };
        }
        RecordInfoState::Completed {
            response,
            expires_at,
            ..
        } => {
            v["expires_at_ms"] = json!(records::wall_ms(*expires_at));
            v["response_bytes"] = json!(response.len());
        }
        _ => {}
    }
    v
}
