//! The async API: the same transitions as the blocking calls, applied by the same code
//! under the same stripe locks; only the waits differ. Each wait is a future woken by the
//! engine itself — the writer's durability watermark (`progress.rs`), a stripe's change
//! signal (`wake.rs`), or the engine's timer thread (`timer.rs`) — so the API needs no
//! particular runtime, never blocks a runtime thread on a wait, and a pending call costs
//! memory, not a thread.
//!
//! Cancellation (dropping a future at an await point) is defined at every point:
//!
//! - waiting for another holder (`claim_or_wait_async`, `run_async`): nothing was claimed;
//!   nothing happens.
//! - waiting for a won claim's durability (`Immediate`): the lease was never handed to
//!   anyone, so no work ran under it: the key is released (counted in
//!   `Stats::claims_cancelled`).
//! - `run_async`'s handler: the lease is dropped with the future and, as every [`Lease`]
//!   dropped unsettled, keeps the key InFlight until the lease ends (the handler may have
//!   done its side effect, or a task holding a [`LeaseHandle`] may still run); its
//!   keep-alive stops, so the lease does end.
//! - waiting for a completion's durability: the completion is queued and will be committed;
//!   the key is never released.
//! - waiting for room in a full queue to store a completion: nothing is stored and the key
//!   stays held until its lease ends (the work is done; a release would run it again).

use crate::api::constants::WAIT_DEFAULT;
use crate::api::engine::Engine;
use crate::api::keep_alive::KeepAlive;
use crate::api::lease::{Claim, Lease, Outcome};
use crate::api::options::{ClaimOptions, CompleteOptions, OnHandlerError};
#[cfg(feature = "postgres")]
use crate::api::remote::Remote;
use crate::base::clock::duration_ns;
use crate::base::sync::{Arc, Mutex};
use crate::index::stats::bump;
use crate::model::codec::Checkpoint;
use crate::model::error::{ClaimError, FlushError, LeaseError, Limit, RunError};
use crate::model::machine::Holder;
use crate::model::scope::ScopedKey;
use crate::model::write_set::{merged, stage, StagedState, WriteSet};
use crate::runtime::constants::WAIT_SLICE_MIN;
use crate::runtime::progress::Failed;
use std::fmt;
use std::future::{poll_fn, Future};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::api::claim_step::{flush_to_claim, Again, Prepared, Step};

