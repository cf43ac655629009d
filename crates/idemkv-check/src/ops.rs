//! `ops_model`: sequences of operations run against the engine and against the sequential
//! model ([`crate::spec`]) side by side, in every durability mode, with a mock clock and a
//! simulated disk ([`idemkv::fault::FaultyStorage`]).
//!
//! After every operation the engine's result must be one the model allows; after every
//! operation the engine's records (`Admin::records`) and in-flight gauge must match the
//! model's; every new token must be above every token issued before, across restarts.
//! `Restart { power_loss: false }` closes the engine and reopens the file;
//! `Restart { power_loss: true }` reopens from the disk's durable image without closing
//! (after a `flush` under `Buffered`, whose promise is weaker and is checked by
//! `storage_faults`). Under `Durability::None` a restart starts from nothing.

use crate::modes;
use crate::spec::{self, ns, KeyModel, KeyOp, KeyRet, KeySpec, SpecConfig};
use arbitrary::Arbitrary;
use idemkv::admin::RecordInfoState;
use idemkv::error::Limit;
use idemkv::fault::{FaultyStorage, WithStorage};
use idemkv::{ClaimError, ClaimOptions, Clock, Durability, Engine, LeaseError, MockClock};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Which key an operation is about: mostly one of three keys, sometimes an empty or an
/// over-long key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub struct KeySel(pub u8);

/// Which token a lease call passes: one the key had (0 = its latest), or one it never had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub struct TokenSel(pub u8);

/// A lease duration, from a set with the edge cases (default, 0, 1 ms, ..., `Duration::MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub struct LeaseSel(pub u8);

/// A clock step, from a set around the lease (20 ms) and retention (100 ms) edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub struct AdvanceSel(pub u8);

/// A byte payload: a length from a set that reaches past the limits, filled with one byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub struct BytesSel(pub u8);

/// A request fingerprint: none, or one of two values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub struct FpSel(pub u8);

/// One step of a sequential workload.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub enum Op {
    /// `claim` (or `claim_or_wait` with a zero wait).
    Claim {
        /// Key.
        key: KeySel,
        /// Fingerprint.
        fingerprint: FpSel,
        /// Lease.
        lease: LeaseSel,
        /// Use `claim_or_wait`.
        wait: bool,
    },
    /// `Engine::complete`.
    Complete {
        /// Key.
        key: KeySel,
        /// Token.
        token: TokenSel,
        /// Response.
        response: BytesSel,
    },
    /// `Engine::release`.
    Release {
        /// Key.
        key: KeySel,
        /// Token.
        token: TokenSel,
    },
    /// `Engine::extend`.
    Extend {
        /// Key.
        key: KeySel,
        /// Token.
        token: TokenSel,
        /// New lease.
        lease: LeaseSel,
    },
    /// `Engine::checkpoint`.
    Checkpoint {
        /// Key.
        key: KeySel,
        /// Token.
        token: TokenSel,
        /// Phase.
        phase: u8,
        /// Payload.
        data: BytesSel,
    },
    /// `Engine::get`.
    Get {
        /// Key.
        key: KeySel,
    },
    /// Move the mock clock.
    Advance {
        /// Step.
        by: AdvanceSel,
    },
    /// `Admin::sweep_now`, then `Engine::flush`.
    Flush,
    /// Close and reopen, or lose power and reopen.
    Restart {
        /// Reopen from the durable image without closing.
        power_loss: bool,
    },
}

/// A workload for `ops_model`.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub struct OpsCase {
    /// The operations, in order.
    pub ops: Vec<Op>,
}

/// Engine settings of the model runs (small limits, so that the edges are reachable).
pub const LEASE: Duration = Duration::from_millis(20);
/// Retention of the model runs.
pub const RETENTION: Duration = Duration::from_millis(100);
/// Longest key of the model runs.
pub const KEY_LEN_MAX: usize = 32;
/// Largest response of the model runs.
pub const RESPONSE_LEN_MAX: usize = 24;
/// Largest checkpoint of the model runs.
pub const CHECKPOINT_LEN_MAX: usize = 16;
/// Most keys in flight in the model runs.
pub const INFLIGHT_MAX: usize = 2;
/// Most restarts a case performs (the rest are skipped), to bound a case's cost.
pub const RESTARTS_MAX: usize = 4;
/// Most operations a case runs.
pub const OPS_MAX: usize = 64;

