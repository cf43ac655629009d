//! # idemkv — an embedded idempotency engine
//!
//! Idempotency checks that *look the key up, then act* break when two copies of a message
//! arrive at once: both see "not found", both act. idemkv makes the check and the write one
//! atomic step. A lock-striped in-memory index decides every claim; an embedded
//! [redb](https://docs.rs/redb) file, written through a commit log with group commit, makes
//! the decisions durable. It is a library: the engine lives in your process, and one
//! [`Engine`] (`Clone + Send + Sync`) serves all of its threads and tasks.
//!
//! ```
//! use idemkv::{ClaimOptions, Durability, Engine};
//! # fn charge_card() -> Vec<u8> { b"charged".to_vec() }
//! let engine = Engine::builder().durability(Durability::None).open()?; // or Engine::open(path)
//! let opts = ClaimOptions::default().payload(b"{\"order\":42}");
//! // However many copies of the message arrive at once, the card is charged once, and every
//! // copy gets the same response.
//! let out = engine.run(b"order-42", &opts, |_lease| Ok::<_, std::io::Error>(charge_card()))?;
//! assert_eq!(out.response(), b"charged");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The model: claim, lease, complete, replay
//!
//! Each key (up to 255 bytes, within an optional [scope](ClaimOptions::scope)) follows one
//! state machine: **Absent** → **InFlight** → **Completed** → Absent again after its
//! retention.
//!
//! 1. **Claim.** [`Engine::claim`] decides atomically. The first caller gets
//!    [`Claim::Acquired`] with a [`Lease`]; a caller while that lease is live gets
//!    [`Claim::InProgress`] (with a hint of when to retry); a caller after the completion
//!    gets [`Claim::Completed`] with the stored response. A claim with another request's
//!    fingerprint ([`ClaimOptions::payload`]) is refused with
//!    [`ClaimError::FingerprintMismatch`]: a key reused for another request never replays
//!    the wrong response.
//! 2. **Lease and fencing token.** A lease is the exclusive right to act for the key until
//!    its deadline. It carries a fencing token ([`Lease::token`]); pass it to downstream
//!    systems so that they refuse writes from a superseded holder. Tokens are unique and
//!    strictly increasing per file, across restarts and crashes, but **not dense**: after a
//!    restart they jump by up to about 2²² (4 Mi), so never use them as ids or counters.
//! 3. **Decide.** Only an explicit decision gives the key back: [`Lease::complete`] stores
//!    the response, [`Lease::release`] forgets the attempt (the key is new again),
//!    [`Lease::fail`] ends the attempt but keeps its checkpoint for the next one. A lease
//!    dropped without a decision (a panic, an early return, a cancelled future) keeps the
//!    key InFlight until the lease ends, as if its holder had crashed; then the next claim
//!    takes it over (attempt + 1, checkpoint handed over).
//! 4. **Replay.** Every later copy, until the key's retention ends, gets the stored
//!    response. [`Engine::run`] (and [`Engine::run_async`], [`Engine::run_typed`]) does all
//!    of this for you: claim, wait for a holder, run the handler with its lease renewed,
//!    complete, and hand every caller the same bytes ([`Outcome::replayed`] tells which
//!    caller ran it).
//!
//! Every call has a blocking and an async form; the async futures are woken by the engine
//! itself and run on any executor. Operator calls (listing records, force-releasing a stuck
//! claim, imports, sweeps, abandoned claims) sit behind [`Engine::admin`]; a file can be
//! read by other processes while the engine runs ([`admin::FileReader`]). [`WriteSet`]
//! commits writes to your own tables and messages for an [`Outbox`] in the same transaction
//! as a completion; [`testing`] helps test a handler against concurrent duplicates.
//!
//! # Where things are
//!
//! The crate root holds what a service uses every day: [`Engine`] and its
//! [`EngineBuilder`], the options of a call, [`Claim`] and [`Lease`], the clocks, and the
//! errors of the everyday calls ([`OpenError`], [`ClaimError`], [`LeaseError`],
//! [`RunError`]). Three modules hold the rest:
//!
//! - [`error`]: every error type (the four above too), e.g. [`error::FlushError`],
//!   [`error::WriteSetError`], [`error::Limit`].
//! - [`admin`]: operator tools: [`admin::Admin`], [`admin::FileReader`], the record and
//!   abandoned-claim listings, [`admin::key_hash`].
//! - [`fault`]: fault injection, an engine over a [`fault::FaultyStorage`] that fails,
//!   stalls or loses power where a test says; only tests need it.
//!
//! Performance knobs (index stripes, queue depth, sweep interval) are grouped in
//! [`Tuning`] ([`EngineBuilder::tuning`]); their defaults suit most services.
//!
//! # Durability and recovery
//!
//! A call that changes a key returns `Ok` (is *acknowledged*) only once it is as durable as
//! the engine's [`Durability`] promises:
//!
//! | mode | a call returns | a crash (kill -9, power loss) loses |
//! |---|---|---|
//! | [`Durability::Immediate`] (default) | after its record is fsynced, in a group commit shared with every concurrent call | nothing acknowledged |
//! | [`Durability::Buffered`] | at once; fsynced within about `max_delay` | at most the calls of about the last `2 × max_delay`, also under overload (excess claims are refused with [`ClaimError::Overloaded`]) |
//! | [`Durability::None`] | at once (memory only, no file) | everything |
//!
//! In every mode another caller is shown a completion only once it is durable as promised,
//! so no replayed response is ever lost, and a duplicate never runs while a live lease or a
//! stored completion exists. A lost call is as if it never happened: after the restart the
//! key is in its earlier state, and the next delivery runs the work again.
//!
//! With a file, each group commit is one synchronous append to a preallocated commit log
//! beside the database (the same path with `-log` appended, 16 MiB); an applier moves the
//! acknowledged batches into the redb file. Keep the two together: copy or move both. On
//! [open](EngineBuilder::open) the engine applies what the log holds, then decides what to
//! do with the claims a dead process left InFlight ([`Recovery`]: by default the next claim
//! takes them over at once). A file that cannot be opened is never truncated or started
//! afresh: [`OpenError::kind`] says why. A failed write or fsync poisons the engine (it
//! acknowledges nothing more; reopening recovers).
//!
//! A file belongs to one process (redb locks it). When several processes must agree on a
//! key, the `postgres` feature runs the same [`Engine`] API over a shared PostgreSQL
//! database (`EngineBuilder::postgres`).
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `http` | off | `idemkv::http`: a tower/axum layer for the `Idempotency-Key` header (stored responses replayed with `Idempotent-Replayed: true`, 409 for a duplicate in flight, 422 for a key reused with another request) |
//! | `postgres` | off | `EngineBuilder::postgres`, `PostgresConfig`: the shared backend, the same API over a PostgreSQL database shared by many processes |
//! | `tracing` | off | a `DEBUG` span per claim and settlement, with the outcome and a hash of the key (raw keys only with `EngineBuilder::log_raw_keys`) |
//! | `metrics` | off | every [`Stats`] counter as an `idemkv_*` metric, commit latency and batch size histograms, gauges of the queue and the keys |
//!
//! Neither `tracing` nor `metrics` installs a subscriber or a recorder: the application
//! does.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod api;
mod base;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod index;
mod model;
mod runtime;
#[cfg(feature = "postgres")]
mod shared;
mod store;

