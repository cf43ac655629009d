//! The database side: the pool, one call with its timeouts and the sorting of its
//! failures, the schema's creation, and each statement's call (its answer's types and
//! decoding are in `rows.rs`).

use super::batch::{Batcher, Keyed};
use super::direct::{usable_after, Direct, Ran};
use super::error::{DatabaseError, DatabaseErrorKind};
use super::rows::{
    attempt_of, checkpoint_of, claim_row, complete_row, done_row, life_column, remaining,
    restarted, token_of, undecodable, wall_ms_of,
};
use super::rows::{ClaimRow, CompleteRow, Fail, GetRow, HookFail, TableRow};
use super::sql::Sql;
use super::PostgresConfig;
use crate::api::lease::Stored;
use crate::model::error::OpenError;
use crate::shared::constants::{
    PG_DEADLOCK_DETECTED, PG_INSUFFICIENT_PRIVILEGE, PG_INTERVAL_MAX, PG_LIFE_READS_MAX,
    PG_SCHEMA_VERSION, PG_SERIALIZATION_FAILURE, PG_SWEEP_BATCH, PG_UNDEFINED_FUNCTION,
    PG_WAKE_STRIPES,
};
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

/// An answer of the completions' queue.
enum Settled {
    Row(CompleteRow),
    /// A flush ask's answer (`Db::flush`): every commit before it is durable.
    Flushed,
}

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

/// A write set as the statements take it: each row's final value (the set's operations
/// apply in order, so a row's last one wins), the rows deleted, the messages.
#[derive(Default)]
pub(crate) struct Writes {
    put_keys: Vec<Vec<u8>>,
    put_values: Vec<Vec<u8>>,
    deletes: Vec<Vec<u8>>,
    messages: Vec<Vec<u8>>,
}

impl Writes {
    pub(crate) fn of(set: &crate::model::write_set::WriteSet) -> Writes {
        let mut last: std::collections::BTreeMap<&[u8], Option<&[u8]>> = Default::default();
        for (row, value) in &set.rows {
            last.insert(&row[..], value.as_deref());
        }
        let mut w = Writes::default();
        for (row, value) in last {
            match value {
                Some(v) => {
                    w.put_keys.push(row.to_vec());
                    w.put_values.push(v.to_vec());
                }
                None => w.deletes.push(row.to_vec()),
            }
        }
        w.messages = set.messages.iter().map(|m| m.to_vec()).collect();
        w
    }
}

/// One claim's question to the database.
#[derive(Debug)]
pub(crate) struct ClaimAsk {
    pub(crate) key: Box<[u8]>,
    pub(crate) fingerprint: Option<crate::model::settings::AskedFingerprint>,
    pub(crate) lease: Duration,
    pub(crate) own_retention: Option<Duration>,
    /// The claim identity it presents (`ClaimOptions::claim_id`).
    pub(crate) claim_id: Option<u128>,
    /// `ClaimOptions::rerun_forgotten`.
    pub(crate) rerun: bool,
}

/// One completion without writes, as a batch sends it.
pub(crate) struct CompleteAsk {
    key: Box<[u8]>,
    token: i64,
    response: Arc<[u8]>,
    own_us: Option<i64>,
    stripe: i32,
    /// Not a completion: an acquisition waiting for the WAL flush (`Db::flush`), with
    /// the lifetime token its claim's statement read.
    flush: Option<i64>,
}

impl Keyed for CompleteAsk {
    fn key(&self) -> &[u8] {
        &self.key
    }
}

impl Keyed for ClaimAsk {
    fn key(&self) -> &[u8] {
        &self.key
    }
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

    /// Whether this session can force the WAL flush and keep the server's lifetime token
    /// (`Sql::can_flush`), and has a token to read: if so, claims commit early from now
    /// on; if not, or if a question fails, they commit as any statement does.
    pub(crate) async fn probe_flush(&self) {
        let can = match self.query(&self.sql.can_flush, &[], false).await {
            Ok(rows) => rows
                .first()
                .and_then(|r| r.try_get(0).ok())
                .unwrap_or(false),
            Err(_) => false,
        };
        let early = can && self.read_life().await.is_ok();
        self.early.store(early, Ordering::Relaxed);
    }

