//! Rebuilding the index from the file on open.
//!
//! Every record is checksummed in full, but only its head is decoded: responses stay in the
//! file. Expired completions are deleted (with markers on, a completion whose marker window
//! is still open becomes a marker, as the sweeper would have made it), InFlight records of
//! the dead process are made ready for takeover, markers are loaded (ended ones deleted),
//! and the token mark is made durable above every token the file has seen before the engine
//! serves anything. An engine opened without markers neither loads nor deletes marker rows.

use crate::base::clock::{duration_ms, Time};
use crate::base::sync::{Mutex, Ordering};
use crate::index::stats::Counters;
use crate::index::stripes::Index;
use crate::model::codec::{self, HeadState};
use crate::model::constants::TOKEN_RESERVE;
use crate::model::error::OpenError;
use crate::model::machine::{self, MarkerRules, Now, Recovered, Reopen};
use crate::model::marker::MarkerId;
use crate::model::settings::Recovery;
use crate::runtime::constants::{RECOVERY_PRESIZE_MAX, RECOVERY_THREADS_MAX};
use crate::store::storage::{Durable, Store, Write};
use std::time::Duration;

/// What one scan thread found besides the slots it inserted.
#[derive(Default)]
struct Found {
    stale: Vec<u64>,
    /// Completions past their retention that leave a marker: `(token, id)`.
    forgotten: Vec<(u64, MarkerId)>,
    max_token: u64,
    scanned: u64,
    /// InFlight records past their reap instant, deleted instead of loaded.
    reaped: u64,
}

/// A completion's head, copied (`None` for an InFlight record's).
fn completed_head(state: &HeadState) -> Option<HeadState> {
    match *state {
        HeadState::Completed {
            attempt,
            completed_wall_ms,
            expires_wall_ms,
        } => Some(HeadState::Completed {
            attempt,
            completed_wall_ms,
            expires_wall_ms,
        }),
        HeadState::InFlight { .. } => None,
    }
}

impl Found {
    /// A completion past its retention: it becomes its `marker` (loaded now, the record
    /// forgotten in the cleanup commit), or without one is deleted.
    fn expired(&mut self, index: &Index, token: u64, marker: Option<crate::model::marker::Marker>) {
        let Some(marker) = marker else {
            self.stale.push(token);
            return;
        };
        self.forgotten.push((
            token,
            MarkerId {
                hash: marker.hash,
                check: marker.check,
            },
        ));
        let stripe = index.stripe_of_hash(marker.hash);
        if let Some(stripe) = index.stripe_at(stripe) {
            stripe.lock().load_marker(marker);
        }
    }

    /// Adds what another scan thread found.
    fn merge(&mut self, mut other: Found) {
        self.stale.append(&mut other.stale);
        self.forgotten.append(&mut other.forgotten);
        self.max_token = self.max_token.max(other.max_token);
        self.scanned += other.scanned;
        self.reaped += other.reaped;
    }
}

/// What recovery reads of the engine's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecoverySettings {
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) marker_retention: Option<Duration>,
    pub(crate) recovery: Recovery,
}

