//! Errors, one enum per operation. Each variant says what happened and what the caller can do.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A limit that refused a call before anything was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// Too many keys are InFlight at once ([`crate::EngineBuilder::inflight_max`]).
    InFlightClaims,
    /// The background writer's queue is full ([`crate::Tuning::queue_depth`]).
    WriterQueue,
    /// Too many keys are held in memory ([`crate::EngineBuilder::keys_max`]).
    Keys,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::InFlightClaims => f.write_str("in-flight claim limit"),
            Limit::WriterQueue => f.write_str("writer queue depth"),
            Limit::Keys => f.write_str("key budget"),
        }
    }
}

/// Why [`crate::Engine::open`], [`crate::EngineBuilder::open`] or [`crate::admin::FileReader`]
/// failed. [`OpenError::kind`] names the kind of failure for a caller that acts on it; the
/// message says what was found and what the operator can do.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// Another process (or another engine in this process) has the file open. redb allows
    /// one writer per file; close the other one first.
    AlreadyOpen {
        /// The file that is locked.
        path: PathBuf,
    },
    /// The file is a redb file but not an idemkv file, or an idemkv file of a newer format.
    /// Nothing was changed; point the engine at its own file.
    Foreign {
        /// What was found instead of an idemkv file.
        detail: String,
    },
    /// The file is damaged: redb refused it, a table definition does not decode, or a record
    /// failed its checksum. Nothing was changed; restore it from a backup, or move it aside
    /// to start empty.
    Corrupted {
        /// What was wrong and where.
        detail: String,
    },
    /// The file's header (its first page) is damaged: redb's magic is missing or broken, so
    /// the file cannot be read, yet it is not empty and did not come from a creation cut
    /// short. It is never started afresh (its records would be lost and every duplicate of
    /// them would run again). Nothing was changed; restore it from a backup.
    HeaderDamaged {
        /// The file.
        path: PathBuf,
        /// What was found in the header and past it.
        detail: String,
    },
    /// A read-only open found commits in the commit log beside the file (`<path>-log`,
    /// written under [`crate::Durability::Immediate`]) that the file does not hold yet: an engine
    /// stopped without closing. Reading the file alone would miss acknowledged commits.
    /// Nothing was changed; open the engine read-write once (it applies the log), then
    /// read again.
    UnappliedLog {
        /// The commit log.
        path: PathBuf,
    },
    /// The operating system refused to open, read, write or sync the file. [`OpenError::kind`]
    /// tells a full disk and a refused permission from other I/O errors; the `io::Error` is
    /// the [`std::error::Error::source`]. The file was not judged damaged.
    Io(std::io::Error),
    /// A path was given to a memory-only engine ([`crate::Durability::None`]), which keeps
    /// no file: the keys would be forgotten at a restart although a file was asked for.
    /// Nothing was created; drop the path, or choose a durable mode.
    MemoryOnlyPath {
        /// The path that was given.
        path: PathBuf,
    },
    /// A builder setting is out of range.
    InvalidConfig {
        /// Which setting and why.
        detail: String,
    },
    /// The shared database refused the open, or could not be reached (feature `postgres`):
    /// [`crate::error::DatabaseError::kind`] says what to do.
    #[cfg(feature = "postgres")]
    Database(crate::model::database_error::DatabaseError),
}

/// The kind of an [`OpenError`], for a caller that acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpenErrorKind {
    /// [`OpenError::AlreadyOpen`]: stop the other process first.
    AlreadyOpen,
    /// [`OpenError::Foreign`]: not an idemkv file.
    Foreign,
    /// [`OpenError::Corrupted`]: damaged; restore from a backup.
    Corrupted,
    /// [`OpenError::HeaderDamaged`]: the header is damaged; restore from a backup.
    HeaderDamaged,
    /// [`OpenError::UnappliedLog`]: open the engine read-write once, then read again.
    UnappliedLog,
    /// An [`OpenError::Io`] because the disk (or the quota) is full: free space and retry.
    DiskFull,
    /// An [`OpenError::Io`] because the OS refused access (file mode, owner, a read-only
    /// file system): fix the permissions and retry.
    PermissionDenied,
    /// Any other [`OpenError::Io`]: check the device, then retry.
    Io,
    /// [`OpenError::InvalidConfig`] or [`OpenError::MemoryOnlyPath`]: fix the builder
    /// settings.
    InvalidConfig,
    /// An [`OpenError::Database`] that is neither a full disk nor a refused permission:
    /// see its [`crate::error::DatabaseError::kind`].
    #[cfg(feature = "postgres")]
    Database,
}

