//! Test helpers shared by the integration tests.
//!
//! [`FaultyBackend`] is an idemkv [`Storage`] that wraps a redb [`StorageBackend`] a real one (in memory or a file)
//! and lets a test inject storage failures, stall the writer, and simulate power loss.
//!
//! - **Counting**: every `write`, `set_len` and `sync_data` call is counted.
//! - **Failures**: [`FaultyBackend::fail_write_in`] / [`FaultyBackend::fail_sync_in`] make the
//!   n-th such call from now fail with an `io::Error` (ENOSPC for writes, EIO for syncs);
//!   [`FaultyBackend::fail_all`] makes every later I/O fail (a dead disk), and
//!   [`FaultyBackend::set_sticky`] turns the first injected failure into `fail_all`.
//! - **Nth I/O**: [`FaultyBackend::set_fault`] arms a [`Fault`] at the Nth I/O counted over
//!   the backend's life (`write`, `set_len` and `sync_data`, from 1; [`FaultyBackend::ios`]).
//!   [`Fault::Error`] fails that one call (ENOSPC for a write or `set_len`, EIO for a sync)
//!   and the process lives on; [`Fault::PowerLoss`] fails it and every later write, `set_len`
//!   and sync (reads still answer from what the OS holds): the machine is gone, and a test
//!   reopens from one of the images below. Backends joined by [`FaultyBackend::share_power`]
//!   (a file and its commit log) lose the power together.
//! - **Stalls**: [`FaultyBackend::close_gate`] makes `sync_data` block until the returned
//!   guard is dropped; [`FaultyBackend::wait_blocked`] waits until a sync is stuck there.
//! - **Power loss**: the backend mirrors the storage in a *live image* (every successful
//!   write) and a *durable image* (the bytes as of the last successful sync). A test reopens
//!   from [`FaultyBackend::durable_image`] (power loss), [`FaultyBackend::live_image`] (a
//!   process crash; the OS kept every write) or [`FaultyBackend::crash_image`] (power loss
//!   where an arbitrary subset of the unsynced writes reached the disk), each loaded into a
//!   fresh in-memory backend with [`FaultyBackend::from_image`].
//!
//! The handle is `Clone` (an `Arc` inside), so a test keeps one after giving a clone to
//! `EngineBuilder::backend`. Locks are delegated to the inner backend: a `FileBackend` gives
//! real file locks (so `AlreadyOpen` works); an `InMemoryBackend` has none, which redb accepts
//! in its exclusive-writer mode.

use idemkv::fault::{LockKind, Storage};
use redb::backends::{FileBackend, InMemoryBackend};
use redb::{BackendError, StorageBackend};
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One change made since the last successful sync (for [`FaultyBackend::crash_image`]).
#[derive(Debug, Clone)]
enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

/// When and how the backend fails at a given I/O ([`FaultyBackend::set_fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The I/O numbered `at` (from 1) fails once; later ones succeed.
    Error {
        /// Which I/O.
        at: u64,
    },
    /// Power is lost at the I/O numbered `at`: it and every later one fail.
    PowerLoss {
        /// Which I/O.
        at: u64,
    },
}

#[derive(Debug, Default)]
struct State {
    /// Writes, `set_len`s and syncs made while the power was on (the [`Fault`] clock).
    ios: u64,
    fault: Option<Fault>,
    /// The power is off ([`Fault::PowerLoss`] struck).
    dead: bool,
    /// The machine's power, shared by the storages of one machine ([`FaultyBackend::share_power`]):
    /// a power loss at one storage's I/O stops the others' I/O at the same instant.
    power_off: Arc<AtomicBool>,
    /// The I/O number at which the armed [`Fault`] struck, once it has.
    struck_at: Option<u64>,
    writes: u64,
    set_lens: u64,
    syncs: u64,
    /// Fail the write / sync whose 1-based count equals this.
    fail_write_at: Option<u64>,
    fail_sync_at: Option<u64>,
    fail_all: bool,
    /// Every read fails with this OS error number.
    read_errno: Option<i32>,
    sticky: bool,
    injected: u64,
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    gate_closed: bool,
    blocked: usize,
}

