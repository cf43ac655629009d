//! The background writer: drains the queue, commits everything pending in one redb write
//! transaction (group commit), then publishes the durability watermark (`progress.rs`).
//! It does not publish the batch's completions one by one: the watermark does, in each
//! stripe as it is next locked (`publication.rs`).
//!
//! Architecture invariant: the writer (and the applier) never holds a stripe lock during
//! I/O. They take stripe locks only after a commit: to settle markers, and, when the queue
//! is empty, to publish completions nobody else has.
//! Architecture invariant: a failed commit poisons the engine before any caller learns of it,
//! so nothing after the failure is acknowledged. A panic on the writer thread counts as a
//! failed commit: it poisons the engine as it unwinds, which wakes every waiter to fail.
//! With the commit log a batch is committed once its frame is synced: its callers are
//! acknowledged before the batch is applied to the file, which the applier (`apply.rs`)
//! does while the writer syncs the next frame. A failed apply poisons the engine for what
//! follows (the batches acknowledged by then replay from the log at the next open).

use crate::base::sabotage::{fault_hook, fault_point};
use crate::base::sync::channel::Receiver;
use crate::base::sync::{Arc, Ordering};
use crate::index::stats::bump;
use crate::model::settings::Durability;
use crate::runtime::apply::{Applier, Job};
use crate::runtime::constants::BATCH_OPS_MAX;
use crate::runtime::gather::Window;
use crate::runtime::progress::Tracker;
#[cfg(test)]
use crate::runtime::queue::collapse;
use crate::runtime::queue::{writes_of, Op, Queued};
use crate::runtime::shared::Shared;
use crate::store::commit_log::CommitLog;
#[cfg(test)]
use crate::store::storage::Write;
use crate::store::storage::{Closing, Durable, Marked};
use std::time::{Duration, Instant};

pub(crate) fn spawn(
    shared: Arc<Shared>,
    store: Arc<Closing>,
    log: Option<CommitLog>,
    rx: Receiver<Queued>,
) -> std::io::Result<crate::base::sync::JoinHandle<()>> {
    // Only a logging writer acknowledges a batch before it reaches the file, so only it has
    // an apply to overlap with its next sync.
    let applier = match log {
        Some(_) => Some(Applier::spawn(shared.clone(), store.clone())?),
        None => None,
    };
    crate::base::sync::spawn("idemkv-writer", move || {
        Writer {
            shared,
            store,
            log,
            applier,
            rx,
            tracker: Tracker::default(),
            voided: Vec::new(),
            marked: Vec::new(),
        }
        .run()
    })
}

struct Writer {
    shared: Arc<Shared>,
    store: Arc<Closing>,
    /// The commit log, when group commits are made durable by it.
    log: Option<CommitLog>,
    /// With the commit log: applies the batches acknowledged on their frame's sync.
    applier: Option<Applier>,
    rx: Receiver<Queued>,
    tracker: Tracker,
    /// Scratch space for the numbers voided since the last commit.
    voided: Vec<u64>,
    /// Scratch space for the marker rows the current commit stored.
    marked: Vec<Marked>,
}

/// Poisons the engine if the writer thread panics, so that nothing more is acknowledged and
/// every waiter wakes to fail. Without this a panic would leave callers waiting for a
/// watermark and publications that never come.
struct PanicGuard<'a>(&'a Shared);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poison("the writer thread panicked".to_string());
            self.0.set_writer_stopped();
        }
    }
}

