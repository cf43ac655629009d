//! Scopes (`ClaimOptions::scope`): the same key in two scopes is two independent keys, in
//! memory and in the file, across a restart, through every call that names a key; the empty
//! scope is the unscoped key; a scope past its limit is refused with its own error.

use idemkv::admin::{FileReader, RecordInfoState};
use idemkv::error::ImportError;
use idemkv::*;
use idemkv_check::fixture::{self, acquire};
use std::path::Path;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);

fn open(path: &Path, clock: &MockClock, durability: Durability) -> Engine {
    fixture::open_builder(
        fixture::builder(path, clock, durability)
            .lease(LEASE)
            .recovery(Recovery::TakeOver),
    )
}

fn in_scope(scope: &[u8]) -> ClaimOptions {
    ClaimOptions::default().scope(scope)
}

fn replayed(engine: &Engine, key: &[u8], opts: &ClaimOptions) -> Vec<u8> {
    match engine.claim(key, opts).unwrap() {
        Claim::Completed(stored) => stored.response().to_vec(),
        other => panic!("expected a replay, got {other:?}"),
    }
}

#[test]
fn one_key_in_two_scopes_is_two_keys_through_claims_completions_replays_and_a_restart() {
    // The memory-only engine's scopes are in the tests below; this one restarts.
    for durability in [Durability::Immediate, Durability::buffered()] {
        two_scopes_through_a_restart(durability);
    }
}

fn two_scopes_through_a_restart(durability: Durability) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scopes.redb");
    let clock = MockClock::new();
    let engine = open(&path, &clock, durability);
    let (alice, bob) = (in_scope(b"alice"), in_scope(b"bob"));

    // Both acquire: neither scope sees the other's claim.
    let a = acquire(
        &engine,
        b"order-1",
        &alice.clone().payload(b"alice's order"),
    );
    let b = acquire(&engine, b"order-1", &bob.clone().payload(b"bob's order"));
    assert_ne!(a.token(), b.token());
    assert_eq!((a.scope(), a.key()), (&b"alice"[..], &b"order-1"[..]));
    assert_eq!((b.scope(), b.key()), (&b"bob"[..], &b"order-1"[..]));
    // Nor the unscoped key.
    let unscoped = acquire(&engine, b"order-1", &ClaimOptions::default());

    a.complete(b"charged alice").unwrap();
    // Alice's completion is hers: Bob's key is still in flight.
    assert!(matches!(
        engine.claim(b"order-1", &bob).unwrap(),
        Claim::InProgress(_)
    ));
    assert!(matches!(
        engine.get_scoped(b"bob", b"order-1").unwrap(),
        Some(KeyState::InFlight { .. })
    ));
    b.release().unwrap();
    assert_eq!(engine.get_scoped(b"bob", b"order-1").unwrap(), None);
    let b = acquire(
        &engine,
        b"order-1",
        &bob.clone().payload(b"bob's second order"),
    );
    b.complete(b"charged bob").unwrap();
    unscoped.complete(b"charged nobody").unwrap();
    // Replays show durable completions only (under `Buffered`, once flushed).
    engine.flush().unwrap();

    // Each scope replays its own response, and checks its own fingerprint.
    let alice_again = alice.clone().payload(b"alice's order");
    assert_eq!(
        replayed(&engine, b"order-1", &alice_again),
        b"charged alice"
    );
    assert!(matches!(
        engine.claim(b"order-1", &alice.clone().payload(b"bob's second order")),
        Err(ClaimError::FingerprintMismatch)
    ));
    assert_eq!(replayed(&engine, b"order-1", &bob), b"charged bob");
    assert_eq!(
        replayed(&engine, b"order-1", &ClaimOptions::default()),
        b"charged nobody"
    );

    // A claim left in flight in a scope, then a restart.
    let held = acquire(&engine, b"job", &alice);
    held.detach();
    engine.close().unwrap();
    drop(engine);

    let engine = open(&path, &clock, durability);
    assert_eq!(
        replayed(&engine, b"order-1", &alice_again),
        b"charged alice"
    );
    assert_eq!(replayed(&engine, b"order-1", &bob), b"charged bob");
    assert_eq!(
        replayed(&engine, b"order-1", &ClaimOptions::default()),
        b"charged nobody"
    );
    // The held claim came back in its scope (taken over, attempt 2); the same key
    // unscoped and in Bob's scope is new.
    let taken = acquire(&engine, b"job", &alice);
    assert_eq!((taken.scope(), taken.attempt()), (&b"alice"[..], 2));
    assert_eq!(acquire(&engine, b"job", &bob).attempt(), 1);
    assert_eq!(
        acquire(&engine, b"job", &ClaimOptions::default()).attempt(),
        1
    );
}

