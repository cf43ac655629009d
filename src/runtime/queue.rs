//! The writer's queue: what holders, the sweeper and the relay send the writer
//! ([`Queued`], [`Op`]), why a send can be refused, and the writes a batch of it commits.

use crate::base::sync::Arc;
use crate::model::codec::Encoded;
use crate::store::batch::Batch;
use crate::store::storage::Write;
use std::time::Instant;

/// One operation in the writer's queue, with its durability sequence number (0 for the
/// shutdown message and for the barrier that wakes the writer to count a voided number,
/// which have none) and, under `Buffered`, when it was acknowledged: the
/// writer commits it within `max_delay` of that instant plus one commit.
pub(crate) struct Queued {
    pub(crate) seq: u64,
    pub(crate) op: Op,
    /// Writes to the application tables and the outbox that ride with `op`: committed in
    /// the same transaction as its record, or not at all.
    pub(crate) tables: Option<Box<Batch>>,
    pub(crate) acked_at: Option<Instant>,
}

impl Queued {
    pub(crate) fn barrier(seq: u64) -> Self {
        Queued {
            seq,
            op: Op::Barrier,
            tables: None,
            acked_at: None,
        }
    }
}

/// One queued operation. Operations of one key are queued under its stripe lock, so they
/// reach the writer in the order their state changes happened.
// `Put` carries its record inline (`codec::Encoded`) on purpose: boxing it would be the
// allocation per record that the inline record exists to avoid.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Op {
    /// Store `value` (a record encoded by the caller, so the writer's one thread does only
    /// B-tree work) under `token`, removing the key's previous record at `old`.
    Put {
        token: u64,
        old: Option<u64>,
        value: Encoded,
        /// In the same commit, remove the marker row `(hash, token)`: a claim acquires a key
        /// whose marker ended or that it asked to run again.
        drop_marker: Option<(u64, u64)>,
    },
    /// Remove the record under `token`.
    Delete { token: u64 },
    /// No record: only the operation's table writes (an outbox relay's `mark_sent`).
    TablesOnly,
    /// Remove the expired completion under `token` and store the marker row it leaves under
    /// `hash`; after the commit, settle the pending marker in memory.
    Forget {
        token: u64,
        hash: u64,
        check: u64,
        marker_retention_ms: u64,
    },
    /// Remove the marker row under `hash` if it is the completion `token`'s.
    DropMarker { hash: u64, token: u64 },
    /// Commit everything queued before it (flush, token reservation).
    Barrier,
    /// Commit what is queued and stop.
    Shutdown,
}

/// The record writes of `batch` in the order a commit applies them (token order, each
/// token's run collapsed), its table writes in queue order, and how many record writes it
/// queued (what the writer's rate counts, whatever the collapse saves).
pub(crate) fn writes_of<'a>(
    batch: &'a [Queued],
    drop_old_removal: bool,
) -> (Vec<Write<'a>>, Vec<&'a Batch>, usize) {
    let mut writes: Vec<Write> = Vec::with_capacity(batch.len());
    for q in batch {
        match &q.op {
            Op::Put {
                token,
                old,
                value,
                drop_marker,
                ..
            } => {
                if let Some((hash, token)) = drop_marker {
                    writes.push(Write::DropMarker {
                        hash: *hash,
                        token: *token,
                    });
                }
                writes.push(Write::Put {
                    token: *token,
                    // Test-only sabotage: leave the replaced record in the file.
                    old: old.filter(|_| !drop_old_removal),
                    value: value.as_slice(),
                });
            }
            Op::Delete { token } => writes.push(Write::Delete { token: *token }),
            Op::Forget {
                token,
                hash,
                check,
                marker_retention_ms,
            } => writes.push(Write::Forget {
                token: *token,
                hash: *hash,
                check: *check,
                marker_retention_ms: *marker_retention_ms,
            }),
            Op::DropMarker { hash, token } => writes.push(Write::DropMarker {
                hash: *hash,
                token: *token,
            }),
            Op::TablesOnly | Op::Barrier | Op::Shutdown => {}
        }
    }
    // Table writes keep their queue order (which is their acceptance order): a later
    // holder may have built on an earlier one's writes.
    let tables: Vec<&Batch> = batch.iter().filter_map(|q| q.tables.as_deref()).collect();
    // Token order makes the B-tree work sequential: claims already arrive nearly in
    // order, and the sweeper's deletions come stripe by stripe, scattered over the tree.
    // The sort is stable, so the writes of one token keep their queue order; writes of
    // different tokens touch different records (an `old` removal only deletes a token
    // that no later write recreates), so reordering them changes nothing committed.
    // A marker row's writes carry its completion's token, and a later marker of the same
    // key has a larger token, so they too keep their order.
    writes.sort_by_key(Write::token);
    // Operations, as queued: the writer's rate (admission) and the counters count these,
    // whatever the collapse below saves.
    let ops = writes.len();
    collapse(&mut writes);
    (writes, tables, ops)
}
/// Why an operation could not be queued.
pub(crate) enum SendRefused {
    Full,
    Poisoned(Arc<str>),
    Closed,
}

/// Collapses each run of record writes of one token in `writes` (sorted by token, stably)
/// into the last one: a claim's InFlight record and its completion in the same batch cost
/// one B-tree insert, not two. A later `Put` of the same token replaces the earlier one's
/// value and keeps its `old` removal; it is merged only when it removes nothing else itself
/// (`old` is none or its own token), so every removal the batch asked for still happens,
/// in the same place in token order. What the transaction commits is unchanged: the
/// earlier value was overwritten within it.
pub(crate) fn collapse(writes: &mut Vec<Write<'_>>) {
    writes.dedup_by(|later, earlier| match (later, earlier) {
        (
            Write::Put {
                token,
                old: None,
                value,
            },
            Write::Put {
                token: kept,
                value: kept_value,
                ..
            },
        ) if token == kept => {
            *kept_value = value;
            true
        }
        (
            Write::Put {
                token,
                old: Some(old),
                value,
            },
            Write::Put {
                token: kept,
                value: kept_value,
                ..
            },
        ) if token == kept && old == token => {
            *kept_value = value;
            true
        }
        _ => false,
    });
}