impl Writer {
    fn run(mut self) {
        let shared = self.shared.clone();
        let _guard = PanicGuard(&shared);
        let mut batch = Vec::with_capacity(BATCH_OPS_MAX);
        loop {
            let Ok(first) = self.rx.recv() else {
                // Stopping either way: a failed apply has poisoned the engine already.
                let _ = self.drain_applier();
                self.shared.set_writer_stopped();
                return;
            };
            batch.push(first);
            self.gather(&mut batch);
            // Holders waiting for room in a full queue can go on.
            self.shared.notify_room();
            let stop = batch.iter().any(|q| matches!(q.op, Op::Shutdown));
            let handed = self.commit(&mut batch, stop);
            if stop {
                // The last commit's responses leave memory too.
                self.shared.index().catch_up();
                self.shared.set_writer_stopped();
                return;
            }
            // Nothing waits to be committed: publish what the callers have not, so that
            // responses the file now holds leave memory. Under load the callers do it, as
            // they lock the stripes anyway, and the writer goes on to the next batch. A
            // batch handed to the applier with the queue empty is published by the
            // applier, once the file holds it.
            if !handed && self.rx.is_empty() {
                self.shared.index().catch_up();
            }
        }
    }

    /// Waits until the applier has applied every batch handed to it: before the writer
    /// commits to the file itself or acknowledges a batch as applied, and before it stops.
    /// `Err`: an apply failed, and the engine is poisoned (nothing more is acknowledged).
    fn drain_applier(&self) -> Result<(), Arc<str>> {
        // Test-only sabotage: go on while the applier may still be applying.
        if fault_point!(self.shared.faults(), SkipApplierDrain) {
            return Ok(());
        }
        if let Some(applier) = &self.applier {
            applier.drain();
        }
        self.shared.poison_reason().map_or(Ok(()), Err)
    }

    /// Adds to `batch` what is queued now (`Immediate`) or arrives within the delay
    /// (`Buffered`), up to the batch limit; a barrier or shutdown ends the batch at once.
    fn gather(&self, batch: &mut Vec<Queued>) {
        let window = match self.shared.cfg().durability {
            Durability::Buffered { max_delay } => Some(Window {
                // Counted from the oldest operation's acknowledgement, not from when the
                // writer got to it: an operation that waited behind a commit is not kept
                // waiting again.
                oldest: batch
                    .first()
                    .and_then(|q| q.acked_at)
                    .unwrap_or_else(Instant::now),
                max_delay,
                secs_per_op: self.shared.admission().secs_per_op(),
                // Under `Buffered` admission, a batch as large as the claims' limit means
                // new claims are being refused until it commits: waiting out the delay
                // would only stall them.
                ops_max: self.shared.admission().claims_max(),
            }),
            _ => None,
        };
        crate::runtime::gather::gather(&self.rx, batch, window);
    }

