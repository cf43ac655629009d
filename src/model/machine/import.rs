//! An operator's import of a record: what the record stands for now, and whether it may
//! replace what the key holds.

use super::record::KeyRef;
use super::{holder_lease_ms, lease_ms, Change, Deltas, Now, Rules, Step, View, Write, NONE};
use crate::base::clock::{duration_ms, wall_ms, wall_ms_ceil};
use crate::model::codec::{Blob, Checkpoint, Record, RecordState};
use crate::model::record_info::{ImportError, RecordInfo, RecordInfoState};
use crate::model::slot::{Extra, Slot};
use std::sync::Arc;

/// What an import did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Imported {
    /// The record is the key's state now.
    Added,
    /// The record was already past its retention or reap instant: nothing to bring back.
    Gone,
}

/// An operator imports `record` into the key. `min_token` is the engine's next token: an
/// imported token must not be below it, or fencing would break. The caller advances the
/// token counter past the record's token before queueing the write. `key` is the record's
/// scoped key, as the caller built it from the record's scope and key.
pub(crate) fn import(
    view: View<'_>,
    key: KeyRef<'_>,
    record: &RecordInfo,
    min_token: u64,
    now: Now,
    rules: &Rules,
) -> Result<Step<Imported>, ImportError> {
    // Classified before the key is looked at: a record with nothing to bring back is not
    // refused because the key exists.
    let Some(restored) = restore(record, now, rules)? else {
        return Ok(Step::answer(Imported::Gone, NONE));
    };
    let old = match view.slot {
        Some(slot) if !slot.is_expired(now.mono_ns) => return Err(ImportError::KeyExists),
        Some(slot) => Some(slot.token),
        None => None,
    };
    if record.token < min_token || record.token == u64::MAX {
        return Err(ImportError::TokenTooSmall {
            token: record.token,
            min: min_token,
        });
    }
    debug_assert!(
        old.is_none_or(|old| old < record.token),
        "a key's tokens only increase"
    );
    let Restored {
        slot,
        state,
        extra,
        reap_ns,
        deltas,
    } = restored;
    let write = rules.durable.then(|| Write::Put {
        token: record.token,
        old,
        record: Record {
            key: key.record_key(),
            fingerprint: record.fingerprint,
            first_claimed_wall_ms: extra.first_claimed_wall_ms,
            retention_ms: None,
            state,
        },
    });
    // Only an expired completion can be replaced.
    let deltas = Deltas {
        completed: deltas.completed - i64::from(old.is_some()),
        ..deltas
    };
    Ok(Step {
        change: Change::Put {
            slot,
            extra,
            reap_ns,
            adopt: false,
        },
        write,
        answer: Imported::Added,
        deltas,
    })
}

/// What an imported record becomes in the index and the file, before the key is looked at.
struct Restored {
    slot: Slot,
    state: RecordState,
    extra: Extra,
    reap_ns: Option<u64>,
    deltas: Deltas,
}

/// The key's state that `record` stands for now; `None`: it is past its retention or reap
/// instant, nothing to bring back.
fn restore(record: &RecordInfo, now: Now, rules: &Rules) -> Result<Option<Restored>, ImportError> {
    match &record.state {
        RecordInfoState::InFlight {
            lease_deadline,
            checkpoint,
            attempt_started_at,
            failed,
            lease,
            claim_id,
        } => {
            let held = HeldImport {
                lease_deadline_ms: wall_ms_ceil(*lease_deadline),
                checkpoint: checkpoint.as_ref().map(|(p, d)| Checkpoint::new(*p, d)),
                attempt_started_wall_ms: attempt_started_at.map_or(0, wall_ms),
                failed: *failed,
                lease_ms: lease.map(lease_ms),
                claim_id: *claim_id,
            };
            Ok(restore_inflight(record, held, now, rules))
        }
        RecordInfoState::Completed {
            published: false, ..
        } => Err(ImportError::Invalid("a completion not yet durable".into())),
        RecordInfoState::Completed {
            response,
            expires_at,
            ..
        } => restore_completed(record, response, wall_ms(*expires_at), now, rules),
    }
}

