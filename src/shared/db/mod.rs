//! The database side: the pool, one call with its timeouts and the sorting of its
//! failures, the schema's creation, and each statement's call (its answer's types and
//! decoding are in `rows.rs`). Here: the pool, the call and the schema; the claims'
//! statements are `claims.rs`; the completions', the checkpoints with writes and the
//! flushes the completions' queue carries `completions.rs`; every other statement `ops.rs`.

use super::batch::{Batcher, Keyed};
use super::direct::{usable_after, Direct, Ran};
use super::error::{DatabaseError, DatabaseErrorKind};
use super::rows::undecodable;
use super::rows::{ClaimRow, Fail};
use super::sql::Sql;
use super::PostgresConfig;
use crate::model::error::OpenError;
use crate::shared::constants::{PG_INTERVAL_MAX, PG_SCHEMA_VERSION, PG_WAKE_STRIPES};
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

mod claims;
mod completions;
mod ops;

pub(crate) use claims::ClaimAsk;
use completions::Settled;
pub(crate) use completions::{CompleteAsk, Writes};

pub(crate) struct Db {
    pool: Pool,
    /// The client configuration, for the listening connection.
    pub(crate) client: tokio_postgres::Config,
    /// The connector of every connection (the client's `sslmode` says whether it is used).
    pub(crate) tls: super::tls::Connector,
    pub(crate) sql: Sql,
    /// How long a call may wait for its answer before it is given up (and its connection
    /// discarded).
    call_timeout: Duration,
    /// Statements executed for callers (not the sweeper's or the listener's).
    pub(crate) round_trips: AtomicU64,
    /// Claims waiting for a statement, and the lanes that send them (`batch.rs`).
    claims: Batcher<ClaimAsk, ClaimRow>,
    /// Completions without writes waiting for a statement, and their lanes (`batch.rs`).
    completions: Batcher<CompleteAsk, Settled>,
    /// How long a completion's marker is kept after its retention (`None`: no markers).
    markers: Option<Duration>,
    /// Connections that the caller's thread drives, for blocking calls (`direct.rs`).
    direct: Direct,
    /// Claims commit without waiting for the WAL flush, which an acquiring claim then
    /// forces (`Sql::claim_early`); set at open where the session can force it.
    early: AtomicBool,
    /// Numbers the flush asks: each is its own key in a batch of completions.
    flush_asks: AtomicU64,
    /// Flush statements sent (`Stats::db_flushes`).
    flushes_sent: AtomicU64,
}

/// A duration as the microseconds a statement takes, capped (see `PG_INTERVAL_MAX`).
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.min(PG_INTERVAL_MAX).as_micros()).unwrap_or(i64::MAX)
}

fn fingerprint_bytes(fp: u128) -> [u8; 16] {
    fp.to_be_bytes()
}

impl Db {
    /// The pool (no connection yet) and the TLS connector; a URL that does not parse is
    /// `Database(Rejected)`, a TLS file that does not load `InvalidConfig`.
    pub(crate) fn new(cfg: &PostgresConfig, markers: Option<Duration>) -> Result<Db, OpenError> {
        let mut client: tokio_postgres::Config = cfg.url.parse().map_err(|e| {
            let mut err = DatabaseError::new(
                DatabaseErrorKind::Rejected,
                format!("the PostgreSQL URL does not parse: {e}"),
            );
            err.source = Some(Arc::new(e));
            OpenError::Database(err)
        })?;
        let tls = super::tls::connector(&mut client, cfg)
            .map_err(|detail| OpenError::InvalidConfig { detail })?;
        client.connect_timeout(cfg.connect_timeout);
        client.keepalives(true);
        if client.get_application_name().is_none() {
            client.application_name("idemkv");
        }
        // The server cancels any statement at the timeout; whatever `options` the URL set
        // comes first, so this one wins.
        let ms = cfg.statement_timeout.as_millis().max(1);
        let options = match client.get_options() {
            Some(o) => format!("{o} -c statement_timeout={ms}"),
            None => format!("-c statement_timeout={ms}"),
        };
        client.options(&options);
        let manager = Manager::from_config(
            client.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // Direct connections come out of the pool's budget (`direct.rs`).
        let direct = super::direct::slots_for(cfg.pool_size, cfg.batch_lanes + cfg.complete_lanes);
        let pool = Pool::builder(manager)
            .max_size(cfg.pool_size - direct)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(cfg.connect_timeout))
            .create_timeout(Some(cfg.connect_timeout))
            .recycle_timeout(Some(cfg.connect_timeout))
            .build()
            .map_err(|e| {
                OpenError::Database(DatabaseError::new(
                    DatabaseErrorKind::Rejected,
                    e.to_string(),
                ))
            })?;
        // A queued claim waits for a lane at most as long as a call waits for its answer.
        let call_timeout = cfg.statement_timeout + cfg.connect_timeout;
        let direct = Direct::new(direct, client.clone(), tls.clone(), cfg.connect_timeout);
        Ok(Db {
            pool,
            client,
            tls,
            sql: Sql::new(cfg.schema.as_deref(), &cfg.table_prefix),
            call_timeout,
            round_trips: AtomicU64::new(0),
            claims: Batcher::new(cfg.batch_lanes, call_timeout),
            completions: Batcher::new(cfg.complete_lanes.min(cfg.pool_size), call_timeout),
            markers,
            direct,
            early: AtomicBool::new(false),
            flush_asks: AtomicU64::new(0),
            flushes_sent: AtomicU64::new(0),
        })
    }

