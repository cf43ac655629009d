//! Claims: the atomic check-and-write at the heart of idemkv, waiting losers, and `run`.
//!
//! Every decision is taken by `claim_step` under the key's stripe lock, in one step: look at
//! the slot, decide, queue the write (non-blocking), change the slot. Waiting for
//! durability and reading a stored response from the file happen after the lock is dropped.

use crate::clock::{duration_ms, duration_ns};
use crate::codec::{self, Blob, Checkpoint, Record, RecordState};
use crate::constants::*;
use crate::engine::{AckRx, Engine, Sabotage, SendRefused};
use crate::error::{ClaimError, FlushError, Limit, RunError};
use crate::index::{Extra, Shard, Slot};
use crate::lease::{Busy, Claim, KeyState, Lease, Outcome, Stored, TypedOutcome};
use crate::options::ClaimOptions;
use crate::stats::bump;
use crate::sweep::Room;
use crate::sync::{Arc, MutexGuard, Ordering};
use crate::token::Shortage;
use crate::writer::{wait_ack, Op};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// One decision of the state machine, taken under the stripe lock.
enum Step {
    Acquired {
        token: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
        ack: Option<AckRx>,
    },
    Busy(Busy),
    /// A memory-only engine's stored response.
    Replay(Stored),
    /// A durable engine's completion: its response is read from the file, unlocked.
    ReplayFromFile {
        token: u64,
    },
    NeedTokens,
    /// The key budget is full: reclaim what is due elsewhere, then look again.
    NeedRoom,
    /// The in-flight limit is full: move ended leases out of the live count elsewhere,
    /// then look again.
    NeedLeases,
}

/// A completion read back from the file, verified.
pub(crate) struct FromFile {
    pub(crate) stored: Stored,
    pub(crate) expires_wall_ms: u64,
    pub(crate) fingerprint: Option<u64>,
}

/// The InFlight record persisted for a lease.
pub(crate) fn inflight_record(
    key: &[u8],
    fingerprint: Option<u64>,
    attempt: u32,
    checkpoint: Option<Checkpoint>,
    deadline_wall_ms: u64,
) -> Record {
    Record {
        key: Blob(Arc::from(key)),
        fingerprint,
        state: RecordState::InFlight {
            lease_deadline_wall_ms: deadline_wall_ms,
            attempt,
            checkpoint,
        },
    }
}

