//! The read-only handle of the operator commands and `FileReader`: it opens a file without
//! changing a byte of it, whether a service has it open or not.

use crate::base::limits::HASH_SECRET_LEN;
use crate::base::sync::Mutex;
use crate::model::error::OpenError;
use crate::store::constants::READER_CACHE_BYTES;
use crate::store::head::{inspect, refuse, Head};
use crate::store::log_state::LogState;
use crate::store::redb_io::{contain, file_backend, open_error, panicked};
use crate::store::storage::{
    check_tables, not_a_directory, our_tables, read_log_state, scan_chunks, scan_records,
    token_hwm, Layout,
};
use crate::store::tables::{META, META_HASH_SECRET};
use redb::backends::FileBackend;
use redb::{
    BackendError, ConcurrencyMode, Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase,
    StorageBackend, TableHandle,
};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};

/// A read-only handle on an idemkv file, for the operator commands: nothing it does changes
/// a byte of the file (or its modification time).
///
/// - When no writer has the file open, it is opened through [`Overlay`]: redb works as a
///   writer would, so it can recover a file that was not closed cleanly and verify every
///   page checksum, but its writes stay in memory. Its locks are shared: a service cannot
///   start while the handle is open, and other readers can.
/// - When a writer has it open (in `SingleWriter` mode), it is opened as a redb read-only
///   handle that follows the writer's commits: it sees the last committed transaction.
pub(crate) struct ReadOnlyStore {
    /// Present until dropped.
    db: Option<ReadDb>,
    path: PathBuf,
    verified: bool,
}

enum ReadDb {
    Snapshot(Database),
    Live(ReadOnlyDatabase),
}

impl fmt::Debug for ReadOnlyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlyStore")
            .field("path", &self.path)
            .field("live", &self.is_live())
            .finish()
    }
}

impl Drop for ReadOnlyStore {
    fn drop(&mut self) {
        // A redb panic on a damaged page leaves its locks poisoned: contain the close.
        let db = self.db.take();
        let _ = contain("close", move || drop(db));
    }
}

/// The check of a commit log beside a file opened read-only (`commit_log::check_beside`).
/// The reader passes it in: the store knows the log's state row, not the log.
pub(crate) type LogCheck = fn(&Path, &[u8; HASH_SECRET_LEN], LogState) -> Result<(), OpenError>;

impl ReadOnlyStore {
    /// Opens the file at `path` read-only. `verify`: check every redb page checksum (only
    /// possible when no writer has the file open; see [`ReadOnlyStore::verified`]).
    pub(crate) fn open(
        path: &Path,
        verify: bool,
        check_log: LogCheck,
    ) -> Result<ReadOnlyStore, OpenError> {
        // A writer can close between the two attempts below; a second round then finds it
        // gone.
        let mut last = None;
        for _ in 0..2 {
            match Self::open_snapshot(path, verify, check_log) {
                Err(OpenError::AlreadyOpen { .. }) => {}
                other => return other,
            }
            match Self::open_live(path) {
                Err(e @ OpenError::Corrupted { .. }) => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| OpenError::AlreadyOpen {
            path: path.to_path_buf(),
        }))
    }

    fn open_file(path: &Path) -> Result<FileBackend, OpenError> {
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => return Err(not_a_directory(path)),
            _ => {}
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .open(path)
            .map_err(OpenError::Io)?;
        let backend = file_backend(file, path)?;
        match contain("open", || inspect(&backend, path)).map_err(panicked)?? {
            Head::Redb => Ok(backend),
            Head::Empty => Err(OpenError::Foreign {
                detail: format!("{} is empty", path.display()),
            }),
            Head::CutShort => Err(OpenError::HeaderDamaged {
                path: path.to_path_buf(),
                detail: "redb's magic is zero; the rest is what a creation cut short leaves: \
                         the file holds no records"
                    .into(),
            }),
            head => refuse(head, path).map(|_| backend),
        }
    }

