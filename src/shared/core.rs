//! The shared backend's operations, as futures on its private runtime: the claim with the
//! local front before it, and what a lease holder does. Each database transition is one
//! statement (`sql.rs`); the front only spares round trips and never decides a transition.

use super::db::{Db, Writes};
use super::front::{Cached, Found, Front, Look};
use super::rows::{ClaimRow, CompleteRow, Fail, GetRow, HookFail, TableRow};
pub(crate) use crate::api::remote::RemoteAnswer as Answer;
use crate::model::answer::{Busy, Forgotten, KeyState, Stored};
use crate::model::codec::Checkpoint;
use crate::model::error::{ClaimError, LeaseError};
use crate::model::settings::AskedFingerprint;
use crate::shared::constants::{PG_CLAIM_ASKS_MAX, PG_INTERVAL_MAX, PG_SWEEP_BATCH};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The counters of `Stats` a shared engine keeps (this process's calls).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) claims: AtomicU64,
    pub(crate) claims_cancelled: AtomicU64,
    pub(crate) acquired: AtomicU64,
    pub(crate) takeovers: AtomicU64,
    pub(crate) replays: AtomicU64,
    pub(crate) in_progress: AtomicU64,
    pub(crate) fingerprint_mismatches: AtomicU64,
    pub(crate) completions: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) leases_lost: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) expirations: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub(crate) struct Core {
    pub(crate) db: Db,
    pub(crate) front: Front,
    /// Whether the listening connection listens (`listen.rs`).
    pub(crate) listening: super::listen::Listening,
    /// Hashes of keys settled here, to announce to other processes (`wake.rs`).
    pub(crate) outbox: super::wake::Outbox,
    pub(crate) counters: Counters,
    pub(crate) closed: AtomicBool,
    pub(crate) retention: Duration,
    /// The longest a caller waits for another caller's ask: the ask's own bound.
    pub(crate) ask_bound: Duration,
}

fn claim_failed(f: Fail) -> ClaimError {
    match f {
        Fail::Refused(e) => ClaimError::Database(e),
        Fail::Unknown(why) => ClaimError::OutcomeUnknown(why),
    }
}

/// An acquisition whose flush failed: committed, but whether it is durable is unknown, so
/// it is not given out.
fn unflushed(f: Fail) -> Fail {
    let why = match f {
        Fail::Refused(e) => e.to_string(),
        Fail::Unknown(why) => why.to_string(),
    };
    Fail::Unknown(Arc::from(format!(
        "the claim committed, but its flush to disk failed, so whether it survives a crash \
         is unknown: {why}"
    )))
}

fn lease_failed(f: Fail) -> LeaseError {
    match f {
        Fail::Refused(e) => LeaseError::Database(e),
        Fail::Unknown(why) => LeaseError::OutcomeUnknown(why),
    }
}

fn mismatched(asked: Option<AskedFingerprint>, stored: Option<u128>) -> bool {
    matches!((asked, stored), (Some(a), Some(s)) if !a.matches(s))
}

/// Drops the key's front entry when the claim ends, if nobody needs it any more. Declared
/// before the claim's receivers, so it runs after they are gone.
struct Tidy<'a> {
    front: &'a Front,
    key: &'a [u8],
    hash: u64,
}

impl Drop for Tidy<'_> {
    fn drop(&mut self) {
        self.front.tidy(self.key, self.hash);
    }
}

impl Core {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// A claim answered by this process alone, on the caller's thread, without the
    /// runtime (`Front::answer_locally`); `None`: make the full claim.
    pub(crate) fn claim_locally(
        &self,
        key: &[u8],
        hash: u64,
        asked: Option<AskedFingerprint>,
        waits: bool,
    ) -> Option<Result<Answer, ClaimError>> {
        if self.is_closed() {
            return None;
        }
        let look = self.front.answer_locally(key, hash, asked, waits)?;
        let answer = match look {
            Look::Replay(stored) => {
                bump(&self.counters.replays);
                Ok(Answer::Completed(stored))
            }
            Look::Mismatch => {
                bump(&self.counters.fingerprint_mismatches);
                Err(ClaimError::FingerprintMismatch)
            }
            Look::Busy {
                retry_after,
                attempt,
            } => Ok(self.busy(retry_after, attempt)),
            // `answer_locally` answers only the three above.
            Look::Ask | Look::Wait { .. } => return None,
        };
        bump(&self.counters.claims);
        Some(answer)
    }

