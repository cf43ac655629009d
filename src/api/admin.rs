//! Operator calls ([`Admin`]): list records, force-release a stuck claim, expire now, import records.
//! They serve the `idemkv` command and tests; services rarely need them.

use crate::api::constants::ABANDONED_LIMIT_DEFAULT;
use crate::api::engine::Engine;
use crate::base::clock::{duration_ms, wall_time};
use crate::model::codec::Checkpoint;
use crate::model::error::{ClaimError, LeaseError, Limit};
use crate::model::machine::{self, Imported, Now};
pub(crate) use crate::model::record_info::{ImportError, RecordInfo, RecordInfoState};
use crate::model::slot::{Extra, Slot};
use std::collections::BinaryHeap;
use std::time::{Duration, SystemTime};

/// `Some` of the wall-clock time `ms` after the epoch, or `None` for 0 (unknown).
pub(crate) fn known_time(ms: u64) -> Option<SystemTime> {
    (ms != 0).then(|| wall_time(ms))
}

/// The state of the InFlight `slot` as an operator sees it at `now`.
fn inflight_state(slot: &Slot, extra: Option<&Extra>, now: Now) -> RecordInfoState {
    RecordInfoState::InFlight {
        lease_deadline: wall_time(machine::lease_end_wall_ms(slot, extra, now)),
        checkpoint: extra
            .and_then(|e| e.checkpoint())
            .map(|c| (c.phase(), c.data().to_vec())),
        attempt_started_at: known_time(extra.map_or(0, |e| e.attempt_started_wall_ms)),
        failed: extra.is_some_and(|e| e.failed),
        lease: extra.and_then(|e| e.lease_ms).map(Duration::from_millis),
        claim_id: extra.and_then(|e| e.claim_id()),
    }
}

/// What [`Admin::abandoned`] (and [`crate::admin::FileReader::abandoned`]) look for: claims
/// whose lease is over and that nobody completed — their holder crashed, gave up, or failed
/// them with [`crate::Lease::fail`] — old enough and idle long enough for a background
/// completer to finish them.
///
/// ```
/// use idemkv::admin::AbandonedQuery;
/// use std::time::Duration;
/// let query = AbandonedQuery::default()
///     .older_than(Duration::from_secs(600))
///     .idle_for(Duration::from_secs(300));
/// assert_eq!(query.limit, 1000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AbandonedQuery {
    /// Only claims whose key was first claimed at least this long ago. A claim whose first
    /// claim is unknown (a record of the first file format) counts as old enough.
    pub older_than: Duration,
    /// Only claims whose lease ended at least this long ago.
    pub idle_for: Duration,
    /// At most this many claims, the earliest first claimed first (ties in token order).
    pub limit: usize,
}

impl Default for AbandonedQuery {
    /// Every abandoned claim, however recent, up to 1000.
    fn default() -> Self {
        AbandonedQuery {
            older_than: Duration::ZERO,
            idle_for: Duration::ZERO,
            limit: ABANDONED_LIMIT_DEFAULT,
        }
    }
}

impl AbandonedQuery {
    /// Only claims whose key was first claimed at least this long ago (sets
    /// [`AbandonedQuery::older_than`]).
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = age;
        self
    }

    /// Only claims whose lease ended at least this long ago (sets
    /// [`AbandonedQuery::idle_for`]).
    pub fn idle_for(mut self, idle: Duration) -> Self {
        self.idle_for = idle;
        self
    }

    /// At most this many claims (sets [`AbandonedQuery::limit`]).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Whether a claim first claimed at `first_ms` (0: unknown) whose lease ended at
    /// `ended_ms` qualifies at `now_ms` (all wall-clock ms).
    fn admits(&self, first_ms: u64, ended_ms: u64, now_ms: u64) -> bool {
        ended_ms <= now_ms
            && now_ms.saturating_sub(first_ms) >= duration_ms(self.older_than)
            && now_ms - ended_ms >= duration_ms(self.idle_for)
    }
}

