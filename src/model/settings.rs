//! Settings the state machine and the layers below it read: the durability mode, what
//! recovery does with leases left behind, the fingerprint a claim asks for.

use crate::model::constants::BUFFERED_DELAY_DEFAULT;
use std::time::Duration;

/// What an acknowledged call promises about surviving a crash.
///
/// In every mode, another caller never sees a completion that the mode could still lose:
/// a loser replays a response only once it is as durable as the mode promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// A call returns only after its record is fsynced, in a group commit shared with every
    /// concurrent call. Nothing acknowledged is lost by a crash or power loss.
    Immediate,
    /// A call returns at once; the writer commits what was acknowledged within `max_delay`
    /// of the oldest queued call in one group commit. New claims are admitted by the
    /// writer's measured rate (no more pending than it commits in three quarters of one
    /// `max_delay`), so a crash loses at most the calls of about the last `2 × max_delay`
    /// even under overload (claims beyond that are refused with `Overloaded`), plus
    /// whatever a single commit takes beyond its prediction when the disk or the scheduler
    /// stalls it (`Stats::commit_max_us`; see docs/design.md). Another
    /// caller sees a completion only after it is fsynced, so nothing lost was ever replayed.
    Buffered {
        /// How long the writer gathers calls into one commit: the loss window while the
        /// writer keeps up.
        max_delay: Duration,
    },
    /// Memory only: no file, nothing survives the process. A path given to the builder is
    /// refused ([`crate::OpenError::MemoryOnlyPath`]) rather than ignored.
    None,
}

impl Durability {
    /// `Buffered` with the default delay (10 ms).
    pub fn buffered() -> Self {
        Durability::Buffered {
            max_delay: BUFFERED_DELAY_DEFAULT,
        }
    }
}

/// What recovery does with the InFlight records a previous process left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Recovery {
    /// Their owner is dead (redb locks the file to one process): the next claim takes them
    /// over at once, attempt + 1, checkpoint kept.
    #[default]
    TakeOver,
    /// Honour the persisted lease deadline: the dead holder's side effects may still land.
    /// The remaining lease is capped by the lease length that holder was given (its claim's
    /// [`crate::ClaimOptions::lease`], or its last [`crate::Lease::extend`] or keep-alive
    /// renewal's), so that a wall-clock jump does not keep a dead claim alive longer than
    /// one of its leases. A record written by a format before 3, which did not keep that
    /// length, is capped by the engine's lease at reopen.
    HonourLeases,
}

/// The fingerprint a claim asks for, with the 64-bit form that records of the previous
/// format hold for the same request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AskedFingerprint {
    pub(crate) value: u128,
    /// The previous format's FNV-1a of the payload, when the claim has the payload.
    pub(crate) legacy: Option<u64>,
}

impl AskedFingerprint {
    /// Whether the stored fingerprint is this request's. A stored value whose high half is
    /// zero is a 64-bit fingerprint (a caller's u64, or the previous format's FNV-1a of the
    /// payload); a [`crate::Fingerprint`] never has a zero high half, so the two never meet.
    pub(crate) fn matches(&self, stored: u128) -> bool {
        stored == self.value
            || (stored >> 64 == 0 && self.legacy.is_some_and(|l| u128::from(l) == stored))
    }
}
