//! The systems under test, each doing claim → side effect → complete its own idiomatic way.

use crate::workload::{AsyncPeer, Delivery, Peer};
use idemkv::{Claim, ClaimError, ClaimOptions, Durability, Engine, LeaseError};
use redb::{self, ReadableTable, TableDefinition};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Lease of an in-flight claim, where the system has one.
pub const LEASE: Duration = Duration::from_secs(30);
/// How long a completed key is remembered, where the system expires keys.
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Sleeps after a refusal for back-pressure: 100 µs, doubling per refusal of the same call
/// up to 2 ms. (A fixed 100 µs left 64 retrying workers waking so often that they took
/// most of the 2 cores from the writer they were waiting for.)
fn backoff(refusals: &mut u32) {
    let us = (100u64 << (*refusals).min(5)).min(2000);
    *refusals += 1;
    std::thread::sleep(Duration::from_micros(us));
}

// ---------------------------------------------------------------------------------------
// idemkv

/// idemkv in one durability mode.
pub struct Idem {
    engine: Engine,
    opts: ClaimOptions,
    retries: AtomicU64,
}

/// How an idemkv row's engine is configured.
#[derive(Debug, Clone, Copy)]
pub struct IdemSettings {
    pub durability: Durability,
}

impl IdemSettings {
    /// `Durability::None`, for the harness's own tests.
    #[cfg(test)]
    pub fn memory() -> Self {
        IdemSettings {
            durability: Durability::None,
        }
    }
}

impl Idem {
    /// Opens an engine on a new file in `dir` (no file for `None`).
    pub fn open(dir: &Path, settings: IdemSettings) -> Result<Self, String> {
        let IdemSettings { durability } = settings;
        let mut b = Engine::builder()
            .durability(durability)
            .lease(LEASE)
            .retention(RETENTION);
        if durability != Durability::None {
            b = b.path(dir.join("idemkv.redb"));
        }
        let engine = b.open().map_err(|e| format!("idemkv open: {e}"))?;
        Ok(Idem {
            engine,
            opts: ClaimOptions::default(),
            retries: AtomicU64::new(0),
        })
    }

    /// The writer's group commits, as a table note (none for `None`).
    pub fn commit_note(&self) -> Option<String> {
        let s = self.engine.stats();
        (s.commits > 0).then(|| {
            let mut note = format!(
                "{} group commits, {:.1} writes each on average, {} at most",
                s.commits,
                s.committed_ops as f64 / s.commits as f64,
                s.batch_max
            );
            if s.log_checkpoints > 0 {
                note.push_str(&format!(
                    ", {} of them commit-log checkpoints (the close's included)",
                    s.log_checkpoints
                ));
            }
            if s.ack_to_fsync_max_us > 0 {
                note.push_str(&format!(
                    "; longest ack-to-fsync {:.1} ms",
                    s.ack_to_fsync_max_us as f64 / 1000.0
                ));
            }
            note.push_str(&format!(
                "; longest commit {:.1} ms",
                s.commit_max_us as f64 / 1000.0
            ));
            note
        })
    }

    /// Flushes and closes the engine (after the timed part).
    pub fn close(&self) -> Result<(), String> {
        self.engine
            .close()
            .map_err(|e| format!("idemkv close: {e}"))
    }
}

impl Peer for Idem {
    type Conn = ();

    fn connect(&self) -> Result<(), String> {
        Ok(())
    }

    fn deliver(
        &self,
        _: &mut (),
        key: &[u8],
        response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let mut refusals = 0;
        loop {
            match self.engine.claim(key, &self.opts) {
                Ok(Claim::Acquired(lease)) => {
                    effect();
                    let token = lease.token();
                    let mut done = lease.complete(response);
                    while let Err(LeaseError::Overloaded(_)) = done {
                        self.retries.fetch_add(1, Ordering::Relaxed);
                        backoff(&mut refusals);
                        done = self.engine.complete(key, token, response);
                    }
                    return done
                        .map(|()| Delivery::Executed)
                        .map_err(|e| format!("complete: {e}"));
                }
                Ok(Claim::InProgress(_) | Claim::Completed(_) | Claim::Forgotten(_)) => {
                    return Ok(Delivery::Duplicate)
                }
                Err(ClaimError::Overloaded(_)) => {
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    backoff(&mut refusals);
                }
                Err(e) => return Err(format!("claim: {e}")),
            }
        }
    }

    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// `Buffered` acknowledges before writing: the run is not over until the writer has
    /// caught up, so the flush is timed (sustained throughput, not the burst the queue
    /// absorbs).
    fn drain(&self) -> Result<(), String> {
        self.engine
            .flush()
            .map_err(|e| format!("idemkv flush: {e}"))
    }
}

