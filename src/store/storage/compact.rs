//! The clean close: compacting the file when enough of it is unused, then closing it with
//! panics contained.

use super::{Closing, Compaction, Store};
use crate::store::constants::{
    COMPACT_UNUSED_BYTES_MIN, COMPACT_UNUSED_PERCENT_MIN, REDB_PAGE_BYTES,
};
use crate::store::redb_io::contain;
use crate::store::snapshot::missing_is_empty;
use crate::store::tables::{CHUNKS, MARKERS, META, OUTBOX, RECORDS, TABLES};
use redb::{ReadTransaction, ReadableDatabase, ReadableTableMetadata, TableDefinition};

impl Closing {
    /// Closes the file after a clean close, first compacting it when enough of it is unused
    /// ([`Store::compact`]). Everything acknowledged is in the file's last commit already:
    /// a compaction moves pages without changing what they hold, in redb's own commits, so
    /// a crash or a failed I/O during it leaves the file as of its last commit, compacted or
    /// not. A failure is reported, not returned: the close has already succeeded.
    pub(crate) fn close(mut self) -> Compaction {
        let Some(mut store) = self.0.take() else {
            return Compaction::Failed {
                why: "the store was already closed".into(),
            };
        };
        let outcome = contain("compaction", || store.compact())
            .unwrap_or_else(|why| Compaction::Failed { why });
        let _ = contain("close", move || drop(store));
        outcome
    }
}

impl Store {
    /// Compacts the file when enough of it is unused: redb moves the highest pages down into
    /// free ones and cuts the file's end, in durable commits of its own. Called once, at a
    /// clean close, after the engine's last commit.
    ///
    /// How much is unused is estimated without reading the records: the chunks' leaves are
    /// counted as the open's scan and each commit since found them (`ChunkPages`); the
    /// other tables, small beside them, are measured. The estimate leaves out the chunks'
    /// branch pages (under 1 % of their leaves) and redb's own trees.
    fn compact(&mut self) -> Compaction {
        // The engine's own read transaction would keep redb from compacting.
        *self.snapshot.write() = None;
        let measured = self
            .file_bytes()
            .and_then(|file_bytes| Ok((file_bytes, self.pages_in_use()?)));
        let (before_bytes, pages) = match measured {
            Ok(measured) => measured,
            Err(why) => return Compaction::Failed { why },
        };
        let unused_bytes = before_bytes.saturating_sub(pages.saturating_mul(REDB_PAGE_BYTES));
        if unused_bytes < COMPACT_UNUSED_BYTES_MIN
            || unused_bytes.saturating_mul(100)
                < before_bytes.saturating_mul(COMPACT_UNUSED_PERCENT_MIN)
        {
            return Compaction::NotNeeded {
                file_bytes: before_bytes,
                unused_bytes,
            };
        }
        match self.db.compact() {
            Ok(_) => match self.file_bytes() {
                Ok(after_bytes) => Compaction::Done {
                    before_bytes,
                    after_bytes,
                },
                Err(why) => Compaction::Failed { why },
            },
            Err(redb::CompactionError::TransactionInProgress) => Compaction::Refused {
                file_bytes: before_bytes,
            },
            Err(e) => Compaction::Failed { why: e.to_string() },
        }
    }

    /// The length of the file (or of a custom backend's storage).
    fn file_bytes(&self) -> Result<u64, String> {
        let len = match &self.storage {
            Some(storage) => storage.len(),
            None => std::fs::metadata(&self.path).map(|m| m.len()),
        };
        len.map_err(|e| format!("the file's length: {e}"))
    }

    /// About how many pages the file's tables take (see [`Store::compact`]).
    fn pages_in_use(&self) -> Result<u64, String> {
        fn pages<K: redb::Key + 'static, V: redb::Value + 'static>(
            txn: &ReadTransaction,
            table: TableDefinition<K, V>,
        ) -> Result<u64, String> {
            let Some(table) = missing_is_empty(txn.open_table(table))? else {
                return Ok(0);
            };
            let stats = table.stats().map_err(|e| e.to_string())?;
            Ok(stats.leaf_pages().saturating_add(stats.branch_pages()))
        }
        let txn = self.db.begin_read().map_err(|e| e.to_string())?;
        let known = {
            let counted = self.chunk_pages.lock();
            // The scans' count stands until a commit changes it.
            counted.known.or(counted.scanned)
        };
        let chunks = match (known, missing_is_empty(txn.open_table(CHUNKS))?) {
            (Some(pages), _) => pages,
            // Not counted (a scan cut short cannot have opened an engine): a page a chunk.
            (None, Some(chunks)) => chunks.len().map_err(|e| e.to_string())?,
            (None, None) => 0,
        };
        let others = [
            pages(&txn, META)?,
            pages(&txn, MARKERS)?,
            pages(&txn, TABLES)?,
            pages(&txn, OUTBOX)?,
            pages(&txn, RECORDS)?,
        ];
        Ok(others.iter().fold(chunks, |sum, n| sum.saturating_add(*n)))
    }
}
