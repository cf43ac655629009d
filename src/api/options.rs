//! Configuration: durability modes, claim options and the engine builder.

use crate::api::constants::{
    CHECKPOINT_LEN_LIMIT, CHECKPOINT_LEN_MAX_DEFAULT, FILE_MODE_DEFAULT, INFLIGHT_MAX_DEFAULT,
    KEEP_ALIVE_MAX_DEFAULT, KEYS_MAX_DEFAULT, KEY_LEN_LIMIT, KEY_LEN_MAX_DEFAULT, LEASE_DEFAULT,
    MARKER_RETENTION_LIMIT, QUEUE_DEPTH_DEFAULT, QUEUE_DEPTH_LIMIT, QUEUE_DEPTH_MIN,
    RESPONSE_LEN_LIMIT, RESPONSE_LEN_MAX_DEFAULT, RETENTION_DEFAULT, RETENTION_LIMIT,
    STRIPES_DEFAULT, STRIPES_LIMIT,
};
use crate::base::clock::Clock;
use crate::base::sync::Arc;
use crate::model::codec::fnv1a64;
use crate::model::error::{FingerprintError, OpenError};
use crate::model::fingerprint::Fingerprint;
pub(crate) use crate::model::settings::{AskedFingerprint, Durability, Recovery};
use crate::runtime::constants::SWEEP_INTERVAL_DEFAULT;
use crate::runtime::recovery::RecoverySettings;
use crate::store::config::{BackendSlot, StoreConfig};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// Per-call options for [`crate::Engine::claim`] and friends.
///
/// ```
/// use idemkv::ClaimOptions;
/// use std::time::Duration;
/// let opts = ClaimOptions::default()
///     .scope(b"tenant-7")
///     .payload(b"{\"amount\":42}")
///     .lease(Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClaimOptions {
    pub(crate) scope: Box<[u8]>,
    pub(crate) fingerprint: Option<AskedFingerprint>,
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) keep_alive: Option<Duration>,
    pub(crate) retention: Option<Duration>,
    pub(crate) on_handler_error: OnHandlerError,
    pub(crate) rerun_forgotten: bool,
    pub(crate) claim_id: Option<u128>,
}

/// What [`crate::Engine::run`], [`crate::Engine::run_typed`] and
/// [`crate::Engine::run_async`] do with the claim when the handler returns an error (set
/// with [`ClaimOptions::on_handler_error`]). Either way the error is returned as
/// `RunError::Handler`. A handler that panics (or a `run_async` future dropped while its
/// handler runs) decides nothing: its lease is dropped unsettled, which keeps the key
/// InFlight until the lease ends, whatever this option says (see [`crate::Lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnHandlerError {
    /// Forget the attempt ([`crate::Lease::release`]): the key becomes Absent, its
    /// checkpoint and fingerprint are dropped, and the next claim starts afresh (attempt 1),
    /// with any payload. For errors that mean nothing was done.
    #[default]
    Release,
    /// End the attempt and keep its progress ([`crate::Lease::fail`]): the record stays
    /// InFlight, marked failed, with its checkpoint and fingerprint; the next claim (or a
    /// waiting caller) takes it over at once with attempt + 1 and the checkpoint, and a
    /// claim with another payload is refused with `FingerprintMismatch`. Nobody retrying,
    /// the claim is reaped `retention` after the failure, like an abandoned one; a
    /// completer finds it with [`crate::admin::Admin::abandoned`]. For internal errors after which
    /// a retry should resume.
    Fail,
}

