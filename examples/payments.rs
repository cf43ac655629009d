//! A small payments API whose `POST /charges` is protected by the Idempotency-Key layer,
//! with the engine in the same binary on a redb file, and its ledger in the engine's
//! application tables: each charge is written with the stored response, in the same
//! transaction, through the handler's [`ClaimContext`].
//!
//! ```sh
//! cargo run --release --example payments -- --listen 127.0.0.1:8080 --file payments.redb
//!
//! # A new key: the charge is made and its response stored (201).
//! curl -si -X POST localhost:8080/charges -H 'Idempotency-Key: "order-42"' \
//!      -H 'content-type: application/json' -d '{"amount":1999,"currency":"EUR"}'
//! # The same request again: the same charge, `Idempotent-Replayed: true`, no second charge.
//! curl -si -X POST localhost:8080/charges -H 'Idempotency-Key: "order-42"' \
//!      -H 'content-type: application/json' -d '{"amount":1999,"currency":"EUR"}'
//!
//! # The processor fails ("fail": true): 503, not stored, and the ledger row the handler
//! # had staged is dropped with it.
//! curl -si -X POST localhost:8080/charges -H 'Idempotency-Key: "order-43"' \
//!      -H 'content-type: application/json' -d '{"amount":500,"currency":"EUR","fail":true}'
//! # The client retries the same key (here without the switch, as if the processor were
//! # back): the handler runs again, and this time the charge is made and stored (201).
//! curl -si -X POST localhost:8080/charges -H 'Idempotency-Key: "order-43"' \
//!      -H 'content-type: application/json' -d '{"amount":500,"currency":"EUR"}'
//!
//! curl -s localhost:8080/charges      # both charges, once each
//! kill -9 %1                          # (or the server's pid); then start it again:
//! cargo run --release --example payments -- --listen 127.0.0.1:8080 --file payments.redb
//! curl -s localhost:8080/charges      # still both charges, once each
//! ```
//!
//! A charge's id is derived from its scope and idempotency key (`ch_` and a hash of
//! them), never from a counter in memory or a fencing token: the retry of a request finds
//! the same id, and two keys never share one. The ledger is the durable record of which
//! keys were charged, so a key reused after its stored response expired is refused (409)
//! rather than charged again under the same id. `"fail": true` in the body makes the
//! handler answer 503 after staging its row, to show that a response that is not stored
//! commits nothing. Both flags are optional.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use idemkv::http::{ClaimContext, IdempotencyConfig, IdempotencyLayer, InFlight};
use idemkv::{Durability, Engine, Fingerprint, WriteSet};
use std::time::Duration;

/// The application table that holds the ledger: charge id → the charge as JSON.
const CHARGES: &str = "charges";

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    json(status, serde_json::json!({ "error": message }).to_string())
}

/// The id of the charge a request makes: `ch_` and 128 bits of a hash of its scope and
/// key. The same scoped key always gives the same id; two scoped keys never share one.
fn charge_id(claim: &ClaimContext) -> String {
    // The scope is at most 255 bytes: its length in one byte keeps scope and key apart.
    let mut scoped = Vec::with_capacity(1 + claim.scope().len() + claim.key().len());
    scoped.push(u8::try_from(claim.scope().len()).unwrap_or(u8::MAX));
    scoped.extend_from_slice(claim.scope());
    scoped.extend_from_slice(claim.key());
    format!("ch_{}", Fingerprint::of_bytes(&scoped))
}

