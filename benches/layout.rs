//! The measurement behind idemkv's table layout (src/store/storage/): records keyed by fencing
//! token (`u64`, issued in time order) versus records keyed by the client's key (random
//! 32-byte strings), in redb.
//!
//! Each criterion iteration is one redb write transaction committed with
//! `redb::Durability::None` (so the fsync does not dominate) holding 1,000 logical
//! operations on a table that holds ~100k records (`PREFILL`); throughput is in operations
//! per second, and time per iteration / 1,000 is the cost per operation. Values are 64
//! bytes (a completed record 128 bytes). The patterns, each in both layouts:
//!
//! - `insert`: 1,000 new records. By client key: random positions in the B-tree. By token:
//!   sequential keys at its right edge.
//! - `claim_complete`: 1,000 new records plus the overwrite of the 1,000 records inserted by
//!   the previous commit with their completed value (idemkv keeps the token on complete).
//! - `takeover`: 1,000 takeovers of random live records. By client key: overwrite in place.
//!   By token (idemkv): remove the old token, insert the new token at the right edge.
//! - `insert_expire`: the steady state under retention: 1,000 inserts plus the removal of the
//!   1,000 oldest records. By client key the oldest are at random positions; by token they
//!   are at the left edge.
//!
//! Untimed: the prefill, the choice of keys, and every `MAINTAIN_EVERY` commits a durable
//! (`Immediate`) commit that trims the table back to `PREFILL` oldest-first, so the table
//! size stays within [100k, 150k] and redb can reuse the pages that non-durable commits
//! freed.
//!
//! The work is CPU-bound and the machine may be shared: a 20 ms commit is preempted many
//! times on a busy machine while a 0.5 ms one often is not, which would bias a wall-clock
//! comparison. So criterion is fed the committing thread's on-CPU time (from
//! `/proc/thread-self/schedstat`; wall time where that is missing, or with
//! `IDEMKV_BENCH_WALL=1`), and stderr shows both, with the share of time spent waiting for a
//! CPU.
//!
//! Run: `cargo bench --bench layout`.

mod common;

use common::{tempdir, wall_clock_only, Latencies, Rng, Sched, Timed, Timer, SEED};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use redb::{Database, Durability, TableDefinition, WriteTransaction};
use std::collections::VecDeque;
use std::time::Duration;
use tempfile::TempDir;

/// Records in the table before measuring.
const PREFILL: usize = 100_000;
/// Logical operations per commit.
const PER_COMMIT: usize = 1_000;
/// Size of a new (in-flight) record's value.
const VALUE_LEN: usize = 64;
/// Size of a completed record's value (it carries the response).
const DONE_LEN: usize = 128;
/// Commits between two untimed maintenance commits (trim to `PREFILL`, durable commit).
const MAINTAIN_EVERY: u64 = 50;
/// redb page cache, as idemkv configures for its own file.
const CACHE_BYTES: usize = 64 << 20;

const BY_CLIENT_KEY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("by_client_key");
const BY_TOKEN: TableDefinition<u64, &[u8]> = TableDefinition::new("by_token");

#[derive(Debug, Clone, Copy)]
enum Pattern {
    Insert,
    ClaimComplete,
    Takeover,
    InsertExpire,
}

impl Pattern {
    const ALL: [Pattern; 4] = [
        Pattern::Insert,
        Pattern::ClaimComplete,
        Pattern::Takeover,
        Pattern::InsertExpire,
    ];

    fn name(self) -> &'static str {
        match self {
            Pattern::Insert => "insert",
            Pattern::ClaimComplete => "claim_complete",
            Pattern::Takeover => "takeover",
            Pattern::InsertExpire => "insert_expire",
        }
    }
}

/// A redb table in one layout, with the list of its live records oldest first.
trait Layout {
    const NAME: &'static str;
    fn open() -> Self;
    /// One commit of `PER_COMMIT` operations of `pattern`; returns its timing.
    fn commit(&mut self, pattern: Pattern) -> Timed;
}

struct Db {
    db: Database,
    _dir: TempDir,
    rng: Rng,
    value: Vec<u8>,
    done: Vec<u8>,
    commits: u64,
}

impl Db {
    fn open(file: &str) -> Self {
        let dir = tempdir();
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(dir.path().join(file))
            .expect("create redb");
        let mut rng = Rng::with_seed(SEED);
        let mut value = vec![0u8; VALUE_LEN];
        rng.fill(&mut value);
        let mut done = vec![0u8; DONE_LEN];
        rng.fill(&mut done);
        Db {
            db,
            _dir: dir,
            rng,
            value,
            done,
            commits: 0,
        }
    }

    fn begin(&self, durability: Durability) -> WriteTransaction {
        let mut txn = self.db.begin_write().expect("begin_write");
        txn.set_durability(durability).expect("set_durability");
        txn
    }

