//! The redb file: opening, recovery scans and group commits. Only the writer thread and
//! `Engine::open` call into this module.
//!
//! Layout: one table keyed by fencing token (`u64`) holding each key's latest record, and a
//! small meta table (format marker, token high-water mark). Tokens are issued in time order,
//! so inserts land at the right edge of the B-tree and expiry deletes from the left edge,
//! several times cheaper than inserting random client keys (see docs/design.md).

use crate::codec::{self, DecodeError, Record};
use crate::constants::{FORMAT_MAGIC, REDB_CACHE_BYTES};
use crate::error::OpenError;
use crate::options::EngineBuilder;
use redb::{
    Database, DatabaseError, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    StorageBackend, TableDefinition, TableHandle,
};
use std::fmt;
use std::io::Read;
use std::ops::Bound;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

pub(crate) const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("idemkv_records");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemkv_meta");
const META_FORMAT: &str = "format";
const META_TOKEN_HWM: &str = "token_hwm";

/// redb's file magic, to tell a foreign file from a damaged redb file.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// One change to the records table, in queue order.
#[derive(Debug)]
pub(crate) enum Write {
    /// Store `value` under `token`, removing the key's previous record at `old`.
    Put {
        token: u64,
        old: Option<u64>,
        value: Vec<u8>,
    },
    /// Remove the record under `token`.
    Delete { token: u64 },
}

impl Write {
    /// The record this write creates, replaces or removes.
    pub(crate) fn token(&self) -> u64 {
        match self {
            Write::Put { token, .. } | Write::Delete { token } => *token,
        }
    }
}

pub(crate) struct Store {
    db: Database,
    path: PathBuf,
    two_phase_commit: bool,
    /// Test-only sabotage, armed on the builder: commits leave the token mark out.
    #[cfg(feature = "testkit")]
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

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Forwards to a boxed backend, because redb takes backends by value.
#[derive(Debug)]
struct Boxed(Box<dyn StorageBackend>);

impl StorageBackend for Boxed {
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
    fn try_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.0.try_lock_range(s, e)
    }
    fn try_lock_shared_range(
        &self,
        s: Bound<u64>,
        e: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_shared_range(s, e)
    }
    fn lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.0.lock_range(s, e)
    }
    fn lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.0.lock_shared_range(s, e)
    }
    fn unlock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.0.unlock_range(s, e)
    }
    fn query_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.0.query_lock_range(s, e)
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

fn open_error(path: &Path, e: DatabaseError) -> OpenError {
    match e {
        DatabaseError::DatabaseAlreadyOpen => OpenError::AlreadyOpen {
            path: path.to_path_buf(),
        },
        DatabaseError::UpgradeRequired(v) => OpenError::Foreign {
            detail: format!("redb file format {v} needs an upgrade this build cannot do"),
        },
        // A read past the end of the file means its own pointers are damaged.
        DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            OpenError::Corrupted {
                detail: format!("the file points past its end ({io})"),
            }
        }
        DatabaseError::Storage(redb::StorageError::Io(io)) => OpenError::Io(io),
        other => OpenError::Corrupted {
            detail: other.to_string(),
        },
    }
}

fn storage_error(e: impl fmt::Display) -> OpenError {
    OpenError::Corrupted {
        detail: e.to_string(),
    }
}

/// Refuses a non-empty file that does not start with redb's magic: it is not ours.
fn check_foreign(path: &Path) -> Result<(), OpenError> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(OpenError::Io(e)),
    };
    let mut head = [0u8; REDB_MAGIC.len()];
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(OpenError::Io(e)),
        }
    }
    if filled == 0 {
        return Ok(());
    }
    if head.iter().all(|&b| b == 0) {
        return reset_file_if_blank(path);
    }
    if filled < head.len() || head != REDB_MAGIC {
        return Err(OpenError::Foreign {
            detail: format!("{} is not a redb file", path.display()),
        });
    }
    Ok(())
}

