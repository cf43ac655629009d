//! A custom storage ([`FaultyStorage`]): the engine keeps its file in it, a new engine over
//! its bytes reads what the first one left, and an open honours the storage's lock.

use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::*;
use std::io;

fn respond(bytes: &'static [u8]) -> impl FnOnce(&Lease) -> io::Result<Vec<u8>> {
    move |_| Ok(bytes.to_vec())
}

#[test]
fn the_engine_keeps_its_records_in_a_custom_storage() {
    let memory = FaultyStorage::memory();
    let engine = Engine::builder().backend(memory.clone()).open().unwrap();
    let opts = ClaimOptions::default();
    let out = engine.run(b"k", &opts, respond(b"v")).unwrap();
    assert!(!out.replayed());
    engine.close().unwrap();
    drop(engine);
    assert!(memory.syncs() > 0, "the engine made its commits durable");
    assert_eq!(memory.pending(), 0, "a closed engine left nothing unsynced");
    assert!(
        !memory.durable_image().is_empty(),
        "the engine wrote into the storage"
    );

    // A new engine over the same storage replays the stored response.
    let engine = Engine::builder().backend(memory.clone()).open().unwrap();
    let out = engine.run(b"k", &opts, respond(b"other")).unwrap();
    assert_eq!((out.response(), out.replayed()), (&b"v"[..], true));
    engine.close().unwrap();
    drop(engine);

    // So does one over a copy of its bytes.
    let copy = FaultyStorage::from_image(memory.durable_image());
    let engine = Engine::builder().backend(copy).open().unwrap();
    let out = engine.run(b"k", &opts, respond(b"other")).unwrap();
    assert_eq!((out.response(), out.replayed()), (&b"v"[..], true));
}

#[test]
fn a_storage_serves_one_open_of_a_builder() {
    let builder = Engine::builder().backend(FaultyStorage::memory());
    let engine = builder.clone().open().unwrap();
    let r = builder.open();
    assert!(matches!(r, Err(OpenError::InvalidConfig { .. })), "{r:?}");
    drop(engine);
}

#[test]
fn a_storage_locked_elsewhere_is_already_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.redb");
    let first = Engine::builder()
        .path(&path)
        .backend(FaultyStorage::file(&path).unwrap())
        .open()
        .unwrap();
    let r = Engine::builder()
        .path(&path)
        .backend(FaultyStorage::file(&path).unwrap())
        .open();
    assert!(matches!(r, Err(OpenError::AlreadyOpen { .. })), "{r:?}");
    // Closing the first engine releases the lock.
    first.close().unwrap();
    drop(first);
    let second = Engine::builder()
        .path(&path)
        .backend(FaultyStorage::file(&path).unwrap())
        .open();
    assert!(second.is_ok(), "{second:?}");
}

#[test]
fn a_storage_that_fails_every_read_is_refused_at_open() {
    let memory = FaultyStorage::memory();
    let engine = Engine::builder().backend(memory.clone()).open().unwrap();
    engine.close().unwrap();
    drop(engine);
    memory.fail_reads_with(Some(13));
    let r = Engine::builder().backend(memory).open();
    assert!(r.is_err(), "{r:?}");
}
