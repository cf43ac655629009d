//! How the writer gathers a batch from its queue.
//!
//! Under `Immediate` (and with memory-only engines, which have no writer) a batch is what
//! is queued when the writer gets to it: every caller is waiting, so waiting for more would
//! only delay them. Under `Buffered { max_delay }` callers do not wait, and the batch is
//! gathered against a deadline: the oldest operation's acknowledgement plus `max_delay`,
//! less the batch's own commit time at the writer's measured rate. So the oldest operation
//! of a batch is durable about `max_delay` after it was acknowledged, and one that waited
//! behind a commit is durable within about `2 × max_delay`.
//!
//! Invariants:
//! - The deadline is checked while the queue keeps delivering, not only when it runs dry:
//!   callers that keep the queue busy never hold a batch open past it.
//! - Past the deadline a batch takes everything queued at that moment (within the limits)
//!   and stops. It never shrinks below the backlog: small batches each pay a whole
//!   commit's fixed cost, so a writer that fell behind would fall further behind.
//! - A barrier or shutdown ends the batch at once.

use crate::base::sync::channel::{Receiver, RecvTimeoutError};
use crate::runtime::constants::{BATCH_OPS_MAX, GATHER_DEADLINE_CHECK_OPS};
use crate::runtime::queue::{Op, Queued};
use std::time::{Duration, Instant};

/// The gathering window of one `Buffered` batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// When the batch's oldest operation was acknowledged.
    pub(crate) oldest: Instant,
    pub(crate) max_delay: Duration,
    /// The writer's measured commit time per operation (0 until measured).
    pub(crate) secs_per_op: f64,
    /// Most operations the batch takes (the admission's limit).
    pub(crate) ops_max: u64,
}

impl Window {
    /// When a batch of `len` operations must stop taking more: `max_delay` after the
    /// oldest acknowledgement, less the commit time of `len` operations. `None` when that
    /// cannot be represented.
    pub(crate) fn deadline(&self, len: usize) -> Option<Instant> {
        let commit =
            Duration::try_from_secs_f64(len as f64 * self.secs_per_op).unwrap_or(self.max_delay);
        self.oldest
            .checked_add(self.max_delay.saturating_sub(commit))
    }
}

fn ends_batch(q: &Queued) -> bool {
    matches!(q.op, Op::Barrier | Op::Shutdown)
}

/// Adds to `batch` (which holds the operation the writer woke for) what is queued now, or
/// under a `window` what arrives before its deadline, within the limits.
pub(crate) fn gather(rx: &Receiver<Queued>, batch: &mut Vec<Queued>, window: Option<Window>) {
    if batch.last().is_some_and(ends_batch) {
        return;
    }
    let Some(window) = window else {
        take_queued(rx, batch, usize::MAX, BATCH_OPS_MAX);
        return;
    };
    let ops_max = usize::try_from(window.ops_max)
        .unwrap_or(usize::MAX)
        .clamp(1, BATCH_OPS_MAX);
    while batch.len() < ops_max {
        // A deadline past what `Instant` can hold (a `max_delay` near `Duration::MAX`) is
        // no deadline: the batch is what is queued, as under `Immediate`.
        let Some(deadline) = window.deadline(batch.len()) else {
            take_queued(rx, batch, rx.len(), ops_max);
            return;
        };
        if batch.len().is_multiple_of(GATHER_DEADLINE_CHECK_OPS) && Instant::now() >= deadline {
            take_queued(rx, batch, rx.len(), ops_max);
            return;
        }
        let next = match rx.recv_deadline(deadline) {
            Ok(op) => op,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
        };
        let end = ends_batch(&next);
        batch.push(next);
        if end {
            return;
        }
    }
}