/// Largest file that may be a creation cut short by a crash (redb's initial layout is a
/// few MiB at most).
const BLANK_FILE_LEN_MAX: u64 = 64 << 20;
/// redb's header: the magic, a god byte, padding, then the page size (u32 LE) at 12.
const REDB_HEADER_PREFIX: usize = 64;
const REDB_PAGE_SIZE_OFFSET: usize = 12;
const REDB_PAGE_SIZE: u32 = 4096;

/// True if `head` (the file's first bytes) is a redb creation that a crash cut short. redb
/// sizes the file and writes its header without the magic, syncs, and only then writes the
/// magic (`page_manager.rs`, "crash safe"): a file whose magic is still zero never held a
/// commit, so nothing acknowledged can be in it. The header must be blank or carry redb's
/// page size, so that a foreign file that happens to start with zeros is not taken for one.
fn is_unfinished_creation(head: &[u8]) -> bool {
    if head.len() < REDB_HEADER_PREFIX || head[..REDB_MAGIC.len()].iter().any(|&b| b != 0) {
        return false;
    }
    let header = &head[..REDB_HEADER_PREFIX];
    let page_size = u32::from_le_bytes([
        header[REDB_PAGE_SIZE_OFFSET],
        header[REDB_PAGE_SIZE_OFFSET + 1],
        header[REDB_PAGE_SIZE_OFFSET + 2],
        header[REDB_PAGE_SIZE_OFFSET + 3],
    ]);
    header.iter().all(|&b| b == 0) || page_size == REDB_PAGE_SIZE
}

