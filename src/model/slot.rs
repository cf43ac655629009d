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
/// A slot's side data: what a slot's 24 bytes do not hold, kept in a box its table entry
/// points to.
///
/// Every InFlight key has one (its instants and lease length), and so has a completed key
/// of a memory-only engine (its response and instants), so its size is memory per key: the
/// parts a claim or completion sets every time are inline, and the rare parts only some
/// callers use (a checkpoint, a claim identity, a recovered lease's end) sit in a second
/// allocation ([`RareParts`]), made when one is set. The fingerprint is inline because the
/// HTTP layer and typed calls set one on every key; it is stored as two words and a flag
/// so that the struct needs no 16-byte alignment (an `Option<u128>` takes 32 bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Extra {
    /// The request fingerprint (read and set by the methods).
    pub(crate) fp: PackedFingerprint,
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
    /// Wall-clock instant of that completion, for the marker it leaves (a memory-only
    /// engine's; a durable engine's marker takes it from the record).
    pub(crate) completed_wall_ms: u64,
    /// The lease length in ms the InFlight key's holder was given (its claim's, its last
    /// extension's or renewal's); `None`: the engine's lease (a lease loaded from a record
    /// of format 1 or 2, which did not keep it).
    pub(crate) lease_ms: Option<u64>,
    /// The parts few keys have (read and set by the methods).
    pub(crate) rare: RareParts,
}

/// An `Option<u128>` in two words and a flag: 8-byte aligned, 24 bytes instead of 32.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PackedFingerprint {
    /// The fingerprint's halves (low, high), meaningful when `set`.
    words: [u64; 2],
    set: bool,
}

/// The parts of [`Extra`] only some keys have: `None` while all of them are unset. Shared,
/// so that the copy of the side data every holder's update starts from (an extension, a
/// renewal, a checkpoint) costs a count, not an allocation; a change copies them first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RareParts(Option<Arc<Rare>>);

/// The parts of [`Extra`] only some keys have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Rare {
    checkpoint: Option<Checkpoint>,
    /// The claim identity the InFlight key's holder presented (`ClaimOptions::claim_id`):
    /// a claim presenting it again resumes the lease.
    claim_id: Option<u128>,
    /// Wall-clock instant (ms) a lease ended when it was already over in the file it was
    /// loaded from (recovery, import): such a lease's monotonic deadline is the instant it
    /// was loaded, which says when it could be taken over, not when it ended. 0: the lease
    /// ends at its deadline. Reports only.
    ended_wall_ms: u64,
}

impl Rare {
    fn is_empty(&self) -> bool {
        self.checkpoint.is_none() && self.claim_id.is_none() && self.ended_wall_ms == 0
    }
}

// Memory per key: every InFlight key, and a memory-only engine's completed key, has one.
// 120 bytes are a 128-byte block of glibc's allocator; with the rare parts inline it was
// 192 bytes, a 208-byte block.
const _: () = assert!(std::mem::size_of::<Extra>() <= 120);

impl Extra {
    /// The request fingerprint the key's claim or completion carried.
    pub(crate) fn fingerprint(&self) -> Option<u128> {
        let [lo, hi] = self.fp.words;
        self.fp.set.then(|| u128::from(lo) | (u128::from(hi) << 64))
    }

    pub(crate) fn set_fingerprint(&mut self, fingerprint: Option<u128>) {
        let fp = fingerprint.unwrap_or(0);
        // Truncation is the point: the two halves.
        #[allow(clippy::cast_possible_truncation)]
        let words = [fp as u64, (fp >> 64) as u64];
        self.fp = PackedFingerprint {
            words,
            set: fingerprint.is_some(),
        };
    }

    /// This side data with `fingerprint` set.
    pub(crate) fn with_fingerprint(mut self, fingerprint: Option<u128>) -> Self {
        self.set_fingerprint(fingerprint);
        self
    }

    /// This side data with `checkpoint` set.
    pub(crate) fn with_checkpoint(mut self, checkpoint: Option<Checkpoint>) -> Self {
        self.set_checkpoint(checkpoint);
        self
    }

    /// This side data with `claim_id` set.
    pub(crate) fn with_claim_id(mut self, claim_id: Option<u128>) -> Self {
        self.set_claim_id(claim_id);
        self
    }

    /// This side data with `ended_wall_ms` set.
    pub(crate) fn with_ended_wall_ms(mut self, ended_wall_ms: u64) -> Self {
        self.set_ended_wall_ms(ended_wall_ms);
        self
    }

    /// The holder's last checkpoint.
    pub(crate) fn checkpoint(&self) -> Option<&Checkpoint> {
        self.rare.0.as_ref().and_then(|r| r.checkpoint.as_ref())
    }

