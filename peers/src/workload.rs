//! The one workload every system runs: N distinct keys, each delivered D times, by C
//! concurrent workers. A delivery claims its key; the winner runs the side effect and then
//! completes the key with its response; every other delivery of the key is a duplicate.
//! The workers are OS threads calling a blocking API ([`run`]) or tasks on a 2-thread
//! tokio runtime awaiting an async one ([`run_async`]); the rest of the run is shared.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// What one delivery turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// This delivery won the claim, ran the side effect and completed the key.
    Executed,
    /// Another delivery owns (or owned) the key: nothing ran.
    Duplicate,
}

/// A system under test. `deliver` must call `effect` exactly when its claim won.
pub trait Peer: Sync {
    /// Per-worker state: a connection, or nothing for an embedded system.
    type Conn: Send;
    /// Opens one worker's connection (not timed).
    fn connect(&self) -> Result<Self::Conn, String>;
    /// Handles one delivery of `key`: claim, and if won, `effect()` then complete with
    /// `response`.
    fn deliver(
        &self,
        conn: &mut Self::Conn,
        key: &[u8],
        response: &[u8],
        effect: &dyn Fn(),
    ) -> Result<Delivery, String>;
    /// How many times a call was refused for back-pressure and retried (idemkv's bounded
    /// writer queue); 0 for systems that block instead.
    fn retries(&self) -> u64 {
        0
    }
    /// Called once after the last delivery, inside the timed part: whatever the system still
    /// owes for the deliveries it acknowledged (idemkv `Buffered`: writing them to the file).
    fn drain(&self) -> Result<(), String> {
        Ok(())
    }
    /// Statements sent to a database server so far, for systems that count them (the
    /// naive PostgreSQL peer, idemkv's shared backend); read after the run.
    fn round_trips(&self) -> Option<u64> {
        None
    }
}

/// The workload's shape.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Distinct keys.
    pub n: usize,
    /// Deliveries of each key.
    pub d: usize,
    /// Concurrent workers.
    pub c: usize,
    /// A run stops taking new deliveries after this long; the numbers then cover what it
    /// finished.
    pub time_limit: Duration,
    /// The response each winner stores.
    pub response: Vec<u8>,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Deliveries handled (all of N×D unless the time limit stopped the run).
    pub deliveries: u64,
    /// Deliveries that won and completed.
    pub executed: u64,
    /// Deliveries answered as duplicates.
    pub duplicates: u64,
    /// Deliveries that failed with an error (counted, not retried).
    pub errors: u64,
    /// The first error seen, if any.
    pub first_error: Option<String>,
    /// Keys whose side effect ran more than once.
    pub double_keys: u64,
    /// Side-effect runs beyond the first, over all keys.
    pub extra_runs: u64,
    /// Keys whose side effect ran at least once.
    pub keys_run: u64,
    /// Wall time from the start signal to the last worker's last delivery.
    pub elapsed: Duration,
    /// True if the time limit cut the run short.
    pub cut_short: bool,
    /// Latency of a winning delivery (claim + side effect + complete), median, in ns.
    pub p50_ns: u64,
    /// Same, 99th percentile.
    pub p99_ns: u64,
    /// Latency of a duplicate delivery (one claim answered "taken"), median, in ns.
    pub dup_p50_ns: u64,
    /// Same, 99th percentile.
    pub dup_p99_ns: u64,
    /// Retries after back-pressure.
    pub retries: u64,
    /// Throughput of every round (filled in by the caller when it keeps the best round).
    pub round_rates: Vec<f64>,
    /// Keys run more than once, summed over all rounds.
    pub double_keys_all: u64,
    /// Extra side-effect runs, summed over all rounds.
    pub extra_runs_all: u64,
    /// Errors, summed over all rounds.
    pub errors_all: u64,
    /// Rounds that failed to run at all.
    pub rounds_failed: usize,
    /// Anything the system reports about itself (idemkv: its group commits).
    pub note: Option<String>,
    /// Statements sent to the database server, where the system counts them.
    pub round_trips: Option<u64>,
    /// The process's CPU time and context switches from the start signal to the end of the
    /// drain (every thread: the workers, the system's own, the harness's watcher).
    pub usage: Option<Usage>,
}

/// CPU time and context switches of the whole process, as `getrusage` counts them (the
/// same as `perf stat -e task-clock,context-switches`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// User and system CPU time of every thread, in ns.
    pub cpu_ns: u64,
    /// Voluntary and involuntary context switches of every thread.
    pub switches: u64,
}

