//! Durability progress: the one signal the writer publishes per commit, and the only way a
//! caller (a blocked thread or a future) learns that its write is durable.
//!
//! Every operation queued for the writer takes a sequence number. After each commit the
//! writer publishes a watermark: every operation numbered at or below it is durable. A
//! caller waits for the watermark to pass its own number, so one store and one wake per
//! commit serve every caller of the batch — there is no channel per operation.
//!
//! Numbers are handed out before the operation enters the queue, so two callers can enqueue
//! out of order; the writer tracks the numbers it committed above the watermark and moves
//! the watermark only over a contiguous run. A number whose operation never entered the
//! queue (the queue refused it) is voided and counts as done.
//!
//! Architecture invariant: the watermark only moves after the commit that made its
//! operations durable returned, and never past an operation that was not committed.
//! Architecture invariant: waiters check the watermark, poison and writer stop under the
//! waiter lock, and the writer (or `poison`, or `close`) changes them before taking that
//! lock to wake: no wake-up is lost.
//! Architecture invariant: a thread waiting for durability sleeps on one of two condition
//! variables, each with the smallest number any of its sleepers waits for; a new
//! watermark notifies exactly those whose smallest number it reached. Which of the two a
//! sleeper picks only decides who else it wakes with, never whether it wakes: a sleeper
//! whose number is above the batch the writer announced sleeps on the other one, so the
//! batch's commit wakes only the callers it made durable (the others would wake for
//! nothing, look, and sleep again: one context switch each per commit).

use crate::base::sync::{AtomicU64, Condvar, Mutex, Ordering};
use crate::index::publication::Marks;
use crate::runtime::constants::ACK_POLL;
use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How a wait for durability ended badly; the caller maps it to its own error.
pub(crate) type Failed = Arc<str>;

/// What a waiter needs to know about the engine besides the watermark: why it stopped.
pub(crate) trait Stopped {
    /// Why nothing more will become durable, if that is so: the poison reason, or that the
    /// writer stopped (closed) with this number not committed.
    fn stopped(&self) -> Option<Failed>;
}

/// A future's registration: wake `waker` once the watermark reaches `seq`.
struct Pending {
    seq: u64,
    waker: Waker,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.seq.cmp(&other.seq)
    }
}

struct Waiters {
    /// Futures by the number they wait for, smallest first.
    wakers: BinaryHeap<Reverse<Pending>>,
    /// Threads asleep on each of `Progress::durable_changed` (they may have timed out).
    sleepers: [usize; 2],
    /// The smallest number a thread asleep on each durability condition variable waits
    /// for since it was last notified (`u64::MAX`: none).
    lowest: [u64; 2],
    /// Publications so far: threads that expect the next one to reach their number sleep
    /// on `durable_changed[published % 2]`, the others on the other one.
    published: u64,
    /// Threads asleep on `Progress::applied_changed`.
    applied_sleepers: usize,
}

impl Default for Waiters {
    fn default() -> Self {
        Self {
            wakers: BinaryHeap::new(),
            sleepers: [0; 2],
            lowest: [u64::MAX; 2],
            published: 0,
            applied_sleepers: 0,
        }
    }
}

impl Waiters {
    /// The durability condition variable a thread waiting for `seq` sleeps on: the next
    /// publication's, unless the batch in flight (its highest number `in_flight`, 0: none
    /// announced) does not hold `seq`.
    fn slot_for(&self, seq: u64, in_flight: u64) -> usize {
        let next = usize::from(self.published % 2 == 1);
        if in_flight > 0 && seq > in_flight {
            1 - next
        } else {
            next
        }
    }
}

/// The watermark a blocked caller waits for.
#[derive(Clone, Copy)]
enum Mark {
    /// Operations durable (in the log, or in the file without one).
    Durable,
    /// Operations in the file.
    Applied,
}

