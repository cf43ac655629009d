use idemkv::error::OpenErrorKind;
use idemkv::*;
use std::time::Duration;

use idemkv_check::modes;

#[test]
fn smoke_all_modes() {
    for mode in modes() {
        let dir = tempfile::tempdir().unwrap();
        let clock = MockClock::new();
        let builder = Engine::builder().durability(mode).clock(clock.clone());
        // A memory-only engine keeps no file and refuses a path.
        let builder = match mode {
            Durability::None => builder,
            _ => builder.path(dir.path().join("s.redb")),
        };
        let engine = builder.open().unwrap();
        let o = ClaimOptions::default();
        let Claim::Acquired(lease) = engine.claim(b"k", &o).unwrap() else {
            panic!()
        };
        assert!(matches!(
            engine.claim(b"k", &o).unwrap(),
            Claim::InProgress(_)
        ));
        lease.complete(b"r").unwrap();
        engine.flush().unwrap();
        match engine.claim(b"k", &o).unwrap() {
            Claim::Completed(s) => assert_eq!(s.response(), b"r"),
            other => panic!("{mode:?} {other:?}"),
        }
        let out = engine
            .run(b"k2", &o, |_| Ok::<_, ()>(b"x".to_vec()))
            .unwrap();
        assert!(!out.replayed());
        clock.advance(Duration::from_secs(1));
        engine.close().unwrap();
        if mode != Durability::None {
            let engine = Engine::builder()
                .path(dir.path().join("s.redb"))
                .durability(mode)
                .clock(clock.clone())
                .open()
                .unwrap();
            match engine.claim(b"k", &o).unwrap() {
                Claim::Completed(s) => assert_eq!(s.response(), b"r"),
                other => panic!("{mode:?} {other:?}"),
            }
        }
    }
}

/// A memory-only engine keeps no file, so a path given to it is refused rather than
/// silently ignored (its keys would be forgotten at a restart although a file was asked
/// for); nothing is created.
#[test]
fn a_memory_only_engine_refuses_a_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.redb");
    let err = Engine::builder()
        .durability(Durability::None)
        .path(&path)
        .open()
        .expect_err("a path is refused");
    assert!(
        matches!(&err, OpenError::MemoryOnlyPath { path: p } if *p == path),
        "{err:?}"
    );
    assert_eq!(err.kind(), OpenErrorKind::InvalidConfig);
    let text = err.to_string();
    assert!(
        text.contains("memory-only") && text.contains("keeps no file"),
        "{text}"
    );
    assert!(
        text.contains("drop the path, or choose a durable mode"),
        "{text}"
    );
    assert!(!path.exists(), "no file was created");
    // Without the path it opens, and a durable mode opens with it.
    Engine::builder()
        .durability(Durability::None)
        .open()
        .unwrap();
    Engine::builder()
        .durability(Durability::Immediate)
        .path(&path)
        .open()
        .unwrap();
}
