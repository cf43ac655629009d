//! Background expiry: reclaims keys past their retention, and abandoned claims past their
//! reap instant, from the index and the file; with markers on, each expired completion
//! leaves its marker, and markers are removed at their end.
//!
//! Expired keys are already Absent to every call (each call checks the deadline); the
//! sweeper only gives their memory and disk space back. An abandoned claim — an InFlight key
//! whose lease ended and that nobody took over — stays takeover-able (with its checkpoint and
//! fingerprint) until the sweeper reaps it `retention` after its lease ended; from then on
//! the key is Absent.
//!
//! Nothing here walks a stripe: each stripe keeps its slots in the order they fall due
//! (`index/expiry.rs`), so a pass costs O(1) per stripe with nothing due and O(1) amortized
//! per key removed. The sweeper works in bounded steps: at most `SWEEP_STRIPE_BATCH` entries per
//! stripe-lock hold, earliest first, and a pause after each `SWEEP_STEP_BUDGET` of work.
//! Deletions go through the group-commit writer, and the sweeper backs off while the writer
//! queue is more than half full.
//! Architecture invariant: the sweeper removes only slots that are due at the instant it
//! holds their stripe lock, so a live lease or an unexpired completion is never evicted.

use crate::base::sync::{Arc, MutexGuard};
use crate::index::shard::{Reclaimed, Shard};
use crate::index::stats::{bump, Events};
use crate::model::machine::Step;
use crate::model::marker::MarkerEnded;
use crate::runtime::constants::{SWEEP_PAUSE, SWEEP_STEP_BUDGET, SWEEP_STRIPE_BATCH};
use crate::runtime::queue::SendRefused;
use crate::runtime::shared::Shared;
use std::time::Instant;

pub(crate) fn spawn(shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("idemkv-sweeper".into())
        .spawn(move || {
            while shared.sweeper().wait() {
                if shared.poison_reason().is_some() || shared.is_closed() {
                    return;
                }
                // The pass locks every stripe, which also publishes the completions of
                // stripes nobody locked since their commit (their responses leave memory).
                sweep_pass(&shared, Pace::Background);
            }
        })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// Yield to claims: pause after each step's budget, wait while the queue is busy.
    Background,
    /// An operator asked: go straight through, flushing when the queue fills.
    Now,
}

/// What one bounded step on one stripe did.
#[derive(Default)]
pub(crate) struct Swept {
    /// Keys removed (expired completions and reaped abandoned claims).
    pub(crate) removed: u64,
    /// Whether more is due on this stripe (the budget ran out, or a deletion was refused).
    pub(crate) more: bool,
    /// Why a deletion could not be queued, if one could not.
    pub(crate) refused: Option<SendRefused>,
}

/// Works off what is due on this stripe at `now`, earliest first, looking at most at `max`
/// entries: ends leases past their deadline, removes completions past their retention
/// (leaving their markers, with markers on) and abandoned claims past their reap instant,
/// and queues the deletion of their records; then removes markers at their end.
pub(crate) fn sweep_stripe(
    s: &Shared,
    shard: &mut MutexGuard<'_, Shard>,
    now: u64,
    max: usize,
) -> Swept {
    let c = s.counters();
    let ended = shard.end_leases(now, max);
    let mut out = Swept {
        more: ended.more,
        ..Swept::default()
    };
    let mut budget = max.saturating_sub(ended.examined);
    while budget > 0 {
        budget -= 1;
        let mut refused = None;
        let mut events = Events::default();
        // The removal follows a queued deletion at once, under this lock: count it here.
        let mut send = |step: &Step<()>| match s.queue(step.write.clone(), false) {
            Ok(_) => {
                s.count(&mut events, &step.deltas);
                true
            }
            Err(why) => {
                refused = Some(why);
                false
            }
        };
        let reclaimed = shard.reclaim(now, &mut send);
        shard.events.merge(&events);
        match reclaimed {
            Reclaimed::Nothing => break,
            Reclaimed::Stale => {}
            Reclaimed::Expired | Reclaimed::Reaped => out.removed += 1,
            Reclaimed::Refused => {
                if matches!(refused, Some(SendRefused::Full)) {
                    bump(&c.overloaded);
                }
                out.refused = refused;
                out.more = true;
                return out;
            }
        }
    }
    // Markers at their end, with what the budget left; they hold no key, so they free no
    // room under the key budget and are not counted as removed.
    while budget > 0 {
        budget -= 1;
        let mut refused = None;
        let mut send = |step: &Step<()>| match s.queue(step.write.clone(), false) {
            Ok(_) => true,
            Err(why) => {
                refused = Some(why);
                false
            }
        };
        match shard.end_marker(now, &mut send) {
            MarkerEnded::Nothing => break,
            MarkerEnded::Stale | MarkerEnded::Ended => {}
            MarkerEnded::Refused => {
                if matches!(refused, Some(SendRefused::Full)) {
                    bump(&c.overloaded);
                }
                out.refused = refused;
                out.more = true;
                return out;
            }
        }
    }
    out.more |= shard.has_due(now);
    out
}

