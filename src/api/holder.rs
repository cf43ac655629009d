//! What a lease holder does: complete, release, extend, checkpoint. Every call compares the
//! caller's token with the key's current token under the stripe lock (fencing), so a
//! superseded holder can never overwrite a newer state.
//!
//! A holder whose work is done is never turned away by the engine's own limits in a way that
//! hands the key to the next caller: a full writer queue is waited out while the lease lasts,
//! and a refused completion leaves the key InFlight under the holder's token until its lease
//! ends. Only an explicit release, or the end of the lease, lets another caller run the work.

use crate::api::engine::Engine;
use crate::base::clock::wall_ms_at;
use crate::base::sabotage::fault_point;
use crate::base::sync::Arc;
use crate::index::stats::bump;
use crate::model::codec::Checkpoint;
use crate::model::error::{FlushError, LeaseError, Limit};
use crate::model::machine::{self, Holder, HolderAnswer, KeyRef};
use crate::model::scope::ScopedKey;
use crate::model::write_set::WriteSet;
use crate::runtime::queue::SendRefused;
use std::time::Duration;

fn refused(engine: &Engine, r: SendRefused) -> LeaseError {
    match r {
        SendRefused::Full => {
            bump(&engine.shared().counters().overloaded);
            LeaseError::Overloaded(Limit::WriterQueue)
        }
        SendRefused::Poisoned(why) => LeaseError::Poisoned(why),
        SendRefused::Closed => LeaseError::Closed,
    }
}

impl Engine {
    /// Completes `key` for `token` with `response` (see [`crate::Lease::complete`]). A repeat
    /// with the same token succeeds without change; any other token gets `LeaseLost`.
    ///
    /// While the writer queue is full the call waits for room as long as the lease lasts. If
    /// it is refused (`ResponseTooLarge`, or `Overloaded` because the lease ended while the
    /// queue stayed full) nothing changed: the key stays InFlight under `token` until its
    /// lease ends, so other callers see `InProgress` and only a claim after the lease ended
    /// takes it over. Within the lease, a completion that fits or a [`Engine::release`] still
    /// settles it.
    ///
    /// `key` is the unscoped key; [`Engine::complete_scoped`] completes a key within a scope.
    pub fn complete(&self, key: &[u8], token: u64, response: &[u8]) -> Result<(), LeaseError> {
        self.complete_scoped(&[], key, token, response)
    }

    /// [`Engine::complete`] with `writes` to the application's tables and outbox, applied
    /// in the same transaction as the completion, or not at all (see
    /// [`crate::Lease::complete_with`]). A repeat for a token that already completed the
    /// key succeeds without applying `writes` again. `key` is the unscoped key.
    pub fn complete_with(
        &self,
        key: &[u8],
        token: u64,
        response: &[u8],
        writes: &WriteSet,
    ) -> Result<(), LeaseError> {
        let scoped = self.lease_key(&[], key)?;
        self.complete_arc(&scoped, token, Arc::from(response), Some(writes))
    }

    /// [`Engine::complete`] of `key` within `scope` ([`crate::ClaimOptions::scope`],
    /// [`crate::Detached::scope`]).
    pub fn complete_scoped(
        &self,
        scope: &[u8],
        key: &[u8],
        token: u64,
        response: &[u8],
    ) -> Result<(), LeaseError> {
        let scoped = self.lease_key(scope, key)?;
        self.complete_arc(&scoped, token, Arc::from(response), None)
    }

    /// The scoped key of a holder's call by key and token.
    fn lease_key(&self, scope: &[u8], key: &[u8]) -> Result<ScopedKey, LeaseError> {
        ScopedKey::new(scope, key).ok_or(LeaseError::ScopeTooLong {
            len: scope.len(),
            max: crate::model::constants::SCOPE_LEN_MAX,
        })
    }

    /// Completes the scoped key `key` (`scope.rs`); every holder's call below takes one.
    pub(crate) fn complete_arc(
        &self,
        key: &ScopedKey,
        token: u64,
        response: Arc<[u8]>,
        writes: Option<&WriteSet>,
    ) -> Result<(), LeaseError> {
        self.complete_kept(key, token, response, None, writes)
            .map(|_| ())
    }