/// A claim whose lease is over and that nobody completed, as [`Admin::abandoned`] lists it:
/// what a completer needs to finish it. Claiming the key takes it over (a new token,
/// attempt + 1, the checkpoint handed over); completing that lease settles it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AbandonedClaim {
    /// The key.
    pub key: Vec<u8>,
    /// The key's scope (empty: unscoped); the completer claims with it
    /// ([`crate::ClaimOptions::scope`]).
    pub scope: Vec<u8>,
    /// The token of the claim whose lease is over.
    pub token: u64,
    /// Its attempt (1 + takeovers); the completer's claim will be `attempt + 1`.
    pub attempt: u32,
    /// The request fingerprint stored with the key, if any: a claim with another one is
    /// refused.
    pub fingerprint: Option<u128>,
    /// When the key was first claimed; `None`: unknown.
    pub first_claimed_at: Option<SystemTime>,
    /// When the attempt whose lease is over started; `None`: unknown.
    pub attempt_started_at: Option<SystemTime>,
    /// When its lease ended (for a failed claim: when it failed).
    pub lease_ended_at: SystemTime,
    /// Whether its holder failed it ([`crate::Lease::fail`]) rather than let it lapse.
    pub failed: bool,
    /// The last checkpoint saved for the key.
    pub checkpoint: Option<Checkpoint>,
}

impl AbandonedClaim {
    /// The record's claim, if it is InFlight with its lease over at `now_ms` and `query`
    /// admits it (an InFlight record's lease deadline is when its lease ends or ended).
    pub(crate) fn from_record(
        r: &RecordInfo,
        query: &AbandonedQuery,
        now_ms: u64,
    ) -> Option<AbandonedClaim> {
        let RecordInfoState::InFlight {
            lease_deadline,
            checkpoint,
            attempt_started_at,
            failed,
            ..
        } = &r.state
        else {
            return None;
        };
        let first_ms = r.first_claimed_at.map_or(0, crate::base::clock::wall_ms);
        let ended_ms = crate::base::clock::wall_ms(*lease_deadline);
        if !query.admits(first_ms, ended_ms, now_ms) {
            return None;
        }
        Some(AbandonedClaim {
            key: r.key.clone(),
            scope: r.scope.clone(),
            token: r.token,
            attempt: r.attempt,
            fingerprint: r.fingerprint,
            first_claimed_at: r.first_claimed_at,
            attempt_started_at: *attempt_started_at,
            lease_ended_at: *lease_deadline,
            failed: *failed,
            checkpoint: checkpoint.as_ref().map(|(p, d)| Checkpoint::new(*p, d)),
        })
    }

    /// The order of a listing: earliest first claimed first (unknown first), then tokens.
    pub(crate) fn order(&self) -> (u64, u64) {
        (
            self.first_claimed_at.map_or(0, crate::base::clock::wall_ms),
            self.token,
        )
    }
}

/// An [`AbandonedClaim`] in the bounded heap of a listing: the latest in listing order on
/// top, so that it is the one dropped when the heap is over its limit.
struct ByOrder(AbandonedClaim);

impl PartialEq for ByOrder {
    fn eq(&self, other: &Self) -> bool {
        self.0.order() == other.0.order()
    }
}

impl Eq for ByOrder {}

impl PartialOrd for ByOrder {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByOrder {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.order().cmp(&other.0.order())
    }
}

/// The first `limit` of `claims` in listing order, holding at most `limit + 1` at a time.
pub(crate) fn first_in_order(
    claims: impl IntoIterator<Item = AbandonedClaim>,
    limit: usize,
) -> Vec<AbandonedClaim> {
    let mut heap = BinaryHeap::new();
    for claim in claims {
        if limit == 0 {
            break;
        }
        if heap.len() == limit
            && heap
                .peek()
                .is_some_and(|top: &ByOrder| top.0.order() <= claim.order())
        {
            continue;
        }
        heap.push(ByOrder(claim));
        if heap.len() > limit {
            heap.pop();
        }
    }
    let mut out: Vec<AbandonedClaim> = heap.into_iter().map(|c| c.0).collect();
    out.sort_by_key(AbandonedClaim::order);
    out
}

