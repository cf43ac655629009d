//! Opening an idemkv file for the operator subcommands, with one-line errors for the usual
//! failures (missing, locked by a running service, corrupted, foreign, I/O), and temporary
//! directories for the commands that make their own file (`demo`, `bench`).
//!
//! The commands that only look (`stats`, `inspect`, `get`, `verify`, `export`) use
//! [`read`]: an [`idemkv::admin::FileReader`], which never changes a byte of the file and works on
//! the file of a running service (it sees the service's last commit). The commands that
//! change the file (`release`, `sweep`, `import`) open an engine, as a service would:
//!
//! - [`How::Live`]: the real clock. Recovery reclaims the completions past their retention
//!   (that is what a service does on open too).
//! - [`How::Snapshot`]: a clock frozen at the UNIX epoch, with leases honoured. Recovery
//!   then keeps every record and deletes nothing, and a deadline the engine reports back is
//!   `wall + (deadline_mono - now_mono)`: a completion's is the one persisted in the file,
//!   but a lease is honoured only up to the length its holder was given (from the epoch,
//!   as the frozen clock reads it), so `release` shows the lease end it reads from the file
//!   before opening. Only calls that persist no time may run on a snapshot:
//!   reads, `force_release` (which writes a deletion) and closing. Claims, completions and
//!   imports stamp wall times into the file and must use [`How::Live`].
//!
//! An engine's open writes to the file (redb's recovery, the engine's durable token mark);
//! a reader's does not.

use crate::cli::error::CliError;
use idemkv::admin::FileReader;
use idemkv::error::OpenErrorKind;
use idemkv::{Clock, Engine, OpenError, Recovery};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest key, response and checkpoint any engine accepts (the builder's upper
/// limits), so that a file written with raised limits is still readable and importable.
const KEY_LEN_LIMIT: usize = 4096;
const RESPONSE_LEN_LIMIT: usize = 64 << 20;
const CHECKPOINT_LEN_LIMIT: usize = 16 << 20;

/// How a subcommand opens the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// The real clock; the file must exist.
    Live,
    /// The real clock; a missing or empty file is created (import).
    LiveCreate,
    /// The frozen clock (see the module docs); the file must exist.
    Snapshot,
}

/// A clock stopped at the UNIX epoch (monotonic zero, wall time the epoch).
#[derive(Debug)]
struct Frozen;

impl Clock for Frozen {
    fn monotonic(&self) -> Duration {
        Duration::ZERO
    }

    fn wall(&self) -> SystemTime {
        UNIX_EPOCH
    }
}

/// Wall-clock milliseconds since the UNIX epoch, now.
pub(crate) fn now_ms() -> u64 {
    crate::cli::records::wall_ms(SystemTime::now())
}

/// Checks that `path` is an existing, non-empty regular file, without creating anything.
pub(crate) fn check_exists(path: &Path) -> Result<(), CliError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(CliError::usage(format!(
            "{} is a directory, not an idemkv file",
            path.display()
        ))),
        Ok(m) if m.len() == 0 => Err(CliError::usage(format!(
            "{} is empty: not an idemkv file",
            path.display()
        ))),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CliError::usage(format!(
            "{}: no such file (nothing was created; check the path)",
            path.display()
        ))),
        Err(e) => Err(CliError::io(format!("cannot read {}", path.display()), e)),
    }
}

/// Opens the idemkv file at `path` with the sweeper off and `Immediate` durability.
pub(crate) fn open(path: &Path, how: How) -> Result<Engine, CliError> {
    if how != How::LiveCreate {
        check_exists(path)?;
    }
    open_unchecked(path, how).map_err(|e| open_error(path, e))
}

/// [`open`] without the existence check, returning the engine's own error.
pub(crate) fn open_unchecked(path: &Path, how: How) -> Result<Engine, OpenError> {
    let mut b = Engine::builder()
        .path(path)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .key_len_max(KEY_LEN_LIMIT)
        .response_len_max(RESPONSE_LEN_LIMIT)
        .checkpoint_len_max(CHECKPOINT_LEN_LIMIT);
    if how == How::Snapshot {
        b = b
            .clock(Frozen)
            .recovery(Recovery::HonourLeases)
            .lease(Duration::MAX);
    }
    b.open()
}

/// Opens the idemkv file at `path` read-only (see the module docs); `verify`: check every
/// redb page checksum too, when no service has the file open.
pub(crate) fn read(path: &Path, verify: bool) -> Result<FileReader, CliError> {
    check_exists(path)?;
    read_unchecked(path, verify).map_err(|e| open_error(path, e))
}

/// [`read`] without the existence check, returning the reader's own error.
pub(crate) fn read_unchecked(path: &Path, verify: bool) -> Result<FileReader, OpenError> {
    if verify {
        FileReader::open_verified(path)
    } else {
        FileReader::open(path)
    }
}

/// The one-line message for a failed open (exit code 2).
pub(crate) fn open_error(path: &Path, e: OpenError) -> CliError {
    let p = path.display();
    match e {
        OpenError::AlreadyOpen { .. } => CliError::usage(format!(
            "{p} is locked: another process has it open (a running service?); stop it first, \
             one process at a time can change an idemkv file"
        )),
        OpenError::Foreign { detail } if detail.contains(&p.to_string()) => {
            CliError::usage(format!("not an idemkv file: {detail}"))
        }
        OpenError::Foreign { detail } => {
            CliError::usage(format!("{p} is not an idemkv file: {detail}"))
        }
        OpenError::Corrupted { detail } => CliError::usage(format!(
            "{p} is corrupted: {detail}; restore it from a backup or move it aside"
        )),
        e @ OpenError::HeaderDamaged { .. } => CliError::usage(format!("{p} is corrupted: {e}")),
        e @ OpenError::Io(_) => {
            let what = match e.kind() {
                OpenErrorKind::DiskFull => "disk full",
                OpenErrorKind::PermissionDenied => "permission denied",
                _ => "I/O error",
            };
            CliError::io(format!("cannot open {p} ({what})"), e)
        }
        other => CliError::io(format!("cannot open {p}"), other),
    }
}

/// Closes the engine, making everything durable; a failure is an error of the command.
pub(crate) fn close(engine: Engine, path: &Path) -> Result<(), CliError> {
    engine
        .close()
        .map_err(|e| CliError::io(format!("closing {}", path.display()), e))
}

/// A directory `<base>/<prefix>-<random>` made for one run, removed when dropped unless
/// `keep`.
pub(crate) fn temp_dir(
    base: &Path,
    prefix: &str,
    keep: bool,
) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("{prefix}-"))
        .disable_cleanup(keep)
        .tempdir_in(base)
}
