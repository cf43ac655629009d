//! Tuning constants of the in-memory index.

/// Side-data boxes a stripe keeps for reuse (`shard/`). A claim allocates one for its
/// InFlight slot and the completion's publication frees it, usually on another thread:
/// both sides pay glibc's paths under the stripe lock. Kept boxes are counted in the
/// stripe's memory (about 1.5 KB per stripe at most).
pub(crate) const SPARE_EXTRAS_PER_STRIPE: usize = 8;
/// Stale entries a settling lease pops off the top of its stripe's lease heap (one lookup
/// each): more than the one it leaves, so the heap drains whenever its top is stale.
pub(crate) const EXPIRY_TRIM_MAX: usize = 4;