impl OpenError {
    /// The kind of failure: what a caller can do about it.
    pub fn kind(&self) -> OpenErrorKind {
        match self {
            OpenError::AlreadyOpen { .. } => OpenErrorKind::AlreadyOpen,
            OpenError::Foreign { .. } => OpenErrorKind::Foreign,
            OpenError::Corrupted { .. } => OpenErrorKind::Corrupted,
            OpenError::HeaderDamaged { .. } => OpenErrorKind::HeaderDamaged,
            OpenError::UnappliedLog { .. } => OpenErrorKind::UnappliedLog,
            OpenError::Io(e) => io_kind(e),
            OpenError::InvalidConfig { .. } | OpenError::MemoryOnlyPath { .. } => {
                OpenErrorKind::InvalidConfig
            }
            #[cfg(feature = "postgres")]
            OpenError::Database(e) => match e.kind() {
                crate::model::database_error::DatabaseErrorKind::PermissionDenied => {
                    OpenErrorKind::PermissionDenied
                }
                crate::model::database_error::DatabaseErrorKind::DiskFull => {
                    OpenErrorKind::DiskFull
                }
                _ => OpenErrorKind::Database,
            },
        }
    }
}

/// ENOSPC and EDQUOT (Linux and the BSDs number EDQUOT differently).
fn is_disk_full(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(e.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
        || matches!(e.raw_os_error(), Some(28))
}

fn io_kind(e: &std::io::Error) -> OpenErrorKind {
    use std::io::ErrorKind;
    if is_disk_full(e) {
        OpenErrorKind::DiskFull
    } else if matches!(
        e.kind(),
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
    ) {
        OpenErrorKind::PermissionDenied
    } else {
        OpenErrorKind::Io
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::AlreadyOpen { path } => write!(
                f,
                "{} is already open in another process or engine (one writer per file)",
                path.display()
            ),
            OpenError::Foreign { detail } => write!(f, "not an idemkv file: {detail}"),
            OpenError::Corrupted { detail } => write!(f, "the file is corrupted: {detail}"),
            OpenError::HeaderDamaged { path, detail } => write!(
                f,
                "the header of {} is damaged: {detail}; nothing was changed: restore the file \
                 from a backup (do not delete it to start afresh: its records would be lost)",
                path.display()
            ),
            OpenError::UnappliedLog { path } => write!(
                f,
                "the commit log {} holds commits the file does not have yet (the engine was \
                 stopped without closing); nothing was changed: open the engine read-write \
                 once to apply them, then read again",
                path.display()
            ),
            OpenError::Io(e) => match io_kind(e) {
                OpenErrorKind::DiskFull => write!(
                    f,
                    "the disk is full while opening: {e}; free space and open again (nothing \
                     acknowledged was lost)"
                ),
                OpenErrorKind::PermissionDenied => write!(
                    f,
                    "permission denied while opening: {e}; the process needs read and write \
                     access to the file and its directory"
                ),
                _ => write!(
                    f,
                    "I/O error while opening: {e}; the file was not found damaged: check the \
                     device, then open again"
                ),
            },
            OpenError::InvalidConfig { detail } => write!(f, "invalid configuration: {detail}"),
            OpenError::MemoryOnlyPath { path } => write!(
                f,
                "a path ({}) was given to a memory-only engine (Durability::None), which keeps \
                 no file and forgets every key at a restart; drop the path, or choose a \
                 durable mode",
                path.display()
            ),
            #[cfg(feature = "postgres")]
            OpenError::Database(e) => write!(f, "opening the shared database failed: {e}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io(e) => Some(e),
            #[cfg(feature = "postgres")]
            OpenError::Database(e) => Some(e),
            _ => None,
        }
    }
}

/// Why a claim ([`crate::Engine::claim`], [`crate::Engine::claim_or_wait`]) or a read
/// ([`crate::Engine::get`]) failed. No state changed unless the variant says so.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimError {
    /// The key is longer than the configured maximum. Hash or shorten it.
    KeyTooLong {
        /// Length of the key given.
        len: usize,
        /// Longest key accepted.
        max: usize,
    },
    /// The key is empty. Empty keys are refused because they are almost always a bug.
    KeyEmpty,
    /// The scope ([`crate::ClaimOptions::scope`]) is longer than the engine accepts
    /// (255 bytes). Hash or shorten it.
    ScopeTooLong {
        /// Length of the scope given.
        len: usize,
        /// Longest scope accepted.
        max: usize,
    },
    /// The key is known with a different request fingerprint: the same idempotency key was
    /// reused for a different request (HTTP would answer 422). Do not retry with this key.
    FingerprintMismatch,
    /// A limit refused the claim before anything was queued. Retry later.
    Overloaded(Limit),
    /// Every token up to `u64::MAX` has been issued; tokens never wrap. Start a new file.
    TokensExhausted,
    /// A storage failure stopped the engine; it acknowledges nothing more. Reopen it.
    Poisoned(Arc<str>),
    /// The claim may or may not hold the key, and the caller has no token: the file engine
    /// queued it but failed before confirming its write; the shared backend lost the
    /// connection after sending it (it may have committed). Nothing ran yet. After a
    /// reopen the key is Absent, or InFlight with the claim's lease (taken over at once
    /// under [`crate::Recovery::TakeOver`], held for what is left of it under
    /// [`crate::Recovery::HonourLeases`]); on the shared backend, InFlight until its lease
    /// ends.
    ///
    /// Retry it with the same [`crate::ClaimOptions::claim_id`]: if the claim holds the
    /// key, the retry gets that lease back (`Acquired`, same token and attempt) instead of
    /// waiting out the whole lease; if it does not, the retry claims the key afresh.
    OutcomeUnknown(Arc<str>),
    /// A stored record failed its checksum, does not match its key, or is missing although
    /// the index still names it (the file lost a write): it is not replayed, and the call
    /// does not retry a read that cannot succeed. Counted in [`crate::Stats::corrupt_reads`].
    /// Stop the engine and verify the file (`idemkv verify`).
    Corrupted(Arc<str>),
    /// The call had to look at its key again too many times in a row (the token reservation
    /// or the key's stored record changed under it each time). Nothing changed; retry.
    Contended,
    /// The engine was closed.
    Closed,
    /// [`crate::ClaimOptions::retention`] asked for more than the engine keeps a key
    /// (ten years). Nothing changed; ask for less.
    RetentionTooLong {
        /// The retention asked for.
        asked: Duration,
        /// The longest retention accepted.
        max: Duration,
    },
    /// The shared database refused the call, or could not be reached, and nothing changed
    /// (feature `postgres`): [`crate::error::DatabaseError::kind`] says what to do.
    #[cfg(feature = "postgres")]
    Database(crate::model::database_error::DatabaseError),
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::KeyTooLong { len, max } => {
                write!(f, "key of {len} bytes exceeds the maximum of {max}")
            }
            ClaimError::KeyEmpty => f.write_str("empty key"),
            ClaimError::ScopeTooLong { len, max } => {
                write!(f, "scope of {len} bytes exceeds the maximum of {max}")
            }
            ClaimError::FingerprintMismatch => {
                f.write_str("the key was used before with a different request fingerprint")
            }
            ClaimError::Overloaded(limit) => write!(f, "overloaded: {limit} reached; retry later"),
            ClaimError::TokensExhausted => f.write_str("fencing tokens exhausted"),
            ClaimError::Poisoned(why) => write!(f, "engine poisoned by a storage failure: {why}"),
            ClaimError::OutcomeUnknown(why) => {
                write!(
                    f,
                    "outcome unknown, the engine failed before confirming: {why}"
                )
            }
            ClaimError::Corrupted(why) => write!(f, "stored record is corrupted: {why}"),
            ClaimError::Contended => {
                f.write_str("the key kept changing while the call looked at it; retry")
            }
            ClaimError::Closed => f.write_str("engine closed"),
            ClaimError::RetentionTooLong { asked, max } => {
                write!(f, "retention of {asked:?} exceeds the maximum of {max:?}")
            }
            #[cfg(feature = "postgres")]
            ClaimError::Database(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ClaimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            #[cfg(feature = "postgres")]
            ClaimError::Database(e) => Some(e),
            _ => None,
        }
    }
}

