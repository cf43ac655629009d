//! The only module that names lock, atomic, channel and thread types. A model-checking build
//! swaps these for shuttle's in one place.
//!
//! In an ordinary build these are plain re-exports of parking_lot, crossbeam and std.
//!
//! Built with `--cfg shuttle` (through RUSTFLAGS; no feature can set it), every lock,
//! condition variable, atomic, channel and the writer's (and applier's) thread decides when it is created:
//! inside a shuttle execution it is shuttle's (every acquire, release, notify, send, receive
//! and atomic access becomes a scheduling point the model checker controls), anywhere else
//! it is parking_lot's, crossbeam's or std's. So one build runs both the model tests
//! (`crates/idemkv-check/tests/shuttle_model.rs`, the
//! `concurrent_claims` fuzz target) and every ordinary test, and an engine opened inside
//! `shuttle::check_*` runs entirely under the scheduler, its writer and applier threads included (the
//! store's own I/O is synchronous, so each redb call is one step of the model). The API
//! keeps parking_lot's and crossbeam's shape: `Mutex::lock() -> MutexGuard`,
//! `MutexGuard::unlocked`, `Condvar::wait_for(&mut guard, d)`, `Condvar::notify_all`,
//! `channel::bounded`, `Sender::try_send`, `Receiver::recv_deadline`.

pub(crate) use std::sync::atomic::Ordering;
/// One-time initialization (a lease's staged writes, made on first use): std's in every
/// build, since no initialization in the engine waits on another thread's work.
pub(crate) use std::sync::OnceLock;
pub(crate) use std::sync::{Arc, Weak};

/// The writer's queue and its acknowledgements: crossbeam's bounded channels.
#[cfg(not(shuttle))]
pub(crate) mod channel {
    pub(crate) use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
}

#[cfg(not(shuttle))]
pub(crate) use std::thread::JoinHandle;

/// Starts a named thread (the writer, the applier).
#[cfg(not(shuttle))]
pub(crate) fn spawn<F, T>(name: &str, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new().name(name.into()).spawn(f)
}

/// Starts a named thread whose work no acknowledgement waits for (the applier), at a lower
/// scheduling priority (see [`lower_priority`]), set before this returns. Threads it starts
/// inherit that priority. Inside a shuttle execution it is a task like any other.
pub(crate) fn spawn_background<F, T>(name: &str, nice: u8, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    #[cfg(shuttle)]
    if in_shuttle() {
        return spawn(name, f);
    }
    let (lowered, wait) = std::sync::mpsc::sync_channel(1);
    let thread = spawn(name, move || {
        lower_priority(nice);
        // The spawner waits for this; a send fails only if it is gone.
        let _ = lowered.send(());
        f()
    })?;
    // An error means the thread ended before it said so: its join reports why.
    let _ = wait.recv();
    Ok(thread)
}

/// Raises the calling thread's nice value by `by` (at most to 19, the lowest priority), so
/// that on busy cores the threads that callers wait for (the writer, the callers
/// themselves) run first. `by` is unsigned: this never raises a priority, which an
/// unprivileged thread could not undo. Best effort (`getpriority` and `setpriority` may be
/// refused, by a sandbox for one): returns whether both calls succeeded. Linux only, where
/// a nice value belongs to one thread; elsewhere the thread keeps its priority.
#[cfg(target_os = "linux")]
pub(crate) fn lower_priority(by: u8) -> bool {
    use rustix::process::{getpriority_process, setpriority_process};
    let me = Some(rustix::thread::gettid());
    getpriority_process(me)
        .and_then(|nice| setpriority_process(me, nice.saturating_add(i32::from(by)).min(19)))
        .is_ok()
}

/// See the Linux version: elsewhere a nice value may belong to the whole process.
#[cfg(not(target_os = "linux"))]
pub(crate) fn lower_priority(_by: u8) -> bool {
    false
}

#[cfg(not(shuttle))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

/// Locks that stay parking_lot's under `--cfg shuttle` too: the fault-injecting storage's
/// (`store/faulty.rs`). redb calls the storage while it holds its own std locks, so a
/// storage call must never be a scheduling point: a task switched out there would leave
/// the model's other tasks blocked on a real lock.
pub(crate) mod plain {
    pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
    pub(crate) use std::sync::atomic::AtomicBool;
}
#[cfg(all(idemkv_sabotage, not(shuttle)))]
pub(crate) use std::sync::atomic::AtomicU8;
#[cfg(not(shuttle))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64};

