//! The demo's traffic: a seeded plan of messages and their duplicate copies, and a broker
//! that hands deliveries to consumer threads at the moments the delivery patterns call for.
//!
//! The plan is fixed by the seed, so the naive handler and the idemkv handler see the same
//! messages, the same copies and the same work per message. Timing is closed-loop: a
//! duplicate is scheduled relative to the moment its first copy was picked up, so "the
//! redelivery arrives while the first copy still works" holds however fast the handler is.

use parking_lot::{Condvar, Mutex};
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Shortest and longest simulated work of one message (log-uniform in between).
pub(crate) const WORK_MIN_US: f64 = 50.0;
pub(crate) const WORK_MAX_US: f64 = 1_000.0;
/// Most copies of one message (the geometric tail is cut here).
const COPIES_MAX: u32 = 64;
/// Messages a consumer holds in flight when a rebalance hands them to another consumer.
const REBALANCE_BATCH: (u32, u32) = (4, 16);

/// The demo's seeded generator (`fastrand`), with the draws a plan needs. The demo needs
/// reproducible plans, not cryptographic randomness.
#[derive(Debug, Clone)]
pub(crate) struct Rng(fastrand::Rng);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(fastrand::Rng::with_seed(seed))
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0.f64()
    }

    /// Uniform in [lo, hi].
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in [lo, hi].
    fn int(&mut self, lo: u32, hi: u32) -> u32 {
        self.0.u32(lo..=hi)
    }

    /// Extra copies with mean `mean` (geometric: most messages get few, some get a burst).
    fn extra_copies(&mut self, mean: f64) -> u32 {
        if mean <= 0.0 {
            return 0;
        }
        let p = 1.0 / (1.0 + mean);
        // Inverse transform of the geometric distribution on {0, 1, 2, ...}.
        let u = 1.0 - self.unit(); // (0, 1]
        let k = (u.ln() / (1.0 - p).ln()).floor();
        (k as u32).min(COPIES_MAX - 1)
    }

    fn work(&mut self) -> Duration {
        let us = (WORK_MIN_US.ln() + (WORK_MAX_US.ln() - WORK_MIN_US.ln()) * self.unit()).exp();
        Duration::from_nanos((us * 1_000.0) as u64)
    }
}

/// How duplicates reach the consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Pattern {
    /// The visibility timeout expires while the first consumer still works: copies are
    /// redelivered at intervals shorter than the work.
    Redelivery,
    /// A consumer group rebalances: every message a consumer holds is handed, at once, to
    /// another consumer while the first may still be working on it.
    Rebalance,
    /// A retry storm: all copies of a message arrive at the same moment.
    Storm,
    /// About a third of the messages each way.
    Mixed,
}

/// The concrete pattern of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Redelivery = 0,
    Rebalance = 1,
    Storm = 2,
}

impl Pattern {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Pattern::Redelivery => "redelivery",
            Pattern::Rebalance => "rebalance",
            Pattern::Storm => "storm",
            Pattern::Mixed => "mixed",
        }
    }
}

impl Kind {
    pub(crate) const ALL: [Kind; 3] = [Kind::Redelivery, Kind::Rebalance, Kind::Storm];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Redelivery => "redelivery",
            Kind::Rebalance => "rebalance",
            Kind::Storm => "storm",
        }
    }
}

/// The idempotency key of message `msg`.
pub(crate) fn key_of(msg: u32) -> String {
    format!("payment-{msg:08}")
}

/// One message of the plan.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    /// How long its handler works between the check and the side effect.
    pub(crate) work: Duration,
    /// The amount "charged" (part of the payload, so part of the fingerprint).
    pub(crate) amount_cents: u32,
    pub(crate) kind: Kind,
    /// Copies delivered in all (1 = no duplicate).
    pub(crate) copies: u32,
}

/// A set of messages whose copies are scheduled together.
#[derive(Debug, Clone)]
enum Group {
    /// Copy `j` is due `j * interval` after the first copy was picked up.
    Redelivery { msg: u32, interval: Duration },
    /// Every further copy is due at once when the first is picked up.
    Storm { msg: u32 },
    /// Messages `first..first + len` go out together; round `r` re-delivers all of them
    /// `r * delay` after the first was picked up.
    Rebalance {
        first: u32,
        len: u32,
        rounds: u32,
        delay: Duration,
    },
}

