//! Application tables and the outbox, committed with a holder's completion or checkpoint
//! (`docs/outbox.md`): both or neither after a restart, a power loss or a failed commit;
//! never the writes of a fenced-out holder; reads that see every accepted write; the relay
//! that sees only committed messages, in id order; ids that continue after a restart; the
//! limits; writes staged in `run`, `run_typed` and `run_async`.
//!
//! Time moves only through a `MockClock`. A `Buffered` engine whose writer must not commit
//! until the test says so gets an hour of `max_delay` (the writer's batching runs on real
//! time; `flush` and `close` commit at once).

use idemkv::admin::FileReader;
use idemkv::error::{FlushError, TableError, WriteSetError};
use idemkv::fault::{Fault, FaultyStorage, WithStorage};
use idemkv::*;
use idemkv_check::backend::{acquired, completed};
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
        let count = FaultyStorage::memory();
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
            let backend = FaultyStorage::memory();
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
                .backend(FaultyStorage::from_image(backend.durable_image()))
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
fn a_power_loss_at_any_io_of_the_file_or_its_commit_log_keeps_each_completion_and_its_writes_together(
) {
    const KEYS: u64 = 3;
    let open = |file: &FaultyStorage, log: &FaultyStorage| {
        Engine::builder()
            .backend(file.clone())
            .log_backend(log.clone())
            .durability(Durability::Immediate)
            .open()
    };
    // The I/O counts of a whole run, to place a power loss at each I/O of either storage.
    let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
    let engine = open(&file, &log).unwrap();
    let log_syncs = log.syncs();
    assert_eq!(counting_workload(&engine, KEYS).len(), KEYS as usize);
    // The claims and completions were made durable by the log: one log sync each. The
    // file's commits are the applier's, off the callers' path, each taking every batch
    // acknowledged since the last: never more than one per acknowledged batch.
    assert!(log.syncs() - log_syncs >= 2 * KEYS);
    assert_eq!(engine.stats().log_checkpoints, 0);
    engine.close().unwrap();
    let totals = [file.ios(), log.ios()];
    let mut survived = [false; KEYS as usize + 1];
    for (struck, total) in totals.into_iter().enumerate() {
        for at in 1..=total {
            let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
            [&file, &log][struck].set_fault(Some(Fault::PowerLoss { at }));
            let acknowledged = match open(&file, &log) {
                Ok(engine) => {
                    let acked = counting_workload(&engine, KEYS);
                    let _ = engine.close();
                    acked
                }
                Err(_) => Vec::new(),
            };
            // The log as power loss leaves it (only what was synced), and as a process
            // crash does (every write, so a frame whose sync never returned too).
            for log_image in [log.durable_image(), log.live_image()] {
                let what = format!("power loss at I/O {at} of the {}", ["file", "log"][struck]);
                let reopened = open(
                    &FaultyStorage::from_image(file.durable_image()),
                    &FaultyStorage::from_image(log_image),
                );
                let Ok(engine) = reopened else {
                    // A power loss while the file was created leaves nothing to check.
                    assert!(acknowledged.is_empty(), "{what}");
                    continue;
                };
                let c = check_counting(&engine, KEYS, &what);
                let kept = acknowledged.last().copied().unwrap_or(0);
                assert!(c >= kept, "{what}: acknowledged {kept}, kept {c}");
                survived[c as usize] = true;
            }
        }
    }
    assert!(survived.iter().all(|&s| s), "counts survived {survived:?}");
}

