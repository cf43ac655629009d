//! Admission of new claims under `Buffered`, by the writer's measured rate.
//!
//! `Buffered { max_delay }` promises that an acknowledged call is fsynced about `max_delay`
//! later. A queue admitted by count alone breaks that under overload: callers outrun the
//! writer, and an acknowledged operation waits behind whole batches. So the writer measures
//! how many operations it commits per second, over its whole cycle for a batch (the commit
//! and the work after it), and new claims are admitted only while what
//! is acknowledged but not yet durable is under three quarters (`ADMIT_BACKLOG_SHARE`) of
//! what it commits in one `max_delay`. A batch is gathered against a deadline of its oldest
//! acknowledgement plus `max_delay` less its own commit time (`gather.rs`) and holds no more
//! than that limit, so an acknowledged operation waits for at most the backlog ahead of it
//! and its own batch: about `1.5 × max_delay`, within the documented `2 × max_delay`.
//!
//! Holders' calls are not subject to it (a finished holder is never turned away; they keep
//! the last eighth of the queue), and the other modes admit by count alone.

use crate::base::sync::{AtomicU64, Mutex, Ordering};
use crate::runtime::constants::{
    ADMIT_BACKLOG_SHARE, ADMIT_BATCH_OPS_MIN, ADMIT_CLAIMS_MIN, ADMIT_RATE_WEIGHT,
};
use std::time::Duration;

pub(crate) struct Admission {
    /// `max_delay` under `Buffered`; `None` admits by count alone.
    max_delay: Option<Duration>,
    /// The count limit: never admit past it.
    claims_cap: u64,
    /// Queue length below which a new claim is admitted now.
    claims_max: AtomicU64,
    /// The writer's rate, operations per second (a moving average; the writer's alone).
    rate: Mutex<Option<f64>>,
    /// The longest an acknowledged operation has waited for its fsync, in ns.
    lag_max_ns: AtomicU64,
}

impl Admission {
    pub(crate) fn new(max_delay: Option<Duration>, claims_cap: usize) -> Self {
        // Until the writer's rate is measured, `Buffered` admits the floor: a first burst
        // admitted by count would be committed long after `max_delay`.
        let first = match max_delay {
            Some(_) => ADMIT_CLAIMS_MIN.min(claims_cap as u64),
            None => claims_cap as u64,
        };
        Self {
            max_delay,
            claims_cap: claims_cap as u64,
            claims_max: AtomicU64::new(first),
            rate: Mutex::new(None),
            lag_max_ns: AtomicU64::new(0),
        }
    }

    /// Whether a new claim may join a queue of `queued` operations.
    pub(crate) fn admits_claim(&self, queued: usize) -> bool {
        (queued as u64) < self.claims_max.load(Ordering::Relaxed)
    }

    /// The writer committed `ops` operations in `took`: update the rate and the limit.
    pub(crate) fn committed(&self, ops: usize, took: Duration) {
        let Some(max_delay) = self.max_delay else {
            return;
        };
        // A small batch's time is mostly the fsync: it says little about the rate.
        if ops < ADMIT_BATCH_OPS_MIN || took.is_zero() {
            return;
        }
        let measured = ops as f64 / took.as_secs_f64();
        let rate = {
            let mut rate = self.rate.lock();
            let next = match *rate {
                Some(r) => r + ADMIT_RATE_WEIGHT * (measured - r),
                None => measured,
            };
            *rate = Some(next);
            next
        };
        self.claims_max.store(
            claims_limit(rate, max_delay, self.claims_cap),
            Ordering::Relaxed,
        );
    }

    /// The oldest operation of a commit had been acknowledged `age` before it was durable.
    pub(crate) fn durable_after(&self, age: Duration) {
        let ns = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
        self.lag_max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// The writer's measured commit time per operation, in seconds (0 until measured).
    pub(crate) fn secs_per_op(&self) -> f64 {
        match *self.rate.lock() {
            Some(rate) if rate > 0.0 => 1.0 / rate,
            _ => 0.0,
        }
    }

    pub(crate) fn claims_max(&self) -> u64 {
        self.claims_max.load(Ordering::Relaxed)
    }

    pub(crate) fn lag_max(&self) -> Duration {
        Duration::from_nanos(self.lag_max_ns.load(Ordering::Relaxed))
    }
}

/// `ADMIT_BACKLOG_SHARE` of what the writer commits in one `max_delay` at `rate`
/// operations per second, kept between a floor (so a slow measurement never starves the
/// queue) and the count limit.
pub(crate) fn claims_limit(rate: f64, max_delay: Duration, cap: u64) -> u64 {
    let ops = rate * max_delay.as_secs_f64() * ADMIT_BACKLOG_SHARE;
    // `as` saturates a float (NaN becomes 0), so no rate can overflow the limit.
    (ops as u64).clamp(ADMIT_CLAIMS_MIN.min(cap), cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_a_share_of_one_delay_of_the_writers_rate_within_floor_and_cap() {
        let ms10 = Duration::from_millis(10);
        assert_eq!(claims_limit(600_000.0, ms10, 14_336), 4_500);
        assert_eq!(claims_limit(200_000.0, ms10, 14_336), ADMIT_CLAIMS_MIN);
        assert_eq!(claims_limit(1.0, ms10, 14_336), ADMIT_CLAIMS_MIN);
        assert_eq!(claims_limit(1e12, ms10, 14_336), 14_336);
        assert_eq!(claims_limit(f64::NAN, ms10, 14_336), ADMIT_CLAIMS_MIN);
        assert_eq!(
            claims_limit(1e6, ms10, 100),
            100,
            "the floor never exceeds the cap"
        );
    }

    #[test]
    fn buffered_admission_follows_the_measured_rate_and_the_others_do_not_move() {
        let a = Admission::new(Some(Duration::from_millis(10)), 14_336);
        assert!(
            a.admits_claim(ADMIT_CLAIMS_MIN as usize - 1)
                && !a.admits_claim(ADMIT_CLAIMS_MIN as usize),
            "before any measurement: the floor"
        );
        assert_eq!(a.secs_per_op(), 0.0, "and no commit time to leave room for");
        a.committed(5_000, Duration::from_millis(5)); // 1 M ops/s
        assert_eq!(a.claims_max(), 7_500);
        assert!(a.admits_claim(7_499) && !a.admits_claim(7_500));
        assert!((a.secs_per_op() - 1e-6).abs() < 1e-12);
        a.committed(10, Duration::from_millis(5)); // too small to count
        assert_eq!(a.claims_max(), 7_500);
        a.committed(8_000, Duration::from_millis(4)); // 2 M ops/s, averaged in
        assert!(a.claims_max() > 7_500 && a.claims_max() < 14_336);

        let immediate = Admission::new(None, 14_336);
        immediate.committed(5_000, Duration::from_millis(25));
        assert_eq!(immediate.claims_max(), 14_336);
    }

    #[test]
    fn the_lag_is_the_longest_seen() {
        let a = Admission::new(Some(Duration::from_millis(10)), 100);
        a.durable_after(Duration::from_millis(3));
        a.durable_after(Duration::from_millis(12));
        a.durable_after(Duration::from_millis(5));
        assert_eq!(a.lag_max(), Duration::from_millis(12));
    }
}
