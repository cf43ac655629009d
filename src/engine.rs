//! The engine: the per-key state machine over the index, and the calls users make.
//!
//! Every transition happens under the key's stripe lock, in one step: look at the slot,
//! decide, queue the write (non-blocking), change the slot. That is the atomic
//! compare-and-set the crate exists for. Waiting for durability happens after the lock is
//! dropped.

use crate::clock::{duration_ms, duration_ns, ClockListener, Time};
use crate::codec::{self, Blob, Checkpoint, Record, RecordState};
use crate::constants::*;
use crate::error::{ClaimError, FlushError, LeaseError, Limit, OpenError, RunError};
use crate::index::{Index, Map, Slot, SlotState};
use crate::lease::{Busy, Claim, KeyState, Lease, Outcome, Stored, TypedOutcome};
use crate::options::{ClaimOptions, Durability, EngineBuilder, Recovery};
use crate::stats::{bump, read, Counters, Stats};
use crate::storage::{Store, Write};
use crate::sync::{Arc, AtomicBool, Mutex, MutexGuard, Ordering, Weak};
use crate::token::{Shortage, Tokens};
use crate::writer::{self, ack_pair, wait_ack, Op};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

/// Settings fixed at open, in the units the hot path uses.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) durability: Durability,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) key_len_max: usize,
    pub(crate) response_len_max: usize,
    pub(crate) checkpoint_len_max: usize,
    pub(crate) inflight_max: u64,
    /// Queue length above which new claims are refused (the rest is headroom for holders).
    pub(crate) claim_queue_max: usize,
}

/// State shared by every engine handle and the writer thread.
pub(crate) struct Shared {
    pub(crate) index: Index,
    pub(crate) time: Time,
    pub(crate) cfg: Config,
    pub(crate) tokens: Tokens,
    pub(crate) counters: Counters,
    pub(crate) tx: Option<Sender<Op>>,
    poisoned: AtomicBool,
    poison_why: Mutex<Option<Arc<str>>>,
    closed: AtomicBool,
    writer_stopped: AtomicBool,
    /// The active test-only sabotage (a `Sabotage` as u8; 0 is none).
    #[cfg(feature = "testkit")]
    pub(crate) sabotage: crate::sync::AtomicU8,
}

/// Bugs a test can switch on, to prove that the checkers catch them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "testkit"), allow(dead_code))]
pub(crate) enum Sabotage {
    /// Claims look the key up, drop the lock, then insert: check-then-act.
    CheckThenAct = 1,
    /// `complete` does not compare tokens.
    NoFencing = 2,
}

impl Shared {
    /// Records the first storage failure; every later call is refused with it.
    pub(crate) fn poison(&self, why: String) -> Arc<str> {
        let why = {
            let mut slot = self.poison_why.lock();
            slot.get_or_insert_with(|| Arc::from(why)).clone()
        };
        self.poisoned.store(true, Ordering::Release);
        self.index.wake_all();
        why
    }

    pub(crate) fn poison_reason(&self) -> Option<Arc<str>> {
        if self.poisoned.load(Ordering::Acquire) {
            self.poison_why.lock().clone()
        } else {
            None
        }
    }

    pub(crate) fn writer_stopped(&self) -> bool {
        self.writer_stopped.load(Ordering::Acquire)
    }