/// Loads every record into the index and makes the token mark durable above every token
/// the file has seen. Returns the first token to issue.
pub(crate) fn recover(
    store: &Store,
    b: &RecoverySettings,
    index: &Index,
    time: &Time,
    counters: &Counters,
) -> Result<u64, OpenError> {
    let (now_ns, now_wall_ns) = time.now();
    let records = store.len()?;
    presize(index, records);
    let now = Now::new(now_ns, now_wall_ns);
    let markers = b.marker_retention.map(|retention| MarkerRules {
        retention,
        durable: true,
    });
    let dropped = load_markers(store, index, markers.is_some(), now)?;
    let found = Mutex::new(Found::default());
    index.begin_load();
    if let Some((first, last)) = store.token_bounds()? {
        let ranges = scan_ranges(first, last, records);
        let scan = |range| scan_range(store, b, index, counters, range, now, markers, &found);
        // One range is scanned on this thread: a thread of its own would buy nothing (and
        // a model-checked open could not follow it).
        let results: Vec<Result<(), OpenError>> = match ranges.as_slice() {
            [range] => vec![scan(range.clone())],
            _ => std::thread::scope(|scope| {
                let handles: Vec<_> = ranges
                    .iter()
                    .map(|range| scope.spawn(|| scan(range.clone())))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(OpenError::Corrupted {
                                detail: "recovery thread panicked".into(),
                            })
                        })
                    })
                    .collect()
            }),
        };
        for r in results {
            r?;
        }
    }
    index.finish_load(now_ns);
    let found = found.into_inner();
    // A damaged key can end a range scan early without any checksum failing: every record
    // the table counts must have been seen.
    if found.scanned != records {
        return Err(OpenError::Corrupted {
            detail: format!(
                "the records table counts {records} records but a scan found {}",
                found.scanned
            ),
        });
    }
    counters
        .abandoned_reaped
        .fetch_add(found.reaped, Ordering::Relaxed);
    let hwm = store.token_hwm()?;
    let next = hwm.max(found.max_token.saturating_add(1)).max(1);
    let marker_retention_ms = markers.map_or(0, |m| duration_ms(m.retention));
    let writes = cleanup(found, dropped, marker_retention_ms);
    store.commit_on_open(
        &writes,
        &[],
        Some(next.saturating_add(TOKEN_RESERVE)),
        Durable::Yes,
    )?;
    Ok(next)
}

/// Sizes each stripe's table for its share of the file's `records`. The stored count sizes
/// the tables, but a damaged count must not ask for terabytes: it is capped, and a failed
/// reservation just means growing as the scan goes.
fn presize(index: &Index, records: u64) {
    let hint = records.min(RECOVERY_PRESIZE_MAX) / index.len() as u64;
    let per_stripe = usize::try_from(hint).unwrap_or(0);
    for stripe in index.stripes() {
        // A little over the average: stripes fill unevenly.
        let _ = stripe
            .lock()
            .try_reserve(per_stripe.saturating_add(per_stripe / 8));
    }
}

/// The token ranges the scan threads take, covering `first..=last`: the range is split so
/// both cores decode and insert (a large file only); stripes are locked per insert, so the
/// threads only meet on a stripe at a time.
fn scan_ranges(first: u64, last: u64, records: u64) -> Vec<std::ops::Range<u64>> {
    let threads = if records > 65_536 {
        RECOVERY_THREADS_MAX
    } else {
        1
    };
    let span = (last - first) / threads + 1;
    (0..threads)
        .map(|i| {
            let start = first.saturating_add(span.saturating_mul(i));
            let end = if i + 1 == threads {
                last.saturating_add(1).max(start)
            } else {
                start.saturating_add(span)
            };
            start..end
        })
        .collect()
}

/// The writes that tidy the file after the scan, committed before the engine serves: the
/// stale records deleted, the completions past retention turned into their markers, the
/// ended markers `dropped`.
fn cleanup(
    found: Found,
    dropped: Vec<(u64, u64)>,
    marker_retention_ms: u64,
) -> Vec<Write<'static>> {
    found
        .stale
        .into_iter()
        .map(|token| Write::Delete { token })
        .chain(
            found
                .forgotten
                .into_iter()
                .map(|(token, id)| Write::Forget {
                    token,
                    hash: id.hash,
                    check: id.check,
                    marker_retention_ms,
                }),
        )
        .chain(
            dropped
                .into_iter()
                .map(|(hash, token)| Write::DropMarker { hash, token }),
        )
        .collect()
}

