//! Request fingerprints through the engine: `payload` stores a 128-bit fingerprint of the
//! bytes, `fingerprint_of` one of a structured request that ignores map order, and the
//! three forms (`payload`, `with_fingerprint`, a caller's `fingerprint(u64)`) each match
//! what they stored, across a restart. (Matching records of the previous format is in
//! `format.rs`.)

use idemkv::error::FingerprintError;
use idemkv::*;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

fn memory() -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .open()
        .unwrap()
}

fn complete(engine: &Engine, key: &[u8], opts: &ClaimOptions, response: &[u8]) {
    match engine.claim(key, opts).unwrap() {
        Claim::Acquired(lease) => lease.complete(response).unwrap(),
        other => panic!("expected to acquire, got {other:?}"),
    }
}

fn claim(engine: &Engine, key: &[u8], opts: &ClaimOptions) -> Result<Vec<u8>, ClaimError> {
    match engine.claim(key, opts)? {
        Claim::Completed(stored) => Ok(stored.response().to_vec()),
        other => panic!("expected a replay or an error, got {other:?}"),
    }
}

fn stored_fingerprint(engine: &Engine, key: &[u8]) -> Option<u128> {
    let records = engine.admin().records();
    records.iter().find(|r| r.key == key).unwrap().fingerprint
}

#[test]
fn payload_stores_the_128_bit_fingerprint_of_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fp.redb");
    let engine = Engine::open(&path).unwrap();
    let body = br#"{"amount":42}"#;
    complete(&engine, b"k", &ClaimOptions::default().payload(body), b"ok");
    let stored = stored_fingerprint(&engine, b"k").unwrap();
    assert_eq!(stored, Fingerprint::of_bytes(body).as_u128());
    // A 128-bit fingerprint: its high half is never zero, so it is never a u64's.
    assert_ne!(stored >> 64, 0);
    engine.close().unwrap();
    drop(engine);

    let engine = Engine::open(&path).unwrap();
    assert_eq!(
        claim(&engine, b"k", &ClaimOptions::default().payload(body)),
        Ok(b"ok".to_vec())
    );
    // The same fingerprint given as a value matches too.
    let same = ClaimOptions::default().with_fingerprint(Fingerprint::of_bytes(body));
    assert_eq!(claim(&engine, b"k", &same), Ok(b"ok".to_vec()));
    assert_eq!(
        claim(
            &engine,
            b"k",
            &ClaimOptions::default().payload(br#"{"amount":43}"#)
        ),
        Err(ClaimError::FingerprintMismatch)
    );
    // Its low 64 bits, given as a caller's u64, are not it.
    assert_eq!(
        claim(
            &engine,
            b"k",
            &ClaimOptions::default().fingerprint(stored as u64)
        ),
        Err(ClaimError::FingerprintMismatch)
    );
}

#[derive(Serialize)]
struct Charge {
    order: u64,
    amount: i64,
    metadata: HashMap<String, String>,
}

#[test]
fn a_structured_request_matches_however_its_maps_were_ordered() {
    let engine = memory();
    let first: serde_json::Value =
        serde_json::from_str(r#"{"order":42,"amount":1999,"metadata":{"a":"1","b":"2"}}"#).unwrap();
    let retry: serde_json::Value =
        serde_json::from_str(r#"{"metadata":{"b":"2","a":"1"},"amount":1999,"order":42}"#).unwrap();
    let opts = |v: &serde_json::Value| ClaimOptions::default().fingerprint_of(v).unwrap();
    complete(&engine, b"pay-1", &opts(&first), b"charged");
    assert_eq!(
        claim(&engine, b"pay-1", &opts(&retry)),
        Ok(b"charged".to_vec())
    );
    // As raw bytes the two bodies differ: `payload` would refuse the retry.
    let raw = ClaimOptions::default().payload(br#"{"amount":1999,"order":42}"#);
    complete(
        &engine,
        b"pay-2",
        &ClaimOptions::default().payload(br#"{"order":42,"amount":1999}"#),
        b"charged",
    );
    assert_eq!(
        claim(&engine, b"pay-2", &raw),
        Err(ClaimError::FingerprintMismatch)
    );
    // Another amount is another request.
    let other: serde_json::Value =
        serde_json::from_str(r#"{"order":42,"amount":2000,"metadata":{"a":"1","b":"2"}}"#).unwrap();
    assert_eq!(
        claim(&engine, b"pay-1", &opts(&other)),
        Err(ClaimError::FingerprintMismatch)
    );
    // A typed request whose map is a HashMap (any iteration order) matches the same JSON.
    let typed = Charge {
        order: 42,
        amount: 1999,
        metadata: HashMap::from([("b".into(), "2".into()), ("a".into(), "1".into())]),
    };
    let typed_opts = ClaimOptions::default().fingerprint_of(&typed).unwrap();
    assert_eq!(
        claim(&engine, b"pay-1", &typed_opts),
        Ok(b"charged".to_vec())
    );
}

#[test]
fn a_request_the_fingerprint_cannot_encode_is_refused_before_any_claim() {
    let mut deep = serde_json::json!(1);
    for _ in 0..200 {
        deep = serde_json::json!([deep]);
    }
    assert!(matches!(
        ClaimOptions::default().fingerprint_of(&deep),
        Err(FingerprintError::TooDeep { max: 128 })
    ));
    // A field and a flattened map entry of one name: which one counts is undefined.
    #[derive(Serialize)]
    struct Flattened<'a> {
        #[serde(rename = "1")]
        one: &'a str,
        #[serde(flatten)]
        rest: BTreeMap<&'a str, &'a str>,
    }
    let clash = Flattened {
        one: "x",
        rest: BTreeMap::from([("1", "y")]),
    };
    assert_eq!(
        ClaimOptions::default().fingerprint_of(&clash).unwrap_err(),
        FingerprintError::DuplicateKey
    );
}

#[test]
fn a_callers_u64_matches_itself_and_nothing_else() {
    let engine = memory();
    complete(
        &engine,
        b"k",
        &ClaimOptions::default().fingerprint(0xfeed),
        b"ok",
    );
    assert_eq!(stored_fingerprint(&engine, b"k"), Some(0xfeed));
    assert_eq!(
        claim(&engine, b"k", &ClaimOptions::default().fingerprint(0xfeed)),
        Ok(b"ok".to_vec())
    );
    assert_eq!(
        claim(&engine, b"k", &ClaimOptions::default().fingerprint(0xbeef)),
        Err(ClaimError::FingerprintMismatch)
    );
    assert_eq!(
        claim(&engine, b"k", &ClaimOptions::default().payload(b"anything")),
        Err(ClaimError::FingerprintMismatch)
    );
    // No fingerprint asked: not checked.
    assert_eq!(
        claim(&engine, b"k", &ClaimOptions::default()),
        Ok(b"ok".to_vec())
    );
}
