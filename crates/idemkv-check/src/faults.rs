//! `storage_faults`: a workload against an engine on a [`FaultyStorage`] that fails or loses power
//! at its Nth I/O, then a reopen and the checks of invariants 2, 4 and 5 of docs/design.md:
//!
//! - the reopened file holds exactly the records of some prefix of the submitted writes
//!   (nothing never submitted appears, and writes are never reordered);
//! - that prefix contains every acknowledged write (`Immediate`: every call that returned
//!   `Ok`; `Buffered`: everything before a successful `flush`, and every completion another
//!   call was shown), so at most the writes after the last acknowledged one differ;
//! - the next token issued after the reopen is above every token issued before the crash.
//!
//! Under `Immediate` the engine runs as by default: its group commits are made durable by
//! the commit log (a second [`FaultyStorage`], on the file's power), and its applier takes
//! them to the file. A fault strikes either storage; [`Mode::unlogged`] runs the other
//! durable path, a custom backend without a log (group commits are durable redb commits).
//!
//! [`exhaustive`] runs a workload once to count its I/Os, then once per I/O point of each
//! storage and fault kind: power loss with only the synced bytes, power loss with every
//! unsynced write too, and a failing call that the process survives.

use crate::ops::{self, call, Call, Model, Op};
use crate::spec::{KeyModel, KeyOp, KeyRet};
use crate::Bug;
use arbitrary::Arbitrary;
use idemkv::admin::{RecordInfo, RecordInfoState};
use idemkv::fault::{Fault, FaultyStorage, WithStorage};
use idemkv::{Claim, ClaimError, ClaimOptions, Durability, LeaseError, MockClock};
use std::collections::BTreeMap;
use std::time::Duration;

/// Most operations of a fault case.
pub const OPS_MAX: usize = 24;

/// The engine configuration of a fault run: its durability mode, and whether it is given a
/// commit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// The durability mode.
    pub durability: Durability,
    /// Whether the engine gets a log storage (`EngineBuilder::log_backend`); only
    /// `Immediate` writes a log.
    pub logged: bool,
}

impl Mode {
    /// Whether an acknowledged call is durable when it returns.
    fn acknowledges_durably(self) -> bool {
        self.durability == Durability::Immediate
    }

    /// `durability` on a custom backend without a log: under `Immediate`, group commits are
    /// durable redb commits (the path of custom backends, and of a disk without room for
    /// the log).
    pub fn unlogged(durability: Durability) -> Mode {
        Mode {
            durability,
            logged: false,
        }
    }
}

impl From<Durability> for Mode {
    /// The default configuration: `Immediate` is logged.
    fn from(durability: Durability) -> Mode {
        Mode {
            durability,
            logged: durability == Durability::Immediate,
        }
    }
}

/// One storage of a fault run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disk {
    /// The redb file.
    File,
    /// The commit log.
    Log,
}

/// Which storage a fuzzed case's fault strikes, and so which `Immediate` path it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Struck {
    /// The file of the default configuration (logged under `Immediate`).
    File,
    /// The commit log under `Immediate` (under `Buffered`, which writes none: the file).
    Log,
    /// The file of an engine without a log ([`Mode::unlogged`]).
    UnloggedFile,
}

/// A fuzzed fault case.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub struct FaultCase {
    /// `Immediate` (otherwise `Buffered`).
    pub immediate: bool,
    /// The workload (`Restart` acts as `Flush`).
    pub ops: Vec<Op>,
    /// The I/O at which the fault strikes: `at % 512 + 1` (past the end of the run: no fault).
    pub at: u16,
    /// Power loss (otherwise one failing call).
    pub power_loss: bool,
    /// After a power loss, which unsynced writes reached the disk (bit i: the i-th, cycling).
    pub keep: u64,
    /// The storage the fault strikes. Drawn last, so that inputs written before it existed
    /// decode as before (with the fault on the file).
    pub struck: Struck,
}

/// The durable part of one key's record, as compared after a reopen.
#[derive(Debug, Clone)]
pub struct DurableRec {
    /// Token.
    pub token: u64,
    /// Fingerprint.
    pub fingerprint: Option<u128>,
    /// Attempt.
    pub attempt: u32,
    /// InFlight with this checkpoint, or Completed with (response, wall end of retention).
    pub state: DurableState,
    /// For an InFlight record of the model: the wall-clock instant (ms) from which recovery
    /// deletes it as an abandoned claim past its reap instant. Not compared.
    pub reap_wall_ms: Option<u64>,
}

impl PartialEq for DurableRec {
    fn eq(&self, other: &Self) -> bool {
        (self.token, self.fingerprint, self.attempt, &self.state)
            == (other.token, other.fingerprint, other.attempt, &other.state)
    }
}