impl AsyncPeer for Idem {
    /// `claim_async`, then `Lease::complete_async`. A claim refused with `Overloaded` (the
    /// writer queue is full) awaits `flush_async` — the queue has room once what is in it
    /// is committed — and retries, counted as a back-pressure retry; `complete_async` waits
    /// for room itself.
    async fn deliver_async(
        &self,
        key: &[u8],
        response: &[u8],
        effect: &(dyn Fn() + Sync),
    ) -> Result<Delivery, String> {
        loop {
            match self.engine.claim_async(key, &self.opts).await {
                Ok(Claim::Acquired(lease)) => {
                    effect();
                    return lease
                        .complete_async(response)
                        .await
                        .map(|()| Delivery::Executed)
                        .map_err(|e| format!("complete: {e}"));
                }
                Ok(Claim::InProgress(_) | Claim::Completed(_) | Claim::Forgotten(_)) => {
                    return Ok(Delivery::Duplicate)
                }
                Err(ClaimError::Overloaded(_)) => {
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    self.engine
                        .flush_async()
                        .await
                        .map_err(|e| format!("idemkv flush: {e}"))?;
                }
                Err(e) => return Err(format!("claim: {e}")),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// redb used naively

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem");

/// redb with one write transaction per claim (check, then insert) and one per completion,
/// each committed with redb's default `Durability::Immediate`.
pub struct RedbNaive {
    db: redb::Database,
}

impl RedbNaive {
    /// Creates a new file in `dir` with the table.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let db = redb::Database::create(dir.join("naive.redb")).map_err(|e| e.to_string())?;
        let tx = db.begin_write().map_err(|e| e.to_string())?;
        tx.open_table(TABLE).map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| e.to_string())?;
        Ok(RedbNaive { db })
    }
}

impl Peer for RedbNaive {
    type Conn = ();

    fn connect(&self) -> Result<(), String> {
        Ok(())
    }

    fn deliver(
        &self,
        _: &mut (),
        key: &[u8],
        response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let e = |e: &dyn std::fmt::Display| format!("redb: {e}");
        let tx = self.db.begin_write().map_err(|x| e(&x))?;
        let won = {
            let mut table = tx.open_table(TABLE).map_err(|x| e(&x))?;
            let exists = table.get(key).map_err(|x| e(&x))?.is_some();
            if !exists {
                table.insert(key, &b"in-flight"[..]).map_err(|x| e(&x))?;
            }
            !exists
        };
        if !won {
            tx.abort().map_err(|x| e(&x))?;
            return Ok(Delivery::Duplicate);
        }
        tx.commit().map_err(|x| e(&x))?;
        effect();
        let tx = self.db.begin_write().map_err(|x| e(&x))?;
        {
            let mut table = tx.open_table(TABLE).map_err(|x| e(&x))?;
            table.insert(key, response).map_err(|x| e(&x))?;
        }
        tx.commit().map_err(|x| e(&x))?;
        Ok(Delivery::Executed)
    }
}

// ---------------------------------------------------------------------------------------
// SQLite (rusqlite, WAL)

/// SQLite in WAL mode, a connection per worker.
pub struct Sqlite {
    path: PathBuf,
    synchronous: &'static str,
    check_then_act: bool,
}

/// SQLite's busy handler: a writer that finds the write lock taken yields a few times, then
/// sleeps 25 µs doubling up to 2 ms, and gives up after about 30 s. Tried on this machine
/// against a fixed 50 µs sleep (64 pollers thrash the 2 cores: SQLite FULL fell to
/// ~80 deliveries/s) and against `busy_timeout` (1, 2, 5 … 100 ms sleeps: long stalls,
/// p99 near 2 s); this backoff gave SQLite its best throughput.
fn sqlite_busy(attempt: i32) -> bool {
    if attempt >= 15_000 {
        return false;
    }
    if attempt < 4 {
        std::thread::yield_now();
    } else {
        let us = (25u64 << (attempt - 4).min(7)).min(2000);
        std::thread::sleep(Duration::from_micros(us));
    }
    true
}

impl Sqlite {
    /// Creates the database file in `dir` with the table, in WAL mode. `synchronous` is
    /// `FULL` or `NORMAL`. `check_then_act` selects the racy baseline.
    pub fn open(
        dir: &Path,
        name: &str,
        synchronous: &'static str,
        check_then_act: bool,
    ) -> Result<Self, String> {
        let path = dir.join(name);
        let conn = rusqlite::Connection::open(&path).map_err(|e| e.to_string())?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS idem (
                 key TEXT PRIMARY KEY,
                 response BLOB
             ) WITHOUT ROWID;",
        )
        .map_err(|e| e.to_string())?;
        Ok(Sqlite {
            path,
            synchronous,
            check_then_act,
        })
    }
}

impl Peer for Sqlite {
    type Conn = rusqlite::Connection;

