//! Operator calls: records, force_release, sweep_now, import (export → import round trip).

use idemkv::admin::RecordInfoState;
use idemkv::error::ImportError;
use idemkv::*;
use idemkv_check::fixture;
use std::time::{Duration, UNIX_EPOCH};

fn open(path: &std::path::Path, clock: &MockClock) -> Engine {
    fixture::open_builder(
        fixture::builder(path, clock, Durability::Immediate).retention(Duration::from_secs(3600)),
    )
}

#[test]
fn export_import_round_trip_preserves_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let source = open(&dir.path().join("a.redb"), &clock);
    let o = ClaimOptions::default();
    for i in 0..50u32 {
        let key = format!("key-{i}");
        let opts = o.clone().fingerprint(u64::from(i));
        let Claim::Acquired(mut lease) = source.claim(key.as_bytes(), &opts).unwrap() else {
            panic!("fresh key must be acquired")
        };
        match i % 3 {
            0 => lease.complete(format!("resp-{i}").as_bytes()).unwrap(),
            1 => {
                lease.set_checkpoint(i, b"half").unwrap();
                lease.detach(); // stays InFlight
            }
            _ => {
                lease.release().unwrap();
            }
        }
    }
    let exported = source.admin().records();
    assert_eq!(exported.len(), 34, "17 completed + 17 in flight");
    assert!(exported.windows(2).all(|w| w[0].token < w[1].token));
    source.close().unwrap();

    let target_path = dir.path().join("b.redb");
    let target = open(&target_path, &clock);
    for r in &exported {
        target.admin().import(r).unwrap();
    }
    assert_eq!(target.admin().records(), exported);
    // Fencing survives the move: a new claim gets a token above every imported one.
    let max = exported.iter().map(|r| r.token).max().unwrap();
    let Claim::Acquired(lease) = target.claim(b"fresh", &o).unwrap() else {
        panic!()
    };
    assert!(lease.token() > max);
    lease.complete(b"x").unwrap();
    // Importing over a live key or below the next token is refused.
    assert_eq!(
        target.admin().import(&exported[0]),
        Err(ImportError::KeyExists)
    );
    let mut low = exported[0].clone();
    low.key = b"other".to_vec();
    assert!(matches!(
        target.admin().import(&low),
        Err(ImportError::TokenTooSmall { .. })
    ));
    target.close().unwrap();

    // And the imported records are durable.
    let reopened = open(&target_path, &clock);
    let again: Vec<_> = reopened
        .admin()
        .records()
        .into_iter()
        .filter(|r| r.key != b"fresh")
        .collect();
    assert_eq!(again.len(), exported.len());
    for (a, b) in again.iter().zip(&exported) {
        assert_eq!(
            (&a.key, a.token, a.fingerprint),
            (&b.key, b.token, b.fingerprint)
        );
        assert_eq!(a.state_name(), b.state_name());
        if let (
            RecordInfoState::Completed {
                response: x,
                expires_at: ex,
                ..
            },
            RecordInfoState::Completed {
                response: y,
                expires_at: ey,
                ..
            },
        ) = (&a.state, &b.state)
        {
            assert_eq!((x, ex), (y, ey));
        }
    }
}

#[test]
fn force_release_frees_a_stuck_claim_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let engine = open(&dir.path().join("a.redb"), &clock);
    let o = ClaimOptions::default().lease(Duration::from_secs(3600));
    let Claim::Acquired(lease) = engine.claim(b"stuck", &o).unwrap() else {
        panic!()
    };
    let token = lease.token();
    lease.detach();
    assert!(matches!(
        engine.claim(b"stuck", &o).unwrap(),
        Claim::InProgress(_)
    ));
    let before = engine.admin().force_release(b"stuck").unwrap().unwrap();
    assert_eq!(before.token, token);
    assert_eq!(before.state_name(), "inflight");
    assert_eq!(engine.admin().force_release(b"stuck").unwrap(), None);
    let Claim::Acquired(lease) = engine.claim(b"stuck", &o).unwrap() else {
        panic!()
    };
    assert!(lease.token() > token);
    // The old holder is fenced out.
    assert_eq!(
        engine.complete(b"stuck", token, b"late"),
        Err(LeaseError::LeaseLost)
    );
    lease.complete(b"ok").unwrap();
    assert_eq!(
        engine.admin().force_release(b"stuck").unwrap(),
        None,
        "completed keys are not released"
    );
}

#[test]
fn sweep_removes_expired_records_from_memory_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.redb");
    let clock = MockClock::new();
    let engine = open(&path, &clock);
    let o = ClaimOptions::default();
    for i in 0..20 {
        engine
            .run(format!("k{i}").as_bytes(), &o, |_| {
                Ok::<_, ()>(b"v".to_vec())
            })
            .unwrap();
    }
    let Claim::Acquired(live) = engine
        .claim(b"live", &o.clone().lease(Duration::MAX))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(engine.admin().sweep_now().unwrap(), 0, "nothing is due yet");
    clock.advance(Duration::from_secs(3600));
    assert_eq!(engine.admin().sweep_now().unwrap(), 20);
    assert_eq!(engine.stats().completed, 0);
    assert_eq!(
        engine.admin().records().len(),
        1,
        "the live lease survives any sweep"
    );
    engine.flush().unwrap();
    drop(live);
    engine.close().unwrap();
    // Reopen with the wall clock turned back: swept records must not come back.
    clock.set_wall(UNIX_EPOCH + Duration::from_secs(1_704_067_200));
    let engine = open(&path, &clock);
    assert!(engine.admin().records().iter().all(|r| r.key == b"live"));
}
