//! Claims: one alone, or a batch of distinct keys in one statement.

use super::{fill, fingerprint_bytes, micros, sorted, Db};
use crate::shared::batch::Keyed;
use crate::shared::constants::{PG_DEADLOCK_DETECTED, PG_SERIALIZATION_FAILURE};
use crate::shared::rows::claim_row;
use crate::shared::rows::{ClaimRow, Fail};
use std::sync::atomic::Ordering;
use std::time::Duration;

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

impl Keyed for ClaimAsk {
    fn key(&self) -> &[u8] {
        &self.key
    }
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

impl Db {
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
    pub(super) async fn claim_batch(
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
}
