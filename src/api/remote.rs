//! The port of a remote backend (feature `postgres`): what an engine whose keys live
//! outside this process, in the shared backend over PostgreSQL (`src/shared/`), asks it.
//!
//! The api layer defines these traits and never names what implements them: `shared/`
//! implements [`Remote`] for its backend and [`RemoteOpener`] for `PostgresConfig`, which
//! `EngineBuilder::postgres` stores in the builder. `EngineBuilder::open` has the opener
//! check the settings, opens the memory-only engine that carries them, and attaches the
//! backend the opener connects (`Engine::with_remote`). The public entry points of
//! `Engine`, `Lease` and `LeaseHandle` then test `Engine::remote` at their top: a branch on
//! an `Option` for an embedded engine, one virtual call for a shared one.
//!
//! The port speaks the model's language only (keys, tokens, write sets, answers, errors),
//! so it depends on no other file of the api: the entry points make the checks every call
//! makes (key, size, closed) before they ask, and turn an acquisition into a `Lease`.

use crate::base::sync::Arc;
use crate::model::answer::{Busy, Forgotten, KeyState, Stored};
use crate::model::codec::Checkpoint;
use crate::model::error::{ClaimError, LeaseError, OpenError, TableError};
use crate::model::machine::Holder;
use crate::model::settings::{AskedFingerprint, Durability};
use crate::model::stats::Stats;
use crate::model::write_set::{TableRow, WriteSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A remote call's future: boxed, so that [`Remote`] stays object-safe.
pub(crate) type RemoteFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The application's own statements, run in the completion's transaction
/// ([`crate::Lease::complete_in_transaction`]).
pub(crate) type Hook = Box<
    dyn for<'t> FnOnce(
            &'t tokio_postgres::Transaction<'t>,
        ) -> Pin<
            Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 't>,
        > + Send,
>;

/// The builder's settings a remote backend checks or keeps.
#[derive(Debug)]
pub(crate) struct RemoteSettings {
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) marker_retention: Option<Duration>,
    pub(crate) sweep_interval: Option<Duration>,
    pub(crate) durability: Durability,
    /// A path or a custom storage backend was set.
    pub(crate) storage: bool,
}

/// Opens a remote backend. The builder holds it (`EngineBuilder::postgres`); its `Debug`
/// is the builder's view of the backend's settings.
pub(crate) trait RemoteOpener: fmt::Debug + Send + Sync {
    /// Refuses settings the backend cannot run with, before anything is opened.
    fn check(&self, settings: &RemoteSettings) -> Result<(), OpenError>;

    /// Connects: the backend, ready for the engine's calls (the settings were checked).
    fn connect(&self, settings: &RemoteSettings) -> Result<Arc<dyn Remote>, OpenError>;
}

/// What a claim asks a remote backend besides its key: the claim's options.
#[derive(Debug)]
pub(crate) struct RemoteAsk {
    pub(crate) fingerprint: Option<AskedFingerprint>,
    pub(crate) claim_id: Option<u128>,
    /// `None`: the engine's lease.
    pub(crate) lease: Option<Duration>,
    /// The key's own retention (whole ms), if the claim chose one.
    pub(crate) retention_ms: Option<u64>,
    /// How long to wait for another holder (`claim_or_wait`); `None`: no wait.
    pub(crate) wait: Option<Duration>,
    pub(crate) rerun_forgotten: bool,
}

/// A remote backend's answer to a claim, before the caller's side turns an acquisition
/// into a `Lease`.
#[derive(Debug)]
pub(crate) enum RemoteAnswer {
    Acquired {
        token: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
        /// The lease length it was claimed with.
        lease: Duration,
    },
    Busy(Busy),
    Completed(Stored),
    Forgotten(Forgotten),
}

/// The operations of an engine whose keys a remote backend decides, each named after the
/// public call it answers. `key` is the scoped key (`scope.rs`); the caller made the checks
/// of its call (the key, the sizes, the engine's closed flag) before it asks.
pub(crate) trait Remote: Send + Sync {
    /// `claim`, or `claim_or_wait` when `ask.wait` is set; blocking.
    fn claim(&self, key: &Arc<[u8]>, ask: &RemoteAsk) -> Result<RemoteAnswer, ClaimError>;

