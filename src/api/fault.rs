//! Fault injection: an engine over storage you provide instead of a file.
//!
//! An application never needs this module: [`crate::EngineBuilder::path`] (or
//! [`crate::Engine::open`]) is the storage of every real deployment. It exists so that a
//! test can put the engine's database and commit log on a [`Storage`] that fails, tears or
//! loses writes where the test says, and check what the engine acknowledges, refuses and
//! recovers afterwards.
//!
//! ```
//! use idemkv::fault::{Storage, WithStorage};
//! use idemkv::{ClaimOptions, Engine};
//! use std::io;
//! use std::sync::Mutex;
//!
//! /// An in-memory image (a real test would fail some of these calls on purpose).
//! #[derive(Debug, Default)]
//! struct Memory(Mutex<Vec<u8>>);
//!
//! impl Storage for Memory {
//!     fn len(&self) -> io::Result<u64> {
//!         Ok(self.0.lock().map_err(|_| io::ErrorKind::Other)?.len() as u64)
//!     }
//!     fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
//!         let data = self.0.lock().map_err(|_| io::ErrorKind::Other)?;
//!         let at = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
//!         let bytes = data.get(at..at + out.len()).ok_or(io::ErrorKind::UnexpectedEof)?;
//!         out.copy_from_slice(bytes);
//!         Ok(())
//!     }
//!     fn set_len(&self, len: u64) -> io::Result<()> {
//!         let len = usize::try_from(len).map_err(|_| io::ErrorKind::OutOfMemory)?;
//!         self.0.lock().map_err(|_| io::ErrorKind::Other)?.resize(len, 0);
//!         Ok(())
//!     }
//!     fn sync_data(&self) -> io::Result<()> {
//!         Ok(())
//!     }
//!     fn write(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
//!         let mut data = self.0.lock().map_err(|_| io::ErrorKind::Other)?;
//!         let at = usize::try_from(offset).map_err(|_| io::ErrorKind::OutOfMemory)?;
//!         if data.len() < at + bytes.len() {
//!             data.resize(at + bytes.len(), 0);
//!         }
//!         data[at..at + bytes.len()].copy_from_slice(bytes);
//!         Ok(())
//!     }
//! }
//!
//! let engine = Engine::builder().backend(Memory::default()).open()?;
//! let opts = ClaimOptions::default();
//! let out = engine.run(b"order-42", &opts, |_lease| Ok::<_, io::Error>(b"done".to_vec()))?;
//! assert!(!out.replayed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why it has this shape: [`Storage`] is implemented outside this crate (the workspace's
//! fault-injecting backend, and any user's own), so it cannot be sealed; and the fault
//! suites run in ordinary and release builds, as a user's own service is built, so it
//! cannot sit behind a test-only cfg either. It is kept out of the everyday surface
//! instead: the types live here, and the builder's storage methods come from the
//! [`WithStorage`] trait, which a test imports and an application never has to.

use crate::api::options::EngineBuilder;
use crate::store::config::BackendSlot;

pub use crate::store::backend::{LockKind, Storage};

/// The builder's storage methods for fault injection: `use idemkv::fault::WithStorage;`
/// brings them into scope. Implemented for [`EngineBuilder`] only (sealed).
pub trait WithStorage: sealed::Sealed + Sized {
    /// Stores the database in a custom [`Storage`] instead of a file at `path` (which is
    /// then only used in messages). A backend serves one open: clones of this builder share
    /// it, and opening a second time is refused with
    /// [`crate::error::OpenError::InvalidConfig`] without touching any file.
    fn backend(self, backend: impl Storage) -> Self;

    /// Stores the commit log in a custom [`Storage`]; only with [`WithStorage::backend`].
    /// Under [`crate::Durability::Immediate`] the engine then writes its commit log there
    /// (without it, a custom backend's group commits are durable redb commits); under
    /// another mode a log it holds is applied at open. As with `backend`, a log storage
    /// serves one open.
    fn log_backend(self, storage: impl Storage) -> Self;
}

impl WithStorage for EngineBuilder {
    fn backend(mut self, backend: impl Storage) -> Self {
        self.backend = Some(BackendSlot::new(backend));
        self
    }

    fn log_backend(mut self, storage: impl Storage) -> Self {
        self.log_backend = Some(BackendSlot::new(storage));
        self
    }
}

mod sealed {
    /// Keeps [`super::WithStorage`] to the engine's own builder.
    pub trait Sealed {}
    impl Sealed for crate::api::options::EngineBuilder {}
}
