//! The listening connection: one per engine. It `LISTEN`s on the backend's channel only
//! while a claim of this process waits (`claim_or_wait`, `run`), and stops listening once
//! no claim has waited for `PG_LISTEN_IDLE`: a process whose claims never wait is never
//! woken by other processes' notifications, which would cost a server wake-up and a
//! client wake-up each (docs/shared.md, "Wake-ups").
//!
//! A completion or release in any process announces the key's hash after its commit
//! (`wake.rs`, several hashes to a notification); this wakes the local waiters of that
//! key, who then ask the database once. A waiting claim registers before its first ask
//! and waits (bounded) until `LISTEN` is in place, so any commit it has not read yet is
//! announced to it. When the connection is lost, the listener connects again after a
//! pause, and once it listens again every waiter asks again (a notification may have been
//! missed); meanwhile waiters fall back on their bounded poll.

use super::core::Core;
use crate::shared::constants::{PG_LISTEN_IDLE, PG_LISTEN_RETRY, PG_WAIT_POLL_MAX};
use parking_lot::Mutex;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{oneshot, watch, Notify};
use tokio_postgres::{AsyncMessage, Client};

/// Who needs the listener, and whether it listens.
pub(crate) struct Listening {
    /// Registered waiting claims, and when their count last fell to zero. Read and
    /// written with `on` under this lock: a claim that registers while `on` is true is
    /// covered, since the listener only stops with no claim registered.
    waiters: Mutex<Waiters>,
    /// `LISTEN` is in place on the current connection.
    on: watch::Sender<bool>,
    /// Wakes the listener when `waiters` leaves or reaches zero.
    changed: Notify,
    /// Notifications received (`Stats::db_notifications`).
    pub(crate) received: AtomicU64,
}

struct Waiters {
    count: usize,
    idle_since: Instant,
}

/// A waiting claim's registration; dropped when the claim returns.
pub(crate) struct Registration<'a>(&'a Listening);

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut waiters = self.0.waiters.lock();
        waiters.count = waiters.count.saturating_sub(1);
        if waiters.count == 0 {
            waiters.idle_since = Instant::now();
            self.0.changed.notify_one();
        }
    }
}

impl Listening {
    pub(crate) fn new() -> Self {
        Listening {
            waiters: Mutex::new(Waiters {
                count: 0,
                idle_since: Instant::now(),
            }),
            on: watch::Sender::new(false),
            changed: Notify::new(),
            received: AtomicU64::new(0),
        }
    }

    /// Registers a claim that may wait, and returns once the listener listens, or after
    /// `PG_WAIT_POLL_MAX` when it cannot (the connection is down): the claim's waits then
    /// end at the bounded poll instead of a notification.
    pub(crate) async fn register(&self) -> Registration<'_> {
        let mut on = {
            let mut waiters = self.waiters.lock();
            waiters.count += 1;
            if waiters.count == 1 {
                self.changed.notify_one();
            }
            let on = self.on.subscribe();
            if *on.borrow() {
                return Registration(self);
            }
            on
        };
        let registration = Registration(self);
        let _ = tokio::time::timeout(PG_WAIT_POLL_MAX, on.wait_for(|on| *on)).await;
        registration
    }

    /// When the listener may stop: `None` while a claim is registered, else the instant
    /// `PG_LISTEN_IDLE` after the last one returned. At or past that instant it sets `on`
    /// to false, under the lock, before the `UNLISTEN` is sent.
    fn idle_until(&self) -> Option<Instant> {
        let waiters = self.waiters.lock();
        if waiters.count > 0 {
            return None;
        }
        let until = waiters.idle_since + PG_LISTEN_IDLE;
        if Instant::now() >= until {
            self.on.send_replace(false);
        }
        Some(until)
    }

    fn listening(&self) {
        let _waiters = self.waiters.lock();
        self.on.send_replace(true);
    }

    /// The connection is gone, and its `LISTEN` with it.
    fn stopped(&self) {
        let _waiters = self.waiters.lock();
        self.on.send_replace(false);
    }
}

/// Listens until the engine closes. `ready` is sent once the first connection is made (or
/// the first attempt failed), so that `open` returns with wake-ups working.
pub(crate) async fn listen(core: Arc<Core>, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    while !core.is_closed() {
        if let Ok((client, mut conn)) = core.db.client.connect(core.db.tls.clone()).await {
            let front = core.clone();
            let driver = tokio::spawn(async move {
                while let Some(Ok(message)) = poll_fn(|cx| conn.poll_message(cx)).await {
                    if let AsyncMessage::Notification(n) = message {
                        front.listening.received.fetch_add(1, Ordering::Relaxed);
                        for hash in super::wake::parse(n.payload()) {
                            front.front.notified(hash);
                        }
                    }
                }
            });
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
            let toggler = tokio::spawn(toggle(core.clone(), client));
            let _ = driver.await;
            toggler.abort();
            // Stopped, so that it cannot mark the listener on after this.
            let _ = toggler.await;
            core.listening.stopped();
        }
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        tokio::time::sleep(PG_LISTEN_RETRY).await;
    }
}

/// Sends `LISTEN` when a claim registers and `UNLISTEN` once none has been registered for
/// `PG_LISTEN_IDLE`, on the listening connection, one statement at a time (so they reach
/// the server in the order decided). Ends with the connection.
async fn toggle(core: Arc<Core>, client: Client) {
    let l = &core.listening;
    let channel = &core.db.sql.channel;
    let mut on = false;
    loop {
        let notified = l.changed.notified();
        if !on && l.waiters.lock().count > 0 {
            // Listen first, then lock: a completion that sees the stripes locked notifies
            // after its commit, when this connection already listens.
            if client
                .batch_execute(&format!("LISTEN \"{channel}\""))
                .await
                .is_err()
                || client.batch_execute(&core.db.sql.hear).await.is_err()
            {
                return;
            }
            on = true;
            // What this process read before the stripes were held may have been completed
            // since without a notification (no listener held them): every waiter, and every
            // ask in flight (which a waiting claim may have joined), asks again. This is what
            // makes "listen, then read" hold for a claim that read before this point. It
            // comes before `listening`, which releases the claims waiting to register: their
            // first asks follow the `LISTEN`, so marking them to ask again would only cost a
            // round trip each.
            core.front.notified_all();
            l.listening();
            continue;
        }
        if on {
            match l.idle_until() {
                Some(until) if Instant::now() >= until => {
                    on = false;
                    if client.batch_execute(&core.db.sql.unhear).await.is_err()
                        || client
                            .batch_execute(&format!("UNLISTEN \"{channel}\""))
                            .await
                            .is_err()
                    {
                        return;
                    }
                    continue;
                }
                Some(until) => {
                    // A claim that registers meanwhile wakes the loop through `changed`.
                    let _ = tokio::time::timeout_at(until.into(), notified).await;
                    continue;
                }
                None => {}
            }
        }
        notified.await;
    }
}
