//! One key's state in memory (a slot) and its rare parts (the side data): the values the
//! state machine decides on and the index keeps.

use crate::base::sync::Arc;
use crate::model::codec::Checkpoint;

pub(crate) const INFLIGHT: u8 = 1;

pub(crate) const PUBLISHED: u8 = 2;

pub(crate) const HAS_EXTRA: u8 = 4;

/// An InFlight slot whose lease was seen to end: it no longer counts against the in-flight
/// limit, and it waits in `ended` to be taken over or reaped.
pub(crate) const ABANDONED: u8 = 8;

/// One key's state in memory. Absent keys have no slot.
///
/// Besides the state, a slot in the table carries its key's table tag ([`Key`]) in what
/// would otherwise be padding, so that growing the table never reads or hashes a key again.
/// Equality compares the state only.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    /// Fencing token of the claim that owns (or completed) the key.
    pub(crate) token: u64,
    /// InFlight: monotonic end of the lease. Completed: monotonic end of retention; the key
    /// is Absent from this instant on. In ns.
    pub(crate) deadline_ns: u64,
    pub(crate) attempt: u32,
    pub(crate) flags: u8,
    /// The key's table tag, little-endian; set by the table on the way in.
    pub(crate) tag: [u8; 3],
}

// The tag lives in the padding: a slot stays 24 bytes.
const _: () = assert!(std::mem::size_of::<Slot>() == 24);

impl PartialEq for Slot {
    fn eq(&self, other: &Self) -> bool {
        self.token == other.token
            && self.deadline_ns == other.deadline_ns
            && self.attempt == other.attempt
            && self.flags == other.flags
    }
}

impl Eq for Slot {}

impl Slot {
    pub(crate) fn inflight(token: u64, deadline_ns: u64, attempt: u32) -> Self {
        Self {
            token,
            deadline_ns,
            attempt,
            flags: INFLIGHT,
            tag: [0; 3],
        }
    }

    /// A completed slot; `published` once the completion is durable under the mode. An
    /// unpublished completion is never shown to another caller (invariant 5).
    pub(crate) fn completed(token: u64, expires_ns: u64, attempt: u32, published: bool) -> Self {
        Self {
            token,
            deadline_ns: expires_ns,
            attempt,
            flags: if published { PUBLISHED } else { 0 },
            tag: [0; 3],
        }
    }

    pub(crate) fn is_inflight(&self) -> bool {
        self.flags & INFLIGHT != 0
    }

    pub(crate) fn is_published(&self) -> bool {
        self.flags & PUBLISHED != 0
    }

    pub(crate) fn has_extra(&self) -> bool {
        self.flags & HAS_EXTRA != 0
    }

    /// True for an InFlight slot whose lease the engine has seen end (and that nobody took
    /// over since): it is not counted against the in-flight limit.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.flags & ABANDONED != 0
    }

    /// True when retention has run out at `now_ns`: the key is Absent to every call. A live
    /// lease never expires this way; only completed keys do.
    pub(crate) fn is_expired(&self, now_ns: u64) -> bool {
        !self.is_inflight() && now_ns >= self.deadline_ns
    }

    /// The same slot with its lease seen to end, as the index marks it.
    #[cfg(any(test, idemkv_sabotage))]
    pub(crate) fn into_abandoned(mut self) -> Self {
        self.flags |= ABANDONED;
        self
    }
}
/// The rare parts of a slot, kept beside it by token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Extra {
    pub(crate) fingerprint: Option<u128>,
    pub(crate) checkpoint: Option<Checkpoint>,
    /// The response of a completed key in a memory-only engine.
    pub(crate) response: Option<Arc<[u8]>>,
    /// Wall-clock end of retention of a completion whose record is not in the file (memory
    /// only, or not yet published), for reports.
    pub(crate) expires_wall_ms: u64,
    /// The key's own retention, in ms, when its claim or completion chose one (`None`: the
    /// engine's). A lease hands it to its completion and its takeover, and is reaped this
    /// long after it ended; a completion's deadline already applies it, and it decides
    /// which expiry queue the completion waits in.
    pub(crate) retention_ms: Option<u64>,
    /// Wall-clock instant (ms) of the key's first claim, kept across takeovers and fails;
    /// 0: unknown (a record of the first format). Kept for a completion only while its
    /// record is not in the file.
    pub(crate) first_claimed_wall_ms: u64,
    /// Wall-clock instant (ms) the current attempt started (InFlight); 0: unknown.
    pub(crate) attempt_started_wall_ms: u64,
    /// The holder failed the attempt (`Lease::fail`): its lease ended, its progress kept.
    pub(crate) failed: bool,
    /// Wall-clock instant (ms) a lease ended when it was already over in the file it was
    /// loaded from (recovery, import): such a lease's monotonic deadline is the instant it
    /// was loaded, which says when it could be taken over, not when it ended. 0: the lease
    /// ends at its deadline. Reports only.
    pub(crate) ended_wall_ms: u64,
    /// Wall-clock instant of that completion, for the marker it leaves (a memory-only
    /// engine's; a durable engine's marker takes it from the record).
    pub(crate) completed_wall_ms: u64,
    /// The lease length in ms the InFlight key's holder was given (its claim's, its last
    /// extension's or renewal's); `None`: the engine's lease (a lease loaded from a record
    /// of format 1 or 2, which did not keep it).
    pub(crate) lease_ms: Option<u64>,
    /// The claim identity the InFlight key's holder presented (`ClaimOptions::claim_id`):
    /// a claim presenting it again resumes the lease.
    pub(crate) claim_id: Option<u128>,
}

impl Extra {
    pub(crate) fn is_empty(&self) -> bool {
        self.fingerprint.is_none()
            && self.checkpoint.is_none()
            && self.response.is_none()
            && self.expires_wall_ms == 0
            && self.retention_ms.is_none()
            && self.first_claimed_wall_ms == 0
            && self.attempt_started_wall_ms == 0
            && !self.failed
            && self.ended_wall_ms == 0
            && self.completed_wall_ms == 0
            && self.lease_ms.is_none()
            && self.claim_id.is_none()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.checkpoint.as_ref().map_or(0, |c| c.data().len())
            + self.response.as_ref().map_or(0, |r| r.len())
    }
}
