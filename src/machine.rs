//! The per-key state machine, as pure functions: given a key's slot and side data, an
//! operation and the instant, each function returns what the key becomes, the write to
//! queue for the writer, the caller's answer and the counter deltas — a [`Step`].
//!
//! Architecture invariant: the state machine never does I/O, takes no lock and reads no
//! clock. Its callers hold the key's stripe lock, read the clock, queue the write (and only
//! if the queue takes it, apply the change and the deltas), wait for acknowledgements and
//! read responses from the file.
//!
//! The table of `docs/design.md` ("The state machine"), cell by cell:
//!
//! | call | function | Absent / expired | InFlight, live | InFlight, over | Completed |
//! |---|---|---|---|---|---|
//! | `claim` | [`claim`], then [`acquire`] | `Acquire` (new) | `Busy` | `Acquire` (takeover) | `Replay` / `ReplayFromFile` (published), `Busy` (not yet) |
//! | `complete` | [`hold`] + [`Holder::Complete`] | `LeaseLost` | `Done` | `Done` (same token) | `Repeat` (same token), else `LeaseLost` |
//! | `release` | [`hold`] + [`Holder::Release`] | `NotHeld` | `Done` | `Done` (same token) | `NotHeld` |
//! | `extend`, `checkpoint` | [`hold`] + [`Holder::Extend`] / [`Holder::Checkpoint`] | `LeaseLost` | `Done` | `Done` (same token) | `LeaseLost` |
//!
//! A claim whose fingerprint differs from the stored one gets `FingerprintMismatch` in every
//! state that has one. Beside the table: [`import`] (an operator adds a record), [`expire`]
//! and [`reap`] (the sweeper removes a completion past its retention, an abandoned claim past
//! its lease end plus retention), [`recover`] and [`load`] (recovery classifies a record of
//! the file and loads it over what an earlier record left).
//!
//! What is not here, and why: admission (the key budget and the in-flight limit, which
//! reserve a place on a shared counter and may sweep), issuing tokens (a shared counter
//! backed by the file), the expiry order of each stripe (`index.rs`, which asks [`expire`]
//! and [`reap`] before removing anything), and publishing a completion after its commit
//! (`Shard::publish`).

use crate::clock::{duration_ms, duration_ns, wall_ms_at};
use crate::codec::{Blob, Checkpoint, HeadState, Record, RecordState};
use crate::constants::RETRY_AFTER_UNPUBLISHED;
use crate::index::{Extra, Slot};
use crate::lease::{Busy, Stored};
use crate::options::Recovery;
use crate::{ImportError, RecordInfo, RecordInfoState};
use std::sync::Arc;
use std::time::Duration;

/// The instant of a transition, read by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Now {
    /// Monotonic ns: lease ends and retention deadlines.
    pub(crate) mono_ns: u64,
    /// Wall-clock ms since the epoch: what records persist.
    pub(crate) wall_ms: u64,
}

/// The engine's settings a transition depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    pub(crate) retention: Duration,
    pub(crate) response_len_max: usize,
    /// A file backs the engine: transitions describe the records to put, and completions
    /// are published by the writer after their commit. A memory-only engine publishes at
    /// once and has no records to build.
    pub(crate) durable: bool,
}

/// A key's state: its slot (none when Absent) and the side data kept beside it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) slot: Option<Slot>,
    pub(crate) extra: Option<&'a Extra>,
}

impl View<'_> {
    /// An Absent key.
    #[cfg(test)]
    pub(crate) const ABSENT: View<'static> = View {
        slot: None,
        extra: None,
    };

    fn fingerprint(&self) -> Option<u64> {
        self.extra.and_then(|e| e.fingerprint)
    }
}

/// One transition: what the key becomes, what to queue, what to answer, what to count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step<A> {
    pub(crate) change: Change,
    /// What the writer must store. `None`: nothing (a refusal, an answer from memory, or a
    /// record a memory-only engine does not build).
    pub(crate) write: Option<Write>,
    pub(crate) answer: A,
    pub(crate) deltas: Deltas,
}

