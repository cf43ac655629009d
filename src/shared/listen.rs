//! The listening connection: one per engine, `LISTEN`ing on the backend's channel. A
//! completion or release in any process announces the key's hash after its commit
//! (`wake.rs`, several hashes to a notification); this wakes the local waiters of that key, who then ask the database once. When the
//! connection is lost, every waiter asks again (a notification may have been missed) and
//! the listener connects again after a pause; meanwhile waiters fall back on their bounded
//! poll.

use super::core::Core;
use crate::constants::PG_LISTEN_RETRY;
use std::future::poll_fn;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio_postgres::{AsyncMessage, NoTls};

/// Listens until the engine closes. `ready` is sent once the first `LISTEN` is in place
/// (or the first attempt failed), so that `open` returns with wake-ups working.
pub(crate) async fn listen(core: Arc<Core>, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    while !core.is_closed() {
        if let Ok((client, mut conn)) = core.db.client.connect(NoTls).await {
            let front = core.clone();
            let driver = tokio::spawn(async move {
                while let Some(Ok(message)) = poll_fn(|cx| conn.poll_message(cx)).await {
                    if let AsyncMessage::Notification(n) = message {
                        for hash in super::wake::parse(n.payload()) {
                            front.front.notified(hash);
                        }
                    }
                }
            });
            let listen = format!("LISTEN \"{}\"", core.db.sql.channel);
            if client.batch_execute(&listen).await.is_ok() {
                core.front.notified_all();
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                let _ = driver.await;
            } else {
                driver.abort();
            }
        }
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        tokio::time::sleep(PG_LISTEN_RETRY).await;
    }
}
