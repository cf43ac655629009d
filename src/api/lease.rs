//! What a claim returns: the lease of a winner, the stored response of a replay, the
//! "in progress" answer of a loser, or the "completed, response no longer kept" answer of a
//! late duplicate.

use crate::api::engine::Engine;
use crate::api::options::{ClaimOptions, CompleteOptions, OnHandlerError};
use crate::base::clock::wall_time;
pub(crate) use crate::model::answer::{Busy, Forgotten, KeyState, Stored};
use crate::model::codec::Checkpoint;
use crate::model::error::LeaseError;
use crate::model::scope::ScopedKey;
use crate::model::write_set::{merged, Staged, WriteSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The answer to a claim.
///
/// Exhaustive on purpose: a key is Absent, InFlight or Completed (or, with markers, was
/// completed and its response is no longer kept), and a claim answers with one of the
/// outcomes of that state machine. A new answer would change what every caller must do, so
/// it would be a breaking change whether or not a wildcard arm compiled.
#[derive(Debug)]
#[must_use = "an Acquired lease dropped unsettled keeps its key until the lease ends; complete, fail or release it"]
pub enum Claim {
    /// The caller owns the key: do the work, then [`Lease::complete`] it.
    Acquired(Lease),
    /// Another holder's lease is live (or its completion is not yet durable).
    InProgress(Busy),
    /// The key was completed: here is the stored response.
    Completed(Stored),
    /// The key was completed, but its retention ended and its response is no longer kept:
    /// only a marker of the completion is (`EngineBuilder::marker_retention`). The work must
    /// not run again; a caller that really wants it to asks with
    /// [`crate::ClaimOptions::rerun_forgotten`].
    Forgotten(Forgotten),
}

/// The exclusive right to act for one key, fenced by a token. A lease ends in one of four
/// ways, each explicit: [`Lease::complete`] (the outcome is stored), [`Lease::release`]
/// (forget the attempt: the key is Absent), [`Lease::fail`] (end the attempt, keep its
/// progress: the next claim takes the key over at once with the checkpoint) or
/// [`Lease::detach`] (let the lease run out as if its holder had crashed).
///
/// Only such a decision gives the key back. A lease dropped without one (an early `?`
/// return, a panicking handler, a future dropped by a timeout or a disconnected client)
/// acts as [`Lease::detach`]: the key stays InFlight under [`Lease::token`] until the lease
/// ends, exactly as if its holder had crashed, and the first claim after that takes it over
/// (attempt + 1, checkpoint kept); staged writes are dropped, and a
/// [`crate::KeepAlive`] of the lease stops renewing it. The engine cannot know whether the
/// dropped holder's side effect already happened (or whether a task given a
/// [`crate::LeaseHandle`] still runs), so handing the key to a duplicate at once could run
/// the work twice. [`Lease::release`] is the explicit way to give the key back at once.
/// Once `complete` was called the lease never releases the key, even if the completion was
/// refused (see [`Lease::complete`]).
pub struct Lease {
    pub(crate) engine: Engine,
    /// The scoped key (`scope.rs`).
    pub(crate) key: ScopedKey,
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    pub(crate) checkpoint: Option<Checkpoint>,
    /// The lease length it was claimed with (what a keep-alive renews by).
    pub(crate) lease: Duration,
    pub(crate) settled: bool,
    /// Writes staged for the completion ([`Lease::stage`]), shared with its handles.
    pub(crate) staged: Staged,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("scope", &String::from_utf8_lossy(self.scope()))
            .field("key", &String::from_utf8_lossy(self.key()))
            .field("token", &self.token)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl Lease {
    /// The fencing token: strictly larger than every token issued before it on this file
    /// (or shared database), across restarts and crashes. Pass it to downstream systems so
    /// they can refuse writes from a superseded holder: a write carrying a token lower than
    /// the last one they accepted for the key comes from a holder whose lease was taken over.
    ///
    /// Tokens are unique but **not dense**: the engine reserves them in blocks, so after a
    /// restart the next token is up to about 2²² (4 Mi) above the last one issued. Never use
    /// a token as an identifier, a sequence number or a counter; derive ids from the key.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// 1 for a fresh claim; one more for each takeover of the key.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The key this lease is for.
    pub fn key(&self) -> &[u8] {
        crate::model::scope::key_of(&self.key)
    }

    /// The scope of the key ([`crate::ClaimOptions::scope`]; empty: unscoped).
    pub fn scope(&self) -> &[u8] {
        crate::model::scope::split(&self.key).0
    }

    /// The checkpoint a previous holder saved, if this claim took over its key.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// Stores `response` as the key's outcome. Under `Immediate` it returns once durable.
    ///
    /// While the writer queue is full the call waits for room as long as the lease lasts.
    /// Whatever the result, the consumed lease does **not** release the key: the work is
    /// done, and releasing would let a waiting caller run it again. If the engine refused
    /// the response (`ResponseTooLarge`, or `Overloaded` because the queue stayed full until
    /// the lease ended), the key stays InFlight under [`Lease::token`] until the lease ends:
    /// other callers see `InProgress` until then, and the first claim after it takes the key
    /// over (attempt + 1). Within the lease [`crate::Engine::complete`] (a response that
    /// fits) or [`crate::Engine::release`] with the token still settle it.
    ///
    /// Writes staged on the lease ([`Lease::stage`]) are applied with the completion.
    pub fn complete(self, response: &[u8]) -> Result<(), LeaseError> {
        self.complete_arc(Arc::from(response))
    }

    /// Like [`Lease::complete`], sharing the caller's bytes.
    pub(crate) fn complete_arc(self, response: Arc<[u8]>) -> Result<(), LeaseError> {
        self.complete_kept(response, None, None).map(|_| ())
    }

    /// Stores `response` as the key's outcome and applies `writes` (after any writes staged
    /// on the lease) to the application's tables and outbox **in the same transaction**:
    /// after a crash either both are there or neither is, and a relay sees the emitted
    /// messages only once they are committed. Acknowledged as [`Lease::complete`] is (under
    /// `Immediate`, one fsync for both).
    ///
    /// None of the writes is applied if the completion is not: a lease lost to a takeover
    /// (`LeaseLost`), a refused completion (`ResponseTooLarge`, `WriteSet` when the writes
    /// with the staged ones are over a limit, `Overloaded`; the key is kept as for
    /// [`Lease::complete`]), or a storage failure. A repeated completion of a key this
    /// token already completed applies nothing again.
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine, WriteSet};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let Claim::Acquired(lease) = engine.claim(b"msg-7", &ClaimOptions::default())? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// let balance = engine.table_get("balances", b"alice")?.map_or(0, |b| b.len());
    /// let mut writes = WriteSet::new();
    /// writes.put("balances", b"alice", &vec![1; balance + 1])?.emit(b"msg-7 applied")?;
    /// lease.complete_with(b"ok", &writes)?;
    /// assert_eq!(engine.table_get("balances", b"alice")?, Some(vec![1]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn complete_with(self, response: &[u8], writes: &WriteSet) -> Result<(), LeaseError> {
        self.complete_kept(Arc::from(response), None, Some(writes))
            .map(|_| ())
    }

    /// [`Lease::complete`] with options: [`CompleteOptions::retention`] sets how long the
    /// key is remembered from this completion on (over the claim's and the engine's).
    /// Refused as [`Lease::complete`] is, and with [`LeaseError::RetentionTooLong`] for a
    /// retention past the maximum (the key stays held, as for `ResponseTooLarge`).
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, CompleteOptions, Durability, Engine};
    /// use std::time::Duration;
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let Claim::Acquired(lease) = engine.claim(b"k", &ClaimOptions::default())? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// lease.complete_with_options(b"done", &CompleteOptions::default().retention(week))?;
    /// let Claim::Completed(stored) = engine.claim(b"k", &ClaimOptions::default())? else {
    ///     unreachable!("the key was completed")
    /// };
    /// assert!(stored.expires_at() > std::time::SystemTime::now() + week / 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn complete_with_options(
        mut self,
        response: &[u8],
        opts: &CompleteOptions,
    ) -> Result<(), LeaseError> {
        let retention_ms = self.own_retention_ms(opts)?;
        self.complete_kept(Arc::from(response), retention_ms, None)
            .map(|_| ())
    }

    /// The completion's own retention from `opts`. A retention past the limit refuses the
    /// completion, and the work is done: the lease is settled without releasing the key
    /// (see [`Lease::complete`]).
    pub(crate) fn own_retention_ms(
        &mut self,
        opts: &CompleteOptions,
    ) -> Result<Option<u64>, LeaseError> {
        opts.retention_ms().inspect_err(|_| self.settled = true)
    }

    /// Completes with `writes` (after any staged on the lease) and the key's own retention
    /// `retention_ms` if given; returns the wall-clock end of the stored response's
    /// retention (ms).
    pub(crate) fn complete_kept(
        mut self,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<&WriteSet>,
    ) -> Result<u64, LeaseError> {
        // Settled whatever happens: a refused completion keeps the key until the lease ends.
        self.settled = true;
        let writes = merged(self.staged.settle(), writes)?;
        let writes = Some(&writes).filter(|w| !w.is_empty());
        self.engine
            .complete_kept(&self.key, self.token, response, retention_ms, writes)
    }

    /// Stages `writes` to be applied with this lease's completion: by [`Lease::complete`],
    /// [`Lease::complete_with`] (before its own writes), or the completion
    /// [`crate::Engine::run`] and `run_typed` make when the handler returns `Ok`. Staged
    /// writes are dropped, never applied, when the lease is released (a handler error in
    /// `run`), dropped, detached, or its completion is refused.
    ///
    /// Refused with `LeaseError::WriteSet` when the staged writes would be over a limit of
    /// one set (nothing is staged then), and `LeaseError::Settled` once the lease settled.
    pub fn stage(&self, writes: WriteSet) -> Result<(), LeaseError> {
        self.staged.stage(writes)
    }

    /// Lets the lease go on purpose **without** releasing the key, as if its holder had
    /// crashed: the key stays InFlight under this token until the lease ends, then the first
    /// claim takes it over (attempt + 1, checkpoint kept); a [`crate::KeepAlive`] of the
    /// lease stops renewing it. Dropping a lease unsettled does the same. Unlike
    /// `std::mem::forget`, the lease's handle on the engine is dropped, so closing the
    /// engine still closes the file.
    ///
    /// The returned [`Detached`] keeps what is needed to settle the key later from anywhere
    /// that holds the engine ([`crate::Engine::complete`], [`crate::Engine::release`] and
    /// [`crate::Engine::extend`] take the key and token; their `_scoped` forms the scope
    /// too), e.g. after handing the work to another thread or process step.
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine, KeyState};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let Claim::Acquired(lease) = engine.claim(b"k", &ClaimOptions::default())? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// let detached = lease.detach();
    /// assert!(matches!(engine.get(b"k")?, Some(KeyState::InFlight { .. })));
    /// engine.complete(detached.key(), detached.token(), b"done")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn detach(mut self) -> Detached {
        self.settled = true;
        self.staged.settle();
        Detached {
            key: self.key.clone(),
            token: self.token,
            attempt: self.attempt,
        }
    }

    /// Gives the key up after a retryable failure: it becomes Absent, and the next claim
    /// (or a waiting caller) acquires it. Returns whether this lease still owned the key.
    pub fn release(mut self) -> Result<bool, LeaseError> {
        self.settled = true;
        self.staged.settle();
        self.engine.release_at(&self.key, self.token)
    }

    /// Ends the attempt after a failure and **keeps** the key's progress: the lease ends
    /// now, and the key stays InFlight under this token, marked failed, with its checkpoint
    /// and fingerprint. The next claim (or a caller waiting in `claim_or_wait` or `run`,
    /// woken by the fail) takes it over at once: a new token, attempt + 1, the last
    /// checkpoint handed over; a claim with another payload is refused with
    /// `FingerprintMismatch`, so the key cannot be reused for a different request. Nobody
    /// retrying, the claim is reaped `retention` after the fail, as an abandoned one is,
    /// and [`crate::admin::Admin::abandoned`] lists it meanwhile. Under `Immediate` it returns once
    /// the failed record is durable.
    ///
    /// Compare [`Lease::release`], which forgets the attempt (the key becomes Absent, its
    /// checkpoint and fingerprint gone). Returns whether this lease still owned the key.
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine, KeyState};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let opts = ClaimOptions::default().payload(b"order 42");
    /// let Claim::Acquired(mut lease) = engine.claim(b"k", &opts)? else { unreachable!() };
    /// lease.set_checkpoint(1, b"charged")?;
    /// assert!(lease.fail()?);
    /// assert!(matches!(engine.get(b"k")?, Some(KeyState::InFlight { failed: true, .. })));
    /// let Claim::Acquired(retry) = engine.claim(b"k", &opts)? else { unreachable!() };
    /// assert_eq!((retry.attempt(), retry.checkpoint().map(|c| c.phase())), (2, Some(1)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fail(mut self) -> Result<bool, LeaseError> {
        self.settled = true;
        // Staged writes belong to a completion, which a fail is not.
        self.staged.settle();
        self.engine.fail_at(&self.key, self.token)
    }

    /// What `run` does with the lease after its handler's error, as `opts` says.
    pub(crate) fn end_after_error(self, opts: &ClaimOptions) -> Result<bool, LeaseError> {
        match opts.on_handler_error {
            OnHandlerError::Release => self.release(),
            OnHandlerError::Fail => self.fail(),
        }
    }

    /// Sets the lease to end `lease` from now (zero and very large values are valid).
    pub fn extend(&self, lease: Duration) -> Result<(), LeaseError> {
        self.engine.extend_at(&self.key, self.token, lease)
    }

    /// Saves progress so that a takeover after a crash or expiry can resume from it.
    pub fn set_checkpoint(&mut self, phase: u32, data: &[u8]) -> Result<(), LeaseError> {
        self.engine
            .checkpoint_at(&self.key, self.token, phase, data, None)?;
        self.checkpoint = Some(Checkpoint::new(phase, data));
        Ok(())
    }

    /// Saves a checkpoint and applies `writes` to the application's tables and outbox in the
    /// same transaction, or neither: a takeover after a crash finds the checkpoint exactly
    /// when it finds the writes, so it can resume from the state they describe. Under
    /// `Immediate` it returns once both are durable. Writes staged for the completion are
    /// not applied here.
    pub fn set_checkpoint_with(
        &mut self,
        phase: u32,
        data: &[u8],
        writes: &WriteSet,
    ) -> Result<(), LeaseError> {
        self.engine
            .checkpoint_at(&self.key, self.token, phase, data, Some(writes))?;
        self.checkpoint = Some(Checkpoint::new(phase, data));
        Ok(())
    }
}

