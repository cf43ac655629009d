//! Connections driven by the thread that runs their statement.
//!
//! A blocking claim or completion runs on its caller's thread (`Backend::drive`). On one of
//! the pool's connections, whose tasks live on the backend's runtime, its statement still
//! crossed threads twice: a runtime thread woke to write it, and one woke again to read the
//! answer and hand it back. On a busy 2-core machine each of those wake-ups waited about
//! 0.3 ms for a core (docs/shared-throughput.md, "Where a one-process statement's time
//! goes"). A direct connection has a single-threaded runtime of its own, which only the
//! thread running a statement on it drives: that thread writes the statement, waits for the
//! answer in its own `epoll_wait`, and reads it. No other thread of the process takes part.
//!
//! Architecture invariants:
//! - Only a thread that drives a blocking call ([`Driving`]) uses a direct connection.
//!   Async calls keep the pool: a direct connection's socket needs the thread that waits
//!   for it to drive its runtime, which a future cannot ask of its executor.
//! - A direct connection serves one statement at a time, under its slot's lock, and a
//!   caller never waits for a slot: one that finds every slot busy uses the pool.
//! - The slots come out of `pool_size`, and only where the pool keeps a connection for
//!   each lane and one more (`slots_for`): an engine's connections stay within its
//!   `pool_size`, and its async calls keep connections enough for its lanes.
//! - Before a statement is sent, the connection reads what arrived while it sat idle: one
//!   the server closed meanwhile (a restart, `pg_terminate_backend`) is replaced first, so
//!   that the statement's outcome is not made unknown by a connection that was already
//!   gone.

use super::block::Rt;
use super::tls::Connector;
use crate::shared::constants::PG_DIRECT_OPEN_RETRY;
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

thread_local! {
    /// This thread drives a blocking call of a shared engine (`Backend::drive`).
    static DRIVING: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as driving a blocking call until dropped.
pub(crate) struct Driving(bool);

impl Driving {
    pub(crate) fn here() -> Self {
        Driving(DRIVING.with(|d| d.replace(true)))
    }

    /// Whether the current thread drives a blocking call.
    pub(crate) fn now() -> bool {
        DRIVING.with(Cell::get)
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        DRIVING.with(|d| d.set(self.0));
    }
}

/// What became of a statement on a direct connection.
pub(crate) enum Ran {
    Rows(Vec<Row>),
    /// Refused by the server before the statement was executed (its preparation failed):
    /// nothing changed, and the connection is usable.
    NotSent(tokio_postgres::Error),
    /// Failed after it was sent: the server's error, or the connection's.
    Failed(tokio_postgres::Error),
    /// The connection ended after the statement was sent, before the answer came.
    Ended,
    /// No answer within the call timeout, after the statement was sent.
    TimedOut,
}

/// Whether a connection stays usable after `e`: the server answered with an error of the
/// statement, not one that ends the connection (class 08, connection exceptions, and 57P,
/// operator intervention such as a shutdown or `pg_terminate_backend`).
pub(crate) fn usable_after(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        let code = db.code().code();
        !(code.starts_with("08") || code.starts_with("57P"))
    })
}

/// How many direct connections an engine of `pool_size` with `lanes` claim and completion
/// lanes has: one per lane, where the pool still keeps one per lane and one more.
pub(crate) fn slots_for(pool_size: usize, lanes: usize) -> usize {
    lanes.min(pool_size.saturating_sub(lanes + 1))
}

type Io = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// One open direct connection. Its fields drop in order: the client and the socket leave
/// the runtime's driver before the runtime stops.
struct Conn {
    client: Client,
    /// The connection's I/O future (`tokio_postgres::Connection`), polled only while a
    /// statement runs.
    io: Io,
    prepared: HashMap<Box<str>, Statement>,
    /// The connection's own runtime; its socket is registered with this runtime's driver.
    /// Never `None` while the connection lives.
    runtime: Rt,
}

/// An engine's direct connections, opened when first needed.
pub(crate) struct Direct {
    slots: Box<[Mutex<Option<Conn>>]>,
    client: tokio_postgres::Config,
    tls: Connector,
    /// Bounds a connection's opening whole (the client's own `connect_timeout` bounds only
    /// the socket's connect, not the TLS handshake or the startup exchange).
    connect_timeout: Duration,
    closed: AtomicBool,
    /// No connection is opened before this instant: one failed to open, and a caller
    /// should not wait for a second attempt before the pool's.
    quiet_until: Mutex<Option<Instant>>,
}

impl Direct {
    /// `n` slots (none: every statement goes to the pool).
    pub(crate) fn new(
        n: usize,
        client: tokio_postgres::Config,
        tls: Connector,
        connect_timeout: Duration,
    ) -> Self {
        Direct {
            slots: (0..n).map(|_| Mutex::new(None)).collect(),
            client,
            tls,
            connect_timeout,
            closed: AtomicBool::new(false),
            quiet_until: Mutex::new(None),
        }
    }

