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
//! | `fail` | [`hold`] + [`Holder::Fail`] | `NotHeld` | `Done`: the lease ends now, the record stays (failed) | `Done` (same token; the end stays) | `NotHeld` |
//! | `extend`, `checkpoint` | [`hold`] + [`Holder::Extend`] / [`Holder::Checkpoint`] | `LeaseLost` | `Done` | `Done` (same token; `extend` of a failed key: `LeaseLost`) | `LeaseLost` |
//!
//! A claim whose fingerprint differs from the stored one gets `FingerprintMismatch` in every
//! state that has one. A failed key is "InFlight, over" for every call but `extend`, which is
//! `LeaseLost` (a failed attempt is never revived): the next claim takes it over at once
//! (attempt + 1, checkpoint and fingerprint kept). Beside the table: [`import`] (an operator adds a record), [`expire`]
//! and [`reap`] (the sweeper removes a completion past its retention, an abandoned claim past
//! its lease end plus retention), [`recover`] and [`load`] (recovery classifies a record of
//! the file and loads it over what an earlier record left).
//!
//! What is not here, and why: admission (the key budget and the in-flight limit, which
//! reserve a place on a shared counter and may sweep), issuing tokens (a shared counter
//! backed by the file), the expiry order of each stripe (`index/stripes.rs`, which asks [`expire`]
//! and [`reap`] before removing anything), and publishing a completion once the writer's
//! watermark passes it (`publication.rs`, applied when its stripe is locked).

use crate::base::clock::{duration_ms, duration_ns, wall_ms, wall_ms_at, wall_ms_ceil};
use crate::model::answer::{Busy, Forgotten, Stored};
use crate::model::codec::{Blob, Checkpoint, HeadState, Record, RecordKey, RecordState};
use crate::model::constants::RETRY_AFTER_UNPUBLISHED;
use crate::model::marker::{Marker, MarkerId};
use crate::model::record_info::{ImportError, RecordInfo, RecordInfoState};
use crate::model::settings::{AskedFingerprint, Recovery};
use crate::model::slot::{Extra, Slot};
use std::sync::Arc;
use std::time::Duration;

/// The instant of a transition, read by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Now {
    /// Monotonic ns: lease ends and retention deadlines.
    pub(crate) mono_ns: u64,
    /// Wall-clock ms since the epoch: what records persist and reports show.
    pub(crate) wall_ms: u64,
    /// The wall reading's nanoseconds past `wall_ms` (below one ms): the ends stored on the
    /// wall clock's millisecond grid are measured from the exact reading.
    pub(crate) wall_sub_ns: u64,
}

impl Now {
    /// The instant whose monotonic reading is `mono_ns` and whose wall reading is `wall_ns`
    /// since the epoch.
    pub(crate) fn new(mono_ns: u64, wall_ns: u64) -> Self {
        Self {
            mono_ns,
            wall_ms: wall_ns / 1_000_000,
            wall_sub_ns: wall_ns % 1_000_000,
        }
    }

    /// Nanoseconds from this instant until the wall clock reaches millisecond `ms` (0 once
    /// it has).
    pub(crate) fn ns_until_wall_ms(&self, ms: u64) -> u64 {
        ms.saturating_sub(self.wall_ms)
            .saturating_mul(1_000_000)
            .saturating_sub(self.wall_sub_ns)
    }

    /// The first whole wall millisecond at or after the monotonic instant `at_ns`: a lease
    /// end as it is stored and reported, never before the real one.
    pub(crate) fn wall_ms_ceil_at(&self, at_ns: u64) -> u64 {
        let wall_ns = u128::from(self.wall_ms) * 1_000_000 + u128::from(self.wall_sub_ns);
        let at_wall_ns = if at_ns >= self.mono_ns {
            wall_ns + u128::from(at_ns - self.mono_ns)
        } else {
            wall_ns.saturating_sub(u128::from(self.mono_ns - at_ns))
        };
        u64::try_from(at_wall_ns.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }

    /// The first whole wall millisecond at or after `keep_ns` from this instant (not
    /// bounded by the monotonic clock's range): a lease's end as its record stores it.
    pub(crate) fn wall_ms_ceil_after(&self, keep_ns: u64) -> u64 {
        let end_ns = u128::from(self.wall_ms) * 1_000_000
            + u128::from(self.wall_sub_ns)
            + u128::from(keep_ns);
        u64::try_from(end_ns.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }

    /// The end of something kept `keep_ns` from this instant, on the wall clock's
    /// millisecond grid: the first whole wall millisecond at or after the exact end (as
    /// stored), and the monotonic instant of it (as the index keeps it). Memory and file
    /// then end at the same instant, never before the exact end and less than a millisecond
    /// after it. Zero ends now.
    pub(crate) fn end_on_wall_grid(&self, keep_ns: u64) -> (u64, u64) {
        if keep_ns == 0 {
            return (self.wall_ms, self.mono_ns);
        }
        let rem_ns = keep_ns % 1_000_000 + self.wall_sub_ns;
        let end_ms = self
            .wall_ms
            .saturating_add(keep_ns / 1_000_000)
            .saturating_add(rem_ns.div_ceil(1_000_000));
        (
            end_ms,
            self.mono_ns.saturating_add(self.ns_until_wall_ms(end_ms)),
        )
    }
}

/// The engine's settings a transition depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    pub(crate) retention: Duration,
    pub(crate) response_len_max: usize,
    /// A file backs the engine: transitions describe the records to put, and completions
    /// are published once the writer's watermark passes them. A memory-only engine
    /// publishes at once and has no records to build.
    pub(crate) durable: bool,
    /// The engine's lease: the lease length an InFlight record keeps for a holder whose own
    /// is unknown (one loaded from a record of format 1 or 2).
    pub(crate) lease: Duration,
}

/// A lease length in whole milliseconds, rounded up (a stored length is never shorter).
pub(crate) fn lease_ms(lease: Duration) -> u64 {
    duration_ns(lease).div_ceil(1_000_000)
}

/// The lease length an InFlight record keeps for the holder whose side data is `extra`.
fn holder_lease_ms(extra: &Extra, rules: &Rules) -> u64 {
    extra.lease_ms.unwrap_or_else(|| lease_ms(rules.lease))
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

    fn fingerprint(&self) -> Option<u128> {
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
#[allow(
    clippy::large_enum_variant,
    reason = "a transition's change lives on the stack for one call; boxing the side data \
              would allocate on every transition"
)]
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
    /// Store `record` under `token`, removing the key's previous record at `old`. (A
    /// completion's record is published when the writer's watermark passes it: see
    /// `Shard::apply`.)
    Put {
        token: u64,
        old: Option<u64>,
        record: Record,
    },
    /// Remove the record under `token`.
    Delete { token: u64 },
    /// Remove the completion's record under `token` and, in the same commit, store the
    /// marker row it leaves under `hash`, built by the writer from the record (its
    /// fingerprint, attempt and completion time; its end is the record's end of retention
    /// plus `marker_retention_ms`).
    Forget {
        token: u64,
        hash: u64,
        check: u64,
        marker_retention_ms: u64,
    },
    /// Remove the marker row under `hash` if it is the one the completion `token` left.
    DropMarker { hash: u64, token: u64 },
}

impl Write {
    /// The token the write stores or removes (a marker's: the token of its completion).
    pub(crate) fn token(&self) -> u64 {
        match self {
            Write::Put { token, .. }
            | Write::Delete { token }
            | Write::Forget { token, .. }
            | Write::DropMarker { token, .. } => *token,
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
    /// Leases ended by their holder's failure, the record kept.
    pub(crate) failures: u64,
    /// Claims answered from a marker (`Forgotten`).
    pub(crate) forgotten: u64,
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
    failures: 0,
    forgotten: 0,
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
    ReplayFromFile {
        token: u64,
    },
    /// The claim presents the claim identity of the key's InFlight holder (`token`), which
    /// did not fail: it resumes that lease ([`resume`]).
    Resume {
        token: u64,
    },
    FingerprintMismatch,
}

/// How a claim acquires the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) kind: Acquiring,
    /// The key's previous token (its record is replaced).
    pub(crate) old: Option<u64>,
    pub(crate) attempt: u32,
    pub(crate) fingerprint: Option<u128>,
    pub(crate) checkpoint: Option<Checkpoint>,
    /// The claim needs a place in the live count. A takeover of a lease still counted live
    /// inherits its place; every other claim (a takeover of an abandoned lease included)
    /// reserves one.
    pub(crate) reserve: bool,
    /// A takeover of an abandoned lease (see [`Change::Put::adopt`]).
    pub(crate) adopt: bool,
    /// The key's own retention in ms (`None`: the engine's): a takeover keeps the one of
    /// the claim it replaces, unless the new claim asks for its own
    /// ([`Plan::asking_retention`]).
    pub(crate) retention_ms: Option<u64>,
    /// A takeover keeps the key's first-claimed instant (wall ms, 0: unknown); `None`: the
    /// key is claimed for the first time now.
    pub(crate) first_claimed_wall_ms: Option<u64>,
    /// The claim identity the claim presents, which its lease keeps.
    pub(crate) claim_id: Option<u128>,
}

impl Plan {
    /// The claim asks for its own retention (in ms): it wins over the one a takeover keeps,
    /// as a retrying client's options are the newer word on its key.
    pub(crate) fn asking_retention(mut self, asked_ms: Option<u64>) -> Self {
        self.retention_ms = asked_ms.or(self.retention_ms);
        self
    }
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

/// A claim looks at the key: row `claim` of the table. A claim presenting `claim_id`, the
/// identity the key's InFlight holder presented, resumes that lease (live, or over and not
/// yet taken over) unless its holder failed it: the caller lost the answer of its own claim.
pub(crate) fn claim(
    view: View<'_>,
    asked: Option<AskedFingerprint>,
    claim_id: Option<u128>,
    now_ns: u64,
) -> Step<ClaimAnswer> {
    let fingerprint = asked.map(|a| a.value);
    let fresh = |kind, old| Plan {
        kind,
        old,
        attempt: 1,
        fingerprint,
        checkpoint: None,
        reserve: true,
        adopt: false,
        retention_ms: None,
        first_claimed_wall_ms: None,
        claim_id,
    };
    let Some(slot) = view.slot else {
        return Step::answer(ClaimAnswer::Acquire(fresh(Acquiring::New, None)), NONE);
    };
    if slot.is_expired(now_ns) {
        let plan = fresh(Acquiring::Expired, Some(slot.token));
        return Step::answer(ClaimAnswer::Acquire(plan), NONE);
    }
    let stored_fp = view.fingerprint();
    if let (Some(asked), Some(stored)) = (asked, stored_fp) {
        if !asked.matches(stored) {
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
                    expires_wall_ms: view.extra.map_or(0, |e| e.expires_wall_ms),
                };
                let deltas = Deltas { replays: 1, ..NONE };
                Step::answer(ClaimAnswer::Replay(stored), deltas)
            }
            None => Step::answer(ClaimAnswer::ReplayFromFile { token: slot.token }, NONE),
        };
    }
    let holder = view.extra.filter(|e| !e.failed).and_then(|e| e.claim_id);
    if claim_id.is_some() && holder == claim_id {
        return Step::answer(ClaimAnswer::Resume { token: slot.token }, NONE);
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
        retention_ms: view.extra.and_then(|e| e.retention_ms),
        first_claimed_wall_ms: Some(view.extra.map_or(0, |e| e.first_claimed_wall_ms)),
        claim_id,
    };
    Step::answer(ClaimAnswer::Acquire(plan), NONE)
}