    pub(crate) fn set_writer_stopped(&self) {
        self.writer_stopped.store(true, Ordering::Release);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// Why an operation could not be queued.
pub(crate) enum SendRefused {
    Full,
    Closed,
}

/// One decision of the state machine, taken under the stripe lock.
enum Step {
    Acquired {
        token: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
        ack: Option<Receiver<Result<(), Arc<str>>>>,
    },
    Busy(Busy),
    Replay(Stored),
    NeedTokens,
}

/// An embedded idempotency engine. Cheap to clone; all clones share one engine, which
/// closes when the last clone (and the last [`Lease`]) is dropped.
///
/// ```
/// use idemkv::{Claim, ClaimOptions, Durability, Engine};
/// let engine = Engine::builder().durability(Durability::None).open()?;
/// let opts = ClaimOptions::default().payload(b"charge 42");
/// match engine.claim(b"order-42", &opts)? {
///     Claim::Acquired(lease) => lease.complete(b"charged")?,
///     Claim::InProgress(busy) => println!("retry in {:?}", busy.retry_after()),
///     Claim::Completed(stored) => println!("replay {:?}", stored.response()),
/// }
/// let again = engine.claim(b"order-42", &opts)?;
/// assert!(matches!(again, Claim::Completed(s) if s.response() == b"charged"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Kept alive so the clock's weak reference to it stays valid.
    _clock_listener: Arc<ClockListener>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = close_shared(&self.shared, &self.writer);
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("durability", &self.shared().cfg.durability)
            .finish()
    }
}

fn close_shared(shared: &Shared, writer: &Mutex<Option<JoinHandle<()>>>) -> Result<(), FlushError> {
    if !shared.closed.swap(true, Ordering::AcqRel) {
        // Every queued send happens under a stripe lock after a check of `closed`: passing
        // through each lock once orders all of them before the shutdown message.
        for stripe in shared.index.stripes() {
            drop(stripe.map.lock());
        }
        if let Some(tx) = &shared.tx {
            let _ = tx.send(Op::Shutdown);
        }
        if let Some(handle) = writer.lock().take() {
            let _ = handle.join();
        }
        shared.set_writer_stopped();
        shared.index.wake_all();
    }
    match shared.poison_reason() {
        Some(why) => Err(FlushError::Poisoned(why)),
        None => Ok(()),
    }
}