/// Loads the file's markers into the index: each one that has not ended. Returns the rows
/// to delete `(hash, token)`: the ended ones. A row that fails its checks is `Corrupted`, as
/// a record is. An engine opened without markers leaves the rows alone (`keep` false): an
/// operator's tool that opens the file with the defaults must not erase them.
fn load_markers(
    store: &Store,
    index: &Index,
    keep: bool,
    now: Now,
) -> Result<Vec<(u64, u64)>, OpenError> {
    if !keep {
        return Ok(Vec::new());
    }
    let rows = store.markers_len()?;
    if rows > 0 {
        let per_stripe = rows.min(RECOVERY_PRESIZE_MAX) / index.len() as u64;
        let per_stripe = usize::try_from(per_stripe).unwrap_or(0);
        for stripe in index.stripes() {
            let _ = stripe
                .lock()
                .reserve_markers(per_stripe.saturating_add(per_stripe / 8));
        }
    }
    let mut dropped = Vec::new();
    store.scan_markers(|hash, bytes| {
        let row = codec::decode_marker(hash, bytes).map_err(|e| OpenError::Corrupted {
            detail: format!("marker row under hash {hash:#018x}: {e}"),
        })?;
        let id = MarkerId {
            hash,
            check: row.check,
        };
        let marker = machine::loaded_marker(
            id,
            row.token,
            row.attempt,
            row.fingerprint,
            row.completed_wall_ms,
            row.end_wall_ms,
            now,
        );
        match marker {
            Some(marker) => {
                let stripe = index.stripe_of_hash(hash);
                if let Some(stripe) = index.stripe_at(stripe) {
                    stripe.lock().load_marker(marker);
                }
            }
            None => dropped.push((hash, row.token)),
        }
        Ok(())
    })??;
    Ok(dropped)
}

#[allow(clippy::too_many_arguments)]
fn scan_range(
    store: &Store,
    b: &RecoverySettings,
    index: &Index,
    counters: &Counters,
    range: std::ops::Range<u64>,
    now: Now,
    markers: Option<MarkerRules>,
    found: &Mutex<Found>,
) -> Result<(), OpenError> {
    let mut local = Found::default();
    let (mut inflight, mut completed) = (0u64, 0u64);
    // One buffer for every record's scoped key: the index copies what it keeps.
    let mut scoped = Vec::new();
    let reopen = Reopen {
        recovery: b.recovery,
        lease: b.lease,
        retention: b.retention,
    };
    let scanned = store.scan(range, |token, bytes| {
        let head = codec::decode_head(token, bytes).map_err(|e| OpenError::Corrupted {
            detail: format!("record under token {token}: {e}"),
        })?;
        local.max_token = local.max_token.max(token);
        // The index names a key by its scoped key (`scope.rs`), rebuilt from the record's
        // scope and key.
        if !crate::model::scope::write_scoped(&mut scoped, &head.scope.0, &head.key.0) {
            return Err(OpenError::Corrupted {
                detail: format!(
                    "record under token {token}: a scope of {} bytes, longer than any written",
                    head.scope.0.len()
                ),
            });
        }
        let key = &scoped[..];
        // Kept for the marker it may leave (`recover` takes the state).
        let done = completed_head(&head.state);
        let (slot, extra, reap_ns) = match machine::recover(
            token,
            head.state,
            head.fingerprint,
            head.retention_ms,
            now,
            &reopen,
            head.first_claimed_wall_ms,
        ) {
            Recovered::Expired => {
                let marker = match (&markers, &done) {
                    (Some(rules), Some(done)) => {
                        let id = index.marker_id(key);
                        machine::recover_marker(token, done, head.fingerprint, id, rules, now)
                    }
                    _ => None,
                };
                local.expired(index, token, marker);
                return Ok(());
            }
            Recovered::Reaped => {
                local.stale.push(token);
                local.reaped += 1;
                return Ok(());
            }
            Recovered::Load {
                slot,
                extra,
                reap_ns,
            } => (slot, extra, reap_ns),
        };
        let k = index.key(key);
        let mut shard = index.stripe(k).lock();
        let step = machine::load(shard.get(k), slot, extra, reap_ns);
        if let Some(write) = &step.write {
            local.stale.push(write.token());
        }
        // Wrapping: the per-thread counts can go below zero transiently (below).
        inflight = inflight.wrapping_add(step.deltas.inflight as u64);
        completed = completed.wrapping_add(step.deltas.completed as u64);
        shard.apply(k, step.change, 0);
        Ok(())
    })?;
    local.scanned = scanned?;
    // The per-thread counts can go below zero transiently (a duplicate found by the other
    // thread), so they are added as wrapping deltas.
    counters
        .gauges
        .inflight
        .fetch_add(inflight, Ordering::Relaxed);
    counters
        .gauges
        .completed
        .fetch_add(completed, Ordering::Relaxed);
    found.lock().merge(local);
    Ok(())
}