impl Engine {
    /// The state machine's claim transition. Runs under the stripe lock.
    fn claim_step(
        &self,
        shard: &mut MutexGuard<'_, Shard>,
        key: &[u8],
        opts: &ClaimOptions,
    ) -> Result<Step, ClaimError> {
        let s = self.shared();
        let c = &s.counters;
        let now = s.time.mono_ns();
        let mut takeover = false;
        // A takeover of a lease already seen to end: it holds no place in the live count.
        let mut adopt = false;
        let mut expired = false;
        let mut attempt = 1u32;
        let mut checkpoint = None;
        let mut fingerprint = opts.fingerprint;
        let current = shard.get(key);
        if let Some(slot) = current {
            if slot.is_expired(now) {
                expired = true;
            } else {
                let extra = shard.extra(&slot);
                let stored_fp = extra.and_then(|e| e.fingerprint);
                if let (Some(asked), Some(stored)) = (opts.fingerprint, stored_fp) {
                    if asked != stored {
                        bump(&c.fingerprint_mismatches);
                        return Err(ClaimError::FingerprintMismatch);
                    }
                }
                if !slot.is_inflight() {
                    if !slot.is_published() {
                        bump(&c.in_progress);
                        return Ok(Step::Busy(Busy {
                            retry_after: RETRY_AFTER_UNPUBLISHED,
                            attempt: slot.attempt,
                            completing: true,
                        }));
                    }
                    return Ok(match extra.and_then(|e| e.response.clone()) {
                        Some(response) => {
                            bump(&c.replays);
                            Step::Replay(Stored {
                                response,
                                token: slot.token,
                                attempt: slot.attempt,
                            })
                        }
                        None => Step::ReplayFromFile { token: slot.token },
                    });
                }
                if now < slot.deadline_ns {
                    bump(&c.in_progress);
                    return Ok(Step::Busy(Busy {
                        retry_after: Duration::from_nanos(slot.deadline_ns - now),
                        attempt: slot.attempt,
                        completing: false,
                    }));
                }
                takeover = true;
                adopt = slot.is_abandoned();
                attempt = slot.attempt.saturating_add(1);
                checkpoint = extra.and_then(|e| e.checkpoint.clone());
                fingerprint = fingerprint.or(stored_fp);
            }
        }
        if current.is_none() && !self.admit_new_key(shard, now) {
            return Ok(Step::NeedRoom);
        }
        // Only live leases count against the in-flight limit: the claim is admitted if the
        // live leases of other keys leave room. A takeover of an ended lease that still holds
        // its place inherits it; any other claim reserves one.
        let mut reserved = !takeover || adopt;
        if !reserved && c.inflight.load(Ordering::Acquire) > s.cfg.inflight_max {
            // The count includes the ended lease being replaced, and exceeds the limit only
            // after `extend`s of ended leases. Move this stripe's ended leases (this one
            // among them) out of the count, and decide as for a takeover of an abandoned
            // lease, which reserves a place.
            shard.end_leases(now, usize::MAX);
            adopt = shard.get(key).is_some_and(|slot| slot.is_abandoned());
            reserved = adopt;
        }
        if reserved && !self.reserve_live(shard, now) {
            return Ok(Step::NeedLeases);
        }
        let undo = || {
            if reserved {
                c.inflight.fetch_sub(1, Ordering::AcqRel);
            }
        };
        let token = match s.tokens.issue() {
            Ok(token) => token,
            Err(shortage) => {
                undo();
                return match shortage {
                    Shortage::NeedReserve => Ok(Step::NeedTokens),
                    Shortage::Exhausted => Err(ClaimError::TokensExhausted),
                };
            }
        };
        debug_assert!(
            current.is_none_or(|old| old.token < token),
            "tokens must increase per key"
        );
        // Test-only sabotage: open a check-then-act window, the bug this crate exists to
        // prevent, so that the checkers can show they catch it (docs/testing.md).
        if current.is_none() && self.sabotaged(Sabotage::CheckThenAct) {
            MutexGuard::unlocked(shard, std::thread::yield_now);
        }
        let lease = opts.lease.unwrap_or(s.cfg.lease);
        let (ack, ack_rx) = self.ack_for_mode();
        if s.tx.is_some() {
            let deadline_wall = s.time.wall_ms().saturating_add(duration_ms(lease));
            let op = Op::Put {
                token,
                old: current.map(|slot| slot.token),
                record: inflight_record(
                    key,
                    fingerprint,
                    attempt,
                    checkpoint.clone(),
                    deadline_wall,
                ),
                publish: false,
                ack,
            };
            if let Err(refused) = self.shared().send(op, true) {
                undo();
                return Err(match refused {
                    SendRefused::Full => {
                        bump(&c.overloaded);
                        ClaimError::Overloaded(Limit::WriterQueue)
                    }
                    SendRefused::Closed => ClaimError::Closed,
                });
            }
        }
        if expired {
            c.completed.fetch_sub(1, Ordering::Relaxed);
        }
        let slot = Slot::inflight(token, now.saturating_add(duration_ns(lease)), attempt);
        let extra = Extra {
            fingerprint,
            checkpoint: checkpoint.clone(),
            ..Extra::default()
        };
        if adopt {
            shard.adopt(key);
        }
        shard.put(key, slot, extra);
        bump(&c.acquired);
        if takeover {
            bump(&c.takeovers);
        }
        Ok(Step::Acquired {
            token,
            attempt,
            checkpoint,
            ack: ack_rx,
        })
    }

    /// Whether a new key fits the `keys_max` budget, after reclaiming what this stripe has
    /// due (a bounded batch from the head of its expiry order: O(1) amortized per key, never
    /// a walk). An unexpired record or a live lease is never dropped for room.
    fn admit_new_key(&self, shard: &mut MutexGuard<'_, Shard>, now: u64) -> bool {
        let s = self.shared();
        let c = &s.counters;
        let keys = || {
            c.inflight.load(Ordering::Relaxed)
                + c.abandoned.load(Ordering::Relaxed)
                + c.completed.load(Ordering::Relaxed)
        };
        if keys() < s.cfg.keys_max {
            return true;
        }
        crate::sweep::sweep_stripe(s, shard, now, SWEEP_STRIPE_BATCH);
        keys() < s.cfg.keys_max
    }