impl Eq for DurableRec {}

/// The state part of a [`DurableRec`]: `Ok(checkpoint)` for InFlight, `Err((response,
/// wall end of retention in ms))` for Completed.
pub type DurableState = Result<Option<(u32, Vec<u8>)>, (Vec<u8>, u64)>;

/// A durable image as a map from key to record.
pub type DurableView = BTreeMap<Vec<u8>, DurableRec>;

fn view_of_model(model: &Model) -> DurableView {
    let retention_ms = model.cfg.retention_ns / 1_000_000;
    let mut v = DurableView::new();
    for (key, spec) in &model.keys {
        let rec = match &spec.state {
            // A marker holds no record (these runs keep no markers).
            KeyModel::Absent | KeyModel::Forgotten { .. } => continue,
            KeyModel::InFlight {
                token,
                fingerprint,
                attempt,
                checkpoint,
                lease_wall_ms,
                retention_ms: own,
                ..
            } => DurableRec {
                token: *token,
                fingerprint: fingerprint.map(u128::from),
                attempt: *attempt,
                state: Ok(checkpoint.clone()),
                reap_wall_ms: Some(lease_wall_ms.saturating_add(own.unwrap_or(retention_ms))),
            },
            KeyModel::Completed {
                token,
                fingerprint,
                attempt,
                response,
                expires_wall_ms,
                ..
            } => DurableRec {
                token: *token,
                fingerprint: fingerprint.map(u128::from),
                attempt: *attempt,
                state: Err((response.clone(), *expires_wall_ms)),
                reap_wall_ms: None,
            },
        };
        v.insert(key.clone(), rec);
    }
    v
}

fn view_of_records(records: &[RecordInfo]) -> Result<DurableView, String> {
    let mut v = DurableView::new();
    for r in records {
        let state = match &r.state {
            RecordInfoState::InFlight { checkpoint, .. } => Ok(checkpoint.clone()),
            RecordInfoState::Completed {
                response,
                expires_at,
                ..
            } => Err((response.clone(), crate::wall_ms(*expires_at))),
            #[allow(unreachable_patterns)]
            other => return Err(format!("unknown record state {other:?}")),
        };
        let rec = DurableRec {
            token: r.token,
            fingerprint: r.fingerprint,
            attempt: r.attempt,
            state,
            reap_wall_ms: None,
        };
        if v.insert(r.key.clone(), rec).is_some() {
            return Err(format!("key {:?} listed twice", r.key));
        }
    }
    Ok(v)
}

/// Whether recovery keeps `r` at `wall_ms`: it deletes completions past their retention
/// and abandoned claims past their reap instant.
fn kept(r: &DurableRec, wall_ms: u64) -> bool {
    !matches!(&r.state, Err((_, exp)) if *exp <= wall_ms)
        && r.reap_wall_ms.is_none_or(|reap| reap > wall_ms)
}

/// `v` without what recovery deletes at `wall_ms` ([`kept`]).
fn unexpired(v: &DurableView, wall_ms: u64) -> DurableView {
    v.iter()
        .filter(|(_, r)| kept(r, wall_ms))
        .map(|(k, r)| (k.clone(), r.clone()))
        .collect()
}

/// Whether the reopened file `found` is the durable `view` at `wall_ms`.
fn matches_view(view: &DurableView, found: &DurableView, wall_ms: u64) -> bool {
    unexpired(view, wall_ms) == *found
}

/// What one fault run saw.
#[derive(Debug, Clone, Default)]
pub struct FaultRun {
    /// I/Os the run made on the file before the reopen.
    pub ios: u64,
    /// I/Os the run made on the commit log before the reopen.
    pub log_ios: u64,
    /// Whether the fault struck.
    pub struck: bool,
    /// Writes submitted, and the prefix length the reopened file matched.
    pub submitted: usize,
    /// Prefix length matched.
    pub matched: usize,
    /// Writes known durable before the crash.
    pub floor: usize,
    /// Writes up to the last one a call returned `Ok` for (in-doubt writes excluded).
    pub acked: usize,
}

/// Runs `ops` in `mode` on a disk armed with `fault`, then reopens and checks. `keep`
/// chooses which unsynced writes survive a power loss.
pub fn run(
    mode: impl Into<Mode>,
    ops_in: &[Op],
    fault: Option<(Disk, Fault)>,
    keep: impl FnMut(usize) -> bool,
) -> Result<FaultRun, String> {
    run_with(mode, ops_in, fault, keep, Bug::None)
}

