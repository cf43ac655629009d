//! Bridges between the callers' threads and executors and the backend's private runtime.

use parking_lot::{Condvar, Mutex};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `f` to completion on the calling thread, parking it between polls. Used on
/// futures whose I/O runs on the backend's runtime (a oneshot receiver, or a call driven
/// in the runtime's context on the pool's connections) or on a direct connection this
/// thread drives itself (`direct.rs`, never inside another runtime), so it works from any
/// thread, inside another runtime's thread too.
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// A runtime stopped without waiting when dropped: it may be dropped on one of its own
/// threads or inside another runtime, where a blocking shutdown is not allowed (nor a wait
/// for a host name's lookup still running on its blocking thread).
pub(crate) struct Rt(pub(crate) Option<tokio::runtime::Runtime>);

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// What runs once no call runs (`Running::when_idle`).
type Then = Box<dyn FnOnce() + Send>;

/// Counts the calls running on the backend's runtime, so that `close` can let them finish.
#[derive(Default)]
pub(crate) struct Running {
    count: Mutex<usize>,
    idle: Condvar,
    then: Mutex<Option<Then>>,
}

/// One running call; dropped when it ends.
pub(crate) struct RunningGuard(Arc<Running>);

impl Running {
    pub(crate) fn enter(self: &Arc<Self>) -> RunningGuard {
        *self.count.lock() += 1;
        RunningGuard(self.clone())
    }

    /// Waits until no call runs, at most `grace`; whether none does.
    pub(crate) fn wait_idle(&self, grace: Duration) -> bool {
        let end = Instant::now() + grace;
        let mut count = self.count.lock();
        while *count > 0 {
            if self.idle.wait_until(&mut count, end).timed_out() {
                return *count == 0;
            }
        }
        true
    }

    /// Runs `f` now if no call runs, else when the last running call ends.
    pub(crate) fn when_idle(&self, f: Then) {
        let count = self.count.lock();
        if *count > 0 {
            *self.then.lock() = Some(f);
            return;
        }
        drop(count);
        f();
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        let mut count = self.0.count.lock();
        *count -= 1;
        if *count > 0 {
            return;
        }
        self.0.idle.notify_all();
        let then = self.0.then.lock().take();
        drop(count);
        if let Some(f) = then {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Running;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn when_idle_waits_for_the_last_running_call() {
        let running = Arc::new(Running::default());
        let ran = Arc::new(AtomicBool::new(false));
        let first = running.enter();
        let second = running.enter();
        let r = ran.clone();
        running.when_idle(Box::new(move || r.store(true, Ordering::SeqCst)));
        drop(first);
        assert!(!ran.load(Ordering::SeqCst));
        drop(second);
        assert!(ran.load(Ordering::SeqCst));
    }

    #[test]
    fn when_idle_runs_at_once_when_nothing_runs() {
        let running = Running::default();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        running.when_idle(Box::new(move || r.store(true, Ordering::SeqCst)));
        assert!(ran.load(Ordering::SeqCst));
    }
}
