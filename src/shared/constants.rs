//! Constants of the shared backend over PostgreSQL (feature `postgres`, docs/shared.md).

use std::time::Duration;

/// The schema version this build creates and reads (the version row of the meta table).
#[cfg(feature = "postgres")]
pub(crate) const PG_SCHEMA_VERSION: i64 = 8;
/// Longest lease or retention sent to the database (about 100 years): the interval and
/// the timestamp it is added to stay far inside PostgreSQL's ranges, and the microsecond
/// count stays exact in a double.
#[cfg(feature = "postgres")]
pub(crate) const PG_INTERVAL_MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// Keys one batched claim statement carries at most.
#[cfg(feature = "postgres")]
pub(crate) const PG_BATCH_MAX: usize = 64;
/// SQLSTATE `deadlock_detected`: the server rolled the transaction back.
#[cfg(feature = "postgres")]
pub(crate) const PG_DEADLOCK_DETECTED: &str = "40P01";
/// SQLSTATE `serialization_failure`: the server rolled the transaction back.
#[cfg(feature = "postgres")]
pub(crate) const PG_SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE `insufficient_privilege`.
#[cfg(feature = "postgres")]
pub(crate) const PG_INSUFFICIENT_PRIVILEGE: &str = "42501";
/// SQLSTATE `undefined_function`.
#[cfg(feature = "postgres")]
pub(crate) const PG_UNDEFINED_FUNCTION: &str = "42883";
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
/// Reads of the server's lifetime token before giving up: a read misses only a token
/// another session wrote meanwhile, which the next read sees.
#[cfg(feature = "postgres")]
pub(crate) const PG_LIFE_READS_MAX: usize = 3;
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
/// After a direct connection (`shared/direct.rs`) failed to open, blocking calls use the
/// pool alone for this long: a server that refuses or does not answer then costs each call
/// one connection attempt, not two.
#[cfg(feature = "postgres")]
pub(crate) const PG_DIRECT_OPEN_RETRY: Duration = Duration::from_secs(1);
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
/// (`shared/batch.rs`; docs/shared.md, "Batches"). One measured best on the peers
/// workload once the batch was planned per execution (a batch takes about 0.16 ms on the
/// server): more completions share each commit, and a completion's wait behind the batch
/// in flight costs less than the WAL flushes it saves (docs/shared-throughput.md).
#[cfg(feature = "postgres")]
pub(crate) const PG_COMPLETE_LANES_DEFAULT: usize = 1;
