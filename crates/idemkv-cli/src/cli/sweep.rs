//! `idemkv sweep FILE`: reclaims every completion past its retention, and every abandoned
//! claim past its lease end plus retention, now, and says how many.
//!
//! A service reclaims them on its own (the background sweeper, and recovery on open), so
//! this is for a file that sits closed. Opening with the real clock already reclaims them
//! (recovery deletes expired completions), and `sweep_now` takes whatever expires after, so
//! the count is taken from a snapshot open first (which reclaims nothing; see `file.rs`):
//! reclaimed = records before - records after.

use crate::cli::error::CliError;
use crate::cli::file::{self, How};
use crate::cli::output::{self, count};
use serde_json::json;
use std::path::PathBuf;

/// Options of `idemkv sweep`.
#[derive(Debug, clap::Args)]
pub(crate) struct SweepArgs {
    /// The idemkv file (never created)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Print one JSON object instead of text
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &SweepArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    let before = file::read(&args.file, false)?
        .snapshot()
        .map_err(|e| file::open_error(&args.file, e))?
        .records
        .len() as u64;
    let engine = file::open(&args.file, How::Live)?;
    let swept = engine.admin().sweep_now();
    let flushed = engine.flush();
    let after = engine.stats();
    file::close(engine, &args.file)?;
    swept.map_err(|e| CliError::io("sweeping", e))?;
    flushed.map_err(|e| CliError::io("sweeping", e))?;
    let inflight = after.inflight + after.abandoned;
    let remaining = inflight + after.completed + after.expired_unswept;
    let reclaimed = before.saturating_sub(remaining);

    if args.json {
        let out = json!({
            "file": args.file.display().to_string(),
            "reclaimed": reclaimed,
            "remaining": remaining,
            "inflight": inflight,
            "completed": after.completed,
        });
        return output::print(&format!("{out}\n"));
    }
    output::print(&format!(
        "swept {}: reclaimed {} records past their retention; {} remain ({} inflight, {} completed)\n",
        args.file.display(),
        count(reclaimed),
        count(remaining),
        count(inflight),
        count(after.completed)
    ))
}