    /// [`Engine::complete`] for `retention_ms` (the key's own retention, if the completion
    /// chose one); returns the wall-clock end of the stored response's retention, in ms.
    pub(crate) fn complete_kept(
        &self,
        key: &ScopedKey,
        token: u64,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<&WriteSet>,
    ) -> Result<u64, LeaseError> {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            self.check_response(key, &response)?;
            return remote.complete(key, token, response, retention_ms, writes);
        }
        let observe = &self.shared().observer();
        let mut expires_wall_ms = 0;
        observe.complete(crate::model::scope::key_of(key), token, || {
            let (seq, expires) = self.with_room(key, token, || {
                self.try_complete_kept(key, token, response.clone(), retention_ms, writes)
            })?;
            expires_wall_ms = expires;
            self.wait_holder(seq)
        })?;
        Ok(expires_wall_ms)
    }

    /// The checks of a completion a remote backend stores: the holder's call, and the
    /// response's size (the embedded engine checks it under the stripe lock).
    #[cfg(feature = "postgres")]
    pub(crate) fn check_response(&self, key: &[u8], response: &[u8]) -> Result<(), LeaseError> {
        self.check_lease_call(key)?;
        let max = self.shared().cfg().response_len_max;
        if response.len() > max {
            return Err(LeaseError::ResponseTooLarge {
                len: response.len(),
                max,
            });
        }
        Ok(())
    }

    /// Waits until a holder's write numbered `seq` is durable (0: nothing to wait for).
    pub(crate) fn wait_holder(&self, seq: u64) -> Result<(), LeaseError> {
        self.shared()
            .wait_durable(seq)
            .map_err(LeaseError::OutcomeUnknown)
    }

    /// The number a holder's call must wait for before it returns: its write's under
    /// `Immediate`, none otherwise.
    pub(crate) fn durable_wait(&self, seq: u64) -> u64 {
        if self.waits_for_durability() {
            seq
        } else {
            0
        }
    }

    /// Runs a holder's call for `token` on `key`, waiting for room while the writer queue is
    /// full: a holder whose work is done must not be turned away (claims are refused
    /// earlier, at seven eighths of the queue, so the rest is the holders' headroom). The
    /// wait blocks outside the stripe lock and ends when the queue has room or the lease
    /// ends on the engine's clock; in the second case the call reports `Overloaded` and the
    /// key is left as it is, InFlight under `token` with its lease over: not released, so
    /// only a takeover (which the lease's end allows) runs the work again.
    fn with_room<T>(
        &self,
        key: &[u8],
        token: u64,
        mut call: impl FnMut() -> Result<T, LeaseError>,
    ) -> Result<T, LeaseError> {
        loop {
            match call() {
                Err(LeaseError::Overloaded(Limit::WriterQueue)) => {
                    match self.lease_deadline_ns(key, token) {
                        Some(deadline) => {
                            if !self.shared().wait_for_room(deadline) {
                                return Err(LeaseError::Overloaded(Limit::WriterQueue));
                            }
                        }
                        // The key moved on since the call looked: one more call says how.
                        None => return call(),
                    }
                }
                other => return other,
            }
        }
    }

    /// The monotonic end of the lease of `token` on `key`, if `token` holds it InFlight.
    pub(crate) fn lease_deadline_ns(&self, key: &[u8], token: u64) -> Option<u64> {
        let (shard, _, k) = self.shared().index().lock(key);
        shard
            .get(k)
            .filter(|slot| slot.token == token && slot.is_inflight())
            .map(|slot| slot.deadline_ns)
    }

    /// Time left on the lease of `token` on `key` (zero if it ended or `token` lost it).
    pub(crate) fn lease_remaining(&self, key: &[u8], token: u64) -> Duration {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return remote.lease_remaining(key, token);
        }
        let now = self.shared().mono_ns();
        self.lease_deadline_ns(key, token)
            .map_or(Duration::ZERO, |d| {
                Duration::from_nanos(d.saturating_sub(now))
            })
    }

    /// One attempt at a completion (with `writes`, queued in the same operation), for
    /// `retention_ms` (the key's own retention, if the completion chose one), never
    /// blocking; returns the number to wait for and the wall-clock end of the stored
    /// response's retention (ms).
    pub(crate) fn try_complete_kept(
        &self,
        key: &ScopedKey,
        token: u64,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<&WriteSet>,
    ) -> Result<(u64, u64), LeaseError> {
        self.check_lease_call(key)?;
        let s = self.shared();
        let max = s.cfg().response_len_max;
        if response.len() > max {
            return Err(LeaseError::ResponseTooLarge {
                len: response.len(),
                max,
            });
        }
        let (mut shard, changed, k) = s.index().lock(key);
        let view = shard.view(k);
        // Test-only sabotage skips the token comparison, to show that the checkers catch a
        // missing fence: the call acts as whatever token holds the key.
        let token = match view.slot {
            Some(slot) if fault_point!(s.faults(), NoFencing) => slot.token,
            _ => token,
        };
        let rules = s.rules();
        let op = Holder::Complete {
            response,
            retention_ms,
        };
        let now = s.now();
        let step = machine::hold(view, KeyRef::Scoped(key), token, op, now, &rules);
        let expires_wall_ms = match (&step.change, view.slot) {
            (machine::Change::Put { extra, .. }, _) => extra.expires_wall_ms,
            // A repeat: the first completion's end, from its side data while it has any,
            // else from its deadline.
            (_, Some(slot)) => view.extra.map_or_else(
                || wall_ms_at(now.wall_ms, now.mono_ns, slot.deadline_ns),
                |e| e.expires_wall_ms,
            ),
            (_, None) => 0,
        };
        match step.answer {
            HolderAnswer::Done => {}
            HolderAnswer::Repeat { published } => {
                // The first completion stands, with its writes; this one's are not applied.
                // It is settled once all queued is.
                drop(shard);
                if published {
                    return Ok((0, expires_wall_ms));
                }
                return s
                    .send_barrier()
                    .map(|seq| (seq, expires_wall_ms))
                    .map_err(|e| match e {
                        FlushError::Poisoned(why) => LeaseError::OutcomeUnknown(why),
                        FlushError::Closed => LeaseError::Closed,
                    });
            }
            HolderAnswer::LeaseLost | HolderAnswer::NotHeld => {
                s.count(&mut shard.events, &step.deltas);
                return Err(LeaseError::LeaseLost);
            }
        }
        let seq = s
            .queue_with(step.write, writes)
            .map_err(|r| refused(self, r))?;
        shard.apply(k, step.change, seq);
        s.count(&mut shard.events, &step.deltas);
        drop(shard);
        // A memory-only engine's completion is published at once. A durable one's waiters,
        // asleep on the stripe while the key was InFlight, look again: they then wait for
        // the watermark that publishes it.
        changed.notify_all();
        Ok((self.durable_wait(seq), expires_wall_ms))
    }

    /// Releases `key` if `token` still owns it as InFlight; returns whether it did. A
    /// released key is Absent: the next claim (or a waiting caller) acquires it. A full
    /// writer queue is waited out as long as the lease lasts (see [`Engine::complete`]).
    /// `key` is the unscoped key; [`Engine::release_scoped`] releases a key within a scope.
    pub fn release(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        self.release_scoped(&[], key, token)
    }

    /// [`Engine::release`] of `key` within `scope`.
    pub fn release_scoped(&self, scope: &[u8], key: &[u8], token: u64) -> Result<bool, LeaseError> {
        let scoped = self.lease_key(scope, key)?;
        self.release_at(&scoped, token)
    }

    /// Releases the scoped key `key`.
    pub(crate) fn release_at(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        let observe = &self.shared().observer();
        observe.release(crate::model::scope::key_of(key), token, || {
            self.release_unobserved(key, token)
        })
    }

    fn release_unobserved(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        self.check_lease_call(key)?;
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return remote.release(key, token);
        }
        let (released, seq) = self.with_room(key, token, || self.release_locked(key, token))?;
        self.wait_holder(self.durable_wait(seq))?;
        Ok(released)
    }

    /// A lease dropped unsettled: nothing changes in the index or the file, so the key stays
    /// InFlight under `token` until its lease ends, as after a crash of its holder (the
    /// engine cannot tell whether the holder's side effect happened). Only reported.
    pub(crate) fn lease_dropped(&self, key: &[u8], token: u64) {
        self.shared()
            .observer()
            .dropped(crate::model::scope::key_of(key), token);
    }

    /// A release that never waits and never fails loudly, for a claim won by a future that
    /// was dropped before it handed the lease to anyone (no work can have run under it). If
    /// the queue is full the lease stays and ends on its own, which is equally safe.
    pub(crate) fn release_unwaited(&self, key: &[u8], token: u64) {
        if self.check_open().is_ok() {
            let _ = self.release_locked(key, token);
        }
    }

    /// One attempt at a release, never blocking: whether it released, and its write's number.
    pub(crate) fn release_locked(&self, key: &[u8], token: u64) -> Result<(bool, u64), LeaseError> {
        let s = self.shared();
        let (mut shard, changed, k) = s.index().lock(key);
        let step = machine::hold(
            shard.view(k),
            KeyRef::Bytes(key),
            token,
            Holder::Release,
            s.now(),
            &s.rules(),
        );
        if step.answer != HolderAnswer::Done {
            return Ok((false, 0));
        }
        let seq = s.queue(step.write, false).map_err(|r| refused(self, r))?;
        shard.apply(k, step.change, seq);
        s.count(&mut shard.events, &step.deltas);
        drop(shard);
        changed.notify_all();
        Ok((true, seq))
    }

    /// Fails the attempt of `token` on `key` if `token` still owns it as InFlight; returns
    /// whether it did (see [`crate::Lease::fail`]): the lease ends now (a lease already over
    /// keeps its end), and the record stays, marked failed, with its checkpoint and
    /// fingerprint, so the next claim takes it over at once. Waiting callers are woken. A
    /// full writer queue is waited out as long as the lease lasts (see [`Engine::complete`]).
    /// Until someone takes it over, the token may still complete, checkpoint or release the
    /// key; an [`Engine::extend`] is `LeaseLost` (a failed attempt is never revived).
    /// `key` is the unscoped key; [`Engine::fail_scoped`] fails a key within a scope.
    pub fn fail(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        self.fail_scoped(&[], key, token)
    }

    /// [`Engine::fail`] of `key` within `scope`.
    pub fn fail_scoped(&self, scope: &[u8], key: &[u8], token: u64) -> Result<bool, LeaseError> {
        let scoped = self.lease_key(scope, key)?;
        self.fail_at(&scoped, token)
    }

    /// Fails the attempt on the scoped key `key`.
    pub(crate) fn fail_at(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        let observe = &self.shared().observer();
        observe.fail(crate::model::scope::key_of(key), token, || {
            self.fail_unobserved(key, token)
        })
    }

    fn fail_unobserved(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        self.check_lease_call(key)?;
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return remote.fail(key, token);
        }
        let (failed, seq) = self.with_room(key, token, || self.fail_locked(key, token))?;
        self.wait_holder(self.durable_wait(seq))?;
        Ok(failed)
    }

    /// One attempt at a fail, never blocking: whether it failed the attempt, and its
    /// write's number.
    pub(crate) fn fail_locked(&self, key: &[u8], token: u64) -> Result<(bool, u64), LeaseError> {
        let s = self.shared();
        let (mut shard, changed, k) = s.index().lock(key);
        let step = machine::hold(
            shard.view(k),
            KeyRef::Bytes(key),
            token,
            Holder::Fail,
            s.now(),
            &s.rules(),
        );
        if step.answer != HolderAnswer::Done {
            return Ok((false, 0));
        }
        let seq = s.queue(step.write, false).map_err(|r| refused(self, r))?;
        shard.apply(k, step.change, seq);
        s.count(&mut shard.events, &step.deltas);
        drop(shard);
        // The key can be taken over now: a waiting caller takes it.
        changed.notify_all();
        Ok((true, seq))
    }

    /// Applies `op` (an extend or a checkpoint) to the InFlight slot owned by `token` and
    /// persists it; returns the number to wait for.
    pub(crate) fn update_inflight(
        &self,
        key: &[u8],
        token: u64,
        op: Holder,
        writes: Option<&WriteSet>,
    ) -> Result<u64, LeaseError> {
        self.update_inflight_at(key, token, |_| op, writes)
    }

    /// [`Engine::update_inflight`] with the operation chosen from the instant the transition
    /// happens at (read under the stripe lock), e.g. an extension that must not pass a
    /// deadline.
    pub(crate) fn update_inflight_at(
        &self,
        key: &[u8],
        token: u64,
        op: impl FnOnce(u64) -> Holder,
        writes: Option<&WriteSet>,
    ) -> Result<u64, LeaseError> {
        self.check_lease_call(key)?;
        let s = self.shared();
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return remote
                .update(key, token, op(s.mono_ns()), writes)
                .map(|()| 0);
        }
        let (mut shard, _, k) = s.index().lock(key);
        let now = s.now();
        let op = op(now.mono_ns);
        let step = machine::hold(
            shard.view(k),
            KeyRef::Bytes(key),
            token,
            op,
            now,
            &s.rules(),
        );
        if step.answer != HolderAnswer::Done {
            s.count(&mut shard.events, &step.deltas);
            return Err(LeaseError::LeaseLost);
        }
        let seq = s
            .queue_with(step.write, writes)
            .map_err(|r| refused(self, r))?;
        shard.apply(k, step.change, seq);
        drop(shard);
        Ok(self.durable_wait(seq))
    }

    /// Sets the lease of `token` on the unscoped `key` to end `lease` from now
    /// ([`Engine::extend_scoped`] within a scope).
    pub fn extend(&self, key: &[u8], token: u64, lease: Duration) -> Result<(), LeaseError> {
        self.extend_scoped(&[], key, token, lease)
    }

    /// [`Engine::extend`] of `key` within `scope`.
    pub fn extend_scoped(
        &self,
        scope: &[u8],
        key: &[u8],
        token: u64,
        lease: Duration,
    ) -> Result<(), LeaseError> {
        let scoped = self.lease_key(scope, key)?;
        self.extend_at(&scoped, token, lease)
    }

    /// Extends the lease on the scoped key `key`.
    pub(crate) fn extend_at(
        &self,
        key: &[u8],
        token: u64,
        lease: Duration,
    ) -> Result<(), LeaseError> {
        let seq = self.with_room(key, token, || {
            self.update_inflight(key, token, Holder::Extend { lease }, None)
        })?;
        self.wait_holder(seq)
    }

    /// Saves a checkpoint for `token` on the unscoped `key`; a takeover receives it
    /// ([`Engine::checkpoint_scoped`] within a scope).
    pub fn checkpoint(
        &self,
        key: &[u8],
        token: u64,
        phase: u32,
        data: &[u8],
    ) -> Result<(), LeaseError> {
        self.checkpoint_scoped(&[], key, token, phase, data)
    }

    /// [`Engine::checkpoint`] with `writes` to the application's tables and outbox, applied
    /// in the same transaction as the checkpoint, or not at all (see
    /// [`crate::Lease::set_checkpoint_with`]). `key` is the unscoped key.
    pub fn checkpoint_with(
        &self,
        key: &[u8],
        token: u64,
        phase: u32,
        data: &[u8],
        writes: &WriteSet,
    ) -> Result<(), LeaseError> {
        let scoped = self.lease_key(&[], key)?;
        self.checkpoint_at(&scoped, token, phase, data, Some(writes))
    }

    /// [`Engine::checkpoint`] of `key` within `scope`.
    pub fn checkpoint_scoped(
        &self,
        scope: &[u8],
        key: &[u8],
        token: u64,
        phase: u32,
        data: &[u8],
    ) -> Result<(), LeaseError> {
        let scoped = self.lease_key(scope, key)?;
        self.checkpoint_at(&scoped, token, phase, data, None)
    }

    /// Saves a checkpoint on the scoped key `key`, with `writes` in its transaction.
    pub(crate) fn checkpoint_at(
        &self,
        key: &[u8],
        token: u64,
        phase: u32,
        data: &[u8],
        writes: Option<&WriteSet>,
    ) -> Result<(), LeaseError> {
        self.check_checkpoint(data)?;
        let seq = self.with_room(key, token, || {
            let checkpoint = Holder::Checkpoint(Checkpoint::new(phase, data));
            self.update_inflight(key, token, checkpoint, writes)
        })?;
        self.wait_holder(seq)
    }

    /// Refuses a checkpoint payload over the limit.
    pub(crate) fn check_checkpoint(&self, data: &[u8]) -> Result<(), LeaseError> {
        let max = self.shared().cfg().checkpoint_len_max;
        if data.len() > max {
            return Err(LeaseError::CheckpointTooLarge {
                len: data.len(),
                max,
            });
        }
        Ok(())
    }
}
