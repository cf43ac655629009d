//! The pure state machine and the values it works on. Imports only `base`.

pub(crate) mod answer;
pub(crate) mod codec;
pub(crate) mod constants;
#[cfg(feature = "postgres")]
pub(crate) mod database_error;
pub(crate) mod error;
pub(crate) mod fingerprint;
pub(crate) mod machine;
#[cfg(idemkv_sabotage)]
pub mod machine_probe;
pub(crate) mod marker;
pub(crate) mod record_info;
pub(crate) mod scope;
pub(crate) mod settings;
pub(crate) mod slot;
pub(crate) mod stats;
pub(crate) mod token;
pub(crate) mod write_set;
