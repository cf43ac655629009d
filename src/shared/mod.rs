//! The shared backend (feature `postgres`): the same `Engine` API over a PostgreSQL
//! database shared by any number of processes on any number of machines.
//!
//! - `config.rs`: [`PostgresConfig`], and `EngineBuilder::postgres`, which stores it in
//!   the builder as the opener `EngineBuilder::open` calls (implemented here).
//! - `sql.rs`: every statement, one per transition; `db/`: the pool, the calls with their
//!   timeouts, the sorting of failures into refusals and unknown outcomes, the schema, and
//!   each statement's call.
//! - `front.rs`: the local front (coalescing, cached completions, local waiters).
//! - `core.rs`: the operations, as futures on the backend's private runtime.
//! - `listen.rs`: the `LISTEN` connection that wakes local waiters.
//! - `wake.rs`: the notifications sent after completions and releases commit.
//! - `block.rs`: running the futures from blocking callers and from any executor.
//!
//! The api layer never names this module: it defines the port a remote backend implements
//! (`api/remote.rs`). `PostgresConfig` is the builder's `RemoteOpener`: `EngineBuilder::open`
//! has it check the settings (`check`), opens a memory-only engine, and attaches the
//! `Backend` it connects (`connect`) as the engine's `Arc<dyn Remote>`. The public entry
//! points of `Engine`, `Lease` and `LeaseHandle` then test `Engine::remote` at their top,
//! make their call's checks and call the backend through the trait. The memory-only engine
//! is never claimed on: it carries the settings (key and size limits), the closed flag and
//! the timer thread that renews kept-alive leases. This module also adds the public calls
//! only a shared engine has: `EngineBuilder::postgres` (`config.rs`) and
//! [`PostgresLease`] (`lease.rs`). docs/shared.md is the contract.

mod batch;
mod block;
mod config;
mod constants;
mod core;
mod db;
mod direct;
use crate::model::database_error as error;
mod front;
mod lease;
mod listen;
mod rows;
mod sql;
mod tls;
mod wake;

pub use config::PostgresConfig;
pub use error::{DatabaseError, DatabaseErrorKind};
pub use lease::PostgresLease;

use self::block::{block_on, Rt, Running};
use self::core::{bump, Answer, Core};
pub(crate) use crate::api::remote::Hook;
use crate::api::remote::{Remote, RemoteAsk, RemoteFuture, RemoteOpener, RemoteSettings};
use crate::model::answer::KeyState;
use crate::model::error::{ClaimError, LeaseError, OpenError, TableError};
use crate::model::machine::Holder;
use crate::model::settings::Durability;
use crate::model::stats::Stats;
use crate::model::write_set::{TableRow, WriteSet};
use crate::shared::constants::{PG_CLOSE_GRACE, PG_RUNTIME_THREADS, PG_SWEEP_BATCHES_PER_PASS};
use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// A shared engine's backend: the operations' state and the runtime that drives them.
pub(crate) struct Backend {
    core: Arc<Core>,
    handle: tokio::runtime::Handle,
    runtime: Mutex<Rt>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    running: Arc<Running>,
    /// The blocking calls driven on their callers' threads (`Backend::drive`): the runtime
    /// stops once none runs, since they use its timers.
    driving: Arc<Running>,
    lease: Duration,
}

/// A write set as the statements take it (`None`: no writes).
fn writes_of(writes: Option<&WriteSet>) -> Option<db::Writes> {
    writes.filter(|w| !w.is_empty()).map(db::Writes::of)
}

fn table_failed(e: ClaimError) -> TableError {
    match e {
        ClaimError::Database(e) => TableError::Database(e),
        ClaimError::OutcomeUnknown(why) => TableError::OutcomeUnknown(why),
        ClaimError::Closed => TableError::Closed,
        other => TableError::OutcomeUnknown(std::sync::Arc::from(other.to_string())),
    }
}

/// A key's own retention in ms as the shared table keeps it (whole ms, as on a file).
fn own_retention(ms: Option<u64>) -> Option<Duration> {
    ms.map(Duration::from_millis)
}

