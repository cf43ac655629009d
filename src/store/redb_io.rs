//! The boundary between redb and the engine's storage: the adapter that lets redb run on
//! any [`Storage`] (the file, or a fault-injecting one in tests), the file storage itself,
//! and how redb's errors read as the engine's open errors.

use crate::base::sync::Arc;
use crate::model::error::OpenError;
use crate::store::backend::{LockKind, Storage};
use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Adapts a user's [`Storage`] to redb. Only whole-storage locks are offered (redb's
/// exclusive-writer mode asks for nothing else); any other range is unsupported, which redb
/// answers by falling back to a whole-storage lock.
#[derive(Debug)]
pub(crate) struct Adapter(pub(crate) Arc<dyn Storage>);

/// Whether a lock range covers the whole storage, as redb's whole-storage fallback asks.
fn whole(start: Bound<u64>, end: Bound<u64>) -> bool {
    matches!(
        (start, end),
        (Bound::Unbounded | Bound::Included(0), Bound::Unbounded)
    )
}

impl Adapter {
    fn try_lock(&self, s: Bound<u64>, e: Bound<u64>, kind: LockKind) -> Result<bool, BackendError> {
        if !whole(s, e) {
            return Err(BackendError::Unsupported);
        }
        self.0.try_lock(kind).map_err(BackendError::Io)
    }
}

impl StorageBackend for Adapter {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.0.write(offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.0.close()
    }
    fn try_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.try_lock(s, e, LockKind::Exclusive)
    }
    fn try_lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.try_lock(s, e, LockKind::Shared)
    }
    fn unlock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        if !whole(s, e) {
            return Err(BackendError::Unsupported);
        }
        self.0.unlock().map_err(BackendError::Io)
    }
}

/// Runs `f`, turning a panic inside redb (possible on a damaged file) into an error.
pub(crate) fn contain<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        format!("{what}: redb panicked: {msg}")
    })
}

/// A panic inside redb while it read the file: the file is damaged.
pub(crate) fn panicked(detail: String) -> OpenError {
    OpenError::Corrupted { detail }
}

/// An I/O error as an open reports it. A read past the end means the file's own pointers
/// are damaged; every other error is the operating system's, reported as it is.
pub(crate) fn io_open_error(io: io::Error) -> OpenError {
    if io.kind() == io::ErrorKind::UnexpectedEof {
        OpenError::Corrupted {
            detail: format!("the file points past its end ({io})"),
        }
    } else {
        OpenError::Io(io)
    }
}

pub(crate) fn backend_io(e: BackendError) -> io::Error {
    match e {
        BackendError::Io(io) => io,
        BackendError::Other(other) => io::Error::other(other),
        BackendError::Unsupported => io::Error::new(
            io::ErrorKind::Unsupported,
            "the storage backend does not support this operation",
        ),
        other => io::Error::other(other.to_string()),
    }
}

/// Maps any redb error met while opening or reading the file: I/O stays I/O (with the
/// `io::Error` as its source), a lock held elsewhere is `AlreadyOpen`, and only what redb
/// found wrong in the file itself is `Corrupted`.
pub(crate) fn open_error(path: &Path, e: impl Into<redb::Error>) -> OpenError {
    match e.into() {
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => {
            OpenError::AlreadyOpen {
                path: path.to_path_buf(),
            }
        }
        redb::Error::UpgradeRequired(v) => OpenError::Foreign {
            detail: format!("redb file format {v} needs an upgrade this build cannot do"),
        },
        // redb refuses a file without its magic this way; the checks before it make that a
        // file that changed under the open.
        redb::Error::Io(io) if io.kind() == io::ErrorKind::InvalidData => OpenError::Foreign {
            detail: format!("{}: {io}", path.display()),
        },
        redb::Error::Io(io) => io_open_error(io),
        redb::Error::PreviousIo => OpenError::Io(io::Error::other(
            "an earlier I/O error on this file stopped redb",
        )),
        redb::Error::Backend(other) => OpenError::Io(io::Error::other(other)),
        redb::Error::Unsupported => OpenError::Io(io::Error::new(
            io::ErrorKind::Unsupported,
            "the storage backend does not support an operation redb needs",
        )),
        e @ (redb::Error::TableTypeMismatch { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_)
        | redb::Error::TypeDefinitionChanged { .. }
        | redb::Error::TableDoesNotExist(_)) => OpenError::Corrupted {
            detail: format!("a table definition of the file does not decode: {e}"),
        },
        other => OpenError::Corrupted {
            detail: other.to_string(),
        },
    }
}

pub(crate) fn file_backend(file: File, path: &Path) -> Result<FileBackend, OpenError> {
    #[allow(clippy::useless_conversion)]
    FileBackend::new(file).map_err(|e| open_error(path, e))
}

/// A file at a path through redb's file backend, with its locks: the medium of
/// `FaultyStorage::file`. The whole-storage lock is redb's lock of the whole range, so it
/// conflicts with an engine that opened the same path itself.
#[derive(Debug)]
pub(crate) struct FileStorage(FileBackend);

impl FileStorage {
    /// Opens the file at `path` for reading and writing, created if missing.
    pub(crate) fn open(path: &Path) -> io::Result<FileStorage> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        #[allow(clippy::useless_conversion)]
        FileBackend::new(file)
            .map(FileStorage)
            .map_err(|e| io::Error::other(e.to_string()))
    }
}

impl Storage for FileStorage {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write(offset, data)
    }
    fn close(&self) -> io::Result<()> {
        self.0.close()
    }
    fn try_lock(&self, kind: LockKind) -> io::Result<bool> {
        let (a, b) = (Bound::Unbounded, Bound::Unbounded);
        match kind {
            LockKind::Shared => self.0.try_lock_shared_range(a, b),
            LockKind::Exclusive => self.0.try_lock_range(a, b),
        }
        .map_err(lock_io)
    }
    fn unlock(&self) -> io::Result<()> {
        let (a, b) = (Bound::Unbounded, Bound::Unbounded);
        self.0.unlock_range(a, b).map_err(lock_io)
    }
}

/// A lock error of redb's file backend as the I/O error [`Storage`] reports.
fn lock_io(e: BackendError) -> io::Error {
    match e {
        BackendError::Io(io) => io,
        BackendError::Unsupported => io::Error::from(io::ErrorKind::Unsupported),
        other => io::Error::other(other.to_string()),
    }
}