impl ClaimOptions {
    /// The scope the key lives in: a tenant, a client, an operation. Keys are unique within
    /// their scope only, so two scopes' equal keys are two independent keys (claims,
    /// completions, replays, fingerprints), and no caller has to build a delimiter into the
    /// key. The scope has its own limit (255 bytes; [`crate::ClaimError::ScopeTooLong`])
    /// and does not count against the key's. The empty scope (the default) is the unscoped
    /// key that every call without a scope uses.
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let alice = ClaimOptions::default().scope(b"alice");
    /// let bob = ClaimOptions::default().scope(b"bob");
    /// let Claim::Acquired(lease) = engine.claim(b"order-1", &alice)? else { unreachable!() };
    /// // Bob's `order-1` is another key.
    /// assert!(matches!(engine.claim(b"order-1", &bob)?, Claim::Acquired(_)));
    /// assert_eq!(lease.scope(), b"alice");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scope(mut self, scope: &[u8]) -> Self {
        self.scope = Box::from(scope);
        self
    }

    /// A request fingerprint of your own, 64 bits wide (a hash or version you already
    /// keep). A claim whose fingerprint differs from the stored one is refused with
    /// `FingerprintMismatch`. Without a fingerprint, no check is made. It matches exactly
    /// what the same call stored, in files of either record format.
    pub fn fingerprint(mut self, fingerprint: u64) -> Self {
        // Zero-extended, a caller's u64 matches what the previous format stored for it.
        self.fingerprint = Some(AskedFingerprint {
            value: u128::from(fingerprint),
            legacy: None,
        });
        self
    }

    /// Fingerprints the request's bytes, byte for byte ([`Fingerprint::of_bytes`], 128
    /// bits). It also matches a record that an earlier version stored for the same payload
    /// (which kept a 64-bit FNV-1a of it), so upgrading does not turn retries into
    /// `FingerprintMismatch`.
    pub fn payload(mut self, payload: &[u8]) -> Self {
        self.fingerprint = Some(AskedFingerprint {
            value: Fingerprint::of_bytes(payload).as_u128(),
            legacy: Some(fnv1a64(payload)),
        });
        self
    }

    /// Fingerprints a structured request ([`Fingerprint::of`]): the same value matches
    /// however its maps were ordered, e.g. the same JSON body with its members reordered,
    /// parsed into the same type. Fails only for a value past the fingerprint's limits or
    /// whose `Serialize` fails.
    ///
    /// ```
    /// use idemkv::{ClaimOptions, Durability, Engine};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let first: serde_json::Value = serde_json::from_str(r#"{"order":42,"amount":1999}"#)?;
    /// let retry: serde_json::Value = serde_json::from_str(r#"{"amount":1999,"order":42}"#)?;
    /// let charge = |_: &idemkv::Lease| Ok::<_, std::io::Error>(b"charged".to_vec());
    /// engine.run(b"pay-1", &ClaimOptions::default().fingerprint_of(&first)?, charge)?;
    /// let again = engine.run(b"pay-1", &ClaimOptions::default().fingerprint_of(&retry)?, charge)?;
    /// assert!(again.replayed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fingerprint_of<T: Serialize + ?Sized>(
        self,
        request: &T,
    ) -> Result<Self, FingerprintError> {
        Ok(self.with_fingerprint(Fingerprint::of(request)?))
    }

    /// A [`Fingerprint`] computed beforehand (by [`Fingerprint::of_bytes`] or
    /// [`Fingerprint::of`]).
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(AskedFingerprint {
            value: fingerprint.as_u128(),
            legacy: None,
        });
        self
    }

    /// Lease for this claim instead of the engine's default. Zero is valid (the claim can be
    /// taken over at once); very large values saturate.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The claim's identity, which its lease keeps (in the record too, so it survives a
    /// reopen): a claim that presents the identity of the key's current holder gets that
    /// lease back, as [`crate::Claim::Acquired`] with the same token and attempt (no new
    /// token, no attempt + 1), renewed for this claim's lease, while the lease is live or
    /// over and not yet taken over, unless its holder failed it; the fingerprint must match
    /// as for any claim.
    ///
    /// This is how a caller retries a claim that answered
    /// [`crate::ClaimError::OutcomeUnknown`] (or whose answer it lost): the claim may hold
    /// the key, and without its token the caller could neither complete nor release it, so
    /// every delivery would wait out the whole lease. Choose the identity once per claim
    /// attempt, at random (`u128` leaves no room for collisions), and present it again only
    /// to retry that same attempt: whoever presents it resumes the lease, so two attempts
    /// that share one would both hold the key.
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let opts = ClaimOptions::default().claim_id(0x5eed_1dea_0001);
    /// let Claim::Acquired(first) = engine.claim(b"order-1", &opts)? else { unreachable!() };
    /// // The answer was lost; the retry with the same identity resumes the lease.
    /// let Claim::Acquired(again) = engine.claim(b"order-1", &opts)? else { unreachable!() };
    /// assert_eq!((again.token(), again.attempt()), (first.token(), first.attempt()));
    /// // Another identity finds the key held.
    /// let other = ClaimOptions::default().claim_id(0x5eed_1dea_0002);
    /// assert!(matches!(engine.claim(b"order-1", &other)?, Claim::InProgress(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn claim_id(mut self, id: u128) -> Self {
        self.claim_id = Some(id);
        self
    }

    /// How long `run` and `claim_or_wait` wait for another holder before giving up.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// How long `run`, `run_typed` and `run_async` keep renewing the lease while the handler
    /// runs (see [`crate::Lease::keep_alive`]), counted from the claim. By default they do,
    /// for up to ten minutes: slow is not dead. A handler that outlives its lease keeps its
    /// key as long as it runs, so the lease length only says how fast the key of a *dead*
    /// holder is taken over: one lease after the last renewal when its thread or task is
    /// gone from a running engine (after a crash, the reopened engine's
    /// [`crate::Recovery`] decides). A handler that hangs past `max` loses its key one lease
    /// later.
    ///
    /// `Duration::ZERO` turns the renewals off: the lease then bounds the handler's time
    /// itself, and a handler still running when it ends may see another caller take the key
    /// over (its completion is then refused with `LeaseLost`). Calls that manage their own
    /// lease ([`crate::Engine::claim`]) renew it with [`crate::Lease::keep_alive`].
    ///
    /// ```
    /// use idemkv::{ClaimOptions, Durability, Engine};
    /// use std::time::Duration;
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// // A one-second lease: a crashed consumer's message is taken over a second after its
    /// // last renewal, while a live one may work for up to an hour.
    /// let opts = ClaimOptions::default()
    ///     .lease(Duration::from_secs(1))
    ///     .keep_alive(Duration::from_secs(3600));
    /// let out = engine.run(b"msg-1", &opts, |_lease| Ok::<_, std::io::Error>(b"done".to_vec()))?;
    /// assert!(!out.replayed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keep_alive(mut self, max: Duration) -> Self {
        self.keep_alive = Some(max);
        self
    }

    /// The keep-alive bound a handler runs under, if any (the default, or none for zero).
    pub(crate) fn keep_alive_max(&self) -> Option<Duration> {
        match self.keep_alive {
            None => Some(KEEP_ALIVE_MAX_DEFAULT),
            Some(max) if max.is_zero() => None,
            Some(max) => Some(max),
        }
    }

    /// What `run`, `run_typed` and `run_async` do with the claim when the handler returns
    /// an error: release it (the default: forget the attempt) or fail it (keep its
    /// checkpoint and fingerprint for the next attempt). See [`OnHandlerError`].
    ///
    /// ```
    /// use idemkv::{ClaimOptions, Durability, Engine, OnHandlerError, RunError};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let opts = ClaimOptions::default().on_handler_error(OnHandlerError::Fail);
    /// let first = engine.run(b"job", &opts, |lease| {
    ///     engine
    ///         .checkpoint(lease.key(), lease.token(), 1, b"step 1 done")
    ///         .map_err(|e| e.to_string())?;
    ///     Err::<Vec<u8>, _>("step 2 failed".to_string())
    /// });
    /// assert!(matches!(first, Err(RunError::Handler(_))));
    /// let second = engine.run(b"job", &opts, |lease| {
    ///     assert_eq!(lease.attempt(), 2);
    ///     assert_eq!(lease.checkpoint().map(|c| c.data()), Some(&b"step 1 done"[..]));
    ///     Ok::<_, String>(b"done".to_vec())
    /// })?;
    /// assert!(!second.replayed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_handler_error(mut self, choice: OnHandlerError) -> Self {
        self.on_handler_error = choice;
        self
    }

    /// How long the key is remembered once completed, instead of the engine's retention
    /// ([`EngineBuilder::retention`]). Kept with the claim: persisted in its record, handed
    /// on to a takeover (unless the taking claim asks for its own), used by the completion
    /// unless it chooses its own ([`CompleteOptions::retention`]), and it also sets when an
    /// abandoned claim of the key is reaped (lease end + this retention).
    ///
    /// Kept to the millisecond, rounded up. At most ten years: a claim asking for more is
    /// refused with [`crate::ClaimError::RetentionTooLong`]. Zero is valid: the completed
    /// key is forgotten at once (Absent from the instant of its completion, so a duplicate
    /// runs again), as with an engine retention of zero.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Runs the work again for a key that was completed but whose response is no longer
    /// kept (the claim would otherwise answer [`crate::Claim::Forgotten`]): the claim
    /// acquires the key as a new one (attempt 1) and its marker is gone for good, even if
    /// the new attempt is released. A fingerprint that differs from the marker's is still
    /// refused with `FingerprintMismatch`. No effect on any other state of the key.
    pub fn rerun_forgotten(mut self) -> Self {
        self.rerun_forgotten = true;
        self
    }
}

