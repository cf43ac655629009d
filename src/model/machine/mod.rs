//! The per-key state machine, as pure functions: given a key's slot and side data, an
//! operation and the instant, each function returns what the key becomes, the write to
//! queue for the writer, the caller's answer and the counter deltas — a [`Step`].
//!
//! Architecture invariant: the state machine never does I/O, takes no lock and reads no
//! clock. Its callers hold the key's stripe lock, read the clock, queue the write (and only
//! if the queue takes it, apply the change and the deltas), wait for acknowledgements and
//! read responses from the file.
//!
//! The table of `docs/design.md` ("The state machine"), cell by cell:
//!
//! | call | function | Absent / expired | InFlight, live | InFlight, over | Completed |
//! |---|---|---|---|---|---|
//! | `claim` | [`claim()`], then [`acquire`] | `Acquire` (new) | `Busy` | `Acquire` (takeover) | `Replay` / `ReplayFromFile` (published), `Busy` (not yet) |
//! | `complete` | [`hold`] + [`Holder::Complete`] | `LeaseLost` | `Done` | `Done` (same token) | `Repeat` (same token), else `LeaseLost` |
//! | `release` | [`hold`] + [`Holder::Release`] | `NotHeld` | `Done` | `Done` (same token) | `NotHeld` |
//! | `fail` | [`hold`] + [`Holder::Fail`] | `NotHeld` | `Done`: the lease ends now, the record stays (failed) | `Done` (same token; the end stays) | `NotHeld` |
//! | `extend`, `checkpoint` | [`hold`] + [`Holder::Extend`] / [`Holder::Checkpoint`] | `LeaseLost` | `Done` | `Done` (same token; `extend` of a failed key: `LeaseLost`) | `LeaseLost` |
//!
//! A claim whose fingerprint differs from the stored one gets `FingerprintMismatch` in every
//! state that has one. A failed key is "InFlight, over" for every call but `extend`, which is
//! `LeaseLost` (a failed attempt is never revived): the next claim takes it over at once
//! (attempt + 1, checkpoint and fingerprint kept). Beside the table: [`import()`] (an
//! operator adds a record), [`expire`] and [`reap`] (the sweeper removes a completion past
//! its retention, an abandoned claim past its lease end plus retention), [`recover()`] and
//! [`load`] (recovery classifies a record of the file and loads it over what an earlier
//! record left).
//!
//! What is not here, and why: admission (the key budget and the in-flight limit, which
//! reserve a place on a shared counter and may sweep), issuing tokens (a shared counter
//! backed by the file), the expiry order of each stripe (`index/expiry.rs`; the shard
//! asks [`expire`] and [`reap`] before removing anything), and publishing a completion
//! once the writer's watermark passes it (`publication.rs`, applied when its stripe is
//! locked).

use crate::base::clock::duration_ns;
use crate::model::codec::Record;
use crate::model::slot::{Extra, Slot};
use std::time::Duration;

mod claim;
mod holder;
mod import;
mod marker;
mod record;
mod recover;
mod sweep;
#[cfg(test)]
mod tests;

pub(crate) use claim::{acquire, claim, resume, Acquired, Acquiring, ClaimAnswer, Plan};
pub(crate) use holder::{hold, Holder, HolderAnswer};
pub(crate) use import::{import, Imported};
pub(crate) use marker::{
    claim_marker, end_marker, forget, loaded_marker, recover_marker, MarkerAnswer, MarkerRules,
};
pub(crate) use record::{lease_end_wall_ms, KeyRef};
pub(crate) use recover::{load, recover, Recovered, Reopen};
pub(crate) use sweep::{expire, reap};

/// The instant of a transition, read by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Now {
    /// Monotonic ns: lease ends and retention deadlines.
    pub(crate) mono_ns: u64,
    /// Wall-clock ms since the epoch: what records persist and reports show.
    pub(crate) wall_ms: u64,
    /// The wall reading's nanoseconds past `wall_ms` (below one ms): the ends stored on the
    /// wall clock's millisecond grid are measured from the exact reading.
    pub(crate) wall_sub_ns: u64,
}