#[derive(Debug)]
struct Inner {
    backend: Box<dyn StorageBackend>,
    state: Mutex<State>,
    cond: Condvar,
}

/// A fault-injecting, power-loss-simulating wrapper around a redb storage backend.
#[derive(Debug, Clone)]
pub struct FaultyBackend(Arc<Inner>);

/// Keeps `sync_data` blocked until dropped (see [`FaultyBackend::close_gate`]).
#[must_use = "the gate opens when this guard is dropped"]
pub struct Gate(FaultyBackend);

impl Drop for Gate {
    fn drop(&mut self) {
        self.0.lock().gate_closed = false;
        self.0 .0.cond.notify_all();
    }
}

/// Sets `image`'s length to `len`, zeros where it grows. A commit log is 16 MiB of zeros
/// at first: `Vec::resize` fills it byte by byte in a debug build, a zeroed allocation and
/// one copy do not.
fn resize(image: &mut Vec<u8>, len: usize) {
    if len <= image.len() {
        image.truncate(len);
        return;
    }
    let mut grown = vec![0; len];
    grown[..image.len()].copy_from_slice(image);
    *image = grown;
}

fn apply(image: &mut Vec<u8>, change: &Pending) {
    match change {
        Pending::SetLen(len) => resize(image, *len as usize),
        Pending::Write(offset, data) => {
            let end = *offset as usize + data.len();
            if image.len() < end {
                resize(image, end);
            }
            image[*offset as usize..end].copy_from_slice(data);
        }
    }
}

/// An injected failure: ENOSPC for writes and set_len, EIO for syncs and reads.
fn injected(what: &str, errno: i32) -> io::Error {
    let os = io::Error::from_raw_os_error(errno);
    io::Error::new(os.kind(), format!("injected {what} failure: {os}"))
}

impl FaultyBackend {
    /// Wraps `backend`; its current content becomes both the live and the durable image.
    pub fn wrap(backend: impl StorageBackend) -> Self {
        let len = backend.len().expect("inner backend len");
        let mut image = vec![0; len as usize];
        backend.read(0, &mut image).expect("inner backend read");
        let state = State {
            durable: image.clone(),
            live: image,
            ..State::default()
        };
        FaultyBackend(Arc::new(Inner {
            backend: Box::new(backend),
            state: Mutex::new(state),
            cond: Condvar::new(),
        }))
    }

    /// An empty in-memory backend.
    pub fn memory() -> Self {
        Self::wrap(InMemoryBackend::new())
    }

    /// A fresh in-memory backend holding `image` (e.g. a durable image after "power loss").
    pub fn from_image(image: impl AsRef<[u8]>) -> Self {
        let image = image.as_ref();
        let mem = InMemoryBackend::new();
        mem.set_len(image.len() as u64).expect("set_len");
        mem.write(0, image).expect("write");
        Self::wrap(mem)
    }

    /// The file at `path` (created if missing) through redb's `FileBackend`, with its locks.
    pub fn file(path: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .expect("open backend file");
        Self::wrap(FileBackend::new(file).expect("FileBackend"))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the state from the others.
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms a fault at the Nth I/O (replacing any other).
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.lock().fault = fault;
    }

    /// Puts this backend on `other`'s power: a [`Fault::PowerLoss`] striking either fails
    /// every later write, `set_len` and sync of both, so that their durable images are the
    /// ones of a single instant.
    pub fn share_power(&self, other: &FaultyBackend) {
        let power = other.lock().power_off.clone();
        self.lock().power_off = power;
    }

    /// Whether the power is off: a [`Fault::PowerLoss`] struck this backend or one sharing
    /// its power.
    pub fn power_lost(&self) -> bool {
        self.lock().power_off.load(Ordering::SeqCst)
    }

    /// I/O calls (`write`, `set_len`, `sync_data`) made so far while the power was on.
    pub fn ios(&self) -> u64 {
        self.lock().ios
    }