/// Per-call options for [`crate::Lease::complete_with_options`].
///
/// ```
/// use idemkv::CompleteOptions;
/// use std::time::Duration;
/// let opts = CompleteOptions::default().retention(Duration::from_secs(7 * 24 * 3600));
/// ```
#[derive(Debug, Clone, Default)]
pub struct CompleteOptions {
    pub(crate) retention: Option<Duration>,
}

impl CompleteOptions {
    /// How long the key is remembered from this completion on. Wins over the claim's
    /// [`ClaimOptions::retention`] and the engine's. Kept to the millisecond, rounded up;
    /// at most ten years ([`crate::LeaseError::RetentionTooLong`] beyond); zero forgets the
    /// key at once.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }
}

impl CompleteOptions {
    /// The completion's own retention in ms, checked against the limit.
    pub(crate) fn retention_ms(&self) -> Result<Option<u64>, crate::LeaseError> {
        checked_retention_ms(self.retention).map_err(|asked| crate::LeaseError::RetentionTooLong {
            asked,
            max: RETENTION_LIMIT,
        })
    }
}

impl ClaimOptions {
    /// The claim's own retention in ms, checked against the limit.
    pub(crate) fn retention_ms(&self) -> Result<Option<u64>, crate::ClaimError> {
        checked_retention_ms(self.retention).map_err(|asked| crate::ClaimError::RetentionTooLong {
            asked,
            max: RETENTION_LIMIT,
        })
    }
}

