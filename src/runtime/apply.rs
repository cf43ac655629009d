//! The applier: with the commit log, the batches whose frames the writer has synced (and
//! whose callers it has acknowledged) reach the file on a thread of its own, while the
//! writer gathers and syncs the next frames.
//!
//! The applier's commits are durable redb commits (two-phase), so the file on its own is
//! always a complete, checksummed state that other processes can follow while the engine
//! runs (redb's single-writer mode, which allows no non-durable commit). Their fsyncs cost
//! nothing on the acknowledgement path: the applier takes every batch handed over since
//! its last commit into one commit, so the slower the file, the larger each commit.
//!
//! Definitions:
//! - A *job* is one acknowledged batch, with the applied watermark it carries: every
//!   operation numbered at or below it is in the file once this job and every earlier one
//!   are applied.
//!
//! Invariants:
//! - Jobs are applied in the order their frames were synced, each commit taking a prefix
//!   of the jobs handed over and not yet applied: the file's records are always the state
//!   of a prefix of the log's frames, and the commit records which.
//! - At most `APPLY_JOBS_MAX` jobs wait; the writer waits for room beyond that, so what is
//!   acknowledged but not yet in the file (responses kept in memory until then) is bounded.
//! - The writer commits to the file itself, and acknowledges a batch as applied (a flush's
//!   barrier alone in its batch), only when the applier is idle and has not failed: redb's
//!   commits stay in frame order, and the applied watermark the writer raises covers every
//!   batch handed over before.
//! - Only the applier raises the applied watermark for a job it applied, to the watermark
//!   the job carries, after its commit returned.
//! - A failed apply poisons the engine. The batches it held, and those the writer may have
//!   synced beside them, were acknowledged on their frames' sync; all replay from the log
//!   at the next open.

use crate::base::sabotage::fault_point;
use crate::base::sync::{Arc, Condvar, JoinHandle, Mutex};
use crate::runtime::constants::{APPLIER_NICE, APPLIER_POLL, APPLY_INTERVAL, APPLY_JOBS_MAX};
use crate::runtime::queue::{writes_of, Queued};
use crate::runtime::shared::Shared;
use crate::store::storage::{Closing, Durable};
use std::collections::VecDeque;
use std::time::Instant;

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
}

