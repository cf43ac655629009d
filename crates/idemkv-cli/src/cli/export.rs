//! `idemkv export FILE [-o OUT]`: every live record as JSON lines (see `records.rs` for the
//! format), in token order, for backup and migration; `idemkv import` reads them back.
//!
//! The file is read without being changed (see `file.rs`; a running service's file gives
//! its last commit), so InFlight records keep their exact persisted lease deadlines and
//! nothing is taken over. Completions past their retention are Absent to every call and
//! are left out (the summary counts them). The output file is created owner-only (0600 on
//! unix): it holds every stored response.

use crate::cli::error::CliError;
use crate::cli::file;
use crate::cli::output::count;
use crate::cli::records::{state_name, RecordLine};
use idemkv::admin::RecordInfoState;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Options of `idemkv export`.
#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    /// The idemkv file (never created)
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Write to OUT (replaced atomically once complete) instead of stdout
    #[arg(short, long, value_name = "OUT")]
    output: Option<PathBuf>,
}

pub(crate) fn run(args: &ExportArgs) -> Result<(), CliError> {
    crate::cli::quiet_panics();
    if let Some(out) = &args.output {
        if same_file(out, &args.file) {
            return Err(CliError::usage(format!(
                "-o {} would overwrite the idemkv file itself",
                out.display()
            )));
        }
    }
    let records = file::read(&args.file, false)?
        .snapshot()
        .map_err(|e| file::open_error(&args.file, e))?
        .records;

    let now = file::now_ms();
    let mut text = String::new();
    let (mut inflight, mut completed, mut expired) = (0u64, 0u64, 0u64);
    for r in &records {
        if state_name(r, now) == "expired" {
            expired += 1;
            continue;
        }
        match r.state {
            RecordInfoState::InFlight { .. } => inflight += 1,
            _ => completed += 1,
        }
        let line = RecordLine::from_record(r).map_err(|e| CliError::io("exporting", e))?;
        let json = serde_json::to_string(&line).map_err(|e| CliError::io("exporting", e))?;
        text.push_str(&json);
        text.push('\n');
    }

    let target = match &args.output {
        None => {
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                if let Some(err) = crate::cli::error::write_failed(e) {
                    return Err(err);
                }
            }
            "stdout".to_string()
        }
        Some(path) => {
            write_atomically(path, text.as_bytes())
                .map_err(|e| CliError::io(format!("writing {}", path.display()), e))?;
            path.display().to_string()
        }
    };
    let skipped = match expired {
        0 => String::new(),
        n => format!("; {} completions past their retention left out", count(n)),
    };
    eprintln!(
        "idemkv: exported {} records ({} inflight, {} completed) from {} to {target}{skipped}",
        count(inflight + completed),
        count(inflight),
        count(completed),
        args.file.display()
    );
    Ok(())
}

/// Whether `a` and `b` name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Permission bits of an export: it holds every stored response, like the idemkv file.
#[cfg(unix)]
const EXPORT_FILE_MODE: u32 = 0o600;

/// Writes `bytes` to a temporary file beside `path`, syncs it, and renames it over `path`,
/// so a reader never sees a half-written backup.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "export".into());
    let tmp = path.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    let result = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, EXPORT_FILE_MODE);
        let file = options.open(&tmp)?;
        // The umask may have narrowed the mode, and a leftover partial file keeps its own.
        #[cfg(unix)]
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(
            EXPORT_FILE_MODE,
        ))?;
        let mut out = BufWriter::new(file);
        out.write_all(bytes)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
