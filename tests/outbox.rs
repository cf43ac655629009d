//! Application tables and the outbox, committed with a holder's completion or checkpoint
//! (`docs/outbox.md`): both or neither after a restart, a power loss or a failed commit;
//! never the writes of a fenced-out holder; reads that see every accepted write; the relay
//! that sees only committed messages, in id order; ids that continue after a restart; the
//! limits; writes staged in `run`, `run_typed` and `run_async`.
//!
//! Time moves only through a `MockClock`. A `Buffered` engine whose writer must not commit
//! until the test says so gets an hour of `max_delay` (the writer's batching runs on real
//! time; `flush` and `close` commit at once).

use idemkv::*;
use idemkv_check::backend::{acquired, completed, Fault, FaultyBackend};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tempfile::TempDir;

const LEASE: Duration = Duration::from_secs(30);
const HOUR: Duration = Duration::from_secs(3600);

/// `Buffered`, with a writer that commits only on `flush` or `close`.
fn held() -> Durability {
    Durability::Buffered { max_delay: HOUR }
}

fn all_modes() -> [Durability; 3] {
    [
        Durability::Immediate,
        Durability::buffered(),
        Durability::None,
    ]
}

/// A file (unless memory-only) and a clock that outlive the engines opened on them.
struct Site {
    dir: TempDir,
    clock: MockClock,
    mode: Durability,
}

