//! The commit log's sync thread: makes a written frame durable while the writer applies the
//! same batch to the file.
//!
//! A logged group commit has two independent parts: the log's fdatasync (I/O wait) and the
//! batch's non-durable commit to the redb file (CPU). Run one after the other, a commit
//! cycle is their sum; run side by side, it is the longer of the two. The writer hands the
//! sync to this thread, commits to the file, then waits for the sync before it publishes
//! or acknowledges anything.
//!
//! Invariants:
//! - At most one sync is pending: the writer waits for it before it writes the next frame,
//!   so frames still become durable in order and only the last can be torn.
//! - Nothing of a batch is published or acknowledged before its frame's sync returned
//!   `Ok`. The file may hold a batch whose sync then failed: that batch was never
//!   acknowledged, the engine is poisoned, and a replay skips the frames the file holds.

use crate::backend::Storage;
use crate::sync::channel::{bounded, Receiver, Sender};
use crate::sync::{Arc, JoinHandle};
use std::io;

/// The handle the log keeps on its sync thread. Dropping it stops the thread once a
/// pending sync has returned.
pub(crate) struct LogSync {
    start: Option<Sender<()>>,
    done: Receiver<io::Result<()>>,
    thread: Option<JoinHandle<()>>,
    pending: bool,
}

impl LogSync {
    /// Starts the thread that syncs `storage`.
    pub(crate) fn spawn(storage: Arc<dyn Storage>) -> io::Result<LogSync> {
        // Capacity one each way: one sync is pending at most.
        let (start, started) = bounded::<()>(1);
        let (finished, done) = bounded(1);
        let thread = crate::sync::spawn("idemkv-log-sync", move || {
            while started.recv().is_ok() {
                if finished.send(storage.sync_data()).is_err() {
                    return;
                }
            }
        })?;
        Ok(LogSync {
            start: Some(start),
            done,
            thread: Some(thread),
            pending: false,
        })
    }

    /// Starts a sync of everything written so far.
    pub(crate) fn start(&mut self) -> io::Result<()> {
        debug_assert!(!self.pending, "one sync is pending at most");
        let sent = self.start.as_ref().is_some_and(|s| s.send(()).is_ok());
        if !sent {
            return Err(stopped());
        }
        self.pending = true;
        Ok(())
    }

    /// Waits for the sync started last; `Ok` when none is pending.
    pub(crate) fn wait(&mut self) -> io::Result<()> {
        if !std::mem::take(&mut self.pending) {
            return Ok(());
        }
        self.done.recv().unwrap_or_else(|_| Err(stopped()))
    }
}

/// The thread ended without answering: it panicked inside the storage's `sync_data`.
fn stopped() -> io::Error {
    io::Error::other("the commit log's sync thread stopped")
}

impl Drop for LogSync {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop; a panic in it was already reported
        // as a failed sync.
        drop(self.start.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A storage that counts syncs and fails the ones it is told to.
    #[derive(Debug, Default)]
    struct Syncs {
        count: AtomicU64,
        fail_at: Mutex<Option<u64>>,
    }

    impl Storage for Syncs {
        fn len(&self) -> io::Result<u64> {
            Ok(0)
        }
        fn read(&self, _: u64, _: &mut [u8]) -> io::Result<()> {
            Ok(())
        }
        fn set_len(&self, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn sync_data(&self) -> io::Result<()> {
            let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
            match *self.fail_at.lock() == Some(n) {
                true => Err(io::Error::other("sync failed on purpose")),
                false => Ok(()),
            }
        }
        fn write(&self, _: u64, _: &[u8]) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_wait_returns_the_result_of_its_own_sync() {
        let storage = Arc::new(Syncs::default());
        *storage.fail_at.lock() = Some(2);
        let mut sync = LogSync::spawn(storage.clone()).unwrap();
        assert!(sync.wait().is_ok(), "nothing pending");
        sync.start().unwrap();
        assert!(sync.wait().is_ok());
        sync.start().unwrap();
        assert!(sync.wait().is_err(), "the second sync failed");
        sync.start().unwrap();
        assert!(sync.wait().is_ok());
        assert!(sync.wait().is_ok(), "a result is returned once");
        assert_eq!(storage.count.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_drop_with_a_sync_pending_lets_it_finish_and_joins() {
        let storage = Arc::new(Syncs::default());
        let mut sync = LogSync::spawn(storage.clone()).unwrap();
        sync.start().unwrap();
        drop(sync);
        assert_eq!(storage.count.load(Ordering::SeqCst), 1);
    }
}
