//! The I/O of the fault-injecting storage (`faulty.rs`): the [`Storage`] calls the engine
//! makes, each counted and checked against the armed failures (`faulty_state.rs`) before it
//! reaches the medium.

use crate::store::backend::{LockKind, Storage};
use crate::store::constants::{INJECTED_IO_ERRNO, INJECTED_WRITE_ERRNO};
use crate::store::faulty::FaultyStorage;
use crate::store::faulty_state::{index, out_of_range, Medium, Pending};
use std::io;

/// An injected failure: ENOSPC for writes and `set_len`, EIO for syncs and reads.
fn injected(what: &str, errno: i32) -> io::Error {
    let os = io::Error::from_raw_os_error(errno);
    io::Error::new(os.kind(), format!("injected {what} failure: {os}"))
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
    use crate::store::faulty_state::Fault;
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
