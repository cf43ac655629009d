//! The state every engine handle, the writer thread and the sweeper thread share: the
//! index, the queue to the writer, the durability watermark, the timers, and the flags that
//! say the engine is poisoned or closed.

use crate::base::clock::Time;
use crate::base::sync::channel::{Sender, TrySendError};
use crate::base::sync::{Arc, AtomicBool, AtomicU64, Condvar, Mutex, Ordering, RwLock};
use crate::index::stats::{Counters, Events};
use crate::index::stripes::Index;
use crate::model::error::FlushError;
use crate::model::machine::{Deltas, Now, Rules, Write};
use crate::model::settings::Durability;
use crate::model::token::Tokens;
use crate::model::write_set::WriteSet;
use crate::runtime::constants::{WAIT_SLICE_MAX, WAIT_SLICE_MIN};
use crate::runtime::progress::{Failed, Progress, Stopped};
use crate::runtime::queue::{Op, Queued, SendRefused};
use crate::runtime::sweeper::Sweeper;
use crate::store::storage::Closing;
use std::time::Duration;

/// Settings fixed at open, in the units the hot path uses.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) durability: Durability,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    /// The second tier of retention (`None`: no markers).
    pub(crate) marker_retention: Option<Duration>,
    pub(crate) key_len_max: usize,
    pub(crate) response_len_max: usize,
    pub(crate) checkpoint_len_max: usize,
    pub(crate) inflight_max: u64,
    pub(crate) keys_max: u64,
    /// Queue length above which new claims are refused (the rest is headroom for holders).
    pub(crate) claim_queue_max: usize,
}

/// State shared by every engine handle, the writer thread and the sweeper thread.
pub(crate) struct Shared {
    index: Index,
    time: Time,
    cfg: Config,
    tokens: Tokens,
    counters: Counters,
    observe: crate::runtime::observe::Observer,
    tx: Option<Sender<Queued>>,
    /// The writer's durability watermark; every durability wait waits on it.
    progress: Progress,
    /// Deadline wake-ups for futures, and the thread that runs keep-alive renewals.
    timers: crate::runtime::timer::Timers,
    keep_alive: crate::runtime::keep_alive::KeepAlives,
    /// Which claims the writer queue admits (by the writer's measured rate under
    /// `Buffered`).
    admission: crate::runtime::admission::Admission,
    /// The application tables and the outbox: the overlay of accepted writes not yet
    /// committed (all of them in a memory-only engine), outbox ids.
    tables: crate::runtime::tables::Tables,
    /// The file, for replay reads. Emptied by `close`, so the file is released with it.
    store: RwLock<Option<Arc<Closing>>>,
    poisoned: AtomicBool,
    poison_why: Mutex<Option<Arc<str>>>,
    closed: AtomicBool,
    writer_stopped: AtomicBool,
    sweeper: Sweeper,
    /// Holders waiting for room in a full writer queue sleep here. Notified when the writer
    /// takes a batch off the queue, and on poison, close and clock jumps. Never taken while a
    /// stripe lock is held.
    room: Mutex<()>,
    room_changed: Condvar,
    /// The fault points' switches and gates (test builds only).
    #[cfg(idemkv_sabotage)]
    faults: crate::base::sabotage::Faults,
}

/// What an opening engine built for its shared state.
pub(crate) struct Parts {
    pub(crate) index: Index,
    pub(crate) time: Time,
    pub(crate) cfg: Config,
    pub(crate) tokens: Tokens,
    pub(crate) counters: Counters,
    pub(crate) observe: crate::runtime::observe::Observer,
    pub(crate) tx: Option<Sender<Queued>>,
    pub(crate) progress: Progress,
    pub(crate) admission: crate::runtime::admission::Admission,
    pub(crate) tables: crate::runtime::tables::Tables,
    pub(crate) store: Option<Arc<Closing>>,
    pub(crate) sweeper: Sweeper,
    /// The sabotage armed on the builder (a `Sabotage` as u8; 0 is none).
    #[cfg(idemkv_sabotage)]
    pub(crate) sabotage: u8,
}

impl Shared {
    /// The shared state of an engine that opens now: running, not poisoned.
    pub(crate) fn new(p: Parts) -> Self {
        Shared {
            index: p.index,
            time: p.time,
            cfg: p.cfg,
            tokens: p.tokens,
            counters: p.counters,
            observe: p.observe,
            tx: p.tx,
            progress: p.progress,
            timers: Default::default(),
            keep_alive: Default::default(),
            admission: p.admission,
            tables: p.tables,
            store: RwLock::new(p.store),
            poisoned: AtomicBool::new(false),
            poison_why: Mutex::new(None),
            closed: AtomicBool::new(false),
            writer_stopped: AtomicBool::new(false),
            sweeper: p.sweeper,
            room: Mutex::new(()),
            room_changed: Condvar::new(),
            #[cfg(idemkv_sabotage)]
            faults: crate::base::sabotage::Faults::new(p.sabotage),
        }
    }
}

