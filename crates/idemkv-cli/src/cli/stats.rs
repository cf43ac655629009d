//! `idemkv stats FILE`: what a file holds, as a table or JSON. Read-only: the file is not
//! changed, and a running service's file can be read (its last commit is shown).

use crate::cli::error::CliError;
use crate::cli::file;
use crate::cli::output::{self, count, Table};
use crate::cli::records::{self, state_name};
use idemkv::admin::RecordInfoState;
use serde_json::json;
use std::path::PathBuf;

/// Options of `idemkv stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatsArgs {
    /// The idemkv file (never created, never changed)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Print one JSON object with every counter instead of the table
    #[arg(long)]
    json: bool,
}

/// What `stats` shows.
struct Counts {
    /// InFlight records, abandoned ones included.
    inflight: u64,
    /// InFlight records whose holder is gone: every one in a file no service has open (the
    /// next open takes them over at once), and those whose lease is over in a live file.
    /// The sweeper reaps them `retention` after their lease ended.
    abandoned: u64,
    completed: u64,
    expired: u64,
    records: u64,
    token_hwm: u64,
    token_next: u64,
    live: bool,
    file_bytes: Option<u64>,
}

pub(crate) fn run(args: &StatsArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    let reader = file::read(&args.file, false)?;
    let snapshot = reader
        .snapshot()
        .map_err(|e| file::open_error(&args.file, e))?;
    let now = file::now_ms();
    let mut c = Counts {
        inflight: 0,
        abandoned: 0,
        completed: 0,
        expired: 0,
        records: snapshot.records.len() as u64,
        token_hwm: snapshot.token_hwm,
        token_next: snapshot.token_next,
        live: reader.is_live(),
        file_bytes: std::fs::metadata(&args.file).map(|m| m.len()).ok(),
    };
    drop(reader);
    for r in &snapshot.records {
        match state_name(r, now) {
            "inflight" => {
                c.inflight += 1;
                if !c.live
                    || matches!(r.state, RecordInfoState::InFlight { lease_deadline, .. }
                        if records::wall_ms(lease_deadline) <= now)
                {
                    c.abandoned += 1;
                }
            }
            "expired" => c.expired += 1,
            _ => c.completed += 1,
        }
    }
    if args.json {
        output::print(&format!("{}\n", to_json(args, &c)))
    } else {
        output::print(&text(args, &c))
    }
}

fn text(args: &StatsArgs, c: &Counts) -> String {
    let mut t = Table::new(&["", "value"]);
    let mut row = |name: &str, value: String| t.row(vec![name.to_string(), value]);
    row("keys in flight", count(c.inflight));
    row("  of which abandoned (lease over)", count(c.abandoned));
    row("keys completed", count(c.completed));
    row("expired, not yet swept", count(c.expired));
    row("keys total", count(c.records));
    if let Some(b) = c.file_bytes {
        row("file size", bytes(b));
    }
    row("next fencing token", count(c.token_next));
    row("token high-water mark", count(c.token_hwm));
    let source = if c.live {
        "the last commit of the service that has the file open (what it has not committed \
         yet is not shown)"
    } else {
        "the file as persisted (no service has it open)"
    };
    format!(
        "idemkv stats: {}\n\n{}\nShown: {source}. Nothing was changed; a service reclaims \
         the expired completions on its next sweep or open.\n--json prints every field.\n",
        args.file.display(),
        t.render()
    )
}

/// 1536 → "1.5 KiB (1,536 bytes)".
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64;
    let mut unit = "";
    for u in UNITS {
        v /= 1024.0;
        unit = u;
        if v < 1024.0 {
            break;
        }
    }
    format!("{v:.1} {unit} ({} bytes)", count(n))
}

fn to_json(args: &StatsArgs, c: &Counts) -> serde_json::Value {
    json!({
        "file": args.file.display().to_string(),
        "inflight": c.inflight,
        "abandoned": c.abandoned,
        "completed": c.completed,
        "expired_unswept": c.expired,
        "records": c.records,
        "file_bytes": c.file_bytes,
        "token_next": c.token_next,
        "token_hwm": c.token_hwm,
        "live": c.live,
    })
}