impl Drop for Lease {
    /// An unsettled lease keeps its key until the lease ends, as [`Lease::detach`] does.
    fn drop(&mut self) {
        if !self.settled {
            self.staged.settle();
            self.engine.lease_dropped(&self.key, self.token);
        }
    }
}

/// What remains of a lease let go with [`Lease::detach`]: the key (and its scope) and the
/// fencing token that still own it until the lease ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached {
    /// The scoped key (`scope.rs`).
    key: ScopedKey,
    token: u64,
    attempt: u32,
}

impl Detached {
    /// The key the lease was for.
    pub fn key(&self) -> &[u8] {
        crate::model::scope::key_of(&self.key)
    }

    /// The scope of the key (empty: unscoped). Settle a scoped key with the `_scoped`
    /// calls, e.g. [`crate::Engine::complete_scoped`].
    pub fn scope(&self) -> &[u8] {
        crate::model::scope::split(&self.key).0
    }

    /// The lease's fencing token (unique and increasing, not dense: see [`Lease::token`]).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lease's attempt number.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// What [`Engine::run`] hands back to every caller of a key: the same bytes, and whether
/// they are a replay of someone else's run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub(crate) response: Arc<[u8]>,
    pub(crate) replayed: bool,
    pub(crate) token: u64,
    /// Wall-clock end of retention of the stored response, ms since the epoch.
    pub(crate) expires_wall_ms: u64,
}