#[test]
fn a_failed_commit_applies_nothing_and_acknowledges_nothing() {
    // Immediate: the commit of the completion and its writes fails; nothing is shown,
    // nothing is acknowledged, and the reopened file holds neither.
    let backend = FaultyStorage::memory();
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
        .backend(FaultyStorage::from_image(backend.live_image()))
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
    let backend = FaultyStorage::memory();
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
        .backend(FaultyStorage::from_image(backend.durable_image()))
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

/// Under `Immediate`, `mark_sent` returns once the removal is durable: a power loss right
/// after it returns leaves the message sent, and a power loss at the removal's first I/O
/// makes the call fail rather than return `Ok` (the check is shared with the teeth test
/// that switches the early return on).
#[test]
fn mark_sent_under_immediate_returns_once_the_removal_is_durable() {
    idemkv_check::faults::mark_sent_then_power_loss(idemkv_check::Bug::None)
        .unwrap_or_else(|e| panic!("{e}"));
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

#[test]
fn limits_are_typed_errors_and_a_refused_completion_applies_nothing() {
    let mut w = WriteSet::new();
    assert_eq!(
        w.put("", b"k", b"v").unwrap_err(),
        WriteSetError::TableNameEmpty
    );
    let long_name = "t".repeat(65);
    assert_eq!(
        w.put(&long_name, b"k", b"v").unwrap_err(),
        WriteSetError::TableNameTooLong { len: 65, max: 64 }
    );
    assert_eq!(
        w.delete("t", &[0; 1025]).unwrap_err(),
        WriteSetError::KeyTooLong {
            len: 1025,
            max: 1024
        }
    );
    let big = vec![0u8; (1 << 20) + 1];
    assert!(matches!(
        w.put("t", b"k", &big).unwrap_err(),
        WriteSetError::ValueTooLarge { .. }
    ));
    assert!(matches!(
        w.emit(&big).unwrap_err(),
        WriteSetError::MessageTooLarge { .. }
    ));
    assert!(w.is_empty(), "refused operations leave the set unchanged");
    for i in 0..1024u32 {
        w.put("t", &i.to_le_bytes(), b"").unwrap();
    }
    assert_eq!(
        w.emit(b"one too many").unwrap_err(),
        WriteSetError::TooManyOps { max: 1024 }
    );
    let mut heavy = WriteSet::new();
    let mb = vec![7u8; 1 << 20];
    for _ in 0..3 {
        heavy.emit(&mb).unwrap();
    }
    assert!(matches!(
        heavy.put("t", b"k", &mb).unwrap_err(),
        WriteSetError::TooManyBytes { .. }
    ));

    for mode in all_modes() {
        let site = Site::new(mode);
        let engine = site.builder().response_len_max(16).open().unwrap();
        assert!(matches!(
            engine.table_get("", b"k"),
            Err(TableError::Invalid(WriteSetError::TableNameEmpty))
        ));
        assert!(matches!(
            engine.table_range("t", b"", None, 10_001),
            Err(TableError::LimitTooLarge {
                limit: 10_001,
                max: 10_000
            })
        ));
        assert!(matches!(
            engine.outbox().pending(10_001),
            Err(TableError::LimitTooLarge { .. })
        ));
        assert!(matches!(
            engine.outbox().mark_sent(&vec![1; 10_001]),
            Err(TableError::LimitTooLarge { .. })
        ));
        let small = writes(|w| w.put("t", b"row", b"v")?.emit(b"m"));

        // Staged and attached writes together over the limit: nothing applied, key kept.
        let lease = acquired(engine.claim(b"k1", &ClaimOptions::default()).unwrap());
        lease.stage(w.clone()).unwrap();
        assert!(matches!(
            lease.stage(small.clone()),
            Err(LeaseError::WriteSet(WriteSetError::TooManyOps { .. }))
        ));
        assert!(matches!(
            lease.complete_with(b"r", &small),
            Err(LeaseError::WriteSet(WriteSetError::TooManyOps { .. }))
        ));
        // A response over the limit: the writes are not applied either.
        let lease = acquired(engine.claim(b"k2", &ClaimOptions::default()).unwrap());
        let token = lease.token();
        assert!(matches!(
            lease.complete_with(&[0; 17], &small),
            Err(LeaseError::ResponseTooLarge { .. })
        ));
        engine.flush().unwrap();
        for key in [&b"k1"[..], b"k2"] {
            assert!(
                matches!(engine.get(key).unwrap(), Some(KeyState::InFlight { .. })),
                "{mode:?}: a refused completion keeps the key"
            );
        }
        assert_eq!(engine.table_get("t", b"row").unwrap(), None, "{mode:?}");
        assert_eq!(engine.table_get("t", &0u32.to_le_bytes()).unwrap(), None);
        assert!(payloads(&engine).is_empty(), "{mode:?}");
        // Within the lease the holder settles it with writes that fit.
        engine.complete_with(b"k2", token, b"r", &small).unwrap();
        engine.flush().unwrap();
        assert_eq!(engine.table_get("t", b"row").unwrap(), Some(b"v".to_vec()));
        assert_eq!(payloads(&engine), ["m"], "{mode:?}");
    }
}

#[test]
fn a_repeated_completion_applies_its_writes_once() {
    for mode in all_modes() {
        let site = Site::new(mode);
        let engine = site.open();
        let lease = acquired(engine.claim(b"k", &ClaimOptions::default()).unwrap());
        let token = lease.token();
        lease.detach();
        let first = writes(|w| w.put("t", b"n", b"1")?.emit(b"once"));
        let second = writes(|w| {
            w.put("t", b"n", b"2")?
                .put("t", b"other", b"x")?
                .emit(b"twice")
        });
        engine.complete_with(b"k", token, b"r", &first).unwrap();
        // A retry of the same completion (its answer was lost, say): acknowledged, and
        // nothing is applied again, whatever it carries.
        engine.complete_with(b"k", token, b"r", &first).unwrap();
        engine.complete_with(b"k", token, b"r", &second).unwrap();
        engine.flush().unwrap();
        let engine = site.restart(engine);
        assert_eq!(engine.table_get("t", b"n").unwrap(), Some(b"1".to_vec()));
        assert_eq!(engine.table_get("t", b"other").unwrap(), None);
        assert_eq!(payloads(&engine), ["once"], "{mode:?}");
    }
}

#[test]
fn a_checkpoint_with_writes_reaches_a_takeover_with_them() {
    for mode in all_modes() {
        let site = Site::new(mode);
        let engine = site.open();
        let short = ClaimOptions::default().lease(Duration::from_secs(1));
        let mut lease = acquired(engine.claim(b"job", &short).unwrap());
        let step = writes(|w| w.put("progress", b"job", b"step-1")?.emit(b"step 1 done"));
        lease
            .set_checkpoint_with(1, b"after step 1", &step)
            .unwrap();
        // The holder dies (its lease ends); a takeover resumes from the checkpoint and finds
        // the state step 1 wrote, in every mode and across a restart.
        lease.detach();
        engine.flush().unwrap();
        let engine = site.restart(engine);
        site.clock.advance(Duration::from_secs(2));
        let takeover = acquired(engine.claim(b"job", &short).unwrap());
        assert_eq!(takeover.attempt(), 2, "{mode:?}");
        let checkpoint = takeover.checkpoint().expect("the checkpoint");
        assert_eq!(
            (checkpoint.phase(), checkpoint.data()),
            (1, &b"after step 1"[..])
        );
        let progress = engine.table_get("progress", b"job").unwrap();
        assert_eq!(progress.as_deref(), Some(&b"step-1"[..]), "{mode:?}");
        assert_eq!(payloads(&engine), ["step 1 done"], "{mode:?}");
        let done = writes(|w| w.put("progress", b"job", b"done")?.emit(b"job done"));
        takeover.complete_with(b"ok", &done).unwrap();
        engine.flush().unwrap();
        assert_eq!(payloads(&engine), ["step 1 done", "job done"], "{mode:?}");
    }
}

#[test]
fn a_power_loss_keeps_a_checkpoint_and_its_writes_together() {
    let count = FaultyStorage::memory();
    let run = |backend: &FaultyStorage| -> bool {
        let Ok(engine) = Engine::builder().backend(backend.clone()).open() else {
            return false;
        };
        let Ok(Claim::Acquired(mut lease)) = engine.claim(b"job", &ClaimOptions::default()) else {
            return false;
        };
        let step = writes(|w| w.put("progress", b"job", b"1")?.emit(b"step 1"));
        let acked = lease.set_checkpoint_with(1, b"cp", &step).is_ok();
        lease.detach();
        let _ = engine.close();
        acked
    };
    run(&count);
    for at in 1..=count.ios() {
        let backend = FaultyStorage::memory();
        backend.set_fault(Some(Fault::PowerLoss { at }));
        let acked = run(&backend);
        let Ok(engine) = Engine::builder()
            .backend(FaultyStorage::from_image(backend.durable_image()))
            .open()
        else {
            continue;
        };
        let checkpoint = match engine.get(b"job").unwrap() {
            Some(KeyState::InFlight { checkpoint, .. }) => checkpoint,
            _ => None,
        };
        let row = engine.table_get("progress", b"job").unwrap();
        let messages = payloads(&engine);
        assert_eq!(checkpoint.is_some(), row.is_some(), "loss at I/O {at}");
        assert_eq!(row.is_some(), messages == ["step 1"], "loss at I/O {at}");
        assert!(
            !acked || row.is_some(),
            "loss at I/O {at}: acknowledged, then lost"
        );
    }
}

#[test]
fn staged_writes_ride_with_run_and_are_dropped_on_a_handler_error() {
    for mode in all_modes() {
        let site = Site::new(mode);
        let engine = site.open();
        let opts = ClaimOptions::default();
        let failed = engine.run(b"k", &opts, |lease| {
            lease.stage(writes(|w| w.put("t", b"k", b"failed")?.emit(b"failed")))?;
            Err::<Vec<u8>, LeaseError>(LeaseError::Closed)
        });
        assert!(matches!(failed, Err(RunError::Handler(_))));
        engine.flush().unwrap();
        assert_eq!(engine.table_get("t", b"k").unwrap(), None, "{mode:?}");
        assert!(payloads(&engine).is_empty(), "{mode:?}");
        // The released key runs again; this time its staged writes are applied.
        let out = engine
            .run(b"k", &opts, |lease| {
                lease.stage(writes(|w| w.put("t", b"k", b"ran")))?;
                lease.stage(writes(|w| w.emit(b"ran")))?;
                Ok::<_, LeaseError>(b"ok".to_vec())
            })
            .unwrap();
        assert!(!out.replayed());
        let typed = engine
            .run_typed(b"typed", &opts, |lease| {
                lease.stage(writes(|w| w.put("t", b"typed", b"ran")?.emit(b"typed")))?;
                Ok::<_, LeaseError>(7u32)
            })
            .unwrap();
        assert_eq!(typed.value, 7);
        // A replay stages nothing and applies nothing.
        let replay = engine
            .run(b"k", &opts, |lease| {
                lease.stage(writes(|w| w.emit(b"never")))?;
                Ok::<_, LeaseError>(b"never".to_vec())
            })
            .unwrap();
        assert!(replay.replayed());
        engine.flush().unwrap();
        let engine = site.restart(engine);
        assert_eq!(engine.table_get("t", b"k").unwrap(), Some(b"ran".to_vec()));
        assert_eq!(
            engine.table_get("t", b"typed").unwrap(),
            Some(b"ran".to_vec())
        );
        assert_eq!(payloads(&engine), ["ran", "typed"], "{mode:?}");
    }
}

#[test]
fn staged_writes_ride_with_run_async_and_are_dropped_on_a_handler_error() {
    for mode in all_modes() {
        let site = Site::new(mode);
        let engine = site.open();
        let opts = ClaimOptions::default();
        futures::executor::block_on(async {
            let failed = engine
                .run_async(b"k", &opts, |lease| async move {
                    lease.stage(writes(|w| w.put("t", b"k", b"failed")?.emit(b"failed")))?;
                    Err::<Vec<u8>, LeaseError>(LeaseError::Closed)
                })
                .await;
            assert!(matches!(failed, Err(RunError::Handler(_))));
            let mut kept = None;
            let out = engine
                .run_async(b"k", &opts, |lease| {
                    kept = Some(lease.clone());
                    async move {
                        let cp = writes(|w| w.put("t", b"step", b"1")?.emit(b"step"));
                        lease.set_checkpoint_with(1, b"cp", &cp).await?;
                        lease.stage(writes(|w| w.put("t", b"k", b"ran")?.emit(b"ran")))?;
                        Ok::<_, LeaseError>(b"ok".to_vec())
                    }
                })
                .await
                .unwrap();
            assert!(!out.replayed());
            // The lease settled: a handle kept past it cannot stage writes that would be lost.
            let late = kept.unwrap().stage(writes(|w| w.emit(b"late")));
            assert_eq!(late, Err(LeaseError::Settled));
            let lease = acquired(engine.claim_async(b"direct", &opts).await.unwrap());
            let w = writes(|w| w.put("t", b"direct", b"1")?.emit(b"direct"));
            lease.complete_with_async(b"ok", &w).await.unwrap();
            engine.outbox().mark_sent_async(&[]).await.unwrap();
            engine.flush_async().await.unwrap();
        });
        let engine = site.restart(engine);
        assert_eq!(engine.table_get("t", b"k").unwrap(), Some(b"ran".to_vec()));
        assert_eq!(engine.table_get("t", b"step").unwrap(), Some(b"1".to_vec()));
        assert_eq!(
            engine.table_get("t", b"direct").unwrap(),
            Some(b"1".to_vec())
        );
        assert_eq!(payloads(&engine), ["step", "ran", "direct"], "{mode:?}");
        let ids: Vec<u64> = engine
            .outbox()
            .pending(10)
            .unwrap()
            .iter()
            .map(|m| m.id())
            .collect();
        futures::executor::block_on(engine.outbox().mark_sent_async(&ids)).unwrap();
        assert!(payloads(&engine).is_empty(), "{mode:?}");
    }
}

#[test]
fn scans_merge_accepted_and_committed_rows_in_key_order() {
    for mode in [held(), Durability::Immediate, Durability::None] {
        let site = Site::new(mode);
        let engine = site.open();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut n = 0u32;
        let mut apply = |engine: &Engine,
                         model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
                         w: &WriteSet,
                         ops: &[(&[u8], Option<&[u8]>)]| {
            n += 1;
            let key = format!("k{n}");
            let lease = acquired(
                engine
                    .claim(key.as_bytes(), &ClaimOptions::default())
                    .unwrap(),
            );
            lease.complete_with(b"ok", w).unwrap();
            for (k, v) in ops {
                match v {
                    Some(v) => model.insert(k.to_vec(), v.to_vec()),
                    None => model.remove(*k),
                };
            }
        };
        let keys: Vec<Vec<u8>> = (0..40u8).map(|i| vec![b'a' + i % 4, i]).collect();
        // Committed rows first, then accepted writes over them: new rows, overwrites and
        // deletions, some not yet committed (under the held `Buffered` writer).
        let mut first = WriteSet::new();
        let mut ops: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
        for k in &keys {
            first.put("t", k, b"old").unwrap();
            ops.push((k, Some(b"old")));
        }
        // Other tables, whose names share a prefix with "t", never show in its scans.
        first
            .put("tt", b"a", b"other")
            .unwrap()
            .put("u", b"", b"other")
            .unwrap();
        apply(&engine, &mut model, &first, &ops);
        engine.flush().unwrap();
        let mut second = WriteSet::new();
        let mut ops: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            match i % 3 {
                0 => {
                    second.delete("t", k).unwrap();
                    ops.push((k, None));
                }
                1 => {
                    second.put("t", k, b"new").unwrap();
                    ops.push((k, Some(b"new")));
                }
                _ => {}
            }
        }
        second
            .put("t", b"b\xff", b"new")
            .unwrap()
            .put("t", b"", b"empty key")
            .unwrap();
        ops.push((b"b\xff", Some(b"new")));
        ops.push((b"", Some(b"empty key")));
        apply(&engine, &mut model, &second, &ops);
        for limit in [0, 1, 5, 17, 100] {
            let all = engine.table_range("t", b"", None, limit).unwrap();
            let expected: Vec<TableRow> = model
                .iter()
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(all, expected, "{mode:?}: range, limit {limit}");
            let b = engine.table_prefix("t", b"b", limit).unwrap();
            let expected: Vec<TableRow> = model
                .iter()
                .filter(|(k, _)| k.starts_with(b"b"))
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(b, expected, "{mode:?}: prefix, limit {limit}");
            let mid = engine
                .table_range("t", b"b", Some(b"c\x05"), limit)
                .unwrap();
            let expected: Vec<TableRow> = model
                .range(b"b".to_vec()..b"c\x05".to_vec())
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(mid, expected, "{mode:?}: bounded range, limit {limit}");
        }
        // Paging: start after the last key returned.
        let mut paged = Vec::new();
        let mut start = Vec::new();
        loop {
            let page = engine.table_range("t", &start, None, 7).unwrap();
            let Some((last, _)) = page.last() else { break };
            start = [last.as_slice(), &[0]].concat();
            paged.extend(page);
        }
        assert_eq!(paged.len(), model.len(), "{mode:?}");
        engine.flush().unwrap();
        let engine = site.restart(engine);
        let all = engine.table_range("t", b"", None, 100).unwrap();
        assert_eq!(all.len(), model.len(), "{mode:?}: after restart");
    }
}

#[test]
fn application_tables_never_reach_the_engines_own() {
    let site = Site::new(Durability::Immediate);
    let engine = site.open();
    let lease = acquired(engine.claim(b"k", &ClaimOptions::default()).unwrap());
    let token = lease.token();
    // Tables named like the engine's are just application tables.
    let w = writes(|w| {
        w.put("idemkv_records", &token.to_be_bytes(), b"not a record")?
            .put("idemkv_chunks", &token.to_be_bytes(), b"not a chunk")?
            .put("idemkv_meta", b"format", b"nonsense")?
            .delete("idemkv_records", &token.to_le_bytes())?
            .delete("idemkv_chunks", &token.to_le_bytes())
    });
    lease.complete_with(b"stored", &w).unwrap();
    let engine = site.restart(engine);
    assert_eq!(
        completed(engine.claim(b"k", &ClaimOptions::default()).unwrap()).response(),
        b"stored"
    );
    let meta = engine.table_get("idemkv_meta", b"format").unwrap();
    assert_eq!(meta.as_deref(), Some(&b"nonsense"[..]));
    engine.close().unwrap();
    // The read-only tools open a file that holds application tables.
    let reader = FileReader::open(site.path()).unwrap();
    assert!(reader.get(b"k").unwrap().is_some());
}