impl Usage {
    /// The process's usage so far; `None` if `getrusage` failed.
    pub fn now() -> Option<Usage> {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `getrusage` fills the `rusage` it is given a pointer to, and the zeroed
        // one is valid anyway.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        // SAFETY: zero-initialised, then filled by the call above.
        let ru = unsafe { ru.assume_init() };
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
        Some(Usage {
            cpu_ns: ns(ru.ru_utime) + ns(ru.ru_stime),
            switches: ru.ru_nvcsw as u64 + ru.ru_nivcsw as u64,
        })
    }

    /// What was used between `before` and `after`.
    fn between(before: Option<Usage>, after: Option<Usage>) -> Option<Usage> {
        let (b, a) = (before?, after?);
        Some(Usage {
            cpu_ns: a.cpu_ns.saturating_sub(b.cpu_ns),
            switches: a.switches.saturating_sub(b.switches),
        })
    }
}

impl Measured {
    /// Deliveries per second.
    pub fn throughput(&self) -> f64 {
        self.deliveries as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Completed keys (claim + complete pairs) per second.
    pub fn completes_per_sec(&self) -> f64 {
        self.executed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// CPU µs and context switches per claim+complete pair (over the whole run,
    /// duplicates included), where measured.
    pub fn per_pair(&self) -> Option<(f64, f64)> {
        let u = self.usage?;
        let pairs = self.executed.max(1) as f64;
        Some((u.cpu_ns as f64 / 1000.0 / pairs, u.switches as f64 / pairs))
    }
}

/// The index of a key [`key_of`] built (`order-NNNNNNNN`); `None` for any other bytes.
pub fn key_index(key: &[u8]) -> Option<usize> {
    std::str::from_utf8(key.strip_prefix(b"order-")?)
        .ok()?
        .parse()
        .ok()
}

/// The key of index `k`: `order-` and eight digits, built without allocating.
pub fn key_of(k: usize) -> [u8; 14] {
    let mut key = *b"order-00000000";
    let mut v = k;
    for i in (6..14).rev() {
        key[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    key
}

/// Nearest-rank percentile of a sorted slice.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A system that also offers an async API: the same delivery as [`Peer::deliver`], as a
/// future that never blocks its thread, so many workers can share a few runtime threads.
/// The workers are tasks on a tokio runtime; there is no per-worker connection (the only
/// implementor is embedded).
pub trait AsyncPeer: Peer + Send + 'static {
    /// Handles one delivery of `key`: claim, and if won, `effect()` then complete with
    /// `response`, awaiting instead of blocking.
    fn deliver_async<'a>(
        &'a self,
        key: &'a [u8],
        response: &'a [u8],
        effect: &'a (dyn Fn() + Sync),
    ) -> impl Future<Output = Result<Delivery, String>> + Send + 'a;
}

/// Runtime threads for the async rows: one per core of the machine the table is measured
/// on (2), so the tasks share the cores the way a service's runtime would.
pub const ASYNC_RUNTIME_THREADS: usize = 2;

/// What one worker (thread or task) recorded.
struct WorkerOut {
    lat: Vec<u64>,
    win_lat: Vec<u64>,
    dup_lat: Vec<u64>,
    executed: u64,
    duplicates: u64,
    errors: u64,
    first_error: Option<String>,
    end: Instant,
}

impl WorkerOut {
    fn new(w: &Workload) -> Self {
        let total = w.n * w.d;
        WorkerOut {
            lat: Vec::with_capacity(total / w.c + 16),
            win_lat: Vec::with_capacity(total / w.c / w.d.max(1) + 16),
            dup_lat: Vec::with_capacity(total / w.c + 16),
            executed: 0,
            duplicates: 0,
            errors: 0,
            first_error: None,
            end: Instant::now(),
        }
    }

    /// Records one delivery that took `ns` and answered `r`.
    fn record(&mut self, ns: u64, r: Result<Delivery, String>) {
        self.lat.push(ns);
        match r {
            Ok(Delivery::Executed) => {
                self.executed += 1;
                self.win_lat.push(ns);
            }
            Ok(Delivery::Duplicate) => {
                self.duplicates += 1;
                self.dup_lat.push(ns);
            }
            Err(e) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(e);
                }
            }
        }
    }
}