/// `retention` in ms if given, or the retention asked for when it is past the limit.
fn checked_retention_ms(retention: Option<Duration>) -> Result<Option<u64>, Duration> {
    retention.map(|r| retention_ms(r).ok_or(r)).transpose()
}

/// A key's own retention, in whole milliseconds (rounded up, so a key is never forgotten
/// before the time asked), or `None` past [`RETENTION_LIMIT`].
pub(crate) fn retention_ms(retention: Duration) -> Option<u64> {
    if retention > RETENTION_LIMIT {
        return None;
    }
    let ms = retention.as_millis();
    let ceil = if retention.as_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    };
    u64::try_from(ceil).ok()
}

/// Performance tuning of an engine, for [`EngineBuilder::tuning`]: none of it changes what
/// the engine promises, only how fast and with how much memory it keeps those promises.
///
/// ```
/// use idemkv::Tuning;
/// use std::time::Duration;
/// let tuning = Tuning::default()
///     .stripes(1024)
///     .queue_depth(64 * 1024)
///     .sweep_interval(Some(Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    pub(crate) stripes: usize,
    pub(crate) queue_depth: usize,
    pub(crate) sweep_interval: Option<Duration>,
}

impl Default for Tuning {
    /// 256 stripes, a queue of 16 Ki operations, a sweep every second.
    fn default() -> Self {
        Self {
            stripes: STRIPES_DEFAULT,
            queue_depth: QUEUE_DEPTH_DEFAULT,
            sweep_interval: Some(SWEEP_INTERVAL_DEFAULT),
        }
    }
}

