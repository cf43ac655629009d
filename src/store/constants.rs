//! Constants of the file and the commit log: the format's magic, cache sizes, the log's
//! size and blocks, and when a clean close compacts the file.

/// Times an open that creates a file starts over because another process placed a file at
/// the path meanwhile (each start over then opens that file).
pub(crate) const CREATE_ATTEMPTS_MAX: u32 = 4;
/// redb page cache of a read-only handle (operator commands scan the file once).
pub(crate) const READER_CACHE_BYTES: usize = 16 << 20;
/// redb page cache for the engine's file.
pub(crate) const REDB_CACHE_BYTES: usize = 64 << 20;
/// Marks a redb file as an idemkv file of the current format. A writable open of a file of
/// the previous format rewrites its marker, so that an older engine refuses the file
/// instead of misreading the records this one adds.
/// Format 5: records packed into chunks (`chunk.rs`), each record in record format 4 or an
/// older one.
pub(crate) const FORMAT_MAGIC: &[u8; 8] = b"idemkv\0\x05";
/// The markers of the previous formats (1 to 4: one record per row of a records table),
/// whose files are still opened: in place by a reader, converted by a writer.
pub(crate) const FORMAT_MAGICS_OLD: [&[u8; 8]; 4] = [
    b"idemkv\0\x01",
    b"idemkv\0\x02",
    b"idemkv\0\x03",
    b"idemkv\0\x04",
];
/// redb's page, its default (the engine never sets another).
pub(crate) const REDB_PAGE_BYTES: u64 = 4096;
/// Most bytes of a chunk of records (`chunk.rs`): one chunk fills one 4 KiB redb leaf. A
/// leaf holding one entry of a fixed-width key and a variable value takes 4 bytes of
/// header, 4 of value end offset, the 8-byte `u64` key and the value (redb 4.6,
/// `RawLeafBuilder::required_bytes`): 4096 − 16.
pub(crate) const CHUNK_BYTES_MAX: usize = REDB_PAGE_BYTES as usize - 16;
/// A clean close compacts the file when at least this share of it (in percent) is
/// estimated unused. redb grows a file by doubling it (up to its 4 GiB regions) and leaves
/// the pages a run freed where they are, so a file closed as it is holds anywhere from none
/// to about half free pages (docs/benchmarks.md, "Disk per record"). A compaction costs
/// close time in proportion to the pages it moves; below 5 % the gain is small, and a file
/// at most 5 % unused keeps the default engine's records within their disk budget of
/// 1.5 × (key + response) (a compacted file holds them at 0.94 × that budget and less).
pub(crate) const COMPACT_UNUSED_PERCENT_MIN: u64 = 5;
/// ... and when at least this many bytes are: a compaction reads every page of the file
/// and makes a few durable commits (two fsyncs each) whatever it moves, not worth it at
/// every close of a small file for less than a mebibyte.
pub(crate) const COMPACT_UNUSED_BYTES_MIN: u64 = 1 << 20;
/// Size of the commit log file, written in full when it is created so that appends never
/// change its size or block map (a durable write flushes data only). A batch whose frame no
/// longer fits is committed as a checkpoint, which starts the log again: at ~150 bytes per
/// write this is about 100 000 writes between checkpoints under load, and at least 4 096
/// frames (one padded block each) when every batch is small.
pub(crate) const LOG_BYTES: u64 = 16 << 20;
/// The block of the commit log file's direct writes (`O_DIRECT`): frames are padded to a
/// multiple of it, and written from a buffer aligned to it. A multiple of the logical block
/// of the devices in use (512 and 4096 bytes), so a direct write is accepted on either.
pub(crate) const LOG_BLOCK_BYTES: u64 = 4096;
/// The commit log file's aligned buffer for direct writes is dropped after a write that grew
/// it past this (the zeros at creation, a frame of large responses), and kept below it: a
/// frame of 64 ordinary writes is about 8 KiB.
pub(crate) const DIRECT_BUFFER_KEPT_BYTES: usize = 1 << 20;
/// The write size used to fill a new commit log with zeros.
pub(crate) const LOG_ZERO_CHUNK_BYTES: usize = 4 << 20;
/// The OS error an injected write or `set_len` failure carries (`FaultyStorage`): ENOSPC,
/// a full disk, the failure a write meets most.
pub(crate) const INJECTED_WRITE_ERRNO: i32 = 28;
/// The OS error an injected sync or read failure carries (`FaultyStorage`): EIO, what a
/// failing device reports.
pub(crate) const INJECTED_IO_ERRNO: i32 = 5;