/// Everything the demo will deliver, fixed by the seed.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) messages: Vec<Message>,
    groups: Vec<Group>,
    /// Deliveries in all (sum of copies).
    pub(crate) deliveries: u64,
}

impl Plan {
    /// `dup_rate` is the expected number of copies per message (at least 1).
    pub(crate) fn new(messages: u32, dup_rate: f64, pattern: Pattern, seed: u64) -> Plan {
        let mut rng = Rng::new(seed);
        let extra = dup_rate - 1.0;
        let mut msgs: Vec<Message> = Vec::with_capacity(messages as usize);
        let mut groups = Vec::new();
        let mut deliveries = 0u64;
        while (msgs.len() as u64) < u64::from(messages) {
            let id = msgs.len() as u32;
            let kind = match pattern {
                Pattern::Redelivery => Kind::Redelivery,
                Pattern::Rebalance => Kind::Rebalance,
                Pattern::Storm => Kind::Storm,
                // A rebalance group holds several messages: pick it less often so that each
                // pattern covers about a third of the messages.
                Pattern::Mixed => {
                    let mean_batch = f64::from(REBALANCE_BATCH.0 + REBALANCE_BATCH.1) / 2.0;
                    if rng.unit() < 1.0 / (2.0 * mean_batch + 1.0) {
                        Kind::Rebalance
                    } else if rng.unit() < 0.5 {
                        Kind::Redelivery
                    } else {
                        Kind::Storm
                    }
                }
            };
            match kind {
                Kind::Redelivery | Kind::Storm => {
                    let copies = 1 + rng.extra_copies(extra);
                    let work = rng.work();
                    let amount_cents = rng.int(100, 99_999);
                    msgs.push(Message {
                        work,
                        amount_cents,
                        kind,
                        copies,
                    });
                    deliveries += u64::from(copies);
                    groups.push(if kind == Kind::Storm {
                        Group::Storm { msg: id }
                    } else {
                        // A visibility timeout shorter than the work: the copy lands while
                        // the first is mid-way (later copies may land after it finished).
                        Group::Redelivery {
                            msg: id,
                            interval: work.mul_f64(rng.between(0.1, 0.7)),
                        }
                    });
                }
                Kind::Rebalance => {
                    let len = rng
                        .int(REBALANCE_BATCH.0, REBALANCE_BATCH.1)
                        .min(messages - id);
                    let rounds = rng.extra_copies(extra);
                    let mut total_work = Duration::ZERO;
                    for _ in 0..len {
                        let work = rng.work();
                        total_work += work;
                        let amount_cents = rng.int(100, 99_999);
                        msgs.push(Message {
                            work,
                            amount_cents,
                            kind,
                            copies: 1 + rounds,
                        });
                    }
                    deliveries += u64::from(len) * u64::from(1 + rounds);
                    let mean_work = total_work / len;
                    groups.push(Group::Rebalance {
                        first: id,
                        len,
                        rounds,
                        delay: mean_work.mul_f64(rng.between(0.1, 0.9)),
                    });
                }
            }
        }
        Plan {
            messages: msgs,
            groups,
            deliveries,
        }
    }
}

/// One copy of one message handed to a consumer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delivery {
    pub(crate) msg: u32,
    /// 0 for the first copy.
    pub(crate) copy: u32,
}

/// A copy waiting for its moment.
struct Due {
    at: Instant,
    seq: u64,
    delivery: Delivery,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    // Reversed: the earliest due copy is the top of the (max-)heap.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct State {
    next_group: usize,
    /// First copies ready now; the group index says whose follow-ups to schedule on pickup.
    fresh: VecDeque<(Delivery, Option<usize>)>,
    delayed: BinaryHeap<Due>,
    seq: u64,
}

/// Hands deliveries to consumer threads: due duplicates first, then fresh messages.
pub(crate) struct Broker<'p> {
    plan: &'p Plan,
    state: Mutex<State>,
    wake: Condvar,
    stop: AtomicBool,
}