/// The state every worker of one run shares: the side-effect counters, the next delivery,
/// and the stop flag the time limit raises.
struct Shared {
    effects: Vec<AtomicU32>,
    next: AtomicUsize,
    stop: AtomicBool,
}

impl Shared {
    fn new(w: &Workload) -> Self {
        Shared {
            effects: (0..w.n).map(|_| AtomicU32::new(0)).collect(),
            next: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// The next delivery's key index, or `None` once all are handed out or time is up.
    fn take(&self, w: &Workload) -> Option<usize> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < w.n * w.d).then_some(i / w.d)
    }

    /// The side effect of key `k`: one more run of it.
    fn effect(&self, k: usize) {
        self.effects[k].fetch_add(1, Ordering::Relaxed);
    }
}

/// Raises `stop` once `limit` has passed since `start`, until `finished` says every worker
/// is done (the same 2 ms polling for the thread and the task rows).
fn watch(start: Instant, limit: Duration, stop: &AtomicBool, finished: impl Fn() -> bool) {
    while !finished() {
        if start.elapsed() >= limit {
            stop.store(true, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs the workload against `peer`. Deliveries are handed out in order from one shared
/// counter, and the D copies of a key are adjacent in that order, so they reach different
/// workers at nearly the same instant: the concurrent-duplicate case that breaks
/// check-then-act code.
pub fn run<P: Peer>(peer: &P, w: &Workload) -> Result<Measured, String> {
    let shared = Shared::new(w);
    let ready = Barrier::new(w.c + 1);
    let go = Barrier::new(w.c + 1);
    let connect_failed = AtomicBool::new(false);
    let (start, before, outs) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..w.c)
            .map(|_| {
                let (shared, ready, go, connect_failed) = (&shared, &ready, &go, &connect_failed);
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(s, move || -> Result<WorkerOut, String> {
                        let conn = peer.connect();
                        if conn.is_err() {
                            connect_failed.store(true, Ordering::SeqCst);
                        }
                        ready.wait();
                        go.wait();
                        let mut conn = conn?;
                        let mut out = WorkerOut::new(w);
                        if connect_failed.load(Ordering::SeqCst) {
                            return Ok(out);
                        }
                        while let Some(k) = shared.take(w) {
                            let key = key_of(k);
                            let effect = || shared.effect(k);
                            let t = Instant::now();
                            let r = peer.deliver(&mut conn, &key, &w.response, &effect);
                            out.record(t.elapsed().as_nanos() as u64, r);
                        }
                        out.end = Instant::now();
                        Ok(out)
                    })
                    .expect("spawn a worker")
            })
            .collect();
        ready.wait();
        let before = Usage::now();
        let start = Instant::now();
        go.wait();
        watch(start, w.time_limit, &shared.stop, || {
            handles.iter().all(|h| h.is_finished())
        });
        let outs: Vec<Result<WorkerOut, String>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect();
        (start, before, outs)
    });
    let drained = peer.drain().map(|()| Instant::now());
    let used = Usage::between(before, Usage::now());
    summarize(peer, w, &shared, start, outs, drained).map(|m| Measured { usage: used, ..m })
}

/// Runs the same workload as [`run`] with its C workers as C tasks on a tokio runtime of
/// [`ASYNC_RUNTIME_THREADS`] threads, each task awaiting [`AsyncPeer::deliver_async`] in a
/// loop where a thread of [`run`] blocks in [`Peer::deliver`]. The clock starts before the
/// tasks are spawned (spawning 64 tasks takes microseconds), and the final drain is the
/// same blocking [`Peer::drain`], timed.
pub fn run_async<P: AsyncPeer>(peer: &Arc<P>, w: &Workload) -> Result<Measured, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(ASYNC_RUNTIME_THREADS)
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let shared = Arc::new(Shared::new(w));
    let work = Arc::new(w.clone());
    let finished = Arc::new(AtomicUsize::new(0));
    let before = Usage::now();
    let start = Instant::now();
    let handles: Vec<_> = (0..w.c)
        .map(|_| {
            let (peer, shared, w, finished) = (
                Arc::clone(peer),
                Arc::clone(&shared),
                Arc::clone(&work),
                Arc::clone(&finished),
            );
            rt.spawn(async move {
                let mut out = WorkerOut::new(&w);
                while let Some(k) = shared.take(&w) {
                    let key = key_of(k);
                    let effect = || shared.effect(k);
                    let t = Instant::now();
                    let r = peer.deliver_async(&key, &w.response, &effect).await;
                    out.record(t.elapsed().as_nanos() as u64, r);
                }
                out.end = Instant::now();
                finished.fetch_add(1, Ordering::Release);
                out
            })
        })
        .collect();
    watch(start, w.time_limit, &shared.stop, || {
        finished.load(Ordering::Acquire) == w.c
    });
    let outs: Vec<Result<WorkerOut, String>> = rt.block_on(async {
        let mut outs = Vec::with_capacity(handles.len());
        for h in handles {
            outs.push(h.await.map_err(|e| format!("a task failed: {e}")));
        }
        outs
    });
    drop(rt);
    let drained = peer.drain().map(|()| Instant::now());
    let used = Usage::between(before, Usage::now());
    summarize(&**peer, w, &shared, start, outs, drained).map(|m| Measured { usage: used, ..m })
}