/// [`run`] with `bug` armed in the engine that runs the workload (the reopened engine is
/// sound): for showing that these checks catch it.
pub fn run_with(
    mode: impl Into<Mode>,
    ops_in: &[Op],
    fault: Option<(Disk, Fault)>,
    mut keep: impl FnMut(usize) -> bool,
    bug: Bug,
) -> Result<FaultRun, String> {
    let setup: Mode = mode.into();
    let mode = setup.durability;
    let clock = MockClock::new();
    let disk = FaultyStorage::memory();
    let log_disk = FaultyStorage::memory();
    log_disk.share_power(&disk);
    match fault {
        Some((Disk::File, f)) => disk.set_fault(Some(f)),
        Some((Disk::Log, f)) => log_disk.set_fault(Some(f)),
        None => {}
    }
    let struck_now = || disk.struck_at().is_some() || log_disk.struck_at().is_some();
    let mut model = Model::new(ops::spec_config(mode), &clock);
    // Durable views after each submitted write; [0] is the empty file.
    let mut views: Vec<DurableView> = vec![DurableView::new()];
    let mut floor = 0usize;
    let mut acked = 0usize;
    // For Buffered: the view index at which each completion (by token) was submitted.
    let mut completion_at: BTreeMap<u64, usize> = BTreeMap::new();
    let mut token_next = 1u64;
    let mut log: Vec<String> = Vec::new();
    let opened = crate::armed(builder(setup, &clock, &disk, &log_disk), bug).open();
    if let Ok(engine) = &opened {
        for op in ops_in.iter().take(OPS_MAX) {
            token_next = token_next.max(engine.stats().token_next);
            let op = match op {
                Op::Restart { .. } => &Op::Flush,
                other => other,
            };
            let (key, kop, ret) = match call(engine, &model, op) {
                Call::Key { key, op, ret } => (key, op, ret),
                Call::Advance(d) => {
                    clock.advance(d);
                    model.advance(d);
                    continue;
                }
                Call::Flush | Call::Restart { .. } => match engine
                    .admin()
                    .sweep_now()
                    .map_err(|e| e.to_string())
                    .and_then(|_| engine.flush().map_err(|e| e.to_string()))
                {
                    Ok(()) => {
                        floor = views.len() - 1;
                        model.flushed();
                        log.push("flush -> Ok".into());
                        continue;
                    }
                    Err(e) => {
                        log.push(format!("flush -> {e}"));
                        break;
                    }
                },
            };
            log.push(format!(
                "{:?} {kop:?} -> {ret:?}",
                String::from_utf8_lossy(&key)
            ));
            if key.is_empty() || key.len() > ops::KEY_LEN_MAX {
                continue;
            }
            // A call the failure cut short: the engine refuses everything from now on.
            let (in_doubt, stop) = match &ret {
                KeyRet::ClaimErr(ClaimError::OutcomeUnknown(_))
                | KeyRet::LeaseErr(LeaseError::OutcomeUnknown(_)) => (true, true),
                KeyRet::ClaimErr(ClaimError::Poisoned(_) | ClaimError::Closed)
                | KeyRet::LeaseErr(LeaseError::Poisoned(_) | LeaseError::Closed) => (false, true),
                _ => (false, false),
            };
            let before = model.key(&key);
            if in_doubt {
                // The write was queued: assume it succeeded, as the spec says it would.
                let assumed = match &kop {
                    KeyOp::Claim { .. } => {
                        let attempt = match before.visible() {
                            KeyModel::InFlight { attempt, .. } => attempt.saturating_add(1),
                            _ => 1,
                        };
                        let checkpoint = match before.visible() {
                            KeyModel::InFlight { checkpoint, .. } => checkpoint.clone(),
                            _ => None,
                        };
                        KeyRet::Acquired {
                            token: token_next,
                            attempt,
                            checkpoint,
                        }
                    }
                    KeyOp::Release { .. } => KeyRet::Released(true),
                    _ => KeyRet::Done,
                };
                model
                    .step(&key, &kop, &assumed)
                    .map_err(|e| format!("the in-doubt call is not one the model allows: {e}"))?;
                views.push(view_of_model(&model));
                break;
            }
            if stop {
                break;
            }
            model
                .step(&key, &kop, &ret)
                .map_err(|e| format!("before the crash: {e}\nsteps:\n  {}", log.join("\n  ")))?;
            let after = model.key(&key);
            let wrote = match (&kop, &ret) {
                (KeyOp::Claim { .. }, KeyRet::Acquired { .. }) => true,
                (KeyOp::Complete { .. }, KeyRet::Done) => {
                    before.state != after.state && matches!(before.state, KeyModel::InFlight { .. })
                }
                (KeyOp::Release { .. }, KeyRet::Released(true)) => true,
                (KeyOp::Extend { .. } | KeyOp::Checkpoint { .. }, KeyRet::Done) => true,
                _ => false,
            };
            if wrote {
                views.push(view_of_model(&model));
                acked = views.len() - 1;
                if let (KeyOp::Complete { token, .. }, true) =
                    (&kop, matches!(before.state, KeyModel::InFlight { .. }))
                {
                    completion_at.insert(*token, views.len() - 1);
                }
                // A durable acknowledgement covers every write queued before it too (the
                // writer's watermark), so the floor moves over the whole prefix.
                if setup.acknowledges_durably() {
                    floor = views.len() - 1;
                }
            }
            // Buffered: a completion shown to a caller is durable, with everything before it.
            let shown = match &ret {
                KeyRet::Replayed { token, .. } => Some(*token),
                KeyRet::Got(Some(crate::spec::GotState::Completed { token, .. })) => Some(*token),
                _ => None,
            };
            if let Some(at) = shown.and_then(|t| completion_at.get(&t)) {
                floor = floor.max(*at);
            }
        }
        token_next = token_next.max(engine.stats().token_next);
    }
    // Crash: a power loss freezes the disk where it struck; a process that survived a
    // failing call, or that never saw one, closes (a poisoned engine writes nothing more).
    // The storages share the power, so after a power loss neither changes any more: their
    // images are of one instant (the log's taken first, as a copy of a live machine would).
    let power_loss = matches!(fault, Some((_, Fault::PowerLoss { .. })));
    if !(power_loss && struck_now()) {
        if let Ok(engine) = &opened {
            let closed = engine.close();
            if !struck_now() {
                closed.map_err(|e| format!("close without a fault failed: {e}"))?;
            }
        }
    }
    let struck = struck_now();
    if !struck && opened.is_ok() {
        floor = views.len() - 1;
    }
    let (log_image, image) = if power_loss && struck {
        (log_disk.crash_image(&mut keep), disk.crash_image(&mut keep))
    } else {
        (log_disk.live_image(), disk.live_image())
    };
    if let Ok(engine) = &opened {
        let _ = engine.close();
    }
    drop(opened);
    let (ios, log_ios) = (disk.ios(), log_disk.ios());
    // Reopen and compare.
    // (A higher in-flight limit, so that the fresh claim below is never refused.)
    let reopened = match builder(
        setup,
        &clock,
        &FaultyStorage::from_image(image),
        &FaultyStorage::from_image(log_image),
    )
    .inflight_max(1 << 10)
    .open()
    {
        Ok(e) => e,
        Err(e) => {
            return Err(format!(
                "reopen failed: {e}\nsteps:\n  {}",
                log.join("\n  ")
            ))
        }
    };
    let wall_ms = crate::wall_ms(idemkv::Clock::wall(&clock));
    let found = view_of_records(&reopened.admin().records())?;
    let matched = (floor..views.len())
        .rev()
        .find(|&j| matches_view(&views[j], &found, wall_ms));
    let Some(matched) = matched else {
        let candidates: Vec<String> = (floor..views.len())
            .map(|j| format!("  after write {j}: {:?}", unexpired(&views[j], wall_ms)))
            .collect();
        return Err(format!(
            "after the reopen the file holds {found:?}\nwhich is no allowed prefix (writes {floor}..={} of the submitted ones):\n{}\nsteps:\n  {}",
            views.len() - 1,
            candidates.join("\n"),
            log.join("\n  ")
        ));
    };
    // Tokens never go backwards, even those issued but never made durable.
    let fresh = reopened
        .claim(b"fresh-after-reopen", &ClaimOptions::default())
        .map_err(|e| format!("claim after the reopen failed: {e}"))?;
    match fresh {
        Claim::Acquired(lease) => {
            if lease.token() < token_next {
                return Err(format!(
                    "token {} issued after the reopen, but tokens up to {} were issued before the crash",
                    lease.token(),
                    token_next - 1
                ));
            }
            lease
                .complete(b"ok")
                .map_err(|e| format!("complete after the reopen failed: {e}"))?;
        }
        other => return Err(format!("claim of a fresh key after the reopen: {other:?}")),
    }
    reopened
        .close()
        .map_err(|e| format!("close after the reopen failed: {e}"))?;
    Ok(FaultRun {
        ios,
        log_ios,
        struck,
        submitted: views.len() - 1,
        matched,
        floor,
        acked,
    })
}