    fn connect(&self) -> Result<rusqlite::Connection, String> {
        let conn = rusqlite::Connection::open(&self.path).map_err(|e| e.to_string())?;
        conn.busy_handler(Some(sqlite_busy))
            .map_err(|e| e.to_string())?;
        conn.execute_batch(&format!("PRAGMA synchronous = {};", self.synchronous))
            .map_err(|e| e.to_string())?;
        Ok(conn)
    }

    fn deliver(
        &self,
        conn: &mut rusqlite::Connection,
        key: &[u8],
        response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let e = |e: rusqlite::Error| format!("sqlite: {e}");
        let key = std::str::from_utf8(key).map_err(|x| x.to_string())?;
        if self.check_then_act {
            // The bug this crate exists to prevent: look, then act, then record.
            let exists = conn
                .prepare_cached("SELECT 1 FROM idem WHERE key = ?1")
                .map_err(e)?
                .exists([key])
                .map_err(e)?;
            if exists {
                return Ok(Delivery::Duplicate);
            }
            effect();
            conn.prepare_cached(
                "INSERT INTO idem (key, response) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET response = excluded.response",
            )
            .map_err(e)?
            .execute(rusqlite::params![key, response])
            .map_err(e)?;
            return Ok(Delivery::Executed);
        }
        let inserted = conn
            .prepare_cached("INSERT INTO idem (key) VALUES (?1) ON CONFLICT DO NOTHING")
            .map_err(e)?
            .execute([key])
            .map_err(e)?;
        if inserted == 0 {
            return Ok(Delivery::Duplicate);
        }
        effect();
        conn.prepare_cached("UPDATE idem SET response = ?2 WHERE key = ?1")
            .map_err(e)?
            .execute(rusqlite::params![key, response])
            .map_err(e)?;
        Ok(Delivery::Executed)
    }
}

// ---------------------------------------------------------------------------------------
// PostgreSQL

/// PostgreSQL on loopback, a connection per worker, autocommit statements.
pub struct Pg {
    conninfo: String,
    synchronous_commit: bool,
    statements: AtomicU64,
}

impl Pg {
    /// Creates (or empties) the table and checkpoints, so each run starts alike.
    pub fn setup(conninfo: &str, synchronous_commit: bool) -> Result<Self, String> {
        let mut c = postgres::Client::connect(conninfo, postgres::NoTls)
            .map_err(|e| format!("postgres connect: {e}"))?;
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS idem (key text PRIMARY KEY, response bytea);
             TRUNCATE idem;
             CHECKPOINT;",
        )
        .map_err(|e| format!("postgres setup: {e}"))?;
        Ok(Pg {
            conninfo: conninfo.to_string(),
            synchronous_commit,
            statements: AtomicU64::new(0),
        })
    }

    /// The server's version string.
    pub fn version(conninfo: &str) -> Result<String, String> {
        let mut c = postgres::Client::connect(conninfo, postgres::NoTls)
            .map_err(|e| format!("postgres connect: {e}"))?;
        let row = c
            .query_one("SHOW server_version", &[])
            .map_err(|e| e.to_string())?;
        Ok(row.get::<_, String>(0))
    }
}

/// One worker's connection and its prepared statements.
pub struct PgConn {
    client: postgres::Client,
    claim: postgres::Statement,
    complete: postgres::Statement,
}

impl Peer for Pg {
    type Conn = PgConn;

    fn connect(&self) -> Result<PgConn, String> {
        let e = |e: postgres::Error| format!("postgres: {e}");
        let mut client = postgres::Client::connect(&self.conninfo, postgres::NoTls).map_err(e)?;
        client
            .batch_execute(if self.synchronous_commit {
                "SET synchronous_commit = on"
            } else {
                "SET synchronous_commit = off"
            })
            .map_err(e)?;
        let claim = client
            .prepare("INSERT INTO idem (key) VALUES ($1) ON CONFLICT DO NOTHING")
            .map_err(e)?;
        let complete = client
            .prepare("UPDATE idem SET response = $2 WHERE key = $1")
            .map_err(e)?;
        Ok(PgConn {
            client,
            claim,
            complete,
        })
    }

