//! The engine handle, opening and closing (its shared state is `runtime/shared.rs`).
//!
//! The state machine's decisions are in `model/machine/`; `claim_step.rs` (claims and
//! waits, for the calls of `claim.rs`), `holder.rs` (what a lease holder does), `admin.rs`,
//! `sweep.rs` (reclaiming expired keys) and `recovery.rs` (rebuilding the index) apply them
//! under the stripe lock.

use crate::api::constants::QUEUE_CLAIM_HEADROOM_DIVISOR;
use crate::api::options::{Durability, EngineBuilder};
#[cfg(feature = "postgres")]
use crate::api::remote::{Remote, RemoteOpener, RemoteSettings};
use crate::base::clock::{ClockListener, Time};
use crate::base::hash::KeyHasher;
use crate::base::sync::{Arc, Mutex, Weak};
use crate::index::stats::{read, Counters, Events, Stats};
use crate::index::stripes::{Index, Keying};
use crate::model::constants::{SCOPE_LEN_MAX, TOKEN_RESERVE};
use crate::model::error::{ClaimError, FlushError, LeaseError, OpenError};
use crate::model::machine::MarkerRules;
use crate::model::scope::ScopedKey;
use crate::model::token::Tokens;
use crate::runtime::progress::Progress;
use crate::runtime::shared::{Config, Parts, Shared};
use crate::runtime::sweeper::Sweeper;
use crate::runtime::writer;
use crate::store::storage::{Closing, Store};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

/// An embedded idempotency engine. Cheap to clone; all clones share one engine, which
/// closes when the last clone (and the last [`crate::Lease`]) is dropped.
///
/// ```
/// use idemkv::{Claim, ClaimOptions, Durability, Engine};
/// let engine = Engine::builder().durability(Durability::None).open()?;
/// let opts = ClaimOptions::default().payload(b"charge 42");
/// match engine.claim(b"order-42", &opts)? {
///     Claim::Acquired(lease) => lease.complete(b"charged")?,
///     Claim::InProgress(busy) => println!("retry in {:?}", busy.retry_after()),
///     Claim::Completed(stored) => println!("replay {:?}", stored.response()),
///     // Only with `EngineBuilder::marker_retention`: completed, response no longer kept.
///     Claim::Forgotten(f) => println!("done at {:?}, response gone", f.completed_at()),
/// }
/// let again = engine.claim(b"order-42", &opts)?;
/// assert!(matches!(again, Claim::Completed(s) if s.response() == b"charged"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// Aligned to its own cache lines: a lease holds an engine handle, so the reference count
/// in front of this is written by every claim that acquires and by every lease dropped,
/// while `shared` is read by every call; apart, the reads do not miss on those writes.
#[repr(align(128))]
struct Inner {
    shared: Arc<Shared>,
    threads: Mutex<Threads>,
    /// Kept alive so the clock's weak reference to it stays valid.
    _clock_listener: Arc<ClockListener>,
    /// The remote backend, when the engine was opened on one (`api/remote.rs`); the
    /// memory-only `shared` then holds only the settings and the timer thread.
    #[cfg(feature = "postgres")]
    remote: Option<Arc<dyn Remote>>,
}

#[derive(Default)]
struct Threads {
    writer: Option<crate::base::sync::JoinHandle<()>>,
    sweeper: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        #[cfg(feature = "postgres")]
        if let Some(remote) = &self.remote {
            remote.close();
        }
        let _ = close_shared(&self.shared, &self.threads);
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("durability", &self.shared().cfg().durability)
            .finish()
    }
}

fn close_shared(shared: &Shared, threads: &Mutex<Threads>) -> Result<(), FlushError> {
    if shared.close_once() {
        shared.stop_background();
        let mut threads = threads.lock();
        if let Some(handle) = threads.sweeper.take() {
            let _ = handle.join();
        }
        // Every queued send happens under a stripe lock after a check of `closed`: passing
        // through each lock once orders all of them before the shutdown message.
        for stripe in shared.index().stripes() {
            drop(stripe.lock());
        }
        shared.send_shutdown();
        if let Some(handle) = threads.writer.take() {
            let _ = handle.join();
        }
        shared.set_writer_stopped();
        shared.release_store();
        shared.index().wake_all();
        shared.notify_room();
    }
    match shared.poison_reason() {
        Some(why) => Err(FlushError::Poisoned(why)),
        None => Ok(()),
    }
}