    /// Commits `batch`; `closing`: it holds the shutdown, the engine's last commit. Returns
    /// whether the batch was handed to the applier (acknowledged on its frame's sync).
    fn commit(&mut self, batch: &mut Vec<Queued>, closing: bool) -> bool {
        fault_hook!(self.shared.faults().writer_may_panic(););
        // Callers of later operations sleep apart from this batch's, so that its
        // publication wakes only the callers it made durable.
        if let Some(highest) = batch.iter().map(|q| q.seq).max().filter(|&s| s > 0) {
            self.shared.progress().announce(highest);
        }
        // Test-only sabotages: acknowledge or publish before the commit returns, so that the
        // durability checks can show they catch a writer that breaks this order.
        let ack_early = fault_point!(self.shared.faults(), AckBeforeCommit);
        if ack_early {
            self.advance(batch, false);
            fault_hook!(self.hold_early_ack(););
        }
        fault_hook! {
            if fault_point!(self.shared.faults(), PublishBeforeCommit) {
                let last = batch.iter().map(|q| q.seq).max().unwrap_or(0);
                self.shared.progress().marks().show_early(last);
            }
            self.shared.faults().commit_gate.pass();
        }
        // The writer's rate, which admission and the gathering deadline use, is measured
        // over the whole batch: the commit, and the settling, acknowledging and freeing
        // after it (before completions were published by the watermark, this work took as
        // long again as the commit for a large batch). Measured over the commit alone,
        // the rate came out about twice the writer's real one, and admitted backlogs that
        // took `2 × max_delay` and more to become durable. On the engine's clock, so a test
        // can make the cycle as long as it needs.
        let began_ns = self.shared.mono_ns();
        // A poisoned engine commits nothing more: the waiters of this batch wake to fail
        // (poisoning woke them) and the watermark stays below them.
        let written = match self.shared.poison_reason() {
            None => self.write(batch, closing, ack_early),
            Some(why) => Err(why),
        };
        match written {
            Ok(Written {
                acked: Acked::OnSync { how },
                ..
            }) => {
                // Acknowledged when its frame was synced: the applier takes the batch to
                // the file while this thread gathers and syncs the next one.
                let job = Job {
                    batch: std::mem::take(batch),
                    how,
                    watermark: self.tracker.watermark(),
                    idle: self.rx.is_empty(),
                };
                match &self.applier {
                    Some(applier) => *batch = applier.hand_off(job),
                    // Not reached: only a writer with an applier acknowledges on the sync.
                    // Were it reached, the batch would stay out of the file while it is
                    // acknowledged: the engine stops acknowledging instead.
                    None => {
                        self.shared
                            .poison("the writer has no applier for a logged batch".into());
                    }
                }
            }
            Ok(Written {
                acked: Acked::AfterApply,
                ..
            }) => {
                fault_hook!(self.shared.faults().after_commit_gate.pass(););
                self.made_durable(batch);
                // Before the watermark moves: a claim that waits for its marker's commit
                // finds it settled.
                self.settle_markers();
                if ack_early {
                    // Acknowledged before the commit by sabotage: the file holds the batch
                    // now, and its completions drop the responses they keep in memory as
                    // their stripes are next locked.
                    self.shared.progress().applied(self.tracker.watermark());
                } else {
                    self.advance(batch, true);
                }
            }
            Err(_) => {}
        }
        batch.clear();
        if let Ok(Written { ops, .. }) = written {
            let took_ns = self.shared.mono_ns().saturating_sub(began_ns);
            self.shared
                .admission()
                .committed(ops, Duration::from_nanos(took_ns));
        }
        matches!(
            written,
            Ok(Written {
                acked: Acked::OnSync { .. },
                ..
            })
        )
    }

    /// Test-only, for the `AckBeforeCommit` sabotage: with the commit log, holds the writer
    /// for `ACK_EARLY_HOLD` between the early acknowledgement and the batch's frame. The
    /// frame is the commit (a kill after its write loses nothing), and it follows the
    /// publication by microseconds: a caller the publication woke could report its
    /// acknowledgement before the write only if it was already running, which depended on
    /// wake-ups that had nothing to do with this batch (an apply that woke every waiter just
    /// before). The hold gives the acknowledged callers a commit's time to go on whoever wakes
    /// them and however they are scheduled, so a kill can catch the sabotage. Not under
    /// shuttle, whose schedules find the window without it.
    #[cfg(idemkv_sabotage)]
    fn hold_early_ack(&self) {
        #[cfg(not(shuttle))]
        if self.log.is_some() {
            std::thread::sleep(crate::runtime::constants::ACK_EARLY_HOLD);
        }
    }

    /// Records how long the batch's oldest `Buffered` operation waited for its fsync.
    fn made_durable(&self, batch: &[Queued]) {
        if let Some(oldest) = batch.iter().filter_map(|q| q.acked_at).min() {
            self.shared.admission().durable_after(oldest.elapsed());
        }
    }

    /// Counts the batch's operations (and any voided numbers) as durable and publishes the
    /// watermark: one store and one wake for the whole batch, its completions included.
    /// `applied`: the file holds the batch too (the applied watermark moves first, so a
    /// caller the wake sends to a completion's stripe settles it in one step).
    fn advance(&mut self, batch: &[Queued], applied: bool) {
        self.shared.progress().take_voided(&mut self.voided);
        let seqs = batch.iter().map(|q| q.seq).filter(|&seq| seq != 0);
        for seq in seqs.chain(self.voided.drain(..)) {
            self.tracker.done(seq);
        }
        let watermark = self.tracker.watermark();
        if applied {
            self.shared.progress().applied(watermark);
        }
        self.shared.progress().publish(watermark);
    }

