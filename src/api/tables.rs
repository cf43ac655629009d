//! The application tables' and the outbox's calls on the engine: reads of rows and ranges,
//! and what the relay reads. The overlay and its lock live in `runtime/tables.rs`.

use crate::api::engine::Engine;
use crate::base::sync::Arc;
use crate::model::error::TableError;
use crate::model::write_set::{row_key, RowWrite, Span, TableRow};
use crate::runtime::tables::check_limit;
use crate::store::snapshot::Snapshot;

impl Engine {
    /// The value of `key` in the application table `table`, or `None`.
    ///
    /// A read sees every write the engine has **accepted**: every write set attached to a
    /// completion or checkpoint that returned `Ok`, committed or not yet (under `Buffered`,
    /// the writes of a completion still in the writer's queue; under `Immediate`, a
    /// completion that is waiting for its fsync is accepted too). It never sees the writes
    /// of a refused or fenced-out holder. Under `Buffered` a crash can lose a suffix of the
    /// accepted writes, never a write while keeping a later one (the file commits them in
    /// the order they were accepted). A memory-only engine reads its memory.
    pub fn table_get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, TableError> {
        let row = row_key(table, key).map_err(TableError::Invalid)?;
        self.check_tables()?;
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return remote.table_get(&row);
        }
        let s = self.shared();
        let snapshot = {
            let state = s.tables().lock();
            if let Some(r) = state.row(&row[..]) {
                return Ok(r.value.as_ref().map(|v| v.to_vec()));
            }
            self.snapshot()
        };
        let Some(snapshot) = snapshot.map_err(|e| self.unread(e))? else {
            return Ok(None);
        };
        snapshot
            .row(&row)
            .map_err(|why| TableError::Poisoned(s.poison(why)))
    }

    /// Up to `limit` rows of `table` with keys from `start` (inclusive) to `end` (exclusive;
    /// `None`: to the table's end), in key order, as of one instant (see
    /// [`Engine::table_get`] for what a read sees). Page by starting the next call after
    /// the last key returned (the key with a 0 byte appended). `limit` is at most 10 000
    /// (`TableError::LimitTooLarge`).
    pub fn table_range(
        &self,
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<TableRow>, TableError> {
        let span = Span::range(table, start, end).map_err(TableError::Invalid)?;
        self.scan(&span, limit)
    }

    /// Up to `limit` rows of `table` whose keys start with `prefix`, in key order (as
    /// [`Engine::table_range`]).
    pub fn table_prefix(
        &self,
        table: &str,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<TableRow>, TableError> {
        let span = Span::prefix(table, prefix).map_err(TableError::Invalid)?;
        self.scan(&span, limit)
    }

    fn scan(&self, span: &Span, limit: usize) -> Result<Vec<TableRow>, TableError> {
        check_limit(limit)?;
        self.check_tables()?;
        let s = self.shared();
        if span.lo >= span.hi || limit == 0 {
            return Ok(Vec::new());
        }
        let strip = |row: &[u8]| row.get(span.prefix_len..).unwrap_or_default().to_vec();
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            let rows = remote.table_scan(&span.lo, &span.hi, limit)?;
            return Ok(rows.into_iter().map(|(k, v)| (strip(&k), v)).collect());
        }
        // The overlay's rows of the span up to its `limit`-th live row (a row past that can
        // be neither in the answer nor hide one of the snapshot's), and the snapshot, taken
        // together under the tables lock: one instant.
        let (overlay, snapshot) = {
            let state = s.tables().lock();
            let mut live = 0;
            let mut overlay: Vec<RowWrite> = Vec::new();
            for (row, r) in state.rows_between(&span.lo, &span.hi) {
                if live == limit {
                    break;
                }
                live += usize::from(r.value.is_some());
                overlay.push((row.clone(), r.value.clone()));
            }
            (overlay, self.snapshot())
        };
        let snapshot = snapshot.map_err(|e| self.unread(e))?;
        let mut out: Vec<TableRow> = Vec::new();
        let mut pending = overlay.into_iter().peekable();
        if let Some(snapshot) = snapshot {
            snapshot
                .rows(&span.lo, &span.hi, |row, value| {
                    // The overlay's rows before this one come first.
                    while out.len() < limit {
                        match pending.peek() {
                            Some((o, _)) if &o[..] < row => {
                                if let Some((o, Some(v))) = pending.next() {
                                    out.push((strip(&o), v.to_vec()));
                                }
                            }
                            _ => break,
                        }
                    }
                    if out.len() >= limit {
                        return false;
                    }
                    match pending.peek() {
                        // The overlay holds a newer write of this row.
                        Some((o, _)) if &o[..] == row => {
                            if let Some((o, Some(v))) = pending.next() {
                                out.push((strip(&o), v.to_vec()));
                            }
                        }
                        _ => out.push((strip(row), value.to_vec())),
                    }
                    out.len() < limit
                })
                .map_err(|why| TableError::Poisoned(s.poison(why)))?;
        }
        for (o, v) in pending {
            if out.len() >= limit {
                break;
            }
            if let Some(v) = v {
                out.push((strip(&o), v.to_vec()));
            }
        }
        Ok(out)
    }

    /// Refuses table calls on a poisoned or closed engine: what a poisoned engine holds in
    /// memory may be lost, so it is not shown.
    pub(crate) fn check_tables(&self) -> Result<(), TableError> {
        let s = self.shared();
        if let Some(why) = s.poison_reason() {
            return Err(TableError::Poisoned(why));
        }
        if s.is_closed() {
            return Err(TableError::Closed);
        }
        Ok(())
    }

    /// The store's snapshot of its last commit (`None`: a memory-only engine). Taken under
    /// the tables lock, it holds every drained write and no write accepted later. A failure
    /// is turned into an error by [`Engine::unread`] once the tables lock is released
    /// (poisoning wakes the stripes, whose locks come first).
    fn snapshot(&self) -> Result<Option<Snapshot>, Unread> {
        let s = self.shared();
        if s.in_memory() {
            return Ok(None);
        }
        let store = s.store().ok_or(Unread::Closed)?;
        store.snapshot().map(Some).map_err(Unread::Failed)
    }

    /// The error of a snapshot that could not be had: a read failure poisons the engine
    /// (redb refuses writes after an I/O error), as a failed replay read does.
    fn unread(&self, e: Unread) -> TableError {
        match e {
            Unread::Closed => TableError::Closed,
            Unread::Failed(why) => TableError::Poisoned(self.shared().poison(why)),
        }
    }
}