    /// A connection from the pool (opened if needed). Nothing is sent on failure.
    async fn conn(&self) -> Result<Object, Fail> {
        self.pool.get().await.map_err(|e| {
            Fail::Refused(match e {
                deadpool_postgres::PoolError::Backend(e) => {
                    DatabaseError::from_client(e, "connecting")
                }
                other => DatabaseError::new(
                    DatabaseErrorKind::Unavailable,
                    format!("no connection: {other}"),
                ),
            })
        })
    }

    /// Sorts a client error: an error the server answered with (other than a connection
    /// ended by the server) changed nothing and leaves the connection usable; anything
    /// else discards the connection, and after the statement was sent its outcome is
    /// unknown.
    fn failed(&self, conn: Object, e: tokio_postgres::Error, sent: bool) -> Fail {
        let (fail, usable) = sort_failure(e, sent);
        if !usable {
            drop(Object::take(conn));
        }
        fail
    }

    /// Runs one statement (prepared once per connection) and returns its rows. `counted`:
    /// a caller's round trip (`Stats::db_round_trips`).
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        counted: bool,
    ) -> Result<Vec<Row>, Fail> {
        if let Some(answer) = self.direct(sql, params, counted) {
            return answer;
        }
        // A pooled connection the server has closed meanwhile is noticed before anything is
        // sent on it, and replaced once.
        let mut tries = 0;
        let (conn, stmt) = loop {
            tries += 1;
            let conn = self.conn().await?;
            if conn.is_closed() && tries < 2 {
                drop(Object::take(conn));
                continue;
            }
            match tokio::time::timeout(self.call_timeout, conn.prepare_cached(sql)).await {
                Ok(Ok(stmt)) => break (conn, stmt),
                Ok(Err(e)) => match self.failed(conn, e, false) {
                    Fail::Refused(e) if tries < 2 && e.kind == DatabaseErrorKind::Unavailable => {
                        continue
                    }
                    other => return Err(other),
                },
                Err(_) => {
                    drop(Object::take(conn));
                    return Err(Fail::Refused(DatabaseError::new(
                        DatabaseErrorKind::Unavailable,
                        "no answer to the statement's preparation in time",
                    )));
                }
            }
        };
        self.count_trip(counted);
        let answer = tokio::time::timeout(self.call_timeout, conn.query(&stmt, params)).await;
        self.rows(conn, answer)
    }

    /// The rows a statement sent on `conn` answered, or why not: its error, or no answer
    /// within the call timeout (the connection is dropped, and the statement's outcome is
    /// unknown).
    fn rows(
        &self,
        conn: Object,
        answer: Result<Result<Vec<Row>, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> Result<Vec<Row>, Fail> {
        match answer {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(self.failed(conn, e, true)),
            Err(_) => {
                drop(Object::take(conn));
                Err(self.no_answer())
            }
        }
    }

    /// A statement sent and not answered within the call timeout: its outcome is unknown.
    fn no_answer(&self) -> Fail {
        Fail::Unknown(Arc::from(format!(
            "no answer from the database within {:?}",
            self.call_timeout
        )))
    }

    /// Counts a caller's round trip (`Stats::db_round_trips`) as its statement is sent.
    fn count_trip(&self, counted: bool) {
        if counted {
            self.round_trips.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `stmt` on a direct connection of this thread (`direct.rs`), answered or failed as
    /// on a pooled one; `None` leaves it to the pool. `counted` as for [`Db::query`].
    fn direct(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        counted: bool,
    ) -> Option<Result<Vec<Row>, Fail>> {
        let ran = self
            .direct
            .run(sql, params, self.call_timeout, &|| self.count_trip(counted))?;
        Some(match ran {
            Ran::Rows(rows) => Ok(rows),
            Ran::NotSent(e) => Err(sort_failure(e, false).0),
            Ran::Failed(e) => Err(sort_failure(e, true).0),
            Ran::Ended => Err(Fail::Unknown(Arc::from(
                "the connection ended before the database answered",
            ))),
            Ran::TimedOut => Err(self.no_answer()),
        })
    }

    /// Runs one statement unprepared, as the protocol's unnamed statement with its
    /// parameters' types given, so that the server plans it for these parameters and the
    /// table as it is now, in the same round trip; returns its rows. For a statement whose
    /// plan depends on the table's size: a prepared one keeps the plan made when it was
    /// prepared, and one made while the table was nearly empty scans it whole once it has
    /// grown. Only the sweeper sends such a statement, from the backend's runtime, so it
    /// always goes through the pool (a direct connection serves a blocking call's
    /// thread). `counted` as for [`Db::query`].
    pub(crate) async fn query_planned(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        counted: bool,
    ) -> Result<Vec<Row>, Fail> {
        // A pooled connection the server has closed meanwhile is replaced once, before
        // anything is sent on it.
        let mut conn = self.conn().await?;
        if conn.is_closed() {
            drop(Object::take(conn));
            conn = self.conn().await?;
        }
        self.count_trip(counted);
        let answer = tokio::time::timeout(self.call_timeout, conn.query_typed(sql, params)).await;
        self.rows(conn, answer)
    }

    /// Creates the schema if this database does not have it yet, or upgrades it from the
    /// version before, under an advisory lock so that engines opening at once do it once;
    /// refuses a schema of another version.
    pub(crate) async fn migrate(&self) -> Result<(), DatabaseError> {
        let refused = |f: Fail| match f {
            Fail::Refused(e) => e,
            Fail::Unknown(why) => DatabaseError::new(DatabaseErrorKind::Unavailable, &*why),
        };
        // The usual case, without a lock or DDL: the version row is there.
        match self.query(&self.sql.version, &[], false).await {
            Ok(rows) => {
                if let Some(row) = rows.first() {
                    let v: i64 = row
                        .try_get(0)
                        .map_err(|e| DatabaseError::from_client(e, "reading the schema version"))?;
                    if self.sql.upgrade(v).is_none() {
                        return check_version(v);
                    }
                }
            }
            Err(Fail::Refused(e)) if e.kind == DatabaseErrorKind::Schema => {}
            Err(e) => return Err(refused(e)),
        }
        let mut conn = self.conn().await.map_err(refused)?;
        let lock = i64::from_ne_bytes(
            crate::model::codec::fnv1a64(self.sql.keys.as_bytes()).to_ne_bytes(),
        );
        let work = async {
            let tx = conn.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock])
                .await?;
            if let Some(create) = &self.sql.create_schema {
                tx.batch_execute(create).await?;
            }
            tx.batch_execute(&self.sql.create_meta()).await?;
            let found = tx.query_opt(&self.sql.version, &[]).await?;
            let version = match found {
                Some(row) => Some(row.try_get::<_, i64>(0)?),
                None => None,
            };
            // A fresh database gets the current schema; one of the version before is
            // upgraded in place (the last statement of each list writes the version row).
            let steps = match version {
                None => Some(&self.sql.create[..]),
                Some(v) => self.sql.upgrade(v),
            };
            if let Some(steps) = steps {
                let (last, ddl) = steps.split_last().unzip();
                for stmt in ddl.unwrap_or_default() {
                    tx.batch_execute(stmt).await?;
                }
                if let Some(version_row) = last {
                    tx.execute(version_row.as_str(), &[&PG_SCHEMA_VERSION])
                        .await?;
                }
            }
            tx.commit().await?;
            Ok::<_, tokio_postgres::Error>(version.filter(|v| self.sql.upgrade(*v).is_none()))
        };
        let timeout = self.call_timeout * 4;
        match tokio::time::timeout(timeout, work).await {
            Ok(Ok(Some(v))) => check_version(v),
            Ok(Ok(None)) => Ok(()),
            Ok(Err(e)) => Err(DatabaseError::from_client(e, "creating the schema")),
            Err(_) => {
                drop(Object::take(conn));
                Err(DatabaseError::new(
                    DatabaseErrorKind::Unavailable,
                    "creating the schema took longer than four call timeouts",
                ))
            }
        }
    }

    /// Flush statements sent (`Stats::db_flushes`).
    pub(crate) fn flushes(&self) -> u64 {
        self.flushes_sent.load(Ordering::Relaxed)
    }

    /// Claims that waited for a lane (`Stats::db_claims_batched`).
    pub(crate) fn claims_batched(&self) -> u64 {
        self.claims.queued()
    }

    /// Completions that waited for a lane (`Stats::db_completions_batched`).
    pub(crate) fn completions_batched(&self) -> u64 {
        self.completions.queued()
    }

    pub(crate) fn close(&self) {
        self.pool.close();
        self.direct.close();
    }
}

