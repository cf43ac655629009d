//! The sequential specification of one key: the state machine of docs/design.md as a function from
//! (state, operation, observed result) to the next state, or a reason the result is wrong.
//!
//! The engine chooses some things the spec cannot predict (the value of a new token, the
//! moment a durable completion is published), so the spec is a *relation*: it checks the
//! observed result against every answer the contract allows, and follows the one the engine
//! gave. The sequential model of `ops_model` and the linearizability checker of
//! `concurrent_claims` and the stress test both use it.

use idemkv::{ClaimError, Durability, KeyState, LeaseError};
use std::fmt;
use std::time::Duration;

/// The retry hint the contract gives while a completion is written but not yet durable
/// (the engine's `constants::RETRY_AFTER_UNPUBLISHED`, stated here as the spec expects it).
pub const RETRY_AFTER_UNPUBLISHED: Duration = Duration::from_millis(1);

/// The wall-clock time (ms) of the monotonic instant `at_ns`, given the wall time
/// `wall_now_ns` (since the epoch) at the monotonic instant `now_ns`: how the contract
/// turns a lease deadline into the wall-clock time it stores and reports, rounded up to
/// the millisecond (never before the real end).
fn wall_ms_at(wall_now_ns: u64, now_ns: u64, at_ns: u64) -> u64 {
    let wall = u128::from(wall_now_ns);
    let at = if at_ns >= now_ns {
        wall + u128::from(at_ns - now_ns)
    } else {
        wall.saturating_sub(u128::from(now_ns - at_ns))
    };
    u64::try_from(at.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// What the spec needs to know about the engine under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    /// The engine's durability mode (decides whether a completion is published at once).
    pub durability: Durability,
    /// The engine's default lease, in ns.
    pub lease_ns: u64,
    /// The engine's retention, in ns.
    pub retention_ns: u64,
    /// Largest response accepted.
    pub response_len_max: usize,
    /// Largest checkpoint accepted.
    pub checkpoint_len_max: usize,
    /// Check wall-clock fields (`expires_at`). Only sound when the clock moves between
    /// operations, never during one (sequential runs).
    pub check_wall: bool,
    /// The engine's marker retention, in ns (`None`: no markers): a completion past its
    /// retention is answered `Forgotten` for this much longer.
    pub marker_retention_ns: Option<u64>,
}

impl SpecConfig {
    /// Whether a completion is published (shown to other callers) the moment it is made.
    pub fn publishes_at_once(&self) -> bool {
        self.durability == Durability::None
    }
}

/// One key's state in the spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum KeyModel {
    /// Never claimed, released, or gone after retention.
    #[default]
    Absent,
    /// Claimed.
    InFlight {
        /// Owner's token.
        token: u64,
        /// Monotonic end of the lease, ns.
        deadline_ns: u64,
        /// Stored fingerprint.
        fingerprint: Option<u64>,
        /// 1 + takeovers.
        attempt: u32,
        /// Saved checkpoint.
        checkpoint: Option<(u32, Vec<u8>)>,
        /// Monotonic instant from which a sweep reaps the claim if nobody took it over:
        /// `retention` after its lease end (after a restart: after its recorded lease end).
        reap_ns: u64,
        /// Wall-clock lease end written in its record, ms.
        lease_wall_ms: u64,
        /// The key's own retention, ms (`None`: the engine's): its claim's, or the one a
        /// takeover kept. It sets `reap_ns` and is its completion's unless that chooses one.
        retention_ms: Option<u64>,
        /// Its holder failed the attempt (`fail`): the lease ended, the record kept.
        failed: bool,
    },
    /// Completed.
    Completed {
        /// Completing token.
        token: u64,
        /// Stored fingerprint.
        fingerprint: Option<u64>,
        /// Completing attempt.
        attempt: u32,
        /// Stored response.
        response: Vec<u8>,
        /// Monotonic end of retention, ns.
        expires_ns: u64,
        /// Wall-clock end of retention, ms.
        expires_wall_ms: u64,
        /// Wall-clock instant of the completion, ms (what a marker it leaves reports).
        completed_wall_ms: u64,
        /// Whether another caller may see it yet.
        published: bool,
    },
    /// What a completion past its retention left (markers on): the key was completed and
    /// its response is no longer kept. To every call but a claim it is Absent.
    Forgotten {
        /// Completing token.
        token: u64,
        /// Stored fingerprint.
        fingerprint: Option<u64>,
        /// Completing attempt.
        attempt: u32,
        /// Wall-clock instant of the completion, ms.
        completed_wall_ms: u64,
        /// Monotonic end of the marker, ns: the key is new from then on.
        end_ns: u64,
        /// Whether its row is committed (a durable engine's marker left by a sweep is
        /// settled when the writer publishes it; until then claims get InProgress).
        settled: bool,
    },
}

