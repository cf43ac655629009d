//! A stripe's "something changed" signal, for blocked threads and for futures alike.
//!
//! Threads sleep on the condition variable; futures leave their waker. Both are woken by
//! one `notify_all` after every change a waiter may be waiting for (a completion published,
//! a release, poison, close, a clock jump).
//!
//! Architecture invariant: a future registers its waker while it holds the stripe lock, and
//! every change is made under that lock before `notify_all`: no wake-up is lost.

use crate::base::sync::{AtomicBool, Condvar, Mutex, MutexGuard, Ordering};
use std::task::Waker;
use std::time::Duration;

pub(crate) struct Changed {
    cv: Condvar,
    watchers: Mutex<Vec<Waker>>,
    /// Whether `watchers` may hold a waker: the notifier's fast path skips the lock.
    watched: AtomicBool,
}

impl Changed {
    pub(crate) fn new() -> Self {
        Self {
            cv: Condvar::new(),
            watchers: Mutex::new(Vec::new()),
            watched: AtomicBool::new(false),
        }
    }

    /// Wakes every sleeping thread and every registered future.
    pub(crate) fn notify_all(&self) {
        self.cv.notify_all();
        if self.watched.load(Ordering::Acquire) {
            let due = {
                let mut w = self.watchers.lock();
                self.watched.store(false, Ordering::Release);
                std::mem::take(&mut *w)
            };
            due.into_iter().for_each(Waker::wake);
        }
    }

    /// Sleeps until notified or `timeout` passes (see `sync::Condvar::wait_for`); the
    /// caller looks at the state again either way.
    pub(crate) fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) {
        let _ = self.cv.wait_for(guard, timeout);
    }

    /// Registers `waker` for the next notification. Called under the stripe lock.
    pub(crate) fn watch(&self, waker: &Waker) {
        let mut w = self.watchers.lock();
        if !w.iter().any(|old| old.will_wake(waker)) {
            w.push(waker.clone());
        }
        self.watched.store(true, Ordering::Release);
    }
}
