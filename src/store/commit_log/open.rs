//! The log beside its file: its path, opening it with a store (replaying what the file
//! lacks, then a checkpoint), and the read-only open's check that nothing is pending.

use super::payload::OwnedWrite;
use super::replay::{pending, replay};
use super::{prepare, CommitLog, MacKey, ReplayError};
use crate::base::limits::HASH_SECRET_LEN;
use crate::model::error::OpenError;
use crate::store::backend::Storage;
use crate::store::batch::Batch;
use crate::store::config::StoreConfig;
use crate::store::constants::LOG_BYTES;
use crate::store::log_file::{Access, LogFile};
use crate::store::log_state::LogState;
use crate::store::storage::Write;
use crate::store::storage::{Durable, Store};
use std::io;
use std::path::{Path, PathBuf};

/// The commit log's file for the database file at `path`: `<path>-log`.
pub(crate) fn log_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push("-log");
    PathBuf::from(name)
}

/// Opens the commit log of a freshly opened store: applies the frames of the current epoch
/// that it holds, then starts a new epoch with a checkpoint (so an open never writes
/// frames of an epoch that earlier frames may share). Returns the log for the writer when
/// the builder asks for one; otherwise a log found is applied, and a file's log removed.
pub(crate) fn open(b: &StoreConfig, store: &Store) -> Result<Option<CommitLog>, OpenError> {
    let state = store.log_state()?;
    let file = match (&b.log_backend, &b.path, b.backend.is_some()) {
        (Some(slot), _, _) => Some((slot.take()?, None)),
        (None, Some(path), false) => {
            let path = log_path(path);
            // A log the file says an engine was appending to is never created afresh: its
            // frames may be the only copy of acknowledged commits.
            let access = match b.logged && (!state.active || path.exists()) {
                true => Access::Create,
                false => Access::Write,
            };
            LogFile::open(&path, access, b.file_mode)?.map(|f| {
                let storage: Box<dyn Storage> = Box::new(f);
                (storage, Some(path))
            })
        }
        _ => None,
    };
    let Some((storage, path)) = file else {
        return match state.active {
            true => Err(missing(b.path.as_deref().map(log_path))),
            false => Ok(None),
        };
    };
    let named = path
        .clone()
        .unwrap_or_else(|| PathBuf::from("<log backend>"));
    let key = MacKey::from_secret(&store.hash_secret()?);
    let image = read_all(&*storage).map_err(OpenError::Io)?;
    let epoch = state.epoch;
    // The frames the file misses (at most the log's size of them, in memory), applied in
    // order in the checkpoint's own commit: one durable commit for the whole replay.
    let mut missed = Vec::new();
    let applied = replay(&image, &key, state, |batch, _| {
        missed.push(batch);
        Ok::<_, OpenError>(())
    })?;
    if let Err(ReplayError::Damaged(why)) = applied {
        return Err(OpenError::Corrupted {
            detail: format!("the commit log {}: {why}", named.display()),
        });
    }
    let next = epoch.checked_add(1).ok_or_else(|| OpenError::Corrupted {
        detail: "the commit log's epoch is at its limit".into(),
    })?;
    let checkpoint = Durable::Checkpoint {
        epoch: next,
        active: b.logged,
    };
    let writes: Vec<Write> = missed
        .iter()
        .flat_map(|batch| batch.writes.iter().map(OwnedWrite::borrow))
        .collect();
    let tables: Vec<&Batch> = missed
        .iter()
        .flat_map(|batch| batch.tables.iter())
        .collect();
    // The token mark only rises: the last frame's that carries one is the highest.
    let hwm = missed.iter().filter_map(|batch| batch.hwm).max();
    store.commit_on_open(&writes, &tables, hwm, checkpoint)?;
    if b.logged {
        match prepare(&*storage) {
            Ok(()) => {
                if let Some(path) = &path {
                    // The log's directory entry must be durable before a frame in it is
                    // acknowledged.
                    crate::store::storage::sync_dir(path).map_err(OpenError::Io)?;
                }
                return Ok(Some(CommitLog::new(storage, key, next)));
            }
            // No room for the log's 16 MiB: the engine runs without it, its group commits
            // durable redb commits, where redb alone would open. The file must say so
            // before the log goes (a file whose active log is missing is refused).
            Err(e) if e.kind() == io::ErrorKind::StorageFull => {
                let inactive = Durable::Checkpoint {
                    epoch: next,
                    active: false,
                };
                store.commit_on_open(&[], &[], None, inactive)?;
            }
            Err(e) => return Err(OpenError::Io(e)),
        }
    }
    let _ = storage.close();
    drop(storage);
    if let Some(path) = path {
        // Everything the log held is in the file, under a checkpoint: the log is empty (or
        // was never filled).
        std::fs::remove_file(&path).map_err(OpenError::Io)?;
        crate::store::storage::sync_dir(&path).map_err(OpenError::Io)?;
    }
    Ok(None)
}

/// The file says an engine was writing a commit log that cannot be found: acknowledged
/// commits may be in it alone.
fn missing(path: Option<PathBuf>) -> OpenError {
    let log = match &path {
        Some(path) => path.display().to_string(),
        None => "(a log_backend)".to_string(),
    };
    OpenError::Corrupted {
        detail: format!(
            "the file was last written by an engine with a commit log that was not closed, \
             and its log {log} is missing: acknowledged commits may be in the log alone; \
             nothing was changed: put the log back beside the file (or pass it as \
             log_backend), then open again"
        ),
    }
}

/// Refuses a read-only open of the file at `path` (in `state`) when its commit log holds
/// commits the file does not have, or is missing while the file says it was in use.
pub(crate) fn check_beside(
    path: &Path,
    store_secret: &[u8; HASH_SECRET_LEN],
    state: LogState,
) -> Result<(), OpenError> {
    let log = log_path(path);
    let Some(file) = LogFile::open(&log, Access::Read, 0)? else {
        return match state.active {
            true => Err(missing(Some(log))),
            false => Ok(()),
        };
    };
    let image = read_all(&file).map_err(OpenError::Io)?;
    match pending(&image, &MacKey::from_secret(store_secret), state) {
        true => Err(OpenError::UnappliedLog { path: log }),
        false => Ok(()),
    }
}

fn read_all(storage: &dyn Storage) -> io::Result<Vec<u8>> {
    let len = usize::try_from(storage.len()?.min(LOG_BYTES)).unwrap_or(0);
    let mut image = vec![0u8; len];
    storage.read(0, &mut image)?;
    Ok(image)
}