    /// Reserves a place in the live count for a new lease. At the limit, the leases of this
    /// stripe that have ended are moved out of the count first (each lease once).
    fn reserve_live(&self, shard: &mut MutexGuard<'_, Shard>, now: u64) -> bool {
        let s = self.shared();
        let reserve = || {
            s.counters
                .inflight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < s.cfg.inflight_max).then_some(n + 1)
                })
                .is_ok()
        };
        reserve() || (shard.end_leases(now, usize::MAX).moved > 0 && reserve())
    }

    /// Turns a decision into the caller's answer: waits for durability under `Immediate`,
    /// reads a stored response from the file. `None`: look again (tokens were reserved, or
    /// the record changed before it could be read).
    fn finish(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
        step: Step,
    ) -> Result<Option<Claim>, ClaimError> {
        match step {
            Step::Acquired {
                token,
                attempt,
                checkpoint,
                ack,
            } => {
                if let Some(rx) = ack {
                    wait_ack(self.shared(), &rx).map_err(ClaimError::OutcomeUnknown)?;
                }
                Ok(Some(Claim::Acquired(Lease {
                    engine: self.clone(),
                    key: Box::from(key),
                    token,
                    attempt,
                    checkpoint,
                    settled: false,
                })))
            }
            Step::Busy(busy) => Ok(Some(Claim::InProgress(busy))),
            Step::Replay(stored) => Ok(Some(Claim::Completed(stored))),
            Step::ReplayFromFile { token } => {
                let read = self.read_completed(key, token, opts.fingerprint)?;
                if read.is_some() {
                    bump(&self.shared().counters.replays);
                }
                Ok(read.map(|r| Claim::Completed(r.stored)))
            }
            Step::NeedTokens => {
                self.shared().flush().map_err(|e| match e {
                    FlushError::Poisoned(why) => ClaimError::Poisoned(why),
                    FlushError::Closed => ClaimError::Closed,
                })?;
                Ok(None)
            }
            Step::NeedRoom => {
                // Reclaim what is due on other stripes (not under this key's lock), then
                // look again; if nothing is due anywhere the budget is truly full, and the
                // refusal costs one read per stripe.
                let s = self.shared();
                match crate::sweep::make_room(s) {
                    Ok(()) => Ok(None),
                    Err(Room::Closed) => Err(ClaimError::Closed),
                    Err(Room::Full) => {
                        bump(&s.counters.overloaded);
                        Err(ClaimError::Overloaded(Limit::Keys))
                    }
                    Err(Room::QueueFull) => {
                        bump(&s.counters.overloaded);
                        Err(ClaimError::Overloaded(Limit::WriterQueue))
                    }
                }
            }
            Step::NeedLeases => {
                // Leases that ended on other stripes still hold places: move them out of
                // the live count, then look again; if none had ended the limit is full.
                let s = self.shared();
                if crate::sweep::end_leases_anywhere(s) == 0 {
                    bump(&s.counters.overloaded);
                    return Err(ClaimError::Overloaded(Limit::InFlightClaims));
                }
                Ok(None)
            }
        }
    }

    /// Reads the completion stored under `token` for `key` and checks its fingerprint.
    /// `Ok(None)`: the record is gone (expired and swept since the slot was seen).
    pub(crate) fn read_completed(
        &self,
        key: &[u8],
        token: u64,
        fingerprint: Option<u64>,
    ) -> Result<Option<FromFile>, ClaimError> {
        let s = self.shared();
        let store = s.store().ok_or(ClaimError::Closed)?;
        let record = match store.get(token) {
            Ok(Some(Ok(record))) => record,
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => {
                return Err(ClaimError::Corrupted(Arc::from(format!(
                    "record under token {token}: {e}"
                ))))
            }
            // redb refuses further writes after an I/O error; stop acknowledging now.
            Err(why) => return Err(ClaimError::Poisoned(s.poison(why))),
        };
        let RecordState::Completed {
            attempt,
            response,
            expires_wall_ms,
            ..
        } = record.state
        else {
            return Err(ClaimError::Corrupted(Arc::from(format!(
                "record under token {token} is not a completion"
            ))));
        };
        if *record.key.0 != *key {
            return Err(ClaimError::Corrupted(Arc::from(format!(
                "record under token {token} belongs to another key"
            ))));
        }
        if let (Some(asked), Some(stored)) = (fingerprint, record.fingerprint) {
            if asked != stored {
                bump(&s.counters.fingerprint_mismatches);
                return Err(ClaimError::FingerprintMismatch);
            }
        }
        Ok(Some(FromFile {
            stored: Stored {
                response: response.0,
                token,
                attempt,
            },
            expires_wall_ms,
            fingerprint: record.fingerprint,
        }))
    }

    /// Claims `key` without waiting: the atomic check-and-write at the heart of idemkv.
    ///
    /// - Absent or expired: a new InFlight lease with a fresh token (`Acquired`).
    /// - InFlight with a live lease: `InProgress`, with a retry hint.
    /// - InFlight with an expired lease: taken over with a new token, attempt + 1 and the
    ///   checkpoint kept (`Acquired`).
    /// - Completed (and durable): `Completed` with the stored response.
    ///
    /// Under `Immediate` an `Acquired` answer is returned once the InFlight record is durable.
    pub fn claim(&self, key: &[u8], opts: &ClaimOptions) -> Result<Claim, ClaimError> {
        self.check_key(key)?;
        self.check_open()?;
        bump(&self.shared().counters.claims);
        loop {
            let step = {
                let (mut shard, _) = self.shared().index.lock(key);
                self.claim_step(&mut shard, key, opts)?
            };
            if let Some(claim) = self.finish(key, opts, step)? {
                return Ok(claim);
            }
        }
    }

    /// Claims `key`, waiting while another holder works on it: returns `Acquired` (the key was
    /// released, or its lease ran out) or `Completed` (the holder finished), or `InProgress`
    /// if the wait ([`ClaimOptions::wait`], default 60 s) ran out first. Waiters are woken by
    /// the holder's completion or release, never by polling.
    pub fn claim_or_wait(&self, key: &[u8], opts: &ClaimOptions) -> Result<Claim, ClaimError> {
        self.check_key(key)?;
        self.check_open()?;
        let s = self.shared();
        bump(&s.counters.claims);
        let wait = opts.wait.unwrap_or(WAIT_DEFAULT);
        let deadline = s.time.mono_ns().saturating_add(duration_ns(wait));
        let mut waited = false;
        loop {
            let step = {
                let (mut shard, changed) = s.index.lock(key);
                loop {
                    if waited {
                        // The outcome being waited for may be lost with the failed commit.
                        if let Some(why) = s.poison_reason() {
                            return Err(ClaimError::OutcomeUnknown(why));
                        }
                        if s.is_closed() {
                            return Err(ClaimError::Closed);
                        }
                    }
                    let step = self.claim_step(&mut shard, key, opts)?;
                    let Step::Busy(busy) = &step else { break step };
                    let now = s.time.mono_ns();
                    if now >= deadline {
                        break step;
                    }
                    // A completing holder's publication wakes us; only a lease deadline is
                    // worth a timed wake-up.
                    let hint = if busy.completing {
                        WAIT_SLICE_MAX
                    } else {
                        busy.retry_after
                    };
                    let slice = hint
                        .min(Duration::from_nanos(deadline - now))
                        .clamp(WAIT_SLICE_MIN, WAIT_SLICE_MAX);
                    bump(&s.counters.waits);
                    waited = true;
                    changed.wait_for(&mut shard, slice);
                }
            };
            if let Some(claim) = self.finish(key, opts, step)? {
                return Ok(claim);
            }
        }
    }

    /// Runs `handler` at most once per key: the winner runs it and stores its bytes; every
    /// concurrent or later caller waits and receives the same bytes with `replayed` set. If
    /// the handler fails, its claim is released and the error returned; a waiting caller
    /// then runs the handler itself.
    ///
    /// ```
    /// use idemkv::{ClaimOptions, Durability, Engine};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let opts = ClaimOptions::default();
    /// let first = engine.run(b"msg-1", &opts, |_lease| Ok::<_, std::io::Error>(b"done".to_vec()))?;
    /// let second = engine.run(b"msg-1", &opts, |_lease| Ok::<_, std::io::Error>(b"again".to_vec()))?;
    /// assert_eq!(first.response(), second.response());
    /// assert!(!first.replayed() && second.replayed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run<E>(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
        handler: impl FnOnce(&Lease) -> Result<Vec<u8>, E>,
    ) -> Result<Outcome, RunError<E>> {
        match self.claim_or_wait(key, opts)? {
            Claim::Acquired(lease) => {
                let token = lease.token();
                match handler(&lease) {
                    Ok(bytes) => {
                        let response: Arc<[u8]> = Arc::from(bytes);
                        lease.complete_arc(response.clone())?;
                        Ok(Outcome {
                            response,
                            replayed: false,
                            token,
                        })
                    }
                    Err(e) => {
                        // The handler's failure is the error to report; a failed release
                        // leaves the lease to expire, which is also safe.
                        let _ = lease.release();
                        Err(RunError::Handler(e))
                    }
                }
            }
            Claim::Completed(stored) => Ok(Outcome {
                response: stored.response,
                replayed: true,
                token: stored.token,
            }),
            Claim::InProgress(busy) => Err(RunError::StillInProgress {
                retry_after: busy.retry_after,
            }),
        }
    }

    /// [`Engine::run`] for a typed response, stored with serde + bincode. Every caller gets an
    /// equal value; a replay decodes the winner's stored bytes.
    pub fn run_typed<T, E>(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
        handler: impl FnOnce(&Lease) -> Result<T, E>,
    ) -> Result<TypedOutcome<T>, RunError<E>>
    where
        T: Serialize + DeserializeOwned,
    {
        match self.claim_or_wait(key, opts)? {
            Claim::Acquired(lease) => match handler(&lease) {
                Ok(value) => {
                    let bytes = codec::encode_value(&value).map_err(RunError::Codec)?;
                    lease.complete_arc(Arc::from(bytes))?;
                    Ok(TypedOutcome {
                        value,
                        replayed: false,
                    })
                }
                Err(e) => {
                    let _ = lease.release();
                    Err(RunError::Handler(e))
                }
            },
            Claim::Completed(stored) => Ok(TypedOutcome {
                value: codec::decode_value(&stored.response).map_err(RunError::Codec)?,
                replayed: true,
            }),
            Claim::InProgress(busy) => Err(RunError::StillInProgress {
                retry_after: busy.retry_after,
            }),
        }
    }

    /// The key's visible state, or `None` if it is Absent (never claimed, released, or past
    /// its retention). A durable engine reads a completed key's response from the file.
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyState>, ClaimError> {
        self.check_key(key)?;
        self.check_open()?;
        let s = self.shared();
        loop {
            let token = {
                let (shard, _) = s.index.lock(key);
                let now = s.time.mono_ns();
                let Some(slot) = shard.get(key).filter(|slot| !slot.is_expired(now)) else {
                    return Ok(None);
                };
                let extra = shard.extra(&slot);
                if slot.is_inflight() {
                    return Ok(Some(KeyState::InFlight {
                        token: slot.token,
                        attempt: slot.attempt,
                        lease_remaining: Duration::from_nanos(slot.deadline_ns.saturating_sub(now)),
                        checkpoint: extra.and_then(|e| e.checkpoint.clone()),
                    }));
                }
                if !slot.is_published() {
                    return Ok(Some(KeyState::Completing { token: slot.token }));
                }
                if let Some(e) = extra.filter(|e| e.response.is_some()) {
                    return Ok(Some(KeyState::Completed {
                        token: slot.token,
                        attempt: slot.attempt,
                        response: e.response.clone().unwrap_or_else(|| Arc::from(&[][..])),
                        expires_at: Duration::from_millis(e.expires_wall_ms),
                    }));
                }
                slot.token
            };
            if let Some(read) = self.read_completed(key, token, None)? {
                return Ok(Some(KeyState::Completed {
                    token: read.stored.token,
                    attempt: read.stored.attempt,
                    response: read.stored.response,
                    expires_at: Duration::from_millis(read.expires_wall_ms),
                }));
            }
        }
    }
}
