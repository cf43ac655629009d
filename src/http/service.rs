//! The tower `Layer` and `Service`: one claim per protected request.

use super::claim::ClaimContext;
use super::key::{self, KeyError};
use super::problem::{self, Kind};
use super::stored;
use super::{IdempotencyConfig, InFlight, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::api::engine::Engine;
use crate::api::lease::{Claim, Lease};
use crate::api::options::ClaimOptions;
use crate::model::error::ClaimError;
use ::http::header::{HeaderValue, CONTENT_LENGTH};
use ::http::request::Parts;
use ::http::{HeaderMap, Request, Response};
use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of the layer's responses: the inner service's own body when the request passed
/// through untouched, otherwise bytes the layer holds (the buffered response of a handler
/// that ran, a replay, or a problem).
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// What every clone of a layer and its services shares.
struct Shared {
    engine: Engine,
    config: IdempotencyConfig,
}

/// A tower [`Layer`] that applies the `Idempotency-Key` protocol to a service (see the
/// [module docs](super)). Cloning it is cheap; every clone shares the engine.
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl IdempotencyLayer {
    /// A layer that keeps its keys in `engine`.
    pub fn new(engine: Engine, config: IdempotencyConfig) -> Self {
        Self {
            shared: Arc::new(Shared { engine, config }),
        }
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service an [`IdempotencyLayer`] wraps around an inner service.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The instance `poll_ready` readied is the one that must be called: take it, and
        // leave a fresh clone (to be readied by the next `poll_ready`) in its place.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        let shared = self.shared.clone();
        Box::pin(handle(shared, inner, req))
    }
}

fn problem<B>(kind: Kind, detail: &str) -> Response<ResponseBody<B>> {
    problem::response(kind, detail, None).map(Either::Right)
}

async fn handle<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: Body + From<Bytes>,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let cfg = &shared.config;
    if !cfg.methods.contains(req.method()) {
        return Ok(inner.call(req).await?.map(Either::Left));
    }
    let (parts, body) = req.into_parts();
    let key = match key_of(&parts.headers, cfg) {
        Ok(key) => key,
        Err(e) => {
            let kind = match e {
                KeyError::Missing => problem::KEY_MISSING,
                KeyError::TooLong { .. } => problem::KEY_TOO_LONG,
                _ => problem::KEY_MALFORMED,
            };
            return Ok(problem(kind, &e.to_string()));
        }
    };
    // The engine keeps scopes apart from keys: two scopes' equal keys never meet.
    let scope = (cfg.scope)(&parts);

    // A declared length over the limit is refused before a byte is read; a body that
    // declares none (or lies) is cut off by the limit while it is read.
    if content_length(&parts.headers).is_some_and(|len| len > cfg.body_len_max as u64) {
        return Ok(too_large(cfg.body_len_max));
    }
    let body = match Limited::new(body, cfg.body_len_max).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(too_large(cfg.body_len_max))
        }
        Err(e) => {
            return Ok(problem(
                problem::BODY_UNREADABLE,
                &format!("reading the request body failed: {e}"),
            ))
        }
    };

    let mut opts = ClaimOptions::default()
        .scope(&scope)
        .payload(&fingerprint(&parts, cfg, &body));
    if let Some(lease) = cfg.lease {
        opts = opts.lease(lease);
    }
    let claim = match cfg.in_flight {
        InFlight::Conflict => shared.engine.claim_async(&key, &opts).await,
        InFlight::Wait(wait) => {
            let opts = opts.wait(wait);
            shared.engine.claim_or_wait_async(&key, &opts).await
        }
    };
    match claim {
        Err(e) => Ok(claim_error(e)),
        Ok(Claim::InProgress(busy)) => Ok(problem::response(
            problem::IN_FLIGHT,
            "a request with this Idempotency-Key is still being processed; retry after the \
             time in Retry-After",
            Some(busy.retry_after()),
        )
        .map(Either::Right)),
        Ok(Claim::Completed(stored)) => Ok(replay(stored.response())),
        // The request was processed; only a marker of it is left. Running the handler again
        // is what the key exists to prevent, so this is final for the key.
        Ok(Claim::Forgotten(forgotten)) => Ok(problem(
            problem::RESPONSE_FORGOTTEN,
            &format!(
                "a request with this Idempotency-Key was processed at {} (ms since the Unix \
                 epoch, attempt {}), but its response is no longer kept; it is not processed \
                 again (use a new key for a new request)",
                crate::base::clock::wall_ms(forgotten.completed_at()),
                forgotten.attempt()
            ),
        )),
        Ok(Claim::Acquired(lease)) => {
            // The handler's view of its claim, made from the lease before `run` takes it.
            let mut parts = parts;
            parts
                .extensions
                .insert(ClaimContext::of(&lease, &shared.engine));
            let req = Request::from_parts(parts, ReqBody::from(body));
            run(cfg, lease, inner.call(req)).await
        }
    }
}