    fn deliver(
        &self,
        c: &mut PgConn,
        key: &[u8],
        response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let e = |e: postgres::Error| format!("postgres: {e}");
        let key = std::str::from_utf8(key).map_err(|x| x.to_string())?;
        self.statements.fetch_add(1, Ordering::Relaxed);
        let inserted = c.client.execute(&c.claim, &[&key]).map_err(e)?;
        if inserted == 0 {
            return Ok(Delivery::Duplicate);
        }
        effect();
        self.statements.fetch_add(1, Ordering::Relaxed);
        c.client
            .execute(&c.complete, &[&key, &response])
            .map_err(e)?;
        Ok(Delivery::Executed)
    }

    fn round_trips(&self) -> Option<u64> {
        Some(self.statements.load(Ordering::Relaxed))
    }
}

// ---------------------------------------------------------------------------------------
// Redis

/// Redis persistence settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisPersistence {
    /// `appendonly yes`, `appendfsync always`.
    Always,
    /// `appendonly yes`, `appendfsync everysec`.
    EverySec,
    /// `appendonly no` (and no RDB snapshots: the server is started with `save ""`).
    Off,
}

/// Redis on loopback, one connection per worker, no pipelining.
pub struct Redis {
    client: redis::Client,
}

impl Redis {
    /// Sets the persistence mode on the running server, empties it, and waits until any
    /// AOF rewrite that the switch started is over.
    pub fn setup(url: &str, mode: RedisPersistence) -> Result<Self, String> {
        let e = |e: redis::RedisError| format!("redis: {e}");
        let client = redis::Client::open(url).map_err(e)?;
        let mut c = client.get_connection().map_err(e)?;
        let config = |c: &mut redis::Connection, k: &str, v: &str| -> Result<(), String> {
            redis::cmd("CONFIG")
                .arg("SET")
                .arg(k)
                .arg(v)
                .query::<()>(c)
                .map_err(e)
        };
        config(&mut c, "appendonly", "no")?;
        redis::cmd("FLUSHALL").query::<()>(&mut c).map_err(e)?;
        match mode {
            RedisPersistence::Always => config(&mut c, "appendfsync", "always")?,
            RedisPersistence::EverySec => config(&mut c, "appendfsync", "everysec")?,
            RedisPersistence::Off => {}
        }
        if mode != RedisPersistence::Off {
            config(&mut c, "appendonly", "yes")?;
        }
        for _ in 0..500 {
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query(&mut c)
                .map_err(e)?;
            let busy = info.lines().any(|l| {
                l.trim() == "aof_rewrite_in_progress:1" || l.trim() == "aof_rewrite_scheduled:1"
            });
            if !busy {
                return Ok(Redis { client });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis: the AOF rewrite after switching persistence did not end".into())
    }

    /// The server's version.
    pub fn version(url: &str) -> Result<String, String> {
        let e = |e: redis::RedisError| format!("redis: {e}");
        let client = redis::Client::open(url).map_err(e)?;
        let mut c = client.get_connection().map_err(e)?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut c).map_err(e)?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_string())
    }
}

impl Peer for Redis {
    type Conn = redis::Connection;

    fn connect(&self) -> Result<redis::Connection, String> {
        self.client
            .get_connection()
            .map_err(|e| format!("redis: {e}"))
    }

    fn deliver(
        &self,
        c: &mut redis::Connection,
        key: &[u8],
        response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let e = |e: redis::RedisError| format!("redis: {e}");
        let won: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg("in-flight")
            .arg("NX")
            .arg("PX")
            .arg(LEASE.as_millis() as u64)
            .query(c)
            .map_err(e)?;
        if won.is_none() {
            return Ok(Delivery::Duplicate);
        }
        effect();
        redis::cmd("SET")
            .arg(key)
            .arg(response)
            .arg("XX")
            .arg("PX")
            .arg(RETENTION.as_millis() as u64)
            .query::<()>(c)
            .map_err(e)?;
        Ok(Delivery::Executed)
    }
}

// ---------------------------------------------------------------------------------------
// moka

/// moka's concurrent cache, in memory only. An empty value marks a key in flight.
pub struct Moka {
    cache: moka::sync::Cache<Box<[u8]>, Arc<[u8]>>,
}

