//! `storage_faults`: a workload against an engine on a [`SimDisk`] that fails or loses power
//! at its Nth I/O, then a reopen and the checks of BRIEF §3 invariants 2, 4 and 5:
//!
//! - the reopened file holds exactly the records of some prefix of the submitted writes
//!   (nothing never submitted appears, and writes are never reordered);
//! - that prefix contains every acknowledged write (`Immediate`: every call that returned
//!   `Ok`; `Buffered`: everything before a successful `flush`, and every completion another
//!   call was shown), so at most the one in-doubt batch differs;
//! - the next token issued after the reopen is above every token issued before the crash.
//!
//! [`exhaustive`] runs a workload once to count its I/Os, then once per I/O point and
//! fault kind: power loss with only the synced bytes, power loss with every unsynced write
//! too, and a failing call that the process survives.

use super::disk::{Fault, SimDisk};
use super::ops::{self, call, Call, Model, Op};
use super::spec::{KeyModel, KeyOp, KeyRet};
use crate::{
    Claim, ClaimError, ClaimOptions, Durability, LeaseError, MockClock, RecordInfo, RecordInfoState,
};
use arbitrary::Arbitrary;
use std::collections::BTreeMap;
use std::time::Duration;

/// Most operations of a fault case.
pub const OPS_MAX: usize = 24;

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
}

