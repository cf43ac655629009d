//! The scenario: a producer, consumers in one consumer group, a reclaimer that hands
//! entries idle for `min_idle` to the consumers (Redis Streams' redelivery), and the report.
//!
//! Everything the report counts lives in Redis, under the run's prefix, so a consumer that
//! is killed loses none of it: per-message side effects, deliveries, reclaims, the ack log.

use crate::resp::{args, Conn, Error, RedisError, Result, Value};
use idemkv::{ClaimOptions, Engine, RunError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The consumer group every consumer reads in.
const GROUP: &str = "workers";

/// How a consumer makes its work happen once per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Check a processed set, work, add to the set, XACK.
    Naive,
    /// `Engine::run` keyed by the message id, XACK for the winner and every replay.
    Idemkv,
}

/// One run's parameters. Serialized for the consumer processes the example spawns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// `host:port` of the Redis server.
    pub redis: String,
    /// Namespace of the run's Redis keys and the engine scope of its message ids.
    pub prefix: String,
    pub messages: usize,
    pub consumers: usize,
    /// Percentage of messages the producer publishes twice (a retrying producer).
    pub duplicate_pct: u32,
    /// Percentage of messages whose work takes `slow_ms` instead of `work_ms`.
    pub slow_pct: u32,
    pub work_ms: (u64, u64),
    pub slow_ms: (u64, u64),
    /// XAUTOCLAIM's min-idle-time: an entry unacknowledged this long is redelivered.
    pub min_idle: Duration,
    pub reclaim_every: Duration,
    /// The claim's lease (shorter than the slow work on purpose).
    pub lease: Duration,
    /// How long a redelivered copy waits for the holder of its message before giving up
    /// (and leaving the entry to the next redelivery).
    pub wait: Duration,
    pub seed: u64,
    /// Give up on the run (reported as not done) after this long.
    pub deadline: Duration,
}

