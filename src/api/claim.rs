//! Claims: the atomic check-and-write at the heart of idemkv, waiting losers, and `run`.
//!
//! Every decision is taken by the state machine (`model/machine/`), applied by `claim_step`
//! under the key's stripe lock in one step: look at the slot, decide, queue the write
//! (non-blocking), change the slot. Waiting for
//! durability and reading a stored response from the file happen after the lock is dropped.

use crate::api::admin::known_time;
use crate::api::constants::{CLAIM_LOOKS_MAX, WAIT_DEFAULT};
use crate::api::engine::Engine;
use crate::api::lease::{Busy, Claim, Forgotten, KeyState, Lease, Outcome, Stored, TypedOutcome};
#[cfg(doc)]
use crate::api::options::OnHandlerError;
use crate::api::options::{AskedFingerprint, ClaimOptions};
#[cfg(feature = "postgres")]
use crate::api::remote::{Remote, RemoteAnswer, RemoteAsk};
use crate::base::clock::{duration_ns, wall_time};
use crate::base::sabotage::fault_point;
use crate::base::sync::{Arc, MutexGuard, Ordering};
use crate::index::key::Key;
use crate::index::shard::{Forgot, Shard};
use crate::index::stats::{bump, Events};
use crate::model::codec::{self, Checkpoint, RecordState};
use crate::model::error::{ClaimError, FlushError, LeaseError, Limit, NotStoredReason, RunError};
use crate::model::machine::{self, Acquired, Acquiring, ClaimAnswer, KeyRef, MarkerAnswer, Now};
use crate::model::token::Shortage;
use crate::runtime::constants::{SWEEP_STRIPE_BATCH, WAIT_SLICE_MAX, WAIT_SLICE_MIN};
use crate::runtime::queue::SendRefused;
use crate::runtime::sweep::Room;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// One decision of the state machine, taken under the stripe lock.
pub(crate) enum Step {
    Acquired {
        token: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
        /// The InFlight record's durability number to wait for (0: none).
        durable: u64,
    },
    Busy(Busy),
    /// A memory-only engine's stored response.
    Replay(Stored),
    /// A durable engine's completion: its response is read from the file, unlocked.
    ReplayFromFile {
        token: u64,
    },
    /// The key was completed and its response is no longer kept: a marker answered.
    Forgotten(Forgotten),
    /// The claim found the key's completion past its retention and turned it into its
    /// marker: look again once the marker's row (operation `seq`) is committed.
    Forgetting {
        seq: u64,
    },
    NeedTokens,
    /// The key budget is full: reclaim what is due elsewhere, then look again.
    NeedRoom,
    /// The in-flight limit is full: move ended leases out of the live count elsewhere,
    /// then look again.
    NeedLeases,
}

/// A decision turned into an answer, or the durability wait that still stands before it.
pub(crate) enum Prepared {
    Ready(Result<Claim, Again>),
    /// Acquired under `Immediate`: the lease, once its InFlight record (number `seq`) is
    /// durable.
    Durable {
        seq: u64,
        lease: Lease,
    },
    /// Tokens ran out: a barrier commits a new high-water mark; look again once it is
    /// durable.
    Tokens,
    /// A marker is being made (`Step::Forgetting`): look again once operation `seq` is
    /// durable, when the writer has settled the marker.
    Marker {
        seq: u64,
    },
}

/// Runs a blocking handler, renewing its lease meanwhile unless the options turn it off.
fn kept_alive<T>(lease: &Lease, opts: &ClaimOptions, handler: impl FnOnce(&Lease) -> T) -> T {
    let _renewing = opts.keep_alive_max().map(|max| lease.keep_alive(max));
    handler(lease)
}

pub(crate) fn flush_to_claim(e: FlushError) -> ClaimError {
    match e {
        FlushError::Poisoned(why) => ClaimError::Poisoned(why),
        FlushError::Closed => ClaimError::Closed,
    }
}

/// Why a decision could not be turned into an answer and the call must look at its key
/// again. Every kind follows progress made by others, and a call looks at most
/// `CLAIM_LOOKS_MAX` times, so no claim loops forever.
#[derive(Clone, Copy)]
pub(crate) enum Again {
    /// Tokens were reserved (a flush committed a new high-water mark).
    Tokens,
    /// Expired keys were reclaimed to make room under the key budget.
    Room,
    /// Ended leases were moved out of the live count to make room under the in-flight
    /// limit.
    Leases,
    /// The stored record changed (expired and swept) before it could be read.
    Record,
    /// The key's completion was turned into its marker, whose row is now committed.
    Marker,
}

impl Again {
    /// The answer once a call has looked `CLAIM_LOOKS_MAX` times.
    fn exhausted(self, engine: &Engine) -> ClaimError {
        match self {
            Again::Room => {
                bump(&engine.shared().counters().overloaded);
                ClaimError::Overloaded(Limit::Keys)
            }
            Again::Leases => {
                bump(&engine.shared().counters().overloaded);
                ClaimError::Overloaded(Limit::InFlightClaims)
            }
            Again::Tokens | Again::Record | Again::Marker => ClaimError::Contended,
        }
    }
}

