//! The applier: with the commit log, the batch whose frame the writer has just synced (and
//! whose callers it has acknowledged) reaches the file on a thread of its own, while the
//! writer gathers and syncs the next frame.
//!
//! Without it the writer's cycle was the frame's durable write followed by the batch's
//! non-durable redb commit, one after the other; the commit does not need the frame's
//! device time and the frame does not need the commit's CPU, so they overlap.
//!
//! Definitions:
//! - A *job* is one acknowledged batch, with the applied watermark it carries: every
//!   operation numbered at or below it is in the file once this job and every earlier one
//!   are applied.
//!
//! Invariants:
//! - At most one job is handed over and not yet applied. The writer hands the next one
//!   over only once the applier is idle, so jobs are applied in the order their frames
//!   were synced: the file's records are always the state of a prefix of the log's frames.
//! - The writer commits to the file itself, and acknowledges a batch as applied (a flush's
//!   barrier alone in its batch), only when the applier is idle and has not failed: redb's
//!   commits stay in frame order, and the applied watermark the writer raises covers every
//!   batch handed over before.
//! - Only the applier raises the applied watermark for a job it applied, to the watermark
//!   the job carries, after its commit returned.
//! - A failed apply poisons the engine. The batch it held, and the one the writer may have
//!   synced beside it, were acknowledged on their frames' sync; both replay from the log at
//!   the next open.

use crate::constants::APPLIER_POLL;
use crate::engine::Shared;
use crate::storage::{Closing, Durable};
use crate::sync::{Arc, Condvar, JoinHandle, Mutex};
use crate::writer::{committed, writes_of, Queued};
use std::time::{Duration, Instant};

/// One acknowledged batch for the file.
pub(crate) struct Job {
    pub(crate) batch: Vec<Queued>,
    /// How the batch was staged: always [`Durable::Logged`].
    pub(crate) how: Durable,
    /// The applied watermark once this batch is in the file.
    pub(crate) watermark: u64,
    /// The writer's queue was empty at the hand-over: after this apply, publish the
    /// completions nobody else will (responses the file now holds leave memory).
    pub(crate) idle: bool,
    /// How long the batch's frame took to write, for `Stats::commit_max_us` (with the
    /// apply's own time, not the wait for the applier between them).
    pub(crate) staged: Duration,
}

#[derive(Default)]
struct Slot {
    job: Option<Job>,
    /// A job is handed over and not yet applied.
    busy: bool,
    /// The last applied batch's buffer, emptied, for the writer's next batch.
    spare: Option<Vec<Queued>>,
    stop: bool,
    /// The applier thread ended (stopped, or panicked): nothing more is applied.
    gone: bool,
}

struct Handoff {
    slot: Mutex<Slot>,
    changed: Condvar,
}

/// The writer's end of the applier.
pub(crate) struct Applier {
    handoff: Arc<Handoff>,
    thread: Option<JoinHandle<()>>,
}

impl Applier {
    pub(crate) fn spawn(shared: Arc<Shared>, store: Arc<Closing>) -> std::io::Result<Self> {
        let handoff = Arc::new(Handoff {
            slot: Mutex::new(Slot::default()),
            changed: Condvar::new(),
        });
        let theirs = handoff.clone();
        let thread = crate::sync::spawn("idemkv-applier", move || run(&shared, &store, &theirs))?;
        Ok(Applier {
            handoff,
            thread: Some(thread),
        })
    }

    /// Hands `job` over once the previous one is applied; returns an empty buffer (with
    /// its capacity) for the writer's next batch.
    pub(crate) fn hand_off(&self, job: Job) -> Vec<Queued> {
        debug_assert!(matches!(job.how, Durable::Logged { .. }));
        let mut slot = self.handoff.slot.lock();
        while slot.busy && !slot.gone {
            self.handoff.changed.wait_for(&mut slot, APPLIER_POLL);
        }
        let spare = slot.spare.take().unwrap_or_default();
        if slot.gone {
            // The applier died (poisoning the engine): the batch is durable in the log,
            // and replays from it at the next open.
            return spare;
        }
        slot.job = Some(job);
        slot.busy = true;
        self.handoff.changed.notify_all();
        spare
    }

    /// Waits until every job handed over is applied (or the applier is gone).
    pub(crate) fn drain(&self) {
        let mut slot = self.handoff.slot.lock();
        while slot.busy && !slot.gone {
            self.handoff.changed.wait_for(&mut slot, APPLIER_POLL);
        }
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        self.drain();
        self.handoff.slot.lock().stop = true;
        self.handoff.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            // A panic on the applier already poisoned the engine (`Gone`).
            let _ = thread.join();
        }
    }
}

/// Marks the applier gone as its thread ends, and poisons the engine if it panics: the
/// writer must neither wait for it nor go on acknowledging batches that no longer reach
/// the file.
struct Gone<'a>(&'a Shared, &'a Handoff);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poison("the applier thread panicked".to_string());
        }
        let mut slot = self.1.slot.lock();
        slot.gone = true;
        slot.busy = false;
        self.1.changed.notify_all();
    }
}

fn run(shared: &Shared, store: &Closing, handoff: &Handoff) {
    let _gone = Gone(shared, handoff);
    loop {
        let job = {
            let mut slot = handoff.slot.lock();
            loop {
                if let Some(job) = slot.job.take() {
                    break job;
                }
                if slot.stop {
                    return;
                }
                handoff.changed.wait_for(&mut slot, APPLIER_POLL);
            }
        };
        let batch = apply(shared, store, job);
        let mut slot = handoff.slot.lock();
        slot.spare = Some(batch);
        slot.busy = false;
        handoff.changed.notify_all();
    }
}

/// Commits `job`'s batch to the file (not durably: its frame is), then raises the applied
/// watermark. Returns the emptied batch buffer.
fn apply(shared: &Shared, store: &Closing, job: Job) -> Vec<Queued> {
    let Job {
        mut batch,
        how,
        watermark,
        idle,
        staged,
    } = job;
    // A poisoned engine writes nothing more to the file; the log holds the batch.
    if shared.poison_reason().is_none() {
        let began = Instant::now();
        // The same writes as the frame's: `writes_of` is a function of the batch alone.
        let (writes, tables, ops) = writes_of(&batch, shared);
        let mut marked = Vec::new();
        // An acknowledged-on-sync batch carries no token mark and no marker row.
        match store.commit(&writes, &tables, None, how, &mut marked) {
            Ok(()) => {
                debug_assert!(
                    marked.is_empty(),
                    "marker batches are applied by the writer"
                );
                if let Some(last) = tables.iter().map(|t| t.ordinal).max() {
                    shared.tables.committed(last);
                }
                committed(shared, staged + began.elapsed(), ops);
                // Test-only hook: a test holding the writer after its commits holds the
                // applied watermark of a batch acknowledged on its sync here.
                #[cfg(idemkv_sabotage)]
                shared.after_commit_gate.pass();
                shared.progress.applied(watermark);
                if idle {
                    shared.index.catch_up();
                }
            }
            Err(why) => {
                shared.poison(why);
            }
        }
    }
    batch.clear();
    batch
}