/// The settings a shared engine cannot run with: the database's commit is its durability,
/// and it keeps no file.
fn check(cfg: &PostgresConfig, settings: &RemoteSettings) -> Result<(), OpenError> {
    let bad = |detail: String| Err(OpenError::InvalidConfig { detail });
    if let Err(detail) = cfg.validate() {
        return bad(detail);
    }
    if settings.storage {
        return bad("a shared (PostgreSQL) engine takes no path or storage backend".into());
    }
    if settings.durability != Durability::Immediate {
        return bad(
            "a shared (PostgreSQL) engine is durable at each commit of the database: leave \
             the durability at Immediate"
                .into(),
        );
    }
    Ok(())
}

/// Connects a shared engine's backend: starts its runtime, creates the schema if this
/// database has none, starts the listener and the sweeper.
fn connect(cfg: &PostgresConfig, settings: &RemoteSettings) -> Result<Arc<Backend>, OpenError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(PG_RUNTIME_THREADS)
        .thread_name("idemkv-pg")
        .enable_all()
        .build()
        .map_err(OpenError::Io)?;
    let handle = runtime.handle().clone();
    let runtime = Rt(Some(runtime));
    let db = {
        // The pool is built inside the runtime, which its timeouts use.
        let _entered = handle.enter();
        db::Db::new(cfg, settings.marker_retention)?
    };
    let core = Arc::new(Core {
        db,
        front: front::Front::new(),
        listening: listen::Listening::new(),
        outbox: Default::default(),
        counters: Default::default(),
        closed: Default::default(),
        retention: settings.retention,
        ask_bound: cfg.statement_timeout + cfg.connect_timeout * 2,
    });
    let migrate = {
        let core = core.clone();
        handle.spawn(async move {
            core.db.migrate().await?;
            core.db.probe_flush().await;
            Ok(())
        })
    };
    match block_on(migrate) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(OpenError::Database(e)),
        Err(_) => {
            return Err(OpenError::Database(DatabaseError::new(
                DatabaseErrorKind::Unavailable,
                "the schema check stopped before it answered",
            )))
        }
    }
    let mut tasks = Vec::new();
    let (ready, listening) = oneshot::channel();
    tasks.push(handle.spawn(listen::listen(core.clone(), ready)));
    let _ = block_on(listening);
    tasks.push(handle.spawn(wake::send(core.clone())));
    if let Some(every) = settings.sweep_interval {
        let core = core.clone();
        tasks.push(handle.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if core.is_closed() {
                    return;
                }
                let _ = core.sweep(PG_SWEEP_BATCHES_PER_PASS).await;
            }
        }));
    }
    Ok(Arc::new(Backend {
        core,
        handle,
        runtime: Mutex::new(runtime),
        tasks: Mutex::new(tasks),
        running: Arc::default(),
        driving: Arc::default(),
        lease: settings.lease,
    }))
}

/// The builder's opener (`EngineBuilder::postgres`).
impl RemoteOpener for PostgresConfig {
    fn check(&self, settings: &RemoteSettings) -> Result<(), OpenError> {
        check(self, settings)
    }

    fn connect(&self, settings: &RemoteSettings) -> Result<Arc<dyn Remote>, OpenError> {
        Ok(connect(self, settings)?)
    }
}