impl Outcome {
    /// The winner's own outcome, stored until `expires_wall_ms`.
    pub(crate) fn fresh(response: Arc<[u8]>, token: u64, expires_wall_ms: u64) -> Self {
        Outcome {
            response,
            replayed: false,
            token,
            expires_wall_ms,
        }
    }

    /// Another caller's stored outcome.
    pub(crate) fn replay(stored: Stored) -> Self {
        Outcome {
            response: stored.response,
            replayed: true,
            token: stored.token,
            expires_wall_ms: stored.expires_wall_ms,
        }
    }
}

impl Outcome {
    /// The response bytes, identical for every caller of the key.
    pub fn response(&self) -> &[u8] {
        &self.response
    }

    /// False for the caller whose handler ran; true for everyone who got its result.
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// The token of the claim whose handler produced the response (unique and increasing,
    /// not dense: see [`Lease::token`]; never an identifier).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// When the stored response stops being remembered (see [`Stored::expires_at`]); for
    /// the caller whose handler ran, when the response it just stored will expire.
    pub fn expires_at(&self) -> SystemTime {
        wall_time(self.expires_wall_ms)
    }
}

/// What [`Engine::run_typed`] hands back: the value, and whether it is a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TypedOutcome<T> {
    /// The handler's value (decoded from storage for a replay).
    pub value: T,
    /// False for the caller whose handler ran.
    pub replayed: bool,
    /// When the stored value stops being remembered (see [`Stored::expires_at`]).
    pub expires_at: SystemTime,
}