/// The spec's whole state for one key: the key, the clock, and the largest token seen.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct KeySpec {
    /// The key's state.
    pub state: KeyModel,
    /// Monotonic clock, ns.
    pub now_ns: u64,
    /// Wall clock, ms.
    pub wall_ms: u64,
    /// Wall clock, the ns past `wall_ms` (below one ms).
    pub wall_sub_ns: u64,
    /// Largest token this key has had (a new one must be above it).
    pub max_token: u64,
}

/// An operation on one key (or on the clock, which every key sees).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOp {
    /// `claim` (or `claim_or_wait` when `wait`, which is linearizable as a claim).
    Claim {
        /// Fingerprint given.
        fingerprint: Option<u64>,
        /// Lease asked for, ns (`None`: the engine's default).
        lease_ns: Option<u64>,
        /// Whether it was `claim_or_wait`.
        wait: bool,
        /// The claim's own retention, ms (`ClaimOptions::retention`).
        retention_ms: Option<u64>,
    },
    /// `complete(token, response)`, or `complete_with_options` with a retention.
    Complete {
        /// Token given.
        token: u64,
        /// Response given.
        response: Vec<u8>,
        /// The completion's own retention, ms (`CompleteOptions::retention`).
        retention_ms: Option<u64>,
    },
    /// `release(token)`.
    Release {
        /// Token given.
        token: u64,
    },
    /// `fail(token)`: end the attempt, keep the record.
    Fail {
        /// Token given.
        token: u64,
    },
    /// `extend(token, lease)`.
    Extend {
        /// Token given.
        token: u64,
        /// New lease, ns.
        lease_ns: u64,
    },
    /// `checkpoint(token, phase, data)`.
    Checkpoint {
        /// Token given.
        token: u64,
        /// Phase given.
        phase: u32,
        /// Payload given.
        data: Vec<u8>,
    },
    /// `get`.
    Get,
    /// The mock clock moved forward.
    Advance {
        /// By how much, ns.
        ns: u64,
    },
    /// Not a call: the writer published `token`'s completion. Under `Immediate` a
    /// successful `complete` returns only after it, so the history gives each such
    /// completion one of these with the same interval.
    Publish {
        /// The completing token.
        token: u64,
    },
}

/// A result as the spec compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRet {
    /// `Claim::Acquired`.
    Acquired {
        /// New token.
        token: u64,
        /// Attempt.
        attempt: u32,
        /// Checkpoint handed over.
        checkpoint: Option<(u32, Vec<u8>)>,
    },
    /// `Claim::InProgress`.
    InProgress {
        /// Retry hint, ns.
        retry_after_ns: u64,
        /// Holder's attempt.
        attempt: u32,
    },
    /// `Claim::Completed`.
    Replayed {
        /// Completing token.
        token: u64,
        /// Completing attempt.
        attempt: u32,
        /// Stored response.
        response: Vec<u8>,
    },
    /// `Claim::Forgotten`: the key was completed, its response is no longer kept.
    Forgotten {
        /// Wall-clock instant of the completion, ms.
        completed_wall_ms: u64,
        /// Completing attempt.
        attempt: u32,
    },
    /// `Ok(())` of complete, extend, checkpoint; the pseudo-op `Publish`; `Advance`.
    Done,
    /// `release` returned `Ok(b)`.
    Released(bool),
    /// `fail` returned `Ok(b)`.
    Failed(bool),
    /// `get` returned this.
    Got(Option<GotState>),
    /// A claim or get failed.
    ClaimErr(ClaimError),
    /// A lease call failed.
    LeaseErr(LeaseError),
}

