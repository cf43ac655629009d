//! The builder's defaults and hard ceilings: limits a user may tighten are defaults for
//! [`crate::EngineBuilder`]; the `_LIMIT` constants are ceilings the builder refuses to
//! exceed. Also the shared backend's settings defaults (feature `postgres`).

use std::time::Duration;

/// Default longest key, in bytes. Stripe allows 255; idempotency keys are usually UUIDs.
pub(crate) const KEY_LEN_MAX_DEFAULT: usize = 255;
/// Hard ceiling for the key length a builder may configure.
pub(crate) const KEY_LEN_LIMIT: usize = 4096;
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
/// Default number of index stripes (a power of two).
pub(crate) const STRIPES_DEFAULT: usize = 256;
/// Hard ceiling for the number of stripes.
pub(crate) const STRIPES_LIMIT: usize = 1 << 16;
/// Default lease of a claim.
pub(crate) const LEASE_DEFAULT: Duration = Duration::from_secs(30);
/// Default retention of a completed record.
pub(crate) const RETENTION_DEFAULT: Duration = Duration::from_secs(24 * 3600);
/// Hard ceiling for a key's own retention (`ClaimOptions::retention`,
/// `CompleteOptions::retention`): ten years. A record kept longer defeats the bounded store
/// the sweeper maintains, and the ceiling keeps every deadline far from saturating.
pub(crate) const RETENTION_LIMIT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Default time `run` waits for another holder of the same key before giving up.
pub(crate) const WAIT_DEFAULT: Duration = Duration::from_secs(60);
/// Default bound of the keep-alive that `run`, `run_typed` and `run_async` give their
/// handler: a live handler keeps its key this long however short its lease, and a handler
/// that hangs longer loses it one lease later. Ten minutes is the longest acknowledgement
/// deadline the common brokers allow by default (Pub/Sub's maximum, above Kafka's five-minute
/// poll interval), so a consumer that its broker still considers alive keeps its key.
pub(crate) const KEEP_ALIVE_MAX_DEFAULT: Duration = Duration::from_secs(10 * 60);
/// Longest marker retention a builder may configure (`EngineBuilder::marker_retention`):
/// markers are kept in memory, so their window is bounded like every other count.
pub(crate) const MARKER_RETENTION_LIMIT: Duration = Duration::from_secs(400 * 24 * 3600);
/// Default most keys held (InFlight plus Completed); past it new keys get `Overloaded`.
pub(crate) const KEYS_MAX_DEFAULT: usize = 64 << 20;
/// Permission bits of a file the engine creates: it holds every stored response, so only
/// its owner may read it.
pub(crate) const FILE_MODE_DEFAULT: u32 = 0o600;
/// Default most claims one `Admin::abandoned` (or `FileReader::abandoned`) listing returns.
pub(crate) const ABANDONED_LIMIT_DEFAULT: usize = 1000;
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
/// Claim statements one shared engine has in flight at once by default; claims asked while
/// all are busy wait and go together in the next (`shared/batch.rs`). One measured best on
/// the duplicate-heavy peers workload, at one process and at four (docs/shared.md,
/// "Batches").
#[cfg(feature = "postgres")]
pub(crate) const PG_BATCH_LANES_DEFAULT: usize = 1;
/// Completion statements (without writes) one shared engine has in flight at once by
/// default; completions asked while all are busy go together in the next, one commit
/// (`shared/batch.rs`; docs/shared.md, "Batches").
#[cfg(feature = "postgres")]
pub(crate) const PG_COMPLETE_LANES_DEFAULT: usize = 2;