/// Why a lease operation ([`crate::Lease::complete`], `release`, `extend`, `set_checkpoint`,
/// or the token forms on [`crate::Engine`]) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseError {
    /// The token no longer owns the key: its lease was taken over by a newer token, or the
    /// key was released, completed by another token, or expired. Nothing changed; the work
    /// done under this token must not be reported as the key's outcome.
    LeaseLost,
    /// The response is larger than the configured maximum, so it can never be stored.
    /// Nothing changed and the key is **not** released (also not by a consumed
    /// [`crate::Lease`]): the work is done, and handing the key to the next caller at once
    /// would run it again. The key stays InFlight under this token until its lease ends:
    /// other callers see `InProgress` (waiters keep waiting), and the first claim after the
    /// lease ended takes the key over (attempt + 1). Until then the holder may still
    /// [`crate::Engine::complete`] with a response that fits, or [`crate::Engine::release`]
    /// the key on purpose, with its token.
    ResponseTooLarge {
        /// Length of the response given.
        len: usize,
        /// Largest response accepted.
        max: usize,
    },
    /// The checkpoint payload is larger than the configured maximum. The lease is still held.
    CheckpointTooLarge {
        /// Length of the payload given.
        len: usize,
        /// Largest payload accepted.
        max: usize,
    },
    /// The key is longer than the configured maximum (token forms only).
    KeyTooLong {
        /// Length of the key given.
        len: usize,
        /// Longest key accepted.
        max: usize,
    },
    /// The scope is longer than the engine accepts (255 bytes; token forms only).
    ScopeTooLong {
        /// Length of the scope given.
        len: usize,
        /// Longest scope accepted.
        max: usize,
    },
    /// The writer queue stayed full until the lease ended. A holder's call (`complete`,
    /// `release`, `extend`, `checkpoint`) waits for room in the queue while its lease lasts
    /// (on the engine's clock) instead of failing; this is what it reports if the lease
    /// ended first. Nothing changed and the key is not released: it stays InFlight under this
    /// token with its lease over, so the next claim takes it over (attempt + 1).
    Overloaded(Limit),
    /// A storage failure stopped the engine; it acknowledges nothing more. Reopen it.
    Poisoned(Arc<str>),
    /// The change was applied in memory and queued, but the engine failed before it was
    /// confirmed durable. After a reopen it may or may not be there.
    OutcomeUnknown(Arc<str>),
    /// The engine was closed.
    Closed,
    /// The writes attached to a completion or checkpoint (with those staged on the lease)
    /// are over a limit of one write set. Nothing was queued or applied; as for
    /// [`LeaseError::ResponseTooLarge`], a consumed [`crate::Lease`] does **not** release the
    /// key: it stays InFlight under this token until its lease ends. Split the writes, or
    /// settle the key with [`crate::Engine::complete_with`] and writes that fit.
    WriteSet(WriteSetError),
    /// Writes were staged on a lease that is already settled (completed, released or
    /// detached): they would never be applied, so they are refused.
    Settled,
    /// [`crate::CompleteOptions::retention`] asked for more than the engine keeps a key
    /// (ten years). Nothing changed and, as for `ResponseTooLarge`, the key is not released:
    /// it stays InFlight under this token until its lease ends, and the holder may still
    /// complete it with a retention that fits.
    RetentionTooLong {
        /// The retention asked for.
        asked: Duration,
        /// The longest retention accepted.
        max: Duration,
    },
    /// The shared database refused the call, or could not be reached, and nothing changed:
    /// the key is as it was, still held under this token (feature `postgres`).
    /// [`crate::error::DatabaseError::kind`] says what to do.
    #[cfg(feature = "postgres")]
    Database(crate::model::database_error::DatabaseError),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::LeaseLost => f.write_str("lease lost: a newer token owns the key"),
            LeaseError::ResponseTooLarge { len, max } => {
                write!(f, "response of {len} bytes exceeds the maximum of {max}")
            }
            LeaseError::CheckpointTooLarge { len, max } => {
                write!(f, "checkpoint of {len} bytes exceeds the maximum of {max}")
            }
            LeaseError::KeyTooLong { len, max } => {
                write!(f, "key of {len} bytes exceeds the maximum of {max}")
            }
            LeaseError::ScopeTooLong { len, max } => {
                write!(f, "scope of {len} bytes exceeds the maximum of {max}")
            }
            LeaseError::Overloaded(limit) => {
                write!(f, "overloaded: {limit} reached for the whole lease")
            }
            LeaseError::Poisoned(why) => write!(f, "engine poisoned by a storage failure: {why}"),
            LeaseError::OutcomeUnknown(why) => {
                write!(
                    f,
                    "outcome unknown, the engine failed before confirming: {why}"
                )
            }
            LeaseError::Closed => f.write_str("engine closed"),
            LeaseError::WriteSet(e) => write!(f, "the attached writes were refused: {e}"),
            LeaseError::Settled => {
                f.write_str("the lease is already settled; staged writes would not be applied")
            }
            LeaseError::RetentionTooLong { asked, max } => {
                write!(f, "retention of {asked:?} exceeds the maximum of {max:?}")
            }
            #[cfg(feature = "postgres")]
            LeaseError::Database(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LeaseError::WriteSet(e) => Some(e),
            #[cfg(feature = "postgres")]
            LeaseError::Database(e) => Some(e),
            _ => None,
        }
    }
}