/// What a claim's look at the key's marker decided.
enum MarkerLook {
    /// The answer, from the marker (or the wait for its commit).
    Answer(Step),
    /// Decide on the slot as without markers; an acquiring claim drops the marker
    /// `(hash, token)` with its write.
    Proceed(Option<(u64, u64)>),
}

/// A completion read back from the file, verified.
pub(crate) struct FromFile {
    pub(crate) stored: Stored,
    pub(crate) expires_wall_ms: u64,
    pub(crate) fingerprint: Option<u128>,
    pub(crate) first_claimed_wall_ms: u64,
}

impl Engine {
    /// A claim's transition (`machine::claim`, then `machine::acquire`), under the stripe
    /// lock: decide, admit, issue a token, queue the write, change the slot.
    pub(crate) fn claim_step(
        &self,
        shard: &mut MutexGuard<'_, Shard>,
        k: Key<'_>,
        key: &Arc<[u8]>,
        opts: &ClaimOptions,
    ) -> Result<Step, ClaimError> {
        debug_assert_eq!(
            k.bytes(),
            &key[..],
            "the call's key and its hashed form agree"
        );
        let s = self.shared();
        let c = s.counters();
        let retention_ms = opts.retention_ms()?;
        let rules = s.rules();
        let now = s.now();
        // The second tier (docs/retention.md): a key without a slot is answered from its
        // marker, and a completion past its retention becomes its marker first.
        let mut drop_marker = None;
        if s.cfg().marker_retention.is_some() {
            match self.marker_step(shard, k, opts, now)? {
                MarkerLook::Answer(step) => return Ok(step),
                MarkerLook::Proceed(dropped) => drop_marker = dropped,
            }
        }
        let decided = machine::claim(shard.view(k), opts.fingerprint, opts.claim_id, now.mono_ns);
        s.count(&mut shard.events, &decided.deltas);
        let mut plan = match decided.answer {
            ClaimAnswer::Acquire(plan) => plan,
            ClaimAnswer::Busy(busy) => return Ok(Step::Busy(busy)),
            ClaimAnswer::Replay(stored) => return Ok(Step::Replay(stored)),
            ClaimAnswer::ReplayFromFile { token } => return Ok(Step::ReplayFromFile { token }),
            ClaimAnswer::Resume { token } => return self.resume_step(shard, k, key, opts, token),
            ClaimAnswer::FingerprintMismatch => return Err(ClaimError::FingerprintMismatch),
        };
        if plan.kind == Acquiring::New && !self.admit_new_key(shard, now.mono_ns) {
            return Ok(Step::NeedRoom);
        }
        if !plan.reserve {
            plan = self.replan_over_inflight_limit(shard, k, opts, now, plan);
        }
        let reserved = plan.reserve;
        if reserved && !self.reserve_live(shard, now.mono_ns) {
            return Ok(Step::NeedLeases);
        }
        let undo = || {
            if reserved {
                c.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
            }
        };
        let token = match s.tokens().issue() {
            Ok(token) => token,
            Err(shortage) => {
                undo();
                return match shortage {
                    Shortage::NeedReserve => Ok(Step::NeedTokens),
                    Shortage::Exhausted => Err(ClaimError::TokensExhausted),
                };
            }
        };
        // Test-only sabotage: open a check-then-act window, the bug this crate exists to
        // prevent, so that the checkers can show they catch it (docs/testing.md).
        if plan.kind == Acquiring::New && fault_point!(s.faults(), CheckThenAct) {
            crate::index::stripes::unlocked(shard, std::thread::yield_now);
        }
        let lease = opts.lease.unwrap_or(s.cfg().lease);
        let plan = plan.asking_retention(retention_ms);
        let step = machine::acquire(plan, KeyRef::Shared(key), token, lease, now, &rules);
        let seq = match s.queue_dropping(step.write, drop_marker, true) {
            Ok(seq) => seq,
            Err(refused) => {
                undo();
                return Err(self.claim_refused(refused));
            }
        };
        shard.apply(k, step.change, seq);
        if let Some((hash, marker_token)) = drop_marker {
            shard.drop_marker(hash, marker_token);
        }
        s.count(&mut shard.events, &step.deltas);
        let Acquired {
            token,
            attempt,
            checkpoint,
        } = step.answer;
        Ok(Step::Acquired {
            token,
            attempt,
            checkpoint,
            durable: if self.waits_for_durability() { seq } else { 0 },
        })
    }

    /// Only live leases count against the in-flight limit: the claim is admitted if the
    /// live leases of other keys leave room. A takeover of an ended lease that still holds
    /// its place (`plan` does not reserve) inherits it; any other claim reserves one.
    /// When the count is over the limit, it includes the ended lease being replaced (it
    /// exceeds the limit only after `extend`s of ended leases): this moves the stripe's
    /// ended leases (this one among them) out of the count, and decides again: as a
    /// takeover of an abandoned lease, which reserves a place.
    #[inline]
    fn replan_over_inflight_limit(
        &self,
        shard: &mut MutexGuard<'_, Shard>,
        k: Key<'_>,
        opts: &ClaimOptions,
        now: Now,
        plan: machine::Plan,
    ) -> machine::Plan {
        let s = self.shared();
        if s.counters().gauges.inflight.load(Ordering::Acquire) <= s.cfg().inflight_max {
            return plan;
        }
        shard.end_leases(now.mono_ns, usize::MAX);
        match machine::claim(shard.view(k), opts.fingerprint, opts.claim_id, now.mono_ns).answer {
            ClaimAnswer::Acquire(again) => again,
            _ => plan,
        }
    }