impl Tuning {
    /// Number of index stripes, a power of two (default 256, at most 65,536).
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = stripes;
        self
    }

    /// Capacity of the writer queue, in operations (default 16 Ki, from 16 to 1 Mi). New
    /// claims may use seven eighths of it; the rest is kept for completions and releases.
    /// The queue is allocated at open, about 330 bytes a slot (an operation carries a small
    /// record inline): 5.4 MB at the default.
    pub fn queue_depth(mut self, depth: usize) -> Self {
        self.queue_depth = depth;
        self
    }

    /// Time between background sweeps that reclaim expired keys (default 1 s); `None`
    /// turns the background sweeper off (expired keys are still Absent to every call, and
    /// [`crate::admin::Admin::sweep_now`] reclaims them on demand).
    pub fn sweep_interval(mut self, interval: Option<Duration>) -> Self {
        self.sweep_interval = interval;
        self
    }
}

/// Builds an [`crate::Engine`]. `Engine::open(path)` is `Engine::builder().path(path).open()`.
///
/// ```no_run
/// use idemkv::{Durability, Engine};
/// use std::time::Duration;
/// let engine = Engine::builder()
///     .path("idem.redb")
///     .durability(Durability::Immediate)
///     .lease(Duration::from_secs(30))
///     .retention(Duration::from_secs(24 * 3600))
///     .open()?;
/// # Ok::<(), idemkv::OpenError>(())
/// ```
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    pub(crate) path: Option<PathBuf>,
    pub(crate) durability: Durability,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    /// The second tier of retention: how long a marker of a completion is kept after its
    /// retention (`None`: no markers).
    pub(crate) marker_retention: Option<Duration>,
    pub(crate) recovery: Recovery,
    /// `None`: the system clocks, read through `clock::Time`'s derived wall reading.
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) key_len_max: usize,
    pub(crate) response_len_max: usize,
    pub(crate) checkpoint_len_max: usize,
    pub(crate) inflight_max: usize,
    pub(crate) keys_max: usize,
    pub(crate) tuning: Tuning,
    /// Permission bits of a file the engine creates (unix).
    pub(crate) file_mode: u32,
    pub(crate) backend: Option<BackendSlot>,
    /// The commit log's storage when the database is a custom backend.
    pub(crate) log_backend: Option<BackendSlot>,
    /// Whether tracing spans carry the raw key besides its hash (`tracing` feature).
    pub(crate) log_raw_keys: bool,
    /// The shared database instead of a file (feature `postgres`): the opener that
    /// `EngineBuilder::postgres` stores, which `open` has open the backend. Its `Debug` is
    /// the `PostgresConfig`'s.
    #[cfg(feature = "postgres")]
    pub(crate) postgres: Option<Arc<dyn crate::api::remote::RemoteOpener>>,
    /// A deliberate bug armed from open on (a `Sabotage` as u8; 0 is none): sabotage builds
    /// only, see `sabotage::arm`.
    #[cfg(idemkv_sabotage)]
    pub(crate) sabotage: u8,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            path: None,
            durability: Durability::Immediate,
            lease: LEASE_DEFAULT,
            retention: RETENTION_DEFAULT,
            marker_retention: None,
            recovery: Recovery::TakeOver,
            clock: None,
            key_len_max: KEY_LEN_MAX_DEFAULT,
            response_len_max: RESPONSE_LEN_MAX_DEFAULT,
            checkpoint_len_max: CHECKPOINT_LEN_MAX_DEFAULT,
            inflight_max: INFLIGHT_MAX_DEFAULT,
            keys_max: KEYS_MAX_DEFAULT,
            tuning: Tuning::default(),
            file_mode: FILE_MODE_DEFAULT,
            backend: None,
            log_backend: None,
            log_raw_keys: false,
            #[cfg(feature = "postgres")]
            postgres: None,
            #[cfg(idemkv_sabotage)]
            sabotage: 0,
        }
    }
}