/// Why [`crate::Engine::flush`] or [`crate::Engine::close`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlushError {
    /// A storage failure stopped the engine; acknowledged `Immediate` calls are durable,
    /// later `Buffered` ones may not be. Reopen it.
    Poisoned(Arc<str>),
    /// The engine was closed.
    Closed,
}

impl fmt::Display for FlushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlushError::Poisoned(why) => write!(f, "engine poisoned by a storage failure: {why}"),
            FlushError::Closed => f.write_str("engine closed"),
        }
    }
}

impl std::error::Error for FlushError {}

/// Why the result of a handler that ran could not be stored (see [`RunError::NotStored`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotStoredReason {
    /// The response is larger than [`crate::EngineBuilder::response_len_max`]; it can never
    /// be stored.
    ResponseTooLarge {
        /// Length of the response the handler returned.
        len: usize,
        /// Largest response accepted.
        max: usize,
    },
    /// The writer queue stayed full until the lease ended.
    QueueFull,
    /// [`crate::Engine::run_typed`]: the handler's value could not be encoded.
    Encode(String),
    /// The writes the handler staged ([`crate::Lease::stage`]) are over a limit of one
    /// write set; none was applied.
    WriteSet(WriteSetError),
}

impl fmt::Display for NotStoredReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotStoredReason::ResponseTooLarge { len, max } => {
                write!(f, "response of {len} bytes exceeds the maximum of {max}")
            }
            NotStoredReason::QueueFull => {
                f.write_str("the writer queue stayed full until the lease ended")
            }
            NotStoredReason::Encode(e) => write!(f, "the value could not be encoded: {e}"),
            NotStoredReason::WriteSet(e) => write!(f, "the staged writes were refused: {e}"),
        }
    }
}

