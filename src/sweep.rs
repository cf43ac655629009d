//! Background expiry: reclaims keys past their retention from the index and the file.
//!
//! Expired keys are already Absent to every call (each call checks the deadline); the
//! sweeper only gives their memory and disk space back. It works in bounded steps: at most
//! `SWEEP_STRIPE_BATCH` keys per stripe-lock hold, earliest deadline first, and a pause
//! after each `SWEEP_STEP_BUDGET` of work. Deletions go through the group-commit writer,
//! and the sweeper backs off while the writer queue is more than half full.
//! Architecture invariant: the sweeper removes only slots that are expired at the instant
//! it holds their stripe lock, so a live lease or an unexpired completion is never evicted.

use crate::constants::*;
use crate::engine::{Engine, Shared};
use crate::error::ClaimError;
use crate::index::Shard;
use crate::stats::bump;
use crate::sync::{Arc, Condvar, Mutex, MutexGuard, Ordering};
use crate::writer::Op;
use std::time::{Duration, Instant};

/// The sweeper thread's schedule and stop signal.
pub(crate) struct Sweeper {
    interval: Option<Duration>,
    state: Mutex<SweeperState>,
    wake: Condvar,
}

#[derive(Default)]
struct SweeperState {
    stop: bool,
    nudged: bool,
}

impl Sweeper {
    pub(crate) fn new(interval: Option<Duration>) -> Self {
        Self {
            interval,
            state: Mutex::new(SweeperState::default()),
            wake: Condvar::new(),
        }
    }

    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.wake.notify_all();
    }

    /// Asks for a pass now (a mock clock jumped).
    pub(crate) fn nudge(&self) {
        self.state.lock().nudged = true;
        self.wake.notify_all();
    }

    /// Waits for the next pass; false once stopped.
    fn wait(&self) -> bool {
        let interval = self.interval.unwrap_or(SWEEP_INTERVAL_DEFAULT);
        let mut state = self.state.lock();
        if !state.stop && !state.nudged {
            self.wake.wait_for(&mut state, interval);
        }
        state.nudged = false;
        !state.stop
    }
}

pub(crate) fn spawn(shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("idemkv-sweeper".into())
        .spawn(move || {
            while shared.sweeper.wait() {
                if shared.poison_reason().is_some() || shared.is_closed() {
                    return;
                }
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

/// Removes up to `max` keys of this stripe that are expired at `now`, earliest first, and
/// queues their deletion. Returns how many it removed and whether more are due.
pub(crate) fn sweep_shard(
    s: &Shared,
    shard: &mut MutexGuard<'_, Shard>,
    now: u64,
    max: usize,
) -> (u64, bool) {
    let due = shard.due(now, max);
    let more = due.len() == max;
    let mut removed = 0u64;
    for (key, token) in due {
        if s.send(Op::Delete { token, ack: None }, false).is_err() {
            bump(&s.counters.overloaded);
            return (removed, true);
        }
        if shard.remove_expired(&key, now).is_some() {
            s.counters.completed.fetch_sub(1, Ordering::Relaxed);
            bump(&s.counters.expirations);
            removed += 1;
        }
    }
    (removed, more)
}

fn queue_busy(s: &Shared) -> bool {
    s.tx.as_ref()
        .is_some_and(|tx| tx.len() >= s.cfg.claim_queue_max / 2)
}

/// One pass over every stripe. Returns how many keys it removed.
fn sweep_pass(s: &Shared, pace: Pace) -> u64 {
    let mut removed = 0u64;
    let mut step_start = Instant::now();
    for stripe in s.index.stripes() {
        loop {
            // A close or poison refuses every deletion from now on: stop, whatever the pace
            // (otherwise each refused send looks like "more to do" and the pass spins).
            if s.poison_reason().is_some() || s.is_closed() {
                return removed;
            }
            if queue_busy(s) {
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
                let mut shard = stripe.map.lock();
                let now = s.time.mono_ns();
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

impl Engine {
    /// Reclaims every key past its retention now, from memory and (through the writer) from
    /// the file; returns how many. Expired keys are already Absent to every call: this only
    /// gives their space back, as the background sweeper does on its own. A close or a
    /// poison during the sweep ends it early with `Closed` or `Poisoned`.
    pub fn sweep_now(&self) -> Result<u64, ClaimError> {
        self.check_open()?;
        let removed = sweep_all(self.shared());
        self.check_open()?;
        Ok(removed)
    }
}
