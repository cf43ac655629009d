//! Fault points: the one mechanism by which a test build breaks the engine on purpose (so
//! that a checker can prove it catches the bug) or holds it at one point of its cycle.
//!
//! Library code marks a fault point with [`fault_point!`] (a condition: is this fault on?)
//! or [`fault_hook!`] (a statement run only in a test build). Built with
//! `--cfg idemkv_sabotage`, the first reads the switches in [`Faults`] and the second runs
//! its statement; built without it, `fault_point!` expands to the constant `false` and
//! `fault_hook!` to nothing, and neither [`Sabotage`] nor [`Faults`] exists.
//! Architecture Invariant: a build without the test cfg contains no fault point.

#[cfg(idemkv_sabotage)]
use crate::base::sync::{AtomicBool, AtomicU8, Ordering};
#[cfg(idemkv_sabotage)]
use std::sync::{Condvar, Mutex, PoisonError};

/// `fault_point!(faults, Name)`: whether a test switched [`Sabotage::Name`] on in `faults`
/// (a [`Faults`]); `fault_point!(thread FLAG)`: whether the calling thread set the
/// thread-local fault `FLAG`. The constant `false` without `--cfg idemkv_sabotage`, where
/// the arguments are not even evaluated.
#[cfg(idemkv_sabotage)]
macro_rules! fault_point {
    (thread $flag:ident) => {
        $crate::base::sabotage::$flag.with(::std::cell::Cell::get)
    };
    ($faults:expr, $name:ident) => {
        $faults.on($crate::base::sabotage::Sabotage::$name)
    };
}
#[cfg(not(idemkv_sabotage))]
macro_rules! fault_point {
    (thread $flag:ident) => {
        false
    };
    ($faults:expr, $name:ident) => {
        false
    };
}
pub(crate) use fault_point;

/// `fault_hook!(statement;)`: the statement in a build with `--cfg idemkv_sabotage`,
/// nothing without it (a gate the writer passes, a panic on demand).
#[cfg(idemkv_sabotage)]
macro_rules! fault_hook {
    ($($body:tt)*) => { $($body)* };
}
#[cfg(not(idemkv_sabotage))]
macro_rules! fault_hook {
    ($($body:tt)*) => {};
}
pub(crate) use fault_hook;

/// Bugs a test can switch on, to prove that the checkers catch them. Each one breaks a
/// promise the engine makes (docs/testing.md, "Teeth"). Exists only in a build with
/// `--cfg idemkv_sabotage` (`sabotage::switch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg(idemkv_sabotage)]
pub enum Sabotage {
    /// Claims look the key up, drop the lock, then insert: check-then-act.
    CheckThenAct = 1,
    /// `complete` does not compare tokens.
    NoFencing = 2,
    /// The writer acknowledges a batch before its commit returns.
    AckBeforeCommit = 3,
    /// The writer shows a batch's completions (a watermark every stripe lock reads) before
    /// its commit returns.
    PublishBeforeCommit = 4,
    /// Commits never write the token high-water mark (the engine believes they did).
    SkipTokenHwm = 5,
    /// A write that replaces a key's record leaves the previous record in the file.
    DropOldRemoval = 6,
    /// A replay decodes the stored record without checking its checksum.
    SkipReplayChecksum = 7,
    /// With the commit log, the writer acknowledges a batch as applied (a flush's barrier
    /// alone), or commits to the file itself, without waiting for the applier to apply the
    /// batches handed to it before.
    SkipApplierDrain = 8,
    /// A keep-alive renewal extends whoever holds the key now, not the lease it was
    /// registered for.
    RenewCurrentHolder = 9,
    /// `Outbox::mark_sent` returns under `Immediate` before the removal is durable.
    MarkSentBeforeDurable = 10,
}

#[cfg(idemkv_sabotage)]
thread_local! {
    /// For the calling thread only: a lease entry matches its slot by token alone, so an
    /// extended lease's old entry ends it at its old deadline (the teeth of `index::shard`'s tests).
    pub(crate) static TOKEN_ONLY_LEASE_ENTRIES: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

/// An engine's fault switches and gates (part of its shared state in a test build only).
#[derive(Debug, Default)]
#[cfg(idemkv_sabotage)]
pub(crate) struct Faults {
    /// The active sabotage (a `Sabotage` as u8; 0 is none).
    active: AtomicU8,
    /// The writer panics at its next batch (`Engine::panic_writer_at_next_batch`).
    writer_panic: AtomicBool,
    /// Holds the writer before its next commit (`sabotage::HeldCommits`).
    pub(crate) commit_gate: CommitGate,
    /// Holds the writer after its next commit, before it moves its watermarks.
    pub(crate) after_commit_gate: CommitGate,
}

#[cfg(idemkv_sabotage)]
impl Faults {
    /// The switches of an engine opened with `armed` on (a `Sabotage` as u8; 0 is none).
    pub(crate) fn new(armed: u8) -> Self {
        Faults {
            active: AtomicU8::new(armed),
            ..Faults::default()
        }
    }

    /// Whether `which` is on (read by [`fault_point!`]).
    #[inline]
    pub(crate) fn on(&self, which: Sabotage) -> bool {
        self.active.load(Ordering::Relaxed) == which as u8
    }

    /// Switches `bug` on (off with `None`).
    pub(crate) fn switch(&self, bug: Option<Sabotage>) {
        self.active
            .store(bug.map_or(0, |b| b as u8), Ordering::Relaxed);
    }

    /// Makes the writer panic at its next batch.
    pub(crate) fn panic_writer_at_next_batch(&self) {
        self.writer_panic.store(true, Ordering::Release);
    }

    /// Called by the writer at each batch: panics if a test asked it to.
    pub(crate) fn writer_may_panic(&self) {
        if self.writer_panic.swap(false, Ordering::AcqRel) {
            panic!("sabotage: the writer panics on purpose");
        }
    }
}

/// Holds the writer at one point of its cycle while closed (see `Engine::hold_commits`,
/// `Engine::hold_after_commits`).
/// It uses std's lock even in model-checking builds: no shuttle test closes it.
#[derive(Debug, Default)]
#[cfg(idemkv_sabotage)]
pub(crate) struct CommitGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
#[cfg(idemkv_sabotage)]
struct GateState {
    closed: bool,
    /// Commits waiting at the gate now.
    held: usize,
}

#[cfg(idemkv_sabotage)]
impl CommitGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn close(&self) {
        self.lock().closed = true;
    }

    pub(crate) fn open(&self) {
        self.lock().closed = false;
        self.changed.notify_all();
    }

    /// Called by the writer at the gate's point of each cycle: waits while it is closed.
    pub(crate) fn pass(&self) {
        let mut s = self.lock();
        if !s.closed {
            return;
        }
        s.held += 1;
        self.changed.notify_all();
        while s.closed {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.held -= 1;
    }

    /// Waits until a commit is held at the gate, at most until `deadline` (real time);
    /// returns whether one is.
    pub(crate) fn wait_until_held(&self, deadline: std::time::Instant) -> bool {
        let mut s = self.lock();
        while s.held == 0 {
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
                return false;
            };
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}
