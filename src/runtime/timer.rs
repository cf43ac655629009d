//! Wake-ups at an instant of the engine's clock, for futures: the one timer behind every
//! async deadline (a wait running out, a lease ending, a keep-alive renewal), so the async
//! API needs no runtime's timer.
//!
//! A background thread, started by the first registration, sleeps until the earliest
//! deadline in real time slices of at most `WAIT_SLICE_MAX` and checks the engine's clock
//! after each, so a mock clock that jumps (its listener nudges the thread) and a real one
//! that passes are both followed.
//!
//! Architecture invariant: the timer thread never takes a stripe lock and never does I/O;
//! it only wakes wakers and runs the keep-alive renewals (`keep_alive.rs`), which queue
//! without waiting.

use crate::base::sync::{Arc, Condvar, Mutex};
use crate::runtime::constants::{WAIT_SLICE_MAX, WAIT_SLICE_MIN};
use crate::runtime::keep_alive::KeepAlives;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Duration;

/// What the timer thread runs on: the engine's shared state (`runtime/shared.rs`), which
/// holds the timers, the clock and the keep-alive renewals.
pub(crate) trait TimerHost: Send + Sync + 'static {
    fn timers(&self) -> &Timers;
    /// The engine clock's monotonic instant, in ns.
    fn mono_ns(&self) -> u64;
    fn keep_alive(&self) -> &KeepAlives;
}

struct Entry {
    at_ns: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at_ns == other.at_ns
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at_ns.cmp(&other.at_ns)
    }
}

#[derive(Default)]
struct State {
    due: BinaryHeap<Reverse<Entry>>,
    thread: Option<JoinHandle<()>>,
    stopped: bool,
}

#[derive(Default)]
pub(crate) struct Timers {
    state: Mutex<State>,
    changed: Condvar,
}

impl Timers {
    /// Wakes `waker` once the engine's monotonic clock reaches `at_ns` (or the engine
    /// closes). Starts the timer thread on first use.
    pub(crate) fn wake_at<H: TimerHost>(&self, shared: &Arc<H>, at_ns: u64, waker: &Waker) {
        // Shuttle does not model time, and its locks cannot be taken from a thread outside
        // the execution: under it a deadline never fires (a wait ends by a notification, and
        // a waiter nobody notifies is reported as a deadlock, as `Condvar::wait_for` is).
        #[cfg(shuttle)]
        if crate::base::sync::in_shuttle() {
            return;
        }
        let mut st = self.state.lock();
        // Without a thread nobody would wake this deadline: wake now, and the future looks
        // again (it never sleeps past its deadline this way).
        if !Self::start(&mut st, shared) {
            drop(st);
            waker.wake_by_ref();
            return;
        }
        let earliest = st.due.peek().is_none_or(|Reverse(e)| at_ns < e.at_ns);
        st.due.push(Reverse(Entry {
            at_ns,
            waker: waker.clone(),
        }));
        drop(st);
        if earliest {
            self.changed.notify_all();
        }
    }

    /// Starts the thread unless it runs or the engine closed; whether it runs.
    fn start<H: TimerHost>(st: &mut State, shared: &Arc<H>) -> bool {
        if st.stopped {
            return false;
        }
        if st.thread.is_none() {
            let shared = shared.clone();
            match std::thread::Builder::new()
                .name("idemkv-timer".into())
                .spawn(move || run(&*shared))
            {
                Ok(handle) => st.thread = Some(handle),
                Err(_) => return false,
            }
        }
        true
    }

    /// Makes sure the thread runs and, with `nudge`, looks at its work again at once (a
    /// keep-alive due within the thread's longest sleep was added). Whether it runs.
    pub(crate) fn start_and_nudge<H: TimerHost>(&self, shared: &Arc<H>, nudge: bool) -> bool {
        #[cfg(shuttle)]
        if crate::base::sync::in_shuttle() {
            return false;
        }
        let started = Self::start(&mut self.state.lock(), shared);
        if nudge {
            self.changed.notify_all();
        }
        started
    }

    /// Makes the thread look at the clock again (a mock clock moved).
    pub(crate) fn nudge(&self) {
        drop(self.state.lock());
        self.changed.notify_all();
    }

    /// Stops the thread and wakes every registered future (the engine is closing).
    pub(crate) fn stop(&self) {
        let (thread, due) = {
            let mut st = self.state.lock();
            st.stopped = true;
            (st.thread.take(), std::mem::take(&mut st.due))
        };
        self.changed.notify_all();
        due.into_iter().for_each(|Reverse(e)| e.waker.wake());
        if let Some(thread) = thread {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn run<H: TimerHost>(shared: &H) {
    let timers = shared.timers();
    loop {
        let mut fired = Vec::new();
        let next_ns = {
            let mut st = timers.state.lock();
            if st.stopped {
                return;
            }
            let now = shared.mono_ns();
            while st.due.peek().is_some_and(|Reverse(e)| e.at_ns <= now) {
                if let Some(Reverse(e)) = st.due.pop() {
                    fired.push(e.waker);
                }
            }
            if fired.is_empty() {
                let renew_ns = shared.keep_alive().next_due_ns();
                let next = st.due.peek().map(|Reverse(e)| e.at_ns);
                let wake_ns = match (next, renew_ns) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let slice = wake_ns.map_or(WAIT_SLICE_MAX, |at| {
                    Duration::from_nanos(at.saturating_sub(now))
                        .clamp(WAIT_SLICE_MIN, WAIT_SLICE_MAX)
                });
                if renew_ns.is_none_or(|at| at > now) {
                    timers.changed.wait_for(&mut st, slice);
                    continue;
                }
            }
            shared.mono_ns()
        };
        fired.into_iter().for_each(Waker::wake);
        shared.keep_alive().renew_due(next_ns);
    }
}