/// Adds at most `n` operations that are queued now, keeping the batch within `ops_max`;
/// stops at an empty queue or after a barrier or shutdown.
fn take_queued(rx: &Receiver<Queued>, batch: &mut Vec<Queued>, n: usize, ops_max: usize) {
    for _ in 0..n {
        if batch.len() >= ops_max {
            return;
        }
        let Ok(next) = rx.try_recv() else {
            return;
        };
        let end = ends_batch(&next);
        batch.push(next);
        if end {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::sync::channel::bounded;

    fn op(acked_at: Option<Instant>) -> Queued {
        Queued {
            seq: 1,
            op: Op::Delete { token: 1 },
            tables: None,
            acked_at,
        }
    }

    fn window(oldest: Instant, secs_per_op: f64, ops_max: u64) -> Window {
        Window {
            oldest,
            max_delay: Duration::from_millis(10),
            secs_per_op,
            ops_max,
        }
    }

    #[test]
    fn the_deadline_leaves_room_for_the_batchs_own_commit() {
        let t0 = Instant::now();
        let w = window(t0, 1e-6, 10_000); // 1 µs per operation
        assert_eq!(w.deadline(0), Some(t0 + Duration::from_millis(10)));
        let at_4000 = w.deadline(4_000).unwrap();
        let expected = t0 + Duration::from_millis(6);
        assert!(
            at_4000.max(expected) - at_4000.min(expected) < Duration::from_micros(1),
            "4,000 operations at 1 µs leave 6 ms: {:?}",
            at_4000 - t0
        );
        assert_eq!(
            w.deadline(50_000),
            Some(t0),
            "never before the acknowledgement"
        );
        let unmeasured = window(t0, 0.0, 10_000);
        assert_eq!(
            unmeasured.deadline(8_000),
            Some(t0 + Duration::from_millis(10))
        );
        for bad in [f64::NAN, f64::INFINITY, -1.0, f64::MAX] {
            assert_eq!(window(t0, bad, 1).deadline(7), Some(t0), "{bad} is due now");
        }
    }

    #[test]
    fn past_its_deadline_a_batch_takes_the_backlog_and_stops_while_callers_keep_sending() {
        const CAPACITY: usize = 256;
        let (tx, rx) = bounded(CAPACITY);
        for _ in 0..CAPACITY {
            tx.try_send(op(None)).unwrap();
        }
        // A sender that never stops: the queue is refilled as fast as the writer drains it.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sender = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = tx.try_send(op(None));
                }
            })
        };
        let late = Instant::now() - Duration::from_secs(1);
        let mut batch = vec![rx.recv().unwrap()];
        gather(&rx, &mut batch, Some(window(late, 1e-6, 100_000)));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sender.join().unwrap();
        // The first deadline check comes at the check interval; then what was queued.
        assert!(
            batch.len() >= CAPACITY.min(GATHER_DEADLINE_CHECK_OPS),
            "the backlog was taken: {}",
            batch.len()
        );
        assert!(
            batch.len() <= GATHER_DEADLINE_CHECK_OPS + CAPACITY,
            "the batch stopped at the backlog, not at the batch limit: {}",
            batch.len()
        );
    }

    #[test]
    fn a_late_batch_is_never_smaller_than_the_backlog() {
        let (tx, rx) = bounded(1_000);
        for _ in 0..700 {
            tx.try_send(op(None)).unwrap();
        }
        let late = Instant::now() - Duration::from_secs(1);
        let mut batch = vec![rx.recv().unwrap()];
        gather(&rx, &mut batch, Some(window(late, 1e-6, 100_000)));
        assert_eq!(
            batch.len(),
            700,
            "everything queued, though the deadline had passed"
        );
    }

    #[test]
    fn a_deadline_past_what_instant_holds_takes_what_is_queued() {
        let (tx, rx) = bounded(1_000);
        for _ in 0..500 {
            tx.try_send(op(None)).unwrap();
        }
        let mut w = window(Instant::now(), 0.0, 100_000);
        w.max_delay = Duration::MAX;
        assert_eq!(w.deadline(0), None);
        let mut batch = vec![rx.recv().unwrap()];
        gather(&rx, &mut batch, Some(w));
        assert_eq!(batch.len(), 500);
    }

    #[test]
    fn a_batch_stops_at_its_limit_and_at_a_barrier() {
        let (tx, rx) = bounded(1_000);
        for _ in 0..600 {
            tx.try_send(op(None)).unwrap();
        }
        let now = Instant::now();
        let mut batch = vec![rx.recv().unwrap()];
        gather(&rx, &mut batch, Some(window(now, 0.0, 300)));
        assert_eq!(batch.len(), 300, "the admission's limit");

        let mut batch = vec![rx.recv().unwrap()];
        gather(&rx, &mut batch, None);
        assert_eq!(batch.len(), 300, "`Immediate`: everything queued");
        assert!(rx.try_recv().is_err());

        for _ in 0..5 {
            tx.try_send(op(None)).unwrap();
        }
        let mut barrier = op(None);
        barrier.op = Op::Barrier;
        tx.try_send(barrier).unwrap();
        tx.try_send(op(None)).unwrap();
        let mut batch = vec![rx.recv().unwrap()];
        gather(&rx, &mut batch, None);
        assert_eq!(batch.len(), 6, "up to and with the barrier");
        assert!(matches!(batch[5].op, Op::Barrier));
    }
}