/// What a client error means for the call, and whether its connection stays usable: an
/// error the server answered with (other than a connection it ended) changed nothing and
/// leaves the connection usable; after anything else the connection is discarded, and a
/// statement already sent has an unknown outcome.
fn sort_failure(e: tokio_postgres::Error, sent: bool) -> (Fail, bool) {
    if usable_after(&e) {
        return (
            Fail::Refused(DatabaseError::from_client(e, "the statement failed")),
            true,
        );
    }
    let fail = if sent {
        Fail::Unknown(Arc::from(format!(
            "the connection failed before the database answered: {e}"
        )))
    } else {
        Fail::Refused(DatabaseError::from_client(e, "the connection failed"))
    };
    (fail, false)
}

/// A key's wake-up stripe (see `Sql::complete`).
pub(crate) fn wake_stripe(hash: u64) -> i32 {
    i32::try_from(hash % u64::from(PG_WAKE_STRIPES)).unwrap_or(0)
}

/// The asks' indexes in the order of their keys: a batch locks its rows in that order.
fn sorted<A: Keyed>(asks: &[&A]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..asks.len()).collect();
    order.sort_unstable_by(|&a, &b| asks[a].key().cmp(asks[b].key()));
    order
}

/// Puts each row of a batch into the answer of its ask: the row's first column `n` counts
/// the sorted keys from 1 (`order` maps them back). A row naming no key is ignored.
fn fill<T>(
    answers: &mut [Result<T, Fail>],
    order: &[usize],
    rows: &[Row],
    decode: impl Fn(&Row) -> Result<T, Fail>,
) -> Result<(), Fail> {
    for row in rows {
        let n: i64 = row.try_get(0).map_err(undecodable)?;
        let slot = usize::try_from(n - 1)
            .ok()
            .and_then(|s| order.get(s))
            .and_then(|&i| answers.get_mut(i));
        if let Some(slot) = slot {
            *slot = decode(row);
        }
    }
    Ok(())
}

fn check_version(v: i64) -> Result<(), DatabaseError> {
    if v == PG_SCHEMA_VERSION {
        return Ok(());
    }
    Err(DatabaseError::new(
        DatabaseErrorKind::Schema,
        format!(
            "the database holds idemkv schema version {v}; this build reads version \
             {PG_SCHEMA_VERSION} only"
        ),
    ))
}

/// Tokens are below 2^63 (they come from a `bigint` sequence); a larger one names no row.
fn token_param(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(-1)
}