impl Now {
    /// The instant whose monotonic reading is `mono_ns` and whose wall reading is `wall_ns`
    /// since the epoch.
    pub(crate) fn new(mono_ns: u64, wall_ns: u64) -> Self {
        Self {
            mono_ns,
            wall_ms: wall_ns / 1_000_000,
            wall_sub_ns: wall_ns % 1_000_000,
        }
    }

    /// Nanoseconds from this instant until the wall clock reaches millisecond `ms` (0 once
    /// it has).
    pub(crate) fn ns_until_wall_ms(&self, ms: u64) -> u64 {
        ms.saturating_sub(self.wall_ms)
            .saturating_mul(1_000_000)
            .saturating_sub(self.wall_sub_ns)
    }

    /// The first whole wall millisecond at or after the monotonic instant `at_ns`: a lease
    /// end as it is stored and reported, never before the real one.
    pub(crate) fn wall_ms_ceil_at(&self, at_ns: u64) -> u64 {
        let wall_ns = u128::from(self.wall_ms) * 1_000_000 + u128::from(self.wall_sub_ns);
        let at_wall_ns = if at_ns >= self.mono_ns {
            wall_ns + u128::from(at_ns - self.mono_ns)
        } else {
            wall_ns.saturating_sub(u128::from(self.mono_ns - at_ns))
        };
        u64::try_from(at_wall_ns.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }

    /// The first whole wall millisecond at or after `keep_ns` from this instant (not
    /// bounded by the monotonic clock's range): a lease's end as its record stores it.
    pub(crate) fn wall_ms_ceil_after(&self, keep_ns: u64) -> u64 {
        let end_ns = u128::from(self.wall_ms) * 1_000_000
            + u128::from(self.wall_sub_ns)
            + u128::from(keep_ns);
        u64::try_from(end_ns.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }

    /// The end of something kept `keep_ns` from this instant, on the wall clock's
    /// millisecond grid: the first whole wall millisecond at or after the exact end (as
    /// stored), and the monotonic instant of it (as the index keeps it). Memory and file
    /// then end at the same instant, never before the exact end and less than a millisecond
    /// after it. Zero ends now.
    pub(crate) fn end_on_wall_grid(&self, keep_ns: u64) -> (u64, u64) {
        if keep_ns == 0 {
            return (self.wall_ms, self.mono_ns);
        }
        let rem_ns = keep_ns % 1_000_000 + self.wall_sub_ns;
        let end_ms = self
            .wall_ms
            .saturating_add(keep_ns / 1_000_000)
            .saturating_add(rem_ns.div_ceil(1_000_000));
        (
            end_ms,
            self.mono_ns.saturating_add(self.ns_until_wall_ms(end_ms)),
        )
    }
}

/// The engine's settings a transition depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    pub(crate) retention: Duration,
    pub(crate) response_len_max: usize,
    /// A file backs the engine: transitions describe the records to put, and completions
    /// are published once the writer's watermark passes them. A memory-only engine
    /// publishes at once and has no records to build.
    pub(crate) durable: bool,
    /// The engine's lease: the lease length an InFlight record keeps for a holder whose own
    /// is unknown (one loaded from a record of format 1 or 2).
    pub(crate) lease: Duration,
}

/// A lease length in whole milliseconds, rounded up (a stored length is never shorter).
pub(crate) fn lease_ms(lease: Duration) -> u64 {
    duration_ns(lease).div_ceil(1_000_000)
}

/// The lease length an InFlight record keeps for the holder whose side data is `extra`.
fn holder_lease_ms(extra: &Extra, rules: &Rules) -> u64 {
    extra.lease_ms.unwrap_or_else(|| lease_ms(rules.lease))
}

/// A key's state: its slot (none when Absent) and the side data kept beside it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) slot: Option<Slot>,
    pub(crate) extra: Option<&'a Extra>,
}

impl View<'_> {
    /// An Absent key.
    #[cfg(test)]
    pub(crate) const ABSENT: View<'static> = View {
        slot: None,
        extra: None,
    };

    fn fingerprint(&self) -> Option<u128> {
        self.extra.and_then(|e| e.fingerprint())
    }
}