    /// A claim; `wait`: `claim_or_wait`'s wait. Concurrent local callers of one key share
    /// one statement (see `front.rs`). A claim presenting `claim_id` asks the database even
    /// when this process knows the key held: it may resume that lease.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim(
        &self,
        key: &[u8],
        hash: u64,
        asked: Option<AskedFingerprint>,
        claim_id: Option<u128>,
        lease: Duration,
        own_retention: Option<Duration>,
        wait: Option<Duration>,
        rerun: bool,
    ) -> Result<Answer, ClaimError> {
        bump(&self.counters.claims);
        // A claim that may wait is covered by `LISTEN` before its first ask: a commit it
        // does not read is announced to it.
        let _registration = match wait {
            Some(_) => Some(self.listening.register().await),
            None => None,
        };
        let _tidy = Tidy {
            front: &self.front,
            key,
            hash,
        };
        let deadline = wait.map(|w| Instant::now() + w.min(PG_INTERVAL_MAX));
        let mut joined = false;
        let mut asks = 0u32;
        loop {
            if self.is_closed() {
                return Err(ClaimError::Closed);
            }
            let far = Instant::now() + self.ask_bound;
            let resumes = claim_id.is_some();
            match self
                .front
                .look(key, hash, asked, deadline, joined, far, resumes)
            {
                Look::Replay(stored) => {
                    bump(&self.counters.replays);
                    return Ok(Answer::Completed(stored));
                }
                Look::Mismatch => {
                    bump(&self.counters.fingerprint_mismatches);
                    return Err(ClaimError::FingerprintMismatch);
                }
                Look::Busy {
                    retry_after,
                    attempt,
                } => return Ok(self.busy(retry_after, attempt)),
                Look::Wait {
                    mut signal,
                    until,
                    joins_ask,
                } => {
                    if !joins_ask {
                        bump(&self.counters.waits);
                    }
                    // A change, the instant, or the entry gone (its sender dropped): look again.
                    let _ = tokio::time::timeout_at(until, signal.changed()).await;
                    joined = joins_ask;
                    continue;
                }
                Look::Ask => {}
            }
            joined = false;
            let sent = Instant::now();
            let row = self
                .db
                .claim(
                    key,
                    asked,
                    claim_id,
                    lease,
                    self.retention,
                    own_retention,
                    rerun,
                )
                .await;
            // The lifetime token the claim's statement read: its flush must still read it.
            let life = match &row {
                Ok(ClaimRow::Acquired { life, .. }) => *life,
                _ => None,
            };
            let (found, answer) = self.decided(row, asked, lease, sent, deadline, &mut asks);
            let flushes = match found {
                Found::Acquired { token, .. } if self.db.commits_early() => Some(token),
                _ => None,
            };
            // Published before the flush: the row is visible to other processes already,
            // and this process's duplicates are answered from it as theirs are.
            self.front.publish(key, hash, sent, found);
            if let Some(token) = flushes {
                if let Err(f) = self.db.flush(self.retention, life).await {
                    self.front.forget_held(key, hash, token);
                    return Err(claim_failed(unflushed(f)));
                }
            }
            if let Some(answer) = answer {
                return answer;
            }
        }
    }

    /// What a claim statement's row means for this caller (`None`: ask again) and what the
    /// local front learns from it; `asks` counts the rows that could not decide.
    fn decided(
        &self,
        row: Result<ClaimRow, Fail>,
        asked: Option<AskedFingerprint>,
        lease: Duration,
        sent: Instant,
        deadline: Option<Instant>,
        asks: &mut u32,
    ) -> (Found, Option<Result<Answer, ClaimError>>) {
        match row {
            Err(f) => (Found::Nothing, Some(Err(claim_failed(f)))),
            Ok(ClaimRow::Acquired {
                token,
                attempt,
                checkpoint,
                resumed,
                ..
            }) => self.acquired(token, attempt, checkpoint, resumed, asked, lease),
            Ok(ClaimRow::Completed {
                stored,
                fingerprint,
                remaining,
            }) if !remaining.is_zero() => {
                let cached = Cached {
                    stored: stored.clone(),
                    fingerprint,
                    until: sent + remaining,
                };
                let answer = if mismatched(asked, fingerprint) {
                    bump(&self.counters.fingerprint_mismatches);
                    Err(ClaimError::FingerprintMismatch)
                } else {
                    bump(&self.counters.replays);
                    Ok(Answer::Completed(stored))
                };
                (Found::Completed(cached), Some(answer))
            }
            Ok(ClaimRow::Held {
                attempt,
                remaining,
                fingerprint,
            }) if mismatched(asked, fingerprint) => {
                bump(&self.counters.fingerprint_mismatches);
                // A live row is published as for a match: a lease of this process
                // stays held here, and joined callers check their own fingerprint. An
                // ended one is not: a joined caller that matches may take it over.
                let found = match remaining.is_zero() {
                    true => Found::Nothing,
                    false => Found::Held {
                        remaining,
                        attempt,
                        fingerprint,
                    },
                };
                (found, Some(Err(ClaimError::FingerprintMismatch)))
            }
            Ok(ClaimRow::Held {
                attempt,
                remaining,
                fingerprint,
            }) if !remaining.is_zero() => {
                let waits_on = deadline.is_some_and(|d| Instant::now() < d);
                let answer = (!waits_on).then(|| Ok(self.busy(remaining, attempt)));
                let found = Found::Held {
                    remaining,
                    attempt,
                    fingerprint,
                };
                (found, answer)
            }
            Ok(ClaimRow::Forgotten {
                attempt,
                fingerprint,
                completed_wall_ms,
                remaining,
            }) if !remaining.is_zero() => {
                let answer = if mismatched(asked, fingerprint) {
                    bump(&self.counters.fingerprint_mismatches);
                    Err(ClaimError::FingerprintMismatch)
                } else {
                    Ok(Answer::Forgotten(Forgotten {
                        completed_wall_ms,
                        attempt,
                        kept_until_wall_ms: expires_wall_ms(remaining),
                    }))
                };
                (Found::Nothing, Some(answer))
            }
            // The function's passes all lost races to other callers' commits, or it read a
            // row whose lease or retention ended as it answered: ask again.
            Ok(_) => {
                *asks += 1;
                if *asks >= PG_CLAIM_ASKS_MAX {
                    (Found::Nothing, Some(Err(ClaimError::Contended)))
                } else {
                    (Found::Nothing, None)
                }
            }
        }
    }

    /// An acquired (or resumed) lease: the caller's answer and the front's entry.
    fn acquired(
        &self,
        token: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
        resumed: bool,
        asked: Option<AskedFingerprint>,
        lease: Duration,
    ) -> (Found, Option<Result<Answer, ClaimError>>) {
        bump(&self.counters.acquired);
        if attempt > 1 && !resumed {
            bump(&self.counters.takeovers);
        }
        let answer = Answer::Acquired {
            token,
            attempt,
            checkpoint,
            lease,
        };
        let found = Found::Acquired {
            token,
            attempt,
            lease,
            fingerprint: asked.map(|a| a.value),
        };
        (found, Some(Ok(answer)))
    }

    fn busy(&self, retry_after: Duration, attempt: u32) -> Answer {
        bump(&self.counters.in_progress);
        Answer::Busy(Busy {
            retry_after,
            attempt,
            completing: false,
        })
    }

    pub(crate) async fn complete(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
        own_retention: Option<Duration>,
        writes: Option<Writes>,
    ) -> Result<u64, LeaseError> {
        let hash = crate::base::hash::key_hash(key);
        let sent = Instant::now();
        let row = self
            .db
            .complete(
                key,
                token,
                &response,
                self.retention,
                own_retention,
                hash,
                writes.as_ref(),
            )
            .await;
        self.completed(key, hash, token, response, sent, row)
    }

    /// A completion whose transaction also runs the application's statements (`hook`).
    pub(crate) async fn complete_in(
        &self,
        key: &[u8],
        token: u64,
        response: Arc<[u8]>,
        own_retention: Option<Duration>,
        writes: Option<Writes>,
        hook: super::Hook,
    ) -> Result<u64, LeaseError> {
        let hash = crate::base::hash::key_hash(key);
        let sent = Instant::now();
        let row = self
            .db
            .complete_in(
                key,
                token,
                &response,
                self.retention,
                own_retention,
                hash,
                writes.as_ref(),
                hook,
            )
            .await;
        let row = match row {
            Ok(row) => Ok(row),
            Err(HookFail::Db(f)) => Err(f),
            // Rolled back: the key stays held, as after any refused completion.
            Err(HookFail::Hook(e)) => {
                return Err(LeaseError::Database(super::DatabaseError::from_client(
                    e,
                    "the application's statement in the completion's transaction failed",
                )))
            }
        };
        self.completed(key, hash, token, response, sent, row)
    }

    /// What a completing statement's answer does here: the local front and the wake-ups.
    fn completed(
        &self,
        key: &[u8],
        hash: u64,
        token: u64,
        response: Arc<[u8]>,
        sent: Instant,
        row: Result<CompleteRow, Fail>,
    ) -> Result<u64, LeaseError> {
        match row {
            Ok(CompleteRow::Done {
                repeat: true,
                remaining,
                heard,
                ..
            }) => {
                // Stored before under this token: the row keeps the first completion's
                // response, which this call's bytes need not be, so none is cached here
                // (a local claim asks and replays the stored one).
                self.front.forget_held(key, hash, token);
                if heard {
                    self.outbox.push(hash);
                }
                Ok(expires_wall_ms(remaining))
            }
            Ok(CompleteRow::Done {
                repeat: false,
                attempt,
                fingerprint,
                remaining,
                heard,
            }) => {
                bump(&self.counters.completions);
                let expires = expires_wall_ms(remaining);
                let stored = Stored {
                    response,
                    token,
                    attempt,
                    expires_wall_ms: expires,
                };
                let cached = Cached {
                    stored,
                    fingerprint,
                    until: sent + remaining,
                };
                self.front.completed(key, hash, cached);
                if heard {
                    self.outbox.push(hash);
                }
                Ok(expires)
            }
            Ok(CompleteRow::Lost) => {
                bump(&self.counters.leases_lost);
                self.front.forget_held(key, hash, token);
                Err(LeaseError::LeaseLost)
            }
            Err(f) => {
                // A refusal leaves the key held; an unknown outcome may have settled it.
                if matches!(f, Fail::Unknown(_)) {
                    self.front.forget_held(key, hash, token);
                    self.outbox.push(hash);
                }
                Err(lease_failed(f))
            }
        }
    }

    pub(crate) async fn release(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        let hash = crate::base::hash::key_hash(key);
        let answer = self.db.release(key, token).await;
        if !matches!(answer, Err(Fail::Refused(_)) | Ok(false)) {
            self.outbox.push(hash);
        }
        if !matches!(answer, Err(Fail::Refused(_))) {
            self.front.forget_held(key, hash, token);
        }
        let released = answer.map_err(lease_failed)?;
        if released {
            bump(&self.counters.releases);
        }
        Ok(released)
    }

    pub(crate) async fn extend(
        &self,
        key: &[u8],
        token: u64,
        lease: Duration,
    ) -> Result<(), LeaseError> {
        let hash = crate::base::hash::key_hash(key);
        let sent = Instant::now();
        match self.db.extend(key, token, lease, self.retention).await {
            Ok(true) => {
                self.front.extended(key, hash, token, sent, lease);
                Ok(())
            }
            Ok(false) => self.lost(key, hash, token),
            Err(f) => Err(lease_failed(f)),
        }
    }

    pub(crate) async fn checkpoint(
        &self,
        key: &[u8],
        token: u64,
        phase: u32,
        data: Arc<[u8]>,
        writes: Option<Writes>,
    ) -> Result<(), LeaseError> {
        let hash = crate::base::hash::key_hash(key);
        let saved = match &writes {
            None => self.db.checkpoint(key, token, phase, &data).await,
            Some(w) => self.db.checkpoint_with(key, token, phase, &data, w).await,
        };
        match saved {
            Ok(true) => Ok(()),
            Ok(false) => self.lost(key, hash, token),
            Err(f) => Err(lease_failed(f)),
        }
    }

    /// Fails the attempt held by `token`: whether it did. The key can be taken over at
    /// once, so local callers look again and other processes' waiters are woken.
    pub(crate) async fn fail(&self, key: &[u8], token: u64) -> Result<bool, LeaseError> {
        let hash = crate::base::hash::key_hash(key);
        let answer = self.db.fail(key, token, self.retention).await;
        if !matches!(answer, Err(Fail::Refused(_)) | Ok(false)) {
            self.outbox.push(hash);
        }
        if !matches!(answer, Err(Fail::Refused(_))) {
            self.front.forget_held(key, hash, token);
        }
        answer.map_err(lease_failed)
    }

    fn lost(&self, key: &[u8], hash: u64, token: u64) -> Result<(), LeaseError> {
        bump(&self.counters.leases_lost);
        self.front.forget_held(key, hash, token);
        Err(LeaseError::LeaseLost)
    }

    pub(crate) async fn get(&self, key: &[u8]) -> Result<Option<KeyState>, ClaimError> {
        let row = self.db.get(key).await.map_err(claim_failed)?;
        Ok(row.map(|row| match row {
            GetRow::InFlight {
                token,
                attempt,
                checkpoint,
                remaining,
                failed,
                first_claimed_wall_ms,
                attempt_started_wall_ms,
            } => KeyState::InFlight {
                token,
                attempt,
                lease_remaining: remaining,
                checkpoint,
                first_claimed_at: first_claimed_wall_ms.map(crate::base::clock::wall_time),
                attempt_started_at: attempt_started_wall_ms.map(crate::base::clock::wall_time),
                failed,
            },
            GetRow::Completed {
                stored,
                expires_wall_ms,
            } => KeyState::Completed {
                token: stored.token,
                attempt: stored.attempt,
                response: stored.response,
                expires_at: crate::base::clock::wall_time(expires_wall_ms),
            },
        }))
    }

    /// A row of the application's tables.
    pub(crate) async fn table_get(&self, row: &[u8]) -> Result<Option<Vec<u8>>, ClaimError> {
        self.db.table_get(row).await.map_err(claim_failed)
    }

    /// Rows of the application's tables from `lo` to `hi` (exclusive).
    pub(crate) async fn table_scan(
        &self,
        lo: &[u8],
        hi: &[u8],
        limit: usize,
    ) -> Result<Vec<TableRow>, ClaimError> {
        self.db
            .table_scan(lo, hi, limit)
            .await
            .map_err(claim_failed)
    }

    /// Pending messages, taken by this relay for `hold`.
    pub(crate) async fn outbox_take(
        &self,
        limit: usize,
        hold: Duration,
    ) -> Result<Vec<(u64, Vec<u8>)>, ClaimError> {
        self.db.outbox_take(limit, hold).await.map_err(claim_failed)
    }

    /// Removes sent messages.
    pub(crate) async fn outbox_sent(&self, ids: &[u64]) -> Result<(), ClaimError> {
        self.db.outbox_sent(ids).await.map_err(claim_failed)
    }

    /// Sweeps until a batch comes back short, at most `batches` batches; the rows deleted.
    pub(crate) async fn sweep(&self, batches: u32) -> Result<u64, ClaimError> {
        let mut total = 0;
        for _ in 0..batches {
            if self.is_closed() {
                break;
            }
            let n = self.db.sweep().await.map_err(claim_failed)?;
            total += n;
            self.counters.expirations.fetch_add(n, Ordering::Relaxed);
            if n < PG_SWEEP_BATCH.unsigned_abs() {
                break;
            }
        }
        Ok(total)
    }
}

/// When a completion with `remaining` retention left on the database's clock expires, on
/// this machine's wall clock: reports only (`Stored::expires_at`); every decision about the
/// key's expiry is the database's.
pub(crate) fn expires_wall_ms(remaining: std::time::Duration) -> u64 {
    crate::base::clock::wall_ms(std::time::SystemTime::now())
        .saturating_add(crate::base::clock::duration_ms(remaining))
}