/// Removes up to `max` due entries of this stripe (see [`sweep_stripe`]). Returns how many
/// keys it removed and whether more are due.
pub(crate) fn sweep_shard(
    s: &Shared,
    shard: &mut MutexGuard<'_, Shard>,
    now: u64,
    max: usize,
) -> (u64, bool) {
    let swept = sweep_stripe(s, shard, now, max);
    (swept.removed, swept.more)
}

/// Frees a place under the key budget for a claim of a new key: works off what is due on
/// the stripes whose expiry order says something is, until one key is removed. Stripes with
/// nothing due are not locked; a stripe visited without freeing anything has its due work
/// done, so a run of refused claims costs O(stripes) reads each and O(1) amortized work.
pub(crate) fn make_room(s: &Shared) -> Result<(), Room> {
    let now = s.mono_ns();
    let mut refused = None;
    for stripe in s.index().any_due(now) {
        let swept = {
            let mut shard = stripe.lock();
            sweep_stripe(s, &mut shard, now, SWEEP_STRIPE_BATCH)
        };
        if swept.removed > 0 {
            return Ok(());
        }
        refused = refused.or(swept.refused);
    }
    Err(match refused {
        Some(SendRefused::Closed | SendRefused::Poisoned(_)) => Room::Closed,
        Some(SendRefused::Full) => Room::QueueFull,
        None => Room::Full,
    })
}

/// Why [`make_room`] freed nothing.
pub(crate) enum Room {
    /// Every key is live (nothing is due anywhere).
    Full,
    /// Something is due, but the writer queue is full.
    QueueFull,
    /// The engine is closing, or a storage failure poisoned it (the caller says which).
    Closed,
}

/// Moves leases that have ended by now out of the live count, on the stripes whose expiry
/// order says one may have, until one moved. Returns how many moved. Stripes with no ended
/// lease are not locked.
pub(crate) fn end_leases_anywhere(s: &Shared) -> u64 {
    let now = s.mono_ns();
    for stripe in s.index().leases_due(now) {
        let moved = stripe.lock().end_leases(now, usize::MAX).moved;
        if moved > 0 {
            return moved;
        }
    }
    0
}

/// One pass over every stripe. Returns how many keys it removed.
fn sweep_pass(s: &Shared, pace: Pace) -> u64 {
    let mut removed = 0u64;
    let mut step_start = Instant::now();
    for stripe in s.index().stripes() {
        loop {
            // A close or poison refuses every deletion from now on: stop, whatever the pace
            // (otherwise each refused send looks like "more to do" and the pass spins).
            if s.poison_reason().is_some() || s.is_closed() {
                return removed;
            }
            if s.queue_busy() {
                match pace {
                    Pace::Background => std::thread::sleep(SWEEP_PAUSE),
                    Pace::Now => {
                        if s.flush().is_err() {
                            return removed;
                        }
                    }
                }
                continue;
            }
            let (n, more) = {
                let mut shard = stripe.lock();
                let now = s.mono_ns();
                sweep_shard(s, &mut shard, now, SWEEP_STRIPE_BATCH)
            };
            removed += n;
            if pace == Pace::Background && step_start.elapsed() >= SWEEP_STEP_BUDGET {
                std::thread::sleep(SWEEP_PAUSE);
                step_start = Instant::now();
            }
            if !more {
                break;
            }
        }
    }
    removed
}

/// Reclaims every expired key now; returns how many.
pub(crate) fn sweep_all(s: &Shared) -> u64 {
    sweep_pass(s, Pace::Now)
}
