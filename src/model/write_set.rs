//! [`WriteSet`]: writes to the application's own tables and messages for the outbox, handed
//! to the engine with a completion or a checkpoint and committed in the same redb
//! transaction as its record (`docs/outbox.md`).
//!
//! Every application table lives in one engine table of the file; a row is stored under
//! its table's name (a one-byte length, then the name) followed by its key. So tables
//! never overlap, a table's rows are one contiguous key range (a scan is one B-tree range),
//! and nothing given to this API can address the engine's own tables.

use crate::base::sync::{Arc, Mutex, OnceLock};
use crate::model::constants::{
    OUTBOX_MESSAGE_LEN_MAX, TABLE_KEY_LEN_MAX, TABLE_NAME_LEN_MAX, TABLE_VALUE_LEN_MAX,
    WRITE_SET_BYTES_MAX, WRITE_SET_OPS_MAX,
};
use crate::model::error::{LeaseError, WriteSetError};
use std::fmt;

/// Writes to the application's tables and messages for the outbox, applied all together
/// with a holder's completion or checkpoint, or not at all.
///
/// Attach a set with [`crate::Lease::complete_with`], [`crate::Lease::set_checkpoint_with`]
/// (or their async and token forms), or stage it for the completion `run` makes with
/// [`crate::Lease::stage`]. The writes are queued in the same operation as the record, so
/// they are committed in the same redb transaction and acknowledged by the same durability
/// wait; a holder that lost its lease, a refused completion, or a failed commit applies
/// none of them. Operations apply in the order they were added.
///
/// Every operation checks its limits (`docs/outbox.md`, "Limits") and leaves the set
/// unchanged when it refuses one.
///
/// ```
/// use idemkv::WriteSet;
/// let mut writes = WriteSet::new();
/// writes
///     .put("balances", b"alice", &150u64.to_le_bytes())?
///     .put("offsets", b"orders", &42u64.to_le_bytes())?
///     .emit(b"{\"confirmed\":\"msg-42\"}")?;
/// assert_eq!(writes.len(), 3);
/// # Ok::<(), idemkv::error::WriteSetError>(())
/// ```
#[derive(Clone, Default)]
pub struct WriteSet {
    /// Row keys (table prefix and key) with their new value, `None` to delete.
    pub(crate) rows: Vec<RowWrite>,
    /// Messages for the outbox, in emission order.
    pub(crate) messages: Vec<Arc<[u8]>>,
    bytes: usize,
}