impl KeySel {
    /// The key bytes.
    pub fn key(self) -> Vec<u8> {
        match self.0 % 16 {
            14 => Vec::new(),
            15 => vec![b'x'; KEY_LEN_MAX + 1],
            v => format!("k{}", v % 3).into_bytes(),
        }
    }
}

impl LeaseSel {
    /// The lease (`None`: the engine's default).
    pub fn lease(self) -> Option<Duration> {
        match self.0 % 8 {
            0 => None,
            1 => Some(Duration::ZERO),
            2 => Some(Duration::from_millis(1)),
            3 => Some(Duration::from_millis(10)),
            4 => Some(Duration::from_millis(20)),
            5 => Some(Duration::from_secs(1)),
            6 => Some(Duration::MAX),
            _ => Some(Duration::from_secs(25 * 3600)),
        }
    }
}

impl AdvanceSel {
    /// The clock step.
    pub fn step(self) -> Duration {
        const MS: [u64; 15] = [
            0, 1, 5, 9, 10, 11, 19, 20, 21, 50, 99, 100, 101, 1000, 3_600_000,
        ];
        if self.0 == 255 {
            return Duration::from_secs(10 * 24 * 3600);
        }
        Duration::from_millis(MS[usize::from(self.0) % MS.len()])
    }
}

impl BytesSel {
    /// The bytes, for a limit of `max`.
    pub fn bytes(self, max: usize) -> Vec<u8> {
        let len = match self.0 % 6 {
            0 => 0,
            1 => 1,
            2 => 3,
            3 => 8,
            4 => max,
            _ => max + 1,
        };
        vec![self.0; len]
    }
}

impl FpSel {
    /// The fingerprint.
    pub fn fingerprint(self) -> Option<u64> {
        match self.0 % 4 {
            0 => None,
            2 => Some(2),
            _ => Some(1),
        }
    }
}

/// The spec configuration matching [`builder`] in `mode`.
pub fn spec_config(mode: Durability) -> SpecConfig {
    SpecConfig {
        durability: mode,
        lease_ns: ns(LEASE),
        retention_ns: ns(RETENTION),
        response_len_max: RESPONSE_LEN_MAX,
        checkpoint_len_max: CHECKPOINT_LEN_MAX,
        check_wall: true,
        marker_retention_ns: None,
    }
}

/// The engine builder the model runs use.
pub fn builder(
    mode: Durability,
    clock: &MockClock,
    disk: Option<&FaultyStorage>,
) -> idemkv::EngineBuilder {
    let mut b = Engine::builder()
        .durability(mode)
        .clock(clock.clone())
        .lease(LEASE)
        .retention(RETENTION)
        .key_len_max(KEY_LEN_MAX)
        .response_len_max(RESPONSE_LEN_MAX)
        .checkpoint_len_max(CHECKPOINT_LEN_MAX)
        .inflight_max(INFLIGHT_MAX)
        // No background sweeps (their timing would make I/O counts vary); `Flush` sweeps.
        .tuning(idemkv::Tuning::default().stripes(4).sweep_interval(None));
    if let Some(disk) = disk {
        b = b.path("sim.redb").backend(disk.clone());
    }
    b
}

/// A failure of a model run: which operation, what happened, and the steps before it.
#[derive(Debug, Clone)]
pub struct ModelFailure(pub String);

impl std::fmt::Display for ModelFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The sequential model of the whole engine: one [`KeySpec`] per key, plus what is global.
#[derive(Debug, Clone)]
pub struct Model {
    /// The spec configuration.
    pub cfg: SpecConfig,
    /// Every key ever touched.
    pub keys: BTreeMap<Vec<u8>, KeySpec>,
    /// Tokens each key has had, oldest first.
    pub tokens: BTreeMap<Vec<u8>, Vec<u64>>,
    /// Largest token issued over the engine's life (reset only by a `None` restart).
    pub max_token: u64,
    /// Monotonic clock, ns.
    pub now_ns: u64,
    /// Wall clock, ns since the epoch.
    pub wall_ns: u64,
    /// Per key, the claim (its token) whose lease was already over in the file a restart
    /// loaded it from, and when the file says it ended (wall ms): what `records` reports as
    /// its lease end until the claim is extended or replaced.
    pub ended: BTreeMap<Vec<u8>, (u64, u64)>,
}

