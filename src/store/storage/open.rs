//! Opening a file: creating it under a temporary name and renaming it into place, checking
//! its format and bringing an older one to this version, and the redb settings of the
//! engine's own handle.

use super::commit::set_record_count;
use super::layout::{migrate, our_tables};
use super::{ChunkPages, Closing, Store};
use crate::base::sync::{Arc, Mutex, RwLock};
use crate::model::error::OpenError;
use crate::store::backend::Storage;
use crate::store::config::StoreConfig;
use crate::store::constants::{
    CREATE_ATTEMPTS_MAX, FORMAT_MAGIC, FORMAT_MAGICS_OLD, REDB_CACHE_BYTES,
};
use crate::store::head::{inspect, refuse, Head};
use crate::store::redb_io::{backend_io, contain, file_backend, open_error, panicked, Adapter};
use crate::store::tables::{CHUNKS, META, META_FORMAT, META_HASH_SECRET, OUTBOX, RECORDS, TABLES};
use redb::backends::FileBackend;
use redb::{
    BackendError, ConcurrencyMode, Database, ReadableTable, StorageBackend, TableHandle,
    WriteTransaction,
};
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};

/// The concurrency mode of the engine's own handle on a file at a path. `SingleWriter`
/// lets read-only handles of other processes (the operator commands) follow the live file;
/// it needs byte-range locks and two-phase commit (with one-phase commit a reader could
/// follow a commit whose pages are not yet flushed), so elsewhere the file is locked whole.
/// It allows no non-durable commit, and the engine makes none (the commit log's batches
/// reach the file in durable commits too).
pub(crate) fn writer_mode() -> ConcurrencyMode {
    if cfg!(any(target_os = "linux", target_vendor = "apple", windows)) {
        ConcurrencyMode::SingleWriter
    } else {
        ConcurrencyMode::ExclusiveWriter
    }
}

pub(crate) fn redb_builder(mode: ConcurrencyMode) -> redb::Builder {
    let mut builder = Database::builder();
    builder.set_cache_size(REDB_CACHE_BYTES);
    // Every page checksum is verified before the engine's first commit. A commit walks
    // redb's own trees (the freed-page lists above all), which nothing else of the open
    // reads: a damaged page there makes redb panic inside a commit while an iterator whose
    // `Drop` walks the same page again is live, and that second panic during unwinding
    // aborts the process, past any `catch_unwind`. Verified pages never reach that path.
    builder.set_check_integrity_on_open(true);
    builder.set_concurrency_mode(mode);
    builder
}

/// Refuses a path that is a directory, before anything is created beside it.
pub(crate) fn not_a_directory(path: &Path) -> OpenError {
    OpenError::Io(io::Error::new(
        io::ErrorKind::IsADirectory,
        format!("{} is a directory, not a file", path.display()),
    ))
}

impl Store {
    /// Opens (or creates) the file and checks that it is an idemkv file of this format.
    ///
    /// A file at a path is created under a temporary name beside it and renamed into place
    /// only once redb has created it and the format marker is committed, so a file at the
    /// path has always finished its creation: one without redb's magic is damaged and is
    /// refused. A custom backend cannot be renamed: its storage is started afresh only when
    /// its content proves a creation cut short (`creation_cut_short`).
    pub(crate) fn open(b: &StoreConfig) -> Result<Closing, OpenError> {
        let path = b.path.clone().unwrap_or_else(|| PathBuf::from("<backend>"));
        let backend = b.backend.as_ref().map(|slot| slot.take()).transpose()?;
        match backend {
            Some(backend) => Self::open_backend(b, backend, path),
            None => Self::open_path(b, path),
        }
    }

