//! `PostgresConfig`: where the shared database is and how the backend talks to it; and
//! `EngineBuilder::postgres`, which stores it in the builder as the opener
//! `EngineBuilder::open` calls (`RemoteOpener`, `api/remote.rs`; implemented in `mod.rs`).

use crate::api::options::EngineBuilder;
use crate::shared::constants::{
    PG_BATCH_LANES_DEFAULT, PG_COMPLETE_LANES_DEFAULT, PG_CONNECT_TIMEOUT_DEFAULT,
    PG_POOL_SIZE_DEFAULT, PG_POOL_SIZE_LIMIT, PG_SCHEMA_LEN_MAX, PG_STATEMENT_TIMEOUT_DEFAULT,
    PG_TABLE_PREFIX_DEFAULT, PG_TABLE_PREFIX_LEN_MAX, PG_TIMEOUT_LIMIT, PG_TIMEOUT_MIN,
};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The settings of the shared backend (feature `postgres`), handed to
/// [`crate::EngineBuilder::postgres`]. The lease, the retention and the size limits stay
/// the builder's.
///
/// ```no_run
/// use idemkv::{Engine, PostgresConfig};
/// use std::time::Duration;
/// let engine = Engine::builder()
///     .postgres(
///         PostgresConfig::new("postgres://app@db.internal/app")
///             .pool_size(16)
///             .statement_timeout(Duration::from_secs(5))
///             .table_prefix("idemkv_"),
///     )
///     .lease(Duration::from_secs(30))
///     .open()?;
/// # Ok::<(), idemkv::OpenError>(())
/// ```
///
/// The URL is the client's (tokio-postgres): `postgres://user:password@host:port/dbname?…`
/// or `host=… user=… dbname=…`, with its standard options (`sslmode`, `application_name`,
/// `options`, several hosts, `target_session_attrs`). `sslmode=require` encrypts every
/// connection and verifies the server's certificate and name against
/// [`tls_root_cert`](Self::tls_root_cert) or the system's trust store; see docs/shared.md
/// ("TLS") for every mode.
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) url: String,
    pub(crate) pool_size: usize,
    pub(crate) statement_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) schema: Option<String>,
    pub(crate) table_prefix: String,
    pub(crate) batch_lanes: usize,
    pub(crate) complete_lanes: usize,
    pub(crate) tls_root_cert: Option<PathBuf>,
    pub(crate) tls_client_cert: Option<(PathBuf, PathBuf)>,
}