impl Moka {
    /// A cache large enough for the whole run, with the retention as its time to live.
    pub fn new() -> Self {
        Moka {
            cache: moka::sync::Cache::builder()
                .max_capacity(10_000_000)
                .time_to_live(RETENTION)
                .build(),
        }
    }
}

impl Peer for Moka {
    type Conn = ();

    fn connect(&self) -> Result<(), String> {
        Ok(())
    }

    fn deliver(
        &self,
        _: &mut (),
        key: &[u8],
        response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let entry = self
            .cache
            .entry(Box::from(key))
            .or_insert_with(|| Arc::from(&[][..]));
        if !entry.is_fresh() {
            return Ok(Delivery::Duplicate);
        }
        effect();
        self.cache.insert(Box::from(key), Arc::from(response));
        Ok(Delivery::Executed)
    }
}

// ---------------------------------------------------------------------------------------
// A lock-striped map

/// Stripes of [`StripedMap`], as many as idemkv's index has by default.
const STRIPES: usize = 256;

/// One stripe: each key's state, `None` while in flight, then its stored response.
type Stripe = parking_lot::Mutex<HashMap<Box<[u8]>, Option<Arc<[u8]>>>>;

/// The simplest correct in-process claim and complete on idemkv's design: a key's stripe
/// is a `parking_lot` mutex over a `HashMap` from key to its state (`None` while in
/// flight, then the stored response). No leases, fencing, retention, fingerprints,
/// counters or records: what a lock-striped index costs on this workload before any of
/// idemkv's contract is paid for.
pub struct StripedMap {
    hasher: std::collections::hash_map::RandomState,
    stripes: Vec<Stripe>,
}

impl StripedMap {
    pub fn new() -> Self {
        StripedMap {
            hasher: std::collections::hash_map::RandomState::new(),
            stripes: (0..STRIPES).map(|_| Default::default()).collect(),
        }
    }

    fn stripe(&self, key: &[u8]) -> &Stripe {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(key) as usize;
        &self.stripes[hash % STRIPES]
    }
}

impl Peer for StripedMap {
    type Conn = ();

    fn connect(&self) -> Result<(), String> {
        Ok(())
    }

    fn deliver(
        &self,
        _: &mut (),
        key: &[u8],
        response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let stripe = self.stripe(key);
        {
            let mut map = stripe.lock();
            if map.contains_key(key) {
                return Ok(Delivery::Duplicate);
            }
            map.insert(Box::from(key), None);
        }
        effect();
        let done = Arc::from(response);
        match stripe.lock().get_mut(key) {
            Some(state) => *state = Some(done),
            None => return Err("striped map: a claimed key vanished".into()),
        }
        Ok(Delivery::Executed)
    }
}

// ---------------------------------------------------------------------------------------
// The harness's own floor

/// Not a system: one preallocated atomic flag per key, set by the first delivery. No
/// hashing, no allocation, no stored response, nothing to wait for: what the harness
/// itself (the shared delivery counter, the timestamps, the side-effect counters, C threads
/// on the machine's cores) costs per delivery, so the ceiling of any in-process row.
pub struct Floor {
    flags: Vec<std::sync::atomic::AtomicBool>,
}

impl Floor {
    /// Flags for keys `0..n` (the workload's key indexes).
    pub fn new(n: usize) -> Self {
        Floor {
            flags: (0..n)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
        }
    }
}

impl Peer for Floor {
    type Conn = ();

    fn connect(&self) -> Result<(), String> {
        Ok(())
    }

    fn deliver(
        &self,
        _: &mut (),
        key: &[u8],
        _response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let flag = crate::workload::key_index(key)
            .and_then(|i| self.flags.get(i))
            .ok_or_else(|| format!("floor: not a workload key: {key:?}"))?;
        Ok(if flag.swap(true, Ordering::AcqRel) {
            Delivery::Duplicate
        } else {
            effect();
            Delivery::Executed
        })
    }
}

// ---------------------------------------------------------------------------------------
// The floor of durable group commit

/// Bytes of one [`DurableFloor`] record: the key's index shifted left 8 bits, or'ed with
/// its [`Tag`], as one little-endian `u64`.
const RECORD_BYTES: usize = 8;
/// The unit of a direct write, offset and length (idemkv's commit log uses the same).
const BLOCK_BYTES: usize = 4096;

/// What a [`DurableFloor`] record says of its key; a zero tag ends the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// The key was claimed.
    Claim = 1,
    /// The key's claim was completed.
    Complete = 2,
}