impl EngineBuilder {
    /// What the store is opened with.
    pub(crate) fn store_config(&self) -> StoreConfig {
        StoreConfig {
            path: self.path.clone(),
            file_mode: self.file_mode,
            logged: self.logged(),
            backend: self.backend.clone(),
            log_backend: self.log_backend.clone(),
            #[cfg(idemkv_sabotage)]
            sabotage: self.sabotage,
        }
    }

    /// What recovery reads.
    pub(crate) fn recovery_settings(&self) -> RecoverySettings {
        RecoverySettings {
            lease: self.lease,
            retention: self.retention,
            marker_retention: self.marker_retention,
            recovery: self.recovery,
        }
    }

    /// The redb file. Required unless durability is [`Durability::None`], which refuses one
    /// ([`OpenError::MemoryOnlyPath`]): a memory-only engine keeps no file.
    pub fn path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The durability mode (default `Immediate`).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Default lease of a claim (default 30 s). Zero and very large values are valid.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a completed key is remembered (default 24 h). After it, the key is new again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The second tier of retention (default `None`: off). With `Some(window)`, a completion
    /// whose retention ends leaves a marker for `window` more: its key's keyed hashes, its
    /// fingerprint, attempt and completion time, and no key bytes and no response (64 bytes
    /// in memory plus about 30 of overhead; a row in the file). A late duplicate within the
    /// window is answered [`crate::Claim::Forgotten`] ("completed at T, response no longer
    /// kept") instead of running the work again; after it the key is new. Markers survive
    /// restarts (in memory only under [`Durability::None`]). At most 400 days; see
    /// docs/retention.md, "Markers: the second tier".
    ///
    /// ```
    /// use idemkv::{Durability, Engine};
    /// use std::time::Duration;
    /// let engine = Engine::builder()
    ///     .durability(Durability::None)
    ///     .retention(Duration::from_secs(24 * 3600))
    ///     .marker_retention(Some(Duration::from_secs(30 * 24 * 3600)))
    ///     .open()?;
    /// # Ok::<(), idemkv::OpenError>(())
    /// ```
    pub fn marker_retention(mut self, window: Option<Duration>) -> Self {
        self.marker_retention = window;
        self
    }

    /// What to do with InFlight records found on open (default: take over at once).
    pub fn recovery(mut self, recovery: Recovery) -> Self {
        self.recovery = recovery;
        self
    }

    /// The time source (default: the system clock). Tests pass a [`crate::MockClock`].
    ///
    /// Leases, retention, waits and, under `Buffered`, the writer's rate that admission
    /// follows read it; the `Buffered` batch deadline and `Stats::ack_to_fsync_max_us` are
    /// real time. A clock that stands still while the writer commits measures no rate, and
    /// admission then stays at its floor (2,048 pending operations) instead of following the
    /// writer.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Longest key accepted, in bytes (default 255, at most 4096).
    pub fn key_len_max(mut self, max: usize) -> Self {
        self.key_len_max = max;
        self
    }

