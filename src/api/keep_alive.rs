//! The [`KeepAlive`] guard a lease holder keeps while its lease is renewed; the registry
//! of renewals the timer thread runs is in `runtime/keep_alive.rs`.

use crate::api::engine::Engine;
use crate::base::clock::duration_ns;
use crate::base::sabotage::fault_point;
use crate::base::sync::{Arc, Mutex};
use crate::model::error::LeaseError;
use crate::model::machine::Holder;
use crate::model::write_set::StagedState;
use crate::runtime::constants::{KEEP_ALIVE_DIVISOR, WAIT_SLICE_MAX};
use crate::runtime::keep_alive::{Renew, Renewal};
use std::fmt;
use std::time::Duration;

/// Renews a lease while it lives and the lease is unsettled (see
/// [`crate::Lease::keep_alive`]). Dropping it, or the lease, stops the renewals; the lease
/// then ends at its last renewed end.
#[must_use = "the lease is renewed only while the guard lives"]
pub struct KeepAlive {
    engine: Engine,
    id: u64,
}

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepAlive").field("id", &self.id).finish()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.engine.shared().keep_alives().remove(self.id);
    }
}

impl Engine {
    /// Starts renewing the lease of `token` on `key` while `lease_state` is unsettled: every
    /// third of `lease`, its end is moved to `lease` from then, never past `max` from now.
    pub(crate) fn keep_alive(
        &self,
        key: &[u8],
        token: u64,
        lease: Duration,
        max: Duration,
        lease_state: Arc<Mutex<StagedState>>,
    ) -> KeepAlive {
        let s = self.shared();
        let now = s.mono_ns();
        let renewal = Renewal {
            engine: Box::new(self.clone()),
            key: Box::from(key),
            token,
            lease,
            until_ns: now.saturating_add(duration_ns(max)),
            lease_state,
        };
        let first_ns = now.saturating_add((duration_ns(lease) / KEEP_ALIVE_DIVISOR).max(1));
        let id = s.keep_alives().add(renewal, first_ns);
        // The timer thread looks at its work at least every `WAIT_SLICE_MAX`, so only a lease
        // whose first renewal is due sooner needs it woken: every `run` registers a
        // renewal, and most handlers end long before it is due.
        let nudge = first_ns.saturating_sub(now) < duration_ns(WAIT_SLICE_MAX);
        // Without a timer thread nothing renews: the lease simply ends as it would have.
        let _ = s.timers().start_and_nudge(self.shared_arc(), nudge);
        KeepAlive {
            engine: self.clone(),
            id,
        }
    }
}

impl Renew for Engine {
    fn token_to_renew(&self, key: &[u8], token: u64) -> u64 {
        // Test-only sabotage: renew whoever holds the key now.
        if fault_point!(self.shared().faults(), RenewCurrentHolder) {
            let s = self.shared();
            let (shard, _, k) = s.index().lock(key);
            return shard.get(k).map_or(token, |slot| slot.token);
        }
        token
    }

    fn extend(
        &self,
        key: &[u8],
        token: u64,
        lease: &mut dyn FnMut(u64) -> Holder,
    ) -> Result<u64, LeaseError> {
        self.update_inflight_at(key, token, lease, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Claim, ClaimOptions, Durability, KeyState, MockClock};

    fn claim(engine: &Engine, lease: Duration) -> crate::Lease {
        match engine.claim(b"k", &ClaimOptions::default().lease(lease)) {
            Ok(Claim::Acquired(lease)) => lease,
            other => panic!("expected Acquired, got {other:?}"),
        }
    }

    fn lease_remaining(engine: &Engine) -> (u64, Duration) {
        match engine.get(b"k") {
            Ok(Some(KeyState::InFlight {
                token,
                lease_remaining,
                ..
            })) => (token, lease_remaining),
            other => panic!("expected InFlight, got {other:?}"),
        }
    }

    /// A renewal extends the lease it was registered for and no other: once the key has
    /// ended and another caller took it over, the old holder's renewal leaves the new
    /// lease alone and is dropped. Renewals are run by the check (no timer thread).
    /// `sabotage` may switch a bug on in the engine (test-only).
    fn renewal_after_a_takeover(sabotage: impl FnOnce(&Engine)) -> Result<(), String> {
        let clock = MockClock::new();
        let engine = Engine::builder()
            .durability(Durability::None)
            .clock(clock.clone())
            .tuning(crate::api::options::Tuning::default().sweep_interval(None))
            .open()
            .map_err(|e| format!("open: {e}"))?;
        sabotage(&engine);
        let s = engine.shared();
        let first = claim(&engine, Duration::from_secs(3));
        let now = s.mono_ns();
        let renewal = Renewal {
            engine: Box::new(engine.clone()),
            // As the lease's handle registers it: the key within its (empty) scope.
            key: Box::from(&*crate::model::scope::scoped_shared(&[], b"k").ok_or("scoped key")?),
            token: first.token(),
            lease: Duration::from_secs(3),
            until_ns: now + duration_ns(Duration::from_secs(60)),
            // The first lease is still held (unsettled), so only the token check can stop
            // the renewal.
            lease_state: first.staged.shared(),
        };
        let id = s
            .keep_alives()
            .add(renewal, now + duration_ns(Duration::from_secs(1)));
        // The renewal is late (its holder's lease ended): another caller takes the key over.
        clock.advance(Duration::from_secs(4));
        let second = claim(&engine, Duration::from_secs(1));
        s.keep_alives().renew_due(s.mono_ns());
        let seen = lease_remaining(&engine);
        let next = s.keep_alives().next_due_ns();
        s.keep_alives().remove(id);
        if seen != (second.token(), Duration::from_secs(1)) {
            return Err(format!(
                "the renewal of token {} changed the lease of token {} that took the key \
                 over: (token, lease left) is {seen:?}, expected ({}, 1s)",
                first.token(),
                second.token(),
                second.token()
            ));
        }
        if next.is_some() {
            return Err("the renewal of a lost lease is still registered".into());
        }
        Ok(())
    }

    #[test]
    fn a_renewal_never_extends_a_lease_another_caller_took_over() {
        renewal_after_a_takeover(|_| {}).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Teeth: the check catches a renewal that extends whoever holds the key now.
    #[cfg(idemkv_sabotage)]
    #[test]
    fn teeth_renewal_check_catches_renewing_the_current_holder() {
        let caught = renewal_after_a_takeover(|engine| {
            crate::api::sabotage::switch(
                engine,
                Some(crate::api::sabotage::Sabotage::RenewCurrentHolder),
            );
        });
        assert!(caught.is_err(), "RenewCurrentHolder was not caught");
    }
}
