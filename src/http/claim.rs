//! [`ClaimContext`]: the claim a protected request's handler runs under, handed to it in the
//! request's extensions.

use crate::api::async_api::LeaseHandle;
use crate::api::engine::Engine;
use crate::api::lease::Lease;
use crate::model::codec::Checkpoint;
use crate::model::error::LeaseError;
use crate::model::write_set::WriteSet;
use std::fmt;

/// The claim a protected request's handler runs under: the layer inserts it into the
/// request's extensions when the request's key is acquired, before the inner service is
/// called (with axum, take it with `Extension<ClaimContext>`). Requests that pass through
/// (an unprotected method) and requests answered by the layer itself (a replay, a 409) never
/// reach the handler, so a protected handler always finds it.
///
/// It tells the handler which claim it holds ([`ClaimContext::key`], [`ClaimContext::scope`],
/// [`ClaimContext::token`], [`ClaimContext::attempt`], and the [`ClaimContext::checkpoint`] a
/// previous attempt saved), and lets it stage writes to the engine's application tables and
/// outbox ([`ClaimContext::stage`]) that commit **in the same transaction as its stored
/// response**: they are applied if and only if the response is stored, and a replay never
/// applies them again. Staged writes are dropped when the response is not stored: a status
/// that `store_when` refuses (a 5xx by default), a handler error, a response body that
/// fails, a request cut off while its handler runs, or a completion the engine refuses.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::{http::StatusCode, routing::post, Extension, Router};
/// use idemkv::http::{ClaimContext, IdempotencyConfig, IdempotencyLayer};
/// use idemkv::{Engine, WriteSet};
///
/// async fn create(
///     Extension(claim): Extension<ClaimContext>,
///     body: String,
/// ) -> (StatusCode, String) {
///     // The key identifies the request: a durable id that a retry of it finds again.
///     let id = format!("ch_{}", String::from_utf8_lossy(claim.key()));
///     let mut writes = WriteSet::new();
///     if writes.put("charges", id.as_bytes(), body.as_bytes()).is_err()
///         || claim.stage(writes).is_err()
///     {
///         return (StatusCode::INTERNAL_SERVER_ERROR, "not recorded".into());
///     }
///     (StatusCode::CREATED, id)
/// }
///
/// let engine = Engine::open("idem.redb")?;
/// let app: Router = Router::new()
///     .route("/charges", post(create))
///     .layer(IdempotencyLayer::new(engine, IdempotencyConfig::default()));
/// # Ok(()) }
/// ```
///
/// It is cheap to clone, and a clone may outlive the request: staging after the layer
/// settled the claim is refused with [`LeaseError::Settled`].
#[derive(Clone)]
pub struct ClaimContext {
    handle: LeaseHandle,
}

impl ClaimContext {
    /// The context of `lease`, acquired from `engine`.
    pub(crate) fn of(lease: &Lease, engine: &Engine) -> Self {
        let _ = engine;
        Self {
            handle: lease.handle(),
        }
    }

    /// The request's `Idempotency-Key`, as the engine keeps it (unescaped, without its
    /// scope).
    pub fn key(&self) -> &[u8] {
        self.handle.key()
    }

    /// The request's scope ([`super::IdempotencyConfig::scope`]; empty: unscoped).
    pub fn scope(&self) -> &[u8] {
        self.handle.scope()
    }

    /// The claim's fencing token: strictly larger than every token issued before it. Pass it
    /// to downstream systems so that they can refuse the writes of a superseded attempt.
    /// Tokens are unique but not dense (after a restart they jump by up to about 2²²): never
    /// use one as an identifier or a counter.
    pub fn token(&self) -> u64 {
        self.handle.token()
    }

    /// 1 for the first run of the key; one more for each takeover (an earlier attempt's
    /// lease ended without a stored response: a crash, or a request cut off while its
    /// handler ran). An attempt above 1 may follow work that was done: check for it.
    pub fn attempt(&self) -> u32 {
        self.handle.attempt()
    }

    /// The checkpoint an earlier attempt saved ([`LeaseHandle::set_checkpoint`]), if this
    /// claim took the key over.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.handle.checkpoint()
    }

    /// Stages `writes` (application tables and outbox) to be committed with the stored
    /// response, in the same transaction; dropped if the response is not stored. Several
    /// calls add up, in order.
    ///
    /// Refused with [`LeaseError::WriteSet`] when the staged writes would be over a limit of
    /// one set (nothing is staged then), [`LeaseError::Settled`] once the layer settled the
    /// claim.
    pub fn stage(&self, writes: WriteSet) -> Result<(), LeaseError> {
        self.handle.stage(writes)
    }

    /// The lease itself, to extend it or save a checkpoint while the handler works. Its
    /// completion stays with the layer.
    pub fn lease(&self) -> &LeaseHandle {
        &self.handle
    }
}

impl fmt::Debug for ClaimContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimContext")
            .field("scope", &String::from_utf8_lossy(self.scope()))
            .field("key", &String::from_utf8_lossy(self.key()))
            .field("token", &self.token())
            .field("attempt", &self.attempt())
            .finish()
    }
}