impl EngineBuilder {
    /// Opens the engine: validates the settings, opens or creates the file, recovers its
    /// records, and starts the writer.
    pub fn open(self) -> Result<Engine, OpenError> {
        self.validate()?;
        let time = Time::new(self.clock.clone());
        let index = Index::new(self.stripes);
        let counters = Counters::default();
        let (tokens, store) = if self.durability == Durability::None {
            (Tokens::new(1, u64::MAX), None)
        } else {
            let store = Store::open(&self)?;
            let next = recover(&store, &self, &index, &time, &counters)?;
            let limit = next.saturating_add(TOKEN_RESERVE);
            (Tokens::new(next, limit), Some(store))
        };
        let cfg = Config {
            durability: self.durability,
            lease: self.lease,
            retention: self.retention,
            key_len_max: self.key_len_max,
            response_len_max: self.response_len_max,
            checkpoint_len_max: self.checkpoint_len_max,
            inflight_max: self.inflight_max as u64,
            claim_queue_max: self.queue_depth - self.queue_depth / QUEUE_CLAIM_HEADROOM_DIVISOR,
        };
        let (tx, rx) = match store {
            Some(_) => {
                let (tx, rx) = crossbeam_channel::bounded(self.queue_depth);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let shared = Arc::new(Shared {
            index,
            time,
            cfg,
            tokens,
            counters,
            tx,
            poisoned: AtomicBool::new(false),
            poison_why: Mutex::new(None),
            closed: AtomicBool::new(false),
            writer_stopped: AtomicBool::new(false),
            #[cfg(feature = "testkit")]
            sabotage: crate::sync::AtomicU8::new(0),
        });
        let writer = match (store, rx) {
            (Some(store), Some(rx)) => {
                Some(writer::spawn(shared.clone(), store, rx).map_err(OpenError::Io)?)
            }
            _ => None,
        };
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        let listener: Arc<ClockListener> = Arc::new(move || {
            if let Some(shared) = weak.upgrade() {
                shared.index.wake_all();
            }
        });
        self.clock.subscribe(Arc::downgrade(&listener));
        Ok(Engine {
            inner: Arc::new(Inner {
                shared,
                writer: Mutex::new(writer),
                _clock_listener: listener,
            }),
        })
    }
}

/// Loads every record into the index and makes the token mark durable above every token
/// the file has seen. Returns the first token to issue.
fn recover(
    store: &Store,
    b: &EngineBuilder,
    index: &Index,
    time: &Time,
    counters: &Counters,
) -> Result<u64, OpenError> {
    let now_ns = time.mono_ns();
    let now_wall = time.wall_ms();
    let mut stale: Vec<u64> = Vec::new();
    let mut max_token = 0u64;
    let scanned = store.scan(|token, record| {
        let record = record.map_err(|e| OpenError::Corrupted {
            detail: format!("record under token {token}: {e}"),
        })?;
        max_token = max_token.max(token);
        let key: Box<[u8]> = Box::from(&record.key.0[..]);
        let slot = match record.state {
            RecordState::Completed {
                expires_wall_ms, ..
            } if expires_wall_ms <= now_wall => {
                stale.push(token);
                return Ok(());
            }
            RecordState::Completed {
                response,
                attempt,
                expires_wall_ms,
                ..
            } => Slot {
                token,
                fingerprint: record.fingerprint,
                attempt,
                state: SlotState::Completed {
                    response: response.0,
                    expires_ns: now_ns
                        .saturating_add((expires_wall_ms - now_wall).saturating_mul(1_000_000)),
                    expires_wall_ms,
                    published: true,
                },
            },
            RecordState::InFlight {
                lease_deadline_wall_ms,
                attempt,
                checkpoint,
            } => {
                let deadline_ns = match b.recovery {
                    Recovery::TakeOver => now_ns,
                    Recovery::HonourLeases => {
                        let left_ms = lease_deadline_wall_ms.saturating_sub(now_wall);
                        let left_ns = left_ms.saturating_mul(1_000_000).min(duration_ns(b.lease));
                        now_ns.saturating_add(left_ns)
                    }
                };
                Slot {
                    token,
                    fingerprint: record.fingerprint,
                    attempt,
                    state: SlotState::InFlight {
                        deadline_ns,
                        checkpoint: checkpoint.map(Box::new),
                    },
                }
            }
        };
        let (mut map, _) = index.lock(&key);
        let replaced = match map.get(&key) {
            // Two records of one key cannot be committed together; keep the newer if a
            // damaged history left both.
            Some(existing) if existing.token > token => {
                stale.push(token);
                return Ok(());
            }
            Some(existing) => Some(existing.clone()),
            None => None,
        };
        if let Some(old) = replaced {
            stale.push(old.token);
            gauge_remove(counters, &old);
        }
        gauge_add(counters, &slot);
        map.insert(key, slot);
        Ok(())
    })?;
    scanned?;
    let hwm = store.token_hwm()?;
    let next = hwm.max(max_token.saturating_add(1)).max(1);
    let writes: Vec<Write> = stale
        .into_iter()
        .map(|token| Write::Delete { token })
        .collect();
    store
        .commit(&writes, Some(next.saturating_add(TOKEN_RESERVE)))
        .map_err(|detail| OpenError::Corrupted { detail })?;
    Ok(next)
}

fn gauge_add(c: &Counters, slot: &Slot) {
    if slot.is_inflight() {
        c.inflight.fetch_add(1, Ordering::Relaxed);
    } else {
        c.completed.fetch_add(1, Ordering::Relaxed);
    }
}

fn gauge_remove(c: &Counters, slot: &Slot) {
    if slot.is_inflight() {
        c.inflight.fetch_sub(1, Ordering::Relaxed);
    } else {
        c.completed.fetch_sub(1, Ordering::Relaxed);
    }
}

fn inflight_record(key: &[u8], slot: &Slot, deadline_wall_ms: u64) -> Record {
    let checkpoint = match &slot.state {
        SlotState::InFlight { checkpoint, .. } => checkpoint.as_deref().cloned(),
        SlotState::Completed { .. } => None,
    };
    Record {
        key: Blob(Arc::from(key)),
        fingerprint: slot.fingerprint,
        state: RecordState::InFlight {
            lease_deadline_wall_ms: deadline_wall_ms,
            attempt: slot.attempt,
            checkpoint,
        },
    }
}

impl Engine {
    /// A builder with the defaults: `Immediate`, 30 s lease, 24 h retention.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Opens (or creates) the file at `path` with the builder defaults.
    pub fn open(path: impl AsRef<Path>) -> Result<Engine, OpenError> {
        Engine::builder().path(path.as_ref()).open()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Whether a test has switched this sabotage on (always false without `testkit`).
    #[inline]
    fn sabotaged(&self, which: Sabotage) -> bool {
        #[cfg(feature = "testkit")]
        {
            self.shared().sabotage.load(Ordering::Relaxed) == which as u8
        }
        #[cfg(not(feature = "testkit"))]
        {
            let _ = which;
            false
        }
    }

    /// The durability mode this engine was opened with.
    pub fn durability(&self) -> Durability {
        self.shared().cfg.durability
    }

    fn check_key(&self, key: &[u8]) -> Result<(), ClaimError> {
        let max = self.shared().cfg.key_len_max;
        if key.is_empty() {
            return Err(ClaimError::KeyEmpty);
        }
        if key.len() > max {
            return Err(ClaimError::KeyTooLong {
                len: key.len(),
                max,
            });
        }
        Ok(())
    }

    pub(crate) fn check_open(&self) -> Result<(), ClaimError> {
        let s = self.shared();
        if let Some(why) = s.poison_reason() {
            return Err(ClaimError::Poisoned(why));
        }
        if s.is_closed() {
            return Err(ClaimError::Closed);
        }
        Ok(())
    }

    fn check_lease_call(&self, key: &[u8]) -> Result<(), LeaseError> {
        match self.check_key(key).and_then(|()| self.check_open()) {
            Ok(()) => Ok(()),
            Err(ClaimError::KeyTooLong { len, max }) => Err(LeaseError::KeyTooLong { len, max }),
            Err(ClaimError::Poisoned(why)) => Err(LeaseError::Poisoned(why)),
            Err(ClaimError::Closed) => Err(LeaseError::Closed),
            // An empty key was never claimed, so no lease can own it.
            Err(_) => Err(LeaseError::LeaseLost),
        }
    }

    /// Queues `op` for the writer. Called under the key's stripe lock, which keeps each
    /// key's operations in order; never blocks. `claim` ops must leave the headroom free.
    pub(crate) fn send(&self, op: Op, claim: bool) -> Result<(), SendRefused> {
        let s = self.shared();
        let Some(tx) = &s.tx else { return Ok(()) };
        if s.is_closed() {
            return Err(SendRefused::Closed);
        }
        if claim && tx.len() >= s.cfg.claim_queue_max {
            return Err(SendRefused::Full);
        }
        match tx.try_send(op) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SendRefused::Full),
            Err(TrySendError::Disconnected(_)) => Err(SendRefused::Closed),
        }
    }

    fn ack_for_mode(&self) -> (Option<writer::Ack>, Option<Receiver<Result<(), Arc<str>>>>) {
        if self.durability() == Durability::Immediate {
            let (tx, rx) = ack_pair();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        }
    }

    /// The state machine's claim transition. Runs under the stripe lock.
    fn claim_step(
        &self,
        map: &mut MutexGuard<'_, Map>,
        key: &[u8],
        opts: &ClaimOptions,
    ) -> Result<Step, ClaimError> {
        let s = self.shared();
        let c = &s.counters;
        let now = s.time.mono_ns();
        let mut takeover = false;
        let mut old_token = None;
        let mut expired_slot = false;
        let mut attempt = 1u32;
        let mut checkpoint: Option<Box<Checkpoint>> = None;
        let mut fingerprint = opts.fingerprint;
        if let Some(slot) = map.get(key) {
            old_token = Some(slot.token);
            if slot.is_expired(now) {
                expired_slot = true;
            } else {
                if let (Some(asked), Some(stored)) = (opts.fingerprint, slot.fingerprint) {
                    if asked != stored {
                        bump(&c.fingerprint_mismatches);
                        return Err(ClaimError::FingerprintMismatch);
                    }
                }
                match &slot.state {
                    SlotState::Completed {
                        response,
                        published: true,
                        ..
                    } => {
                        bump(&c.replays);
                        return Ok(Step::Replay(Stored {
                            response: response.clone(),
                            token: slot.token,
                            attempt: slot.attempt,
                        }));
                    }
                    SlotState::Completed { .. } => {
                        bump(&c.in_progress);
                        return Ok(Step::Busy(Busy {
                            retry_after: RETRY_AFTER_UNPUBLISHED,
                            attempt: slot.attempt,
                        }));
                    }
                    SlotState::InFlight { deadline_ns, .. } if now < *deadline_ns => {
                        bump(&c.in_progress);
                        return Ok(Step::Busy(Busy {
                            retry_after: Duration::from_nanos(deadline_ns - now),
                            attempt: slot.attempt,
                        }));
                    }
                    SlotState::InFlight {
                        checkpoint: saved, ..
                    } => {
                        takeover = true;
                        attempt = slot.attempt.saturating_add(1);
                        checkpoint = saved.clone();
                        fingerprint = fingerprint.or(slot.fingerprint);
                    }
                }
            }
        }
        // A takeover keeps the key InFlight, so only a new claim counts against the limit.
        if !takeover
            && c.inflight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < s.cfg.inflight_max).then_some(n + 1)
                })
                .is_err()
        {
            bump(&c.overloaded);
            return Err(ClaimError::Overloaded(Limit::InFlightClaims));
        }
        let undo = |c: &Counters| {
            if !takeover {
                c.inflight.fetch_sub(1, Ordering::AcqRel);
            }
        };
        let token = match s.tokens.issue() {
            Ok(token) => token,
            Err(shortage) => {
                undo(c);
                return match shortage {
                    Shortage::NeedReserve => Ok(Step::NeedTokens),
                    Shortage::Exhausted => Err(ClaimError::TokensExhausted),
                };
            }
        };
        debug_assert!(
            old_token.is_none_or(|old| old < token),
            "tokens must increase per key"
        );
        // Test-only sabotage: open a check-then-act window, the bug this crate exists to
        // prevent, so that the checkers can show they catch it (docs/testing.md).
        if old_token.is_none() && self.sabotaged(Sabotage::CheckThenAct) {
            MutexGuard::unlocked(map, std::thread::yield_now);
        }
        let lease = opts.lease.unwrap_or(s.cfg.lease);
        let slot = Slot {
            token,
            fingerprint,
            attempt,
            state: SlotState::InFlight {
                deadline_ns: now.saturating_add(duration_ns(lease)),
                checkpoint,
            },
        };
        let (ack, ack_rx) = self.ack_for_mode();
        if s.tx.is_some() {
            let deadline_wall = s.time.wall_ms().saturating_add(duration_ms(lease));
            let op = Op::Put {
                token,
                old: old_token,
                record: inflight_record(key, &slot, deadline_wall),
                publish: None,
                ack,
            };
            if let Err(refused) = self.send(op, true) {
                undo(c);
                return Err(match refused {
                    SendRefused::Full => {
                        bump(&c.overloaded);
                        ClaimError::Overloaded(Limit::WriterQueue)
                    }
                    SendRefused::Closed => ClaimError::Closed,
                });
            }
        }
        let checkpoint = match &slot.state {
            SlotState::InFlight { checkpoint, .. } => checkpoint.as_deref().cloned(),
            SlotState::Completed { .. } => None,
        };
        if expired_slot {
            c.completed.fetch_sub(1, Ordering::Relaxed);
        }
        match map.get_mut(key) {
            Some(existing) => *existing = slot,
            None => {
                map.insert(Box::from(key), slot);
            }
        }
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

    /// Turns a decision into the caller's answer, waiting for durability under `Immediate`.
    fn finish(&self, key: &[u8], step: Step) -> Result<Claim, ClaimError> {
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
                Ok(Claim::Acquired(Lease {
                    engine: self.clone(),
                    key: Box::from(key),
                    token,
                    attempt,
                    checkpoint,
                    settled: false,
                }))
            }
            Step::Busy(busy) => Ok(Claim::InProgress(busy)),
            Step::Replay(stored) => Ok(Claim::Completed(stored)),
            Step::NeedTokens => unreachable!("token shortage is handled by the caller"),
        }
    }

    /// Makes the writer raise the durable token mark, then lets the caller retry.
    fn reserve_tokens(&self) -> Result<(), ClaimError> {
        self.flush().map_err(|e| match e {
            FlushError::Poisoned(why) => ClaimError::Poisoned(why),
            FlushError::Closed => ClaimError::Closed,
        })
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
                let (mut map, _) = self.shared().index.lock(key);
                self.claim_step(&mut map, key, opts)?
            };
            match step {
                Step::NeedTokens => self.reserve_tokens()?,
                step => return self.finish(key, step),
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
                let (mut map, changed) = s.index.lock(key);
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
                    let step = self.claim_step(&mut map, key, opts)?;
                    let Step::Busy(busy) = &step else { break step };
                    let now = s.time.mono_ns();
                    if now >= deadline {
                        break step;
                    }
                    let slice = busy
                        .retry_after
                        .min(Duration::from_nanos(deadline - now))
                        .clamp(WAIT_SLICE_MIN, WAIT_SLICE_MAX);
                    bump(&s.counters.waits);
                    waited = true;
                    changed.wait_for(&mut map, slice);
                }
            };
            match step {
                Step::NeedTokens => self.reserve_tokens()?,
                step => return self.finish(key, step),
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
                        let response = lease.complete_arc(Arc::from(bytes))?;
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

    /// Completes `key` for `token` with `response` (see [`Lease::complete`]). A repeat with
    /// the same token succeeds without change; any other token gets `LeaseLost`.
    pub fn complete(&self, key: &[u8], token: u64, response: &[u8]) -> Result<(), LeaseError> {
        self.complete_shared(key, token, Arc::from(response))
            .map(drop)
    }

    pub(crate) fn complete_shared(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
    ) -> Result<Arc<[u8]>, LeaseError> {
        self.check_lease_call(key)?;
        let s = self.shared();
        let c = &s.counters;
        let max = s.cfg.response_len_max;
        if response.len() > max {
            return Err(LeaseError::ResponseTooLarge {
                len: response.len(),
                max,
            });
        }
        let (mut map, changed) = s.index.lock(key);
        let now = s.time.mono_ns();
        let Some(slot) = map
            .get_mut(key)
            // Test-only sabotage skips the token comparison, to show that the checkers
            // catch a missing fence.
            .filter(|slot| {
                (slot.token == token || self.sabotaged(Sabotage::NoFencing))
                    && !slot.is_expired(now)
            })
        else {
            bump(&c.leases_lost);
            return Err(LeaseError::LeaseLost);
        };
        if let SlotState::Completed {
            response: stored,
            published,
            ..
        } = &slot.state
        {
            let stored = stored.clone();
            let published = *published;
            drop(map);
            if !published {
                // The first completion is queued; it is settled once everything queued is.
                self.flush().map_err(|e| match e {
                    FlushError::Poisoned(why) => LeaseError::OutcomeUnknown(why),
                    FlushError::Closed => LeaseError::Closed,
                })?;
            }
            return Ok(stored);
        }
        let wall = s.time.wall_ms();
        let expires_wall_ms = wall.saturating_add(duration_ms(s.cfg.retention));
        let published = s.tx.is_none();
        let (ack, ack_rx) = self.ack_for_mode();
        if s.tx.is_some() {
            let op = Op::Put {
                token,
                old: None,
                record: Record {
                    key: Blob(Arc::from(key)),
                    fingerprint: slot.fingerprint,
                    state: RecordState::Completed {
                        response: Blob(response.clone()),
                        attempt: slot.attempt,
                        completed_wall_ms: wall,
                        expires_wall_ms,
                    },
                },
                publish: Some(Box::from(key)),
                ack,
            };
            self.send(op, false).map_err(|refused| match refused {
                SendRefused::Full => {
                    bump(&c.overloaded);
                    LeaseError::Overloaded(Limit::WriterQueue)
                }
                SendRefused::Closed => LeaseError::Closed,
            })?;
        }
        slot.state = SlotState::Completed {
            response: response.clone(),
            expires_ns: now.saturating_add(duration_ns(s.cfg.retention)),
            expires_wall_ms,
            published,
        };
        c.inflight.fetch_sub(1, Ordering::AcqRel);
        c.completed.fetch_add(1, Ordering::Relaxed);
        bump(&c.completions);
        drop(map);
        if published {
            changed.notify_all();
        }
        if let Some(rx) = ack_rx {
            wait_ack(s, &rx).map_err(LeaseError::OutcomeUnknown)?;
        }
        Ok(response)
    }

    /// Releases `key` if `token` still owns it as InFlight; returns whether it did. A
    /// released key is Absent: the next claim (or a waiting caller) acquires it.
    pub fn release(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        self.check_lease_call(key)?;
        let (released, ack) = self.release_locked(key, token, true)?;
        if let Some(rx) = ack {
            wait_ack(self.shared(), &rx).map_err(LeaseError::OutcomeUnknown)?;
        }
        Ok(released)
    }

    /// Release from `Drop`: never waits, never fails loudly. If the queue is full the lease
    /// stays and expires on its own, which is equally safe.
    pub(crate) fn release_on_drop(&self, key: &[u8], token: u64) {
        if self.check_open().is_ok() {
            let _ = self.release_locked(key, token, false);
        }
    }

    #[allow(clippy::type_complexity)]
    fn release_locked(
        &self,
        key: &[u8],
        token: u64,
        want_ack: bool,
    ) -> Result<(bool, Option<Receiver<Result<(), Arc<str>>>>), LeaseError> {
        let s = self.shared();
        let (mut map, changed) = s.index.lock(key);
        match map.get(key) {
            Some(slot) if slot.token == token && slot.is_inflight() => {}
            _ => return Ok((false, None)),
        }
        let (ack, ack_rx) = if want_ack {
            self.ack_for_mode()
        } else {
            (None, None)
        };
        self.send(Op::Delete { token, ack }, false)
            .map_err(|refused| match refused {
                SendRefused::Full => {
                    bump(&s.counters.overloaded);
                    LeaseError::Overloaded(Limit::WriterQueue)
                }
                SendRefused::Closed => LeaseError::Closed,
            })?;
        map.remove(key);
        s.counters.inflight.fetch_sub(1, Ordering::AcqRel);
        bump(&s.counters.releases);
        drop(map);
        changed.notify_all();
        Ok((true, ack_rx))
    }

    /// Applies `change` to the InFlight slot owned by `token` and persists it.
    fn update_inflight(
        &self,
        key: &[u8],
        token: u64,
        change: impl FnOnce(&mut Slot, u64),
    ) -> Result<(), LeaseError> {
        self.check_lease_call(key)?;
        let s = self.shared();
        let (mut map, _) = s.index.lock(key);
        let now = s.time.mono_ns();
        let Some(slot) = map
            .get_mut(key)
            .filter(|slot| slot.token == token && slot.is_inflight())
        else {
            bump(&s.counters.leases_lost);
            return Err(LeaseError::LeaseLost);
        };
        let mut next = slot.clone();
        change(&mut next, now);
        let (ack, ack_rx) = self.ack_for_mode();
        if s.tx.is_some() {
            let SlotState::InFlight { deadline_ns, .. } = next.state else {
                unreachable!("update_inflight keeps the slot InFlight");
            };
            let left_ms = deadline_ns.saturating_sub(now) / 1_000_000;
            let deadline_wall = s.time.wall_ms().saturating_add(left_ms);
            let op = Op::Put {
                token,
                old: None,
                record: inflight_record(key, &next, deadline_wall),
                publish: None,
                ack,
            };
            self.send(op, false).map_err(|refused| match refused {
                SendRefused::Full => {
                    bump(&s.counters.overloaded);
                    LeaseError::Overloaded(Limit::WriterQueue)
                }
                SendRefused::Closed => LeaseError::Closed,
            })?;
        }
        *slot = next;
        drop(map);
        if let Some(rx) = ack_rx {
            wait_ack(s, &rx).map_err(LeaseError::OutcomeUnknown)?;
        }
        Ok(())
    }

    /// Sets the lease of `token` on `key` to end `lease` from now.
    pub fn extend(&self, key: &[u8], token: u64, lease: Duration) -> Result<(), LeaseError> {
        self.update_inflight(key, token, |slot, now| {
            if let SlotState::InFlight { deadline_ns, .. } = &mut slot.state {
                *deadline_ns = now.saturating_add(duration_ns(lease));
            }
        })
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
        self.update_inflight(key, token, |slot, _| {
            if let SlotState::InFlight { checkpoint, .. } = &mut slot.state {
                *checkpoint = Some(Box::new(Checkpoint::new(phase, data)));
            }
        })
    }

    /// The key's visible state, or `None` if it is Absent (never claimed, released, or past
    /// its retention).
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyState>, ClaimError> {
        self.check_key(key)?;
        self.check_open()?;
        let s = self.shared();
        let (map, _) = s.index.lock(key);
        let now = s.time.mono_ns();
        let Some(slot) = map.get(key).filter(|slot| !slot.is_expired(now)) else {
            return Ok(None);
        };
        Ok(Some(match &slot.state {
            SlotState::InFlight {
                deadline_ns,
                checkpoint,
            } => KeyState::InFlight {
                token: slot.token,
                attempt: slot.attempt,
                lease_remaining: Duration::from_nanos(deadline_ns.saturating_sub(now)),
                checkpoint: checkpoint.as_deref().cloned(),
            },
            SlotState::Completed {
                published: false, ..
            } => KeyState::Completing { token: slot.token },
            SlotState::Completed {
                response,
                expires_wall_ms,
                ..
            } => KeyState::Completed {
                token: slot.token,
                attempt: slot.attempt,
                response: response.clone(),
                expires_at: Duration::from_millis(*expires_wall_ms),
            },
        }))
    }

    /// A snapshot of the engine's counters.
    pub fn stats(&self) -> Stats {
        let s = self.shared();
        let c = &s.counters;
        Stats {
            inflight: read(&c.inflight),
            completed: read(&c.completed),
            claims: read(&c.claims),
            acquired: read(&c.acquired),
            takeovers: read(&c.takeovers),
            replays: read(&c.replays),
            in_progress: read(&c.in_progress),
            fingerprint_mismatches: read(&c.fingerprint_mismatches),
            completions: read(&c.completions),
            releases: read(&c.releases),
            leases_lost: read(&c.leases_lost),
            waits: read(&c.waits),
            overloaded: read(&c.overloaded),
            commits: read(&c.commits),
            committed_ops: read(&c.committed_ops),
            batch_max: read(&c.batch_max),
            queue_depth: s.tx.as_ref().map_or(0, |tx| tx.len() as u64),
            token_next: s.tokens.next(),
            poisoned: s.poison_reason().is_some(),
        }
    }

    /// Waits until every call acknowledged so far is durable (a no-op without a file).
    pub fn flush(&self) -> Result<(), FlushError> {
        let s = self.shared();
        if let Some(why) = s.poison_reason() {
            return Err(FlushError::Poisoned(why));
        }
        if s.is_closed() {
            return Err(FlushError::Closed);
        }
        let Some(tx) = &s.tx else { return Ok(()) };
        let (ack, rx) = ack_pair();
        tx.send(Op::Barrier { ack })
            .map_err(|_| FlushError::Closed)?;
        wait_ack(s, &rx).map_err(|why| match s.poison_reason() {
            Some(_) => FlushError::Poisoned(why),
            None => FlushError::Closed,
        })
    }

    /// Makes everything acknowledged durable, stops the writer and refuses further calls.
    /// Idempotent; also done when the last handle is dropped.
    pub fn close(&self) -> Result<(), FlushError> {
        close_shared(&self.inner.shared, &self.inner.writer)
    }
}
