//! Leases that follow their holder: while a [`KeepAlive`] guard lives, the engine's timer
//! thread renews its lease before it ends, up to a maximum; dropping the guard stops the
//! renewals, and so does the end of the lease itself (settled, or dropped unsettled), so a
//! holder that died (its task dropped, its thread gone) stops holding the key one lease
//! later.
//!
//! Renewals queue an extension without waiting for its durability: a crash ends every
//! holder of the file anyway, and the file's lease end only bounds when a takeover may
//! happen after a restart.

use crate::base::clock::duration_ns;
use crate::base::sync::{Arc, Mutex};
use crate::model::error::LeaseError;
use crate::model::machine::Holder;
use crate::model::write_set::{is_settled, StagedState};
use crate::runtime::constants::{KEEP_ALIVE_DIVISOR, WAIT_SLICE_MIN};
use std::collections::BTreeMap;
use std::time::Duration;

/// What a renewal extends a lease through: the engine's own lease call, which the API layer
/// provides (it also reaches the shared backend).
pub(crate) trait Renew: Send + Sync {
    /// The token a renewal registered with `token` extends: `token` (a test-only sabotage
    /// makes it whoever holds `key` now).
    fn token_to_renew(&self, key: &[u8], token: u64) -> u64;
    /// Extends the lease of `key` held with `token`; `lease` sizes the extension at the
    /// instant it is applied.
    fn extend(
        &self,
        key: &[u8],
        token: u64,
        lease: &mut dyn FnMut(u64) -> Holder,
    ) -> Result<u64, LeaseError>;
}

pub(crate) struct Renewal {
    pub(crate) engine: Box<dyn Renew>,
    pub(crate) key: Box<[u8]>,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    /// Renewals never move the lease's end past this instant (monotonic ns).
    pub(crate) until_ns: u64,
    /// The lease's own state: once it is settled or dropped, nothing is renewed (a dropped
    /// lease keeps its key only until the lease ends).
    pub(crate) lease_state: Arc<Mutex<StagedState>>,
}

impl Renewal {
    /// The token the renewal extends: always the one it was registered for, since a key
    /// taken over by another caller is no longer this guard's lease.
    fn token(&self) -> u64 {
        self.engine.token_to_renew(&self.key, self.token)
    }
}

#[derive(Default)]
struct Registry {
    /// By (next renewal instant, id).
    due: BTreeMap<(u64, u64), Renewal>,
    /// Each live guard's current place in `due`.
    at: BTreeMap<u64, u64>,
    next_id: u64,
}

/// The engine's keep-alive registrations.
#[derive(Default)]
pub(crate) struct KeepAlives {
    registry: Mutex<Registry>,
}

impl KeepAlives {
    pub(crate) fn add(&self, renewal: Renewal, first_ns: u64) -> u64 {
        let mut r = self.registry.lock();
        r.next_id += 1;
        let id = r.next_id;
        r.due.insert((first_ns, id), renewal);
        r.at.insert(id, first_ns);
        id
    }

    pub(crate) fn remove(&self, id: u64) {
        let mut r = self.registry.lock();
        if let Some(at) = r.at.remove(&id) {
            r.due.remove(&(at, id));
        }
    }

    /// When the next renewal is due, if any.
    pub(crate) fn next_due_ns(&self) -> Option<u64> {
        self.registry
            .lock()
            .due
            .first_key_value()
            .map(|((at, _), _)| *at)
    }

    /// Renews every lease due at `now` (on the timer thread).
    pub(crate) fn renew_due(&self, now: u64) {
        loop {
            let (id, renewal) = {
                let mut r = self.registry.lock();
                let Some(entry) = r.due.first_entry() else {
                    return;
                };
                if entry.key().0 > now {
                    return;
                }
                let ((_, id), renewal) = entry.remove_entry();
                r.at.remove(&id);
                (id, renewal)
            };
            if renewal.until_ns <= now || is_settled(&renewal.lease_state) {
                continue;
            }
            // The extension is sized at the instant it is applied (under the stripe lock), so
            // a clock that moved since `now` can never carry the lease past `until_ns`.
            let lease_max_ns = duration_ns(renewal.lease);
            let mut capped = false;
            let mut extend = |at: u64| {
                let left_ns = renewal.until_ns.saturating_sub(at);
                capped = left_ns <= lease_max_ns;
                Holder::Extend {
                    lease: Duration::from_nanos(lease_max_ns.min(left_ns)),
                }
            };
            let next_ns = match renewal
                .engine
                .extend(&renewal.key, renewal.token(), &mut extend)
            {
                // The lease now ends at the maximum: nothing more to renew.
                Ok(_) if capped => continue,
                Ok(_) => now.saturating_add((lease_max_ns / KEEP_ALIVE_DIVISOR).max(1)),
                // A full queue: try again shortly, well before the lease ends.
                Err(LeaseError::Overloaded(_)) => now.saturating_add(duration_ns(WAIT_SLICE_MIN)),
                // The lease was lost, released or completed, or the engine stopped.
                Err(_) => continue,
            };
            let mut r = self.registry.lock();
            r.due.insert((next_ns, id), renewal);
            r.at.insert(id, next_ns);
        }
    }
}
