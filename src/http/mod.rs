//! An `Idempotency-Key` layer for tower and axum services (feature `http`).
//!
//! [`IdempotencyLayer`] makes retried HTTP requests safe, following the IETF draft
//! *The Idempotency-Key HTTP Header Field* (draft-ietf-httpapi-idempotency-key-header): a
//! request of a protected method (POST and PATCH by default) must carry an
//! `Idempotency-Key` header; the first request with a key runs the handler, and every
//! repetition of it gets the handler's stored response back, marked
//! `Idempotent-Replayed: true`, without running the handler again.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{routing::post, Router};
//! use idemkv::http::{IdempotencyConfig, IdempotencyLayer, InFlight};
//! use idemkv::Engine;
//! use std::time::Duration;
//!
//! let engine = Engine::open("idem.redb")?;
//! let config = IdempotencyConfig::default()
//!     // A duplicate of a request still running waits for its response.
//!     .in_flight(InFlight::Wait(Duration::from_secs(10)))
//!     // Keys of different API keys never meet.
//!     .scope(|parts| {
//!         parts.headers.get("x-api-key").map_or(Vec::new(), |v| v.as_bytes().to_vec())
//!     });
//! let app: Router = Router::new()
//!     .route("/charges", post(|| async { "charged" }))
//!     .layer(IdempotencyLayer::new(engine, config));
//! # Ok(()) }
//! ```
//!
//! What the layer answers, and from which engine state (`docs/http.md` has the full table):
//!
//! | answer | when |
//! |---|---|
//! | the handler's response | the key was new (or released by a 5xx): the handler ran |
//! | the stored response + `Idempotent-Replayed: true` | the key is completed |
//! | 400 | key missing, repeated, malformed, empty or too long; body unreadable |
//! | 409 + `Retry-After` | another request with the key is still running (policy [`InFlight::Conflict`], or the wait of [`InFlight::Wait`] ran out) |
//! | 413 | the body is over [`IdempotencyConfig::body_len_max`] |
//! | 422 | the key was used with a different request (fingerprint mismatch) |
//! | 503 (+ `Retry-After` for a limit) | the engine is overloaded, closed, poisoned or out of tokens |
//! | 500 | the engine's outcome is unknown, a stored response is unreadable (damaged or over the stored-response limits: answered, never a panic, and the handler is not run again), or the layer is misconfigured |
//!
//! Error bodies are RFC 9457 problem details (`application/problem+json`) with `type`
//! (`urn:idemkv:problem:<slug>`), `title`, `status` and `detail`.
//!
//! **Which responses are stored.** By default 2xx and 4xx responses (and every status below
//! 500) are stored and replayed, except 408, 425 and 429, which tell the client to retry
//! later ([`retries_later`]); those and a 5xx release the key so that a retry runs the
//! handler again ([`IdempotencyConfig::store_when`] changes the policy). The winner's response body
//! is buffered whole, as the request body is. If the engine refuses to store a response
//! (over [`crate::EngineBuilder::response_len_max`], or a writer queue full for the whole
//! lease), the handler's response is still returned, and the key stays in flight until the
//! lease ends (the engine never runs finished work twice on its own): duplicates get 409
//! until then, and the first request after it runs the handler again.
//!
//! **The handler's claim.** A request that acquires its key reaches the handler with a
//! [`ClaimContext`] in its extensions: the key, scope, fencing token, attempt and
//! checkpoint of its claim, and [`ClaimContext::stage`], which stages writes to the
//! engine's application tables and outbox ([`crate::WriteSet`]) to commit in the same
//! transaction as the stored response; they are dropped if the response is not stored.
//!
//! **Fingerprints.** A request's fingerprint covers its method, path and query, the
//! configured headers ([`IdempotencyConfig::fingerprint_header`]) and its body, as a
//! canonical length-prefixed encoding hashed by [`crate::ClaimOptions::payload`].

mod claim;
mod constants;
mod key;
mod problem;
mod service;
mod stored;

pub use claim::ClaimContext;
pub use problem::PROBLEM_JSON;
pub use service::{IdempotencyLayer, IdempotencyService, ResponseBody};

/// The stored form of a response, reached from the fuzz target `stored_response`. Compiled
/// only with `--cfg idemkv_sabotage` (as the engine's other test hooks, `src/sabotage.rs`),
/// so no build of a user's has it; hidden from the documentation. Plain types only, so the
/// fuzz crate needs no `http` of its own.
#[cfg(idemkv_sabotage)]
#[doc(hidden)]
pub mod stored_hooks {
    use ::http::header::{HeaderName, HeaderValue};
    use ::http::{HeaderMap, StatusCode};
    use http_body_util::BodyExt;
    use std::future::Future;