impl Shared {
    /// How many operations wait in the writer queue now.
    pub(crate) fn queued(&self) -> usize {
        self.tx.as_ref().map_or(0, |tx| tx.len())
    }

    /// Marks the engine closed: true for the one call that closed it.
    pub(crate) fn close_once(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    /// Lets the file go: no replay reads it after close. After a clean close (nothing
    /// poisoned the engine, so its last commit holds everything acknowledged) the file is
    /// compacted when enough of it is unused (`Closing::close`); a replay still in flight
    /// holds the store, and then closes the file as it is.
    pub(crate) fn release_store(&self) {
        let Some(store) = self.store.write().take() else {
            return;
        };
        if self.poison_reason().is_some() {
            return;
        }
        if let Ok(store) = Arc::try_unwrap(store) {
            crate::runtime::observe::closed_file(&store.close());
        }
    }

    /// The fault points' switches and gates (`base::sabotage`; test builds only).
    #[cfg(idemkv_sabotage)]
    #[inline]
    pub(crate) fn faults(&self) -> &crate::base::sabotage::Faults {
        &self.faults
    }

    /// The index: every key's slot, under its stripe's lock.
    #[inline]
    pub(crate) fn index(&self) -> &Index {
        &self.index
    }

    /// The settings fixed at open.
    #[inline]
    pub(crate) fn cfg(&self) -> &Config {
        &self.cfg
    }

    /// The engine-wide counters (`Stats`, metrics, admission's gauges).
    #[inline]
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The fencing tokens: issued by claims, reserved in the file by the writer.
    #[inline]
    pub(crate) fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// Where spans, events and metrics go.
    #[inline]
    pub(crate) fn observer(&self) -> &crate::runtime::observe::Observer {
        &self.observe
    }

    /// The writer's durability watermark; every durability wait waits on it.
    #[inline]
    pub(crate) fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Which claims the writer queue admits.
    #[inline]
    pub(crate) fn admission(&self) -> &crate::runtime::admission::Admission {
        &self.admission
    }

    /// The application tables' overlay and the outbox.
    #[inline]
    pub(crate) fn tables(&self) -> &crate::runtime::tables::Tables {
        &self.tables
    }

    /// The sweeper thread's wake-ups.
    #[inline]
    pub(crate) fn sweeper(&self) -> &Sweeper {
        &self.sweeper
    }

    /// Deadline wake-ups for futures, and the thread that runs keep-alive renewals.
    #[inline]
    pub(crate) fn timers(&self) -> &crate::runtime::timer::Timers {
        &self.timers
    }

    /// The registered keep-alive renewals.
    #[inline]
    pub(crate) fn keep_alives(&self) -> &crate::runtime::keep_alive::KeepAlives {
        &self.keep_alive
    }

    /// The engine's monotonic clock, in nanoseconds.
    #[inline]
    pub(crate) fn mono_ns(&self) -> u64 {
        self.time.mono_ns()
    }

    /// Whether the engine keeps everything in memory (no file, no writer thread).
    #[inline]
    pub(crate) fn in_memory(&self) -> bool {
        self.tx.is_none()
    }

    /// Whether the writer queue is full (never without a file).
    pub(crate) fn queue_full(&self) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.is_full())
    }

    /// Whether the writer queue is at least half its claims' limit: the sweeper then paces
    /// itself (never without a file).
    pub(crate) fn queue_busy(&self) -> bool {
        self.tx
            .as_ref()
            .is_some_and(|tx| tx.len() >= self.cfg.claim_queue_max / 2)
    }

    /// Stops the sweeper and the timer thread (their threads then end): the start of close.
    pub(crate) fn stop_background(&self) {
        self.sweeper.stop();
        self.timers.stop();
    }

    /// Tells the writer to commit what it has and stop (no-op without a file). Sent after
    /// every stripe lock was passed once, so every queued send comes before it.
    pub(crate) fn send_shutdown(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Queued {
                seq: 0,
                op: Op::Shutdown,
                tables: None,
                acked_at: None,
            });
        }
    }

    /// A clock that jumps woke us: every waiter re-checks its deadline (stripe waiters,
    /// watermark waiters, holders waiting for room, the sweeper and the timers).
    pub(crate) fn clock_jumped(&self) {
        self.index.wake_all();
        self.progress.wake_all();
        self.notify_room();
        self.sweeper.nudge();
        self.timers.nudge();
    }
}

