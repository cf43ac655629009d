//! The I/O side of the fault-injecting storage (`faulty.rs`): its state, the fault clock
//! that decides which call fails, the live and durable images, and the [`Storage`] calls
//! the engine makes.
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
use crate::store::backend::{LockKind, Storage};
use crate::store::constants::{INJECTED_IO_ERRNO, INJECTED_WRITE_ERRNO};
use crate::store::faulty::{Fault, FaultyStorage};
use crate::store::storage::FileStorage;
use std::io;

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
    fn check(&mut self, count: u64, at: Option<u64>) -> bool {
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
fn index(value: u64) -> io::Result<usize> {
    usize::try_from(value)
        .ok()
        .filter(|&v| isize::try_from(v).is_ok())
        .ok_or_else(out_of_range)
}

fn out_of_range() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "offset or length out of range")
}

/// An injected failure: ENOSPC for writes and `set_len`, EIO for syncs and reads.
fn injected(what: &str, errno: i32) -> io::Error {
    let os = io::Error::from_raw_os_error(errno);
    io::Error::new(os.kind(), format!("injected {what} failure: {os}"))
}

/// The whole content of `file`: the first live and durable image of a file storage.
pub(crate) fn read_whole(file: &FileStorage) -> io::Result<Vec<u8>> {
    let mut image = vec![0; index(file.len()?)?];
    file.read(0, &mut image)?;
    Ok(image)
}