impl std::error::Error for NotStoredReason {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NotStoredReason::WriteSet(e) => Some(e),
            _ => None,
        }
    }
}

/// Why a [`crate::WriteSet`] refused an operation: one of its limits
/// (`docs/outbox.md`, "Limits"). The set is unchanged by a refused operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteSetError {
    /// A table name must not be empty.
    TableNameEmpty,
    /// The table name is longer than the limit.
    TableNameTooLong {
        /// Length of the name given, in bytes.
        len: usize,
        /// Longest name accepted.
        max: usize,
    },
    /// The row key is longer than the limit.
    KeyTooLong {
        /// Length of the key given.
        len: usize,
        /// Longest key accepted.
        max: usize,
    },
    /// The row value is larger than the limit.
    ValueTooLarge {
        /// Length of the value given.
        len: usize,
        /// Largest value accepted.
        max: usize,
    },
    /// The outbox message is larger than the limit.
    MessageTooLarge {
        /// Length of the message given.
        len: usize,
        /// Largest message accepted.
        max: usize,
    },
    /// The set already holds the most operations (puts, deletes, messages) one set may.
    TooManyOps {
        /// Most operations in one set.
        max: usize,
    },
    /// The set would hold more bytes (names, keys, values, messages) than one set may.
    TooManyBytes {
        /// Bytes the set would hold.
        len: usize,
        /// Most bytes in one set.
        max: usize,
    },
}

