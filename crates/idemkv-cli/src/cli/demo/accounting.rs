//! What the card processor saw: every charge of every message, and the per-column summary
//! the report prints (side effects, double charges, latency, throughput, violations).

use super::workload::{key_of, Plan};
use super::Column;
use crate::cli::output::{count, duration};
use idemkv::Stats;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Most violations explained one by one (the count covers them all).
const VIOLATIONS_SHOWN: usize = 10;

/// One execution of the side effect under an idemkv lease.
#[derive(Debug, Clone)]
pub(super) struct Charge {
    pub(super) msg: u32,
    /// Which copy of the message (0 = the first delivered).
    pub(super) copy: u32,
    pub(super) token: u64,
    pub(super) attempt: u32,
    pub(super) thread: u32,
    pub(super) start: Duration,
    pub(super) end: Duration,
}

/// The card processor: counts the charges of every message.
pub(super) struct Ledger {
    charges: Vec<AtomicU32>,
    /// Token of the first charge of each message (idemkv columns).
    winner: Vec<AtomicU64>,
    /// Every charge in detail (idemkv columns: one per message, if all goes well).
    log: Mutex<Vec<Charge>>,
}

impl Ledger {
    pub(super) fn new(messages: usize) -> Self {
        Ledger {
            charges: (0..messages).map(|_| AtomicU32::new(0)).collect(),
            winner: (0..messages).map(|_| AtomicU64::new(0)).collect(),
            log: Mutex::new(Vec::new()),
        }
    }

