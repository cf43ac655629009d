//! The file's redb tables and its meta table's keys: one place that names them, for the
//! store (`storage/`), the reads of one commit (`snapshot.rs`) and the conversion of
//! old files.

use redb::TableDefinition;

/// The records of a file of a format before 5, one per row under its token: read in place
/// by a read-only open, converted into chunks by a writable one.
pub(crate) const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("idemkv_records");
/// The records, packed into chunks stored under their first token (`chunk.rs`).
pub(crate) const CHUNKS: TableDefinition<u64, &[u8]> = TableDefinition::new("idemkv_chunks");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemkv_meta");
/// Every application table's rows, each under its table's prefix (`write_set.rs`).
pub(crate) const TABLES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemkv_tables");
/// The outbox: messages by id, until a relay marks them sent.
pub(crate) const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("idemkv_outbox");
/// Marker rows by the key's keyed hash. Created by the first commit that stores one, so a
/// file that never held a marker has the same tables as before markers existed.
pub(crate) const MARKERS: TableDefinition<u64, &[u8]> = TableDefinition::new("idemkv_markers");
pub(crate) const META_FORMAT: &str = "format";
pub(crate) const META_TOKEN_HWM: &str = "token_hwm";
/// The number of records the chunks hold (u64 LE), kept by every commit that changes it: it
/// sizes the index before recovery's scan, and a scan that finds fewer (a damaged key can end
/// a range scan early without any checksum failing) refuses the file.
pub(crate) const META_RECORD_COUNT: &str = "record_count";
/// The next outbox id: ids are never reused, also after every message was marked sent.
pub(crate) const META_OUTBOX_NEXT: &str = "outbox_next";
/// The secret that keys the index's hashes (`index::KeyHasher`), drawn when the file is
/// first opened for writing and never changed: markers name keys by these hashes.
pub(crate) const META_HASH_SECRET: &str = "hash_secret";
/// The commit log's state as the file last recorded it (`commit_log/`): its epoch, the
/// number of that epoch's frames the file holds, and whether an engine was writing the log
/// (1) or closed it with a checkpoint (0). 17 bytes; absent: no log was ever used.
pub(crate) const META_LOG_STATE: &str = "log_state";
