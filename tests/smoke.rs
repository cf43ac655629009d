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