/// [`KeyState`] in a comparable form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GotState {
    /// InFlight.
    InFlight {
        /// Token.
        token: u64,
        /// Attempt.
        attempt: u32,
        /// Lease left, ns.
        lease_remaining_ns: u64,
        /// Checkpoint.
        checkpoint: Option<(u32, Vec<u8>)>,
        /// Failed by its holder.
        failed: bool,
    },
    /// Completion not yet durable.
    Completing {
        /// Token.
        token: u64,
    },
    /// Completed.
    Completed {
        /// Token.
        token: u64,
        /// Attempt.
        attempt: u32,
        /// Response.
        response: Vec<u8>,
        /// Wall end of retention, ms.
        expires_wall_ms: u64,
    },
}

impl GotState {
    /// Converts what `get` returned.
    pub fn from_key_state(s: &KeyState) -> Option<GotState> {
        Some(match s {
            KeyState::InFlight {
                token,
                attempt,
                lease_remaining,
                checkpoint,
                failed,
                ..
            } => GotState::InFlight {
                token: *token,
                attempt: *attempt,
                lease_remaining_ns: ns(*lease_remaining),
                checkpoint: checkpoint.as_ref().map(|c| (c.phase(), c.data().to_vec())),
                failed: *failed,
            },
            KeyState::Completing { token } => GotState::Completing { token: *token },
            KeyState::Completed {
                token,
                attempt,
                response,
                expires_at,
            } => GotState::Completed {
                token: *token,
                attempt: *attempt,
                response: response.to_vec(),
                expires_wall_ms: crate::wall_ms(*expires_at),
            },
            #[allow(unreachable_patterns)]
            _ => return None,
        })
    }
}

/// A duration in ns, saturating (as the engine counts).
pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Why a result is not one the contract allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch(pub String);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad<T>(op: &KeyOp, ret: &KeyRet, state: &KeySpec, allowed: &str) -> Result<T, Mismatch> {
    Err(Mismatch(format!(
        "{op:?} returned {ret:?}, but in state {:?} at t={}ns the contract allows {allowed}",
        state.state, state.now_ns
    )))
}

/// How long a key is kept, ns: its own retention (ms) if it has one, else the engine's.
fn keep_ns(cfg: &SpecConfig, own_ms: Option<u64>) -> u64 {
    own_ms.map_or(cfg.retention_ns, |ms| ms.saturating_mul(1_000_000))
}

/// Whether the key is Absent at `now` (no slot, or a completion past its retention) to
/// every call but a claim, which also looks at a marker.
fn is_absent(state: &KeyModel, now: u64) -> bool {
    match state {
        KeyModel::Absent | KeyModel::Forgotten { .. } => true,
        KeyModel::Completed { expires_ns, .. } => now >= *expires_ns,
        KeyModel::InFlight { .. } => false,
    }
}

impl KeyModel {
    /// The marker this state is at `now` under `cfg`, if a claim is to be answered from one:
    /// a marker not yet at its end, or a completion past its retention within the marker
    /// window (which the claim turns into its marker, waiting for its commit).
    pub fn marker_at(&self, cfg: &SpecConfig, now: u64) -> Option<KeyModel> {
        let window = cfg.marker_retention_ns?;
        match self {
            KeyModel::Forgotten { end_ns, .. } if now < *end_ns => Some(self.clone()),
            KeyModel::Completed {
                token,
                fingerprint,
                attempt,
                expires_ns,
                completed_wall_ms,
                ..
            } if now >= *expires_ns && now < expires_ns.saturating_add(window) => {
                Some(KeyModel::Forgotten {
                    token: *token,
                    fingerprint: *fingerprint,
                    attempt: *attempt,
                    completed_wall_ms: *completed_wall_ms,
                    end_ns: expires_ns.saturating_add(window),
                    settled: true,
                })
            }
            _ => None,
        }
    }
}

