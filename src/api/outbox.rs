//! The outbox relay: reads the committed messages holders emitted ([`crate::WriteSet::emit`])
//! in id order, and removes them through the writer once they are published.
//!
//! Recording is exactly-once (a message is written in the same transaction as the
//! completion that emitted it); publication is at-least-once (a relay that crashes after
//! publishing and before `mark_sent` is durable publishes again). See `docs/outbox.md`.

use crate::api::engine::Engine;
use crate::api::tables::OutboxView;
use crate::base::sabotage::fault_point;
use crate::base::sync::Arc;
use crate::model::error::TableError;
use crate::runtime::queue::SendRefused;
use crate::runtime::tables::check_limit;
use std::fmt;

/// The relay's handle on the engine's outbox ([`Engine::outbox`]). Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    engine: Engine,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox").finish_non_exhaustive()
    }
}

/// A message in the outbox: its id (issued in the order the engine accepted the write sets
/// that emitted them, never reused, continuing across restarts) and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    id: u64,
    payload: Arc<[u8]>,
}

impl OutboxMessage {
    /// The message's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The bytes emitted.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
}

impl Engine {
    /// The outbox relay's handle.
    ///
    /// ```
    /// use idemkv::{Claim, ClaimOptions, Durability, Engine, WriteSet};
    /// let engine = Engine::builder().durability(Durability::None).open()?;
    /// let Claim::Acquired(lease) = engine.claim(b"msg-1", &ClaimOptions::default())? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// let mut writes = WriteSet::new();
    /// writes.put("balances", b"alice", b"150")?.emit(b"confirmed msg-1")?;
    /// lease.complete_with(b"ok", &writes)?;
    ///
    /// let outbox = engine.outbox();
    /// let pending = outbox.pending(100)?;
    /// assert_eq!(pending[0].payload(), b"confirmed msg-1");
    /// // ... publish them, then:
    /// let ids: Vec<u64> = pending.iter().map(|m| m.id()).collect();
    /// outbox.mark_sent(&ids)?;
    /// assert!(outbox.pending(100)?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn outbox(&self) -> Outbox {
        Outbox {
            engine: self.clone(),
        }
    }
}

impl Outbox {
    /// Up to `limit` (at most 10 000) messages not yet marked sent, in id order.
    ///
    /// Only **committed** messages are returned — durable as the mode promises (fsynced
    /// under `Immediate` and `Buffered`) — so a relay never publishes a message whose
    /// completion a crash could still undo. Messages whose `mark_sent` was accepted are
    /// not returned again, also before that removal is committed. A memory-only engine
    /// returns every message emitted.
    pub fn pending(&self, limit: usize) -> Result<Vec<OutboxMessage>, TableError> {
        check_limit(limit)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let message = |id: u64, payload: Arc<[u8]>| OutboxMessage { id, payload };
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.engine.remote() {
            self.engine.check_tables()?;
            let taken = remote.outbox_pending(limit)?;
            return Ok(taken
                .into_iter()
                .map(|(id, m)| message(id, Arc::from(m)))
                .collect());
        }
        match self.engine.outbox_view(limit)? {
            OutboxView::Memory(first) => {
                Ok(first.into_iter().map(|(id, m)| message(id, m)).collect())
            }
            OutboxView::Durable { sent, snapshot } => {
                let mut out = Vec::new();
                snapshot
                    .messages(|id, payload| {
                        if !sent.contains(&id) {
                            out.push(message(id, Arc::from(payload)));
                        }
                        out.len() < limit
                    })
                    .map_err(|why| TableError::Poisoned(self.engine.shared().poison(why)))?;
                Ok(out)
            }
        }
    }

    /// Removes the messages `ids` (at most 10 000; ids not in the outbox are ignored) once
    /// they are published. The removal goes through the writer: under `Immediate` the call
    /// returns once it is durable; under `Buffered` at once (a crash before its commit
    /// publishes them again: publication is at-least-once). A full writer queue is waited
    /// out.
    pub fn mark_sent(&self, ids: &[u64]) -> Result<(), TableError> {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.engine.remote() {
            check_limit(ids.len())?;
            self.engine.check_tables()?;
            return remote.outbox_sent(ids);
        }
        let seq = self.queue_removal(ids, |s| {
            s.wait_for_room(u64::MAX);
        })?;
        self.engine
            .shared()
            .wait_durable(seq)
            .map_err(TableError::OutcomeUnknown)
    }

    /// The async form of [`Outbox::mark_sent`]: waits for room and durability without
    /// blocking a thread.
    pub async fn mark_sent_async(&self, ids: &[u64]) -> Result<(), TableError> {
        #[cfg(feature = "postgres")]
        if let Some(remote) = self.engine.remote() {
            check_limit(ids.len())?;
            self.engine.check_tables()?;
            return remote.outbox_sent_async(ids).await;
        }
        let seq = loop {
            match self.try_queue_removal(ids)? {
                Some(seq) => break seq,
                None => {
                    self.engine.room(u64::MAX).await;
                }
            }
        };
        self.engine
            .durable(seq)
            .await
            .map_err(TableError::OutcomeUnknown)
    }

    /// Queues the removal, waiting with `wait` while the queue is full; returns the number
    /// to wait for (0: nothing to wait for).
    fn queue_removal(
        &self,
        ids: &[u64],
        wait: impl Fn(&crate::runtime::shared::Shared),
    ) -> Result<u64, TableError> {
        loop {
            match self.try_queue_removal(ids)? {
                Some(seq) => return Ok(seq),
                None => wait(self.engine.shared()),
            }
        }
    }

    /// One attempt: `None` while the queue is full.
    fn try_queue_removal(&self, ids: &[u64]) -> Result<Option<u64>, TableError> {
        check_limit(ids.len())?;
        self.engine.check_tables()?;
        if ids.is_empty() {
            return Ok(Some(0));
        }
        let s = self.engine.shared();
        // Test-only sabotage: the removal is not waited for under a durable mode.
        let waits =
            self.engine.waits_for_durability() && !fault_point!(s.faults(), MarkSentBeforeDurable);
        match s.try_mark_sent(ids) {
            Ok(Some(seq)) if waits => Ok(Some(seq)),
            Ok(Some(_)) => Ok(Some(0)),
            Ok(None) => Ok(None),
            Err(SendRefused::Poisoned(why)) => Err(TableError::Poisoned(why)),
            Err(SendRefused::Closed) => Err(TableError::Closed),
            Err(SendRefused::Full) => Ok(None),
        }
    }
}