impl Backend {
    /// Runs `f` on the backend's runtime; the receiver gets its output (or an error when
    /// the runtime stopped first).
    fn call<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        let running = self.running.enter();
        self.handle.spawn(async move {
            let _running = running;
            let _ = tx.send(f.await);
        });
        rx
    }

    /// Starts a claim on the scoped key `key` (`scope.rs`: two scopes' equal keys are two
    /// rows). One the local front can answer is answered here, on the caller's thread,
    /// without the runtime (`Core::claim_locally`). If its caller is gone by the time it
    /// acquired (a dropped future), the lease is released and counted in
    /// `Stats::claims_cancelled`.
    fn start_claim(
        &self,
        key: &Arc<[u8]>,
        ask: &RemoteAsk,
    ) -> oneshot::Receiver<Result<Answer, ClaimError>> {
        let (tx, rx) = oneshot::channel();
        let hash = crate::base::hash::key_hash(key);
        if let Some(answer) = self.claim_locally(key, hash, ask) {
            let _ = tx.send(answer);
            return rx;
        }
        let claim = self.ask_database(key, hash, ask);
        let (core, key) = (self.core.clone(), Arc::clone(key));
        let running = self.running.enter();
        self.handle.spawn(async move {
            let _running = running;
            let answer = claim.await;
            if let Err(Ok(Answer::Acquired { token, .. })) = tx.send(answer) {
                bump(&core.counters.claims_cancelled);
                let _ = core.release(&key, token).await;
            }
        });
        rx
    }

    /// The answer the local front gives `key` on the caller's thread, if any
    /// (`Core::claim_locally`). A claim presenting an identity may resume a lease of this
    /// process: the database decides.
    fn claim_locally(
        &self,
        key: &[u8],
        hash: u64,
        ask: &RemoteAsk,
    ) -> Option<Result<Answer, ClaimError>> {
        match ask.claim_id {
            None => self
                .core
                .claim_locally(key, hash, ask.fingerprint, ask.wait.is_some()),
            Some(_) => None,
        }
    }

    /// The claim of `key` as `ask` says, asked of the database (one the local front could
    /// not answer): the blocking claim drives it on its caller's thread, the async one on
    /// the runtime.
    fn ask_database(
        &self,
        key: &Arc<[u8]>,
        hash: u64,
        ask: &RemoteAsk,
    ) -> impl Future<Output = Result<Answer, ClaimError>> + Send + 'static {
        let (core, key) = (self.core.clone(), Arc::clone(key));
        let (asked, claim_id, wait, rerun) =
            (ask.fingerprint, ask.claim_id, ask.wait, ask.rerun_forgotten);
        let lease = ask.lease.unwrap_or(self.lease);
        let retention = own_retention(ask.retention_ms);
        async move {
            core.claim(&key, hash, asked, claim_id, lease, retention, wait, rerun)
                .await
        }
    }

    /// A blocking claim. Any claim the local front cannot answer runs on the caller's own
    /// thread, in the runtime's context (its timers), its statement on a direct connection
    /// this thread drives (`direct.rs`) or else on the pool's: the statement's answer wakes
    /// this thread, and the key's local waiters, directly, with no task of the runtime in
    /// between.
    fn claim_here(&self, key: &Arc<[u8]>, ask: &RemoteAsk) -> Result<Answer, ClaimError> {
        let hash = crate::base::hash::key_hash(key);
        if let Some(answer) = self.claim_locally(key, hash, ask) {
            return answer;
        }
        self.drive(self.ask_database(key, hash, ask))
            .unwrap_or(Err(ClaimError::Closed))
    }

    /// Runs `f` on the caller's thread in the runtime's context (its timers, and the
    /// pool's connections, whose tasks stay on the runtime), its statements on direct
    /// connections when this thread may drive them; `None` when the backend is closed.
    fn drive<T>(&self, f: impl Future<Output = T>) -> Option<T> {
        let _running = self.running.enter();
        // Entered before the check: a closing backend stops its runtime only once no
        // caller drives a call (its timers would fail under it).
        let _driving = self.driving.enter();
        if self.core.is_closed() {
            return None;
        }
        // Outside any runtime's context, its statements may run on a direct connection
        // that this thread drives (`direct.rs`); a thread of another runtime must not start
        // one, so there they keep the pool.
        let outside = tokio::runtime::Handle::try_current().is_err();
        let _entered = self.handle.enter();
        let _here = outside.then(direct::Driving::here);
        Some(block_on(f))
    }

    fn start_complete(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<db::Writes>,
    ) -> oneshot::Receiver<Result<u64, LeaseError>> {
        let core = self.core.clone();
        let key: Arc<[u8]> = Arc::from(key);
        let own = own_retention(retention_ms);
        self.call(async move { core.complete(&key, token, response, own, writes).await })
    }

    fn start_release(&self, key: &[u8], token: u64) -> oneshot::Receiver<Result<bool, LeaseError>> {
        let core = self.core.clone();
        let key: Arc<[u8]> = Arc::from(key);
        self.call(async move { core.release(&key, token).await })
    }

    fn start_fail(&self, key: &[u8], token: u64) -> oneshot::Receiver<Result<bool, LeaseError>> {
        let core = self.core.clone();
        let key: Arc<[u8]> = Arc::from(key);
        self.call(async move { core.fail(&key, token).await })
    }

    fn start_update(
        &self,
        key: &[u8],
        token: u64,
        op: Holder,
        writes: Option<db::Writes>,
    ) -> oneshot::Receiver<Result<(), LeaseError>> {
        let core = self.core.clone();
        let key: Arc<[u8]> = Arc::from(key);
        self.call(async move {
            match op {
                Holder::Extend { lease } => core.extend(&key, token, lease).await,
                Holder::Checkpoint(c) => {
                    let data: Arc<[u8]> = Arc::from(c.data());
                    core.checkpoint(&key, token, c.phase(), data, writes).await
                }
                _ => Err(LeaseError::LeaseLost),
            }
        })
    }

    fn start_sent(&self, ids: &[u64]) -> oneshot::Receiver<Result<(), ClaimError>> {
        let core = self.core.clone();
        let ids = ids.to_vec();
        self.call(async move { core.outbox_sent(&ids).await })
    }
}