    /// The error of a claim whose write the writer queue refused (a full queue is counted
    /// as an overload).
    fn claim_refused(&self, refused: SendRefused) -> ClaimError {
        match refused {
            SendRefused::Full => {
                bump(&self.shared().counters().overloaded);
                ClaimError::Overloaded(Limit::WriterQueue)
            }
            SendRefused::Poisoned(why) => ClaimError::Poisoned(why),
            SendRefused::Closed => ClaimError::Closed,
        }
    }

    /// A claim that presents its key's holder's claim identity resumes that lease
    /// (`machine::resume`), under the stripe lock: the lease is renewed for the claim's
    /// lease and its record rewritten, as an `extend` would, and the claim is answered with
    /// the holder's token, attempt and checkpoint.
    fn resume_step(
        &self,
        shard: &mut MutexGuard<'_, Shard>,
        k: Key<'_>,
        key: &Arc<[u8]>,
        opts: &ClaimOptions,
        token: u64,
    ) -> Result<Step, ClaimError> {
        let s = self.shared();
        let lease = opts.lease.unwrap_or(s.cfg().lease);
        let now = s.now();
        let rules = s.rules();
        let step = machine::resume(
            shard.view(k),
            KeyRef::Shared(key),
            token,
            lease,
            now,
            &rules,
        )
        // The look that answered `Resume` saw this lease under the same lock.
        .ok_or(ClaimError::Contended)?;
        let seq = s
            .queue(step.write, false)
            .map_err(|refused| match refused {
                SendRefused::Full => {
                    bump(&s.counters().overloaded);
                    ClaimError::Overloaded(Limit::WriterQueue)
                }
                SendRefused::Poisoned(why) => ClaimError::Poisoned(why),
                SendRefused::Closed => ClaimError::Closed,
            })?;
        shard.apply(k, step.change, seq);
        s.count(&mut shard.events, &step.deltas);
        let Acquired {
            token,
            attempt,
            checkpoint,
        } = step.answer;
        Ok(Step::Acquired {
            token,
            attempt,
            checkpoint,
            durable: if self.waits_for_durability() { seq } else { 0 },
        })
    }

    /// The claim's look at the key's marker, under the stripe lock (markers on). A
    /// completion past its retention whose marker window is open is expired first, as the
    /// sweeper would expire it, leaving its marker (a durable engine's look waits for the
    /// marker's commit, then looks again). A key without a slot is then decided on its
    /// marker by the state machine ([`machine::claim_marker`]).
    fn marker_step(
        &self,
        shard: &mut MutexGuard<'_, Shard>,
        k: Key<'_>,
        opts: &ClaimOptions,
        now: Now,
    ) -> Result<MarkerLook, ClaimError> {
        let s = self.shared();
        match shard.get(k) {
            Some(slot) if !slot.is_expired(now.mono_ns) => return Ok(MarkerLook::Proceed(None)),
            Some(_) => {
                let mut queued = 0;
                let mut refused = None;
                let mut events = Events::default();
                let forgot = shard.forget(k, now.mono_ns, &mut |step| match s
                    .queue(step.write.clone(), false)
                {
                    Ok(seq) => {
                        s.count(&mut events, &step.deltas);
                        queued = seq;
                        true
                    }
                    Err(why) => {
                        refused = Some(why);
                        false
                    }
                });
                shard.events.merge(&events);
                match forgot {
                    // Its marker window is over too: the claim replaces it as without markers.
                    Forgot::Nothing => return Ok(MarkerLook::Proceed(None)),
                    Forgot::Marked(marker) if marker.is_pending() => {
                        return Ok(MarkerLook::Answer(Step::Forgetting { seq: queued }))
                    }
                    Forgot::Marked(_) => {}
                    Forgot::Refused => {
                        return Err(match refused {
                            Some(SendRefused::Poisoned(why)) => ClaimError::Poisoned(why),
                            Some(SendRefused::Closed) => ClaimError::Closed,
                            Some(SendRefused::Full) | None => {
                                bump(&s.counters().overloaded);
                                ClaimError::Overloaded(Limit::WriterQueue)
                            }
                        })
                    }
                }
            }
            None => {}
        }
        let Some(marker) = shard.marker(k) else {
            return Ok(MarkerLook::Proceed(None));
        };
        let decided = machine::claim_marker(&marker, opts.fingerprint, opts.rerun_forgotten, now);
        s.count(&mut shard.events, &decided.deltas);
        Ok(match decided.answer {
            MarkerAnswer::Forgotten(forgotten) => MarkerLook::Answer(Step::Forgotten(forgotten)),
            MarkerAnswer::Busy(busy) => MarkerLook::Answer(Step::Busy(busy)),
            MarkerAnswer::FingerprintMismatch => return Err(ClaimError::FingerprintMismatch),
            MarkerAnswer::Acquire => MarkerLook::Proceed(Some((marker.hash, marker.token))),
        })
    }