    /// Reads the server's lifetime token, writing a new one where crash recovery (or a
    /// promotion) left none, so that the claims sent from now on read one.
    async fn read_life(&self) -> Result<i64, Fail> {
        let mut last = None;
        for _ in 0..PG_LIFE_READS_MAX {
            match self.query(&self.sql.life, &[], false).await {
                Ok(rows) => {
                    // A row another session wrote meanwhile is missed by this statement's
                    // snapshot, never by the next one's.
                    if let Some(row) = rows.first() {
                        return row.try_get(0).map_err(undecodable);
                    }
                }
                // Under REPEATABLE READ or SERIALIZABLE, the insert that meets a row
                // committed after its snapshot is a serialization failure: read again.
                Err(Fail::Refused(e)) if e.code.as_deref() == Some(PG_SERIALIZATION_FAILURE) => {
                    last = Some(Fail::Refused(e));
                }
                Err(f) => return Err(f),
            }
        }
        Err(last.unwrap_or_else(|| {
            Fail::Unknown(Arc::from("the server's lifetime token could not be read"))
        }))
    }

    /// A claim statement: committed early where the session can force the flush.
    fn claim_sql(&self, batch: bool) -> &str {
        match (self.early.load(Ordering::Relaxed), batch) {
            (true, false) => &self.sql.claim_early,
            (true, true) => &self.sql.claim_batch_early,
            (false, false) => &self.sql.claim,
            (false, true) => &self.sql.claim_batch,
        }
    }

    /// Whether claims commit early (`Sql::claim_early`): an acquisition is then given out
    /// only after [`Db::flush`]. Decided once, at open, before any claim.
    pub(crate) fn commits_early(&self) -> bool {
        self.early.load(Ordering::Relaxed)
    }

    /// Returns once every claim committed before the call is durable. It asks in the
    /// completions' queue (`batch.rs`): a batch of completions that stores a response
    /// commits with the WAL flush, which covers every claim committed before it was
    /// sent; a batch that stores none, or holds only flush asks, sends `Sql::flush`.
    ///
    /// `life` is the lifetime token the claim's own statement read (`ClaimRow::Acquired`):
    /// a flushing commit proves the claim durable only if its statement still reads it. A
    /// crash-restart in between empties the token's table, and the claim may have been
    /// lost although a later commit, on a new connection, succeeds; another server (a
    /// promoted standby) has a token of its own: the answer is then unknown. A claim that
    /// read no token (the first after a crash) is unknown at once, and a new token is
    /// written for the claims that follow.
    pub(crate) async fn flush(&self, retention: Duration, life: Option<i64>) -> Result<(), Fail> {
        let Some(life) = life else {
            let _ = self.read_life().await;
            return Err(restarted());
        };
        let n = self.flush_asks.fetch_add(1, Ordering::Relaxed);
        let ask = CompleteAsk {
            key: Box::from(n.to_ne_bytes()),
            token: 0,
            response: Arc::from(&[][..]),
            own_us: None,
            stripe: 0,
            flush: Some(life),
        };
        match self.settle(ask, micros(retention)).await {
            Ok(Settled::Flushed) => Ok(()),
            Ok(Settled::Row(_)) => Err(Fail::Unknown(Arc::from(
                "a flush was answered as a completion",
            ))),
            Err(f) => Err(f),
        }
    }

    /// An ask of the completions' queue: a completion without writes or a flush.
    async fn settle(&self, ask: CompleteAsk, retention_us: i64) -> Result<Settled, Fail> {
        self.completions
            .ask(ask, async |asks: &[&CompleteAsk]| {
                self.settle_batch(asks, retention_us).await
            })
            .await
    }