    /// `claim_async`, or `claim_or_wait_async` when `ask.wait` is set.
    fn claim_async<'a>(
        &'a self,
        key: &'a Arc<[u8]>,
        ask: &'a RemoteAsk,
    ) -> RemoteFuture<'a, Result<RemoteAnswer, ClaimError>>;

    /// A completion with the application's own statements in its transaction.
    fn complete_in(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
        writes: Option<&WriteSet>,
        hook: Hook,
    ) -> Result<u64, LeaseError>;

    /// A completion, kept for `retention_ms` if given; answers the wall-clock end of its
    /// retention (ms).
    fn complete(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<&WriteSet>,
    ) -> Result<u64, LeaseError>;

    /// The async completion. Dropping the future once polled leaves the completion to run:
    /// once sent, it is never withdrawn.
    fn complete_async<'a>(
        &'a self,
        key: &'a [u8],
        token: u64,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<&'a WriteSet>,
    ) -> RemoteFuture<'a, Result<u64, LeaseError>>;

    /// `release`.
    fn release(&self, key: &[u8], token: u64) -> Result<bool, LeaseError>;

    /// The async release.
    fn release_async<'a>(
        &'a self,
        key: &'a [u8],
        token: u64,
    ) -> RemoteFuture<'a, Result<bool, LeaseError>>;

    /// `fail`: the attempt ends now, the key stays InFlight, marked failed.
    fn fail(&self, key: &[u8], token: u64) -> Result<bool, LeaseError>;

    /// The async fail. Dropping the future once polled leaves the fail to run.
    fn fail_async<'a>(
        &'a self,
        key: &'a [u8],
        token: u64,
    ) -> RemoteFuture<'a, Result<bool, LeaseError>>;

    /// `extend` or `checkpoint`, a checkpoint with `writes`.
    fn update(
        &self,
        key: &[u8],
        token: u64,
        op: Holder,
        writes: Option<&WriteSet>,
    ) -> Result<(), LeaseError>;

    /// The async `extend` or `checkpoint`.
    fn update_async<'a>(
        &'a self,
        key: &'a [u8],
        token: u64,
        op: Holder,
        writes: Option<&'a WriteSet>,
    ) -> RemoteFuture<'a, Result<(), LeaseError>>;

    /// `get_scoped`.
    fn get(&self, key: &[u8]) -> Result<Option<KeyState>, ClaimError>;

    /// `table_get`: the row `row` (table prefix and key).
    fn table_get(&self, row: &[u8]) -> Result<Option<Vec<u8>>, TableError>;

    /// `table_range` / `table_prefix`: at most `limit` rows from `lo` to `hi` (exclusive),
    /// with their table prefix.
    fn table_scan(&self, lo: &[u8], hi: &[u8], limit: usize) -> Result<Vec<TableRow>, TableError>;

    /// `Outbox::pending`: messages taken by this caller for the engine's lease.
    fn outbox_pending(&self, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, TableError>;

    /// `Outbox::mark_sent`.
    fn outbox_sent(&self, ids: &[u64]) -> Result<(), TableError>;

    /// `Outbox::mark_sent_async`.
    fn outbox_sent_async<'a>(&'a self, ids: &'a [u64]) -> RemoteFuture<'a, Result<(), TableError>>;

    /// `Admin::sweep_now`: every row past its reaping instant.
    fn sweep_now(&self) -> Result<u64, ClaimError>;

    /// Time left on the lease of `token` on `key`, as this process estimates it.
    fn lease_remaining(&self, key: &[u8], token: u64) -> Duration;

    /// `Engine::stats`: this process's counters of its calls.
    fn stats(&self) -> Stats;

    /// Stops the backend. Idempotent; also done when the engine's last handle drops.
    fn close(&self);
}