/// `POST /charges` with `{"amount": <positive integer>, "currency": "<3 letters>"}` (and
/// `"fail": true` to have the payment processor fail).
async fn create_charge(
    State(engine): State<Engine>,
    Extension(claim): Extension<ClaimContext>,
    body: Bytes,
) -> Response {
    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid JSON: {e}")),
    };
    let amount = request["amount"].as_u64().filter(|a| *a > 0);
    let currency = request["currency"]
        .as_str()
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()));
    let (Some(amount), Some(currency)) = (amount, currency) else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount must be a positive integer, currency three capital letters",
        );
    };
    let id = charge_id(&claim);
    // The ledger outlives the layer's stored responses (their retention): a key charged
    // before is never charged again under its id.
    match engine.table_get(CHARGES, id.as_bytes()) {
        Ok(None) => {}
        Ok(Some(_)) => {
            return error(
                StatusCode::CONFLICT,
                &format!("this Idempotency-Key was used for charge {id}; use a new key"),
            )
        }
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
    let charge = serde_json::json!({
        "id": id, "amount": amount, "currency": currency, "status": "succeeded"
    })
    .to_string();
    // The side effect the layer guards: the charge enters the ledger with the stored
    // response, in one transaction, or not at all.
    let mut writes = WriteSet::new();
    let staged = writes
        .put(CHARGES, id.as_bytes(), charge.as_bytes())
        .map(drop)
        .map_err(|e| e.to_string())
        .and_then(|()| claim.stage(writes).map_err(|e| e.to_string()));
    if let Err(e) = staged {
        return error(StatusCode::INTERNAL_SERVER_ERROR, &e);
    }
    if request["fail"].as_bool() == Some(true) {
        // A 5xx is not stored: the row staged above is dropped, and a retry runs again.
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the payment processor is unavailable; retry with the same Idempotency-Key",
        );
    }
    let mut res = json(StatusCode::CREATED, charge);
    if let Ok(location) = header::HeaderValue::from_str(&format!("/charges/{id}")) {
        res.headers_mut().insert(header::LOCATION, location);
    }
    res
}

/// `GET /charges/{id}`: one charge, or 404.
async fn get_charge(State(engine): State<Engine>, Path(id): Path<String>) -> Response {
    match engine.table_get(CHARGES, id.as_bytes()) {
        Ok(Some(charge)) => json(
            StatusCode::OK,
            String::from_utf8_lossy(&charge).into_owned(),
        ),
        Ok(None) => error(StatusCode::NOT_FOUND, "no such charge"),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// `GET /charges`: every charge in the ledger, by id (not protected: GET passes through
/// the layer).
async fn list_charges(State(engine): State<Engine>) -> Response {
    let mut charges = Vec::new();
    let mut start = Vec::new();
    loop {
        let rows = match engine.table_range(CHARGES, &start, None, 1000) {
            Ok(rows) => rows,
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        };
        let Some((last, _)) = rows.last() else { break };
        // The next page starts just after the last key read.
        start = [&last[..], &[0]].concat();
        charges.extend(
            rows.into_iter()
                .map(|(_, charge)| String::from_utf8_lossy(&charge).into_owned()),
        );
    }
    json(StatusCode::OK, format!("[{}]", charges.join(",")))
}

/// The payments API on `engine`: `POST /charges` behind the layer, `GET /charges` and
/// `GET /charges/{id}`.
pub fn router(engine: Engine) -> Router {
    let config = IdempotencyConfig::default()
        // A retry that arrives while the first request runs waits for its answer.
        .in_flight(InFlight::Wait(Duration::from_secs(10)))
        // Keys of different API keys never meet.
        .scope(|parts| {
            parts
                .headers
                .get("x-api-key")
                .map_or(Vec::new(), |v| v.as_bytes().to_vec())
        });
    Router::new()
        .route("/charges", post(create_charge).get(list_charges))
        .route("/charges/{id}", get(get_charge))
        .with_state(engine.clone())
        .layer(IdempotencyLayer::new(engine, config))
}

struct Args {
    listen: String,
    file: String,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:8080".to_owned(),
        file: "payments.redb".to_owned(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => args.listen = value,
            "--file" => args.file = value,
            _ => {
                return Err(format!(
                    "unknown flag {flag} (use --listen ADDR, --file PATH)"
                ))
            }
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let engine = Engine::builder()
        .path(&args.file)
        // A charge is acknowledged only once it is on disk, with its stored response.
        .durability(Durability::Immediate)
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(24 * 3600))
        .open()?;
    let app = router(engine.clone());
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    println!(
        "payments API on http://{} (idempotency keys and ledger in {})",
        listener.local_addr()?,
        args.file
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    engine.close()?;
    Ok(())
}
