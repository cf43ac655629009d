//! The local front: what this process knows about the keys its callers are asking about,
//! so that concurrent duplicates inside one process make one database round trip per key.
//!
//! Per key there is at most one entry, under its stripe's lock:
//!
//! - while one caller **asks** the database (`asking`), every other local caller of the
//!   key waits for that answer instead of sending its own statement;
//! - **Held**: a lease of this process holds the key; local callers wait for its
//!   completion or release (or its lease's end, then one of them asks);
//! - **Remote**: at the last ask another process held the key; the waiters sleep until a
//!   notification for the key, the lease's end, or a bounded poll, then one asks again;
//! - **Completed**: a completion cached until its retention ends (as the database said,
//!   measured from before the statement was sent, so never past the database's own end),
//!   replayed without a round trip; bounded in count and bytes.
//!
//! Every change of an entry bumps its signal (a `watch` channel): a waiter subscribes
//! under the stripe lock, so no change made after its look is missed.

use crate::api::lease::Stored;
use crate::model::settings::AskedFingerprint;
use crate::shared::constants::{
    PG_CACHE_BYTES_MAX, PG_CACHE_ENTRIES_MAX, PG_FRONT_STRIPES, PG_INTERVAL_MAX, PG_WAIT_POLL_MAX,
    PG_WAIT_POLL_MIN,
};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A cached completion.
#[derive(Debug, Clone)]
pub(crate) struct Cached {
    pub(crate) stored: Stored,
    pub(crate) fingerprint: Option<u128>,
    pub(crate) until: Instant,
}

#[derive(Debug, Clone)]
enum Local {
    /// Nothing known (an ask is under way, or failed).
    Unknown,
    Held {
        token: u64,
        attempt: u32,
        /// The lease's end as this process estimates it (never later than the database's).
        until: Instant,
        /// The row's fingerprint, when known (`None`: the claim brought none and took over
        /// a row that may have one; an ask learns it).
        fingerprint: Option<Option<u128>>,
    },
    Remote {
        attempt: u32,
        /// The row's fingerprint, as the last ask read it.
        fingerprint: Option<u128>,
        /// The other holder's lease end, as the last ask reported it.
        until: Instant,
        /// When a waiter asks again without a notification.
        recheck: Instant,
    },
    Completed(Cached),
}

struct Entry {
    key: Box<[u8]>,
    state: Local,
    asking: bool,
    /// A notification for the key arrived while an ask was under way: its answer may be
    /// older than the change.
    notified: bool,
    signal: watch::Sender<()>,
}

impl Entry {
    fn new(key: &[u8]) -> Entry {
        Entry {
            key: Box::from(key),
            state: Local::Unknown,
            asking: false,
            notified: false,
            signal: watch::Sender::new(()),
        }
    }

    fn bump(&self) {
        self.signal.send_replace(());
    }
}

#[derive(Default)]
struct Stripe {
    /// By key hash; a hash shared by several keys holds each of them.
    map: HashMap<u64, Vec<Entry>>,
    /// Completions cached in this stripe, oldest first: (hash, token) for eviction.
    order: VecDeque<(u64, u64)>,
    cached: usize,
    cached_bytes: usize,
}

impl Stripe {
    fn find(&mut self, hash: u64, key: &[u8]) -> Option<&mut Entry> {
        self.map.get_mut(&hash)?.iter_mut().find(|e| *e.key == *key)
    }

    fn entry(&mut self, hash: u64, key: &[u8]) -> &mut Entry {
        let list = self.map.entry(hash).or_default();
        let at = match list.iter().position(|e| *e.key == *key) {
            Some(at) => at,
            None => {
                list.push(Entry::new(key));
                list.len() - 1
            }
        };
        &mut list[at]
    }

    fn remove(&mut self, hash: u64, key: &[u8]) {
        let Some(list) = self.map.get_mut(&hash) else {
            return;
        };
        let gone = list
            .iter()
            .position(|e| *e.key == *key)
            .map(|at| list.swap_remove(at));
        if list.is_empty() {
            self.map.remove(&hash);
        }
        if let Some(e) = gone {
            self.uncache(&e.state);
            e.bump();
        }
    }

    fn uncache(&mut self, state: &Local) {
        if let Local::Completed(c) = state {
            self.cached -= 1;
            self.cached_bytes -= c.stored.response.len();
        }
    }