impl KeySpec {
    /// A key that is Absent, with the clock at `now_ns` / `wall_ms`.
    pub fn new(now_ns: u64, wall_ms: u64) -> Self {
        Self::at_wall_ns(now_ns, wall_ms.saturating_mul(1_000_000))
    }

    /// A key that is Absent, with the clock at `now_ns` / `wall_ns` (since the epoch).
    pub fn at_wall_ns(now_ns: u64, wall_ns: u64) -> Self {
        KeySpec {
            state: KeyModel::Absent,
            now_ns,
            wall_ms: wall_ns / 1_000_000,
            wall_sub_ns: wall_ns % 1_000_000,
            max_token: 0,
        }
    }

    /// The wall clock, ns since the epoch.
    pub fn wall_ns(&self) -> u64 {
        self.wall_ms
            .saturating_mul(1_000_000)
            .saturating_add(self.wall_sub_ns)
    }

    /// The state as a caller may observe it now (expired completions are Absent).
    pub fn visible(&self) -> &KeyModel {
        if is_absent(&self.state, self.now_ns) {
            &KeyModel::Absent
        } else {
            &self.state
        }
    }

    /// Whether the key holds an InFlight slot (live or not).
    pub fn is_inflight(&self) -> bool {
        matches!(self.state, KeyModel::InFlight { .. })
    }

    /// Whether the key holds a live lease (its end not reached): what counts against the
    /// in-flight limit and the engine's `inflight` gauge.
    pub fn is_live(&self) -> bool {
        matches!(self.state, KeyModel::InFlight { deadline_ns, .. } if self.now_ns < deadline_ns)
    }

    /// Whether the key holds an abandoned claim: InFlight, its lease over, not yet reaped
    /// (the engine's `abandoned` gauge).
    pub fn is_abandoned(&self) -> bool {
        self.is_inflight() && !self.is_live()
    }

    /// When something kept `keep_ns` from now ends: the first whole wall millisecond at or
    /// after the exact end (as the record stores it), and the monotonic instant of it. Memory
    /// and file end together, never early. Zero ends now.
    fn end_on_wall_grid(&self, keep_ns: u64) -> (u64, u64) {
        if keep_ns == 0 {
            return (self.now_ns, self.wall_ms);
        }
        // ceil((wall + keep) / 1 ms), in parts that cannot overflow.
        let end_ms = self
            .wall_ms
            .saturating_add(keep_ns / 1_000_000)
            .saturating_add((keep_ns % 1_000_000 + self.wall_sub_ns).div_ceil(1_000_000));
        let left_ns = end_ms
            .saturating_sub(self.wall_ms)
            .saturating_mul(1_000_000)
            .saturating_sub(self.wall_sub_ns);
        (self.now_ns.saturating_add(left_ns), end_ms)
    }