    pub(crate) fn set_checkpoint(&mut self, checkpoint: Option<Checkpoint>) {
        let set = checkpoint.is_some();
        self.change_rare(set, |r| r.checkpoint = checkpoint);
    }

    /// The claim identity the InFlight key's holder presented.
    pub(crate) fn claim_id(&self) -> Option<u128> {
        self.rare.0.as_ref().and_then(|r| r.claim_id)
    }

    pub(crate) fn set_claim_id(&mut self, claim_id: Option<u128>) {
        self.change_rare(claim_id.is_some(), |r| r.claim_id = claim_id);
    }

    /// Wall-clock instant (ms) a lease loaded already over ended; 0: at its deadline.
    pub(crate) fn ended_wall_ms(&self) -> u64 {
        self.rare.0.as_ref().map_or(0, |r| r.ended_wall_ms)
    }

    pub(crate) fn set_ended_wall_ms(&mut self, ended_wall_ms: u64) {
        self.change_rare(ended_wall_ms != 0, |r| r.ended_wall_ms = ended_wall_ms);
    }

    /// Applies `change` to the rare parts (to a copy of them if another `Extra` shares
    /// them). Their allocation is made only if `sets` (the change sets a part) and dropped
    /// once no part is set, so an `Extra` whose rare parts are all unset owns none.
    fn change_rare(&mut self, sets: bool, change: impl FnOnce(&mut Rare)) {
        if self.rare.0.is_none() && !sets {
            return;
        }
        let rare = Arc::make_mut(self.rare.0.get_or_insert_with(Arc::default));
        change(rare);
        if rare.is_empty() {
            self.rare.0 = None;
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        !self.fp.set
            && self.rare.0.is_none()
            && self.response.is_none()
            && self.expires_wall_ms == 0
            && self.retention_ms.is_none()
            && self.first_claimed_wall_ms == 0
            && self.attempt_started_wall_ms == 0
            && !self.failed
            && self.completed_wall_ms == 0
            && self.lease_ms.is_none()
    }

    /// Heap bytes beyond the `Extra` itself: the rare parts, the checkpoint's and the
    /// response's bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.rare.0.as_ref().map_or(0, |r| {
            std::mem::size_of::<Rare>() + r.checkpoint.as_ref().map_or(0, |c| c.data().len())
        }) + self.response.as_ref().map_or(0, |r| r.len())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_round_trips_through_its_two_words() {
        for fp in [
            0,
            1,
            u128::from(u64::MAX),
            1 << 64,
            u128::MAX,
            0x0123_4567_89ab_cdef << 60,
        ] {
            let extra = Extra::default().with_fingerprint(Some(fp));
            assert_eq!(extra.fingerprint(), Some(fp));
            assert!(!extra.is_empty());
        }
        let unset = Extra::default()
            .with_fingerprint(Some(9))
            .with_fingerprint(None);
        assert_eq!(unset.fingerprint(), None);
        assert!(unset.is_empty());
        assert_eq!(unset, Extra::default());
    }

    #[test]
    fn the_rare_parts_own_a_box_only_while_one_is_set() {
        let mut extra = Extra::default();
        extra.set_checkpoint(None);
        extra.set_claim_id(None);
        extra.set_ended_wall_ms(0);
        assert!(extra.rare.0.is_none(), "unsetting allocates nothing");
        assert_eq!(extra.heap_bytes(), 0);

        let cp = Checkpoint::new(2, b"half");
        extra = extra
            .with_checkpoint(Some(cp.clone()))
            .with_claim_id(Some(7))
            .with_ended_wall_ms(40);
        assert_eq!(extra.checkpoint(), Some(&cp));
        assert_eq!((extra.claim_id(), extra.ended_wall_ms()), (Some(7), 40));
        assert_eq!(extra.heap_bytes(), std::mem::size_of::<Rare>() + 4);
        assert!(!extra.is_empty());

        // A copy shares the rare parts until one side changes them.
        let copy = extra.clone();
        assert!(Arc::ptr_eq(
            copy.rare.0.as_ref().expect("set"),
            extra.rare.0.as_ref().expect("set")
        ));
        // Each part unset on its own; the allocation goes with the last one.
        extra.set_checkpoint(None);
        extra.set_ended_wall_ms(0);
        assert!(extra.rare.0.is_some());
        assert_eq!(extra.claim_id(), Some(7));
        extra.set_claim_id(None);
        assert!(extra.rare.0.is_none());
        assert!(extra.is_empty());
        assert_eq!(extra, Extra::default());
        // The copy kept every part.
        assert_eq!(copy.checkpoint(), Some(&cp));
        assert_eq!((copy.claim_id(), copy.ended_wall_ms()), (Some(7), 40));
    }
}
