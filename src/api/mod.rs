//! The public engine: `Engine`, its builder and options, leases, admin, outbox, reader, the async API. Imports every layer below.

pub(crate) mod admin;
pub(crate) mod async_api;
pub(crate) mod claim;
pub(crate) mod claim_step;
pub(crate) mod constants;
pub(crate) mod engine;
pub mod fault;
pub(crate) mod holder;
pub(crate) mod keep_alive;
pub(crate) mod lease;
pub(crate) mod options;
pub(crate) mod outbox;
pub(crate) mod reader;
#[cfg(feature = "postgres")]
pub(crate) mod remote;
#[cfg(idemkv_sabotage)]
pub mod sabotage;
pub(crate) mod spans;
pub(crate) mod tables;
pub mod testing;