/// A case of [`OPS_MAX`] operations with its fault among the first 256 I/Os, drawn from
/// `u`. Random bytes decoded as the fuzz target decodes them give workloads of one or two
/// operations (each element of a list costs a coin flip); this gives seeded tests full ones.
pub fn dense_case(u: &mut arbitrary::Unstructured<'_>) -> arbitrary::Result<FaultCase> {
    let immediate = u.arbitrary()?;
    let ops = (0..OPS_MAX)
        .map(|_| u.arbitrary())
        .collect::<arbitrary::Result<Vec<Op>>>()?;
    Ok(FaultCase {
        immediate,
        ops,
        at: u.int_in_range(0..=255)?,
        power_loss: u.arbitrary()?,
        keep: u.arbitrary()?,
        struck: u.arbitrary()?,
    })
}

/// The engine of a fault run on `file`, given `log` as its commit log when `setup` is
/// logged.
fn builder(
    setup: Mode,
    clock: &MockClock,
    file: &FaultyStorage,
    log: &FaultyStorage,
) -> idemkv::EngineBuilder {
    let b = ops::builder(setup.durability, clock, Some(file));
    if setup.logged {
        b.log_backend(log.clone())
    } else {
        b
    }
}

/// Runs a fuzzed case.
pub fn run_case(case: &FaultCase) -> Result<FaultRun, String> {
    run_case_with(case, Bug::None)
}

