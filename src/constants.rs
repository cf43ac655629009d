//! Every limit and tuning constant of the engine, in one place.
//!
//! Limits that a user may tighten are defaults for [`crate::EngineBuilder`]; the `_LIMIT`
//! constants are hard ceilings that the builder refuses to exceed.

use std::time::Duration;

/// Default longest key, in bytes. Stripe allows 255; idempotency keys are usually UUIDs.
pub(crate) const KEY_LEN_MAX_DEFAULT: usize = 255;
/// Hard ceiling for the key length a builder may configure.
pub(crate) const KEY_LEN_LIMIT: usize = 4096;

/// Longest scope, in bytes ([`crate::ClaimOptions::scope`]): a tenant, client or operation
/// name, or a hash of one. Inside the engine a scoped key is the scope's length (one byte),
/// the scope and the key, so the ceiling is a byte's.
pub(crate) const SCOPE_LEN_MAX: usize = 255;
/// Stack buffer for building a scoped key: two cache lines, enough for the usual scope and
/// key (an id, a UUID, a hash in hex), cheap to clear on every call. A longer one is built
/// on the heap, then copied into its shared allocation: one allocation more.
pub(crate) const SCOPED_STACK_LEN: usize = 128;

/// Default largest stored response, in bytes.
pub(crate) const RESPONSE_LEN_MAX_DEFAULT: usize = 1 << 20;
/// Hard ceiling for a response: redb values stay far below its 3 GiB value limit, and one
/// response can never dominate a group commit.
pub(crate) const RESPONSE_LEN_LIMIT: usize = 64 << 20;

/// Default largest checkpoint payload, in bytes.
pub(crate) const CHECKPOINT_LEN_MAX_DEFAULT: usize = 64 << 10;
/// Hard ceiling for a checkpoint payload.
pub(crate) const CHECKPOINT_LEN_LIMIT: usize = 16 << 20;

/// Default number of keys that may be InFlight at once.
pub(crate) const INFLIGHT_MAX_DEFAULT: usize = 1 << 20;

/// Default capacity of the writer queue, in operations.
pub(crate) const QUEUE_DEPTH_DEFAULT: usize = 16 << 10;
/// Smallest writer queue a builder may configure: the claim headroom below needs room.
pub(crate) const QUEUE_DEPTH_MIN: usize = 16;
/// Hard ceiling for the writer queue.
pub(crate) const QUEUE_DEPTH_LIMIT: usize = 1 << 20;
/// Fraction (1/N) of the writer queue kept free of new claims, so that holders can still
/// complete or release when claims have filled the rest.
pub(crate) const QUEUE_CLAIM_HEADROOM_DIVISOR: usize = 8;

/// Most times one claim or `get` looks at its key again after a race it cannot win by
/// waiting (tokens being reserved, room being made, a stored record replaced before it could
/// be read). Each look follows real progress by others, so this is never reached in
/// practice; it only guarantees that no call loops forever.
pub(crate) const CLAIM_LOOKS_MAX: u32 = 64;

