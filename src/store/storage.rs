//! The redb file: opening, recovery scans and group commits. Only the writer thread and
//! `Engine::open` call into this module.
//!
//! Layout: one table of chunks keyed by the first fencing token (`u64`) of each, each chunk
//! holding the latest records of consecutive tokens (`chunk.rs`), a small meta table (format
//! marker, token high-water mark, the secret that keys the index's hashes), and, once an
//! engine with markers has left one, a markers table keyed by the key's keyed hash
//! (docs/retention.md, "Markers: the second tier"). Tokens are issued in time order, so
//! inserts land in the last chunk and expiry deletes from the first ones, several times
//! cheaper than inserting random client keys (see docs/design.md). Files of the formats
//! before 5 hold one record per row of a records table: a writable open converts them
//! (`migrate`), a read-only one reads them in place.

use crate::base::limits::HASH_SECRET_LEN;
use crate::base::sync::{Arc, Mutex, RwLock};
use crate::model::codec::{self, DecodeError, MarkerRecord, Record};
use crate::model::error::OpenError;
use crate::store::backend::Storage;
use crate::store::batch::Batch;
use crate::store::chunk::{self, Packer};
use crate::store::chunk_set::{chunk_get, damaged_chunk, value_pages, ChunkSet};
use crate::store::config::StoreConfig;
use crate::store::constants::{
    COMPACT_UNUSED_BYTES_MIN, COMPACT_UNUSED_PERCENT_MIN, CREATE_ATTEMPTS_MAX, FORMAT_MAGIC,
    FORMAT_MAGICS_OLD, REDB_CACHE_BYTES, REDB_PAGE_BYTES,
};
use crate::store::head::{inspect, refuse, Head};
use crate::store::log_state::LogState;
use crate::store::redb_io::{backend_io, contain, file_backend, open_error, panicked, Adapter};
use crate::store::snapshot::{missing_is_empty, Snapshot};
use crate::store::tables::{
    CHUNKS, MARKERS, META, META_FORMAT, META_HASH_SECRET, META_LOG_STATE, META_OUTBOX_NEXT,
    META_RECORD_COUNT, META_TOKEN_HWM, OUTBOX, RECORDS, TABLES,
};
use redb::backends::FileBackend;
use redb::{
    BackendError, ConcurrencyMode, Database, ReadTransaction, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, StorageBackend, TableDefinition, TableHandle, WriteTransaction,
};
use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};

/// One change to the records table, in queue order.
#[derive(Debug)]
pub(crate) enum Write<'a> {
    /// Store `value` under `token`, removing the key's previous record at `old`.
    Put {
        token: u64,
        old: Option<u64>,
        value: &'a [u8],
    },
    /// Remove the record under `token`.
    Delete { token: u64 },
    /// Remove the completion under `token` and store the marker row it leaves under `hash`,
    /// built from the removed record (`codec::marker_of_record`).
    Forget {
        token: u64,
        hash: u64,
        check: u64,
        marker_retention_ms: u64,
    },
    /// Remove the marker row under `hash` if it is the one the completion `token` left (or
    /// if it is damaged).
    DropMarker { hash: u64, token: u64 },
}

impl Write<'_> {
    /// The record this write creates, replaces or removes (a marker's: its completion's).
    pub(crate) fn token(&self) -> u64 {
        match self {
            Write::Put { token, .. }
            | Write::Delete { token }
            | Write::Forget { token, .. }
            | Write::DropMarker { token, .. } => *token,
        }
    }
}

/// How a commit is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durable {
    /// Fsynced before the commit returns.
    Yes,
    /// The commit log already holds the batch durably, as frame `seq` of `epoch` (its
    /// callers were acknowledged then); the commit, fsynced off the acknowledgement path,
    /// records that the file holds the frames up to it.
    Logged { epoch: u64, seq: u64 },
    /// Fsynced, and makes `epoch` the commit log's current epoch in the same commit: the
    /// log's earlier frames are all in the file from now on. `active`: a writer goes on
    /// appending to the log (false for the checkpoint of a close).
    Checkpoint { epoch: u64, active: bool },
}

/// Reads the commit log's state from a meta table.
pub(crate) fn read_log_state(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
    path: &Path,
) -> Result<LogState, OpenError> {
    let value = meta.get(META_LOG_STATE).map_err(|e| open_error(path, e))?;
    match value {
        None => Ok(LogState::default()),
        Some(v) => LogState::decode(v.value()).ok_or_else(|| OpenError::Corrupted {
            detail: "the commit log's state in the meta table does not decode".into(),
        }),
    }
}

/// The marker row a [`Write::Forget`] stored, for the writer to settle the marker in memory
/// after the commit. `row` is `None` when the record was not in the file (nothing stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marked {
    pub(crate) hash: u64,
    pub(crate) token: u64,
    pub(crate) row: Option<MarkerRecord>,
}

/// The pages the chunks table's leaves take, counted as redb allocates them ([`value_pages`]:
/// a chunk of one page or less takes a page, a larger one the power of two of pages that
/// holds it), so that a close can tell the file's unused share without reading its records.
/// Known exactly from an open that found no chunk, or from the open's scan of every chunk
/// on; every commit after that adds what it changed.
#[derive(Debug, Default)]
struct ChunkPages {
    /// What the open's scans counted (the chunks whose keys their ranges hold).
    scanned: Option<u64>,
    /// The chunks' pages as of the last commit, once known.
    known: Option<u64>,
}

impl ChunkPages {
    /// A scan of the open counted `pages`. Scans end before the open's first commit after
    /// them, and a count already known (from an empty table) stays as it is.
    fn scanned(&mut self, pages: u64) {
        if self.known.is_none() {
            self.scanned = Some(self.scanned.unwrap_or(0).saturating_add(pages));
        }
    }

    /// A commit changed the chunks' pages by `delta`.
    fn committed(&mut self, delta: i64) {
        self.known = self
            .known
            .or(self.scanned)
            .map(|pages| pages.saturating_add_signed(delta));
    }
}

