//! What the store is opened with: the path, the file mode, custom storage. The engine's
//! builder makes one (`EngineBuilder::store_config`); the store never reads the builder.

use crate::base::sync::{Arc, Mutex};
use crate::model::error::OpenError;
use crate::store::backend::Storage;
use std::path::PathBuf;

/// What the store reads at open.
#[derive(Debug, Clone)]
pub(crate) struct StoreConfig {
    pub(crate) path: Option<PathBuf>,
    pub(crate) file_mode: u32,
    /// Whether group commits are made durable by the commit log (`EngineBuilder::logged`).
    pub(crate) logged: bool,
    /// Custom storage for the file (`EngineBuilder::storage`).
    pub(crate) backend: Option<BackendSlot>,
    /// Custom storage for the commit log.
    pub(crate) log_backend: Option<BackendSlot>,
    /// The test-only sabotage armed on the builder (a `Sabotage` as u8; 0 is none).
    #[cfg(idemkv_sabotage)]
    pub(crate) sabotage: u8,
}

/// A custom storage handed to the builder (fault injection, tests). Clones of the builder
/// share the slot; the first open takes the storage out of it.
pub(crate) struct BackendSlot(pub(crate) Arc<Mutex<Option<Box<dyn Storage>>>>);

impl BackendSlot {
    pub(crate) fn new(storage: impl Storage) -> Self {
        BackendSlot(Arc::new(Mutex::new(Some(Box::new(storage)))))
    }

    /// Takes the backend for an open. A second open of the same backend (through a clone of
    /// the builder) is refused: it must never fall back to a file named after the
    /// placeholder path, nor share one backend between two databases.
    pub(crate) fn take(&self) -> Result<Box<dyn Storage>, OpenError> {
        self.0
            .lock()
            .take()
            .ok_or_else(|| OpenError::InvalidConfig {
                detail: "the storage backend was already used by an earlier open (a clone of \
                     this builder); give each open its own backend"
                    .into(),
            })
    }
}

impl Clone for BackendSlot {
    fn clone(&self) -> Self {
        BackendSlot(self.0.clone())
    }
}

impl std::fmt::Debug for BackendSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackendSlot")
    }
}
