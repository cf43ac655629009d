//! Operator calls: list records, force-release a stuck claim, expire now, import records.
//! They serve the `idemkv` command and tests; services rarely need them.

use crate::codec::{Blob, Checkpoint, Record, RecordState};
use crate::engine::Engine;
use crate::error::{ClaimError, Limit};
use crate::index::{Slot, SlotState};
use crate::stats::bump;
use crate::sync::{Arc, Ordering};
use crate::writer::{wait_ack, Op};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One key's record as an operator sees it (and as `export`/`import` move it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordInfo {
    /// The key.
    pub key: Vec<u8>,
    /// The fencing token of the claim that owns or completed the key.
    pub token: u64,
    /// The request fingerprint, if the claim gave one.
    pub fingerprint: Option<u64>,
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
        /// Wall-clock end of the lease, ms since the epoch.
        lease_deadline_ms: u64,
        /// The saved checkpoint: phase and payload.
        checkpoint: Option<(u32, Vec<u8>)>,
    },
    /// Completed (a completion not yet durable is listed too, as `published: false`).
    Completed {
        /// The stored response.
        response: Vec<u8>,
        /// Wall-clock end of retention, ms since the epoch.
        expires_at_ms: u64,
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

/// Why [`Engine::import`] refused a record.
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

fn info(key: &[u8], slot: &Slot, now_ns: u64, now_wall_ms: u64) -> RecordInfo {
    let state = match &slot.state {
        SlotState::InFlight {
            deadline_ns,
            checkpoint,
        } => RecordInfoState::InFlight {
            lease_deadline_ms: now_wall_ms
                .saturating_add(deadline_ns.saturating_sub(now_ns) / 1_000_000),
            checkpoint: checkpoint
                .as_deref()
                .map(|c| (c.phase(), c.data().to_vec())),
        },
        SlotState::Completed {
            response,
            expires_wall_ms,
            published,
            ..
        } => RecordInfoState::Completed {
            response: response.to_vec(),
            expires_at_ms: *expires_wall_ms,
            published: *published,
        },
    };
    RecordInfo {
        key: key.to_vec(),
        token: slot.token,
        fingerprint: slot.fingerprint,
        attempt: slot.attempt,
        state,
    }
}

impl Engine {
    /// Every live (unexpired) record, in token order. Takes each stripe lock once, briefly.
    pub fn records(&self) -> Vec<RecordInfo> {
        let s = self.shared();
        let mut out = Vec::new();
        for stripe in s.index.stripes() {
            let map = stripe.map.lock();
            let now = s.time.mono_ns();
            let wall = s.time.wall_ms();
            out.extend(
                map.iter()
                    .filter(|(_, slot)| !slot.is_expired(now))
                    .map(|(key, slot)| info(key, slot, now, wall)),
            );
        }
        out.sort_by_key(|r| r.token);
        out
    }

    /// Releases `key` whatever its token, if it is InFlight: the operator's remedy for a
    /// claim stuck behind a long lease. Returns the record as it was before the release.
    pub fn force_release(&self, key: &[u8]) -> Result<Option<RecordInfo>, ClaimError> {
        let before = {
            let s = self.shared();
            let map = s.index.lock(key).0;
            let now = s.time.mono_ns();
            match map.get(key) {
                Some(slot) if slot.is_inflight() => info(key, slot, now, s.time.wall_ms()),
                _ => return Ok(None),
            }
        };
        match self.release(key, before.token) {
            Ok(true) => Ok(Some(before)),
            // The holder finished or released in between: nothing to force.
            Ok(false) => Ok(None),
            Err(e) => Err(match e {
                crate::LeaseError::Poisoned(why) => ClaimError::Poisoned(why),
                crate::LeaseError::OutcomeUnknown(why) => ClaimError::OutcomeUnknown(why),
                crate::LeaseError::Overloaded(limit) => ClaimError::Overloaded(limit),
                _ => ClaimError::Closed,
            }),
        }
    }

    /// Removes every expired record from memory and queues its deletion from the file.
    /// Returns how many were removed. Expired records are already Absent to every call;
    /// this reclaims their space. Stops early (returning what it did) if the writer queue
    /// fills up.
    pub fn sweep_now(&self) -> Result<u64, ClaimError> {
        self.check_open()?;
        let s = self.shared();
        let mut removed = 0u64;
        for stripe in s.index.stripes() {
            let mut map = stripe.map.lock();
            let now = s.time.mono_ns();
            let expired: Vec<(Box<[u8]>, u64)> = map
                .iter()
                .filter(|(_, slot)| slot.is_expired(now))
                .map(|(k, slot)| (k.clone(), slot.token))
                .collect();
            for (key, token) in expired {
                if self.send(Op::Delete { token, ack: None }, false).is_err() {
                    bump(&s.counters.overloaded);
                    return Ok(removed);
                }
                map.remove(&key);
                s.counters.completed.fetch_sub(1, Ordering::Relaxed);
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Adds a record exported from another engine (see [`Engine::records`]), durably under
    /// `Immediate`. Records must be imported in token order into an engine whose next token
    /// is not above theirs (a fresh file), so fencing is preserved.
    pub fn import(&self, record: &RecordInfo) -> Result<(), ImportError> {
        self.check_open().map_err(ImportError::Engine)?;
        let s = self.shared();
        if record.key.is_empty() || record.key.len() > s.cfg.key_len_max {
            return Err(ImportError::Invalid(format!(
                "key length {} outside 1..={}",
                record.key.len(),
                s.cfg.key_len_max
            )));
        }
        let key = record.key.as_slice();
        let (mut map, changed) = s.index.lock(key);
        let now = s.time.mono_ns();
        let wall = s.time.wall_ms();
        let old = match map.get(key) {
            Some(slot) if !slot.is_expired(now) => return Err(ImportError::KeyExists),
            Some(slot) => Some(slot.token),
            None => None,
        };
        let min = s.tokens.next();
        if record.token < min || record.token == u64::MAX {
            return Err(ImportError::TokenTooSmall {
                token: record.token,
                min,
            });
        }
        let (slot, state) = match &record.state {
            RecordInfoState::InFlight {
                lease_deadline_ms,
                checkpoint,
            } => {
                let checkpoint = checkpoint.as_ref().map(|(p, d)| Checkpoint::new(*p, d));
                let left_ns = lease_deadline_ms
                    .saturating_sub(wall)
                    .saturating_mul(1_000_000);
                (
                    SlotState::InFlight {
                        deadline_ns: now.saturating_add(left_ns),
                        checkpoint: checkpoint.clone().map(Box::new),
                    },
                    RecordState::InFlight {
                        lease_deadline_wall_ms: *lease_deadline_ms,
                        attempt: record.attempt,
                        checkpoint,
                    },
                )
            }
            RecordInfoState::Completed {
                published: false, ..
            } => return Err(ImportError::Invalid("a completion not yet durable".into())),
            RecordInfoState::Completed {
                response,
                expires_at_ms,
                ..
            } => {
                if response.len() > s.cfg.response_len_max {
                    return Err(ImportError::Invalid("response too large".into()));
                }
                let response: Arc<[u8]> = Arc::from(response.as_slice());
                let left_ns = expires_at_ms.saturating_sub(wall).saturating_mul(1_000_000);
                (
                    SlotState::Completed {
                        response: response.clone(),
                        expires_ns: now.saturating_add(left_ns),
                        expires_wall_ms: *expires_at_ms,
                        published: true,
                    },
                    RecordState::Completed {
                        response: Blob(response),
                        attempt: record.attempt,
                        completed_wall_ms: wall,
                        expires_wall_ms: *expires_at_ms,
                    },
                )
            }
        };
        if let RecordInfoState::Completed { expires_at_ms, .. } = &record.state {
            if *expires_at_ms <= wall {
                // Already past its retention: importing it would resurrect nothing useful.
                return Ok(());
            }
        }
        if !s.tokens.advance_to(record.token) {
            return Err(ImportError::Engine(ClaimError::TokensExhausted));
        }
        let (ack, rx) = crate::writer::ack_pair();
        let op = Op::Put {
            token: record.token,
            old,
            record: Record {
                key: Blob(Arc::from(key)),
                fingerprint: record.fingerprint,
                state,
            },
            publish: None,
            ack: Some(ack),
        };
        self.send(op, false)
            .map_err(|_| ImportError::Engine(ClaimError::Overloaded(Limit::WriterQueue)))?;
        let new = Slot {
            token: record.token,
            fingerprint: record.fingerprint,
            attempt: record.attempt,
            state: slot,
        };
        if let Some(old_slot) = map.insert(Box::from(key), new) {
            // Only an expired completion can be replaced here.
            debug_assert!(!old_slot.is_inflight());
            s.counters.completed.fetch_sub(1, Ordering::Relaxed);
        }
        if record.state_name() == "inflight" {
            s.counters.inflight.fetch_add(1, Ordering::Relaxed);
        } else {
            s.counters.completed.fetch_add(1, Ordering::Relaxed);
        }
        drop(map);
        changed.notify_all();
        if s.tx.is_some() {
            wait_ack(s, &rx).map_err(|why| ImportError::Engine(ClaimError::OutcomeUnknown(why)))?;
        }
        Ok(())
    }
}
