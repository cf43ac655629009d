//! The Idempotency-Key layer (feature `http`) behind a real axum server on 127.0.0.1, driven
//! by a real hyper client: the draft's error table, storing and replaying, scopes, restarts.

use axum::body::Bytes;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER, SET_COOKIE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::routing::{get, post};
use axum::{Extension, Router};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idemkv::http::{ClaimContext, IdempotencyConfig, IdempotencyLayer, InFlight, PROBLEM_JSON};
use idemkv::{Claim, ClaimOptions, Durability, Engine, KeyState, MockClock, WriteSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Notify};

const REPLAYED: &str = "idempotent-replayed";

struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn serve(app: Router) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Server { addr, stop, task }
}

impl Server {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers.get(REPLAYED).is_some_and(|v| v == "true")
    }
    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
    fn problem(&self) -> serde_json::Value {
        assert_eq!(self.headers[CONTENT_TYPE], PROBLEM_JSON, "{self:?}");
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        assert_eq!(v["status"], self.status.as_u16(), "{v}");
        assert!(v["type"]
            .as_str()
            .unwrap()
            .starts_with("urn:idemkv:problem:"));
        assert!(!v["title"].as_str().unwrap().is_empty());
        assert!(!v["detail"].as_str().unwrap().is_empty());
        v
    }
    fn retry_after(&self) -> u64 {
        self.headers[RETRY_AFTER].to_str().unwrap().parse().unwrap()
    }
}

async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let res = client.request(req).await.unwrap();
    let (parts, body) = res.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn post_key(client: &HttpClient, addr: SocketAddr, key: &str, body: &str) -> Reply {
    send(
        client,
        addr,
        Method::POST,
        "/charges",
        &[("idempotency-key", key)],
        body,
    )
    .await
}

/// An in-memory engine on a clock that does not move (exact Retry-After values).
fn engine() -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .clock(MockClock::new())
        .lease(Duration::from_secs(7))
        .open()
        .unwrap()
}

/// `POST /charges` answering "charge #N for BODY" (N counts the handler's runs).
fn charges(engine: Engine, config: IdempotencyConfig, runs: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/charges",
            post(move |body: String| {
                let runs = runs.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("charge #{n} for {body}"))
                }
            }),
        )
        .layer(IdempotencyLayer::new(engine, config))
}