/// The durable part of one key's record, as compared after a reopen.
#[derive(Debug, Clone)]
pub struct DurableRec {
    /// Token.
    pub token: u64,
    /// Fingerprint.
    pub fingerprint: Option<u64>,
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
            KeyModel::Absent => continue,
            KeyModel::InFlight {
                token,
                fingerprint,
                attempt,
                checkpoint,
                lease_wall_ms,
                ..
            } => DurableRec {
                token: *token,
                fingerprint: *fingerprint,
                attempt: *attempt,
                state: Ok(checkpoint.clone()),
                reap_wall_ms: Some(lease_wall_ms.saturating_add(retention_ms)),
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
                fingerprint: *fingerprint,
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
                expires_at_ms,
                ..
            } => Err((response.clone(), *expires_at_ms)),
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

/// Drops completions past their retention and abandoned claims past their reap instant at
/// `wall_ms` (recovery deletes both).
fn unexpired(v: &DurableView, wall_ms: u64) -> DurableView {
    v.iter()
        .filter(|(_, r)| !matches!(&r.state, Err((_, exp)) if *exp <= wall_ms))
        .filter(|(_, r)| r.reap_wall_ms.is_none_or(|reap| reap > wall_ms))
        .map(|(k, r)| (k.clone(), r.clone()))
        .collect()
}

/// What one fault run saw.
#[derive(Debug, Clone, Default)]
pub struct FaultRun {
    /// I/Os the run made before the reopen.
    pub ios: u64,
    /// Whether the fault struck.
    pub struck: bool,
    /// Writes submitted, and the prefix length the reopened file matched.
    pub submitted: usize,
    /// Prefix length matched.
    pub matched: usize,
    /// Writes known durable before the crash.
    pub floor: usize,
}

/// Runs `ops` in `mode` on a disk armed with `fault`, then reopens and checks. `keep`
/// chooses which unsynced writes survive a power loss.
pub fn run(
    mode: Durability,
    ops_in: &[Op],
    fault: Option<Fault>,
    mut keep: impl FnMut(usize) -> bool,
) -> Result<FaultRun, String> {
    let clock = MockClock::new();
    let disk = SimDisk::new();
    disk.set_fault(fault);
    let mut model = Model::new(ops::spec_config(mode), &clock);
    // Durable views after each submitted write; [0] is the empty file.
    let mut views: Vec<DurableView> = vec![DurableView::new()];
    let mut floor = 0usize;
    // For Buffered: the view index at which each completion (by token) was submitted.
    let mut completion_at: BTreeMap<u64, usize> = BTreeMap::new();
    let mut parked = Vec::new();
    let mut token_next = 1u64;
    let mut log: Vec<String> = Vec::new();
    let opened = ops::builder(mode, &clock, Some(&disk)).open();
    if let Ok(engine) = &opened {
        for op in ops_in.iter().take(OPS_MAX) {
            token_next = token_next.max(engine.stats().token_next);
            let op = match op {
                Op::Restart { .. } => &Op::Flush,
                other => other,
            };
            let (key, kop, ret) = match call(engine, &model, &mut parked, op) {
                Call::Key { key, op, ret } => (key, op, ret),
                Call::Advance(d) => {
                    clock.advance(d);
                    model.advance(d);
                    continue;
                }
                Call::Flush | Call::Restart { .. } => match engine
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
                if let (KeyOp::Complete { token, .. }, true) =
                    (&kop, matches!(before.state, KeyModel::InFlight { .. }))
                {
                    completion_at.insert(*token, views.len() - 1);
                }
                if mode == Durability::Immediate {
                    floor = views.len() - 1;
                }
            }
            // Buffered: a completion shown to a caller is durable, with everything before it.
            let shown = match &ret {
                KeyRet::Replayed { token, .. } => Some(*token),
                KeyRet::Got(Some(super::spec::GotState::Completed { token, .. })) => Some(*token),
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
    let power_loss = matches!(fault, Some(Fault::PowerLoss { .. }));
    if !(power_loss && disk.struck_at().is_some()) {
        if let Ok(engine) = &opened {
            let closed = engine.close();
            if disk.struck_at().is_none() {
                closed.map_err(|e| format!("close without a fault failed: {e}"))?;
            }
        }
    }
    let struck = disk.struck_at().is_some();
    if !struck && opened.is_ok() {
        floor = views.len() - 1;
    }
    let image = if power_loss && struck {
        disk.crash_image(&mut keep)
    } else {
        disk.live_image()
    };
    if let Ok(engine) = &opened {
        let _ = engine.close();
    }
    drop(opened);
    drop(parked);
    let ios = disk.ios();
    // Reopen and compare.
    // (A higher in-flight limit, so that the fresh claim below is never refused.)
    let reopened = match ops::builder(mode, &clock, Some(&SimDisk::from_image(image)))
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
    let wall_ms = u64::try_from(crate::Clock::wall(&clock).as_millis()).unwrap_or(u64::MAX);
    let found = view_of_records(&reopened.records())?;
    let matched = (floor..views.len())
        .rev()
        .find(|&j| unexpired(&views[j], wall_ms) == found);
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
        struck,
        submitted: views.len() - 1,
        matched,
        floor,
    })
}

/// Runs a fuzzed case.
pub fn run_case(case: &FaultCase) -> Result<FaultRun, String> {
    let mode = if case.immediate {
        Durability::Immediate
    } else {
        Durability::Buffered {
            max_delay: Duration::from_millis(1),
        }
    };
    // Workloads make a few hundred I/Os at most: fold the byte into that range.
    let at = u64::from(case.at) % 512 + 1;
    let fault = if case.power_loss {
        Fault::PowerLoss { at }
    } else {
        Fault::Error { at }
    };
    let keep = case.keep;
    run(mode, &case.ops, Some(fault), |i| {
        keep & (1 << (i % 64)) != 0
    })
}

/// What [`exhaustive`] covered.
#[derive(Debug, Clone, Copy, Default)]
pub struct Coverage {
    /// I/O points of the fault-free run.
    pub io_points: u64,
    /// Runs made (three per I/O point).
    pub runs: u64,
}

/// Power loss (synced bytes only; every unsynced write too) and a failing call, at every
/// I/O point of `ops` in `mode`.
pub fn exhaustive(mode: Durability, ops_in: &[Op]) -> Result<Coverage, String> {
    let base = run(mode, ops_in, None, |_| false)?;
    let mut cov = Coverage {
        io_points: base.ios,
        runs: 1,
    };
    for at in 1..=base.ios {
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
            run(mode, ops_in, Some(fault), |_| keep_all)
                .map_err(|e| format!("{mode:?}, {name} at I/O {at} of {}: {e}", base.ios))?;
            cov.runs += 1;
        }
    }
    Ok(cov)
}

/// A small workload touching every kind of write: claims, a checkpoint, an extend, a
/// completion, a release, a takeover after the lease ran out, and a flush.
pub fn small_workload() -> Vec<Op> {
    use super::ops::{AdvanceSel, BytesSel, FpSel, KeySel, LeaseSel, TokenSel};
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
