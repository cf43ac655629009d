//! The redb file: opening, recovery scans and group commits, for the engine's open and
//! recovery, its writer and applier, the commit log and the read-only tools.
//!
//! Layout: one table of chunks keyed by the first fencing token (`u64`) of each, each chunk
//! holding the latest records of consecutive tokens (`chunk.rs`), a small meta table (format
//! marker, token high-water mark, the secret that keys the index's hashes), and, once an
//! engine with markers has left one, a markers table keyed by the key's keyed hash
//! (docs/retention.md, "Markers: the second tier"). Tokens are issued in time order, so
//! inserts land in the last chunk and expiry deletes from the first ones, several times
//! cheaper than inserting random client keys (see docs/design.md). Files of the formats
//! before 5 hold one record per row of a records table: a writable open converts them
//! (`layout.rs`), a read-only one reads them in place.
//!
//! Here: `Store` and its reads. Opening and creating a file is `open.rs`, how each format
//! holds its records (the scans, the conversion) `layout.rs`, a group commit `commit.rs`,
//! the close's compaction `compact.rs`.

use crate::base::limits::HASH_SECRET_LEN;
use crate::base::sync::{Arc, Mutex, RwLock};
use crate::model::codec::{self, DecodeError, MarkerRecord, Record};
use crate::model::error::OpenError;
use crate::store::backend::Storage;
use crate::store::chunk;
use crate::store::chunk_set::{chunk_get, damaged_chunk};
use crate::store::log_state::LogState;
use crate::store::redb_io::{contain, open_error, panicked};
use crate::store::snapshot::{missing_is_empty, Snapshot};
use crate::store::tables::{
    CHUNKS, MARKERS, META, META_HASH_SECRET, META_LOG_STATE, META_OUTBOX_NEXT, META_RECORD_COUNT,
    OUTBOX, TABLES,
};
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use std::fmt;
use std::path::{Path, PathBuf};

mod commit;
mod compact;
mod layout;
mod open;
#[cfg(test)]
mod tests;

use layout::meta_value;
pub(crate) use layout::{check_tables, our_tables, scan_chunks, scan_records, token_hwm, Layout};
pub(crate) use open::{not_a_directory, sync_dir};

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

/// The pages the chunks table's leaves take, counted as redb allocates them (`value_pages`:
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

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// The first outbox id to issue: above every id the file holds or ever held.
    pub(crate) fn outbox_next(&self) -> Result<u64, OpenError> {
        let err = |e: redb::Error| open_error(&self.path, e);
        let txn = self.begin_read()?;
        let marked = match meta_value(&txn, &self.path, META_OUTBOX_NEXT)? {
            Some(v) => {
                let bytes: [u8; 8] = v.as_slice().try_into().map_err(|_| OpenError::Corrupted {
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
        meta_value(&self.begin_read()?, &self.path, META_HASH_SECRET)?
            .and_then(|v| <[u8; HASH_SECRET_LEN]>::try_from(v.as_slice()).ok())
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
        meta_value(&self.begin_read()?, &self.path, META_RECORD_COUNT)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
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

    /// The commit log's state as the file records it.
    pub(crate) fn log_state(&self) -> Result<LogState, OpenError> {
        let txn = self.begin_read()?;
        let meta = txn
            .open_table(META)
            .map_err(|e| open_error(&self.path, e))?;
        read_log_state(&meta, &self.path)
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
