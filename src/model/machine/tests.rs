//! Every cell of the state table, without an engine: the new state, the queued write,
//! the answer and the counts of each transition.

use super::record::{inflight_record, with_progress};
use super::*;
use crate::base::clock::wall_time;
use crate::model::answer::Busy;
use crate::model::codec::{Blob, Checkpoint, HeadState, RecordKey, RecordState};
use crate::model::constants::RETRY_AFTER_UNPUBLISHED;
use crate::model::marker::{Marker, MarkerId};
use crate::model::record_info::{ImportError, RecordInfo, RecordInfoState};
use crate::model::settings::{AskedFingerprint, Recovery};
use std::sync::Arc;

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
    Extra::default().with_fingerprint(Some(u128::from(fingerprint)))
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
            first_claimed_wall_ms: FIRST_CLAIMED,
            attempt_started_wall_ms: WALL0,
            ..Extra::default()
        }
        .with_fingerprint(Some(7))
        .with_checkpoint(Some(Checkpoint::new(3, b"half"))),
        done: Slot::completed(5, EXPIRES, 2, true),
        done_unpublished: Slot::completed(5, EXPIRES, 2, false),
        done_extra: Extra {
            response: Some(Arc::from(&b"resp"[..])),
            expires_wall_ms: WALL0 + 10_000,
            ..Extra::default()
        }
        .with_fingerprint(Some(7)),
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
            checkpoint: st.lease_extra.checkpoint().cloned(),
            // It still holds its place in the live count: inherited.
            reserve: false,
            adopt: false,
            retention_ms: None,
            first_claimed_wall_ms: Some(FIRST_CLAIMED),
        }
    );
    let step = acquire(plan, K, 20, LEASE, at(END), &durable());
    let cp = st.lease_extra.checkpoint().cloned();
    // The first claim is kept; the new attempt starts now.
    let extra = Extra {
        first_claimed_wall_ms: FIRST_CLAIMED,
        attempt_started_wall_ms: at(END).wall_ms,
        lease_ms: Some(LEASE.as_millis() as u64),
        ..Extra::default()
    }
    .with_fingerprint(Some(7))
    .with_checkpoint(cp.clone());
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
                    response: Some(Arc::from(&b"out"[..])),
                    expires_wall_ms,
                    first_claimed_wall_ms: FIRST_CLAIMED,
                    completed_wall_ms: at(now).wall_ms,
                    ..Extra::default()
                }
                .with_fingerprint(Some(7)),
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
            st.lease_extra.checkpoint().cloned(),
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
        (
            Acquiring::Takeover,
            3,
            &failed.checkpoint().cloned(),
            Some(7)
        )
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
        ..st.lease_extra.clone()
    }
    .with_ended_wall_ms(WALL0);
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
    assert_eq!(extra.ended_wall_ms(), 0);
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
        ..st.lease_extra.clone()
    }
    .with_ended_wall_ms(WALL0 - 9_000);
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
                extra.ended_wall_ms()
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
            extra.ended_wall_ms()
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
        lease_ms: Some(600_000),
        ..st.lease_extra.clone()
    }
    .with_claim_id(id);
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
                checkpoint: st.lease_extra.checkpoint().cloned(),
            }
        );
        let Change::Put { slot, extra: e, .. } = &step.change else {
            panic!("{:?}", step.change);
        };
        assert_eq!(*slot, Slot::inflight(5, now + 40_000 * MS, 2));
        assert_eq!((e.lease_ms, e.claim_id()), (Some(40_000), id));
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
    assert_eq!(e.claim_id(), Some(3));
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
            assert_eq!(
                (extra.lease_ms.is_some(), extra.claim_id()),
                (true, Some(9))
            );
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
                        st.lease_extra.checkpoint().cloned(),
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
            ..st.lease_extra.clone()
        }
        .with_checkpoint(Some(cp.clone()));
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
                ..Extra::default()
            }
            .with_ended_wall_ms(ended),
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
    let m =
        recover_marker(5, &head(now.wall_ms - 1_000), Some(7), ID, &rules, now).expect("a marker");
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
        first_claimed_wall_ms: FIRST_CLAIMED,
        ..Extra::default()
    }
    .with_fingerprint(Some(7))
    .with_checkpoint(cp.clone())
    .with_ended_wall_ms(end_wall);
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