/// Runs a fuzzed case with `bug` armed (see [`run_with`]).
pub fn run_case_with(case: &FaultCase, bug: Bug) -> Result<FaultRun, String> {
    let durability = if case.immediate {
        Durability::Immediate
    } else {
        Durability::Buffered {
            max_delay: Duration::from_millis(1),
        }
    };
    let (mode, disk) = match case.struck {
        Struck::File => (Mode::from(durability), Disk::File),
        Struck::Log if case.immediate => (Mode::from(durability), Disk::Log),
        Struck::Log => (Mode::from(durability), Disk::File),
        Struck::UnloggedFile => (Mode::unlogged(durability), Disk::File),
    };
    // Workloads make a few hundred I/Os at most: fold the byte into that range.
    let at = u64::from(case.at) % 512 + 1;
    let fault = if case.power_loss {
        Fault::PowerLoss { at }
    } else {
        Fault::Error { at }
    };
    let keep = case.keep;
    run_with(
        mode,
        &case.ops,
        Some((disk, fault)),
        |i| keep & (1 << (i % 64)) != 0,
        bug,
    )
}

/// What [`exhaustive`] covered.
#[derive(Debug, Clone, Copy, Default)]
pub struct Coverage {
    /// I/O points of the fault-free run (the file's and the log's).
    pub io_points: u64,
    /// Of them, the log's.
    pub log_io_points: u64,
    /// Runs made (three per I/O point).
    pub runs: u64,
    /// Runs whose reopened file lacks a write a call returned `Ok` for: never under
    /// `Immediate`; anything recent under `Buffered`.
    pub lost_acknowledged: u64,
}

/// Power loss (synced bytes only; every unsynced write too) and a failing call, at every
/// I/O point of `ops` in `mode`: of the file, and of the log when `mode` is logged. The
/// applier's file commits follow real time, so a run's file I/Os may differ a little from
/// the fault-free run's; each run is checked on its own.
pub fn exhaustive(mode: impl Into<Mode>, ops_in: &[Op]) -> Result<Coverage, String> {
    exhaustive_with(mode, ops_in, Bug::None)
}

/// [`exhaustive`] with `bug` armed (see [`run_with`]); stops at the first failing run.
pub fn exhaustive_with(mode: impl Into<Mode>, ops_in: &[Op], bug: Bug) -> Result<Coverage, String> {
    let mode: Mode = mode.into();
    let base = run_with(mode, ops_in, None, |_| false, bug)
        .map_err(|e| format!("{mode:?}, without a fault: {e}"))?;
    let mut cov = Coverage {
        io_points: base.ios + base.log_ios,
        log_io_points: base.log_ios,
        runs: 1,
        lost_acknowledged: 0,
    };
    let points = (1..=base.ios)
        .map(|at| (Disk::File, at, base.ios))
        .chain((1..=base.log_ios).map(|at| (Disk::Log, at, base.log_ios)));
    for (disk, at, of) in points {
        for (name, fault, keep_all) in [
            (
                "power loss, synced bytes only",
                Fault::PowerLoss { at },
                false,
            ),
            (
                "power loss, unsynced writes kept",
                Fault::PowerLoss { at },
                true,
            ),
            ("failing call", Fault::Error { at }, false),
        ] {
            let run =
                run_with(mode, ops_in, Some((disk, fault)), |_| keep_all, bug).map_err(|e| {
                    format!("{mode:?}, {name} at I/O {at} of {of} of the {disk:?}: {e}")
                })?;
            cov.runs += 1;
            cov.lost_acknowledged += u64::from(run.matched < run.acked);
        }
    }
    Ok(cov)
}