    /// The I/O number at which the armed [`Fault`] struck, if it has.
    pub fn struck_at(&self) -> Option<u64> {
        self.lock().struck_at
    }

    /// Writes made so far (successful or not).
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// `set_len` calls made so far.
    pub fn set_lens(&self) -> u64 {
        self.lock().set_lens
    }

    /// Syncs made so far (successful or not).
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Makes the `n`-th write from now (1 = the next one) fail with ENOSPC.
    pub fn fail_write_in(&self, n: u64) {
        let mut s = self.lock();
        s.fail_write_at = Some(s.writes + n.max(1));
    }

    /// Makes the `n`-th sync from now (1 = the next one) fail with EIO.
    pub fn fail_sync_in(&self, n: u64) {
        let mut s = self.lock();
        s.fail_sync_at = Some(s.syncs + n.max(1));
    }

    /// Makes every later read, write, set_len and sync fail (a dead disk), or stops doing so.
    pub fn fail_all(&self, on: bool) {
        self.lock().fail_all = on;
    }

    /// Makes every later read fail with the OS error `errno` (e.g. 13, EACCES: a permission
    /// taken away under a running process), or stops doing so.
    pub fn fail_reads_with(&self, errno: Option<i32>) {
        self.lock().read_errno = errno;
    }

    /// Whether the first injected failure also turns on [`Self::fail_all`].
    pub fn set_sticky(&self, sticky: bool) {
        self.lock().sticky = sticky;
    }

    /// Clears every armed failure.
    pub fn heal(&self) {
        let mut s = self.lock();
        s.fail_write_at = None;
        s.fail_sync_at = None;
        s.fail_all = false;
    }

    /// Blocks every `sync_data` call until the returned guard is dropped.
    pub fn close_gate(&self) -> Gate {
        self.lock().gate_closed = true;
        Gate(self.clone())
    }

    /// Waits (real time, at most 10 s) until a `sync_data` call is blocked at the gate.
    pub fn wait_blocked(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = self.lock();
        while s.blocked == 0 {
            let left = deadline
                .checked_duration_since(Instant::now())
                .expect("no sync blocked at the gate within 10 s");
            s = self.0.cond.wait_timeout(s, left).expect("gate").0;
        }
    }

    /// The storage as every successful write left it.
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().live.clone()
    }

    /// The storage as of the last successful sync: what survives a power loss.
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// Changes made since the last successful sync.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// The durable image plus the unsynced changes `keep(i)` selects (in order): a power loss
    /// in which some writes since the last sync happened to reach the disk.
    pub fn crash_image(&self, mut keep: impl FnMut(usize) -> bool) -> Vec<u8> {
        let s = self.lock();
        let mut image = s.durable.clone();
        for (i, change) in s.pending.iter().enumerate() {
            if keep(i) {
                apply(&mut image, change);
            }
        }
        image
    }

    /// Counts a call and decides whether it fails; `at` is its armed failure, if any. The
    /// [`Fault`] clock ticks first: a dead disk fails every call, and the armed [`Fault`]
    /// strikes at its I/O number.
    fn check(&self, s: &mut State, count: u64, at: Option<u64>) -> bool {
        if s.dead || s.power_off.load(Ordering::SeqCst) {
            return true;
        }
        s.ios += 1;
        let nth = match s.fault {
            Some(Fault::Error { at }) => at == s.ios,
            Some(Fault::PowerLoss { at }) => {
                s.dead = at == s.ios;
                if s.dead {
                    s.power_off.store(true, Ordering::SeqCst);
                }
                s.dead
            }
            None => false,
        };
        if nth {
            s.struck_at = Some(s.ios);
        }
        let fire = nth || s.fail_all || at == Some(count);
        if fire {
            s.injected += 1;
            s.fail_all |= s.sticky;
        }
        fire
    }
}