#[cfg(all(shuttle, idemkv_sabotage))]
pub(crate) use self::model::AtomicU8;
#[cfg(shuttle)]
pub(crate) use self::model::{
    channel, in_shuttle, spawn, AtomicBool, AtomicU64, Condvar, JoinHandle, Mutex, MutexGuard,
    RwLock,
};

#[cfg(shuttle)]
#[allow(dead_code)]
mod model {
    use std::fmt;
    use std::ops::{Deref, DerefMut};
    use std::sync::atomic::Ordering;
    use std::sync::PoisonError;
    use std::time::Duration;

    /// True when called from a task of a running shuttle execution.
    pub(crate) fn in_shuttle() -> bool {
        shuttle::current::try_get_current_task().is_some()
    }

    /// A mutex that is shuttle's inside a shuttle execution, parking_lot's elsewhere.
    pub(crate) enum Mutex<T> {
        Real(parking_lot::Mutex<T>),
        Model(shuttle::sync::Mutex<T>),
    }

    enum Guard<'a, T> {
        Real(parking_lot::MutexGuard<'a, T>),
        Model(shuttle::sync::MutexGuard<'a, T>),
    }

    /// The guard of [`Mutex`]; `inner` is `None` only inside [`MutexGuard::unlocked`] and
    /// [`Condvar::wait_for`].
    pub(crate) struct MutexGuard<'a, T> {
        lock: &'a Mutex<T>,
        inner: Option<Guard<'a, T>>,
    }

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            if in_shuttle() {
                Mutex::Model(shuttle::sync::Mutex::new(value))
            } else {
                Mutex::Real(parking_lot::Mutex::new(value))
            }
        }

        fn raw(&self) -> Guard<'_, T> {
            match self {
                Mutex::Real(m) => Guard::Real(m.lock()),
                // A panicking holder already failed the execution; keep going with the data.
                Mutex::Model(m) => Guard::Model(m.lock().unwrap_or_else(PoisonError::into_inner)),
            }
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard {
                lock: self,
                inner: Some(self.raw()),
            }
        }

        pub(crate) fn into_inner(self) -> T {
            match self {
                Mutex::Real(m) => m.into_inner(),
                Mutex::Model(m) => m.into_inner().unwrap_or_else(PoisonError::into_inner),
            }
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            match self {
                Mutex::Real(m) => m.get_mut(),
                Mutex::Model(m) => m.get_mut().unwrap_or_else(PoisonError::into_inner),
            }
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Mutex::new(T::default())
        }
    }

    impl<T> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex { .. }")
        }
    }

    impl<'a, T> MutexGuard<'a, T> {
        /// Releases the lock while `f` runs, then takes it again (parking_lot's `unlocked`).
        pub(crate) fn unlocked<F: FnOnce() -> U, U>(s: &mut Self, f: F) -> U {
            s.inner = None;
            let out = f();
            s.inner = Some(s.lock.raw());
            out
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            match &self.inner {
                Some(Guard::Real(g)) => g,
                Some(Guard::Model(g)) => g,
                None => unreachable!("a MutexGuard is only empty inside unlocked/wait_for"),
            }
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            match &mut self.inner {
                Some(Guard::Real(g)) => g,
                Some(Guard::Model(g)) => g,
                None => unreachable!("a MutexGuard is only empty inside unlocked/wait_for"),
            }
        }
    }

    /// A condition variable that is shuttle's inside a shuttle execution.
    pub(crate) enum Condvar {
        Real(parking_lot::Condvar),
        Model(shuttle::sync::Condvar),
    }

    impl Condvar {
        pub(crate) fn new() -> Self {
            if in_shuttle() {
                Condvar::Model(shuttle::sync::Condvar::new())
            } else {
                Condvar::Real(parking_lot::Condvar::new())
            }
        }

        /// Wakes every waiter.
        pub(crate) fn notify_all(&self) -> usize {
            match self {
                Condvar::Real(c) => c.notify_all(),
                Condvar::Model(c) => {
                    c.notify_all();
                    0
                }
            }
        }

        /// Wakes one waiter.
        pub(crate) fn notify_one(&self) -> bool {
            match self {
                Condvar::Real(c) => c.notify_one(),
                Condvar::Model(c) => {
                    c.notify_one();
                    false
                }
            }
        }

        /// Sleeps until notified or `timeout` passes; returns whether it timed out. Shuttle does
        /// not model time: under it the wait ends only by a notification (a waiter nobody
        /// wakes is reported as a deadlock, which is what a lost wake-up is).
        pub(crate) fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> bool {
            match (self, guard.inner.take()) {
                (Condvar::Real(c), Some(Guard::Real(mut g))) => {
                    let timed_out = c.wait_for(&mut g, timeout).timed_out();
                    guard.inner = Some(Guard::Real(g));
                    timed_out
                }
                (Condvar::Model(c), Some(Guard::Model(g))) => {
                    let g = c.wait(g).unwrap_or_else(PoisonError::into_inner);
                    guard.inner = Some(Guard::Model(g));
                    false
                }
                // A lock and a condition variable from different worlds (created inside and
                // outside an execution): a spurious wake-up, which every waiter tolerates.
                (_, inner) => {
                    drop(inner);
                    guard.inner = Some(guard.lock.raw());
                    false
                }
            }
        }
    }

    impl Default for Condvar {
        fn default() -> Self {
            Condvar::new()
        }
    }

    impl fmt::Debug for Condvar {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Condvar { .. }")
        }
    }

    /// A reader-writer lock that is shuttle's inside a shuttle execution.
    pub(crate) enum RwLock<T> {
        Real(parking_lot::RwLock<T>),
        Model(shuttle::sync::RwLock<T>),
    }

    enum ReadInner<'a, T> {
        Real(parking_lot::RwLockReadGuard<'a, T>),
        Model(shuttle::sync::RwLockReadGuard<'a, T>),
    }

    enum WriteInner<'a, T> {
        Real(parking_lot::RwLockWriteGuard<'a, T>),
        Model(shuttle::sync::RwLockWriteGuard<'a, T>),
    }

    /// Shared access to a [`RwLock`].
    pub(crate) struct RwLockReadGuard<'a, T>(ReadInner<'a, T>);
    /// Exclusive access to a [`RwLock`].
    pub(crate) struct RwLockWriteGuard<'a, T>(WriteInner<'a, T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            if in_shuttle() {
                RwLock::Model(shuttle::sync::RwLock::new(value))
            } else {
                RwLock::Real(parking_lot::RwLock::new(value))
            }
        }

        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            RwLockReadGuard(match self {
                RwLock::Real(l) => ReadInner::Real(l.read()),
                RwLock::Model(l) => {
                    ReadInner::Model(l.read().unwrap_or_else(PoisonError::into_inner))
                }
            })
        }

        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            RwLockWriteGuard(match self {
                RwLock::Real(l) => WriteInner::Real(l.write()),
                RwLock::Model(l) => {
                    WriteInner::Model(l.write().unwrap_or_else(PoisonError::into_inner))
                }
            })
        }
    }

    impl<T: Default> Default for RwLock<T> {
        fn default() -> Self {
            RwLock::new(T::default())
        }
    }

    impl<T> fmt::Debug for RwLock<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("RwLock { .. }")
        }
    }

    impl<T> Deref for RwLockReadGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            match &self.0 {
                ReadInner::Real(g) => g,
                ReadInner::Model(g) => g,
            }
        }
    }

    impl<T> Deref for RwLockWriteGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            match &self.0 {
                WriteInner::Real(g) => g,
                WriteInner::Model(g) => g,
            }
        }
    }

    impl<T> DerefMut for RwLockWriteGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            match &mut self.0 {
                WriteInner::Real(g) => g,
                WriteInner::Model(g) => g,
            }
        }
    }

    macro_rules! atomic_int {
        ($name:ident, $int:ty) => {
            /// An atomic integer that is shuttle's inside a shuttle execution, std's elsewhere.
            pub(crate) enum $name {
                Real(std::sync::atomic::$name),
                Model(shuttle::sync::atomic::$name),
            }

            impl $name {
                pub(crate) fn new(v: $int) -> Self {
                    if in_shuttle() {
                        $name::Model(shuttle::sync::atomic::$name::new(v))
                    } else {
                        $name::Real(std::sync::atomic::$name::new(v))
                    }
                }
                pub(crate) fn load(&self, o: Ordering) -> $int {
                    match self {
                        $name::Real(a) => a.load(o),
                        $name::Model(a) => a.load(o),
                    }
                }
                pub(crate) fn store(&self, v: $int, o: Ordering) {
                    match self {
                        $name::Real(a) => a.store(v, o),
                        $name::Model(a) => a.store(v, o),
                    }
                }
                pub(crate) fn swap(&self, v: $int, o: Ordering) -> $int {
                    match self {
                        $name::Real(a) => a.swap(v, o),
                        $name::Model(a) => a.swap(v, o),
                    }
                }
                pub(crate) fn fetch_add(&self, v: $int, o: Ordering) -> $int {
                    match self {
                        $name::Real(a) => a.fetch_add(v, o),
                        $name::Model(a) => a.fetch_add(v, o),
                    }
                }
                pub(crate) fn fetch_sub(&self, v: $int, o: Ordering) -> $int {
                    match self {
                        $name::Real(a) => a.fetch_sub(v, o),
                        $name::Model(a) => a.fetch_sub(v, o),
                    }
                }
                pub(crate) fn fetch_max(&self, v: $int, o: Ordering) -> $int {
                    match self {
                        $name::Real(a) => a.fetch_max(v, o),
                        $name::Model(a) => a.fetch_max(v, o),
                    }
                }
                pub(crate) fn fetch_min(&self, v: $int, o: Ordering) -> $int {
                    match self {
                        $name::Real(a) => a.fetch_min(v, o),
                        $name::Model(a) => a.fetch_min(v, o),
                    }
                }
                pub(crate) fn compare_exchange(
                    &self,
                    current: $int,
                    new: $int,
                    success: Ordering,
                    failure: Ordering,
                ) -> Result<$int, $int> {
                    match self {
                        $name::Real(a) => a.compare_exchange(current, new, success, failure),
                        $name::Model(a) => a.compare_exchange(current, new, success, failure),
                    }
                }
                pub(crate) fn compare_exchange_weak(
                    &self,
                    current: $int,
                    new: $int,
                    success: Ordering,
                    failure: Ordering,
                ) -> Result<$int, $int> {
                    match self {
                        $name::Real(a) => a.compare_exchange_weak(current, new, success, failure),
                        $name::Model(a) => a.compare_exchange_weak(current, new, success, failure),
                    }
                }
                pub(crate) fn fetch_update<F>(
                    &self,
                    set: Ordering,
                    fetch: Ordering,
                    f: F,
                ) -> Result<$int, $int>
                where
                    F: FnMut($int) -> Option<$int>,
                {
                    match self {
                        $name::Real(a) => a.fetch_update(set, fetch, f),
                        $name::Model(a) => a.fetch_update(set, fetch, f),
                    }
                }
            }

            impl Default for $name {
                fn default() -> Self {
                    $name::new(0)
                }
            }

            impl fmt::Debug for $name {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    match self {
                        $name::Real(a) => fmt::Debug::fmt(a, f),
                        $name::Model(a) => fmt::Debug::fmt(a, f),
                    }
                }
            }
        };
    }

    atomic_int!(AtomicU64, u64);
    atomic_int!(AtomicU8, u8);

    /// An atomic bool that is shuttle's inside a shuttle execution, std's elsewhere.
    pub(crate) enum AtomicBool {
        Real(std::sync::atomic::AtomicBool),
        Model(shuttle::sync::atomic::AtomicBool),
    }

    impl AtomicBool {
        pub(crate) fn new(v: bool) -> Self {
            if in_shuttle() {
                AtomicBool::Model(shuttle::sync::atomic::AtomicBool::new(v))
            } else {
                AtomicBool::Real(std::sync::atomic::AtomicBool::new(v))
            }
        }
        pub(crate) fn load(&self, o: Ordering) -> bool {
            match self {
                AtomicBool::Real(a) => a.load(o),
                AtomicBool::Model(a) => a.load(o),
            }
        }
        pub(crate) fn store(&self, v: bool, o: Ordering) {
            match self {
                AtomicBool::Real(a) => a.store(v, o),
                AtomicBool::Model(a) => a.store(v, o),
            }
        }
        pub(crate) fn swap(&self, v: bool, o: Ordering) -> bool {
            match self {
                AtomicBool::Real(a) => a.swap(v, o),
                AtomicBool::Model(a) => a.swap(v, o),
            }
        }
        pub(crate) fn compare_exchange(
            &self,
            current: bool,
            new: bool,
            success: Ordering,
            failure: Ordering,
        ) -> Result<bool, bool> {
            match self {
                AtomicBool::Real(a) => a.compare_exchange(current, new, success, failure),
                AtomicBool::Model(a) => a.compare_exchange(current, new, success, failure),
            }
        }
    }

    impl Default for AtomicBool {
        fn default() -> Self {
            AtomicBool::new(false)
        }
    }

    impl fmt::Debug for AtomicBool {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                AtomicBool::Real(a) => fmt::Debug::fmt(a, f),
                AtomicBool::Model(a) => fmt::Debug::fmt(a, f),
            }
        }
    }

    /// A thread that is shuttle's when spawned inside a shuttle execution.
    pub(crate) enum JoinHandle<T> {
        Real(std::thread::JoinHandle<T>),
        Model(shuttle::thread::JoinHandle<T>),
    }

    impl<T> JoinHandle<T> {
        pub(crate) fn join(self) -> std::thread::Result<T> {
            match self {
                JoinHandle::Real(h) => h.join(),
                JoinHandle::Model(h) => h.join(),
            }
        }
    }

    /// Starts a named thread: a shuttle task inside a shuttle execution.
    pub(crate) fn spawn<F, T>(name: &str, f: F) -> std::io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if in_shuttle() {
            shuttle::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map(JoinHandle::Model)
        } else {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map(JoinHandle::Real)
        }
    }

    /// Bounded channels that are shuttle's inside a shuttle execution, crossbeam's elsewhere,
    /// with the part of crossbeam's API the engine uses. Shuttle does not model time: a
    /// receive with a timeout waits for a message (or every sender gone), and one with a
    /// deadline finds the deadline passed unless a message is already queued.
    pub(crate) mod channel {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::time::{Duration, Instant};

        pub(crate) use crossbeam_channel::{
            RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError,
        };
        use shuttle::sync::mpsc;

        /// Sending half; `len` counts queued messages in the model.
        pub(crate) enum Sender<T> {
            Real(crossbeam_channel::Sender<T>),
            Model(mpsc::SyncSender<T>, Arc<AtomicUsize>, usize),
        }

        /// Receiving half.
        pub(crate) enum Receiver<T> {
            Real(crossbeam_channel::Receiver<T>),
            Model(mpsc::Receiver<T>, Arc<AtomicUsize>),
        }

        pub(crate) fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
            if super::in_shuttle() {
                let (tx, rx) = mpsc::sync_channel(cap);
                let queued = Arc::new(AtomicUsize::new(0));
                (
                    Sender::Model(tx, queued.clone(), cap),
                    Receiver::Model(rx, queued),
                )
            } else {
                let (tx, rx) = crossbeam_channel::bounded(cap);
                (Sender::Real(tx), Receiver::Real(rx))
            }
        }

        impl<T> Clone for Sender<T> {
            fn clone(&self) -> Self {
                match self {
                    Sender::Real(tx) => Sender::Real(tx.clone()),
                    Sender::Model(tx, queued, cap) => {
                        Sender::Model(tx.clone(), queued.clone(), *cap)
                    }
                }
            }
        }

        impl<T> Sender<T> {
            pub(crate) fn send(&self, t: T) -> Result<(), SendError<T>> {
                match self {
                    Sender::Real(tx) => tx.send(t),
                    Sender::Model(tx, queued, _) => {
                        queued.fetch_add(1, Ordering::SeqCst);
                        tx.send(t).map_err(|e| {
                            queued.fetch_sub(1, Ordering::SeqCst);
                            SendError(e.0)
                        })
                    }
                }
            }

            pub(crate) fn try_send(&self, t: T) -> Result<(), TrySendError<T>> {
                match self {
                    Sender::Real(tx) => tx.try_send(t),
                    Sender::Model(tx, queued, _) => {
                        queued.fetch_add(1, Ordering::SeqCst);
                        tx.try_send(t).map_err(|e| {
                            queued.fetch_sub(1, Ordering::SeqCst);
                            match e {
                                mpsc::TrySendError::Full(t) => TrySendError::Full(t),
                                mpsc::TrySendError::Disconnected(t) => {
                                    TrySendError::Disconnected(t)
                                }
                            }
                        })
                    }
                }
            }

            pub(crate) fn len(&self) -> usize {
                match self {
                    Sender::Real(tx) => tx.len(),
                    Sender::Model(_, queued, _) => queued.load(Ordering::SeqCst),
                }
            }

            pub(crate) fn is_full(&self) -> bool {
                match self {
                    Sender::Real(tx) => tx.is_full(),
                    Sender::Model(_, queued, cap) => queued.load(Ordering::SeqCst) >= *cap,
                }
            }
        }

        impl<T> Receiver<T> {
            fn took(queued: &AtomicUsize) {
                queued.fetch_sub(1, Ordering::SeqCst);
            }

            pub(crate) fn len(&self) -> usize {
                match self {
                    Receiver::Real(rx) => rx.len(),
                    Receiver::Model(_, queued) => queued.load(Ordering::SeqCst),
                }
            }

            pub(crate) fn is_empty(&self) -> bool {
                self.len() == 0
            }

            pub(crate) fn recv(&self) -> Result<T, RecvError> {
                match self {
                    Receiver::Real(rx) => rx.recv(),
                    Receiver::Model(rx, queued) => {
                        let t = rx.recv().map_err(|_| RecvError)?;
                        Self::took(queued);
                        Ok(t)
                    }
                }
            }

            pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
                match self {
                    Receiver::Real(rx) => rx.try_recv(),
                    Receiver::Model(rx, queued) => {
                        let t = rx.try_recv().map_err(|e| match e {
                            mpsc::TryRecvError::Empty => TryRecvError::Empty,
                            mpsc::TryRecvError::Disconnected => TryRecvError::Disconnected,
                        })?;
                        Self::took(queued);
                        Ok(t)
                    }
                }
            }

            pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
                match self {
                    Receiver::Real(rx) => rx.recv_timeout(timeout),
                    Receiver::Model(..) => self.recv().map_err(|_| RecvTimeoutError::Disconnected),
                }
            }

            pub(crate) fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
                match self {
                    Receiver::Real(rx) => rx.recv_deadline(deadline),
                    Receiver::Model(..) => self.try_recv().map_err(|e| match e {
                        TryRecvError::Empty => RecvTimeoutError::Timeout,
                        TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                    }),
                }
            }
        }
    }
}