impl Model {
    /// A model of an empty engine with the clock at `clock`.
    pub fn new(cfg: SpecConfig, clock: &MockClock) -> Self {
        Model {
            cfg,
            keys: BTreeMap::new(),
            tokens: BTreeMap::new(),
            max_token: 0,
            now_ns: ns(clock.monotonic()),
            wall_ns: crate::wall_ns(clock.wall()),
            ended: BTreeMap::new(),
        }
    }

    /// The wall clock in whole ms, as the engine stores instants.
    fn wall_ms(&self) -> u64 {
        self.wall_ns / 1_000_000
    }

    /// The key's spec (Absent if never touched).
    pub fn key(&self, key: &[u8]) -> KeySpec {
        self.keys.get(key).cloned().unwrap_or_else(|| KeySpec {
            max_token: self
                .tokens
                .get(key)
                .and_then(|t| t.last().copied())
                .unwrap_or(0),
            ..KeySpec::at_wall_ns(self.now_ns, self.wall_ns)
        })
    }

    /// Keys holding a live lease: what counts against the in-flight limit.
    pub fn inflight(&self) -> usize {
        self.keys.values().filter(|k| k.is_live()).count()
    }

    /// Keys holding an abandoned claim (lease over, nobody took over, not reaped).
    pub fn abandoned(&self) -> usize {
        self.keys.values().filter(|k| k.is_abandoned()).count()
    }

    /// Checks `ret` for `op` on `key` and advances the model.
    pub fn step(&mut self, key: &[u8], op: &KeyOp, ret: &KeyRet) -> Result<(), String> {
        let spec = self.key(key);
        // Limits that the per-key spec does not know: a claim that would make a lease live
        // (of a new key, or a takeover of an ended one whose fingerprint matches) is refused
        // while the live leases of other keys fill the limit. Ended leases do not count.
        if let KeyOp::Claim { fingerprint, .. } = op {
            let needs_place = match spec.visible() {
                // A marker answers without a lease (these runs keep no markers).
                KeyModel::Absent | KeyModel::Forgotten { .. } => true,
                KeyModel::InFlight {
                    deadline_ns,
                    fingerprint: stored,
                    ..
                } => {
                    spec.now_ns >= *deadline_ns
                        && !matches!((fingerprint, stored), (Some(a), Some(b)) if a != b)
                }
                KeyModel::Completed { .. } => false,
            };
            if needs_place && self.inflight() >= INFLIGHT_MAX {
                return match ret {
                    KeyRet::ClaimErr(ClaimError::Overloaded(Limit::InFlightClaims)) => Ok(()),
                    _ => Err(format!(
                        "{op:?} returned {ret:?}, but {INFLIGHT_MAX} keys are in flight: Overloaded(InFlightClaims) expected"
                    )),
                };
            }
        }
        let next = spec.step(&self.cfg, op, ret).map_err(|m| m.0)?;
        if let KeyRet::Acquired { token, .. } = ret {
            if *token <= self.max_token {
                return Err(format!(
                    "token {token} issued after token {} (tokens must increase over the engine's life)",
                    self.max_token
                ));
            }
            self.max_token = *token;
            self.tokens.entry(key.to_vec()).or_default().push(*token);
        }
        if let (KeyOp::Extend { .. }, KeyRet::Done) = (op, ret) {
            self.ended.remove(key);
        }
        self.keys.insert(key.to_vec(), next);
        Ok(())
    }

