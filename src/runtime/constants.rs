//! Tuning constants of the running engine: the writer's batches, admission, the applier,
//! recovery, the sweeper, the timers.

use std::time::Duration;

/// Most operations the writer puts in one redb transaction.
pub(crate) const BATCH_OPS_MAX: usize = 8192;
/// `Buffered` gathering (`gather.rs`): operations taken between two readings of the clock
/// against the batch's deadline. A reading costs tens of nanoseconds; a batch holds
/// thousands of operations, so this checks it often enough at a small fraction of the cost.
pub(crate) const GATHER_DEADLINE_CHECK_OPS: usize = 64;
/// `Buffered` admission (`admission.rs`): a commit smaller than this does not update the
/// writer's measured rate (its time is mostly the fsync).
pub(crate) const ADMIT_BATCH_OPS_MIN: usize = 256;
/// `Buffered` admission: the fewest queued operations new claims are ever held to. The
/// `2 × max_delay` bound holds while the writer commits at least this many per `max_delay`
/// (205 k operations/s at the default 10 ms; this machine's writer commits 250–450 k over
/// its whole cycle, fewer as the file and the index grow).
pub(crate) const ADMIT_CLAIMS_MIN: u64 = 2048;
/// `Buffered` admission: new claims are admitted while what is acknowledged but not yet
/// durable is under this share of what the writer commits in one `max_delay`. An
/// acknowledged operation then waits for at most that backlog and its own batch (no larger):
/// `2 × share × max_delay`, 1.5 × at 0.75, leaving a quarter of `max_delay` of the
/// documented `2 × max_delay` for fsync stalls and scheduling. Measured under saturation
/// (docs/benchmarks.md), with the rate timed over the commit alone (about twice the real
/// one): 0.5 gave 11–16 ms at 10 ms and 0.75 14–18 ms with 1.1–1.5× the throughput; 1.0
/// reached 21 ms. With the rate timed over the whole cycle, 0.75 gave 10–18 ms.
pub(crate) const ADMIT_BACKLOG_SHARE: f64 = 0.75;
/// `Buffered` admission: the weight of the newest measurement in the rate's moving average.
pub(crate) const ADMIT_RATE_WEIGHT: f64 = 0.25;
/// Longest real-time slice a waiter sleeps before it looks at the clock again. A waiter is
/// woken by every state change of its stripe; the slice only bounds the cost of a clock
/// that cannot notify (wall-clock jumps, foreign clocks).
pub(crate) const WAIT_SLICE_MAX: Duration = Duration::from_millis(250);
/// Backstop for a thread waiting for durability: every change it waits for (a new watermark,
/// poison, the writer stopping) wakes it, so this timeout only bounds the cost of a bug.
pub(crate) const ACK_POLL: Duration = Duration::from_millis(100);
/// Test-only (`AckBeforeCommit` with the commit log): how long the sabotaged writer waits
/// between acknowledging a batch and writing its frame, about a commit to the file on a
/// disk, so that a kill lands in that window about one time in three.
#[cfg(all(idemkv_sabotage, not(shuttle)))]
pub(crate) const ACK_EARLY_HOLD: Duration = Duration::from_millis(2);
/// Most acknowledged batches waiting for the applier (with the commit log): the applier
/// takes all of them into its next durable commit, and the writer waits for room beyond
/// this, which bounds the responses kept in memory until the file holds them.
pub(crate) const APPLY_JOBS_MAX: usize = 64;
/// Shortest time between two of the applier's commits (with the commit log). Each commit
/// flushes the device twice, and the callers' acknowledgements wait for the log's own
/// flushes on the same device: at most a few hundred file commits a second keep the log's
/// writes from queueing behind them, while a reader of the live file sees the engine's
/// state this much behind, at most.
pub(crate) const APPLY_INTERVAL: Duration = Duration::from_millis(10);
/// How much the applier lowers its thread's priority (a nice increment; Linux). No
/// acknowledgement waits for an apply (a flush, a checkpoint, the outbox's `pending` and
/// `close` do, and take longer on busy cores), but each of its commits is two device flushes
/// and milliseconds of CPU under load (every batch of the last `APPLY_INTERVAL`, 2–3 µs per
/// operation), which otherwise delay the writer and the callers
/// woken by its syncs. Measured with 64 blocking threads on 2 cores (docs/experiments.md,
/// "`Immediate` with 64 blocking threads"): 0 gave 76–85 k claim+complete/s, 10 gave
/// 87–93 k, 19 gave 98–100 k; with two CPU-bound processes beside the engine, 0 and 10 gave
/// 21–23 k and 19 gave 6 k (the applier, starved inside its commit, holds the writer back
/// once `APPLY_JOBS_MAX` jobs wait). 10 keeps most of the gain without that cliff.
pub(crate) const APPLIER_NICE: u8 = 10;
/// Backstop for the writer waiting for the applier, and the applier for its next batch:
/// every apply, stop and hand-over that changes when the applier acts notifies, so this
/// timeout only bounds the cost of a bug.
pub(crate) const APPLIER_POLL: Duration = Duration::from_millis(100);
/// A kept-alive lease is renewed when this fraction of it has passed (every third), so a
/// renewal delayed by a full queue or a busy machine still lands before the lease ends.
pub(crate) const KEEP_ALIVE_DIVISOR: u64 = 3;
/// Shortest real-time slice a waiter sleeps, so that a tiny retry hint never spins.
pub(crate) const WAIT_SLICE_MIN: Duration = Duration::from_millis(1);
/// Default time between two background sweeps.
pub(crate) const SWEEP_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// Most expiry entries the sweeper works off per stripe-lock hold (leases ended, keys
/// removed, stale entries dropped): bounds how long a claim can wait behind it (a few tens of
/// microseconds). Also the most a claim at the key budget reclaims per stripe it visits.
pub(crate) const SWEEP_STRIPE_BATCH: usize = 256;
/// Work the background sweeper does before it pauses for `SWEEP_PAUSE`.
pub(crate) const SWEEP_STEP_BUDGET: Duration = Duration::from_millis(2);
/// The background sweeper's pause between steps, and while the writer queue is busy.
pub(crate) const SWEEP_PAUSE: Duration = Duration::from_millis(1);
/// Most records recovery pre-sizes the index for; a larger (or damaged) count just grows.
pub(crate) const RECOVERY_PRESIZE_MAX: u64 = 1 << 24;
/// Threads that scan the file on open (the machine class has two cores).
pub(crate) const RECOVERY_THREADS_MAX: u64 = 2;
/// Most rows one table scan returns, and most messages one `Outbox::pending` returns or
/// one `Outbox::mark_sent` removes.
pub(crate) const TABLE_SCAN_LIMIT_MAX: usize = 10_000;