/// The operator's calls on an engine: list records, force-release a stuck claim, import
/// exported records, sweep now. They serve the `idemkv` command, migrations and tests; the
/// idempotency API itself is on [`Engine`]. Get one with [`Engine::admin`].
///
/// ```
/// use idemkv::{Durability, Engine};
/// let engine = Engine::builder().durability(Durability::None).open()?;
/// assert!(engine.admin().records().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Admin<'a> {
    engine: &'a Engine,
}

impl Engine {
    /// The operator's calls on this engine ([`Admin`]).
    pub fn admin(&self) -> Admin<'_> {
        Admin { engine: self }
    }
}

impl Admin<'_> {
    /// Every live (unexpired) record, in token order. Takes each stripe lock once, briefly;
    /// a durable engine reads completed responses from the file afterwards.
    pub fn records(&self) -> Vec<RecordInfo> {
        let s = self.engine.shared();
        let mut out = Vec::new();
        let mut from_file = Vec::new();
        for stripe in s.index().stripes() {
            let shard = stripe.lock();
            let now = s.now();
            for (scoped, slot) in shard
                .iter()
                .filter(|(_, slot)| !slot.is_expired(now.mono_ns))
            {
                let (scope, key) = crate::model::scope::split(scoped);
                let extra = shard.extra(slot);
                let state = if slot.is_inflight() {
                    inflight_state(slot, extra, now)
                } else if let Some(response) = extra.and_then(|e| e.response.as_ref()) {
                    RecordInfoState::Completed {
                        response: response.to_vec(),
                        expires_at: wall_time(extra.map_or(0, |e| e.expires_wall_ms)),
                        published: slot.is_published(),
                    }
                } else {
                    if slot.is_published() {
                        from_file.push(out.len());
                    }
                    // Not yet durable: the response is only in the file once published.
                    RecordInfoState::Completed {
                        response: Vec::new(),
                        expires_at: wall_time(extra.map_or(0, |e| e.expires_wall_ms)),
                        published: slot.is_published(),
                    }
                };
                out.push(RecordInfo {
                    key: key.to_vec(),
                    scope: scope.to_vec(),
                    token: slot.token,
                    fingerprint: extra.and_then(|e| e.fingerprint()),
                    attempt: slot.attempt,
                    state,
                    first_claimed_at: known_time(extra.map_or(0, |e| e.first_claimed_wall_ms)),
                });
            }
        }
        let mut gone = std::collections::HashSet::new();
        for i in from_file {
            let r = &mut out[i];
            let scoped = crate::model::scope::scoped(&r.scope, &r.key).unwrap_or_default();
            match self.engine.read_completed(&scoped, r.token, None) {
                Ok(Some(read)) => {
                    r.state = RecordInfoState::Completed {
                        response: read.stored.response.to_vec(),
                        expires_at: wall_time(read.expires_wall_ms),
                        published: true,
                    };
                    r.fingerprint = read.fingerprint;
                    r.first_claimed_at = known_time(read.first_claimed_wall_ms);
                }
                // Expired and swept since the walk, or unreadable: not a live record.
                _ => {
                    gone.insert(r.token);
                }
            }
        }
        out.retain(|r| !gone.contains(&r.token));
        out.sort_by_key(|r| r.token);
        out
    }

    /// The claims whose lease is over and that nobody completed (their holder crashed, gave
    /// up, or failed them), first claimed at least `query.older_than` ago and idle (lease
    /// over) for at least `query.idle_for`, with their checkpoints: at most `query.limit`,
    /// the earliest first claimed first. A background completer finishes each by claiming
    /// its key (a takeover: attempt + 1, the checkpoint handed over) and completing that
    /// lease; a claim someone else takes over meanwhile simply answers `InProgress` or
    /// `Completed`.
    ///
    /// Takes each stripe lock once, briefly, and walks its keys (an operator's call, like
    /// [`Admin::records`]); reads nothing from the file.
    ///
    /// ```
    /// use idemkv::admin::AbandonedQuery;
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let Claim::Acquired(mut lease) = engine.claim(b"job-7", &ClaimOptions::default())? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// lease.set_checkpoint(1, b"step 1 done")?;
    /// lease.fail()?; // the attempt ends, the progress stays
    /// let found = engine.admin().abandoned(&AbandonedQuery::default());
    /// assert_eq!(found.len(), 1);
    /// assert!(found[0].failed);
    /// let opts = ClaimOptions::default().scope(&found[0].scope);
    /// let Claim::Acquired(lease) = engine.claim(&found[0].key, &opts)? else {
    ///     unreachable!("a failed claim is taken over at once")
    /// };
    /// assert_eq!(lease.checkpoint().map(|c| c.data()), Some(&b"step 1 done"[..]));
    /// lease.complete(b"finished by the completer")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn abandoned(&self, query: &AbandonedQuery) -> Vec<AbandonedClaim> {
        let s = self.engine.shared();
        let mut found = Vec::new();
        for stripe in s.index().stripes() {
            let shard = stripe.lock();
            let now = s.now();
            let over = |slot: &Slot| slot.is_inflight() && slot.deadline_ns <= now.mono_ns;
            for (scoped, slot) in shard.iter().filter(|(_, slot)| over(slot)) {
                let (scope, key) = crate::model::scope::split(scoped);
                let extra = shard.extra(slot);
                let first_ms = extra.map_or(0, |e| e.first_claimed_wall_ms);
                let ended_ms = machine::lease_end_wall_ms(slot, extra, now);
                if !query.admits(first_ms, ended_ms, now.wall_ms) {
                    continue;
                }
                found.push(AbandonedClaim {
                    key: key.to_vec(),
                    scope: scope.to_vec(),
                    token: slot.token,
                    attempt: slot.attempt,
                    fingerprint: extra.and_then(|e| e.fingerprint()),
                    first_claimed_at: known_time(first_ms),
                    attempt_started_at: known_time(extra.map_or(0, |e| e.attempt_started_wall_ms)),
                    lease_ended_at: wall_time(ended_ms),
                    failed: extra.is_some_and(|e| e.failed),
                    checkpoint: extra.and_then(|e| e.checkpoint().cloned()),
                });
            }
            // Bounded while walking: at most `limit` kept beyond one stripe's finds.
            if found.len() > query.limit.saturating_mul(2) {
                found = first_in_order(found, query.limit);
            }
        }
        first_in_order(found, query.limit)
    }

    /// Releases the unscoped `key` whatever its token, if it is InFlight: the operator's
    /// remedy for a claim stuck behind a long lease. Returns the record as it was before the
    /// release. [`Admin::force_release_scoped`] releases a key within a scope.
    pub fn force_release(&self, key: &[u8]) -> Result<Option<RecordInfo>, ClaimError> {
        self.force_release_scoped(&[], key)
    }

    /// [`Admin::force_release`] of `key` within `scope`.
    pub fn force_release_scoped(
        &self,
        scope: &[u8],
        key: &[u8],
    ) -> Result<Option<RecordInfo>, ClaimError> {
        self.engine.check_key(key)?;
        self.engine.check_open()?;
        let scoped = self.engine.scoped_key(scope, key)?;
        let before = {
            let s = self.engine.shared();
            let (shard, _, k) = s.index().lock(&scoped);
            let Some(slot) = shard.get(k).filter(|slot| slot.is_inflight()) else {
                return Ok(None);
            };
            let extra = shard.extra(&slot);
            RecordInfo {
                key: key.to_vec(),
                scope: scope.to_vec(),
                token: slot.token,
                fingerprint: extra.and_then(|e| e.fingerprint()),
                attempt: slot.attempt,
                state: inflight_state(&slot, extra, s.now()),
                first_claimed_at: known_time(extra.map_or(0, |e| e.first_claimed_wall_ms)),
            }
        };
        match self.engine.release_at(&scoped, before.token) {
            Ok(true) => Ok(Some(before)),
            // The holder finished or released in between: nothing to force.
            Ok(false) => Ok(None),
            Err(e) => Err(match e {
                LeaseError::Poisoned(why) => ClaimError::Poisoned(why),
                LeaseError::OutcomeUnknown(why) => ClaimError::OutcomeUnknown(why),
                LeaseError::Overloaded(limit) => ClaimError::Overloaded(limit),
                _ => ClaimError::Closed,
            }),
        }
    }

    /// Adds a record exported from another engine (see [`Admin::records`]), durably under
    /// `Immediate`. Records must be imported in token order into an engine whose next token
    /// is not above theirs (a fresh file), so fencing is preserved.
    pub fn import(&self, record: &RecordInfo) -> Result<(), ImportError> {
        self.import_inner(record, true)
    }

    /// [`Admin::import`] without waiting for the record's commit: imports share group
    /// commits, and [`Engine::flush`] makes everything imported so far durable. For bulk
    /// restores, where one fsync per record would take hours.
    pub fn import_queued(&self, record: &RecordInfo) -> Result<(), ImportError> {
        self.import_inner(record, false)
    }

    /// Reclaims every key past its retention, and every abandoned claim past its lease end
    /// plus retention, now, from memory and (through the writer) from the file; returns how
    /// many. Expired keys are already Absent to every call: this only gives their space
    /// back, as the background sweeper does on its own. A reaped abandoned claim is Absent
    /// from then on. A close or a poison during the sweep ends it early with `Closed` or
    /// `Poisoned`.
    pub fn sweep_now(&self) -> Result<u64, ClaimError> {
        self.engine.check_open()?;
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.engine.remote() {
            return remote.sweep_now();
        }
        let removed = crate::runtime::sweep::sweep_all(self.engine.shared());
        self.engine.check_open()?;
        Ok(removed)
    }

    fn import_inner(&self, record: &RecordInfo, wait: bool) -> Result<(), ImportError> {
        self.engine.check_open().map_err(ImportError::Engine)?;
        let s = self.engine.shared();
        if record.key.is_empty() || record.key.len() > s.cfg().key_len_max {
            return Err(ImportError::Invalid(format!(
                "key length {} outside 1..={}",
                record.key.len(),
                s.cfg().key_len_max
            )));
        }
        let key =
            crate::model::scope::ScopedKey::new(&record.scope, &record.key).ok_or_else(|| {
                ImportError::Invalid(format!(
                    "scope length {} over {}",
                    record.scope.len(),
                    crate::model::constants::SCOPE_LEN_MAX
                ))
            })?;
        let (mut shard, changed, k) = s.index().lock(&key);
        let step = machine::import(
            shard.view(k),
            machine::KeyRef::Scoped(&key),
            record,
            s.tokens().next(),
            s.now(),
            &s.rules(),
        )?;
        if step.answer == Imported::Gone {
            return Ok(());
        }
        if !s.tokens().advance_to(record.token) {
            return Err(ImportError::Engine(ClaimError::TokensExhausted));
        }
        let seq = s
            .queue(step.write, false)
            .map_err(|_| ImportError::Engine(ClaimError::Overloaded(Limit::WriterQueue)))?;
        shard.apply(k, step.change, seq);
        s.count(&mut shard.events, &step.deltas);
        drop(shard);
        changed.notify_all();
        if wait {
            s.wait_durable(seq)
                .map_err(|why| ImportError::Engine(ClaimError::OutcomeUnknown(why)))?;
        }
        Ok(())
    }
}