impl Engine {
    /// The async form of [`Engine::claim`]: the same decision, taken at once; under
    /// `Immediate` an `Acquired` answer resolves once its InFlight record is durable.
    ///
    /// Dropping the future after the claim was won (while it waits for durability) releases
    /// the key: the lease never reached the caller, so no work ran under it.
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine};
    /// # futures_lite_block_on(async {
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let Claim::Acquired(lease) = engine.claim_async(b"k", &ClaimOptions::default()).await? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// lease.complete_async(b"done").await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     let waker = std::task::Waker::noop();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn claim_async(&self, key: &[u8], opts: &ClaimOptions) -> Result<Claim, ClaimError> {
        // Traced as the blocking call is, once the answer is known (a span is not held
        // across the awaits).
        let answer = self.claim_async_unobserved(key, opts).await;
        self.shared().observer().claim(key, false, || answer)
    }

    async fn claim_async_unobserved(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
    ) -> Result<Claim, ClaimError> {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return self.claim_remote_async(remote, key, opts, false).await;
        }
        self.check_key(key)?;
        let key = &self.scoped_key(&opts.scope, key)?;
        self.check_open()?;
        let mut looks = 0;
        loop {
            let step = self.look(key, opts, looks == 0)?;
            if let Some(claim) = self.settle_async(key, opts, step, &mut looks).await? {
                return Ok(claim);
            }
        }
    }

    /// The async form of [`Engine::claim_or_wait`]: while another holder works on the key
    /// the future waits — woken by the holder's completion or release, or by the end of its
    /// lease — up to [`ClaimOptions::wait`] (default 60 s), without blocking a thread.
    ///
    /// Dropping the future while it waits changes nothing; dropping it after the claim was
    /// won, before it returned the lease, releases the key.
    pub async fn claim_or_wait_async(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
    ) -> Result<Claim, ClaimError> {
        let answer = self.claim_or_wait_async_unobserved(key, opts).await;
        self.shared().observer().claim(key, true, || answer)
    }

    async fn claim_or_wait_async_unobserved(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
    ) -> Result<Claim, ClaimError> {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.remote() {
            return self.claim_remote_async(remote, key, opts, true).await;
        }
        self.check_key(key)?;
        let key = &self.scoped_key(&opts.scope, key)?;
        self.check_open()?;
        let s = self.shared();
        let wait = opts.wait.unwrap_or(WAIT_DEFAULT);
        let deadline = s.mono_ns().saturating_add(duration_ns(wait));
        let mut looking = Looking {
            deadline,
            counted: false,
            waited: false,
            timer_ns: None,
        };
        let mut looks = 0;
        loop {
            let step = poll_fn(|cx| self.poll_claim(key, opts, &mut looking, cx)).await?;
            if let Some(claim) = self.settle_async(key, opts, step, &mut looks).await? {
                return Ok(claim);
            }
        }
    }

    /// One look at the key for [`Engine::claim_or_wait_async`]: a decision, or (the key is
    /// busy and the wait has time left) a registration for the next change and a timer.
    fn poll_claim(
        &self,
        key: &ScopedKey,
        opts: &ClaimOptions,
        looking: &mut Looking,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Step, ClaimError>> {
        let s = self.shared();
        let (mut shard, changed, k) = s.index().lock(key);
        if !looking.counted {
            looking.counted = true;
            s.count_claim(&mut shard.events);
        }
        if looking.waited {
            // The outcome being waited for may be lost with the failed commit.
            if let Some(why) = s.poison_reason() {
                return Poll::Ready(Err(ClaimError::OutcomeUnknown(why)));
            }
            if s.is_closed() {
                return Poll::Ready(Err(ClaimError::Closed));
            }
        }
        let step = match self.claim_step(&mut shard, k, key, opts) {
            Ok(step) => step,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let Step::Busy(busy) = &step else {
            return Poll::Ready(Ok(step));
        };
        let now = s.mono_ns();
        if now >= looking.deadline {
            return Poll::Ready(Ok(step));
        }
        // A completing holder's publication wakes us through the stripe; a live lease may
        // also end, which nothing announces: that needs the timer.
        let left = looking.deadline - now;
        let wake_ns = if busy.completing {
            looking.deadline
        } else {
            now + duration_ns(busy.retry_after)
                .max(duration_ns(WAIT_SLICE_MIN))
                .min(left)
        };
        bump(&s.counters().waits);
        looking.waited = true;
        match shard.published_at(k) {
            // A durable completion is published by the writer's watermark, which wakes its
            // waiters; the stripe is not notified. Durable since this look: look again.
            Some(seq) => {
                if s.progress().poll(seq, s, cx).is_ready() {
                    cx.waker().wake_by_ref();
                }
            }
            // Registered under the stripe lock: a change made after this look wakes us.
            None => changed.watch(cx.waker()),
        }
        drop(shard);
        if looking.timer_ns != Some(wake_ns) {
            looking.timer_ns = Some(wake_ns);
            s.timers().wake_at(self.shared_arc(), wake_ns, cx.waker());
        }
        Poll::Pending
    }

    /// The async driver of `prepare` (see `Engine::settle`).
    async fn settle_async(
        &self,
        key: &ScopedKey,
        opts: &ClaimOptions,
        step: Step,
        looks: &mut u32,
    ) -> Result<Option<Claim>, ClaimError> {
        let answer = match self.prepare(key, opts, step)? {
            Prepared::Ready(answer) => answer,
            Prepared::Durable { seq, lease } => {
                let mut won = Won(Some(lease));
                self.durable(seq)
                    .await
                    .map_err(|why| self.claim_wait_failed(why))?;
                match won.0.take() {
                    Some(lease) => Ok(Claim::Acquired(lease)),
                    None => Err(Again::Record),
                }
            }
            Prepared::Tokens => {
                self.flush_async().await.map_err(flush_to_claim)?;
                Err(Again::Tokens)
            }
            Prepared::Marker { seq } => {
                self.durable(seq)
                    .await
                    .map_err(|_| self.marker_wait_failed())?;
                Err(Again::Marker)
            }
        };
        self.count_look(answer, looks)
    }

    /// Resolves once the write numbered `seq` is durable (0: at once).
    pub(crate) fn durable(&self, seq: u64) -> impl Future<Output = Result<(), Failed>> + '_ {
        let s = self.shared();
        poll_fn(move |cx| {
            if seq == 0 {
                return Poll::Ready(Ok(()));
            }
            s.progress().poll(seq, s, cx)
        })
    }

    /// The async form of [`Engine::flush`]: resolves once every call acknowledged so far is
    /// durable. A full writer queue is waited out without blocking.
    pub async fn flush_async(&self) -> Result<(), FlushError> {
        #[cfg(feature = "postgres")]
        if self.remote().is_some() {
            return self.flush();
        }
        let s = self.shared();
        if let Some(why) = s.poison_reason() {
            return Err(FlushError::Poisoned(why));
        }
        if s.is_closed() {
            return Err(FlushError::Closed);
        }
        let seq = loop {
            match s.try_send_barrier() {
                Ok(Some(seq)) => break seq,
                Ok(None) => {
                    self.room(u64::MAX).await;
                }
                Err(e) => return Err(e),
            }
        };
        self.durable(seq).await.map_err(|_| s.flush_stopped())
    }

    /// Waits until the writer has taken what is queued now off the queue (its commit is
    /// published), `deadline_ns` passes, or the engine stops. False only when the deadline
    /// passed first.
    pub(crate) async fn room(&self, deadline_ns: u64) -> bool {
        let s = self.shared();
        let queued = s.progress().issued();
        let mut timer_set = false;
        poll_fn(|cx| {
            let full = s.queue_full();
            if !full || s.poison_reason().is_some() || s.is_closed() {
                return Poll::Ready(true);
            }
            if s.mono_ns() >= deadline_ns {
                return Poll::Ready(false);
            }
            if s.progress().poll(queued, s, cx).is_ready() {
                return Poll::Ready(true);
            }
            if !timer_set && deadline_ns != u64::MAX {
                timer_set = true;
                s.timers()
                    .wake_at(self.shared_arc(), deadline_ns, cx.waker());
            }
            Poll::Pending
        })
        .await
    }

    /// [`Engine::with_room`] for futures: a full queue is waited out while the lease lasts.
    async fn with_room_async<T>(
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
                            if !self.room(deadline).await {
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

    async fn wait_holder_async(&self, seq: u64) -> Result<(), LeaseError> {
        self.durable(seq).await.map_err(LeaseError::OutcomeUnknown)
    }

    /// The async form of [`Engine::run`]: the winner's `handler` is a future, given a
    /// [`LeaseHandle`] (`'static`, so the future can own it); every concurrent or later
    /// caller waits without blocking and receives the same bytes with `replayed` set. A
    /// handler's error releases or fails the claim, as [`ClaimOptions::on_handler_error`]
    /// says (see [`Engine::run`]).
    ///
    /// The lease is renewed while the handler's future is alive, up to ten minutes by
    /// default ([`ClaimOptions::keep_alive`]), so a slow handler keeps its key. Dropping the returned future while the handler runs
    /// (an outer `tokio::time::timeout`, a disconnected client) drops the lease, which keeps
    /// the key InFlight until the lease ends, as after a crash of its holder: the handler
    /// may already have done its side effect, so a duplicate must not run it at once. The
    /// keep-alive stops with the future; the first claim after the lease ends takes the key
    /// over (attempt + 1, checkpoint kept). A panicking handler does the same.
    pub async fn run_async<E, F, Fut>(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
        handler: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
    {
        match self.claim_or_wait_async(key, opts).await? {
            Claim::Acquired(lease) => {
                let token = lease.token();
                let keep = opts.keep_alive_max().map(|max| lease.keep_alive(max));
                let out = handler(lease.handle()).await;
                drop(keep);
                match out {
                    Ok(bytes) => {
                        let response: Arc<[u8]> = Arc::from(bytes);
                        let expires_wall_ms = lease
                            .complete_kept_async(response.clone(), None, None)
                            .await
                            .map_err(|e| self.not_stored(key, opts, token, e))?;
                        Ok(Outcome::fresh(response, token, expires_wall_ms))
                    }
                    Err(e) => {
                        // The handler's failure is the error to report; a failed release or
                        // fail leaves the lease to expire, which is also safe.
                        let _ = match opts.on_handler_error {
                            OnHandlerError::Release => lease.release_async().await,
                            OnHandlerError::Fail => lease.fail_async().await,
                        };
                        Err(RunError::Handler(e))
                    }
                }
            }
            Claim::Completed(stored) => Ok(Outcome::replay(stored)),
            Claim::InProgress(busy) => Err(RunError::still_in_progress(&busy)),
            Claim::Forgotten(forgotten) => Err(RunError::Forgotten(forgotten)),
        }
    }
}

/// The state of one `claim_or_wait_async` across its looks.
struct Looking {
    deadline: u64,
    /// Whether the call was counted (once, at its first look).
    counted: bool,
    waited: bool,
    /// The instant a timer is set for, so a look woken early does not set another.
    timer_ns: Option<u64>,
}

/// A claim won while its future waits for durability: dropped with the future, it releases
/// the key (the lease never reached the caller, so no work ran under it) and counts the
/// cancellation.
struct Won(Option<Lease>);

impl Drop for Won {
    fn drop(&mut self) {
        if let Some(mut lease) = self.0.take() {
            bump(&lease.engine.shared().counters().claims_cancelled);
            lease.settled = true;
            lease.engine.release_unwaited(&lease.key, lease.token);
        }
    }
}

impl Lease {
    /// The async form of [`Lease::complete`]: resolves once the completion is durable under
    /// `Immediate`, waiting for room in a full queue without blocking. Dropping the future
    /// at any point never releases the key: before its first poll the lease inside is
    /// dropped unsettled (the key is kept until the lease ends), later the completion is
    /// queued or, still waiting for room, the lease runs out.
    pub async fn complete_async(self, response: &[u8]) -> Result<(), LeaseError> {
        self.complete_arc_async(Arc::from(response), None).await
    }

    /// The async form of [`Lease::complete_with`]: the completion and `writes` (after the
    /// staged ones) in one transaction, or neither.
    pub async fn complete_with_async(
        self,
        response: &[u8],
        writes: &WriteSet,
    ) -> Result<(), LeaseError> {
        self.complete_arc_async(Arc::from(response), Some(writes))
            .await
    }

    pub(crate) async fn complete_arc_async(
        self,
        response: Arc<[u8]>,
        writes: Option<&WriteSet>,
    ) -> Result<(), LeaseError> {
        self.complete_kept_async(response, None, writes)
            .await
            .map(|_| ())
    }

    /// The async form of [`Lease::complete_with_options`].
    pub async fn complete_with_options_async(
        mut self,
        response: &[u8],
        opts: &CompleteOptions,
    ) -> Result<(), LeaseError> {
        let retention_ms = self.own_retention_ms(opts)?;
        self.complete_kept_async(Arc::from(response), retention_ms, None)
            .await
            .map(|_| ())
    }

    /// Completes with the key's own retention `retention_ms` if given; resolves to the
    /// wall-clock end of the stored response's retention (ms).
    pub(crate) async fn complete_kept_async(
        mut self,
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
        writes: Option<&WriteSet>,
    ) -> Result<u64, LeaseError> {
        // Settled whatever happens: a refused completion keeps the key until the lease ends.
        self.settled = true;
        let writes = merged(self.staged.settle(), writes)?;
        let writes = Some(&writes).filter(|w| !w.is_empty());
        let (engine, key, token) = (&self.engine, &self.key, self.token);
        #[cfg(feature = "postgres")]
        if let Some(remote) = engine.remote() {
            let mut expires_wall_ms = 0;
            let done = match engine.check_response(key, &response) {
                Ok(()) => {
                    remote
                        .complete_async(key, token, response, retention_ms, writes)
                        .await
                }
                Err(e) => Err(e),
            }
            .map(|expires| expires_wall_ms = expires);
            let key = crate::model::scope::key_of(key);
            return engine
                .shared()
                .observer()
                .complete(key, token, || done)
                .map(|()| expires_wall_ms);
        }
        let done = async {
            let (seq, expires_wall_ms) = engine
                .with_room_async(key, token, || {
                    engine.try_complete_kept(key, token, response.clone(), retention_ms, writes)
                })
                .await?;
            engine.wait_holder_async(seq).await?;
            Ok(expires_wall_ms)
        }
        .await;
        let mut expires_wall_ms = 0;
        engine
            .shared()
            .observer()
            .complete(crate::model::scope::key_of(key), token, || {
                done.map(|expires| expires_wall_ms = expires)
            })?;
        Ok(expires_wall_ms)
    }

    /// The async form of [`Lease::release`]. Dropping the future before its first poll drops
    /// the lease unsettled (the key is kept until the lease ends); dropping it later leaves
    /// the release queued (or, if it was still waiting for room, the lease to run out).
    pub async fn release_async(mut self) -> Result<bool, LeaseError> {
        self.settled = true;
        self.staged.settle();
        let (engine, key, token) = (&self.engine, &self.key, self.token);
        engine.check_lease_call(key)?;
        #[cfg(feature = "postgres")]
        if let Some(remote) = engine.remote() {
            return remote.release_async(key, token).await;
        }
        let (released, seq) = engine
            .with_room_async(key, token, || engine.release_locked(key, token))
            .await?;
        let seq = if engine.waits_for_durability() {
            seq
        } else {
            0
        };
        engine.wait_holder_async(seq).await?;
        Ok(released)
    }

    /// The async form of [`Lease::fail`]: the lease ends now and the record stays, marked
    /// failed, with its checkpoint and fingerprint; resolves once the failed record is
    /// durable under `Immediate`, waiting for room in a full queue without blocking.
    /// Dropping the future before its first poll drops the lease unsettled (the key is kept
    /// until the lease ends); dropping it later leaves the fail queued (or, if it was still
    /// waiting for room, the lease to run out).
    pub async fn fail_async(mut self) -> Result<bool, LeaseError> {
        self.settled = true;
        self.staged.settle();
        let (engine, key, token) = (&self.engine, &self.key, self.token);
        let done = async {
            engine.check_lease_call(key)?;
            #[cfg(feature = "postgres")]
            if let Some(remote) = engine.remote() {
                return remote.fail_async(key, token).await;
            }
            let (failed, seq) = engine
                .with_room_async(key, token, || engine.fail_locked(key, token))
                .await?;
            engine.wait_holder_async(engine.durable_wait(seq)).await?;
            Ok(failed)
        }
        .await;
        let key = crate::model::scope::key_of(key);
        engine.shared().observer().fail(key, token, || done)
    }

    /// Renews this lease while the returned guard lives and the lease is unsettled: every
    /// third of the lease, its end is moved a full lease ahead, but never past `max` from
    /// now. Drop the guard when the work ends; settling the lease (complete, release, fail,
    /// detach) or dropping it also stops the renewals.
    ///
    /// A holder that dies drops its guard and its lease (a task dropped by its runtime, a
    /// thread that unwound), so its key is taken over one lease later rather than at `max`.
    pub fn keep_alive(&self, max: Duration) -> KeepAlive {
        self.engine
            .keep_alive(&self.key, self.token, self.lease, max, self.staged.shared())
    }

    /// A handle on this lease for a future that must own it (see [`Engine::run_async`]).
    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            engine: self.engine.clone(),
            key: self.key.clone(),
            token: self.token,
            attempt: self.attempt,
            checkpoint: self.checkpoint.clone(),
            staged: self.staged.shared(),
        }
    }
}

/// A clonable, `'static` handle on a lease, for async handlers: what the lease is
/// (scope, key, token, attempt, the checkpoint it took over) and what a holder does while it
/// works (extend, checkpoint, stage writes for the completion). Completing, releasing and
/// failing stay with the [`Lease`] itself: under [`Engine::run_async`] the handler's result
/// decides (an error releases or fails the claim, as [`ClaimOptions::on_handler_error`]
/// says), so that one owner ends the lease. A handle may outlive its lease (a task the
/// handler spawned): that is why a lease dropped unsettled keeps its key until the lease
/// ends rather than handing it to a duplicate while the task may still act under the token.
#[derive(Clone)]
pub struct LeaseHandle {
    engine: Engine,
    /// The scoped key (`scope.rs`).
    key: ScopedKey,
    token: u64,
    attempt: u32,
    checkpoint: Option<Checkpoint>,
    staged: Arc<Mutex<StagedState>>,
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("scope", &String::from_utf8_lossy(self.scope()))
            .field("key", &String::from_utf8_lossy(self.key()))
            .field("token", &self.token)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl LeaseHandle {
    /// The fencing token: unique and strictly increasing per file, not dense (see
    /// [`Lease::token`]); never an identifier.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// 1 for a fresh claim; one more for each takeover.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        crate::model::scope::key_of(&self.key)
    }

    /// The scope of the key (empty: unscoped).
    pub fn scope(&self) -> &[u8] {
        crate::model::scope::split(&self.key).0
    }

    /// The checkpoint a previous holder saved, if this claim took over its key.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// The async form of [`Lease::extend`].
    pub async fn extend(&self, lease: Duration) -> Result<(), LeaseError> {
        self.update(Holder::Extend { lease }, None).await
    }

    /// The async form of [`Lease::set_checkpoint`]: a takeover receives it.
    pub async fn set_checkpoint(&self, phase: u32, data: &[u8]) -> Result<(), LeaseError> {
        self.engine.check_checkpoint(data)?;
        self.update(Holder::Checkpoint(Checkpoint::new(phase, data)), None)
            .await
    }

    /// The async form of [`Lease::set_checkpoint_with`]: the checkpoint and `writes` in one
    /// transaction, or neither.
    pub async fn set_checkpoint_with(
        &self,
        phase: u32,
        data: &[u8],
        writes: &WriteSet,
    ) -> Result<(), LeaseError> {
        self.engine.check_checkpoint(data)?;
        let op = Holder::Checkpoint(Checkpoint::new(phase, data));
        self.update(op, Some(writes)).await
    }

    /// Stages `writes` for the lease's completion (see [`Lease::stage`]): in
    /// [`Engine::run_async`], they are applied with the completion made when the handler's
    /// future returns `Ok`, and dropped when it fails or is dropped.
    pub fn stage(&self, writes: WriteSet) -> Result<(), LeaseError> {
        stage(&self.staged, writes)
    }

    async fn update(&self, op: Holder, writes: Option<&WriteSet>) -> Result<(), LeaseError> {
        let (engine, key, token) = (&self.engine, &self.key[..], self.token);
        #[cfg(feature = "postgres")]
        if let Some(remote) = engine.remote() {
            engine.check_lease_call(key)?;
            return remote.update_async(key, token, op, writes).await;
        }
        let seq = engine
            .with_room_async(key, token, || {
                engine.update_inflight(key, token, op.clone(), writes)
            })
            .await?;
        engine.wait_holder_async(seq).await
    }
}

/// Claims on a remote backend, awaited.
#[cfg(feature = "postgres")]
impl Engine {
    /// `claim_async` (`wait`: `claim_or_wait_async`) on the remote backend `remote`.
    async fn claim_remote_async(
        &self,
        remote: &dyn Remote,
        key: &[u8],
        opts: &ClaimOptions,
        wait: bool,
    ) -> Result<Claim, ClaimError> {
        let (key, ask) = self.remote_ask(key, opts, wait)?;
        let answer = remote.claim_async(&key, &ask).await?;
        Ok(self.remote_claim(key, answer))
    }
}
