//! `idemkv release FILE KEY`: force-releases a stuck claim (an InFlight record), whatever
//! its token, and prints the record as it was.
//!
//! The key becomes Absent: the next claim starts afresh (attempt 1, no checkpoint) instead
//! of taking the old claim over. Exit codes: 0 released, 1 nothing to release (the key is
//! absent or completed), 2 an error.
//!
//! The file is opened as a snapshot (see `file.rs`): a release writes only the deletion of
//! the record, no time, and the record printed carries its exact persisted lease deadline.

use crate::cli::error::{CliError, EXIT_VIOLATION};
use crate::cli::file::{self, How};
use crate::cli::get::{key_arg, scope_arg};
use crate::cli::output;
use crate::cli::records::{self, printable};
use idemkv::admin::{RecordInfo, RecordInfoState};
use idemkv::KeyState;
use serde_json::json;
use std::path::PathBuf;

/// Options of `idemkv release`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReleaseArgs {
    /// The idemkv file (never created)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// The key of the stuck claim, as text (or as hex with --hex)
    #[arg(value_name = "KEY")]
    key: String,

    /// The scope the key lives in, as text (or as hex with --hex); default: unscoped
    #[arg(long, value_name = "SCOPE")]
    scope: Option<String>,

    /// KEY (and SCOPE) are hex (for binary keys)
    #[arg(long)]
    hex: bool,

    /// Print one JSON object instead of text
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &ReleaseArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    let key = key_arg(&args.key, args.hex)?;
    let scope = scope_arg(args.scope.as_deref(), args.hex)?;
    let shown = if scope.is_empty() {
        printable(&key)
    } else {
        format!("{} in scope {}", printable(&key), printable(&scope))
    };
    // The record as the file holds it, read first: its lease end is shown as recorded.
    let recorded = file::read(&args.file, false)
        .ok()
        .and_then(|reader| reader.get_scoped(&scope, &key).ok().flatten());
    let engine = file::open(&args.file, How::Snapshot)?;
    let released = engine.admin().force_release_scoped(&scope, &key);
    // Why there was nothing to release, for the message.
    let now_state = match &released {
        Ok(None) => engine.get_scoped(&scope, &key).ok().flatten(),
        _ => None,
    };
    file::close(engine, &args.file)?;
    let released = released.map_err(|e| CliError::io(format!("releasing {shown}"), e))?;
    let now = file::now_ms();

    let Some(mut before) = released else {
        let why = match &now_state {
            None => "it is absent (never claimed, released, or reclaimed)".to_string(),
            Some(KeyState::Completed { expires_at, .. })
                if records::wall_ms(*expires_at) <= now =>
            {
                "it is completed and past its retention (Absent to every call)".to_string()
            }
            Some(KeyState::Completed { token, .. }) => {
                format!("it is completed (token {token}); a release never drops a completion")
            }
            Some(_) => "it is not in flight".to_string(),
        };
        if args.json {
            let mut out = json!({ "key": records::hex(&key), "released": false, "reason": why });
            if !scope.is_empty() {
                out["scope"] = json!(records::hex(&scope));
            }
            output::print(&format!("{out}\n"))?;
        } else {
            output::print(&format!("nothing to release: {shown}: {why}\n"))?;
        }
        return Err(CliError::silent(EXIT_VIOLATION));
    };

    // The snapshot's clock stands at the epoch, so the engine honours a lease only up to the
    // length its holder was given from then on: the end it reports for a lease recorded to
    // end later is not the recorded one. The recorded end of the same claim is shown.
    if let (
        RecordInfoState::InFlight { lease_deadline, .. },
        Some(RecordInfo {
            token,
            state:
                RecordInfoState::InFlight {
                    lease_deadline: in_file,
                    ..
                },
            ..
        }),
    ) = (&mut before.state, &recorded)
    {
        if *token == before.token {
            *lease_deadline = *in_file;
        }
    }
    if args.json {
        let mut record = json!({
            "state": "inflight",
            "token": before.token,
            "attempt": before.attempt,
            "fingerprint": records::fingerprint(before.fingerprint),
            "first_claimed_ms": records::opt_ms(before.first_claimed_at),
        });
        if let RecordInfoState::InFlight {
            lease_deadline,
            checkpoint,
            failed,
            ..
        } = &before.state
        {
            record["failed"] = json!(failed);
            record["lease_deadline_ms"] = json!(records::wall_ms(*lease_deadline));
            record["checkpoint"] = match checkpoint {
                Some((phase, data)) => json!({ "phase": phase, "data": records::hex(data) }),
                None => serde_json::Value::Null,
            };
        }
        let mut out = json!({ "key": records::hex(&key), "released": true, "before": record });
        if !scope.is_empty() {
            out["scope"] = json!(records::hex(&scope));
        }
        return output::print(&format!("{out}\n"));
    }
    let mut out = format!("released {shown}: it is now absent; the next claim starts afresh\n");
    out.push_str("the record before:\n");
    let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<11} {v}\n"));
    line("state", "inflight".into());
    line("token", before.token.to_string());
    line("attempt", before.attempt.to_string());
    line(
        "first claim",
        records::instant(before.first_claimed_at, now),
    );
    if let RecordInfoState::InFlight {
        lease_deadline,
        checkpoint,
        failed,
        ..
    } = &before.state
    {
        if *failed {
            line("failed", "yes (its holder ended the attempt)".into());
        }
        let lease_deadline_ms = records::wall_ms(*lease_deadline);
        line(
            if lease_deadline_ms <= now {
                "lease ended"
            } else {
                "lease ends"
            },
            format!(
                "{} ({})",
                records::utc(lease_deadline_ms, true),
                records::left(lease_deadline_ms, now)
            ),
        );
        line(
            "checkpoint",
            match checkpoint {
                None => "none (discarded with the claim)".into(),
                Some((phase, data)) => format!(
                    "phase {phase}, {} bytes (discarded with the claim): {}",
                    data.len(),
                    records::truncate(&printable(data), 120)
                ),
            },
        );
    }
    output::print(&out)
}
