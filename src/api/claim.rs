//! Claims: the atomic check-and-write at the heart of idemkv, waiting losers, and `run`.
//!
//! Every decision is taken by the state machine (`model/machine/`), applied by
//! `claim_step.rs` under the key's stripe lock in one step: look at the slot, decide, queue
//! the write (non-blocking), change the slot. Waiting for durability and reading a stored
//! response from the file happen after the lock is dropped.

use crate::api::admin::known_time;
use crate::api::claim_step::Step;
use crate::api::constants::{CLAIM_LOOKS_MAX, WAIT_DEFAULT};
use crate::api::engine::Engine;
use crate::api::lease::{Claim, KeyState, Lease, Outcome, TypedOutcome};
use crate::api::options::ClaimOptions;
#[cfg(doc)]
use crate::api::options::OnHandlerError;
#[cfg(feature = "postgres")]
use crate::api::remote::{Remote, RemoteAnswer, RemoteAsk};
use crate::base::clock::{duration_ns, wall_time};
use crate::base::sync::Arc;
use crate::index::stats::bump;
use crate::model::codec;
#[cfg(idemkv_sabotage)]
use crate::model::error::FlushError;
use crate::model::error::{ClaimError, LeaseError, NotStoredReason, RunError};
use crate::runtime::constants::{WAIT_SLICE_MAX, WAIT_SLICE_MIN};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// Runs a blocking handler, renewing its lease meanwhile unless the options turn it off.
fn kept_alive<T>(lease: &Lease, opts: &ClaimOptions, handler: impl FnOnce(&Lease) -> T) -> T {
    let _renewing = opts.keep_alive_max().map(|max| lease.keep_alive(max));
    handler(lease)
}

impl Engine {
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
                        checkpoint: extra.and_then(|e| e.checkpoint().cloned()),
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
        // Shared: the backend's batches keep the key beyond the call.
        let scoped = self.scoped_key(&opts.scope, key)?.shared();
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
                key: crate::model::scope::ScopedKey::Shared(key),
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
