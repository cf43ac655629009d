//! A small payments API whose `POST /charges` is protected by the Idempotency-Key layer,
//! with the engine in the same binary on a redb file.
//!
//! ```sh
//! cargo run --release --example payments -- --listen 127.0.0.1:8080 --file payments.redb
//! curl -si -X POST localhost:8080/charges -H 'Idempotency-Key: "order-42"' \
//!      -H 'content-type: application/json' -d '{"amount":1999,"currency":"EUR"}'
//! ```
//!
//! Repeat the request: the same charge comes back with `Idempotent-Replayed: true`, and no
//! second charge is made (`GET /charges` lists them). Both flags are optional.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idemkv::http::{IdempotencyConfig, IdempotencyLayer, InFlight};
use idemkv::{Durability, Engine};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Default)]
struct Ledger {
    charges: Arc<Mutex<Vec<String>>>,
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `POST /charges` with `{"amount": <positive integer>, "currency": "<3 letters>"}`.
async fn create_charge(State(ledger): State<Ledger>, body: Bytes) -> Response {
    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({ "error": format!("invalid JSON: {e}") }).to_string(),
            )
        }
    };
    let amount = request["amount"].as_u64().filter(|a| *a > 0);
    let currency = request["currency"]
        .as_str()
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()));
    let (Some(amount), Some(currency)) = (amount, currency) else {
        return json(
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"error":"amount must be a positive integer, currency three capital letters"}"#
                .to_owned(),
        );
    };
    // The side effect the layer guards: a charge is appended to the ledger.
    let charge = {
        let Ok(mut charges) = ledger.charges.lock() else {
            return json(StatusCode::INTERNAL_SERVER_ERROR, "{}".to_owned());
        };
        let id = format!("ch_{}", charges.len() + 1);
        let charge = serde_json::json!({
            "id": id, "amount": amount, "currency": currency, "status": "succeeded"
        })
        .to_string();
        charges.push(charge.clone());
        charge
    };
    let mut res = json(StatusCode::CREATED, charge);
    if let Ok(location) = header::HeaderValue::from_str("/charges") {
        res.headers_mut().insert(header::LOCATION, location);
    }
    res
}

/// `GET /charges`: every charge made (not protected: GET passes through the layer).
async fn list_charges(State(ledger): State<Ledger>) -> Response {
    let charges = ledger
        .charges
        .lock()
        .map(|c| c.join(","))
        .unwrap_or_default();
    json(StatusCode::OK, format!("[{charges}]"))
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
        .durability(Durability::Immediate)
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(24 * 3600))
        .open()?;
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
    let app = Router::new()
        .route("/charges", post(create_charge).get(list_charges))
        .with_state(Ledger::default())
        .layer(IdempotencyLayer::new(engine.clone(), config));
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    println!(
        "payments API on http://{} (idempotency keys in {})",
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
