//! The background writer: drains the queue, commits everything pending in one redb write
//! transaction (group commit), then publishes and acknowledges.
//!
//! Architecture invariant: the writer never holds a stripe lock during I/O. It takes stripe
//! locks only after a commit, to publish completions.
//! Architecture invariant: a failed commit poisons the engine before any caller learns of it,
//! so nothing after the failure is acknowledged. A panic on the writer thread counts as a
//! failed commit: it poisons the engine as it unwinds and fails every pending acknowledgement.

use crate::codec::{self, Record};
use crate::constants::{ACK_POLL, BATCH_OPS_MAX};
use crate::engine::{Sabotage, Shared};
use crate::options::Durability;
use crate::stats::bump;
use crate::storage::{Closing, Write};
use crate::sync::channel::{bounded, Receiver, RecvTimeoutError, Sender};
use crate::sync::{Arc, Ordering};
use std::time::Instant;

/// Tells one waiting caller how its write ended.
pub(crate) type Ack = Sender<Result<(), Arc<str>>>;

/// One queued operation. Operations of one key are queued under its stripe lock, so they
/// reach the writer in the order their state changes happened.
pub(crate) enum Op {
    /// Store `record` under `token`, removing the key's previous record at `old`.
    Put {
        token: u64,
        old: Option<u64>,
        record: Record,
        /// After the commit, mark the key's completion with this token as visible (the key
        /// is the record's own).
        publish: bool,
        ack: Option<Ack>,
    },
    /// Remove the record under `token`.
    Delete { token: u64, ack: Option<Ack> },
    /// Commit everything queued before it (flush, token reservation).
    Barrier { ack: Ack },
    /// Commit what is queued and stop.
    Shutdown,
}

impl Op {
    /// Where the outcome of this operation is reported, if anyone waits for it.
    fn ack(&self) -> Option<&Ack> {
        match self {
            Op::Put { ack, .. } | Op::Delete { ack, .. } => ack.as_ref(),
            Op::Barrier { ack } => Some(ack),
            Op::Shutdown => None,
        }
    }
}

pub(crate) fn spawn(
    shared: Arc<Shared>,
    store: Arc<Closing>,
    rx: Receiver<Op>,
) -> std::io::Result<crate::sync::JoinHandle<()>> {
    crate::sync::spawn("idemkv-writer", move || Writer { shared, store, rx }.run())
}

struct Writer {
    shared: Arc<Shared>,
    store: Arc<Closing>,
    rx: Receiver<Op>,
}

/// The writer's batch, and what happens to it if the writer thread panics: the engine is
/// poisoned first (so nothing more is acknowledged and waiters wake), then every operation
/// of the batch and of the queue is acknowledged with the failure. Without this a panic
/// would leave the engine reporting `Closed` and callers waiting on acknowledgements and
/// publications that never come.
struct Batch<'a> {
    writer: &'a Writer,
    ops: Vec<Op>,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let shared = &self.writer.shared;
        let why = shared.poison("the writer thread panicked".to_string());
        let queued = std::iter::from_fn(|| self.writer.rx.try_recv().ok());
        for op in self.ops.drain(..).chain(queued) {
            if let Some(ack) = op.into_ack() {
                let _ = ack.send(Err(why.clone()));
            }
        }
        shared.set_writer_stopped();
    }
}

impl Op {
    fn into_ack(self) -> Option<Ack> {
        match self {
            Op::Put { ack, .. } | Op::Delete { ack, .. } => ack,
            Op::Barrier { ack } => Some(ack),
            Op::Shutdown => None,
        }
    }
}

impl Writer {
    fn run(self) {
        let mut batch = Batch {
            writer: &self,
            ops: Vec::with_capacity(BATCH_OPS_MAX),
        };
        loop {
            let Ok(first) = self.rx.recv() else {
                self.shared.set_writer_stopped();
                return;
            };
            batch.ops.push(first);
            self.gather(&mut batch.ops);
            // Holders waiting for room in a full queue can go on.
            self.shared.notify_room();
            let stop = batch.ops.iter().any(|op| matches!(op, Op::Shutdown));
            self.commit(&mut batch.ops);
            if stop {
                self.shared.set_writer_stopped();
                return;
            }
        }
    }

    /// Adds to `batch` what is queued now (`Immediate`) or arrives within the delay
    /// (`Buffered`), up to the batch limit; a barrier or shutdown ends the batch at once.
    fn gather(&self, batch: &mut Vec<Op>) {
        let urgent = |op: &Op| matches!(op, Op::Barrier { .. } | Op::Shutdown);
        if batch.last().is_some_and(urgent) {
            return;
        }
        let deadline = match self.shared.cfg.durability {
            Durability::Buffered { max_delay } => Instant::now().checked_add(max_delay),
            _ => None,
        };
        while batch.len() < BATCH_OPS_MAX {
            let next = match deadline {
                Some(deadline) => match self.rx.recv_deadline(deadline) {
                    Ok(op) => op,
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
                },
                None => match self.rx.try_recv() {
                    Ok(op) => op,
                    Err(_) => return,
                },
            };
            let end = urgent(&next);
            batch.push(next);
            if end {
                return;
            }
        }
    }

