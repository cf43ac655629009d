//! How a file holds its records: the tables of each format, reading records in place
//! (one per row before format 5, chunks since), and converting an older file's records
//! into chunks.

use crate::model::codec;
use crate::model::error::OpenError;
use crate::store::chunk::{self, Packer};
use crate::store::chunk_set::{damaged_chunk, value_pages};
use crate::store::constants::{FORMAT_MAGIC, FORMAT_MAGICS_OLD};
use crate::store::redb_io::open_error;
use crate::store::tables::{
    CHUNKS, MARKERS, META, META_FORMAT, META_TOKEN_HWM, OUTBOX, RECORDS, TABLES,
};
use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata, TableHandle, WriteTransaction};
use std::path::Path;

/// Converts the records table of a file of an older format into chunks, in the open's
/// transaction `txn`, and removes it: the file changes only if that commit does (a crash
/// before it leaves the old file as it was). Every record is verified first, so a damaged
/// one refuses the open (`Corrupted`) without changing the file. Records keep their bytes
/// (formats 1 to 4 are all read). Returns the number of records.
pub(super) fn migrate(txn: &WriteTransaction, path: &Path) -> Result<u64, OpenError> {
    let err = |e: redb::Error| open_error(path, e);
    let mut count = 0u64;
    {
        let records = txn.open_table(RECORDS).map_err(|e| err(e.into()))?;
        let mut chunks = txn.open_table(CHUNKS).map_err(|e| err(e.into()))?;
        let mut packer = Packer::default();
        let mut store = |entries: Vec<(u64, Vec<u8>)>| -> Result<(), OpenError> {
            if let Some(&(first, _)) = entries.first() {
                let bytes = chunk::encode(&entries);
                chunks
                    .insert(first, bytes.as_slice())
                    .map_err(|e| err(e.into()))?;
            }
            Ok(())
        };
        for entry in records.iter().map_err(|e| err(e.into()))? {
            let (k, v) = entry.map_err(|e| err(e.into()))?;
            let token = k.value();
            codec::decode_head(token, v.value()).map_err(|e| OpenError::Corrupted {
                detail: format!("record {token} fails its checks: {e}"),
            })?;
            count += 1;
            if let Some(full) = packer.push(token, v.value().to_vec()) {
                store(full)?;
            }
        }
        if let Some(rest) = packer.finish() {
            store(rest)?;
        }
    }
    txn.delete_table(RECORDS).map_err(|e| err(e.into()))?;
    Ok(count)
}

/// The durable token high-water mark in `txn`'s snapshot (0 if none was ever written).
pub(crate) fn token_hwm(txn: &ReadTransaction, path: &Path) -> Result<u64, OpenError> {
    let Some(v) = meta_value(txn, path, META_TOKEN_HWM)? else {
        return Ok(0);
    };
    let bytes: [u8; 8] = v.as_slice().try_into().map_err(|_| OpenError::Corrupted {
        detail: "token high-water mark is not 8 bytes".into(),
    })?;
    Ok(u64::from_le_bytes(bytes))
}

/// The meta table's value under `key` in `txn`'s snapshot, if it has one. Read at open and
/// by the operator tools, never on a call's path, so the copy costs nothing that matters.
pub(super) fn meta_value(
    txn: &ReadTransaction,
    path: &Path,
    key: &str,
) -> Result<Option<Vec<u8>>, OpenError> {
    let meta = txn.open_table(META).map_err(|e| open_error(path, e))?;
    let value = meta.get(key).map_err(|e| open_error(path, e))?;
    Ok(value.map(|v| v.value().to_vec()))
}