    /// Checks `ret` as the result of `op` and returns the state after it.
    pub fn step(&self, cfg: &SpecConfig, op: &KeyOp, ret: &KeyRet) -> Result<KeySpec, Mismatch> {
        let mut next = self.clone();
        let now = self.now_ns;
        match op {
            KeyOp::Advance { ns } => {
                next.now_ns = now.saturating_add(*ns);
                let wall_ns = self.wall_ns().saturating_add(*ns);
                next.wall_ms = wall_ns / 1_000_000;
                next.wall_sub_ns = wall_ns % 1_000_000;
                Ok(next)
            }
            KeyOp::Publish { token } => {
                match &mut next.state {
                    KeyModel::InFlight { token: t, .. } if t == token => {
                        return bad(op, ret, self, "a publish only after its completion")
                    }
                    KeyModel::Completed {
                        token: t,
                        published,
                        ..
                    } if t == token => *published = true,
                    KeyModel::Forgotten {
                        token: t, settled, ..
                    } if t == token => *settled = true,
                    _ => {}
                }
                Ok(next)
            }
            KeyOp::Claim {
                fingerprint,
                lease_ns,
                wait: _,
                retention_ms,
            } => self.claim(cfg, op, ret, *fingerprint, *lease_ns, *retention_ms),
            KeyOp::Complete {
                token,
                response,
                retention_ms: asked_ms,
            } => {
                if response.len() > cfg.response_len_max {
                    return match ret {
                        KeyRet::LeaseErr(LeaseError::ResponseTooLarge { len, max })
                            if *len == response.len() && *max == cfg.response_len_max =>
                        {
                            Ok(next)
                        }
                        _ => bad(op, ret, self, "ResponseTooLarge"),
                    };
                }
                match self.visible() {
                    KeyModel::Completed { token: t, .. } if t == token => {
                        if *ret != KeyRet::Done {
                            return bad(op, ret, self, "Ok (a repeat of the same token)");
                        }
                        // A repeat waits until the first completion is durable.
                        if let KeyModel::Completed { published, .. } = &mut next.state {
                            *published = true;
                        }
                        Ok(next)
                    }
                    KeyModel::InFlight {
                        token: t,
                        fingerprint,
                        attempt,
                        retention_ms,
                        ..
                    } if t == token => {
                        if *ret != KeyRet::Done {
                            return bad(op, ret, self, "Ok (the token owns the key)");
                        }
                        // The completion's own retention, else its claim's, else the
                        // engine's.
                        let own = asked_ms.or(*retention_ms);
                        let (expires_ns, expires_wall_ms) =
                            self.end_on_wall_grid(keep_ns(cfg, own));
                        next.state = KeyModel::Completed {
                            token: *t,
                            fingerprint: *fingerprint,
                            attempt: *attempt,
                            response: response.clone(),
                            expires_ns,
                            expires_wall_ms,
                            completed_wall_ms: self.wall_ms,
                            published: cfg.publishes_at_once(),
                        };
                        Ok(next)
                    }
                    _ => match ret {
                        KeyRet::LeaseErr(LeaseError::LeaseLost) => Ok(next),
                        _ => bad(op, ret, self, "LeaseLost (the token does not own the key)"),
                    },
                }
            }
            KeyOp::Release { token } => match self.visible() {
                KeyModel::InFlight { token: t, .. } if t == token => match ret {
                    KeyRet::Released(true) => {
                        next.state = KeyModel::Absent;
                        Ok(next)
                    }
                    _ => bad(op, ret, self, "Ok(true)"),
                },
                _ => match ret {
                    KeyRet::Released(false) => Ok(next),
                    _ => bad(op, ret, self, "Ok(false)"),
                },
            },
            KeyOp::Fail { token } => match &mut next.state {
                KeyModel::InFlight {
                    token: t,
                    deadline_ns,
                    reap_ns,
                    lease_wall_ms,
                    failed,
                    retention_ms,
                    ..
                } if t == token => match ret {
                    KeyRet::Failed(true) => {
                        // The lease ends now; one already over keeps its end and reap instant.
                        // Reaped by the key's own retention, as an abandoned claim is.
                        if now < *deadline_ns {
                            *deadline_ns = now;
                            *reap_ns = now.saturating_add(keep_ns(cfg, *retention_ms));
                        }
                        *lease_wall_ms = wall_ms_at(self.wall_ns(), now, *deadline_ns);
                        *failed = true;
                        Ok(next)
                    }
                    _ => bad(op, ret, self, "Ok(true)"),
                },
                _ => match ret {
                    KeyRet::Failed(false) => Ok(next),
                    _ => bad(op, ret, self, "Ok(false)"),
                },
            },
            // A failed attempt is never extended: its token gets `LeaseLost`.
            KeyOp::Extend { token, lease_ns } => match &mut next.state {
                KeyModel::InFlight {
                    token: t,
                    deadline_ns,
                    reap_ns,
                    lease_wall_ms,
                    retention_ms,
                    failed: false,
                    ..
                } if t == token => {
                    if *ret != KeyRet::Done {
                        return bad(op, ret, self, "Ok");
                    }
                    *deadline_ns = now.saturating_add(*lease_ns);
                    *reap_ns = deadline_ns.saturating_add(keep_ns(cfg, *retention_ms));
                    *lease_wall_ms = wall_ms_at(self.wall_ns(), now, *deadline_ns);
                    Ok(next)
                }
                _ => match ret {
                    KeyRet::LeaseErr(LeaseError::LeaseLost) => Ok(next),
                    _ => bad(op, ret, self, "LeaseLost"),
                },
            },
            KeyOp::Checkpoint { token, phase, data } => {
                if data.len() > cfg.checkpoint_len_max {
                    return match ret {
                        KeyRet::LeaseErr(LeaseError::CheckpointTooLarge { len, max })
                            if *len == data.len() && *max == cfg.checkpoint_len_max =>
                        {
                            Ok(next)
                        }
                        _ => bad(op, ret, self, "CheckpointTooLarge"),
                    };
                }
                match &mut next.state {
                    KeyModel::InFlight {
                        token: t,
                        checkpoint,
                        deadline_ns,
                        lease_wall_ms,
                        ..
                    } if t == token => {
                        if *ret != KeyRet::Done {
                            return bad(op, ret, self, "Ok");
                        }
                        *checkpoint = Some((*phase, data.clone()));
                        // The record is rewritten with the lease's own end, also when it
                        // is already over.
                        *lease_wall_ms = wall_ms_at(self.wall_ns(), now, *deadline_ns);
                        Ok(next)
                    }
                    _ => match ret {
                        KeyRet::LeaseErr(LeaseError::LeaseLost) => Ok(next),
                        _ => bad(op, ret, self, "LeaseLost"),
                    },
                }
            }
            KeyOp::Get => self.get(cfg, op, ret),
        }
    }