/// Most operations the writer puts in one redb transaction.
pub(crate) const BATCH_OPS_MAX: usize = 8192;
/// Largest encoded record a queued operation carries inline (`codec::Encoded`); a larger one
/// goes on the heap. A record allocated by the caller and freed by the writer costs both
/// threads glibc's slow paths (measured: the writer's frees of record buffers took a fifth
/// of a sustained `Buffered` writer's cycle). 240 bytes hold a completion with a 36-byte key
/// and a 100-byte response; each queue slot and batch entry grows by about that much.
pub(crate) const RECORD_INLINE_BYTES: usize = 240;
/// Side-data boxes a stripe keeps for reuse (`index.rs`). A claim allocates one for its
/// InFlight slot and the completion's publication frees it, usually on another thread:
/// both sides pay glibc's paths under the stripe lock. Kept boxes are counted in the
/// stripe's memory (about 1.5 KB per stripe at most).
pub(crate) const SPARE_EXTRAS_PER_STRIPE: usize = 8;
/// `Buffered` gathering (`gather.rs`): operations taken between two readings of the clock
/// against the batch's deadline. A reading costs tens of nanoseconds; a batch holds
/// thousands of operations, so this checks it often enough at a small fraction of the cost.
pub(crate) const GATHER_DEADLINE_CHECK_OPS: usize = 64;
/// `Buffered` admission (`admission.rs`): a commit smaller than this does not update the
/// writer's measured rate (its time is mostly the fsync).
pub(crate) const ADMIT_BATCH_OPS_MIN: usize = 256;
/// `Buffered` admission: the fewest queued operations new claims are ever held to. The
/// `2 × max_delay` bound holds while the writer commits at least this many per `max_delay`
/// (205 k operations/s at the default 10 ms; this machine's writer commits 250–450 k over
/// its whole cycle, fewer as the file and the index grow).
pub(crate) const ADMIT_CLAIMS_MIN: u64 = 2048;
/// `Buffered` admission: new claims are admitted while what is acknowledged but not yet
/// durable is under this share of what the writer commits in one `max_delay`. An
/// acknowledged operation then waits for at most that backlog and its own batch (no larger):
/// `2 × share × max_delay`, 1.5 × at 0.75, leaving a quarter of `max_delay` of the
/// documented `2 × max_delay` for fsync stalls and scheduling. Measured under saturation
/// (docs/benchmarks.md), with the rate timed over the commit alone (about twice the real
/// one): 0.5 gave 11–16 ms at 10 ms and 0.75 14–18 ms with 1.1–1.5× the throughput; 1.0
/// reached 21 ms. With the rate timed over the whole cycle, 0.75 gave 10–18 ms.
pub(crate) const ADMIT_BACKLOG_SHARE: f64 = 0.75;
/// `Buffered` admission: the weight of the newest measurement in the rate's moving average.
pub(crate) const ADMIT_RATE_WEIGHT: f64 = 0.25;

/// Default number of index stripes (a power of two).
pub(crate) const STRIPES_DEFAULT: usize = 256;
/// Hard ceiling for the number of stripes.
pub(crate) const STRIPES_LIMIT: usize = 1 << 16;

/// Tokens reserved ahead in the durable high-water mark. Every issued token is below the
/// durable mark, so a crash can never make a token repeat. Must exceed `QUEUE_DEPTH_LIMIT`
/// so that one commit always covers every token queued behind it.
pub(crate) const TOKEN_RESERVE: u64 = 1 << 22;

/// Oldest the system clock's wall offset may be before a transition measures it again
/// (`clock::Time`): a step of the wall clock shows in readings within this long. Reading
/// the wall clock costs a transition as much as the monotonic read it derives from; at
/// this age the re-measurement is ten reads a second, whatever the load.
pub(crate) const WALL_OFFSET_AGE_NS_MAX: u64 = 100_000_000;

/// Default lease of a claim.
pub(crate) const LEASE_DEFAULT: Duration = Duration::from_secs(30);
/// Default retention of a completed record.
pub(crate) const RETENTION_DEFAULT: Duration = Duration::from_secs(24 * 3600);
/// Hard ceiling for a key's own retention (`ClaimOptions::retention`,
/// `CompleteOptions::retention`): ten years. A record kept longer defeats the bounded store
/// the sweeper maintains, and the ceiling keeps every deadline far from saturating.
pub(crate) const RETENTION_LIMIT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Default most a `Buffered` acknowledgement may wait before it is durable.
pub(crate) const BUFFERED_DELAY_DEFAULT: Duration = Duration::from_millis(10);
/// Default time `run` waits for another holder of the same key before giving up.
pub(crate) const WAIT_DEFAULT: Duration = Duration::from_secs(60);
/// Retry hint given while a completion is written but not yet durable.
pub(crate) const RETRY_AFTER_UNPUBLISHED: Duration = Duration::from_millis(1);
/// Longest real-time slice a waiter sleeps before it looks at the clock again. A waiter is
/// woken by every state change of its stripe; the slice only bounds the cost of a clock
/// that cannot notify (wall-clock jumps, foreign clocks).
pub(crate) const WAIT_SLICE_MAX: Duration = Duration::from_millis(250);

