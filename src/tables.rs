//! The application's tables and the outbox inside the engine: accepting a holder's write set
//! with its record, the overlay of what is accepted but not yet committed, and reads.
//!
//! A durable engine queues a write set in the *same* operation as the holder's record, so
//! the writer commits both in one redb transaction. Reads must see every write the engine
//! has accepted, also before its commit (a later holder under `Buffered` builds on an
//! earlier one's writes), so each accepted write enters an in-memory overlay, and the writer
//! drains it once the write is committed. A read looks at the overlay first, then at the
//! store's snapshot of the last commit.
//!
//! Architecture invariant: a write set is accepted (ids issued, queued, entered in the
//! overlay) in one step under the tables lock, so operations carrying writes reach the
//! queue in the order of their ordinals and outbox ids, and a reader never sees a write in
//! neither the overlay nor the snapshot. The writer renews the store's snapshot *before* it
//! drains the overlay, so an overlay miss is always answered by a snapshot that holds the
//! write. Lock order: a stripe lock, then the tables lock; the tables lock is never held
//! across I/O or a wait.
//!
//! A memory-only engine (`Durability::None`) keeps every row and message in the same
//! structures, applied at once.

use crate::constants::TABLE_SCAN_LIMIT_MAX;
use crate::engine::{Engine, SendRefused, Shared};
use crate::error::TableError;
use crate::machine::Write;
use crate::storage::Snapshot;
use crate::sync::{Arc, Mutex, MutexGuard};
use crate::write_set::{row_key, RowWrite, Span, TableRow, WriteSet};
use crate::writer::Op;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// A write set as the writer applies it: rows in order, messages with their ids, and the
/// outbox ids a relay marked sent. `ordinal` orders accepted batches (queue order).
#[derive(Debug, Clone, Default)]
pub(crate) struct Batch {
    pub(crate) ordinal: u64,
    pub(crate) rows: Vec<RowWrite>,
    pub(crate) messages: Vec<(u64, Arc<[u8]>)>,
    pub(crate) sent: Vec<u64>,
}

/// The newest accepted write of a row: its value (`None`: deleted) and the ordinal of the
/// batch that wrote it.
#[derive(Debug)]
struct Row {
    ordinal: u64,
    value: Option<Arc<[u8]>>,
}

/// What one accepted batch put in the overlay, for the drain after its commit.
#[derive(Debug)]
struct Accepted {
    ordinal: u64,
    rows: Vec<Arc<[u8]>>,
    sent: Vec<u64>,
}

#[derive(Debug)]
pub(crate) struct State {
    /// Durable engine: the newest accepted write of each row not yet drained. Memory
    /// engine: every row (deletions remove the entry).
    rows: BTreeMap<Arc<[u8]>, Row>,
    /// Durable engine: accepted batches not yet drained, oldest first.
    accepted: VecDeque<Accepted>,
    /// Durable engine: outbox ids marked sent whose removal is not yet drained, with the
    /// ordinal of the newest batch that marked them.
    sent: HashMap<u64, u64>,
    /// Memory engine: the outbox.
    messages: BTreeMap<u64, Arc<[u8]>>,
    /// The next outbox id (ids continue across restarts: recovered from the file).
    next_id: u64,
    next_ordinal: u64,
}

/// The application tables and outbox state of one engine.
#[derive(Debug)]
pub(crate) struct Tables {
    state: Mutex<State>,
}