    fn open_snapshot(
        path: &Path,
        verify: bool,
        check_log: LogCheck,
    ) -> Result<ReadOnlyStore, OpenError> {
        let overlay = Overlay::new(Self::open_file(path)?)?;
        let mut builder = Database::builder();
        builder.set_cache_size(READER_CACHE_BYTES);
        builder.set_check_integrity_on_open(verify);
        let db = contain("open", || builder.create_with_backend(overlay))
            .map_err(panicked)?
            .map_err(|e| open_error(path, e))?;
        let store = Self::checked(ReadDb::Snapshot(db), path, verify)?;
        store.refuse_unapplied_log(check_log)?;
        Ok(store)
    }

    /// With no engine running, a commit log beside the file that holds commits of the
    /// file's current epoch means the file alone misses acknowledged commits.
    fn refuse_unapplied_log(&self, check_log: LogCheck) -> Result<(), OpenError> {
        let path = &self.path;
        let (secret, state) = contain("read", || {
            let txn = self.begin_read()?;
            let meta = txn.open_table(META).map_err(|e| open_error(path, e))?;
            let secret = meta
                .get(META_HASH_SECRET)
                .map_err(|e| open_error(path, e))?
                .and_then(|v| <[u8; HASH_SECRET_LEN]>::try_from(v.value()).ok());
            Ok::<_, OpenError>((secret, read_log_state(&meta, path)?))
        })
        .map_err(panicked)??;
        // A file without a secret was never opened by an engine that logs.
        let Some(secret) = secret else {
            return Ok(());
        };
        check_log(path, &secret, state)
    }

    fn open_live(path: &Path) -> Result<ReadOnlyStore, OpenError> {
        let backend = Self::open_file(path)?;
        let mut builder = Database::builder();
        builder.set_cache_size(READER_CACHE_BYTES);
        builder.set_concurrency_mode(ConcurrencyMode::SingleWriter);
        let db = contain("open", || builder.open_read_only_with_backend(backend))
            .map_err(panicked)?
            .map_err(|e| open_error(path, e))?;
        Self::checked(ReadDb::Live(db), path, false)
    }

    fn checked(db: ReadDb, path: &Path, verified: bool) -> Result<ReadOnlyStore, OpenError> {
        let store = ReadOnlyStore {
            db: Some(db),
            path: path.to_path_buf(),
            verified,
        };
        contain("format check", || {
            let txn = store.begin_read()?;
            let names = our_tables(txn.list_tables().map_err(|e| open_error(path, e))?)?;
            if !names.iter().any(|n| n == META.name()) {
                return Err(OpenError::Foreign {
                    detail: format!("{} holds no idemkv tables", path.display()),
                });
            }
            check_tables(&txn, path).map(drop)
        })
        .map_err(panicked)??;
        Ok(store)
    }

    /// Whether a writer has the file open: what this handle reads is the writer's last
    /// commit at the time of each read.
    pub(crate) fn is_live(&self) -> bool {
        matches!(self.db, Some(ReadDb::Live(_)))
    }

    /// Whether every redb page checksum was verified on open.
    pub(crate) fn verified(&self) -> bool {
        self.verified
    }

    /// A read transaction: one consistent snapshot of the file.
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction, OpenError> {
        let txn = match &self.db {
            Some(ReadDb::Snapshot(db)) => db.begin_read(),
            Some(ReadDb::Live(db)) => db.begin_read(),
            None => unreachable!("a ReadOnlyStore holds its database until dropped"),
        };
        txn.map_err(|e| open_error(&self.path, e))
    }

    /// The token mark in `txn`.
    pub(crate) fn token_hwm(&self, txn: &ReadTransaction) -> Result<u64, OpenError> {
        token_hwm(txn, &self.path)
    }

