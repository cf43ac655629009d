//! Limits and tuning constants that every layer may read: the hash secret's length, how
//! stale a clock's wall offset may get.

/// Oldest the system clock's wall offset may be before a transition measures it again
/// (`clock::Time`): a step of the wall clock shows in readings within this long. Reading
/// the wall clock costs a transition as much as the monotonic read it derives from; at
/// this age the re-measurement is ten reads a second, whatever the load.
pub(crate) const WALL_OFFSET_AGE_NS_MAX: u64 = 100_000_000;
/// Bytes of the secret that keys the index's hashes (two SipHash keys of 16 bytes: one for
/// the table and stripe hash, one for the markers' second hash), kept in the file's meta
/// table so that hashes are the same after a restart.
pub(crate) const HASH_SECRET_LEN: usize = 32;