    fn commit(&self, batch: &mut Vec<Op>) {
        #[cfg(idemkv_sabotage)]
        if self.shared.writer_panic.swap(false, Ordering::AcqRel) {
            panic!("sabotage: the writer panics on purpose");
        }
        // Test-only sabotages: acknowledge or publish before the commit returns, so that the
        // durability checks can show they catch a writer that breaks this order.
        let ack_early = self.shared.sabotaged(Sabotage::AckBeforeCommit);
        let publish_early = self.shared.sabotaged(Sabotage::PublishBeforeCommit);
        if ack_early {
            for op in batch.iter() {
                if let Some(ack) = op.ack() {
                    let _ = ack.send(Ok(()));
                }
            }
        }
        if publish_early {
            self.publish(batch);
        }
        #[cfg(idemkv_sabotage)]
        self.shared.commit_gate.pass();
        let result = match self.shared.poison_reason() {
            Some(why) => Err(why),
            None => self.write(batch),
        };
        if result.is_ok() && !publish_early {
            self.publish(batch);
        }
        for op in batch.drain(..) {
            if let Some(ack) = op.into_ack().filter(|_| !ack_early) {
                // A caller that stopped waiting has dropped its receiver; nothing to tell.
                let _ = ack.send(result.clone());
            }
        }
    }

    fn write(&self, batch: &[Op]) -> Result<(), Arc<str>> {
        let mut writes: Vec<Write> = batch
            .iter()
            .filter_map(|op| match op {
                Op::Put {
                    token, old, record, ..
                } => Some(Write::Put {
                    token: *token,
                    // Test-only sabotage: leave the replaced record in the file.
                    old: old.filter(|_| !self.shared.sabotaged(Sabotage::DropOldRemoval)),
                    value: codec::encode(*token, record),
                }),
                Op::Delete { token, .. } => Some(Write::Delete { token: *token }),
                Op::Barrier { .. } | Op::Shutdown => None,
            })
            .collect();
        // Token order makes the B-tree work sequential: claims already arrive nearly in
        // order, and the sweeper's deletions come stripe by stripe, scattered over the tree.
        // The sort is stable, so the writes of one token keep their queue order; writes of
        // different tokens touch different records (an `old` removal only deletes a token
        // that no later write recreates), so reordering them changes nothing committed.
        writes.sort_by_key(Write::token);
        // Read after the batch was received: every token in it is below `next`, so this
        // mark covers them all.
        let hwm = self.shared.tokens.reserve_target();
        if writes.is_empty() && hwm.is_none() {
            return Ok(());
        }
        let started = crate::observe::commit_started();
        match self.store.commit(&writes, hwm) {
            Ok(()) => {
                if let Some(hwm) = hwm {
                    self.shared.tokens.raise_limit(hwm);
                }
                let c = &self.shared.counters;
                bump(&c.commits);
                c.committed_ops
                    .fetch_add(writes.len() as u64, Ordering::Relaxed);
                c.batch_max
                    .fetch_max(writes.len() as u64, Ordering::Relaxed);
                crate::observe::committed(&self.shared, started, writes.len());
                Ok(())
            }
            Err(why) => Err(self.shared.poison(why)),
        }
    }

    /// Makes committed completions visible and wakes their waiters.
    fn publish(&self, batch: &[Op]) {
        for op in batch {
            let Op::Put {
                token,
                record,
                publish: true,
                ..
            } = op
            else {
                continue;
            };
            let key = &record.key.0[..];
            let (mut shard, changed, k) = self.shared.index.lock(key);
            shard.publish(k, *token);
            drop(shard);
            changed.notify_all();
        }
    }
}

/// A receiver for one acknowledgement.
pub(crate) fn ack_pair() -> (Ack, Receiver<Result<(), Arc<str>>>) {
    bounded(1)
}

/// Waits for an acknowledgement; a writer that stopped first counts as a failure.
pub(crate) fn wait_ack(
    shared: &Shared,
    rx: &Receiver<Result<(), Arc<str>>>,
) -> Result<(), Arc<str>> {
    // A writer that died poisoned the engine first: report why.
    let stopped = || {
        shared
            .poison_reason()
            .unwrap_or_else(|| Arc::from("the engine closed before confirming"))
    };
    loop {
        match rx.recv_timeout(ACK_POLL) {
            Ok(result) => return result,
            Err(RecvTimeoutError::Disconnected) => return Err(stopped()),
            // An operation that raced `close` may sit in the queue after the writer left.
            Err(RecvTimeoutError::Timeout) if shared.writer_stopped() => {
                return rx.try_recv().unwrap_or_else(|_| Err(stopped()));
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}