/// Backstop for a thread waiting for durability: every change it waits for (a new watermark,
/// poison, the writer stopping) wakes it, so this timeout only bounds the cost of a bug.
pub(crate) const ACK_POLL: Duration = Duration::from_millis(100);

/// Most acknowledged batches waiting for the applier (with the commit log): the applier
/// takes all of them into its next durable commit, and the writer waits for room beyond
/// this, which bounds the responses kept in memory until the file holds them.
pub(crate) const APPLY_JOBS_MAX: usize = 64;
/// Shortest time between two of the applier's commits (with the commit log). Each commit
/// flushes the device twice, and the callers' acknowledgements wait for the log's own
/// flushes on the same device: at most a few hundred file commits a second keep the log's
/// writes from queueing behind them, while a reader of the live file sees the engine's
/// state this much behind, at most.
pub(crate) const APPLY_INTERVAL: Duration = Duration::from_millis(10);
/// Backstop for the writer waiting for the applier, and the applier for its next batch:
/// every hand-over, apply and stop notifies, so this timeout only bounds the cost of a bug.
pub(crate) const APPLIER_POLL: Duration = Duration::from_millis(100);
/// Default bound of the keep-alive that `run`, `run_typed` and `run_async` give their
/// handler: a live handler keeps its key this long however short its lease, and a handler
/// that hangs longer loses it one lease later. Ten minutes is the longest acknowledgement
/// deadline the common brokers allow by default (Pub/Sub's maximum, above Kafka's five-minute
/// poll interval), so a consumer that its broker still considers alive keeps its key.
pub(crate) const KEEP_ALIVE_MAX_DEFAULT: Duration = Duration::from_secs(10 * 60);
/// A kept-alive lease is renewed when this fraction of it has passed (every third), so a
/// renewal delayed by a full queue or a busy machine still lands before the lease ends.
pub(crate) const KEEP_ALIVE_DIVISOR: u64 = 3;
/// Shortest real-time slice a waiter sleeps, so that a tiny retry hint never spins.
pub(crate) const WAIT_SLICE_MIN: Duration = Duration::from_millis(1);

/// Default time between two background sweeps.
pub(crate) const SWEEP_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// Most expiry entries the sweeper works off per stripe-lock hold (leases ended, keys
/// removed, stale entries dropped): bounds how long a claim can wait behind it (a few tens of
/// microseconds). Also the most a claim at the key budget reclaims per stripe it visits.
pub(crate) const SWEEP_STRIPE_BATCH: usize = 256;
/// Work the background sweeper does before it pauses for `SWEEP_PAUSE`.
pub(crate) const SWEEP_STEP_BUDGET: Duration = Duration::from_millis(2);
/// The background sweeper's pause between steps, and while the writer queue is busy.
pub(crate) const SWEEP_PAUSE: Duration = Duration::from_millis(1);

/// A stripe's expiry queue is compacted once its stale entries (left by keys that changed)
/// outnumber its current ones by this many: O(1) amortized per stale entry, rare enough that
/// few calls pay for one (most stale entries are popped by trimming first), and it keeps a
/// queue within about twice its keys plus this.
pub(crate) const EXPIRY_COMPACT_SLACK: usize = 1024;
/// Stale entries a settling lease pops off the top of its stripe's lease heap (one lookup
/// each): more than the one it leaves, so the heap drains whenever its top is stale.
pub(crate) const EXPIRY_TRIM_MAX: usize = 4;

