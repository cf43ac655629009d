//! Storage faults: I/O errors at every point of a workload, power loss, corrupted and
//! foreign files, a second open of one file, and a stalled writer.
//!
//! The contract under test (docs/design.md, "How a commit can fail"): a storage error poisons the engine, which then
//! acknowledges nothing more; waiting callers learn that the outcome is unknown; a reopen
//! recovers every acknowledged call; a damaged or foreign file gives a clear error, never a
//! panic and never a wrong replay.

use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv_check::backend as common;

use common::acquired;
use idemkv::error::{FlushError, Limit};
use idemkv::*;
use redb::{ReadableDatabase, TableDefinition};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn opts() -> ClaimOptions {
    ClaimOptions::default()
}

fn open_backend(b: &FaultyStorage, mode: Durability) -> Result<Engine, OpenError> {
    Engine::builder()
        .backend(b.clone())
        .durability(mode)
        // Every open uses the same mock start time, so retention never runs out between runs.
        .clock(MockClock::new())
        .open()
}

/// Like [`open_backend`] under `Immediate`, with `log` as the commit log when given (the
/// default configuration's path: each group commit is one log append).
fn open_logged(b: &FaultyStorage, log: Option<&FaultyStorage>) -> Result<Engine, OpenError> {
    let mut builder = Engine::builder()
        .backend(b.clone())
        .durability(Durability::Immediate)
        .clock(MockClock::new());
    if let Some(log) = log {
        builder = builder.log_backend(log.clone());
    }
    builder.open()
}

fn open_path(path: &Path) -> Result<Engine, OpenError> {
    Engine::builder().path(path).clock(MockClock::new()).open()
}

fn acquire(engine: &Engine, key: &[u8]) -> Lease {
    match engine.claim(key, &opts()) {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("claim {:?}: expected Acquired, got {other:?}", show(key)),
    }
}

fn complete_key(engine: &Engine, key: &[u8], response: &[u8]) -> u64 {
    let lease = acquire(engine, key);
    let token = lease.token();
    lease.complete(response).expect("complete");
    token
}

fn expect_completed(engine: &Engine, key: &[u8], response: &[u8]) {
    match engine.get(key) {
        Ok(Some(KeyState::Completed { response: r, .. })) => {
            assert_eq!(&r[..], response, "key {}", show(key))
        }
        other => panic!("key {}: expected Completed, got {other:?}", show(key)),
    }
    match engine.claim(key, &opts()) {
        Ok(Claim::Completed(s)) => assert_eq!(s.response(), response, "key {}", show(key)),
        other => panic!("key {}: expected a replay, got {other:?}", show(key)),
    }
}

fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

fn response_for(key: &str) -> Vec<u8> {
    format!("response of {key}: ").repeat(4).into_bytes()
}

/// Waits (real time, bounded) until `cond` holds; for conditions on other threads.
fn spin_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

fn is_poison(e: &LeaseError) -> bool {
    matches!(e, LeaseError::OutcomeUnknown(_) | LeaseError::Poisoned(_))
}

/// Checks that `engine` is poisoned and refuses everything.
fn assert_poisoned(engine: &Engine, held: Option<&Lease>) {
    assert!(engine.stats().poisoned, "stats().poisoned");
    assert!(matches!(
        engine.claim(b"after", &opts()),
        Err(ClaimError::Poisoned(_))
    ));
    assert!(matches!(
        engine.claim_or_wait(b"after", &opts()),
        Err(ClaimError::Poisoned(_))
    ));
    assert!(matches!(engine.flush(), Err(FlushError::Poisoned(_))));
    assert!(matches!(engine.get(b"after"), Err(ClaimError::Poisoned(_))));
    if let Some(lease) = held {
        assert!(matches!(
            lease.extend(Duration::from_secs(1)),
            Err(LeaseError::Poisoned(_))
        ));
        let r = engine.complete(lease.key(), lease.token(), b"late");
        assert!(matches!(r, Err(LeaseError::Poisoned(_))), "{r:?}");
    }
}

// ---------------------------------------------------------------------------------------
// A storage failure under Immediate poisons the engine; a reopen recovers what was acked
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Write,
    Sync,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Storage {
    /// In memory; reopened from the durable image (power loss) and the live image.
    Memory,
    /// A real file through `FileBackend`; reopened by path.
    File,
}

#[test]
fn immediate_failure_poisons_and_reopen_serves_acknowledged() {
    for fault in [Fault::Sync, Fault::Write] {
        for storage in [Storage::Memory, Storage::File] {
            immediate_failure_case(fault, storage);
        }
    }
}

