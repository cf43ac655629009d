//! Fault injection: an engine over a storage that fails where a test says.
//!
//! An application never needs this module: [`crate::EngineBuilder::path`] (or
//! [`crate::Engine::open`]) is the storage of every real deployment. It exists so that a
//! test can put the engine's database and commit log on a [`FaultyStorage`] that fails,
//! stalls or loses power where the test says, and check what the engine acknowledges,
//! refuses and recovers afterwards.
//!
//! ```
//! use idemkv::fault::{FaultyStorage, WithStorage};
//! use idemkv::{ClaimOptions, Engine};
//! use std::io;
//!
//! let disk = FaultyStorage::memory();
//! let engine = Engine::builder().backend(disk.clone()).open()?;
//! let opts = ClaimOptions::default();
//! let charge = |_lease: &idemkv::Lease| Ok::<_, io::Error>(b"charged".to_vec());
//! engine.run(b"order-42", &opts, charge)?;
//!
//! // The disk fails the next sync: the call is refused, and the engine acknowledges
//! // nothing more.
//! disk.fail_sync_in(1);
//! assert!(engine.run(b"order-43", &opts, charge).is_err());
//! drop(engine);
//!
//! // The power goes: an engine over what the disk had synced replays the acknowledged call.
//! let after = FaultyStorage::from_image(disk.durable_image());
//! let engine = Engine::builder().backend(after).open()?;
//! let out = engine.run(b"order-42", &opts, charge)?;
//! assert_eq!((out.response(), out.replayed()), (&b"charged"[..], true));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why it has this shape: the fault suites run in ordinary and release builds, as a user's
//! own service is built, so fault injection cannot sit behind a test-only cfg. It is kept
//! out of the everyday surface instead: the types live here, and the builder's storage
//! methods come from the sealed [`WithStorage`] trait, which a test imports and an
//! application never has to. The storage is one concrete type, not a trait to implement,
//! so that what the engine asks of its storage (a read past the end, a lock, a sync) stays
//! a contract inside the crate.

use crate::api::options::EngineBuilder;
use crate::store::config::BackendSlot;

pub use crate::store::faulty::{FaultyStorage, Gate};
pub use crate::store::faulty_state::Fault;

/// The builder's storage methods for fault injection: `use idemkv::fault::WithStorage;`
/// brings them into scope. Implemented for [`EngineBuilder`] only (sealed).
pub trait WithStorage: sealed::Sealed + Sized {
    /// Stores the database in `storage` instead of a file at `path` (which is then only
    /// used in messages). A storage serves one open: clones of this builder share it, and
    /// opening a second time is refused with [`crate::error::OpenError::InvalidConfig`]
    /// without touching any file. (A clone of the [`FaultyStorage`] handle, given to a new
    /// builder, opens the same bytes again.)
    fn backend(self, storage: FaultyStorage) -> Self;

    /// Stores the commit log in `storage`; only with [`WithStorage::backend`]. Under
    /// [`crate::Durability::Immediate`] the engine then writes its commit log there
    /// (without it, a custom backend's group commits are durable redb commits); under
    /// another mode a log it holds is applied at open. As with `backend`, a log storage
    /// serves one open.
    fn log_backend(self, storage: FaultyStorage) -> Self;
}

impl WithStorage for EngineBuilder {
    fn backend(mut self, storage: FaultyStorage) -> Self {
        self.backend = Some(BackendSlot::new(storage));
        self
    }

    fn log_backend(mut self, storage: FaultyStorage) -> Self {
        self.log_backend = Some(BackendSlot::new(storage));
        self
    }
}

mod sealed {
    /// Keeps [`super::WithStorage`] to the engine's own builder.
    pub trait Sealed {}
    impl Sealed for crate::api::options::EngineBuilder {}
}