#[test]
fn scopes_never_share_a_key_whatever_bytes_they_hold() {
    let engine = Engine::builder()
        .durability(Durability::None)
        .open()
        .unwrap();
    // Concatenated, each pair would be one string: "abc", "\0k", "\x01ak".
    let pairs: [(&[u8], &[u8]); 6] = [
        (b"ab", b"c"),
        (b"a", b"bc"),
        (b"", b"abc"),
        (b"\0", b"k"),
        (b"", b"\0k"),
        (b"\x01a", b"k"),
    ];
    let leases: Vec<Lease> = pairs
        .iter()
        .map(|(scope, key)| acquire(&engine, key, &in_scope(scope)))
        .collect();
    for (lease, (scope, key)) in leases.iter().zip(pairs) {
        assert_eq!((lease.scope(), lease.key()), (scope, key));
    }
    let records = engine.admin().records();
    assert_eq!(records.len(), pairs.len());
    for (scope, key) in pairs {
        assert!(records.iter().any(|r| r.scope == scope && r.key == key));
    }
}

#[test]
fn the_empty_scope_is_the_unscoped_key() {
    let engine = Engine::builder()
        .durability(Durability::None)
        .open()
        .unwrap();
    let lease = acquire(&engine, b"k", &in_scope(b""));
    assert_eq!(lease.scope(), b"");
    assert!(matches!(
        engine.claim(b"k", &ClaimOptions::default()).unwrap(),
        Claim::InProgress(_)
    ));
    lease.complete(b"done").unwrap();
    assert_eq!(replayed(&engine, b"k", &ClaimOptions::default()), b"done");
    assert_eq!(
        engine.get(b"k").unwrap(),
        engine.get_scoped(b"", b"k").unwrap()
    );
    assert_eq!(engine.admin().records()[0].scope, b"");
}

#[test]
fn a_scope_past_its_limit_is_refused_with_its_own_error() {
    let engine = Engine::builder()
        .durability(Durability::None)
        .open()
        .unwrap();
    let longest = vec![b's'; 255];
    acquire(&engine, b"k", &in_scope(&longest))
        .complete(b"ok")
        .unwrap();
    assert_eq!(replayed(&engine, b"k", &in_scope(&longest)), b"ok");
    let too_long = vec![b's'; 256];
    let refused = ClaimError::ScopeTooLong { len: 256, max: 255 };
    assert_eq!(
        engine.claim(b"k", &in_scope(&too_long)).unwrap_err(),
        refused
    );
    assert_eq!(
        engine
            .claim_or_wait(b"k", &in_scope(&too_long))
            .unwrap_err(),
        refused
    );
    assert_eq!(engine.get_scoped(&too_long, b"k").unwrap_err(), refused);
    let run = engine.run(b"k", &in_scope(&too_long), |_| {
        Ok::<_, std::io::Error>(b"never".to_vec())
    });
    assert!(matches!(run, Err(RunError::Claim(e)) if e == refused));
    assert_eq!(
        engine
            .complete_scoped(&too_long, b"k", 1, b"x")
            .unwrap_err(),
        LeaseError::ScopeTooLong { len: 256, max: 255 }
    );
    // The key limit is the key's alone: a long scope does not eat into it.
    let longest_key = vec![b'k'; 255];
    acquire(&engine, &longest_key, &in_scope(&longest));
    assert!(matches!(
        engine.claim(&[b'k'; 256], &in_scope(b"s")),
        Err(ClaimError::KeyTooLong { len: 256, max: 255 })
    ));
}