    /// Calls `f` with every record in `txn`, in token order (see [`Store::scan`]), in the
    /// layout the snapshot's format marker names: a file of an older format is read in place.
    pub(crate) fn scan<E>(
        &self,
        txn: &ReadTransaction,
        f: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<Result<u64, E>, OpenError> {
        contain("scan", || match check_tables(txn, &self.path)? {
            Layout::Records => scan_records(txn, &self.path, 0..u64::MAX, f),
            Layout::Chunks => scan_chunks(txn, &self.path, 0..u64::MAX, f, &mut 0),
        })
        .map_err(panicked)?
    }
}

/// Size of the pages [`Overlay`] keeps its writes in.
const OVERLAY_PAGE_BYTES: u64 = 4096;

#[derive(Debug)]
struct OverlayState {
    len: u64,
    /// Bytes of the file still visible under the overlay (a shrink hides the rest).
    base_len: u64,
    pages: HashMap<u64, Box<[u8]>>,
}

/// A copy-on-write view of a file: reads see the file under every write made through the
/// view, writes stay in memory, syncs do nothing. Lock requests become shared locks on the
/// file, so the view excludes writers and admits other readers. redb can then recover and
/// verify a file as a writer does without changing a byte of it.
#[derive(Debug)]
struct Overlay {
    base: FileBackend,
    state: Mutex<OverlayState>,
}

impl Overlay {
    fn new(base: FileBackend) -> Result<Self, OpenError> {
        let len = base.len().map_err(OpenError::Io)?;
        Ok(Overlay {
            base,
            state: Mutex::new(OverlayState {
                len,
                base_len: len,
                pages: HashMap::new(),
            }),
        })
    }

    /// The file's bytes at `offset` as far as they are visible, zeros past that.
    fn read_base(&self, s: &OverlayState, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let visible = s.base_len.saturating_sub(offset).min(out.len() as u64) as usize;
        if visible > 0 {
            self.base.read(offset, &mut out[..visible])?;
        }
        out[visible..].fill(0);
        Ok(())
    }
}

impl StorageBackend for Overlay {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.state.lock().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let s = self.state.lock();
        let end = offset.saturating_add(out.len() as u64);
        if end > s.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        }
        self.read_base(&s, offset, out)?;
        if out.is_empty() {
            return Ok(());
        }
        for page in offset / OVERLAY_PAGE_BYTES..=(end - 1) / OVERLAY_PAGE_BYTES {
            let Some(data) = s.pages.get(&page) else {
                continue;
            };
            let page_start = page * OVERLAY_PAGE_BYTES;
            let from = offset.max(page_start);
            let to = end.min(page_start + OVERLAY_PAGE_BYTES);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - page_start) as usize..(to - page_start) as usize]);
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut s = self.state.lock();
        if len < s.len {
            s.pages.retain(|&p, _| p * OVERLAY_PAGE_BYTES < len);
            let cut = (len % OVERLAY_PAGE_BYTES) as usize;
            if let Some(page) = s.pages.get_mut(&(len / OVERLAY_PAGE_BYTES)) {
                page[cut..].fill(0);
            }
            s.base_len = s.base_len.min(len);
        }
        s.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut s = self.state.lock();
        let end = offset.saturating_add(data.len() as u64);
        if data.is_empty() {
            return Ok(());
        }
        for page in offset / OVERLAY_PAGE_BYTES..=(end - 1) / OVERLAY_PAGE_BYTES {
            let page_start = page * OVERLAY_PAGE_BYTES;
            if !s.pages.contains_key(&page) {
                let mut fresh = vec![0u8; OVERLAY_PAGE_BYTES as usize].into_boxed_slice();
                self.read_base(&s, page_start, &mut fresh)?;
                s.pages.insert(page, fresh);
            }
            let from = offset.max(page_start);
            let to = end.min(page_start + OVERLAY_PAGE_BYTES);
            if let Some(target) = s.pages.get_mut(&page) {
                target[(from - page_start) as usize..(to - page_start) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            }
        }
        s.len = s.len.max(end);
        Ok(())
    }

    fn close(&self) -> Result<(), io::Error> {
        self.base.close()
    }
    fn try_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.base.try_lock_shared_range(s, e)
    }
    fn try_lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.base.try_lock_shared_range(s, e)
    }
    fn lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.base.lock_shared_range(s, e)
    }
    fn lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.base.lock_shared_range(s, e)
    }
    fn unlock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.base.unlock_range(s, e)
    }
    fn query_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.base.query_lock_range(s, e)
    }
}