    /// One batch of the completions' queue: its completions in one statement (or alone),
    /// then, for its flush asks, a flush statement unless a completion stored a response
    /// under the same lifetime token (its commit was the flush).
    async fn settle_batch(
        &self,
        asks: &[&CompleteAsk],
        retention_us: i64,
    ) -> Vec<Result<Settled, Fail>> {
        let completes: Vec<&CompleteAsk> =
            asks.iter().copied().filter(|a| a.flush.is_none()).collect();
        let flushes = asks.len() - completes.len();
        // With flush asks, even a lone completion goes as a batch: its row names the
        // lifetime token its commit stands under.
        let (done, batch_life) = match &completes[..] {
            [] => (Vec::new(), None),
            [one] if flushes == 0 => (vec![self.complete_one(one, retention_us, None).await], None),
            many => self.complete_batch(many, retention_us, flushes > 0).await,
        };
        let stored = done
            .iter()
            .any(|a| matches!(a, Ok(CompleteRow::Done { repeat: false, .. })));
        let mut done = done.into_iter();
        // Flush asks that the batch's commit does not stand for: the flush statement's.
        let pending = |ask: &CompleteAsk| match ask.flush {
            Some(life) => !(stored && batch_life == Some(life)),
            None => false,
        };
        let mut answers: Vec<Result<Settled, Fail>> = Vec::with_capacity(asks.len());
        let found = match asks.iter().any(|a| pending(a)) {
            true => {
                self.flushes_sent.fetch_add(1, Ordering::Relaxed);
                Some(self.flush_statement().await)
            }
            false => None,
        };
        for ask in asks {
            let answer = match (ask.flush, &found) {
                (Some(life), Some(found)) if pending(ask) => match found {
                    Ok(Some(now)) if *now == life => Ok(Settled::Flushed),
                    Ok(_) => Err(restarted()),
                    Err(f) => Err(f.clone()),
                },
                (Some(_), _) => Ok(Settled::Flushed),
                (None, _) => done.next().map_or_else(
                    || {
                        Err(Fail::Unknown(Arc::from(
                            "the batch gave no answer for this call",
                        )))
                    },
                    |a| a.map(Settled::Row),
                ),
            };
            answers.push(answer);
        }
        match found {
            // The token is gone: a new one, for the claims that follow.
            Some(Ok(None)) => {
                let _ = self.read_life().await;
            }
            // The role may no longer force the flush (a revoke after the open): claims
            // commit with the flush again from now on, rather than each be unknown.
            Some(Err(Fail::Refused(e)))
                if matches!(
                    e.code.as_deref(),
                    Some(PG_INSUFFICIENT_PRIVILEGE | PG_UNDEFINED_FUNCTION)
                ) =>
            {
                self.early.store(false, Ordering::Relaxed);
            }
            _ => {}
        }
        answers
    }

    /// The flush statement: the lifetime token it read (`None`: the row is gone, and it
    /// wrote nothing), once its commit is durable.
    async fn flush_statement(&self) -> Result<Option<i64>, Fail> {
        let rows = self.query(&self.sql.flush, &[], true).await?;
        match rows.first() {
            Some(row) => Ok(Some(row.try_get(0).map_err(undecodable)?)),
            None => Ok(None),
        }
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

    /// One claim's statement: alone, or in a batch with other keys' claims of this
    /// process (`batch.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim(
        &self,
        key: &[u8],
        fingerprint: Option<crate::model::settings::AskedFingerprint>,
        claim_id: Option<u128>,
        lease: Duration,
        retention: Duration,
        own_retention: Option<Duration>,
        rerun: bool,
    ) -> Result<ClaimRow, Fail> {
        let ask = ClaimAsk {
            key: Box::from(key),
            fingerprint,
            lease,
            own_retention,
            claim_id,
            rerun,
        };
        self.claims
            .ask(ask, async |asks: &[&ClaimAsk]| match asks {
                [one] => vec![self.claim_one(one, retention).await],
                many => self.claim_batch(many, retention).await,
            })
            .await
    }

    /// One claim alone (see `Sql::claim`).
    async fn claim_one(&self, ask: &ClaimAsk, retention: Duration) -> Result<ClaimRow, Fail> {
        let (fp, legacy) = fingerprint_params(ask);
        let (fp, legacy) = (fp.as_ref().map(|b| &b[..]), legacy.as_ref().map(|b| &b[..]));
        let (lease_us, retention_us) = (micros(ask.lease), micros(retention));
        let own_us = ask.own_retention.map(micros);
        let id = ask.claim_id.map(u128::to_be_bytes);
        let id = id.as_ref().map(|b| &b[..]);
        let markers = self.markers.is_some();
        let rows = self
            .query(
                self.claim_sql(false),
                &[
                    &&*ask.key,
                    &fp,
                    &legacy,
                    &lease_us,
                    &retention_us,
                    &own_us,
                    &id,
                    &markers,
                    &ask.rerun,
                ],
                true,
            )
            .await?;
        match rows.first() {
            Some(row) => claim_row(row, 0),
            None => Ok(ClaimRow::Again),
        }
    }

