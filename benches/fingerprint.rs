//! The cost of a request fingerprint (src/model/fingerprint.rs, docs/design.md "Fingerprints").
//!
//! - `bytes`: `Fingerprint::of_bytes` (BLAKE3) against the 64-bit FNV-1a loop that
//!   `ClaimOptions::payload` computed before, over bodies of 64 B to 1 MiB.
//! - `value`: `Fingerprint::of` of a `serde_json::Value` (an order of `LINES` lines, about
//!   1 KiB as JSON text), against `of_bytes` of its text and against parsing the text,
//!   which a structured fingerprint of a request body comes after.
//!
//! Run: `cargo bench --bench fingerprint`.

mod common;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idemkv::Fingerprint;
use serde_json::{json, Value};

/// Body sizes of the `bytes` group.
const SIZES: [usize; 4] = [64, 1 << 10, 64 << 10, 1 << 20];
/// Lines of the order in the `value` group.
const LINES: usize = 12;

/// The 64-bit FNV-1a of `payload`'s earlier fingerprints, for comparison.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn bytes(c: &mut Criterion) {
    let mut rng = common::Rng::with_seed(common::SEED);
    let mut group = c.benchmark_group("fingerprint_bytes");
    for size in SIZES {
        let body: Vec<u8> = (0..size).map(|_| rng.u8(..)).collect();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("blake3_128", size), &body, |b, body| {
            b.iter(|| Fingerprint::of_bytes(black_box(body)))
        });
        group.bench_with_input(BenchmarkId::new("fnv1a_64", size), &body, |b, body| {
            b.iter(|| fnv1a64(black_box(body)))
        });
    }
    group.finish();
}

fn order() -> Value {
    let lines: Vec<Value> = (0..LINES)
        .map(|i| json!({"sku": format!("SKU-{i:05}"), "qty": i + 1, "price": 9.95 + i as f64, "gift": i % 3 == 0}))
        .collect();
    json!({
        "order": 42_317,
        "customer": {"id": "cus_8e03978e40d5", "email": "someone@example.com", "tier": "gold"},
        "currency": "EUR",
        "lines": lines,
        "shipping": {"method": "express", "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"}},
        "note": null
    })
}

fn value(c: &mut Criterion) {
    let value = order();
    let text = serde_json::to_vec(&value).expect("a Value always serializes");
    let mut group = c.benchmark_group("fingerprint_value");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("of_value", |b| {
        b.iter(|| Fingerprint::of(black_box(&value)).expect("fits the limits"))
    });
    group.bench_function("of_bytes_of_text", |b| {
        b.iter(|| Fingerprint::of_bytes(black_box(&text)))
    });
    group.bench_function("parse_text", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&text)).expect("valid JSON"))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = bytes, value
}
criterion_main!(benches);