    /// Whether this commit is followed by an untimed maintenance commit.
    fn count_commit(&mut self) -> bool {
        self.commits += 1;
        self.commits.is_multiple_of(MAINTAIN_EVERY)
    }
}

/// Records keyed by the client's key: 32 random bytes.
struct ByClientKey {
    db: Db,
    live: VecDeque<[u8; 32]>,
}

impl ByClientKey {
    fn new_key(&mut self) -> [u8; 32] {
        let mut k = [0u8; 32];
        self.db.rng.fill(&mut k);
        k
    }

    /// Untimed: trims to `PREFILL` records oldest first, in a durable commit.
    fn maintain(&mut self) {
        let txn = self.db.begin(Durability::Immediate);
        {
            let mut table = txn.open_table(BY_CLIENT_KEY).expect("open_table");
            while self.live.len() > PREFILL {
                let k = self.live.pop_front().expect("live");
                table.remove(k.as_slice()).expect("remove");
            }
        }
        txn.commit().expect("commit");
    }
}

impl Layout for ByClientKey {
    const NAME: &'static str = "by_client_key";

    fn open() -> Self {
        let mut me = ByClientKey {
            db: Db::open("by_client_key.redb"),
            live: VecDeque::with_capacity(PREFILL * 2),
        };
        for _ in 0..PREFILL / 10_000 {
            let keys: Vec<[u8; 32]> = (0..10_000).map(|_| me.new_key()).collect();
            let txn = me.db.begin(Durability::None);
            {
                let mut table = txn.open_table(BY_CLIENT_KEY).expect("open_table");
                for k in &keys {
                    table
                        .insert(k.as_slice(), me.db.value.as_slice())
                        .expect("insert");
                }
            }
            txn.commit().expect("commit");
            me.live.extend(keys);
        }
        me.maintain();
        me
    }

    fn commit(&mut self, pattern: Pattern) -> Timed {
        let fresh: Vec<[u8; 32]> = match pattern {
            Pattern::Takeover => Vec::new(),
            _ => (0..PER_COMMIT).map(|_| self.new_key()).collect(),
        };
        let others: Vec<[u8; 32]> = match pattern {
            Pattern::Insert => Vec::new(),
            // The previous commit's new records (the prefill's last ones at first).
            Pattern::ClaimComplete => self
                .live
                .range(self.live.len() - PER_COMMIT..)
                .copied()
                .collect(),
            Pattern::Takeover => (0..PER_COMMIT)
                .map(|_| self.live[self.db.rng.u64(0..self.live.len() as u64) as usize])
                .collect(),
            Pattern::InsertExpire => self.live.drain(..PER_COMMIT).collect(),
        };
        let (value, done) = (self.db.value.as_slice(), self.db.done.as_slice());
        let timer = Timer::start();
        let txn = self.db.begin(Durability::None);
        {
            let mut table = txn.open_table(BY_CLIENT_KEY).expect("open_table");
            match pattern {
                Pattern::Insert => {
                    for k in &fresh {
                        table.insert(k.as_slice(), value).expect("insert");
                    }
                }
                Pattern::ClaimComplete => {
                    for (k, prev) in fresh.iter().zip(&others) {
                        table.insert(prev.as_slice(), done).expect("insert");
                        table.insert(k.as_slice(), value).expect("insert");
                    }
                }
                Pattern::Takeover => {
                    for k in &others {
                        table.insert(k.as_slice(), value).expect("insert");
                    }
                }
                Pattern::InsertExpire => {
                    for (k, old) in fresh.iter().zip(&others) {
                        table.insert(k.as_slice(), value).expect("insert");
                        table.remove(old.as_slice()).expect("remove");
                    }
                }
            }
        }
        txn.commit().expect("commit");
        let elapsed = timer.stop();
        self.live.extend(fresh);
        if self.db.count_commit() {
            self.maintain();
        }
        elapsed
    }
}

/// Records keyed by fencing token: sequential u64 (idemkv's layout).
struct ByToken {
    db: Db,
    live: VecDeque<u64>,
    next: u64,
}

impl ByToken {
    /// Untimed: trims to `PREFILL` records oldest first, in a durable commit.
    fn maintain(&mut self) {
        let txn = self.db.begin(Durability::Immediate);
        {
            let mut table = txn.open_table(BY_TOKEN).expect("open_table");
            while self.live.len() > PREFILL {
                let t = self.live.pop_front().expect("live");
                table.remove(t).expect("remove");
            }
        }
        txn.commit().expect("commit");
    }
}

impl Layout for ByToken {
    const NAME: &'static str = "by_token";