impl fmt::Display for WriteSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteSetError::TableNameEmpty => f.write_str("empty table name"),
            WriteSetError::TableNameTooLong { len, max } => {
                write!(f, "table name of {len} bytes exceeds the maximum of {max}")
            }
            WriteSetError::KeyTooLong { len, max } => {
                write!(f, "row key of {len} bytes exceeds the maximum of {max}")
            }
            WriteSetError::ValueTooLarge { len, max } => {
                write!(f, "row value of {len} bytes exceeds the maximum of {max}")
            }
            WriteSetError::MessageTooLarge { len, max } => {
                write!(
                    f,
                    "outbox message of {len} bytes exceeds the maximum of {max}"
                )
            }
            WriteSetError::TooManyOps { max } => {
                write!(f, "a write set holds at most {max} operations; split it")
            }
            WriteSetError::TooManyBytes { len, max } => write!(
                f,
                "a write set of {len} bytes exceeds the maximum of {max}; split it"
            ),
        }
    }
}

impl std::error::Error for WriteSetError {}

/// Why a read of an application table ([`crate::Engine::table_get`], `table_range`,
/// `table_prefix`) or a call of the outbox relay ([`crate::Outbox`]) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TableError {
    /// The table name or the key is over a limit (it could never have been written).
    Invalid(WriteSetError),
    /// A scan, `pending` or `mark_sent` asked for more rows or messages than one call
    /// returns or removes. Ask for fewer and page.
    LimitTooLarge {
        /// The number asked for.
        limit: usize,
        /// Most one call handles.
        max: usize,
    },
    /// A storage failure stopped the engine; it shows and acknowledges nothing more
    /// (what it held in memory may be lost). Reopen it.
    Poisoned(Arc<str>),
    /// `mark_sent` was queued, but the engine failed before confirming it: after a reopen
    /// the messages may still be pending (and be published again).
    OutcomeUnknown(Arc<str>),
    /// The engine was closed.
    Closed,
    /// The shared database refused the call or could not be reached (feature `postgres`):
    /// [`crate::error::DatabaseError::kind`] says what to do.
    #[cfg(feature = "postgres")]
    Database(crate::model::database_error::DatabaseError),
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::Invalid(e) => write!(f, "invalid table access: {e}"),
            TableError::LimitTooLarge { limit, max } => {
                write!(
                    f,
                    "a limit of {limit} exceeds the maximum of {max} per call"
                )
            }
            TableError::Poisoned(why) => write!(f, "engine poisoned by a storage failure: {why}"),
            TableError::OutcomeUnknown(why) => write!(
                f,
                "outcome unknown, the engine failed before confirming: {why}"
            ),
            TableError::Closed => f.write_str("engine closed"),
            #[cfg(feature = "postgres")]
            TableError::Database(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TableError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TableError::Invalid(e) => Some(e),
            _ => None,
        }
    }
}