fn immediate_failure_case(fault: Fault, storage: Storage) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("poison.redb");
    let backend = match storage {
        Storage::Memory => FaultyStorage::memory(),
        Storage::File => FaultyStorage::file(&path).unwrap(),
    };
    let engine = open_backend(&backend, Durability::Immediate).unwrap();
    let mut acked = Vec::new();
    let mut max_token = 0;
    for i in 0..5 {
        let key = format!("acked-{i}");
        max_token = max_token.max(complete_key(&engine, key.as_bytes(), &response_for(&key)));
        acked.push(key);
    }
    let held = acquire(&engine, b"held");
    let other = acquire(&engine, b"other");
    max_token = max_token.max(held.token()).max(other.token());
    engine.flush().unwrap();

    match fault {
        Fault::Sync => backend.fail_sync_in(1),
        Fault::Write => backend.fail_write_in(1),
    }
    let before = backend.injected();
    let r = held.complete(&response_for("held"));
    assert!(
        matches!(&r, Err(e) if is_poison(e)),
        "{fault:?}/{storage:?}: {r:?}"
    );
    assert_eq!(backend.injected(), before + 1, "the failure was injected");
    let token_next = engine.stats().token_next;
    assert_poisoned(&engine, Some(&other));
    // Nothing is acknowledged after the failure, even with the disk healthy again.
    backend.heal();
    assert!(matches!(
        engine.claim(b"new", &opts()),
        Err(ClaimError::Poisoned(_))
    ));
    assert!(matches!(other.release(), Err(LeaseError::Poisoned(_))));
    assert!(matches!(engine.close(), Err(FlushError::Poisoned(_))));
    drop(engine);

    let images = match storage {
        Storage::Memory => vec![backend.durable_image(), backend.live_image()],
        Storage::File => vec![Vec::new()],
    };
    for image in images {
        let engine = match storage {
            Storage::Memory => {
                open_backend(&FaultyStorage::from_image(&image), Durability::Immediate)
            }
            Storage::File => open_path(&path),
        }
        .unwrap_or_else(|e| panic!("{fault:?}/{storage:?}: reopen: {e}"));
        assert!(!engine.stats().poisoned);
        for key in &acked {
            expect_completed(&engine, key.as_bytes(), &response_for(key));
        }
        // The unconfirmed completion is either there with its bytes or not at all (then the
        // acknowledged claim is InFlight, and taken over at once).
        match engine.get(b"held").unwrap() {
            Some(KeyState::Completed { response, .. }) => {
                assert_eq!(&response[..], response_for("held"))
            }
            Some(KeyState::InFlight { attempt: 1, .. }) => {}
            other => panic!("{fault:?}/{storage:?}: held: {other:?}"),
        }
        assert!(matches!(
            engine.get(b"other").unwrap(),
            Some(KeyState::InFlight { .. })
        ));
        assert_eq!(engine.get(b"new").unwrap(), None, "never acknowledged");
        assert_eq!(engine.get(b"after").unwrap(), None, "never acknowledged");
        let lease = acquire(&engine, b"other");
        assert_eq!(lease.attempt(), 2, "takeover of a dead owner");
        assert!(lease.token() > max_token && lease.token() >= token_next);
        lease.complete(b"done").unwrap();
        let fresh = acquire(&engine, b"fresh");
        assert!(fresh.token() >= token_next, "tokens keep increasing");
        fresh.complete(b"f").unwrap();
        engine.close().unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// A waiter on an unpublished completion learns that the outcome is unknown
// ---------------------------------------------------------------------------------------

#[test]
fn waiter_on_unpublished_completion_gets_outcome_unknown() {
    let backend = FaultyStorage::memory();
    let engine = open_backend(&backend, Durability::Immediate).unwrap();
    complete_key(&engine, b"before", b"kept");
    let lease = acquire(&engine, b"k");
    let busy = acquire(&engine, b"busy");

    let gate = backend.close_gate();
    backend.fail_sync_in(1);
    let holder = std::thread::spawn(move || lease.complete(b"lost?"));
    common::wait_sync_held(&backend);
    // The completion is queued but not durable: nobody may see it yet.
    assert!(matches!(
        engine.get(b"k").unwrap(),
        Some(KeyState::Completing { .. })
    ));
    assert!(matches!(
        engine.claim(b"k", &opts()),
        Ok(Claim::InProgress(_))
    ));

    let waits = engine.stats().waits;
    let (e1, e2) = (engine.clone(), engine.clone());
    let waiter = std::thread::spawn(move || e1.claim_or_wait(b"k", &opts()));
    let waiter_busy = std::thread::spawn(move || e2.claim_or_wait(b"busy", &opts()));
    spin_until("both waiters to sleep", || {
        engine.stats().waits >= waits + 2
    });
    drop(gate); // the blocked sync now fails

    let r = holder.join().unwrap();
    assert!(matches!(r, Err(LeaseError::OutcomeUnknown(_))), "{r:?}");
    let r = waiter.join().unwrap();
    assert!(matches!(r, Err(ClaimError::OutcomeUnknown(_))), "{r:?}");
    let r = waiter_busy.join().unwrap();
    assert!(matches!(r, Err(ClaimError::OutcomeUnknown(_))), "{r:?}");
    assert_poisoned(&engine, Some(&busy));
    drop(busy);
    let _ = engine.close();
    drop(engine);

    for image in [backend.durable_image(), backend.live_image()] {
        let engine =
            open_backend(&FaultyStorage::from_image(&image), Durability::Immediate).unwrap();
        expect_completed(&engine, b"before", b"kept");
        match engine.get(b"k").unwrap() {
            Some(KeyState::Completed { response, .. }) => assert_eq!(&response[..], b"lost?"),
            Some(KeyState::InFlight { .. }) => {}
            other => panic!("k: {other:?}"),
        }
        engine.close().unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Fail every write / every sync of a small workload, one at a time
// ---------------------------------------------------------------------------------------

/// What the workload asked for one key and what it was told.
#[derive(Debug, Default, Clone)]
struct KeyLog {
    claim_tried: bool,
    claim_acked: bool,
    checkpoint: Option<(u32, Vec<u8>)>,
    checkpoint_acked: bool,
    response: Option<Vec<u8>>,
    complete_acked: bool,
    release_tried: bool,
    release_acked: bool,
}

#[derive(Debug, Default)]
struct Log {
    keys: BTreeMap<Vec<u8>, KeyLog>,
    /// Description of the first failed call, if any.
    failed: Option<String>,
    /// Calls acknowledged after the first failure (must stay empty).
    acked_after_failure: Vec<String>,
    max_token: u64,
    /// Failures injected before `close` (the rest hit redb's shutdown, after every ack).
    injected_before_close: u64,
}

impl Log {
    fn note<T, E: std::fmt::Debug>(&mut self, what: &str, r: &Result<T, E>) -> bool {
        match r {
            Ok(_) if self.failed.is_some() => self.acked_after_failure.push(what.into()),
            Ok(_) => {}
            Err(e) => {
                self.failed.get_or_insert_with(|| format!("{what}: {e:?}"));
            }
        }
        r.is_ok()
    }

    fn key(&mut self, key: &str) -> &mut KeyLog {
        self.keys.entry(key.as_bytes().to_vec()).or_default()
    }
}

const SETUP_KEYS: [&str; 3] = ["setup-0", "setup-1", "setup-2"];

/// A small Immediate workload that touches every write path: claim, checkpoint, complete,
/// release, run, and a lease left held. Returns the leases still held (drop them after
/// `close`, so that their drop queues nothing).
fn workload(engine: &Engine, log: &mut Log) -> Vec<Lease> {
    let mut held = Vec::new();
    for (i, key) in ["w0", "w1", "w2", "w3", "w5"].into_iter().enumerate() {
        log.key(key).claim_tried = true;
        let r = engine.claim(key.as_bytes(), &opts());
        if !log.note(&format!("claim {key}"), &r) {
            continue;
        }
        let Ok(Claim::Acquired(mut lease)) = r else {
            panic!("claim {key}: {r:?}")
        };
        log.key(key).claim_acked = true;
        log.max_token = log.max_token.max(lease.token());
        if i == 1 || i == 3 {
            let cp = format!("checkpoint of {key}").into_bytes();
            log.key(key).checkpoint = Some((i as u32, cp.clone()));
            let r = lease.set_checkpoint(i as u32, &cp);
            log.key(key).checkpoint_acked = log.note(&format!("checkpoint {key}"), &r);
        }
        match i {
            2 => {
                log.key(key).release_tried = true;
                let r = lease.release();
                log.key(key).release_acked = log.note(&format!("release {key}"), &r);
            }
            3 => held.push(lease),
            _ => {
                let response = response_for(key);
                log.key(key).response = Some(response.clone());
                let r = lease.complete(&response);
                log.key(key).complete_acked = log.note(&format!("complete {key}"), &r);
            }
        }
    }
    // `run`: a claim and a completion in one call.
    let response = response_for("w4");
    log.key("w4").claim_tried = true;
    let r = engine.run(b"w4", &opts(), |_lease| Ok::<_, ()>(response.clone()));
    match &r {
        Ok(out) => {
            assert_eq!(out.response(), response);
            let k = log.key("w4");
            k.claim_acked = true;
            k.response = Some(response.clone());
            k.complete_acked = true;
        }
        Err(RunError::Lease(_)) => {
            let k = log.key("w4");
            k.claim_acked = true;
            k.response = Some(response.clone());
        }
        Err(_) => {}
    }
    log.note("run w4", &r);
    let r = engine.flush();
    log.note("flush", &r);
    held
}

/// Checks a reopened engine against what the workload was told.
fn verify(engine: &Engine, log: &Log, token_next: u64, ctx: &str) {
    for key in SETUP_KEYS {
        expect_completed(engine, key.as_bytes(), &response_for(key));
    }
    for (key, k) in &log.keys {
        let state = engine.get(key).unwrap();
        let name = show(key);
        let ok = match &state {
            Some(KeyState::Completed {
                response, attempt, ..
            }) => k.response.as_deref() == Some(&response[..]) && *attempt == 1,
            Some(KeyState::InFlight {
                attempt,
                checkpoint,
                ..
            }) => {
                let cp_ok = match (checkpoint, &k.checkpoint) {
                    (None, _) => !k.checkpoint_acked,
                    (Some(c), Some((phase, data))) => c.phase() == *phase && c.data() == &data[..],
                    (Some(_), None) => false,
                };
                *attempt == 1 && cp_ok && k.claim_tried && !k.complete_acked && !k.release_acked
            }
            None => !k.claim_acked || (k.release_tried && !k.complete_acked),
            Some(other) => panic!("{ctx}: {name}: {other:?}"),
        };
        assert!(
            ok,
            "{ctx}: key {name}: state {state:?} contradicts {k:?} (log {log:?})"
        );
    }
    for key in ["never", "after"] {
        assert_eq!(engine.get(key.as_bytes()).unwrap(), None, "{ctx}: {key}");
    }
    let lease = acquire(engine, b"fresh");
    assert!(
        lease.token() > log.max_token && lease.token() >= token_next,
        "{ctx}: token {} after {} / next {token_next}",
        lease.token(),
        log.max_token
    );
    lease.complete(b"fresh").unwrap();
    engine.flush().unwrap();
}

/// An image holding the setup keys, completed and closed cleanly.
fn base_image() -> Vec<u8> {
    let backend = FaultyStorage::memory();
    let engine = open_backend(&backend, Durability::Immediate).unwrap();
    for key in SETUP_KEYS {
        complete_key(&engine, key.as_bytes(), &response_for(key));
    }
    engine.close().unwrap();
    drop(engine);
    backend.live_image()
}

/// The storage a workload's failures strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Struck {
    /// The file of an engine without a log: group commits are durable redb commits.
    UnloggedFile,
    /// The file of an engine with a commit log (the default), written by its applier.
    File,
    /// That engine's commit log.
    Log,
}

impl Struck {
    fn logged(self) -> bool {
        self != Struck::UnloggedFile
    }
}

/// The file and the commit log of a workload's engine.
struct Disks {
    file: FaultyStorage,
    log: FaultyStorage,
}

impl Disks {
    /// The storage `struck` names.
    fn struck(&self, struck: Struck) -> &FaultyStorage {
        match struck {
            Struck::Log => &self.log,
            _ => &self.file,
        }
    }
}

/// Opens an engine on the images `(file, log)`, logged when `struck` is.
fn reopen(struck: Struck, (file, log): &(Vec<u8>, Vec<u8>)) -> Result<Engine, OpenError> {
    let log = struck.logged().then(|| FaultyStorage::from_image(log));
    open_logged(&FaultyStorage::from_image(file), log.as_ref())
}

/// Runs the workload on `base` (with an empty log when `struck` is logged) with `arm`
/// applied to the struck storage after open; returns the log, the token mark the engine
/// reported last, and the storages.
fn run_armed(base: &[u8], struck: Struck, arm: impl FnOnce(&FaultyStorage)) -> (Log, u64, Disks) {
    let disks = Disks {
        file: FaultyStorage::from_image(base),
        log: FaultyStorage::memory(),
    };
    let engine = open_logged(&disks.file, struck.logged().then_some(&disks.log)).unwrap();
    let backend = disks.struck(struck);
    arm(backend);
    let mut log = Log::default();
    let held = workload(&engine, &mut log);
    let token_next = engine.stats().token_next;
    log.injected_before_close = backend.injected();
    let r = engine.close();
    if log.failed.is_none() {
        // A failure in the final commit is reported by close; nothing is acked after it.
        log.note("close", &r);
    }
    drop(held);
    drop(engine);
    (log, token_next, disks)
}

/// Under `Immediate` (the default), failures of the file's I/Os, which its applier makes.
#[test]
fn every_io_point_of_a_workload_can_fail() {
    every_io_point_can_fail(Struck::File);
}

/// Under `Immediate` (the default), failures of the commit log's I/Os.
#[test]
fn every_io_point_of_a_workload_log_can_fail() {
    every_io_point_can_fail(Struck::Log);
}

/// On a custom backend without a log, whose group commits are durable redb commits.
#[test]
fn every_io_point_of_an_unlogged_workload_can_fail() {
    every_io_point_can_fail(Struck::UnloggedFile);
}

/// Fails each write and each sync of the `struck` storage in turn (once; then with the disk
/// dead after it), and reopens the images a crash and a power loss leave: both storages'
/// live images, their durable ones (the log's taken first), and a torn one.
fn every_io_point_can_fail(struck: Struck) {
    let base = base_image();
    // A dry run counts the I/O the workload (and its close) makes after the arming point.
    let at_arm = std::cell::Cell::new((0, 0));
    let (log, _, dry) = run_armed(&base, struck, |b| at_arm.set((b.writes(), b.syncs())));
    assert!(log.failed.is_none(), "{log:?}");
    let dry = dry.struck(struck);
    let writes = dry.writes() - at_arm.get().0;
    let syncs = dry.syncs() - at_arm.get().1;
    assert!(writes > 0 && syncs > 0);
    eprintln!("{struck:?}: workload: {writes} writes, {syncs} syncs");

    let mut seen_failures = 0;
    let mut in_shutdown = 0;
    // Every point once; then, with the disk dead after the failure (sticky), every third.
    // Debug builds of redb are slow, so each run reopens only the images that matter most.
    for sticky in [false, true] {
        for fault in [Fault::Write, Fault::Sync] {
            let count = if fault == Fault::Write { writes } else { syncs };
            for n in (1..=count).filter(|n| !sticky || n % 3 == 1) {
                let (log, token_next, disks) = run_armed(&base, struck, |b| {
                    b.set_sticky(sticky);
                    match fault {
                        Fault::Write => b.fail_write_in(n),
                        Fault::Sync => b.fail_sync_in(n),
                    }
                });
                let backend = disks.struck(struck);
                let ctx = format!("{struck:?}: {fault:?} #{n} sticky={sticky}");
                assert!(log.acked_after_failure.is_empty(), "{ctx}: {log:?}");
                // With the log, the applier's file I/O follows real time: a late point may
                // never be reached.
                if backend.injected() == 0 && struck == Struck::File {
                    continue;
                }
                assert!(backend.injected() > 0, "{ctx}: nothing failed");
                if log.injected_before_close > 0 {
                    assert!(log.failed.is_some(), "{ctx}: the failure went unreported");
                } else {
                    // redb's own shutdown write failed after the last commit: nothing was
                    // lost, and `close` has nothing to report.
                    in_shutdown += 1;
                }
                seen_failures += u64::from(backend.injected() > 0);
                let (file, log_disk) = (&disks.file, &disks.log);
                let mut images = vec![("live", (file.live_image(), log_disk.live_image()))];
                if !sticky {
                    let log_image = log_disk.durable_image();
                    images.push(("durable", (file.durable_image(), log_image)));
                }
                if !sticky && n % 2 == 0 && backend.pending() > 1 {
                    // Power loss where a pseudo-random subset of the unsynced writes landed.
                    let keep = |i: usize| (i as u64 * 0x9E37_79B9 + n) % 3 != 0;
                    let log_image = log_disk.crash_image(keep);
                    images.push(("torn", (file.crash_image(keep), log_image)));
                }
                for (what, images) in images {
                    let ctx = format!("{ctx} {what} image");
                    let engine = reopen(struck, &images)
                        .unwrap_or_else(|e| panic!("{ctx}: reopen: {e} ({log:?})"));
                    verify(&engine, &log, token_next, &ctx);
                    engine.close().unwrap();
                }
            }
        }
    }
    eprintln!(
        "{struck:?}: {seen_failures} failures injected, {in_shutdown} of them in redb's shutdown"
    );
    assert!(
        seen_failures > 10,
        "{struck:?}: only {seen_failures} failures were injected"
    );
}

/// Each write and sync of an open and close in turn fails, of the file (with a commit log
/// and without) and of the log.
#[test]
fn every_io_point_of_open_can_fail() {
    let base = base_image();
    for struck in [Struck::UnloggedFile, Struck::File, Struck::Log] {
        let disks = |base: &[u8]| Disks {
            file: FaultyStorage::from_image(base),
            log: FaultyStorage::memory(),
        };
        let open = |d: &Disks| open_logged(&d.file, struck.logged().then_some(&d.log));
        let probe = disks(&base);
        open(&probe).unwrap().close().unwrap();
        let probe = probe.struck(struck);
        let (writes, syncs) = (probe.writes(), probe.syncs());
        for fault in [Fault::Write, Fault::Sync] {
            let count = if fault == Fault::Write { writes } else { syncs };
            for n in 1..=count {
                let d = disks(&base);
                let b = d.struck(struck);
                match fault {
                    Fault::Write => b.fail_write_in(n),
                    Fault::Sync => b.fail_sync_in(n),
                }
                let ctx = format!("open, {struck:?}: {fault:?} #{n}");
                if let Ok(engine) = open(&d) {
                    // The failure hit the engine's first commits or its close instead.
                    let _ = engine.close();
                }
                let durable = (d.file.durable_image(), d.log.durable_image());
                let live = (d.file.live_image(), d.log.live_image());
                for images in [durable, live] {
                    let engine =
                        reopen(struck, &images).unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
                    for key in SETUP_KEYS {
                        expect_completed(&engine, key.as_bytes(), &response_for(key));
                    }
                    engine.close().unwrap();
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Corrupted files
// ---------------------------------------------------------------------------------------

const CORRUPT_KEYS: usize = 12;

fn corrupt_response(i: usize) -> Vec<u8> {
    format!("<corruption-test response {i:02} {}>", "x".repeat(i * 7)).into_bytes()
}

fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

/// Writes an idemkv file with `CORRUPT_KEYS` completed keys and one InFlight key; returns
/// its bytes.
fn corruption_fixture(path: &Path) -> Vec<u8> {
    let engine = open_path(path).unwrap();
    for i in 0..CORRUPT_KEYS {
        complete_key(&engine, format!("c{i}").as_bytes(), &corrupt_response(i));
    }
    let held = acquire(&engine, b"inflight");
    engine.close().unwrap();
    drop(held);
    drop(engine);
    std::fs::read(path).unwrap()
}

#[test]
fn corrupted_file_is_refused_or_never_replays_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.redb");
    let original = corruption_fixture(&good);

    // Damage: one byte xor-ed with a mask (0xff or 0x01, alternating) at the redb header,
    // at three points of every non-empty 4 KiB page, and inside stored responses; plus the
    // header of the B-tree leaf holding the records (entry count, key and value offsets),
    // whose damage reaches deepest into redb.
    let mut positions: Vec<usize> = vec![0, 4, 8, 9, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64];
    positions.extend([100, 200, 256, 300, 400, 511, 512, 1000, 2048, 4095]);
    for (p, page) in original.chunks(4096).enumerate() {
        if let Some(first) = page.iter().position(|&b| b != 0) {
            let last = page.iter().rposition(|&b| b != 0).unwrap();
            positions.extend([first, (first + last) / 2, last].map(|o| p * 4096 + o));
        }
    }
    for i in 0..4 {
        for at in find_all(&original, &corrupt_response(i)) {
            positions.extend([at, at + 10]);
        }
    }
    let mut damage: Vec<(usize, u8)> = positions
        .iter()
        .enumerate()
        .map(|(n, &pos)| (pos, if n % 2 == 0 { 0xff } else { 0x01 }))
        .collect();
    // Page-relative spots where redb keeps counts, offsets and allocator bitmaps in this
    // file's layout (found with IDEMKV_FAULTS_EXHAUSTIVE), with both masks, on every page.
    for (p, page) in original.chunks(4096).enumerate() {
        if page.iter().any(|&b| b != 0) {
            for o in [2, 28, 29, 130, 266, 289, 313] {
                damage.extend([(p * 4096 + o, 0xff), (p * 4096 + o, 0x01)]);
            }
        }
    }
    // The live leaf holds every response (older copies of it hold fewer).
    let leaf = (0..original.len() / 4096)
        .max_by_key(|&p| {
            let page = &original[p * 4096..(p + 1) * 4096];
            let held = (0..CORRUPT_KEYS)
                .filter(|&i| !find_all(page, &corrupt_response(i)).is_empty())
                .count();
            (held, p)
        })
        .unwrap()
        * 4096;
    damage.push((leaf, 0x01));
    damage.extend((leaf..leaf + 160).map(|pos| (pos, 0xff)));
    // A damaged live response must be refused: its record fails its checksum.
    let mut must_refuse = std::collections::BTreeSet::new();
    for i in (0..CORRUPT_KEYS).step_by(3) {
        let page = &original[leaf..leaf + 4096];
        for at in find_all(page, &corrupt_response(i)) {
            must_refuse.extend([leaf + at + 1, leaf + at + 20]);
        }
    }
    damage.extend(must_refuse.iter().map(|&pos| (pos, 0x01)));
    // IDEMKV_FAULTS_EXHAUSTIVE=<step>: every step-th byte of every non-empty page instead
    // (slow; for hunting, best with --release).
    if let Some(step) = std::env::var("IDEMKV_FAULTS_EXHAUSTIVE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        damage.clear();
        for (p, page) in original.chunks(4096).enumerate() {
            if let Some(first) = page.iter().position(|&b| b != 0) {
                let last = page.iter().rposition(|&b| b != 0).unwrap();
                for (n, o) in (first..=last).step_by(step.max(1)).enumerate() {
                    damage.push((p * 4096 + o, if n % 2 == 0 { 0xff } else { 0x01 }));
                }
            }
        }
    }
    damage.retain(|&(p, _)| p < original.len());
    damage.sort_unstable();
    damage.dedup();

    let hunting = std::env::var_os("IDEMKV_FAULTS_EXHAUSTIVE").is_some();
    let bad = dir.path().join("bad.redb");
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut problems = Vec::new();
    for &(pos, mask) in &damage {
        {
            let mut bytes = original.clone();
            bytes[pos] ^= mask;
            std::fs::write(&bad, &bytes).unwrap();
            let ctx = format!("offset {pos} xor {mask:#04x}");
            if hunting {
                eprintln!("trying {ctx}"); // an abort (not a panic) names its culprit
            }
            let run = catch_unwind(AssertUnwindSafe(|| {
                let r = Engine::builder().path(&bad).clock(MockClock::new()).open();
                let engine = match r {
                    Ok(engine) => engine,
                    Err(e) => {
                        let kind = match e {
                            OpenError::Corrupted { .. } => "Corrupted",
                            OpenError::Foreign { .. } => "Foreign",
                            OpenError::HeaderDamaged { .. } => "HeaderDamaged",
                            OpenError::Io(_) => "Io",
                            _ => "other",
                        };
                        return Err(format!("{kind}: {e}"));
                    }
                };
                let mut missing = 0;
                for i in 0..CORRUPT_KEYS {
                    let key = format!("c{i}");
                    match engine.get(key.as_bytes()) {
                        Ok(Some(KeyState::Completed { response, .. })) => {
                            assert_eq!(&response[..], corrupt_response(i), "{key}: wrong bytes")
                        }
                        Ok(None) => missing += 1,
                        other => panic!("{key}: {other:?}"),
                    }
                }
                // The engine must keep working or fail cleanly (a write may hit the damage).
                if let Ok(Claim::Acquired(lease)) = engine.claim(b"new", &opts()) {
                    let _ = lease.complete(b"new");
                }
                let _ = engine.flush();
                let _ = engine.close();
                Ok(missing)
            }));
            match run {
                Ok(Ok(_)) if must_refuse.contains(&pos) => {
                    problems.push(format!("{ctx}: a damaged live response was accepted"));
                }
                Ok(Ok(0)) => *outcomes.entry("opened intact".into()).or_default() += 1,
                Ok(Ok(missing)) => {
                    *outcomes
                        .entry("opened, records missing".into())
                        .or_default() += 1;
                    problems.push(format!("{ctx}: opened, but {missing} records vanished"));
                }
                Ok(Err(kind)) => {
                    let short = kind.split(':').next().unwrap().to_string();
                    if short == "Io" || short == "other" {
                        problems.push(format!("{ctx}: unexpected error {kind}"));
                    }
                    *outcomes.entry(short).or_default() += 1;
                }
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    problems.push(format!("{ctx}: PANIC escaped: {msg}"));
                }
            }
        }
    }
    eprintln!(
        "corruption outcomes over {} damages: {outcomes:?}",
        damage.len()
    );
    for p in &problems {
        eprintln!("note: {p}");
    }
    // Every problem fails the test: an escaped panic; an error that does not say "corrupted"
    // (or "foreign"); or a file that opens while acknowledged records silently vanished (a
    // duplicate of such a key would run its side effect again).
    let mut kinds: BTreeMap<&str, (usize, &String)> = BTreeMap::new();
    for p in &problems {
        let kind = ["PANIC escaped", "unexpected error", "vanished", "accepted"]
            .into_iter()
            .find(|k| p.contains(k))
            .unwrap_or("other");
        kinds.entry(kind).or_insert((0, p)).0 += 1;
    }
    assert!(
        problems.is_empty(),
        "{} problems; count and first example of each kind: {kinds:#?}",
        problems.len()
    );
    assert!(!must_refuse.is_empty(), "no live response found");
}

/// redb keeps each table's entry count in the table's definition. A damaged count must give
/// an error (or be ignored), never a panic or an abort (an allocation failure aborts the whole
/// process, so each open runs in a child process: this test binary, re-run on this test).
#[test]
fn damaged_table_length_never_aborts() {
    const CHILD: &str = "IDEMKV_FAULTS_CHILD_OPEN";
    if let Some(path) = std::env::var_os(CHILD) {
        let r = catch_unwind(|| {
            let engine = Engine::builder()
                .path(&path)
                .clock(MockClock::new())
                .open()?;
            let mut found = 0;
            for i in 0..CORRUPT_KEYS {
                if let Ok(Some(KeyState::Completed { response, .. })) =
                    engine.get(format!("c{i}").as_bytes())
                {
                    assert_eq!(&response[..], corrupt_response(i), "wrong bytes replayed");
                    found += 1;
                }
            }
            let _ = engine.close();
            Ok::<_, OpenError>(found)
        });
        match r {
            Ok(Ok(found)) => println!("CHILD-RESULT: opened, {found} records"),
            Ok(Err(e)) => println!("CHILD-RESULT: error: {e}"),
            Err(_) => println!("CHILD-RESULT: PANIC escaped"),
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.redb");
    let original = corruption_fixture(&good);
    // The chunks table's definition: type byte 3 (a normal table), the count (of chunks) as a
    // u64, then the B-tree header (root page, checksum, and the count again). Damage both
    // counts.
    let chunks = {
        use redb::{ReadableDatabase, ReadableTableMetadata};
        let db = redb::Database::open(&good).unwrap();
        let txn = db.begin_read().unwrap();
        let def = redb::TableDefinition::<u64, &[u8]>::new("idemkv_chunks");
        txn.open_table(def).unwrap().len().unwrap()
    };
    assert!(chunks > 0);
    let count = chunks.to_le_bytes();
    let mut pattern = vec![3u8];
    pattern.extend_from_slice(&count);
    let mut at = Vec::new();
    for (p, page) in original.chunks(4096).enumerate() {
        if !find_all(page, b"idemkv_chunks").is_empty() {
            for def in find_all(page, &pattern) {
                let end = (def + 64).min(page.len());
                let counts = find_all(&page[def..end], &count);
                at.extend(counts.iter().map(|o| p * 4096 + def + o));
            }
        }
    }
    assert!(at.len() >= 2, "chunks table definition not found");
    let mut problems = Vec::new();
    // Byte 4: a count of ~2^40; byte 7: ~2^63. (Not smaller: a count of ~2^32 that an engine
    // believed could make it allocate, and touch, gigabytes before failing.)
    for byte in [4usize, 7] {
        let mut bytes = original.clone();
        for &a in &at {
            bytes[a + byte] ^= 0xff;
        }
        let bad = dir.path().join(format!("count-{byte}.redb"));
        std::fs::write(&bad, &bytes).unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "damaged_table_length_never_aborts",
                "--exact",
                "--nocapture",
            ])
            .env(CHILD, &bad)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let result = stdout
            .lines()
            .find(|l| l.starts_with("CHILD-RESULT"))
            .map(str::to_string);
        match result {
            Some(r) if out.status.success() && !r.contains("PANIC") => {
                eprintln!("count byte {byte}: {r}")
            }
            _ => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let why = stderr
                    .lines()
                    .find(|l| l.contains("memory allocation") || l.contains("panicked"))
                    .unwrap_or("");
                problems.push(format!(
                    "count byte {byte} (offsets {at:?}): {:?}, {}: {why}",
                    out.status,
                    result.unwrap_or_else(|| "no result (the process died)".into())
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

// ---------------------------------------------------------------------------------------
// Foreign files
// ---------------------------------------------------------------------------------------

#[test]
fn foreign_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<u8>); 4] = [
        (
            "random",
            (0..64 * 1024u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
                .collect(),
        ),
        ("text", b"order-42,charged\norder-43,refunded\n".repeat(100)),
        ("short", b"redb".to_vec()),
        ("one byte", vec![0x42]),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(format!("{}.redb", name.replace(' ', "_")));
        std::fs::write(&path, &bytes).unwrap();
        match open_path(&path) {
            Err(OpenError::Foreign { .. }) => {}
            other => panic!("{name}: expected Foreign, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{name}: the file was changed"
        );
    }

    // A valid redb file of another application.
    const USERS: TableDefinition<&str, u64> = TableDefinition::new("users");
    let path = dir.path().join("other-app.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(USERS).unwrap().insert("alice", 42).unwrap();
        txn.commit().unwrap();
    }
    let r = Engine::builder().path(&path).open();
    assert!(matches!(r, Err(OpenError::Foreign { .. })), "{r:?}");
    // Nothing of the other application's data was touched.
    let db = redb::Database::create(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let tables: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| redb::TableHandle::name(&t).to_string())
        .collect();
    assert_eq!(tables, vec!["users".to_string()]);
    assert_eq!(
        txn.open_table(USERS)
            .unwrap()
            .get("alice")
            .unwrap()
            .unwrap()
            .value(),
        42
    );
    drop(txn);
    drop(db);

    // The same, given through a storage backend.
    let b = FaultyStorage::file(&path).unwrap();
    let r = open_backend(&b, Durability::Immediate);
    assert!(matches!(r, Err(OpenError::Foreign { .. })), "{r:?}");
}

// ---------------------------------------------------------------------------------------
// One engine per file
// ---------------------------------------------------------------------------------------

#[test]
fn second_open_of_one_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.redb");
    let first = open_path(&path).unwrap();
    complete_key(&first, b"k", b"v");
    for attempt in 0..2 {
        match open_path(&path) {
            Err(OpenError::AlreadyOpen { path: p }) => assert_eq!(p, path),
            other => panic!("attempt {attempt}: expected AlreadyOpen, got {other:?}"),
        }
    }
    // Through a backend that delegates redb's locks to the file.
    let r = Engine::builder()
        .path(&path)
        .backend(FaultyStorage::file(&path).unwrap())
        .open();
    assert!(matches!(r, Err(OpenError::AlreadyOpen { .. })), "{r:?}");
    // The refused opens did not disturb the first engine.
    complete_key(&first, b"k2", b"v2");
    first.close().unwrap();
    drop(first);

    let second = open_path(&path).unwrap();
    expect_completed(&second, b"k", b"v");
    expect_completed(&second, b"k2", b"v2");
    // Dropping the last handle also releases the file.
    drop(second);
    let third = open_path(&path).unwrap();
    expect_completed(&third, b"k2", b"v2");
    third.close().unwrap();
}

// ---------------------------------------------------------------------------------------
// A stalled writer: claims are refused first, holders keep their headroom
// ---------------------------------------------------------------------------------------

#[test]
fn stalled_writer_refuses_claims_and_completions_wait_for_room() {
    const DEPTH: usize = 16;
    let backend = FaultyStorage::memory();
    let engine = Engine::builder()
        .backend(backend.clone())
        .durability(Durability::buffered())
        .tuning(idemkv::Tuning::default().queue_depth(DEPTH))
        .clock(MockClock::new())
        .open()
        .unwrap();
    complete_key(&engine, b"before", b"b");
    engine.flush().unwrap();

    let gate = backend.close_gate();
    let mut leases = vec![acquire(&engine, b"q0")];
    common::wait_sync_held(&backend); // the writer is stuck committing q0
    let refused = loop {
        let key = format!("q{}", leases.len());
        match engine.claim(key.as_bytes(), &opts()) {
            Ok(Claim::Acquired(lease)) => leases.push(lease),
            Err(ClaimError::Overloaded(Limit::WriterQueue)) => break key,
            other => panic!("{key}: {other:?}"),
        }
        assert!(leases.len() <= DEPTH + 1, "claims were never refused");
    };
    // Seven eighths of the queue (14 of 16) took claims. `Buffered` admits by what is not yet
    // durable, so the one the writer is committing counts among them.
    assert_eq!(leases.len(), DEPTH - DEPTH / 8, "claims accepted");
    assert!(engine.stats().overloaded >= 1);
    assert_eq!(
        engine.get(refused.as_bytes()).unwrap(),
        None,
        "a refused claim changes nothing"
    );
    // Replays and reads need no queue.
    assert!(matches!(
        engine.claim(b"before", &opts()),
        Ok(Claim::Completed(_))
    ));

    // Holders complete in the headroom at once; past it, a completion waits for room in
    // the queue (while its lease lasts) instead of failing.
    let mut completed = Vec::new();
    for lease in leases.drain(..DEPTH / 8) {
        let key = lease.key().to_vec();
        lease.complete(&response_for(&show(&key))).unwrap();
        completed.push(key);
    }
    let waiting: Vec<Vec<u8>> = leases.iter().map(|l| l.key().to_vec()).collect();
    let finisher = std::thread::spawn(move || {
        for lease in leases {
            let key = lease.key().to_vec();
            lease.complete(&response_for(&show(&key))).unwrap();
        }
    });
    // While the writer is stalled, a waiting holder still owns its key.
    assert!(matches!(
        engine.claim(&waiting[0], &opts()),
        Ok(Claim::InProgress(_))
    ));

    drop(gate); // the writer drains
    finisher.join().unwrap();
    completed.extend(waiting);
    engine.flush().unwrap();
    assert_eq!(engine.stats().queue_depth, 0);
    let lease = acquire(&engine, refused.as_bytes());
    lease.complete(&response_for(&refused)).unwrap();
    completed.push(refused.into_bytes());
    engine.flush().unwrap();
    for key in &completed {
        expect_completed(&engine, key, &response_for(&show(key)));
    }
    assert_eq!(engine.stats().queue_depth, 0);
    assert!(!engine.stats().poisoned);
    // After a flush, a power loss keeps everything.
    let image = backend.durable_image();
    engine.close().unwrap();
    drop(engine);
    let engine = open_backend(&FaultyStorage::from_image(&image), Durability::buffered()).unwrap();
    expect_completed(&engine, b"before", b"b");
    for key in &completed {
        expect_completed(&engine, key, &response_for(&show(key)));
    }
    engine.close().unwrap();
}

// ---------------------------------------------------------------------------------------
// What a power loss may take from an acknowledged claim.
// ---------------------------------------------------------------------------------------

/// What survives a power loss now: the disk's durable image, reopened.
fn after_power_loss(backend: &FaultyStorage) -> Engine {
    open_backend(
        &FaultyStorage::from_image(backend.durable_image()),
        Durability::Immediate,
    )
    .unwrap_or_else(|e| panic!("reopen after the power loss: {e}"))
}

/// Runs `call` on another thread and returns its result, or `None` if it is still running
/// once a sync is blocked at `backend`'s gate (closed by the caller). The thread is left to
/// finish when the gate opens; `rx` then yields its result.
fn call_with_sync_held<T: Send + 'static>(
    backend: &FaultyStorage,
    call: impl FnOnce() -> T + Send + 'static,
) -> (Option<T>, std::sync::mpsc::Receiver<T>) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(call());
    });
    common::wait_sync_held(backend);
    (rx.try_recv().ok(), rx)
}

/// A hang detector, not a pace: how long a call that must not wait for a sync may take.
const RETURN_WITHIN: Duration = Duration::from_secs(10);

/// A claim is acknowledged only after its record is fsynced, so an acknowledged claim survives a power loss at any moment after it returned,
/// and a retry after the restart takes the key over (attempt 2).
#[test]
fn a_durable_claim_survives_a_power_loss_once_acknowledged() {
    let backend = FaultyStorage::memory();
    let engine = open_backend(&backend, Durability::Immediate).unwrap();
    complete_key(&engine, b"before", b"kept");
    let gate = backend.close_gate();
    let e = engine.clone();
    let (early, rx) = call_with_sync_held(&backend, move || e.claim(b"k", &opts()));
    assert!(
        early.is_none(),
        "a durable claim returned while its fsync was held: {early:?}"
    );
    drop(gate);
    let lease = acquired(rx.recv_timeout(RETURN_WITHIN).expect("claim").unwrap());
    let reopened = after_power_loss(&backend);
    match reopened.get(b"k").unwrap() {
        Some(KeyState::InFlight { token, attempt, .. }) => {
            assert_eq!((token, attempt), (lease.token(), 1))
        }
        other => panic!("the acknowledged claim is {other:?} after the power loss"),
    }
    let retry = acquired(reopened.claim(b"k", &opts()).unwrap());
    assert_eq!(retry.attempt(), 2, "a retry after the crash is a takeover");
    assert!(retry.token() > lease.token());
    drop(retry);
    reopened.close().unwrap();
    drop(lease);
    engine.close().unwrap();
}