/// Longest marker retention a builder may configure (`EngineBuilder::marker_retention`):
/// markers are kept in memory, so their window is bounded like every other count.
pub(crate) const MARKER_RETENTION_LIMIT: Duration = Duration::from_secs(400 * 24 * 3600);
/// Bytes of the secret that keys the index's hashes (two SipHash keys of 16 bytes: one for
/// the table and stripe hash, one for the markers' second hash), kept in the file's meta
/// table so that hashes are the same after a restart.
pub(crate) const HASH_SECRET_LEN: usize = 32;

/// Default most keys held (InFlight plus Completed); past it new keys get `Overloaded`.
pub(crate) const KEYS_MAX_DEFAULT: usize = 64 << 20;

/// Most records recovery pre-sizes the index for; a larger (or damaged) count just grows.
pub(crate) const RECOVERY_PRESIZE_MAX: u64 = 1 << 24;

/// Threads that scan the file on open (the machine class has two cores).
pub(crate) const RECOVERY_THREADS_MAX: u64 = 2;

/// Permission bits of a file the engine creates: it holds every stored response, so only
/// its owner may read it.
pub(crate) const FILE_MODE_DEFAULT: u32 = 0o600;

/// Times an open that creates a file starts over because another process placed a file at
/// the path meanwhile (each start over then opens that file).
pub(crate) const CREATE_ATTEMPTS_MAX: u32 = 4;

/// redb page cache of a read-only handle (operator commands scan the file once).
pub(crate) const READER_CACHE_BYTES: usize = 16 << 20;

/// redb page cache for the engine's file.
pub(crate) const REDB_CACHE_BYTES: usize = 64 << 20;

/// Version of the record encoding. Bumped on any incompatible change.
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The oldest record version still read (and converted on the way in); never written. Every
/// version from it up to [`FORMAT_VERSION`] is read.
pub(crate) const FORMAT_VERSION_READ_MIN: u32 = 1;
/// Version of the marker row encoding (the markers table, docs/retention.md). Bumped on any
/// incompatible change.
pub(crate) const MARKER_FORMAT_VERSION: u32 = 1;
/// Marks a redb file as an idemkv file of the current format. A writable open of a file of
/// the previous format rewrites its marker, so that an older engine refuses the file
/// instead of misreading the records this one adds.
pub(crate) const FORMAT_MAGIC: &[u8; 8] = b"idemkv\0\x03";
/// The markers of the previous formats (1 and 2), whose files are still opened.
pub(crate) const FORMAT_MAGICS_OLD: [&[u8; 8]; 2] = [b"idemkv\0\x01", b"idemkv\0\x02"];

// Request fingerprints (src/fingerprint.rs). Fingerprints are persisted: changing an
// encoding or a context string changes every fingerprint and needs a new context.

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

// Application tables and the outbox (`write_set.rs`, `tables.rs`, `outbox.rs`). Hard limits:
// a write set rides in one queued operation and is committed in one transaction, so each
// bounds what one completion can make the writer do.

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
/// Most rows one table scan returns, and most messages one `Outbox::pending` returns or
/// one `Outbox::mark_sent` removes.
pub(crate) const TABLE_SCAN_LIMIT_MAX: usize = 10_000;
/// Default most claims one `Admin::abandoned` (or `FileReader::abandoned`) listing returns.
pub(crate) const ABANDONED_LIMIT_DEFAULT: usize = 1000;

// The Idempotency-Key layer for HTTP services (feature `http`, src/http/).

