//! The builder's defaults and hard ceilings: limits a user may tighten are defaults for
//! [`crate::EngineBuilder`]; the `_LIMIT` constants are ceilings the builder refuses to
//! exceed.

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
