//! Async calls polled in their caller's task.
//!
//! An async claim or completion used to run as a task of the backend's runtime, its
//! caller's future waiting on a channel for the answer: each call woke a runtime thread to
//! start it and the caller's executor again to hand the answer back. On a busy 2-core
//! machine those hand-offs cost more than the statement's own wait (docs/shared.md,
//! "Throughput across processes"). Here the call's future is polled in the caller's task,
//! in the runtime's context (its timers, and the pool's connections, whose tasks stay on
//! the runtime), so the statement's answer wakes the caller's task directly.
//!
//! Invariants:
//! - A call whose future is dropped before it ends goes on as a task of the runtime, and
//!   its orphan handler gets the output: a claim that acquired releases its lease, so a
//!   dropped future never leaves one behind (as before, the statement sent is not undone).
//! - Each poll holds the backend's `driving` guard and checks that the backend is open
//!   first: a closing backend stops its runtime only between polls, never under one, and
//!   a poll after the close answers `closed` without touching the runtime.

use super::block::{Running, RunningGuard};
use super::core::Core;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

type Call<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// What runs on a dropped call's output, on the runtime.
pub(crate) type Orphan<T> = Box<dyn FnOnce(T) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// What an in-task call needs of its backend.
pub(crate) struct Host {
    pub(crate) handle: tokio::runtime::Handle,
    pub(crate) core: Arc<Core>,
    /// Counts the calls that may still need the runtime (`close` lets them finish).
    pub(crate) running: Arc<Running>,
    /// Held during each poll: the runtime stops only once none is held.
    pub(crate) driving: Arc<Running>,
}

/// A call polled in its caller's task (see the module docs).
pub(crate) struct InTask<T: Send + 'static> {
    call: Option<Call<T>>,
    orphan: Option<Orphan<T>>,
    /// The answer of a call polled after its backend closed.
    closed: fn() -> T,
    host: Arc<Host>,
    _running: Option<RunningGuard>,
}

impl<T: Send + 'static> InTask<T> {
    pub(crate) fn new(
        host: &Arc<Host>,
        call: impl Future<Output = T> + Send + 'static,
        orphan: Option<Orphan<T>>,
        closed: fn() -> T,
    ) -> Self {
        InTask {
            call: Some(Box::pin(call)),
            orphan,
            closed,
            _running: Some(host.running.enter()),
            host: host.clone(),
        }
    }
}

impl<T: Send + 'static> Future for InTask<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        let _driving = this.host.driving.enter();
        let Some(call) = this.call.as_mut() else {
            // Polled again after it answered: the answer was given once.
            return Poll::Ready((this.closed)());
        };
        if this.host.core.is_closed() {
            this.call = None;
            this._running = None;
            return Poll::Ready((this.closed)());
        }
        let _entered = this.host.handle.enter();
        let answer = call.as_mut().poll(cx);
        if answer.is_ready() {
            this.call = None;
            this._running = None;
        }
        answer
    }
}

impl<T: Send + 'static> Drop for InTask<T> {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let _driving = self.host.driving.enter();
        // A closed backend runs nothing more; its statements in flight were given up.
        if self.host.core.is_closed() {
            return;
        }
        let orphan = self.orphan.take();
        let running = self._running.take();
        self.host.handle.spawn(async move {
            let _running = running;
            let output = call.await;
            if let Some(orphan) = orphan {
                orphan(output).await;
            }
        });
    }
}