/// See `Store::scan`: the records of a file of a format before 5, one per row.
pub(crate) fn scan_records<E>(
    txn: &ReadTransaction,
    path: &Path,
    range: std::ops::Range<u64>,
    mut f: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<Result<u64, E>, OpenError> {
    let table = txn.open_table(RECORDS).map_err(|e| open_error(path, e))?;
    let mut seen = 0u64;
    let mut last: Option<u64> = None;
    for entry in table.range(range).map_err(|e| open_error(path, e))? {
        let (k, v) = entry.map_err(|e| open_error(path, e))?;
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

/// See `Store::scan`: the records of the chunks table. A chunk whose key is not above the
/// last token of the chunk before it means a damaged tree: `Corrupted`.
/// Also adds to `pages` the pages of the chunks whose keys `range` holds ([`value_pages`]),
/// so that scans of disjoint ranges count each chunk once.
pub(crate) fn scan_chunks<E>(
    txn: &ReadTransaction,
    path: &Path,
    range: std::ops::Range<u64>,
    mut f: impl FnMut(u64, &[u8]) -> Result<(), E>,
    pages: &mut u64,
) -> Result<Result<u64, E>, OpenError> {
    let err = |e: redb::Error| open_error(path, e);
    let table = txn.open_table(CHUNKS).map_err(|e| err(e.into()))?;
    // The chunk holding `range.start`, if any, is stored at or below it.
    let from = match table
        .range(..=range.start)
        .map_err(|e| err(e.into()))?
        .next_back()
    {
        Some(entry) => entry.map_err(|e| err(e.into()))?.0.value(),
        None => range.start,
    };
    let mut seen = 0u64;
    let mut last: Option<u64> = None;
    let mut failed = None;
    for entry in table.range(from..range.end).map_err(|e| err(e.into()))? {
        let (k, v) = entry.map_err(|e| err(e.into()))?;
        let key = k.value();
        if last.is_some_and(|l| l >= key) {
            return Err(OpenError::Corrupted {
                detail: format!("chunk keys out of order at token {key}"),
            });
        }
        if key >= range.start {
            *pages = pages.saturating_add(value_pages(v.value().len()));
        }
        chunk::for_each(key, v.value(), |token, bytes| {
            last = Some(token);
            if token < range.start {
                return true;
            }
            if token >= range.end {
                return false;
            }
            seen += 1;
            match f(token, bytes) {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        })
        .map_err(damaged_chunk)?;
        if let Some(e) = failed {
            return Ok(Err(e));
        }
    }
    Ok(Ok(seen))
}

/// How a file holds its records: one per row (formats before 5, read in place by a
/// read-only open), or packed into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    Records,
    Chunks,
}

/// The layout of a file with the format marker `marker`; `None`: not a marker of ours.
fn layout_of(marker: &[u8]) -> Option<Layout> {
    if marker == FORMAT_MAGIC.as_slice() {
        Some(Layout::Chunks)
    } else if FORMAT_MAGICS_OLD.iter().any(|old| marker == old.as_slice()) {
        Some(Layout::Records)
    } else {
        None
    }
}

/// The names of the tables a file holds, refused as `Foreign` if any is not idemkv's.
pub(crate) fn our_tables(
    tables: impl Iterator<Item = redb::UntypedTableHandle>,
) -> Result<Vec<String>, OpenError> {
    let names: Vec<String> = tables.map(|t| t.name().to_string()).collect();
    let ours = [
        META.name(),
        RECORDS.name(),
        CHUNKS.name(),
        TABLES.name(),
        OUTBOX.name(),
        MARKERS.name(),
    ];
    if let Some(other) = names.iter().find(|n| !ours.contains(&n.as_str())) {
        return Err(OpenError::Foreign {
            detail: format!("redb file holds a foreign table {other:?}"),
        });
    }
    Ok(names)
}

/// Opens the meta and records tables in `txn` and reads through their definitions: the
/// format marker, the mark, the record (or chunk) count and both ends of the records tree
/// (and both end chunks' framing). Returns the file's layout.
pub(crate) fn check_tables(txn: &ReadTransaction, path: &Path) -> Result<Layout, OpenError> {
    let damaged = |e: redb::Error| match open_error(path, e) {
        OpenError::Corrupted { detail } => OpenError::Corrupted {
            detail: format!("the table definitions do not decode: {detail}"),
        },
        other => other,
    };
    let meta = txn.open_table(META).map_err(|e| damaged(e.into()))?;
    // A reader opens every format it reads without changing it.
    let layout = match meta.get(META_FORMAT).map_err(|e| damaged(e.into()))? {
        Some(v) => layout_of(v.value()).ok_or_else(|| OpenError::Foreign {
            detail: format!("unknown idemkv format marker {:02x?}", v.value()),
        })?,
        None => {
            return Err(OpenError::Foreign {
                detail: format!("{} has no idemkv format marker", path.display()),
            })
        }
    };
    token_hwm(txn, path)?;
    let table = match layout {
        Layout::Records => RECORDS,
        Layout::Chunks => CHUNKS,
    };
    let records = txn.open_table(table).map_err(|e| damaged(e.into()))?;
    let len = records.len().map_err(|e| damaged(e.into()))?;
    let first = records.first().map_err(|e| damaged(e.into()))?;
    let last = records.last().map_err(|e| damaged(e.into()))?;
    if (len > 0) != first.is_some() || first.is_some() != last.is_some() {
        return Err(OpenError::Corrupted {
            detail: format!("the records table counts {len} rows but its tree disagrees"),
        });
    }
    if layout == Layout::Chunks {
        for (k, v) in first.iter().chain(last.iter()) {
            chunk::for_each(k.value(), v.value(), |_, _| true).map_err(damaged_chunk)?;
        }
    }
    Ok(layout)
}