#[cfg(all(test, target_os = "linux", not(shuttle)))]
mod tests {
    /// The calling thread's nice value, from `/proc` (field 19 of its `stat`).
    fn own_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
        let after_name = stat.rsplit_once(')').expect("the name's parenthesis").1;
        after_name
            .split_whitespace()
            .nth(16)
            .and_then(|n| n.parse().ok())
            .expect("nice")
    }

    #[test]
    fn lowering_a_threads_priority_leaves_its_spawners_alone() {
        let before = own_nice();
        let lowered = std::thread::spawn(move || {
            let changed = super::lower_priority(3);
            (changed, own_nice())
        })
        .join()
        .expect("join");
        assert_eq!(lowered, (true, (before + 3).min(19)));
        assert_eq!(
            own_nice(),
            before,
            "the nice value is the thread's, not the process's"
        );
        let clamped = std::thread::spawn(|| {
            super::lower_priority(100);
            own_nice()
        })
        .join()
        .expect("join");
        assert_eq!(clamped, 19, "at most the lowest priority");
    }

    #[test]
    fn a_background_thread_runs_at_its_priority_from_its_first_instruction() {
        let before = own_nice();
        let seen = super::spawn_background("lowered", 2, own_nice)
            .expect("spawn")
            .join()
            .expect("join");
        assert_eq!(seen, (before + 2).min(19));
    }
}