    /// Commits the batch, or stages it and leaves it to the applier; says when its callers
    /// were acknowledged. `acked`: they were before the call (sabotage).
    fn write(&mut self, batch: &[Queued], closing: bool, acked: bool) -> Result<Written, Arc<str>> {
        let (writes, tables, ops) =
            writes_of(batch, fault_point!(self.shared.faults(), DropOldRemoval));
        // Read after the batch was received: every token in it is below `next`, so this
        // mark covers them all.
        let hwm = self.shared.tokens().reserve_target();
        // A close with a log checkpoints, even nothing: the file is then complete and
        // says so (its log is no longer active), and stands without the log.
        if ops == 0 && tables.is_empty() && hwm.is_none() && !(closing && self.log.is_some()) {
            // Acknowledged as applied (a flush's barrier alone): so is everything handed
            // over before it, or the engine is poisoned.
            self.drain_applier()?;
            return Ok(Written {
                acked: Acked::AfterApply,
                ops,
            });
        }
        // The commit's span, for `Stats::commit_max_us` and the latency metric: from the
        // first write (to the log, or to the file) to the return of the last fsync, or to
        // the end of the apply for a batch acknowledged on its frame's sync.
        let began = Instant::now();
        let how = match &mut self.log {
            None => Durable::Yes,
            Some(log) => log
                .stage(&writes, &tables, hwm, closing)
                .map_err(|why| self.shared.poison(why))?,
        };
        // A logged batch is durable once its frame's fdatasync returned: its callers are
        // acknowledged now, and the applier takes the batch to the file, so that the ones
        // who go on queue their next writes in time for the next batch instead of the one
        // after. The watermark publishes its completions too; they keep their responses in
        // memory until the applied watermark passes them (a replay of a completion without
        // one reads the file, which does not hold it yet). A batch whose waiters expect the
        // apply's effects when they wake is acknowledged after it: a token mark (claims
        // waiting for tokens look for the raised limit) and marker rows (settled after the
        // apply).
        let early = matches!(how, Durable::Logged { .. })
            && self.applier.is_some()
            && !acked
            && hwm.is_none()
            && !batch.iter().any(touches_markers);
        if early {
            // The applier may have failed while the frame was synced: a poisoned engine
            // acknowledges nothing more.
            if let Some(why) = self.shared.poison_reason() {
                return Err(why);
            }
            self.made_durable(batch);
            // The group commit is the frame: counted before its callers are told, so a
            // caller that returns sees it in `Stats`.
            committed(&self.shared, began.elapsed(), ops);
            // Test-only hook: held after the frame's sync, before the watermark moves.
            fault_hook!(self.shared.faults().after_commit_gate.pass(););
            self.advance(batch, false);
            return Ok(Written {
                acked: Acked::OnSync { how },
                ops,
            });
        }
        // The file takes its commits in frame order: the applier's batch first.
        self.drain_applier()?;
        self.marked.clear();
        match self
            .store
            .commit(&writes, &tables, hwm, how, &mut self.marked)
        {
            Ok(()) => {
                if self.log.as_mut().is_some_and(|log| log.committed(how)) {
                    bump(&self.shared.counters().log_checkpoints);
                }
                // The store renewed its snapshot in the commit: reads of the application
                // tables find these writes there from now on, not in the overlay.
                if let Some(last) = tables.iter().map(|t| t.ordinal).max() {
                    self.shared.tables().committed(last);
                }
                if let Some(hwm) = hwm {
                    self.shared.tokens().raise_limit(hwm);
                }
                committed(&self.shared, began.elapsed(), ops);
                Ok(Written {
                    acked: Acked::AfterApply,
                    ops,
                })
            }
            Err(why) => Err(self.shared.poison(why)),
        }
    }

