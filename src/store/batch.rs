//! What the writer applies of a write set: the application tables' rows and the outbox.

use crate::base::sync::Arc;
use crate::model::write_set::RowWrite;

/// A write set as the writer applies it: rows in order, messages with their ids, and the
/// outbox ids a relay marked sent. `ordinal` orders accepted batches (queue order).
#[derive(Debug, Clone, Default)]
pub(crate) struct Batch {
    pub(crate) ordinal: u64,
    pub(crate) rows: Vec<RowWrite>,
    pub(crate) messages: Vec<(u64, Arc<[u8]>)>,
    pub(crate) sent: Vec<u64>,
}
