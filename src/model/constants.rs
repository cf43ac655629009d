//! Limits of the values the state machine works on (keys, scopes, write sets, fingerprints)
//! and the record format's versions.

use std::time::Duration;

/// Longest scope, in bytes ([`crate::ClaimOptions::scope`]): a tenant, client or operation
/// name, or a hash of one. Inside the engine a scoped key is the scope's length (one byte),
/// the scope and the key, so the ceiling is a byte's.
pub(crate) const SCOPE_LEN_MAX: usize = 255;
/// Stack buffer for building a shared scoped key (`scope::scoped_shared`: one longer than
/// `SCOPED_INLINE_LEN`, or a remote backend's): two cache lines, cheap to clear. A longer
/// one is built on the heap, then copied into its shared allocation: one allocation more.
pub(crate) const SCOPED_STACK_LEN: usize = 128;
/// Longest scoped key a call keeps inline (`scope::ScopedKey`), without an allocation: a
/// UUID in text with a short scope fits. A call builds one on every claim, and most claims
/// (replays, copies that find the key in progress) hand out no lease to share it with.
pub(crate) const SCOPED_INLINE_LEN: usize = 62;
/// Largest encoded record a queued operation carries inline (`codec::Encoded`); a larger one
/// goes on the heap. A record allocated by the caller and freed by the writer costs both
/// threads glibc's slow paths (measured: the writer's frees of record buffers took a fifth
/// of a sustained `Buffered` writer's cycle). 240 bytes hold a completion with a 36-byte key
/// and a 100-byte response; each queue slot and batch entry grows by about that much.
pub(crate) const RECORD_INLINE_BYTES: usize = 240;
/// Tokens reserved ahead in the durable high-water mark. Every issued token is below the
/// durable mark, so a crash can never make a token repeat. Must exceed `QUEUE_DEPTH_LIMIT`
/// so that one commit always covers every token queued behind it.
pub(crate) const TOKEN_RESERVE: u64 = 1 << 22;
/// Default most a `Buffered` acknowledgement may wait before it is durable.
pub(crate) const BUFFERED_DELAY_DEFAULT: Duration = Duration::from_millis(10);
/// Retry hint given while a completion is written but not yet durable.
pub(crate) const RETRY_AFTER_UNPUBLISHED: Duration = Duration::from_millis(1);
/// A stripe's expiry queue is compacted once its stale entries (left by keys that changed)
/// outnumber its current ones by this many: O(1) amortized per stale entry, rare enough that
/// few calls pay for one (most stale entries are popped by trimming first), and it keeps a
/// queue within about twice its keys plus this.
pub(crate) const EXPIRY_COMPACT_SLACK: usize = 1024;
/// Version of the record encoding. Bumped on any incompatible change. Written as one byte
/// (format 4 on); the versions up to [`FORMAT_VERSION_FIXED_MAX`] were a u32 LE.
pub(crate) const FORMAT_VERSION: u32 = 4;
/// The last record version written with a 4-byte version and fixed-width integers.
pub(crate) const FORMAT_VERSION_FIXED_MAX: u32 = 3;
/// The oldest record version still read (and converted on the way in); never written. Every
/// version from it up to [`FORMAT_VERSION`] is read.
pub(crate) const FORMAT_VERSION_READ_MIN: u32 = 1;
/// Version of the marker row encoding (the markers table, docs/retention.md). Bumped on any
/// incompatible change.
pub(crate) const MARKER_FORMAT_VERSION: u32 = 1;
/// Deepest nesting `Fingerprint::of` accepts: the top value is at depth 0, and every value
/// inside another (an element, a map key or value, a field, an `Option`'s or a newtype's
/// content, a variant's content) one deeper. serde_json parses at most 128 levels of
/// arrays and objects, so every `serde_json::Value` it produces fits.
pub(crate) const FINGERPRINT_DEPTH_MAX: usize = 128;
/// Longest canonical encoding `Fingerprint::of` builds, in bytes (it is held in memory
/// while maps are sorted). A JSON document grows at most about 8.5 times (`1,` becomes a
/// 17-byte integer), so any parsed body up to 7 MiB fits.
pub(crate) const FINGERPRINT_ENCODING_LEN_MAX: usize = 64 << 20;
/// BLAKE3 key-derivation context of `Fingerprint::of_bytes` (raw bytes).
pub(crate) const FINGERPRINT_CONTEXT_BYTES: &str = "idemkv 2026 request fingerprint v1: raw bytes";
/// BLAKE3 key-derivation context of `Fingerprint::of` (the canonical encoding of a value).
pub(crate) const FINGERPRINT_CONTEXT_VALUE: &str =
    "idemkv 2026 request fingerprint v1: canonical serde value";
/// Longest application table name, in bytes (stored as a one-byte length before the name).
pub(crate) const TABLE_NAME_LEN_MAX: usize = 64;
/// Longest key of an application table row, in bytes.
pub(crate) const TABLE_KEY_LEN_MAX: usize = 1024;
/// Largest value of an application table row, in bytes.
pub(crate) const TABLE_VALUE_LEN_MAX: usize = 1 << 20;
/// Largest outbox message, in bytes.
pub(crate) const OUTBOX_MESSAGE_LEN_MAX: usize = 1 << 20;
/// Most operations (puts, deletes and emitted messages) in one write set.
pub(crate) const WRITE_SET_OPS_MAX: usize = 1024;
/// Most bytes in one write set: table names, keys, values and messages added up.
pub(crate) const WRITE_SET_BYTES_MAX: usize = 4 << 20;