impl<A> Step<A> {
    /// An answer that changes nothing.
    fn answer(answer: A, deltas: Deltas) -> Self {
        Self {
            change: Change::Keep,
            write: None,
            answer,
            deltas,
        }
    }
}

/// What the key's slot becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    Keep,
    /// Replace the slot and its side data.
    Put {
        slot: Slot,
        extra: Extra,
        /// The instant an InFlight slot is reaped if abandoned, when it comes from a record
        /// (recovery, import) rather than from the lease's own end.
        reap_ns: Option<u64>,
        /// A takeover of an abandoned lease whose claim reserved a place in the live count:
        /// the old slot leaves the abandoned set without being counted live again.
        adopt: bool,
    },
    Remove,
}

/// A write for the writer's queue (the caller adds the acknowledgement channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// Store `record` under `token`, removing the key's previous record at `old`; publish
    /// the completion after the commit if `publish`.
    Put {
        token: u64,
        old: Option<u64>,
        record: Record,
        publish: bool,
    },
    /// Remove the record under `token`.
    Delete { token: u64 },
}

impl Write {
    /// The token the write stores or removes.
    pub(crate) fn token(&self) -> u64 {
        match self {
            Write::Put { token, .. } | Write::Delete { token } => *token,
        }
    }
}

/// Changes to the engine's counters. Gauges are signed; events count up.
///
/// `inflight` does not include the place a claim reserves: admission reserves it against
/// the limit before the claim transition ([`Plan::reserve`]). The `abandoned` gauge is kept
/// by the index, which moves leases in and out of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Deltas {
    pub(crate) inflight: i64,
    pub(crate) completed: i64,
    pub(crate) acquired: u64,
    pub(crate) takeovers: u64,
    pub(crate) replays: u64,
    pub(crate) in_progress: u64,
    pub(crate) fingerprint_mismatches: u64,
    pub(crate) completions: u64,
    pub(crate) releases: u64,
    pub(crate) leases_lost: u64,
    pub(crate) expirations: u64,
    pub(crate) abandoned_reaped: u64,
}

const NONE: Deltas = Deltas {
    inflight: 0,
    completed: 0,
    acquired: 0,
    takeovers: 0,
    replays: 0,
    in_progress: 0,
    fingerprint_mismatches: 0,
    completions: 0,
    releases: 0,
    leases_lost: 0,
    expirations: 0,
    abandoned_reaped: 0,
};

// ---------------------------------------------------------------------------------------
// claim
// ---------------------------------------------------------------------------------------

/// What a claim decides on looking at the key.
#[derive(Debug, Clone)]
pub(crate) enum ClaimAnswer {
    /// The key can be acquired: admit the claim, issue a token, then [`acquire`].
    Acquire(Plan),
    Busy(Busy),
    /// A memory-only engine's stored response.
    Replay(Stored),
    /// A durable engine's completion: its response is read from the file, unlocked.
    ReplayFromFile { token: u64 },
    FingerprintMismatch,
}

/// How a claim acquires the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) kind: Acquiring,
    /// The key's previous token (its record is replaced).
    pub(crate) old: Option<u64>,
    pub(crate) attempt: u32,
    pub(crate) fingerprint: Option<u64>,
    pub(crate) checkpoint: Option<Checkpoint>,
    /// The claim needs a place in the live count. A takeover of a lease still counted live
    /// inherits its place; every other claim (a takeover of an abandoned lease included)
    /// reserves one.
    pub(crate) reserve: bool,
    /// A takeover of an abandoned lease (see [`Change::Put::adopt`]).
    pub(crate) adopt: bool,
}

/// Which column of the table a claim acquires from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquiring {
    /// The key has no slot: a new key under the key budget.
    New,
    /// A completion past its retention is replaced.
    Expired,
    /// A lease that is over is taken over: attempt + 1, checkpoint and fingerprint kept.
    Takeover,
}