impl fmt::Debug for WriteSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteSet")
            .field("rows", &self.rows.len())
            .field("messages", &self.messages.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl WriteSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` of `table` to `value`.
    pub fn put(
        &mut self,
        table: &str,
        key: &[u8],
        value: &[u8],
    ) -> Result<&mut Self, WriteSetError> {
        let row = row_key(table, key)?;
        if value.len() > TABLE_VALUE_LEN_MAX {
            return Err(WriteSetError::ValueTooLarge {
                len: value.len(),
                max: TABLE_VALUE_LEN_MAX,
            });
        }
        self.room(1, table.len() + key.len() + value.len())?;
        self.rows.push((row, Some(Arc::from(value))));
        Ok(self)
    }

    /// Removes `key` from `table` (nothing happens if it is not there).
    pub fn delete(&mut self, table: &str, key: &[u8]) -> Result<&mut Self, WriteSetError> {
        let row = row_key(table, key)?;
        self.room(1, table.len() + key.len())?;
        self.rows.push((row, None));
        Ok(self)
    }

    /// Appends `message` to the outbox. It gets its id when the engine accepts the set, and
    /// the relay ([`crate::Engine::outbox`]) sees it once it is committed.
    pub fn emit(&mut self, message: &[u8]) -> Result<&mut Self, WriteSetError> {
        if message.len() > OUTBOX_MESSAGE_LEN_MAX {
            return Err(WriteSetError::MessageTooLarge {
                len: message.len(),
                max: OUTBOX_MESSAGE_LEN_MAX,
            });
        }
        self.room(1, message.len())?;
        self.messages.push(Arc::from(message));
        Ok(self)
    }

    /// Appends every operation of `other` after this set's, if the two fit in one set.
    pub fn append(&mut self, other: WriteSet) -> Result<&mut Self, WriteSetError> {
        self.room(other.len(), other.bytes)?;
        self.rows.extend(other.rows);
        self.messages.extend(other.messages);
        Ok(self)
    }

    /// Operations in the set: puts, deletes and messages.
    pub fn len(&self) -> usize {
        self.rows.len() + self.messages.len()
    }

    /// Whether the set holds no operation.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the set counts against its limit: table names, keys, values and messages.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Reserves `ops` more operations and `bytes` more bytes, or refuses them.
    fn room(&mut self, ops: usize, bytes: usize) -> Result<(), WriteSetError> {
        if self.len().saturating_add(ops) > WRITE_SET_OPS_MAX {
            return Err(WriteSetError::TooManyOps {
                max: WRITE_SET_OPS_MAX,
            });
        }
        let total = self.bytes.saturating_add(bytes);
        if total > WRITE_SET_BYTES_MAX {
            return Err(WriteSetError::TooManyBytes {
                len: total,
                max: WRITE_SET_BYTES_MAX,
            });
        }
        self.bytes = total;
        Ok(())
    }
}

/// A row's stored key and its new value (`None`: deleted).
pub(crate) type RowWrite = (Arc<[u8]>, Option<Arc<[u8]>>);

/// A row a table scan returns: its key (without the table) and its value.
pub type TableRow = (Vec<u8>, Vec<u8>);

/// Checks a table name: 1 to `TABLE_NAME_LEN_MAX` bytes.
fn check_table(table: &str) -> Result<(), WriteSetError> {
    if table.is_empty() {
        return Err(WriteSetError::TableNameEmpty);
    }
    if table.len() > TABLE_NAME_LEN_MAX {
        return Err(WriteSetError::TableNameTooLong {
            len: table.len(),
            max: TABLE_NAME_LEN_MAX,
        });
    }
    Ok(())
}

/// The stored prefix of `table`'s rows: its length as one byte, then its name. A name is
/// UTF-8 (never a 0xFF byte) no longer than 255 bytes, so no prefix ends in 0xFF, and
/// [`successor`] of a prefix plus anything stays within the prefix's bytes.
fn table_prefix(table: &str) -> Result<Vec<u8>, WriteSetError> {
    check_table(table)?;
    let mut out = Vec::with_capacity(1 + table.len());
    // `check_table` bounds the length by TABLE_NAME_LEN_MAX (< 256).
    out.push(u8::try_from(table.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(table.as_bytes());
    Ok(out)
}

/// The stored key of `key` in `table`, checked against the limits.
pub(crate) fn row_key(table: &str, key: &[u8]) -> Result<Arc<[u8]>, WriteSetError> {
    if key.len() > TABLE_KEY_LEN_MAX {
        return Err(WriteSetError::KeyTooLong {
            len: key.len(),
            max: TABLE_KEY_LEN_MAX,
        });
    }
    let mut row = table_prefix(table)?;
    row.extend_from_slice(key);
    Ok(Arc::from(row))
}

/// The smallest byte string greater than every string that starts with `bytes`. `bytes`
/// must not be all 0xFF (a table prefix never is).
fn successor(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&u8::MAX) {
        bytes.pop();
    }
    if let Some(last) = bytes.last_mut() {
        *last += 1;
    }
    bytes
}

/// The stored key range `[lo, hi)` of a scan of `table`, and the length of the table's
/// prefix (stripped from the keys the scan returns).
pub(crate) struct Span {
    pub(crate) lo: Vec<u8>,
    pub(crate) hi: Vec<u8>,
    pub(crate) prefix_len: usize,
}

impl Span {
    /// Keys of `table` from `start` (inclusive) to `end` (exclusive; `None`: the table's end).
    pub(crate) fn range(
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> Result<Span, WriteSetError> {
        let prefix = table_prefix(table)?;
        let lo = [&prefix[..], start].concat();
        let hi = match end {
            Some(end) => [&prefix[..], end].concat(),
            None => successor(prefix.clone()),
        };
        Ok(Span {
            lo,
            hi,
            prefix_len: prefix.len(),
        })
    }

    /// Keys of `table` that start with `prefix`.
    pub(crate) fn prefix(table: &str, prefix: &[u8]) -> Result<Span, WriteSetError> {
        let table_prefix = table_prefix(table)?;
        let lo = [&table_prefix[..], prefix].concat();
        let hi = successor(lo.clone());
        Ok(Span {
            lo,
            hi,
            prefix_len: table_prefix.len(),
        })
    }
}

/// The writes staged on one lease for its completion, shared by the lease and its
/// [`crate::LeaseHandle`]s.
#[derive(Default)]
pub(crate) struct StagedState {
    writes: WriteSet,
    /// The lease settled (completed, released, failed, detached) or was dropped: nothing
    /// staged now would be applied, and a keep-alive stops renewing it.
    settled: bool,
}

/// A lease's staged writes. Allocated at the first `stage` or `handle`, so a lease that
/// stages nothing costs nothing (and the lease stays small).
#[derive(Default)]
pub(crate) struct Staged(OnceLock<Arc<Mutex<StagedState>>>);

impl Staged {
    /// The shared set, created on first use (for a handle).
    pub(crate) fn shared(&self) -> Arc<Mutex<StagedState>> {
        self.0
            .get_or_init(|| Arc::new(Mutex::new(StagedState::default())))
            .clone()
    }

    /// Adds `writes` to what the completion will apply.
    pub(crate) fn stage(&self, writes: WriteSet) -> Result<(), LeaseError> {
        stage(&self.shared(), writes)
    }

    /// Takes the staged writes for the completion (or drops them with a release): the lease
    /// is settled, and later staging is refused.
    pub(crate) fn settle(&self) -> WriteSet {
        match self.0.get() {
            Some(shared) => {
                let mut state = shared.lock();
                state.settled = true;
                std::mem::take(&mut state.writes)
            }
            None => WriteSet::default(),
        }
    }
}

/// Whether the lease owning `shared` settled (completed, released, failed, detached) or was
/// dropped.
pub(crate) fn is_settled(shared: &Mutex<StagedState>) -> bool {
    shared.lock().settled
}

/// Adds `writes` to a lease's staged set, unless the lease settled.
pub(crate) fn stage(shared: &Mutex<StagedState>, writes: WriteSet) -> Result<(), LeaseError> {
    let mut state = shared.lock();
    if state.settled {
        return Err(LeaseError::Settled);
    }
    state
        .writes
        .append(writes)
        .map(drop)
        .map_err(LeaseError::WriteSet)
}

/// The writes a completion applies: what was staged on the lease, then `writes`.
pub(crate) fn merged(staged: WriteSet, writes: Option<&WriteSet>) -> Result<WriteSet, LeaseError> {
    let mut all = staged;
    if let Some(writes) = writes.filter(|w| !w.is_empty()) {
        all.append(writes.clone()).map_err(LeaseError::WriteSet)?;
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_disjoint_contiguous_ranges() {
        let a = row_key("a", b"\xff\xff").unwrap();
        let ab = row_key("ab", b"").unwrap();
        let b = row_key("b", b"").unwrap();
        let span = Span::range("a", b"", None).unwrap();
        assert!(span.lo.as_slice() <= &a[..] && &a[..] < span.hi.as_slice());
        for other in [&ab, &b] {
            assert!(!(span.lo.as_slice() <= &other[..] && &other[..] < span.hi.as_slice()));
        }
        let p = Span::prefix("a", b"\xff").unwrap();
        assert!(p.lo.as_slice() <= &a[..] && &a[..] < p.hi.as_slice());
        assert!(p.hi.as_slice() <= span.hi.as_slice());
    }

    #[test]
    fn a_refused_operation_leaves_the_set_unchanged() {
        let mut w = WriteSet::new();
        w.put("t", b"k", b"v").unwrap();
        let big = vec![0u8; TABLE_VALUE_LEN_MAX + 1];
        assert!(matches!(
            w.put("t", b"k", &big),
            Err(WriteSetError::ValueTooLarge { .. })
        ));
        assert_eq!((w.len(), w.bytes()), (1, 3));
    }
}