pub(crate) struct Store {
    /// A read transaction on the last commit, replaced by every commit before the writer
    /// publishes anything of it: replays read through it instead of starting a read
    /// transaction each (which, with live readers, costs several lock syscalls). Declared
    /// before `db` so that it is dropped first.
    snapshot: RwLock<Option<Arc<ReadTransaction>>>,
    db: Database,
    path: PathBuf,
    /// A custom backend's storage, for its length at close (a file's is read at `path`).
    storage: Option<Arc<dyn Storage>>,
    /// The pages the chunks take, for a close to tell how much of the file is unused.
    chunk_pages: Mutex<ChunkPages>,
    /// Test-only sabotage, armed on the builder: commits leave the token mark out.
    #[cfg(idemkv_sabotage)]
    skip_token_hwm: bool,
}

/// Holds a [`Store`] and closes it with panics contained: after redb panicked on a damaged
/// page its internal locks are poisoned, and dropping the database would panic again.
pub(crate) struct Closing(Option<Store>);

impl Closing {
    pub(crate) fn new(store: Store) -> Self {
        Self(Some(store))
    }
}

impl std::ops::Deref for Closing {
    type Target = Store;
    fn deref(&self) -> &Store {
        // Only `drop` takes the store out.
        match &self.0 {
            Some(store) => store,
            None => unreachable!("a Closing store is present until dropped"),
        }
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        let store = self.0.take();
        let _ = contain("close", move || drop(store));
    }
}

/// What a clean close did about the file's unused pages ([`Closing::close`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Compaction {
    /// The file's pages were moved down into its free ones and its end cut off.
    Done { before_bytes: u64, after_bytes: u64 },
    /// Less of the file was unused than a compaction is worth
    /// (`COMPACT_UNUSED_PERCENT_MIN`, `COMPACT_UNUSED_BYTES_MIN`).
    NotNeeded { file_bytes: u64, unused_bytes: u64 },
    /// A read transaction was live (a reader of the live file, a snapshot still held):
    /// redb compacts only a file nobody reads.
    Refused { file_bytes: u64 },
    /// An I/O error (a full disk) or a panic inside redb: the file keeps what its last
    /// commit holds, and the next open repairs redb's allocator state if it must.
    Failed { why: String },
}

impl fmt::Display for Compaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compaction::Done {
                before_bytes,
                after_bytes,
            } => write!(f, "compacted from {before_bytes} to {after_bytes} bytes"),
            Compaction::NotNeeded {
                file_bytes,
                unused_bytes,
            } => write!(
                f,
                "not compacted: about {unused_bytes} of {file_bytes} bytes unused"
            ),
            Compaction::Refused { file_bytes } => write!(
                f,
                "not compacted ({file_bytes} bytes): a read transaction was live"
            ),
            Compaction::Failed { why } => write!(f, "compaction failed: {why}"),
        }
    }
}