    /// Sets an entry's state, keeping the cache's counts.
    fn set(&mut self, hash: u64, key: &[u8], state: Local) {
        let (adds, bytes, token) = match &state {
            Local::Completed(c) => (1, c.stored.response.len(), c.stored.token),
            _ => (0, 0, 0),
        };
        let e = self.entry(hash, key);
        let old = std::mem::replace(&mut e.state, state);
        e.bump();
        self.uncache(&old);
        if adds == 1 {
            self.cached += 1;
            self.cached_bytes += bytes;
            self.order.push_back((hash, token));
        }
    }

    /// Evicts the oldest cached completions while the stripe is over its share of the
    /// cache. Entries that are no longer those completions are skipped.
    fn evict(&mut self, entries_max: usize, bytes_max: usize) {
        while self.cached > entries_max || self.cached_bytes > bytes_max {
            let Some((hash, token)) = self.order.pop_front() else {
                return;
            };
            let victim = self.map.get(&hash).and_then(|list| {
                list.iter()
                    .find(|e| {
                        !e.asking
                            && matches!(&e.state, Local::Completed(c) if c.stored.token == token)
                    })
                    .map(|e| e.key.clone())
            });
            if let Some(key) = victim {
                self.remove(hash, &key);
            }
        }
        // The order keeps entries of completions already gone; drop them once they
        // outnumber the live ones, so it stays within about twice the cache.
        if self.order.len() > 2 * self.cached + 64 {
            let map = &self.map;
            self.order.retain(|(hash, token)| {
                map.get(hash).is_some_and(|list| {
                    list.iter().any(
                        |e| matches!(&e.state, Local::Completed(c) if c.stored.token == *token),
                    )
                })
            });
        }
    }
}

/// What a caller does next after looking at its key.
pub(crate) enum Look {
    /// Ask the database; this caller holds the key's ask until it publishes an answer.
    Ask,
    /// A cached completion.
    Replay(Stored),
    Mismatch,
    /// Another holder has it; answer `InProgress` with this hint.
    Busy {
        retry_after: Duration,
        attempt: u32,
    },
    /// Wait for a change of the entry, or until `until`.
    Wait {
        signal: watch::Receiver<()>,
        until: Instant,
        /// Whether the wait is for another caller's ask (its answer then serves this one).
        joins_ask: bool,
    },
}

/// What a claim's ask found, for the front to publish.
pub(crate) enum Found {
    Acquired {
        token: u64,
        attempt: u32,
        lease: Duration,
        /// The claim's own fingerprint: the row's, when the claim brought one.
        fingerprint: Option<u128>,
    },
    Completed(Cached),
    Held {
        remaining: Duration,
        attempt: u32,
        fingerprint: Option<u128>,
    },
    /// The ask failed, or could not decide: nothing is known.
    Nothing,
}

/// Whether a claim's fingerprint lets the front answer it from a held key's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Matches,
    Mismatch,
    /// The row's fingerprint is not known here: only the database can answer.
    Unknown,
}

/// `known`: the row's fingerprint, when the front knows it. As the database decides: a
/// claim or a row without a fingerprint matches anything.
fn local_check(asked: Option<AskedFingerprint>, known: Option<Option<u128>>) -> Check {
    match (asked, known) {
        (None, _) | (Some(_), Some(None)) => Check::Matches,
        (Some(_), None) => Check::Unknown,
        (Some(a), Some(Some(stored))) if a.matches(stored) => Check::Matches,
        (Some(_), Some(Some(_))) => Check::Mismatch,
    }
}

pub(crate) struct Front {
    stripes: Box<[Mutex<Stripe>]>,
    entries_max: usize,
    bytes_max: usize,
}

impl Front {
    pub(crate) fn new() -> Front {
        Front {
            stripes: (0..PG_FRONT_STRIPES).map(|_| Mutex::default()).collect(),
            entries_max: (PG_CACHE_ENTRIES_MAX / PG_FRONT_STRIPES).max(1),
            bytes_max: PG_CACHE_BYTES_MAX / PG_FRONT_STRIPES,
        }
    }

