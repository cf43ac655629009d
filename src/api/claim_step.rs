//! A claim's step under its key's stripe lock: look at the slot, let the state machine
//! decide, queue the write (non-blocking) and change the slot, all in one hold of the lock;
//! then, with the lock dropped, turn the decision into an answer (wait for durability,
//! read a stored response from the file, make room under a limit and look again).

use crate::api::constants::CLAIM_LOOKS_MAX;
use crate::api::engine::Engine;
use crate::api::lease::{Busy, Claim, Forgotten, Lease, Stored};
use crate::api::options::{AskedFingerprint, ClaimOptions};
use crate::base::sabotage::fault_point;
use crate::base::sync::{Arc, MutexGuard, Ordering};
use crate::index::key::Key;
use crate::index::shard::{Forgot, Shard};
use crate::index::stats::{bump, Events};
use crate::model::codec::{Checkpoint, RecordState};
use crate::model::error::{ClaimError, FlushError, Limit};
use crate::model::machine::{self, Acquired, Acquiring, ClaimAnswer, KeyRef, MarkerAnswer, Now};
use crate::model::scope::ScopedKey;
use crate::model::token::Shortage;
use crate::runtime::constants::SWEEP_STRIPE_BATCH;
use crate::runtime::queue::SendRefused;
use crate::runtime::sweep::Room;

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
        key: &ScopedKey,
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
        let step = machine::acquire(plan, KeyRef::Scoped(key), token, lease, now, &rules);
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
        key: &ScopedKey,
        opts: &ClaimOptions,
        token: u64,
    ) -> Result<Step, ClaimError> {
        let s = self.shared();
        let lease = opts.lease.unwrap_or(s.cfg().lease);
        let now = s.now();
        let rules = s.rules();
        let step = machine::resume(
            shard.view(k),
            KeyRef::Scoped(key),
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
        key: &ScopedKey,
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
        key: &ScopedKey,
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
                    // The call's scoped key: inline bytes copied, or its allocation shared.
                    key: key.clone(),
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
        key: &ScopedKey,
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
    pub(super) fn settle(
        &self,
        key: &ScopedKey,
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
}