    /// Largest response accepted, in bytes (default 1 MiB, at most 64 MiB).
    pub fn response_len_max(mut self, max: usize) -> Self {
        self.response_len_max = max;
        self
    }

    /// Largest checkpoint payload accepted, in bytes (default 64 KiB, at most 16 MiB).
    pub fn checkpoint_len_max(mut self, max: usize) -> Self {
        self.checkpoint_len_max = max;
        self
    }

    /// Most keys InFlight at once (default 1 Mi); past it claims get `Overloaded`.
    pub fn inflight_max(mut self, max: usize) -> Self {
        self.inflight_max = max;
        self
    }

    /// Most keys held at once, InFlight plus Completed (default 64 Mi). A claim of a new key
    /// past it gets `Overloaded(Limit::Keys)` after the keys past their retention are
    /// reclaimed; an unexpired record or a live lease is never dropped to make room.
    pub fn keys_max(mut self, max: usize) -> Self {
        self.keys_max = max;
        self
    }

    /// Permission bits of a file the engine creates (default `0o600`: owner read and write
    /// only, because the file holds every stored response). Applied as given, whatever the
    /// process umask; must include owner read and write. An existing file's mode is never
    /// changed. Unix only: elsewhere a new file gets the directory's default access rules.
    #[cfg(unix)]
    pub fn file_mode(mut self, mode: u32) -> Self {
        self.file_mode = mode;
        self
    }

    /// Whether group commits are made durable by the commit log: under `Immediate`, for a
    /// file at a path, or a custom backend given a log storage.
    pub(crate) fn logged(&self) -> bool {
        self.durability == Durability::Immediate
            && match (&self.backend, &self.log_backend) {
                (None, _) => self.path.is_some(),
                (Some(_), log) => log.is_some(),
            }
    }

    /// Whether the `tracing` feature's spans carry each call's raw key (in a `key` field,
    /// non-ASCII bytes escaped) besides its hash (default off; no effect without the
    /// feature). Off by default because keys are often personal or business data (an
    /// e-mail address, an order or payment id) and logs are usually kept longer and read
    /// more widely than the engine's file: by default a log line carries only
    /// [`crate::admin::key_hash`], which is stable but not secret. Turn it on only where the logs
    /// may hold the keys.
    pub fn log_raw_keys(mut self, enabled: bool) -> Self {
        self.log_raw_keys = enabled;
        self
    }