/// Runs the handler under `lease`, then stores its response or gives the key up.
async fn run<F, ResBody, E>(
    cfg: &IdempotencyConfig,
    lease: Lease,
    handler: F,
) -> Result<Response<ResponseBody<ResBody>>, E>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
{
    // If this future is dropped (the client went away, an outer timeout fired) or the
    // handler panics, the lease is dropped unsettled, which keeps the key InFlight until
    // its lease ends, as after a crash: the handler was cut off at an unknown point, perhaps
    // after its side effect, so a retry must not run it again at once.
    let res = match handler.await {
        Ok(res) => res,
        Err(e) => {
            // The handler failed without a response: a retry may run it.
            let _ = lease.release_async().await;
            return Err(e);
        }
    };
    let (res_parts, res_body) = res.into_parts();
    // The body's error type need not be Send; only its boxed form is kept across awaits.
    let collected = res_body.collect().await.map_err(Into::<BoxError>::into);
    let body = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            // No response to store or return: treated as a failed handler.
            let _ = lease.release_async().await;
            return Ok(problem(
                problem::INTERNAL,
                &format!("the handler's response body failed: {e}"),
            ));
        }
    };
    // The handler ran and its response was read: the key is settled now.
    settle(cfg, lease, &res_parts, &body).await;
    Ok(Response::from_parts(
        res_parts,
        Either::Right(Full::new(body)),
    ))
}

/// Stores the handler's response under `lease` (if `store_when` says so) or gives the key up.
async fn settle(
    cfg: &IdempotencyConfig,
    lease: Lease,
    res: &::http::response::Parts,
    body: &Bytes,
) {
    if (cfg.store)(res.status) {
        match stored::encode(
            res.status,
            &res.headers,
            |name| cfg.replays_header(name),
            body,
        ) {
            // Whatever the engine answers, the handler ran: its response goes back. A
            // refused completion (too large, queue full for the whole lease) keeps the key
            // in flight until the lease ends; a lost lease or a stopped engine leave it to
            // the engine's state.
            Ok(encoded) => {
                let _ = lease.complete_async(&encoded).await;
            }
            // The kept headers are over the stored-response limits (a response that could
            // not be replayed): the work is done, so the key is kept until the lease ends,
            // as for a response the engine refuses, rather than released.
            Err(_) => {
                let _ = lease.detach();
            }
        }
    } else {
        let _ = lease.release_async().await;
    }
}

fn key_of(headers: &HeaderMap, cfg: &IdempotencyConfig) -> Result<Vec<u8>, KeyError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    key::parse(value.as_bytes(), cfg.strict_keys, cfg.key_len_max)
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

fn too_large<B>(max: usize) -> Response<ResponseBody<B>> {
    problem(
        problem::BODY_TOO_LARGE,
        &format!("the request body is over the limit of {max} bytes"),
    )
}

