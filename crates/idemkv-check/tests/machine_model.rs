//! The engine's pure state machine (`src/model/machine/`), driven one key at a time through the
//! hidden probe (`idemkv::machine_probe`), against the sequential spec (`spec.rs`): random
//! operation sequences from fixed seeds, and after every operation the spec must accept the
//! machine's answer and both must hold the same state (token, attempt, fingerprint,
//! checkpoint, response, lease end, reap instant, retention end, the key's own retention,
//! published, failed; with markers on, the marker's completion time, end and whether it is
//! settled), with claims and completions that choose their own retention. The teeth: a
//! probe whose `complete` skips the token comparison must be caught. Built only with
//! `--cfg idemkv_sabotage` (docs/testing.md):
//! `RUSTFLAGS="--cfg idemkv_sabotage" CARGO_TARGET_DIR=target/sabotage
//! cargo test -p idemkv-check --test machine_model`.
#![cfg(idemkv_sabotage)]

use idemkv::machine_probe::{Probe, ProbeClaim, ProbeHold, ProbeState, Swept};
use idemkv::{ClaimError, Durability, LeaseError};
use idemkv_check::spec::{KeyModel, KeyOp, KeyRet, KeySpec, SpecConfig};
use std::time::Duration;

const MS: u64 = 1_000_000;
const RETENTION_NS: u64 = 50 * MS;
const SHORT_NS: u64 = 5 * MS;
const LONG_NS: u64 = 200 * MS;
/// The marker window of the runs with markers on.
const MARKER_NS: u64 = 100 * MS;
const STEPS: usize = 3_000;

/// How often each interesting transition happened, so that a run that never reaches one
/// fails instead of passing vacuously.
#[derive(Debug, Default)]
struct Seen {
    acquired: u64,
    takeovers: u64,
    replays: u64,
    busy: u64,
    mismatches: u64,
    completes: u64,
    lost: u64,
    released: u64,
    failed: u64,
    extended: u64,
    checkpointed: u64,
    expired: u64,
    reaped: u64,
    published: u64,
    forgotten: u64,
    markers_ended: u64,
}

struct Run {
    probe: Probe,
    spec: KeySpec,
    cfg: SpecConfig,
    issued: Vec<u64>,
    rng: fastrand::Rng,
    seen: Seen,
}

fn claim_ret(c: ProbeClaim) -> KeyRet {
    match c {
        ProbeClaim::Acquired {
            token,
            attempt,
            checkpoint,
        } => KeyRet::Acquired {
            token,
            attempt,
            checkpoint,
        },
        ProbeClaim::InProgress {
            retry_after_ns,
            attempt,
        } => KeyRet::InProgress {
            retry_after_ns,
            attempt,
        },
        ProbeClaim::Replayed {
            token,
            attempt,
            response,
        } => KeyRet::Replayed {
            token,
            attempt,
            response,
        },
        ProbeClaim::FingerprintMismatch => KeyRet::ClaimErr(ClaimError::FingerprintMismatch),
        ProbeClaim::Forgotten {
            completed_wall_ms,
            attempt,
        } => KeyRet::Forgotten {
            completed_wall_ms,
            attempt,
        },
    }
}

fn unit_ret(h: ProbeHold) -> KeyRet {
    match h {
        ProbeHold::Done => KeyRet::Done,
        // `complete`, `extend` and `checkpoint` have no `Ok(false)`: the spec rejects it.
        ProbeHold::NotHeld => KeyRet::Released(false),
        ProbeHold::LeaseLost => KeyRet::LeaseErr(LeaseError::LeaseLost),
    }
}

fn release_ret(h: ProbeHold) -> KeyRet {
    match h {
        ProbeHold::Done => KeyRet::Released(true),
        ProbeHold::NotHeld => KeyRet::Released(false),
        ProbeHold::LeaseLost => KeyRet::LeaseErr(LeaseError::LeaseLost),
    }
}

fn fail_ret(h: ProbeHold) -> KeyRet {
    match h {
        ProbeHold::Done => KeyRet::Failed(true),
        ProbeHold::NotHeld => KeyRet::Failed(false),
        ProbeHold::LeaseLost => KeyRet::LeaseErr(LeaseError::LeaseLost),
    }
}