/// A claim resumes the lease of `token`, whose holder presented the same claim identity
/// ([`ClaimAnswer::Resume`]): the lease is renewed for `lease` from now, as `extend` would,
/// and handed back with its token, attempt and checkpoint (no new token, no new attempt).
/// `None` if `token` no longer holds the key as a lease that may be resumed.
pub(crate) fn resume(
    view: View<'_>,
    key: KeyRef<'_>,
    token: u64,
    lease: Duration,
    now: Now,
    rules: &Rules,
) -> Option<Step<Acquired>> {
    let slot = view.slot.filter(|s| s.token == token && s.is_inflight())?;
    let checkpoint = view.extra.and_then(|e| e.checkpoint.clone());
    let step = hold(view, key, token, Holder::Extend { lease }, now, rules);
    if step.answer != HolderAnswer::Done {
        return None;
    }
    Some(Step {
        change: step.change,
        write: step.write,
        answer: Acquired {
            token,
            attempt: slot.attempt,
            checkpoint,
        },
        deltas: Deltas {
            acquired: 1,
            ..step.deltas
        },
    })
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
    key: KeyRef<'_>,
    token: u64,
    lease: Duration,
    now: Now,
    rules: &Rules,
) -> Step<Acquired> {
    debug_assert!(
        plan.old.is_none_or(|old| old < token),
        "a key's tokens only increase"
    );
    let extra = Extra {
        fingerprint: plan.fingerprint,
        checkpoint: plan.checkpoint.clone(),
        first_claimed_wall_ms: plan.first_claimed_wall_ms.unwrap_or(now.wall_ms),
        attempt_started_wall_ms: now.wall_ms,
        retention_ms: plan.retention_ms,
        lease_ms: Some(lease_ms(lease)),
        claim_id: plan.claim_id,
        ..Extra::default()
    };
    let write = rules.durable.then(|| Write::Put {
        token,
        old: plan.old,
        record: Record {
            retention_ms: plan.retention_ms,
            ..with_progress(
                inflight_record(
                    key,
                    plan.fingerprint,
                    plan.attempt,
                    plan.checkpoint.clone(),
                    // Rounded up: the stored end is never before the real one.
                    now.wall_ms_ceil_after(duration_ns(lease)),
                ),
                &extra,
                rules,
            )
        },
    });
    let slot = Slot::inflight(
        token,
        now.mono_ns.saturating_add(duration_ns(lease)),
        plan.attempt,
    );
    let deltas = Deltas {
        completed: if plan.kind == Acquiring::Expired {
            -1
        } else {
            0
        },
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

/// The scoped key (`scope.rs`) a transition may write a record for: the call's shared
/// allocation when it has one (the record then holds another reference, not a copy), or
/// bytes that a record copies.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyRef<'a> {
    Shared(&'a Arc<[u8]>),
    Bytes(&'a [u8]),
}

impl KeyRef<'_> {
    fn record_key(self) -> RecordKey {
        match self {
            KeyRef::Shared(key) => RecordKey::shared(key),
            KeyRef::Bytes(key) => RecordKey::copied(key),
        }
    }
}

/// The InFlight record persisted for a lease of the scoped key `key` (`scope.rs`).
pub(crate) fn inflight_record(
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
pub(crate) fn with_progress(mut record: Record, extra: &Extra, rules: &Rules) -> Record {
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
        *claim_id = extra.claim_id;
    }
    record
}

/// When the lease of the InFlight `slot` ends or ended, on the wall clock (ms): its
/// deadline, or for a lease that was already over in the file it was loaded from, the end
/// that file recorded. A live lease's end is rounded up (never before the real end); a
/// lease that is over reports an end no later than now, so that it reads as over.
pub(crate) fn lease_end_wall_ms(slot: &Slot, extra: Option<&Extra>, now: Now) -> u64 {
    match extra.map_or(0, |e| e.ended_wall_ms) {
        ended if ended != 0 && slot.deadline_ns <= now.mono_ns => ended,
        _ if slot.deadline_ns <= now.mono_ns => {
            now.wall_ms_ceil_at(slot.deadline_ns).min(now.wall_ms)
        }
        _ => now.wall_ms_ceil_at(slot.deadline_ns),
    }
}

// ---------------------------------------------------------------------------------------
// what a holder does
// ---------------------------------------------------------------------------------------

/// What the holder of a token does to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Store the response; the key is Completed for `retention_ms` if given, else for the
    /// retention its claim chose, else for the engine's.
    Complete {
        response: Arc<[u8]>,
        retention_ms: Option<u64>,
    },
    /// Give the key up: it is Absent.
    Release,
    /// Set the lease to end `lease` from now.
    Extend { lease: Duration },
    /// Save a checkpoint, which a takeover receives.
    Checkpoint(Checkpoint),
    /// End the attempt and keep the key: the lease ends now (or stays ended), the record
    /// stays InFlight and marked failed, with its checkpoint and fingerprint, so the next
    /// claim takes it over at once.
    Fail,
}

/// What a holder's call answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HolderAnswer {
    /// The call changed the key (completed, released, failed, extended, checkpointed).
    Done,
    /// A repeated completion with the same token: the first stands. Settled once everything
    /// queued is, so an unpublished one waits for a flush.
    Repeat { published: bool },
    /// `release` or `fail` of a key the token does not hold as InFlight: `Ok(false)`.
    NotHeld,
    /// The token does not hold the key.
    LeaseLost,
}