    fn claim(
        &self,
        cfg: &SpecConfig,
        op: &KeyOp,
        ret: &KeyRet,
        asked_fp: Option<u64>,
        lease_ns: Option<u64>,
        asked_retention_ms: Option<u64>,
    ) -> Result<KeySpec, Mismatch> {
        let now = self.now_ns;
        let lease = lease_ns.unwrap_or(cfg.lease_ns);
        let mut next = self.clone();
        let acquire = |next: &mut KeySpec,
                       attempt: u32,
                       checkpoint: Option<(u32, Vec<u8>)>,
                       fingerprint: Option<u64>,
                       retention_ms: Option<u64>|
         -> Result<(), Mismatch> {
            match ret {
                KeyRet::Acquired {
                    token,
                    attempt: a,
                    checkpoint: c,
                } if *token > self.max_token
                    && *token != u64::MAX
                    && *a == attempt
                    && *c == checkpoint =>
                {
                    next.max_token = *token;
                    let deadline_ns = now.saturating_add(lease);
                    next.state = KeyModel::InFlight {
                        token: *token,
                        deadline_ns,
                        fingerprint,
                        attempt,
                        checkpoint,
                        reap_ns: deadline_ns.saturating_add(keep_ns(cfg, retention_ms)),
                        // The claim's whole lease from the exact wall reading, rounded up
                        // (not bounded by the monotonic deadline's saturation).
                        lease_wall_ms: u64::try_from(
                            (u128::from(self.wall_ns()) + u128::from(lease)).div_ceil(1_000_000),
                        )
                        .unwrap_or(u64::MAX),
                        retention_ms,
                        failed: false,
                    };
                    Ok(())
                }
                _ => bad(
                    op,
                    ret,
                    self,
                    &format!(
                        "Acquired with a token above {}, attempt {attempt}, checkpoint {checkpoint:?}",
                        self.max_token
                    ),
                ),
            }
        };
        if let Some(marker) = self.state.marker_at(cfg, now) {
            let KeyModel::Forgotten {
                fingerprint,
                attempt,
                completed_wall_ms,
                settled,
                ..
            } = marker
            else {
                unreachable!("a marker is Forgotten")
            };
            next.state = marker;
            return match ret {
                KeyRet::ClaimErr(ClaimError::FingerprintMismatch)
                    if asked_fp.is_some() && fingerprint.is_some() && asked_fp != fingerprint =>
                {
                    Ok(next)
                }
                KeyRet::InProgress {
                    retry_after_ns,
                    attempt: a,
                } if !settled
                    && *retry_after_ns == ns(RETRY_AFTER_UNPUBLISHED)
                    && *a == attempt =>
                {
                    Ok(next)
                }
                KeyRet::Forgotten {
                    completed_wall_ms: c,
                    attempt: a,
                } if settled
                    && *a == attempt
                    && (!cfg.check_wall || *c == completed_wall_ms)
                    && (asked_fp.is_none() || fingerprint.is_none() || asked_fp == fingerprint) =>
                {
                    Ok(next)
                }
                _ => bad(
                    op,
                    ret,
                    self,
                    "Forgotten with the completion's time and attempt (FingerprintMismatch for \
                     another fingerprint; InProgress until a marker's row is committed)",
                ),
            };
        }
        let state = self.visible().clone();
        if let KeyModel::Absent = state {
            acquire(&mut next, 1, None, asked_fp, asked_retention_ms)?;
            return Ok(next);
        }
        let stored_fp = match &state {
            KeyModel::InFlight { fingerprint, .. } | KeyModel::Completed { fingerprint, .. } => {
                *fingerprint
            }
            KeyModel::Absent | KeyModel::Forgotten { .. } => None,
        };
        if let (Some(a), Some(s)) = (asked_fp, stored_fp) {
            if a != s {
                return match ret {
                    KeyRet::ClaimErr(ClaimError::FingerprintMismatch) => Ok(next),
                    _ => bad(op, ret, self, "FingerprintMismatch"),
                };
            }
        }
        match state {
            KeyModel::Absent | KeyModel::Forgotten { .. } => unreachable!("handled above"),
            KeyModel::Completed {
                token,
                attempt,
                response,
                published,
                ..
            } => match ret {
                KeyRet::Replayed {
                    token: t,
                    attempt: a,
                    response: r,
                } if *t == token && *a == attempt && *r == response => {
                    if let KeyModel::Completed { published, .. } = &mut next.state {
                        *published = true;
                    }
                    Ok(next)
                }
                KeyRet::InProgress {
                    retry_after_ns,
                    attempt: a,
                } if !published
                    && *retry_after_ns == ns(RETRY_AFTER_UNPUBLISHED)
                    && *a == attempt =>
                {
                    Ok(next)
                }
                _ => bad(
                    op,
                    ret,
                    self,
                    if published {
                        "Completed with the stored response"
                    } else {
                        "Completed with the stored response, or InProgress until it is durable"
                    },
                ),
            },
            KeyModel::InFlight {
                deadline_ns,
                attempt,
                ..
            } if now < deadline_ns => match ret {
                KeyRet::InProgress {
                    retry_after_ns,
                    attempt: a,
                } if *retry_after_ns == deadline_ns - now && *a == attempt => Ok(next),
                _ => bad(
                    op,
                    ret,
                    self,
                    &format!(
                        "InProgress (retry after {}ns, attempt {attempt})",
                        deadline_ns - now
                    ),
                ),
            },
            KeyModel::InFlight {
                fingerprint,
                attempt,
                checkpoint,
                retention_ms,
                ..
            } => {
                // A takeover keeps the key's retention unless the claim asks for its own.
                acquire(
                    &mut next,
                    attempt.saturating_add(1),
                    checkpoint,
                    asked_fp.or(fingerprint),
                    asked_retention_ms.or(retention_ms),
                )?;
                Ok(next)
            }
        }
    }