pub mod admin {
    //! Operator tools: the [`Admin`] handle of a running engine ([`crate::Engine::admin`]:
    //! listing records, force-releasing a stuck claim, imports, sweeps, abandoned claims),
    //! reading a file from another process while the engine runs ([`FileReader`]), and
    //! [`key_hash`], the hash a log line carries instead of the key.
    pub use crate::api::admin::{AbandonedClaim, AbandonedQuery, Admin};
    pub use crate::api::reader::{FileReader, FileSnapshot};
    pub use crate::base::hash::key_hash;
    pub use crate::model::record_info::{RecordInfo, RecordInfoState};
}
pub mod error {
    //! Every error type of the engine. The four that the everyday calls return are also at
    //! the crate root: [`OpenError`] ([`crate::EngineBuilder::open`]), [`ClaimError`]
    //! ([`crate::Engine::claim`]), [`LeaseError`] ([`crate::Lease::complete`] and the other
    //! decisions) and [`RunError`] ([`crate::Engine::run`]).
    //!
    //! Every error enum is `#[non_exhaustive]`: match it with a wildcard arm.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub use crate::model::database_error::{DatabaseError, DatabaseErrorKind};
    pub use crate::model::error::{
        ClaimError, FingerprintError, FlushError, LeaseError, Limit, NotStoredReason, OpenError,
        OpenErrorKind, RunError, TableError, WriteSetError,
    };
    pub use crate::model::record_info::ImportError;
}
pub use crate::api::async_api::LeaseHandle;
pub use crate::api::engine::Engine;
pub use crate::api::fault;
pub use crate::api::keep_alive::KeepAlive;
pub use crate::api::lease::{Claim, Detached, Lease, Outcome, TypedOutcome};
pub use crate::api::options::{
    ClaimOptions, CompleteOptions, EngineBuilder, OnHandlerError, Tuning,
};
pub use crate::api::outbox::{Outbox, OutboxMessage};
#[cfg(idemkv_sabotage)]
#[doc(hidden)]
pub use crate::api::sabotage;
pub use crate::api::testing;
pub use crate::base::clock::{Clock, MockClock, SystemClock};
pub use crate::model::answer::{Busy, Forgotten, KeyState, Stored};
pub use crate::model::codec::Checkpoint;
pub use crate::model::error::{ClaimError, LeaseError, OpenError, RunError};
pub use crate::model::fingerprint::Fingerprint;
#[cfg(idemkv_sabotage)]
#[doc(hidden)]
pub use crate::model::machine_probe;
pub use crate::model::settings::{Durability, Recovery};
pub use crate::model::stats::Stats;
pub use crate::model::write_set::{TableRow, WriteSet};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use crate::shared::PostgresConfig;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    //! What only a shared (PostgreSQL) engine can do: a lease's completion in a transaction
    //! that also runs the application's own statements ([`PostgresLease`], from
    //! [`crate::Lease::into_postgres`]), and the client those statements are written with.
    pub use crate::shared::PostgresLease;
    /// The PostgreSQL client the shared backend uses, for the application's own statements
    /// in a completion's transaction ([`PostgresLease::complete_in_transaction`]).
    pub use tokio_postgres;
}

/// The README's examples, compiled by `cargo test --doc` (one of them needs the `http`
/// feature).
#[cfg(all(doctest, feature = "http"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