#[test]
fn a_detached_scoped_lease_is_settled_by_the_scoped_calls_only() {
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .lease(LEASE)
        .open()
        .unwrap();
    let mut lease = acquire(&engine, b"k", &in_scope(b"t"));
    lease.set_checkpoint(1, b"step-1").unwrap();
    let detached = lease.detach();
    assert_eq!((detached.scope(), detached.key()), (&b"t"[..], &b"k"[..]));
    let token = detached.token();
    // The unscoped key of the same bytes is another key: nothing of it is held.
    assert_eq!(
        engine.complete(detached.key(), token, b"x"),
        Err(LeaseError::LeaseLost)
    );
    assert_eq!(engine.release(detached.key(), token), Ok(false));
    engine
        .extend_scoped(detached.scope(), detached.key(), token, 2 * LEASE)
        .unwrap();
    engine
        .checkpoint_scoped(detached.scope(), detached.key(), token, 2, b"step-2")
        .unwrap();
    clock.advance(LEASE + Duration::from_millis(1));
    // Extended: still held in its scope.
    assert!(matches!(
        engine.get_scoped(b"t", b"k").unwrap(),
        Some(KeyState::InFlight { checkpoint: Some(c), .. }) if c.phase() == 2
    ));
    engine
        .complete_scoped(detached.scope(), detached.key(), token, b"done")
        .unwrap();
    assert_eq!(replayed(&engine, b"k", &in_scope(b"t")), b"done");
    assert_eq!(engine.get(b"k").unwrap(), None);

    // And a release in its scope frees it for the next claim there.
    let other = acquire(&engine, b"j", &in_scope(b"t")).detach();
    assert!(engine.release_scoped(b"t", b"j", other.token()).unwrap());
    assert_eq!(acquire(&engine, b"j", &in_scope(b"t")).attempt(), 1);
}

#[test]
fn operators_see_scopes_apart_and_export_import_and_release_keep_them() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let source = open(
        &dir.path().join("source.redb"),
        &clock,
        Durability::Immediate,
    );
    acquire(&source, b"k", &in_scope(b"t1"))
        .complete(b"one")
        .unwrap();
    acquire(&source, b"k", &in_scope(b"t2"))
        .complete(b"two")
        .unwrap();
    let mut held = acquire(&source, b"k", &ClaimOptions::default());
    held.set_checkpoint(3, b"cp").unwrap();
    held.detach();
    let exported = source.admin().records();
    let scopes: Vec<&[u8]> = exported.iter().map(|r| &r.scope[..]).collect();
    assert_eq!(scopes, [&b"t1"[..], b"t2", b""]);
    source.close().unwrap();
    drop(source);

    // A reader of the file sees each scope's record apart.
    let reader = FileReader::open(dir.path().join("source.redb")).unwrap();
    let read = |scope: &[u8]| reader.get_scoped(scope, b"k").unwrap().unwrap();
    assert!(matches!(
        read(b"t2").state,
        RecordInfoState::Completed { ref response, .. } if response == b"two"
    ));
    assert_eq!(read(b"").scope, b"");
    assert_eq!(reader.get(b"k").unwrap().unwrap().token, read(b"").token);
    assert!(reader.get_scoped(b"t3", b"k").unwrap().is_none());
    drop(reader);

    // Imported into a fresh file, the records keep their scopes.
    let target = open(
        &dir.path().join("target.redb"),
        &clock,
        Durability::Immediate,
    );
    for r in &exported {
        target.admin().import(r).unwrap();
    }
    assert_eq!(target.admin().records(), exported);
    assert_eq!(replayed(&target, b"k", &in_scope(b"t1")), b"one");
    assert_eq!(replayed(&target, b"k", &in_scope(b"t2")), b"two");
    // An import of a scope past the limit is refused as invalid.
    let mut bad = exported[0].clone();
    bad.scope = vec![0; 256];
    bad.token += 100;
    assert!(matches!(
        target.admin().import(&bad),
        Err(ImportError::Invalid(_))
    ));

    // A force-release names the scope: the unscoped stuck claim is released, the scoped
    // completions are untouched.
    assert_eq!(
        target.admin().force_release_scoped(b"t1", b"k").unwrap(),
        None
    );
    let before = target.admin().force_release(b"k").unwrap().unwrap();
    assert_eq!((before.scope.as_slice(), before.attempt), (&b""[..], 1));
    assert_eq!(target.get(b"k").unwrap(), None);
    assert_eq!(replayed(&target, b"k", &in_scope(b"t1")), b"one");
}
