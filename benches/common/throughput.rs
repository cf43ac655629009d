//! Throughput drivers shared by `group_commit` and `async_api`: idemkv in each durability
//! mode doing claim+complete pairs on new keys, driven by C OS threads (the blocking API) or
//! by many tasks on a tokio runtime (the async API), timed for criterion (`iter_custom`) or
//! for a fixed block of wall time (the alternating passes).
//!
//! Included by path (`#[path = "common/throughput.rs"] mod throughput;`) next to
//! `mod common;`, whose helpers it uses.

#![allow(dead_code)]

use crate::common::{key, response, tempdir, Latencies};
use idemkv::{Claim, ClaimError, ClaimOptions, Durability, Engine};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use tempfile::TempDir;
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

/// Bytes of every stored response.
pub const RESPONSE_LEN: usize = 64;
/// Longer than any bench run, so no lease expires during one.
pub const LEASE: Duration = Duration::from_secs(3600);
/// Concurrent tasks of the async rows.
pub const TASKS: usize = 10_000;
/// Worker threads of the async rows' runtime: one per core of the reference machine.
pub const RUNTIME_THREADS: usize = 2;
/// Rounds of the alternating passes, and the length of each contender's block.
pub const ROUNDS: usize = 3;
pub const BLOCK: Duration = Duration::from_millis(700);

/// The engine configurations measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `Durability::Immediate` (the default): the claim and the completion each wait for a
    /// group commit, made durable by one append to the commit log.
    Immediate,
    /// `Durability::buffered()` (10 ms); every timed sample ends with a flush, so the
    /// figure is sustained durable throughput, not the burst the writer queue absorbs.
    Buffered,
    /// `Durability::None`: memory only.
    None,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Immediate, Mode::Buffered, Mode::None];

    /// Whether acknowledged calls may still be waiting for their commit when a sample ends.
    fn buffered(self) -> bool {
        self == Mode::Buffered
    }

    /// The name of the mode in benchmark ids and on stderr.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Immediate => "immediate",
            Mode::Buffered => "buffered_10ms",
            Mode::None => "none",
        }
    }

    fn open(self) -> (Engine, Option<TempDir>) {
        let builder = Engine::builder().lease(LEASE);
        let (builder, dir) = match self {
            Mode::None => (builder.durability(Durability::None), None),
            _ => {
                let dir = tempdir();
                let builder = builder.path(dir.path().join("bench.redb"));
                let builder = match self {
                    Mode::Immediate => builder.durability(Durability::Immediate),
                    _ => builder.durability(Durability::buffered()),
                };
                (builder, Some(dir))
            }
        };
        (builder.open().expect("open engine"), dir)
    }
}

/// What one contender accumulates over criterion's calls and the alternating blocks.
#[derive(Default)]
pub struct Run {
    pub next_key: AtomicU64,
    pub claim: Mutex<Latencies>,
    pub complete: Mutex<Latencies>,
    /// Claims refused with `Overloaded` (each followed by a flush and a retry).
    pub backoffs: AtomicU64,
}

impl Run {
    pub fn record(&self, claim: Vec<u64>, complete: Vec<u64>) {
        self.claim.lock().expect("lock").extend(claim);
        self.complete.lock().expect("lock").extend(complete);
    }

    pub fn summary(&self) -> String {
        let claim = self.claim.lock().expect("lock").summary();
        let complete = self.complete.lock().expect("lock").summary();
        format!("claim {claim}\n    complete {complete}")
    }
}

/// One idemkv engine in one mode, with what its runs accumulate.
pub struct Idem {
    pub mode: Mode,
    pub engine: Engine,
    _dir: Option<TempDir>,
    opts: ClaimOptions,
    resp: Vec<u8>,
    pub run: Run,
}

impl Idem {
    pub fn open(mode: Mode) -> Idem {
        let (engine, dir) = mode.open();
        Idem {
            mode,
            engine,
            _dir: dir,
            opts: ClaimOptions::default().fingerprint(0xF1A9_E2B3_C4D5_0617),
            resp: response(RESPONSE_LEN),
            run: Run::default(),
        }
    }

    /// One claim + complete of a new key with the blocking API; returns the latencies of
    /// the claim (back-offs included) and of the complete. A claim refused because the
    /// writer queue is full (`Buffered` outrunning its writer) waits for a flush and retries.
    pub fn pair(&self, k: &[u8]) -> (Duration, Duration) {
        let t0 = Instant::now();
        let lease = loop {
            match self.engine.claim(k, &self.opts) {
                Ok(Claim::Acquired(lease)) => break lease,
                Err(ClaimError::Overloaded(_)) => {
                    self.run.backoffs.fetch_add(1, Ordering::Relaxed);
                    self.engine.flush().expect("flush");
                }
                other => panic!("claim of a new key answered {other:?}"),
            }
        };
        let t1 = Instant::now();
        // A full queue is waited out inside `complete` while the lease lasts.
        lease.complete(&self.resp).expect("complete");
        (t1 - t0, t1.elapsed())
    }