    fn stripe(&self, hash: u64) -> &Mutex<Stripe> {
        // The hash is FNV-1a: fold its high bits in before taking the low ones.
        let i = ((hash ^ (hash >> 32)) as usize) & (PG_FRONT_STRIPES - 1);
        &self.stripes[i]
    }

    /// One look at `key` by a claim. `waiting`: the caller waits for a settled key (until
    /// `deadline`); `joined`: its last wait was for another caller's ask, whose answer
    /// serves it; `resumes`: the claim presents a claim identity, so a lease known held
    /// (here or elsewhere) may be its own to resume: it asks the database instead of
    /// waiting or answering busy.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn look(
        &self,
        key: &[u8],
        hash: u64,
        asked: Option<AskedFingerprint>,
        deadline: Option<Instant>,
        joined: bool,
        far: Instant,
        resumes: bool,
    ) -> Look {
        let now = Instant::now();
        let waiting = deadline.is_some_and(|d| now < d);
        let wait_until = |t: Instant| match deadline {
            Some(d) => t.min(d),
            None => t,
        };
        let mut stripe = self.stripe(hash).lock();
        let e = stripe.entry(hash, key);
        if e.asking {
            return Look::Wait {
                signal: e.signal.subscribe(),
                until: wait_until(far),
                joins_ask: true,
            };
        }
        match e.state.clone() {
            Local::Completed(c) if now < c.until => {
                if let (Some(asked), Some(stored)) = (asked, c.fingerprint) {
                    if !asked.matches(stored) {
                        return Look::Mismatch;
                    }
                }
                return Look::Replay(c.stored);
            }
            Local::Held {
                until,
                attempt,
                fingerprint,
                ..
            } if now < until && !resumes && local_check(asked, fingerprint) != Check::Unknown => {
                if local_check(asked, fingerprint) == Check::Mismatch {
                    return Look::Mismatch;
                }
                if waiting {
                    return Look::Wait {
                        signal: e.signal.subscribe(),
                        until: wait_until(until),
                        joins_ask: false,
                    };
                }
                return Look::Busy {
                    retry_after: until - now,
                    attempt,
                };
            }
            Local::Remote {
                until,
                recheck,
                attempt,
                fingerprint,
            } if now < recheck && !resumes => {
                // The ask this caller joined answers it as the database did: the row's
                // fingerprint is checked as the asker's was.
                if joined && local_check(asked, Some(fingerprint)) == Check::Mismatch {
                    return Look::Mismatch;
                }
                if waiting {
                    return Look::Wait {
                        signal: e.signal.subscribe(),
                        until: wait_until(recheck),
                        joins_ask: false,
                    };
                }
                if joined {
                    return Look::Busy {
                        retry_after: until.saturating_duration_since(now),
                        attempt,
                    };
                }
            }
            _ => {}
        }
        e.asking = true;
        e.notified = false;
        Look::Ask
    }

    /// What this process can answer about `key` by itself, on the caller's thread: a
    /// cached completion (or its fingerprint mismatch), or, for a caller that does not
    /// wait, a live lease of this process. `None` when the answer needs the full claim (no
    /// entry, an ask under way to join, another process's lease, something expired). It
    /// creates no entry and takes no ask, so the full claim that follows a `None` starts
    /// from the same state; what it answers is what `look` would have answered.
    pub(crate) fn answer_locally(
        &self,
        key: &[u8],
        hash: u64,
        asked: Option<AskedFingerprint>,
        waits: bool,
    ) -> Option<Look> {
        let now = Instant::now();
        let mut stripe = self.stripe(hash).lock();
        let e = stripe.find(hash, key)?;
        if e.asking {
            return None;
        }
        match &e.state {
            Local::Completed(c) if now < c.until => {
                if let (Some(asked), Some(stored)) = (asked, c.fingerprint) {
                    if !asked.matches(stored) {
                        return Some(Look::Mismatch);
                    }
                }
                Some(Look::Replay(c.stored.clone()))
            }
            Local::Held {
                until,
                attempt,
                fingerprint,
                ..
            } if now < *until => match local_check(asked, *fingerprint) {
                Check::Mismatch => Some(Look::Mismatch),
                Check::Unknown => None,
                Check::Matches if waits => None,
                Check::Matches => Some(Look::Busy {
                    retry_after: *until - now,
                    attempt: *attempt,
                }),
            },
            _ => None,
        }
    }

    /// Publishes what an ask found and lets the key's waiters look again. `sent`: when the
    /// statement was sent (estimates of deadlines start there, so they are never later
    /// than the database's).
    pub(crate) fn publish(&self, key: &[u8], hash: u64, sent: Instant, found: Found) {
        let now = Instant::now();
        let mut stripe = self.stripe(hash).lock();
        let notified = stripe.find(hash, key).is_some_and(|e| e.notified);
        // A lease of this process that is live by its estimate (never later than the
        // database's end) is the row's holder: an ask that found the key held found it.
        let own = stripe.find(hash, key).and_then(|e| match e.state {
            Local::Held {
                token,
                attempt,
                until,
                ..
            } if now < until => Some((token, attempt, until)),
            _ => None,
        });
        let state = match (found, own) {
            (
                Found::Acquired {
                    token,
                    attempt,
                    lease,
                    fingerprint,
                },
                _,
            ) => Local::Held {
                token,
                attempt,
                until: sent + lease.min(PG_INTERVAL_MAX),
                fingerprint: fingerprint.map(Some),
            },
            (Found::Completed(c), _) => Local::Completed(c),
            (Found::Held { fingerprint, .. }, Some((token, attempt, until))) => Local::Held {
                token,
                attempt,
                until,
                fingerprint: Some(fingerprint),
            },
            (
                Found::Held {
                    remaining,
                    attempt,
                    fingerprint,
                },
                None,
            ) => {
                let until = now + remaining.min(PG_INTERVAL_MAX);
                // A notification during the ask means the answer may be stale: look again
                // at once (after the shortest pause).
                let recheck = if notified {
                    now + PG_WAIT_POLL_MIN
                } else {
                    until
                        .min(now + PG_WAIT_POLL_MAX)
                        .max(now + PG_WAIT_POLL_MIN)
                };
                Local::Remote {
                    attempt,
                    fingerprint,
                    until,
                    recheck,
                }
            }
            (Found::Nothing, _) => Local::Unknown,
        };
        let cache =
            matches!(state, Local::Completed(ref c) if c.stored.response.len() <= self.bytes_max);
        let keep = cache || !matches!(state, Local::Completed(_));
        if keep {
            stripe.set(hash, key, state);
        } else {
            stripe.remove(hash, key);
        }
        if let Some(e) = stripe.find(hash, key) {
            e.asking = false;
            e.notified = false;
            e.bump();
        }
        stripe.evict(self.entries_max, self.bytes_max);
    }

    /// A lease of this process completed the key (or found its completion stored).
    pub(crate) fn completed(&self, key: &[u8], hash: u64, cached: Cached) {
        let mut stripe = self.stripe(hash).lock();
        if cached.stored.response.len() <= self.bytes_max {
            stripe.set(hash, key, Local::Completed(cached));
        } else {
            stripe.remove(hash, key);
        }
        stripe.evict(self.entries_max, self.bytes_max);
    }

    /// A lease of this process no longer holds the key as the front thinks (released,
    /// lost, or its outcome unknown): forget what is known so that the next look asks.
    pub(crate) fn forget_held(&self, key: &[u8], hash: u64, token: u64) {
        let mut stripe = self.stripe(hash).lock();
        let held = stripe
            .find(hash, key)
            .is_some_and(|e| matches!(e.state, Local::Held { token: t, .. } if t == token));
        if held {
            stripe.set(hash, key, Local::Unknown);
            stripe.tidy(hash, key);
        }
    }

    /// A lease of this process was extended: its end moves (estimated from `sent`).
    pub(crate) fn extended(
        &self,
        key: &[u8],
        hash: u64,
        token: u64,
        sent: Instant,
        lease: Duration,
    ) {
        let mut stripe = self.stripe(hash).lock();
        if let Some(e) = stripe.find(hash, key) {
            if let Local::Held {
                token: t, until, ..
            } = &mut e.state
            {
                if *t == token {
                    *until = sent + lease.min(PG_INTERVAL_MAX);
                    e.bump();
                }
            }
        }
    }

    /// Time left on the lease of `token`, as this process estimates it.
    pub(crate) fn lease_remaining(&self, key: &[u8], hash: u64, token: u64) -> Duration {
        let mut stripe = self.stripe(hash).lock();
        match stripe.find(hash, key).map(|e| &e.state) {
            Some(Local::Held {
                token: t, until, ..
            }) if *t == token => until.saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        }
    }

    /// A notification for the keys of `hash`: their waiters ask again.
    pub(crate) fn notified(&self, hash: u64) {
        let mut stripe = self.stripe(hash).lock();
        let now = Instant::now();
        if let Some(list) = stripe.map.get_mut(&hash) {
            for e in list {
                wake(e, now);
            }
        }
    }

    /// Every waiter on another process's key asks again (notifications may have been lost
    /// with the listening connection).
    pub(crate) fn notified_all(&self) {
        let now = Instant::now();
        for stripe in self.stripes.iter() {
            let mut stripe = stripe.lock();
            for list in stripe.map.values_mut() {
                for e in list {
                    wake(e, now);
                }
            }
        }
    }

    /// Drops the key's entry when nobody needs it: no ask under way, no waiter, and nothing
    /// worth keeping (a lease of this process or a cached completion).
    pub(crate) fn tidy(&self, key: &[u8], hash: u64) {
        self.stripe(hash).lock().tidy(hash, key);
    }

    /// Live leases of this process, and cached completions.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let now = Instant::now();
        let (mut held, mut cached) = (0u64, 0u64);
        for stripe in self.stripes.iter() {
            let stripe = stripe.lock();
            for e in stripe.map.values().flatten() {
                match &e.state {
                    Local::Held { until, .. } if now < *until => held += 1,
                    Local::Completed(c) if now < c.until => cached += 1,
                    _ => {}
                }
            }
        }
        (held, cached)
    }

    /// Forgets everything (close): every waiter looks again and finds the engine closed.
    pub(crate) fn clear(&self) {
        for stripe in self.stripes.iter() {
            let mut stripe = stripe.lock();
            for e in stripe.map.values().flatten() {
                e.bump();
            }
            *stripe = Stripe::default();
        }
    }
}