    fn get(&self, cfg: &SpecConfig, op: &KeyOp, ret: &KeyRet) -> Result<KeySpec, Mismatch> {
        let mut next = self.clone();
        let KeyRet::Got(got) = ret else {
            return bad(op, ret, self, "a state");
        };
        let ok = match (self.visible(), got) {
            (KeyModel::Absent, None) => true,
            (
                KeyModel::InFlight {
                    token,
                    deadline_ns,
                    attempt,
                    checkpoint,
                    failed,
                    ..
                },
                Some(GotState::InFlight {
                    token: t,
                    attempt: a,
                    lease_remaining_ns,
                    checkpoint: c,
                    failed: f,
                }),
            ) => {
                t == token
                    && a == attempt
                    && c == checkpoint
                    && *lease_remaining_ns == deadline_ns.saturating_sub(self.now_ns)
                    && f == failed
            }
            (
                KeyModel::Completed {
                    token,
                    published: false,
                    ..
                },
                Some(GotState::Completing { token: t }),
            ) => t == token,
            (
                KeyModel::Completed {
                    token,
                    attempt,
                    response,
                    expires_wall_ms,
                    ..
                },
                Some(GotState::Completed {
                    token: t,
                    attempt: a,
                    response: r,
                    expires_wall_ms: e,
                }),
            ) => {
                let fine = t == token
                    && a == attempt
                    && r == response
                    && (!cfg.check_wall || e == expires_wall_ms);
                if fine {
                    if let KeyModel::Completed { published, .. } = &mut next.state {
                        *published = true;
                    }
                }
                fine
            }
            _ => false,
        };
        if ok {
            Ok(next)
        } else {
            bad(op, ret, self, "the state itself")
        }
    }
}