/// Why no snapshot could be had.
enum Unread {
    Closed,
    Failed(String),
}

/// What the relay reads under the tables lock: the outbox ids whose removal is accepted but
/// not yet committed, and the snapshot (a durable engine), or the first `limit` messages
/// (a memory-only engine).
pub(crate) enum OutboxView {
    Durable {
        sent: std::collections::HashSet<u64>,
        snapshot: Snapshot,
    },
    Memory(Vec<(u64, Arc<[u8]>)>),
}

impl Engine {
    pub(crate) fn outbox_view(&self, limit: usize) -> Result<OutboxView, TableError> {
        self.check_tables()?;
        let s = self.shared();
        let state = s.tables().lock();
        if s.in_memory() {
            return Ok(OutboxView::Memory(state.first_messages(limit)));
        }
        drop(state);
        // The relay reads the file, which a logged batch reaches after its callers were
        // acknowledged: wait until it holds everything durable now, so that every message
        // whose completion returned is seen.
        s.progress()
            .wait_applied(s.progress().durable(), s)
            .map_err(TableError::Poisoned)?;
        let state = s.tables().lock();
        let sent = state.sent_ids().collect();
        let snapshot = self.snapshot();
        drop(state);
        match snapshot.map_err(|e| self.unread(e))? {
            Some(snapshot) => Ok(OutboxView::Durable { sent, snapshot }),
            None => Ok(OutboxView::Memory(Vec::new())),
        }
    }
}