/// A small workload touching every kind of write: claims, a checkpoint, an extend, a
/// completion, a takeover after the lease ran out, a takeover of a zero lease that is then
/// released (its first record must be gone with it), and a flush.
pub fn small_workload() -> Vec<Op> {
    use crate::ops::{AdvanceSel, BytesSel, FpSel, KeySel, LeaseSel, TokenSel};
    vec![
        Op::Claim {
            key: KeySel(0),
            fingerprint: FpSel(1),
            lease: LeaseSel(0),
            wait: false,
        },
        Op::Claim {
            key: KeySel(1),
            fingerprint: FpSel(0),
            lease: LeaseSel(5),
            wait: false,
        },
        Op::Checkpoint {
            key: KeySel(0),
            token: TokenSel(0),
            phase: 1,
            data: BytesSel(3),
        },
        Op::Complete {
            key: KeySel(1),
            token: TokenSel(0),
            response: BytesSel(2),
        },
        Op::Extend {
            key: KeySel(0),
            token: TokenSel(0),
            lease: LeaseSel(2),
        },
        Op::Advance { by: AdvanceSel(5) },
        Op::Claim {
            key: KeySel(0),
            fingerprint: FpSel(1),
            lease: LeaseSel(0),
            wait: false,
        },
        Op::Claim {
            key: KeySel(2),
            fingerprint: FpSel(0),
            lease: LeaseSel(1),
            wait: false,
        },
        Op::Claim {
            key: KeySel(2),
            fingerprint: FpSel(0),
            lease: LeaseSel(0),
            wait: false,
        },
        Op::Release {
            key: KeySel(2),
            token: TokenSel(0),
        },
        Op::Complete {
            key: KeySel(0),
            token: TokenSel(0),
            response: BytesSel(3),
        },
        Op::Get { key: KeySel(1) },
        Op::Flush,
    ]
}

/// Real time a [`held_commit`] run waits for the engine's threads at most (a safety net:
/// every wait ends as soon as its condition holds).
#[cfg(idemkv_sabotage)]
const HELD_WAIT_MAX: Duration = Duration::from_secs(10);

