//! One key driven through the pure state machine (`machine/`) alone, transition by
//! transition, so that a checker can compare each answer and each state with an independent
//! specification. Compiled only with `--cfg idemkv_sabotage`; hidden from the documentation.
//!
//! The [`Probe`] holds what the index and the file hold for one key (its slot, its side data,
//! its reap instant, its records by token, and with markers on its marker and marker row)
//! and applies each step's change and write the way the index and the writer do, without
//! admission, locks, queues or I/O. Tokens are issued in increasing order, as the token
//! counter does.

use crate::base::clock::duration_ns;
use crate::model::codec::{self, Checkpoint, MarkerRecord, Record, RecordState};
use crate::model::machine::{
    self, Change, ClaimAnswer, Holder, HolderAnswer, MarkerAnswer, MarkerRules, Now, Rules, Step,
    View, Write,
};
use crate::model::marker::{Marker, MarkerId, Markers};
use crate::model::settings::AskedFingerprint;
use crate::model::slot::{Extra, Slot};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The probe's one key, as a scoped key (unscoped).
const KEY: &[u8] = b"\0probe";
/// The probe key's marker hashes (any fixed pair: the probe holds one key).
const ID: MarkerId = MarkerId {
    hash: 0x5EED,
    check: 0xC0DE,
};

/// What a claim answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeClaim {
    /// The key was acquired under a fresh token.
    Acquired {
        /// The fresh token.
        token: u64,
        /// 1 + takeovers.
        attempt: u32,
        /// The checkpoint handed over, as (phase, data).
        checkpoint: Option<(u32, Vec<u8>)>,
    },
    /// Busy: retry after this many ns.
    InProgress {
        /// The retry hint, ns.
        retry_after_ns: u64,
        /// The holder's attempt.
        attempt: u32,
    },
    /// The stored response (from memory, or read from the key's record).
    Replayed {
        /// The completing token.
        token: u64,
        /// The completing attempt.
        attempt: u32,
        /// The response.
        response: Vec<u8>,
    },
    /// The fingerprint differs from the stored one.
    FingerprintMismatch,
    /// A marker answered: completed, response no longer kept.
    Forgotten {
        /// Wall-clock instant of the completion, ms.
        completed_wall_ms: u64,
        /// The completing attempt.
        attempt: u32,
    },
}

/// What a holder's call answered, in the public API's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeHold {
    /// `Ok(())`, or `Ok(true)` for a release.
    Done,
    /// `Ok(false)` of a release.
    NotHeld,
    /// `Err(LeaseLost)`.
    LeaseLost,
}

/// What a sweep removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swept {
    /// Nothing was due.
    Nothing,
    /// A completion past its retention.
    Expired,
    /// An abandoned claim past its reap instant.
    Reaped,
    /// A marker at its end.
    MarkerEnded,
}

/// The key's state as the probe holds it (a completion past its retention is still there
/// until a sweep removes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeState {
    /// No slot.
    Absent,
    /// A lease.
    InFlight {
        /// Owner's token.
        token: u64,
        /// 1 + takeovers.
        attempt: u32,
        /// Monotonic lease end, ns.
        deadline_ns: u64,
        /// Monotonic instant a sweep reaps it once abandoned, ns.
        reap_ns: u64,
        /// Stored fingerprint.
        fingerprint: Option<u64>,
        /// Saved checkpoint, as (phase, data).
        checkpoint: Option<(u32, Vec<u8>)>,
        /// The lease end written in its record (wall ms), when the probe is durable.
        lease_wall_ms: Option<u64>,
        /// The key's own retention, ms: from its record when the probe is durable, else
        /// from its side data.
        retention_ms: Option<u64>,
        /// Failed by its holder (its side data).
        failed: bool,
        /// The failure flag written in its record, when the probe is durable.
        failed_on_file: Option<bool>,
    },
    /// A completion.
    Completed {
        /// Completing token.
        token: u64,
        /// Completing attempt.
        attempt: u32,
        /// Monotonic end of retention, ns.
        expires_ns: u64,
        /// Wall-clock end of retention, ms.
        expires_wall_ms: u64,
        /// Stored fingerprint.
        fingerprint: Option<u64>,
        /// Stored response.
        response: Vec<u8>,
        /// Shown to other callers.
        published: bool,
    },
    /// A marker (markers on): no slot.
    Forgotten {
        /// Completing token.
        token: u64,
        /// Completing attempt.
        attempt: u32,
        /// Stored fingerprint.
        fingerprint: Option<u64>,
        /// Wall-clock instant of the completion, ms.
        completed_wall_ms: u64,
        /// Monotonic end, ns.
        end_ns: u64,
        /// Settled (a durable probe's marker is pending until [`Probe::publish`]).
        settled: bool,
    },
}