    /// [`Idem::pair`] with the async API.
    pub async fn pair_async(&self, k: &[u8]) -> (Duration, Duration) {
        let t0 = Instant::now();
        let lease = loop {
            match self.engine.claim_async(k, &self.opts).await {
                Ok(Claim::Acquired(lease)) => break lease,
                Err(ClaimError::Overloaded(_)) => {
                    self.run.backoffs.fetch_add(1, Ordering::Relaxed);
                    self.engine.flush_async().await.expect("flush");
                }
                other => panic!("claim of a new key answered {other:?}"),
            }
        };
        let t1 = Instant::now();
        lease.complete_async(&self.resp).await.expect("complete");
        (t1 - t0, t1.elapsed())
    }

    /// The end of a timed sample: `Buffered` flushes, so what was acknowledged is durable
    /// before the clock stops; the other modes are durable (or memory only) already.
    pub fn finish(&self) {
        if self.mode.buffered() {
            self.engine.flush().expect("flush");
        }
    }

    pub async fn finish_async(&self) {
        if self.mode.buffered() {
            self.engine.flush_async().await.expect("flush");
        }
    }

    /// The writer's batch formation and the latency percentiles, over the whole run.
    pub fn report(&self, label: &str) -> String {
        let s = self.engine.stats();
        let avg = s.committed_ops as f64 / s.commits.max(1) as f64;
        format!(
            "{label}: pairs={} commits={} committed_ops={} avg_batch={avg:.1} batch_max={} \
             overloaded={} backoffs={} (over the whole run, warm-up and alternating blocks \
             included)\n    {}",
            s.completions,
            s.commits,
            s.committed_ops,
            s.batch_max,
            s.overloaded,
            self.run.backoffs.load(Ordering::Relaxed),
            self.run.summary()
        )
    }

    pub fn close(&self) {
        self.engine.close().expect("close");
    }
}

/// Runs `per_thread` pairs on each of `threads` threads, each pair on a new key of `run`;
/// the last thread to end calls `finish`. Returns the time from the start barrier to the
/// end of `finish` (thread start-up is not timed).
pub fn run_threads<F, G>(threads: usize, per_thread: u64, run: &Run, op: &F, finish: &G) -> Duration
where
    F: Fn(&[u8]) -> (Duration, Duration) + Sync,
    G: Fn() + Sync,
{
    let barrier = Barrier::new(threads + 1);
    let left = AtomicUsize::new(threads);
    let end = Mutex::new(None::<Instant>);
    let start = std::thread::scope(|s| {
        for _ in 0..threads {
            let (barrier, left, end) = (&barrier, &left, &end);
            s.spawn(move || {
                let first = run.next_key.fetch_add(per_thread, Ordering::Relaxed);
                let mut claim = Vec::with_capacity(per_thread as usize);
                let mut complete = Vec::with_capacity(per_thread as usize);
                barrier.wait();
                for i in 0..per_thread {
                    let (a, b) = op(&key(first + i));
                    claim.push(a.as_nanos() as u64);
                    complete.push(b.as_nanos() as u64);
                }
                if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    finish();
                    *end.lock().expect("lock") = Some(Instant::now());
                }
                run.record(claim, complete);
            });
        }
        barrier.wait();
        Instant::now()
    });
    let end = end.into_inner().expect("lock").expect("a thread ran");
    end.saturating_duration_since(start)
}

/// Keys of the alternating blocks: far from the criterion runs' (which count up from 0),
/// distinct per block.
static BLOCK_KEYS: AtomicU64 = AtomicU64::new(1 << 62);