/// A claim looks at the key: row `claim` of the table.
pub(crate) fn claim(view: View<'_>, fingerprint: Option<u64>, now_ns: u64) -> Step<ClaimAnswer> {
    let fresh = |kind, old| Plan {
        kind,
        old,
        attempt: 1,
        fingerprint,
        checkpoint: None,
        reserve: true,
        adopt: false,
    };
    let Some(slot) = view.slot else {
        return Step::answer(ClaimAnswer::Acquire(fresh(Acquiring::New, None)), NONE);
    };
    if slot.is_expired(now_ns) {
        let plan = fresh(Acquiring::Expired, Some(slot.token));
        return Step::answer(ClaimAnswer::Acquire(plan), NONE);
    }
    let stored_fp = view.fingerprint();
    if let (Some(asked), Some(stored)) = (fingerprint, stored_fp) {
        if asked != stored {
            let deltas = Deltas {
                fingerprint_mismatches: 1,
                ..NONE
            };
            return Step::answer(ClaimAnswer::FingerprintMismatch, deltas);
        }
    }
    let busy = |retry_after, completing| {
        let busy = Busy {
            retry_after,
            attempt: slot.attempt,
            completing,
        };
        let deltas = Deltas {
            in_progress: 1,
            ..NONE
        };
        Step::answer(ClaimAnswer::Busy(busy), deltas)
    };
    if !slot.is_inflight() {
        if !slot.is_published() {
            return busy(RETRY_AFTER_UNPUBLISHED, true);
        }
        return match view.extra.and_then(|e| e.response.clone()) {
            Some(response) => {
                let stored = Stored {
                    response,
                    token: slot.token,
                    attempt: slot.attempt,
                };
                let deltas = Deltas { replays: 1, ..NONE };
                Step::answer(ClaimAnswer::Replay(stored), deltas)
            }
            None => Step::answer(ClaimAnswer::ReplayFromFile { token: slot.token }, NONE),
        };
    }
    if now_ns < slot.deadline_ns {
        return busy(Duration::from_nanos(slot.deadline_ns - now_ns), false);
    }
    let adopt = slot.is_abandoned();
    let plan = Plan {
        kind: Acquiring::Takeover,
        old: Some(slot.token),
        attempt: slot.attempt.saturating_add(1),
        fingerprint: fingerprint.or(stored_fp),
        checkpoint: view.extra.and_then(|e| e.checkpoint.clone()),
        reserve: adopt,
        adopt,
    };
    Step::answer(ClaimAnswer::Acquire(plan), NONE)
}

/// What an acquired claim returns to its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acquired {
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    pub(crate) checkpoint: Option<Checkpoint>,
}

/// The claim, admitted and holding a fresh `token`, acquires the key for `lease`.
pub(crate) fn acquire(
    plan: Plan,
    key: &[u8],
    token: u64,
    lease: Duration,
    now: Now,
    rules: &Rules,
) -> Step<Acquired> {
    debug_assert!(
        plan.old.is_none_or(|old| old < token),
        "a key's tokens only increase"
    );
    let write = rules.durable.then(|| Write::Put {
        token,
        old: plan.old,
        record: inflight_record(
            key,
            plan.fingerprint,
            plan.attempt,
            plan.checkpoint.clone(),
            now.wall_ms.saturating_add(duration_ms(lease)),
        ),
        publish: false,
    });
    let slot = Slot::inflight(
        token,
        now.mono_ns.saturating_add(duration_ns(lease)),
        plan.attempt,
    );
    let extra = Extra {
        fingerprint: plan.fingerprint,
        checkpoint: plan.checkpoint.clone(),
        ..Extra::default()
    };
    let deltas = Deltas {
        completed: if plan.kind == Acquiring::Expired { -1 } else { 0 },
        acquired: 1,
        takeovers: u64::from(plan.kind == Acquiring::Takeover),
        ..NONE
    };
    Step {
        change: Change::Put {
            slot,
            extra,
            reap_ns: None,
            adopt: plan.adopt,
        },
        write,
        answer: Acquired {
            token,
            attempt: plan.attempt,
            checkpoint: plan.checkpoint,
        },
        deltas,
    }
}

