//! The other statements: a holder's release, extend, checkpoint and fail; reads of a key and
//! of the application's tables; the outbox's relay; the sweeper's batch.

use super::{micros, token_param, Db};
use crate::api::lease::Stored;
use crate::shared::constants::PG_SWEEP_BATCH;
use crate::shared::rows::{
    attempt_of, checkpoint_of, remaining, token_of, undecodable, wall_ms_of,
};
use crate::shared::rows::{Fail, GetRow, TableRow};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::Type;

impl Db {
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
}