/// Converts a claim's result. A lease is dropped at once, unsettled: it keeps its key
/// InFlight until the lease ends, as a holder that never decides does in the spec; the
/// operations settle it by key and token.
pub fn claim_ret(r: Result<idemkv::Claim, ClaimError>) -> KeyRet {
    match r {
        Ok(idemkv::Claim::Acquired(lease)) => {
            let ret = KeyRet::Acquired {
                token: lease.token(),
                attempt: lease.attempt(),
                checkpoint: lease.checkpoint().map(|c| (c.phase(), c.data().to_vec())),
            };
            drop(lease);
            ret
        }
        Ok(idemkv::Claim::InProgress(busy)) => KeyRet::InProgress {
            retry_after_ns: ns(busy.retry_after()),
            attempt: busy.attempt(),
        },
        Ok(idemkv::Claim::Completed(stored)) => KeyRet::Replayed {
            token: stored.token(),
            attempt: stored.attempt(),
            response: stored.response().to_vec(),
        },
        Ok(idemkv::Claim::Forgotten(forgotten)) => KeyRet::Forgotten {
            completed_wall_ms: crate::wall_ms(forgotten.completed_at()),
            attempt: forgotten.attempt(),
        },
        Err(e) => KeyRet::ClaimErr(e),
    }
}

/// Converts `complete`, `extend` or `checkpoint`'s result.
pub fn unit_ret(r: Result<(), LeaseError>) -> KeyRet {
    match r {
        Ok(()) => KeyRet::Done,
        Err(e) => KeyRet::LeaseErr(e),
    }
}

/// Converts `release`'s result.
pub fn release_ret(r: Result<bool, LeaseError>) -> KeyRet {
    match r {
        Ok(b) => KeyRet::Released(b),
        Err(e) => KeyRet::LeaseErr(e),
    }
}

/// Converts `fail`'s result.
pub fn fail_ret(r: Result<bool, LeaseError>) -> KeyRet {
    match r {
        Ok(b) => KeyRet::Failed(b),
        Err(e) => KeyRet::LeaseErr(e),
    }
}

/// Converts `get`'s result.
pub fn get_ret(r: Result<Option<KeyState>, ClaimError>) -> KeyRet {
    match r {
        Ok(None) => KeyRet::Got(None),
        Ok(Some(s)) => match GotState::from_key_state(&s) {
            Some(g) => KeyRet::Got(Some(g)),
            None => KeyRet::ClaimErr(ClaimError::Closed),
        },
        Err(e) => KeyRet::ClaimErr(e),
    }
}