    fn open_backend(
        b: &StoreConfig,
        backend: Box<dyn Storage>,
        path: PathBuf,
    ) -> Result<Closing, OpenError> {
        let storage: Arc<dyn Storage> = Arc::from(backend);
        let backend = Adapter(storage.clone());
        let head = contain("open", || inspect(&backend, &path)).map_err(panicked)??;
        if let Head::CutShort = refuse(head, &path)? {
            backend.set_len(0).map_err(OpenError::Io)?;
            backend.sync_data().map_err(OpenError::Io)?;
        }
        // A custom backend may have no byte-range locks: lock it whole.
        let builder = redb_builder(ConcurrencyMode::ExclusiveWriter);
        let db = contain("open", || builder.create_with_backend(backend))
            .map_err(panicked)?
            .map_err(|e| open_error(&path, e))?;
        let mut store = Self::finish(b, db, path)?;
        if let Some(s) = store.0.as_mut() {
            s.storage = Some(storage);
        }
        Ok(store)
    }

    /// Checks the format of a freshly opened database, committing the format marker into a
    /// new one.
    fn finish(b: &StoreConfig, db: Database, path: PathBuf) -> Result<Closing, OpenError> {
        #[cfg(not(idemkv_sabotage))]
        let _ = b;
        let store = Closing::new(Store {
            snapshot: RwLock::new(None),
            db,
            path,
            storage: None,
            chunk_pages: Mutex::new(ChunkPages::default()),
            #[cfg(idemkv_sabotage)]
            skip_token_hwm: b.sabotage == crate::base::sabotage::Sabotage::SkipTokenHwm as u8,
        });
        contain("format check", || store.check_format()).map_err(panicked)??;
        // A file without chunks: every page they take from now on is counted by the commits.
        if contain("open", || store.chunks_empty()).map_err(panicked)?? {
            store.chunk_pages.lock().known = Some(0);
        }
        Ok(store)
    }