/// Invariants 4 and 5 at the moment they are most at risk: the writer is held before the
/// commit of a completion (`Engine::hold_commits`) while a caller waits for it (`Immediate`)
/// or has returned (`Buffered`), and a claim of a new key has issued a token that is not
/// durable yet. Meanwhile `get` and `claim` of the completed key must answer that it is
/// still being made durable (`Completing`, `InProgress`), and under `Immediate` the
/// completing caller must still be waiting. Then the power goes: the file is reopened from
/// the disk's durable image, and what a caller was shown or acknowledged must be in it, and
/// the first token issued after the reopen must be above every token issued before.
/// `bug` is armed from the open on. Needs `--cfg idemkv_sabotage` (the engine's commit gate).
#[cfg(idemkv_sabotage)]
pub fn held_commit(mode: impl Into<Mode>, bug: Bug) -> Result<(), String> {
    let setup: Mode = mode.into();
    let mode = setup.durability;
    let clock = MockClock::new();
    let (disk, log_disk) = (FaultyStorage::memory(), FaultyStorage::memory());
    let engine = crate::armed(
        builder(setup, &clock, &disk, &log_disk).inflight_max(16),
        bug,
    )
    .open()
    .map_err(|e| format!("open: {e}"))?;
    let long = ClaimOptions::default().lease(Duration::from_secs(3600));
    let lease = match engine.claim(b"a", &long) {
        Ok(Claim::Acquired(lease)) => lease,
        other => return Err(format!("claim of a new key: {other:?}")),
    };
    let token_a = lease.token();
    engine.flush().map_err(|e| format!("flush: {e}"))?;
    let response: &[u8] = b"resp-a";
    let held = engine.hold_commits();
    let result = std::thread::scope(|s| {
        let completer = s.spawn(move || lease.complete(response));
        if !held.wait_until_held(HELD_WAIT_MAX) {
            return Err("the completion's commit never reached the writer".to_string());
        }
        let claimer = s.spawn(|| engine.claim(b"b", &long));
        let queued = |e: &idemkv::Engine| matches!(e.get(b"b"), Ok(Some(_)));
        let deadline = std::time::Instant::now() + HELD_WAIT_MAX;
        while !queued(&engine) {
            if std::time::Instant::now() > deadline {
                return Err("the claim of a new key was never queued".to_string());
            }
            std::thread::yield_now();
        }
        let token_next = engine.stats().token_next;
        let mut shown = None;
        let mut wrong = Vec::new();
        match engine.get(b"a") {
            Ok(Some(idemkv::KeyState::Completing { token })) if token == token_a => {}
            Ok(Some(idemkv::KeyState::Completed { response, .. })) => {
                shown = Some(response.to_vec());
            }
            other => wrong.push(format!("get: {other:?}")),
        }
        match engine.claim(b"a", &ClaimOptions::default()) {
            Ok(Claim::InProgress(busy)) if busy.completing() => {}
            Ok(Claim::Completed(stored)) => shown = Some(stored.response().to_vec()),
            other => wrong.push(format!("claim: {other:?}")),
        }
        // Only `Immediate` promises that a returned `complete` is durable.
        let acked = mode == Durability::Immediate && completer.is_finished();
        // The power goes now: the held commit has not begun.
        let image = (log_disk.durable_image(), disk.durable_image());
        drop(held);
        let completed = completer
            .join()
            .map_err(|_| "the completing thread panicked".to_string())?;
        let claimed = claimer
            .join()
            .map_err(|_| "the claiming thread panicked".to_string())?;
        Ok((image, token_next, shown, wrong, acked, completed, claimed))
    });
    let (image, token_next, shown, wrong, acked, completed, claimed) = match result {
        Ok(r) => r,
        Err(e) => {
            // Release a writer still held, so that the engine can close.
            let _ = engine.close();
            return Err(e);
        }
    };
    engine.close().map_err(|e| format!("close: {e}"))?;
    if !wrong.is_empty() {
        return Err(format!(
            "{setup:?}: while the completion's commit was held (not durable), callers of its \
             key were answered {wrong:?}; expected Completing / InProgress (completing)"
        ));
    }
    completed.map_err(|e| format!("complete: {e}"))?;
    if !matches!(claimed, Ok(Claim::Acquired(_))) {
        return Err(format!("claim of a new key: {claimed:?}"));
    }
    let (log_image, image) = image;
    let reopened = builder(
        setup,
        &clock,
        &FaultyStorage::from_image(image),
        &FaultyStorage::from_image(log_image),
    )
    .inflight_max(16)
    .open()
    .map_err(|e| format!("reopen after the power loss: {e}"))?;
    let found = view_of_records(&reopened.admin().records())?;
    let durable = matches!(
        found.get(&b"a"[..]),
        Some(DurableRec { token, state: Err((r, _)), .. }) if *token == token_a && r == response
    );
    if acked && !durable {
        return Err(format!(
            "{setup:?}: `complete` returned Ok while its commit was held, and the power loss \
             lost it: the file holds {found:?}"
        ));
    }
    if let Some(bytes) = shown.filter(|_| !durable) {
        return Err(format!(
            "{setup:?}: a caller was shown the completion {bytes:?} while its commit was held, \
             and the power loss lost it: the file holds {found:?}"
        ));
    }
    match reopened.claim(b"fresh-after-reopen", &ClaimOptions::default()) {
        Ok(Claim::Acquired(lease)) if lease.token() < token_next => {
            return Err(format!(
                "{setup:?}: token {} issued after the reopen, but tokens up to {} were issued \
                 before the power loss",
                lease.token(),
                token_next - 1
            ))
        }
        Ok(Claim::Acquired(_)) => {}
        other => return Err(format!("claim after the reopen: {other:?}")),
    }
    reopened
        .close()
        .map_err(|e| format!("close after the reopen: {e}"))
}

/// The response [`damaged_response`] stores, and what the damage turns it into: the same
/// length, so that the record still decodes and only its checksum tells.
#[cfg(idemkv_sabotage)]
const INTACT: &[u8] = b"receipt #1234: charged 19.99 EUR";
#[cfg(idemkv_sabotage)]
const ROTTEN: &[u8] = b"receipt #1234: charged 99.99 EUR";