    /// The clock moved.
    pub fn advance(&mut self, d: Duration) {
        let op = KeyOp::Advance { ns: ns(d) };
        for k in self.keys.values_mut() {
            if let Ok(next) = k.step(&self.cfg, &op, &KeyRet::Done) {
                *k = next;
            }
        }
        self.now_ns = self.now_ns.saturating_add(ns(d));
        self.wall_ns = self.wall_ns.saturating_add(ns(d));
    }

    /// A sweep ran, then everything queued became durable and published: abandoned claims
    /// past their reap instant are gone.
    pub fn flushed(&mut self) {
        for k in self.keys.values_mut() {
            match &mut k.state {
                KeyModel::Completed { published, .. } => *published = true,
                KeyModel::InFlight { reap_ns, .. } if *reap_ns <= k.now_ns => {
                    k.state = KeyModel::Absent;
                }
                _ => {}
            }
        }
    }

    /// The engine restarted: under `None` everything is gone (and tokens start over);
    /// otherwise what is durable is reloaded, InFlight keys are taken over at once.
    pub fn restarted(&mut self) {
        if self.cfg.durability == Durability::None {
            self.keys.clear();
            self.tokens.clear();
            self.max_token = 0;
            return;
        }
        let (now, wall) = (self.now_ns, self.wall_ms());
        let retention_ms = self.cfg.retention_ns / 1_000_000;
        self.ended.clear();
        for (key, k) in self.keys.iter_mut() {
            let absent = matches!(k.visible(), KeyModel::Absent);
            match &mut k.state {
                _ if absent => k.state = KeyModel::Absent,
                // Recovery deletes a claim past its recorded lease end plus retention, and
                // reaps the others that much after their recorded end.
                // A key's own retention, if it has one, stands in for the engine's.
                KeyModel::InFlight {
                    lease_wall_ms,
                    retention_ms: own,
                    ..
                } if lease_wall_ms.saturating_add(own.unwrap_or(retention_ms)) <= wall => {
                    k.state = KeyModel::Absent;
                }
                KeyModel::InFlight {
                    token,
                    deadline_ns,
                    reap_ns,
                    lease_wall_ms,
                    retention_ms: own,
                    ..
                } => {
                    if *lease_wall_ms <= wall {
                        self.ended.insert(key.clone(), (*token, *lease_wall_ms));
                    }
                    *deadline_ns = now;
                    let left_ms = lease_wall_ms.saturating_add(own.unwrap_or(retention_ms)) - wall;
                    *reap_ns = now.saturating_add(left_ms.saturating_mul(1_000_000));
                }
                KeyModel::Completed { published, .. } => *published = true,
                KeyModel::Absent | KeyModel::Forgotten { .. } => {}
            }
        }
    }

    /// Compares the engine's records with the model.
    pub fn check_records(&self, engine: &Engine) -> Result<(), String> {
        let records = engine.admin().records();
        let mut seen = 0;
        for r in &records {
            let spec = self.key(&r.key);
            let fine = match (spec.visible(), &r.state) {
                (
                    KeyModel::InFlight {
                        token,
                        deadline_ns,
                        fingerprint,
                        attempt,
                        checkpoint,
                        failed,
                        ..
                    },
                    RecordInfoState::InFlight {
                        lease_deadline,
                        checkpoint: c,
                        failed: f,
                        ..
                    },
                ) => {
                    // A lease that is over is reported with the instant it ended; every end
                    // is rounded up to the millisecond (never before the real one).
                    let lease_end_ms = match self.ended.get(&r.key) {
                        Some((t, ended_ms)) if t == token && *deadline_ns <= self.now_ns => {
                            *ended_ms
                        }
                        _ if *deadline_ns >= self.now_ns => self
                            .wall_ms()
                            .saturating_add((deadline_ns - self.now_ns).div_ceil(1_000_000)),
                        _ => self
                            .wall_ms()
                            .saturating_sub((self.now_ns - deadline_ns) / 1_000_000),
                    };
                    r.token == *token
                        && r.fingerprint == fingerprint.map(u128::from)
                        && r.attempt == *attempt
                        && c == checkpoint
                        && f == failed
                        && crate::wall_ms(*lease_deadline) == lease_end_ms
                }
                (
                    KeyModel::Completed {
                        token,
                        fingerprint,
                        attempt,
                        response,
                        expires_wall_ms,
                        published,
                        ..
                    },
                    RecordInfoState::Completed {
                        response: resp,
                        expires_at,
                        published: p,
                    },
                ) => {
                    r.token == *token
                        && r.fingerprint == fingerprint.map(u128::from)
                        && r.attempt == *attempt
                        && resp == response
                        && crate::wall_ms(*expires_at) == *expires_wall_ms
                        && (*p || !*published)
                }
                _ => false,
            };
            if !fine {
                return Err(format!(
                    "record {r:?} does not match the model's {:?}",
                    spec.visible()
                ));
            }
            seen += 1;
        }
        let expected = self
            .keys
            .values()
            .filter(|k| !matches!(k.visible(), KeyModel::Absent))
            .count();
        if seen != expected {
            return Err(format!(
                "the engine lists {seen} records, the model has {expected} live keys: {records:?} vs {:?}",
                self.keys
            ));
        }
        let stats = engine.stats();
        if (stats.inflight, stats.abandoned) != (self.inflight() as u64, self.abandoned() as u64) {
            return Err(format!(
                "stats() has {} live leases and {} abandoned claims, the model {} and {}",
                stats.inflight,
                stats.abandoned,
                self.inflight(),
                self.abandoned()
            ));
        }
        Ok(())
    }
}

