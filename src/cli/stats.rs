//! `idemkv stats FILE`: the engine's counters for a file, as a table or JSON.

use crate::cli::error::CliError;
use crate::cli::file::{self, How};
use crate::cli::output::{self, count, Table};
use idemkv::Stats;
use serde_json::json;
use std::path::PathBuf;

/// Options of `idemkv stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatsArgs {
    /// The idemkv file (never created)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Print one JSON object with every counter instead of the table
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &StatsArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    let engine = file::open(&args.file, How::Live)?;
    let stats = engine.stats();
    file::close(engine, &args.file)?;
    let file_bytes = std::fs::metadata(&args.file).map(|m| m.len()).ok();
    if args.json {
        output::print(&format!("{}\n", to_json(&stats, file_bytes)))
    } else {
        output::print(&text(args, &stats, file_bytes))
    }
}

fn text(args: &StatsArgs, s: &Stats, file_bytes: Option<u64>) -> String {
    let mut t = Table::new(&["", "value"]);
    let mut row = |name: &str, value: String| t.row(vec![name.to_string(), value]);
    // Every claim found in a closed file belongs to a process that is gone: it is taken
    // over at once, so it shows as abandoned (reaped `retention` after its lease ended).
    row("keys in flight", count(s.inflight + s.abandoned));
    row("  of which abandoned (lease over)", count(s.abandoned));
    row("keys completed", count(s.completed));
    row("expired, not yet swept", count(s.expired_unswept));
    row(
        "keys total",
        count(s.inflight + s.abandoned + s.completed + s.expired_unswept),
    );
    row("index memory", bytes(s.index_bytes));
    if let Some(b) = file_bytes {
        row("file size", bytes(b));
    }
    row("next fencing token", count(s.token_next));
    row("poisoned", if s.poisoned { "yes" } else { "no" }.into());
    format!(
        "idemkv stats: {}\n\n{}\nActivity counters (claims, replays, commits, ...) count since open: zero for \
         a file opened here.\n--json prints every field.\n",
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

fn to_json(s: &Stats, file_bytes: Option<u64>) -> serde_json::Value {
    json!({
        "inflight": s.inflight,
        "abandoned": s.abandoned,
        "abandoned_reaped": s.abandoned_reaped,
        "completed": s.completed,
        "expired_unswept": s.expired_unswept,
        "expirations": s.expirations,
        "index_bytes": s.index_bytes,
        "file_bytes": file_bytes,
        "claims": s.claims,
        "acquired": s.acquired,
        "takeovers": s.takeovers,
        "replays": s.replays,
        "in_progress": s.in_progress,
        "fingerprint_mismatches": s.fingerprint_mismatches,
        "completions": s.completions,
        "releases": s.releases,
        "leases_lost": s.leases_lost,
        "waits": s.waits,
        "overloaded": s.overloaded,
        "commits": s.commits,
        "committed_ops": s.committed_ops,
        "batch_max": s.batch_max,
        "queue_depth": s.queue_depth,
        "token_next": s.token_next,
        "poisoned": s.poisoned,
    })
}
