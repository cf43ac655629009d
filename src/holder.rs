//! What a lease holder does: complete, release, extend, checkpoint. Every call compares the
//! caller's token with the key's current token under the stripe lock (fencing), so a
//! superseded holder can never overwrite a newer state.
//!
//! A holder whose work is done is never turned away by the engine's own limits in a way that
//! hands the key to the next caller: a full writer queue is waited out while the lease lasts,
//! and a refused completion leaves the key InFlight under the holder's token until its lease
//! ends. Only an explicit release, or the end of the lease, lets another caller run the work.

use crate::codec::Checkpoint;
use crate::engine::{Engine, Sabotage, SendRefused};
use crate::error::{FlushError, LeaseError, Limit};
use crate::machine::{self, Holder, HolderAnswer};
use crate::stats::bump;
use crate::sync::Arc;
use std::time::Duration;

fn refused(engine: &Engine, r: SendRefused) -> LeaseError {
    match r {
        SendRefused::Full => {
            bump(&engine.shared().counters.overloaded);
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
    pub fn complete(&self, key: &[u8], token: u64, response: &[u8]) -> Result<(), LeaseError> {
        self.complete_arc(key, token, Arc::from(response))
    }

    pub(crate) fn complete_arc(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
    ) -> Result<(), LeaseError> {
        let observe = &self.shared().observe;
        observe.complete(key, token, || {
            self.complete_unobserved(key, token, response)
        })
    }

    fn complete_unobserved(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
    ) -> Result<(), LeaseError> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg() {
            return pg.complete(self, key, token, response);
        }
        let seq = self.with_room(key, token, || {
            self.try_complete(key, token, response.clone())
        })?;
        self.wait_holder(seq)
    }

    /// Waits until a holder's write numbered `seq` is durable (0: nothing to wait for).
    pub(crate) fn wait_holder(&self, seq: u64) -> Result<(), LeaseError> {
        self.shared()
            .wait_durable(seq)
            .map_err(LeaseError::OutcomeUnknown)
    }

    /// The number a holder's call must wait for before it returns: its write's under
    /// `Immediate`, none otherwise.
    fn durable_wait(&self, seq: u64) -> u64 {
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
        let (shard, _, k) = self.shared().index.lock(key);
        shard
            .get(k)
            .filter(|slot| slot.token == token && slot.is_inflight())
            .map(|slot| slot.deadline_ns)
    }

    /// Time left on the lease of `token` on `key` (zero if it ended or `token` lost it).
    pub(crate) fn lease_remaining(&self, key: &[u8], token: u64) -> Duration {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg() {
            return pg.lease_remaining(key, token);
        }
        let now = self.shared().time.mono_ns();
        self.lease_deadline_ns(key, token)
            .map_or(Duration::ZERO, |d| {
                Duration::from_nanos(d.saturating_sub(now))
            })
    }

    /// One attempt at a completion, never blocking; returns the number to wait for.
    pub(crate) fn try_complete(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
    ) -> Result<u64, LeaseError> {
        self.check_lease_call(key)?;
        let s = self.shared();
        let max = s.cfg.response_len_max;
        if response.len() > max {
            return Err(LeaseError::ResponseTooLarge {
                len: response.len(),
                max,
            });
        }
        let (mut shard, changed, k) = s.index.lock(key);
        let view = shard.view(k);
        // Test-only sabotage skips the token comparison, to show that the checkers catch a
        // missing fence: the call acts as whatever token holds the key.
        let token = match view.slot {
            Some(slot) if self.sabotaged(Sabotage::NoFencing) => slot.token,
            _ => token,
        };
        let rules = s.rules();
        let op = Holder::Complete { response };
        let step = machine::hold(view, key, token, op, s.now(), &rules);
        match step.answer {
            HolderAnswer::Done => {}
            HolderAnswer::Repeat { published } => {
                // The first completion stands. It is settled once all queued is.
                drop(shard);
                if published {
                    return Ok(0);
                }
                return s.send_barrier().map_err(|e| match e {
                    FlushError::Poisoned(why) => LeaseError::OutcomeUnknown(why),
                    FlushError::Closed => LeaseError::Closed,
                });
            }
            HolderAnswer::LeaseLost | HolderAnswer::NotHeld => {
                s.count(&mut shard.events, &step.deltas);
                return Err(LeaseError::LeaseLost);
            }
        }
        let seq = s.queue(step.write, false).map_err(|r| refused(self, r))?;
        shard.apply(k, step.change);
        s.count(&mut shard.events, &step.deltas);
        drop(shard);
        // A memory-only engine's completion is published at once.
        if !rules.durable {
            changed.notify_all();
        }
        Ok(self.durable_wait(seq))
    }

    /// Releases `key` if `token` still owns it as InFlight; returns whether it did. A
    /// released key is Absent: the next claim (or a waiting caller) acquires it. A full
    /// writer queue is waited out as long as the lease lasts (see [`Engine::complete`]).
    pub fn release(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        let observe = &self.shared().observe;
        observe.release(key, token, || self.release_unobserved(key, token))
    }

    fn release_unobserved(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg() {
            return pg.release(self, key, token);
        }
        self.check_lease_call(key)?;
        let (released, seq) = self.with_room(key, token, || self.release_locked(key, token))?;
        self.wait_holder(self.durable_wait(seq))?;
        Ok(released)
    }

    /// Release from `Drop`: never waits, never fails loudly. If the queue is full the lease
    /// stays and expires on its own, which is equally safe.
    pub(crate) fn release_on_drop(&self, key: &[u8], token: u64) {
        self.shared().observe.dropped(key, token);
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg() {
            return pg.release_on_drop(key, token);
        }
        if self.check_open().is_ok() {
            let _ = self.release_locked(key, token);
        }
    }

    /// One attempt at a release, never blocking: whether it released, and its write's number.
    pub(crate) fn release_locked(&self, key: &[u8], token: u64) -> Result<(bool, u64), LeaseError> {
        let s = self.shared();
        let (mut shard, changed, k) = s.index.lock(key);
        let step = machine::hold(
            shard.view(k),
            key,
            token,
            Holder::Release,
            s.now(),
            &s.rules(),
        );
        if step.answer != HolderAnswer::Done {
            return Ok((false, 0));
        }
        let seq = s.queue(step.write, false).map_err(|r| refused(self, r))?;
        shard.apply(k, step.change);
        s.count(&mut shard.events, &step.deltas);
        drop(shard);
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
    ) -> Result<u64, LeaseError> {
        self.update_inflight_at(key, token, |_| op)
    }

    /// [`Engine::update_inflight`] with the operation chosen from the instant the transition
    /// happens at (read under the stripe lock), e.g. an extension that must not pass a
    /// deadline.
    pub(crate) fn update_inflight_at(
        &self,
        key: &[u8],
        token: u64,
        op: impl FnOnce(u64) -> Holder,
    ) -> Result<u64, LeaseError> {
        self.check_lease_call(key)?;
        let s = self.shared();
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg() {
            return pg.update(key, token, op(s.time.mono_ns())).map(|()| 0);
        }
        let (mut shard, _, k) = s.index.lock(key);
        let now = s.now();
        let op = op(now.mono_ns);
        let step = machine::hold(shard.view(k), key, token, op, now, &s.rules());
        if step.answer != HolderAnswer::Done {
            s.count(&mut shard.events, &step.deltas);
            return Err(LeaseError::LeaseLost);
        }
        let seq = s.queue(step.write, false).map_err(|r| refused(self, r))?;
        shard.apply(k, step.change);
        drop(shard);
        Ok(self.durable_wait(seq))
    }

    /// Sets the lease of `token` on `key` to end `lease` from now.
    pub fn extend(&self, key: &[u8], token: u64, lease: Duration) -> Result<(), LeaseError> {
        let seq = self.with_room(key, token, || {
            self.update_inflight(key, token, Holder::Extend { lease })
        })?;
        self.wait_holder(seq)
    }

    /// Saves a checkpoint for `token` on `key`; a takeover receives it.
    pub fn checkpoint(
        &self,
        key: &[u8],
        token: u64,
        phase: u32,
        data: &[u8],
    ) -> Result<(), LeaseError> {
        let max = self.shared().cfg.checkpoint_len_max;
        if data.len() > max {
            return Err(LeaseError::CheckpointTooLarge {
                len: data.len(),
                max,
            });
        }
        let seq = self.with_room(key, token, || {
            self.update_inflight(key, token, Holder::Checkpoint(Checkpoint::new(phase, data)))
        })?;
        self.wait_holder(seq)
    }
}
