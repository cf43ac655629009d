//! `idemkv get FILE KEY`: one key's state and stored response.
//!
//! Read-only: the file is not changed (a running service's file shows its last commit).
//! Exit codes: 0 the key has a live record (inflight or completed), 1 it is Absent (never
//! claimed, released, or past its retention), 2 an error.

use crate::cli::error::{CliError, EXIT_VIOLATION};
use crate::cli::file;
use crate::cli::output;
use crate::cli::records::{self, hex, printable, state_name, unhex};
use idemkv::admin::{RecordInfo, RecordInfoState};
use serde_json::json;
use std::io::Write as _;
use std::path::PathBuf;

/// Options of `idemkv get`.
#[derive(Debug, clap::Args)]
pub(crate) struct GetArgs {
    /// The idemkv file (never created)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// The key, as text (or as hex with --hex)
    #[arg(value_name = "KEY")]
    key: String,

    /// The scope the key lives in, as text (or as hex with --hex); default: unscoped
    #[arg(long, value_name = "SCOPE")]
    scope: Option<String>,

    /// KEY (and SCOPE) are hex (for binary keys; `inspect --json` prints every key as hex)
    #[arg(long)]
    hex: bool,

    /// Print one JSON object instead of text
    #[arg(long, conflicts_with = "raw")]
    json: bool,

    /// Write only the stored response, byte for byte (fails unless the key is completed)
    #[arg(long)]
    raw: bool,
}

/// Parses a `--scope` argument (text, or hex with `--hex`); none is the empty scope.
pub(crate) fn scope_arg(scope: Option<&str>, is_hex: bool) -> Result<Vec<u8>, CliError> {
    match scope {
        None => Ok(Vec::new()),
        Some(s) if is_hex => {
            unhex(s).map_err(|e| CliError::usage(format!("SCOPE is not hex: {e}")))
        }
        Some(s) => Ok(s.as_bytes().to_vec()),
    }
}

/// Parses a KEY argument: text, or hex with `--hex`.
pub(crate) fn key_arg(key: &str, is_hex: bool) -> Result<Vec<u8>, CliError> {
    let bytes = if is_hex {
        unhex(key).map_err(|e| CliError::usage(format!("KEY is not hex: {e}")))?
    } else {
        key.as_bytes().to_vec()
    };
    if bytes.is_empty() {
        return Err(CliError::usage("KEY is empty"));
    }
    Ok(bytes)
}

pub(crate) fn run(args: &GetArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    let key = key_arg(&args.key, args.hex)?;
    let scope = scope_arg(args.scope.as_deref(), args.hex)?;
    let reader = file::read(&args.file, false)?;
    let record = reader
        .get_scoped(&scope, &key)
        .map_err(|e| CliError::io(format!("reading {}", printable(&key)), e))?;
    drop(reader);
    let now = file::now_ms();
    // The file keeps completions past their retention until a sweep; to a service they are
    // Absent.
    let expired = matches!(&record, Some(r) if state_name(r, now) == "expired");
    let live = record.is_some() && !expired;

    if args.raw {
        return match &record {
            Some(RecordInfo {
                state: RecordInfoState::Completed { response, .. },
                ..
            }) if !expired => {
                let mut out = std::io::stdout().lock();
                match out.write_all(response).and_then(|()| out.flush()) {
                    Ok(()) => Ok(()),
                    Err(e) => crate::cli::error::write_failed(e).map_or(Ok(()), Err),
                }
            }
            _ => Err(CliError::negative(format!(
                "{} has no response: it is {}",
                printable(&key),
                name(&record, now)
            ))),
        };
    }
    if args.json {
        output::print(&format!("{}\n", to_json(&scope, &key, &record, now)))?;
    } else {
        output::print(&text(&scope, &key, &record, now))?;
    }
    if live {
        Ok(())
    } else {
        Err(CliError::silent(EXIT_VIOLATION))
    }
}

fn name(record: &Option<RecordInfo>, now: u64) -> &'static str {
    match record {
        None => "absent",
        Some(r) => state_name(r, now),
    }
}