impl PostgresConfig {
    /// The database at `url`, with the defaults: a pool of 8 connections, a 5 s statement
    /// timeout, a 5 s connect timeout, the connection's default schema (`search_path`),
    /// and the table prefix `idemkv_`.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig {
            url: url.into(),
            pool_size: PG_POOL_SIZE_DEFAULT,
            statement_timeout: PG_STATEMENT_TIMEOUT_DEFAULT,
            connect_timeout: PG_CONNECT_TIMEOUT_DEFAULT,
            schema: None,
            table_prefix: PG_TABLE_PREFIX_DEFAULT.to_string(),
            batch_lanes: PG_BATCH_LANES_DEFAULT,
            complete_lanes: PG_COMPLETE_LANES_DEFAULT,
            tls_root_cert: None,
            tls_client_cert: None,
        }
    }

    /// Most connections this engine opens for its calls, as they need them (default 8, at
    /// most 1024); one more listens for wake-ups. Eight processes with the default hold at
    /// most 72 connections, within PostgreSQL's default `max_connections = 100`
    /// (docs/shared.md, "Connections"). A call waits for a free connection up to the
    /// connect timeout.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// The server-side `statement_timeout` of every connection (default 5 s, from 1 ms to
    /// 1 h). A statement the server cancels for it changed nothing
    /// (`DatabaseErrorKind::StatementTimeout`). A call whose answer does not arrive within
    /// this plus the connect timeout is given up as `OutcomeUnknown` and its connection
    /// discarded.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// How long opening a connection, or waiting for a free one in the pool, may take
    /// (default 5 s, from 1 ms to 1 h).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The schema that holds the tables (created if missing). Default: none, the
    /// connection's `search_path` decides. Lower-case ASCII letters, digits and `_`, at
    /// most 20 bytes, not starting with a digit.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The prefix of the backend's tables, sequence and notification channel (default
    /// `idemkv_`): engines with different prefixes share nothing. Lower-case ASCII
    /// letters, digits and `_`, at most 30 bytes, not starting with a digit.
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }

    /// Claim statements this engine has in flight at once (default 1, at most the pool
    /// size). Claims asked while every lane is busy wait, and go together in the next
    /// statement, one transaction: a group commit. One lane makes the fewest statements
    /// and commits; more lanes let a claim that waits on a row another process is writing
    /// hold up fewer of this process's claims (docs/shared.md, "Batches").
    pub fn batch_lanes(mut self, lanes: usize) -> Self {
        self.batch_lanes = lanes;
        self
    }

    /// Completion statements this engine has in flight at once (default 1; at least 1, and
    /// never more than the pool size). Completions without writes asked while every lane
    /// is busy wait, and go together in the next statement: one transaction and one WAL
    /// flush for all of them, each still fenced by its own token and answered on its own
    /// (docs/shared.md, "Batches"). A completion with writes or with the application's SQL
    /// always has a statement of its own.
    pub fn complete_lanes(mut self, lanes: usize) -> Self {
        self.complete_lanes = lanes;
        self
    }

    /// Verifies the server's certificate against the CA certificates of this PEM file
    /// (libpq's `sslrootcert`) instead of the system's trust store. With it, the URL's
    /// `sslmode=prefer` (the default) encrypts whenever the server offers TLS; without it,
    /// `prefer` connects in plain text, because no connection is encrypted unverified. The
    /// file is read at open.
    ///
    /// ```no_run
    /// use idemkv::{Engine, PostgresConfig};
    /// let engine = Engine::builder()
    ///     .postgres(
    ///         PostgresConfig::new("postgres://app@db.internal/app?sslmode=require")
    ///             .tls_root_cert("/etc/idemkv/db-ca.pem"),
    ///     )
    ///     .open()?;
    /// # Ok::<(), idemkv::OpenError>(())
    /// ```
    pub fn tls_root_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_root_cert = Some(path.into());
        self
    }

    /// Presents this certificate chain (PEM, the client's certificate first) and its
    /// private key (PEM: PKCS#8, PKCS#1 or SEC1) when the server asks for one (libpq's
    /// `sslcert` and `sslkey`), e.g. for `cert` authentication. Read at open; refused
    /// (`InvalidConfig`) when the connection would be plain text, where it would never be
    /// presented.
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Checks the settings; the message names the one that is out of range.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !(1..=PG_POOL_SIZE_LIMIT).contains(&self.pool_size) {
            return Err(format!("pool_size must be 1..={PG_POOL_SIZE_LIMIT}"));
        }
        if !(1..=self.pool_size).contains(&self.batch_lanes) {
            return Err("batch_lanes must be from 1 to the pool size".to_string());
        }
        if !(1..=PG_POOL_SIZE_LIMIT).contains(&self.complete_lanes) {
            return Err(format!("complete_lanes must be 1..={PG_POOL_SIZE_LIMIT}"));
        }
        for (name, t) in [
            ("statement_timeout", self.statement_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if t < PG_TIMEOUT_MIN || t > PG_TIMEOUT_LIMIT {
                return Err(format!(
                    "{name} must be from {PG_TIMEOUT_MIN:?} to {PG_TIMEOUT_LIMIT:?}"
                ));
            }
        }
        if let Some(schema) = &self.schema {
            identifier("schema", schema, PG_SCHEMA_LEN_MAX, false)?;
        }
        identifier(
            "table_prefix",
            &self.table_prefix,
            PG_TABLE_PREFIX_LEN_MAX,
            true,
        )
    }
}