/// Gathers the workers' records into one measurement and checks the side-effect counters.
fn summarize<P: Peer>(
    peer: &P,
    w: &Workload,
    shared: &Shared,
    start: Instant,
    outs: Vec<Result<WorkerOut, String>>,
    drained: Result<Instant, String>,
) -> Result<Measured, String> {
    let total = w.n * w.d;
    let mut m = Measured::default();
    let mut lat = Vec::with_capacity(total);
    let mut win_lat = Vec::with_capacity(w.n);
    let mut dup_lat = Vec::with_capacity(total);
    let mut end = start;
    for out in outs {
        let out = out.map_err(|e| format!("worker failed: {e}"))?;
        lat.extend_from_slice(&out.lat);
        win_lat.extend_from_slice(&out.win_lat);
        dup_lat.extend_from_slice(&out.dup_lat);
        m.executed += out.executed;
        m.duplicates += out.duplicates;
        m.errors += out.errors;
        if m.first_error.is_none() {
            m.first_error = out.first_error;
        }
        end = end.max(out.end);
    }
    end = end.max(drained?);
    m.deliveries = lat.len() as u64;
    m.cut_short = m.deliveries < total as u64;
    m.elapsed = end.duration_since(start);
    win_lat.sort_unstable();
    dup_lat.sort_unstable();
    m.p50_ns = percentile(&win_lat, 0.50);
    m.p99_ns = percentile(&win_lat, 0.99);
    m.dup_p50_ns = percentile(&dup_lat, 0.50);
    m.dup_p99_ns = percentile(&dup_lat, 0.99);
    for e in &shared.effects {
        let runs = e.load(Ordering::Relaxed) as u64;
        if runs >= 1 {
            m.keys_run += 1;
        }
        if runs > 1 {
            m.double_keys += 1;
            m.extra_runs += runs - 1;
        }
    }
    m.retries = peer.retries();
    m.round_trips = peer.round_trips();
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_percentiles() {
        assert_eq!(&key_of(42), b"order-00000042");
        assert_eq!(&key_of(12345678), b"order-12345678");
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 1.0), 100);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    fn small() -> Workload {
        Workload {
            n: 500,
            d: 3,
            c: 16,
            time_limit: Duration::from_secs(60),
            response: b"done".to_vec(),
        }
    }

    /// The task runner hands out every delivery once, runs each key's effect once, and
    /// counts the rest as duplicates, exactly as the thread runner does.
    #[test]
    fn async_runner_matches_the_thread_runner() {
        let dir = std::env::temp_dir();
        let w = small();
        let peer = Arc::new(
            crate::systems::Idem::open(&dir, crate::systems::IdemSettings::memory()).expect("open"),
        );
        let a = run_async(&peer, &w).expect("async run");
        let t = run(
            &crate::systems::Idem::open(&dir, crate::systems::IdemSettings::memory())
                .expect("open"),
            &w,
        )
        .expect("thread run");
        for m in [&a, &t] {
            assert_eq!(m.deliveries, 1500);
            assert_eq!(m.executed, 500);
            assert_eq!(m.duplicates, 1000);
            assert_eq!(m.keys_run, 500);
            assert_eq!((m.double_keys, m.errors), (0, 0));
            assert!(!m.cut_short);
        }
    }

    /// The harness floor is a correct (if trivial) idempotency check: one run per key,
    /// every other delivery a duplicate; a key not of the workload is an error, not a panic.
    #[test]
    fn the_harness_floor_runs_each_key_once() {
        let w = small();
        let m = run(&crate::systems::Floor::new(w.n), &w).expect("floor run");
        assert_eq!((m.deliveries, m.executed, m.duplicates), (1500, 500, 1000));
        assert_eq!((m.keys_run, m.double_keys, m.errors), (500, 0, 0));
        let floor = crate::systems::Floor::new(2);
        for key in [&b"order-00000002"[..], b"order-x", b"short"] {
            assert!(floor.deliver(&mut (), key, b"", &|| {}).is_err(), "{key:?}");
        }
    }

    /// The durable floor runs each key once and answers the rest as duplicates; its file
    /// holds, in order, a claim then a completion of every executed key and nothing else,
    /// and the process's CPU time and context switches were measured.
    #[test]
    fn the_durable_floor_runs_each_key_once_and_writes_every_acknowledged_record() {
        let w = small();
        let dir = std::env::temp_dir().join(format!("idemkv-peers-floor-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let floor = crate::systems::DurableFloor::open(&dir, w.n).expect("open");
        let m = run(&floor, &w).expect("durable floor run");
        assert_eq!((m.deliveries, m.executed, m.duplicates), (1500, 500, 1000));
        assert_eq!((m.keys_run, m.double_keys, m.errors), (500, 0, 0));
        assert!(m.usage.is_some_and(|u| u.cpu_ns > 0));
        for key in [&b"order-00000500"[..], b"order-x", b"short"] {
            assert!(floor.deliver(&mut (), key, b"", &|| {}).is_err(), "{key:?}");
        }
        floor.close().expect("close");
        assert!(
            floor.deliver(&mut (), &key_of(0), b"", &|| {}).is_ok(),
            "a duplicate needs no write"
        );
        let records = floor.read_back().expect("read back");
        assert_eq!(records.len(), 1000, "{}", floor.note());
        let mut seen = vec![0u8; w.n];
        for (k, tag) in records {
            // Each key: its claim (1), then its completion (2), once each.
            let want = match tag {
                crate::systems::Tag::Claim => 0,
                crate::systems::Tag::Complete => 1,
            };
            assert_eq!(seen[k], want, "key {k}");
            seen[k] += 1;
        }
        assert!(seen.iter().all(|&s| s == 2));
        let fresh = crate::systems::DurableFloor::open(&dir.join("x"), 1);
        assert!(fresh.is_err(), "no such directory");
        drop(floor);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The lock-striped map runs each key once under the workload's concurrent duplicates,
    /// and a second delivery after the first completed is a duplicate too.
    #[test]
    fn the_striped_map_runs_each_key_once() {
        let w = small();
        let map = crate::systems::StripedMap::new();
        let m = run(&map, &w).expect("striped map run");
        assert_eq!((m.deliveries, m.executed, m.duplicates), (1500, 500, 1000));
        assert_eq!((m.keys_run, m.double_keys, m.errors), (500, 0, 0));
        let ran = std::sync::atomic::AtomicU32::new(0);
        let effect = || {
            ran.fetch_add(1, Ordering::Relaxed);
        };
        let key = b"order-00000000";
        assert_eq!(
            map.deliver(&mut (), key, b"r", &effect),
            Ok(Delivery::Duplicate)
        );
        let fresh = crate::systems::StripedMap::new();
        assert_eq!(
            fresh.deliver(&mut (), key, b"r", &effect),
            Ok(Delivery::Executed)
        );
        assert_eq!(
            fresh.deliver(&mut (), key, b"r", &effect),
            Ok(Delivery::Duplicate)
        );
        assert_eq!(ran.load(Ordering::Relaxed), 1);
    }

    /// A run stopped by the time limit reports what it finished, for tasks as for threads.
    #[test]
    fn async_runner_stops_at_the_time_limit() {
        let w = Workload {
            time_limit: Duration::ZERO,
            n: 1_000_000,
            ..small()
        };
        let peer = Arc::new(
            crate::systems::Idem::open(
                &std::env::temp_dir(),
                crate::systems::IdemSettings::memory(),
            )
            .expect("open"),
        );
        let m = run_async(&peer, &w).expect("async run");
        assert!(m.cut_short);
        assert_eq!(m.deliveries, m.executed + m.duplicates);
        assert_eq!(m.double_keys, 0);
    }
}