/// A holder's call with `token` on the key: rows `complete`, `release`, `extend` and
/// `checkpoint` of the table. Fencing: only the key's current token acts, also after its
/// lease ended as long as nobody took the key over.
pub(crate) fn hold(
    view: View<'_>,
    key: KeyRef<'_>,
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
        Holder::Complete {
            response,
            retention_ms,
        } => {
            let Some(slot) = held.filter(|slot| !slot.is_expired(now.mono_ns)) else {
                return lost();
            };
            if !slot.is_inflight() {
                let published = slot.is_published();
                return Step::answer(HolderAnswer::Repeat { published }, NONE);
            }
            complete(view, key, slot, response, retention_ms, now, rules)
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
            // A failed attempt is over for good: nothing revives it (not even a keep-alive
            // renewal racing the fail), and the next claim takes it over.
            let failed = view.extra.is_some_and(|e| e.failed);
            let Some(mut slot) = held.filter(|slot| slot.is_inflight() && !failed) else {
                return lost();
            };
            let unmoved = slot.deadline_ns;
            slot.deadline_ns = now.mono_ns.saturating_add(duration_ns(lease));
            let mut extra = view.extra.cloned().unwrap_or_default();
            // A live lease again: its end is its deadline, and its length the one given now.
            extra.ended_wall_ms = 0;
            extra.lease_ms = Some(lease_ms(lease));
            let reap_ns = reap_after(slot.deadline_ns, &extra, rules);
            let mut step = update(key, slot, extra, now, rules);
            // An extension that leaves the deadline where it was keeps the slot's place in
            // the expiry order, but not its reap instant: one loaded from a record (reaped
            // `retention` after the recorded end) is reaped after this end from now on.
            if slot.deadline_ns == unmoved {
                if let Change::Put { reap_ns: r, .. } = &mut step.change {
                    *r = Some(reap_ns);
                }
            }
            step
        }
        Holder::Fail => {
            let Some(mut slot) = held.filter(Slot::is_inflight) else {
                return Step::answer(HolderAnswer::NotHeld, NONE);
            };
            // A lease already over keeps its end, and so its reap instant.
            slot.deadline_ns = slot.deadline_ns.min(now.mono_ns);
            let mut extra = view.extra.cloned().unwrap_or_default();
            extra.failed = true;
            let mut step = update(key, slot, extra, now, rules);
            step.deltas.failures = 1;
            step
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
/// meanwhile); a memory-only engine keeps them and publishes at once. The retention is the
/// completion's own (`retention_ms`), else the claim's, else the engine's; a key's own
/// retention is whole milliseconds, so memory and file agree on its end to the ns.
fn complete(
    view: View<'_>,
    key: KeyRef<'_>,
    slot: Slot,
    response: Arc<[u8]>,
    retention_ms: Option<u64>,
    now: Now,
    rules: &Rules,
) -> Step<HolderAnswer> {
    let fingerprint = view.fingerprint();
    let own_ms = retention_ms.or(view.extra.and_then(|e| e.retention_ms));
    let keep_ns = keep_ns(own_ms, rules);
    let (expires_wall_ms, expires_ns) = now.end_on_wall_grid(keep_ns);
    let first_claimed_wall_ms = view.extra.map_or(0, |e| e.first_claimed_wall_ms);
    let write = rules.durable.then(|| Write::Put {
        token: slot.token,
        old: None,
        record: Record {
            key: key.record_key(),
            fingerprint,
            first_claimed_wall_ms,
            retention_ms: own_ms,
            state: RecordState::Completed {
                attempt: slot.attempt,
                completed_wall_ms: now.wall_ms,
                expires_wall_ms,
                response: Blob(response.clone()),
            },
        },
    });
    let extra = Extra {
        fingerprint,
        response: Some(response),
        expires_wall_ms,
        retention_ms: own_ms,
        first_claimed_wall_ms,
        completed_wall_ms: now.wall_ms,
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

/// How long the key is kept: its own retention (ms), or the engine's.
fn keep_ns(own_ms: Option<u64>, rules: &Rules) -> u64 {
    match own_ms {
        Some(ms) => ms.saturating_mul(1_000_000),
        None => duration_ns(rules.retention),
    }
}

/// The instant an InFlight slot ending at `deadline_ns` is reaped if abandoned: the key's
/// own retention after its end, or the engine's.
fn reap_after(deadline_ns: u64, extra: &Extra, rules: &Rules) -> u64 {
    deadline_ns.saturating_add(keep_ns(extra.retention_ms, rules))
}

/// `extend` or `checkpoint`: the InFlight slot changes and its record is rewritten with the
/// lease's own end, also when it is already over (a holder may act until someone takes
/// over), so that recovery reaps the claim `retention` after it, as the sweeper would have.
fn update(
    key: KeyRef<'_>,
    slot: Slot,
    extra: Extra,
    now: Now,
    rules: &Rules,
) -> Step<HolderAnswer> {
    let write = rules.durable.then(|| Write::Put {
        token: slot.token,
        old: None,
        record: Record {
            retention_ms: extra.retention_ms,
            ..with_progress(
                inflight_record(
                    key,
                    extra.fingerprint,
                    slot.attempt,
                    extra.checkpoint.clone(),
                    // Rounded up: the stored end is never before the real one.
                    now.wall_ms_ceil_at(slot.deadline_ns),
                ),
                &extra,
                rules,
            )
        },
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
        fingerprint: record.fingerprint,
        checkpoint: held.checkpoint.clone(),
        first_claimed_wall_ms: record.first_claimed_at.map_or(0, wall_ms),
        attempt_started_wall_ms: held.attempt_started_wall_ms,
        failed: held.failed,
        ended_wall_ms: if over { deadline_ms } else { 0 },
        lease_ms: held.lease_ms,
        claim_id: held.claim_id,
        ..Extra::default()
    };
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
        fingerprint: record.fingerprint,
        response: Some(response.clone()),
        expires_wall_ms: expires_at_ms,
        first_claimed_wall_ms: record.first_claimed_at.map_or(0, wall_ms),
        completed_wall_ms: now.wall_ms,
        ..Extra::default()
    };
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
    debug_assert!(now_ns >= slot.deadline_ns, "a live lease is never evicted");
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
// markers: the second tier of retention
// ---------------------------------------------------------------------------------------

/// The second tier of retention: after a completion's retention, a marker of it is kept
/// for `retention` more (docs/retention.md, "Markers: the second tier").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MarkerRules {
    pub(crate) retention: Duration,
    /// A file backs the engine: the writer builds the marker's row from the completion's
    /// record in the commit that deletes it, and settles the marker in memory after it.
    pub(crate) durable: bool,
}

/// A completion past its retention is removed (as [`expire`] removes it) and leaves a
/// marker `id` until its end of retention plus the marker retention. The marker is `None`
/// when that end has passed too: the removal is then a plain expiry. A durable engine's
/// marker is pending until the writer has committed its row (its fingerprint and completion
/// time come from the record); a memory-only engine's comes from the side data, which holds
/// the response, the fingerprint and the completion time. `None` if `slot` is not a
/// completion past its retention.
pub(crate) fn forget(
    slot: &Slot,
    extra: Option<&Extra>,
    id: MarkerId,
    rules: &MarkerRules,
    now_ns: u64,
) -> Option<Step<Option<Marker>>> {
    let expired = expire(slot, now_ns)?;
    let end_ns = slot
        .deadline_ns
        .saturating_add(duration_ns(rules.retention));
    if end_ns <= now_ns {
        return Some(Step {
            change: expired.change,
            write: expired.write,
            answer: None,
            deltas: expired.deltas,
        });
    }
    let marker = if rules.durable {
        Marker::pending(id, slot.token, slot.attempt, end_ns)
    } else {
        Marker::kept(
            id,
            slot.token,
            slot.attempt,
            extra.and_then(|e| e.fingerprint),
            extra.map_or(0, |e| e.completed_wall_ms),
            end_ns,
        )
    };
    let write = Write::Forget {
        token: slot.token,
        hash: id.hash,
        check: id.check,
        marker_retention_ms: duration_ms(rules.retention),
    };
    Some(Step {
        change: Change::Remove,
        write: Some(write),
        answer: Some(marker),
        deltas: expired.deltas,
    })
}

/// The sweeper removes a marker at its end (`None` before it). The key's slot, if any, is
/// not touched.
pub(crate) fn end_marker(marker: &Marker, now_ns: u64, durable: bool) -> Option<Step<()>> {
    if !marker.is_ended(now_ns) {
        return None;
    }
    let write = durable.then_some(Write::DropMarker {
        hash: marker.hash,
        token: marker.token,
    });
    Some(Step {
        change: Change::Keep,
        write,
        answer: (),
        deltas: NONE,
    })
}

/// What a claim of a key without a slot decides on the key's marker.
#[derive(Debug, Clone)]
pub(crate) enum MarkerAnswer {
    /// The key was completed and its response is no longer kept.
    Forgotten(Forgotten),
    /// The marker's row is not committed yet (a durable engine, for one commit).
    Busy(Busy),
    FingerprintMismatch,
    /// The key is new (the marker ended), or the caller asked to run it again: the claim
    /// acquires it as a new key, dropping the marker with its write.
    Acquire,
}

/// A claim looks at the marker of a key that has no slot: `Forgotten` while the marker
/// lasts, unless the claim's fingerprint differs (`FingerprintMismatch`, as for a
/// completion) or it asks to run a forgotten key again (`rerun`).
pub(crate) fn claim_marker(
    marker: &Marker,
    asked: Option<AskedFingerprint>,
    rerun: bool,
    now: Now,
) -> Step<MarkerAnswer> {
    if marker.is_ended(now.mono_ns) {
        return Step::answer(MarkerAnswer::Acquire, NONE);
    }
    if marker.is_pending() {
        let busy = Busy {
            retry_after: RETRY_AFTER_UNPUBLISHED,
            attempt: marker.attempt,
            completing: true,
        };
        let deltas = Deltas {
            in_progress: 1,
            ..NONE
        };
        return Step::answer(MarkerAnswer::Busy(busy), deltas);
    }
    if let (Some(asked), Some(stored)) = (asked, marker.fingerprint()) {
        if !asked.matches(stored) {
            let deltas = Deltas {
                fingerprint_mismatches: 1,
                ..NONE
            };
            return Step::answer(MarkerAnswer::FingerprintMismatch, deltas);
        }
    }
    if rerun {
        return Step::answer(MarkerAnswer::Acquire, NONE);
    }
    let forgotten = Forgotten {
        completed_wall_ms: marker.completed_wall_ms,
        attempt: marker.attempt,
        kept_until_wall_ms: wall_ms_at(now.wall_ms, now.mono_ns, marker.end_ns),
    };
    let deltas = Deltas {
        forgotten: 1,
        ..NONE
    };
    Step::answer(MarkerAnswer::Forgotten(forgotten), deltas)
}

/// Recovery finds a completion past its retention: with markers on and its marker's window
/// still open at `now`, it leaves the marker it would have left had the sweeper removed it
/// before the restart (the writer builds the same row from the record, with
/// [`Write::Forget`]). `None`: no marker.
pub(crate) fn recover_marker(
    token: u64,
    head: &HeadState,
    fingerprint: Option<u128>,
    id: MarkerId,
    rules: &MarkerRules,
    now: Now,
) -> Option<Marker> {
    let HeadState::Completed {
        attempt,
        completed_wall_ms,
        expires_wall_ms,
    } = *head
    else {
        return None;
    };
    let end_wall_ms = expires_wall_ms.saturating_add(duration_ms(rules.retention));
    loaded_marker(
        id,
        token,
        attempt,
        fingerprint,
        completed_wall_ms,
        end_wall_ms,
        now,
    )
}

/// A marker row read from the file at `now`, in memory: `None` if it has ended.
pub(crate) fn loaded_marker(
    id: MarkerId,
    token: u64,
    attempt: u32,
    fingerprint: Option<u128>,
    completed_wall_ms: u64,
    end_wall_ms: u64,
    now: Now,
) -> Option<Marker> {
    if end_wall_ms <= now.wall_ms {
        return None;
    }
    let left_ns = (end_wall_ms - now.wall_ms).saturating_mul(1_000_000);
    Some(Marker::kept(
        id,
        token,
        attempt,
        fingerprint,
        completed_wall_ms,
        now.mono_ns.saturating_add(left_ns),
    ))
}

// ---------------------------------------------------------------------------------------
// recovery
// ---------------------------------------------------------------------------------------

/// How recovery treats the InFlight records a previous process left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reopen {
    pub(crate) recovery: Recovery,
    /// The configured lease, which caps an honoured lease whose record does not keep its
    /// own length (a record of format 1 or 2).
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
}

/// What recovery does with one record of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one record's verdict lives on the stack for one call; boxing its side data \
              would allocate per record"
)]
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

/// Recovery classifies the record under `token`, decoded to its head, at `now`. An InFlight
/// record with its own `retention_ms` is reaped that long after its lease end, and keeps it
/// for its completion and takeover. `first_claimed_wall_ms` is the record's first-claimed
/// instant (0: unknown).
pub(crate) fn recover(
    token: u64,
    head: HeadState,
    fingerprint: Option<u128>,
    own_retention_ms: Option<u64>,
    now: Now,
    reopen: &Reopen,
    first_claimed_wall_ms: u64,
) -> Recovered {
    let retention_ms = own_retention_ms.unwrap_or_else(|| duration_ms(reopen.retention));
    match head {
        HeadState::Completed {
            expires_wall_ms, ..
        } if expires_wall_ms <= now.wall_ms => Recovered::Expired,
        HeadState::Completed {
            attempt,
            expires_wall_ms,
            ..
        } => {
            let left_ns = now.ns_until_wall_ms(expires_wall_ms);
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
            attempt_started_wall_ms,
            failed,
            lease_ms,
            claim_id,
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
                // The owner is dead: redb locks the file to one process. A failed claim's
                // lease ended when its holder failed it.
                Recovery::TakeOver => now.mono_ns,
                _ if failed => now.mono_ns,
                // What is left of the recorded lease, capped by the length its holder was
                // given (a wall clock that jumped back must not keep a dead claim alive
                // longer than one of its leases); a record without it: the engine's lease.
                Recovery::HonourLeases => {
                    let cap_ns = lease_ms
                        .map_or(duration_ns(reopen.lease), |ms| ms.saturating_mul(1_000_000));
                    let left_ns = now.ns_until_wall_ms(lease_deadline_wall_ms).min(cap_ns);
                    now.mono_ns.saturating_add(left_ns)
                }
            };
            // A lease already over when the file recorded it keeps that end for reports (a
            // failed one's record holds the instant of the fail, whatever the clock says).
            let over =
                deadline_ns <= now.mono_ns && (failed || lease_deadline_wall_ms <= now.wall_ms);
            let extra = Extra {
                fingerprint,
                checkpoint,
                retention_ms: own_retention_ms,
                first_claimed_wall_ms,
                attempt_started_wall_ms,
                failed,
                ended_wall_ms: if over { lease_deadline_wall_ms } else { 0 },
                lease_ms,
                claim_id,
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

#[cfg(test)]
mod tests {
    //! Every cell of the state table, without an engine: the new state, the queued write,
    //! the answer and the counts of each transition.

    use super::*;
    use crate::base::clock::wall_time;

    const KEY: &[u8] = b"k";
    /// `KEY` as the transitions take it: its scoped key (unscoped).
    const K: KeyRef<'static> = KeyRef::Bytes(b"\0k");
    const MS: u64 = 1_000_000;
    /// Monotonic instants (ns): leases of the fixtures end at `END`, completions expire at
    /// `EXPIRES`.
    const END: u64 = 100 * MS;
    const EXPIRES: u64 = 500 * MS;
    const LIVE: u64 = 50 * MS;
    const WALL0: u64 = 1_700_000_000_000;
    /// When the fixtures' key was first claimed (wall ms), before its current attempt.
    const FIRST_CLAIMED: u64 = WALL0 - 60_000;
    const RETENTION: Duration = Duration::from_secs(10);
    const LEASE: Duration = Duration::from_secs(30);

    fn at(mono_ns: u64) -> Now {
        Now::new(mono_ns, WALL0 * MS + mono_ns)
    }

    fn rules(durable: bool) -> Rules {
        Rules {
            retention: RETENTION,
            response_len_max: 16,
            durable,
            lease: LEASE,
        }
    }

    fn durable() -> Rules {
        rules(true)
    }

    fn memory() -> Rules {
        rules(false)
    }

    fn ask(fingerprint: u64) -> Option<AskedFingerprint> {
        Some(AskedFingerprint {
            value: u128::from(fingerprint),
            legacy: None,
        })
    }

    fn fp(fingerprint: u64) -> Extra {
        Extra {
            fingerprint: Some(u128::from(fingerprint)),
            ..Extra::default()
        }
    }

    /// The states of the table's columns, each with its side data (fingerprint 7, and a
    /// checkpoint for leases, a response for a memory-only completion).
    struct States {
        lease: Slot,
        lease_extra: Extra,
        done: Slot,
        done_unpublished: Slot,
        done_extra: Extra,
    }

    fn states() -> States {
        States {
            lease: Slot::inflight(5, END, 2),
            lease_extra: Extra {
                fingerprint: Some(7),
                checkpoint: Some(Checkpoint::new(3, b"half")),
                first_claimed_wall_ms: FIRST_CLAIMED,
                attempt_started_wall_ms: WALL0,
                ..Extra::default()
            },
            done: Slot::completed(5, EXPIRES, 2, true),
            done_unpublished: Slot::completed(5, EXPIRES, 2, false),
            done_extra: Extra {
                fingerprint: Some(7),
                response: Some(Arc::from(&b"resp"[..])),
                expires_wall_ms: WALL0 + 10_000,
                ..Extra::default()
            },
        }
    }

    fn view<'a>(slot: Slot, extra: &'a Extra) -> View<'a> {
        View {
            slot: Some(slot),
            extra: Some(extra),
        }
    }

    fn plan_of(step: Step<ClaimAnswer>) -> Plan {
        assert_eq!(
            step.change,
            Change::Keep,
            "a claim decides before it changes"
        );
        assert_eq!(step.write, None);
        match step.answer {
            ClaimAnswer::Acquire(plan) => plan,
            other => panic!("expected Acquire, got {other:?}"),
        }
    }

    fn busy_of(step: Step<ClaimAnswer>) -> Busy {
        assert_eq!(step.change, Change::Keep);
        assert_eq!(step.write, None);
        assert_eq!(
            step.deltas,
            Deltas {
                in_progress: 1,
                ..NONE
            }
        );
        match step.answer {
            ClaimAnswer::Busy(busy) => busy,
            other => panic!("expected Busy, got {other:?}"),
        }
    }

    // --- claim -------------------------------------------------------------------------

    #[test]
    fn claim_of_an_absent_key_acquires_a_new_key() {
        let plan = plan_of(claim(View::ABSENT, ask(9), None, LIVE));
        assert_eq!(
            plan,
            Plan {
                claim_id: None,
                kind: Acquiring::New,
                old: None,
                attempt: 1,
                fingerprint: Some(9),
                checkpoint: None,
                reserve: true,
                adopt: false,
                retention_ms: None,
                first_claimed_wall_ms: None,
            }
        );
        let step = acquire(plan, K, 11, LEASE, at(LIVE), &durable());
        let deadline = LIVE + LEASE.as_nanos() as u64;
        // A new key: first claimed now, and its attempt started now.
        let extra = Extra {
            first_claimed_wall_ms: at(LIVE).wall_ms,
            attempt_started_wall_ms: at(LIVE).wall_ms,
            lease_ms: Some(LEASE.as_millis() as u64),
            ..fp(9)
        };
        assert_eq!(
            step.change,
            Change::Put {
                slot: Slot::inflight(11, deadline, 1),
                extra: extra.clone(),
                reap_ns: None,
                adopt: false,
            }
        );
        let lease_end_wall = at(LIVE).wall_ms + 30_000;
        let record = with_progress(
            inflight_record(K, Some(9), 1, None, lease_end_wall),
            &extra,
            &durable(),
        );
        assert_eq!(record.first_claimed_wall_ms, at(LIVE).wall_ms);
        assert!(matches!(
            record.state,
            RecordState::InFlight { attempt_started_wall_ms, failed: false, .. }
                if attempt_started_wall_ms == at(LIVE).wall_ms
        ));
        assert_eq!(
            step.write,
            Some(Write::Put {
                token: 11,
                old: None,
                record,
            })
        );
        assert_eq!(
            step.answer,
            Acquired {
                token: 11,
                attempt: 1,
                checkpoint: None
            }
        );
        assert_eq!(
            step.deltas,
            Deltas {
                acquired: 1,
                ..NONE
            }
        );
    }

    #[test]
    fn claim_of_an_expired_completion_acquires_it_afresh_whatever_its_fingerprint() {
        let st = states();
        let now = EXPIRES;
        // The stored fingerprint belongs to the expired completion: not checked.
        let plan = plan_of(claim(view(st.done, &st.done_extra), ask(8), None, now));
        assert_eq!(
            (
                plan.kind,
                plan.old,
                plan.attempt,
                plan.fingerprint,
                plan.reserve
            ),
            (Acquiring::Expired, Some(5), 1, Some(8), true)
        );
        assert_eq!(plan.checkpoint, None);
        let step = acquire(plan, K, 12, LEASE, at(now), &durable());
        assert!(matches!(
            step.write,
            Some(Write::Put {
                token: 12,
                old: Some(5),
                ..
            })
        ));
        assert!(
            matches!(step.change, Change::Put { slot, .. } if slot == Slot::inflight(12, now + LEASE.as_nanos() as u64, 1))
        );
        assert_eq!(
            step.deltas,
            Deltas {
                completed: -1,
                acquired: 1,
                ..NONE
            }
        );
    }

    #[test]
    fn claim_of_a_live_lease_is_busy_until_its_end() {
        let st = states();
        let busy = busy_of(claim(view(st.lease, &st.lease_extra), None, None, LIVE));
        assert_eq!(busy.retry_after, Duration::from_nanos(END - LIVE));
        assert_eq!((busy.attempt, busy.completing), (2, false));
        // One nanosecond before the end it is still live.
        let busy = busy_of(claim(
            view(st.lease, &st.lease_extra),
            ask(7),
            None,
            END - 1,
        ));
        assert_eq!(busy.retry_after, Duration::from_nanos(1));
    }

    #[test]
    fn claim_of_a_lease_that_is_over_takes_it_over_keeping_checkpoint_and_fingerprint() {
        let st = states();
        let plan = plan_of(claim(view(st.lease, &st.lease_extra), None, None, END));
        assert_eq!(
            plan,
            Plan {
                claim_id: None,
                kind: Acquiring::Takeover,
                old: Some(5),
                attempt: 3,
                fingerprint: Some(7),
                checkpoint: st.lease_extra.checkpoint.clone(),
                // It still holds its place in the live count: inherited.
                reserve: false,
                adopt: false,
                retention_ms: None,
                first_claimed_wall_ms: Some(FIRST_CLAIMED),
            }
        );
        let step = acquire(plan, K, 20, LEASE, at(END), &durable());
        let cp = st.lease_extra.checkpoint.clone();
        // The first claim is kept; the new attempt starts now.
        let extra = Extra {
            fingerprint: Some(7),
            checkpoint: cp.clone(),
            first_claimed_wall_ms: FIRST_CLAIMED,
            attempt_started_wall_ms: at(END).wall_ms,
            lease_ms: Some(LEASE.as_millis() as u64),
            ..Extra::default()
        };
        assert_eq!(
            step.change,
            Change::Put {
                slot: Slot::inflight(20, END + LEASE.as_nanos() as u64, 3),
                extra: extra.clone(),
                reap_ns: None,
                adopt: false,
            }
        );
        assert_eq!(
            step.write,
            Some(Write::Put {
                token: 20,
                old: Some(5),
                record: with_progress(
                    inflight_record(K, Some(7), 3, cp.clone(), at(END).wall_ms + 30_000),
                    &extra,
                    &durable()
                ),
            })
        );
        assert_eq!(
            step.answer,
            Acquired {
                token: 20,
                attempt: 3,
                checkpoint: cp
            }
        );
        assert_eq!(
            step.deltas,
            Deltas {
                acquired: 1,
                takeovers: 1,
                ..NONE
            }
        );
    }

    #[test]
    fn a_takeover_of_an_abandoned_lease_reserves_a_place_and_adopts_it() {
        let st = states();
        let abandoned = st.lease.into_abandoned();
        let plan = plan_of(claim(
            view(abandoned, &st.lease_extra),
            ask(7),
            None,
            END + 1,
        ));
        assert_eq!((plan.reserve, plan.adopt, plan.attempt), (true, true, 3));
        let step = acquire(plan, K, 21, LEASE, at(END + 1), &memory());
        assert!(matches!(step.change, Change::Put { adopt: true, .. }));
        assert_eq!(step.write, None, "a memory-only engine builds no record");
    }

    #[test]
    fn claim_of_a_published_completion_replays_it() {
        let st = states();
        // Memory only: the response is beside the slot.
        let step = claim(view(st.done, &st.done_extra), ask(7), None, LIVE);
        assert_eq!((&step.change, &step.write), (&Change::Keep, &None));
        assert_eq!(step.deltas, Deltas { replays: 1, ..NONE });
        let ClaimAnswer::Replay(stored) = step.answer else {
            panic!("expected Replay");
        };
        assert_eq!(
            (&*stored.response, stored.token, stored.attempt),
            (&b"resp"[..], 5, 2)
        );
        // Durable: the response is in the file, read after the lock is dropped (and the
        // replay counted then).
        let extra = fp(7);
        let step = claim(view(st.done, &extra), None, None, EXPIRES - 1);
        assert!(matches!(
            step.answer,
            ClaimAnswer::ReplayFromFile { token: 5 }
        ));
        assert_eq!(step.deltas, NONE);
        // Without side data at all (a published durable completion drops it).
        let bare = View {
            slot: Some(st.done),
            extra: None,
        };
        assert!(matches!(
            claim(bare, ask(1), None, LIVE).answer,
            ClaimAnswer::ReplayFromFile { token: 5 }
        ));
    }

    #[test]
    fn claim_of_an_unpublished_completion_is_busy_completing() {
        let st = states();
        let busy = busy_of(claim(
            view(st.done_unpublished, &st.done_extra),
            None,
            None,
            LIVE,
        ));
        assert_eq!(
            (busy.retry_after, busy.attempt, busy.completing),
            (RETRY_AFTER_UNPUBLISHED, 2, true)
        );
    }

    #[test]
    fn a_fingerprint_mismatch_is_refused_in_every_state_that_has_one() {
        let st = states();
        let abandoned = st.lease.into_abandoned();
        let cells = [
            ("InFlight, live", view(st.lease, &st.lease_extra), LIVE),
            ("InFlight, over", view(st.lease, &st.lease_extra), END),
            ("InFlight, abandoned", view(abandoned, &st.lease_extra), END),
            ("Completed", view(st.done, &st.done_extra), LIVE),
            (
                "Completed, unpublished",
                view(st.done_unpublished, &st.done_extra),
                LIVE,
            ),
        ];
        for (name, v, now) in cells {
            let step = claim(v, ask(8), None, now);
            assert!(
                matches!(step.answer, ClaimAnswer::FingerprintMismatch),
                "{name}"
            );
            assert_eq!(
                (&step.change, &step.write),
                (&Change::Keep, &None),
                "{name}"
            );
            assert_eq!(
                step.deltas,
                Deltas {
                    fingerprint_mismatches: 1,
                    ..NONE
                },
                "{name}"
            );
            // The same fingerprint, or none asked, is never a mismatch.
            for asked in [ask(7), None] {
                let step = claim(v, asked, None, now);
                assert!(
                    !matches!(step.answer, ClaimAnswer::FingerprintMismatch),
                    "{name}"
                );
            }
        }
        // A state without a stored fingerprint is not checked.
        let none = Extra::default();
        let step = claim(view(st.lease, &none), ask(8), None, LIVE);
        assert!(matches!(step.answer, ClaimAnswer::Busy(_)));
        // Absent and expired have none to compare with.
        assert!(matches!(
            claim(View::ABSENT, ask(8), None, LIVE).answer,
            ClaimAnswer::Acquire(_)
        ));
    }

    // --- complete ------------------------------------------------------------------------

    fn complete_op() -> Holder {
        Holder::Complete {
            response: Arc::from(&b"out"[..]),
            retention_ms: None,
        }
    }

    fn lost(step: &Step<HolderAnswer>) {
        assert_eq!(step.answer, HolderAnswer::LeaseLost);
        assert_eq!((&step.change, &step.write), (&Change::Keep, &None));
        assert_eq!(
            step.deltas,
            Deltas {
                leases_lost: 1,
                ..NONE
            }
        );
    }

    #[test]
    fn complete_of_an_absent_or_expired_key_is_lease_lost() {
        let st = states();
        lost(&hold(
            View::ABSENT,
            K,
            5,
            complete_op(),
            at(LIVE),
            &durable(),
        ));
        let expired = view(st.done, &st.done_extra);
        lost(&hold(expired, K, 5, complete_op(), at(EXPIRES), &durable()));
    }

    #[test]
    fn complete_by_the_holder_completes_live_or_over_and_another_token_is_lease_lost() {
        let st = states();
        let v = view(st.lease, &st.lease_extra);
        // Live, and over (nobody took over): the same transition.
        for now in [LIVE, END, END + 1_000 * MS] {
            let step = hold(v, K, 5, complete_op(), at(now), &durable());
            assert_eq!(step.answer, HolderAnswer::Done);
            let expires_wall_ms = at(now).wall_ms + 10_000;
            assert_eq!(
                step.change,
                Change::Put {
                    // Unpublished until the writer commits it.
                    slot: Slot::completed(5, now + RETENTION.as_nanos() as u64, 2, false),
                    // The first claim is kept with the completion (the record has it).
                    extra: Extra {
                        fingerprint: Some(7),
                        response: Some(Arc::from(&b"out"[..])),
                        expires_wall_ms,
                        first_claimed_wall_ms: FIRST_CLAIMED,
                        completed_wall_ms: at(now).wall_ms,
                        ..Extra::default()
                    },
                    reap_ns: None,
                    adopt: false,
                }
            );
            assert_eq!(
                step.write,
                Some(Write::Put {
                    token: 5,
                    old: None,
                    record: Record {
                        key: RecordKey::copied(b"\0k"),
                        fingerprint: Some(7),
                        first_claimed_wall_ms: FIRST_CLAIMED,
                        retention_ms: None,
                        state: RecordState::Completed {
                            attempt: 2,
                            completed_wall_ms: at(now).wall_ms,
                            expires_wall_ms,
                            response: Blob(Arc::from(&b"out"[..])),
                        },
                    },
                })
            );
            assert_eq!(
                step.deltas,
                Deltas {
                    inflight: -1,
                    completed: 1,
                    completions: 1,
                    ..NONE
                }
            );
            // A superseded token (the key was taken over: it holds a newer one).
            lost(&hold(v, K, 4, complete_op(), at(now), &durable()));
        }
    }

    #[test]
    fn complete_in_a_memory_only_engine_is_published_at_once() {
        let st = states();
        let v = view(st.lease, &st.lease_extra);
        let step = hold(v, K, 5, complete_op(), at(LIVE), &memory());
        assert_eq!(step.write, None);
        assert!(
            matches!(&step.change, Change::Put { slot, extra, .. } if slot.is_published() && extra.response.is_some())
        );
    }

    #[test]
    fn complete_of_a_completion_is_a_repeat_for_its_token_and_lease_lost_otherwise() {
        let st = states();
        for (slot, published) in [(st.done, true), (st.done_unpublished, false)] {
            let v = view(slot, &st.done_extra);
            let step = hold(v, K, 5, complete_op(), at(LIVE), &durable());
            assert_eq!(step.answer, HolderAnswer::Repeat { published });
            assert_eq!((&step.change, &step.write), (&Change::Keep, &None));
            assert_eq!(step.deltas, NONE);
            lost(&hold(v, K, 6, complete_op(), at(LIVE), &durable()));
        }
    }

    // --- release -------------------------------------------------------------------------

    fn not_held(step: &Step<HolderAnswer>) {
        assert_eq!(step.answer, HolderAnswer::NotHeld);
        assert_eq!((&step.change, &step.write), (&Change::Keep, &None));
        assert_eq!(
            step.deltas, NONE,
            "a release that holds nothing counts nothing"
        );
    }

    #[test]
    fn release_by_the_holder_makes_the_key_absent_live_or_over() {
        let st = states();
        let v = view(st.lease, &st.lease_extra);
        for now in [LIVE, END] {
            let step = hold(v, K, 5, Holder::Release, at(now), &durable());
            assert_eq!(step.answer, HolderAnswer::Done);
            assert_eq!(step.change, Change::Remove);
            assert_eq!(step.write, Some(Write::Delete { token: 5 }));
            assert_eq!(
                step.deltas,
                Deltas {
                    inflight: -1,
                    releases: 1,
                    ..NONE
                }
            );
            not_held(&hold(v, K, 4, Holder::Release, at(now), &durable()));
        }
        let step = hold(v, K, 5, Holder::Release, at(LIVE), &memory());
        assert_eq!((step.change, step.write), (Change::Remove, None));
    }

    #[test]
    fn release_of_an_absent_expired_or_completed_key_holds_nothing() {
        let st = states();
        not_held(&hold(
            View::ABSENT,
            K,
            5,
            Holder::Release,
            at(LIVE),
            &durable(),
        ));
        let done = view(st.done, &st.done_extra);
        not_held(&hold(done, K, 5, Holder::Release, at(LIVE), &durable()));
        not_held(&hold(done, K, 5, Holder::Release, at(EXPIRES), &durable()));
        let unpublished = view(st.done_unpublished, &st.done_extra);
        not_held(&hold(
            unpublished,
            K,
            5,
            Holder::Release,
            at(LIVE),
            &durable(),
        ));
    }

    // --- fail ------------------------------------------------------------------------------

    #[test]
    fn fail_by_the_holder_ends_a_live_lease_now_and_keeps_the_record() {
        let st = states();
        let v = view(st.lease, &st.lease_extra);
        let step = hold(v, K, 5, Holder::Fail, at(LIVE), &durable());
        assert_eq!(step.answer, HolderAnswer::Done);
        let extra = Extra {
            failed: true,
            ..st.lease_extra.clone()
        };
        // The lease ends now: the index reaps it `retention` after this instant.
        assert_eq!(
            step.change,
            Change::Put {
                slot: Slot::inflight(5, LIVE, 2),
                extra: extra.clone(),
                reap_ns: None,
                adopt: false,
            }
        );
        let record = with_progress(
            inflight_record(
                K,
                Some(7),
                2,
                st.lease_extra.checkpoint.clone(),
                at(LIVE).wall_ms,
            ),
            &extra,
            &durable(),
        );
        assert!(matches!(
            record.state,
            RecordState::InFlight {
                failed: true,
                attempt_started_wall_ms: WALL0,
                ..
            }
        ));
        assert_eq!(record.first_claimed_wall_ms, FIRST_CLAIMED);
        assert_eq!(
            step.write,
            Some(Write::Put {
                token: 5,
                old: None,
                record,
            })
        );
        assert_eq!(
            step.deltas,
            Deltas {
                failures: 1,
                ..NONE
            }
        );
        // A memory-only engine keeps the same state and writes nothing.
        let step = hold(v, K, 5, Holder::Fail, at(LIVE), &memory());
        assert_eq!(step.write, None);
        assert!(matches!(step.change, Change::Put { slot, .. } if slot.deadline_ns == LIVE));
    }

    #[test]
    fn fail_of_a_lease_already_over_keeps_its_end() {
        let st = states();
        for slot in [st.lease, st.lease.into_abandoned()] {
            let v = view(slot, &st.lease_extra);
            let step = hold(v, K, 5, Holder::Fail, at(END + 7 * MS), &durable());
            assert_eq!(step.answer, HolderAnswer::Done);
            let Change::Put {
                slot: after, extra, ..
            } = &step.change
            else {
                panic!("expected Put, got {:?}", step.change);
            };
            assert_eq!(
                after.deadline_ns, END,
                "the end, and so the reap instant, stay"
            );
            assert!(extra.failed);
            assert!(matches!(
                &step.write,
                Some(Write::Put { record, .. }) if matches!(
                    record.state,
                    RecordState::InFlight { lease_deadline_wall_ms, failed: true, .. }
                        if lease_deadline_wall_ms == at(END).wall_ms
                )
            ));
        }
    }

    #[test]
    fn fail_without_the_key_is_not_held() {
        let st = states();
        let cells = [
            ("Absent", View::ABSENT),
            ("another token", view(st.lease, &st.lease_extra)),
            ("Completed", view(st.done, &st.done_extra)),
            (
                "Completed, unpublished",
                view(st.done_unpublished, &st.done_extra),
            ),
        ];
        for (name, v) in cells {
            let token = if name == "another token" { 4 } else { 5 };
            let step = hold(v, K, token, Holder::Fail, at(LIVE), &durable());
            assert_eq!(step.answer, HolderAnswer::NotHeld, "{name}");
            assert_eq!(
                (&step.change, &step.write),
                (&Change::Keep, &None),
                "{name}"
            );
            assert_eq!(step.deltas, NONE, "{name}");
        }
    }

    #[test]
    fn a_failed_key_is_taken_over_at_once_with_its_progress_and_guarded_by_its_fingerprint() {
        let st = states();
        let failed = Extra {
            failed: true,
            ..st.lease_extra.clone()
        };
        let slot = Slot::inflight(5, LIVE, 2);
        // At the instant of the fail, as any time after.
        let plan = plan_of(claim(view(slot, &failed), ask(7), None, LIVE));
        assert_eq!(
            (plan.kind, plan.attempt, &plan.checkpoint, plan.fingerprint),
            (Acquiring::Takeover, 3, &failed.checkpoint, Some(7))
        );
        assert_eq!(plan.first_claimed_wall_ms, Some(FIRST_CLAIMED));
        let step = acquire(plan, K, 9, LEASE, at(LIVE + MS), &durable());
        let Change::Put { extra, .. } = &step.change else {
            panic!("expected Put");
        };
        // The new attempt is not failed; it started now; the first claim is kept.
        assert!(!extra.failed);
        assert_eq!(
            (extra.first_claimed_wall_ms, extra.attempt_started_wall_ms),
            (FIRST_CLAIMED, at(LIVE + MS).wall_ms)
        );
        // Another payload cannot take the key.
        assert!(matches!(
            claim(view(slot, &failed), ask(8), None, LIVE).answer,
            ClaimAnswer::FingerprintMismatch
        ));
    }

    #[test]
    fn a_failed_lease_is_never_extended_but_its_holder_may_still_settle_it() {
        let st = states();
        let failed = Extra {
            failed: true,
            ..st.lease_extra.clone()
        };
        let v = view(Slot::inflight(5, LIVE, 2), &failed);
        lost(&hold(
            v,
            K,
            5,
            Holder::Extend { lease: LEASE },
            at(LIVE),
            &durable(),
        ));
        // Until someone takes it over, the failed token may complete, checkpoint or release.
        let cp = Holder::Checkpoint(Checkpoint::new(9, b"more"));
        for op in [complete_op(), cp, Holder::Release] {
            let step = hold(v, K, 5, op.clone(), at(LIVE + MS), &durable());
            assert_eq!(step.answer, HolderAnswer::Done, "{op:?}");
        }
        // An extend of a lease loaded already over forgets the recorded end.
        let loaded = Extra {
            ended_wall_ms: WALL0,
            ..st.lease_extra.clone()
        };
        let v = view(Slot::inflight(5, LIVE, 2), &loaded);
        let step = hold(
            v,
            K,
            5,
            Holder::Extend { lease: LEASE },
            at(LIVE),
            &durable(),
        );
        let Change::Put { extra, .. } = &step.change else {
            panic!("expected Put");
        };
        assert_eq!(extra.ended_wall_ms, 0);
    }

    #[test]
    fn the_lease_end_reported_is_when_it_ended() {
        let st = states();
        // Live: its deadline; over: its deadline, in the past (not now).
        assert_eq!(
            lease_end_wall_ms(&st.lease, Some(&st.lease_extra), at(LIVE)),
            at(END).wall_ms
        );
        assert_eq!(
            lease_end_wall_ms(&st.lease, Some(&st.lease_extra), at(END + 500 * MS)),
            at(END).wall_ms
        );
        // Loaded already over: the end the file recorded.
        let loaded = Extra {
            ended_wall_ms: WALL0 - 9_000,
            ..st.lease_extra.clone()
        };
        let at_open = Slot::inflight(5, LIVE, 2);
        assert_eq!(
            lease_end_wall_ms(&at_open, Some(&loaded), at(LIVE + MS)),
            WALL0 - 9_000
        );
    }

    #[test]
    fn recovery_takes_a_failed_record_over_at_once_in_both_modes() {
        let now = at(LIVE);
        let failed_at = now.wall_ms - 5;
        let head = HeadState::InFlight {
            lease_ms: None,
            claim_id: None,
            lease_deadline_wall_ms: failed_at,
            attempt: 2,
            attempt_started_wall_ms: failed_at - 100,
            failed: true,
            checkpoint: Some(Checkpoint::new(1, b"c")),
        };
        for recovery in [Recovery::TakeOver, Recovery::HonourLeases] {
            let Recovered::Load {
                slot,
                extra,
                reap_ns,
            } = recover(
                5,
                head.clone(),
                Some(7),
                None,
                now,
                &reopen(recovery),
                FIRST_CLAIMED,
            )
            else {
                panic!("expected Load");
            };
            assert_eq!(slot, Slot::inflight(5, LIVE, 2), "{recovery:?}");
            assert_eq!(
                reap_ns,
                Some(LIVE + (RETENTION.as_millis() as u64 - 5) * MS),
                "reaped at the fail plus retention"
            );
            assert!(extra.failed);
            assert_eq!(
                (
                    extra.first_claimed_wall_ms,
                    extra.attempt_started_wall_ms,
                    extra.ended_wall_ms
                ),
                (FIRST_CLAIMED, failed_at - 100, failed_at)
            );
        }
        // Even with a lease end the wall clock has not reached (a clock stepped back).
        let ahead = HeadState::InFlight {
            lease_ms: None,
            claim_id: None,
            lease_deadline_wall_ms: now.wall_ms + 60_000,
            attempt: 2,
            attempt_started_wall_ms: 0,
            failed: true,
            checkpoint: None,
        };
        let Recovered::Load { slot, .. } = recover(
            5,
            ahead,
            None,
            None,
            now,
            &reopen(Recovery::HonourLeases),
            0,
        ) else {
            panic!("expected Load");
        };
        assert_eq!(slot.deadline_ns, LIVE);
    }

    #[test]
    fn import_of_a_failed_record_keeps_it_failed_and_over() {
        let now = at(LIVE);
        let info = RecordInfo {
            state: RecordInfoState::InFlight {
                lease: None,
                claim_id: None,
                lease_deadline: wall_time(now.wall_ms - 3),
                checkpoint: Some((1, b"c".to_vec())),
                attempt_started_at: Some(wall_time(now.wall_ms - 50)),
                failed: true,
            },
            ..record(42, completed_info(0, b"", true))
        };
        let step = import(View::ABSENT, K, &info, 42, now, &durable()).expect("imported");
        let Change::Put { slot, extra, .. } = &step.change else {
            panic!("expected Put");
        };
        assert_eq!(slot.deadline_ns, LIVE, "taken over at once");
        assert_eq!(
            (
                extra.failed,
                extra.first_claimed_wall_ms,
                extra.attempt_started_wall_ms,
                extra.ended_wall_ms
            ),
            (true, FIRST_CLAIMED, now.wall_ms - 50, now.wall_ms - 3)
        );
        assert!(matches!(
            &step.write,
            Some(Write::Put { record, .. }) if record.first_claimed_wall_ms == FIRST_CLAIMED
                && matches!(record.state, RecordState::InFlight { failed: true, .. })
        ));
    }

    // --- claim identity ----------------------------------------------------------------------

    #[test]
    fn a_claim_presenting_its_holders_identity_resumes_the_lease_live_or_over() {
        let st = states();
        let id = Some(0xC1A1_u128 << 64 | 1);
        let extra = Extra {
            claim_id: id,
            lease_ms: Some(600_000),
            ..st.lease_extra.clone()
        };
        let v = view(st.lease, &extra);
        for now in [LIVE, END + 7 * MS] {
            // The same identity (and a matching fingerprint, or none): the holder's lease.
            for asked in [ask(7), None] {
                let step = claim(v, asked, id, now);
                assert_eq!(step.answer_kind(), "resume 5");
                assert_eq!(
                    (step.change.clone(), step.write.clone()),
                    (Change::Keep, None)
                );
            }
            // Another identity, or none: as without identities.
            let other = claim(v, ask(7), Some(2), now);
            let none = claim(v, ask(7), None, now);
            for step in [other, none] {
                let want = if now < END { "busy" } else { "acquire" };
                assert_eq!(step.answer_kind(), want);
            }
            // A different fingerprint is refused first.
            assert_eq!(claim(v, ask(8), id, now).answer_kind(), "mismatch");
            // Resumed: renewed for the claim's lease, same token, attempt and checkpoint,
            // the record rewritten with the new end and length.
            let lease = Duration::from_secs(40);
            let step = resume(v, K, 5, lease, at(now), &durable()).expect("resumable");
            assert_eq!(
                step.answer,
                Acquired {
                    token: 5,
                    attempt: 2,
                    checkpoint: st.lease_extra.checkpoint.clone(),
                }
            );
            let Change::Put { slot, extra: e, .. } = &step.change else {
                panic!("{:?}", step.change);
            };
            assert_eq!(*slot, Slot::inflight(5, now + 40_000 * MS, 2));
            assert_eq!((e.lease_ms, e.claim_id), (Some(40_000), id));
            assert!(matches!(
                &step.write,
                Some(Write::Put { token: 5, record, .. }) if matches!(record.state,
                    RecordState::InFlight { lease_ms: Some(40_000), claim_id, attempt: 2, .. }
                        if claim_id == id)
            ));
            assert_eq!(step.deltas.acquired, 1);
        }
        // A failed lease is never resumed: the next claim takes it over.
        let failed = Extra {
            failed: true,
            ..extra.clone()
        };
        let over = Slot::inflight(5, LIVE, 2);
        assert_eq!(
            claim(view(over, &failed), ask(7), id, LIVE).answer_kind(),
            "acquire"
        );
        assert!(resume(view(over, &failed), K, 5, LEASE, at(LIVE), &durable()).is_none());
        // A takeover keeps the new claim's identity, not the old holder's.
        let plan = plan_of(claim(v, ask(7), Some(3), END));
        let step = acquire(plan, K, 20, LEASE, at(END), &durable());
        let Change::Put { extra: e, .. } = &step.change else {
            panic!("{:?}", step.change);
        };
        assert_eq!(e.claim_id, Some(3));
    }

    impl Step<ClaimAnswer> {
        /// The kind of a claim's answer, for compact assertions.
        fn answer_kind(&self) -> String {
            match &self.answer {
                ClaimAnswer::Acquire(_) => "acquire".into(),
                ClaimAnswer::Busy(_) => "busy".into(),
                ClaimAnswer::Resume { token } => format!("resume {token}"),
                ClaimAnswer::FingerprintMismatch => "mismatch".into(),
                ClaimAnswer::Replay(_) | ClaimAnswer::ReplayFromFile { .. } => "replay".into(),
            }
        }
    }

    /// A lease's stored end is never before its real one: an instant a fraction of a
    /// millisecond past the wall clock's grid rounds the stored end up, on a claim and on an
    /// extension, and the reported end too.
    #[test]
    fn a_stored_lease_end_is_rounded_up_to_the_millisecond() {
        let sub = 400_000; // 0.4 ms past the wall grid
        let now = Now::new(LIVE, WALL0 * MS + LIVE + sub);
        assert_eq!(now.wall_sub_ns, (LIVE + sub) % MS);
        let exact_end_ns = WALL0 * MS + LIVE + sub + LEASE.as_nanos() as u64;
        let plan = plan_of(claim(View::ABSENT, ask(9), None, LIVE));
        let step = acquire(plan, K, 11, LEASE, now, &durable());
        let Some(Write::Put { record, .. }) = &step.write else {
            panic!("{:?}", step.write);
        };
        let RecordState::InFlight {
            lease_deadline_wall_ms,
            lease_ms,
            ..
        } = record.state
        else {
            panic!("{:?}", record.state);
        };
        assert_eq!(lease_deadline_wall_ms, exact_end_ns.div_ceil(MS));
        assert!(lease_deadline_wall_ms * MS >= exact_end_ns);
        assert_eq!(lease_ms, Some(30_000));
        // A zero lease ends now: stored as the next whole millisecond, not the one before.
        let plan = plan_of(claim(View::ABSENT, None, None, LIVE));
        let zero = acquire(plan, K, 12, Duration::ZERO, now, &durable());
        assert!(matches!(
            &zero.write,
            Some(Write::Put { record, .. }) if matches!(record.state,
                RecordState::InFlight { lease_deadline_wall_ms, lease_ms: Some(0), .. }
                    if lease_deadline_wall_ms == now.wall_ms + 1)
        ));
        // Extended at the same kind of instant.
        let Change::Put { slot, extra, .. } = step.change else {
            panic!()
        };
        let later = Now::new(LIVE + 3 * MS, WALL0 * MS + LIVE + 3 * MS + sub);
        let ext = hold(
            view(slot, &extra),
            K,
            11,
            Holder::Extend {
                lease: Duration::from_nanos(5_000 * MS + 1),
            },
            later,
            &durable(),
        );
        let exact_ns = WALL0 * MS + LIVE + 3 * MS + sub + 5_000 * MS + 1;
        assert!(matches!(
            &ext.write,
            Some(Write::Put { record, .. }) if matches!(record.state,
                RecordState::InFlight { lease_deadline_wall_ms, lease_ms: Some(5_001), .. }
                    if lease_deadline_wall_ms == exact_ns.div_ceil(MS))
        ));
        // Reported: the end rounded up too.
        let Change::Put { slot, extra, .. } = ext.change else {
            panic!()
        };
        assert_eq!(
            lease_end_wall_ms(&slot, Some(&extra), later),
            exact_ns.div_ceil(MS)
        );
    }

    /// With `HonourLeases`, a recovered lease keeps what is left of it, capped by the length
    /// its holder was given: a 600 s lease survives a restart past the engine's 30 s, and a
    /// deadline pushed far out by a wall-clock jump is still capped, by that length. A record
    /// that does not keep a length (formats 1 and 2) is capped by the engine's lease.
    #[test]
    fn an_honoured_lease_is_capped_by_its_own_length() {
        let now = at(LIVE);
        let honour = reopen(Recovery::HonourLeases);
        let head = |left_ms: u64, lease_ms| HeadState::InFlight {
            lease_deadline_wall_ms: now.wall_ms + left_ms,
            attempt: 1,
            attempt_started_wall_ms: 0,
            failed: false,
            checkpoint: None,
            lease_ms,
            claim_id: Some(9),
        };
        let deadline = |h| match recover(5, h, None, None, now, &honour, 0) {
            Recovered::Load { slot, extra, .. } => {
                assert_eq!((extra.lease_ms.is_some(), extra.claim_id), (true, Some(9)));
                slot.deadline_ns
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(deadline(head(590_000, Some(600_000))), LIVE + 590_000 * MS);
        assert_eq!(
            deadline(head(86_400_000, Some(600_000))),
            LIVE + 600_000 * MS
        );
        assert_eq!(deadline(head(20_000, Some(10_000))), LIVE + 10_000 * MS);
        let Recovered::Load { slot, extra, .. } =
            recover(5, head(590_000, None), None, None, now, &honour, 0)
        else {
            panic!()
        };
        assert_eq!(slot.deadline_ns, LIVE + LEASE.as_nanos() as u64);
        assert_eq!(extra.lease_ms, None);
    }

    // --- extend and checkpoint ---------------------------------------------------------------

    #[test]
    fn an_extension_that_leaves_the_deadline_in_place_gives_the_reap_instant() {
        // A lease of zero from its own deadline: the slot keeps its place in the expiry
        // order, and the index is told the reap instant that follows from this end (one
        // loaded from a record may have another).
        let st = states();
        let v = view(st.lease, &st.lease_extra);
        let op = Holder::Extend {
            lease: Duration::ZERO,
        };
        let step = hold(v, K, 5, op, at(END), &durable());
        assert_eq!(step.answer, HolderAnswer::Done);
        let retention_ns = duration_ns(durable().retention);
        match step.change {
            Change::Put { slot, reap_ns, .. } => {
                assert_eq!(slot.deadline_ns, END);
                assert_eq!(reap_ns, Some(END + retention_ns));
            }
            other => panic!("an extension puts the slot: {other:?}"),
        }
        // One that moves the deadline leaves the reap instant to the new end.
        let op = Holder::Extend {
            lease: Duration::from_millis(1),
        };
        let step = hold(v, K, 5, op, at(END), &durable());
        assert!(matches!(step.change, Change::Put { reap_ns: None, .. }));
    }

    #[test]
    fn extend_by_the_holder_moves_the_lease_end_live_or_over() {
        let st = states();
        let v = view(st.lease, &st.lease_extra);
        for now in [LIVE, END + 7 * MS] {
            let lease = Duration::from_secs(5);
            let op = Holder::Extend { lease };
            let step = hold(v, K, 5, op.clone(), at(now), &durable());
            assert_eq!(step.answer, HolderAnswer::Done);
            let deadline = now + 5_000 * MS;
            // The holder's lease length is the one extended to.
            let extra = Extra {
                lease_ms: Some(5_000),
                ..st.lease_extra.clone()
            };
            assert_eq!(
                step.change,
                Change::Put {
                    slot: Slot::inflight(5, deadline, 2),
                    extra: extra.clone(),
                    reap_ns: None,
                    adopt: false,
                }
            );
            assert_eq!(
                step.write,
                Some(Write::Put {
                    token: 5,
                    old: None,
                    record: with_progress(
                        inflight_record(
                            K,
                            Some(7),
                            2,
                            st.lease_extra.checkpoint.clone(),
                            at(now).wall_ms + 5_000
                        ),
                        &extra,
                        &durable()
                    ),
                })
            );
            assert_eq!(step.deltas, NONE);
            lost(&hold(v, K, 4, op, at(now), &durable()));
        }
    }

    #[test]
    fn checkpoint_by_the_holder_persists_the_lease_s_own_end_even_when_over() {
        let st = states();
        let v = view(st.lease, &st.lease_extra);
        let cp = Checkpoint::new(4, b"more");
        for now in [LIVE, END + 7 * MS] {
            let op = Holder::Checkpoint(cp.clone());
            let step = hold(v, K, 5, op.clone(), at(now), &durable());
            assert_eq!(step.answer, HolderAnswer::Done);
            let extra = Extra {
                checkpoint: Some(cp.clone()),
                ..st.lease_extra.clone()
            };
            assert_eq!(
                step.change,
                Change::Put {
                    slot: st.lease,
                    extra: extra.clone(),
                    reap_ns: None,
                    adopt: false,
                }
            );
            // The lease's end (not now) on the wall clock: `END` in wall time.
            assert_eq!(
                step.write,
                Some(Write::Put {
                    token: 5,
                    old: None,
                    record: with_progress(
                        inflight_record(K, Some(7), 2, Some(cp.clone()), at(END).wall_ms),
                        &extra,
                        &durable()
                    ),
                })
            );
            lost(&hold(v, K, 6, op, at(now), &durable()));
        }
        let step = hold(v, K, 5, Holder::Checkpoint(cp), at(LIVE), &memory());
        assert_eq!(step.write, None);
    }

    #[test]
    fn extend_and_checkpoint_of_an_absent_expired_or_completed_key_are_lease_lost() {
        let st = states();
        let ops = [
            Holder::Extend { lease: LEASE },
            Holder::Checkpoint(Checkpoint::new(1, b"x")),
        ];
        for op in ops {
            lost(&hold(View::ABSENT, K, 5, op.clone(), at(LIVE), &durable()));
            let done = view(st.done, &st.done_extra);
            lost(&hold(done, K, 5, op.clone(), at(LIVE), &durable()));
            lost(&hold(done, K, 5, op.clone(), at(EXPIRES), &durable()));
            let unpublished = view(st.done_unpublished, &st.done_extra);
            lost(&hold(unpublished, K, 5, op, at(LIVE), &durable()));
        }
    }

    // --- the sweeper -------------------------------------------------------------------------

    #[test]
    fn the_sweeper_expires_only_completions_past_their_retention() {
        let st = states();
        assert_eq!(expire(&st.done, EXPIRES - 1), None);
        let step = expire(&st.done, EXPIRES).expect("due");
        assert_eq!(step.change, Change::Remove);
        assert_eq!(step.write, Some(Write::Delete { token: 5 }));
        assert_eq!(
            step.deltas,
            Deltas {
                completed: -1,
                expirations: 1,
                ..NONE
            }
        );
        // Never a lease, live, over or abandoned.
        assert_eq!(expire(&st.lease, u64::MAX), None);
        assert_eq!(expire(&st.lease.into_abandoned(), u64::MAX), None);
    }

    #[test]
    fn the_sweeper_reaps_only_abandoned_claims_at_their_reap_instant() {
        let st = states();
        let reap_at = END + RETENTION.as_nanos() as u64;
        let abandoned = st.lease.into_abandoned();
        assert_eq!(reap(&abandoned, reap_at, reap_at - 1), None);
        let step = reap(&abandoned, reap_at, reap_at).expect("due");
        assert_eq!(step.change, Change::Remove);
        assert_eq!(step.write, Some(Write::Delete { token: 5 }));
        assert_eq!(
            step.deltas,
            Deltas {
                abandoned_reaped: 1,
                ..NONE
            }
        );
        // A lease still counted live (not seen to end) and a completion never are.
        assert_eq!(reap(&st.lease, reap_at, u64::MAX), None);
        assert_eq!(reap(&st.done, reap_at, u64::MAX), None);
    }

    // --- a key's own retention ------------------------------------------------------------

    /// The claim's retention is persisted and kept beside the lease, handed to a takeover,
    /// and used by the completion unless the completion chooses its own.
    #[test]
    fn a_claims_own_retention_is_kept_through_a_takeover_and_used_by_its_completion() {
        let plan = plan_of(claim(View::ABSENT, None, None, LIVE)).asking_retention(Some(4_000));
        let step = acquire(plan, K, 11, LEASE, at(LIVE), &durable());
        let Change::Put { extra, .. } = &step.change else {
            panic!("a claim puts")
        };
        assert_eq!(extra.retention_ms, Some(4_000));
        let Some(Write::Put { record, .. }) = &step.write else {
            panic!("a durable claim writes")
        };
        assert_eq!(record.retention_ms, Some(4_000));
        // A takeover keeps it; a claim asking for its own replaces it.
        let lease = Slot::inflight(11, END, 1);
        let kept = plan_of(claim(view(lease, extra), None, None, END));
        assert_eq!(
            kept.clone().asking_retention(None).retention_ms,
            Some(4_000)
        );
        assert_eq!(kept.asking_retention(Some(9)).retention_ms, Some(9));
        // Completed with the claim's retention, or the completion's own.
        for (asked, keep_ms) in [(None, 4_000u64), (Some(250), 250)] {
            let op = Holder::Complete {
                response: Arc::from(&b"out"[..]),
                retention_ms: asked,
            };
            for rules in [durable(), memory()] {
                let done = hold(view(lease, extra), K, 11, op.clone(), at(END), &rules);
                let Change::Put { slot, extra: e, .. } = &done.change else {
                    panic!("a completion puts")
                };
                assert_eq!(slot.deadline_ns, END + keep_ms * MS);
                assert_eq!(e.expires_wall_ms, at(END).wall_ms + keep_ms);
                assert_eq!(e.retention_ms, Some(keep_ms));
                if let Some(Write::Put { record, .. }) = &done.write {
                    assert_eq!(record.retention_ms, Some(keep_ms));
                }
            }
        }
    }

    /// Recovery reaps an InFlight record by its own retention, and keeps it for the key.
    #[test]
    fn recovery_reaps_a_claim_by_its_own_retention() {
        let now = at(LIVE);
        let head = |lease_deadline_wall_ms| HeadState::InFlight {
            lease_ms: None,
            claim_id: None,
            lease_deadline_wall_ms,
            attempt: 1,
            attempt_started_wall_ms: 0,
            failed: false,
            checkpoint: None,
        };
        let take = reopen(Recovery::TakeOver);
        // Ended 2 s ago: past its own 1 s, not the engine's 10 s.
        let ended = now.wall_ms - 2_000;
        assert_eq!(
            recover(5, head(ended), None, Some(1_000), now, &take, 0),
            Recovered::Reaped
        );
        assert_eq!(
            recover(5, head(ended), None, Some(3_000), now, &take, 0),
            Recovered::Load {
                slot: Slot::inflight(5, LIVE, 1),
                extra: Extra {
                    retention_ms: Some(3_000),
                    // Over when the file recorded it: its end is kept for reports.
                    ended_wall_ms: ended,
                    ..Extra::default()
                },
                reap_ns: Some(LIVE + 1_000 * MS),
            }
        );
    }

    // --- markers ------------------------------------------------------------------------------

    const WINDOW: Duration = Duration::from_secs(100);
    const ID: MarkerId = MarkerId { hash: 3, check: 4 };

    fn marking(durable: bool) -> MarkerRules {
        MarkerRules {
            retention: WINDOW,
            durable,
        }
    }

    #[test]
    fn an_expired_completion_leaves_a_marker_pending_in_a_durable_engine() {
        let st = states();
        let end = EXPIRES + WINDOW.as_nanos() as u64;
        assert_eq!(
            forget(&st.done, None, ID, &marking(true), EXPIRES - 1),
            None
        );
        let step = forget(&st.done, None, ID, &marking(true), EXPIRES).expect("due");
        assert_eq!(step.change, Change::Remove);
        assert_eq!(
            step.write,
            Some(Write::Forget {
                token: 5,
                hash: 3,
                check: 4,
                marker_retention_ms: 100_000,
            })
        );
        assert_eq!(
            step.deltas,
            Deltas {
                completed: -1,
                expirations: 1,
                ..NONE
            }
        );
        let marker = step.answer.expect("a marker");
        assert!(marker.is_pending());
        assert_eq!((marker.token, marker.attempt, marker.end_ns), (5, 2, end));
    }

    #[test]
    fn a_memory_only_marker_takes_the_completion_from_its_side_data() {
        let st = states();
        let mut extra = st.done_extra.clone();
        extra.completed_wall_ms = WALL0 + 1;
        let step = forget(&st.done, Some(&extra), ID, &marking(false), EXPIRES).expect("due");
        let marker = step.answer.expect("a marker");
        assert!(!marker.is_pending());
        assert_eq!(
            (marker.fingerprint(), marker.completed_wall_ms),
            (Some(7), WALL0 + 1)
        );
        // Past the window as well: a plain expiry, no marker.
        let late = EXPIRES + WINDOW.as_nanos() as u64;
        let step = forget(&st.done, Some(&extra), ID, &marking(false), late).expect("due");
        assert_eq!(step.answer, None);
        assert_eq!(step.write, Some(Write::Delete { token: 5 }));
        assert_eq!(forget(&st.lease, None, ID, &marking(false), u64::MAX), None);
    }

    #[test]
    fn a_claim_of_a_marker_is_forgotten_until_its_end() {
        let end = EXPIRES + WINDOW.as_nanos() as u64;
        let m = Marker::kept(ID, 5, 2, Some(7), WALL0 + 3, end);
        let answer = |asked, rerun, now| claim_marker(&m, asked, rerun, at(now));
        let step = answer(None, false, end - 1);
        let MarkerAnswer::Forgotten(f) = step.answer else {
            panic!("{:?}", step.answer)
        };
        assert_eq!(
            (f.completed_wall_ms, f.attempt, f.kept_until_wall_ms),
            // The end on the wall clock, as read a nanosecond before it.
            (WALL0 + 3, 2, at(end - 1).wall_ms)
        );
        assert_eq!(
            step.deltas,
            Deltas {
                forgotten: 1,
                ..NONE
            }
        );
        assert!(matches!(
            answer(ask(7), false, end - 1).answer,
            MarkerAnswer::Forgotten(_)
        ));
        let step = answer(ask(8), true, end - 1);
        assert!(matches!(step.answer, MarkerAnswer::FingerprintMismatch));
        assert_eq!(step.deltas.fingerprint_mismatches, 1);
        assert!(matches!(
            answer(ask(7), true, end - 1).answer,
            MarkerAnswer::Acquire
        ));
        assert!(matches!(
            answer(ask(8), false, end).answer,
            MarkerAnswer::Acquire
        ));
        let pending = Marker::pending(ID, 5, 2, end);
        let step = claim_marker(&pending, ask(8), false, at(LIVE));
        let MarkerAnswer::Busy(busy) = step.answer else {
            panic!("{:?}", step.answer)
        };
        assert_eq!(
            (busy.retry_after, busy.completing),
            (RETRY_AFTER_UNPUBLISHED, true)
        );
    }

    #[test]
    fn the_sweeper_ends_a_marker_at_its_end_and_deletes_its_row() {
        let m = Marker::kept(ID, 5, 2, None, WALL0, 1_000);
        assert_eq!(end_marker(&m, 999, true), None);
        let step = end_marker(&m, 1_000, true).expect("due");
        assert_eq!(step.write, Some(Write::DropMarker { hash: 3, token: 5 }));
        assert_eq!(step.change, Change::Keep, "no slot is touched");
        assert_eq!(end_marker(&m, 1_000, false).and_then(|s| s.write), None);
    }

    #[test]
    fn recovery_turns_a_completion_past_retention_into_its_marker_within_the_window() {
        let now = at(LIVE);
        let head = |expires_wall_ms| HeadState::Completed {
            attempt: 2,
            completed_wall_ms: expires_wall_ms - 10_000,
            expires_wall_ms,
        };
        let window_ms = WINDOW.as_millis() as u64;
        let rules = marking(true);
        // Expired 1 s ago: 99 s of its window are left.
        let m = recover_marker(5, &head(now.wall_ms - 1_000), Some(7), ID, &rules, now)
            .expect("a marker");
        assert_eq!(m.end_ns, LIVE + (window_ms - 1_000) * MS);
        assert_eq!(
            (m.completed_wall_ms, m.fingerprint()),
            (now.wall_ms - 11_000, Some(7))
        );
        assert!(!m.is_pending(), "its row is written at open");
        // Its window is over too: none.
        let gone = head(now.wall_ms - window_ms);
        assert_eq!(recover_marker(5, &gone, None, ID, &rules, now), None);
        let lease = HeadState::InFlight {
            lease_ms: None,
            claim_id: None,
            lease_deadline_wall_ms: 0,
            attempt: 1,
            attempt_started_wall_ms: 0,
            failed: false,
            checkpoint: None,
        };
        assert_eq!(recover_marker(5, &lease, None, ID, &rules, now), None);
    }

    // --- recovery ----------------------------------------------------------------------------

    fn reopen(recovery: Recovery) -> Reopen {
        Reopen {
            recovery,
            lease: LEASE,
            retention: RETENTION,
        }
    }

    #[test]
    fn recovery_deletes_expired_completions_and_loads_the_others_published() {
        let now = at(LIVE);
        let head = |expires_wall_ms| HeadState::Completed {
            attempt: 2,
            completed_wall_ms: 0,
            expires_wall_ms,
        };
        let r = reopen(Recovery::TakeOver);
        assert_eq!(
            recover(5, head(now.wall_ms), None, None, now, &r, 0),
            Recovered::Expired
        );
        assert_eq!(
            recover(5, head(now.wall_ms + 3), Some(7), None, now, &r, 0),
            Recovered::Load {
                slot: Slot::completed(5, LIVE + 3 * MS, 2, true),
                extra: Extra::default(),
                reap_ns: None,
            }
        );
    }

    #[test]
    fn recovery_reaps_abandoned_claims_and_readies_the_others_for_takeover() {
        let now = at(LIVE);
        let retention_ms = RETENTION.as_millis() as u64;
        let cp = Some(Checkpoint::new(1, b"c"));
        let head = |lease_deadline_wall_ms| HeadState::InFlight {
            lease_ms: None,
            claim_id: None,
            lease_deadline_wall_ms,
            attempt: 2,
            attempt_started_wall_ms: 0,
            failed: false,
            checkpoint: cp.clone(),
        };
        let take = reopen(Recovery::TakeOver);
        let honour = reopen(Recovery::HonourLeases);
        // Past its lease end plus retention: reaped.
        let ended = now.wall_ms - retention_ms;
        assert_eq!(
            recover(5, head(ended), None, None, now, &take, FIRST_CLAIMED),
            Recovered::Reaped
        );
        // Before: loaded, reaped at its recorded end plus retention.
        let end_wall = now.wall_ms - 1;
        // The instants are loaded, and the lease's recorded end is kept for reports.
        let extra = Extra {
            fingerprint: Some(7),
            checkpoint: cp.clone(),
            first_claimed_wall_ms: FIRST_CLAIMED,
            ended_wall_ms: end_wall,
            ..Extra::default()
        };
        assert_eq!(
            recover(5, head(end_wall), Some(7), None, now, &take, FIRST_CLAIMED),
            Recovered::Load {
                slot: Slot::inflight(5, LIVE, 2),
                extra: extra.clone(),
                reap_ns: Some(LIVE + (retention_ms - 1) * MS),
            }
        );
        // Honoured leases keep their time left, capped at one configured lease.
        let far = now.wall_ms + 3_600_000;
        let Recovered::Load { slot, .. } =
            recover(5, head(far), Some(7), None, now, &honour, FIRST_CLAIMED)
        else {
            panic!("expected Load");
        };
        assert_eq!(slot, Slot::inflight(5, LIVE + LEASE.as_nanos() as u64, 2));
        let Recovered::Load { slot, .. } = recover(
            5,
            head(now.wall_ms + 2),
            Some(7),
            None,
            now,
            &honour,
            FIRST_CLAIMED,
        ) else {
            panic!("expected Load");
        };
        assert_eq!(slot, Slot::inflight(5, LIVE + 2 * MS, 2));
        let Recovered::Load { slot, .. } =
            recover(5, head(far), Some(7), None, now, &take, FIRST_CLAIMED)
        else {
            panic!("expected Load");
        };
        assert_eq!(slot.deadline_ns, LIVE, "taken over at once");
    }

    #[test]
    fn recovery_keeps_the_newer_of_two_records_of_a_key() {
        let lease = Slot::inflight(5, LIVE, 1);
        let done = Slot::completed(9, EXPIRES, 1, true);
        // First record of the key.
        let step = load(None, lease, Extra::default(), Some(7));
        assert_eq!(step.write, None);
        assert_eq!(
            step.deltas,
            Deltas {
                inflight: 1,
                ..NONE
            }
        );
        assert!(matches!(
            step.change,
            Change::Put {
                reap_ns: Some(7),
                ..
            }
        ));
        // A newer record replaces an older one, whose record is deleted.
        let step = load(Some(lease), done, Extra::default(), None);
        assert_eq!(step.write, Some(Write::Delete { token: 5 }));
        assert_eq!(
            step.deltas,
            Deltas {
                inflight: -1,
                completed: 1,
                ..NONE
            }
        );
        assert!(matches!(step.change, Change::Put { slot, .. } if slot == done));
        // An older record found after a newer one is deleted instead.
        let step = load(Some(done), lease, Extra::default(), None);
        assert_eq!(step.write, Some(Write::Delete { token: 5 }));
        assert_eq!((step.change, step.deltas), (Change::Keep, NONE));
    }

    // --- import ------------------------------------------------------------------------------

    fn record(token: u64, state: RecordInfoState) -> RecordInfo {
        RecordInfo {
            key: KEY.to_vec(),
            scope: Vec::new(),
            token,
            fingerprint: Some(7),
            attempt: 2,
            state,
            first_claimed_at: Some(wall_time(FIRST_CLAIMED)),
        }
    }

    fn completed_info(expires_at_ms: u64, response: &[u8], published: bool) -> RecordInfoState {
        RecordInfoState::Completed {
            response: response.to_vec(),
            expires_at: wall_time(expires_at_ms),
            published,
        }
    }

    #[test]
    fn import_adds_a_record_to_an_absent_or_expired_key() {
        let now = at(LIVE);
        let info = record(40, completed_info(now.wall_ms + 3, b"r", true));
        let step = import(View::ABSENT, K, &info, 40, now, &durable()).expect("imported");
        assert_eq!(step.answer, Imported::Added);
        assert_eq!(
            step.change,
            Change::Put {
                // Published by the writer once committed; answered from memory until then.
                slot: Slot::completed(40, LIVE + 3 * MS, 2, false),
                extra: Extra {
                    response: Some(Arc::from(&b"r"[..])),
                    expires_wall_ms: now.wall_ms + 3,
                    first_claimed_wall_ms: FIRST_CLAIMED,
                    completed_wall_ms: now.wall_ms,
                    ..fp(7)
                },
                reap_ns: None,
                adopt: false,
            }
        );
        assert!(matches!(
            &step.write,
            Some(Write::Put {
                token: 40,
                old: None,
                record,
            }) if record.first_claimed_wall_ms == FIRST_CLAIMED
        ));
        assert_eq!(
            step.deltas,
            Deltas {
                completed: 1,
                ..NONE
            }
        );
        // Over an expired completion: it replaces it.
        let st = states();
        let expired = view(st.done, &st.done_extra);
        let later = at(EXPIRES);
        let info = record(41, completed_info(later.wall_ms + 3, b"r", true));
        let step = import(expired, K, &info, 41, later, &memory()).expect("imported");
        assert_eq!(step.write, None);
        assert_eq!(step.deltas, NONE, "one completion out, one in");
        assert!(
            matches!(&step.change, Change::Put { slot, extra, .. } if slot.is_published() && extra.response.is_some())
        );
        // An InFlight record is reaped at its recorded end plus retention.
        let info = record(
            42,
            RecordInfoState::InFlight {
                lease: None,
                claim_id: None,
                lease_deadline: wall_time(now.wall_ms + 2),
                checkpoint: Some((1, b"c".to_vec())),
                attempt_started_at: None,
                failed: false,
            },
        );
        let step = import(View::ABSENT, K, &info, 42, now, &durable()).expect("imported");
        assert!(matches!(
            step.change,
            Change::Put { slot, reap_ns: Some(r), .. }
                if slot == Slot::inflight(42, LIVE + 2 * MS, 2) && r == LIVE + 10_002 * MS
        ));
        assert_eq!(
            step.deltas,
            Deltas {
                inflight: 1,
                ..NONE
            }
        );
    }

    #[test]
    fn import_refuses_live_keys_small_tokens_and_malformed_records() {
        let st = states();
        let now = at(LIVE);
        let good = record(40, completed_info(now.wall_ms + 3, b"r", true));
        for live in [
            view(st.lease, &st.lease_extra),
            view(st.done, &st.done_extra),
            view(st.done_unpublished, &st.done_extra),
        ] {
            assert_eq!(
                import(live, K, &good, 40, now, &durable()).err(),
                Some(ImportError::KeyExists)
            );
        }
        assert_eq!(
            import(View::ABSENT, K, &good, 41, now, &durable()).err(),
            Some(ImportError::TokenTooSmall { token: 40, min: 41 })
        );
        let max = record(u64::MAX, completed_info(now.wall_ms + 3, b"r", true));
        assert!(matches!(
            import(View::ABSENT, K, &max, 1, now, &durable()),
            Err(ImportError::TokenTooSmall { .. })
        ));
        let unpublished = record(40, completed_info(now.wall_ms + 3, b"r", false));
        assert!(matches!(
            import(View::ABSENT, K, &unpublished, 40, now, &durable()),
            Err(ImportError::Invalid(_))
        ));
        let large = record(40, completed_info(now.wall_ms + 3, &[0; 17], true));
        assert!(matches!(
            import(View::ABSENT, K, &large, 40, now, &durable()),
            Err(ImportError::Invalid(_))
        ));
    }

    #[test]
    fn import_of_a_record_past_its_end_brings_nothing_back_even_over_a_live_key() {
        let st = states();
        let now = at(LIVE);
        let live = view(st.lease, &st.lease_extra);
        let retention_ms = RETENTION.as_millis() as u64;
        let gone = [
            completed_info(now.wall_ms, b"r", true),
            RecordInfoState::InFlight {
                lease: None,
                claim_id: None,
                lease_deadline: wall_time(now.wall_ms - retention_ms),
                checkpoint: None,
                attempt_started_at: None,
                failed: false,
            },
        ];
        for state in gone {
            let step = import(live, K, &record(1, state), 40, now, &durable()).expect("no error");
            assert_eq!(step.answer, Imported::Gone);
            assert_eq!(
                (step.change, step.write, step.deltas),
                (Change::Keep, None, NONE)
            );
        }
    }
}