/// A stored response damaged in the file after it was written, while the engine runs
/// (bypassing the encoder, as bit rot would): every way of reading it back — `claim`,
/// `claim_or_wait`, `run` (whose handler must not run) and `get` — must be refused with
/// `Corrupted`, and none may return the damaged bytes. `bug` is armed from the open on.
/// Needs `--cfg idemkv_sabotage` (the engine's raw access to stored values).
#[cfg(idemkv_sabotage)]
pub fn damaged_response(mode: Durability, bug: Bug) -> Result<(), String> {
    let clock = MockClock::new();
    let disk = FaultyStorage::memory();
    let engine = crate::armed(
        ops::builder(mode, &clock, Some(&disk)).response_len_max(INTACT.len()),
        bug,
    )
    .open()
    .map_err(|e| format!("open: {e}"))?;
    let outcome = engine
        .run(b"k", &ClaimOptions::default(), |_| {
            Ok::<_, String>(INTACT.to_vec())
        })
        .map_err(|e| format!("run: {e}"))?;
    engine.flush().map_err(|e| format!("flush: {e}"))?;
    let mut found = false;
    let damaged = engine
        .damage_stored_value(outcome.token(), |value| {
            if let Some(at) = value.windows(INTACT.len()).position(|w| w == INTACT) {
                value[at..at + ROTTEN.len()].copy_from_slice(ROTTEN);
                found = true;
            }
        })
        .map_err(|e| format!("damage: {e}"))?;
    if !damaged || !found {
        return Err(format!(
            "the stored value under token {} does not hold the response",
            outcome.token()
        ));
    }
    let corrupted = |r: &Result<String, ClaimError>| matches!(r, Err(ClaimError::Corrupted(_)));
    let opts = ClaimOptions::default().wait(Duration::ZERO);
    let show = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let mut handler_ran = false;
    let answers: Vec<(&str, Result<String, ClaimError>)> = vec![
        (
            "claim",
            engine.claim(b"k", &opts).map(|c| match c {
                Claim::Completed(s) => show(s.response()),
                other => format!("{other:?}"),
            }),
        ),
        (
            "claim_or_wait",
            engine.claim_or_wait(b"k", &opts).map(|c| match c {
                Claim::Completed(s) => show(s.response()),
                other => format!("{other:?}"),
            }),
        ),
        (
            "run",
            match engine.run(b"k", &opts, |_| {
                handler_ran = true;
                Ok::<_, String>(b"ran again".to_vec())
            }) {
                Ok(out) => Ok(show(out.response())),
                Err(idemkv::RunError::Claim(e)) => Err(e),
                Err(e) => Ok(format!("run error {e}")),
            },
        ),
        (
            "get",
            engine.get(b"k").map(|state| match state {
                Some(idemkv::KeyState::Completed { response, .. }) => show(&response),
                other => format!("{other:?}"),
            }),
        ),
    ];
    let _ = engine.close();
    let wrong: Vec<String> = answers
        .iter()
        .filter(|(_, r)| !corrupted(r))
        .map(|(call, r)| format!("{call} -> {r:?}"))
        .collect();
    if handler_ran || !wrong.is_empty() {
        return Err(format!(
            "{mode:?}: the stored response was damaged in the file (\"{}\" -> \"{}\"); every \
             read of it must be refused with Corrupted, but: {wrong:?}{}",
            show(INTACT),
            show(ROTTEN),
            if handler_ran {
                " and run's handler ran again"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// `Outbox::mark_sent` under `Immediate` returns once the removal is durable: the disk as a
/// power loss leaves it right after the call returned `Ok` must not hold the message as
/// pending. Run twice: with the power on, and with the power lost at the removal's first
/// I/O (then the call must not return `Ok`: the disk lost the removal). `bug` is armed from
/// the open on.
pub fn mark_sent_then_power_loss(bug: Bug) -> Result<(), String> {
    for lose_power in [false, true] {
        let clock = MockClock::new();
        let disk = FaultyStorage::memory();
        let open = |disk: &FaultyStorage, bug: Bug| {
            crate::armed(ops::builder(Durability::Immediate, &clock, Some(disk)), bug)
                .open()
                .map_err(|e| format!("open: {e}"))
        };
        let engine = open(&disk, bug)?;
        let Claim::Acquired(lease) = engine
            .claim(b"k", &ClaimOptions::default())
            .map_err(|e| format!("claim: {e}"))?
        else {
            return Err("a fresh key was not acquired".into());
        };
        let mut writes = idemkv::WriteSet::new();
        writes.emit(b"message").map_err(|e| format!("emit: {e}"))?;
        lease
            .complete_with(b"ok", &writes)
            .map_err(|e| format!("complete: {e}"))?;
        let outbox = engine.outbox();
        let ids: Vec<u64> = outbox
            .pending(10)
            .map_err(|e| format!("pending: {e}"))?
            .iter()
            .map(|m| m.id())
            .collect();
        if ids.len() != 1 {
            return Err(format!("expected one pending message, found {ids:?}"));
        }
        if lose_power {
            disk.set_fault(Some(Fault::PowerLoss { at: disk.ios() + 1 }));
        }
        let sent = outbox.mark_sent(&ids);
        // What a power loss at this instant leaves.
        let image = disk.durable_image();
        drop(engine);
        if !lose_power {
            sent.as_ref().map_err(|e| format!("mark_sent: {e}"))?;
        }
        let reopened = open(&FaultyStorage::from_image(&image), Bug::None)?;
        let pending = reopened
            .outbox()
            .pending(10)
            .map_err(|e| format!("pending after the reopen: {e}"))?;
        let _ = reopened.close();
        if sent.is_ok() && !pending.is_empty() {
            return Err(format!(
                "mark_sent returned Ok under Immediate ({}), yet after a power loss at \
                 its return the message is pending again",
                if lose_power {
                    "the power went at the removal's first I/O"
                } else {
                    "the power stayed on until it returned"
                }
            ));
        }
    }
    Ok(())
}