/// The InFlight record persisted for a lease.
pub(crate) fn inflight_record(
    key: &[u8],
    fingerprint: Option<u64>,
    attempt: u32,
    checkpoint: Option<Checkpoint>,
    deadline_wall_ms: u64,
) -> Record {
    Record {
        key: Blob(Arc::from(key)),
        fingerprint,
        state: RecordState::InFlight {
            lease_deadline_wall_ms: deadline_wall_ms,
            attempt,
            checkpoint,
        },
    }
}

// ---------------------------------------------------------------------------------------
// what a holder does
// ---------------------------------------------------------------------------------------

/// What the holder of a token does to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Store the response; the key is Completed for `retention`.
    Complete { response: Arc<[u8]> },
    /// Give the key up: it is Absent.
    Release,
    /// Set the lease to end `lease` from now.
    Extend { lease: Duration },
    /// Save a checkpoint, which a takeover receives.
    Checkpoint(Checkpoint),
}

/// What a holder's call answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HolderAnswer {
    /// The call changed the key (completed, released, extended, checkpointed).
    Done,
    /// A repeated completion with the same token: the first stands. Settled once everything
    /// queued is, so an unpublished one waits for a flush.
    Repeat { published: bool },
    /// `release` of a key the token does not hold as InFlight: `Ok(false)`.
    NotHeld,
    /// The token does not hold the key.
    LeaseLost,
}

/// A holder's call with `token` on the key: rows `complete`, `release`, `extend` and
/// `checkpoint` of the table. Fencing: only the key's current token acts, also after its
/// lease ended as long as nobody took the key over.
pub(crate) fn hold(
    view: View<'_>,
    key: &[u8],
    token: u64,
    op: Holder,
    now: Now,
    rules: &Rules,
) -> Step<HolderAnswer> {
    let lost = || {
        let deltas = Deltas {
            leases_lost: 1,
            ..NONE
        };
        Step::answer(HolderAnswer::LeaseLost, deltas)
    };
    let held = view.slot.filter(|slot| slot.token == token);
    match op {
        Holder::Complete { response } => {
            let Some(slot) = held.filter(|slot| !slot.is_expired(now.mono_ns)) else {
                return lost();
            };
            if !slot.is_inflight() {
                let published = slot.is_published();
                return Step::answer(HolderAnswer::Repeat { published }, NONE);
            }
            complete(view, key, slot, response, now, rules)
        }
        Holder::Release => {
            let Some(slot) = held.filter(Slot::is_inflight) else {
                return Step::answer(HolderAnswer::NotHeld, NONE);
            };
            let deltas = Deltas {
                inflight: -1,
                releases: 1,
                ..NONE
            };
            Step {
                change: Change::Remove,
                write: rules.durable.then_some(Write::Delete { token: slot.token }),
                answer: HolderAnswer::Done,
                deltas,
            }
        }
        Holder::Extend { lease } => {
            let Some(mut slot) = held.filter(Slot::is_inflight) else {
                return lost();
            };
            slot.deadline_ns = now.mono_ns.saturating_add(duration_ns(lease));
            let extra = view.extra.cloned().unwrap_or_default();
            update(key, slot, extra, now, rules)
        }
        Holder::Checkpoint(checkpoint) => {
            let Some(slot) = held.filter(Slot::is_inflight) else {
                return lost();
            };
            let mut extra = view.extra.cloned().unwrap_or_default();
            extra.checkpoint = Some(checkpoint);
            update(key, slot, extra, now, rules)
        }
    }
}