impl Storage for FaultyBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.0.backend.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let s = self.lock();
        if let Some(errno) = s.read_errno {
            return Err(injected("read", errno));
        }
        if s.fail_all {
            return Err(injected("read", 5));
        }
        // A read past the end is an EOF, as a file gives (redb's in-memory backend reports
        // an index out of range instead); the live image mirrors the inner backend's length.
        let end = offset.saturating_add(out.len() as u64);
        if end > s.live.len() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        }
        drop(s);
        self.0.backend.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut s = self.lock();
        s.set_lens += 1;
        if self.check(&mut s, 0, None) {
            return Err(injected("set_len", 28));
        }
        self.0.backend.set_len(len)?;
        apply(&mut s.live, &Pending::SetLen(len));
        s.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut s = self.lock();
        s.syncs += 1;
        let count = s.syncs;
        s.blocked += 1;
        self.0.cond.notify_all();
        while s.gate_closed {
            s = self.0.cond.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.blocked -= 1;
        let at = s.fail_sync_at;
        if self.check(&mut s, count, at) {
            return Err(injected("sync", 5));
        }
        self.0.backend.sync_data()?;
        let pending = std::mem::take(&mut s.pending);
        for change in &pending {
            apply(&mut s.durable, change);
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut s = self.lock();
        s.writes += 1;
        let (count, at) = (s.writes, s.fail_write_at);
        if self.check(&mut s, count, at) {
            return Err(injected("write", 28));
        }
        self.0.backend.write(offset, data)?;
        let change = Pending::Write(offset, data.to_vec());
        apply(&mut s.live, &change);
        s.pending.push(change);
        Ok(())
    }

    fn close(&self) -> Result<(), io::Error> {
        self.0.backend.close()
    }
    // The engine locks its storage whole; the inner backend gives real file locks, so a
    // second open of the same file is refused.
    fn try_lock(&self, kind: LockKind) -> Result<bool, io::Error> {
        let (a, b) = (Bound::Unbounded, Bound::Unbounded);
        match kind {
            LockKind::Shared => self.0.backend.try_lock_shared_range(a, b),
            _ => self.0.backend.try_lock_range(a, b),
        }
        .map_err(lock_io)
    }
    fn unlock(&self) -> Result<(), io::Error> {
        let (a, b) = (Bound::Unbounded, Bound::Unbounded);
        self.0.backend.unlock_range(a, b).map_err(lock_io)
    }
}

/// A lock error of the inner backend as the I/O error [`Storage`] reports.
fn lock_io(e: BackendError) -> io::Error {
    match e {
        BackendError::Io(io) => io,
        BackendError::Unsupported => io::Error::from(io::ErrorKind::Unsupported),
        other => io::Error::other(other.to_string()),
    }
}

// ---------------------------------------------------------------------------------------
// Assertions shared by the suites: unwrap a claim into the answer the test expects.
// ---------------------------------------------------------------------------------------

#[track_caller]
pub fn acquired(claim: idemkv::Claim) -> idemkv::Lease {
    match claim {
        idemkv::Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[track_caller]
pub fn in_progress(claim: idemkv::Claim) -> idemkv::Busy {
    match claim {
        idemkv::Claim::InProgress(busy) => busy,
        other => panic!("expected InProgress, got {other:?}"),
    }
}

#[track_caller]
pub fn completed(claim: idemkv::Claim) -> idemkv::Stored {
    match claim {
        idemkv::Claim::Completed(stored) => stored,
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// The response stored under `key`, or `None` when the key is Absent (the claim that found
/// it so is released again). Any other answer fails the test.
#[track_caller]
pub fn stored_response(engine: &idemkv::Engine, key: &str) -> Option<Vec<u8>> {
    match engine.claim(key.as_bytes(), &idemkv::ClaimOptions::default()) {
        Ok(idemkv::Claim::Completed(stored)) => Some(stored.response().to_vec()),
        Ok(idemkv::Claim::Acquired(lease)) => {
            if let Err(e) = lease.release() {
                panic!("{key}: release: {e}");
            }
            None
        }
        other => panic!("{key}: expected Completed or Acquired, got {other:?}"),
    }
}

/// Waits (in real time, bounded) until `cond` holds: for another thread to reach a point.
#[track_caller]
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < give_up,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}