/// A blocking claim or completion runs on the caller's thread, in the runtime's context
/// (`Backend::drive`); the other blocking calls wait for the runtime's answer on the
/// caller's thread (`block.rs`); an async call sends its statement when its future is first polled, and dropping the
/// future after that leaves the statement to run.
impl Remote for Backend {
    fn claim(&self, key: &Arc<[u8]>, ask: &RemoteAsk) -> Result<Answer, ClaimError> {
        self.claim_here(key, ask)
    }

    fn claim_async<'a>(
        &'a self,
        key: &'a Arc<[u8]>,
        ask: &'a RemoteAsk,
    ) -> RemoteFuture<'a, Result<Answer, ClaimError>> {
        Box::pin(async move {
            self.start_claim(key, ask)
                .await
                .unwrap_or(Err(ClaimError::Closed))
        })
    }

    fn complete_in(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
        writes: Option<&WriteSet>,
        hook: Hook,
    ) -> Result<u64, LeaseError> {
        let core = self.core.clone();
        let key: Arc<[u8]> = Arc::from(key);
        let writes = writes_of(writes);
        let rx = self.call(async move {
            core.complete_in(&key, token, response, None, writes, hook)
                .await
        });
        block_on(rx).unwrap_or(Err(LeaseError::Closed))
    }

    fn complete(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<&WriteSet>,
    ) -> Result<u64, LeaseError> {
        let writes = writes_of(writes);
        let own = own_retention(retention_ms);
        let complete = self.core.complete(key, token, response, own, writes);
        self.drive(complete).unwrap_or(Err(LeaseError::Closed))
    }

    fn complete_async<'a>(
        &'a self,
        key: &'a [u8],
        token: u64,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<&'a WriteSet>,
    ) -> RemoteFuture<'a, Result<u64, LeaseError>> {
        Box::pin(async move {
            let writes = writes_of(writes);
            self.start_complete(key, token, response, retention_ms, writes)
                .await
                .unwrap_or(Err(LeaseError::Closed))
        })
    }

    fn release(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        block_on(self.start_release(key, token)).unwrap_or(Err(LeaseError::Closed))
    }

    fn release_async<'a>(
        &'a self,
        key: &'a [u8],
        token: u64,
    ) -> RemoteFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.start_release(key, token)
                .await
                .unwrap_or(Err(LeaseError::Closed))
        })
    }

    fn fail(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        block_on(self.start_fail(key, token)).unwrap_or(Err(LeaseError::Closed))
    }

    fn fail_async<'a>(
        &'a self,
        key: &'a [u8],
        token: u64,
    ) -> RemoteFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.start_fail(key, token)
                .await
                .unwrap_or(Err(LeaseError::Closed))
        })
    }

    fn update(
        &self,
        key: &[u8],
        token: u64,
        op: Holder,
        writes: Option<&WriteSet>,
    ) -> Result<(), LeaseError> {
        block_on(self.start_update(key, token, op, writes_of(writes)))
            .unwrap_or(Err(LeaseError::Closed))
    }

    fn update_async<'a>(
        &'a self,
        key: &'a [u8],
        token: u64,
        op: Holder,
        writes: Option<&'a WriteSet>,
    ) -> RemoteFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            self.start_update(key, token, op, writes_of(writes))
                .await
                .unwrap_or(Err(LeaseError::Closed))
        })
    }

    fn get(&self, key: &[u8]) -> Result<Option<KeyState>, ClaimError> {
        let core = self.core.clone();
        let key: Arc<[u8]> = Arc::from(key);
        block_on(self.call(async move { core.get(&key).await })).unwrap_or(Err(ClaimError::Closed))
    }

    fn table_get(&self, row: &[u8]) -> Result<Option<Vec<u8>>, TableError> {
        let core = self.core.clone();
        let row: Arc<[u8]> = Arc::from(row);
        block_on(self.call(async move { core.table_get(&row).await }))
            .unwrap_or(Err(ClaimError::Closed))
            .map_err(table_failed)
    }

    fn table_scan(&self, lo: &[u8], hi: &[u8], limit: usize) -> Result<Vec<TableRow>, TableError> {
        let core = self.core.clone();
        let (lo, hi): (Arc<[u8]>, Arc<[u8]>) = (Arc::from(lo), Arc::from(hi));
        block_on(self.call(async move { core.table_scan(&lo, &hi, limit).await }))
            .unwrap_or(Err(ClaimError::Closed))
            .map_err(table_failed)
    }

    fn outbox_pending(&self, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, TableError> {
        let core = self.core.clone();
        let hold = self.lease;
        block_on(self.call(async move { core.outbox_take(limit, hold).await }))
            .unwrap_or(Err(ClaimError::Closed))
            .map_err(table_failed)
    }

    fn outbox_sent(&self, ids: &[u64]) -> Result<(), TableError> {
        block_on(self.start_sent(ids))
            .unwrap_or(Err(ClaimError::Closed))
            .map_err(table_failed)
    }

    fn outbox_sent_async<'a>(&'a self, ids: &'a [u64]) -> RemoteFuture<'a, Result<(), TableError>> {
        Box::pin(async move {
            self.start_sent(ids)
                .await
                .unwrap_or(Err(ClaimError::Closed))
                .map_err(table_failed)
        })
    }

    /// In bounded batches.
    fn sweep_now(&self) -> Result<u64, ClaimError> {
        let core = self.core.clone();
        block_on(self.call(async move { core.sweep(u32::MAX).await }))
            .unwrap_or(Err(ClaimError::Closed))
    }

    fn lease_remaining(&self, key: &[u8], token: u64) -> Duration {
        let hash = crate::base::hash::key_hash(key);
        self.core.front.lease_remaining(key, hash, token)
    }

    fn stats(&self) -> Stats {
        let c = &self.core.counters;
        let read = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let (held, cached) = self.core.front.counts();
        Stats {
            inflight: held,
            completed: cached,
            expirations: read(&c.expirations),
            claims: read(&c.claims),
            claims_cancelled: read(&c.claims_cancelled),
            acquired: read(&c.acquired),
            takeovers: read(&c.takeovers),
            replays: read(&c.replays),
            in_progress: read(&c.in_progress),
            fingerprint_mismatches: read(&c.fingerprint_mismatches),
            completions: read(&c.completions),
            releases: read(&c.releases),
            leases_lost: read(&c.leases_lost),
            waits: read(&c.waits),
            db_round_trips: read(&self.core.db.round_trips),
            db_claims_batched: self.core.db.claims_batched(),
            db_flushes: self.core.db.flushes(),
            db_completions_batched: self.core.db.completions_batched(),
            db_notifications: read(&self.core.listening.received),
            ..Stats::default()
        }
    }

    /// Stops the backend: wakes every local waiter (it answers `Closed`), lets running
    /// calls finish for a short grace, closes the pool and stops the runtime. Idempotent.
    fn close(&self) {
        if self.core.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.core.front.clear();
        // On a runtime thread (the last handle dropped inside a task) nothing may block.
        if tokio::runtime::Handle::try_current().is_err() {
            self.running.wait_idle(PG_CLOSE_GRACE);
        }
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        self.core.db.close();
        if let Some(rt) = self.runtime.lock().0.take() {
            self.driving
                .when_idle(Box::new(move || rt.shutdown_background()));
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.close();
    }
}
