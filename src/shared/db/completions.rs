//! Completions: with writes, a statement of their own (the writes commit with them); without,
//! alone or in a batch of the completions' queue, which also carries the flushes that make
//! early-committed acquisitions durable (with the server's lifetime token they check); a
//! completion with the application's own statements in its transaction; a checkpoint with
//! writes (`Writes`, a write set as the statements take it).

use super::{fill, micros, sorted, token_param, wake_stripe, Db};
use crate::shared::batch::Keyed;
use crate::shared::constants::{
    PG_DEADLOCK_DETECTED, PG_INSUFFICIENT_PRIVILEGE, PG_LIFE_READS_MAX, PG_SERIALIZATION_FAILURE,
    PG_UNDEFINED_FUNCTION,
};
use crate::shared::error::{DatabaseError, DatabaseErrorKind};
use crate::shared::rows::{complete_row, done_row, life_column, restarted, undecodable};
use crate::shared::rows::{CompleteRow, Fail, HookFail};
use deadpool_postgres::Object;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::ToSql;

/// An answer of the completions' queue.
pub(super) enum Settled {
    Row(CompleteRow),
    /// A flush ask's answer (`Db::flush`): every commit before it is durable.
    Flushed,
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

impl Db {
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
        hook: crate::shared::Hook,
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
}

#[cfg(test)]
mod tests {
    use super::{CompleteAsk, Writes};
    use crate::model::write_set::WriteSet;
    use crate::shared::db::{ClaimAsk, Db};
    use crate::shared::rows::{ClaimRow, CompleteRow};
    use crate::shared::PostgresConfig;
    use std::sync::Arc;
    use std::time::Duration;

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
                            token: crate::shared::db::token_param(token),
                            response: Arc::from(&b"ok"[..]),
                            own_us: None,
                            stripe: 0,
                            flush: None,
                        })
                        .collect();
                    let asks: Vec<&CompleteAsk> = completions.iter().collect();
                    let micros = crate::shared::db::micros(retention);
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
