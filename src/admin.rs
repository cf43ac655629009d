//! Operator calls ([`Admin`]): list records, force-release a stuck claim, expire now, import records.
//! They serve the `idemkv` command and tests; services rarely need them.

use crate::clock::{duration_ms, wall_time};
use crate::engine::Engine;
use crate::error::{ClaimError, LeaseError, Limit};
use crate::lease::KeyState;
use crate::machine::{self, Imported};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::SystemTime;

/// One key's record as an operator sees it (and as `export`/`import` move it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordInfo {
    /// The key.
    pub key: Vec<u8>,
    /// The fencing token of the claim that owns or completed the key.
    pub token: u64,
    /// The request fingerprint, if the claim gave one (128 bits; one whose high half is
    /// zero is a 64-bit fingerprint).
    pub fingerprint: Option<u128>,
    /// The attempt number (1 + takeovers).
    pub attempt: u32,
    /// The state.
    pub state: RecordInfoState,
}

/// The state part of a [`RecordInfo`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RecordInfoState {
    /// Claimed, not completed.
    InFlight {
        /// Wall-clock end of the lease (stored to the millisecond).
        lease_deadline: SystemTime,
        /// The saved checkpoint: phase and payload.
        checkpoint: Option<(u32, Vec<u8>)>,
    },
    /// Completed (a completion not yet durable is listed too, as `published: false`).
    Completed {
        /// The stored response.
        response: Vec<u8>,
        /// Wall-clock end of retention (stored to the millisecond).
        expires_at: SystemTime,
        /// Whether the completion is durable and replayed to other callers.
        published: bool,
    },
}

impl RecordInfo {
    /// A short name of the state: `inflight`, `completing` or `completed`.
    pub fn state_name(&self) -> &'static str {
        match &self.state {
            RecordInfoState::InFlight { .. } => "inflight",
            RecordInfoState::Completed {
                published: false, ..
            } => "completing",
            RecordInfoState::Completed { .. } => "completed",
        }
    }
}

/// Why [`Admin::import`] refused a record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImportError {
    /// The key already has a live record in this engine; nothing changed.
    KeyExists,
    /// The record's token is not above every token this engine issued, so importing it
    /// would break fencing. Import into a fresh file, in token order.
    TokenTooSmall {
        /// The record's token.
        token: u64,
        /// The smallest token accepted now.
        min: u64,
    },
    /// The record is malformed (empty key, a completion not yet durable, oversized parts).
    Invalid(String),
    /// The claim-side checks refused it (closed, poisoned, overloaded).
    Engine(ClaimError),
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::KeyExists => f.write_str("the key already has a live record"),
            ImportError::TokenTooSmall { token, min } => write!(
                f,
                "token {token} is below {min}, the next token of this engine; import into a fresh file in token order"
            ),
            ImportError::Invalid(why) => write!(f, "invalid record: {why}"),
            ImportError::Engine(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ImportError {}

/// The operator's calls on an engine: list records, force-release a stuck claim, import
/// exported records, sweep now. They serve the `idemkv` command, migrations and tests; the
/// idempotency API itself is on [`Engine`]. Get one with [`Engine::admin`].
///
/// ```
/// use idemkv::{Durability, Engine};
/// let engine = Engine::builder().durability(Durability::None).open()?;
/// assert!(engine.admin().records().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Admin<'a> {
    engine: &'a Engine,
}

impl Engine {
    /// The operator's calls on this engine ([`Admin`]).
    pub fn admin(&self) -> Admin<'_> {
        Admin { engine: self }
    }
}

