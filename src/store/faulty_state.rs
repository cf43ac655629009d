//! The state of the fault-injecting storage (`faulty.rs`, its I/O in `faulty_io.rs`): the
//! counters and armed failures, the fault clock that decides which call fails, and the live
//! and durable images.
//!
//! Invariants:
//! - The live image holds the medium's bytes: in memory it is the storage itself; over a
//!   file every change is made to the file first and mirrored only once it succeeded.
//! - Every change since the last successful sync is in `pending`, in order, so the durable
//!   image plus `pending` is the live image.
//! - A change is checked against the address space before it is made (at most
//!   `isize::MAX` bytes, what a `Vec` holds), so applying it to an image never overflows.

use crate::base::sync::plain::{AtomicBool, Condvar, Mutex};
use crate::base::sync::{Arc, Ordering};
use crate::store::backend::Storage;
use crate::store::redb_io::FileStorage;
use std::io;

/// When and how a [`crate::fault::FaultyStorage`] fails at a given I/O
/// ([`crate::fault::FaultyStorage::set_fault`]).
///
/// I/Os are the storage's `write`, `set_len` and `sync_data` calls made while the power was
/// on, numbered from 1 over its life ([`crate::fault::FaultyStorage::ios`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The I/O numbered `at` fails once (ENOSPC for a write or `set_len`, EIO for a sync);
    /// later ones succeed, and the process lives on.
    Error {
        /// Which I/O, from 1.
        at: u64,
    },
    /// Power is lost at the I/O numbered `at`: it and every later write, `set_len` and sync
    /// fail (reads still answer from what the OS holds). The machine is gone; a test reopens
    /// from one of the storage's images.
    PowerLoss {
        /// Which I/O, from 1.
        at: u64,
    },
}

/// Where a fault-injecting storage keeps its bytes.
pub(crate) enum Medium {
    /// In memory: the live image is the storage.
    Memory,
    /// A file, with its locks; the images mirror it.
    File(FileStorage),
}

/// What the handles of one storage share.
pub(crate) struct Inner {
    pub(crate) medium: Medium,
    pub(crate) state: Mutex<State>,
    /// Signalled when the gate opens and when a sync arrives at it.
    pub(crate) cond: Condvar,
}

/// One change made since the last successful sync (for `FaultyStorage::crash_image`).
#[derive(Debug, Clone)]
pub(crate) enum Pending {
    /// The bytes written at an offset.
    Write(usize, Vec<u8>),
    /// A new length.
    SetLen(usize),
}

/// The counters, armed failures and images of one storage.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Writes, `set_len`s and syncs made while the power was on (the [`Fault`] clock).
    pub(crate) ios: u64,
    pub(crate) fault: Option<Fault>,
    /// The power is off: a [`Fault::PowerLoss`] struck this storage.
    pub(crate) dead: bool,
    /// The machine's power, shared by the storages of one machine
    /// (`FaultyStorage::share_power`): a power loss at one storage's I/O stops the others'
    /// I/O at the same instant.
    pub(crate) power_off: Arc<AtomicBool>,
    /// The I/O number at which the armed [`Fault`] struck, once it has.
    pub(crate) struck_at: Option<u64>,
    pub(crate) writes: u64,
    pub(crate) set_lens: u64,
    pub(crate) syncs: u64,
    /// Fail the write whose 1-based count equals this.
    pub(crate) fail_write_at: Option<u64>,
    /// Fail the sync whose 1-based count equals this.
    pub(crate) fail_sync_at: Option<u64>,
    pub(crate) fail_all: bool,
    /// Every read fails with this OS error number.
    pub(crate) read_errno: Option<i32>,
    pub(crate) sticky: bool,
    pub(crate) injected: u64,
    pub(crate) live: Vec<u8>,
    pub(crate) durable: Vec<u8>,
    pub(crate) pending: Vec<Pending>,
    pub(crate) gate_closed: bool,
    /// Syncs held at the gate (or about to check it).
    pub(crate) blocked: usize,
}

impl State {
    /// Counts a call and decides whether it fails; `at` is its armed failure, if any, and
    /// `count` its own count. The [`Fault`] clock ticks first: a dead disk fails every call,
    /// and the armed [`Fault`] strikes at its I/O number.
    pub(crate) fn check(&mut self, count: u64, at: Option<u64>) -> bool {
        if self.dead || self.power_off.load(Ordering::SeqCst) {
            return true;
        }
        self.ios += 1;
        let nth = match self.fault {
            Some(Fault::Error { at }) => at == self.ios,
            Some(Fault::PowerLoss { at }) => {
                self.dead = at == self.ios;
                if self.dead {
                    self.power_off.store(true, Ordering::SeqCst);
                }
                self.dead
            }
            None => false,
        };
        if nth {
            self.struck_at = Some(self.ios);
        }
        let fire = nth || self.fail_all || at == Some(count);
        if fire {
            self.injected += 1;
            self.fail_all |= self.sticky;
        }
        fire
    }
}

impl Pending {
    /// Makes this change to `image`. A change that grows it past its length zero-fills the
    /// gap, as a file does.
    pub(crate) fn apply(&self, image: &mut Vec<u8>) {
        match self {
            Pending::SetLen(len) => resize(image, *len),
            Pending::Write(offset, data) => {
                let end = offset.saturating_add(data.len());
                if image.len() < end {
                    resize(image, end);
                }
                if let Some(target) = image.get_mut(*offset..end) {
                    target.copy_from_slice(data);
                }
            }
        }
    }
}

/// Sets `image`'s length to `len`, zeros where it grows. A commit log is 16 MiB of zeros at
/// first: `Vec::resize` fills it byte by byte in a debug build, a zeroed allocation and one
/// copy do not.
fn resize(image: &mut Vec<u8>, len: usize) {
    if len <= image.len() {
        image.truncate(len);
        return;
    }
    let mut grown = vec![0; len];
    if let Some(head) = grown.get_mut(..image.len()) {
        head.copy_from_slice(image);
    }
    *image = grown;
}

/// An offset or a length as an index into an image: at most `isize::MAX`, the most a `Vec`
/// holds. Anything larger is refused as redb's in-memory backend refuses it.
pub(crate) fn index(value: u64) -> io::Result<usize> {
    usize::try_from(value)
        .ok()
        .filter(|&v| isize::try_from(v).is_ok())
        .ok_or_else(out_of_range)
}

pub(crate) fn out_of_range() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "offset or length out of range")
}

/// The whole content of `file`: the first live and durable image of a file storage.
pub(crate) fn read_whole(file: &FileStorage) -> io::Result<Vec<u8>> {
    let mut image = vec![0; index(file.len()?)?];
    file.read(0, &mut image)?;
    Ok(image)
}