/// Default longest Idempotency-Key, in bytes after unescaping: the engine's default key
/// limit (the scope is carried apart and has its own), so that a default layer on a
/// default engine never passes a key the engine refuses.
#[cfg(feature = "http")]
pub(crate) const HTTP_KEY_LEN_MAX_DEFAULT: usize = KEY_LEN_MAX_DEFAULT;
/// Default largest request body buffered for the fingerprint (1 MiB); larger ones get 413.
#[cfg(feature = "http")]
pub(crate) const HTTP_BODY_LEN_MAX_DEFAULT: usize = 1 << 20;
/// Retry-After, in seconds, of a 503 for an engine limit (which gives no hint of its own).
#[cfg(feature = "http")]
pub(crate) const HTTP_OVERLOADED_RETRY_AFTER_SECS: u64 = 1;
/// Version of the stored-response encoding (after its magic). Bumped on any incompatible
/// change; a stored response of an unknown version is answered with 500, never misread.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_VERSION: u8 = 1;
/// Most header values a stored response carries. Stored values are untrusted (a damaged
/// file, an `import`, the shared table): the decoder checks every count and length against
/// these limits before it reads or allocates, and the encoder keeps to them, so that every
/// response it stores decodes. Far above what the allow-listed headers of one response hold.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_HEADERS_MAX: usize = 100;
/// Longest header name of a stored response, in bytes.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_HEADER_NAME_LEN_MAX: usize = 256;
/// Longest header value of a stored response, in bytes (8 KiB, a common server's limit for
/// a whole header line).
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_HEADER_VALUE_LEN_MAX: usize = 8 << 10;
/// Most bytes of header names and values one stored response carries in all.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_HEADERS_LEN_MAX: usize = 64 << 10;
/// Largest stored response, in bytes: the engine's ceiling for any stored response, which no
/// `response_len_max` can raise.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_LEN_MAX: usize = RESPONSE_LEN_LIMIT;

// The shared backend over PostgreSQL (feature `postgres`, src/shared/, docs/shared.md).

