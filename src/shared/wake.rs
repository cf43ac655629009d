//! The sending side of wake-ups. A completion or release commits WITHOUT notifying (a
//! transaction that calls `pg_notify` holds PostgreSQL's database-wide notify lock through
//! its commit's WAL flush, which serializes every notifying commit); once its statement
//! has returned, the key's hash is queued here, and one task per engine sends what is
//! queued as one autocommit `pg_notify` per batch. While a batch is on its way the next
//! one gathers, so at most one notifying transaction per engine is in flight.
//!
//! A hash is queued only after its statement answered, so a notification is never
//! delivered before the commit it announces: a woken waiter re-reads and sees it. A batch
//! lost (the process ends, the call fails) only delays other processes' waiters until
//! their bounded poll (`PG_WAIT_POLL_MAX`).

use super::core::Core;
use crate::shared::constants::PG_NOTIFY_PAYLOAD_BYTES_MAX;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::Notify;

/// The hashes waiting to be announced, and the bell of the task that sends them.
#[derive(Default)]
pub(crate) struct Outbox {
    queued: Mutex<Vec<u64>>,
    bell: Notify,
}

impl Outbox {
    /// Queues a key's hash; call only after the statement that settled the key answered.
    pub(crate) fn push(&self, hash: u64) {
        self.queued.lock().push(hash);
        self.bell.notify_one();
    }

    fn take(&self) -> Vec<u64> {
        let mut hashes = std::mem::take(&mut *self.queued.lock());
        hashes.sort_unstable();
        hashes.dedup();
        hashes
    }
}

/// The payloads announcing `hashes`: hex hashes joined by commas, each payload within the
/// server's limit on a notification.
pub(crate) fn payloads(hashes: &[u64]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for h in hashes {
        if !cur.is_empty() && cur.len() + 17 > PG_NOTIFY_PAYLOAD_BYTES_MAX {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(',');
        }
        cur.push_str(&format!("{h:016x}"));
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The hashes a notification's payload names (the listener's side of `payloads`).
pub(crate) fn parse(payload: &str) -> impl Iterator<Item = u64> + '_ {
    payload
        .split(',')
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
}

/// Sends the queued hashes until the engine closes.
pub(crate) async fn send(core: Arc<Core>) {
    while !core.is_closed() {
        core.outbox.bell.notified().await;
        let hashes = core.outbox.take();
        for payload in payloads(&hashes) {
            // A failure is not retried: the waiters' bounded poll covers it.
            let _ = core.db.query(&core.db.sql.notify, &[&payload], false).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, payloads};
    use crate::shared::constants::PG_NOTIFY_PAYLOAD_BYTES_MAX;

    #[test]
    fn payloads_carry_every_hash_within_the_limit() {
        let hashes: Vec<u64> = (0..2000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let sent = payloads(&hashes);
        assert!(sent.len() > 1);
        assert!(sent.iter().all(|p| p.len() <= PG_NOTIFY_PAYLOAD_BYTES_MAX));
        let back: Vec<u64> = sent.iter().flat_map(|p| parse(p)).collect();
        assert_eq!(back, hashes);
        assert!(payloads(&[]).is_empty());
    }
}