/// The spec's state in the probe's terms (`durable`: the probe reports the record's lease
/// end).
fn expected(spec: &KeyModel, durable: bool) -> ProbeState {
    match spec.clone() {
        KeyModel::Absent => ProbeState::Absent,
        KeyModel::InFlight {
            token,
            deadline_ns,
            fingerprint,
            attempt,
            checkpoint,
            reap_ns,
            lease_wall_ms,
            retention_ms,
            failed,
        } => ProbeState::InFlight {
            token,
            attempt,
            deadline_ns,
            reap_ns,
            fingerprint,
            checkpoint,
            lease_wall_ms: durable.then_some(lease_wall_ms),
            retention_ms,
            failed,
            failed_on_file: durable.then_some(failed),
        },
        KeyModel::Completed {
            token,
            fingerprint,
            attempt,
            response,
            expires_ns,
            expires_wall_ms,
            published,
            ..
        } => ProbeState::Completed {
            token,
            attempt,
            expires_ns,
            expires_wall_ms,
            fingerprint,
            response,
            published,
        },
        KeyModel::Forgotten {
            token,
            fingerprint,
            attempt,
            completed_wall_ms,
            end_ns,
            settled,
        } => ProbeState::Forgotten {
            token,
            attempt,
            fingerprint,
            completed_wall_ms,
            end_ns,
            settled,
        },
    }
}

impl Run {
    fn new(seed: u64, durable: bool, markers: bool) -> Self {
        let (mono_ns, wall_ms) = (1_000 * MS, 1_700_000_000_000);
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        Run {
            probe: {
                let probe = Probe::new(
                    Duration::from_nanos(RETENTION_NS),
                    durable,
                    mono_ns,
                    wall_ms,
                );
                if markers {
                    probe.with_markers(Duration::from_nanos(MARKER_NS))
                } else {
                    probe
                }
            },
            spec: KeySpec::new(mono_ns, wall_ms),
            cfg: SpecConfig {
                durability,
                lease_ns: LONG_NS,
                retention_ns: RETENTION_NS,
                response_len_max: usize::MAX,
                checkpoint_len_max: usize::MAX,
                check_wall: true,
                marker_retention_ns: markers.then_some(MARKER_NS),
            },
            issued: Vec::new(),
            rng: fastrand::Rng::with_seed(seed),
            seen: Seen::default(),
        }
    }

    fn durable(&self) -> bool {
        !self.cfg.publishes_at_once()
    }

    /// The current token, a stale one, one never issued, or zero.
    fn token(&mut self) -> u64 {
        let current = match &self.spec.state {
            KeyModel::InFlight { token, .. }
            | KeyModel::Completed { token, .. }
            | KeyModel::Forgotten { token, .. } => Some(*token),
            KeyModel::Absent => None,
        };
        match self.rng.u8(0..10) {
            0..=4 => current.unwrap_or(0),
            5..=7 if !self.issued.is_empty() => self.issued[self.rng.usize(..self.issued.len())],
            8 => 0,
            _ => self.spec.max_token + 1 + self.rng.u64(0..3),
        }
    }

    /// A key's own retention (ms), or none: shorter and longer than the engine's, zero.
    fn retention_ms(&mut self) -> Option<u64> {
        match self.rng.u8(0..6) {
            0 => Some(0),
            1 => Some(self.rng.u64(1..RETENTION_NS / MS)),
            2 => Some(self.rng.u64(RETENTION_NS / MS..4 * RETENTION_NS / MS)),
            _ => None,
        }
    }

    fn lease_ns(&mut self) -> u64 {
        match self.rng.u8(0..4) {
            0 => 0,
            1 => SHORT_NS,
            2 => LONG_NS,
            _ => self.rng.u64(1..SHORT_NS),
        }
    }

    /// A clock step, often landing on, just before or just after a lease end, a reap
    /// instant or a retention end.
    fn advance_ns(&mut self) -> u64 {
        let now = self.spec.now_ns;
        let edge = match &self.spec.state {
            KeyModel::InFlight {
                deadline_ns,
                reap_ns,
                ..
            } => {
                if self.rng.bool() {
                    *deadline_ns
                } else {
                    *reap_ns
                }
            }
            KeyModel::Completed { expires_ns, .. } => match self.cfg.marker_retention_ns {
                Some(window) if self.rng.bool() && now >= *expires_ns => expires_ns + window,
                _ => *expires_ns,
            },
            KeyModel::Forgotten { end_ns, .. } => *end_ns,
            KeyModel::Absent => now,
        };
        if edge > now && self.rng.u8(0..3) > 0 {
            let to = edge - now;
            return match self.rng.u8(0..3) {
                0 => to - 1,
                1 => to,
                _ => to + 1,
            }
            .max(1);
        }
        match self.rng.u8(0..3) {
            0 => self.rng.u64(1..1_000),
            1 => self.rng.u64(1..SHORT_NS),
            _ => self.rng.u64(1..LONG_NS),
        }
    }