/// Why [`crate::Engine::run`] or [`crate::Engine::run_typed`] did not produce an outcome.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError<E> {
    /// The claim failed (see [`ClaimError`]); the handler did not run.
    Claim(ClaimError),
    /// The handler ran, but its result could not be stored because the lease was lost (a
    /// newer token took the key over after the lease ended) or the engine stopped (see
    /// [`LeaseError`]).
    Lease(LeaseError),
    /// The handler ran and its work is done, but the engine refused to store its result
    /// (`reason`). The key is **not** released, so the engine's own limit never turns into
    /// a second run: it stays InFlight under `token` until the lease ends, `retry_after`
    /// from now. Until then every other caller gets `InProgress` (`run`:
    /// [`RunError::StillInProgress`] once its wait runs out); after it, the next claim takes
    /// the key over (attempt + 1) and runs the handler again. Fix the cause (a response that
    /// fits) before that; [`crate::Engine::release`] with `token` gives the key up at once
    /// ([`crate::Engine::release_scoped`] for a key claimed within a scope).
    NotStored {
        /// Why the result could not be stored.
        reason: NotStoredReason,
        /// The token the handler ran under; it still owns the key.
        token: u64,
        /// Time until the lease ends and the key can be taken over (zero if it has ended).
        retry_after: Duration,
    },
    /// The handler returned an error; the claim was released so that a retry (a waiting
    /// caller, or the next one) can run it at once.
    Handler(E),
    /// Another holder still had the key when the wait ran out. Retry after the hint.
    StillInProgress {
        /// When the holder's lease ends, as far as the engine knows.
        retry_after: Duration,
    },
    /// A replayed typed response could not be decoded (see [`crate::Engine::run_typed`]).
    Codec(String),
    /// The key was completed, but its response is no longer kept (a marker answered, see
    /// [`crate::Claim::Forgotten`]); the handler did not run. Run it again only on purpose,
    /// with [`crate::ClaimOptions::rerun_forgotten`].
    Forgotten(crate::model::answer::Forgotten),
}

impl<E> RunError<E> {
    /// The answer of a run whose wait for another holder ran out.
    pub(crate) fn still_in_progress(busy: &crate::model::answer::Busy) -> Self {
        RunError::StillInProgress {
            retry_after: busy.retry_after,
        }
    }
}

impl<E: fmt::Display> fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Claim(e) => write!(f, "claim failed: {e}"),
            RunError::Lease(e) => write!(f, "storing the response failed: {e}"),
            RunError::NotStored {
                reason,
                token,
                retry_after,
            } => write!(
                f,
                "the handler ran but its result was not stored ({reason}); token {token} \
                 keeps the key for {retry_after:?}"
            ),
            RunError::Handler(e) => write!(f, "handler failed: {e}"),
            RunError::StillInProgress { retry_after } => {
                write!(
                    f,
                    "still in progress elsewhere; retry after {retry_after:?}"
                )
            }
            RunError::Codec(e) => write!(f, "typed response codec: {e}"),
            RunError::Forgotten(forgotten) => forgotten.fmt(f),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for RunError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Claim(e) => Some(e),
            RunError::Lease(e) => Some(e),
            RunError::NotStored { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

impl<E> From<ClaimError> for RunError<E> {
    fn from(e: ClaimError) -> Self {
        RunError::Claim(e)
    }
}

impl<E> From<LeaseError> for RunError<E> {
    fn from(e: LeaseError) -> Self {
        RunError::Lease(e)
    }
}

/// Why [`crate::Fingerprint::of`] could not fingerprint a value. Nothing was stored; the
/// value itself is the cause, so the same value fails the same way every time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The value nests deeper than `max` levels (each element, map key or value, field,
    /// `Option` content, newtype or enum variant content is one level). Flatten the request
    /// or fingerprint its bytes.
    TooDeep {
        /// Deepest nesting accepted.
        max: usize,
    },
    /// The value's canonical encoding is longer than `max` bytes. Fingerprint the request's
    /// bytes instead ([`crate::Fingerprint::of_bytes`]), which has no such limit.
    TooLarge {
        /// Longest encoding accepted, in bytes.
        max: usize,
    },
    /// A map has two entries whose keys are the same canonical value (for example a
    /// struct field and a `#[serde(flatten)]`ed map key of the same name, or the keys `1u8`
    /// and `1i64`). Which entry a fingerprint should take is undefined, so none is chosen.
    DuplicateKey,
    /// The value's `Serialize` implementation failed (or broke serde's calling contract);
    /// the message is its own.
    Serialize {
        /// What the implementation reported.
        message: String,
    },
}

impl fmt::Display for FingerprintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FingerprintError::TooDeep { max } => {
                write!(f, "value nests deeper than {max} levels")
            }
            FingerprintError::TooLarge { max } => {
                write!(f, "value's canonical encoding exceeds {max} bytes")
            }
            FingerprintError::DuplicateKey => f.write_str("a map has two equal keys"),
            FingerprintError::Serialize { message } => {
                write!(f, "the value failed to serialize: {message}")
            }
        }
    }
}

impl std::error::Error for FingerprintError {}