    fn open() -> Self {
        let mut me = ByToken {
            db: Db::open("by_token.redb"),
            live: VecDeque::with_capacity(PREFILL * 2),
            next: 1,
        };
        for _ in 0..PREFILL / 10_000 {
            let txn = me.db.begin(Durability::None);
            {
                let mut table = txn.open_table(BY_TOKEN).expect("open_table");
                for _ in 0..10_000 {
                    table
                        .insert(me.next, me.db.value.as_slice())
                        .expect("insert");
                    me.live.push_back(me.next);
                    me.next += 1;
                }
            }
            txn.commit().expect("commit");
        }
        me.maintain();
        me
    }

    fn commit(&mut self, pattern: Pattern) -> Timed {
        let first = self.next;
        self.next += PER_COMMIT as u64;
        let fresh = first..self.next;
        let others: Vec<u64> = match pattern {
            Pattern::Insert => Vec::new(),
            Pattern::ClaimComplete => self
                .live
                .range(self.live.len() - PER_COMMIT..)
                .copied()
                .collect(),
            // The old token leaves the list; the new one joins at the end, as a takeover
            // moves the key to the newest token.
            Pattern::Takeover => (0..PER_COMMIT)
                .map(|_| {
                    let i = self.db.rng.u64(0..self.live.len() as u64) as usize;
                    self.live.swap_remove_back(i).expect("live")
                })
                .collect(),
            Pattern::InsertExpire => self.live.drain(..PER_COMMIT).collect(),
        };
        let (value, done) = (self.db.value.as_slice(), self.db.done.as_slice());
        let timer = Timer::start();
        let txn = self.db.begin(Durability::None);
        {
            let mut table = txn.open_table(BY_TOKEN).expect("open_table");
            match pattern {
                Pattern::Insert => {
                    for t in fresh.clone() {
                        table.insert(t, value).expect("insert");
                    }
                }
                Pattern::ClaimComplete => {
                    for (t, prev) in fresh.clone().zip(&others) {
                        table.insert(*prev, done).expect("insert");
                        table.insert(t, value).expect("insert");
                    }
                }
                Pattern::Takeover => {
                    for (t, old) in fresh.clone().zip(&others) {
                        table.remove(*old).expect("remove");
                        table.insert(t, value).expect("insert");
                    }
                }
                Pattern::InsertExpire => {
                    for (t, old) in fresh.clone().zip(&others) {
                        table.insert(t, value).expect("insert");
                        table.remove(*old).expect("remove");
                    }
                }
            }
        }
        txn.commit().expect("commit");
        let elapsed = timer.stop();
        self.live.extend(fresh);
        if self.db.count_commit() {
            self.maintain();
        }
        elapsed
    }
}

fn bench_layout<L: Layout>(c: &mut Criterion, pattern: Pattern) {
    let mut group = c.benchmark_group(format!("layout_{}", pattern.name()));
    group
        .throughput(Throughput::Elements(PER_COMMIT as u64))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let wall_only = wall_clock_only();
    let mut layout: Option<L> = None;
    let (mut wall, mut cpu, mut sched) = (Latencies::default(), Latencies::default(), None);
    group.bench_function(BenchmarkId::from_parameter(L::NAME), |b| {
        let layout = layout.get_or_insert_with(L::open);
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let t = layout.commit(pattern);
                    wall.push(t.wall);
                    if let Some(s) = t.sched {
                        cpu.push(Duration::from_nanos(s.on_cpu_ns));
                        sched.get_or_insert_with(Sched::default).add(s);
                    }
                    t.for_criterion(wall_only)
                })
                .sum()
        });
    });
    if layout.is_some() {
        let per_op = |l: &mut Latencies| {
            l.ns.sort_unstable();
            common::percentile_us(&l.ns, 50.0) / PER_COMMIT as f64
        };
        let (wall_op, cpu_op) = (per_op(&mut wall), per_op(&mut cpu));
        let name = format!("{}/{}", pattern.name(), L::NAME);
        eprintln!(
            "[layout] {name}: per operation p50 {cpu_op:.2} us on CPU, {wall_op:.2} us wall \
             (criterion is fed {})",
            if wall_only || sched.is_none() {
                "wall time"
            } else {
                "on-CPU time"
            }
        );
        eprintln!("    per commit of {PER_COMMIT}, wall: {}", wall.summary());
        if let Some(s) = sched {
            eprintln!(
                "    per commit of {PER_COMMIT}, on CPU: {} (runnable but waiting for a CPU: \
                 {:.0}% of the timed time)",
                cpu.summary(),
                100.0 * s.waiting_ns as f64 / (s.on_cpu_ns + s.waiting_ns).max(1) as f64
            );
        }
    }
    group.finish();
}

fn layouts(c: &mut Criterion) {
    for pattern in Pattern::ALL {
        bench_layout::<ByClientKey>(c, pattern);
        bench_layout::<ByToken>(c, pattern);
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = layouts
}
criterion_main!(benches);