/// `POST /charges` whose first run waits for `gate` before answering.
fn held_charges(
    engine: Engine,
    config: IdempotencyConfig,
    runs: Arc<AtomicUsize>,
    gate: Arc<Notify>,
) -> Router {
    Router::new()
        .route(
            "/charges",
            post(move |body: String| {
                let (runs, gate) = (runs.clone(), gate.clone());
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    if n == 1 {
                        gate.notified().await;
                    }
                    (
                        StatusCode::CREATED,
                        [("content-type", "text/plain"), ("x-charge", "c1")],
                        format!("charge #{n} for {body}"),
                    )
                }
            }),
        )
        .layer(IdempotencyLayer::new(engine, config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_policy_32_duplicates_run_once_and_31_replay() {
    let engine = engine();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let config = IdempotencyConfig::default().in_flight(InFlight::Wait(Duration::from_secs(60)));
    let app = held_charges(engine.clone(), config, runs.clone(), gate.clone());
    let server = serve(app).await;
    let client = client();
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let client = client.clone();
            let addr = server.addr;
            tokio::spawn(
                async move { post_key(&client, addr, "\"pay-1\"", "{\"amount\":5}").await },
            )
        })
        .collect();
    // The winner holds until the 31 others are waiting for it (the bound only turns a
    // waiter that is never counted into a failure instead of a hang).
    let all_waiting = async {
        while engine.stats().waits < 31 || runs.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all_waiting)
        .await
        .expect("31 duplicates counted in Stats::waits while the winner runs");
    gate.notify_one();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for r in &replies {
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        assert_eq!(r.body, replies[0].body);
        assert_eq!(r.headers[CONTENT_TYPE], "text/plain");
        // Only the allow-listed headers are replayed.
        assert_eq!(r.headers.get("x-charge").is_some(), !r.replayed());
    }
    assert_eq!(replies[0].text(), "charge #1 for {\"amount\":5}");
    assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 31);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_policy_32_duplicates_run_once_losers_get_409() {
    let engine = engine();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let app = held_charges(
        engine.clone(),
        IdempotencyConfig::default(),
        runs.clone(),
        gate.clone(),
    );
    let server = serve(app).await;
    let client = client();
    let (tx, mut rx) = mpsc::unbounded_channel();
    for _ in 0..32 {
        let (client, addr, tx) = (client.clone(), server.addr, tx.clone());
        tokio::spawn(async move {
            let _ = tx.send(post_key(&client, addr, "pay-2", "{\"amount\":7}").await);
        });
    }
    // Every loser answers while the winner is held.
    let mut losers = Vec::new();
    while losers.len() < 31 {
        losers.push(rx.recv().await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for r in &losers {
        assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
        // The lease (7 s on a clock that does not move) is the hint.
        assert_eq!(r.retry_after(), 7);
        r.problem();
    }
    gate.notify_one();
    let winner = rx.recv().await.unwrap();
    assert_eq!(winner.status, StatusCode::CREATED);
    assert!(!winner.replayed());
    assert_eq!(winner.text(), "charge #1 for {\"amount\":7}");
    let again = post_key(&client, server.addr, "pay-2", "{\"amount\":7}").await;
    assert!(again.replayed());
    assert_eq!(again.body, winner.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(client);
    server.stop().await;
}

async fn plain_server(config: IdempotencyConfig) -> (Server, Arc<AtomicUsize>, HttpClient) {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = serve(charges(engine(), config, runs.clone())).await;
    (server, runs, client())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_key_is_400_problem_json() {
    let (server, runs, client) = plain_server(IdempotencyConfig::default()).await;
    let r = send(&client, server.addr, Method::POST, "/charges", &[], "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let p = r.problem();
    assert_eq!(p["type"], "urn:idemkv:problem:key-missing");
    assert_eq!(p["title"], "Idempotency-Key is missing");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // PATCH is protected by default too.
    let r = send(&client, server.addr, Method::PATCH, "/charges", &[], "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_key_is_400() {
    let (server, runs, client) = plain_server(IdempotencyConfig::default()).await;
    for bad in [
        "\"unterminated",
        "\"a\\nb\"",
        "two words",
        "\"k\";p=1",
        "a,b",
    ] {
        let r = post_key(&client, server.addr, bad, "{}").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.problem()["type"], "urn:idemkv:problem:key-malformed");
    }
    // The header twice.
    let r = send(
        &client,
        server.addr,
        Method::POST,
        "/charges",
        &[("idempotency-key", "a"), ("idempotency-key", "b")],
        "{}",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    // An empty String.
    let r = post_key(&client, server.addr, "\"\"", "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // A bare token and an escaped String are accepted by default.
    assert_eq!(
        post_key(&client, server.addr, "8e03978e-40d5", "{}")
            .await
            .status,
        201
    );
    assert_eq!(
        post_key(&client, server.addr, "\"a\\\"b\"", "{}")
            .await
            .status,
        201
    );
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_keys_refuse_bare_tokens() {
    let (server, runs, client) = plain_server(IdempotencyConfig::default().strict_keys(true)).await;
    let r = post_key(&client, server.addr, "pay-1", "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        post_key(&client, server.addr, "\"pay-1\"", "{}")
            .await
            .status,
        201
    );
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_long_key_is_400_and_the_default_fits_the_engine() {
    let (server, runs, client) = plain_server(IdempotencyConfig::default()).await;
    // The default limit is the engine's (255): the scope is carried apart from the key.
    let longest = "k".repeat(255);
    assert_eq!(
        post_key(&client, server.addr, &longest, "{}").await.status,
        201
    );
    let r = post_key(&client, server.addr, &"k".repeat(256), "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.problem()["type"], "urn:idemkv:problem:key-too-long");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(client);
    server.stop().await;
    // A configured limit.
    let (server, _, client) = plain_server(IdempotencyConfig::default().key_len_max(8)).await;
    assert_eq!(
        post_key(&client, server.addr, "\"12345678\"", "{}")
            .await
            .status,
        201
    );
    assert_eq!(
        post_key(&client, server.addr, "\"123456789\"", "{}")
            .await
            .status,
        400
    );
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_duplicate_is_409_with_retry_after() {
    let engine = engine();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let config = IdempotencyConfig::default().lease(Duration::from_millis(2500));
    let server = serve(held_charges(engine, config, runs.clone(), gate.clone())).await;
    let client = client();
    let first = {
        let (client, addr) = (client.clone(), server.addr);
        tokio::spawn(async move { post_key(&client, addr, "k", "a").await })
    };
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let r = post_key(&client, server.addr, "k", "a").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.retry_after(), 3, "2.5 s rounded up");
    assert_eq!(r.problem()["type"], "urn:idemkv:problem:in-flight");
    gate.notify_one();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_key_with_another_request_is_422() {
    let runs = Arc::new(AtomicUsize::new(0));
    let config =
        IdempotencyConfig::default().fingerprint_header(HeaderName::from_static("x-currency"));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/charges",
            post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { (StatusCode::CREATED, "charged") }
            })
            .patch(|| async { "patched" }),
        )
        .route("/refunds", post(|| async { "refunded" }))
        .layer(IdempotencyLayer::new(engine(), config));
    let server = serve(app).await;
    let client = client();
    assert_eq!(
        post_key(&client, server.addr, "k", "{\"amount\":1}")
            .await
            .status,
        201
    );
    // Another body.
    let r = post_key(&client, server.addr, "k", "{\"amount\":2}").await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.problem()["type"], "urn:idemkv:problem:key-reused");
    // Another path, another query, another method, another fingerprinted header.
    let other_path = send(
        &client,
        server.addr,
        Method::POST,
        "/refunds",
        &[("idempotency-key", "k")],
        "{\"amount\":1}",
    )
    .await;
    let other_query = send(
        &client,
        server.addr,
        Method::POST,
        "/charges?x=1",
        &[("idempotency-key", "k")],
        "{\"amount\":1}",
    )
    .await;
    let other_method = send(
        &client,
        server.addr,
        Method::PATCH,
        "/charges",
        &[("idempotency-key", "k")],
        "{\"amount\":1}",
    )
    .await;
    let other_header = send(
        &client,
        server.addr,
        Method::POST,
        "/charges",
        &[("idempotency-key", "k"), ("x-currency", "EUR")],
        "{\"amount\":1}",
    )
    .await;
    for r in [other_path, other_query, other_method, other_header] {
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{r:?}");
    }
    // The same request replays.
    assert!(post_key(&client, server.addr, "k", "{\"amount\":1}")
        .await
        .replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_the_limit_is_413_by_length_or_as_read() {
    let (server, runs, client) = plain_server(IdempotencyConfig::default().body_len_max(16)).await;
    assert_eq!(
        post_key(&client, server.addr, "k1", &"x".repeat(16))
            .await
            .status,
        201
    );
    let r = post_key(&client, server.addr, "k2", &"x".repeat(17)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.problem()["type"], "urn:idemkv:problem:body-too-large");
    // A chunked body declares no length: the limit cuts it off as it is read.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(
        b"POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: k3\r\n\
          transfer-encoding: chunked\r\nconnection: close\r\n\r\n\
          a\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_passes_through_untouched() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = charges(engine(), IdempotencyConfig::default(), runs.clone()).route(
        "/balance",
        get(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move { format!("balance read {n}") }
        }),
    );
    let server = serve(app).await;
    let client = client();
    for n in 1..=2 {
        let r = send(
            &client,
            server.addr,
            Method::GET,
            "/balance",
            &[("idempotency-key", "k")],
            "",
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.text(), format!("balance read {n}"));
        assert!(!r.replayed());
    }
    // No key needed either; a configured method list changes what is protected.
    let r = send(&client, server.addr, Method::GET, "/balance", &[], "").await;
    assert_eq!(r.status, StatusCode::OK);
    drop(client);
    server.stop().await;
    let (server, runs, client) =
        plain_server(IdempotencyConfig::default().methods([Method::PUT])).await;
    assert_eq!(
        send(&client, server.addr, Method::POST, "/charges", &[], "")
            .await
            .status,
        201
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(client);
    server.stop().await;
}

/// `POST /charges` answering with the status the body names ("500", "404", "201").
fn status_echo(engine: Engine, config: IdempotencyConfig, runs: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/charges",
            post(move |body: String| {
                let runs = runs.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let status = StatusCode::from_u16(body.trim().parse().unwrap()).unwrap();
                    (
                        status,
                        [(SET_COOKIE, "session=s1"), (CONTENT_TYPE, "text/plain")],
                        [("x-charge-id", format!("ch_{n}"))],
                        format!("run {n}"),
                    )
                }
            }),
        )
        .layer(IdempotencyLayer::new(engine, config))
}

/// What the first run of [`first_run_app`]'s handler does; every later run answers 201
/// "run N".
#[derive(Debug, Clone, Copy)]
enum FirstRun {
    /// Answers 503.
    Unavailable,
    /// Counts itself (its side effect), then never finishes.
    Hangs,
    /// Panics.
    Panics,
}

/// `POST /charges` behind the layer, counting its handler's runs in `runs`.
fn first_run_app(engine: Engine, runs: Arc<AtomicUsize>, first: FirstRun) -> Router {
    Router::new()
        .route(
            "/charges",
            post(move || {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if n == 1 {
                        match first {
                            FirstRun::Unavailable => {
                                return (StatusCode::SERVICE_UNAVAILABLE, "down".to_owned())
                            }
                            FirstRun::Hangs => std::future::pending::<()>().await,
                            FirstRun::Panics => panic!("the handler's first run panics"),
                        }
                    }
                    (StatusCode::CREATED, format!("run {n}"))
                }
            }),
        )
        .layer(IdempotencyLayer::new(engine, IdempotencyConfig::default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_error_is_not_stored_and_a_retry_runs_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = first_run_app(engine(), runs.clone(), FirstRun::Unavailable);
    let server = serve(app).await;
    let client = client();
    let r = post_key(&client, server.addr, "k", "x").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let r = post_key(&client, server.addr, "k", "x").await;
    assert_eq!(
        (r.status, r.text(), r.replayed()),
        (StatusCode::CREATED, "run 2", false)
    );
    let r = post_key(&client, server.addr, "k", "x").await;
    assert_eq!(
        (r.status, r.text(), r.replayed()),
        (StatusCode::CREATED, "run 2", true)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_error_is_stored_and_store_policy_is_configurable() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = serve(status_echo(
        engine(),
        IdempotencyConfig::default(),
        runs.clone(),
    ))
    .await;
    let client = client();
    let first = post_key(&client, server.addr, "k", "404").await;
    let again = post_key(&client, server.addr, "k", "404").await;
    assert_eq!(
        (first.status, again.status),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    assert_eq!(again.text(), "run 1");
    assert!(again.replayed() && !first.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(client);
    server.stop().await;
    // Storing only 2xx: a 404 runs again.
    let runs = Arc::new(AtomicUsize::new(0));
    let config = IdempotencyConfig::default().store_when(|s| s.is_success());
    let server = serve(status_echo(engine(), config, runs.clone())).await;
    let client = self::client();
    post_key(&client, server.addr, "k", "404").await;
    let again = post_key(&client, server.addr, "k", "404").await;
    assert_eq!((again.text(), again.replayed()), ("run 2", false));
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_cookie_is_never_replayed_other_listed_headers_are() {
    let runs = Arc::new(AtomicUsize::new(0));
    let config = IdempotencyConfig::default()
        .replay_header(SET_COOKIE)
        .replay_header(HeaderName::from_static("x-charge-id"));
    let server = serve(status_echo(engine(), config, runs.clone())).await;
    let client = client();
    let first = post_key(&client, server.addr, "k", "201").await;
    assert_eq!(first.headers[SET_COOKIE], "session=s1");
    let replay = post_key(&client, server.addr, "k", "201").await;
    assert!(replay.replayed());
    assert!(replay.headers.get(SET_COOKIE).is_none(), "{replay:?}");
    assert_eq!(replay.headers["x-charge-id"], "ch_1");
    assert_eq!(replay.headers[CONTENT_TYPE], "text/plain");
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.body, first.body);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_separate_identical_keys() {
    let runs = Arc::new(AtomicUsize::new(0));
    let config = IdempotencyConfig::default().scope(|parts| {
        parts
            .headers
            .get("x-tenant")
            .map_or(Vec::new(), |v| v.as_bytes().to_vec())
    });
    let engine = engine();
    let server = serve(charges(engine.clone(), config, runs.clone())).await;
    let client = client();
    let as_tenant = |tenant: &'static str, body: &'static str| {
        let client = client.clone();
        let addr = server.addr;
        async move {
            send(
                &client,
                addr,
                Method::POST,
                "/charges",
                &[("idempotency-key", "k"), ("x-tenant", tenant)],
                body,
            )
            .await
        }
    };
    // Same key, different bodies: no 422, because the tenants' keys never meet.
    let a = as_tenant("acme", "a").await;
    let b = as_tenant("globex", "b").await;
    // Scopes whose concatenation with the key would be equal ("ab"+"k" vs "a"+"bk") too.
    let ab = send(
        &client,
        server.addr,
        Method::POST,
        "/charges",
        &[("idempotency-key", "k"), ("x-tenant", "ab")],
        "c",
    )
    .await;
    let a_bk = send(
        &client,
        server.addr,
        Method::POST,
        "/charges",
        &[("idempotency-key", "bk"), ("x-tenant", "a")],
        "d",
    )
    .await;
    for r in [&a, &b, &ab, &a_bk] {
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        assert!(!r.replayed());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    let a2 = as_tenant("acme", "a").await;
    let b2 = as_tenant("globex", "b").await;
    assert!(a2.replayed() && b2.replayed());
    assert_eq!((a2.body, b2.body), (a.body, b.body));
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    // The engine holds each tenant's key in its scope, not one key with a delimiter.
    for tenant in [&b"acme"[..], b"globex", b"ab"] {
        assert!(matches!(
            engine.get_scoped(tenant, b"k").unwrap(),
            Some(KeyState::Completed { .. })
        ));
    }
    assert_eq!(engine.get(b"k").unwrap(), None);
    // A scope past the engine's limit is the service's misconfiguration, not the client's.
    let long: &'static str = Box::leak("t".repeat(256).into_boxed_str());
    let r = as_tenant(long, "e").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.problem()["type"], "urn:idemkv:problem:misconfigured");
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_duplicate_whose_response_is_no_longer_kept_is_410_and_does_not_run() {
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .retention(Duration::from_secs(60))
        .marker_retention(Some(Duration::from_secs(3600)))
        .open()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let server = serve(charges(engine, IdempotencyConfig::default(), runs.clone())).await;
    let client = client();
    let first = post_key(&client, server.addr, "\"late\"", "{\"amount\":1}").await;
    assert_eq!(first.status, 201);
    clock.advance(Duration::from_secs(61));
    let late = post_key(&client, server.addr, "\"late\"", "{\"amount\":1}").await;
    assert_eq!(late.status, StatusCode::GONE, "{late:?}");
    let problem = late.problem();
    assert_eq!(problem["type"], "urn:idemkv:problem:response-forgotten");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("no longer kept"),
        "{problem}"
    );
    // The same key with another request is still a reuse.
    let reused = post_key(&client, server.addr, "\"late\"", "{\"amount\":2}").await;
    assert_eq!(reused.status, 422);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the late duplicate did not run"
    );
    // After the marker's window the key is new.
    clock.advance(Duration::from_secs(3600));
    let again = post_key(&client, server.addr, "\"late\"", "{\"amount\":1}").await;
    assert_eq!(again.status, 201);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_states_map_to_503_and_500() {
    // A limit: one claim in flight at most; the second key gets 503 with Retry-After.
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(MockClock::new())
        .inflight_max(1)
        .open()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let app = held_charges(
        engine.clone(),
        IdempotencyConfig::default(),
        runs.clone(),
        gate.clone(),
    );
    let server = serve(app).await;
    let client = client();
    let first = {
        let (client, addr) = (client.clone(), server.addr);
        tokio::spawn(async move { post_key(&client, addr, "k1", "a").await })
    };
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let r = post_key(&client, server.addr, "k2", "a").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.retry_after(), 1);
    assert_eq!(r.problem()["type"], "urn:idemkv:problem:overloaded");
    gate.notify_one();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);

    // A stored value that is not a stored response: 500, never a panic.
    let Claim::Acquired(lease) = engine
        .claim(b"bad", &ClaimOptions::default().payload(&[]))
        .unwrap()
    else {
        panic!("a new key is acquired")
    };
    lease.complete(b"not an HTTP response").unwrap();
    // The layer's fingerprint differs from the one above, so claim without one first.
    let Claim::Acquired(lease) = engine.claim(b"bad2", &ClaimOptions::default()).unwrap() else {
        panic!("a new key is acquired")
    };
    lease.complete(b"not an HTTP response").unwrap();
    let r = post_key(&client, server.addr, "bad2", "x").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        r.problem()["type"],
        "urn:idemkv:problem:stored-response-corrupted"
    );
    let r = post_key(&client, server.addr, "bad", "x").await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);

    // A closed engine: 503, and GETs still pass.
    engine.close().unwrap();
    let r = post_key(&client, server.addr, "k3", "a").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem()["type"], "urn:idemkv:problem:unavailable");
    assert!(r.headers.get(RETRY_AFTER).is_none());
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_the_engine_refuses_is_returned_and_the_key_stays_in_flight() {
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(MockClock::new())
        .lease(Duration::from_secs(5))
        .response_len_max(64)
        .open()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let server = serve(charges(engine, IdempotencyConfig::default(), runs.clone())).await;
    let client = client();
    let big = "x".repeat(100);
    let r = post_key(&client, server.addr, "k", &big).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.text(), format!("charge #1 for {big}"));
    let r = post_key(&client, server.addr, "k", &big).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.retry_after(), 5);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_a_restart_on_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("http.redb");
    let open = || {
        Engine::builder()
            .path(&path)
            .durability(Durability::Immediate)
            .open()
            .unwrap()
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = open();
    let server = serve(charges(
        engine.clone(),
        IdempotencyConfig::default(),
        runs.clone(),
    ))
    .await;
    let client = client();
    let first = post_key(&client, server.addr, "\"order-9\"", "{\"amount\":9}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    drop(client);
    server.stop().await;
    engine.close().unwrap();
    drop(engine);

    let engine = open();
    let server = serve(charges(
        engine.clone(),
        IdempotencyConfig::default(),
        runs.clone(),
    ))
    .await;
    let client = self::client();
    let again = post_key(&client, server.addr, "\"order-9\"", "{\"amount\":9}").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers[CONTENT_TYPE], first.headers[CONTENT_TYPE]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The fingerprint survived the restart too.
    let other = post_key(&client, server.addr, "\"order-9\"", "{\"amount\":10}").await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    drop(client);
    server.stop().await;
    engine.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_is_a_clone_send_service_for_tower() {
    // Compile-time: the service is Clone and its futures are Send (axum needs both); a
    // oneshot call through tower works without a server.
    use tower::ServiceExt;
    fn assert_clone_send<T: Clone + Send + Sync>(_: &T) {}
    let layer = IdempotencyLayer::new(engine(), IdempotencyConfig::default());
    assert_clone_send(&layer);
    let app = charges(
        engine(),
        IdempotencyConfig::default(),
        Arc::new(AtomicUsize::new(0)),
    );
    let req = Request::post("/charges")
        .header("idempotency-key", HeaderValue::from_static("k"))
        .body(axum::body::Body::from("x"))
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
}

/// One request through the router in process (no server), answered in full.
async fn call(app: &Router, key: &str, body: &str) -> Reply {
    use tower::ServiceExt;
    let req = Request::post("/charges")
        .header("idempotency-key", key)
        .body(axum::body::Body::from(body.to_owned()))
        .unwrap();
    let (parts, body) = app.clone().oneshot(req).await.unwrap().into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// A server drops a request's future when its client disconnects, and so does an outer
/// timeout: the handler stopped at an unknown point, perhaps after its side effect. The key
/// is kept InFlight until its lease ends, as after a crash, not released for the retry to
/// run the handler again at once.
#[tokio::test]
async fn a_request_cut_off_while_its_handler_runs_keeps_the_key_until_its_lease_ends() {
    use tower::ServiceExt;
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .lease(Duration::from_secs(7))
        .open()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = first_run_app(engine.clone(), runs.clone(), FirstRun::Hangs);
    let first = Request::post("/charges")
        .header("idempotency-key", "\"k\"")
        .body(axum::body::Body::from("x"))
        .unwrap();
    let mut first = Box::pin(app.clone().oneshot(first));
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(futures::poll!(&mut first).is_pending());
        tokio::task::yield_now().await;
    }
    drop(first);

    assert!(
        matches!(engine.get(b"k").unwrap(), Some(KeyState::InFlight { .. })),
        "the key stays InFlight"
    );
    let retry = call(&app, "\"k\"", "x").await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert_eq!(retry.retry_after(), 7, "the first request's whole lease");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler did not run again"
    );

    // A tick before the lease ends the key is still held.
    clock.advance(Duration::from_secs(7) - Duration::from_millis(1));
    let retry = call(&app, "\"k\"", "x").await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");

    // Past the lease, as after a crash, the retry takes the key over and runs it.
    clock.advance(Duration::from_millis(1));
    let retry = call(&app, "\"k\"", "x").await;
    assert_eq!(
        (retry.status, retry.text(), retry.replayed()),
        (StatusCode::CREATED, "run 2", false)
    );
    assert!(
        matches!(
            engine.get(b"k").unwrap(),
            Some(KeyState::Completed { attempt: 2, .. })
        ),
        "the retry took the key over"
    );
    let replay = call(&app, "\"k\"", "x").await;
    assert_eq!((replay.text(), replay.replayed()), ("run 2", true));
}

/// A panicking handler is cut off at an unknown point too: its lease is dropped unsettled,
/// which keeps the key until the lease ends, exactly as for a dropped request (unlike a
/// handler that *returns* an error, or a 5xx, whose retry runs at once).
#[tokio::test]
async fn a_panicking_handler_keeps_the_key_until_its_lease_ends() {
    use futures::FutureExt;
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .lease(Duration::from_secs(7))
        .open()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = first_run_app(engine.clone(), runs.clone(), FirstRun::Panics);
    let panicked = std::panic::AssertUnwindSafe(call(&app, "\"k\"", "x"))
        .catch_unwind()
        .await;
    assert!(panicked.is_err());
    assert!(
        matches!(
            engine.get(b"k").unwrap(),
            Some(KeyState::InFlight { attempt: 1, .. })
        ),
        "the key stays InFlight"
    );
    let retry = call(&app, "\"k\"", "x").await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler did not run again"
    );

    clock.advance(Duration::from_secs(7));
    let retry = call(&app, "\"k\"", "x").await;
    assert_eq!((retry.status, retry.text()), (StatusCode::CREATED, "run 2"));
    assert!(matches!(
        engine.get(b"k").unwrap(),
        Some(KeyState::Completed { attempt: 2, .. })
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// 408, 425 and 429 tell the client to send the request again later: not stored, so the
/// retry runs the handler; another 4xx is stored and replayed.
#[tokio::test]
async fn statuses_that_say_retry_later_are_not_stored() {
    for status in ["408", "425", "429"] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = status_echo(engine(), IdempotencyConfig::default(), runs.clone());
        let first = call(&app, "\"k\"", status).await;
        assert_eq!(first.status.as_str(), status);
        let retry = call(&app, "\"k\"", status).await;
        assert_eq!(
            (retry.text(), retry.replayed()),
            ("run 2", false),
            "{status}"
        );
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let app = status_echo(engine(), IdempotencyConfig::default(), runs.clone());
    call(&app, "\"k\"", "409").await;
    let replay = call(&app, "\"k\"", "409").await;
    assert_eq!((replay.text(), replay.replayed()), ("run 1", true));
}

/// The stored body is the encoded representation: its `Content-Encoding` is replayed with
/// it by default.
#[tokio::test]
async fn a_replay_keeps_the_content_encoding_of_its_body() {
    const GZIP: &[u8] =
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x4b\x04\x00\x43\xbe\xb7\xe8\x01\x00\x00\x00";
    let app = Router::new()
        .route(
            "/charges",
            post(|| async {
                (
                    StatusCode::CREATED,
                    [
                        (CONTENT_TYPE, "application/json"),
                        (axum::http::header::CONTENT_ENCODING, "gzip"),
                    ],
                    GZIP,
                )
            }),
        )
        .layer(IdempotencyLayer::new(
            engine(),
            IdempotencyConfig::default(),
        ));
    let first = call(&app, "\"k\"", "{}").await;
    let replay = call(&app, "\"k\"", "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.headers["content-encoding"], "gzip");
    assert_eq!(replay.headers[CONTENT_TYPE], "application/json");
}

/// A stored response in the layer's version-1 encoding, written by hand as a damaged record
/// (an `import` file, the shared table) could hold it: magic, version, status (u16 LE), the
/// headers (a u64 LE count, then each name and value as a u64 LE length and bytes), the body.
fn stored_by_hand(status: u16, count: u64, headers: &[(&[u8], &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out = b"idemkv-http\x01".to_vec();
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u64).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        out.extend_from_slice(value);
    }
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(body);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_stored_response_is_a_500_problem_and_the_key_is_not_run_again() {
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(MockClock::new())
        .response_len_max(4 << 20)
        .open()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = charges(engine.clone(), IdempotencyConfig::default(), runs.clone());
    let many: Vec<(&[u8], &[u8])> = vec![(b"x-a", b"1"); 40_000];
    let damaged = [
        // More headers than a header map can hold (a capacity or an append that panics).
        ("many", stored_by_hand(200, many.len() as u64, &many, b"ok")),
        // A count far beyond the record's bytes.
        ("count", stored_by_hand(200, u64::MAX, &[], b"")),
        // A header name and a value no header may have.
        ("name", stored_by_hand(200, 1, &[(b"bad name", b"v")], b"")),
        ("value", stored_by_hand(200, 1, &[(b"x-a", b"\n")], b"")),
        // A name far over any header's.
        (
            "long",
            stored_by_hand(200, 1, &[(&[b'a'; 100_000][..], b"v")], b""),
        ),
        // An impossible status.
        ("status", stored_by_hand(1000, 0, &[], b"")),
    ];
    for (key, bytes) in &damaged {
        // Claimed without a fingerprint, so that the layer's request matches it.
        let Claim::Acquired(lease) = engine
            .claim(key.as_bytes(), &ClaimOptions::default())
            .unwrap()
        else {
            panic!("a new key is acquired")
        };
        lease.complete(bytes).unwrap();
        let r = call(&app, key, "x").await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{key}");
        assert_eq!(
            r.problem()["type"],
            "urn:idemkv:problem:stored-response-corrupted",
            "{key}"
        );
        // The key stays completed: the handler is not run again for it.
        assert!(
            matches!(
                engine.get(key.as_bytes()).unwrap(),
                Some(KeyState::Completed { .. })
            ),
            "{key}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The same shape within the limits replays.
    let fine = stored_by_hand(201, 2, &[(b"x-a", b"1"), (b"x-a", b"2")], b"ok");
    let Claim::Acquired(lease) = engine.claim(b"fine", &ClaimOptions::default()).unwrap() else {
        panic!("a new key is acquired")
    };
    lease.complete(&fine).unwrap();
    let r = call(&app, "fine", "x").await;
    assert_eq!(
        (r.status, r.text(), r.replayed()),
        (StatusCode::CREATED, "ok", true)
    );
    assert_eq!(r.headers.get_all("x-a").iter().count(), 2);
}

/// `POST /charges` whose handler reads its [`ClaimContext`], stages a row
/// (`charges`/key = the body) and an outbox message, and answers with the status the body's
/// first word names (`"201 a"`) and the claim it saw.
fn staging_app(engine: Engine, runs: Arc<AtomicUsize>) -> Router {
    let config = IdempotencyConfig::default().scope(|parts| {
        parts
            .headers
            .get("x-tenant")
            .map_or(Vec::new(), |v| v.as_bytes().to_vec())
    });
    Router::new()
        .route(
            "/charges",
            post(
                move |Extension(claim): Extension<ClaimContext>, body: String| {
                    let runs = runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let mut writes = WriteSet::new();
                        writes
                            .put("charges", claim.key(), body.as_bytes())
                            .unwrap()
                            .emit(body.as_bytes())
                            .unwrap();
                        claim.stage(writes).unwrap();
                        let status = body.split(' ').next().unwrap().parse().unwrap();
                        (
                            StatusCode::from_u16(status).unwrap(),
                            format!(
                                "key={} scope={} attempt={} checkpoint={} token>0={}",
                                String::from_utf8_lossy(claim.key()),
                                String::from_utf8_lossy(claim.scope()),
                                claim.attempt(),
                                claim.checkpoint().is_some(),
                                claim.token() > 0,
                            ),
                        )
                    }
                },
            ),
        )
        .layer(IdempotencyLayer::new(engine, config))
}

#[tokio::test]
async fn a_handler_reads_its_claim_and_its_staged_writes_commit_with_the_stored_response() {
    use tower::ServiceExt;
    let engine = engine();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = staging_app(engine.clone(), runs.clone());
    let post = |key: &str, body: &str| {
        Request::post("/charges")
            .header("idempotency-key", key)
            .header("x-tenant", "acme")
            .body(axum::body::Body::from(body.to_owned()))
            .unwrap()
    };
    let reply = |res: axum::response::Response| async move {
        let (parts, body) = res.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    };

    // A stored 2xx: the handler saw its claim, and its writes are committed with it.
    let r = reply(app.clone().oneshot(post("\"k1\"", "201 a")).await.unwrap()).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(
        r.text(),
        "key=k1 scope=acme attempt=1 checkpoint=false token>0=true"
    );
    assert_eq!(
        engine.table_get("charges", b"k1").unwrap().as_deref(),
        Some(&b"201 a"[..])
    );
    assert_eq!(engine.outbox().pending(10).unwrap().len(), 1);

    // A replay does not run the handler, so nothing is applied again.
    let r = reply(app.clone().oneshot(post("\"k1\"", "201 a")).await.unwrap()).await;
    assert!(r.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(engine.outbox().pending(10).unwrap().len(), 1);

    // A 5xx is not stored: its staged writes are dropped with it, and the retry's are kept.
    let r = reply(app.clone().oneshot(post("\"k2\"", "503 b")).await.unwrap()).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(engine.table_get("charges", b"k2").unwrap(), None);
    assert_eq!(engine.outbox().pending(10).unwrap().len(), 1);
    assert_eq!(engine.get(b"k2").unwrap(), None, "released");
    // A 4xx is stored (the default policy), and so are its writes.
    let r = reply(app.clone().oneshot(post("\"k3\"", "404 c")).await.unwrap()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        engine.table_get("charges", b"k3").unwrap().as_deref(),
        Some(&b"404 c"[..])
    );
    assert_eq!(engine.outbox().pending(10).unwrap().len(), 2);
}

#[tokio::test]
async fn a_handler_error_drops_its_staged_writes() {
    use tower::ServiceExt;
    let engine = engine();
    let svc = tower::ServiceBuilder::new()
        .layer(IdempotencyLayer::new(
            engine.clone(),
            IdempotencyConfig::default(),
        ))
        .service(tower::service_fn(
            |req: Request<axum::body::Body>| async move {
                let claim = req.extensions().get::<ClaimContext>().unwrap().clone();
                let mut writes = WriteSet::new();
                writes.put("charges", claim.key(), b"x").unwrap();
                claim.stage(writes).unwrap();
                Err::<axum::response::Response, _>(std::io::Error::other("the handler failed"))
            },
        ));
    let req = Request::post("/charges")
        .header("idempotency-key", "k")
        .body(axum::body::Body::from("x"))
        .unwrap();
    let err = svc.clone().oneshot(req).await.unwrap_err();
    assert_eq!(err.to_string(), "the handler failed");
    assert_eq!(engine.table_get("charges", b"k").unwrap(), None);
    assert_eq!(engine.get(b"k").unwrap(), None, "released for a retry");
}

/// A request cut off while its handler runs leaves its staged writes unapplied; the attempt
/// that takes the key over sees attempt 2 and the checkpoint the first one saved.
#[tokio::test]
async fn a_takeover_sees_its_attempt_and_the_checkpoint_and_only_its_own_writes() {
    use tower::ServiceExt;
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .lease(Duration::from_secs(7))
        .open()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    // Set once the first run saved its checkpoint.
    let saved = Arc::new(AtomicUsize::new(0));
    let app = {
        let (runs, saved) = (runs.clone(), saved.clone());
        Router::new()
            .route(
                "/charges",
                post(move |Extension(claim): Extension<ClaimContext>| {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let saved = saved.clone();
                    async move {
                        let mut writes = WriteSet::new();
                        writes.put("runs", &[n as u8], b"").unwrap();
                        claim.stage(writes).unwrap();
                        let seen = format!(
                            "attempt {} checkpoint {:?}",
                            claim.attempt(),
                            claim.checkpoint().map(|c| c.data().to_vec())
                        );
                        if n == 1 {
                            claim.lease().set_checkpoint(1, b"half").await.unwrap();
                            saved.store(1, Ordering::SeqCst);
                            std::future::pending::<()>().await;
                        }
                        (StatusCode::CREATED, seen)
                    }
                }),
            )
            .layer(IdempotencyLayer::new(
                engine.clone(),
                IdempotencyConfig::default(),
            ))
    };
    let first = Request::post("/charges")
        .header("idempotency-key", "k")
        .body(axum::body::Body::from("x"))
        .unwrap();
    let mut first = Box::pin(app.clone().oneshot(first));
    // The first run saves its checkpoint, then is cut off.
    while saved.load(Ordering::SeqCst) == 0 {
        assert!(futures::poll!(&mut first).is_pending());
        tokio::task::yield_now().await;
    }
    drop(first);
    clock.advance(Duration::from_secs(7));
    let retry = call(&app, "k", "x").await;
    assert_eq!(
        (retry.status, retry.text()),
        (
            StatusCode::CREATED,
            "attempt 2 checkpoint Some([104, 97, 108, 102])"
        )
    );
    assert_eq!(engine.table_get("runs", &[1]).unwrap(), None);
    assert_eq!(engine.table_get("runs", &[2]).unwrap(), Some(Vec::new()));
}

/// The payments example's router, as the example serves it.
#[allow(dead_code)]
#[path = "../examples/payments.rs"]
mod payments;

/// `POST /charges` to the payments example with `key` and `body`, then the charge's id.
async fn pay(app: &Router, key: &str, body: &str) -> (Reply, Option<String>) {
    let r = call(app, key, body).await;
    let id = serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_owned));
    (r, id)
}

/// `GET /charges` of the payments example: the ids in the ledger.
async fn ledger(app: &Router) -> Vec<String> {
    use tower::ServiceExt;
    let req = Request::get("/charges")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let charges: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    charges
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_ledger_survives_a_restart_and_its_ids_never_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.redb");
    let open = || {
        Engine::builder()
            .path(&path)
            .durability(Durability::Immediate)
            .open()
            .unwrap()
    };
    let eur = |amount: u32| format!("{{\"amount\":{amount},\"currency\":\"EUR\"}}");

    let engine = open();
    let app = payments::router(engine.clone());
    let (r, a) = pay(&app, "\"order-1\"", &eur(100)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let (r, b) = pay(&app, "\"order-2\"", &eur(200)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // The processor fails: 503, not stored, and its staged ledger row is dropped.
    let failing = "{\"amount\":300,\"currency\":\"EUR\",\"fail\":true}";
    let (r, _) = pay(&app, "\"order-3\"", failing).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{r:?}");
    assert!(!r.replayed());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a, b);
    let mut before = ledger(&app).await;
    before.sort();
    let mut expected = vec![a.clone(), b.clone()];
    expected.sort();
    assert_eq!(before, expected);
    drop(app);
    engine.close().unwrap();
    drop(engine);

    // After the restart: the same ledger, the same replays, and new ids for new keys.
    let engine = open();
    let app = payments::router(engine.clone());
    let mut after = ledger(&app).await;
    after.sort();
    assert_eq!(after, expected);
    let (r, again) = pay(&app, "\"order-1\"", &eur(100)).await;
    assert!(r.replayed(), "{r:?}");
    assert_eq!(again.as_deref(), Some(a.as_str()));
    // The failed key runs again, now that the processor answers.
    let (r, c) = pay(&app, "\"order-3\"", &eur(300)).await;
    assert_eq!(
        (r.status, r.replayed()),
        (StatusCode::CREATED, false),
        "{r:?}"
    );
    let (r, d) = pay(&app, "\"order-4\"", &eur(400)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let (c, d) = (c.unwrap(), d.unwrap());
    let mut ids = vec![a.clone(), b.clone(), c.clone(), d.clone()];
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "no id is shared: {ids:?}");
    let mut all = ledger(&app).await;
    all.sort();
    assert_eq!(all, ids, "every acknowledged charge once");
    // The same key in another API key's scope is another charge.
    let other = {
        use tower::ServiceExt;
        let req = Request::post("/charges")
            .header("idempotency-key", "\"order-1\"")
            .header("x-api-key", "tenant-2")
            .body(axum::body::Body::from(eur(100)))
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v["id"].as_str().unwrap().to_owned()
    };
    assert!(!ids.contains(&other));
    assert_eq!(ledger(&app).await.len(), 5);
    drop(app);
    engine.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_ledger_refuses_a_key_reused_after_its_response_expired() {
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .retention(Duration::from_secs(60))
        .open()
        .unwrap();
    let app = payments::router(engine.clone());
    let body = "{\"amount\":100,\"currency\":\"EUR\"}";
    let (r, id) = pay(&app, "\"order-1\"", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    clock.advance(Duration::from_secs(61));
    let (r, _) = pay(&app, "\"order-1\"", body).await;
    assert_eq!(
        (r.status, r.replayed()),
        (StatusCode::CONFLICT, false),
        "{r:?}"
    );
    assert!(r.text().contains(&id.unwrap()), "{r:?}");
    assert_eq!(ledger(&app).await.len(), 1);
}
