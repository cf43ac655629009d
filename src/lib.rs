//! # idemkv — an embedded idempotency engine
//!
//! Idempotency checks that *look the key up, then act* break when two copies of a message
//! arrive at once: both see "not found", both act. idemkv makes the check and the write one
//! atomic compare-and-set. A lock-striped in-memory index decides every claim; an embedded
//! [redb](https://docs.rs/redb) file makes the decisions durable through a background
//! group-commit writer.
//!
//! Each key follows one state machine: **Absent** → **InFlight** (a lease and a fencing
//! token) → **Completed** (the stored response) → Absent again after its retention.
//!
//! ```
//! use idemkv::{ClaimOptions, Durability, Engine};
//! # fn charge_card() -> Vec<u8> { b"charged".to_vec() }
//! let engine = Engine::builder().durability(Durability::None).open()?;
//! let opts = ClaimOptions::default().payload(b"{\"order\":42}");
//! // However many copies of the message arrive at once, the card is charged once, and every
//! // copy gets the same response.
//! let out = engine.run(b"order-42", &opts, |_lease| Ok::<_, std::io::Error>(charge_card()))?;
//! assert_eq!(out.response(), b"charged");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `docs/design.md` for the contract, the invariants and the durability modes.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

mod admin;
mod admission;
mod apply;
mod async_api;
mod backend;
mod claim;
mod clock;
mod codec;
mod commit_log;
mod constants;
mod engine;
mod error;
mod fingerprint;
mod gather;
mod holder;
#[cfg(feature = "http")]
pub mod http;
mod index;
mod keep_alive;
mod lease;
mod log_file;
mod machine;
#[cfg(idemkv_sabotage)]
#[doc(hidden)]
pub mod machine_probe;
mod marker;
mod observe;
mod options;
mod outbox;
mod progress;
mod publication;
mod reader;
mod recovery;
#[cfg(idemkv_sabotage)]
#[doc(hidden)]
pub mod sabotage;
mod scope;
#[cfg(feature = "postgres")]
mod shared;
mod stats;
mod storage;
mod sweep;
mod sync;
mod tables;
pub mod testing;
mod timer;
mod token;
mod wake;
mod write_set;
mod writer;

pub use crate::admin::{
    AbandonedClaim, AbandonedQuery, Admin, ImportError, RecordInfo, RecordInfoState,
};
pub use crate::async_api::LeaseHandle;
pub use crate::backend::{LockKind, Storage};
pub use crate::clock::{Clock, ClockListener, MockClock, SystemClock};
pub use crate::codec::Checkpoint;
pub use crate::engine::Engine;
pub use crate::error::{
    ClaimError, FingerprintError, FlushError, LeaseError, Limit, NotStoredReason, OpenError,
    OpenErrorKind, RunError, TableError, WriteSetError,
};
pub use crate::fingerprint::Fingerprint;
pub use crate::keep_alive::KeepAlive;
pub use crate::lease::{
    Busy, Claim, Detached, Forgotten, KeyState, Lease, Outcome, Stored, TypedOutcome,
};
pub use crate::observe::key_hash;
pub use crate::options::{
    ClaimOptions, CompleteOptions, Durability, EngineBuilder, OnHandlerError, Recovery,
};
pub use crate::outbox::{Outbox, OutboxMessage};
pub use crate::reader::{FileReader, FileSnapshot};
#[cfg(feature = "postgres")]
pub use crate::shared::{DatabaseError, DatabaseErrorKind, PostgresConfig};
pub use crate::stats::Stats;
pub use crate::write_set::{TableRow, WriteSet};
/// The PostgreSQL client the shared backend uses, for the application's own statements in
/// a completion's transaction ([`Lease::complete_in_transaction`]).
#[cfg(feature = "postgres")]
pub use tokio_postgres;