impl Admin<'_> {
    /// Every live (unexpired) record, in token order. Takes each stripe lock once, briefly;
    /// a durable engine reads completed responses from the file afterwards.
    pub fn records(&self) -> Vec<RecordInfo> {
        let s = self.engine.shared();
        let mut out = Vec::new();
        let mut from_file = Vec::new();
        for stripe in s.index.stripes() {
            let shard = stripe.map.lock();
            let now = s.time.mono_ns();
            let wall = s.time.wall_ms();
            for (key, slot) in shard.iter().filter(|(_, slot)| !slot.is_expired(now)) {
                let extra = shard.extra(slot);
                let state = if slot.is_inflight() {
                    RecordInfoState::InFlight {
                        lease_deadline: wall_time(
                            wall.saturating_add(slot.deadline_ns.saturating_sub(now) / 1_000_000),
                        ),
                        checkpoint: extra
                            .and_then(|e| e.checkpoint.as_ref())
                            .map(|c| (c.phase(), c.data().to_vec())),
                    }
                } else if let Some(response) = extra.and_then(|e| e.response.as_ref()) {
                    RecordInfoState::Completed {
                        response: response.to_vec(),
                        expires_at: wall_time(extra.map_or(0, |e| e.expires_wall_ms)),
                        published: slot.is_published(),
                    }
                } else {
                    if slot.is_published() {
                        from_file.push(out.len());
                    }
                    // Not yet durable: the response is only in the file once published.
                    RecordInfoState::Completed {
                        response: Vec::new(),
                        expires_at: wall_time(extra.map_or(0, |e| e.expires_wall_ms)),
                        published: slot.is_published(),
                    }
                };
                out.push(RecordInfo {
                    key: key.to_vec(),
                    token: slot.token,
                    fingerprint: extra.and_then(|e| e.fingerprint),
                    attempt: slot.attempt,
                    state,
                });
            }
        }
        let mut gone = std::collections::HashSet::new();
        for i in from_file {
            let r = &mut out[i];
            match self.engine.read_completed(&r.key, r.token, None) {
                Ok(Some(read)) => {
                    r.state = RecordInfoState::Completed {
                        response: read.stored.response.to_vec(),
                        expires_at: wall_time(read.expires_wall_ms),
                        published: true,
                    };
                    r.fingerprint = read.fingerprint;
                }
                // Expired and swept since the walk, or unreadable: not a live record.
                _ => {
                    gone.insert(r.token);
                }
            }
        }
        out.retain(|r| !gone.contains(&r.token));
        out.sort_by_key(|r| r.token);
        out
    }

    /// Releases `key` whatever its token, if it is InFlight: the operator's remedy for a
    /// claim stuck behind a long lease. Returns the record as it was before the release.
    pub fn force_release(&self, key: &[u8]) -> Result<Option<RecordInfo>, ClaimError> {
        self.engine.check_key(key)?;
        let before = match self.engine.get(key)? {
            Some(KeyState::InFlight {
                token,
                attempt,
                lease_remaining,
                checkpoint,
            }) => {
                let wall = self.engine.shared().time.wall_ms();
                RecordInfo {
                    key: key.to_vec(),
                    token,
                    fingerprint: None,
                    attempt,
                    state: RecordInfoState::InFlight {
                        lease_deadline: wall_time(
                            wall.saturating_add(duration_ms(lease_remaining)),
                        ),
                        checkpoint: checkpoint.map(|c| (c.phase(), c.data().to_vec())),
                    },
                }
            }
            _ => return Ok(None),
        };
        match self.engine.release(key, before.token) {
            Ok(true) => Ok(Some(before)),
            // The holder finished or released in between: nothing to force.
            Ok(false) => Ok(None),
            Err(e) => Err(match e {
                LeaseError::Poisoned(why) => ClaimError::Poisoned(why),
                LeaseError::OutcomeUnknown(why) => ClaimError::OutcomeUnknown(why),
                LeaseError::Overloaded(limit) => ClaimError::Overloaded(limit),
                _ => ClaimError::Closed,
            }),
        }
    }

    /// Adds a record exported from another engine (see [`Admin::records`]), durably under
    /// `Immediate`. Records must be imported in token order into an engine whose next token
    /// is not above theirs (a fresh file), so fencing is preserved.
    pub fn import(&self, record: &RecordInfo) -> Result<(), ImportError> {
        self.import_inner(record, true)
    }

    /// [`Admin::import`] without waiting for the record's commit: imports share group
    /// commits, and [`Engine::flush`] makes everything imported so far durable. For bulk
    /// restores, where one fsync per record would take hours.
    pub fn import_queued(&self, record: &RecordInfo) -> Result<(), ImportError> {
        self.import_inner(record, false)
    }

    /// Reclaims every key past its retention, and every abandoned claim past its lease end
    /// plus retention, now, from memory and (through the writer) from the file; returns how
    /// many. Expired keys are already Absent to every call: this only gives their space
    /// back, as the background sweeper does on its own. A reaped abandoned claim is Absent
    /// from then on. A close or a poison during the sweep ends it early with `Closed` or
    /// `Poisoned`.
    pub fn sweep_now(&self) -> Result<u64, ClaimError> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine.pg() {
            return pg.sweep_now(self.engine);
        }
        self.engine.check_open()?;
        let removed = crate::sweep::sweep_all(self.engine.shared());
        self.engine.check_open()?;
        Ok(removed)
    }

    fn import_inner(&self, record: &RecordInfo, wait: bool) -> Result<(), ImportError> {
        self.engine.check_open().map_err(ImportError::Engine)?;
        let s = self.engine.shared();
        if record.key.is_empty() || record.key.len() > s.cfg.key_len_max {
            return Err(ImportError::Invalid(format!(
                "key length {} outside 1..={}",
                record.key.len(),
                s.cfg.key_len_max
            )));
        }
        let key = record.key.as_slice();
        let (mut shard, changed, k) = s.index.lock(key);
        let step = machine::import(shard.view(k), record, s.tokens.next(), s.now(), &s.rules())?;
        if step.answer == Imported::Gone {
            return Ok(());
        }
        if !s.tokens.advance_to(record.token) {
            return Err(ImportError::Engine(ClaimError::TokensExhausted));
        }
        let seq = s
            .queue(step.write, false)
            .map_err(|_| ImportError::Engine(ClaimError::Overloaded(Limit::WriterQueue)))?;
        shard.apply(k, step.change);
        s.count(&mut shard.events, &step.deltas);
        drop(shard);
        changed.notify_all();
        if wait {
            s.wait_durable(seq)
                .map_err(|why| ImportError::Engine(ClaimError::OutcomeUnknown(why)))?;
        }
        Ok(())
    }
}