impl Shared {
    /// Records the first storage failure; every later call is refused with it.
    pub(crate) fn poison(&self, why: String) -> Arc<str> {
        crate::runtime::observe::poisoned(&why);
        let why = {
            let mut slot = self.poison_why.lock();
            slot.get_or_insert_with(|| Arc::from(why)).clone()
        };
        self.poisoned.store(true, Ordering::Release);
        self.index.wake_all();
        self.notify_room();
        self.progress.wake_all();
        why
    }

    /// Wakes every holder waiting for room in the writer queue. Taking the lock orders the
    /// wake after any waiter's check of the queue.
    pub(crate) fn notify_room(&self) {
        drop(self.room.lock());
        self.room_changed.notify_all();
    }

    /// Waits until the writer queue has room, `deadline_ns` (monotonic) passes, or the engine
    /// stops. Returns false only when the deadline passed first. Called without any stripe
    /// lock; wakes on the writer taking a batch, a clock jump, poison or close.
    pub(crate) fn wait_for_room(&self, deadline_ns: u64) -> bool {
        let Some(tx) = &self.tx else { return true };
        let mut room = self.room.lock();
        loop {
            if self.poison_reason().is_some() || self.is_closed() || !tx.is_full() {
                return true;
            }
            // Read under the room lock: a clock jump after this read notifies us.
            let now = self.time.mono_ns();
            if now >= deadline_ns {
                return false;
            }
            let left = std::time::Duration::from_nanos(deadline_ns - now);
            self.room_changed
                .wait_for(&mut room, left.clamp(WAIT_SLICE_MIN, WAIT_SLICE_MAX));
        }
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
        self.progress.wake_all();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn store(&self) -> Option<Arc<Closing>> {
        self.store.read().clone()
    }

    /// Queues `op` for the writer. Called under the key's stripe lock, which keeps each
    /// key's operations in order; never blocks. `claim` ops must leave the headroom free.
    ///
    /// The poison check here, under the stripe lock at the point of no return, is what keeps
    /// a call that passed `check_open` just before a poison from being acknowledged: every
    /// transition that queues a write is refused once the engine is poisoned.
    ///
    /// Returns the operation's durability sequence number (0 without a file): it is durable
    /// once the writer's watermark reaches it.
    pub(crate) fn send(&self, op: Op, claim: bool) -> Result<u64, SendRefused> {
        self.send_with(op, None, claim)
    }

    /// [`Shared::send`] with table writes riding in the same queued operation.
    pub(crate) fn send_with(
        &self,
        op: Op,
        tables: Option<Box<crate::store::batch::Batch>>,
        claim: bool,
    ) -> Result<u64, SendRefused> {
        let Some(tx) = &self.tx else { return Ok(0) };
        self.admit(tx, claim)?;
        let buffered = matches!(self.cfg.durability, Durability::Buffered { .. });
        let seq = self.progress.issue();
        // Under `Buffered` an operation carries its acknowledgement time for the writer.
        let acked_at = buffered.then(std::time::Instant::now);
        let queued = Queued {
            seq,
            op,
            tables,
            acked_at,
        };
        let refused = match tx.try_send(queued) {
            Ok(()) => return Ok(seq),
            Err(TrySendError::Full(_)) => SendRefused::Full,
            // A writer that died of a panic poisoned the engine before dropping the queue.
            Err(TrySendError::Disconnected(_)) => match self.poison_reason() {
                Some(why) => SendRefused::Poisoned(why),
                None => SendRefused::Closed,
            },
        };
        self.void(tx, seq);
        Err(refused)
    }

    /// What a new claim is admitted against. `Buffered` counts what is acknowledged but not
    /// yet durable (queued, or in the commit in flight): that, not the queue alone, is what
    /// a crash can lose.
    fn backlog(&self, tx: &crate::base::sync::channel::Sender<Queued>) -> usize {
        if !matches!(self.cfg.durability, Durability::Buffered { .. }) {
            return tx.len();
        }
        let pending = self.progress.issued() - self.progress.durable();
        usize::try_from(pending).unwrap_or(usize::MAX)
    }

    /// The checks an operation passes before it is acknowledged: refused once the engine is
    /// poisoned or closed, and a `claim` also when admission refuses it. A claim that
    /// queues nothing ([`Config::defers_new_claims`]) passes them too, so it is
    /// acknowledged exactly when a queued one would be.
    fn admit(
        &self,
        tx: &crate::base::sync::channel::Sender<Queued>,
        claim: bool,
    ) -> Result<(), SendRefused> {
        if let Some(why) = self.poison_reason() {
            return Err(SendRefused::Poisoned(why));
        }
        if self.is_closed() {
            return Err(SendRefused::Closed);
        }
        if claim && !self.admission.admits_claim(self.backlog(tx)) {
            return Err(SendRefused::Full);
        }
        Ok(())
    }

    /// `seq` will never reach the writer: it counts as done at the writer's next commit.
    /// The queue was full when the operation was refused, but the writer may have drained
    /// it and gone idle since, with the watermark held below `seq` and everything after
    /// it committed but not acknowledged or shown. A barrier without a number wakes it to
    /// count the void; if the queue is full again, the writer has work and counts it then.
    fn void(&self, tx: &crate::base::sync::channel::Sender<Queued>, seq: u64) {
        self.progress.void(seq);
        let _ = tx.try_send(Queued::barrier(0));
    }

    /// Blocks until the operation numbered `seq` is durable (0: nothing to wait for).
    pub(crate) fn wait_durable(&self, seq: u64) -> Result<(), Failed> {
        if seq == 0 {
            return Ok(());
        }
        self.progress.wait(seq, self)
    }

    /// Waits until everything queued so far is committed (a no-op without a file).
    pub(crate) fn flush(&self) -> Result<(), FlushError> {
        if let Some(why) = self.poison_reason() {
            return Err(FlushError::Poisoned(why));
        }
        if self.is_closed() {
            return Err(FlushError::Closed);
        }
        let seq = self.send_barrier()?;
        self.wait_durable(seq).map_err(|_| self.flush_stopped())
    }

    /// Queues a barrier if the queue has room: `Ok(None)` when it is full. 0 without a file.
    pub(crate) fn try_send_barrier(&self) -> Result<Option<u64>, FlushError> {
        let Some(tx) = &self.tx else {
            return Ok(Some(0));
        };
        let seq = self.progress.issue();
        let result = match tx.try_send(Queued::barrier(seq)) {
            Ok(()) => return Ok(Some(seq)),
            Err(TrySendError::Full(_)) => Ok(None),
            Err(TrySendError::Disconnected(_)) => Err(self.flush_stopped()),
        };
        self.void(tx, seq);
        result
    }

    /// Queues a barrier (blocking while the queue is full): everything queued before it is
    /// durable once its number is. 0 without a file.
    pub(crate) fn send_barrier(&self) -> Result<u64, FlushError> {
        let Some(tx) = &self.tx else { return Ok(0) };
        let seq = self.progress.issue();
        if tx.send(Queued::barrier(seq)).is_err() {
            self.progress.void(seq);
            return Err(self.flush_stopped());
        }
        Ok(seq)
    }

    pub(crate) fn flush_stopped(&self) -> FlushError {
        match self.poison_reason() {
            Some(why) => FlushError::Poisoned(why),
            None => FlushError::Closed,
        }
    }
}

impl Stopped for Shared {
    fn stopped(&self) -> Option<Failed> {
        if let Some(why) = self.poison_reason() {
            return Some(why);
        }
        // An operation that raced `close` may sit in the queue after the writer left.
        self.writer_stopped()
            .then(|| Arc::from("the engine closed before confirming"))
    }
}

impl Shared {
    /// The instant of a transition, for the state machine: both readings (with the system
    /// clock, the wall one comes with the monotonic one at no extra read).
    pub(crate) fn now(&self) -> Now {
        let (mono_ns, wall_ns) = self.time.now();
        Now::new(mono_ns, wall_ns)
    }