fn encode(index: usize, tag: Tag) -> u64 {
    ((index as u64) << 8) | tag as u64
}

/// The callers' records waiting for the writer, and what the writer tells them.
#[derive(Default)]
struct Queue {
    records: Vec<u64>,
    /// The sequence number of the last record queued (the first one's is 1).
    issued: u64,
    /// The open batch: the number of batches the writer has taken.
    batch: u64,
    /// Every record numbered at or below this is durable.
    durable: u64,
    /// The writer is parked (or about to be) on an empty queue: the next caller unparks it.
    writer_idle: bool,
    /// No more records are taken: closed, or a write failed (`failed` says why).
    closed: bool,
    failed: Option<String>,
}

/// What the callers and the writer share.
///
/// Waking: a caller waits on the condition variable of its batch's parity, under the
/// queue's mutex; the writer raises the watermark and notifies that one under the same
/// mutex. So exactly the callers the write made durable wake (the next batch's callers
/// wait on the other one; the batch after that opens only once this one is notified), and
/// `parking_lot` requeues them on the mutex, where each wakes the next as it lets go: the
/// writer pays one wake-up per write. Tried on the 2-core VM of docs/benchmarks.md
/// against per-thread parking (the writer unparking each caller of the batch: the woken
/// callers preempted it, 0.4–1.5 involuntary context switches and 11–20 µs of CPU per pair
/// against 0.2 and 7),
/// against one condition variable for both batches (callers of the next batch woken for
/// nothing: 2.5 voluntary switches per pair against 2.1), and against a watermark under a
/// mutex of its own (a second lock per record: 7.6–7.9 µs of CPU per pair, and lower
/// throughput in every alternating round); this was the fastest. A raw futex per batch
/// parity, woken for the whole batch in one system call (Linux only), had the same median
/// throughput in 8 alternating rounds, higher peaks and a lower p99, but 9–12 µs of CPU
/// per pair (the callers, woken at once, contend for the queue's mutex).
#[derive(Default)]
struct GroupLog {
    queue: parking_lot::Mutex<Queue>,
    /// Callers of batch `b` wait on `written[b % 2]`.
    written: [parking_lot::Condvar; 2],
    writer: std::sync::OnceLock<std::thread::Thread>,
    writes: AtomicU64,
    records: AtomicU64,
}

impl GroupLog {
    /// Queues `record` and blocks until it is durable.
    fn append(&self, record: u64) -> Result<(), String> {
        let mut q = self.queue.lock();
        if q.closed {
            return Err(why_closed(&q));
        }
        q.records.push(record);
        q.issued += 1;
        let (seq, written) = (q.issued, &self.written[(q.batch % 2) as usize]);
        if std::mem::take(&mut q.writer_idle) {
            if let Some(writer) = self.writer.get() {
                writer.unpark();
            }
        }
        while q.durable < seq {
            if q.failed.is_some() {
                return Err(why_closed(&q));
            }
            written.wait(&mut q);
        }
        Ok(())
    }

    /// The writer: takes everything queued, appends it with one durable write, raises the
    /// watermark and wakes the batch's callers. Returns when closed and drained, or at the
    /// first failed write (after waking every waiter), with how long each write took (ns).
    fn write_loop(&self, mut file: AppendFile) -> Vec<u64> {
        let mut batch = Vec::new();
        let mut took_ns = Vec::new();
        loop {
            let (last, b) = {
                let mut q = self.queue.lock();
                while q.records.is_empty() {
                    if q.closed {
                        return took_ns;
                    }
                    q.writer_idle = true;
                    parking_lot::MutexGuard::unlocked(&mut q, std::thread::park);
                }
                std::mem::swap(&mut q.records, &mut batch);
                q.batch += 1;
                (q.issued, q.batch - 1)
            };
            let t = std::time::Instant::now();
            let written = file.append(&batch);
            took_ns.push(t.elapsed().as_nanos() as u64);
            let mut q = self.queue.lock();
            if let Err(e) = written {
                q.failed = Some(e.to_string());
                q.closed = true;
                self.written.iter().for_each(|w| {
                    w.notify_all();
                });
                return took_ns;
            }
            q.durable = last;
            self.written[(b % 2) as usize].notify_all();
            drop(q);
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.records
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            batch.clear();
        }
    }
}

fn why_closed(q: &Queue) -> String {
    match &q.failed {
        Some(why) => format!("durable floor: {why}"),
        None => "durable floor: closed".into(),
    }
}