/// `complete` of the InFlight `slot`. The response and fingerprint stay beside the slot
/// until the completion is published (a mismatch is refused and `records` reports it
/// meanwhile); a memory-only engine keeps them and publishes at once.
fn complete(
    view: View<'_>,
    key: &[u8],
    slot: Slot,
    response: Arc<[u8]>,
    now: Now,
    rules: &Rules,
) -> Step<HolderAnswer> {
    let fingerprint = view.fingerprint();
    let expires_wall_ms = now.wall_ms.saturating_add(duration_ms(rules.retention));
    let write = rules.durable.then(|| Write::Put {
        token: slot.token,
        old: None,
        record: Record {
            key: Blob(Arc::from(key)),
            fingerprint,
            state: RecordState::Completed {
                attempt: slot.attempt,
                completed_wall_ms: now.wall_ms,
                expires_wall_ms,
                response: Blob(response.clone()),
            },
        },
        publish: true,
    });
    let expires_ns = now.mono_ns.saturating_add(duration_ns(rules.retention));
    let extra = Extra {
        fingerprint,
        response: Some(response),
        expires_wall_ms,
        ..Extra::default()
    };
    let deltas = Deltas {
        inflight: -1,
        completed: 1,
        completions: 1,
        ..NONE
    };
    Step {
        change: Change::Put {
            slot: Slot::completed(slot.token, expires_ns, slot.attempt, !rules.durable),
            extra,
            reap_ns: None,
            adopt: false,
        },
        write,
        answer: HolderAnswer::Done,
        deltas,
    }
}

/// `extend` or `checkpoint`: the InFlight slot changes and its record is rewritten with the
/// lease's own end, also when it is already over (a holder may act until someone takes
/// over), so that recovery reaps the claim `retention` after it, as the sweeper would have.
fn update(key: &[u8], slot: Slot, extra: Extra, now: Now, rules: &Rules) -> Step<HolderAnswer> {
    let write = rules.durable.then(|| Write::Put {
        token: slot.token,
        old: None,
        record: inflight_record(
            key,
            extra.fingerprint,
            slot.attempt,
            extra.checkpoint.clone(),
            wall_ms_at(now.wall_ms, now.mono_ns, slot.deadline_ns),
        ),
        publish: false,
    });
    Step {
        change: Change::Put {
            slot,
            extra,
            reap_ns: None,
            adopt: false,
        },
        write,
        answer: HolderAnswer::Done,
        deltas: NONE,
    }
}