/// An imported InFlight record's lease, in the units the index keeps.
struct HeldImport {
    /// Rounded up: the stored end is never before the one imported.
    lease_deadline_ms: u64,
    checkpoint: Option<Checkpoint>,
    attempt_started_wall_ms: u64,
    failed: bool,
    lease_ms: Option<u64>,
    claim_id: Option<u128>,
}

/// An imported InFlight record: held until its lease's end (taken over at once if it
/// failed), reaped a retention after that; `None` once that reap instant has passed.
fn restore_inflight(
    record: &RecordInfo,
    held: HeldImport,
    now: Now,
    rules: &Rules,
) -> Option<Restored> {
    let retention_ms = duration_ms(rules.retention);
    let deadline_ms = held.lease_deadline_ms;
    if deadline_ms.saturating_add(retention_ms) <= now.wall_ms {
        return None;
    }
    let over = held.failed || deadline_ms <= now.wall_ms;
    let extra = Extra {
        first_claimed_wall_ms: record.first_claimed_at.map_or(0, wall_ms),
        attempt_started_wall_ms: held.attempt_started_wall_ms,
        failed: held.failed,
        lease_ms: held.lease_ms,
        ..Extra::default()
    }
    .with_fingerprint(record.fingerprint)
    .with_checkpoint(held.checkpoint.clone())
    .with_ended_wall_ms(if over { deadline_ms } else { 0 })
    .with_claim_id(held.claim_id);
    let state = RecordState::InFlight {
        lease_deadline_wall_ms: deadline_ms,
        attempt: record.attempt,
        attempt_started_wall_ms: extra.attempt_started_wall_ms,
        failed: held.failed,
        checkpoint: held.checkpoint,
        lease_ms: Some(holder_lease_ms(&extra, rules)),
        claim_id: held.claim_id,
    };
    // A failed claim is taken over at once, whatever end its record gives.
    let left_ns = if held.failed {
        0
    } else {
        now.ns_until_wall_ms(deadline_ms)
    };
    let slot = Slot::inflight(
        record.token,
        now.mono_ns.saturating_add(left_ns),
        record.attempt,
    );
    let reap_ns = now
        .mono_ns
        .saturating_add(now.ns_until_wall_ms(deadline_ms.saturating_add(retention_ms)));
    let deltas = Deltas {
        inflight: 1,
        ..NONE
    };
    Some(Restored {
        slot,
        state,
        extra,
        reap_ns: Some(reap_ns),
        deltas,
    })
}

/// An imported completion, kept until `expires_at_ms`; `None` once that has passed.
fn restore_completed(
    record: &RecordInfo,
    response: &[u8],
    expires_at_ms: u64,
    now: Now,
    rules: &Rules,
) -> Result<Option<Restored>, ImportError> {
    if expires_at_ms <= now.wall_ms {
        return Ok(None);
    }
    if response.len() > rules.response_len_max {
        return Err(ImportError::Invalid("response too large".into()));
    }
    let response: Arc<[u8]> = Arc::from(response);
    // As a completion's: until it is published and the file holds it, the
    // fingerprint is checked and a replay answered from here (with the commit log, a
    // batch is published before it reaches the file).
    let extra = Extra {
        response: Some(response.clone()),
        expires_wall_ms: expires_at_ms,
        first_claimed_wall_ms: record.first_claimed_at.map_or(0, wall_ms),
        completed_wall_ms: now.wall_ms,
        ..Extra::default()
    }
    .with_fingerprint(record.fingerprint);
    let state = RecordState::Completed {
        attempt: record.attempt,
        completed_wall_ms: now.wall_ms,
        expires_wall_ms: expires_at_ms,
        response: Blob(response),
    };
    // A durable import is shown once the writer has committed and published it.
    let slot = Slot::completed(
        record.token,
        now.mono_ns
            .saturating_add(now.ns_until_wall_ms(expires_at_ms)),
        record.attempt,
        !rules.durable,
    );
    let deltas = Deltas {
        completed: 1,
        ..NONE
    };
    Ok(Some(Restored {
        slot,
        state,
        extra,
        reap_ns: None,
        deltas,
    }))
}
