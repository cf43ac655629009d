//! The records a transition writes for a key: its scoped key, the InFlight record of a
//! lease and the instants its side data adds.

use super::{holder_lease_ms, Now, Rules};
use crate::model::codec::{Checkpoint, Record, RecordKey, RecordState};
use crate::model::scope::ScopedKey;
use crate::model::slot::{Extra, Slot};
/// The scoped key (`scope.rs`) a transition may write a record for: the call's own (the
/// record copies its inline bytes or takes another reference to its allocation), or bytes
/// that a record copies.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyRef<'a> {
    Scoped(&'a ScopedKey),
    Bytes(&'a [u8]),
}

impl KeyRef<'_> {
    pub(super) fn record_key(self) -> RecordKey {
        match self {
            KeyRef::Scoped(key) => RecordKey::from_scoped(key),
            KeyRef::Bytes(key) => RecordKey::copied(key),
        }
    }
}

/// The InFlight record persisted for a lease of the scoped key `key` (`scope.rs`).
pub(super) fn inflight_record(
    key: KeyRef<'_>,
    fingerprint: Option<u128>,
    attempt: u32,
    checkpoint: Option<Checkpoint>,
    deadline_wall_ms: u64,
) -> Record {
    Record {
        key: key.record_key(),
        fingerprint,
        first_claimed_wall_ms: 0,
        retention_ms: None,
        state: RecordState::InFlight {
            lease_deadline_wall_ms: deadline_wall_ms,
            attempt,
            attempt_started_wall_ms: 0,
            failed: false,
            checkpoint,
            lease_ms: None,
            claim_id: None,
        },
    }
}

/// `record` with the key's instants, failure flag and holder, as its side data holds them:
/// the first claim (kept across takeovers and fails), and for an InFlight record the start
/// of its attempt, whether its holder failed it, the lease length its holder was given (the
/// engine's of `rules` if unknown) and the claim identity it presented.
pub(super) fn with_progress(mut record: Record, extra: &Extra, rules: &Rules) -> Record {
    record.first_claimed_wall_ms = extra.first_claimed_wall_ms;
    if let RecordState::InFlight {
        attempt_started_wall_ms,
        failed,
        lease_ms,
        claim_id,
        ..
    } = &mut record.state
    {
        *attempt_started_wall_ms = extra.attempt_started_wall_ms;
        *failed = extra.failed;
        *lease_ms = Some(holder_lease_ms(extra, rules));
        *claim_id = extra.claim_id();
    }
    record
}

/// When the lease of the InFlight `slot` ends or ended, on the wall clock (ms): its
/// deadline, or for a lease that was already over in the file it was loaded from, the end
/// that file recorded. A live lease's end is rounded up (never before the real end); a
/// lease that is over reports an end no later than now, so that it reads as over.
pub(crate) fn lease_end_wall_ms(slot: &Slot, extra: Option<&Extra>, now: Now) -> u64 {
    match extra.map_or(0, |e| e.ended_wall_ms()) {
        ended if ended != 0 && slot.deadline_ns <= now.mono_ns => ended,
        _ if slot.deadline_ns <= now.mono_ns => {
            now.wall_ms_ceil_at(slot.deadline_ns).min(now.wall_ms)
        }
        _ => now.wall_ms_ceil_at(slot.deadline_ns),
    }
}