impl<'p> Broker<'p> {
    pub(crate) fn new(plan: &'p Plan) -> Self {
        Broker {
            plan,
            state: Mutex::new(State {
                next_group: 0,
                fresh: VecDeque::new(),
                delayed: BinaryHeap::new(),
                seq: 0,
            }),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        }
    }

    /// Stops handing out deliveries (a consumer hit a fatal error).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _guard = self.state.lock();
        self.wake.notify_all();
    }

    /// The next delivery for a consumer, waiting for a due duplicate if nothing else is left;
    /// `None` once everything was delivered.
    pub(crate) fn next(&self) -> Option<Delivery> {
        let mut st = self.state.lock();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            let now = Instant::now();
            if st.delayed.peek().is_some_and(|due| due.at <= now) {
                return st.delayed.pop().map(|due| due.delivery);
            }
            if st.fresh.is_empty() {
                self.refill(&mut st);
            }
            if let Some((delivery, group)) = st.fresh.pop_front() {
                if let Some(group) = group {
                    self.schedule(&mut st, group, now);
                    self.wake.notify_all();
                }
                return Some(delivery);
            }
            let at = st.delayed.peek()?.at;
            self.wake.wait_until(&mut st, at);
        }
    }

    fn refill(&self, st: &mut State) {
        let Some(group) = self.plan.groups.get(st.next_group) else {
            return;
        };
        let index = st.next_group;
        st.next_group += 1;
        match *group {
            Group::Redelivery { msg, .. } | Group::Storm { msg } => {
                st.fresh.push_back((Delivery { msg, copy: 0 }, Some(index)));
            }
            Group::Rebalance { first, len, .. } => {
                for msg in first..first + len {
                    let trigger = (msg == first).then_some(index);
                    st.fresh.push_back((Delivery { msg, copy: 0 }, trigger));
                }
            }
        }
    }

    /// Schedules the duplicates of `group`, whose first copy is picked up at `now`.
    fn schedule(&self, st: &mut State, group: usize, now: Instant) {
        let push = |st: &mut State, at: Instant, msg: u32, copy: u32| {
            st.seq += 1;
            let seq = st.seq;
            st.delayed.push(Due {
                at,
                seq,
                delivery: Delivery { msg, copy },
            });
        };
        match self.plan.groups[group] {
            Group::Redelivery { msg, interval } => {
                for copy in 1..self.plan.messages[msg as usize].copies {
                    push(st, now + interval * copy, msg, copy);
                }
            }
            Group::Storm { msg } => {
                for copy in 1..self.plan.messages[msg as usize].copies {
                    push(st, now, msg, copy);
                }
            }
            Group::Rebalance {
                first,
                len,
                rounds,
                delay,
            } => {
                for round in 1..=rounds {
                    for msg in first..first + len {
                        push(st, now + delay * round, msg, round);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_reproducible_and_counts_copies() {
        let a = Plan::new(5_000, 3.0, Pattern::Mixed, 7);
        let b = Plan::new(5_000, 3.0, Pattern::Mixed, 7);
        assert_eq!(a.messages.len(), 5_000);
        assert_eq!(a.deliveries, b.deliveries);
        let sum: u64 = a.messages.iter().map(|m| u64::from(m.copies)).sum();
        assert_eq!(sum, a.deliveries);
        let mean = a.deliveries as f64 / 5_000.0;
        assert!((2.5..3.5).contains(&mean), "mean copies {mean}");
    }

    #[test]
    fn mixed_covers_each_pattern_about_equally() {
        let plan = Plan::new(30_000, 2.0, Pattern::Mixed, 3);
        for kind in Kind::ALL {
            let share = plan.messages.iter().filter(|m| m.kind == kind).count();
            assert!((8_000..12_000).contains(&share), "{kind:?}: {share}");
        }
    }

    #[test]
    fn broker_delivers_every_copy_once() {
        let plan = Plan::new(300, 2.5, Pattern::Mixed, 1);
        let broker = Broker::new(&plan);
        let mut seen = vec![0u32; 300];
        while let Some(d) = broker.next() {
            seen[d.msg as usize] += 1;
        }
        for (i, m) in plan.messages.iter().enumerate() {
            assert_eq!(seen[i], m.copies);
        }
    }
}
