//! The machinery that checks idemkv (never published): the operation types and the
//! whole-engine model of the `ops_model` fuzz target, the sequential spec, a history recorder
//! and a linearizability checker, the concurrent scripts of `concurrent_claims`, a simulated
//! disk and the `storage_faults` runner, the stress runner, and the assertion helpers of the
//! integration tests (`backend`; the simulated disk itself is the library's
//! `idemkv::fault::FaultyStorage`). `docs/testing.md` explains each part.
//!
//! The deliberate bugs of the teeth ([`Bug`]) act only in a build of the engine with
//! `--cfg idemkv_sabotage` (set through RUSTFLAGS); in any other build [`sabotage`] and
//! [`armed`] accept [`Bug::None`] alone, and the shuttle runners exist only with
//! `--cfg shuttle`.

use idemkv::{Engine, EngineBuilder};

pub mod backend;
pub mod concurrent;
pub mod faults;
pub mod fixture;
pub mod history;
pub mod linearizability;
pub mod ops;
pub mod spec;
pub mod stress;

/// Milliseconds since the UNIX epoch of a wall-clock time, as the engine stores it (a time
/// before the epoch reads as 0; saturates at `u64::MAX`).
pub fn wall_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Nanoseconds since the UNIX epoch of a wall-clock time, as the engine reads it (0 before
/// the epoch; saturates at `u64::MAX`).
pub fn wall_ns(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The three durability modes, for checks and tests that run in each (`Buffered` with a
/// 1 ms delay, so a batch closes quickly).
pub fn modes() -> [idemkv::Durability; 3] {
    [
        idemkv::Durability::None,
        idemkv::Durability::Buffered {
            max_delay: std::time::Duration::from_millis(1),
        },
        idemkv::Durability::Immediate,
    ]
}

/// `n` bytes from `rng`: the input of a seeded case (`Unstructured`), as a fuzzer's would be.
pub fn bytes(rng: &mut fastrand::Rng, n: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    rng.fill(&mut out);
    out
}

/// A bug to switch on in an engine, for proving that a checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Bug {
    /// No bug: the engine as shipped.
    None,
    /// Claims check, drop the lock, then insert: the check-then-act race.
    CheckThenAct,
    /// `complete` skips the fencing-token comparison.
    NoFencing,
    /// The writer acknowledges a batch before its commit returns (a crash then loses an
    /// acknowledged call).
    AckBeforeCommit,
    /// The writer publishes a batch's completions before its commit returns (another caller
    /// can be shown a completion a crash still erases).
    PublishBeforeCommit,
    /// Commits leave the token high-water mark out of the file (tokens issued but never
    /// written are issued again after a crash). Arm it on the builder ([`armed`]): the mark
    /// is first written when the file is opened.
    SkipTokenHwm,
    /// A write that replaces a key's record (a takeover, a claim of an expired key) leaves
    /// the previous record in the file, where it comes back after a restart.
    DropOldRemoval,
    /// A replay reads the stored response without checking its checksum.
    SkipReplayChecksum,
    /// With the commit log, a batch acknowledged as applied (a flush's barrier alone) or
    /// committed by the writer itself does not wait for the batches handed to the applier:
    /// the applied watermark passes completions the file does not hold yet.
    SkipApplierDrain,
    /// A keep-alive renewal extends whoever holds the key now instead of the lease it was
    /// registered for (a lease another caller took over is extended for them).
    RenewCurrentHolder,
    /// `Outbox::mark_sent` returns under `Immediate` before the removal is durable (a power
    /// loss right after it returns publishes the message again).
    MarkSentBeforeDurable,
}

impl Bug {
    /// Every bug (not [`Bug::None`]).
    pub const ALL: [Bug; 10] = [
        Bug::CheckThenAct,
        Bug::NoFencing,
        Bug::AckBeforeCommit,
        Bug::PublishBeforeCommit,
        Bug::SkipTokenHwm,
        Bug::DropOldRemoval,
        Bug::SkipReplayChecksum,
        Bug::SkipApplierDrain,
        Bug::RenewCurrentHolder,
        Bug::MarkSentBeforeDurable,
    ];

    /// The engine's switch for this bug (`None` for [`Bug::None`]).
    #[cfg(idemkv_sabotage)]
    fn switch(self) -> Option<idemkv::sabotage::Sabotage> {
        use idemkv::sabotage::Sabotage;
        Some(match self {
            Bug::None => return None,
            Bug::CheckThenAct => Sabotage::CheckThenAct,
            Bug::NoFencing => Sabotage::NoFencing,
            Bug::AckBeforeCommit => Sabotage::AckBeforeCommit,
            Bug::PublishBeforeCommit => Sabotage::PublishBeforeCommit,
            Bug::SkipTokenHwm => Sabotage::SkipTokenHwm,
            Bug::DropOldRemoval => Sabotage::DropOldRemoval,
            Bug::SkipReplayChecksum => Sabotage::SkipReplayChecksum,
            Bug::SkipApplierDrain => Sabotage::SkipApplierDrain,
            Bug::RenewCurrentHolder => Sabotage::RenewCurrentHolder,
            Bug::MarkSentBeforeDurable => Sabotage::MarkSentBeforeDurable,
        })
    }

    /// Without the sabotage build no bug can act: asking for one is a mistake in the test
    /// command, reported rather than silently run without the bug.
    #[cfg(not(idemkv_sabotage))]
    fn unavailable(self) {
        assert_eq!(
            self,
            Bug::None,
            "{self:?} needs a build with RUSTFLAGS=\"--cfg idemkv_sabotage\" (docs/testing.md)"
        );
    }
}

/// Switches `bug` on in a running engine (off with [`Bug::None`]).
/// [`Bug::SkipTokenHwm`] acts only when armed on the builder ([`armed`]).
pub fn sabotage(engine: &Engine, bug: Bug) {
    #[cfg(idemkv_sabotage)]
    idemkv::sabotage::switch(engine, bug.switch());
    #[cfg(not(idemkv_sabotage))]
    {
        let _ = engine;
        bug.unavailable();
    }
}

/// The builder with `bug` switched on from the open on, so that it also acts during the
/// open (the first commit writes the token mark).
pub fn armed(builder: EngineBuilder, bug: Bug) -> EngineBuilder {
    #[cfg(idemkv_sabotage)]
    return idemkv::sabotage::arm(builder, bug.switch());
    #[cfg(not(idemkv_sabotage))]
    {
        bug.unavailable();
        builder
    }
}