pub(crate) struct Progress {
    /// The next number to hand out; the first operation gets 1.
    next: AtomicU64,
    /// The watermarks: every operation numbered at or below `durable` is durable. Shared
    /// with the index, which publishes completions by them.
    marks: crate::base::sync::Arc<Marks>,
    /// Numbers handed out whose operation never entered the queue.
    voided: Mutex<Vec<u64>>,
    waiters: Mutex<Waiters>,
    /// The highest number in the batch the writer is committing, once it said so
    /// ([`Progress::announce`]); 0 between its publication and the next announcement. Not
    /// under the waiter lock: the writer does not wait for callers to announce a batch.
    in_flight: AtomicU64,
    /// Threads waiting for durability, in two groups (see [`Waiters::slot_for`]).
    durable_changed: [Condvar; 2],
    /// Threads waiting for the file ([`Progress::wait_applied`]).
    applied_changed: Condvar,
    /// Threads a publication woke (or handed to the waiter lock to wake), for the tests.
    #[cfg(test)]
    woken: std::sync::atomic::AtomicUsize,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            next: AtomicU64::new(1),
            marks: crate::base::sync::Arc::new(Marks::new()),
            voided: Mutex::new(Vec::new()),
            waiters: Mutex::new(Waiters::default()),
            in_flight: AtomicU64::new(0),
            durable_changed: [Condvar::new(), Condvar::new()],
            applied_changed: Condvar::new(),
            #[cfg(test)]
            woken: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// A number for an operation about to be queued.
    pub(crate) fn issue(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The last number handed out (0: none yet).
    pub(crate) fn issued(&self) -> u64 {
        self.next.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// `seq` will never reach the writer (the queue refused its operation).
    pub(crate) fn void(&self, seq: u64) {
        self.voided.lock().push(seq);
    }

    /// The numbers voided since the last call (the writer's).
    pub(crate) fn take_voided(&self, into: &mut Vec<u64>) {
        into.append(&mut self.voided.lock());
    }

    pub(crate) fn durable(&self) -> u64 {
        self.marks.durable()
    }

    /// The watermarks, for the index.
    pub(crate) fn marks(&self) -> crate::base::sync::Arc<Marks> {
        self.marks.clone()
    }

    /// Every operation numbered at or below `watermark` is in the file (the writer's or the
    /// applier's, after the apply; with the commit log this may come after
    /// [`Progress::publish`]).
    pub(crate) fn applied(&self, watermark: u64) {
        self.marks.raise_applied(watermark);
        // Wakes the threads waiting for the file ([`Progress::wait_applied`]) only: the
        // durable watermark did not move.
        let w = self.waiters.lock();
        if w.applied_sleepers > 0 {
            self.applied_changed.notify_all();
        }
    }

    /// Blocks until every operation numbered at or below `seq` is in the file, or fails
    /// when nothing more will be. With the commit log the file follows the log by up to
    /// the applier's interval.
    pub(crate) fn wait_applied(&self, seq: u64, engine: &impl Stopped) -> Result<(), Failed> {
        self.block_until(Mark::Applied, seq, engine)
    }

    /// The writer is committing a batch whose highest number is `highest`: threads waiting
    /// for a number above it sleep apart from the batch's, so its publication does not
    /// wake them. Only a hint: a publication wakes every sleeper it satisfies.
    pub(crate) fn announce(&self, highest: u64) {
        self.in_flight.store(highest, Ordering::Relaxed);
    }

    /// Publishes a new watermark and wakes whoever it satisfies: the sleeping threads of
    /// each condition variable whose smallest number it reached (one notification each),
    /// and the futures registered at or below it.
    pub(crate) fn publish(&self, watermark: u64) {
        let before = self.marks.raise_durable(watermark);
        let mut due = Vec::new();
        {
            let mut w = self.waiters.lock();
            // The batch in flight ended either way: sleepers go back to expecting the next.
            w.published += 1;
            self.in_flight.store(0, Ordering::Relaxed);
            if watermark <= before {
                return;
            }
            for (i, changed) in self.durable_changed.iter().enumerate() {
                if w.lowest[i] <= watermark {
                    w.lowest[i] = u64::MAX;
                    if w.sleepers[i] > 0 {
                        let _woken = changed.notify_all();
                        #[cfg(test)]
                        self.woken
                            .fetch_add(_woken, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }
            while w.wakers.peek().is_some_and(|p| p.0.seq <= watermark) {
                if let Some(Reverse(p)) = w.wakers.pop() {
                    due.push(p.waker);
                }
            }
        }
        due.into_iter().for_each(Waker::wake);
    }

    /// Wakes every waiter to look again: the engine was poisoned or its writer stopped.
    pub(crate) fn wake_all(&self) {
        let due: Vec<Waker> = {
            let mut w = self.waiters.lock();
            self.durable_changed.iter().for_each(|c| {
                c.notify_all();
            });
            self.applied_changed.notify_all();
            w.wakers.drain().map(|Reverse(p)| p.waker).collect()
        };
        due.into_iter().for_each(Waker::wake);
    }

    /// The watermark `mark` now.
    fn at(&self, mark: Mark) -> u64 {
        match mark {
            Mark::Durable => self.durable(),
            Mark::Applied => self.marks.applied_now(),
        }
    }

    fn ready(&self, seq: u64, engine: &impl Stopped) -> Option<Result<(), Failed>> {
        self.reached(Mark::Durable, seq, engine)
    }

    /// Whether `mark` has reached `seq` (`Ok`), or nothing more will move it (`Err`).
    fn reached(&self, mark: Mark, seq: u64, engine: &impl Stopped) -> Option<Result<(), Failed>> {
        if self.at(mark) >= seq {
            return Some(Ok(()));
        }
        engine.stopped().map(|why| {
            // The last commit may have covered `seq` just before the writer stopped.
            if self.at(mark) >= seq {
                Ok(())
            } else {
                Err(why)
            }
        })
    }

    /// Blocks until operation `seq` is durable, or fails when nothing more will be.
    pub(crate) fn wait(&self, seq: u64, engine: &impl Stopped) -> Result<(), Failed> {
        self.block_until(Mark::Durable, seq, engine)
    }

    fn block_until(&self, mark: Mark, seq: u64, engine: &impl Stopped) -> Result<(), Failed> {
        loop {
            if let Some(done) = self.reached(mark, seq, engine) {
                return done;
            }
            // Every change a waiter waits for notifies; the timeout is only a backstop.
            self.sleep_on(mark, seq, engine, ACK_POLL);
        }
    }

    /// Sleeps until operation `seq` is durable, the engine stops, or `timeout` passes; the
    /// caller looks at what it waits for again either way.
    pub(crate) fn sleep(&self, seq: u64, engine: &impl Stopped, timeout: Duration) {
        self.sleep_on(Mark::Durable, seq, engine, timeout);
    }

    /// Sleeps until `mark` reaches `seq`, the engine stops, or `timeout` passes. Both marks
    /// are raised before the waiter lock is taken to wake sleepers (`publish`, `applied`),
    /// so the check under the lock loses no wake-up.
    fn sleep_on(&self, mark: Mark, seq: u64, engine: &impl Stopped, timeout: Duration) {
        if self.reached(mark, seq, engine).is_some() {
            return;
        }
        let mut w = self.waiters.lock();
        if self.reached(mark, seq, engine).is_some() {
            return;
        }
        match mark {
            Mark::Durable => {
                let i = w.slot_for(seq, self.in_flight.load(Ordering::Relaxed));
                w.sleepers[i] += 1;
                w.lowest[i] = w.lowest[i].min(seq);
                self.durable_changed[i].wait_for(&mut w, timeout);
                w.sleepers[i] -= 1;
            }
            Mark::Applied => {
                w.applied_sleepers += 1;
                self.applied_changed.wait_for(&mut w, timeout);
                w.applied_sleepers -= 1;
            }
        }
    }

    /// The async form of [`Progress::wait`]: registers `cx`'s waker until `seq` is durable.
    pub(crate) fn poll(
        &self,
        seq: u64,
        engine: &impl Stopped,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Failed>> {
        if let Some(done) = self.ready(seq, engine) {
            return Poll::Ready(done);
        }
        let mut w = self.waiters.lock();
        if let Some(done) = self.ready(seq, engine) {
            return Poll::Ready(done);
        }
        // A future polled again registers again; the older entry only causes one spurious
        // wake, and every entry leaves the heap when `seq` becomes durable or the engine
        // stops, so a dropped future leaves nothing behind for long.
        w.wakers.push(Reverse(Pending {
            seq,
            waker: cx.waker().clone(),
        }));
        Poll::Pending
    }
}

/// The writer's view: which numbers it committed, and the contiguous watermark below them.
#[derive(Default)]
pub(crate) struct Tracker {
    watermark: u64,
    /// Numbers done above the watermark (not contiguous with it yet).
    ahead: BinaryHeap<Reverse<u64>>,
}

impl Tracker {
    /// Counts `seq` as done (committed, or voided).
    pub(crate) fn done(&mut self, seq: u64) {
        debug_assert!(seq > self.watermark, "a sequence number is done twice");
        self.ahead.push(Reverse(seq));
        while self
            .ahead
            .peek()
            .is_some_and(|Reverse(s)| *s == self.watermark + 1)
        {
            self.ahead.pop();
            self.watermark += 1;
        }
    }

    pub(crate) fn watermark(&self) -> u64 {
        self.watermark
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Running(Option<Failed>);
    impl Stopped for Running {
        fn stopped(&self) -> Option<Failed> {
            self.0.clone()
        }
    }

    #[test]
    fn the_watermark_moves_only_over_a_contiguous_run() {
        let mut t = Tracker::default();
        t.done(2);
        t.done(3);
        assert_eq!(t.watermark(), 0, "1 is not done yet");
        t.done(1);
        assert_eq!(t.watermark(), 3);
        t.done(5);
        assert_eq!(t.watermark(), 3);
        t.done(4);
        assert_eq!(t.watermark(), 5);
    }

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_future_is_woken_once_its_number_is_durable_and_not_before() {
        let p = Progress::new();
        let running = Running(None);
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let (a, b) = (p.issue(), p.issue());
        assert!(p.poll(b, &running, &mut cx).is_pending());
        p.publish(a);
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(p.poll(b, &running, &mut cx).is_pending());
        p.publish(b);
        assert!(count.0.load(std::sync::atomic::Ordering::SeqCst) >= 1);
        assert!(matches!(p.poll(b, &running, &mut cx), Poll::Ready(Ok(()))));
    }

    #[test]
    fn a_stopped_engine_fails_what_is_not_durable_and_keeps_what_is() {
        let p = Progress::new();
        let (a, b) = (p.issue(), p.issue());
        p.publish(a);
        let stopped = Running(Some(Arc::from("disk full")));
        assert!(p.wait(a, &stopped).is_ok());
        assert_eq!(p.wait(b, &stopped).err().as_deref(), Some("disk full"));
    }

    /// Spawns a thread waiting for `seq`, and returns once it sleeps on the progress.
    fn sleeping_waiter(p: &Arc<Progress>, seq: u64) -> std::thread::JoinHandle<Result<(), Failed>> {
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || p.wait(seq, &Running(None)))
        };
        while p.waiters.lock().sleepers.iter().sum::<usize>() == 0 {
            std::thread::yield_now();
        }
        waiter
    }

    /// Two numbers issued, the writer committing the first alone, and a thread asleep
    /// waiting for the second.
    type Announced = (
        Arc<Progress>,
        u64,
        u64,
        std::thread::JoinHandle<Result<(), Failed>>,
    );

    fn first_announced_second_waiting() -> Announced {
        let p = Arc::new(Progress::new());
        let (a, b) = (p.issue(), p.issue());
        p.announce(a);
        let waiter = sleeping_waiter(&p, b);
        (p, a, b, waiter)
    }

    fn woken(p: &Progress) -> usize {
        p.woken.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn a_waiter_for_a_later_number_is_not_woken_by_an_earlier_commit() {
        // `b` waits for the batch after the one holding `a`.
        let (p, a, b, waiter) = first_announced_second_waiting();
        p.publish(a);
        assert_eq!(
            woken(&p),
            0,
            "the commit of `a` made nothing `b` waits for durable"
        );
        p.publish(b);
        assert_eq!(woken(&p), 1);
        assert!(waiter.join().unwrap().is_ok());
    }

    #[test]
    fn a_waiter_is_woken_by_the_commit_that_reaches_it_whatever_was_announced() {
        // `b` sleeps apart from the batch holding `a`, whose commit then publishes up to
        // `b` (committed earlier above a gap that `a` fills, or voided).
        let (p, _, b, waiter) = first_announced_second_waiting();
        p.publish(b);
        assert_eq!(woken(&p), 1);
        assert!(waiter.join().unwrap().is_ok());
    }

    #[test]
    fn applying_wakes_no_thread_waiting_for_durability() {
        let p = Arc::new(Progress::new());
        let (a, b) = (p.issue(), p.issue());
        p.publish(a);
        let waiter = sleeping_waiter(&p, b);
        p.applied(a);
        assert_eq!(woken(&p), 0);
        p.publish(b);
        assert_eq!(woken(&p), 1);
        assert!(waiter.join().unwrap().is_ok());
    }

    #[test]
    fn a_blocked_thread_wakes_on_publish() {
        let p = Arc::new(Progress::new());
        let seq = p.issue();
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || p.wait(seq, &Running(None)))
        };
        p.publish(seq);
        assert!(waiter.join().unwrap().is_ok());
    }
}