    /// Claims of distinct keys in one statement (see `Sql::claim_batch`): one answer per
    /// ask, in the asks' order. The statement claims the keys in sorted order.
    async fn claim_batch(
        &self,
        asks: &[&ClaimAsk],
        retention: Duration,
    ) -> Vec<Result<ClaimRow, Fail>> {
        let order = sorted(asks);
        let fps: Vec<_> = order.iter().map(|&i| fingerprint_params(asks[i])).collect();
        let keys: Vec<&[u8]> = order.iter().map(|&i| &*asks[i].key).collect();
        let fp: Vec<Option<&[u8]>> = fps.iter().map(|f| f.0.as_ref().map(|b| &b[..])).collect();
        let legacy: Vec<Option<&[u8]>> = fps.iter().map(|f| f.1.as_ref().map(|b| &b[..])).collect();
        let lease_us: Vec<i64> = order.iter().map(|&i| micros(asks[i].lease)).collect();
        let own_us: Vec<Option<i64>> = order
            .iter()
            .map(|&i| asks[i].own_retention.map(micros))
            .collect();
        let retention_us = micros(retention);
        let ids: Vec<Option<[u8; 16]>> = order
            .iter()
            .map(|&i| asks[i].claim_id.map(u128::to_be_bytes))
            .collect();
        let ids: Vec<Option<&[u8]>> = ids.iter().map(|id| id.as_ref().map(|b| &b[..])).collect();
        let reruns: Vec<bool> = order.iter().map(|&i| asks[i].rerun).collect();
        let markers = self.markers.is_some();
        let rows = self
            .query(
                self.claim_sql(true),
                &[
                    &keys,
                    &fp,
                    &legacy,
                    &lease_us,
                    &own_us,
                    &retention_us,
                    &ids,
                    &markers,
                    &reruns,
                ],
                true,
            )
            .await;
        // A key without a row (the function used up its passes) asks again.
        let mut answers: Vec<Result<ClaimRow, Fail>> =
            (0..asks.len()).map(|_| Ok(ClaimRow::Again)).collect();
        match rows {
            Ok(rows) => {
                if let Err(f) = fill(&mut answers, &order, &rows, |row| claim_row(row, 1)) {
                    return asks.iter().map(|_| Err(f.clone())).collect();
                }
            }
            // The transaction was rolled back (a deadlock, or a serialization failure on a
            // database that runs it SERIALIZABLE): nothing changed, every key asks again.
            Err(Fail::Refused(e))
                if matches!(
                    e.code.as_deref(),
                    Some(PG_DEADLOCK_DETECTED | PG_SERIALIZATION_FAILURE)
                ) => {}
            Err(f) => return asks.iter().map(|_| Err(f.clone())).collect(),
        }
        answers
    }