#[derive(Default)]
struct Slot {
    /// Jobs handed over and not yet taken by the applier, oldest first.
    jobs: VecDeque<Job>,
    /// Jobs are handed over and not yet applied (waiting, or in the applier's commit).
    busy: bool,
    /// Emptied batch buffers of applied jobs, for the writer's next batches.
    spare: Vec<Vec<Queued>>,
    stop: bool,
    /// The writer waits for every job to be applied: commit at once, without waiting for
    /// the next commit's time.
    urgent: bool,
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
        let thread =
            crate::base::sync::spawn_background("idemkv-applier", APPLIER_NICE, move || {
                run(&shared, &store, &theirs)
            })?;
        Ok(Applier {
            handoff,
            thread: Some(thread),
        })
    }

    /// Hands `job` over once there is room for it; returns an empty buffer (with the
    /// capacity of an applied batch's, when one is spare) for the writer's next batch.
    pub(crate) fn hand_off(&self, job: Job) -> Vec<Queued> {
        debug_assert!(matches!(job.how, Durable::Logged { .. }));
        let mut slot = self.handoff.slot.lock();
        while slot.jobs.len() >= APPLY_JOBS_MAX && !slot.gone {
            self.handoff.changed.wait_for(&mut slot, APPLIER_POLL);
        }
        let spare = slot.spare.pop().unwrap_or_default();
        if slot.gone {
            // The applier died (poisoning the engine): the batch is durable in the log,
            // and replays from it at the next open.
            return spare;
        }
        slot.jobs.push_back(job);
        slot.busy = true;
        // The applier sleeps until its next commit is due once it holds jobs: only the
        // first job (it slept without a deadline) and a full room change when it acts.
        if slot.jobs.len() == 1 || slot.jobs.len() >= APPLY_JOBS_MAX || untimed() {
            self.handoff.changed.notify_all();
        }
        spare
    }

    /// Waits until every job handed over is applied (or the applier is gone).
    pub(crate) fn drain(&self) {
        let mut slot = self.handoff.slot.lock();
        if slot.busy {
            slot.urgent = true;
            self.handoff.changed.notify_all();
        }
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
    let mut jobs = Vec::new();
    let mut last_commit = Instant::now();
    loop {
        {
            let mut slot = handoff.slot.lock();
            loop {
                if slot.stop && slot.jobs.is_empty() {
                    return;
                }
                // Each commit's fsyncs share the device with the log's synchronous writes,
                // which callers wait for: commit at most every `APPLY_INTERVAL`, taking all
                // the jobs handed over meanwhile, unless the writer waits for the file or
                // the jobs fill their room.
                let due = last_commit + APPLY_INTERVAL;
                let now = Instant::now();
                let ready =
                    slot.urgent || slot.stop || slot.jobs.len() >= APPLY_JOBS_MAX || untimed();
                if !slot.jobs.is_empty() && (ready || now >= due) {
                    jobs.extend(slot.jobs.drain(..));
                    break;
                }
                let timeout = if slot.jobs.is_empty() {
                    APPLIER_POLL
                } else {
                    due - now
                };
                handoff.changed.wait_for(&mut slot, timeout);
            }
            // The writer may hand the next jobs over while these are committed.
            handoff.changed.notify_all();
        }
        apply(shared, store, &mut jobs);
        last_commit = Instant::now();
        // Emptied outside the hand-over lock: dropping a batch frees its records.
        let spare: Vec<Vec<Queued>> = jobs
            .drain(..)
            .map(|job| {
                let mut batch = job.batch;
                batch.clear();
                batch
            })
            .collect();
        let mut slot = handoff.slot.lock();
        let room = APPLY_JOBS_MAX.saturating_sub(slot.spare.len());
        slot.spare.extend(spare.into_iter().take(room));
        slot.busy = !slot.jobs.is_empty();
        if !slot.busy {
            slot.urgent = false;
        }
        handoff.changed.notify_all();
    }
}

/// Commits the batches of `jobs` to the file in one durable commit, in the order their
/// frames were synced, then raises the applied watermark to the last job's.
fn apply(shared: &Shared, store: &Closing, jobs: &mut [Job]) {
    // A poisoned engine writes nothing more to the file; the log holds the batches.
    if shared.poison_reason().is_some() {
        return;
    }
    let Some(last) = jobs.last() else {
        return;
    };
    let (how, watermark, idle) = (last.how, last.watermark, last.idle);
    let mut writes = Vec::new();
    let mut tables = Vec::new();
    for job in jobs.iter() {
        // The same writes as the frame's: `writes_of` is a function of the batch alone.
        let (w, t, _) = writes_of(&job.batch, fault_point!(shared.faults(), DropOldRemoval));
        writes.extend(w);
        tables.extend(t);
    }
    let mut marked = Vec::new();
    // An acknowledged-on-sync batch carries no token mark and no marker row. The commit
    // records the last job's frame: the file holds every frame up to it.
    match store.commit(&writes, &tables, None, how, &mut marked) {
        Ok(()) => {
            debug_assert!(
                marked.is_empty(),
                "marker batches are applied by the writer"
            );
            if let Some(last) = tables.iter().map(|t| t.ordinal).max() {
                shared.tables().committed(last);
            }
            // The group commits were counted at their frames' syncs: this commit only
            // brings the file up to them.
            shared.progress().applied(watermark);
            if idle {
                shared.index().catch_up();
            }
        }
        Err(why) => {
            shared.poison(why);
        }
    }
}

/// Whether waits cannot end by a timeout: shuttle does not model time (a wait nobody
/// notifies is a deadlock there), so under it every job is applied at once.
fn untimed() -> bool {
    #[cfg(shuttle)]
    if crate::base::sync::in_shuttle() {
        return true;
    }
    false
}
