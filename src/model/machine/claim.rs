//! A claim's transitions: row `claim` of the state table (`claim`, then `acquire`), and
//! `resume` for a claim that presents its holder's identity again.

use super::holder::{hold, Holder, HolderAnswer};
use super::record::{inflight_record, with_progress, KeyRef};
use super::{lease_ms, Change, Deltas, Now, Rules, Step, View, Write, NONE};
use crate::base::clock::duration_ns;
use crate::model::answer::{Busy, Stored};
use crate::model::codec::{Checkpoint, Record};
use crate::model::constants::RETRY_AFTER_UNPUBLISHED;
use crate::model::settings::AskedFingerprint;
use crate::model::slot::{Extra, Slot};
use std::time::Duration;

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
    let holder = view.extra.filter(|e| !e.failed).and_then(|e| e.claim_id());
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
        checkpoint: view.extra.and_then(|e| e.checkpoint().cloned()),
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
    let checkpoint = view.extra.and_then(|e| e.checkpoint().cloned());
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
        first_claimed_wall_ms: plan.first_claimed_wall_ms.unwrap_or(now.wall_ms),
        attempt_started_wall_ms: now.wall_ms,
        retention_ms: plan.retention_ms,
        lease_ms: Some(lease_ms(lease)),
        ..Extra::default()
    }
    .with_fingerprint(plan.fingerprint)
    .with_checkpoint(plan.checkpoint.clone())
    .with_claim_id(plan.claim_id);
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