impl EngineBuilder {
    /// Opens the engine: validates the settings, opens or creates the file, recovers its
    /// records, and starts the writer and the sweeper.
    pub fn open(self) -> Result<Engine, OpenError> {
        #[cfg(feature = "postgres")]
        if let Some(opener) = self.postgres.clone() {
            return self.open_remote(&*opener);
        }
        self.validate()?;
        let time = Time::new(self.clock.clone());
        let counters = Counters::default();
        let memory_only = self.durability == Durability::None;
        // A durable engine's hashes are keyed by the secret its file keeps, so a key hashes
        // the same after a restart and its marker finds it.
        let (opened, mut log) = if memory_only {
            (None, None)
        } else {
            let store = Store::open(&self.store_config())?;
            // Before recovery reads the records: what the log holds is part of them.
            let log = crate::store::commit_log::open(&self.store_config(), &store)?;
            (Some(store), log)
        };
        let hasher = match &opened {
            Some(store) => KeyHasher::from_secret(&store.hash_secret()?),
            None => KeyHasher::random(),
        };
        let progress = Progress::new();
        let index = Index::new(
            self.tuning.stripes,
            crate::base::clock::duration_ns(self.retention),
            counters.gauges.clone(),
            Keying {
                hasher,
                markers: self.marker_retention.map(|retention| MarkerRules {
                    retention,
                    durable: !memory_only,
                }),
                marks: progress.marks(),
            },
        );
        let (tokens, store, outbox_next) = match opened {
            None => (Tokens::new(1, u64::MAX), None, 1),
            Some(store) => {
                let (tokens, outbox_next) = self.recover(&store, &index, &time, &counters)?;
                (tokens, Some(Arc::new(store)), outbox_next)
            }
        };
        let cfg = self.config();
        let claim_queue_max = cfg.claim_queue_max;
        let (tx, rx) = match store {
            Some(_) => {
                let (tx, rx) = crate::base::sync::channel::bounded(self.tuning.queue_depth);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let shared = Arc::new(Shared::new(Parts {
            index,
            time,
            cfg,
            tokens,
            counters,
            observe: crate::runtime::observe::Observer::new(self.log_raw_keys),
            tx,
            progress,
            admission: crate::runtime::admission::Admission::new(
                match self.durability {
                    Durability::Buffered { max_delay } => Some(max_delay),
                    _ => None,
                },
                claim_queue_max,
            ),
            tables: crate::runtime::tables::Tables::new(outbox_next),
            store: store.clone(),
            sweeper: Sweeper::new(self.tuning.sweep_interval),
            #[cfg(idemkv_sabotage)]
            sabotage: self.sabotage,
        }));
        let mut threads = Threads::default();
        if let (Some(store), Some(rx)) = (store, rx) {
            threads.writer =
                Some(writer::spawn(shared.clone(), store, log.take(), rx).map_err(OpenError::Io)?);
        }
        let engine = Engine {
            inner: Arc::new(Inner {
                shared: shared.clone(),
                threads: Mutex::new(Threads::default()),
                _clock_listener: subscribe_clock(&self, &shared),
                #[cfg(feature = "postgres")]
                remote: None,
            }),
        };
        if self.tuning.sweep_interval.is_some() {
            threads.sweeper = Some(crate::runtime::sweep::spawn(shared).map_err(OpenError::Io)?);
        }
        *engine.inner.threads.lock() = threads;
        Ok(engine)
    }
}

impl EngineBuilder {
    /// Opens an engine on the remote backend `opener` connects to: the opener checks the
    /// settings, a memory-only engine carries them (limits, the closed flag, the timer
    /// thread of keep-alive renewals), and the backend answers every call.
    #[cfg(feature = "postgres")]
    fn open_remote(self, opener: &dyn RemoteOpener) -> Result<Engine, OpenError> {
        let settings = RemoteSettings {
            lease: self.lease,
            retention: self.retention,
            marker_retention: self.marker_retention,
            sweep_interval: self.tuning.sweep_interval,
            durability: self.durability,
            storage: self.path.is_some() || self.backend.is_some(),
        };
        opener.check(&settings)?;
        let mut local = self;
        local.postgres = None;
        local.durability = Durability::None;
        local.tuning.sweep_interval = None;
        let engine = local.open()?;
        let remote = opener.connect(&settings)?;
        engine
            .with_remote(remote)
            .ok_or_else(|| OpenError::InvalidConfig {
                detail: "the engine was shared before its backend was attached".into(),
            })
    }

    /// Loads the file's records into `index` (`runtime::recovery`) and checks its tables.
    /// Returns the tokens to issue from and the next outbox id.
    fn recover(
        &self,
        store: &Closing,
        index: &Index,
        time: &Time,
        counters: &Counters,
    ) -> Result<(Tokens, u64), OpenError> {
        // A damaged file can make redb panic mid-scan: contain it as corruption.
        let next = crate::store::redb_io::contain("recovery", || {
            crate::runtime::recovery::recover(
                store,
                &self.recovery_settings(),
                index,
                time,
                counters,
            )
        })
        .map_err(|detail| OpenError::Corrupted { detail })??;
        // Every replay opens the tables again: a table tree that only decodes in the
        // write path must be refused now, not on each read.
        store.check_tables()?;
        let outbox_next = store.outbox_next()?;
        let limit = next.saturating_add(TOKEN_RESERVE);
        Ok((Tokens::new(next, limit), outbox_next))
    }

    /// The settings, in the units the hot path uses.
    fn config(&self) -> Config {
        Config {
            durability: self.durability,
            lease: self.lease,
            retention: self.retention,
            marker_retention: self.marker_retention,
            key_len_max: self.key_len_max,
            response_len_max: self.response_len_max,
            checkpoint_len_max: self.checkpoint_len_max,
            inflight_max: self.inflight_max as u64,
            keys_max: self.keys_max as u64,
            // The rest of the queue is headroom for holders.
            claim_queue_max: self.tuning.queue_depth
                - self.tuning.queue_depth / QUEUE_CLAIM_HEADROOM_DIVISOR,
        }
    }
}

/// Lets a clock that jumps (a mock clock) wake every waiter to re-check its deadline.
fn subscribe_clock(b: &EngineBuilder, shared: &Arc<Shared>) -> Arc<ClockListener> {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let listener: Arc<ClockListener> = Arc::new(move || {
        if let Some(shared) = weak.upgrade() {
            shared.clock_jumped();
        }
    });
    if let Some(mock) = b.clock.as_deref().and_then(|c| c.mock_clock()) {
        mock.subscribe(Arc::downgrade(&listener));
    }
    listener
}

impl Engine {
    /// A builder with the defaults: `Immediate`, 30 s lease, 24 h retention.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Opens (or creates) the file at `path` with the builder defaults.
    pub fn open(path: impl AsRef<Path>) -> Result<Engine, OpenError> {
        Engine::builder().path(path.as_ref()).open()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    pub(crate) fn shared_arc(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// The remote backend, if this engine was opened on one: the embedded engine's calls
    /// pay only this test of an `Option`.
    #[cfg(feature = "postgres")]
    #[inline]
    pub(crate) fn remote(&self) -> Option<&dyn Remote> {
        self.inner.remote.as_deref()
    }

    /// Hands a freshly opened (memory-only, unshared) engine its remote backend; `None`
    /// if the engine was already shared with another handle.
    #[cfg(feature = "postgres")]
    fn with_remote(mut self, remote: Arc<dyn Remote>) -> Option<Engine> {
        Arc::get_mut(&mut self.inner)?.remote = Some(remote);
        Some(self)
    }

    /// The durability mode this engine was opened with.
    pub fn durability(&self) -> Durability {
        // A shared engine's calls return once the database committed them.
        #[cfg(feature = "postgres")]
        if self.remote().is_some() {
            return Durability::Immediate;
        }
        self.shared().cfg().durability
    }

    /// The engine's retention ([`EngineBuilder::retention`]): how long a completed key is
    /// remembered unless its claim or completion chose its own
    /// ([`crate::ClaimOptions::retention`], [`crate::CompleteOptions::retention`]). A
    /// replay tells the instant its key expires ([`crate::Stored::expires_at`]).
    pub fn retention(&self) -> Duration {
        self.shared().cfg().retention
    }

    pub(crate) fn check_key(&self, key: &[u8]) -> Result<(), ClaimError> {
        let max = self.shared().cfg().key_len_max;
        if key.is_empty() {
            return Err(ClaimError::KeyEmpty);
        }
        if key.len() > max {
            return Err(ClaimError::KeyTooLong {
                len: key.len(),
                max,
            });
        }
        Ok(())
    }

    /// The scoped key (`scope.rs`) of `key` within `scope`, the form every internal call
    /// takes; a scope past its limit is refused.
    pub(crate) fn scoped_key(&self, scope: &[u8], key: &[u8]) -> Result<ScopedKey, ClaimError> {
        ScopedKey::new(scope, key).ok_or(ClaimError::ScopeTooLong {
            len: scope.len(),
            max: SCOPE_LEN_MAX,
        })
    }

    pub(crate) fn check_open(&self) -> Result<(), ClaimError> {
        let s = self.shared();
        if let Some(why) = s.poison_reason() {
            return Err(ClaimError::Poisoned(why));
        }
        if s.is_closed() {
            return Err(ClaimError::Closed);
        }
        Ok(())
    }

    /// The checks of a holder's call on the scoped key `scoped`.
    pub(crate) fn check_lease_call(&self, scoped: &[u8]) -> Result<(), LeaseError> {
        let key = crate::model::scope::key_of(scoped);
        match self.check_key(key).and_then(|()| self.check_open()) {
            Ok(()) => Ok(()),
            Err(ClaimError::KeyTooLong { len, max }) => Err(LeaseError::KeyTooLong { len, max }),
            Err(ClaimError::Poisoned(why)) => Err(LeaseError::Poisoned(why)),
            Err(ClaimError::Closed) => Err(LeaseError::Closed),
            // An empty key was never claimed, so no lease can own it.
            Err(_) => Err(LeaseError::LeaseLost),
        }
    }

    /// Whether the mode makes a call wait until its write is durable before it returns.
    pub(crate) fn waits_for_durability(&self) -> bool {
        self.durability() == Durability::Immediate
    }

    /// A snapshot of the engine's counters: O(stripes), never a walk over the keys. Each
    /// stripe is locked once; one whose expiry order says a lease has ended moves it to the
    /// `abandoned` gauge first (work the sweeper would do, each lease once), and the count
    /// of keys past retention comes from the head of each stripe's completion order.
    pub fn stats(&self) -> Stats {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return remote.stats();
        }
        let s = self.shared();
        let c = s.counters();
        let now = s.mono_ns();
        let (mut expired_unswept, mut index_bytes, mut markers) = (0u64, 0u64, 0u64);
        let mut events = Events::default();
        for (i, stripe) in s.index().stripes().enumerate() {
            let mut shard = stripe.lock();
            events.merge(&shard.events);
            if s.index().lease_may_be_due(i, now) {
                shard.end_leases(now, usize::MAX);
            }
            if s.index().reclaim_may_be_due(i, now) {
                expired_unswept += shard.expired_unswept(now);
            }
            index_bytes += shard.memory_bytes() as u64;
            markers += shard.markers_len() as u64;
        }
        crate::runtime::observe::gauges(s.observer(), s.counters(), || s.queued());
        let commits = read(&c.commits);
        Stats {
            inflight: read(&c.gauges.inflight),
            abandoned: read(&c.gauges.abandoned),
            abandoned_reaped: read(&c.abandoned_reaped) + events.abandoned_reaped,
            completed: read(&c.gauges.completed).saturating_sub(expired_unswept),
            expired_unswept,
            expirations: events.expirations,
            markers,
            forgotten: events.forgotten,
            index_bytes,
            claims: events.claims,
            claims_cancelled: read(&c.claims_cancelled),
            acquired: events.acquired,
            takeovers: events.takeovers,
            replays: read(&c.replays) + events.replays,
            in_progress: events.in_progress,
            fingerprint_mismatches: read(&c.fingerprint_mismatches) + events.fingerprint_mismatches,
            corrupt_reads: read(&c.corrupt_reads),
            completions: events.completions,
            releases: events.releases,
            failures: events.failures,
            leases_lost: events.leases_lost,
            waits: read(&c.waits),
            overloaded: read(&c.overloaded),
            commits,
            committed_ops: read(&c.committed_ops),
            log_checkpoints: read(&c.log_checkpoints),
            batch_max: read(&c.batch_max),
            commit_max_us: read(&c.commit_max_us),
            queue_depth: s.queued() as u64,
            queue_claims_max: s.admission().claims_max(),
            ack_to_fsync_max_us: u64::try_from(s.admission().lag_max().as_micros())
                .unwrap_or(u64::MAX),
            token_next: s.tokens().next(),
            poisoned: s.poison_reason().is_some(),
            db_round_trips: 0,
            db_claims_batched: 0,
            db_flushes: 0,
            db_completions_batched: 0,
            db_notifications: 0,
        }
    }

    /// Waits until every call acknowledged so far is durable (a no-op without a file).
    pub fn flush(&self) -> Result<(), FlushError> {
        // A shared engine's acknowledged calls are committed already.
        #[cfg(feature = "postgres")]
        if self.remote().is_some() {
            return self.check_open().map_err(|_| FlushError::Closed);
        }
        self.shared().flush()
    }

    /// Makes everything acknowledged durable, stops the background threads, releases the
    /// file and refuses further calls. Idempotent; also done when the last handle drops.
    pub fn close(&self) -> Result<(), FlushError> {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            remote.close();
        }
        close_shared(&self.inner.shared, &self.inner.threads)
    }

    /// Makes the writer thread panic at its next batch, before writing it, as a bug in the
    /// writer would. The engine must poison itself and fail every pending acknowledgement
    /// (`docs/design.md`, "How a commit can fail"). Only with `--cfg idemkv_sabotage`.
    #[cfg(idemkv_sabotage)]
    #[doc(hidden)]
    pub fn panic_writer_at_next_batch(&self) {
        self.shared().faults().panic_writer_at_next_batch();
    }
}