/// One transition: what the key becomes, what to queue, what to answer, what to count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step<A> {
    pub(crate) change: Change,
    /// What the writer must store. `None`: nothing (a refusal, an answer from memory, or a
    /// record a memory-only engine does not build).
    pub(crate) write: Option<Write>,
    pub(crate) answer: A,
    pub(crate) deltas: Deltas,
}

impl<A> Step<A> {
    /// An answer that changes nothing.
    fn answer(answer: A, deltas: Deltas) -> Self {
        Self {
            change: Change::Keep,
            write: None,
            answer,
            deltas,
        }
    }
}

/// What the key's slot becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a transition's change lives on the stack for one call; boxing the side data \
              would allocate on every transition"
)]
pub(crate) enum Change {
    Keep,
    /// Replace the slot and its side data.
    Put {
        slot: Slot,
        extra: Extra,
        /// The instant an InFlight slot is reaped if abandoned, when it comes from a record
        /// (recovery, import) rather than from the lease's own end.
        reap_ns: Option<u64>,
        /// A takeover of an abandoned lease whose claim reserved a place in the live count:
        /// the old slot leaves the abandoned set without being counted live again.
        adopt: bool,
    },
    Remove,
}

/// A write for the writer's queue (the caller adds the acknowledgement channel).
#[derive(Debug, Clone, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "a write lives for one transition, on the stack, and is encoded before it is \
              queued: boxing the record (its key inline) would allocate on every claim"
)]
pub(crate) enum Write {
    /// Store `record` under `token`, removing the key's previous record at `old`. (A
    /// completion's record is published when the writer's watermark passes it: see
    /// `Shard::apply`.)
    Put {
        token: u64,
        old: Option<u64>,
        record: Record,
    },
    /// Remove the record under `token`.
    Delete { token: u64 },
    /// Remove the completion's record under `token` and, in the same commit, store the
    /// marker row it leaves under `hash`, built by the writer from the record (its
    /// fingerprint, attempt and completion time; its end is the record's end of retention
    /// plus `marker_retention_ms`).
    Forget {
        token: u64,
        hash: u64,
        check: u64,
        marker_retention_ms: u64,
    },
    /// Remove the marker row under `hash` if it is the one the completion `token` left.
    DropMarker { hash: u64, token: u64 },
}

impl Write {
    /// The token the write stores or removes (a marker's: the token of its completion).
    pub(crate) fn token(&self) -> u64 {
        match self {
            Write::Put { token, .. }
            | Write::Delete { token }
            | Write::Forget { token, .. }
            | Write::DropMarker { token, .. } => *token,
        }
    }
}

/// Changes to the engine's counters. Gauges are signed; events count up.
///
/// `inflight` does not include the place a claim reserves: admission reserves it against
/// the limit before the claim transition ([`Plan::reserve`]). The `abandoned` gauge is kept
/// by the index, which moves leases in and out of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Deltas {
    pub(crate) inflight: i64,
    pub(crate) completed: i64,
    pub(crate) acquired: u64,
    pub(crate) takeovers: u64,
    pub(crate) replays: u64,
    pub(crate) in_progress: u64,
    pub(crate) fingerprint_mismatches: u64,
    pub(crate) completions: u64,
    pub(crate) releases: u64,
    pub(crate) leases_lost: u64,
    pub(crate) expirations: u64,
    pub(crate) abandoned_reaped: u64,
    /// Leases ended by their holder's failure, the record kept.
    pub(crate) failures: u64,
    /// Claims answered from a marker (`Forgotten`).
    pub(crate) forgotten: u64,
}

const NONE: Deltas = Deltas {
    inflight: 0,
    completed: 0,
    acquired: 0,
    takeovers: 0,
    replays: 0,
    in_progress: 0,
    fingerprint_mismatches: 0,
    completions: 0,
    releases: 0,
    leases_lost: 0,
    expirations: 0,
    abandoned_reaped: 0,
    failures: 0,
    forgotten: 0,
};