/// Default number of pooled connections of one shared engine (the listener is one more).
#[cfg(feature = "postgres")]
pub(crate) const PG_POOL_SIZE_DEFAULT: usize = 8;
/// Most pooled connections a `PostgresConfig` may ask for.
#[cfg(feature = "postgres")]
pub(crate) const PG_POOL_SIZE_LIMIT: usize = 1024;
/// Default server-side `statement_timeout` of the backend's connections.
#[cfg(feature = "postgres")]
pub(crate) const PG_STATEMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default time to open a connection, or to wait for a free one in the pool.
#[cfg(feature = "postgres")]
pub(crate) const PG_CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Shortest statement or connect timeout accepted.
#[cfg(feature = "postgres")]
pub(crate) const PG_TIMEOUT_MIN: Duration = Duration::from_millis(1);
/// Longest statement or connect timeout accepted.
#[cfg(feature = "postgres")]
pub(crate) const PG_TIMEOUT_LIMIT: Duration = Duration::from_secs(3600);
/// Default prefix of the backend's tables, sequence and channel.
#[cfg(feature = "postgres")]
pub(crate) const PG_TABLE_PREFIX_DEFAULT: &str = "idemkv_";
/// Longest table prefix: with the longest schema it keeps every name (and the notification
/// channel) under PostgreSQL's 63-byte identifier limit.
#[cfg(feature = "postgres")]
pub(crate) const PG_TABLE_PREFIX_LEN_MAX: usize = 30;
/// Longest schema name.
#[cfg(feature = "postgres")]
pub(crate) const PG_SCHEMA_LEN_MAX: usize = 20;
/// The schema version this build creates and reads (the version row of the meta table).
#[cfg(feature = "postgres")]
pub(crate) const PG_SCHEMA_VERSION: i64 = 5;
/// Longest lease or retention sent to the database (about 100 years): the interval and
/// the timestamp it is added to stay far inside PostgreSQL's ranges, and the microsecond
/// count stays exact in a double.
#[cfg(feature = "postgres")]
pub(crate) const PG_INTERVAL_MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// Claim statements one shared engine has in flight at once by default; claims asked while
/// all are busy wait and go together in the next (`shared/batch.rs`). One measured best on
/// the duplicate-heavy peers workload, at one process and at four (docs/shared.md,
/// "Batches").
#[cfg(feature = "postgres")]
pub(crate) const PG_BATCH_LANES_DEFAULT: usize = 1;
/// Keys one batched claim statement carries at most.
#[cfg(feature = "postgres")]
pub(crate) const PG_BATCH_MAX: usize = 64;
/// SQLSTATE `deadlock_detected`: the server rolled the transaction back.
#[cfg(feature = "postgres")]
pub(crate) const PG_DEADLOCK_DETECTED: &str = "40P01";
/// SQLSTATE `serialization_failure`: the server rolled the transaction back.
#[cfg(feature = "postgres")]
pub(crate) const PG_SERIALIZATION_FAILURE: &str = "40001";
/// Times one claim asks the database again after a statement that could not decide from
/// its snapshot (a row committed or changed between the statement's snapshot and its
/// conflict check). Each re-ask follows a commit by another caller.
#[cfg(feature = "postgres")]
pub(crate) const PG_CLAIM_ASKS_MAX: u32 = 16;
/// Most a waiter on a key held by another process sleeps before asking the database
/// again when no notification woke it (a notification lost with the listening
/// connection): the poll is bounded, and never faster than a lease's end.
#[cfg(feature = "postgres")]
pub(crate) const PG_WAIT_POLL_MAX: Duration = Duration::from_secs(1);
/// Shortest sleep of a waiter before asking again, so that a tiny remaining lease never
/// turns into a loop of statements.
#[cfg(feature = "postgres")]
pub(crate) const PG_WAIT_POLL_MIN: Duration = Duration::from_millis(2);
/// Completed records one shared engine caches for replays without a round trip.
#[cfg(feature = "postgres")]
pub(crate) const PG_CACHE_ENTRIES_MAX: usize = 64 << 10;
/// Response bytes one shared engine caches; a larger response is never cached.
#[cfg(feature = "postgres")]
pub(crate) const PG_CACHE_BYTES_MAX: usize = 64 << 20;
/// Stripes of the local front (a power of two).
#[cfg(feature = "postgres")]
pub(crate) const PG_FRONT_STRIPES: usize = 64;
/// Rows one sweep statement deletes at most (retention and abandoned claims).
#[cfg(feature = "postgres")]
pub(crate) const PG_SWEEP_BATCH: i64 = 1000;
/// Sweep statements one background pass issues at most before it waits for the next.
#[cfg(feature = "postgres")]
pub(crate) const PG_SWEEP_BATCHES_PER_PASS: u32 = 16;
/// How long the listening connection keeps listening after the last waiting claim of its
/// engine returned: waits that follow each other closely do not each pay a `LISTEN`.
#[cfg(feature = "postgres")]
pub(crate) const PG_LISTEN_IDLE: Duration = Duration::from_secs(2);
/// Wake-up stripes: a completion notifies only when a listening connection holds its
/// key's stripe (docs/shared.md, "Wake-ups"). Completions of one stripe at once contend
/// for its lock (the loser notifies needlessly), and each listening engine holds one lock
/// per stripe in the server's shared lock table (`max_locks_per_transaction` ×
/// `max_connections` slots): 16 keeps both small.
#[cfg(feature = "postgres")]
pub(crate) const PG_WAKE_STRIPES: u32 = 16;
/// Pause of the listening connection before it connects again after losing its link.
#[cfg(feature = "postgres")]
pub(crate) const PG_LISTEN_RETRY: Duration = Duration::from_millis(500);
/// The longest payload of one wake-up notification, in bytes (PostgreSQL refuses 8000
/// and more); a batch of key hashes longer than this is sent as several notifications.
#[cfg(feature = "postgres")]
pub(crate) const PG_NOTIFY_PAYLOAD_BYTES_MAX: usize = 7900;
/// Worker threads of the private runtime that drives a shared engine's connections.
#[cfg(feature = "postgres")]
pub(crate) const PG_RUNTIME_THREADS: usize = 2;
/// How long `close` waits for calls still running on the backend's runtime (a release
/// sent by a dropped lease) before it stops the runtime.
#[cfg(feature = "postgres")]
pub(crate) const PG_CLOSE_GRACE: Duration = Duration::from_secs(5);

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