fn reset_file_if_blank(path: &Path) -> Result<(), OpenError> {
    let foreign = || OpenError::Foreign {
        detail: format!("{} is not a redb file", path.display()),
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(OpenError::Io)?;
    let len = file.metadata().map_err(OpenError::Io)?.len();
    let mut head = [0u8; REDB_HEADER_PREFIX];
    if len > BLANK_FILE_LEN_MAX || file.read_exact(&mut head).is_err() {
        return Err(foreign());
    }
    if !is_unfinished_creation(&head) {
        return Err(foreign());
    }
    file.set_len(0).map_err(OpenError::Io)?;
    file.sync_all().map_err(OpenError::Io)
}

/// The backend form of [`reset_file_if_blank`]; anything else is left for redb to judge.
fn reset_backend_if_blank(backend: &dyn StorageBackend) -> Result<(), OpenError> {
    let len = backend.len().map_err(OpenError::Io)?;
    if len < REDB_HEADER_PREFIX as u64 || len > BLANK_FILE_LEN_MAX {
        return Ok(());
    }
    let mut head = [0u8; REDB_HEADER_PREFIX];
    backend.read(0, &mut head).map_err(OpenError::Io)?;
    if is_unfinished_creation(&head) {
        backend.set_len(0).map_err(OpenError::Io)?;
        backend.sync_data().map_err(OpenError::Io)?;
    }
    Ok(())
}

impl Store {
    /// Opens (or creates) the file and checks that it is an idemkv file of this format.
    pub(crate) fn open(b: &EngineBuilder) -> Result<Closing, OpenError> {
        let path = b.path.clone().unwrap_or_else(|| PathBuf::from("<backend>"));
        let mut builder = Database::builder();
        builder.set_cache_size(REDB_CACHE_BYTES);
        builder.set_check_integrity_on_open(b.verify_on_open);
        let backend = b.backend.as_ref().map(|slot| slot.take()).transpose()?;
        let db = match backend {
            Some(backend) => {
                reset_backend_if_blank(&*backend)?;
                contain("open", || builder.create_with_backend(Boxed(backend)))
            }
            None => {
                check_foreign(&path)?;
                contain("open", || builder.create(&path))
            }
        }
        .map_err(|detail| OpenError::Corrupted { detail })?
        .map_err(|e| open_error(&path, e))?;
        let store = Closing::new(Store {
            db,
            path,
            two_phase_commit: b.two_phase_commit,
            #[cfg(feature = "testkit")]
            skip_token_hwm: b.sabotage == crate::engine::Sabotage::SkipTokenHwm as u8,
        });
        contain("format check", || store.check_format())
            .map_err(|detail| OpenError::Corrupted { detail })??;
        Ok(store)
    }

    fn check_format(&self) -> Result<(), OpenError> {
        let mut txn = self.db.begin_write().map_err(storage_error)?;
        txn.set_two_phase_commit(true);
        {
            let names: Vec<String> = txn
                .list_tables()
                .map_err(storage_error)?
                .map(|t| t.name().to_string())
                .collect();
            let ours = [META.name(), RECORDS.name()];
            if let Some(other) = names.iter().find(|n| !ours.contains(&n.as_str())) {
                return Err(OpenError::Foreign {
                    detail: format!("redb file holds a foreign table {other:?}"),
                });
            }
            let mut meta = txn.open_table(META).map_err(storage_error)?;
            let format = meta
                .get(META_FORMAT)
                .map_err(storage_error)?
                .map(|v| v.value().to_vec());
            match format {
                Some(f) if f == FORMAT_MAGIC => {}
                Some(f) => {
                    return Err(OpenError::Foreign {
                        detail: format!("unknown idemkv format marker {f:02x?}"),
                    })
                }
                None if names.iter().any(|n| n == RECORDS.name()) => {
                    return Err(OpenError::Corrupted {
                        detail: "records without a format marker".into(),
                    })
                }
                None => {
                    meta.insert(META_FORMAT, FORMAT_MAGIC.as_slice())
                        .map_err(storage_error)?;
                }
            }
            txn.open_table(RECORDS).map_err(storage_error)?;
        }
        txn.commit().map_err(storage_error)?;
        Ok(())
    }

    /// The durable token high-water mark: every token ever issued is below it.
    pub(crate) fn token_hwm(&self) -> Result<u64, OpenError> {
        let txn = self.db.begin_read().map_err(storage_error)?;
        let meta = txn.open_table(META).map_err(storage_error)?;
        let Some(v) = meta.get(META_TOKEN_HWM).map_err(storage_error)? else {
            return Ok(0);
        };
        let bytes: [u8; 8] = v.value().try_into().map_err(|_| OpenError::Corrupted {
            detail: "token high-water mark is not 8 bytes".into(),
        })?;
        Ok(u64::from_le_bytes(bytes))
    }

    /// Number of records in the file (for sizing the index before a scan).
    pub(crate) fn len(&self) -> Result<u64, OpenError> {
        let txn = self.db.begin_read().map_err(storage_error)?;
        let table = txn.open_table(RECORDS).map_err(storage_error)?;
        table.len().map_err(storage_error)
    }

    /// Calls `f` with the raw value of every record whose token is in `range`, in token
    /// order; stops at the first error `f` returns. Returns how many records it visited.
    /// Keys that do not strictly increase mean a damaged tree: `Corrupted`.
    pub(crate) fn scan<E>(
        &self,
        range: std::ops::Range<u64>,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<Result<u64, E>, OpenError> {
        let txn = self.db.begin_read().map_err(storage_error)?;
        let table = txn.open_table(RECORDS).map_err(storage_error)?;
        let mut seen = 0u64;
        let mut last: Option<u64> = None;
        for entry in table.range(range).map_err(storage_error)? {
            let (k, v) = entry.map_err(storage_error)?;
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

    /// The first and last token stored, if any.
    pub(crate) fn token_bounds(&self) -> Result<Option<(u64, u64)>, OpenError> {
        let txn = self.db.begin_read().map_err(storage_error)?;
        let table = txn.open_table(RECORDS).map_err(storage_error)?;
        let first = table
            .first()
            .map_err(storage_error)?
            .map(|(k, _)| k.value());
        let last = table.last().map_err(storage_error)?.map(|(k, _)| k.value());
        Ok(first.zip(last))
    }

    /// Reads and verifies the record stored under `token`. `Ok(None)`: no such record.
    /// `Err`: redb failed (the caller poisons the engine).
    pub(crate) fn get(&self, token: u64) -> Result<Option<Result<Record, DecodeError>>, String> {
        contain("read", || {
            let txn = self.db.begin_read().map_err(|e| e.to_string())?;
            let table = txn.open_table(RECORDS).map_err(|e| e.to_string())?;
            let value = table.get(token).map_err(|e| e.to_string())?;
            Ok(value.map(|v| codec::decode(token, v.value())))
        })?
    }

    /// Applies `writes` in order and raises the token mark to `hwm`, in one fsynced commit.
    pub(crate) fn commit(&self, writes: &[Write], hwm: Option<u64>) -> Result<(), String> {
        contain("commit", || self.commit_inner(writes, hwm))?
    }

    fn commit_inner(&self, writes: &[Write], hwm: Option<u64>) -> Result<(), String> {
        let mut txn = self.db.begin_write().map_err(|e| e.to_string())?;
        // Keys and responses come from clients: two-phase commit keeps a torn write from
        // ever being mistaken for a valid commit (see `EngineBuilder::two_phase_commit`).
        txn.set_two_phase_commit(self.two_phase_commit);
        txn.set_durability(redb::Durability::Immediate)
            .map_err(|e| e.to_string())?;
        {
            let mut table = txn.open_table(RECORDS).map_err(|e| e.to_string())?;
            for w in writes {
                match w {
                    Write::Put { token, old, value } => {
                        if let Some(old) = old {
                            table.remove(*old).map_err(|e| e.to_string())?;
                        }
                        table
                            .insert(*token, value.as_slice())
                            .map_err(|e| e.to_string())?;
                    }
                    Write::Delete { token } => {
                        table.remove(*token).map_err(|e| e.to_string())?;
                    }
                }
            }
            // Test-only sabotage: the mark never reaches the file, so that the checks can
            // show they catch tokens reissued after a crash.
            #[cfg(feature = "testkit")]
            let hwm = hwm.filter(|_| !self.skip_token_hwm);
            if let Some(hwm) = hwm {
                let mut meta = txn.open_table(META).map_err(|e| e.to_string())?;
                meta.insert(META_TOKEN_HWM, hwm.to_le_bytes().as_slice())
                    .map_err(|e| e.to_string())?;
            }
        }
        txn.commit().map_err(|e| e.to_string())
    }
}

/// Raw access to stored values, for the testing kit only: a replay that skips the checksum
/// (a sabotage) and damage to a stored value that bypasses the encoder (bit rot).
#[cfg(feature = "testkit")]
impl Store {
    /// Reads the record under `token` and decodes it without checking its checksum.
    pub(crate) fn get_unverified(
        &self,
        token: u64,
    ) -> Result<Option<Result<Record, DecodeError>>, String> {
        contain("read", || {
            let txn = self.db.begin_read().map_err(|e| e.to_string())?;
            let table = txn.open_table(RECORDS).map_err(|e| e.to_string())?;
            let value = table.get(token).map_err(|e| e.to_string())?;
            Ok(value.map(|v| codec::decode_unverified(v.value())))
        })?
    }

    /// Rewrites the raw value under `token` with `damage`, in a commit of its own (redb
    /// orders it with the writer's). Returns false if there is no such record.
    pub(crate) fn damage(
        &self,
        token: u64,
        damage: impl FnOnce(&mut Vec<u8>),
    ) -> Result<bool, String> {
        let txn = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut table = txn.open_table(RECORDS).map_err(|e| e.to_string())?;
            let Some(mut value) = table
                .get(token)
                .map_err(|e| e.to_string())?
                .map(|v| v.value().to_vec())
            else {
                return Ok(false);
            };
            damage(&mut value);
            table
                .insert(token, value.as_slice())
                .map_err(|e| e.to_string())?;
        }
        txn.commit().map_err(|e| e.to_string())?;
        Ok(true)
    }
}