/// Runs the engine and the model side by side.
pub struct Harness {
    /// Mode under test.
    pub mode: Durability,
    /// The shared mock clock.
    pub clock: MockClock,
    /// The simulated disk (not under `None`).
    pub disk: Option<FaultyStorage>,
    /// The engine.
    pub engine: Engine,
    /// The model.
    pub model: Model,
    /// What happened so far, for failure reports.
    pub log: Vec<String>,
    restarts: usize,
}

impl Harness {
    /// Opens an engine in `mode` on a fresh simulated disk.
    pub fn open(mode: Durability) -> Result<Harness, ModelFailure> {
        let clock = MockClock::new();
        let disk = (mode != Durability::None).then(FaultyStorage::memory);
        let engine = builder(mode, &clock, disk.as_ref())
            .open()
            .map_err(|e| ModelFailure(format!("open failed: {e}")))?;
        let model = Model::new(spec_config(mode), &clock);
        Ok(Harness {
            mode,
            clock,
            disk,
            engine,
            model,
            log: Vec::new(),
            restarts: 0,
        })
    }
}

/// The token a [`TokenSel`] names for `key`, given the tokens the model has seen.
pub fn pick_token(model: &Model, key: &[u8], sel: TokenSel) -> u64 {
    match sel.0 {
        255 => 0,
        254 => u64::MAX - 1,
        253 => model.max_token,
        v => match model.tokens.get(key) {
            Some(list) if !list.is_empty() => list[list.len() - 1 - usize::from(v) % list.len()],
            _ => 0,
        },
    }
}

impl Harness {
    /// What a call with an invalid key must return, if `key` is invalid.
    pub fn key_error(key: &[u8]) -> Option<ClaimError> {
        if key.is_empty() {
            Some(ClaimError::KeyEmpty)
        } else if key.len() > KEY_LEN_MAX {
            Some(ClaimError::KeyTooLong {
                len: key.len(),
                max: KEY_LEN_MAX,
            })
        } else {
            None
        }
    }

    /// What a lease call with an invalid key must return, if `key` is invalid.
    pub fn lease_key_error(key: &[u8]) -> Option<LeaseError> {
        match Self::key_error(key)? {
            ClaimError::KeyTooLong { len, max } => Some(LeaseError::KeyTooLong { len, max }),
            _ => Some(LeaseError::LeaseLost),
        }
    }

