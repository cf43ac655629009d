//! The fault-injecting storage (`idemkv::fault::FaultyStorage`): an in-memory image or a
//! file that fails, stalls or loses power where a test says, and keeps the images a test
//! reopens from after a simulated crash. This file holds the public type and the test's
//! controls; `faulty_state.rs` its state and `faulty_io.rs` the I/O the engine calls.

use crate::base::sync::plain::{Condvar, Mutex, MutexGuard};
use crate::base::sync::{Arc, Ordering};
use crate::store::faulty_state::{read_whole, Fault, Inner, Medium, State};
use crate::store::redb_io::FileStorage;
use std::fmt;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// A storage for an engine's file or commit log that fails, stalls or loses power where a
/// test says ([`crate::fault::WithStorage::backend`], [`crate::fault::WithStorage::log_backend`]).
///
/// - **Counting**: every `write`, `set_len` and `sync_data` the engine makes is counted
///   ([`FaultyStorage::writes`], [`FaultyStorage::set_lens`], [`FaultyStorage::syncs`]).
/// - **Failures**: [`FaultyStorage::fail_write_in`] and [`FaultyStorage::fail_sync_in`]
///   make the n-th such call from now fail (ENOSPC for a write, EIO for a sync);
///   [`FaultyStorage::fail_all`] makes every later I/O fail (a dead disk), and
///   [`FaultyStorage::set_sticky`] turns the first injected failure into `fail_all`.
/// - **Nth I/O**: [`FaultyStorage::set_fault`] arms a [`Fault`] at an I/O numbered over the
///   storage's life. Storages joined by [`FaultyStorage::share_power`] (a file and its
///   commit log) lose the power together.
/// - **Stalls**: [`FaultyStorage::close_gate`] holds every `sync_data` until the returned
///   [`Gate`] is dropped; [`FaultyStorage::wait_blocked`] waits until a sync is held there.
/// - **Crashes**: the storage keeps a *live image* (every successful write) and a *durable
///   image* (the bytes as of the last successful sync). A test reopens from
///   [`FaultyStorage::durable_image`] (power loss), [`FaultyStorage::live_image`] (a process
///   crash: the OS kept every write) or [`FaultyStorage::crash_image`] (power loss after
///   which some unsynced writes had reached the disk), each loaded into a fresh storage with
///   [`FaultyStorage::from_image`].
///
/// The handle is `Clone`, and clones share one storage: a test keeps one after giving a
/// clone to the builder. A storage serves one open at a time; an in-memory one has no lock
/// (the engine opens it without one), a [file](FaultyStorage::file) takes the file's real
/// locks, so a second open of the same file is refused with
/// [`crate::OpenError::AlreadyOpen`].
#[derive(Clone)]
pub struct FaultyStorage(pub(crate) Arc<Inner>);

/// Holds every `sync_data` of a [`FaultyStorage`] until dropped
/// ([`FaultyStorage::close_gate`]).
#[must_use = "the gate opens when this guard is dropped"]
#[derive(Debug)]
pub struct Gate(FaultyStorage);

impl Drop for Gate {
    fn drop(&mut self) {
        self.0.lock().gate_closed = false;
        self.0 .0.cond.notify_all();
    }
}

impl FaultyStorage {
    fn new(medium: Medium, image: Vec<u8>) -> Self {
        let state = State {
            durable: image.clone(),
            live: image,
            ..State::default()
        };
        FaultyStorage(Arc::new(Inner {
            medium,
            state: Mutex::new(state),
            cond: Condvar::new(),
        }))
    }

    /// An empty storage in memory.
    pub fn memory() -> Self {
        Self::new(Medium::Memory, Vec::new())
    }

    /// A storage in memory holding `image`, e.g. one of another storage's images after a
    /// simulated crash. It is both its live and its durable image.
    pub fn from_image(image: impl AsRef<[u8]>) -> Self {
        Self::new(Medium::Memory, image.as_ref().to_vec())
    }

    /// The file at `path` (created if missing), with the file's own locks; its content is
    /// both the live and the durable image at first.
    ///
    /// # Errors
    ///
    /// The file cannot be opened or read, or is too large to be held in memory.
    pub fn file(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = FileStorage::open(path.as_ref())?;
        let image = read_whole(&file)?;
        Ok(Self::new(Medium::File(file), image))
    }