// ---------------------------------------------------------------------------------------
// import
// ---------------------------------------------------------------------------------------

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
/// token counter past the record's token before queueing the write.
pub(crate) fn import(
    view: View<'_>,
    record: &RecordInfo,
    min_token: u64,
    now: Now,
    rules: &Rules,
) -> Result<Step<Imported>, ImportError> {
    let gone = || Ok(Step::answer(Imported::Gone, NONE));
    let retention_ms = duration_ms(rules.retention);
    let ms_left = |until_ms: u64| until_ms.saturating_sub(now.wall_ms).saturating_mul(1_000_000);
    // Classified before the key is looked at: a record with nothing to bring back is not
    // refused because the key exists.
    let (slot, state, extra, reap_ns, deltas) = match &record.state {
        RecordInfoState::InFlight {
            lease_deadline_ms, ..
        } if lease_deadline_ms.saturating_add(retention_ms) <= now.wall_ms => return gone(),
        RecordInfoState::InFlight {
            lease_deadline_ms,
            checkpoint,
        } => {
            let checkpoint = checkpoint.as_ref().map(|(p, d)| Checkpoint::new(*p, d));
            let extra = Extra {
                fingerprint: record.fingerprint,
                checkpoint: checkpoint.clone(),
                ..Extra::default()
            };
            let state = RecordState::InFlight {
                lease_deadline_wall_ms: *lease_deadline_ms,
                attempt: record.attempt,
                checkpoint,
            };
            let slot = Slot::inflight(
                record.token,
                now.mono_ns.saturating_add(ms_left(*lease_deadline_ms)),
                record.attempt,
            );
            let reap_ns = now
                .mono_ns
                .saturating_add(ms_left(lease_deadline_ms.saturating_add(retention_ms)));
            let deltas = Deltas {
                inflight: 1,
                ..NONE
            };
            (slot, state, extra, Some(reap_ns), deltas)
        }
        RecordInfoState::Completed {
            published: false, ..
        } => return Err(ImportError::Invalid("a completion not yet durable".into())),
        RecordInfoState::Completed { expires_at_ms, .. } if *expires_at_ms <= now.wall_ms => {
            return gone()
        }
        RecordInfoState::Completed {
            response,
            expires_at_ms,
            ..
        } => {
            if response.len() > rules.response_len_max {
                return Err(ImportError::Invalid("response too large".into()));
            }
            let response: Arc<[u8]> = Arc::from(response.as_slice());
            let extra = if rules.durable {
                // Until the writer publishes it, the fingerprint is checked from here.
                Extra {
                    fingerprint: record.fingerprint,
                    ..Extra::default()
                }
            } else {
                Extra {
                    fingerprint: record.fingerprint,
                    response: Some(response.clone()),
                    expires_wall_ms: *expires_at_ms,
                    ..Extra::default()
                }
            };
            let state = RecordState::Completed {
                attempt: record.attempt,
                completed_wall_ms: now.wall_ms,
                expires_wall_ms: *expires_at_ms,
                response: Blob(response),
            };
            // A durable import is shown once the writer has committed and published it.
            let slot = Slot::completed(
                record.token,
                now.mono_ns.saturating_add(ms_left(*expires_at_ms)),
                record.attempt,
                !rules.durable,
            );
            let deltas = Deltas {
                completed: 1,
                ..NONE
            };
            (slot, state, extra, None, deltas)
        }
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
    let write = rules.durable.then(|| Write::Put {
        token: record.token,
        old,
        record: Record {
            key: Blob(Arc::from(record.key.as_slice())),
            fingerprint: record.fingerprint,
            state,
        },
        publish: true,
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

// ---------------------------------------------------------------------------------------
// the sweeper
// ---------------------------------------------------------------------------------------

/// The sweeper removes a completion past its retention. `None` if `slot` is not one: a
/// live lease or an unexpired completion is never removed. The deletion is queued whatever
/// the durability (a memory-only engine has no queue and drops it).
pub(crate) fn expire(slot: &Slot, now_ns: u64) -> Option<Step<()>> {
    if !slot.is_expired(now_ns) {
        return None;
    }
    debug_assert!(!slot.is_inflight(), "a lease never expires");
    let deltas = Deltas {
        completed: -1,
        expirations: 1,
        ..NONE
    };
    Some(removal(slot, deltas))
}

/// The sweeper reaps an abandoned claim — its lease ended and nobody took it over — at its
/// reap instant `reap_ns` (its lease end plus retention). `None` if `slot` is not one.
pub(crate) fn reap(slot: &Slot, reap_ns: u64, now_ns: u64) -> Option<Step<()>> {
    if !(slot.is_inflight() && slot.is_abandoned() && now_ns >= reap_ns) {
        return None;
    }
    debug_assert!(
        now_ns >= slot.deadline_ns,
        "a live lease is never evicted"
    );
    let deltas = Deltas {
        abandoned_reaped: 1,
        ..NONE
    };
    Some(removal(slot, deltas))
}

fn removal(slot: &Slot, deltas: Deltas) -> Step<()> {
    Step {
        change: Change::Remove,
        write: Some(Write::Delete { token: slot.token }),
        answer: (),
        deltas,
    }
}

// ---------------------------------------------------------------------------------------
// recovery
// ---------------------------------------------------------------------------------------

/// How recovery treats the InFlight records a previous process left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reopen {
    pub(crate) recovery: Recovery,
    /// The configured lease, which caps an honoured one.
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
}

/// What recovery does with one record of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recovered {
    /// A completion past its retention: its record is deleted.
    Expired,
    /// An abandoned claim past its reap instant: its record is deleted, the claim counted
    /// as reaped.
    Reaped,
    /// Loaded into the index (see [`load`]).
    Load {
        slot: Slot,
        extra: Extra,
        reap_ns: Option<u64>,
    },
}

/// Recovery classifies the record under `token`, decoded to its head, at `now`.
pub(crate) fn recover(
    token: u64,
    head: HeadState,
    fingerprint: Option<u64>,
    now: Now,
    reopen: &Reopen,
) -> Recovered {
    let retention_ms = duration_ms(reopen.retention);
    match head {
        HeadState::Completed {
            expires_wall_ms, ..
        } if expires_wall_ms <= now.wall_ms => Recovered::Expired,
        HeadState::Completed {
            attempt,
            expires_wall_ms,
            ..
        } => {
            let left_ns = (expires_wall_ms - now.wall_ms).saturating_mul(1_000_000);
            let slot = Slot::completed(token, now.mono_ns.saturating_add(left_ns), attempt, true);
            Recovered::Load {
                slot,
                extra: Extra::default(),
                reap_ns: None,
            }
        }
        HeadState::InFlight {
            lease_deadline_wall_ms,
            ..
        } if lease_deadline_wall_ms.saturating_add(retention_ms) <= now.wall_ms => {
            Recovered::Reaped
        }
        HeadState::InFlight {
            lease_deadline_wall_ms,
            attempt,
            checkpoint,
        } => {
            // Reaped `retention` after the recorded lease end, as a completion expires
            // `retention` after it was made; taken from the file, not from the in-memory
            // deadline (which `TakeOver` sets to now), so that restarts never postpone it.
            let reap_left_ms = lease_deadline_wall_ms
                .saturating_add(retention_ms)
                .saturating_sub(now.wall_ms);
            let reap_ns = now
                .mono_ns
                .saturating_add(reap_left_ms.saturating_mul(1_000_000));
            let deadline_ns = match reopen.recovery {
                // The owner is dead: redb locks the file to one process.
                Recovery::TakeOver => now.mono_ns,
                Recovery::HonourLeases => {
                    let left_ns = lease_deadline_wall_ms
                        .saturating_sub(now.wall_ms)
                        .saturating_mul(1_000_000)
                        .min(duration_ns(reopen.lease));
                    now.mono_ns.saturating_add(left_ns)
                }
            };
            let extra = Extra {
                fingerprint,
                checkpoint,
                ..Extra::default()
            };
            Recovered::Load {
                slot: Slot::inflight(token, deadline_ns, attempt),
                extra,
                reap_ns: Some(reap_ns),
            }
        }
    }
}

/// Recovery loads a record's `slot` over `existing`, what an earlier record of the same key
/// left. Two records of one key are never committed together, but if a damaged history
/// left both the newer wins; the write deletes the older.
pub(crate) fn load(
    existing: Option<Slot>,
    slot: Slot,
    extra: Extra,
    reap_ns: Option<u64>,
) -> Step<()> {
    let count = |slot: &Slot, sign: i64| Deltas {
        inflight: if slot.is_inflight() { sign } else { 0 },
        completed: if slot.is_inflight() { 0 } else { sign },
        ..NONE
    };
    if let Some(existing) = existing.filter(|e| e.token > slot.token) {
        debug_assert!(existing.token != slot.token);
        return Step {
            change: Change::Keep,
            write: Some(Write::Delete { token: slot.token }),
            answer: (),
            deltas: NONE,
        };
    }
    let mut deltas = count(&slot, 1);
    let mut write = None;
    if let Some(existing) = existing {
        let gone = count(&existing, -1);
        deltas.inflight += gone.inflight;
        deltas.completed += gone.completed;
        write = Some(Write::Delete {
            token: existing.token,
        });
    }
    Step {
        change: Change::Put {
            slot,
            extra,
            reap_ns,
            adopt: false,
        },
        write,
        answer: (),
        deltas,
    }
}
