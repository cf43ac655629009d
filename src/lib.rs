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

mod api;
mod base;
#[cfg(feature = "http")]
pub mod http;
mod index;
mod model;
mod runtime;
#[cfg(feature = "postgres")]
mod shared;
mod store;

pub use crate::api::admin::{AbandonedClaim, AbandonedQuery, Admin};
pub use crate::api::async_api::LeaseHandle;
pub use crate::api::engine::Engine;
pub use crate::api::keep_alive::KeepAlive;
pub use crate::api::lease::{Claim, Detached, KeyState, Lease, Outcome, TypedOutcome};
pub use crate::api::options::{ClaimOptions, CompleteOptions, EngineBuilder, OnHandlerError};
pub use crate::api::outbox::{Outbox, OutboxMessage};
#[cfg(feature = "postgres")]
pub use crate::api::postgres_config::PostgresConfig;
pub use crate::api::reader::{FileReader, FileSnapshot};
#[cfg(idemkv_sabotage)]
#[doc(hidden)]
pub use crate::api::sabotage;
pub use crate::api::testing;
pub use crate::base::clock::{Clock, ClockListener, MockClock, SystemClock};
pub use crate::base::hash::key_hash;
pub use crate::model::answer::{Busy, Forgotten, Stored};
pub use crate::model::codec::Checkpoint;
#[cfg(feature = "postgres")]
pub use crate::model::database_error::{DatabaseError, DatabaseErrorKind};
pub use crate::model::error::{
    ClaimError, FingerprintError, FlushError, LeaseError, Limit, NotStoredReason, OpenError,
    OpenErrorKind, RunError, TableError, WriteSetError,
};
pub use crate::model::fingerprint::Fingerprint;
#[cfg(idemkv_sabotage)]
#[doc(hidden)]
pub use crate::model::machine_probe;
pub use crate::model::record_info::{ImportError, RecordInfo, RecordInfoState};
pub use crate::model::settings::{Durability, Recovery};
pub use crate::model::stats::Stats;
pub use crate::model::write_set::{TableRow, WriteSet};
pub use crate::store::backend::{LockKind, Storage};