    /// The settings the state machine's transitions depend on.
    pub(crate) fn rules(&self) -> Rules {
        Rules {
            retention: self.cfg.retention,
            response_len_max: self.cfg.response_len_max,
            durable: self.tx.is_some(),
            lease: self.cfg.lease,
        }
    }

    /// Queues a state machine's write (see [`Shared::send`]) and returns its durability
    /// sequence number; nothing to write is queued as nothing (0). A claim with nothing to
    /// write in a durable engine (one left to its lease's first durable act) still passes
    /// [`Shared::send`]'s checks.
    pub(crate) fn queue(&self, write: Option<Write>, claim: bool) -> Result<u64, SendRefused> {
        self.queue_dropping(write, None, claim)
    }

    /// [`Shared::queue`] for a claim that acquires a key over its marker `(hash, token)`:
    /// the marker row is removed in the commit that stores the claim's record.
    pub(crate) fn queue_dropping(
        &self,
        write: Option<Write>,
        drop_marker: Option<(u64, u64)>,
        claim: bool,
    ) -> Result<u64, SendRefused> {
        match (write, &self.tx) {
            (None, Some(tx)) if claim => self.admit(tx, true).map(|()| 0),
            (None, _) => Ok(0),
            (Some(write), _) => self.send(self.op(write, drop_marker), claim),
        }
    }