impl Site {
    fn new(mode: Durability) -> Site {
        Site {
            dir: tempfile::tempdir().unwrap(),
            clock: MockClock::new(),
            mode,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("outbox.redb")
    }

    fn builder(&self) -> EngineBuilder {
        let b = Engine::builder()
            .durability(self.mode)
            .clock(self.clock.clone())
            .lease(LEASE);
        if self.mode == Durability::None {
            b
        } else {
            b.path(self.path())
        }
    }

    fn open(&self) -> Engine {
        self.builder().open().unwrap()
    }

    /// Closes and reopens (a memory-only engine keeps its handle: it has no file).
    fn restart(&self, engine: Engine) -> Engine {
        if self.mode == Durability::None {
            return engine;
        }
        engine.close().unwrap();
        drop(engine);
        self.open()
    }
}

fn writes(f: impl FnOnce(&mut WriteSet) -> Result<&mut WriteSet, WriteSetError>) -> WriteSet {
    let mut w = WriteSet::new();
    f(&mut w).unwrap();
    w
}

fn u64_of(bytes: Option<Vec<u8>>) -> u64 {
    bytes.map_or(0, |b| u64::from_le_bytes(b.as_slice().try_into().unwrap()))
}

fn payloads(engine: &Engine) -> Vec<String> {
    let pending = engine.outbox().pending(10_000).unwrap();
    pending
        .iter()
        .map(|m| String::from_utf8(m.payload().to_vec()).unwrap())
        .collect()
}

fn is_completed(engine: &Engine, key: &[u8]) -> bool {
    matches!(engine.get(key).unwrap(), Some(KeyState::Completed { .. }))
}

#[test]
fn the_writes_commit_with_the_completion_and_survive_a_restart() {
    for mode in all_modes() {
        let site = Site::new(mode);
        let engine = site.open();
        let lease = acquired(engine.claim(b"msg-1", &ClaimOptions::default()).unwrap());
        let w = writes(|w| {
            w.put("balances", b"alice", b"150")?
                .put("offsets", b"orders", b"1")?
                .emit(b"confirm msg-1")
        });
        lease.complete_with(b"ok", &w).unwrap();
        let check = |engine: &Engine| {
            let balance = engine.table_get("balances", b"alice").unwrap();
            assert_eq!(balance.as_deref(), Some(&b"150"[..]), "{mode:?}");
            let offset = engine.table_get("offsets", b"orders").unwrap();
            assert_eq!(offset.as_deref(), Some(&b"1"[..]), "{mode:?}");
            // (A `Buffered` completion is shown to other callers once it is committed.)
            engine.flush().unwrap();
            assert!(is_completed(engine, b"msg-1"), "{mode:?}");
            assert_eq!(payloads(engine), ["confirm msg-1"], "{mode:?}");
        };
        check(&engine);
        check(&site.restart(engine));
    }
}

/// Key `i` adds 1 to a counter it reads through the engine and emits message `i`. Returns
/// the keys whose completion returned `Ok`. Under `Buffered` the first completion is
/// flushed alone, so that a power loss can fall between commits there too.
fn counting_workload(engine: &Engine, keys: u64) -> Vec<u64> {
    let mut acknowledged = Vec::new();
    for i in 1..=keys {
        let key = format!("k{i}");
        let Ok(Claim::Acquired(lease)) = engine.claim(key.as_bytes(), &ClaimOptions::default())
        else {
            continue;
        };
        let Ok(count) = engine.table_get("state", b"count") else {
            continue;
        };
        let next = u64_of(count) + 1;
        let w = writes(|w| {
            w.put("state", b"count", &next.to_le_bytes())?
                .put("applied", key.as_bytes(), b"1")?
                .emit(format!("m{next}").as_bytes())
        });
        if lease.complete_with(b"done", &w).is_ok() {
            acknowledged.push(i);
        }
        if i == 1 && engine.durability() != Durability::Immediate {
            let _ = engine.flush();
        }
    }
    acknowledged
}

/// After any crash: the counter is `c`, keys 1..=c are completed with their rows, no later
/// key is, and the outbox holds m1..=mc in id order: both or neither, and only a suffix lost.
fn check_counting(engine: &Engine, keys: u64, what: &str) -> u64 {
    let c = u64_of(engine.table_get("state", b"count").unwrap());
    for i in 1..=keys {
        let key = format!("k{i}");
        let done = is_completed(engine, key.as_bytes());
        let applied = engine
            .table_get("applied", key.as_bytes())
            .unwrap()
            .is_some();
        assert_eq!(done, i <= c, "{what}: k{i} completed: {done}, counter {c}");
        assert_eq!(
            applied, done,
            "{what}: k{i} completed {done} but applied {applied}"
        );
    }
    let pending = engine.outbox().pending(1000).unwrap();
    let expected: Vec<String> = (1..=c).map(|n| format!("m{n}")).collect();
    let got: Vec<String> = pending
        .iter()
        .map(|m| String::from_utf8(m.payload().to_vec()).unwrap())
        .collect();
    assert_eq!(got, expected, "{what}: outbox");
    assert!(pending.windows(2).all(|w| w[0].id() < w[1].id()), "{what}");
    c
}

#[test]
fn a_power_loss_at_any_io_keeps_each_completion_and_its_writes_together() {
    const KEYS: u64 = 3;
    for mode in [Durability::Immediate, Durability::buffered()] {
        // The I/O count of a whole run, to place a power loss at each one.
        let count = FaultyBackend::memory();
        let engine = Engine::builder()
            .backend(count.clone())
            .durability(mode)
            .open()
            .unwrap();
        counting_workload(&engine, KEYS);
        engine.close().unwrap();
        let total = count.ios();
        let mut survived = [false; KEYS as usize + 1];
        for at in 1..=total {
            let backend = FaultyBackend::memory();
            backend.set_fault(Some(Fault::PowerLoss { at }));
            let opened = Engine::builder()
                .backend(backend.clone())
                .durability(mode)
                .open();
            let acknowledged = match opened {
                Ok(engine) => {
                    let acked = counting_workload(&engine, KEYS);
                    let _ = engine.close();
                    acked
                }
                Err(_) => Vec::new(),
            };
            let reopened = Engine::builder()
                .backend(FaultyBackend::from_image(backend.durable_image()))
                .durability(mode)
                .open();
            let Ok(engine) = reopened else {
                // A power loss while the file was created leaves nothing to check.
                assert!(acknowledged.is_empty(), "{mode:?}, loss at I/O {at}");
                continue;
            };
            let c = check_counting(&engine, KEYS, &format!("{mode:?}, loss at I/O {at}"));
            if mode == Durability::Immediate {
                let kept = acknowledged.last().copied().unwrap_or(0);
                assert!(
                    c >= kept,
                    "{mode:?}, loss at I/O {at}: acknowledged {kept}, kept {c}"
                );
            }
            survived[c as usize] = true;
        }
        // The sweep cut the run before, between and after the commits (`Buffered` commits
        // the last two completions together or apart, as the real-time batching falls).
        let cut_everywhere = match mode {
            Durability::Immediate => survived.iter().all(|&s| s),
            _ => survived[0] && survived[1] && survived[KEYS as usize],
        };
        assert!(cut_everywhere, "{mode:?}: counts survived {survived:?}");
    }
}

#[test]
fn a_failed_commit_applies_nothing_and_acknowledges_nothing() {
    // Immediate: the commit of the completion and its writes fails; nothing is shown,
    // nothing is acknowledged, and the reopened file holds neither.
    let backend = FaultyBackend::memory();
    let engine = Engine::builder()
        .backend(backend.clone())
        .durability(Durability::Immediate)
        .open()
        .unwrap();
    let lease = acquired(engine.claim(b"k", &ClaimOptions::default()).unwrap());
    backend.fail_write_in(1);
    let w = writes(|w| w.put("t", b"row", b"v")?.emit(b"m"));
    assert!(matches!(
        lease.complete_with(b"r", &w),
        Err(LeaseError::OutcomeUnknown(_))
    ));
    assert!(matches!(
        engine.table_get("t", b"row"),
        Err(TableError::Poisoned(_))
    ));
    assert!(matches!(
        engine.outbox().pending(10),
        Err(TableError::Poisoned(_))
    ));
    let _ = engine.close();
    let engine = Engine::builder()
        .backend(FaultyBackend::from_image(backend.live_image()))
        .open()
        .unwrap();
    assert!(matches!(
        engine.get(b"k").unwrap(),
        Some(KeyState::InFlight { .. })
    ));
    assert_eq!(engine.table_get("t", b"row").unwrap(), None);
    assert!(engine.outbox().pending(10).unwrap().is_empty());
    engine.close().unwrap();

    // Buffered: the completion was acknowledged and its writes read back, but the commit
    // fails: the engine shows nothing more, and the file holds neither.
    let backend = FaultyBackend::memory();
    let engine = Engine::builder()
        .backend(backend.clone())
        .durability(held())
        .open()
        .unwrap();
    let lease = acquired(engine.claim(b"k", &ClaimOptions::default()).unwrap());
    let second = acquired(engine.claim(b"k2", &ClaimOptions::default()).unwrap());
    lease.complete_with(b"r", &w).unwrap();
    assert_eq!(engine.table_get("t", b"row").unwrap(), Some(b"v".to_vec()));
    assert!(
        engine.outbox().pending(10).unwrap().is_empty(),
        "not committed"
    );
    backend.fail_all(true);
    assert!(matches!(engine.flush(), Err(FlushError::Poisoned(_))));
    assert!(matches!(
        engine.table_get("t", b"row"),
        Err(TableError::Poisoned(_))
    ));
    // Nothing more is acknowledged, with or without writes.
    assert!(matches!(
        second.complete_with(b"r", &w),
        Err(LeaseError::Poisoned(_))
    ));
    assert!(matches!(
        engine.claim(b"other", &ClaimOptions::default()),
        Err(ClaimError::Poisoned(_))
    ));
    let _ = engine.close();
    let engine = Engine::builder()
        .backend(FaultyBackend::from_image(backend.durable_image()))
        .open()
        .unwrap();
    assert_eq!(engine.get(b"k").unwrap(), None);
    assert_eq!(engine.table_get("t", b"row").unwrap(), None);
    assert!(engine.outbox().pending(10).unwrap().is_empty());
}

#[test]
fn a_fenced_out_holders_writes_are_never_applied_and_a_takeovers_are() {
    for mode in all_modes() {
        let site = Site::new(mode);
        let engine = site.open();
        let short = ClaimOptions::default().lease(Duration::from_secs(1));
        let mut first = acquired(engine.claim(b"job", &short).unwrap());
        site.clock.advance(Duration::from_secs(2));
        let second = acquired(engine.claim(b"job", &short).unwrap());
        assert_eq!(second.attempt(), 2);
        let stale = writes(|w| w.put("t", b"owner", b"first")?.emit(b"from first"));
        assert_eq!(
            first.set_checkpoint_with(1, b"cp", &stale),
            Err(LeaseError::LeaseLost),
            "{mode:?}"
        );
        assert_eq!(
            engine.complete_with(b"job", first.token(), b"r1", &stale),
            Err(LeaseError::LeaseLost),
            "{mode:?}"
        );
        first.stage(stale.clone()).unwrap();
        assert_eq!(
            first.complete(b"r1"),
            Err(LeaseError::LeaseLost),
            "{mode:?}"
        );
        let fresh = writes(|w| w.put("t", b"owner", b"second")?.emit(b"from second"));
        second.complete_with(b"r2", &fresh).unwrap();
        let check = |engine: &Engine| {
            engine.flush().unwrap();
            let owner = engine.table_get("t", b"owner").unwrap();
            assert_eq!(owner.as_deref(), Some(&b"second"[..]), "{mode:?}");
            assert_eq!(payloads(engine), ["from second"], "{mode:?}");
            let stored = completed(engine.claim(b"job", &short).unwrap());
            assert_eq!(stored.response(), b"r2");
        };
        check(&engine);
        check(&site.restart(engine));
    }
}

#[test]
fn reads_see_every_accepted_write_and_the_relay_only_committed_ones() {
    for mode in [held(), Durability::Immediate, Durability::None] {
        let site = Site::new(mode);
        let engine = site.open();
        for n in 1..=10u64 {
            let key = format!("k{n}");
            let lease = acquired(
                engine
                    .claim(key.as_bytes(), &ClaimOptions::default())
                    .unwrap(),
            );
            // Each holder builds on what the previous ones wrote, committed or not.
            let count = u64_of(engine.table_get("state", b"count").unwrap());
            assert_eq!(count, n - 1, "{mode:?}");
            let w = writes(|w| {
                w.put("state", b"count", &n.to_le_bytes())?
                    .emit(format!("m{n}").as_bytes())
            });
            lease.complete_with(b"ok", &w).unwrap();
        }
        let expected: Vec<String> = (1..=10).map(|n| format!("m{n}")).collect();
        if mode == held() {
            // Accepted, not committed: readable, but not for the relay (a crash could lose
            // them, and with them their completions).
            assert!(payloads(&engine).is_empty());
            engine.flush().unwrap();
        }
        assert_eq!(payloads(&engine), expected, "{mode:?}");
        let pending = engine.outbox().pending(100).unwrap();
        assert!(pending.windows(2).all(|w| w[1].id() == w[0].id() + 1));
        assert_eq!(u64_of(engine.table_get("state", b"count").unwrap()), 10);
    }
}

#[test]
fn the_relay_reads_in_id_order_and_mark_sent_removes_through_the_writer() {
    for mode in [Durability::Immediate, held(), Durability::None] {
        let site = Site::new(mode);
        let engine = site.open();
        let mut n = 0;
        for (key, count) in [(b"a", 2), (b"b", 1), (b"c", 3)] {
            let lease = acquired(engine.claim(key, &ClaimOptions::default()).unwrap());
            let mut w = WriteSet::new();
            for _ in 0..count {
                n += 1;
                w.emit(format!("m{n}").as_bytes()).unwrap();
            }
            lease.complete_with(b"ok", &w).unwrap();
        }
        engine.flush().unwrap();
        let outbox = engine.outbox();
        let all = outbox.pending(100).unwrap();
        let ids: Vec<u64> = all.iter().map(OutboxMessage::id).collect();
        assert_eq!(ids, (ids[0]..ids[0] + 6).collect::<Vec<_>>(), "{mode:?}");
        let first_two = outbox.pending(2).unwrap();
        assert_eq!(first_two, all[..2].to_vec());
        outbox.mark_sent(&ids[..2]).unwrap();
        // Accepted removals are not shown again, also before they are committed.
        let rest: Vec<u64> = outbox
            .pending(100)
            .unwrap()
            .iter()
            .map(|m| m.id())
            .collect();
        assert_eq!(rest, ids[2..].to_vec(), "{mode:?}");
        outbox.mark_sent(&[]).unwrap();
        outbox.mark_sent(&[ids[0], u64::MAX]).unwrap();
        outbox.mark_sent(&ids[2..4]).unwrap();
        let engine = site.restart(engine);
        let left: Vec<String> = payloads(&engine);
        assert_eq!(left, ["m5", "m6"], "{mode:?}");
    }
}

#[test]
fn outbox_ids_continue_after_a_restart() {
    for mode in [Durability::Immediate, Durability::buffered()] {
        let site = Site::new(mode);
        let mut engine = site.open();
        let mut last = 0;
        for round in 0..3 {
            let key = format!("k{round}");
            let lease = acquired(
                engine
                    .claim(key.as_bytes(), &ClaimOptions::default())
                    .unwrap(),
            );
            let w = writes(|w| w.emit(b"x")?.emit(b"y"));
            lease.complete_with(b"ok", &w).unwrap();
            engine.flush().unwrap();
            let ids: Vec<u64> = engine
                .outbox()
                .pending(10)
                .unwrap()
                .iter()
                .map(|m| m.id())
                .collect();
            assert_eq!(ids.len(), 2, "{mode:?}");
            assert!(
                ids[0] > last,
                "{mode:?}: round {round} reused id {} after {last}",
                ids[0]
            );
            last = ids[1];
            // Every message sent: the outbox is empty, and ids still continue.
            engine.outbox().mark_sent(&ids).unwrap();
            engine = site.restart(engine);
            assert!(engine.outbox().pending(10).unwrap().is_empty());
        }
    }
}