impl Closing {
    /// Closes the file after a clean close, first compacting it when enough of it is unused
    /// ([`Store::compact`]). Everything acknowledged is in the file's last commit already:
    /// a compaction moves pages without changing what they hold, in redb's own commits, so
    /// a crash or a failed I/O during it leaves the file as of its last commit, compacted or
    /// not. A failure is reported, not returned: the close has already succeeded.
    pub(crate) fn close(mut self) -> Compaction {
        let Some(mut store) = self.0.take() else {
            return Compaction::Failed {
                why: "the store was already closed".into(),
            };
        };
        let outcome = contain("compaction", || store.compact())
            .unwrap_or_else(|why| Compaction::Failed { why });
        let _ = contain("close", move || drop(store));
        outcome
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

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
    /// its content proves a creation cut short ([`creation_cut_short`]).
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

    /// The first outbox id to issue: above every id the file holds or ever held.
    pub(crate) fn outbox_next(&self) -> Result<u64, OpenError> {
        let err = |e: redb::Error| open_error(&self.path, e);
        let txn = self.begin_read()?;
        let meta = txn.open_table(META).map_err(|e| err(e.into()))?;
        let marked = match meta.get(META_OUTBOX_NEXT).map_err(|e| err(e.into()))? {
            Some(v) => {
                let bytes: [u8; 8] = v.value().try_into().map_err(|_| OpenError::Corrupted {
                    detail: "the next outbox id is not 8 bytes".into(),
                })?;
                u64::from_le_bytes(bytes)
            }
            None => 0,
        };
        let outbox = txn.open_table(OUTBOX).map_err(|e| err(e.into()))?;
        let last = outbox
            .last()
            .map_err(|e| err(e.into()))?
            .map_or(0, |(k, _)| k.value().saturating_add(1));
        Ok(marked.max(last).max(1))
    }

    /// A read transaction on the last commit (the one replays use), for reads of the
    /// application tables and the outbox.
    pub(crate) fn snapshot(&self) -> Result<Snapshot, String> {
        if let Some(txn) = self.snapshot.read().clone() {
            return Ok(Snapshot(txn));
        }
        contain("read", || self.db.begin_read().map_err(|e| e.to_string()))?
            .map(|txn| Snapshot(Arc::new(txn)))
    }

    /// The secret that keys the index's hashes (written by the open's format check).
    pub(crate) fn hash_secret(&self) -> Result<[u8; HASH_SECRET_LEN], OpenError> {
        let txn = self.begin_read()?;
        let meta = txn
            .open_table(META)
            .map_err(|e| open_error(&self.path, e))?;
        let value = meta
            .get(META_HASH_SECRET)
            .map_err(|e| open_error(&self.path, e))?;
        value
            .and_then(|v| <[u8; HASH_SECRET_LEN]>::try_from(v.value()).ok())
            .ok_or_else(|| OpenError::Corrupted {
                detail: format!("the hash secret is missing or not {HASH_SECRET_LEN} bytes"),
            })
    }

    /// Number of marker rows (for sizing the index before loading them).
    pub(crate) fn markers_len(&self) -> Result<u64, OpenError> {
        let txn = self.begin_read()?;
        match txn.open_table(MARKERS) {
            Ok(table) => table.len().map_err(|e| open_error(&self.path, e)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(open_error(&self.path, e)),
        }
    }

    /// Calls `f` with every marker row (its hash and raw value), in hash order; stops at the
    /// first error `f` returns. A file without a markers table has none.
    pub(crate) fn scan_markers<E>(
        &self,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, OpenError> {
        let txn = self.begin_read()?;
        let table = match txn.open_table(MARKERS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Ok(())),
            Err(e) => return Err(open_error(&self.path, e)),
        };
        for entry in table.iter().map_err(|e| open_error(&self.path, e))? {
            let (k, v) = entry.map_err(|e| open_error(&self.path, e))?;
            if let Err(e) = f(k.value(), v.value()) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Checks that both tables open and their definitions decode in a read transaction, as
    /// every replay will open them: a file whose table tree is damaged is refused at open
    /// instead of failing each read later.
    pub(crate) fn check_tables(&self) -> Result<(), OpenError> {
        contain("table check", || {
            let txn = self.begin_read()?;
            check_tables(&txn, &self.path)?;
            // The application tables and the outbox (which the format check created):
            // their definitions and both ends of their trees.
            let damaged = |e: redb::Error| match open_error(&self.path, e) {
                OpenError::Corrupted { detail } => OpenError::Corrupted {
                    detail: format!("the table definitions do not decode: {detail}"),
                },
                other => other,
            };
            let rows = txn.open_table(TABLES).map_err(|e| damaged(e.into()))?;
            rows.first().map_err(|e| damaged(e.into()))?;
            rows.last().map_err(|e| damaged(e.into()))?;
            let outbox = txn.open_table(OUTBOX).map_err(|e| damaged(e.into()))?;
            outbox.first().map_err(|e| damaged(e.into()))?;
            outbox.last().map_err(|e| damaged(e.into()))?;
            Ok(())
        })
        .map_err(panicked)?
    }

    fn begin_read(&self) -> Result<ReadTransaction, OpenError> {
        self.db.begin_read().map_err(|e| open_error(&self.path, e))
    }

    /// The durable token high-water mark: every token ever issued is below it.
    pub(crate) fn token_hwm(&self) -> Result<u64, OpenError> {
        token_hwm(&self.begin_read()?, &self.path)
    }

    /// Number of records in the file (for sizing the index before a scan, and for the scan
    /// to be checked against), as the meta table counts them.
    pub(crate) fn len(&self) -> Result<u64, OpenError> {
        let txn = self.begin_read()?;
        let meta = txn
            .open_table(META)
            .map_err(|e| open_error(&self.path, e))?;
        let count = meta
            .get(META_RECORD_COUNT)
            .map_err(|e| open_error(&self.path, e))?;
        count
            .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| OpenError::Corrupted {
                detail: "the record count is missing or not 8 bytes".into(),
            })
    }

    /// Calls `f` with the raw value of every record whose token is in `range`, in token
    /// order; stops at the first error `f` returns. Returns how many records it visited.
    /// Keys that do not strictly increase mean a damaged tree: `Corrupted`.
    pub(crate) fn scan<E>(
        &self,
        range: std::ops::Range<u64>,
        f: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<Result<u64, E>, OpenError> {
        let mut pages = 0;
        let scanned = scan_chunks(&self.begin_read()?, &self.path, range, f, &mut pages)?;
        if scanned.is_ok() {
            self.chunk_pages.lock().scanned(pages);
        }
        Ok(scanned)
    }

    /// Whether the file holds no chunk.
    fn chunks_empty(&self) -> Result<bool, OpenError> {
        let txn = self.begin_read()?;
        match missing_is_empty(txn.open_table(CHUNKS)) {
            Ok(Some(chunks)) => chunks.is_empty().map_err(|e| open_error(&self.path, e)),
            Ok(None) => Ok(true),
            Err(detail) => Err(OpenError::Corrupted { detail }),
        }
    }

    /// The first and last token stored, if any.
    pub(crate) fn token_bounds(&self) -> Result<Option<(u64, u64)>, OpenError> {
        let err = |e: redb::Error| open_error(&self.path, e);
        let txn = self.begin_read()?;
        let table = txn.open_table(CHUNKS).map_err(|e| err(e.into()))?;
        // A chunk is stored under its first token.
        let first = table
            .first()
            .map_err(|e| err(e.into()))?
            .map(|(k, _)| k.value());
        let last = match table.last().map_err(|e| err(e.into()))? {
            Some((k, v)) => Some(chunk::last_token(k.value(), v.value()).map_err(damaged_chunk)?),
            None => None,
        };
        Ok(first.zip(last))
    }

    /// Reads and verifies the record stored under `token`. `Ok(None)`: no such record.
    /// `Err`: redb failed (the caller poisons the engine).
    pub(crate) fn get(&self, token: u64) -> Result<Option<Result<Record, DecodeError>>, String> {
        contain("read", || {
            let cached = self.snapshot.read().clone();
            let txn = match cached {
                Some(txn) => txn,
                None => Arc::new(self.db.begin_read().map_err(|e| e.to_string())?),
            };
            let table = txn.open_table(CHUNKS).map_err(|e| e.to_string())?;
            chunk_get(&table, token, |bytes| codec::decode(token, bytes)).map_err(|e| e.to_string())
        })?
    }

    /// Applies `writes`, then the table batches `tables` (each in order), and raises the
    /// token mark to `hwm`, in one fsynced commit. The marker rows its [`Write::Forget`]s
    /// stored are added to `marked` (whose content means nothing if the commit fails).
    pub(crate) fn commit(
        &self,
        writes: &[Write],
        tables: &[&Batch],
        hwm: Option<u64>,
        how: Durable,
        marked: &mut Vec<Marked>,
    ) -> Result<(), String> {
        contain("commit", || {
            self.commit_inner(writes, tables, hwm, how, marked)
        })?
        .map_err(|e| e.to_string())
    }

    /// The commit log's state as the file records it.
    pub(crate) fn log_state(&self) -> Result<LogState, OpenError> {
        let txn = self.begin_read()?;
        let meta = txn
            .open_table(META)
            .map_err(|e| open_error(&self.path, e))?;
        read_log_state(&meta, &self.path)
    }

    /// [`Store::commit`] during open (recovery's own writes, a batch replayed from the
    /// commit log, the log's checkpoint): a failure is a typed open error (a full disk is
    /// not damage).
    pub(crate) fn commit_on_open(
        &self,
        writes: &[Write],
        tables: &[&Batch],
        hwm: Option<u64>,
        how: Durable,
    ) -> Result<(), OpenError> {
        let mut marked = Vec::new();
        contain("commit", || {
            self.commit_inner(writes, tables, hwm, how, &mut marked)
        })
        .map_err(panicked)?
        .map_err(|e| open_error(&self.path, e))
    }

    fn commit_inner(
        &self,
        writes: &[Write],
        tables: &[&Batch],
        hwm: Option<u64>,
        how: Durable,
        marked: &mut Vec<Marked>,
    ) -> Result<(), redb::Error> {
        let mut txn = self.db.begin_write()?;
        // Keys and responses come from clients: two-phase commit keeps a torn write from
        // ever being mistaken for a valid commit (with one-phase commit redb trusts a
        // checksum to tell a torn commit from a valid one, which crafted bytes could
        // defeat), and lets readers of other processes follow the live file.
        txn.set_two_phase_commit(true);
        // Every commit is durable, a logged batch's too: the applier's fsyncs are off the
        // acknowledgement path, and a file whose every commit is durable can be followed
        // by other processes while the engine runs (redb's single-writer mode).
        txn.set_durability(redb::Durability::Immediate)?;
        write_log_state(&txn, how)?;
        let pages = apply_writes(&txn, writes, marked)?;
        // Test-only sabotage: the mark never reaches the file, so that the checks can show
        // they catch tokens reissued after a crash.
        #[cfg(idemkv_sabotage)]
        let hwm = hwm.filter(|_| !self.skip_token_hwm);
        if let Some(hwm) = hwm {
            let mut meta = txn.open_table(META)?;
            meta.insert(META_TOKEN_HWM, hwm.to_le_bytes().as_slice())?;
        }
        apply_tables(&txn, tables)?;
        txn.commit()?;
        self.chunk_pages.lock().committed(pages);
        // (A failed commit returned above and left the previous snapshot, which holds every
        // record published so far whose response is not in memory: the writer poisons the
        // engine before it publishes more, and a completion published at its commit-log
        // sync keeps its response in memory until this commit succeeded. Without a
        // snapshot, replays start their own read transactions.)
        let fresh = self.db.begin_read().ok().map(Arc::new);
        *self.snapshot.write() = fresh;
        Ok(())
    }
}

impl Store {
    /// Compacts the file when enough of it is unused: redb moves the highest pages down into
    /// free ones and cuts the file's end, in durable commits of its own. Called once, at a
    /// clean close, after the engine's last commit.
    ///
    /// How much is unused is estimated without reading the records: the chunks' leaves are
    /// counted as the open's scan and each commit since found them ([`ChunkPages`]); the
    /// other tables, small beside them, are measured. The estimate leaves out the chunks'
    /// branch pages (under 1 % of their leaves) and redb's own trees.
    fn compact(&mut self) -> Compaction {
        // The engine's own read transaction would keep redb from compacting.
        *self.snapshot.write() = None;
        let measured = self
            .file_bytes()
            .and_then(|file_bytes| Ok((file_bytes, self.pages_in_use()?)));
        let (before_bytes, pages) = match measured {
            Ok(measured) => measured,
            Err(why) => return Compaction::Failed { why },
        };
        let unused_bytes = before_bytes.saturating_sub(pages.saturating_mul(REDB_PAGE_BYTES));
        if unused_bytes < COMPACT_UNUSED_BYTES_MIN
            || unused_bytes.saturating_mul(100)
                < before_bytes.saturating_mul(COMPACT_UNUSED_PERCENT_MIN)
        {
            return Compaction::NotNeeded {
                file_bytes: before_bytes,
                unused_bytes,
            };
        }
        match self.db.compact() {
            Ok(_) => match self.file_bytes() {
                Ok(after_bytes) => Compaction::Done {
                    before_bytes,
                    after_bytes,
                },
                Err(why) => Compaction::Failed { why },
            },
            Err(redb::CompactionError::TransactionInProgress) => Compaction::Refused {
                file_bytes: before_bytes,
            },
            Err(e) => Compaction::Failed { why: e.to_string() },
        }
    }

    /// The length of the file (or of a custom backend's storage).
    fn file_bytes(&self) -> Result<u64, String> {
        let len = match &self.storage {
            Some(storage) => storage.len(),
            None => std::fs::metadata(&self.path).map(|m| m.len()),
        };
        len.map_err(|e| format!("the file's length: {e}"))
    }

    /// About how many pages the file's tables take (see [`Store::compact`]).
    fn pages_in_use(&self) -> Result<u64, String> {
        fn pages<K: redb::Key + 'static, V: redb::Value + 'static>(
            txn: &ReadTransaction,
            table: TableDefinition<K, V>,
        ) -> Result<u64, String> {
            let Some(table) = missing_is_empty(txn.open_table(table))? else {
                return Ok(0);
            };
            let stats = table.stats().map_err(|e| e.to_string())?;
            Ok(stats.leaf_pages().saturating_add(stats.branch_pages()))
        }
        let txn = self.db.begin_read().map_err(|e| e.to_string())?;
        let known = {
            let counted = self.chunk_pages.lock();
            // The scans' count stands until a commit changes it.
            counted.known.or(counted.scanned)
        };
        let chunks = match (known, missing_is_empty(txn.open_table(CHUNKS))?) {
            (Some(pages), _) => pages,
            // Not counted (a scan cut short cannot have opened an engine): a page a chunk.
            (None, Some(chunks)) => chunks.len().map_err(|e| e.to_string())?,
            (None, None) => 0,
        };
        let others = [
            pages(&txn, META)?,
            pages(&txn, MARKERS)?,
            pages(&txn, TABLES)?,
            pages(&txn, OUTBOX)?,
            pages(&txn, RECORDS)?,
        ];
        Ok(others.iter().fold(chunks, |sum, n| sum.saturating_add(*n)))
    }
}

/// Records in the file which commit-log frames it holds, in the commit that applies them:
/// a replay skips those frames instead of applying them twice.
fn write_log_state(txn: &WriteTransaction, how: Durable) -> Result<(), redb::Error> {
    let state = match how {
        Durable::Yes => return Ok(()),
        Durable::Logged { epoch, seq } => LogState {
            epoch,
            applied: seq.saturating_add(1),
            active: true,
        },
        Durable::Checkpoint { epoch, active } => LogState {
            epoch,
            applied: 0,
            active,
        },
    };
    let mut meta = txn.open_table(META)?;
    meta.insert(META_LOG_STATE, state.encode().as_slice())?;
    Ok(())
}

/// Applies the record and marker writes of a commit: the records change in the chunks they
/// belong in, which are then written back repacked ([`ChunkSet`]). Returns by how many pages
/// the chunks changed ([`ChunkPages`]).
fn apply_writes(
    txn: &WriteTransaction,
    writes: &[Write],
    marked: &mut Vec<Marked>,
) -> Result<i64, redb::Error> {
    let mut table = txn.open_table(CHUNKS)?;
    let mut set = ChunkSet::default();
    // Opened (and so created) only by a batch that touches a marker.
    let mut markers = None;
    for w in writes {
        match w {
            Write::Put { token, old, value } => {
                if let Some(old) = old {
                    set.remove(&table, *old)?;
                }
                set.insert(&table, *token, value)?;
            }
            Write::Delete { token } => {
                set.remove(&table, *token)?;
            }
            Write::Forget {
                token,
                hash,
                check,
                marker_retention_ms,
            } => {
                let row = set.remove(&table, *token)?.and_then(|old| {
                    codec::marker_of_record(*token, &old, *check, *marker_retention_ms)
                });
                if let Some(row) = &row {
                    let markers = match &mut markers {
                        Some(m) => m,
                        None => markers.insert(txn.open_table(MARKERS)?),
                    };
                    markers.insert(*hash, codec::encode_marker(*hash, row).as_slice())?;
                }
                marked.push(Marked {
                    hash: *hash,
                    token: *token,
                    row,
                });
            }
            Write::DropMarker { hash, token } => {
                let markers = match &mut markers {
                    Some(m) => m,
                    None => markers.insert(txn.open_table(MARKERS)?),
                };
                let ours = markers.get(*hash)?.is_some_and(|v| {
                    codec::decode_marker(*hash, v.value()).map_or(true, |r| r.token == *token)
                });
                if ours {
                    markers.remove(*hash)?;
                }
            }
        }
    }
    let (delta, pages) = set.write(&mut table)?;
    if delta != 0 {
        let count = {
            let meta = txn.open_table(META)?;
            let value = meta.get(META_RECORD_COUNT)?;
            value
                .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
                .map_or(0, u64::from_le_bytes)
        };
        set_record_count(txn, count.wrapping_add_signed(delta))?;
    }
    Ok(pages)
}

fn set_record_count(txn: &WriteTransaction, count: u64) -> Result<(), redb::Error> {
    let mut meta = txn.open_table(META)?;
    meta.insert(META_RECORD_COUNT, count.to_le_bytes().as_slice())?;
    Ok(())
}

/// Applies the application tables' rows, the outbox's new messages and the messages marked
/// sent, in batch order.
fn apply_tables(txn: &WriteTransaction, tables: &[&Batch]) -> Result<(), redb::Error> {
    if tables.is_empty() {
        return Ok(());
    }
    let mut rows = txn.open_table(TABLES)?;
    let mut outbox = txn.open_table(OUTBOX)?;
    let mut next = None;
    for batch in tables {
        for (row, value) in &batch.rows {
            match value {
                Some(value) => rows.insert(&row[..], &value[..])?,
                None => rows.remove(&row[..])?,
            };
        }
        for (id, message) in &batch.messages {
            outbox.insert(*id, &message[..])?;
            next = next.max(Some(id.saturating_add(1)));
        }
        for id in &batch.sent {
            outbox.remove(*id)?;
        }
    }
    if let Some(next) = next {
        let mut meta = txn.open_table(META)?;
        meta.insert(META_OUTBOX_NEXT, next.to_le_bytes().as_slice())?;
    }
    Ok(())
}

/// Converts the records table of a file of an older format into chunks, in the open's
/// transaction `txn`, and removes it: the file changes only if that commit does (a crash
/// before it leaves the old file as it was). Every record is verified first, so a damaged
/// one refuses the open (`Corrupted`) without changing the file. Records keep their bytes
/// (formats 1 to 4 are all read). Returns the number of records.
fn migrate(txn: &WriteTransaction, path: &Path) -> Result<u64, OpenError> {
    let err = |e: redb::Error| open_error(path, e);
    let mut count = 0u64;
    {
        let records = txn.open_table(RECORDS).map_err(|e| err(e.into()))?;
        let mut chunks = txn.open_table(CHUNKS).map_err(|e| err(e.into()))?;
        let mut packer = Packer::default();
        let mut store = |entries: Vec<(u64, Vec<u8>)>| -> Result<(), OpenError> {
            if let Some(&(first, _)) = entries.first() {
                let bytes = chunk::encode(&entries);
                chunks
                    .insert(first, bytes.as_slice())
                    .map_err(|e| err(e.into()))?;
            }
            Ok(())
        };
        for entry in records.iter().map_err(|e| err(e.into()))? {
            let (k, v) = entry.map_err(|e| err(e.into()))?;
            let token = k.value();
            codec::decode_head(token, v.value()).map_err(|e| OpenError::Corrupted {
                detail: format!("record {token} fails its checks: {e}"),
            })?;
            count += 1;
            if let Some(full) = packer.push(token, v.value().to_vec()) {
                store(full)?;
            }
        }
        if let Some(rest) = packer.finish() {
            store(rest)?;
        }
    }
    txn.delete_table(RECORDS).map_err(|e| err(e.into()))?;
    Ok(count)
}

/// The durable token high-water mark in `txn`'s snapshot (0 if none was ever written).
pub(crate) fn token_hwm(txn: &ReadTransaction, path: &Path) -> Result<u64, OpenError> {
    let meta = txn.open_table(META).map_err(|e| open_error(path, e))?;
    let Some(v) = meta.get(META_TOKEN_HWM).map_err(|e| open_error(path, e))? else {
        return Ok(0);
    };
    let bytes: [u8; 8] = v.value().try_into().map_err(|_| OpenError::Corrupted {
        detail: "token high-water mark is not 8 bytes".into(),
    })?;
    Ok(u64::from_le_bytes(bytes))
}

/// See [`Store::scan`]: the records of a file of a format before 5, one per row.
pub(crate) fn scan_records<E>(
    txn: &ReadTransaction,
    path: &Path,
    range: std::ops::Range<u64>,
    mut f: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<Result<u64, E>, OpenError> {
    let table = txn.open_table(RECORDS).map_err(|e| open_error(path, e))?;
    let mut seen = 0u64;
    let mut last: Option<u64> = None;
    for entry in table.range(range).map_err(|e| open_error(path, e))? {
        let (k, v) = entry.map_err(|e| open_error(path, e))?;
        let token = k.value();
        if last.is_some_and(|l| l >= token) {
            return Err(OpenError::Corrupted {
                detail: format!("record keys out of order at token {token}"),
            });
        }
        last = Some(token);
        seen += 1;
        if let Err(e) = f(token, v.value()) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(seen))
}

/// See [`Store::scan`]: the records of the chunks table. A chunk whose key is not above the
/// last token of the chunk before it means a damaged tree: `Corrupted`.
/// Also adds to `pages` the pages of the chunks whose keys `range` holds ([`value_pages`]),
/// so that scans of disjoint ranges count each chunk once.
pub(crate) fn scan_chunks<E>(
    txn: &ReadTransaction,
    path: &Path,
    range: std::ops::Range<u64>,
    mut f: impl FnMut(u64, &[u8]) -> Result<(), E>,
    pages: &mut u64,
) -> Result<Result<u64, E>, OpenError> {
    let err = |e: redb::Error| open_error(path, e);
    let table = txn.open_table(CHUNKS).map_err(|e| err(e.into()))?;
    // The chunk holding `range.start`, if any, is stored at or below it.
    let from = match table
        .range(..=range.start)
        .map_err(|e| err(e.into()))?
        .next_back()
    {
        Some(entry) => entry.map_err(|e| err(e.into()))?.0.value(),
        None => range.start,
    };
    let mut seen = 0u64;
    let mut last: Option<u64> = None;
    let mut failed = None;
    for entry in table.range(from..range.end).map_err(|e| err(e.into()))? {
        let (k, v) = entry.map_err(|e| err(e.into()))?;
        let key = k.value();
        if last.is_some_and(|l| l >= key) {
            return Err(OpenError::Corrupted {
                detail: format!("chunk keys out of order at token {key}"),
            });
        }
        if key >= range.start {
            *pages = pages.saturating_add(value_pages(v.value().len()));
        }
        chunk::for_each(key, v.value(), |token, bytes| {
            last = Some(token);
            if token < range.start {
                return true;
            }
            if token >= range.end {
                return false;
            }
            seen += 1;
            match f(token, bytes) {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        })
        .map_err(damaged_chunk)?;
        if let Some(e) = failed {
            return Ok(Err(e));
        }
    }
    Ok(Ok(seen))
}

/// How a file holds its records: one per row (formats before 5, read in place by a
/// read-only open), or packed into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    Records,
    Chunks,
}

/// The layout of a file with the format marker `marker`; `None`: not a marker of ours.
fn layout_of(marker: &[u8]) -> Option<Layout> {
    if marker == FORMAT_MAGIC.as_slice() {
        Some(Layout::Chunks)
    } else if FORMAT_MAGICS_OLD.iter().any(|old| marker == old.as_slice()) {
        Some(Layout::Records)
    } else {
        None
    }
}

/// The names of the tables a file holds, refused as `Foreign` if any is not idemkv's.
pub(crate) fn our_tables(
    tables: impl Iterator<Item = redb::UntypedTableHandle>,
) -> Result<Vec<String>, OpenError> {
    let names: Vec<String> = tables.map(|t| t.name().to_string()).collect();
    let ours = [
        META.name(),
        RECORDS.name(),
        CHUNKS.name(),
        TABLES.name(),
        OUTBOX.name(),
        MARKERS.name(),
    ];
    if let Some(other) = names.iter().find(|n| !ours.contains(&n.as_str())) {
        return Err(OpenError::Foreign {
            detail: format!("redb file holds a foreign table {other:?}"),
        });
    }
    Ok(names)
}

/// Opens the meta and records tables in `txn` and reads through their definitions: the
/// format marker, the mark, the record (or chunk) count and both ends of the records tree
/// (and both end chunks' framing). Returns the file's layout.
pub(crate) fn check_tables(txn: &ReadTransaction, path: &Path) -> Result<Layout, OpenError> {
    let damaged = |e: redb::Error| match open_error(path, e) {
        OpenError::Corrupted { detail } => OpenError::Corrupted {
            detail: format!("the table definitions do not decode: {detail}"),
        },
        other => other,
    };
    let meta = txn.open_table(META).map_err(|e| damaged(e.into()))?;
    // A reader opens every format it reads without changing it.
    let layout = match meta.get(META_FORMAT).map_err(|e| damaged(e.into()))? {
        Some(v) => layout_of(v.value()).ok_or_else(|| OpenError::Foreign {
            detail: format!("unknown idemkv format marker {:02x?}", v.value()),
        })?,
        None => {
            return Err(OpenError::Foreign {
                detail: format!("{} has no idemkv format marker", path.display()),
            })
        }
    };
    token_hwm(txn, path)?;
    let table = match layout {
        Layout::Records => RECORDS,
        Layout::Chunks => CHUNKS,
    };
    let records = txn.open_table(table).map_err(|e| damaged(e.into()))?;
    let len = records.len().map_err(|e| damaged(e.into()))?;
    let first = records.first().map_err(|e| damaged(e.into()))?;
    let last = records.last().map_err(|e| damaged(e.into()))?;
    if (len > 0) != first.is_some() || first.is_some() != last.is_some() {
        return Err(OpenError::Corrupted {
            detail: format!("the records table counts {len} rows but its tree disagrees"),
        });
    }
    if layout == Layout::Chunks {
        for (k, v) in first.iter().chain(last.iter()) {
            chunk::for_each(k.value(), v.value(), |_, _| true).map_err(damaged_chunk)?;
        }
    }
    Ok(layout)
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

/// Raw access to stored values, for the sabotage build only: a replay that skips the
/// checksum (a sabotage) and damage to a stored value that bypasses the encoder (bit rot).
#[cfg(idemkv_sabotage)]
impl Store {
    /// Reads the record under `token` and decodes it without checking its checksum (its
    /// chunk's framing is still checked: the record's own checksum is what is skipped).
    pub(crate) fn get_unverified(
        &self,
        token: u64,
    ) -> Result<Option<Result<Record, DecodeError>>, String> {
        contain("read", || {
            let txn = self.db.begin_read().map_err(|e| e.to_string())?;
            let table = txn.open_table(CHUNKS).map_err(|e| e.to_string())?;
            chunk_get(&table, token, codec::decode_unverified).map_err(|e| e.to_string())
        })?
    }

    /// Rewrites the raw record under `token` with `damage`, in a commit of its own (redb
    /// orders it with the writer's). Its chunk is framed again around the damaged record, so
    /// that only the record's own checksum can catch it. Returns false if there is no such
    /// record.
    pub(crate) fn damage(
        &self,
        token: u64,
        damage: impl FnOnce(&mut Vec<u8>),
    ) -> Result<bool, String> {
        let txn = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut table = txn.open_table(CHUNKS).map_err(|e| e.to_string())?;
            let found = match table
                .range(..=token)
                .map_err(|e| e.to_string())?
                .next_back()
            {
                Some(entry) => {
                    let (k, v) = entry.map_err(|e| e.to_string())?;
                    let entries = chunk::decode(k.value(), v.value()).map_err(|e| e.to_string())?;
                    Some((k.value(), entries))
                }
                None => None,
            };
            let Some((key, mut entries)) = found else {
                return Ok(false);
            };
            let Some((_, record)) = entries.iter_mut().find(|(t, _)| *t == token) else {
                return Ok(false);
            };
            damage(record);
            table
                .insert(key, chunk::encode(&entries).as_slice())
                .map_err(|e| e.to_string())?;
        }
        txn.commit().map_err(|e| e.to_string())?;
        // Replays read through the snapshot of the writer's last commit: renew it, as the
        // writer would, so the damage is what the next replay reads.
        *self.snapshot.write() = self.db.begin_read().ok().map(Arc::new);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::constants::CHUNK_BYTES_MAX;
    use std::collections::BTreeMap;

    fn db() -> Database {
        Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .expect("an in-memory database")
    }

    fn commit(db: &Database, writes: &[Write]) {
        let txn = db.begin_write().expect("a write transaction");
        apply_writes(&txn, writes, &mut Vec::new()).expect("the writes apply");
        txn.commit().expect("the commit");
    }

    /// Every chunk (key and encoded size) after checking the layout's invariants against
    /// `want`, the records the file must hold: each chunk stored under its first token and
    /// within its budget (unless it holds one record), the records in token order.
    fn chunks(db: &Database, want: &BTreeMap<u64, Vec<u8>>) -> Vec<(u64, usize)> {
        let txn = db.begin_read().expect("a read transaction");
        let table = txn.open_table(CHUNKS).expect("the chunks table");
        let mut found = BTreeMap::new();
        let mut sizes = Vec::new();
        for entry in table.iter().expect("iterates") {
            let (k, v) = entry.expect("an entry");
            let entries = chunk::decode(k.value(), v.value()).expect("a valid chunk");
            assert_eq!(entries.first().map(|e| e.0), Some(k.value()));
            assert!(v.value().len() <= CHUNK_BYTES_MAX || entries.len() == 1);
            assert!(found.last_key_value().is_none_or(|(&l, _)| l < k.value()));
            found.extend(entries);
            sizes.push((k.value(), v.value().len()));
        }
        assert_eq!(&found, want);
        let meta = txn.open_table(META).expect("the meta table");
        let count = meta
            .get(META_RECORD_COUNT)
            .expect("reads")
            .map(|v| v.value().to_vec());
        let count = count.map_or(0, |v| u64::from_le_bytes(v.try_into().expect("8 bytes")));
        assert_eq!(count, want.len() as u64);
        sizes
    }

    /// A leaf takes a page up to a full chunk, then a power of two of pages.
    #[test]
    fn a_chunk_takes_the_pages_redb_allocates_for_its_leaf() {
        assert_eq!(value_pages(0), 1);
        assert_eq!(value_pages(CHUNK_BYTES_MAX), 1);
        assert_eq!(value_pages(CHUNK_BYTES_MAX + 1), 2);
        assert_eq!(value_pages(2 * 4096 - 16), 2);
        assert_eq!(value_pages(2 * 4096 - 15), 4);
        assert_eq!(value_pages(100_000), 32);
    }

    /// The pages the commits count as they change the chunks are the pages of the chunks
    /// they leave, through appends, records larger than a chunk, growth in place and
    /// deletions; an open's count starts from its scans, and commits before them are not
    /// counted.
    #[test]
    fn commits_keep_the_count_of_the_chunks_pages() {
        let db = db();
        let mut counted = ChunkPages {
            known: Some(0),
            ..ChunkPages::default()
        };
        let mut commit = |writes: &[Write]| {
            let txn = db.begin_write().expect("a write transaction");
            let pages = apply_writes(&txn, writes, &mut Vec::new()).expect("the writes apply");
            txn.commit().expect("the commit");
            counted.committed(pages);
        };
        let values: Vec<Vec<u8>> = (0..400u64)
            .map(|t| value(t, if t % 50 == 7 { 9_000 } else { 120 }))
            .collect();
        for (batch, chunk) in values.chunks(9).enumerate() {
            let writes: Vec<Write> = chunk
                .iter()
                .enumerate()
                .map(|(i, v)| Write::Put {
                    token: (batch * 9 + i) as u64,
                    old: None,
                    value: v,
                })
                .collect();
            commit(&writes);
        }
        let grown: Vec<Vec<u8>> = (100..140u64).map(|t| value(t, 700)).collect();
        let writes: Vec<Write> = grown
            .iter()
            .zip(100u64..)
            .map(|(v, t)| Write::Put {
                token: t,
                old: Some(t),
                value: v,
            })
            .collect();
        commit(&writes);
        let deletes: Vec<Write> = (0..250u64).map(|token| Write::Delete { token }).collect();
        commit(&deletes);
        let txn = db.begin_read().expect("a read transaction");
        let table = txn.open_table(CHUNKS).expect("the chunks table");
        let mut pages = 0;
        for entry in table.iter().expect("iterates") {
            pages += value_pages(entry.expect("an entry").1.value().len());
        }
        assert!(pages > 10, "{pages}");
        assert_eq!(counted.known, Some(pages));
        // An open: commits before its scans are not counted, the scans add up, and the
        // commits after them count on from there.
        let mut open = ChunkPages::default();
        open.committed(5);
        assert_eq!(open.known, None);
        open.scanned(30);
        open.scanned(12);
        open.committed(-2);
        assert_eq!(open.known, Some(40));
        open.scanned(7);
        open.committed(1);
        assert_eq!(open.known, Some(41));
    }

    fn value(token: u64, len: usize) -> Vec<u8> {
        vec![token as u8; len]
    }

    /// Appends fill each chunk before the next; a record that grows in the middle spills
    /// into the next chunk; a record larger than a chunk gets one of its own.
    #[test]
    fn appends_fill_chunks_and_growth_spills() {
        let db = db();
        let mut want = BTreeMap::new();
        for batch in 0..300u64 {
            let values: Vec<(u64, Vec<u8>)> = (1..=7)
                .map(|i| (batch * 7 + i, value(batch * 7 + i, 100)))
                .collect();
            let writes: Vec<Write> = values
                .iter()
                .map(|(t, v)| Write::Put {
                    token: *t,
                    old: None,
                    value: v,
                })
                .collect();
            commit(&db, &writes);
            want.extend(values);
        }
        let sizes = chunks(&db, &want);
        let (_, full) = sizes.split_last().expect("chunks");
        assert!(
            full.iter().all(|&(_, n)| n + 103 > CHUNK_BYTES_MAX),
            "{sizes:?}"
        );
        // InFlight records completed in place, in the middle: they grow.
        let grown: Vec<(u64, Vec<u8>)> = (500..540).map(|t| (t, value(t, 300))).collect();
        let writes: Vec<Write> = grown
            .iter()
            .map(|(t, v)| Write::Put {
                token: *t,
                old: Some(*t),
                value: v,
            })
            .collect();
        commit(&db, &writes);
        want.extend(grown);
        chunks(&db, &want);
        // A record larger than a chunk.
        let big = value(5000, 3 * CHUNK_BYTES_MAX);
        commit(
            &db,
            &[Write::Put {
                token: 5000,
                old: Some(1000),
                value: &big,
            }],
        );
        want.remove(&1000);
        want.insert(5000, big);
        let sizes = chunks(&db, &want);
        assert_eq!(sizes.last().map(|s| s.0), Some(5000));
    }

    /// Writes in any order within a commit (new tokens, completions behind them, removals
    /// of old ones, tokens below every chunk, an empty table's first chunk) find the chunk
    /// a search of the tree would: each located range is checked against the search in
    /// debug builds, and the file against a model after every commit.
    #[test]
    fn located_ranges_answer_as_the_search_does() {
        let db = db();
        let mut want: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut top = 1_000u64;
        for _ in 0..120 {
            let mut puts: BTreeMap<u64, (Option<u64>, Vec<u8>)> = BTreeMap::new();
            let mut deletes = Vec::new();
            for _ in 0..next(80) {
                let token = match next(6) {
                    // A new claim, or a completion of a recent one (grown in place).
                    0..=2 => {
                        top += 1 + next(3);
                        top
                    }
                    3 => top.saturating_sub(next(200)),
                    // Below everything so far, or anywhere.
                    4 => next(1_000),
                    _ => next(top + 1),
                };
                if next(4) == 0 && want.contains_key(&token) && !puts.contains_key(&token) {
                    deletes.push(token);
                } else if !deletes.contains(&token) {
                    let old = want.contains_key(&token).then_some(token);
                    puts.insert(token, (old, value(token, 20 + next(150) as usize)));
                }
            }
            // Interleaved: the puts in a shuffled order, the deletes among them.
            let mut writes: Vec<Write> = puts
                .iter()
                .map(|(t, (old, v))| Write::Put {
                    token: *t,
                    old: *old,
                    value: v,
                })
                .chain(deletes.iter().map(|&token| Write::Delete { token }))
                .collect();
            for i in (1..writes.len()).rev() {
                writes.swap(i, next(i as u64 + 1) as usize);
            }
            commit(&db, &writes);
            for t in &deletes {
                want.remove(t);
            }
            want.extend(puts.into_iter().map(|(t, (_, v))| (t, v)));
            chunks(&db, &want);
        }
        assert!(
            want.len() > 500,
            "the test fills many chunks: {}",
            want.len()
        );
    }

    /// Deletions from the left edge remove emptied chunks; a chunk left under half full
    /// merges with a neighbour when both fit; a record found below every chunk joins the
    /// first one.
    #[test]
    fn deletions_remove_and_merge_chunks() {
        let db = db();
        let mut want = BTreeMap::new();
        let values: Vec<(u64, Vec<u8>)> = (10..2010).map(|t| (t, value(t, 60))).collect();
        for part in values.chunks(50) {
            let writes: Vec<Write> = part
                .iter()
                .map(|(t, v)| Write::Put {
                    token: *t,
                    old: None,
                    value: v,
                })
                .collect();
            commit(&db, &writes);
        }
        want.extend(values);
        let before = chunks(&db, &want).len();
        // Expiry from the left edge.
        for start in (10..1010).step_by(100) {
            let writes: Vec<Write> = (start..start + 100)
                .map(|token| Write::Delete { token })
                .collect();
            commit(&db, &writes);
            want.retain(|&t, _| t >= start + 100);
        }
        let after = chunks(&db, &want);
        assert!(after.len() <= before / 2 + 1, "{before} → {}", after.len());
        // Three of every four records of the rest go, in one commit each per chunk.
        let gone: Vec<u64> = want.keys().copied().filter(|t| t % 4 != 0).collect();
        for part in gone.chunks(64) {
            let writes: Vec<Write> = part.iter().map(|&token| Write::Delete { token }).collect();
            commit(&db, &writes);
        }
        want.retain(|t, _| t % 4 == 0);
        let sizes = chunks(&db, &want);
        let bytes: usize = sizes.iter().map(|s| s.1).sum();
        assert!(bytes * 2 > sizes.len() * CHUNK_BYTES_MAX, "{sizes:?}");
        // Below every chunk.
        let low = value(3, 10);
        commit(
            &db,
            &[Write::Put {
                token: 3,
                old: None,
                value: &low,
            }],
        );
        want.insert(3, low);
        chunks(&db, &want);
        // Everything goes: no chunk is left.
        let writes: Vec<Write> = want.keys().map(|&token| Write::Delete { token }).collect();
        commit(&db, &writes);
        assert!(chunks(&db, &BTreeMap::new()).is_empty());
    }
}