    /// One random operation on both sides; `Err` with the history's last step when they
    /// disagree.
    fn step(&mut self) -> Result<(), String> {
        let (op, ret) = match self.rng.u8(0..22) {
            0..=5 => {
                let fingerprint = match self.rng.u8(0..3) {
                    0 => None,
                    n => Some(u64::from(n)),
                };
                let lease_ns = self.lease_ns();
                let retention_ms = self.retention_ms();
                let ret = claim_ret(self.probe.claim_kept(
                    fingerprint,
                    Duration::from_nanos(lease_ns),
                    retention_ms,
                ));
                match &ret {
                    KeyRet::Acquired { token, attempt, .. } => {
                        self.issued.push(*token);
                        self.seen.acquired += 1;
                        self.seen.takeovers += u64::from(*attempt > 1);
                    }
                    KeyRet::Replayed { .. } => self.seen.replays += 1,
                    KeyRet::InProgress { .. } => self.seen.busy += 1,
                    KeyRet::Forgotten { .. } => self.seen.forgotten += 1,
                    _ => self.seen.mismatches += 1,
                }
                let op = KeyOp::Claim {
                    fingerprint,
                    lease_ns: Some(lease_ns),
                    wait: false,
                    retention_ms,
                };
                (op, ret)
            }
            6..=8 => {
                let token = self.token();
                let response = vec![self.rng.u8(..); self.rng.usize(0..4)];
                let retention_ms = self.retention_ms();
                let ret = unit_ret(self.probe.complete_kept(token, &response, retention_ms));
                self.seen.completes += u64::from(ret == KeyRet::Done);
                let op = KeyOp::Complete {
                    token,
                    response,
                    retention_ms,
                };
                (op, ret)
            }
            9..=10 => {
                let token = self.token();
                let ret = release_ret(self.probe.release(token));
                self.seen.released += u64::from(ret == KeyRet::Released(true));
                (KeyOp::Release { token }, ret)
            }
            11..=12 => {
                let token = self.token();
                let lease_ns = self.lease_ns();
                let ret = unit_ret(self.probe.extend(token, Duration::from_nanos(lease_ns)));
                self.seen.extended += u64::from(ret == KeyRet::Done);
                (KeyOp::Extend { token, lease_ns }, ret)
            }
            13 => {
                let token = self.token();
                let phase = self.rng.u32(0..4);
                let data = vec![self.rng.u8(..); self.rng.usize(0..3)];
                let ret = unit_ret(self.probe.checkpoint(token, phase, &data));
                self.seen.checkpointed += u64::from(ret == KeyRet::Done);
                (KeyOp::Checkpoint { token, phase, data }, ret)
            }
            14..=16 => {
                let ns = self.advance_ns();
                self.probe.advance(Duration::from_nanos(ns));
                (KeyOp::Advance { ns }, KeyRet::Done)
            }
            17..=18 => return self.sweep(),
            20..=21 => {
                let token = self.token();
                let ret = fail_ret(self.probe.fail(token));
                self.seen.failed += u64::from(ret == KeyRet::Failed(true));
                (KeyOp::Fail { token }, ret)
            }
            _ => {
                let Some(token) = self.probe.publish() else {
                    return self.compare("publish (nothing to publish)");
                };
                self.seen.published += 1;
                (KeyOp::Publish { token }, KeyRet::Done)
            }
        };
        self.seen.lost += u64::from(ret == KeyRet::LeaseErr(LeaseError::LeaseLost));
        self.spec = self
            .spec
            .step(&self.cfg, &op, &ret)
            .map_err(|m| format!("the spec rejects the machine's answer: {m}"))?;
        self.compare(&format!("{op:?} -> {ret:?}"))
    }

    /// A sweep removes only what the spec says is due, and everything that is.
    fn sweep(&mut self) -> Result<(), String> {
        let swept = self.probe.sweep();
        let now = self.spec.now_ns;
        let due = match &self.spec.state {
            KeyModel::Completed { expires_ns, .. } if now >= *expires_ns => Swept::Expired,
            KeyModel::InFlight {
                deadline_ns,
                reap_ns,
                ..
            } if now >= *deadline_ns && now >= *reap_ns => Swept::Reaped,
            KeyModel::Forgotten { end_ns, .. } if now >= *end_ns => Swept::MarkerEnded,
            _ => Swept::Nothing,
        };
        if swept != due {
            return Err(format!(
                "sweep at t={now}: the machine {swept:?}, the spec expects {due:?} in {:?}",
                self.spec.state
            ));
        }
        match swept {
            Swept::Nothing => {}
            Swept::Expired => self.seen.expired += 1,
            Swept::Reaped => self.seen.reaped += 1,
            Swept::MarkerEnded => self.seen.markers_ended += 1,
        }
        if swept != Swept::Nothing {
            // An expired completion leaves its marker while its window is open; a durable
            // one is settled when the writer publishes its row.
            self.spec.state = match self.spec.state.marker_at(&self.cfg, now) {
                Some(KeyModel::Forgotten {
                    token,
                    fingerprint,
                    attempt,
                    completed_wall_ms,
                    end_ns,
                    ..
                }) if swept == Swept::Expired => KeyModel::Forgotten {
                    token,
                    fingerprint,
                    attempt,
                    completed_wall_ms,
                    end_ns,
                    settled: !self.durable(),
                },
                _ => KeyModel::Absent,
            };
        }
        self.compare("sweep")
    }

