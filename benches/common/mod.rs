//! Helpers shared by the benchmarks: fixed-seed `fastrand` generators, key generation, bench settings.
//!
//! Every bench uses fixed seeds, so two runs insert the same keys in the same order.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

/// Seed of every PRNG in the benches (any non-zero constant).
pub const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// The benches' seeded generator: picks keys and fills values.
pub type Rng = fastrand::Rng;

/// splitmix64 finalizer: a bijection on u64, so distinct inputs give distinct outputs.
pub fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Length of every idempotency key in the benches (a UUID without dashes is 32 bytes).
pub const KEY_LEN: usize = 32;

/// The key number `i`: 32 lowercase hex digits, distinct for distinct `i`, spread over the
/// key space like client-chosen UUIDs.
pub fn key(i: u64) -> [u8; KEY_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; KEY_LEN];
    let hi = mix(i);
    for (n, byte) in out.iter_mut().enumerate() {
        let nibble = if n < 16 {
            (hi >> (60 - 4 * n)) & 0xF
        } else {
            (i >> (60 - 4 * (n - 16))) & 0xF
        };
        *byte = HEX[nibble as usize];
    }
    out
}

/// A response body of `len` bytes (deterministic content).
pub fn response(len: usize) -> Vec<u8> {
    let mut rng = Rng::with_seed(SEED ^ len as u64);
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

/// Whether the slow variants (1 M live keys, 256 threads) run: `IDEMKV_BENCH_BIG=1`.
pub fn big() -> bool {
    std::env::var("IDEMKV_BENCH_BIG").is_ok_and(|v| v == "1")
}

/// A fresh directory for a database file: under `IDEMKV_BENCH_DIR` if set, else the system
/// temporary directory. Deleted when dropped.
pub fn tempdir() -> tempfile::TempDir {
    match std::env::var_os("IDEMKV_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(PathBuf::from(dir)),
        None => tempfile::tempdir(),
    }
    .expect("create a temporary directory")
}

/// Short runs: the machine has two shared cores.
pub fn criterion() -> criterion::Criterion {
    criterion::Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

/// The `q` quantile (0..=1) of sorted samples, the rank rounded between the first and the
/// last; `None` if there are none. The one percentile of the benches.
pub fn percentile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (q * last as f64).round() as usize;
    Some(sorted[rank.min(last)])
}

/// Percentile (0..=100) of sorted nanosecond samples, as microseconds (NaN if none).
pub fn percentile_us(sorted_ns: &[u64], p: f64) -> f64 {
    percentile(sorted_ns, p / 100.0).map_or(f64::NAN, |ns| ns as f64 / 1000.0)
}

/// Per-operation latencies (ns), summarized as percentiles on stderr. Criterion's estimates
/// are over samples (each the mean of many iterations); these are over single operations.
#[derive(Debug, Default)]
pub struct Latencies {
    pub ns: Vec<u64>,
}

impl Latencies {
    pub fn push(&mut self, d: Duration) {
        self.ns.push(d.as_nanos() as u64);
    }

    pub fn extend(&mut self, other: Vec<u64>) {
        self.ns.extend(other);
    }

    /// `label: n=… p50=… p90=… p99=… p99.9=… max=…` (microseconds).
    pub fn summary(&mut self) -> String {
        self.ns.sort_unstable();
        let s = &self.ns;
        format!(
            "n={} p50={:.2}us p90={:.2}us p99={:.2}us p99.9={:.2}us max={:.2}us",
            s.len(),
            percentile_us(s, 50.0),
            percentile_us(s, 90.0),
            percentile_us(s, 99.0),
            percentile_us(s, 99.9),
            s.last().map_or(f64::NAN, |&m| m as f64 / 1000.0),
        )
    }
}

/// Cost of one `Instant::now()` (ns), to read per-operation latencies against.
pub fn clock_cost_ns() -> f64 {
    let n = 1_000_000u32;
    let start = std::time::Instant::now();
    let mut last = start;
    for _ in 0..n {
        last = criterion::black_box(std::time::Instant::now());
    }
    (last - start).as_nanos() as f64 / n as f64
}

/// This thread's CPU time in ns (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, exact to the
/// nanosecond, unlike `/proc/thread-self/schedstat`, which lags by up to a scheduler tick for
/// a running thread).
pub fn thread_cpu_ns() -> Option<u64> {
    cpu_ns(3)
}

/// This process's CPU time in ns, all threads (`CLOCK_PROCESS_CPUTIME_ID`): on a shared
/// machine, the CPU a multi-threaded section cost, whatever other load slowed its wall time.
pub fn process_cpu_ns() -> Option<u64> {
    cpu_ns(2)
}

/// `clock_gettime(clock)` in ns. Declared here to avoid a `libc` dependency; std links libc
/// anyway.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn cpu_ns(clock: i32) -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec with the C layout on 64-bit Linux.
    let rc = unsafe { clock_gettime(clock, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn cpu_ns(_clock: i32) -> Option<u64> {
    None
}

/// This thread's scheduler accounting: nanoseconds on a CPU (exact, from
/// [`thread_cpu_ns`]) and nanoseconds runnable but waiting for one (from
/// `/proc/thread-self/schedstat`, which lags by up to a tick; fine over many samples).
/// `None` where unavailable. On a shared machine on-CPU time is the cost of CPU-bound work;
/// the wait is what other load added.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sched {
    pub on_cpu_ns: u64,
    pub waiting_ns: u64,
}

impl Sched {
    pub fn now() -> Option<Sched> {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let waiting_ns = s.split_whitespace().nth(1)?.parse::<u64>().ok()?;
        Some(Sched {
            on_cpu_ns: thread_cpu_ns()?,
            waiting_ns,
        })
    }

    /// The change from `earlier` to `self`.
    pub fn since(self, earlier: Sched) -> Sched {
        Sched {
            on_cpu_ns: self.on_cpu_ns.saturating_sub(earlier.on_cpu_ns),
            waiting_ns: self.waiting_ns.saturating_sub(earlier.waiting_ns),
        }
    }

    pub fn add(&mut self, other: Sched) {
        self.on_cpu_ns += other.on_cpu_ns;
        self.waiting_ns += other.waiting_ns;
    }
}

/// Whether benches that can time on-CPU time should feed criterion wall time instead:
/// `IDEMKV_BENCH_WALL=1`.
pub fn wall_clock_only() -> bool {
    std::env::var("IDEMKV_BENCH_WALL").is_ok_and(|v| v == "1")
}

/// Wall time and (where available) this thread's scheduler accounting over a section.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub wall: Duration,
    pub sched: Option<Sched>,
}

impl Timed {
    /// What criterion is fed: on-CPU time when available, unless `IDEMKV_BENCH_WALL=1`.
    pub fn for_criterion(&self, wall_only: bool) -> Duration {
        match self.sched {
            Some(s) if !wall_only => Duration::from_nanos(s.on_cpu_ns),
            _ => self.wall,
        }
    }
}

pub struct Timer {
    start: std::time::Instant,
    sched: Option<Sched>,
}

impl Timer {
    pub fn start() -> Timer {
        let sched = Sched::now();
        Timer {
            start: std::time::Instant::now(),
            sched,
        }
    }

    pub fn stop(self) -> Timed {
        let wall = self.start.elapsed();
        let sched = match (Sched::now(), self.sched) {
            (Some(end), Some(start)) => Some(end.since(start)),
            _ => None,
        };
        Timed { wall, sched }
    }
}

/// Scheduler accounting summed over this process's threads named `name` (e.g. the engine's
/// `idemkv-writer`), from their `schedstat`, `None` where unavailable. Exact for a thread
/// that is blocked when read (the writer between batches); may lag a tick for a running one.
pub fn threads_named(name: &str) -> Option<Sched> {
    let mut total = None::<Sched>;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let Ok(s) = std::fs::read_to_string(dir.join("schedstat")) else {
            continue;
        };
        let mut it = s.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
        total.get_or_insert_with(Sched::default).add(Sched {
            on_cpu_ns: it.next().unwrap_or(0),
            waiting_ns: it.next().unwrap_or(0),
        });
    }
    total
}

/// Resident set size of this process, from /proc (0 where unavailable).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}