impl Tables {
    /// `next_id`: the first outbox id to issue.
    pub(crate) fn new(next_id: u64) -> Self {
        Tables {
            state: Mutex::new(State {
                rows: BTreeMap::new(),
                accepted: VecDeque::new(),
                sent: HashMap::new(),
                messages: BTreeMap::new(),
                next_id: next_id.max(1),
                next_ordinal: 1,
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// The writer committed every accepted batch up to `ordinal` (and renewed the store's
    /// snapshot): the overlay no longer needs them.
    pub(crate) fn committed(&self, ordinal: u64) {
        let mut state = self.state.lock();
        let State {
            rows,
            accepted,
            sent,
            ..
        } = &mut *state;
        while accepted.front().is_some_and(|a| a.ordinal <= ordinal) {
            let Some(done) = accepted.pop_front() else {
                break;
            };
            for row in done.rows {
                // A later batch's write of the row stays until that batch is committed.
                if rows.get(&row).is_some_and(|r| r.ordinal == done.ordinal) {
                    rows.remove(&row);
                }
            }
            for id in done.sent {
                if sent.get(&id) == Some(&done.ordinal) {
                    sent.remove(&id);
                }
            }
        }
    }
}

impl State {
    /// The batch `writes` becomes if accepted now (nothing changes until [`State::accept`]).
    fn batch(&self, writes: &WriteSet) -> Batch {
        Batch {
            ordinal: self.next_ordinal,
            rows: writes.rows.clone(),
            messages: (self.next_id..)
                .zip(writes.messages.iter().cloned())
                .collect(),
            sent: Vec::new(),
        }
    }

    /// The batch that marks `ids` sent, if accepted now.
    fn sent_batch(&self, ids: &[u64]) -> Batch {
        Batch {
            ordinal: self.next_ordinal,
            sent: ids.to_vec(),
            ..Batch::default()
        }
    }

    /// `batch` was queued: its writes are visible to reads from now on.
    fn accept(&mut self, batch: &Batch) {
        self.next_ordinal += 1;
        self.next_id += batch.messages.len() as u64;
        for (row, value) in &batch.rows {
            let entry = Row {
                ordinal: batch.ordinal,
                value: value.clone(),
            };
            self.rows.insert(row.clone(), entry);
        }
        for &id in &batch.sent {
            self.sent.insert(id, batch.ordinal);
        }
        self.accepted.push_back(Accepted {
            ordinal: batch.ordinal,
            rows: batch.rows.iter().map(|(row, _)| row.clone()).collect(),
            sent: batch.sent.clone(),
        });
    }

    /// A memory-only engine applies `writes` at once.
    fn apply(&mut self, writes: &WriteSet) {
        for (row, value) in &writes.rows {
            match value {
                Some(value) => {
                    let entry = Row {
                        ordinal: 0,
                        value: Some(value.clone()),
                    };
                    self.rows.insert(row.clone(), entry);
                }
                None => {
                    self.rows.remove(row);
                }
            }
        }
        for message in &writes.messages {
            self.messages.insert(self.next_id, message.clone());
            self.next_id += 1;
        }
    }
}

impl Shared {
    /// Queues a holder's record `write` together with `writes` in one operation (see
    /// [`Shared::send`]; called under the key's stripe lock, never blocks). A memory-only
    /// engine applies the writes at once. On a refusal nothing is queued or applied.
    pub(crate) fn queue_with(
        &self,
        write: Option<Write>,
        writes: Option<&WriteSet>,
    ) -> Result<u64, SendRefused> {
        let Some(writes) = writes.filter(|w| !w.is_empty()) else {
            return self.queue(write, false);
        };
        if self.tx.is_none() {
            self.tables.lock().apply(writes);
            return Ok(0);
        }
        // Encoded before the tables lock is taken: only the acceptance is under it.
        let op = write.map_or(Op::TablesOnly, |w| self.op(w, None));
        let mut state = self.tables.lock();
        let batch = state.batch(writes);
        let seq = self.send_with(op, Some(Box::new(batch.clone())), false)?;
        state.accept(&batch);
        Ok(seq)
    }

    /// Queues the removal of the outbox messages `ids` (tables lock held only while
    /// queueing). Returns the operation's durability number, or `None` while the queue is
    /// full. A memory-only engine removes them at once.
    pub(crate) fn try_mark_sent(&self, ids: &[u64]) -> Result<Option<u64>, SendRefused> {
        let mut state = self.tables.lock();
        if self.tx.is_none() {
            for id in ids {
                state.messages.remove(id);
            }
            return Ok(Some(0));
        }
        let batch = state.sent_batch(ids);
        match self.send_with(Op::TablesOnly, Some(Box::new(batch.clone())), false) {
            Ok(seq) => {
                state.accept(&batch);
                Ok(Some(seq))
            }
            Err(SendRefused::Full) => Ok(None),
            Err(other) => Err(other),
        }
    }
}

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
        if let Some(pg) = self.pg() {
            return pg.table_get(self, &row);
        }
        let s = self.shared();
        let snapshot = {
            let state = s.tables.lock();
            if let Some(r) = state.rows.get(&row[..]) {
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
        if let Some(pg) = self.pg() {
            let rows = pg.table_scan(self, &span.lo, &span.hi, limit)?;
            return Ok(rows.into_iter().map(|(k, v)| (strip(&k), v)).collect());
        }
        // The overlay's rows of the span up to its `limit`-th live row (a row past that can
        // be neither in the answer nor hide one of the snapshot's), and the snapshot, taken
        // together under the tables lock: one instant.
        let (overlay, snapshot) = {
            let state = s.tables.lock();
            let mut live = 0;
            let mut overlay: Vec<RowWrite> = Vec::new();
            for (row, r) in state.rows.range::<[u8], _>((
                std::ops::Bound::Included(&span.lo[..]),
                std::ops::Bound::Excluded(&span.hi[..]),
            )) {
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
        if s.tx.is_none() {
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

/// Refuses a per-call count over the limit.
pub(crate) fn check_limit(limit: usize) -> Result<(), TableError> {
    if limit > TABLE_SCAN_LIMIT_MAX {
        return Err(TableError::LimitTooLarge {
            limit,
            max: TABLE_SCAN_LIMIT_MAX,
        });
    }
    Ok(())
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
        let state = s.tables.lock();
        if s.tx.is_none() {
            let first = state
                .messages
                .iter()
                .take(limit)
                .map(|(id, m)| (*id, m.clone()))
                .collect();
            return Ok(OutboxView::Memory(first));
        }
        drop(state);
        // The relay reads the file, which a logged batch reaches after its callers were
        // acknowledged: wait until it holds everything durable now, so that every message
        // whose completion returned is seen.
        s.progress
            .wait_applied(s.progress.durable(), s)
            .map_err(TableError::Poisoned)?;
        let state = s.tables.lock();
        let sent = state.sent.keys().copied().collect();
        let snapshot = self.snapshot();
        drop(state);
        match snapshot.map_err(|e| self.unread(e))? {
            Some(snapshot) => Ok(OutboxView::Durable { sent, snapshot }),
            None => Ok(OutboxView::Memory(Vec::new())),
        }
    }
}
