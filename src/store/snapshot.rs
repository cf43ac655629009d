//! Reads of one commit of the file: the application tables' rows and the outbox's
//! messages, for `FileReader` and the engine's table reads.

use crate::base::sync::Arc;
use crate::store::redb_io::contain;
use crate::store::tables::{OUTBOX, TABLES};
use redb::{ReadTransaction, ReadableTable};

/// A read transaction on one commit, for the application tables and the outbox. Cheap to
/// clone; its reads never change.
#[derive(Clone)]
pub(crate) struct Snapshot(pub(crate) Arc<ReadTransaction>);

/// A table this snapshot predates reads as empty.
pub(crate) fn missing_is_empty<T>(
    opened: Result<T, redb::TableError>,
) -> Result<Option<T>, String> {
    match opened {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl Snapshot {
    /// The value stored under the row key `row`. `Err`: redb failed (the caller poisons).
    pub(crate) fn row(&self, row: &[u8]) -> Result<Option<Vec<u8>>, String> {
        contain("read", || {
            let Some(table) = missing_is_empty(self.0.open_table(TABLES))? else {
                return Ok(None);
            };
            let value = table.get(row).map_err(|e| e.to_string())?;
            Ok(value.map(|v| v.value().to_vec()))
        })?
    }

    /// Calls `f` with each row whose key is in `[lo, hi)`, in key order, while it returns
    /// true.
    pub(crate) fn rows(
        &self,
        lo: &[u8],
        hi: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), String> {
        contain("scan", || {
            let Some(table) = missing_is_empty(self.0.open_table(TABLES))? else {
                return Ok(());
            };
            for entry in table.range(lo..hi).map_err(|e| e.to_string())? {
                let (k, v) = entry.map_err(|e| e.to_string())?;
                if !f(k.value(), v.value()) {
                    break;
                }
            }
            Ok(())
        })?
    }

    /// Calls `f` with each outbox message, in id order, while it returns true.
    pub(crate) fn messages(&self, mut f: impl FnMut(u64, &[u8]) -> bool) -> Result<(), String> {
        contain("scan", || {
            let Some(table) = missing_is_empty(self.0.open_table(OUTBOX))? else {
                return Ok(());
            };
            for entry in table.iter().map_err(|e| e.to_string())? {
                let (k, v) = entry.map_err(|e| e.to_string())?;
                if !f(k.value(), v.value()) {
                    break;
                }
            }
            Ok(())
        })?
    }
}
