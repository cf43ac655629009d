//! `idemkv get FILE KEY`: one key's state and stored response.
//!
//! Exit codes: 0 the key has a live record (inflight or completed), 1 it is Absent (never
//! claimed, released, or past its retention), 2 an error.

use crate::cli::error::{CliError, EXIT_VIOLATION};
use crate::cli::file::{self, How};
use crate::cli::output;
use crate::cli::records::{self, hex, printable, unhex};
use idemkv::KeyState;
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

    /// KEY is hex (for binary keys; `inspect --json` prints every key as hex)
    #[arg(long)]
    hex: bool,

    /// Print one JSON object instead of text
    #[arg(long, conflicts_with = "raw")]
    json: bool,

    /// Write only the stored response, byte for byte (fails unless the key is completed)
    #[arg(long)]
    raw: bool,
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
    let engine = file::open(&args.file, How::Snapshot)?;
    let state = engine
        .get(&key)
        .map_err(|e| CliError::io(format!("reading {}", printable(&key)), e));
    file::close(engine, &args.file)?;
    let state = state?;
    let now = file::now_ms();
    // The snapshot keeps completions past their retention; to a service they are Absent.
    let expired = matches!(&state, Some(KeyState::Completed { expires_at, .. })
        if ms(expires_at) <= now);
    let live = state.is_some() && !expired;

    if args.raw {
        return match &state {
            Some(KeyState::Completed { response, .. }) if !expired => {
                let mut out = std::io::stdout().lock();
                match out.write_all(response).and_then(|()| out.flush()) {
                    Ok(()) => Ok(()),
                    Err(e) => crate::cli::error::write_failed(e).map_or(Ok(()), Err),
                }
            }
            _ => Err(CliError::negative(format!(
                "{} has no response: it is {}",
                printable(&key),
                name(&state, expired)
            ))),
        };
    }
    if args.json {
        output::print(&format!("{}\n", to_json(&key, &state, expired, now)))?;
    } else {
        output::print(&text(&key, &state, expired, now))?;
    }
    if live {
        Ok(())
    } else {
        Err(CliError::silent(EXIT_VIOLATION))
    }
}

fn ms(d: &std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn name(state: &Option<KeyState>, expired: bool) -> &'static str {
    match state {
        None => "absent",
        Some(KeyState::InFlight { .. }) => "inflight",
        Some(KeyState::Completing { .. }) => "completing",
        Some(KeyState::Completed { .. }) if expired => "expired",
        Some(KeyState::Completed { .. }) => "completed",
        Some(_) => "unknown",
    }
}

fn text(key: &[u8], state: &Option<KeyState>, expired: bool, now: u64) -> String {
    let mut lines: Vec<(&str, String)> = vec![("key", printable(key))];
    match state {
        None => lines.push((
            "state",
            "absent (never claimed, released, or reclaimed after its retention)".into(),
        )),
        Some(KeyState::InFlight {
            token,
            attempt,
            lease_remaining,
            checkpoint,
        }) => {
            let deadline = ms(lease_remaining);
            lines.push(("state", "inflight (claimed, not completed)".into()));
            lines.push(("token", token.to_string()));
            lines.push(("attempt", attempt.to_string()));
            lines.push((
                "lease ends",
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
                    Some(c) => format!(
                        "phase {}, {} bytes: {}",
                        c.phase(),
                        c.data().len(),
                        records::truncate(&printable(c.data()), 200)
                    ),
                },
            ));
        }
        Some(KeyState::Completed {
            token,
            attempt,
            response,
            expires_at,
        }) => {
            let expires = ms(expires_at);
            lines.push((
                "state",
                if expired {
                    "expired (past its retention: Absent to every call; the next sweep or open \
                     reclaims it)"
                        .into()
                } else {
                    "completed".into()
                },
            ));
            lines.push(("token", token.to_string()));
            lines.push(("attempt", attempt.to_string()));
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
        Some(KeyState::Completing { token }) => {
            lines.push(("state", "completing (not yet durable)".into()));
            lines.push(("token", token.to_string()));
        }
        Some(_) => lines.push(("state", "unknown".into())),
    }
    let mut out = String::new();
    for (k, v) in lines {
        out.push_str(&format!("{k:<11} {v}\n"));
    }
    if let Some(KeyState::Completed { response, .. }) = state {
        out.push('\n');
        out.push_str(&printable(response));
        out.push('\n');
    }
    out
}

fn to_json(key: &[u8], state: &Option<KeyState>, expired: bool, now: u64) -> serde_json::Value {
    let mut v = json!({
        "key": hex(key),
        "key_text": String::from_utf8_lossy(key),
        "state": name(state, expired),
    });
    match state {
        Some(KeyState::InFlight {
            token,
            attempt,
            lease_remaining,
            checkpoint,
        }) => {
            let deadline = ms(lease_remaining);
            v["token"] = json!(token);
            v["attempt"] = json!(attempt);
            v["lease_deadline_ms"] = json!(deadline);
            v["left_ms"] = json!(records::signed_left_ms(deadline, now));
            v["checkpoint"] = match checkpoint {
                Some(c) => json!({ "phase": c.phase(), "data": hex(c.data()) }),
                None => serde_json::Value::Null,
            };
        }
        Some(KeyState::Completed {
            token,
            attempt,
            response,
            expires_at,
        }) => {
            let expires = ms(expires_at);
            v["token"] = json!(token);
            v["attempt"] = json!(attempt);
            v["expires_at_ms"] = json!(expires);
            v["left_ms"] = json!(records::signed_left_ms(expires, now));
            v["response"] = json!(hex(response));
            v["response_text"] = json!(String::from_utf8_lossy(response));
        }
        Some(KeyState::Completing { token }) => v["token"] = json!(token),
        _ => {}
    }
    v
}