    /// A response as plain parts: status, headers (name, value) in order, body.
    pub type Plain = (u16, Vec<(String, Vec<u8>)>, Vec<u8>);

    /// Decodes a stored response.
    pub fn decode_stored(bytes: &[u8]) -> Result<Plain, String> {
        let stored = super::stored::decode(bytes).map_err(|e| e.to_string())?;
        Ok(plain(stored.status, &stored.headers, &stored.body))
    }

    /// Encodes a response as the layer stores it (every header kept).
    pub fn encode_stored(response: &Plain) -> Result<Vec<u8>, String> {
        let (status, headers, body) = response;
        let status = StatusCode::from_u16(*status).map_err(|e| e.to_string())?;
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
            let value = HeaderValue::from_bytes(value).map_err(|e| e.to_string())?;
            map.try_append(name, value).map_err(|e| e.to_string())?;
        }
        super::stored::encode(status, &map, |_| true, body).map_err(|e| e.to_string())
    }

    /// What the layer answers a duplicate whose key holds `bytes`: the replay, or the 500
    /// problem for a value that does not decode.
    pub fn replay_stored(bytes: &[u8]) -> Plain {
        let res = super::service::replay::<http_body_util::Full<bytes::Bytes>>(bytes);
        let (parts, body) = res.into_parts();
        // Both arms are in-memory bodies, which cannot fail; polled without a runtime.
        let body = match body {
            http_body_util::Either::Left(full) | http_body_util::Either::Right(full) => {
                let waker = std::task::Waker::noop();
                let mut cx = std::task::Context::from_waker(waker);
                let mut collect = std::pin::pin!(full.collect());
                match collect.as_mut().poll(&mut cx) {
                    std::task::Poll::Ready(Ok(c)) => c.to_bytes(),
                    _ => bytes::Bytes::new(),
                }
            }
        };
        plain(parts.status, &parts.headers, &body)
    }

    fn plain(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Plain {
        let headers = headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        (status.as_u16(), headers, body.to_vec())
    }
}

use crate::http::constants::{HTTP_BODY_LEN_MAX_DEFAULT, HTTP_KEY_LEN_MAX_DEFAULT};
use ::http::header::{
    HeaderName, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_TYPE, ETAG, LOCATION,
    SET_COOKIE,
};
use ::http::request::Parts;
use ::http::{Method, StatusCode};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The header that carries the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header a replayed response carries (`true`); the first response never carries it.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// What a request gets while another request with the same key is still being handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InFlight {
    /// Answer 409 Conflict at once, with `Retry-After` (the holder's remaining lease, in
    /// seconds rounded up). The draft's behaviour.
    Conflict,
    /// Wait up to this long for the first request to finish and answer with its stored
    /// response (a replay); 409 with `Retry-After` if the wait runs out. If the first
    /// request's response is not stored (a 5xx), the waiting request runs the handler itself.
    Wait(Duration),
}

type ScopeFn = dyn Fn(&Parts) -> Vec<u8> + Send + Sync;
type StoreFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// The settings of an [`IdempotencyLayer`], built from [`IdempotencyConfig::default`].
#[derive(Clone)]
pub struct IdempotencyConfig {
    pub(crate) methods: Vec<Method>,
    pub(crate) strict_keys: bool,
    pub(crate) key_len_max: usize,
    pub(crate) scope: Arc<ScopeFn>,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) in_flight: InFlight,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) store: Arc<StoreFn>,
    pub(crate) body_len_max: usize,
    pub(crate) lease: Option<Duration>,
}

impl Default for IdempotencyConfig {
    /// POST and PATCH protected; quoted and bare keys of up to 255 bytes; one empty scope;
    /// no header fingerprinted; [`InFlight::Conflict`]; content-type, content-encoding,
    /// content-language, location, etag and cache-control replayed; every status below 500
    /// stored but 408, 425 and 429 ([`retries_later`]); bodies up to 1 MiB; the engine's
    /// lease.
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            strict_keys: false,
            key_len_max: HTTP_KEY_LEN_MAX_DEFAULT,
            scope: Arc::new(|_| Vec::new()),
            fingerprint_headers: Vec::new(),
            in_flight: InFlight::Conflict,
            replay_headers: vec![
                CONTENT_TYPE,
                // The stored body is the encoded representation: without its coding a
                // replay of a compressed body could not be read.
                CONTENT_ENCODING,
                CONTENT_LANGUAGE,
                LOCATION,
                ETAG,
                CACHE_CONTROL,
            ],
            store: Arc::new(|status| !status.is_server_error() && !retries_later(status)),
            body_len_max: HTTP_BODY_LEN_MAX_DEFAULT,
            lease: None,
        }
    }
}