/// One key, its file and its clock, driven through the state machine.
#[derive(Debug)]
pub struct Probe {
    slot: Option<Slot>,
    extra: Option<Extra>,
    reap_ns: u64,
    records: BTreeMap<u64, Record>,
    next_token: u64,
    now: Now,
    rules: Rules,
    markers: Option<MarkerRules>,
    marker: Option<Marker>,
    /// The marker row the file holds (a durable probe).
    marker_row: Option<MarkerRecord>,
    /// A deliberate bug for the checker's teeth: `complete` acts with the key's current
    /// token whatever token it is given, as if the fencing comparison were skipped.
    pub skip_token_check_on_complete: bool,
    /// A deliberate bug for the checker's teeth: `fail` releases the key (forgetting its
    /// progress) instead of keeping it.
    pub release_on_fail: bool,
}

impl Probe {
    /// An Absent key at monotonic `mono_ns` and wall `wall_ms`. A `durable` probe keeps
    /// records and publishes a completion only at [`Probe::publish`]; otherwise at once.
    pub fn new(retention: Duration, durable: bool, mono_ns: u64, wall_ms: u64) -> Self {
        Self {
            slot: None,
            extra: None,
            reap_ns: 0,
            records: BTreeMap::new(),
            next_token: 1,
            now: Now::new(mono_ns, wall_ms.saturating_mul(1_000_000)),
            rules: Rules {
                retention,
                response_len_max: usize::MAX,
                durable,
                // Only a lease loaded from an older record lacks its own length; the probe
                // loads none.
                lease: Duration::from_secs(30),
            },
            markers: None,
            marker: None,
            marker_row: None,
            skip_token_check_on_complete: false,
            release_on_fail: false,
        }
    }

    /// The same probe keeping markers for `window` after a completion's retention.
    pub fn with_markers(mut self, window: Duration) -> Self {
        self.markers = Some(MarkerRules {
            retention: window,
            durable: self.rules.durable,
        });
        self
    }