    /// Runs the statement `sql` (prepared once per connection) with `params` on a free
    /// direct connection, on this thread, within `timeout`; `sending`
    /// is called as the statement is sent (after its preparation). `None` leaves the
    /// statement to the pool: this thread drives no blocking call, every slot is busy, the
    /// engine is closed, no connection could be opened, or the connection failed before
    /// the statement was executed (the pool then opens another, and reports why not).
    pub(crate) fn run(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        timeout: Duration,
        sending: &dyn Fn(),
    ) -> Option<Ran> {
        if !Driving::now() || self.closed.load(Ordering::Acquire) {
            return None;
        }
        let ran = {
            let mut slot = self.slots.iter().find_map(|s| s.try_lock())?;
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            if slot.as_mut().is_some_and(|c| !c.alive()) {
                *slot = None;
            }
            if slot.is_none() {
                *slot = Some(self.open()?);
            }
            let conn = slot.as_mut()?;
            let sent = Cell::new(false);
            let ran = conn.run(sql, params, timeout, &|| {
                sent.set(true);
                sending();
            });
            let usable = match &ran {
                Ran::Rows(_) => true,
                Ran::NotSent(e) | Ran::Failed(e) => usable_after(e),
                Ran::Ended | Ran::TimedOut => false,
            };
            if !usable {
                *slot = None;
                if !sent.get() {
                    return None;
                }
            }
            ran
        };
        // A close that found this slot in use left its connection to this caller.
        if self.closed.load(Ordering::Acquire) {
            self.close();
        }
        Some(ran)
    }

    /// Drops every idle connection; a connection in use is dropped after its statement.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for slot in self.slots.iter() {
            if let Some(mut conn) = slot.try_lock() {
                conn.take();
            }
        }
    }

    fn open(&self) -> Option<Conn> {
        if self.quiet_until.lock().is_some_and(|t| Instant::now() < t) {
            return None;
        }
        let conn = self.connect();
        if conn.is_none() {
            *self.quiet_until.lock() = Some(Instant::now() + PG_DIRECT_OPEN_RETRY);
        }
        conn
    }

    fn connect(&self) -> Option<Conn> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .ok()?;
        let opened = runtime.block_on(tokio::time::timeout(
            self.connect_timeout,
            self.client.connect(self.tls.clone()),
        ));
        // On failure the runtime is dropped as an `Rt` too: a host name's lookup may still
        // run on its blocking thread.
        let runtime = Rt(Some(runtime));
        let (client, io) = opened.ok()?.ok()?;
        Some(Conn {
            client,
            io: Box::pin(io),
            prepared: HashMap::new(),
            runtime,
        })
    }
}

impl Conn {
    /// Reads what the server sent while the connection sat idle; `false` once it ended.
    fn alive(&mut self) -> bool {
        let Conn {
            client,
            io,
            runtime,
            ..
        } = self;
        let Some(runtime) = &runtime.0 else {
            return false;
        };
        let ended = runtime.block_on(async {
            // One turn of the driver first: a socket's state is known to the runtime only
            // once its driver has read the events of the idle time.
            tokio::task::yield_now().await;
            poll_fn(|cx| Poll::Ready(io.as_mut().poll(cx).is_ready())).await
        });
        !ended && !client.is_closed()
    }

    /// Runs `sql` with `params`, preparing it first if this connection has not yet. A failure of the
    /// preparation is `NotSent` when the server answered it, and `Ended` or `TimedOut`
    /// otherwise (`sending` has not been called then).
    fn run(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        timeout: Duration,
        sending: &dyn Fn(),
    ) -> Ran {
        let Conn {
            client,
            io,
            prepared,
            runtime,
        } = self;
        let Some(runtime) = &runtime.0 else {
            return Ran::Ended;
        };
        runtime.block_on(async {
            let work = async {
                let statement = match prepared.get(sql) {
                    Some(s) => s.clone(),
                    None => match client.prepare(sql).await {
                        Ok(s) => {
                            prepared.insert(Box::from(sql), s.clone());
                            s
                        }
                        Err(e) if e.as_db_error().is_some() => return Ran::NotSent(e),
                        Err(_) => return Ran::Ended,
                    },
                };
                sending();
                let answer = client.query(&statement, params).await;
                match answer {
                    Ok(rows) => Ran::Rows(rows),
                    Err(e) => Ran::Failed(e),
                }
            };
            let mut work = std::pin::pin!(tokio::time::timeout(timeout, work));
            // The statement and the connection's I/O, polled together on this thread.
            poll_fn(|cx| {
                if let Poll::Ready(done) = work.as_mut().poll(cx) {
                    return Poll::Ready(done.unwrap_or(Ran::TimedOut));
                }
                if io.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ran::Ended);
                }
                Poll::Pending
            })
            .await
        })
    }
}