/// Runs `threads` threads doing pairs on new keys until `block` has passed, then `finish`
/// (in the last thread to stop); returns the pairs done per second, `finish` included.
pub fn run_threads_for<F, G>(threads: usize, block: Duration, op: &F, finish: &G) -> f64
where
    F: Fn(&[u8]) -> (Duration, Duration) + Sync,
    G: Fn() + Sync,
{
    let barrier = Barrier::new(threads + 1);
    let done = AtomicU64::new(0);
    let left = AtomicUsize::new(threads);
    let end = Mutex::new(None::<Instant>);
    let start = std::thread::scope(|s| {
        for _ in 0..threads {
            let (barrier, done, left, end) = (&barrier, &done, &left, &end);
            s.spawn(move || {
                barrier.wait();
                let deadline = Instant::now() + block;
                while Instant::now() < deadline {
                    op(&key(BLOCK_KEYS.fetch_add(1, Ordering::Relaxed)));
                    done.fetch_add(1, Ordering::Relaxed);
                }
                if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    finish();
                    *end.lock().expect("lock") = Some(Instant::now());
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    let end = end.into_inner().expect("lock").expect("a thread ran");
    done.into_inner() as f64 / end.saturating_duration_since(start).as_secs_f64()
}

/// The async rows' runtime: `RUNTIME_THREADS` workers, no I/O or timer driver (the
/// engine's futures are woken by the engine).
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_THREADS)
        .thread_name("bench-worker")
        .build()
        .expect("tokio runtime")
}

/// The start and the end of a timed batch of tasks: the clock starts once every task has
/// been polled up to the gate (spawning and first polls are not timed) and stops when the
/// last task has finished, its flush included.
struct Gate {
    open: Semaphore,
    ready: AtomicUsize,
    left: AtomicUsize,
    end: Mutex<Option<Instant>>,
    done: AtomicU64,
}

impl Gate {
    fn new(tasks: usize) -> Arc<Gate> {
        Arc::new(Gate {
            open: Semaphore::new(0),
            ready: AtomicUsize::new(0),
            left: AtomicUsize::new(tasks),
            end: Mutex::new(None),
            done: AtomicU64::new(0),
        })
    }

    async fn pass(&self) {
        self.ready.fetch_add(1, Ordering::AcqRel);
        self.open.acquire().await.expect("gate open").forget();
    }

    /// Waits (outside the runtime) for every task to reach the gate, then opens it;
    /// returns the start time.
    fn start(&self, tasks: usize) -> Instant {
        while self.ready.load(Ordering::Acquire) < tasks {
            std::thread::sleep(Duration::from_micros(200));
        }
        let start = Instant::now();
        self.open.add_permits(tasks);
        start
    }

    /// Called by each task at its end; the last one runs `finish` and stops the clock.
    async fn leave(&self, idem: &Idem) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            idem.finish_async().await;
            *self.end.lock().expect("lock") = Some(Instant::now());
        }
    }

    fn end(&self) -> Instant {
        self.end.lock().expect("lock").expect("a task ran")
    }
}

/// `tasks` tasks on `rt`, each doing `per_task` pairs with the async API on its own new
/// keys; the last to end flushes (`Buffered`). Returns the time from the opening of the
/// start gate to the end of that flush.
pub fn run_tasks(rt: &Runtime, tasks: usize, per_task: u64, idem: &Arc<Idem>) -> Duration {
    let gate = Gate::new(tasks);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (idem, gate) = (Arc::clone(idem), Arc::clone(&gate));
            rt.spawn(async move {
                let first = idem.run.next_key.fetch_add(per_task, Ordering::Relaxed);
                let mut claim = Vec::with_capacity(per_task as usize);
                let mut complete = Vec::with_capacity(per_task as usize);
                gate.pass().await;
                for i in 0..per_task {
                    let (a, b) = idem.pair_async(&key(first + i)).await;
                    claim.push(a.as_nanos() as u64);
                    complete.push(b.as_nanos() as u64);
                }
                gate.leave(&idem).await;
                idem.run.record(claim, complete);
            })
        })
        .collect();
    let start = gate.start(tasks);
    rt.block_on(async {
        for h in handles {
            h.await.expect("task");
        }
    });
    gate.end().saturating_duration_since(start)
}

/// `tasks` tasks on `rt` doing pairs with the async API on new keys until `block` has
/// passed, then a flush (`Buffered`); returns the pairs done per second, flush included.
pub fn run_tasks_for(rt: &Runtime, tasks: usize, block: Duration, idem: &Arc<Idem>) -> f64 {
    let gate = Gate::new(tasks);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (idem, gate) = (Arc::clone(idem), Arc::clone(&gate));
            rt.spawn(async move {
                gate.pass().await;
                let deadline = Instant::now() + block;
                while Instant::now() < deadline {
                    idem.pair_async(&key(BLOCK_KEYS.fetch_add(1, Ordering::Relaxed)))
                        .await;
                    gate.done.fetch_add(1, Ordering::Relaxed);
                }
                gate.leave(&idem).await;
            })
        })
        .collect();
    let start = gate.start(tasks);
    rt.block_on(async {
        for h in handles {
            h.await.expect("task");
        }
    });
    let secs = gate.end().saturating_duration_since(start).as_secs_f64();
    gate.done.load(Ordering::Relaxed) as f64 / secs
}

/// `rounds[r][c]` (pairs/s of contender `c` in round `r`) as one line per contender, with
/// each round's ratio to contender `base` when given.
pub fn show_rounds(names: &[&str], rounds: &[Vec<f64>], base: Option<usize>) -> String {
    let mut out = String::new();
    for (c, name) in names.iter().enumerate() {
        let shown: Vec<String> = rounds
            .iter()
            .map(|r| match base {
                Some(b) if b != c => format!("{:.0} ({:.2}x)", r[c], r[c] / r[b]),
                _ => format!("{:.0}", r[c]),
            })
            .collect();
        out.push_str(&format!("\n    {name:<28} {}", shown.join(", ")));
    }
    out
}