impl Config {
    pub fn new(redis: &str, prefix: &str) -> Config {
        Config {
            redis: redis.to_string(),
            prefix: prefix.to_string(),
            messages: 2000,
            consumers: 8,
            duplicate_pct: 5,
            slow_pct: 5,
            work_ms: (1, 50),
            slow_ms: (200, 400),
            min_idle: Duration::from_millis(100),
            reclaim_every: Duration::from_millis(20),
            lease: Duration::from_millis(100),
            wait: Duration::from_secs(1),
            seed: 7,
            deadline: Duration::from_secs(300),
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// The message's work time: a property of the message, the same for every copy.
    fn work_for(&self, msg: &str) -> Duration {
        let h = msg.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let mut rng = fastrand::Rng::with_seed(self.seed ^ h);
        let (lo, hi) = if rng.u32(0..100) < self.slow_pct {
            self.slow_ms
        } else {
            self.work_ms
        };
        Duration::from_millis(rng.u64(lo..=hi))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn err(msg: String) -> Error {
    Box::new(RedisError(msg))
}

fn at(items: &[Value], i: usize) -> Result<&Value> {
    items
        .get(i)
        .ok_or_else(|| err(format!("reply too short: {items:?}")))
}

/// A stream entry: its id in the stream and the producer's message id.
#[derive(Debug, Clone)]
pub struct Entry {
    pub entry: String,
    pub msg: String,
}

/// Entries of an XREADGROUP stream reply or XAUTOCLAIM's claimed list. An entry deleted
/// from the stream meanwhile (no fields) is skipped.
fn entries(list: &[Value]) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for item in list {
        let parts = item.array()?;
        let fields = at(parts, 1)?.array()?;
        let msg = fields
            .chunks(2)
            .find(|kv| kv[0] == Value::Bytes(b"id".to_vec()))
            .and_then(|kv| kv.get(1));
        if let Some(msg) = msg {
            out.push(Entry {
                entry: at(parts, 0)?.string()?,
                msg: msg.string()?,
            });
        }
    }
    Ok(out)
}

/// Creates the stream and the group, and notes the start time.
pub fn setup(cfg: &Config) -> Result<()> {
    let mut c = Conn::connect(&cfg.redis)?;
    c.cmd(&[
        "XGROUP",
        "CREATE",
        &cfg.key("stream"),
        GROUP,
        "0",
        "MKSTREAM",
    ])?;
    c.cmd(&["SET", &cfg.key("start"), &now_ms().to_string()])?;
    Ok(())
}

/// Publishes the messages; a duplicate goes out a few messages after its original, as a
/// producer's retry after a lost acknowledgement would.
pub fn produce(cfg: &Config) -> Result<()> {
    let mut c = Conn::connect(&cfg.redis)?;
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let stream = cfg.key("stream");
    let mut retries: Vec<(usize, String)> = Vec::new();
    let publish = |c: &mut Conn, msg: &str| {
        c.cmd(&["XADD", &stream, "*", "id", msg, "amount", "100"])
            .map(drop)
    };
    for i in 0..cfg.messages {
        let msg = format!("msg-{i:06}");
        publish(&mut c, &msg)?;
        if rng.u32(0..100) < cfg.duplicate_pct {
            retries.push((i + rng.usize(1..20), msg));
        }
        for (_, msg) in retries.extract_if(.., |(due, _)| *due <= i) {
            publish(&mut c, &msg)?;
        }
    }
    for (_, msg) in retries {
        publish(&mut c, &msg)?;
    }
    Ok(())
}

/// Waits until every entry of the stream is acknowledged, or the deadline passes.
pub fn await_done(cfg: &Config, started: std::time::Instant) -> Result<bool> {
    let mut c = Conn::connect(&cfg.redis)?;
    loop {
        let entries = c.cmd(&["XLEN", &cfg.key("stream")])?.int()?;
        let acked = c.cmd(&["HLEN", &cfg.key("acked")])?.int()?;
        if acked >= entries {
            return Ok(true);
        }
        if started.elapsed() > cfg.deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Tells every consumer, in this process or another, to stop.
pub fn signal_stop(cfg: &Config) -> Result<()> {
    Conn::connect(&cfg.redis)?.cmd(&["SET", &cfg.key("stop"), "1"])?;
    Ok(())
}

/// What the consumers of one process share.
struct Process<'a> {
    cfg: &'a Config,
    mode: Mode,
    engine: Option<&'a Engine>,
    /// Abort right after this many completions (see [`consume`]).
    abort_at: Option<usize>,
    completed: AtomicUsize,
    stop: AtomicBool,
}

/// The consumers of one process: `threads` consumer threads and one reclaimer, until the
/// stop key is set. With `abort_at = Some(k)` the process aborts right after the k-th
/// message it completed, before that message's XACK (a crash at the worst moment).
pub fn consume(
    cfg: &Config,
    mode: Mode,
    engine: Option<&Engine>,
    name: &str,
    threads: usize,
    abort_at: Option<usize>,
) -> Result<()> {
    if mode == Mode::Idemkv && engine.is_none() {
        return Err(err("idemkv mode without an engine".into()));
    }
    let p = Process {
        cfg,
        mode,
        engine,
        abort_at,
        completed: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    };
    // Bounded: the reclaimer claims no more than the consumers can take on.
    let (tx, rx) = crossbeam_channel::bounded::<Entry>(threads);
    std::thread::scope(|s| {
        let p = &p;
        let reclaimer = s.spawn(move || {
            let r = reclaim(p, name, &tx, threads);
            // Whatever ended the reclaimer ends the consumers too.
            p.stop.store(true, Ordering::SeqCst);
            r
        });
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let rx = rx.clone();
                s.spawn(move || {
                    let r = Consumer::new(p, format!("{name}-{i}")).and_then(|mut c| c.run(&rx));
                    if r.is_err() {
                        p.stop.store(true, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        let mut result = reclaimer
            .join()
            .map_err(|_| err("reclaimer panicked".into()))?;
        for w in workers {
            let r = w.join().map_err(|_| err("consumer panicked".into()))?;
            result = result.and(r);
        }
        result
    })
}

/// Every `reclaim_every`: XAUTOCLAIM the entries idle for `min_idle` (their consumer is slow
/// or dead) and hand them to this process's consumers.
fn reclaim(
    p: &Process,
    name: &str,
    tx: &crossbeam_channel::Sender<Entry>,
    capacity: usize,
) -> Result<()> {
    let cfg = p.cfg;
    let mut c = Conn::connect(&cfg.redis)?;
    let (stream, idle) = (cfg.key("stream"), cfg.min_idle.as_millis().to_string());
    let me = format!("{name}-reclaimer");
    while !p.stop.load(Ordering::SeqCst) {
        if c.cmd(&["EXISTS", &cfg.key("stop")])?.int()? == 1 {
            break;
        }
        let room = capacity.saturating_sub(tx.len());
        if room > 0 {
            let reply = c.cmd(&[
                "XAUTOCLAIM",
                &stream,
                GROUP,
                &me,
                &idle,
                "0-0",
                "COUNT",
                &room.to_string(),
            ])?;
            let claimed = entries(at(reply.array()?, 1)?.array()?)?;
            if !claimed.is_empty() {
                c.cmd(&["INCRBY", &cfg.key("reclaimed"), &claimed.len().to_string()])?;
            }
            for e in claimed {
                if tx.send(e).is_err() {
                    return Ok(());
                }
            }
        }
        std::thread::sleep(cfg.reclaim_every);
    }
    Ok(())
}

/// One consumer of the group, with its own connection.
struct Consumer<'a> {
    p: &'a Process<'a>,
    cfg: &'a Config,
    name: String,
    c: Conn,
}

impl<'a> Consumer<'a> {
    fn new(p: &'a Process<'a>, name: String) -> Result<Self> {
        Ok(Consumer {
            p,
            cfg: p.cfg,
            name,
            c: Conn::connect(&p.cfg.redis)?,
        })
    }

    /// Reclaimed entries first, then new ones (XREADGROUP `>`), until told to stop.
    fn run(&mut self, reclaimed: &crossbeam_channel::Receiver<Entry>) -> Result<()> {
        let stream = self.cfg.key("stream");
        while !self.p.stop.load(Ordering::SeqCst) {
            let batch = match reclaimed.try_recv() {
                Ok(e) => vec![e],
                Err(_) => {
                    let reply = self.c.cmd(&[
                        "XREADGROUP",
                        "GROUP",
                        GROUP,
                        &self.name,
                        "COUNT",
                        "1",
                        "BLOCK",
                        "20",
                        "STREAMS",
                        &stream,
                        ">",
                    ])?;
                    match reply.array()?.first() {
                        Some(s) => entries(at(s.array()?, 1)?.array()?)?,
                        None => continue,
                    }
                }
            };
            for e in batch {
                self.c.transaction(&[
                    args(&[
                        b"HINCRBY",
                        self.cfg.key("deliveries").as_bytes(),
                        e.entry.as_bytes(),
                        b"1",
                    ]),
                    args(&[
                        b"HSETNX",
                        self.cfg.key("first").as_bytes(),
                        e.entry.as_bytes(),
                        now_ms().to_string().as_bytes(),
                    ]),
                ])?;
                match (self.p.mode, self.p.engine) {
                    (Mode::Idemkv, Some(engine)) => self.with_engine(engine, &e)?,
                    _ => self.naive(&e)?,
                }
            }
        }
        Ok(())
    }

    /// Check, work, mark, ack: two copies that check before either marks both work.
    fn naive(&mut self, e: &Entry) -> Result<()> {
        let processed = self.cfg.key("processed");
        if self.c.cmd(&["SISMEMBER", &processed, &e.msg])?.int()? == 1 {
            return self.ack(e, "skip", b"");
        }
        std::thread::sleep(self.cfg.work_for(&e.msg));
        let receipt = format!("{} charged by {}", e.msg, self.name);
        self.side_effect(&e.msg, &receipt)?;
        self.c.cmd(&["SADD", &processed, &e.msg])?;
        self.ack(e, "naive", receipt.as_bytes())
    }

    /// `Engine::run` keyed by the message id; XACK for the winner and for a replay. A copy
    /// that gets no answer (the holder still at work when the wait ends, or an error) is not
    /// acknowledged: the broker redelivers it.
    fn with_engine(&mut self, engine: &Engine, e: &Entry) -> Result<()> {
        // A lease shorter than the slow work: `run` keeps it alive while the handler works,
        // so a live consumer keeps its message and a dead one's is taken over one lease later.
        let opts = ClaimOptions::default()
            .scope(self.cfg.prefix.as_bytes())
            .lease(self.cfg.lease)
            .wait(self.cfg.wait);
        let outcome = engine.run(e.msg.as_bytes(), &opts, |lease| -> Result<Vec<u8>> {
            // A takeover (attempt > 1) follows a holder that died, maybe after its side
            // effect landed and before its completion was stored: look before doing it
            // again. Attempts never overlap, so the look cannot race that holder.
            if lease.attempt() > 1 {
                self.count("takeovers")?;
                let done = self.c.cmd(&["HGET", &self.cfg.key("receipts"), &e.msg])?;
                if let Some(receipt) = done.opt_string()? {
                    self.count("reconciled")?;
                    return Ok(receipt.into_bytes());
                }
            }
            std::thread::sleep(self.cfg.work_for(&e.msg));
            let receipt = format!("{} charged by {} token {}", e.msg, self.name, lease.token());
            self.side_effect(&e.msg, &receipt)?;
            Ok(receipt.into_bytes())
        });
        match outcome {
            Ok(outcome) => {
                if !outcome.replayed() {
                    let n = self.p.completed.fetch_add(1, Ordering::SeqCst) + 1;
                    if self.p.abort_at == Some(n) {
                        let note = format!("{}\t{}", e.entry, e.msg);
                        self.c.cmd(&["SET", &self.cfg.key("aborted"), &note])?;
                        // Completed and stored, not acknowledged: the broker redelivers it.
                        std::process::abort();
                    }
                }
                let kind = if outcome.replayed() {
                    "replay"
                } else {
                    "fresh"
                };
                self.ack(e, kind, outcome.response())
            }
            Err(RunError::StillInProgress { .. }) => self.count("in_progress"),
            Err(other) => {
                eprintln!("{}: {} left to redelivery: {other}", self.name, e.msg);
                self.count("run_errors")
            }
        }
    }

    /// The side effect, visible outside the consumer: one more execution of `msg` and the
    /// receipt it produced, in one transaction.
    fn side_effect(&mut self, msg: &str, receipt: &str) -> Result<()> {
        self.c.transaction(&[
            args(&[
                b"HINCRBY",
                self.cfg.key("effects").as_bytes(),
                msg.as_bytes(),
                b"1",
            ]),
            args(&[
                b"HSET",
                self.cfg.key("receipts").as_bytes(),
                msg.as_bytes(),
                receipt.as_bytes(),
            ]),
        ])?;
        Ok(())
    }

    /// XACK, with the time of the entry's first acknowledgement and a line in the ack log
    /// (what this copy answered), in one transaction: a kill never leaves one without the
    /// others.
    fn ack(&mut self, e: &Entry, kind: &str, response: &[u8]) -> Result<()> {
        let cfg = self.cfg;
        let mut line = format!("{}\t{}\t{kind}\t", e.entry, e.msg).into_bytes();
        line.extend_from_slice(response);
        self.c.transaction(&[
            args(&[
                b"XACK",
                cfg.key("stream").as_bytes(),
                GROUP.as_bytes(),
                e.entry.as_bytes(),
            ]),
            args(&[
                b"HSETNX",
                cfg.key("acked").as_bytes(),
                e.entry.as_bytes(),
                now_ms().to_string().as_bytes(),
            ]),
            args(&[b"RPUSH", cfg.key("acklog").as_bytes(), &line]),
        ])?;
        Ok(())
    }

    /// Counts an idemkv answer other than a fresh run or a replay.
    fn count(&mut self, what: &str) -> Result<()> {
        self.c
            .cmd(&["HINCRBY", &self.cfg.key("stats"), what, "1"])?;
        Ok(())
    }
}

/// What a run did, read back from Redis.
#[derive(Debug, Default)]
pub struct Report {
    pub title: String,
    pub messages: usize,
    pub entries: usize,
    pub deliveries: u64,
    pub reclaimed: u64,
    pub max_deliveries: u64,
    /// Messages whose side effect ran 0, 1, 2, 3 or more times.
    pub effects: [usize; 4],
    pub doubles: Vec<(String, u64)>,
    pub fresh: usize,
    pub replays: usize,
    pub skips: usize,
    pub in_progress: u64,
    pub run_errors: u64,
    pub takeovers: u64,
    pub reconciled: u64,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub unacked: usize,
    pub pending: i64,
    /// Acknowledged copies whose answer is not the message's stored receipt.
    pub mismatched: Vec<String>,
    pub done: bool,
    /// The message completed and not acknowledged when its consumer aborted.
    pub aborted: Option<Aborted>,
    pub kills: Vec<String>,
    /// A naive run: its copies answer with their own receipts, nothing is replayed.
    pub naive: bool,
}

fn hash(c: &mut Conn, key: &str) -> Result<HashMap<String, String>> {
    let flat = c.cmd(&["HGETALL", key])?;
    let flat = flat.array()?;
    let mut map = HashMap::new();
    for kv in flat.chunks(2) {
        map.insert(at(kv, 0)?.string()?, at(kv, 1)?.string()?);
    }
    Ok(map)
}

fn num(map: &HashMap<String, String>, k: &str) -> Result<u64> {
    map.get(k).map_or(Ok(0), |v| v.parse().map_err(Into::into))
}

pub fn report(cfg: &Config, title: &str, done: bool) -> Result<Report> {
    let mut c = Conn::connect(&cfg.redis)?;
    let mut r = Report {
        title: title.to_string(),
        done,
        ..Report::default()
    };
    let stream = c.cmd(&["XRANGE", &cfg.key("stream"), "-", "+"])?;
    let all = entries(stream.array()?)?;
    let ids: HashSet<&str> = all.iter().map(|e| e.msg.as_str()).collect();
    r.entries = all.len();
    r.messages = ids.len();

    let effects = hash(&mut c, &cfg.key("effects"))?;
    let mut sorted: Vec<&str> = ids.iter().copied().collect();
    sorted.sort_unstable();
    for msg in sorted {
        let n = num(&effects, msg)?;
        r.effects[n.min(3) as usize] += 1;
        if n > 1 {
            r.doubles.push((msg.to_string(), n));
        }
    }

    let deliveries = hash(&mut c, &cfg.key("deliveries"))?;
    for e in &all {
        let n = num(&deliveries, &e.entry)?;
        r.deliveries += n;
        r.max_deliveries = r.max_deliveries.max(n);
    }
    r.reclaimed = c
        .cmd(&["GET", &cfg.key("reclaimed")])?
        .opt_string()?
        .map_or(Ok(0), |v| v.parse())?;
    let stats = hash(&mut c, &cfg.key("stats"))?;
    r.in_progress = num(&stats, "in_progress")?;
    r.run_errors = num(&stats, "run_errors")?;
    r.takeovers = num(&stats, "takeovers")?;
    r.reconciled = num(&stats, "reconciled")?;

    // Latency: an entry's first delivery to its first acknowledgement.
    let first = hash(&mut c, &cfg.key("first"))?;
    let acked = hash(&mut c, &cfg.key("acked"))?;
    let mut latencies = Vec::new();
    let mut last_ack = 0;
    for e in &all {
        match acked.get(&e.entry) {
            Some(a) => {
                let a: u64 = a.parse()?;
                last_ack = last_ack.max(a);
                latencies.push(a.saturating_sub(num(&first, &e.entry)?));
            }
            None => r.unacked += 1,
        }
    }
    latencies.sort_unstable();
    let pct = |p: usize| {
        latencies
            .get((latencies.len() * p / 100).min(latencies.len().saturating_sub(1)))
            .map_or(Duration::ZERO, |&ms| Duration::from_millis(ms))
    };
    (r.p50, r.p99) = (pct(50), pct(99));
    let start: u64 = c
        .cmd(&["GET", &cfg.key("start")])?
        .opt_string()?
        .map_or(Ok(0), |v| v.parse())?;
    r.elapsed = Duration::from_millis(last_ack.saturating_sub(start));
    let pending = c.cmd(&["XPENDING", &cfg.key("stream"), GROUP])?;
    r.pending = at(pending.array()?, 0)?.int()?;

    // Every acknowledged copy answered with the message's stored receipt.
    let receipts = hash(&mut c, &cfg.key("receipts"))?;
    let log = c.cmd(&["LRANGE", &cfg.key("acklog"), "0", "-1"])?;
    let mut acked_as: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in log.array()? {
        let line = line.string()?;
        let mut f = line.splitn(4, '\t');
        let (entry, msg, kind, response) = (f.next(), f.next(), f.next(), f.next());
        let (Some(entry), Some(msg), Some(kind), Some(response)) = (entry, msg, kind, response)
        else {
            return Err(err(format!("bad ack log line {line:?}")));
        };
        match kind {
            "fresh" => r.fresh += 1,
            "replay" => r.replays += 1,
            "skip" => r.skips += 1,
            _ => r.fresh += 1,
        }
        acked_as
            .entry(entry.to_string())
            .or_default()
            .push(kind.to_string());
        if matches!(kind, "fresh" | "replay")
            && receipts.get(msg).map(String::as_str) != Some(response)
        {
            r.mismatched.push(format!("{msg}: acked with {response:?}"));
        }
    }
    if let Some(note) = c.cmd(&["GET", &cfg.key("aborted")])?.opt_string()? {
        if let Some((entry, msg)) = note.split_once('\t') {
            r.aborted = Some(Aborted {
                entry: entry.to_string(),
                msg: msg.to_string(),
                deliveries: num(&deliveries, entry)?,
                acked_as: acked_as.remove(entry).unwrap_or_default(),
                effects: num(&effects, msg)?,
            });
        }
    }
    Ok(r)
}

/// What became of the entry whose consumer aborted after completing it, before its XACK.
#[derive(Debug)]
pub struct Aborted {
    pub entry: String,
    pub msg: String,
    /// Deliveries of the entry, the one before the abort included.
    pub deliveries: u64,
    /// How each acknowledgement of the entry answered (`replay`: the stored receipt).
    pub acked_as: Vec<String>,
    /// The message's side effects.
    pub effects: u64,
}

impl Report {
    /// Every message done: each stream entry acknowledged, nothing pending, each message's
    /// side effect exactly once, each acknowledged copy answered with the stored receipt.
    pub fn exactly_once(&self) -> bool {
        self.done
            && self.unacked == 0
            && self.pending == 0
            && self.effects[0] == 0
            && self.doubles.is_empty()
            && self.mismatched.is_empty()
    }

    pub fn print(&self) {
        let ms = |d: Duration| d.as_millis();
        println!("== {}", self.title);
        println!(
            "messages            {} ({} stream entries: {} published twice)",
            self.messages,
            self.entries,
            self.entries - self.messages
        );
        println!(
            "deliveries          {} ({} redelivered by XAUTOCLAIM; most deliveries of one entry: {})",
            self.deliveries, self.reclaimed, self.max_deliveries
        );
        println!(
            "side effects/msg    0: {}  1: {}  2: {}  3+: {}",
            self.effects[0], self.effects[1], self.effects[2], self.effects[3]
        );
        let shown: Vec<String> = self
            .doubles
            .iter()
            .take(8)
            .map(|(m, n)| format!("{m} x{n}"))
            .collect();
        println!(
            "double executions   {}{}",
            self.doubles.len(),
            if shown.is_empty() {
                String::new()
            } else {
                format!(
                    " ({}{})",
                    shown.join(", "),
                    if self.doubles.len() > 8 { ", ..." } else { "" }
                )
            }
        );
        println!(
            "acknowledged copies {} ran the work, {} replayed the stored result, {} skipped as processed",
            self.fresh, self.replays, self.skips
        );
        if !self.naive {
            println!(
                "not acknowledged    {} copies still in progress when their wait ended, {} errors (left to redelivery)",
                self.in_progress, self.run_errors
            );
            println!(
                "takeovers           {} (claims of a dead holder taken over), {} of them found its side effect applied and stored its receipt",
                self.takeovers, self.reconciled
            );
        }
        let secs = self.elapsed.as_secs_f64().max(0.001);
        println!(
            "throughput          {:.0} messages/s ({} ms in all)",
            self.messages as f64 / secs,
            ms(self.elapsed)
        );
        println!(
            "latency             p50 {} ms, p99 {} ms (first delivery to ack)",
            ms(self.p50),
            ms(self.p99)
        );
        for k in &self.kills {
            println!("crash               {k}");
        }
        if let Some(a) = &self.aborted {
            println!(
                "aborted message     {} (entry {}): completed, then its consumer aborted before XACK; \
                 the entry was delivered {} times and acked as [{}], the side effect ran {} time(s)",
                a.msg,
                a.entry,
                a.deliveries,
                a.acked_as.join(", "),
                a.effects
            );
        }
        for m in self.mismatched.iter().take(5) {
            println!("wrong answer        {m}");
        }
        println!(
            "check               done: {}, every entry acked: {} (unacked {}, pending {}), effect exactly once: {}, every copy acked with the stored result: {}",
            self.done,
            self.unacked == 0 && self.pending == 0,
            self.unacked,
            self.pending,
            self.effects[0] == 0 && self.doubles.is_empty(),
            if self.naive { "n/a" } else if self.mismatched.is_empty() { "true" } else { "false" }
        );
    }
}

/// Deletes the run's keys (a long-lived server is not left to fill up).
pub fn cleanup(cfg: &Config) -> Result<()> {
    let mut c = Conn::connect(&cfg.redis)?;
    let keys = [
        "stream",
        "start",
        "stop",
        "effects",
        "receipts",
        "processed",
        "deliveries",
        "first",
        "acked",
        "acklog",
        "reclaimed",
        "stats",
        "aborted",
    ];
    let mut cmd = vec!["DEL".to_string()];
    cmd.extend(keys.iter().map(|k| cfg.key(k)));
    c.cmd(&cmd)?;
    Ok(())
}

/// One run with its consumers as threads of this process.
pub fn run_in_process(
    cfg: &Config,
    mode: Mode,
    engine: Option<&Engine>,
    title: &str,
) -> Result<Report> {
    setup(cfg)?;
    let started = std::time::Instant::now();
    let done = std::thread::scope(|s| -> Result<bool> {
        let consumers = s.spawn(|| consume(cfg, mode, engine, "c", cfg.consumers, None));
        let produced = produce(cfg);
        let done = produced.and_then(|()| await_done(cfg, started));
        signal_stop(cfg)?;
        consumers
            .join()
            .map_err(|_| err("consumers panicked".into()))??;
        done
    })?;
    let mut report = report(cfg, title, done)?;
    report.naive = mode == Mode::Naive;
    Ok(report)
}