    /// One look of a claim that does not wait: the decision under the stripe lock, the call
    /// counted at its first look.
    pub(crate) fn look(
        &self,
        key: &Arc<[u8]>,
        opts: &ClaimOptions,
        first: bool,
    ) -> Result<Step, ClaimError> {
        let (mut shard, _, k) = self.shared().index().lock(key);
        if first {
            self.shared().count_claim(&mut shard.events);
        }
        self.claim_step(&mut shard, k, key, opts)
    }

    /// Whether a new key fits the `keys_max` budget, after reclaiming what this stripe has
    /// due (a bounded batch from the head of its expiry order: O(1) amortized per key, never
    /// a walk). An unexpired record or a live lease is never dropped for room.
    fn admit_new_key(&self, shard: &mut MutexGuard<'_, Shard>, now: u64) -> bool {
        let s = self.shared();
        let gauges = &s.counters().gauges;
        if gauges.keys() < s.cfg().keys_max {
            return true;
        }
        crate::runtime::sweep::sweep_stripe(s, shard, now, SWEEP_STRIPE_BATCH);
        gauges.keys() < s.cfg().keys_max
    }

    /// Reserves a place in the live count for a new lease. At the limit, the leases of this
    /// stripe that have ended are moved out of the count first (each lease once).
    fn reserve_live(&self, shard: &mut MutexGuard<'_, Shard>, now: u64) -> bool {
        let s = self.shared();
        let reserve = || {
            s.counters()
                .gauges
                .inflight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < s.cfg().inflight_max).then_some(n + 1)
                })
                .is_ok()
        };
        reserve() || (shard.end_leases(now, usize::MAX).moved > 0 && reserve())
    }

    /// Turns a decision into the caller's answer, or into what it must still wait for,
    /// without blocking: reads a stored response from the file, queues a barrier for tokens.
    /// The blocking (`finish`) and async drivers only add the wait.
    pub(crate) fn prepare(
        &self,
        key: &Arc<[u8]>,
        opts: &ClaimOptions,
        step: Step,
    ) -> Result<Prepared, ClaimError> {
        match step {
            Step::Acquired {
                token,
                attempt,
                checkpoint,
                durable,
            } => {
                // The lease exists before its durability wait; a caller that stops waiting
                // (a dropped future) never received it, and `Won` releases the claim.
                let lease = Lease {
                    engine: self.clone(),
                    // The call's scoped key, shared: no copy per lease.
                    key: Arc::clone(key),
                    token,
                    attempt,
                    checkpoint,
                    lease: opts.lease.unwrap_or(self.shared().cfg().lease),
                    settled: false,
                    staged: Default::default(),
                };
                Ok(if durable == 0 {
                    Prepared::Ready(Ok(Claim::Acquired(lease)))
                } else {
                    Prepared::Durable {
                        seq: durable,
                        lease,
                    }
                })
            }
            Step::Busy(busy) => Ok(Prepared::Ready(Ok(Claim::InProgress(busy)))),
            Step::Replay(stored) => Ok(Prepared::Ready(Ok(Claim::Completed(stored)))),
            Step::ReplayFromFile { token } => {
                match self.read_completed(key, token, opts.fingerprint)? {
                    Some(read) => {
                        bump(&self.shared().counters().replays);
                        Ok(Prepared::Ready(Ok(Claim::Completed(read.stored))))
                    }
                    None => Ok(Prepared::Ready(Err(Again::Record))),
                }
            }
            Step::Forgotten(forgotten) => Ok(Prepared::Ready(Ok(Claim::Forgotten(forgotten)))),
            Step::Forgetting { seq } => Ok(Prepared::Marker { seq }),
            Step::NeedTokens => Ok(Prepared::Tokens),
            step => self.make_room(step).map(Prepared::Ready),
        }
    }

    /// The error of a durability wait that failed, for a claim: the claim's own record
    /// (`Acquired`) may or may not have been committed.
    pub(crate) fn claim_wait_failed(&self, why: Arc<str>) -> ClaimError {
        ClaimError::OutcomeUnknown(why)
    }

    /// The error of a failed wait for a marker's commit: the claim changed nothing of its
    /// own, so the engine's state is the answer.
    pub(crate) fn marker_wait_failed(&self) -> ClaimError {
        match self.shared().poison_reason() {
            Some(why) => ClaimError::Poisoned(why),
            None => ClaimError::Closed,
        }
    }

    /// The blocking driver of [`Engine::prepare`].
    fn finish(
        &self,
        key: &Arc<[u8]>,
        opts: &ClaimOptions,
        step: Step,
    ) -> Result<Result<Claim, Again>, ClaimError> {
        match self.prepare(key, opts, step)? {
            Prepared::Ready(answer) => Ok(answer),
            Prepared::Durable { seq, lease } => {
                self.shared()
                    .wait_durable(seq)
                    .map_err(|why| self.claim_wait_failed(why))?;
                Ok(Ok(Claim::Acquired(lease)))
            }
            Prepared::Tokens => {
                self.shared().flush().map_err(flush_to_claim)?;
                Ok(Err(Again::Tokens))
            }
            Prepared::Marker { seq } => {
                self.shared()
                    .wait_durable(seq)
                    .map_err(|_| self.marker_wait_failed())?;
                Ok(Err(Again::Marker))
            }
        }
    }

    /// The decisions that need room first: reclaim keys, or end leases, elsewhere.
    fn make_room(&self, step: Step) -> Result<Result<Claim, Again>, ClaimError> {
        match step {
            Step::NeedRoom => {
                // Reclaim what is due on other stripes (not under this key's lock), then
                // look again; if nothing is due anywhere the budget is truly full, and the
                // refusal costs one read per stripe. A sweep cut short by a close or a
                // poison says so.
                let s = self.shared();
                match crate::runtime::sweep::make_room(s) {
                    Ok(()) => Ok(Err(Again::Room)),
                    Err(Room::Closed) => {
                        self.check_open()?;
                        Err(ClaimError::Closed)
                    }
                    Err(Room::Full) => {
                        bump(&s.counters().overloaded);
                        Err(ClaimError::Overloaded(Limit::Keys))
                    }
                    Err(Room::QueueFull) => {
                        bump(&s.counters().overloaded);
                        Err(ClaimError::Overloaded(Limit::WriterQueue))
                    }
                }
            }
            Step::NeedLeases => {
                // Leases that ended on other stripes still hold places: move them out of
                // the live count, then look again; if none had ended the limit is full.
                let s = self.shared();
                if crate::runtime::sweep::end_leases_anywhere(s) == 0 {
                    bump(&s.counters().overloaded);
                    return Err(ClaimError::Overloaded(Limit::InFlightClaims));
                }
                Ok(Err(Again::Leases))
            }
            // Every other decision was answered by `prepare`.
            _ => Err(ClaimError::Contended),
        }
    }

    /// A `Corrupted` answer for a replay or read, counted.
    fn corrupted(&self, detail: String) -> ClaimError {
        bump(&self.shared().counters().corrupt_reads);
        ClaimError::Corrupted(Arc::from(detail))
    }

    /// Whether `key` still names `token` as its completion. Asked under the stripe lock after
    /// the record under `token` was found missing: a completion's record leaves the file only
    /// after its slot left the index (expiry, takeover, release), so a slot that still names
    /// the token means the file lost a record the index holds.
    fn still_completed_under(&self, key: &[u8], token: u64) -> bool {
        let (shard, _, k) = self.shared().index().lock(key);
        shard
            .get(k)
            .is_some_and(|slot| slot.token == token && !slot.is_inflight())
    }

    /// [`Engine::finish`], counting the looks: `None` means look again, and a call that has
    /// looked `CLAIM_LOOKS_MAX` times gets the answer its last reason calls for.
    fn settle(
        &self,
        key: &Arc<[u8]>,
        opts: &ClaimOptions,
        step: Step,
        looks: &mut u32,
    ) -> Result<Option<Claim>, ClaimError> {
        let answer = self.finish(key, opts, step)?;
        self.count_look(answer, looks)
    }

    /// Counts one look: `None` means look again, unless the call has looked
    /// `CLAIM_LOOKS_MAX` times.
    pub(crate) fn count_look(
        &self,
        answer: Result<Claim, Again>,
        looks: &mut u32,
    ) -> Result<Option<Claim>, ClaimError> {
        match answer {
            Ok(claim) => Ok(Some(claim)),
            Err(again) => {
                *looks += 1;
                if *looks >= CLAIM_LOOKS_MAX {
                    return Err(again.exhausted(self));
                }
                Ok(None)
            }
        }
    }

    /// Reads the completion stored under `token` for `key` (scoped) and checks its
    /// fingerprint.
    /// `Ok(None)`: the record is gone because the key moved on (expired and swept since the
    /// slot was seen); look again. A record missing while the key still names it is
    /// `Corrupted`, never a reason to look again: that read could never succeed.
    pub(crate) fn read_completed(
        &self,
        key: &[u8],
        token: u64,
        fingerprint: Option<AskedFingerprint>,
    ) -> Result<Option<FromFile>, ClaimError> {
        let s = self.shared();
        let store = s.store().ok_or(ClaimError::Closed)?;
        // Test-only sabotage: trust the stored bytes without their checksum, so that the
        // corruption checks can show they catch a replay of damaged bytes.
        #[cfg(idemkv_sabotage)]
        let read = match fault_point!(s.faults(), SkipReplayChecksum) {
            true => store.get_unverified(token),
            false => store.get(token),
        };
        #[cfg(not(idemkv_sabotage))]
        let read = store.get(token);
        let record = match read {
            Ok(Some(Ok(record))) => record,
            Ok(None) if self.still_completed_under(key, token) => {
                return Err(self.corrupted(format!(
                    "the record under token {token} is missing from the file, but the index \
                     still names it as the key's completion"
                )))
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => {
                return Err(self.corrupted(format!("record under token {token}: {e}")))
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
            return Err(self.corrupted(format!("record under token {token} is not a completion")));
        };
        if key != record.key.scoped() {
            return Err(
                self.corrupted(format!("record under token {token} belongs to another key"))
            );
        }
        if let (Some(asked), Some(stored)) = (fingerprint, record.fingerprint) {
            if !asked.matches(stored) {
                bump(&s.counters().fingerprint_mismatches);
                return Err(ClaimError::FingerprintMismatch);
            }
        }
        Ok(Some(FromFile {
            stored: Stored {
                response: response.0,
                token,
                attempt,
                expires_wall_ms,
            },
            expires_wall_ms,
            fingerprint: record.fingerprint,
            first_claimed_wall_ms: record.first_claimed_wall_ms,
        }))
    }

    /// Claims `key` without waiting: the atomic check-and-write at the heart of idemkv.
    ///
    /// - Absent or expired: a new InFlight lease with a fresh token (`Acquired`).
    /// - InFlight with a live lease: `InProgress`, with a retry hint.
    /// - InFlight with an expired lease: taken over with a new token, attempt + 1 and the
    ///   checkpoint kept (`Acquired`).
    /// - Completed (and durable): `Completed` with the stored response.
    /// - Completed, retention over, marker kept (`EngineBuilder::marker_retention`):
    ///   `Forgotten`, unless [`ClaimOptions::rerun_forgotten`] asks to acquire it again.
    ///
    /// Under `Immediate` an `Acquired` answer is returned once the InFlight record is durable.
    pub fn claim(&self, key: &[u8], opts: &ClaimOptions) -> Result<Claim, ClaimError> {
        let observe = &self.shared().observer();
        observe.claim(key, false, || self.claim_unobserved(key, opts))
    }

    fn claim_unobserved(&self, key: &[u8], opts: &ClaimOptions) -> Result<Claim, ClaimError> {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return self.claim_remote(remote, key, opts, false);
        }
        self.check_key(key)?;
        let key = &self.scoped_key(&opts.scope, key)?;
        self.check_open()?;
        let mut looks = 0;
        loop {
            let step = self.look(key, opts, looks == 0)?;
            if let Some(claim) = self.settle(key, opts, step, &mut looks)? {
                return Ok(claim);
            }
        }
    }

    /// Claims `key`, waiting while another holder works on it: returns `Acquired` (the key was
    /// released, or its lease ran out) or `Completed` (the holder finished), or `InProgress`
    /// if the wait ([`ClaimOptions::wait`], default 60 s) ran out first. Waiters are woken by
    /// the holder's completion or release, never by polling.
    pub fn claim_or_wait(&self, key: &[u8], opts: &ClaimOptions) -> Result<Claim, ClaimError> {
        let observe = &self.shared().observer();
        observe.claim(key, true, || self.claim_or_wait_unobserved(key, opts))
    }

    fn claim_or_wait_unobserved(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
    ) -> Result<Claim, ClaimError> {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return self.claim_remote(remote, key, opts, true);
        }
        self.check_key(key)?;
        let key = &self.scoped_key(&opts.scope, key)?;
        self.check_open()?;
        let s = self.shared();
        let wait = opts.wait.unwrap_or(WAIT_DEFAULT);
        let deadline = s.mono_ns().saturating_add(duration_ns(wait));
        let mut waited = false;
        let mut looks = 0;
        loop {
            let step = {
                let (mut shard, changed, k) = s.index().lock(key);
                if looks == 0 && !waited {
                    s.count_claim(&mut shard.events);
                }
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
                    let step = self.claim_step(&mut shard, k, key, opts)?;
                    let Step::Busy(busy) = &step else { break step };
                    let now = s.mono_ns();
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
                    bump(&s.counters().waits);
                    waited = true;
                    match shard.published_at(k) {
                        // A durable completion is published by the writer's watermark,
                        // which wakes its waiters; the stripe is not notified.
                        Some(seq) => crate::index::stripes::unlocked(&mut shard, || {
                            s.progress().sleep(seq, s, slice);
                        }),
                        None => crate::index::stripes::wait(changed, &mut shard, slice),
                    }
                }
            };
            if let Some(claim) = self.settle(key, opts, step, &mut looks)? {
                return Ok(claim);
            }
        }
    }

    /// Runs `handler` at most once per key: the winner runs it and stores its bytes; every
    /// concurrent or later caller waits and receives the same bytes with `replayed` set.
    ///
    /// **Slow is not dead.** While the handler runs, its lease is renewed (by the engine's
    /// timer thread, every third of the lease), up to ten minutes by default
    /// ([`ClaimOptions::keep_alive`]): a handler slower than its lease keeps its key, and the
    /// lease length only says how soon the key of a holder that died is taken over. Waiting
    /// callers wait up to [`ClaimOptions::wait`] (a minute by default) and then get
    /// [`RunError::StillInProgress`]; a consumer of a message broker that would rather hand
    /// the copy back to the broker at once sets a short wait.
    ///
    /// What the other callers see depends on how the winner's run ends:
    ///
    /// - **Stored**: they receive its bytes (`replayed`).
    /// - **The handler failed** ([`RunError::Handler`]): what [`ClaimOptions::on_handler_error`]
    ///   says. By default ([`OnHandlerError::Release`]) the claim is released: the key is
    ///   Absent, and a waiting caller acquires it at once as a new key (attempt 1, no
    ///   checkpoint) and runs its own handler. With [`OnHandlerError::Fail`] the claim is
    ///   failed ([`Lease::fail`]): the record stays with its checkpoint and fingerprint, and
    ///   a waiting caller takes it over at once (attempt + 1, the checkpoint handed over).
    ///   Only an error the handler *returns* counts.
    /// - **The handler panicked**: its lease is dropped unsettled, and like every such lease
    ///   (see [`Lease`]) it keeps the key InFlight under the winner's token until the lease
    ///   ends, as if the winner had crashed: the engine cannot know whether the handler's
    ///   side effect happened before the panic. The others keep waiting; the first caller
    ///   after the lease ended takes the key over (attempt + 1, the checkpoint handed over).
    ///   The keep-alive ([`ClaimOptions::keep_alive`]) stops with the handler.
    /// - **The handler ran but the engine refused its result** ([`RunError::NotStored`]: a
    ///   response over `response_len_max`, or a writer queue that stayed full for the whole
    ///   lease): the key is *not* released, because the work is done. It stays InFlight under
    ///   the winner's token until the lease ends, so the others keep waiting (and get
    ///   [`RunError::StillInProgress`] if their wait runs out first); the first caller after the
    ///   lease ended takes the key over with attempt + 1 and runs its handler.
    /// - **The lease was lost or the engine stopped** ([`RunError::Lease`]).
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
                match kept_alive(&lease, opts, handler) {
                    Ok(bytes) => {
                        let response: Arc<[u8]> = Arc::from(bytes);
                        let expires_wall_ms = lease
                            .complete_kept(response.clone(), None, None)
                            .map_err(|e| self.not_stored(key, opts, token, e))?;
                        Ok(Outcome::fresh(response, token, expires_wall_ms))
                    }
                    Err(e) => {
                        // The handler's failure is the error to report; a failed release or
                        // fail leaves the lease to expire, which is also safe.
                        let _ = lease.end_after_error(opts);
                        Err(RunError::Handler(e))
                    }
                }
            }
            Claim::Completed(stored) => Ok(Outcome::replay(stored)),
            Claim::InProgress(busy) => Err(RunError::still_in_progress(&busy)),
            Claim::Forgotten(forgotten) => Err(RunError::Forgotten(forgotten)),
        }
    }

    /// Sorts a refused completion after the handler ran: the engine's own refusals (the key
    /// stays held, see [`RunError::NotStored`]) from a lost lease or a stopped engine.
    pub(crate) fn not_stored<E>(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
        token: u64,
        e: LeaseError,
    ) -> RunError<E> {
        let reason = match e {
            LeaseError::ResponseTooLarge { len, max } => {
                NotStoredReason::ResponseTooLarge { len, max }
            }
            LeaseError::Overloaded(_) => NotStoredReason::QueueFull,
            LeaseError::WriteSet(e) => NotStoredReason::WriteSet(e),
            other => return RunError::Lease(other),
        };
        RunError::NotStored {
            reason,
            token,
            retry_after: self.held_for(key, opts, token),
        }
    }

    /// Time left on the lease of `token` on `key` within the options' scope.
    fn held_for(&self, key: &[u8], opts: &ClaimOptions, token: u64) -> Duration {
        crate::model::scope::scoped(&opts.scope, key).map_or(Duration::ZERO, |scoped| {
            self.lease_remaining(&scoped, token)
        })
    }

    /// [`Engine::run`] for a typed response, stored with serde + bincode. Every caller gets an
    /// equal value; a replay decodes the winner's stored bytes. A value that cannot be encoded
    /// (or whose encoding is too large) is work done but not stored: [`RunError::NotStored`],
    /// and the key stays held until the lease ends, as for [`Engine::run`].
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
            Claim::Acquired(lease) => match kept_alive(&lease, opts, handler) {
                Ok(value) => {
                    let token = lease.token();
                    let bytes = match codec::encode_value(&value) {
                        Ok(bytes) => bytes,
                        Err(e) => {
                            let _ = lease.detach();
                            return Err(RunError::NotStored {
                                reason: NotStoredReason::Encode(e),
                                token,
                                retry_after: self.held_for(key, opts, token),
                            });
                        }
                    };
                    let expires_wall_ms = lease
                        .complete_kept(Arc::from(bytes), None, None)
                        .map_err(|e| self.not_stored(key, opts, token, e))?;
                    Ok(TypedOutcome {
                        value,
                        replayed: false,
                        expires_at: wall_time(expires_wall_ms),
                    })
                }
                Err(e) => {
                    let _ = lease.end_after_error(opts);
                    Err(RunError::Handler(e))
                }
            },
            Claim::Completed(stored) => Ok(TypedOutcome {
                value: codec::decode_value(&stored.response).map_err(RunError::Codec)?,
                replayed: true,
                expires_at: stored.expires_at(),
            }),
            Claim::InProgress(busy) => Err(RunError::StillInProgress {
                retry_after: busy.retry_after,
            }),
            Claim::Forgotten(forgotten) => Err(RunError::Forgotten(forgotten)),
        }
    }

    /// The unscoped key's visible state, or `None` if it is Absent (never claimed,
    /// released, or past its retention; also while a marker of it is kept, which only a
    /// claim answers from). A durable engine reads a completed key's response from the
    /// file; a record missing from the file while the key still names it is `Corrupted`.
    /// [`Engine::get_scoped`] reads a key within a scope.
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyState>, ClaimError> {
        self.get_scoped(&[], key)
    }

    /// [`Engine::get`] of `key` within `scope` ([`ClaimOptions::scope`]); the empty scope is
    /// the unscoped key.
    pub fn get_scoped(&self, scope: &[u8], key: &[u8]) -> Result<Option<KeyState>, ClaimError> {
        self.check_key(key)?;
        let key = &*self.scoped_key(scope, key)?;
        self.check_open()?;
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return remote.get(key);
        }
        let s = self.shared();
        // Each look after the first follows a completion that expired and was swept while
        // its record was being read; a missing record the key still names is `Corrupted`.
        for _ in 0..CLAIM_LOOKS_MAX {
            let token = {
                let (shard, _, k) = s.index().lock(key);
                let now = s.mono_ns();
                let Some(slot) = shard.get(k).filter(|slot| !slot.is_expired(now)) else {
                    return Ok(None);
                };
                let extra = shard.extra(&slot);
                if slot.is_inflight() {
                    return Ok(Some(KeyState::InFlight {
                        token: slot.token,
                        attempt: slot.attempt,
                        lease_remaining: Duration::from_nanos(slot.deadline_ns.saturating_sub(now)),
                        checkpoint: extra.and_then(|e| e.checkpoint.clone()),
                        first_claimed_at: known_time(extra.map_or(0, |e| e.first_claimed_wall_ms)),
                        attempt_started_at: known_time(
                            extra.map_or(0, |e| e.attempt_started_wall_ms),
                        ),
                        failed: extra.is_some_and(|e| e.failed),
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
                        expires_at: wall_time(e.expires_wall_ms),
                    }));
                }
                slot.token
            };
            if let Some(read) = self.read_completed(key, token, None)? {
                return Ok(Some(KeyState::Completed {
                    token: read.stored.token,
                    attempt: read.stored.attempt,
                    response: read.stored.response,
                    expires_at: wall_time(read.expires_wall_ms),
                }));
            }
        }
        Err(ClaimError::Contended)
    }

    /// Sabotage builds only: deletes the record of `key`'s current token from the file while the
    /// index keeps naming it, as a storage fault that lost a committed write would, so that
    /// a test can show a replay is refused with `Corrupted` instead of retried forever.
    /// Returns whether the key had a record to lose; the deletion is committed on return.
    #[cfg(idemkv_sabotage)]
    #[doc(hidden)]
    pub fn lose_record(&self, key: &[u8]) -> Result<bool, FlushError> {
        let s = self.shared();
        let Some(key) = crate::model::scope::scoped(&[], key) else {
            return Ok(false);
        };
        {
            let (shard, _, k) = s.index().lock(&key);
            let Some(slot) = shard.get(k) else {
                return Ok(false);
            };
            if s.send(
                crate::runtime::queue::Op::Delete { token: slot.token },
                false,
            )
            .is_err()
            {
                return Err(FlushError::Closed);
            }
        }
        s.flush()?;
        Ok(true)
    }
}