    /// Performance tuning: index stripes, writer queue depth, background sweep interval
    /// (default [`Tuning::default`]). The defaults suit most services; the behaviour the
    /// engine promises does not depend on them.
    ///
    /// ```
    /// use idemkv::{Durability, Engine, Tuning};
    /// let engine = Engine::builder()
    ///     .durability(Durability::None)
    ///     .tuning(Tuning::default().stripes(1024).sweep_interval(None))
    ///     .open()?;
    /// # Ok::<(), idemkv::OpenError>(())
    /// ```
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), OpenError> {
        let bad = |detail: String| Err(OpenError::InvalidConfig { detail });
        if self.key_len_max == 0 || self.key_len_max > KEY_LEN_LIMIT {
            return bad(format!("key_len_max must be 1..={KEY_LEN_LIMIT}"));
        }
        if self.response_len_max > RESPONSE_LEN_LIMIT {
            return bad(format!(
                "response_len_max must be at most {RESPONSE_LEN_LIMIT}"
            ));
        }
        if self.checkpoint_len_max > CHECKPOINT_LEN_LIMIT {
            return bad(format!(
                "checkpoint_len_max must be at most {CHECKPOINT_LEN_LIMIT}"
            ));
        }
        if let Some(window) = self.marker_retention {
            if window.is_zero() || window > MARKER_RETENTION_LIMIT {
                return bad(format!(
                    "marker_retention must be above zero and at most {} days (None turns \
                     markers off)",
                    MARKER_RETENTION_LIMIT.as_secs() / 86_400
                ));
            }
        }
        if let (Durability::None, Some(path)) = (self.durability, &self.path) {
            return Err(OpenError::MemoryOnlyPath { path: path.clone() });
        }
        if self.log_backend.is_some() && self.backend.is_none() {
            return bad("log_backend goes with backend: a file's log is the file beside it".into());
        }
        if self.keys_max == 0 {
            return bad("keys_max must be at least 1".into());
        }
        if self.inflight_max == 0 {
            return bad("inflight_max must be at least 1".into());
        }
        if !(QUEUE_DEPTH_MIN..=QUEUE_DEPTH_LIMIT).contains(&self.tuning.queue_depth) {
            return bad(format!(
                "queue_depth must be {QUEUE_DEPTH_MIN}..={QUEUE_DEPTH_LIMIT}"
            ));
        }
        if !self.tuning.stripes.is_power_of_two() || self.tuning.stripes > STRIPES_LIMIT {
            return bad(format!(
                "stripes must be a power of two up to {STRIPES_LIMIT}"
            ));
        }
        if self.file_mode & !0o7777 != 0 || self.file_mode & 0o600 != 0o600 {
            return bad(format!(
                "file_mode {:#o} must be permission bits that include owner read and write (0o600)",
                self.file_mode
            ));
        }
        if self.durability != Durability::None && self.path.is_none() && self.backend.is_none() {
            return bad("a path is required unless durability is None".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::codec::{self, Blob, Record, RecordKey, RecordState};

    /// A completed record of `payload`'s request as the previous format wrote it (its
    /// fingerprint the 64-bit FNV-1a of the payload), read back as the engine reads it.
    fn version_1_record(payload: &[u8]) -> Record {
        let record = Record {
            key: RecordKey::copied(b"\0k"),
            fingerprint: Some(u128::from(fnv1a64(payload))),
            first_claimed_wall_ms: 0,
            retention_ms: None,
            state: RecordState::Completed {
                attempt: 1,
                completed_wall_ms: 1,
                expires_wall_ms: 2,
                response: Blob(Arc::from(&b"ok"[..])),
            },
        };
        codec::decode(7, &codec::encode_v1(7, &record)).unwrap()
    }

    fn asked(opts: ClaimOptions) -> AskedFingerprint {
        opts.fingerprint.unwrap()
    }

    #[test]
    fn payload_matches_its_128_bit_fingerprint_and_the_previous_formats_fnv() {
        let old = version_1_record(b"{\"amount\":42}").fingerprint.unwrap();
        let payload = asked(ClaimOptions::default().payload(b"{\"amount\":42}"));
        assert!(payload.matches(old), "a record of the previous format");
        assert!(payload.matches(Fingerprint::of_bytes(b"{\"amount\":42}").as_u128()));
        // Another payload matches neither form.
        let other = asked(ClaimOptions::default().payload(b"{\"amount\":43}"));
        assert!(!other.matches(old));
        assert!(!other.matches(Fingerprint::of_bytes(b"{\"amount\":42}").as_u128()));
        // The FNV-1a is only a fallback for a stored 64-bit value: a 128-bit fingerprint
        // whose low half equals it is another request's.
        assert!(!payload.matches(old | 1 << 64));
        // A fingerprint given as a value has no 64-bit form to fall back on.
        let value = asked(
            ClaimOptions::default().with_fingerprint(Fingerprint::of_bytes(b"{\"amount\":42}")),
        );
        assert!(!value.matches(old));
        // A caller's u64 is compared as it is, in either format.
        let own = asked(ClaimOptions::default().fingerprint(0xfeed));
        assert!(own.matches(0xfeed) && !own.matches(0xfeed | 1 << 64));
    }
}