    fn open_path(b: &StoreConfig, path: PathBuf) -> Result<Closing, OpenError> {
        for _ in 0..CREATE_ATTEMPTS_MAX {
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => return Err(not_a_directory(&path)),
                Ok(m) if m.len() > 0 => return Self::open_existing(b, path),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(OpenError::Io(e)),
            }
            if let Some(store) = Self::create(b, &path)? {
                return Ok(store);
            }
        }
        // Each attempt found a file placed by another process meanwhile and that file gone
        // again before it could be opened.
        Err(OpenError::AlreadyOpen { path })
    }

    fn open_existing(b: &StoreConfig, path: PathBuf) -> Result<Closing, OpenError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(OpenError::Io)?;
        let backend = file_backend(file, &path)?;
        match contain("open", || inspect(&backend, &path)).map_err(panicked)?? {
            Head::Redb => {}
            // Without the rename, files are created in place: recognised by content.
            #[cfg(not(unix))]
            Head::CutShort => {
                backend.set_len(0).map_err(OpenError::Io)?;
                backend.sync_data().map_err(OpenError::Io)?;
            }
            // Only a completed creation is ever renamed into place (see `create`).
            #[cfg(unix)]
            Head::CutShort => {
                return Err(OpenError::HeaderDamaged {
                    path,
                    detail: "redb's magic is zero; the rest is what a creation cut short \
                             leaves, so the file holds no records, but no idemkv creation \
                             leaves such a file at its path: remove it only if you know \
                             where it came from"
                        .into(),
                })
            }
            head => {
                refuse(head, &path)?;
            }
        }
        #[cfg(unix)]
        remove_leftover(&creating_path(&path));
        let builder = redb_builder(writer_mode());
        let db = contain("open", || builder.create_with_backend(backend))
            .map_err(panicked)?
            .map_err(|e| open_error(&path, e))?;
        Self::finish(b, db, path)
    }

    /// Creates the file at `path` under a temporary name beside it, commits the format
    /// marker, and renames it into place. `None`: another process placed a file at the path
    /// meanwhile (the caller opens that one).
    #[cfg(unix)]
    fn create(b: &StoreConfig, path: &Path) -> Result<Option<Closing>, OpenError> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let tmp = creating_path(path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(b.file_mode)
            .open(&tmp)
            .map_err(OpenError::Io)?;
        let probe = file.try_clone().map_err(OpenError::Io)?;
        let backend = file_backend(file, path)?;
        // A leftover temporary file never held a commit of any caller (nothing is committed
        // before the rename but the format marker), so it is reset; but only by the holder
        // of its lock, since another process may be creating in it right now.
        let whole = (Bound::Unbounded, Bound::Unbounded);
        match backend.try_lock_range(whole.0, whole.1) {
            Ok(true) => {}
            Ok(false) => {
                return Err(OpenError::AlreadyOpen {
                    path: path.to_path_buf(),
                })
            }
            // Without locks one creator at a time is the caller's promise, as for redb.
            Err(BackendError::Unsupported) => {}
            Err(e) => return Err(OpenError::Io(backend_io(e))),
        }
        // The name may have been renamed into place since it was opened here: then this
        // handle is the real file, which must not be reset.
        if !same_file(&probe, &tmp)? {
            let _ = backend.unlock_range(whole.0, whole.1);
            return Ok(None);
        }
        let reset = (|| {
            backend.set_len(0)?;
            probe.set_permissions(std::fs::Permissions::from_mode(b.file_mode))?;
            backend.sync_data()
        })();
        // redb takes its own locks; a creator that slips in between finds the file empty
        // and then loses to redb's lock.
        let _ = backend.unlock_range(whole.0, whole.1);
        reset.map_err(OpenError::Io)?;
        let builder = redb_builder(writer_mode());
        let db = contain("create", || builder.create_with_backend(backend))
            .map_err(panicked)?
            .map_err(|e| open_error(path, e))?;
        let mut store = Self::finish(b, db, tmp.clone())?;
        // Every creator holds redb's lock on the temporary file from here to the rename, so
        // this look at the path and the rename are one step for them.
        match std::fs::metadata(path) {
            Ok(m) if m.len() > 0 => {
                drop(store);
                let _ = std::fs::remove_file(&tmp);
                return Ok(None);
            }
            Ok(m) if m.is_dir() => return Err(not_a_directory(path)),
            _ => {}
        }
        std::fs::rename(&tmp, path).map_err(OpenError::Io)?;
        sync_dir(path).map_err(OpenError::Io)?;
        if let Some(s) = store.0.as_mut() {
            s.path = path.to_path_buf();
        }
        Ok(Some(store))
    }

    /// Without rename-safe locking, creates in place: a creation cut short is recognised by
    /// its content, as for a custom backend.
    #[cfg(not(unix))]
    fn create(b: &StoreConfig, path: &Path) -> Result<Option<Closing>, OpenError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(OpenError::Io)?;
        let backend = file_backend(file, path)?;
        let builder = redb_builder(writer_mode());
        let db = contain("create", || builder.create_with_backend(backend))
            .map_err(panicked)?
            .map_err(|e| open_error(path, e))?;
        Self::finish(b, db, path.to_path_buf()).map(Some)
    }

    fn check_format(&self) -> Result<(), OpenError> {
        let err = |e: redb::Error| open_error(&self.path, e);
        let mut txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        txn.set_two_phase_commit(true);
        {
            let names = our_tables(txn.list_tables().map_err(|e| err(e.into()))?)?;
            // A database that never held a table has no table tree at all; one that names
            // no table but has table tree pages (an entry count damaged to zero) held data.
            // (Asked before any table is opened here, which would add to the tree.)
            let tree_pages = match names.is_empty() {
                true => txn.stats().map_err(|e| err(e.into()))?.branch_pages(),
                false => 0,
            };
            let format = {
                let meta = txn.open_table(META).map_err(|e| err(e.into()))?;
                let value = meta.get(META_FORMAT).map_err(|e| err(e.into()))?;
                value.map(|v| v.value().to_vec())
            };
            self.settle_format(&txn, format.as_deref(), &names, tree_pages)?;
            let mut meta = txn.open_table(META).map_err(|e| err(e.into()))?;
            let secret = meta
                .get(META_HASH_SECRET)
                .map_err(|e| err(e.into()))?
                .is_some();
            if !secret {
                let fresh = crate::base::hash::KeyHasher::random_secret();
                meta.insert(META_HASH_SECRET, fresh.as_slice())
                    .map_err(|e| err(e.into()))?;
            }
            txn.open_table(CHUNKS).map_err(|e| err(e.into()))?;
            // Created by the first open of this version, opened by every later one.
            txn.open_table(TABLES).map_err(|e| err(e.into()))?;
            txn.open_table(OUTBOX).map_err(|e| err(e.into()))?;
        }
        txn.commit().map_err(|e| err(e.into()))?;
        Ok(())
    }

    /// Checks the format marker `format` against the tables `names`, and brings a file of an
    /// older format (or a new one) to the current format in the open's transaction `txn`.
    fn settle_format(
        &self,
        txn: &WriteTransaction,
        format: Option<&[u8]>,
        names: &[String],
        tree_pages: u64,
    ) -> Result<(), OpenError> {
        let err = |e: redb::Error| open_error(&self.path, e);
        let has = |table: &str| names.iter().any(|n| n == table);
        let old = |f: &[u8]| FORMAT_MAGICS_OLD.iter().any(|old| f == old.as_slice());
        match format {
            // The marker and the chunks table are created in one commit: a marker without
            // the table is a damaged table tree, whose records must not be replaced by an
            // empty table.
            Some(f) if f == FORMAT_MAGIC && !has(CHUNKS.name()) => {
                return Err(OpenError::Corrupted {
                    detail: "a format marker without the chunks table".into(),
                })
            }
            Some(f) if f == FORMAT_MAGIC => return Ok(()),
            // A conversion commits the chunks, the marker and the records table's removal
            // together: chunks beside an old marker are a damaged table tree.
            Some(f) if old(f) && has(CHUNKS.name()) => {
                return Err(OpenError::Corrupted {
                    detail: "chunks beside the format marker of an older format".into(),
                })
            }
            // A previous format: its records move into chunks and the marker moves on in
            // this transaction, before any record of the new format is written.
            Some(f) if old(f) => {
                let records = migrate(txn, &self.path)?;
                set_record_count(txn, records).map_err(err)?;
            }
            Some(f) => {
                return Err(OpenError::Foreign {
                    detail: format!("unknown idemkv format marker {f:02x?}"),
                })
            }
            None if has(RECORDS.name()) || has(CHUNKS.name()) => {
                return Err(OpenError::Corrupted {
                    detail: "records without a format marker".into(),
                })
            }
            None if tree_pages > 0 => {
                return Err(OpenError::Corrupted {
                    detail: "the table tree names no idemkv table but holds pages".into(),
                })
            }
            None => set_record_count(txn, 0).map_err(err)?,
        }
        let mut meta = txn.open_table(META).map_err(|e| err(e.into()))?;
        meta.insert(META_FORMAT, FORMAT_MAGIC.as_slice())
            .map_err(|e| err(e.into()))?;
        Ok(())
    }
}