    /// A completion: with writes, its own statement (the writes commit with it); without,
    /// alone or in a batch with other keys' completions of this process (`batch.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn complete(
        &self,
        key: &[u8],
        token: u64,
        response: &Arc<[u8]>,
        retention: Duration,
        own_retention: Option<Duration>,
        hash: u64,
        writes: Option<&Writes>,
    ) -> Result<CompleteRow, Fail> {
        let ask = CompleteAsk {
            key: Box::from(key),
            token: token_param(token),
            response: response.clone(),
            own_us: own_retention.map(micros),
            stripe: wake_stripe(hash),
            flush: None,
        };
        let retention_us = micros(retention);
        if writes.is_some() {
            return self.complete_one(&ask, retention_us, writes).await;
        }
        match self.settle(ask, retention_us).await {
            Ok(Settled::Row(row)) => Ok(row),
            Ok(Settled::Flushed) => Err(Fail::Unknown(Arc::from(
                "a completion was answered as a flush",
            ))),
            Err(f) => Err(f),
        }
    }

    /// One completion's statement (see `Sql::complete`).
    async fn complete_one(
        &self,
        ask: &CompleteAsk,
        retention_us: i64,
        writes: Option<&Writes>,
    ) -> Result<CompleteRow, Fail> {
        let marker_us = self.markers.map(micros);
        let (key, response) = (&*ask.key, &*ask.response);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &key,
            &ask.token,
            &response,
            &retention_us,
            &ask.own_us,
            &ask.stripe,
            &marker_us,
        ];
        let sql = match writes {
            None => &self.sql.complete,
            Some(w) => {
                params.extend([
                    &w.put_keys as &(dyn ToSql + Sync),
                    &w.put_values,
                    &w.deletes,
                    &w.messages,
                ]);
                &self.sql.complete_with
            }
        };
        let rows = self.query(sql, &params, true).await?;
        complete_row(&rows, 0)
    }

    /// Completions of distinct keys in one statement and one commit (see
    /// `Sql::complete_batch`): one answer per ask, in the asks' order. A batch the server
    /// rolled back (a deadlock with another transaction) changed nothing: each completion
    /// is then sent alone.
    ///
    /// With `life`, the statement also reads the lifetime token, and answers it (`None`:
    /// none, or no row came back); a role that may not read it never asks.
    async fn complete_batch(
        &self,
        asks: &[&CompleteAsk],
        retention_us: i64,
        life: bool,
    ) -> (Vec<Result<CompleteRow, Fail>>, Option<i64>) {
        let order = sorted(asks);
        let keys: Vec<&[u8]> = order.iter().map(|&i| &*asks[i].key).collect();
        let tokens: Vec<i64> = order.iter().map(|&i| asks[i].token).collect();
        let responses: Vec<&[u8]> = order.iter().map(|&i| &*asks[i].response).collect();
        let own_us: Vec<Option<i64>> = order.iter().map(|&i| asks[i].own_us).collect();
        let stripes: Vec<i32> = order.iter().map(|&i| asks[i].stripe).collect();
        let marker_us = self.markers.map(micros);
        let rows = self
            .query(
                match life {
                    true => &self.sql.complete_batch_life,
                    false => &self.sql.complete_batch,
                },
                &[
                    &keys,
                    &tokens,
                    &responses,
                    &own_us,
                    &stripes,
                    &retention_us,
                    &marker_us,
                ],
                true,
            )
            .await;
        // An ask without a row: its token no longer holds the key.
        let mut answers: Vec<Result<CompleteRow, Fail>> =
            (0..asks.len()).map(|_| Ok(CompleteRow::Lost)).collect();
        match rows {
            Ok(rows) => {
                if let Err(f) = fill(&mut answers, &order, &rows, |row| done_row(row, 1)) {
                    return (asks.iter().map(|_| Err(f.clone())).collect(), None);
                }
                let life = rows.first().and_then(life_column);
                (answers, life)
            }
            Err(Fail::Refused(e))
                if matches!(
                    e.code.as_deref(),
                    Some(PG_DEADLOCK_DETECTED | PG_SERIALIZATION_FAILURE)
                ) =>
            {
                let mut answers = Vec::with_capacity(asks.len());
                for ask in asks {
                    answers.push(self.complete_one(ask, retention_us, None).await);
                }
                (answers, None)
            }
            Err(f) => (asks.iter().map(|_| Err(f.clone())).collect(), None),
        }
    }

    /// The completion's statement and then the application's own statements (`hook`) in
    /// one transaction on one connection; the hook runs only when the completion wrote the
    /// row (not for a repeat or a lost lease), and its error rolls everything back.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn complete_in(
        &self,
        key: &[u8],
        token: u64,
        response: &[u8],
        retention: Duration,
        own_retention: Option<Duration>,
        hash: u64,
        writes: Option<&Writes>,
        hook: super::Hook,
    ) -> Result<CompleteRow, HookFail> {
        let (token, retention_us) = (token_param(token), micros(retention));
        let own_us = own_retention.map(micros);
        let stripe = wake_stripe(hash);
        let marker_us = self.markers.map(micros);
        let mut conn = self.conn().await.map_err(HookFail::Db)?;
        // `BEGIN`, the completion and the commit (or rollback); the hook's own are not
        // counted.
        self.round_trips.fetch_add(3, Ordering::Relaxed);
        let work = async {
            let tx = conn.transaction().await.map_err(|e| (e, false))?;
            let sql = match writes {
                None => &self.sql.complete,
                Some(_) => &self.sql.complete_with,
            };
            let stmt = tx.prepare_cached(sql).await.map_err(|e| (e, false))?;
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![
                &key,
                &token,
                &response,
                &retention_us,
                &own_us,
                &stripe,
                &marker_us,
            ];
            if let Some(w) = writes {
                params.extend([
                    &w.put_keys as &(dyn ToSql + Sync),
                    &w.put_values,
                    &w.deletes,
                    &w.messages,
                ]);
            }
            let rows = tx.query(&stmt, &params).await.map_err(|e| (e, false))?;
            let row = match complete_row(&rows, 0) {
                Ok(row) => row,
                Err(f) => return Ok(Err(HookFail::Db(f))),
            };
            if !matches!(row, CompleteRow::Done { repeat: false, .. }) {
                // Nothing written: nothing for the hook to join.
                tx.rollback().await.map_err(|e| (e, false))?;
                return Ok(Ok(row));
            }
            if let Err(e) = hook(&tx).await {
                let _ = tx.rollback().await;
                return Ok(Err(HookFail::Hook(e)));
            }
            tx.commit().await.map_err(|e| (e, true))?;
            Ok(Ok(row))
        };
        let answer = tokio::time::timeout(self.call_timeout, work).await;
        match answer {
            Ok(Ok(done)) => done,
            // Before the commit was sent nothing is committed; a failed commit whose
            // answer is an error of the server rolled back, one without an answer is
            // unknown.
            Ok(Err((e, commit))) => Err(HookFail::Db(match self.failed(conn, e, commit) {
                Fail::Unknown(why) if !commit => Fail::Refused(DatabaseError::new(
                    DatabaseErrorKind::Unavailable,
                    format!("the connection failed before the commit: {why}"),
                )),
                other => other,
            })),
            Err(_) => {
                drop(Object::take(conn));
                Err(HookFail::Db(Fail::Unknown(Arc::from(format!(
                    "no answer from the database within {:?}",
                    self.call_timeout
                )))))
            }
        }
    }

    /// A checkpoint with writes (see `Sql::checkpoint_with`): whether `token` still held
    /// the key (and the checkpoint and the writes are saved).
    pub(crate) async fn checkpoint_with(
        &self,
        key: &[u8],
        token: u64,
        phase: u32,
        data: &[u8],
        w: &Writes,
    ) -> Result<bool, Fail> {
        let (token, phase) = (token_param(token), i64::from(phase));
        let rows = self
            .query(
                &self.sql.checkpoint_with,
                &[
                    &key,
                    &token,
                    &phase,
                    &data,
                    &w.put_keys,
                    &w.put_values,
                    &w.deletes,
                    &w.messages,
                ],
                true,
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// A row of the application's tables.
    pub(crate) async fn table_get(&self, row: &[u8]) -> Result<Option<Vec<u8>>, Fail> {
        let rows = self.query(&self.sql.table_get, &[&row], true).await?;
        match rows.first() {
            Some(r) => Ok(Some(r.try_get(0).map_err(undecodable)?)),
            None => Ok(None),
        }
    }

    /// Up to `limit` rows from `lo` (inclusive) to `hi` (exclusive), in key order.
    pub(crate) async fn table_scan(
        &self,
        lo: &[u8],
        hi: &[u8],
        limit: usize,
    ) -> Result<Vec<TableRow>, Fail> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(&self.sql.table_scan, &[&lo, &hi, &limit], true)
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get(0).map_err(undecodable)?,
                    r.try_get(1).map_err(undecodable)?,
                ))
            })
            .collect()
    }

    /// Takes up to `limit` pending messages for `hold` (see `Sql::outbox_take`), in id
    /// order.
    pub(crate) async fn outbox_take(
        &self,
        limit: usize,
        hold: Duration,
    ) -> Result<Vec<(u64, Vec<u8>)>, Fail> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let hold_us = micros(hold);
        let rows = self
            .query(&self.sql.outbox_take, &[&limit, &hold_us], true)
            .await?;
        let mut out = rows
            .iter()
            .map(|r| {
                let id: i64 = r.try_get(0).map_err(undecodable)?;
                Ok((id.max(0).unsigned_abs(), r.try_get(1).map_err(undecodable)?))
            })
            .collect::<Result<Vec<_>, Fail>>()?;
        out.sort_unstable_by_key(|m| m.0);
        Ok(out)
    }

    /// Removes the messages `ids`.
    pub(crate) async fn outbox_sent(&self, ids: &[u64]) -> Result<(), Fail> {
        let ids: Vec<i64> = ids.iter().filter_map(|&i| i64::try_from(i).ok()).collect();
        self.query(&self.sql.outbox_sent, &[&ids], true).await?;
        Ok(())
    }

    /// Whether the release removed the key.
    pub(crate) async fn release(&self, key: &[u8], token: u64) -> Result<bool, Fail> {
        let token = token_param(token);
        let rows = self.query(&self.sql.release, &[&key, &token], true).await?;
        Ok(!rows.is_empty())
    }

    /// Whether `token` still held the key (and its lease now ends `lease` from now).
    pub(crate) async fn extend(
        &self,
        key: &[u8],
        token: u64,
        lease: Duration,
        retention: Duration,
    ) -> Result<bool, Fail> {
        let (token, lease_us, retention_us) =
            (token_param(token), micros(lease), micros(retention));
        let rows = self
            .query(
                &self.sql.extend,
                &[&key, &token, &lease_us, &retention_us],
                true,
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Whether `token` still held the key (and the checkpoint is saved).
    pub(crate) async fn checkpoint(
        &self,
        key: &[u8],
        token: u64,
        phase: u32,
        data: &[u8],
    ) -> Result<bool, Fail> {
        let (token, phase) = (token_param(token), i64::from(phase));
        let rows = self
            .query(&self.sql.checkpoint, &[&key, &token, &phase, &data], true)
            .await?;
        Ok(!rows.is_empty())
    }

    /// Whether `token` still held the key (and its attempt is now failed).
    pub(crate) async fn fail(
        &self,
        key: &[u8],
        token: u64,
        retention: Duration,
    ) -> Result<bool, Fail> {
        let (token, retention_us) = (token_param(token), micros(retention));
        let rows = self
            .query(&self.sql.fail, &[&key, &token, &retention_us], true)
            .await?;
        Ok(!rows.is_empty())
    }

    pub(crate) async fn get(&self, key: &[u8]) -> Result<Option<GetRow>, Fail> {
        let rows = self.query(&self.sql.get, &[&key], true).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: String = row.try_get(0).map_err(undecodable)?;
        let token = token_of(row.try_get(1).map_err(undecodable)?);
        let attempt = attempt_of(row.try_get(2).map_err(undecodable)?);
        Ok(Some(if state == "i" {
            GetRow::InFlight {
                token,
                attempt,
                checkpoint: checkpoint_of(
                    row.try_get(3).map_err(undecodable)?,
                    row.try_get(4).map_err(undecodable)?,
                ),
                remaining: remaining(row.try_get(6).map_err(undecodable)?),
                failed: row.try_get(8).map_err(undecodable)?,
                first_claimed_wall_ms: wall_ms_of(row.try_get(9).map_err(undecodable)?),
                attempt_started_wall_ms: wall_ms_of(row.try_get(10).map_err(undecodable)?),
            }
        } else {
            let response: Option<Vec<u8>> = row.try_get(5).map_err(undecodable)?;
            let expires: Option<i64> = row.try_get(7).map_err(undecodable)?;
            let expires_wall_ms = expires.unwrap_or(0).max(0).unsigned_abs();
            GetRow::Completed {
                stored: Stored {
                    response: Arc::from(response.unwrap_or_default()),
                    token,
                    attempt,
                    expires_wall_ms,
                },
                expires_wall_ms,
            }
        }))
    }

    /// One bounded sweep batch: the rows it deleted.
    /// Planned for each pass (`query_planned`): its joins of the chosen keys with the
    /// table would keep a plan made while the table was empty, a scan of every row.
    pub(crate) async fn sweep(&self) -> Result<u64, Fail> {
        let rows = self
            .query_planned(&self.sql.sweep, &[(&PG_SWEEP_BATCH, Type::INT8)], false)
            .await?;
        let n: i64 = rows
            .first()
            .ok_or_else(|| Fail::Unknown(Arc::from("the sweep answered no row")))?
            .try_get(0)
            .map_err(undecodable)?;
        Ok(n.max(0).unsigned_abs())
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

/// A claim's fingerprint and its 64-bit legacy form, as the statement's bytes.
fn fingerprint_params(ask: &ClaimAsk) -> (Option<[u8; 16]>, Option<[u8; 16]>) {
    let fp = ask.fingerprint.map(|f| fingerprint_bytes(f.value));
    let legacy = ask
        .fingerprint
        .and_then(|f| f.legacy)
        .map(|l| fingerprint_bytes(u128::from(l)));
    (fp, legacy)
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

#[cfg(test)]
mod writes_tests {
    use super::Writes;
    use crate::model::write_set::WriteSet;

    /// A set's operations apply in order: the statement gets each row's last write, and
    /// the messages in emission order.
    #[test]
    fn a_write_set_is_reduced_to_each_rows_last_write() {
        let mut w = WriteSet::new();
        w.put("t", b"a", b"1")
            .and_then(|w| w.put("t", b"b", b"2"))
            .and_then(|w| w.delete("t", b"a"))
            .and_then(|w| w.put("t", b"b", b"3"))
            .and_then(|w| w.delete("t", b"c"))
            .and_then(|w| w.put("t", b"c", b"4"))
            .and_then(|w| w.emit(b"m1"))
            .and_then(|w| w.emit(b"m2"))
            .expect("a small set");
        let got = Writes::of(&w);
        let row = |k: &[u8]| [&[1u8][..], b"t", k].concat();
        assert_eq!(got.put_keys, vec![row(b"b"), row(b"c")]);
        assert_eq!(got.put_values, vec![b"3".to_vec(), b"4".to_vec()]);
        assert_eq!(got.deletes, vec![row(b"a")]);
        assert_eq!(got.messages, vec![b"m1".to_vec(), b"m2".to_vec()]);
    }
}

#[cfg(test)]
mod plan_tests {
    use super::{ClaimAsk, ClaimRow, CompleteAsk, CompleteRow, Db};
    use crate::shared::PostgresConfig;
    use std::sync::Arc;
    use std::time::Duration;

    /// The engine sends the batches of claims and of completions as prepared statements
    /// that keep one plan: on a pool of one connection (so that every statement runs in
    /// one session), twelve batches of each leave at most five custom plans of each in
    /// `pg_prepared_statements`. A batch sent unprepared is not in that view at all, and
    /// one planned for every execution counts only custom plans. Needs the server of
    /// `scripts/pg.sh test`.
    #[test]
    fn the_engine_sends_its_batches_prepared_with_one_plan() {
        let url = std::env::var("IDEMKV_PG_URL").unwrap_or_else(|_| {
            panic!("IDEMKV_PG_URL is not set: this test needs the server of `scripts/pg.sh test`")
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            // A schema of its own, dropped with everything in it at the end.
            let schema = format!("t{:08x}_dbplans", fastrand::u32(..));
            let cfg = PostgresConfig::new(url).schema(&schema).pool_size(1);
            let db = Db::new(&cfg, None).expect("db");
            db.migrate().await.expect("schema");
            let (lease, retention) = (Duration::from_secs(60), Duration::from_secs(3600));
            const EXECUTIONS: usize = 12;
            // First as sent by claims that commit with the flush, then, once the open's
            // check turned them on, by early claims whose completions read the token.
            for early in [false, true] {
                if early {
                    db.probe_flush().await;
                    assert!(db.commits_early(), "a superuser may force the flush");
                }
                for round in 0..EXECUTIONS {
                    let keys: Vec<Vec<u8>> = (0..2)
                        .map(|k| format!("k{early}-{round}-{k}").into_bytes())
                        .collect();
                    let claims: Vec<ClaimAsk> = keys
                        .iter()
                        .map(|k| ClaimAsk {
                            key: Box::from(&k[..]),
                            fingerprint: None,
                            lease,
                            own_retention: None,
                            claim_id: None,
                            rerun: false,
                        })
                        .collect();
                    let asks: Vec<&ClaimAsk> = claims.iter().collect();
                    let mut tokens = Vec::new();
                    for answer in db.claim_batch(&asks, retention).await {
                        match answer {
                            Ok(ClaimRow::Acquired { token, life, .. }) => {
                                assert_eq!(life.is_some(), early, "an early claim reads the token");
                                tokens.push(token);
                            }
                            _ => panic!("a fresh key is acquired"),
                        }
                    }
                    let completions: Vec<CompleteAsk> = keys
                        .iter()
                        .zip(&tokens)
                        .map(|(k, &token)| CompleteAsk {
                            key: Box::from(&k[..]),
                            token: super::token_param(token),
                            response: Arc::from(&b"ok"[..]),
                            own_us: None,
                            stripe: 0,
                            flush: None,
                        })
                        .collect();
                    let asks: Vec<&CompleteAsk> = completions.iter().collect();
                    let micros = super::micros(retention);
                    let (answers, life) = db.complete_batch(&asks, micros, early).await;
                    assert_eq!(life.is_some(), early, "the batch read the token");
                    for answer in answers {
                        assert!(
                            matches!(answer, Ok(CompleteRow::Done { repeat: false, .. })),
                            "a held key is completed"
                        );
                    }
                }
            }
            let sql = &db.sql;
            for statement in [
                &sql.claim_batch,
                &sql.complete_batch,
                &sql.claim_batch_early,
                &sql.complete_batch_life,
            ] {
                let rows = db
                    .query(
                        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
                         WHERE statement = $1",
                        &[statement],
                        false,
                    )
                    .await
                    .expect("pg_prepared_statements");
                let plans: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
                assert!(
                    matches!(plans[..], [(generic, custom)]
                        if crate::shared::sql::kept_one_plan(generic, custom, EXECUTIONS)),
                    "plans (generic, custom) of:\n{statement}\n{plans:?}"
                );
            }
            db.query(&format!("DROP SCHEMA \"{schema}\" CASCADE"), &[], false)
                .await
                .expect("drop");
        });
    }
}
