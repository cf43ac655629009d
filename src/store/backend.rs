//! The storage the engine keeps a file or a commit log in when it is not a file at a path:
//! a resizable byte array with a durability barrier. The store adapts it to redb
//! (`redb_io.rs`); the commit log's own file implements it too (`log_file.rs`). It is
//! crate-private: the one custom storage a user can give the builder is the fault-injecting
//! `FaultyStorage` (`faulty.rs`).

use std::fmt;
use std::io;

/// The kind of lock an open takes on a [`Storage`] for as long as it uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// An engine that writes: no other opener may hold any lock.
    Exclusive,
    /// A read-only view: other read-only views may hold one too.
    Shared,
}

/// Where the engine keeps its file, or its commit log, when it is not a file at a path
/// (the fault-injecting storage given to [`crate::fault::WithStorage::backend`], the commit
/// log's own file).
///
/// Offsets and lengths are in bytes. The engine calls these methods from its writer thread,
/// its opens and its close (which may compact the storage's content after the engine's last
/// commit), never concurrently with a `close`.
// `len` is the storage's size in bytes, not a collection's count: no `is_empty`.
#[allow(clippy::len_without_is_empty)]
pub(crate) trait Storage: fmt::Debug + Send + Sync + 'static {
    /// The current length.
    fn len(&self) -> io::Result<u64>;

    /// Fills `out` with the bytes at `offset`. A range past the end is an error (of kind
    /// `UnexpectedEof`, which the engine reports as a damaged file).
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()>;

    /// Sets the length; new bytes read as zero.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Makes every earlier `write` and `set_len` durable. A commit is acknowledged only
    /// after this returns `Ok`.
    fn sync_data(&self) -> io::Result<()>;

    /// Writes `data` at `offset` (not durable until the next `sync_data`).
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Called once when the engine is done with the storage; releases any lock it holds.
    fn close(&self) -> io::Result<()> {
        Ok(())
    }

    /// Tries to lock the whole storage: `Ok(true)` when acquired, `Ok(false)` when another
    /// opener holds a conflicting lock (the open then fails with
    /// [`crate::OpenError::AlreadyOpen`]). The default acquires at once, for a storage that
    /// nothing else can reach.
    fn try_lock(&self, kind: LockKind) -> io::Result<bool> {
        let _ = kind;
        Ok(true)
    }

    /// Releases the lock taken by [`Storage::try_lock`].
    fn unlock(&self) -> io::Result<()> {
        Ok(())
    }
}