/// The file a [`DurableFloor`] appends to: preallocated (zeros written and synced at
/// open, as idemkv prepares its commit log, so an append changes no metadata), written
/// through a second descriptor opened `O_DIRECT | O_DSYNC` from a block-aligned image of
/// the file, each write durable when it returns; where the file system refuses direct I/O,
/// a buffered write and `fdatasync`.
struct AppendFile {
    file: std::fs::File,
    direct: Option<std::fs::File>,
    /// The file's content from `start` (block-aligned), `capacity` bytes.
    image: Vec<u8>,
    start: usize,
    capacity: usize,
    /// Bytes of records written.
    end: usize,
}

impl AppendFile {
    fn create(path: &Path, records: usize) -> std::io::Result<AppendFile> {
        use std::io::Write;
        let capacity = (records * RECORD_BYTES).div_ceil(BLOCK_BYTES).max(1) * BLOCK_BYTES;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        file.write_all(&vec![0u8; capacity])?;
        file.sync_all()?;
        let image = vec![0u8; capacity + BLOCK_BYTES];
        let start = image.as_ptr().align_offset(BLOCK_BYTES);
        Ok(AppendFile {
            direct: Self::open_direct(path),
            file,
            image,
            start,
            capacity,
            end: 0,
        })
    }

    #[cfg(target_os = "linux")]
    fn open_direct(path: &Path) -> Option<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(path)
            .ok()
    }

    #[cfg(not(target_os = "linux"))]
    fn open_direct(_path: &Path) -> Option<std::fs::File> {
        None
    }

    /// Appends `records` with one write, durable when this returns. The write covers the
    /// blocks from the one the previous append ended in: that block is written again with
    /// the same bytes before the new records, so a torn write cannot damage an earlier
    /// acknowledged record (PostgreSQL rewrites its last WAL page the same way).
    fn append(&mut self, records: &[u64]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let end = self.end + records.len() * RECORD_BYTES;
        if end > self.capacity {
            return Err(std::io::Error::other("the file is full"));
        }
        let image = &mut self.image[self.start..self.start + self.capacity];
        for (slot, r) in image[self.end..end]
            .chunks_exact_mut(RECORD_BYTES)
            .zip(records)
        {
            slot.copy_from_slice(&r.to_le_bytes());
        }
        let from = self.end / BLOCK_BYTES * BLOCK_BYTES;
        let to = end.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        self.end = end;
        let data = &image[from..to];
        if let Some(direct) = &self.direct {
            match direct.write_at(data, from as u64) {
                Ok(n) if n == data.len() => return Ok(()),
                Ok(n) => {
                    return Err(std::io::Error::other(format!(
                        "a direct write of {} bytes wrote {n}",
                        data.len()
                    )))
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    self.direct = None;
                }
                Err(e) => return Err(e),
            }
        }
        self.file.write_all_at(data, from as u64)?;
        self.file.sync_data()
    }
}

/// Not a system: the minimal correct durable group commit, the floor under every row that
/// acknowledges a claim and a completion only once each is on disk. One preallocated
/// atomic flag per key as in [`Floor`]; the delivery that sets it writes a claim record
/// and waits until it is durable, runs the effect, then writes a completion record and
/// waits again; every other delivery is a duplicate at once (as idemkv replays duplicates
/// from memory). Callers queue an 8-byte record under one mutex and wait; one writer
/// thread appends all that is queued with one durable write ([`AppendFile`]) and wakes
/// exactly the callers it made durable ([`GroupLog`]). No hashing, no index, no stored
/// response, no checkpoint: what two durable group commits per pair cost on this machine,
/// not a rival.
pub struct DurableFloor {
    flags: Vec<std::sync::atomic::AtomicBool>,
    log: Arc<GroupLog>,
    writer: parking_lot::Mutex<Option<std::thread::JoinHandle<Vec<u64>>>>,
    /// How long each write took, in ns, sorted (filled in by [`DurableFloor::close`]).
    writes_ns: parking_lot::Mutex<Vec<u64>>,
    path: PathBuf,
    direct: bool,
}

