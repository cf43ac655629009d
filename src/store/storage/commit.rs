//! A group commit: the records' writes into their chunks, the markers, the application
//! tables and the outbox, the token mark and the commit log's state, in one redb write
//! transaction.

use super::{Durable, Marked, Store, Write};
use crate::base::sync::Arc;
use crate::model::codec;
use crate::model::error::OpenError;
use crate::store::batch::Batch;
use crate::store::chunk_set::ChunkSet;
use crate::store::log_state::LogState;
use crate::store::redb_io::{contain, open_error, panicked};
use crate::store::tables::{
    CHUNKS, MARKERS, META, META_LOG_STATE, META_OUTBOX_NEXT, META_RECORD_COUNT, META_TOKEN_HWM,
    OUTBOX, TABLES,
};
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

impl Store {
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
/// the chunks changed (`ChunkPages`).
pub(super) fn apply_writes(
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

pub(super) fn set_record_count(txn: &WriteTransaction, count: u64) -> Result<(), redb::Error> {
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
