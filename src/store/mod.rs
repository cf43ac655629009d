//! The file: record storage in redb, the commit log, the storage trait and the
//! fault-injecting storage. Imports `base` and `model`.

pub(crate) mod backend;
pub(crate) mod batch;
pub(crate) mod chunk;
pub(crate) mod chunk_set;
pub(crate) mod commit_log;
pub(crate) mod config;
pub(crate) mod constants;
pub(crate) mod faulty;
pub(crate) mod faulty_io;
pub(crate) mod faulty_state;
pub(crate) mod head;
pub(crate) mod log_file;
pub(crate) mod log_state;
pub(crate) mod read_only;
pub(crate) mod redb_io;
pub(crate) mod snapshot;
pub(crate) mod storage;
pub(crate) mod tables;