impl DurableFloor {
    /// Flags for keys `0..n` and a new file in `dir` with room for a claim and a
    /// completion of each, written with direct I/O if the file system takes it.
    pub fn open(dir: &Path, n: usize) -> Result<Self, String> {
        let path = dir.join("durable-floor.log");
        let file = AppendFile::create(&path, 2 * n)
            .map_err(|e| format!("durable floor: {}: {e}", path.display()))?;
        let direct = file.direct.is_some();
        let log = Arc::new(GroupLog::default());
        let writer = {
            let log = Arc::clone(&log);
            std::thread::Builder::new()
                .name("durable-floor".into())
                .spawn(move || log.write_loop(file))
                .map_err(|e| format!("durable floor: spawn the writer: {e}"))?
        };
        let _ = log.writer.set(writer.thread().clone());
        Ok(DurableFloor {
            flags: (0..n)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            log,
            writer: parking_lot::Mutex::new(Some(writer)),
            writes_ns: parking_lot::Mutex::new(Vec::new()),
            path,
            direct,
        })
    }

    /// Stops the writer once it has written what is queued; an error if a write failed.
    pub fn close(&self) -> Result<(), String> {
        let wake = {
            let mut q = self.log.queue.lock();
            q.closed = true;
            std::mem::take(&mut q.writer_idle)
        };
        if let Some(handle) = self.writer.lock().take() {
            if wake {
                handle.thread().unpark();
            }
            let mut took_ns = handle
                .join()
                .map_err(|_| "durable floor: the writer panicked".to_string())?;
            took_ns.sort_unstable();
            *self.writes_ns.lock() = took_ns;
        }
        match &self.log.queue.lock().failed {
            Some(why) => Err(format!("durable floor: {why}")),
            None => Ok(()),
        }
    }

    /// The writes so far and the records they carried, how long they took (once
    /// closed), and whether they went direct.
    pub fn note(&self) -> String {
        let writes = self.log.writes.load(Ordering::Relaxed);
        let records = self.log.records.load(Ordering::Relaxed);
        let took_ns = self.writes_ns.lock();
        format!(
            "{writes} group commits, {:.1} records each on average, each write p50 {}; {}",
            records as f64 / writes.max(1) as f64,
            crate::report::fmt_ns(crate::workload::percentile(&took_ns, 0.5)),
            if self.direct {
                "O_DIRECT | O_DSYNC writes"
            } else {
                "buffered writes + fdatasync"
            }
        )
    }

    /// The records in the file, in order (read after [`DurableFloor::close`]).
    pub fn read_back(&self) -> Result<Vec<(usize, Tag)>, String> {
        let bytes = std::fs::read(&self.path).map_err(|e| format!("durable floor: {e}"))?;
        let mut out = Vec::new();
        for chunk in bytes.chunks_exact(RECORD_BYTES) {
            let mut raw = [0u8; RECORD_BYTES];
            raw.copy_from_slice(chunk);
            let r = u64::from_le_bytes(raw);
            let tag = match r & 0xff {
                0 => break,
                1 => Tag::Claim,
                2 => Tag::Complete,
                t => return Err(format!("durable floor: a record with tag {t}")),
            };
            out.push(((r >> 8) as usize, tag));
        }
        Ok(out)
    }
}

/// The latency of `count` appends of one 4 KiB block each, in ns, as [`DurableFloor`]'s
/// writer appends (to a new, preallocated file at `path`, removed after), and whether
/// they went direct (`O_DIRECT | O_DSYNC`) rather than buffered with `fdatasync`.
pub fn block_append_latencies_ns(path: &Path, count: usize) -> Result<(Vec<u64>, bool), String> {
    let e = |e: std::io::Error| format!("{}: {e}", path.display());
    let per_block = BLOCK_BYTES / RECORD_BYTES;
    let mut file = AppendFile::create(path, count * per_block).map_err(e)?;
    let block: Vec<u64> = (1..=per_block as u64).collect();
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let t = std::time::Instant::now();
        file.append(&block).map_err(e)?;
        out.push(t.elapsed().as_nanos() as u64);
    }
    let direct = file.direct.is_some();
    drop(file);
    let _ = std::fs::remove_file(path);
    Ok((out, direct))
}

impl Drop for DurableFloor {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Peer for DurableFloor {
    type Conn = ();

    fn connect(&self) -> Result<(), String> {
        Ok(())
    }

    fn deliver(
        &self,
        _: &mut (),
        key: &[u8],
        _response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String> {
        let index = crate::workload::key_index(key)
            .filter(|&i| i < self.flags.len())
            .ok_or_else(|| format!("durable floor: not a workload key: {key:?}"))?;
        if self.flags[index].swap(true, Ordering::AcqRel) {
            return Ok(Delivery::Duplicate);
        }
        self.log.append(encode(index, Tag::Claim))?;
        effect();
        self.log.append(encode(index, Tag::Complete))?;
        Ok(Delivery::Executed)
    }
}