fn text(scope: &[u8], key: &[u8], record: &Option<RecordInfo>, now: u64) -> String {
    let mut lines: Vec<(&str, String)> = Vec::new();
    if !scope.is_empty() {
        lines.push(("scope", printable(scope)));
    }
    lines.push(("key", printable(key)));
    match record {
        None => lines.push((
            "state",
            "absent (never claimed, released, or reclaimed after its retention)".into(),
        )),
        Some(r) => match &r.state {
            RecordInfoState::InFlight {
                lease_deadline,
                checkpoint,
                attempt_started_at,
                failed,
                ..
            } => {
                let deadline = records::wall_ms(*lease_deadline);
                lines.push((
                    "state",
                    if *failed {
                        "inflight, failed (its holder ended the attempt; the next claim                          takes it over with its checkpoint)"
                            .into()
                    } else {
                        "inflight (claimed, not completed)".into()
                    },
                ));
                lines.push(("token", r.token.to_string()));
                lines.push(("attempt", r.attempt.to_string()));
                lines.push(("first claim", records::instant(r.first_claimed_at, now)));
                lines.push(("attempt at", records::instant(*attempt_started_at, now)));
                lines.push((
                    if deadline <= now {
                        "lease ended"
                    } else {
                        "lease ends"
                    },
                    format!(
                        "{} ({})",
                        records::utc(deadline, true),
                        records::left(deadline, now)
                    ),
                ));
                lines.push((
                    "checkpoint",
                    match checkpoint {
                        None => "none".into(),
                        Some((phase, data)) => format!(
                            "phase {phase}, {} bytes: {}",
                            data.len(),
                            records::truncate(&printable(data), 200)
                        ),
                    },
                ));
            }
            RecordInfoState::Completed {
                response,
                expires_at,
                ..
            } => {
                let expires = records::wall_ms(*expires_at);
                lines.push((
                    "state",
                    if expires <= now {
                        "expired (past its retention: Absent to every call; the next sweep or \
                         open reclaims it)"
                            .into()
                    } else {
                        "completed".into()
                    },
                ));
                lines.push(("token", r.token.to_string()));
                lines.push(("attempt", r.attempt.to_string()));
                lines.push((
                    "expires",
                    format!(
                        "{} ({})",
                        records::utc(expires, true),
                        records::left(expires, now)
                    ),
                ));
                lines.push(("response", format!("{} bytes", response.len())));
            }
            _ => lines.push(("state", "unknown".into())),
        },
    }
    let mut out = String::new();
    for (k, v) in lines {
        out.push_str(&format!("{k:<11} {v}\n"));
    }
    if let Some(RecordInfo {
        state: RecordInfoState::Completed { response, .. },
        ..
    }) = record
    {
        out.push('\n');
        out.push_str(&printable(response));
        out.push('\n');
    }
    out
}

fn to_json(scope: &[u8], key: &[u8], record: &Option<RecordInfo>, now: u64) -> serde_json::Value {
    let mut v = json!({
        "key": hex(key),
        "key_text": String::from_utf8_lossy(key),
        "state": name(record, now),
    });
    if !scope.is_empty() {
        v["scope"] = json!(hex(scope));
        v["scope_text"] = json!(String::from_utf8_lossy(scope));
    }
    let Some(r) = record else { return v };
    v["token"] = json!(r.token);
    v["attempt"] = json!(r.attempt);
    v["fingerprint"] = json!(records::fingerprint(r.fingerprint));
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
            let lease_deadline_ms = records::wall_ms(*lease_deadline);
            v["lease_deadline_ms"] = json!(lease_deadline_ms);
            v["left_ms"] = json!(records::signed_left_ms(lease_deadline_ms, now));
            v["checkpoint"] = match checkpoint {
                Some((phase, data)) => json!({ "phase": phase, "data": hex(data) }),
                None => serde_json::Value::Null,
            };
        }
        RecordInfoState::Completed {
            response,
            expires_at,
            ..
        } => {
            let expires_at_ms = records::wall_ms(*expires_at);
            v["expires_at_ms"] = json!(expires_at_ms);
            v["left_ms"] = json!(records::signed_left_ms(expires_at_ms, now));
            v["response"] = json!(hex(response));
            v["response_text"] = json!(String::from_utf8_lossy(response));
        }
        _ => {}
    }
    v
}