    fn view(&self) -> View<'_> {
        View {
            slot: self.slot,
            extra: self.extra.as_ref(),
        }
    }

    /// Applies a step's change and write as the index and the writer would.
    fn apply(&mut self, change: Change, write: Option<Write>) {
        match change {
            Change::Keep => {}
            Change::Remove => {
                self.slot = None;
                self.extra = None;
            }
            Change::Put {
                slot,
                extra,
                reap_ns,
                ..
            } => {
                // The index decides the flags: a put clears "abandoned", except for a lease
                // that keeps its place (a checkpoint of an abandoned lease).
                let fresh = if slot.is_inflight() {
                    Slot::inflight(slot.token, slot.deadline_ns, slot.attempt)
                } else {
                    Slot::completed(
                        slot.token,
                        slot.deadline_ns,
                        slot.attempt,
                        slot.is_published(),
                    )
                };
                let keeps_place = self.slot.is_some_and(|old| {
                    old.is_abandoned()
                        && old.token == fresh.token
                        && old.is_inflight() == fresh.is_inflight()
                        && old.deadline_ns == fresh.deadline_ns
                });
                self.slot = Some(if keeps_place {
                    fresh.into_abandoned()
                } else {
                    fresh
                });
                if fresh.is_inflight() {
                    // As the index does: the key's own retention, else the engine's.
                    let retention_ns = extra.retention_ms.map_or_else(
                        || duration_ns(self.rules.retention),
                        |ms| ms.saturating_mul(1_000_000),
                    );
                    self.reap_ns =
                        reap_ns.unwrap_or_else(|| fresh.deadline_ns.saturating_add(retention_ns));
                }
                self.extra = Some(extra);
            }
        }
        match write {
            None => {}
            Some(Write::Put {
                token, old, record, ..
            }) => {
                if let Some(old) = old {
                    self.records.remove(&old);
                }
                self.records.insert(token, record);
            }
            Some(Write::Delete { token }) => {
                self.records.remove(&token);
            }
            // As the storage does: the row is built from the record the commit deletes.
            Some(Write::Forget {
                token,
                check,
                marker_retention_ms,
                ..
            }) => {
                let row = self.records.remove(&token).and_then(|record| {
                    let bytes = codec::encode(token, &record);
                    codec::marker_of_record(token, &bytes, check, marker_retention_ms)
                });
                if row.is_some() {
                    self.marker_row = row;
                }
            }
            Some(Write::DropMarker { token, .. })
                if self.marker_row.is_some_and(|r| r.token == token) =>
            {
                self.marker_row = None;
            }
            Some(Write::DropMarker { .. }) => {}
        }
    }

    /// The expiry of the slot at `now` as the index makes it: with markers on, the slot
    /// leaves its marker (`machine::forget`); otherwise (or past the marker's window) a plain
    /// expiry. Returns whether the slot was expired.
    fn expire_slot(&mut self, slot: &Slot) -> bool {
        let now = self.now.mono_ns;
        let step = match &self.markers {
            Some(rules) => machine::forget(slot, self.extra.as_ref(), ID, rules, now),
            None => machine::expire(slot, now).map(|step| Step {
                change: step.change,
                write: step.write,
                answer: None,
                deltas: step.deltas,
            }),
        };
        let Some(step) = step else {
            return false;
        };
        self.apply(step.change, step.write);
        if let Some(marker) = step.answer {
            self.marker = Some(marker);
        }
        true
    }

    /// The writer settles a pending marker after its row's commit.
    fn settle_marker(&mut self) -> Option<u64> {
        let marker = self.marker.as_mut().filter(|m| m.is_pending())?;
        let token = marker.token;
        match self.marker_row.filter(|r| r.token == token) {
            Some(row) => {
                Markers::settle(marker, row.fingerprint, row.completed_wall_ms, row.attempt)
            }
            None => self.marker = None,
        }
        Some(token)
    }

    /// `claim` with `fingerprint` and `lease`: [`machine::claim`], then [`machine::acquire`]
    /// under the next token when it may acquire.
    pub fn claim(&mut self, fingerprint: Option<u64>, lease: Duration) -> ProbeClaim {
        self.claim_kept(fingerprint, lease, None)
    }

    /// [`Probe::claim`] with the claim's own retention, in ms.
    pub fn claim_kept(
        &mut self,
        fingerprint: Option<u64>,
        lease: Duration,
        retention_ms: Option<u64>,
    ) -> ProbeClaim {
        let asked = fingerprint.map(|f| AskedFingerprint {
            value: u128::from(f),
            legacy: None,
        });
        // With markers on, as the engine's claim does (`Engine::marker_step`): a completion
        // past its retention becomes its marker first (a durable claim waits for its commit),
        // and a key without a slot is answered from its marker.
        self.forget_expired();
        if let Some(answer) = self.claim_marker(asked) {
            return answer;
        }
        // The probe presents no claim identity, so no claim resumes a lease.
        let step = machine::claim(self.view(), asked, None, self.now.mono_ns);
        match step.answer {
            ClaimAnswer::Acquire(plan) => {
                let plan = plan.asking_retention(retention_ms);
                let token = self.next_token;
                self.next_token += 1;
                let step = machine::acquire(
                    plan,
                    machine::KeyRef::Bytes(KEY),
                    token,
                    lease,
                    self.now,
                    &self.rules,
                );
                self.apply(step.change, step.write);
                ProbeClaim::Acquired {
                    token: step.answer.token,
                    attempt: step.answer.attempt,
                    checkpoint: step
                        .answer
                        .checkpoint
                        .map(|c| (c.phase(), c.data().to_vec())),
                }
            }
            ClaimAnswer::Busy(busy) => ProbeClaim::InProgress {
                retry_after_ns: duration_ns(busy.retry_after),
                attempt: busy.attempt,
            },
            ClaimAnswer::Replay(stored) => ProbeClaim::Replayed {
                token: stored.token,
                attempt: stored.attempt,
                response: stored.response.to_vec(),
            },
            // As the engine's read of the record does (`read_completed`): the fingerprint of
            // a published completion is checked against its record.
            ClaimAnswer::ReplayFromFile { token } => self.replay_from_file(token, fingerprint),
            ClaimAnswer::FingerprintMismatch => ProbeClaim::FingerprintMismatch,
            ClaimAnswer::Resume { .. } => {
                unreachable!("a claim without an identity resumes nothing")
            }
        }
    }

    /// A completion past its retention becomes its marker (past the marker's window too,
    /// nothing is done: the claim replaces the completion as without markers).
    fn forget_expired(&mut self) {
        let now = self.now.mono_ns;
        let (Some(rules), Some(slot)) = (self.markers, self.slot.filter(|s| s.is_expired(now)))
        else {
            return;
        };
        let step = machine::forget(&slot, self.extra.as_ref(), ID, &rules, now);
        if let Some(Step {
            change,
            write,
            answer: Some(marker),
            ..
        }) = step
        {
            self.apply(change, write);
            self.marker = Some(marker);
            self.settle_marker();
        }
    }

    /// A claim of a key without a slot, answered from its marker; `None`: there is none,
    /// or the claim acquires (the marker is dropped with the claim's write).
    fn claim_marker(&mut self, asked: Option<AskedFingerprint>) -> Option<ProbeClaim> {
        let marker = self.marker.filter(|_| self.slot.is_none())?;
        let step = machine::claim_marker(&marker, asked, false, self.now);
        match step.answer {
            MarkerAnswer::Forgotten(f) => Some(ProbeClaim::Forgotten {
                completed_wall_ms: crate::base::clock::wall_ms(f.completed_at()),
                attempt: f.attempt(),
            }),
            MarkerAnswer::Busy(busy) => Some(ProbeClaim::InProgress {
                retry_after_ns: duration_ns(busy.retry_after),
                attempt: busy.attempt,
            }),
            MarkerAnswer::FingerprintMismatch => Some(ProbeClaim::FingerprintMismatch),
            MarkerAnswer::Acquire => {
                self.apply(
                    Change::Keep,
                    Some(Write::DropMarker {
                        hash: marker.hash,
                        token: marker.token,
                    }),
                );
                self.marker = None;
                None
            }
        }
    }

    /// A replay of the completion under `token` from its record, as the engine's read of
    /// the record does (`read_completed`): the fingerprint of a published completion is
    /// checked against its record.
    fn replay_from_file(&self, token: u64, fingerprint: Option<u64>) -> ProbeClaim {
        match self.records.get(&token) {
            Some(Record {
                fingerprint: Some(stored),
                state: RecordState::Completed { .. },
                ..
            }) if fingerprint.is_some_and(|asked| u128::from(asked) != *stored) => {
                ProbeClaim::FingerprintMismatch
            }
            Some(Record {
                state:
                    RecordState::Completed {
                        attempt, response, ..
                    },
                ..
            }) => ProbeClaim::Replayed {
                token,
                attempt: *attempt,
                response: response.0.to_vec(),
            },
            // A replay whose record is missing: the checker reports the difference.
            _ => ProbeClaim::InProgress {
                retry_after_ns: 0,
                attempt: 0,
            },
        }
    }

    fn hold(&mut self, token: u64, op: Holder) -> HolderAnswer {
        let step = machine::hold(
            self.view(),
            machine::KeyRef::Bytes(KEY),
            token,
            op,
            self.now,
            &self.rules,
        );
        self.apply(step.change, step.write);
        step.answer
    }

    /// `complete(token, response)`. A repeat of an unpublished completion waits for the
    /// writer, as the engine's does: the probe publishes it first.
    pub fn complete(&mut self, token: u64, response: &[u8]) -> ProbeHold {
        self.complete_kept(token, response, None)
    }

    /// [`Probe::complete`] with the completion's own retention, in ms.
    pub fn complete_kept(
        &mut self,
        token: u64,
        response: &[u8],
        retention_ms: Option<u64>,
    ) -> ProbeHold {
        let token = match self.slot {
            Some(slot) if self.skip_token_check_on_complete => slot.token,
            _ => token,
        };
        let response: Arc<[u8]> = Arc::from(response);
        let op = Holder::Complete {
            response,
            retention_ms,
        };
        match self.hold(token, op) {
            HolderAnswer::Done => ProbeHold::Done,
            HolderAnswer::Repeat { published } => {
                if !published {
                    self.publish();
                }
                ProbeHold::Done
            }
            HolderAnswer::NotHeld => ProbeHold::NotHeld,
            HolderAnswer::LeaseLost => ProbeHold::LeaseLost,
        }
    }

    /// `release(token)`.
    pub fn release(&mut self, token: u64) -> ProbeHold {
        match self.hold(token, Holder::Release) {
            HolderAnswer::Done => ProbeHold::Done,
            HolderAnswer::NotHeld | HolderAnswer::Repeat { .. } => ProbeHold::NotHeld,
            HolderAnswer::LeaseLost => ProbeHold::LeaseLost,
        }
    }

    /// `fail(token)`: `Done` is `Ok(true)`, `NotHeld` is `Ok(false)`.
    pub fn fail(&mut self, token: u64) -> ProbeHold {
        let op = if self.release_on_fail {
            Holder::Release
        } else {
            Holder::Fail
        };
        to_hold(self.hold(token, op))
    }

    /// `extend(token, lease)`.
    pub fn extend(&mut self, token: u64, lease: Duration) -> ProbeHold {
        to_hold(self.hold(token, Holder::Extend { lease }))
    }

    /// `checkpoint(token, phase, data)`.
    pub fn checkpoint(&mut self, token: u64, phase: u32, data: &[u8]) -> ProbeHold {
        to_hold(self.hold(token, Holder::Checkpoint(Checkpoint::new(phase, data))))
    }

    /// The key's completion is published once its commit is durable and in the file (in
    /// the engine, by the writer's watermarks as its stripe is next locked): the slot is
    /// shown and its side data dropped (the record holds it). Returns the token
    /// published, if any.
    pub fn publish(&mut self) -> Option<u64> {
        if self.slot.is_none() {
            return self.settle_marker();
        }
        let slot = self
            .slot
            .filter(|s| !s.is_inflight() && !s.is_published())?;
        self.slot = Some(Slot::completed(
            slot.token,
            slot.deadline_ns,
            slot.attempt,
            true,
        ));
        self.extra = None;
        Some(slot.token)
    }

    /// The clocks move forward by `by` (the wall clock by whole ms, as the mock clock's
    /// readers see it).
    pub fn advance(&mut self, by: Duration) {
        let ns = duration_ns(by);
        let wall_ns = self
            .now
            .wall_ms
            .saturating_mul(1_000_000)
            .saturating_add(self.now.wall_sub_ns);
        self.now = Now::new(
            self.now.mono_ns.saturating_add(ns),
            wall_ns.saturating_add(ns),
        );
    }

    /// One sweep of the key: a lease seen to end becomes abandoned, then
    /// [`machine::expire`] and [`machine::reap`] decide whether it goes.
    pub fn sweep(&mut self) -> Swept {
        let Some(mut slot) = self.slot else {
            let Some(marker) = self.marker else {
                return Swept::Nothing;
            };
            let durable = self.rules.durable;
            let Some(step) = machine::end_marker(&marker, self.now.mono_ns, durable) else {
                return Swept::Nothing;
            };
            self.apply(step.change, step.write);
            self.marker = None;
            return Swept::MarkerEnded;
        };
        if slot.is_inflight() && !slot.is_abandoned() && self.now.mono_ns >= slot.deadline_ns {
            slot = slot.into_abandoned();
            self.slot = Some(slot);
        }
        if self.expire_slot(&slot) {
            return Swept::Expired;
        }
        if let Some(step) = machine::reap(&slot, self.reap_ns, self.now.mono_ns) {
            self.apply(step.change, step.write);
            return Swept::Reaped;
        }
        Swept::Nothing
    }

    /// The key's state now.
    pub fn state(&self) -> ProbeState {
        let Some(slot) = self.slot else {
            let Some(m) = self.marker else {
                return ProbeState::Absent;
            };
            // A settled durable marker must agree with its row, which a restart would load.
            let row_agrees = !self.rules.durable
                || m.is_pending()
                || self.marker_row.is_some_and(|r| {
                    r.token == m.token
                        && r.fingerprint == m.fingerprint()
                        && r.completed_wall_ms == m.completed_wall_ms
                        && r.attempt == m.attempt
                });
            // A pending marker knows only its token and end: the rest is in the row its
            // commit stored, which the writer will settle it from.
            let (fingerprint, completed_wall_ms, attempt) = match self.marker_row {
                Some(r) if m.is_pending() && r.token == m.token => {
                    (r.fingerprint, r.completed_wall_ms, r.attempt)
                }
                _ => (m.fingerprint(), m.completed_wall_ms, m.attempt),
            };
            return ProbeState::Forgotten {
                token: m.token,
                attempt,
                fingerprint: narrow(fingerprint),
                completed_wall_ms,
                end_ns: m.end_ns,
                settled: !m.is_pending() && row_agrees,
            };
        };
        let extra = self.extra.clone().unwrap_or_default();
        let record = self.records.get(&slot.token);
        if slot.is_inflight() {
            let (lease_wall_ms, failed_on_file) = match record.map(|r| &r.state) {
                Some(RecordState::InFlight {
                    lease_deadline_wall_ms,
                    failed,
                    ..
                }) => (Some(*lease_deadline_wall_ms), Some(*failed)),
                _ => (None, None),
            };
            let retention_ms = match record {
                Some(r) if self.rules.durable => r.retention_ms,
                _ => extra.retention_ms,
            };
            return ProbeState::InFlight {
                token: slot.token,
                attempt: slot.attempt,
                deadline_ns: slot.deadline_ns,
                reap_ns: self.reap_ns,
                fingerprint: narrow(extra.fingerprint()),
                checkpoint: extra.checkpoint().map(|c| (c.phase(), c.data().to_vec())),
                lease_wall_ms,
                retention_ms,
                failed: extra.failed,
                failed_on_file,
            };
        }
        // Until it is published the completion's data sits beside the slot; after, in the
        // record (a memory-only probe keeps it beside the slot throughout).
        let (fingerprint, response, expires_wall_ms) = match (&extra.response, record) {
            (Some(response), _) => (
                extra.fingerprint(),
                response.to_vec(),
                extra.expires_wall_ms,
            ),
            (
                None,
                Some(Record {
                    fingerprint,
                    state:
                        RecordState::Completed {
                            response,
                            expires_wall_ms,
                            ..
                        },
                    ..
                }),
            ) => (*fingerprint, response.0.to_vec(), *expires_wall_ms),
            (None, _) => (extra.fingerprint(), Vec::new(), extra.expires_wall_ms),
        };
        ProbeState::Completed {
            token: slot.token,
            attempt: slot.attempt,
            expires_ns: slot.deadline_ns,
            expires_wall_ms,
            fingerprint: narrow(fingerprint),
            response,
            published: slot.is_published(),
        }
    }
}

fn to_hold(answer: HolderAnswer) -> ProbeHold {
    match answer {
        HolderAnswer::Done | HolderAnswer::Repeat { .. } => ProbeHold::Done,
        HolderAnswer::NotHeld => ProbeHold::NotHeld,
        HolderAnswer::LeaseLost => ProbeHold::LeaseLost,
    }
}

/// The probe's fingerprints are a caller's u64, zero-extended by the engine.
fn narrow(fingerprint: Option<u128>) -> Option<u64> {
    fingerprint.map(|f| {
        debug_assert!(f >> 64 == 0, "the probe only asks with 64-bit fingerprints");
        f as u64
    })
}