    fn compare(&self, what: &str) -> Result<(), String> {
        let want = expected(&self.spec.state, self.durable());
        let got = self.probe.state();
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "after {what} at t={}: the machine holds {got:?}, the spec {want:?}",
                self.spec.now_ns
            ))
        }
    }
}

/// A deliberate bug of the probe, for the teeth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    None,
    /// `complete` skips the token comparison.
    NoFence,
    /// `fail` releases the key instead of keeping it.
    FailReleases,
}

/// Runs `STEPS` random operations from `seed`; the first disagreement, if any.
fn run(seed: u64, durable: bool, markers: bool, bug: Bug, seen: &mut Seen) -> Result<(), String> {
    let mut r = Run::new(seed, durable, markers);
    r.probe.skip_token_check_on_complete = bug == Bug::NoFence;
    r.probe.release_on_fail = bug == Bug::FailReleases;
    for i in 0..STEPS {
        r.step().map_err(|e| {
            format!("seed {seed}, durable {durable}, markers {markers}, step {i}: {e}")
        })?;
    }
    let s = r.seen;
    seen.acquired += s.acquired;
    seen.takeovers += s.takeovers;
    seen.replays += s.replays;
    seen.busy += s.busy;
    seen.mismatches += s.mismatches;
    seen.completes += s.completes;
    seen.lost += s.lost;
    seen.released += s.released;
    seen.failed += s.failed;
    seen.extended += s.extended;
    seen.checkpointed += s.checkpointed;
    seen.expired += s.expired;
    seen.reaped += s.reaped;
    seen.published += s.published;
    seen.forgotten += s.forgotten;
    seen.markers_ended += s.markers_ended;
    Ok(())
}

fn agrees(durable: bool, markers: bool) {
    let mut seen = Seen::default();
    for seed in 0..6 {
        if let Err(e) = run(seed, durable, markers, Bug::None, &mut seen) {
            panic!("{e}");
        }
    }
    let counts = [
        ("acquired", seen.acquired),
        ("takeovers", seen.takeovers),
        ("replays", seen.replays),
        ("busy", seen.busy),
        ("fingerprint mismatches", seen.mismatches),
        ("completes", seen.completes),
        ("leases lost", seen.lost),
        ("releases", seen.released),
        ("fails", seen.failed),
        ("extends", seen.extended),
        ("checkpoints", seen.checkpointed),
        ("expirations", seen.expired),
        ("reaps", seen.reaped),
    ];
    for (name, n) in counts {
        assert!(n > 0, "the runs never reached {name}: {seen:?}");
    }
    assert_eq!(
        (seen.forgotten > 0, seen.markers_ended > 0),
        (markers, markers),
        "markers answer and end only when kept: {seen:?}"
    );
    assert_eq!(
        seen.published > 0,
        durable,
        "only a durable probe publishes later: {seen:?}"
    );
}

#[test]
fn the_memory_only_machine_agrees_with_the_spec_step_by_step() {
    agrees(false, false);
}

#[test]
fn the_durable_machine_agrees_with_the_spec_step_by_step() {
    agrees(true, false);
}

#[test]
fn the_memory_only_machine_with_markers_agrees_with_the_spec_step_by_step() {
    agrees(false, true);
}

#[test]
fn the_durable_machine_with_markers_agrees_with_the_spec_step_by_step() {
    agrees(true, true);
}

#[test]
fn a_complete_that_skips_the_token_comparison_is_caught() {
    for durable in [false, true] {
        let mut seen = Seen::default();
        let caught = (0..6)
            .filter_map(|seed| run(seed, durable, false, Bug::NoFence, &mut seen).err())
            .collect::<Vec<_>>();
        assert_eq!(
            caught.len(),
            6,
            "durable {durable}: the skipped token comparison went unnoticed in some seeds"
        );
        assert!(
            caught.iter().all(|e| e.contains("Complete")),
            "caught for another reason: {caught:?}"
        );
    }
}

#[test]
fn a_fail_that_forgets_the_progress_is_caught() {
    for durable in [false, true] {
        let mut seen = Seen::default();
        let caught = (0..6)
            .filter_map(|seed| run(seed, durable, false, Bug::FailReleases, &mut seen).err())
            .collect::<Vec<_>>();
        assert_eq!(
            caught.len(),
            6,
            "durable {durable}: a fail that releases went unnoticed in some seeds"
        );
        assert!(
            caught.iter().all(|e| e.contains("Fail")),
            "caught for another reason: {caught:?}"
        );
    }
}