    /// Records one run of the side effect; `charge` details it when a lease ran it.
    pub(super) fn charge(&self, charge: Option<Charge>, msg: u32) {
        self.charges[msg as usize].fetch_add(1, Ordering::AcqRel);
        if let Some(charge) = charge {
            let _ = self.winner[msg as usize].compare_exchange(
                0,
                charge.token,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            self.log.lock().push(charge);
        }
    }

    /// The token whose run charged `msg` first (0 if none did).
    pub(super) fn winner(&self, msg: u32) -> u64 {
        self.winner[msg as usize].load(Ordering::Acquire)
    }
}

/// A copy that received a response other than the winner's.
#[derive(Debug, Clone)]
pub(super) struct WrongResponse {
    pub(super) msg: u32,
    pub(super) winner: u64,
    pub(super) got_token: u64,
    pub(super) got: Vec<u8>,
}

/// What one consumer thread saw.
#[derive(Debug, Default)]
pub(super) struct ThreadOut {
    pub(super) latencies_ns: Vec<u64>,
    pub(super) absorbed: u64,
    pub(super) retries: u64,
    /// Handler runs whose completion was refused with `LeaseLost`.
    pub(super) lease_lost: u64,
    pub(super) wrong: Vec<WrongResponse>,
}

/// The results of one column over the plan.
#[derive(Debug)]
pub(super) struct ColumnResult {
    pub(super) column: Column,
    pub(super) deliveries: u64,
    pub(super) messages: u64,
    pub(super) side_effects: u64,
    pub(super) double_charged: u64,
    pub(super) extra_charges: u64,
    pub(super) double_by_kind: [u64; 3],
    pub(super) absorbed: u64,
    pub(super) retries: u64,
    pub(super) lease_lost: u64,
    pub(super) p50: Duration,
    pub(super) p99: Duration,
    pub(super) max: Duration,
    pub(super) elapsed: Duration,
    /// Copies whose response was not the winner's (idemkv columns only).
    pub(super) wrong_responses: u64,
    /// Messages whose side effect never ran.
    pub(super) never_charged: u64,
    /// Explanations of the first violations (idemkv columns only).
    pub(super) violations: Vec<String>,
    /// The engine's counters after the run (idemkv columns only).
    pub(super) engine: Option<Stats>,
}

impl ColumnResult {
    /// What went wrong, in one phrase, if anything did. The naive column's double charges
    /// are the point of the demo, not a failure, so only idemkv columns can fail.
    pub(super) fn failure_summary(&self) -> Option<String> {
        if self.column == Column::Naive {
            return None;
        }
        let mut parts = Vec::new();
        if self.double_charged > 0 {
            parts.push(format!(
                "{} messages charged more than once ({} extra charges)",
                count(self.double_charged),
                count(self.extra_charges)
            ));
        }
        if self.wrong_responses > 0 {
            parts.push(format!(
                "{} copies answered with a response other than the winner's",
                count(self.wrong_responses)
            ));
        }
        if self.never_charged > 0 {
            parts.push(format!(
                "{} messages never charged",
                count(self.never_charged)
            ));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// Deliveries per second over the column's wall time.
    pub(super) fn throughput(&self) -> f64 {
        self.deliveries as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Adds up what the consumers and the ledger saw for one column.
pub(super) fn summarize(
    plan: &Plan,
    column: Column,
    ledger: Ledger,
    outs: Vec<ThreadOut>,
    elapsed: Duration,
) -> ColumnResult {
    let mut latencies: Vec<u64> = Vec::with_capacity(plan.deliveries as usize);
    let (mut absorbed, mut retries, mut lease_lost) = (0, 0, 0);
    let mut wrong = Vec::new();
    for out in outs {
        latencies.extend(out.latencies_ns);
        absorbed += out.absorbed;
        retries += out.retries;
        lease_lost += out.lease_lost;
        wrong.extend(out.wrong);
    }
    latencies.sort_unstable();
    let mut side_effects = 0u64;
    let mut double_charged = 0u64;
    let mut extra_charges = 0u64;
    let mut double_by_kind = [0u64; 3];
    let mut doubles = Vec::new();
    let mut never = Vec::new();
    for (i, c) in ledger.charges.iter().enumerate() {
        let c = u64::from(c.load(Ordering::Acquire));
        side_effects += c;
        if c > 1 {
            double_charged += 1;
            extra_charges += c - 1;
            double_by_kind[plan.messages[i].kind as usize] += 1;
            doubles.push(i as u32);
        } else if c == 0 {
            never.push(i as u32);
        }
    }

    let guarded = column != Column::Naive;
    let violations = if guarded {
        explain_violations(&ledger.log.into_inner(), &doubles, &wrong, &never)
    } else {
        Vec::new()
    };
    ColumnResult {
        column,
        deliveries: latencies.len() as u64,
        messages: plan.messages.len() as u64,
        side_effects,
        double_charged,
        extra_charges,
        double_by_kind,
        absorbed,
        retries,
        lease_lost,
        p50: crate::cli::percentile(&latencies, 0.50),
        p99: crate::cli::percentile(&latencies, 0.99),
        max: crate::cli::percentile(&latencies, 1.0),
        elapsed,
        wrong_responses: if guarded { wrong.len() as u64 } else { 0 },
        never_charged: never.len() as u64,
        violations,
        engine: None,
    }
}

/// The first violations of an idemkv column, one sentence each, then how many more.
fn explain_violations(
    log: &[Charge],
    doubles: &[u32],
    wrong: &[WrongResponse],
    never: &[u32],
) -> Vec<String> {
    let total = doubles.len() + wrong.len() + never.len();
    let mut out = Vec::new();
    for &msg in doubles.iter().take(VIOLATIONS_SHOWN) {
        let mut runs: Vec<&Charge> = log.iter().filter(|c| c.msg == msg).collect();
        runs.sort_by_key(|c| c.start);
        out.push(explain_double(msg, &runs));
    }
    for w in wrong
        .iter()
        .take(VIOLATIONS_SHOWN.saturating_sub(out.len()))
    {
        out.push(format!(
            "{} got the response of token {} ({:?}), but token {} ran the handler: \
             every copy must get the winner's bytes",
            key_of(w.msg),
            w.got_token,
            String::from_utf8_lossy(&w.got),
            w.winner
        ));
    }
    for &msg in never
        .iter()
        .take(VIOLATIONS_SHOWN.saturating_sub(out.len()))
    {
        out.push(format!(
            "{} was never charged: every delivery returned, but no handler ran",
            key_of(msg)
        ));
    }
    if total > out.len() {
        out.push(format!("... and {} more", total - out.len()));
    }
    out
}

/// Why a message was charged more than once, from the runs of its handler.
fn explain_double(msg: u32, runs: &[&Charge]) -> String {
    const RUNS_SHOWN: usize = 3;
    let mut list: Vec<String> = runs
        .iter()
        .take(RUNS_SHOWN)
        .map(|c| {
            format!(
                "copy {} under token {} (attempt {}, consumer-{}) ran {}..{}",
                c.copy,
                c.token,
                c.attempt,
                c.thread,
                duration(c.start),
                duration(c.end)
            )
        })
        .collect();
    if runs.len() > RUNS_SHOWN {
        list.push(format!("{} more", runs.len() - RUNS_SHOWN));
    }
    let overlapped = runs.windows(2).any(|w| w[1].start < w[0].end);
    let tokens: HashSet<u64> = runs.iter().map(|c| c.token).collect();
    let why = if tokens.len() < runs.len() {
        "one lease ran the handler twice"
    } else if overlapped {
        "the runs overlapped, so two leases were live at once (the one-winner invariant broke)"
    } else {
        "the runs did not overlap, so a later claim did not see the earlier run's outcome"
    };
    format!(
        "{} was charged {} times: {}; {why}",
        key_of(msg),
        runs.len(),
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::demo::workload::Pattern;

    fn outs(latencies_ns: Vec<u64>, absorbed: u64) -> Vec<ThreadOut> {
        vec![ThreadOut {
            latencies_ns,
            absorbed,
            ..ThreadOut::default()
        }]
    }

    #[test]
    fn summary_counts_extra_charges_per_message() {
        let plan = Plan::new(3, 1.0, Pattern::Storm, 1);
        let ledger = Ledger::new(3);
        for msg in [0, 0, 0, 1] {
            ledger.charge(None, msg);
        }
        let r = summarize(
            &plan,
            Column::Naive,
            ledger,
            outs(vec![3, 1, 2], 0),
            Duration::from_secs(1),
        );
        assert_eq!(r.side_effects, 4);
        assert_eq!(r.double_charged, 1);
        assert_eq!(r.extra_charges, 2);
        assert_eq!(r.never_charged, 1);
        assert_eq!(r.p50, Duration::from_nanos(2));
        assert_eq!(r.max, Duration::from_nanos(3));
        // The naive column's double charges are what the demo shows, not a failure.
        assert!(r.failure_summary().is_none());
        assert!(r.violations.is_empty());
    }

    #[test]
    fn idemkv_columns_fail_and_explain_a_double_charge() {
        let plan = Plan::new(2, 1.0, Pattern::Storm, 1);
        let ledger = Ledger::new(2);
        let charge = |token, start_us, end_us| Charge {
            msg: 0,
            copy: 0,
            token,
            attempt: 1,
            thread: 0,
            start: Duration::from_micros(start_us),
            end: Duration::from_micros(end_us),
        };
        ledger.charge(Some(charge(5, 0, 10)), 0);
        ledger.charge(Some(charge(6, 5, 15)), 0);
        ledger.charge(
            Some(Charge {
                msg: 1,
                ..charge(7, 0, 1)
            }),
            1,
        );
        assert_eq!(ledger.winner(0), 5);
        let column = Column::Idemkv(super::super::DurabilityArg::None);
        let r = summarize(
            &plan,
            column,
            ledger,
            outs(vec![1, 1], 0),
            Duration::from_secs(1),
        );
        let failure = r
            .failure_summary()
            .expect("a double charge fails the column");
        assert!(
            failure.contains("1 messages charged more than once"),
            "{failure}"
        );
        assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
        assert!(
            r.violations[0].contains("charged 2 times"),
            "{:?}",
            r.violations
        );
        assert!(r.violations[0].contains("overlapped"), "{:?}", r.violations);
    }
}
