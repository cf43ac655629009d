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

use crate::base::sync::{Arc, Mutex, MutexGuard};
use crate::model::error::TableError;
use crate::model::write_set::WriteSet;
use crate::runtime::constants::TABLE_SCAN_LIMIT_MAX;
pub(crate) use crate::store::batch::Batch;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// The newest accepted write of a row: its value (`None`: deleted) and the ordinal of the
/// batch that wrote it.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) ordinal: u64,
    pub(crate) value: Option<Arc<[u8]>>,
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
    pub(crate) fn batch(&self, writes: &WriteSet) -> Batch {
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
    pub(crate) fn sent_batch(&self, ids: &[u64]) -> Batch {
        Batch {
            ordinal: self.next_ordinal,
            sent: ids.to_vec(),
            ..Batch::default()
        }
    }

    /// `batch` was queued: its writes are visible to reads from now on.
    pub(crate) fn accept(&mut self, batch: &Batch) {
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

    /// The overlay's newest write of `row` (`None`: the overlay does not know the row).
    pub(crate) fn row(&self, row: &[u8]) -> Option<&Row> {
        self.rows.get(row)
    }

    /// The overlay's rows from `lo` (inclusive) to `hi` (exclusive), in key order.
    pub(crate) fn rows_between<'a>(
        &'a self,
        lo: &'a [u8],
        hi: &'a [u8],
    ) -> impl Iterator<Item = (&'a Arc<[u8]>, &'a Row)> + 'a {
        use std::ops::Bound::{Excluded, Included};
        self.rows.range::<[u8], _>((Included(lo), Excluded(hi)))
    }

    /// The ids of the outbox messages marked sent whose removal is not yet in the file.
    pub(crate) fn sent_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.sent.keys().copied()
    }

    /// Memory engine: the first `limit` outbox messages, oldest first.
    pub(crate) fn first_messages(&self, limit: usize) -> Vec<(u64, Arc<[u8]>)> {
        self.messages
            .iter()
            .take(limit)
            .map(|(id, m)| (*id, m.clone()))
            .collect()
    }

    /// Memory engine: removes the outbox messages `ids` at once.
    pub(crate) fn remove_messages(&mut self, ids: &[u64]) {
        for id in ids {
            self.messages.remove(id);
        }
    }

    /// A memory-only engine applies `writes` at once.
    pub(crate) fn apply(&mut self, writes: &WriteSet) {
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