fn wake(e: &mut Entry, now: Instant) {
    if e.asking {
        e.notified = true;
    }
    if let Local::Remote { recheck, .. } = &mut e.state {
        *recheck = now;
    }
    e.bump();
}

impl Stripe {
    fn tidy(&mut self, hash: u64, key: &[u8]) {
        let idle = self.find(hash, key).is_some_and(|e| {
            !e.asking
                && e.signal.receiver_count() == 0
                && matches!(e.state, Local::Unknown | Local::Remote { .. })
        });
        if idle {
            self.remove(hash, key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn stored(token: u64) -> Stored {
        Stored {
            response: Arc::from(&b"r"[..]),
            token,
            attempt: 1,
            expires_wall_ms: 0,
        }
    }

    fn ask(front: &Front, key: &[u8], hash: u64) {
        assert!(matches!(
            front.look(key, hash, None, None, false, Instant::now(), false),
            Look::Ask
        ));
    }

    /// The caller's-thread answer agrees with the full look: a live lease of this process
    /// answers a caller that does not wait, a cached completion answers everyone, and an
    /// ask under way, another process's lease or an unknown key are left to the full claim.
    #[test]
    fn answers_locally_only_what_the_full_look_answers_without_a_round_trip() {
        let front = Front::new();
        let (k, h) = (&b"k"[..], 7);
        assert!(front.answer_locally(k, h, None, false).is_none());
        ask(&front, k, h);
        // Another caller would join this ask: not answered locally.
        assert!(front.answer_locally(k, h, None, false).is_none());
        let lease = Duration::from_secs(60);
        let found = Found::Acquired {
            token: 3,
            attempt: 1,
            lease,
            fingerprint: None,
        };
        front.publish(k, h, Instant::now(), found);
        match front.answer_locally(k, h, None, false) {
            Some(Look::Busy {
                attempt: 1,
                retry_after,
            }) => assert!(retry_after <= lease),
            _ => panic!("a live local lease answers a caller that does not wait"),
        }
        assert!(front.answer_locally(k, h, None, true).is_none());
        let cached = Cached {
            stored: stored(3),
            fingerprint: None,
            until: Instant::now() + lease,
        };
        front.completed(k, h, cached);
        for waits in [false, true] {
            match front.answer_locally(k, h, None, waits) {
                Some(Look::Replay(s)) => assert_eq!(s.token, 3),
                _ => panic!("a cached completion is replayed"),
            }
        }

        let (r, rh) = (&b"remote"[..], 9);
        ask(&front, r, rh);
        let found = Found::Held {
            remaining: lease,
            attempt: 2,
            fingerprint: None,
        };
        front.publish(r, rh, Instant::now(), found);
        assert!(front.answer_locally(r, rh, None, false).is_none());
        assert!(front.answer_locally(r, rh, None, true).is_none());
    }

    /// A cached completion stored with one fingerprint refuses a claim that brings another.
    #[test]
    fn a_cached_completion_answers_a_mismatched_fingerprint_locally() {
        let front = Front::new();
        let (k, h) = (&b"k"[..], 1);
        let cached = Cached {
            stored: stored(5),
            fingerprint: Some(1),
            until: Instant::now() + Duration::from_secs(60),
        };
        front.completed(k, h, cached);
        let other = AskedFingerprint {
            value: 2,
            legacy: None,
        };
        assert!(matches!(
            front.answer_locally(k, h, Some(other), false),
            Some(Look::Mismatch)
        ));
    }

    /// A live lease of this process answers a claim locally only as the database would:
    /// a claim bringing another fingerprint than the holder's is refused, not told to wait,
    /// and one the front cannot check (the holder brought none to a takeover) is asked.
    #[test]
    fn a_held_key_refuses_a_mismatched_fingerprint_locally() {
        let front = Front::new();
        let fp = |value| AskedFingerprint {
            value,
            legacy: None,
        };
        let lease = Duration::from_secs(60);
        for (k, h, holder) in [(&b"k"[..], 1, Some(1)), (&b"u"[..], 2, None)] {
            ask(&front, k, h);
            let found = Found::Acquired {
                token: 3,
                attempt: 2,
                lease,
                fingerprint: holder,
            };
            front.publish(k, h, Instant::now(), found);
        }
        for waits in [false, true] {
            assert!(matches!(
                front.answer_locally(b"k", 1, Some(fp(2)), waits),
                Some(Look::Mismatch)
            ));
        }
        assert!(matches!(
            front.look(b"k", 1, Some(fp(2)), None, false, Instant::now(), false),
            Look::Mismatch
        ));
        assert!(matches!(
            front.answer_locally(b"k", 1, Some(fp(1)), false),
            Some(Look::Busy { attempt: 2, .. })
        ));
        // Unknown: the full claim asks, and what it finds keeps the lease held here.
        assert!(front.answer_locally(b"u", 2, Some(fp(2)), false).is_none());
        assert!(matches!(
            front.look(b"u", 2, Some(fp(2)), None, false, Instant::now(), false),
            Look::Ask
        ));
        let found = Found::Held {
            remaining: lease,
            attempt: 2,
            fingerprint: Some(1),
        };
        front.publish(b"u", 2, Instant::now(), found);
        assert!(!front.lease_remaining(b"u", 2, 3).is_zero());
        assert!(matches!(
            front.answer_locally(b"u", 2, Some(fp(2)), false),
            Some(Look::Mismatch)
        ));
    }

    /// Another process's lease: a caller that joined an ask is answered as the database
    /// answered the asker, its own fingerprint checked against the row's; one that did not
    /// join asks.
    #[test]
    fn a_joined_caller_with_another_fingerprint_is_refused() {
        let front = Front::new();
        let (k, h) = (&b"k"[..], 4);
        let fp = |value| AskedFingerprint {
            value,
            legacy: None,
        };
        ask(&front, k, h);
        let found = Found::Held {
            remaining: Duration::from_secs(60),
            attempt: 1,
            fingerprint: Some(1),
        };
        front.publish(k, h, Instant::now(), found);
        let far = Instant::now() + Duration::from_secs(60);
        assert!(matches!(
            front.look(k, h, Some(fp(2)), None, true, far, false),
            Look::Mismatch
        ));
        assert!(matches!(
            front.look(k, h, Some(fp(1)), None, true, far, false),
            Look::Busy { attempt: 1, .. }
        ));
        assert!(matches!(
            front.look(k, h, Some(fp(2)), None, false, far, false),
            Look::Ask
        ));
    }
}
