//! `idemkv import FILE [-i IN]`: adds the records of an `export` (JSON lines) to FILE,
//! creating it if it does not exist.
//!
//! Fencing tokens are kept as they were, so the import must go into a file that has issued
//! no token at or above the smallest imported one (a fresh file), and in token order: the
//! lines are sorted by token first, and a file whose next token is already above the
//! smallest imported token is refused before anything changes. Every line is parsed before
//! anything is written: one malformed line and nothing is imported (exit 2). Records the
//! engine refuses (a key that already has a live record, a token out of order) are reported
//! by line number and the others imported (exit 1). Completions already past their
//! retention are skipped and counted.

use crate::cli::error::CliError;
use crate::cli::file::{self, How};
use crate::cli::output::{self, count};
use crate::cli::records::{self, printable, RecordLine};
use idemkv::admin::{RecordInfo, RecordInfoState};
use idemkv::error::ImportError;
use idemkv::ClaimError;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::io::Read;
use std::path::PathBuf;

/// Per-line problems printed one by one (the count covers them all).
const ERRORS_SHOWN: usize = 20;

/// Options of `idemkv import`.
#[derive(Debug, clap::Args)]
pub(crate) struct ImportArgs {
    /// The idemkv file to import into (created if missing; must be fresh, see above)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Read the JSON lines from IN instead of stdin
    #[arg(short, long, value_name = "IN")]
    input: Option<PathBuf>,

    /// Print one JSON object instead of text
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &ImportArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    let (source, text) = read_input(args)?;

    // Parse everything first: a malformed backup imports nothing.
    let mut records: Vec<(usize, RecordInfo)> = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<RecordLine>(line)
            .map_err(|e| e.to_string())
            .and_then(|l| l.to_record())
        {
            Ok(r) => records.push((number, r)),
            Err(e) => bad.push(format!("{source}:{number}: {e}")),
        }
    }
    if !bad.is_empty() {
        print_errors(&bad);
        return Err(CliError::usage(format!(
            "{} of {} lines of {source} are not valid records (see above); nothing was imported",
            count(bad.len() as u64),
            count((bad.len() + records.len()) as u64)
        )));
    }
    records.sort_by_key(|(_, r)| r.token);

    // One open only: every open reserves a block of tokens, so a check on a separate open
    // would move the mark it checks. (Opening reclaims completions past their retention,
    // which are Absent to every call anyway.)
    let engine = file::open(&args.file, How::LiveCreate)?;
    let token_next = engine.stats().token_next;
    if let Some((line, first)) = records.first() {
        if first.token < token_next {
            file::close(engine, &args.file)?;
            return Err(CliError::usage(format!(
                "the next token of {} is {}, above token {} of {source}:{line}: import into a \
                 fresh file (fencing needs imported tokens above every token the file has \
                 issued); nothing was imported",
                args.file.display(),
                token_next,
                first.token
            )));
        }
    }
    let now = file::now_ms();
    let (mut inflight, mut completed, mut expired) = (0u64, 0u64, 0u64);
    let mut refused = Vec::new();
    // Each record is committed before the next (the engine imports one at a time, in token
    // order), so a large import takes a while: show where it is (never drawn unless stderr
    // is a terminal).
    let pb =
        ProgressBar::with_draw_target(Some(records.len() as u64), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "  import [{bar:32}] {human_pos}/{human_len} records  eta {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    for (line, r) in &records {
        pb.inc(1);
        if let RecordInfoState::Completed { expires_at, .. } = r.state {
            if records::wall_ms(expires_at) <= now {
                expired += 1;
                continue;
            }
        }
        // Imports share group commits; a full writer queue is drained and the record retried.
        let mut result = engine.admin().import_queued(r);
        if matches!(result, Err(ImportError::Engine(ClaimError::Overloaded(_)))) {
            engine
                .flush()
                .map_err(|e| CliError::io(format!("importing into {}", args.file.display()), e))?;
            result = engine.admin().import_queued(r);
        }
        match result {
            Ok(()) if matches!(r.state, RecordInfoState::InFlight { .. }) => inflight += 1,
            Ok(()) => completed += 1,
            Err(e) => refused.push(format!(
                "{source}:{line}: {} (token {}): {e}",
                printable(&r.key),
                r.token
            )),
        }
    }
    pb.finish_and_clear();
    let flushed = engine.flush();
    file::close(engine, &args.file)?;
    flushed.map_err(|e| CliError::io(format!("importing into {}", args.file.display()), e))?;

    if args.json {
        let out = json!({
            "file": args.file.display().to_string(),
            "imported": inflight + completed,
            "inflight": inflight,
            "completed": completed,
            "skipped_expired": expired,
            "refused": refused.len(),
            "errors": refused,
        });
        output::print(&format!("{out}\n"))?;
    } else {
        print_errors(&refused);
        output::print(&format!(
            "imported {} records ({} inflight, {} completed) into {}; {} skipped past their \
             retention; {} refused\n",
            count(inflight + completed),
            count(inflight),
            count(completed),
            args.file.display(),
            count(expired),
            count(refused.len() as u64)
        ))?;
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(CliError::negative(format!(
            "{} of {} records were refused (listed above)",
            count(refused.len() as u64),
            count(records.len() as u64)
        )))
    }
}

fn read_input(args: &ImportArgs) -> Result<(String, String), CliError> {
    let mut bytes = Vec::new();
    let source = match &args.input {
        Some(path) => {
            bytes = std::fs::read(path)
                .map_err(|e| CliError::io(format!("reading {}", path.display()), e))?;
            path.display().to_string()
        }
        None => {
            std::io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .map_err(|e| CliError::io("reading stdin", e))?;
            "stdin".to_string()
        }
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        CliError::usage(format!(
            "{source} is not UTF-8 text (byte {}): not an idemkv export",
            e.utf8_error().valid_up_to()
        ))
    })?;
    Ok((source, text))
}

fn print_errors(errors: &[String]) {
    for e in errors.iter().take(ERRORS_SHOWN) {
        eprintln!(
            "idemkv: {}",
            e.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
    if errors.len() > ERRORS_SHOWN {
        eprintln!(
            "idemkv: ... and {} more",
            count((errors.len() - ERRORS_SHOWN) as u64)
        );
    }
}
