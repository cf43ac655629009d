//! The commit log's own file (`<path>-log`, `commit_log/` says what it holds).
//!
//! Reads, and every write on a platform or file system without direct I/O, go through
//! redb's file backend, the same positioned reads and writes as the database file, made
//! durable by `fdatasync`. On Linux every write of whole blocks at a block's offset (each
//! frame, which the commit log pads to whole blocks, and the zeros written at creation) goes
//! through a second descriptor of the same file opened with `O_DIRECT | O_DSYNC`, from a
//! buffer aligned to the block: it reaches the device without the page cache and is
//! durable when it returns, so a frame costs one device write instead of a buffered write,
//! a writeback and a flush.
//!
//! Invariants:
//! - `sync_data` flushes whenever a write since the last sync went through the page cache,
//!   so a caller that writes then syncs gets durability on either path.
//! - A file system that refuses direct I/O (at open, or with `EINVAL` or `EOPNOTSUPP` on a
//!   write) turns the direct path off for good; that write, and every later one, goes
//!   through the page cache instead, and the next `sync_data` flushes it.
//! - Both descriptors name the same file: the direct one is used only if it opened the
//!   same device and inode as the first.

use crate::base::sync::{AtomicBool, Ordering};
use crate::model::error::OpenError;
use crate::store::backend::Storage;
use crate::store::constants::{DIRECT_BUFFER_KEPT_BYTES, LOG_BLOCK_BYTES};
use redb::backends::FileBackend;
use redb::StorageBackend;
use std::io;
use std::path::Path;

/// How a log file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// To look for unapplied frames (a read-only open of the file).
    Read,
    /// To apply and remove a log left beside the file.
    Write,
    /// To apply and keep writing it, created if absent.
    Create,
}

/// A commit log in a file.
#[derive(Debug)]
pub(crate) struct LogFile {
    file: FileBackend,
    /// The direct, synchronous descriptor (Linux, `Access::Create`, when the file system
    /// takes it).
    pub(crate) direct: Option<Direct>,
    /// A write went through the page cache since the last `sync_data`.
    pub(crate) dirty: AtomicBool,
}

impl LogFile {
    /// Opens the log at `path`: `None` when it is absent (never with `Access::Create`).
    pub(crate) fn open(
        path: &Path,
        access: Access,
        mode: u32,
    ) -> Result<Option<LogFile>, OpenError> {
        let create = access == Access::Create;
        let mut options = std::fs::OpenOptions::new();
        options
            .read(true)
            .write(access != Access::Read)
            .create(create)
            .truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            if create {
                options.mode(mode);
            }
        }
        #[cfg(not(unix))]
        let _ = mode;
        let file = match options.open(path) {
            Ok(file) => file,
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(OpenError::Io(e)),
        };
        // Only the engine that appends frames writes them directly.
        let direct = match create {
            true => Direct::open(path, &file),
            false => None,
        };
        let file = crate::store::redb_io::file_backend(file, path)?;
        Ok(Some(LogFile {
            file,
            direct,
            dirty: AtomicBool::new(false),
        }))
    }
}

impl Storage for LogFile {
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.file.read(offset, out)
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if let Some(direct) = &self.direct {
            if direct.write(offset, data)? {
                return Ok(());
            }
        }
        self.dirty.store(true, Ordering::Release);
        self.file.write(offset, data)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.dirty.store(true, Ordering::Release);
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        // Direct writes were durable when they returned; only the page cache's need a flush.
        // A failed flush leaves the file dirty; the writer poisons the engine on it and
        // writes nothing more, so the flush is never retried (Linux may report a retried
        // flush as a success without the pages it lost).
        match self.dirty.swap(false, Ordering::AcqRel) {
            true => self.file.sync_data().inspect_err(|_| {
                self.dirty.store(true, Ordering::Release);
            }),
            false => Ok(()),
        }
    }
}

/// The log file opened again for direct, synchronous writes of whole blocks.
#[derive(Debug)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) struct Direct {
    #[cfg(target_os = "linux")]
    file: std::fs::File,
    /// Direct I/O needs a buffer aligned to the block: frames are copied into this one.
    #[cfg(target_os = "linux")]
    aligned: crate::base::sync::Mutex<Vec<u8>>,
    /// Cleared when the file system refused a direct write.
    pub(crate) on: AtomicBool,
}

impl Direct {
    /// `None` where the platform or the file system has no direct I/O (the log is then
    /// written through the page cache, as on any platform), or where `path` no longer
    /// names the file `first` opened.
    #[cfg(target_os = "linux")]
    fn open(path: &Path, first: &std::fs::File) -> Option<Direct> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(path)
            .ok()?;
        let (a, b) = (first.metadata().ok()?, file.metadata().ok()?);
        if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
            return None;
        }
        Some(Direct {
            file,
            aligned: crate::base::sync::Mutex::new(Vec::new()),
            on: AtomicBool::new(true),
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn open(_path: &Path, _first: &std::fs::File) -> Option<Direct> {
        None
    }

    /// Writes `data` at `offset` directly and durably when both are whole blocks: `true`
    /// then, `false` when the caller must write it through the page cache instead.
    #[cfg(target_os = "linux")]
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<bool> {
        use std::os::unix::fs::FileExt;
        let len = data.len() as u64;
        let whole = len > 0
            && offset.is_multiple_of(LOG_BLOCK_BYTES)
            && len.is_multiple_of(LOG_BLOCK_BYTES);
        if !whole || !self.on.load(Ordering::Acquire) {
            return Ok(false);
        }
        let block = LOG_BLOCK_BYTES as usize;
        let mut aligned = self.aligned.lock();
        // The buffer's address is what must be aligned: room for the data from the first
        // block boundary inside it. (Growing it may move it, so the start is found after.)
        aligned.resize(data.len() + block, 0);
        let start = aligned.as_ptr().align_offset(block);
        let Some(out) = start
            .checked_add(data.len())
            .and_then(|end| aligned.get_mut(start..end))
        else {
            return Ok(false);
        };
        out.copy_from_slice(data);
        let written = self.file.write_at(out, offset);
        // A large write (the zeros at creation, a batch of large responses) does not keep
        // its buffer for the log's life.
        if aligned.capacity() > DIRECT_BUFFER_KEPT_BYTES {
            *aligned = Vec::new();
        }
        match written {
            Ok(n) if n == data.len() => Ok(true),
            Ok(n) => Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "a direct write of {} bytes to the commit log wrote {n}",
                    data.len()
                ),
            )),
            // The file system takes no direct I/O for this file after all. The caller writes
            // the same bytes through the page cache, whatever this wrote.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                self.on.store(false, Ordering::Release);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn write(&self, _offset: u64, _data: &[u8]) -> io::Result<bool> {
        Ok(false)
    }
}