/// Claims on a remote backend (`remote.rs`): the checks every claim makes, the ask, and
/// the caller's `Claim` from the backend's answer.
#[cfg(feature = "postgres")]
impl Engine {
    /// `claim` (`wait`: `claim_or_wait`) on the remote backend `remote`.
    pub(crate) fn claim_remote(
        &self,
        remote: &dyn Remote,
        key: &[u8],
        opts: &ClaimOptions,
        wait: bool,
    ) -> Result<Claim, ClaimError> {
        let (key, ask) = self.remote_ask(key, opts, wait)?;
        let answer = remote.claim(&key, &ask)?;
        Ok(self.remote_claim(key, answer))
    }

    /// The scoped key of a claim and what it asks a remote backend. Refuses what the
    /// backend does not keep: the key, the claim's own retention, the scope, then a closed
    /// engine.
    pub(crate) fn remote_ask(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
        wait: bool,
    ) -> Result<(Arc<[u8]>, RemoteAsk), ClaimError> {
        self.check_key(key)?;
        let retention_ms = opts.retention_ms()?;
        let scoped = self.scoped_key(&opts.scope, key)?;
        self.check_open()?;
        let ask = RemoteAsk {
            fingerprint: opts.fingerprint,
            claim_id: opts.claim_id,
            lease: opts.lease,
            retention_ms,
            wait: wait.then(|| opts.wait.unwrap_or(WAIT_DEFAULT)),
            rerun_forgotten: opts.rerun_forgotten,
        };
        Ok((scoped, ask))
    }

    /// The caller's `Claim` from a remote backend's answer on the scoped key `key`.
    pub(crate) fn remote_claim(&self, key: Arc<[u8]>, answer: RemoteAnswer) -> Claim {
        match answer {
            RemoteAnswer::Acquired {
                token,
                attempt,
                checkpoint,
                lease,
            } => Claim::Acquired(Lease {
                engine: self.clone(),
                key,
                token,
                attempt,
                checkpoint,
                lease,
                settled: false,
                staged: Default::default(),
            }),
            RemoteAnswer::Busy(busy) => Claim::InProgress(busy),
            RemoteAnswer::Completed(stored) => Claim::Completed(stored),
            RemoteAnswer::Forgotten(forgotten) => Claim::Forgotten(forgotten),
        }
    }
}