impl IdempotencyConfig {
    /// The methods whose requests must carry a key (default POST and PATCH). Requests of
    /// other methods pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Accept only a quoted structured-field String (`"abc"`), as the draft specifies; by
    /// default a bare token (`abc`, a UUID) is accepted too.
    pub fn strict_keys(mut self, strict: bool) -> Self {
        self.strict_keys = strict;
        self
    }

    /// Longest key accepted, in bytes after unescaping (default 255); longer ones get 400.
    /// It must not exceed the engine's [`crate::EngineBuilder::key_len_max`] (default 255),
    /// or requests with keys between the two get 500 (misconfigured). The scope does not
    /// count against it.
    pub fn key_len_max(mut self, max: usize) -> Self {
        self.key_len_max = max;
        self
    }

    /// Derives the scope of a request's key (the tenant, the API key), so that identical
    /// keys of two clients never meet: the engine keeps the scope apart from the key
    /// ([`crate::ClaimOptions::scope`]). At most 255 bytes (hash a longer one); a longer
    /// scope gets 500 (misconfigured). Default: one empty scope for every request.
    pub fn scope(mut self, scope: impl Fn(&Parts) -> Vec<u8> + Send + Sync + 'static) -> Self {
        self.scope = Arc::new(scope);
        self
    }

    /// Adds a request header to the fingerprint (all its values, in order), so that the
    /// same key with another value of it gets 422.
    pub fn fingerprint_header(mut self, name: HeaderName) -> Self {
        self.fingerprint_headers.push(name);
        self
    }

    /// What a duplicate of a request still in flight gets (default [`InFlight::Conflict`]).
    pub fn in_flight(mut self, policy: InFlight) -> Self {
        self.in_flight = policy;
        self
    }

    /// Adds a response header to those stored and replayed. `Set-Cookie` is never stored:
    /// a cookie is meant for one response, and a replay may reach another client of the
    /// same scope.
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.replay_headers.push(name);
        self
    }

    /// Replaces the list of response headers stored and replayed (`Set-Cookie` never is).
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replay_headers = names.into_iter().collect();
        self
    }

    /// Which responses are stored and replayed (default: every status below 500 but those
    /// that tell the client to retry later, [`retries_later`]). A response not stored
    /// releases the key, so that a retry runs the handler again.
    ///
    /// ```
    /// use idemkv::http::{retries_later, IdempotencyConfig};
    /// // Store 2xx only: any error lets the retry run the handler again.
    /// let only_success = IdempotencyConfig::default().store_when(|s| s.is_success());
    /// // The default, spelled out.
    /// let default = IdempotencyConfig::default()
    ///     .store_when(|s| !s.is_server_error() && !retries_later(s));
    /// # let _ = (only_success, default);
    /// ```
    pub fn store_when(
        mut self,
        store: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.store = Arc::new(store);
        self
    }

    /// Largest request body, in bytes, buffered for the fingerprint (default 1 MiB). A
    /// larger body (by `Content-Length`, or as read) gets 413 and the handler does not run.
    pub fn body_len_max(mut self, max: usize) -> Self {
        self.body_len_max = max;
        self
    }

    /// The lease of each claim (default: the engine's). The handler should finish within
    /// it: past it, a duplicate takes the key over and runs the handler again.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Whether a response header is stored for replays.
    pub(crate) fn replays_header(&self, name: &HeaderName) -> bool {
        *name != SET_COOKIE && self.replay_headers.contains(name)
    }
}

/// Whether `status` tells the client to send the same request again later: 408 Request
/// Timeout, 425 Too Early and 429 Too Many Requests. The default [`IdempotencyConfig`] does
/// not store these: the request was refused before its work, and replaying the refusal for
/// the key's whole retention would turn a refusal the client is told to wait out into a
/// permanent one.
pub fn retries_later(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_EARLY | StatusCode::TOO_MANY_REQUESTS
    )
}

impl fmt::Debug for IdempotencyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyConfig")
            .field("methods", &self.methods)
            .field("strict_keys", &self.strict_keys)
            .field("key_len_max", &self.key_len_max)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("in_flight", &self.in_flight)
            .field("replay_headers", &self.replay_headers)
            .field("body_len_max", &self.body_len_max)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}