impl Storage for FaultyStorage {
    fn len(&self) -> io::Result<u64> {
        match &self.0.medium {
            Medium::Memory => Ok(self.lock().live.len() as u64),
            Medium::File(file) => file.len(),
        }
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let s = self.lock();
        if let Some(errno) = s.read_errno {
            return Err(injected("read", errno));
        }
        if s.fail_all {
            return Err(injected("read", INJECTED_IO_ERRNO));
        }
        // A read past the end is an EOF, as a file gives; the live image has the medium's
        // length.
        let past_end = || io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end");
        let end = offset.saturating_add(out.len() as u64);
        if end > s.live.len() as u64 {
            return Err(past_end());
        }
        match &self.0.medium {
            Medium::Memory => {
                let start = index(offset)?;
                let end = start.saturating_add(out.len());
                out.copy_from_slice(s.live.get(start..end).ok_or_else(past_end)?);
                Ok(())
            }
            Medium::File(file) => {
                drop(s);
                file.read(offset, out)
            }
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.lock();
        s.set_lens += 1;
        if s.check(0, None) {
            return Err(injected("set_len", INJECTED_WRITE_ERRNO));
        }
        let change = Pending::SetLen(index(len)?);
        if let Medium::File(file) = &self.0.medium {
            file.set_len(len)?;
        }
        change.apply(&mut s.live);
        s.pending.push(change);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut s = self.lock();
        s.syncs += 1;
        let count = s.syncs;
        s.blocked += 1;
        self.0.cond.notify_all();
        while s.gate_closed {
            self.0.cond.wait(&mut s);
        }
        s.blocked -= 1;
        let at = s.fail_sync_at;
        if s.check(count, at) {
            return Err(injected("sync", INJECTED_IO_ERRNO));
        }
        if let Medium::File(file) = &self.0.medium {
            file.sync_data()?;
        }
        let pending = std::mem::take(&mut s.pending);
        for change in &pending {
            change.apply(&mut s.durable);
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.lock();
        s.writes += 1;
        let (count, at) = (s.writes, s.fail_write_at);
        if s.check(count, at) {
            return Err(injected("write", INJECTED_WRITE_ERRNO));
        }
        let start = index(offset)?;
        let end = index(
            offset
                .checked_add(data.len() as u64)
                .ok_or_else(out_of_range)?,
        )?;
        match &self.0.medium {
            // As redb's in-memory backend: a write lands within the length set before it.
            Medium::Memory if end > s.live.len() => return Err(out_of_range()),
            Medium::Memory => {}
            Medium::File(file) => file.write(offset, data)?,
        }
        let change = Pending::Write(start, data.to_vec());
        change.apply(&mut s.live);
        s.pending.push(change);
        Ok(())
    }

    fn close(&self) -> io::Result<()> {
        match &self.0.medium {
            Medium::Memory => Ok(()),
            Medium::File(file) => file.close(),
        }
    }

    // The engine locks its storage whole. A file gives real locks, so a second open of the
    // same file is refused; memory has none, which redb accepts in its exclusive-writer mode.
    fn try_lock(&self, kind: LockKind) -> io::Result<bool> {
        match &self.0.medium {
            Medium::Memory => Err(io::ErrorKind::Unsupported.into()),
            Medium::File(file) => file.try_lock(kind),
        }
    }

    fn unlock(&self) -> io::Result<()> {
        match &self.0.medium {
            Medium::Memory => Err(io::ErrorKind::Unsupported.into()),
            Medium::File(file) => file.unlock(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn memory_reads_what_was_written_and_eof_past_the_end() {
        let s = FaultyStorage::memory();
        s.set_len(8).unwrap();
        s.write(2, b"abc").unwrap();
        let mut out = [9; 8];
        s.read(0, &mut out).unwrap();
        assert_eq!(&out, b"\0\0abc\0\0\0");
        assert_eq!(s.len().unwrap(), 8);
        let e = s.read(6, &mut [0; 3]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = s.write(7, b"xy").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = s.set_len(u64::MAX).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            s.live_image().len(),
            8,
            "refused changes leave the image as it was"
        );
    }

    #[test]
    fn only_synced_changes_are_durable_and_crash_image_picks_pending_ones() {
        let s = FaultyStorage::memory();
        s.set_len(4).unwrap();
        s.write(0, b"ab").unwrap();
        s.sync_data().unwrap();
        s.write(0, b"x").unwrap();
        s.write(3, b"y").unwrap();
        assert_eq!(s.durable_image(), b"ab\0\0");
        assert_eq!(s.live_image(), b"xb\0y");
        assert_eq!(s.pending(), 2);
        assert_eq!(s.crash_image(|i| i == 1), b"ab\0y");
        let reopened = FaultyStorage::from_image(s.crash_image(|_| true));
        assert_eq!(reopened.durable_image(), s.live_image());
    }

    #[test]
    fn armed_failures_strike_at_their_call() {
        let s = FaultyStorage::memory();
        s.set_len(4).unwrap();
        s.fail_write_in(2);
        s.write(0, b"a").unwrap();
        let e = s.write(0, b"b").unwrap_err();
        assert!(e.to_string().contains("injected write"), "{e}");
        s.write(0, b"c").unwrap();
        s.fail_sync_in(1);
        assert!(s.sync_data().is_err());
        s.sync_data().unwrap();
        assert_eq!((s.writes(), s.syncs(), s.injected()), (3, 2, 2));
        assert_eq!(s.durable_image(), b"c\0\0\0");
    }

    #[test]
    fn power_loss_stops_every_storage_on_the_same_power() {
        let (file, log) = (FaultyStorage::memory(), FaultyStorage::memory());
        log.share_power(&file);
        file.set_fault(Some(Fault::PowerLoss { at: 2 }));
        file.set_len(1).unwrap();
        assert!(file.sync_data().is_err());
        assert_eq!(file.struck_at(), Some(2));
        assert!(log.power_lost());
        assert!(log.set_len(1).is_err());
        assert_eq!(file.ios(), 2, "no I/O is counted once the power is off");
        assert_eq!(
            file.durable_image(),
            b"",
            "the lost sync made nothing durable"
        );
    }

    #[test]
    fn a_closed_gate_holds_syncs_until_dropped() {
        let s = FaultyStorage::memory();
        let gate = s.close_gate();
        assert!(!s.wait_blocked(Duration::from_millis(1)));
        let syncer = {
            let s = s.clone();
            std::thread::spawn(move || s.sync_data())
        };
        assert!(s.wait_blocked(Duration::from_secs(10)));
        drop(gate);
        syncer.join().unwrap().unwrap();
        assert_eq!(s.syncs(), 1);
    }

    #[test]
    fn reads_fail_as_armed() {
        let s = FaultyStorage::from_image(b"abcd");
        s.fail_reads_with(Some(13));
        let e = s.read(0, &mut [0; 2]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        s.fail_reads_with(None);
        s.fail_all(true);
        assert!(s.read(0, &mut [0; 2]).is_err());
        s.heal();
        let mut out = [0; 2];
        s.read(2, &mut out).unwrap();
        assert_eq!(&out, b"cd");
    }
}