    /// Runs one operation and checks it.
    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        let (key, kop, ret) = match call(&self.engine, &self.model, op) {
            Call::Key { key, op, ret } => (key, op, ret),
            Call::Advance(d) => {
                self.clock.advance(d);
                self.model.advance(d);
                self.log.push(format!("advance {d:?}"));
                return Ok(());
            }
            Call::Flush => {
                self.engine
                    .admin()
                    .sweep_now()
                    .map_err(|err| format!("sweep_now failed: {err}"))?;
                self.engine
                    .flush()
                    .map_err(|err| format!("flush failed: {err}"))?;
                self.model.flushed();
                self.log.push("flush".into());
                return self.model.check_records(&self.engine);
            }
            Call::Restart { power_loss } => {
                if self.restarts >= RESTARTS_MAX {
                    return Ok(());
                }
                self.restarts += 1;
                self.restart(power_loss)?;
                self.log.push(format!("restart (power loss: {power_loss})"));
                return self.model.check_records(&self.engine);
            }
        };
        self.log.push(format!(
            "{:?} {kop:?} -> {ret:?}",
            String::from_utf8_lossy(&key)
        ));
        self.check_call(&key, &kop, &ret)?;
        self.model.check_records(&self.engine)
    }

    /// Checks the result of a call made by [`call`].
    pub fn check_call(&mut self, key: &[u8], kop: &KeyOp, ret: &KeyRet) -> Result<(), String> {
        let invalid = match kop {
            KeyOp::Claim { .. } | KeyOp::Get => Self::key_error(key).map(KeyRet::ClaimErr),
            _ => Self::lease_key_error(key).map(KeyRet::LeaseErr),
        };
        // A call with two faults (an invalid key and an oversized payload) may report either.
        let oversized = match kop {
            KeyOp::Complete { response, .. } if response.len() > RESPONSE_LEN_MAX => {
                Some(KeyRet::LeaseErr(LeaseError::ResponseTooLarge {
                    len: response.len(),
                    max: RESPONSE_LEN_MAX,
                }))
            }
            KeyOp::Checkpoint { data, .. } if data.len() > CHECKPOINT_LEN_MAX => {
                Some(KeyRet::LeaseErr(LeaseError::CheckpointTooLarge {
                    len: data.len(),
                    max: CHECKPOINT_LEN_MAX,
                }))
            }
            _ => None,
        };
        if let Some(expected) = invalid {
            if *ret != expected && Some(ret) != oversized.as_ref() {
                return Err(format!(
                    "{kop:?} on an invalid key returned {ret:?}, expected {expected:?}"
                ));
            }
            return Ok(());
        }
        self.model.step(key, kop, ret)?;
        if self.mode == Durability::Immediate {
            // Under Immediate an acknowledged completion is published before it returns.
            if let (KeyOp::Complete { token, .. }, KeyRet::Done) = (kop, ret) {
                self.model
                    .step(key, &KeyOp::Publish { token: *token }, &KeyRet::Done)?;
            }
        }
        Ok(())
    }

    /// Restarts the engine (see the module docs).
    pub fn restart(&mut self, power_loss: bool) -> Result<(), String> {
        let image = match (&self.disk, power_loss) {
            (None, _) => None,
            (Some(disk), true) => {
                if self.mode != Durability::Immediate {
                    self.engine
                        .flush()
                        .map_err(|e| format!("flush failed: {e}"))?;
                }
                Some(disk.durable_image())
            }
            (Some(disk), false) => {
                self.engine
                    .close()
                    .map_err(|e| format!("close failed: {e}"))?;
                Some(disk.live_image())
            }
        };
        // The old engine may still write to its own disk; the new one reads a copy.
        let _ = self.engine.close();
        self.disk = image.map(FaultyStorage::from_image);
        self.engine = builder(self.mode, &self.clock, self.disk.as_ref())
            .open()
            .map_err(|e| format!("reopen failed: {e}"))?;
        self.model.restarted();
        Ok(())
    }

    /// The steps run so far, one per line.
    pub fn transcript(&self) -> String {
        let mut s = String::new();
        for (i, line) in self.log.iter().enumerate() {
            let _ = writeln!(s, "  {i:>3}: {line}");
        }
        s
    }
}

/// What [`call`] did.
#[derive(Debug, Clone)]
pub enum Call {
    /// A call about one key.
    Key {
        /// The key.
        key: Vec<u8>,
        /// The call as the spec sees it.
        op: KeyOp,
        /// Its result.
        ret: KeyRet,
    },
    /// Not done: move the clock by this much.
    Advance(Duration),
    /// Not done: flush.
    Flush,
    /// Not done: restart.
    Restart {
        /// Lose power instead of closing.
        power_loss: bool,
    },
}