    /// The queued form of a state machine's write, with the marker row `drop_marker` its
    /// commit removes (a claim that acquires a key over its marker). Encoded here, on the
    /// caller's thread: the writer's one thread only does the B-tree work and the commit.
    pub(crate) fn op(&self, write: Write, drop_marker: Option<(u64, u64)>) -> Op {
        match write {
            Write::Put { token, old, record } => Op::Put {
                token,
                old,
                value: crate::model::codec::encode_queued(token, &record),
                drop_marker,
            },
            Write::Delete { token } => Op::Delete { token },
            Write::Forget {
                token,
                hash,
                check,
                marker_retention_ms,
            } => Op::Forget {
                token,
                hash,
                check,
                marker_retention_ms,
            },
            Write::DropMarker { hash, token } => Op::DropMarker { hash, token },
        }
    }

    /// Applies a state machine's counter deltas: the gauges to the engine-wide counters that
    /// admission reads, the events to `events` (the stripe's own, under its lock).
    pub(crate) fn count(&self, events: &mut Events, d: &Deltas) {
        let c = &self.counters;
        let gauge = |g: &AtomicU64, delta: i64, order: Ordering| {
            if delta > 0 {
                g.fetch_add(delta.unsigned_abs(), order);
            } else if delta < 0 {
                g.fetch_sub(delta.unsigned_abs(), order);
            }
        };
        gauge(&c.gauges.inflight, d.inflight, Ordering::AcqRel);
        gauge(&c.gauges.completed, d.completed, Ordering::Relaxed);
        events.add(d);
        c.metrics.add(d);
    }

    /// Counts one claim call, in its stripe's events (under the stripe lock).
    pub(crate) fn count_claim(&self, events: &mut Events) {
        events.claims += 1;
        self.counters.metrics.claim();
    }
}

/// Queueing with a write set: the tables' overlay accepts it in the same step.
impl Shared {
    /// Queues a holder's record `write` together with `writes` in one operation (see
    /// [`Shared::send`]; called under the key's stripe lock, never blocks). A memory-only
    /// engine applies the writes at once. On a refusal nothing is queued or applied.
    pub(crate) fn queue_with(
        &self,
        write: Option<Write>,
        writes: Option<&WriteSet>,
    ) -> Result<u64, SendRefused> {
        let Some(writes) = writes.filter(|w| !w.is_empty()) else {
            return self.queue(write, false);
        };
        if self.tx.is_none() {
            self.tables.lock().apply(writes);
            return Ok(0);
        }
        // Encoded before the tables lock is taken: only the acceptance is under it.
        let op = write.map_or(Op::TablesOnly, |w| self.op(w, None));
        let mut state = self.tables.lock();
        let batch = state.batch(writes);
        let seq = self.send_with(op, Some(Box::new(batch.clone())), false)?;
        state.accept(&batch);
        Ok(seq)
    }

    /// Queues the removal of the outbox messages `ids` (tables lock held only while
    /// queueing). Returns the operation's durability number, or `None` while the queue is
    /// full. A memory-only engine removes them at once.
    pub(crate) fn try_mark_sent(&self, ids: &[u64]) -> Result<Option<u64>, SendRefused> {
        let mut state = self.tables.lock();
        if self.tx.is_none() {
            state.remove_messages(ids);
            return Ok(Some(0));
        }
        let batch = state.sent_batch(ids);
        match self.send_with(Op::TablesOnly, Some(Box::new(batch.clone())), false) {
            Ok(seq) => {
                state.accept(&batch);
                Ok(Some(seq))
            }
            Err(SendRefused::Full) => Ok(None),
            Err(other) => Err(other),
        }
    }
}

impl crate::runtime::timer::TimerHost for Shared {
    fn timers(&self) -> &crate::runtime::timer::Timers {
        &self.timers
    }

    fn mono_ns(&self) -> u64 {
        Shared::mono_ns(self)
    }

    fn keep_alive(&self) -> &crate::runtime::keep_alive::KeepAlives {
        &self.keep_alive
    }
}