/// The names are spliced into SQL (identifiers cannot be parameters): only a plain
/// lower-case identifier is accepted, so no quoting or case folding can surprise.
fn identifier(what: &str, s: &str, max: usize, empty_ok: bool) -> Result<(), String> {
    let ok_first = |c: char| c.is_ascii_lowercase() || c == '_';
    let ok = |c: char| ok_first(c) || c.is_ascii_digit();
    let valid = s.len() <= max
        && (empty_ok || !s.is_empty())
        && s.chars().next().is_none_or(ok_first)
        && s.chars().all(ok);
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{what} {s:?} must be lower-case ASCII letters, digits and '_', at most {max} \
             bytes, not starting with a digit"
        ))
    }
}

impl fmt::Debug for PostgresConfig {
    /// The URL is left out: it may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("pool_size", &self.pool_size)
            .field("statement_timeout", &self.statement_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("schema", &self.schema)
            .field("table_prefix", &self.table_prefix)
            .field("batch_lanes", &self.batch_lanes)
            .field("complete_lanes", &self.complete_lanes)
            .field("tls_root_cert", &self.tls_root_cert)
            .field("tls_client_cert", &self.tls_client_cert)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// Keeps the engine's keys in a PostgreSQL database shared by any number of processes
    /// on any number of machines, instead of a file this process owns (feature
    /// `postgres`; docs/shared.md). The API, the state machine and the fencing contract
    /// are the same; the lease, retention, key, response and checkpoint limits and the
    /// sweep interval still come from this builder. The database's commit is the
    /// durability: the durability setting must stay `Immediate` (the default), and no
    /// path or storage backend may be set.
    ///
    /// ```no_run
    /// use idemkv::{Engine, PostgresConfig};
    /// let engine = Engine::builder()
    ///     .postgres(PostgresConfig::new("postgres://app@127.0.0.1/app"))
    ///     .open()?;
    /// # Ok::<(), idemkv::OpenError>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(mut self, config: PostgresConfig) -> Self {
        self.postgres = Some(Arc::new(config));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::PostgresConfig;

    #[test]
    fn out_of_range_settings_are_named() {
        let cfg = || PostgresConfig::new("postgres://localhost/db");
        assert!(cfg().validate().is_ok());
        assert!(cfg()
            .pool_size(0)
            .validate()
            .unwrap_err()
            .contains("pool_size"));
        // At most one lane per pooled connection (8 by default).
        for lanes in [0, 9] {
            let err = cfg().batch_lanes(lanes).validate().unwrap_err();
            assert!(err.contains("batch_lanes"), "{err}");
        }
        assert!(cfg().batch_lanes(8).validate().is_ok());
        assert!(cfg().pool_size(4).batch_lanes(4).validate().is_ok());
        // Completion lanes: at least one; more than the pool are allowed (the pool caps
        // those used), so the default stays valid with `pool_size(1)`.
        for lanes in [0, 1025] {
            let err = cfg().complete_lanes(lanes).validate().unwrap_err();
            assert!(err.contains("complete_lanes"), "{err}");
        }
        assert!(cfg().pool_size(1).validate().is_ok());
        assert!(cfg().complete_lanes(16).validate().is_ok());
        assert!(cfg().table_prefix("Bad").validate().is_err());
    }

    #[test]
    fn the_builder_shows_the_settings_but_never_the_url() {
        let url = "postgres://app:hunter2@db.internal/app";
        let builder =
            crate::EngineBuilder::default().postgres(PostgresConfig::new(url).pool_size(3));
        for shown in [format!("{builder:?}"), format!("{:?}", builder.clone())] {
            assert!(
                shown.contains("postgres: Some(PostgresConfig { pool_size: 3,"),
                "{shown}"
            );
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }
}