/// Makes the engine call `op` names (tokens picked from `model`); a claim's lease is
/// dropped unsettled, which keeps its key (see [`spec::claim_ret`]). Clock steps, flushes
/// and restarts are left to the caller.
pub fn call(engine: &Engine, model: &Model, op: &Op) -> Call {
    let e = engine;
    let (key, kop, ret) = match *op {
        Op::Claim {
            key,
            fingerprint,
            lease,
            wait,
        } => {
            let key = key.key();
            let mut opts = ClaimOptions::default();
            if let Some(fp) = fingerprint.fingerprint() {
                opts = opts.fingerprint(fp);
            }
            if let Some(l) = lease.lease() {
                opts = opts.lease(l);
            }
            let r = if wait {
                e.claim_or_wait(&key, &opts.wait(Duration::ZERO))
            } else {
                e.claim(&key, &opts)
            };
            let ret = spec::claim_ret(r);
            let kop = KeyOp::Claim {
                fingerprint: fingerprint.fingerprint(),
                lease_ns: lease.lease().map(ns),
                wait,
                retention_ms: None,
            };
            (key, kop, ret)
        }
        Op::Complete {
            key,
            token,
            response,
        } => {
            let key = key.key();
            let token = pick_token(model, &key, token);
            let response = response.bytes(RESPONSE_LEN_MAX);
            let ret = spec::unit_ret(e.complete(&key, token, &response));
            let kop = KeyOp::Complete {
                token,
                response,
                retention_ms: None,
            };
            (key, kop, ret)
        }
        Op::Release { key, token } => {
            let key = key.key();
            let token = pick_token(model, &key, token);
            let ret = spec::release_ret(e.release(&key, token));
            (key, KeyOp::Release { token }, ret)
        }
        Op::Extend { key, token, lease } => {
            let key = key.key();
            let token = pick_token(model, &key, token);
            let d = lease.lease().unwrap_or(LEASE);
            let ret = spec::unit_ret(e.extend(&key, token, d));
            (
                key,
                KeyOp::Extend {
                    token,
                    lease_ns: ns(d),
                },
                ret,
            )
        }
        Op::Checkpoint {
            key,
            token,
            phase,
            data,
        } => {
            let key = key.key();
            let token = pick_token(model, &key, token);
            let data = data.bytes(CHECKPOINT_LEN_MAX);
            let ret = spec::unit_ret(e.checkpoint(&key, token, u32::from(phase), &data));
            let kop = KeyOp::Checkpoint {
                token,
                phase: u32::from(phase),
                data,
            };
            (key, kop, ret)
        }
        Op::Get { key } => {
            let key = key.key();
            let ret = spec::get_ret(e.get(&key));
            (key, KeyOp::Get, ret)
        }
        Op::Advance { by } => return Call::Advance(by.step()),
        Op::Flush => return Call::Flush,
        Op::Restart { power_loss } => return Call::Restart { power_loss },
    };
    Call::Key { key, op: kop, ret }
}

/// Runs `case` in `mode` against the model; at most [`OPS_MAX`] operations.
pub fn run_case(mode: Durability, case: &OpsCase) -> Result<(), ModelFailure> {
    let mut h = Harness::open(mode)?;
    for (i, op) in case.ops.iter().take(OPS_MAX).enumerate() {
        if let Err(why) = h.apply(op) {
            let _ = h.engine.close();
            return Err(ModelFailure(format!(
                "{mode:?}, operation {i} ({op:?}): {why}\nsteps:\n{}",
                h.transcript()
            )));
        }
    }
    h.engine
        .close()
        .map_err(|e| ModelFailure(format!("{mode:?}: close failed: {e}")))?;
    Ok(())
}

/// Runs `case` in every mode.
pub fn run_case_all_modes(case: &OpsCase) -> Result<(), ModelFailure> {
    for mode in modes() {
        run_case(mode, case)?;
    }
    Ok(())
}
