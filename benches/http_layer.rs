//! Per-request cost of the Idempotency-Key layer (feature `http`): the same axum handler
//! called through the router with and without the layer, in process (`tower::ServiceExt::
//! oneshot` on the router, no network), on a current-thread tokio runtime.
//!
//! - `plain`: `POST /charges` without the layer (the baseline: routing, extracting the body,
//!   the handler).
//! - `new_key/{none,buffered}`: with the layer, each request a new key: parse the key, buffer
//!   and fingerprint the body, claim, run the handler, encode and store its response.
//! - `replay/{none,buffered}`: with the layer, the same key again: answered from the stored
//!   response without running the handler.
//!
//! `Buffered` is on a file in a temporary directory; the timed loop flushes (untimed) every
//! `CHUNK` requests so that the writer queue never fills.
//!
//! Run: `cargo bench --bench http_layer`.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use idemkv::http::{IdempotencyConfig, IdempotencyLayer};
use idemkv::{Durability, Engine};
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// Requests timed between two untimed flushes: 2 operations each not yet durable, well below
/// what `Buffered` admits before the writer's rate is measured (2,048).
const CHUNK: u64 = 512;
/// A typical small JSON request body.
const BODY: &str = r#"{"amount":1999,"currency":"EUR","customer":"cus_8e03978e40d5"}"#;

fn app() -> Router {
    Router::new().route(
        "/charges",
        post(|body: String| async move {
            (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                format!(
                    r#"{{"id":"ch_1","status":"succeeded","request_len":{}}}"#,
                    body.len()
                ),
            )
        }),
    )
}

fn request(key: Option<&str>) -> Request<Body> {
    let mut req = Request::post("/charges").header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Body::from(BODY)).expect("a valid request")
}

async fn call(app: &Router, req: Request<Body>) -> StatusCode {
    let res = app
        .clone()
        .oneshot(req)
        .await
        .expect("the router is infallible");
    let status = res.status();
    // The body is read, as a server would send it.
    let _ = black_box(axum::body::to_bytes(res.into_body(), usize::MAX).await);
    status
}

fn engine(mode: Durability, dir: &tempfile::TempDir) -> Engine {
    let builder = Engine::builder()
        .durability(mode)
        .lease(Duration::from_secs(3600));
    // A memory-only engine keeps no file and refuses a path.
    let builder = match mode {
        Durability::None => builder,
        _ => builder.path(dir.path().join("bench.redb")),
    };
    builder.open().expect("open the engine")
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut group = c.benchmark_group("http_layer");

    let plain = app();
    group.bench_function("plain", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            rt.block_on(async {
                for _ in 0..iters {
                    assert_eq!(call(&plain, request(None)).await, StatusCode::CREATED);
                }
            });
            start.elapsed()
        })
    });

    for (name, mode) in [
        ("none", Durability::None),
        ("buffered", Durability::buffered()),
    ] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let engine = engine(mode, &dir);
        let layered = app().layer(IdempotencyLayer::new(
            engine.clone(),
            IdempotencyConfig::default(),
        ));
        let mut next = 0u64;
        group.bench_function(BenchmarkId::new("new_key", name), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(CHUNK);
                    let keys: Vec<String> =
                        (0..n).map(|i| format!("\"key-{}\"", next + i)).collect();
                    next += n;
                    let start = Instant::now();
                    rt.block_on(async {
                        for key in &keys {
                            let status = call(&layered, request(Some(key))).await;
                            assert_eq!(status, StatusCode::CREATED);
                        }
                    });
                    timed += start.elapsed();
                    engine.flush().expect("flush");
                    left -= n;
                }
                timed
            })
        });
        rt.block_on(async {
            assert_eq!(
                call(&layered, request(Some("\"replayed\""))).await,
                StatusCode::CREATED
            );
        });
        engine.flush().expect("flush");
        group.bench_function(BenchmarkId::new("replay", name), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                rt.block_on(async {
                    for _ in 0..iters {
                        let status = call(&layered, request(Some("\"replayed\""))).await;
                        assert_eq!(status, StatusCode::CREATED);
                    }
                });
                start.elapsed()
            })
        });
        engine.close().expect("close");
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