    /// Settles the markers whose rows the commit stored (or drops those whose record was
    /// gone), and wakes the claims waiting on their stripes: each stripe is locked and
    /// notified once per batch.
    fn settle_markers(&mut self) {
        if self.marked.is_empty() {
            return;
        }
        let index = &self.shared.index();
        self.marked.sort_by_key(|m| index.stripe_of_hash(m.hash));
        for group in self
            .marked
            .chunk_by(|a, b| index.stripe_of_hash(a.hash) == index.stripe_of_hash(b.hash))
        {
            let Some(stripe) = group
                .first()
                .and_then(|m| index.stripe_at(index.stripe_of_hash(m.hash)))
            else {
                continue;
            };
            let mut shard = stripe.lock();
            let mut settled = false;
            for m in group {
                settled |= shard.settle_marker(m.hash, m.token, m.row.as_ref());
            }
            drop(shard);
            if settled {
                stripe.notify_changed();
            }
        }
        self.marked.clear();
    }
}

/// Counts a commit of `ops` record writes that succeeded and took `took` (from its first
/// write to its last fsync, or, for a batch acknowledged on its frame's sync, the frame's
/// write and the apply, without the wait for the applier between them).
pub(crate) fn committed(shared: &Shared, took: Duration, ops: usize) {
    let c = shared.counters();
    bump(&c.commits);
    c.committed_ops.fetch_add(ops as u64, Ordering::Relaxed);
    c.batch_max.fetch_max(ops as u64, Ordering::Relaxed);
    let took_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    c.commit_max_us.fetch_max(took_us, Ordering::Relaxed);
    crate::runtime::observe::committed(
        shared.observer(),
        shared.counters(),
        || shared.queued(),
        took,
        ops,
    );
}

/// A committed batch: when its callers were acknowledged, and how many operations it held.
#[derive(Debug, Clone, Copy)]
struct Written {
    acked: Acked,
    /// Record writes as queued, before the collapse: what the writer's rate counts.
    ops: usize,
}

/// When a committed batch's callers were acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acked {
    /// When its log frame's fdatasync returned; the applier takes it to the file, staged
    /// as `how`.
    OnSync { how: Durable },
    /// After the commit (the only way without the log).
    AfterApply,
}

/// Whether a queued operation writes or drops a marker row (settled only after the apply).
fn touches_markers(q: &Queued) -> bool {
    matches!(
        q.op,
        Op::Forget { .. }
            | Op::DropMarker { .. }
            | Op::Put {
                drop_marker: Some(_),
                ..
            }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(token: u64, old: Option<u64>, value: &[u8]) -> Write<'_> {
        Write::Put { token, old, value }
    }

    fn shown(writes: &[Write<'_>]) -> Vec<String> {
        writes.iter().map(|w| format!("{w:?}")).collect()
    }

    /// A queued operation carries a small record inline, so each queue slot and batch entry
    /// is this large; the queue is allocated whole at open. Growing it is a decision.
    #[test]
    fn a_queued_operation_stays_within_its_size() {
        let size = std::mem::size_of::<Queued>();
        assert!(size <= 328, "a queued operation takes {size} bytes");
    }

    #[test]
    fn a_claim_and_its_completion_in_one_batch_are_one_insert_keeping_the_removal() {
        let mut writes = vec![
            put(3, None, b"claim-3"),
            put(3, None, b"done-3"),
            // A takeover of token 2, then its completion: token 2's record still goes.
            put(5, Some(2), b"claim-5"),
            put(5, None, b"done-5"),
            put(7, None, b"claim-7"),
        ];
        collapse(&mut writes);
        assert_eq!(
            shown(&writes),
            shown(&[
                put(3, None, b"done-3"),
                put(5, Some(2), b"done-5"),
                put(7, None, b"claim-7"),
            ])
        );
    }

    #[test]
    fn writes_that_remove_or_are_not_puts_are_kept_in_order() {
        let mut writes = vec![
            put(4, None, b"claim-4"),
            // A later write of the same token that removes another record is not merged.
            put(4, Some(1), b"again-4"),
            Write::Delete { token: 4 },
            put(4, None, b"after-delete"),
            Write::Forget {
                token: 6,
                hash: 9,
                check: 9,
                marker_retention_ms: 1,
            },
            put(6, None, b"after-forget"),
        ];
        let before = shown(&writes);
        collapse(&mut writes);
        assert_eq!(shown(&writes), before);
    }
}
