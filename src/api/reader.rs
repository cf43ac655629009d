//! Reading an idemkv file without changing it: what the operator commands (`idemkv stats`,
//! `inspect`, `get`, `verify`, `export`) use, and what a backup tool can use.

use crate::api::admin::{known_time, AbandonedClaim, AbandonedQuery, RecordInfo, RecordInfoState};
use crate::base::clock::wall_time;
use crate::model::codec::{self, RecordState};
use crate::model::error::OpenError;
use crate::store::commit_log::check_beside;
use crate::store::read_only::ReadOnlyStore;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// A read-only view of an idemkv file. Nothing it does changes a byte of the file or its
/// modification time: it never recovers, sweeps, takes over or reserves tokens.
///
/// - If no engine has the file open, the view is a snapshot: a file that was not closed
///   cleanly is recovered in memory only, and [`FileReader::open_verified`] checks every
///   redb page checksum. While the view is open an engine cannot open the file
///   ([`OpenError::AlreadyOpen`]); other readers can.
/// - If an engine has it open (on Linux, macOS and Windows, with two-phase commit, the
///   default), the view follows the engine's commits: each [`FileReader::snapshot`] or
///   [`FileReader::get`] sees the last transaction the engine committed, and nothing the
///   engine holds only in memory (a `Buffered` call not yet committed, a lease extended in
///   memory, counters). Page checksums cannot be checked then ([`FileReader::pages_verified`]).
///
/// ```no_run
/// let reader = idemkv::admin::FileReader::open("idem.redb")?;
/// let snapshot = reader.snapshot()?;
/// println!("{} records, next token {}", snapshot.records.len(), snapshot.token_next);
/// # Ok::<(), idemkv::OpenError>(())
/// ```
#[derive(Debug)]
pub struct FileReader {
    store: ReadOnlyStore,
}

/// Everything one consistent snapshot of a file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileSnapshot {
    /// Every record, in token order, exactly as persisted: InFlight records with their
    /// persisted lease deadlines, and completions past their retention too (Absent to every
    /// call; the next sweep or open reclaims them). A file whose history was damaged may
    /// hold two records of one key (an engine keeps the newer one).
    pub records: Vec<RecordInfo>,
    /// The durable token high-water mark: every token ever issued is below it.
    pub token_hwm: u64,
    /// The first token an engine that opened this file would issue.
    pub token_next: u64,
}

impl FileReader {
    /// Opens the idemkv file at `path` read-only. Never creates anything.
    pub fn open(path: impl AsRef<Path>) -> Result<FileReader, OpenError> {
        Ok(FileReader {
            store: ReadOnlyStore::open(path.as_ref(), false, check_beside)?,
        })
    }

    /// [`FileReader::open`], and if no engine has the file open, verify every redb page
    /// checksum first (reads the whole file).
    pub fn open_verified(path: impl AsRef<Path>) -> Result<FileReader, OpenError> {
        Ok(FileReader {
            store: ReadOnlyStore::open(path.as_ref(), true, check_beside)?,
        })
    }

    /// Whether an engine has the file open: every read sees its last commit at the time.
    pub fn is_live(&self) -> bool {
        self.store.is_live()
    }

    /// Whether every redb page checksum was verified on open.
    pub fn pages_verified(&self) -> bool {
        self.store.verified()
    }

    /// Every record and the token mark, from one consistent snapshot. Every record's
    /// checksum is verified; the first that fails is reported as `Corrupted`.
    pub fn snapshot(&self) -> Result<FileSnapshot, OpenError> {
        let txn = self.store.begin_read()?;
        let token_hwm = self.store.token_hwm(&txn)?;
        let mut records = Vec::new();
        let mut max_token = 0u64;
        self.store.scan(&txn, |token, bytes| {
            max_token = max_token.max(token);
            records.push(info(token, bytes)?);
            Ok::<(), OpenError>(())
        })??;
        Ok(FileSnapshot {
            records,
            token_hwm,
            token_next: token_hwm.max(max_token.saturating_add(1)).max(1),
        })
    }

    /// The record of the unscoped `key` (the newest, if a damaged history left two), as
    /// persisted: a completion past its retention is returned too; compare its `expires_at`
    /// with the time. `None`: the file holds no record of the key.
    pub fn get(&self, key: &[u8]) -> Result<Option<RecordInfo>, OpenError> {
        self.get_scoped(&[], key)
    }

    /// [`FileReader::get`] of `key` within `scope` (the empty scope is the unscoped key).
    pub fn get_scoped(&self, scope: &[u8], key: &[u8]) -> Result<Option<RecordInfo>, OpenError> {
        let txn = self.store.begin_read()?;
        let mut newest = None;
        self.store.scan(&txn, |token, bytes| {
            let head = codec::decode_head(token, bytes).map_err(|e| corrupted(token, e))?;
            if head.key.0[..] == *key && head.scope.0[..] == *scope {
                newest = Some(info(token, bytes)?);
            }
            Ok::<(), OpenError>(())
        })??;
        Ok(newest)
    }

    /// The abandoned claims of the file at `now`, as [`crate::admin::Admin::abandoned`] lists an
    /// engine's: InFlight records whose persisted lease end is at least `query.idle_for`
    /// before `now`, first claimed at least `query.older_than` before it, at most
    /// `query.limit`, the earliest first claimed first. As persisted: a lease a running
    /// engine extended but has not committed yet shows its last committed end.
    pub fn abandoned(
        &self,
        query: &AbandonedQuery,
        now: SystemTime,
    ) -> Result<Vec<AbandonedClaim>, OpenError> {
        let now_ms = crate::base::clock::wall_ms(now);
        let records = self.snapshot()?.records;
        let found = records
            .iter()
            .filter_map(|r| AbandonedClaim::from_record(r, query, now_ms));
        Ok(crate::api::admin::first_in_order(found, query.limit))
    }
}

fn corrupted(token: u64, e: impl std::fmt::Display) -> OpenError {
    OpenError::Corrupted {
        detail: format!("record under token {token}: {e}"),
    }
}

/// A stored record as an operator sees it.
fn info(token: u64, bytes: &[u8]) -> Result<RecordInfo, OpenError> {
    let record = codec::decode(token, bytes).map_err(|e| corrupted(token, e))?;
    let (attempt, state) = match record.state {
        RecordState::InFlight {
            lease_deadline_wall_ms,
            attempt,
            checkpoint,
            attempt_started_wall_ms,
            failed,
            lease_ms,
            claim_id,
        } => (
            attempt,
            RecordInfoState::InFlight {
                lease_deadline: wall_time(lease_deadline_wall_ms),
                checkpoint: checkpoint.map(|c| (c.phase(), c.data().to_vec())),
                attempt_started_at: known_time(attempt_started_wall_ms),
                failed,
                lease: lease_ms.map(Duration::from_millis),
                claim_id,
            },
        ),
        RecordState::Completed {
            attempt,
            expires_wall_ms,
            response,
            ..
        } => (
            attempt,
            RecordInfoState::Completed {
                response: response.0.to_vec(),
                expires_at: wall_time(expires_wall_ms),
                published: true,
            },
        ),
    };
    Ok(RecordInfo {
        key: record.key.key().to_vec(),
        scope: record.key.scope().to_vec(),
        token,
        fingerprint: record.fingerprint,
        attempt,
        state,
        first_claimed_at: known_time(record.first_claimed_wall_ms),
    })
}