/// The temporary name a file is created under, beside `path`.
#[cfg(unix)]
fn creating_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.idemkv-creating"))
}

/// Whether the open `file` is the file at `path`.
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> Result<bool, OpenError> {
    use std::os::unix::fs::MetadataExt;
    let open = file.metadata().map_err(OpenError::Io)?;
    match std::fs::metadata(path) {
        Ok(named) => Ok(open.dev() == named.dev() && open.ino() == named.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(OpenError::Io(e)),
    }
}

/// Elsewhere a directory cannot be opened to be synced: creating or removing a file there
/// is as durable as the file system makes it.
#[cfg(not(unix))]
pub(crate) fn sync_dir(_path: &Path) -> io::Result<()> {
    Ok(())
}

/// Makes a rename in `path`'s directory durable.
#[cfg(unix)]
pub(crate) fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Removes a temporary file a creation left behind (it never held a commit of any caller),
/// unless a creator holds it right now. Best effort: a failure leaves it for later.
#[cfg(unix)]
fn remove_leftover(tmp: &Path) {
    let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(tmp) else {
        return;
    };
    let Ok(probe) = file.try_clone() else { return };
    #[allow(clippy::useless_conversion)]
    let Ok(backend) = FileBackend::new(file) else {
        return;
    };
    if let Ok(true) = backend.try_lock_range(Bound::Unbounded, Bound::Unbounded) {
        if let Ok(true) = same_file(&probe, tmp) {
            let _ = std::fs::remove_file(tmp);
        }
        let _ = backend.unlock_range(Bound::Unbounded, Bound::Unbounded);
    }
}