    /// The state. parking_lot's mutex has no poisoning: a test thread that panicked while
    /// holding it does not hide the state from the others.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock()
    }

    /// Arms `fault` at the Nth I/O (replacing any other), or disarms it with `None`.
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.lock().fault = fault;
    }

    /// Puts this storage on `other`'s power: a [`Fault::PowerLoss`] striking either fails
    /// every later write, `set_len` and sync of both, so that their durable images are the
    /// ones of a single instant.
    pub fn share_power(&self, other: &FaultyStorage) {
        let power = other.lock().power_off.clone();
        self.lock().power_off = power;
    }

    /// Whether the power is off: a [`Fault::PowerLoss`] struck this storage or one sharing
    /// its power.
    pub fn power_lost(&self) -> bool {
        self.lock().power_off.load(Ordering::SeqCst)
    }

    /// The I/O calls (`write`, `set_len`, `sync_data`) made so far while the power was on.
    pub fn ios(&self) -> u64 {
        self.lock().ios
    }

    /// The I/O number at which the armed [`Fault`] struck, once it has.
    pub fn struck_at(&self) -> Option<u64> {
        self.lock().struck_at
    }

    /// The writes made so far, successful or not.
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// The `set_len` calls made so far, successful or not.
    pub fn set_lens(&self) -> u64 {
        self.lock().set_lens
    }

    /// The syncs made so far, successful or not.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// The failures injected so far.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Makes the `n`-th write from now (1, or 0, is the next one) fail with ENOSPC.
    pub fn fail_write_in(&self, n: u64) {
        let mut s = self.lock();
        s.fail_write_at = Some(s.writes.saturating_add(n.max(1)));
    }

    /// Makes the `n`-th sync from now (1, or 0, is the next one) fail with EIO.
    pub fn fail_sync_in(&self, n: u64) {
        let mut s = self.lock();
        s.fail_sync_at = Some(s.syncs.saturating_add(n.max(1)));
    }

    /// Makes every later read, write, `set_len` and sync fail (a dead disk), or stops doing
    /// so.
    pub fn fail_all(&self, on: bool) {
        self.lock().fail_all = on;
    }

    /// Makes every later read fail with the OS error `errno` (e.g. 13, EACCES: a permission
    /// taken away under a running process), or stops doing so with `None`.
    pub fn fail_reads_with(&self, errno: Option<i32>) {
        self.lock().read_errno = errno;
    }

    /// Sets whether the first injected failure also turns on [`FaultyStorage::fail_all`].
    pub fn set_sticky(&self, sticky: bool) {
        self.lock().sticky = sticky;
    }

    /// Clears the failures armed by [`FaultyStorage::fail_write_in`],
    /// [`FaultyStorage::fail_sync_in`] and [`FaultyStorage::fail_all`].
    pub fn heal(&self) {
        let mut s = self.lock();
        s.fail_write_at = None;
        s.fail_sync_at = None;
        s.fail_all = false;
    }

    /// Holds every `sync_data` call until the returned [`Gate`] is dropped.
    pub fn close_gate(&self) -> Gate {
        self.lock().gate_closed = true;
        Gate(self.clone())
    }

    /// Waits, in real time and for at most `timeout`, until a `sync_data` call is held at
    /// the gate ([`FaultyStorage::close_gate`]): `true` once one is, `false` if none came.
    #[must_use = "a test asserts that the sync came"]
    pub fn wait_blocked(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut s = self.lock();
        while s.blocked == 0 {
            let left = match deadline {
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return false,
                },
                // A timeout past the clock's range: wait as long as it takes.
                None => Duration::from_secs(3600),
            };
            self.0.cond.wait_for(&mut s, left);
        }
        true
    }

    /// The storage as every successful write and `set_len` left it.
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().live.clone()
    }

    /// The storage as of the last successful sync: what survives a power loss.
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// The changes (writes and `set_len`s) made since the last successful sync.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// The durable image plus the unsynced changes `keep(i)` selects, `i` counting them in
    /// the order they were made from 0: a power loss after which some changes since the last
    /// sync happened to have reached the disk.
    pub fn crash_image(&self, mut keep: impl FnMut(usize) -> bool) -> Vec<u8> {
        let s = self.lock();
        let mut image = s.durable.clone();
        for (i, change) in s.pending.iter().enumerate() {
            if keep(i) {
                change.apply(&mut image);
            }
        }
        image
    }
}

impl fmt::Debug for FaultyStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let medium = match self.0.medium {
            Medium::Memory => "memory",
            Medium::File(_) => "file",
        };
        let mut d = f.debug_struct("FaultyStorage");
        d.field("medium", &medium);
        // Never waits: a Debug of a storage whose sync is held must not hang.
        if let Some(s) = self.0.state.try_lock() {
            d.field("live_bytes", &s.live.len())
                .field("ios", &s.ios)
                .field("injected", &s.injected)
                .field("pending", &s.pending.len());
        }
        d.finish_non_exhaustive()
    }
}