/// The canonical encoding of what identifies a request: a tag, the method, the path and
/// query, each configured header (its name, its number of values, each value), and the
/// body, every field prefixed by its length (u64, big-endian), so that no two different
/// requests encode alike.
fn fingerprint(parts: &Parts, cfg: &IdempotencyConfig, body: &[u8]) -> Vec<u8> {
    fn field(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        out.extend_from_slice(bytes);
    }
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let mut out = Vec::with_capacity(64 + target.len() + body.len());
    field(&mut out, b"idemkv-http-fingerprint-1");
    field(&mut out, parts.method.as_str().as_bytes());
    field(&mut out, target.as_bytes());
    out.extend_from_slice(&(cfg.fingerprint_headers.len() as u64).to_be_bytes());
    for name in &cfg.fingerprint_headers {
        field(&mut out, name.as_str().as_bytes());
        let values = parts.headers.get_all(name);
        out.extend_from_slice(&(values.iter().count() as u64).to_be_bytes());
        for value in values {
            field(&mut out, value.as_bytes());
        }
    }
    field(&mut out, body);
    out
}

/// A stored response as it is replayed, or 500 if it cannot be read.
///
/// A damaged value is answered, never re-run: the key stays Completed, so the handler does
/// not run for it again, and every duplicate gets the same 500.
pub(crate) fn replay<B>(bytes: &[u8]) -> Response<ResponseBody<B>> {
    let built = stored::decode(bytes).and_then(|stored| {
        let mut headers = stored.headers;
        headers
            .try_insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"))
            .map_err(|_| stored::StoredError::TooManyHeaders {
                count: headers.len() as u64,
                max: crate::http::constants::HTTP_STORED_HEADERS_MAX,
            })?;
        let mut res = Response::new(Either::Right(Full::new(stored.body)));
        *res.status_mut() = stored.status;
        *res.headers_mut() = headers;
        Ok(res)
    });
    built.unwrap_or_else(|e| {
        problem(
            problem::CORRUPTED,
            &format!("the stored response for this Idempotency-Key cannot be decoded: {e}"),
        )
    })
}

/// The answer to a claim the engine refused (see `docs/http.md`). Engine-internal reasons
/// (a storage error's text) are not sent to the client.
fn claim_error<B>(e: ClaimError) -> Response<ResponseBody<B>> {
    match e {
        ClaimError::FingerprintMismatch => problem(
            problem::KEY_REUSED,
            "this Idempotency-Key was used with a different request (method, path, body or \
             fingerprinted headers); use a new key for a new request",
        ),
        ClaimError::Overloaded(limit) => {
            problem::overloaded(&format!("{limit} reached; retry later")).map(Either::Right)
        }
        ClaimError::Contended => {
            problem::overloaded("the key kept changing while it was claimed; retry")
                .map(Either::Right)
        }
        ClaimError::Closed => problem(problem::UNAVAILABLE, "the idempotency store is closed"),
        ClaimError::Poisoned(_) => problem(
            problem::UNAVAILABLE,
            "the idempotency store stopped after a storage failure",
        ),
        ClaimError::TokensExhausted => problem(
            problem::UNAVAILABLE,
            "the idempotency store can issue no more fencing tokens",
        ),
        ClaimError::OutcomeUnknown(_) => problem(
            problem::OUTCOME_UNKNOWN,
            "the idempotency store failed before confirming the claim; the handler did not \
             run; retry with the same key",
        ),
        ClaimError::Corrupted(_) => problem(
            problem::CORRUPTED,
            "the stored record for this Idempotency-Key is damaged",
        ),
        ClaimError::KeyTooLong { .. } | ClaimError::KeyEmpty => problem(
            problem::MISCONFIGURED,
            "the key exceeds the engine's key limit",
        ),
        ClaimError::ScopeTooLong { .. } => problem(
            problem::MISCONFIGURED,
            "the scope of the request exceeds the engine's scope limit",
        ),
        // The engine's error enums may grow; a new variant is a 500 until it is mapped.
        #[allow(unreachable_patterns)]
        _ => problem(problem::INTERNAL, "the idempotency store refused the claim"),
    }
}
