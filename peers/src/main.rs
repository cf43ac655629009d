//! `idemkv-peers`: the side-by-side benchmark. One workload (claim then complete N
//! keys, each delivered D times, by C concurrent workers) against idemkv in its three
//! durability modes and against the systems people use instead. `scripts/peers.sh` starts
//! the servers and runs this; see docs/benchmarks.md.

mod report;
mod shared;
mod systems;
mod workload;

use report::{Class, Row};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use systems::RedisPersistence;
use workload::{percentile, Workload};

const USAGE: &str = "usage: idemkv-peers --data-dir DIR [--n 100000] [--d 2] [--c 64]
    [--time-limit SECS (4)] [--rounds 5] [--response-bytes 64] [--systems all|ID,ID,...]
    [--pg CONNINFO] [--redis URL] [--doc docs/benchmarks.md] [--svg docs/peers.svg]
    [--stamp TEXT] [--disk TEXT] [--command TEXT] [--section main|shared]
    [--calibrate yes|no (yes)]

ids: idemkv-immediate idemkv-buffered idemkv-none
     idemkv-immediate-async idemkv-buffered-async
     (the -async rows: C tasks on a 2-thread tokio runtime, idemkv's async API)
     redb-naive sqlite-full sqlite-normal
     sqlite-check-then-act pg-sync-on pg-sync-off redis-always redis-everysec redis-none moka
     striped-map
     idemkv-shared idemkv-shared-4p idemkv-shared-async idemkv-shared-4p-async
     (not in `all`: PostgreSQL at D = 8, `--section shared`)
     durable-floor
     (not in `all`: the calibration's durable group-commit floor, as a row)

--section shared: the shared backend's comparison (round trips per delivery, no chart),
written between the peers-shared:begin / peers-shared:end markers of --doc.
--calibrate no: skips the calibration (to profile one system's process alone).";

struct Args {
    data_dir: PathBuf,
    workload: Workload,
    systems: Option<Vec<String>>,
    rounds: usize,
    pg: Option<String>,
    redis: Option<String>,
    doc: Option<PathBuf>,
    svg: Option<PathBuf>,
    stamp: String,
    disk: String,
    command: String,
    /// `shared`: the shared backend's section instead of the main table.
    shared_section: bool,
    /// Whether to measure the calibration.
    calibrate: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        data_dir: PathBuf::new(),
        workload: Workload {
            n: 100_000,
            d: 2,
            c: 64,
            time_limit: Duration::from_secs(4),
            response: Vec::new(),
        },
        systems: None,
        rounds: 5,
        pg: None,
        redis: None,
        doc: None,
        svg: None,
        stamp: String::new(),
        disk: String::new(),
        command: String::new(),
        shared_section: false,
        calibrate: true,
    };
    let mut response_bytes = 64usize;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = |v: &str| -> Result<usize, String> {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--data-dir" => a.data_dir = PathBuf::from(value),
            "--n" => a.workload.n = num(&value)?.max(1),
            "--d" => a.workload.d = num(&value)?.max(1),
            "--c" => a.workload.c = num(&value)?.max(1),
            "--time-limit" => a.workload.time_limit = Duration::from_secs(num(&value)? as u64),
            "--rounds" => a.rounds = num(&value)?.max(1),
            "--response-bytes" => response_bytes = num(&value)?,
            "--systems" if value == "all" => a.systems = None,
            "--systems" => a.systems = Some(value.split(',').map(|s| s.trim().into()).collect()),
            "--pg" => a.pg = Some(value),
            "--redis" => a.redis = Some(value),
            "--doc" => a.doc = Some(PathBuf::from(value)),
            "--svg" => a.svg = Some(PathBuf::from(value)),
            "--stamp" => a.stamp = value,
            "--disk" => a.disk = value,
            "--command" => a.command = value,
            "--section" => match value.as_str() {
                "main" => a.shared_section = false,
                "shared" => a.shared_section = true,
                _ => return Err(format!("--section: main or shared, not {value}")),
            },
            "--calibrate" => match value.as_str() {
                "yes" => a.calibrate = true,
                "no" => a.calibrate = false,
                _ => return Err(format!("--calibrate: yes or no, not {value}")),
            },
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    if a.data_dir.as_os_str().is_empty() {
        return Err(format!("--data-dir is required\n{USAGE}"));
    }
    if a.workload.n > 99_999_999 {
        return Err("--n is at most 99999999 (keys are order-NNNNNNNN)".into());
    }
    a.workload.response = (0..response_bytes).map(|i| b'a' + (i % 26) as u8).collect();
    Ok(a)
}

/// The systems, in table order: (id, name, class, promise).
const SYSTEMS: &[(&str, &str, Class, &str)] = &[
    (
        "idemkv-immediate",
        "idemkv Immediate",
        Class::Immediate,
        "fsynced before each call returns (group commit)",
    ),
    (
        "idemkv-immediate-async",
        "idemkv Immediate, async tasks",
        Class::Immediate,
        "as idemkv Immediate; C tasks on 2 runtime threads, async API",
    ),
    (
        "redis-always",
        "Redis SET NX, appendfsync always",
        Class::Immediate,
        "AOF fsynced before the reply (one fsync per event-loop pass)",
    ),
    (
        "pg-sync-on",
        "PostgreSQL, synchronous_commit on",
        Class::Immediate,
        "WAL flushed before the commit returns (group commit)",
    ),
    (
        "sqlite-full",
        "SQLite WAL, synchronous FULL",
        Class::Immediate,
        "WAL fsynced at every commit",
    ),
    (
        "redb-naive",
        "redb naive (txn per claim)",
        Class::Immediate,
        "fsynced at every commit (2 per key)",
    ),
    (
        "idemkv-buffered",
        "idemkv Buffered (10 ms)",
        Class::Buffered,
        "fsynced within 10 ms; replays only once durable",
    ),
    (
        "idemkv-buffered-async",
        "idemkv Buffered (10 ms), async tasks",
        Class::Buffered,
        "as idemkv Buffered; C tasks on 2 runtime threads, async API",
    ),
    (
        "redis-everysec",
        "Redis SET NX, appendfsync everysec",
        Class::Buffered,
        "AOF fsynced every second (a crash loses ~1–2 s)",
    ),
    (
        "pg-sync-off",
        "PostgreSQL, synchronous_commit off",
        Class::Buffered,
        "WAL flushed within 3 × wal_writer_delay (600 ms)",
    ),
    (
        "sqlite-normal",
        "SQLite WAL, synchronous NORMAL",
        Class::Buffered,
        "WAL fsynced at checkpoints; power loss can drop the last commits",
    ),
    (
        "sqlite-check-then-act",
        "SQLite check-then-act (racy)",
        Class::Buffered,
        "as SQLite NORMAL, but SELECT then INSERT: not atomic",
    ),
    (
        "idemkv-shared",
        "idemkv shared (PostgreSQL), 1 process",
        Class::Immediate,
        "committed by PostgreSQL (synchronous_commit on) before each call returns",
    ),
    (
        "idemkv-shared-4p",
        "idemkv shared (PostgreSQL), 4 processes",
        Class::Immediate,
        "committed by PostgreSQL (synchronous_commit on) before each call returns",
    ),
    (
        "idemkv-shared-async",
        "idemkv shared (PostgreSQL), 1 process, async",
        Class::Immediate,
        "committed by PostgreSQL (synchronous_commit on) before each call returns",
    ),
    (
        "idemkv-shared-4p-async",
        "idemkv shared (PostgreSQL), 4 processes, async",
        Class::Immediate,
        "committed by PostgreSQL (synchronous_commit on) before each call returns",
    ),
    (
        "durable-floor",
        "durable group-commit floor (calibration)",
        Class::Immediate,
        "claim and completion each acknowledged after one direct, synchronous write",
    ),
    ("idemkv-none", "idemkv None", Class::Memory, "memory only"),
    (
        "redis-none",
        "Redis SET NX, no persistence",
        Class::Memory,
        "memory only (no AOF, no RDB)",
    ),
    (
        "moka",
        "moka (entry().or_insert_with)",
        Class::Memory,
        "memory only, in-process",
    ),
    (
        "striped-map",
        "lock-striped HashMap (256 parking_lot mutexes)",
        Class::Memory,
        "memory only, in-process; claim and complete, no lease or retention",
    ),
];

fn run_one(id: &str, args: &Args, dir: &Path) -> Result<workload::Measured, String> {
    let w = &args.workload;
    let need_pg = || {
        args.pg
            .clone()
            .ok_or_else(|| "no PostgreSQL (--pg)".to_string())
    };
    let need_redis = || {
        args.redis
            .clone()
            .ok_or_else(|| "no Redis (--redis)".to_string())
    };
    match id {
        _ if id.starts_with("idemkv-") && !id.starts_with("idemkv-shared") => {
            // idemkv-{immediate,buffered,none}[-async]
            let durability = match id {
                _ if id.starts_with("idemkv-immediate") => idemkv::Durability::Immediate,
                _ if id.starts_with("idemkv-buffered") => idemkv::Durability::buffered(),
                _ => idemkv::Durability::None,
            };
            let settings = systems::IdemSettings { durability };
            let peer = Arc::new(systems::Idem::open(dir, settings)?);
            let mut m = if id.ends_with("-async") {
                workload::run_async(&peer, w)?
            } else {
                workload::run(&*peer, w)?
            };
            peer.close()?;
            m.note = peer.commit_note();
            Ok(m)
        }
        "redb-naive" => workload::run(&systems::RedbNaive::open(dir)?, w),
        "sqlite-full" => workload::run(&systems::Sqlite::open(dir, "full.db", "FULL", false)?, w),
        "sqlite-normal" => workload::run(
            &systems::Sqlite::open(dir, "normal.db", "NORMAL", false)?,
            w,
        ),
        "sqlite-check-then-act" => {
            workload::run(&systems::Sqlite::open(dir, "cta.db", "NORMAL", true)?, w)
        }
        "pg-sync-on" => workload::run(&systems::Pg::setup(&need_pg()?, true)?, w),
        "pg-sync-off" => workload::run(&systems::Pg::setup(&need_pg()?, false)?, w),
        "redis-always" => workload::run(
            &systems::Redis::setup(&need_redis()?, RedisPersistence::Always)?,
            w,
        ),
        "redis-everysec" => workload::run(
            &systems::Redis::setup(&need_redis()?, RedisPersistence::EverySec)?,
            w,
        ),
        "redis-none" => workload::run(
            &systems::Redis::setup(&need_redis()?, RedisPersistence::Off)?,
            w,
        ),
        "moka" => workload::run(&systems::Moka::new(), w),
        "striped-map" => workload::run(&systems::StripedMap::new(), w),
        "durable-floor" => durable_floor_round(dir, w),
        "idemkv-shared" => shared::run_one_process(&need_pg()?, w, false),
        "idemkv-shared-4p" => shared::run_processes(&need_pg()?, w, 4, dir, false),
        "idemkv-shared-async" => shared::run_one_process(&need_pg()?, w, true),
        "idemkv-shared-4p-async" => shared::run_processes(&need_pg()?, w, 4, dir, true),
        other => Err(format!("unknown system {other}")),
    }
}

/// The floor every durable system here stands on, measured on the data directory's disk in
/// the same run, one thread: a 4 KiB write + fdatasync, a 4 KiB direct, synchronous append
/// (as idemkv's commit log and [`systems::DurableFloor`] write), and a one-insert redb
/// `Immediate` commit, plain and with two-phase commit (which idemkv's writer uses). And
/// the floor of every in-process row: the workload run against [`systems::Floor`] (the
/// harness alone); and of every row that acknowledges a claim and a completion durably:
/// the workload run against [`systems::DurableFloor`] (two durable group commits per pair).
struct Calibration {
    fsync_p50: u64,
    fsync_p99: u64,
    /// A 4 KiB append as [`systems::DurableFloor`] writes it (and idemkv's commit log).
    direct_p50: u64,
    direct_p99: u64,
    /// Whether those went `O_DIRECT | O_DSYNC` (else buffered, then `fdatasync`).
    direct_on: bool,
    redb_p50: u64,
    redb_2pc_p50: u64,
    /// The harness alone, best of [`FLOOR_ROUNDS`]: deliveries/s and claim+complete/s.
    floor: (f64, f64),
    /// The durable group-commit floor's best of [`FLOOR_ROUNDS`].
    durable: workload::Measured,
}

/// Rounds of the harness floor; its best is reported, as for every row.
const FLOOR_ROUNDS: usize = 3;

impl Calibration {
    fn describe(&self) -> String {
        let d = &self.durable;
        let per_pair = match d.per_pair() {
            Some((cpu_us, switches)) => {
                format!(", {cpu_us:.1} µs of CPU and {switches:.1} context switches per pair")
            }
            None => String::new(),
        };
        format!(
            "4 KiB write + fdatasync p50 {}, p99 {}; 4 KiB {} append p50 {}, p99 {}; \
             redb one-insert `Immediate` commit p50 {} \
             (with two-phase commit, as idemkv's writer commits: p50 {}). The harness alone \
             (the same workload and workers, each delivery setting one preallocated atomic \
             flag per key instead of calling a system; best of {FLOOR_ROUNDS}): {}/s \
             deliveries, {}/s claim+complete, the ceiling of any in-process row. Two durable \
             group commits per pair (the same flags; the winner queues an 8-byte claim record \
             and blocks until one writer thread has written everything queued with one durable \
             write, runs the effect, then the same for its completion record; no index, no \
             stored response; blocking threads, best of {FLOOR_ROUNDS}): {}/s claim+complete, \
             p50 {}{per_pair} ({}), the ceiling of any row that acknowledges a claim and its \
             completion durably",
            report::fmt_ns(self.fsync_p50),
            report::fmt_ns(self.fsync_p99),
            if self.direct_on {
                "`O_DIRECT | O_DSYNC`"
            } else {
                "buffered + fdatasync"
            },
            report::fmt_ns(self.direct_p50),
            report::fmt_ns(self.direct_p99),
            report::fmt_ns(self.redb_p50),
            report::fmt_ns(self.redb_2pc_p50),
            report::fmt_rate(self.floor.0),
            report::fmt_rate(self.floor.1),
            report::fmt_rate(d.completes_per_sec()),
            report::fmt_ns(d.p50_ns),
            d.note.as_deref().unwrap_or("no note"),
        )
    }
}

/// The best of [`FLOOR_ROUNDS`] runs of a floor (picked as every row's best round is,
/// [`best_round`]); an error if any round failed or answered wrongly.
fn floor_rounds(
    what: &str,
    run: impl Fn(usize) -> Result<workload::Measured, String>,
) -> Result<workload::Measured, String> {
    let m = best_round((0..FLOOR_ROUNDS).map(run).collect())
        .map_err(|e| format!("calibration: {what}: {e}"))?;
    if m.rounds_failed > 0 || m.errors_all > 0 || m.double_keys_all > 0 {
        return Err(format!(
            "calibration: {what} answered wrongly: {} failed rounds, {} errors, {} doubles ({})",
            m.rounds_failed,
            m.errors_all,
            m.double_keys_all,
            m.first_error.as_deref().unwrap_or("no error message")
        ));
    }
    Ok(m)
}

/// The workload against the harness alone ([`systems::Floor`]): deliveries/s and
/// claim+complete/s.
fn harness_floor(w: &workload::Workload) -> Result<(f64, f64), String> {
    let m = floor_rounds("the harness floor", |_| {
        workload::run(&systems::Floor::new(w.n), w)
    })?;
    Ok((m.throughput(), m.completes_per_sec()))
}

/// One run of the workload against [`systems::DurableFloor`] on a new file in `dir`, with
/// its group commits as the note; an error unless the file holds a claim and a completion
/// record of every executed delivery, and nothing else.
fn durable_floor_round(dir: &Path, w: &workload::Workload) -> Result<workload::Measured, String> {
    let floor = systems::DurableFloor::open(dir, w.n)?;
    let mut m = workload::run(&floor, w)?;
    floor.close()?;
    let records = floor.read_back()?;
    let claims = records
        .iter()
        .filter(|(_, tag)| *tag == systems::Tag::Claim)
        .count() as u64;
    if (claims, records.len() as u64) != (m.executed, 2 * m.executed) {
        return Err(format!(
            "durable floor: {} executed, but the file holds {claims} claims in {} records",
            m.executed,
            records.len()
        ));
    }
    m.note = Some(floor.note());
    Ok(m)
}

/// The workload against [`systems::DurableFloor`], each round in a new directory under
/// `dir`.
fn durable_floor(dir: &Path, w: &workload::Workload) -> Result<workload::Measured, String> {
    floor_rounds("the durable floor", |round| {
        let sub = dir.join(format!("durable-floor-{round}"));
        let _ = fs::remove_dir_all(&sub);
        fs::create_dir_all(&sub).map_err(|e| format!("{}: {e}", sub.display()))?;
        let m = durable_floor_round(&sub, w);
        let _ = fs::remove_dir_all(&sub);
        m
    })
}

fn calibrate(dir: &Path, w: &workload::Workload) -> Result<Calibration, String> {
    let e = |e: &dyn std::fmt::Display| format!("calibration: {e}");
    let path = dir.join("fsync.bin");
    let mut f = File::create(&path).map_err(|x| e(&x))?;
    let block = vec![7u8; 4096];
    let mut fs = Vec::new();
    for _ in 0..300 {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(0)).map_err(|x| e(&x))?;
        let t = Instant::now();
        f.write_all(&block).map_err(|x| e(&x))?;
        f.sync_data().map_err(|x| e(&x))?;
        fs.push(t.elapsed().as_nanos() as u64);
    }
    fs.sort_unstable();
    let _ = fs::remove_file(&path);
    let (mut direct, direct_on) =
        systems::block_append_latencies_ns(&dir.join("direct.bin"), 300).map_err(|x| e(&x))?;
    direct.sort_unstable();
    let mut redb = [0u64; 2];
    for (slot, two_phase) in [false, true].into_iter().enumerate() {
        let rpath = dir.join("calibrate.redb");
        let db = redb::Database::create(&rpath).map_err(|x| e(&x))?;
        let table: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("t");
        let mut commits = Vec::new();
        for i in 0..300u64 {
            let t = Instant::now();
            let mut tx = db.begin_write().map_err(|x| e(&x))?;
            tx.set_two_phase_commit(two_phase);
            {
                let mut tb = tx.open_table(table).map_err(|x| e(&x))?;
                tb.insert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), &[1u8; 32][..])
                    .map_err(|x| e(&x))?;
            }
            tx.commit().map_err(|x| e(&x))?;
            commits.push(t.elapsed().as_nanos() as u64);
        }
        commits.sort_unstable();
        drop(db);
        let _ = fs::remove_file(&rpath);
        redb[slot] = percentile(&commits, 0.5);
    }
    Ok(Calibration {
        fsync_p50: percentile(&fs, 0.5),
        fsync_p99: percentile(&fs, 0.99),
        direct_p50: percentile(&direct, 0.5),
        direct_p99: percentile(&direct, 0.99),
        direct_on,
        redb_p50: redb[0],
        redb_2pc_p50: redb[1],
        floor: harness_floor(w)?,
        durable: durable_floor(dir, w)?,
    })
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn mem_gib() -> String {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kb| format!("{:.0} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_else(|| "? GiB".into())
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--shared-child") {
        if let Err(e) = shared::child_main(&argv[2..]) {
            eprintln!("shared child: {e}");
            std::process::exit(1);
        }
        return;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = fs::create_dir_all(&args.data_dir) {
        eprintln!("cannot create {}: {e}", args.data_dir.display());
        std::process::exit(1);
    }
    let load_before = loadavg();
    let started = Instant::now();
    let w = &args.workload;
    eprintln!(
        "workload: N={} keys x D={} deliveries, C={} workers, {} B responses, time limit {:?}",
        w.n,
        w.d,
        w.c,
        w.response.len(),
        w.time_limit
    );
    let calib = match args.calibrate {
        true => calibrate(&args.data_dir, w),
        false => Err("calibration: skipped (--calibrate no)".into()),
    };
    match &calib {
        Ok(c) => eprintln!("calibration: {}", c.describe()),
        Err(e) => eprintln!("{e}"),
    }
    // `all` leaves out the shared backend's rows: they have their own section and workload
    // (`scripts/peers.sh shared`; D must divide among its processes).
    let selected: Vec<_> = SYSTEMS
        .iter()
        .filter(|(id, ..)| match &args.systems {
            Some(s) => s.iter().any(|x| x == id),
            None => !id.starts_with("idemkv-shared") && *id != "durable-floor",
        })
        .collect();
    // Round-robin: every system once per round, so a burst of outside load lands on
    // different systems in different rounds; each row reports its best round.
    let mut runs: Vec<Vec<Result<workload::Measured, String>>> = vec![Vec::new(); selected.len()];
    for round in 1..=args.rounds {
        eprintln!("round {round} of {}", args.rounds);
        for (i, &&(id, ..)) in selected.iter().enumerate() {
            let dir = args.data_dir.join(id);
            let _ = fs::remove_dir_all(&dir);
            let result = fs::create_dir_all(&dir)
                .map_err(|e| e.to_string())
                .and_then(|()| run_one(id, &args, &dir));
            let _ = fs::remove_dir_all(&dir);
            match &result {
                Ok(m) => {
                    eprintln!(
                        "  {id:<22} {:>11}/s deliveries {:>10}/s claim+complete  p50 {:>9}  \
                         p99 {:>9}  doubles {}  errors {}  retries {}  {:.1}s{}{}",
                        report::fmt_rate(m.throughput()),
                        report::fmt_rate(m.completes_per_sec()),
                        report::fmt_ns(m.p50_ns),
                        report::fmt_ns(m.p99_ns),
                        m.double_keys,
                        m.errors,
                        m.retries,
                        m.elapsed.as_secs_f64(),
                        if m.cut_short { " (time limit)" } else { "" },
                        m.per_pair()
                            .map(|(cpu, cs)| format!(
                                "  per pair (this process): {cpu:.1} µs CPU, {cs:.2} switches"
                            ))
                            .unwrap_or_default()
                    );
                    if let Some(note) = &m.note {
                        eprintln!("  {:<22} {note}", "");
                    }
                }
                Err(e) => eprintln!("  {id:<22} not run: {e}"),
            }
            runs[i].push(result);
        }
    }
    let rows: Vec<Row> = selected
        .iter()
        .zip(runs)
        .map(|(&&(id, name, class, promise), results)| Row {
            id,
            name,
            class,
            promise,
            result: best_round(results),
        })
        .collect();
    let load_after = loadavg();
    if args.shared_section {
        shared_section(&args, &rows, &calib, &load_before, &load_after, started);
        return;
    }
    let table = report::table(&rows);
    let targets = report::targets(&rows, calib.as_ref().ok().map(|c| c.redb_p50));
    println!("{table}\n{targets}");

    let pg_version = args
        .pg
        .as_deref()
        .map(|c| systems::Pg::version(c).unwrap_or_else(|e| e))
        .unwrap_or_else(|| "not run".into());
    let redis_version = args
        .redis
        .as_deref()
        .map(|u| systems::Redis::version(u).unwrap_or_else(|e| e))
        .unwrap_or_else(|| "not run".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let subtitle = format!(
        "N={} keys x D={} deliveries, C={} workers; {} cores ({}); {}",
        w.n,
        w.d,
        w.c,
        cores,
        cpu_model(),
        args.stamp
    );

    if let Some(svg_path) = &args.svg {
        if let Err(e) = fs::write(svg_path, report::svg(&rows, &subtitle)) {
            eprintln!("cannot write {}: {e}", svg_path.display());
        }
    }

    let mut block = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(
        block,
        "_Generated by `scripts/peers.sh` {}; everything between the `peers:begin` and \
         `peers:end` markers is rewritten by each run._\n",
        if args.stamp.is_empty() {
            String::new()
        } else {
            format!("on {}", args.stamp)
        }
    );
    let _ = writeln!(
        block,
        "**Machine.** {cores} cores ({}), {} RAM, Linux {kernel}; data files on {}. \
         The clients and the servers share these cores; load average \
         (1 min) {load_before} before the measurements, {load_after} after.\n",
        cpu_model(),
        mem_gib(),
        if args.disk.is_empty() {
            "?"
        } else {
            &args.disk
        }
    );
    let _ = writeln!(
        block,
        "**Versions.** Redis {redis_version}; PostgreSQL {pg_version}; SQLite {} (bundled by \
         rusqlite); redb 4 (the one idemkv uses); moka 0.12.\n",
        rusqlite::version()
    );
    let _ = writeln!(
        block,
        "**Workload.** N = {} keys × D = {} deliveries = {} deliveries, C = {} concurrent \
         workers, {} B responses, at most {} s per system and round; {} rounds, round-robin over \
         the systems; each row shows its best round (highest deliveries/s).\n",
        w.n,
        w.d,
        w.n * w.d,
        w.c,
        w.response.len(),
        w.time_limit.as_secs(),
        args.rounds
    );
    if !args.command.is_empty() {
        let _ = writeln!(block, "**Command.** `{}`\n", args.command);
    }
    if let Ok(c) = &calib {
        let _ = writeln!(
            block,
            "**Calibration** (same run; the disk's floor on the same disk, one thread): {}.\n",
            c.describe()
        );
    }
    let _ = writeln!(block, "{table}");
    let _ = writeln!(block, "![throughput and latency per system](peers.svg)\n");
    let _ = writeln!(
        block,
        "**Goals** (idemkv's deliveries/s ÷ the peer's, at matching durability; each `-async` \
         row against the same peers as its blocking twin; then claim+complete/s, and the \
         `Immediate` rows' p50 against the calibration's single-insert redb commit):\n"
    );
    let _ = writeln!(block, "{targets}");
    let _ = writeln!(
        block,
        "Run time of the measurements: {:.0} s.",
        started.elapsed().as_secs_f64()
    );

    if let Some(doc) = &args.doc {
        if let Err(e) = splice_doc(doc, &block) {
            eprintln!("cannot update {}: {e}", doc.display());
            std::process::exit(1);
        }
        eprintln!("wrote {}", doc.display());
    }
    let failed = rows
        .iter()
        .filter(|r| {
            r.result.is_err()
                || r.result
                    .as_ref()
                    .is_ok_and(|m| m.errors_all > 0 || m.rounds_failed > 0)
        })
        .count();
    if failed > 0 {
        eprintln!("{failed} system(s) failed or reported errors; see the notes column");
    }
}

/// The round with the highest throughput, carrying every round's throughput and the
/// double executions and errors of all rounds; an error only if no round ran.
fn best_round(
    results: Vec<Result<workload::Measured, String>>,
) -> Result<workload::Measured, String> {
    let ok: Vec<&workload::Measured> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let Some(best) = ok
        .iter()
        .max_by(|a, b| a.throughput().total_cmp(&b.throughput()))
    else {
        return Err(failed
            .first()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "no round ran".into()));
    };
    let mut best = (*best).clone();
    best.round_rates = ok.iter().map(|m| m.throughput()).collect();
    best.double_keys_all = ok.iter().map(|m| m.double_keys).sum();
    best.extra_runs_all = ok.iter().map(|m| m.extra_runs).sum();
    best.errors_all = ok.iter().map(|m| m.errors).sum();
    best.rounds_failed = failed.len();
    if best.first_error.is_none() {
        best.first_error = ok
            .iter()
            .find_map(|m| m.first_error.clone())
            .or_else(|| failed.first().map(|e| e.to_string()));
    }
    Ok(best)
}

const BEGIN: &str = "<!-- peers:begin -->";
const END: &str = "<!-- peers:end -->";
const SHARED_BEGIN: &str = "<!-- peers-shared:begin -->";
const SHARED_END: &str = "<!-- peers-shared:end -->";

/// Replaces what lies between the markers in `doc` (appending a Peers section with the
/// markers if the file or the markers are missing).
fn splice_doc(doc: &Path, block: &str) -> std::io::Result<()> {
    splice_between(doc, block, BEGIN, END, "Peers")
}

fn splice_between(
    doc: &Path,
    block: &str,
    begin: &str,
    end: &str,
    heading: &str,
) -> std::io::Result<()> {
    let old = fs::read_to_string(doc).unwrap_or_default();
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if b < e => format!(
            "{}{begin}\n\n{block}\n{end}{}",
            &old[..b],
            &old[e + end.len()..]
        ),
        _ => format!("{old}\n## {heading}\n\n{begin}\n\n{block}\n{end}\n"),
    };
    fs::write(doc, new)
}

/// The shared backend's comparison: its rows next to the naive PostgreSQL baseline, with
/// the database round trips per delivery, written between the `peers-shared` markers.
fn shared_section(
    args: &Args,
    rows: &[Row],
    calib: &Result<Calibration, String>,
    load_before: &str,
    load_after: &str,
    started: Instant,
) {
    use std::fmt::Write as _;
    let w = &args.workload;
    let table = report::round_trip_table(rows);
    println!("{table}");
    let pg_version = args
        .pg
        .as_deref()
        .map(|c| systems::Pg::version(c).unwrap_or_else(|e| e))
        .unwrap_or_else(|| "not run".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mut block = String::new();
    let _ = writeln!(
        block,
        "_Generated by `scripts/peers.sh shared` {}; everything between the `peers-shared:begin` \
         and `peers-shared:end` markers is rewritten by each run._\n",
        if args.stamp.is_empty() {
            String::new()
        } else {
            format!("on {}", args.stamp)
        }
    );
    let _ = writeln!(
        block,
        "**Machine.** {cores} cores ({}), {} RAM; PostgreSQL {pg_version} on {} \
         (synchronous_commit on), on the same cores as the clients; load average (1 min) \
         {load_before} before the measurements, {load_after} after.\n",
        cpu_model(),
        mem_gib(),
        if args.disk.is_empty() {
            "?"
        } else {
            &args.disk
        }
    );
    let _ = writeln!(
        block,
        "**Workload.** N = {} keys × D = {} deliveries = {} deliveries, C = {} concurrent \
         workers in all (split evenly over the processes of a row, each process delivering \
         every key D ÷ processes times), {} B responses, at most {} s per system and round; \
         {} rounds, round-robin; each row shows its best round.\n",
        w.n,
        w.d,
        w.n * w.d,
        w.c,
        w.response.len(),
        w.time_limit.as_secs(),
        args.rounds
    );
    if !args.command.is_empty() {
        let _ = writeln!(block, "**Command.** `{}`\n", args.command);
    }
    if let Ok(c) = calib {
        let _ = writeln!(
            block,
            "**Calibration** (same run; the disk's floor on the same disk, one thread): {}.\n",
            c.describe()
        );
    }
    let _ = writeln!(block, "{table}");
    let _ = writeln!(
        block,
        "Run time of the measurements: {:.0} s.",
        started.elapsed().as_secs_f64()
    );
    if let Some(doc) = &args.doc {
        let written = splice_between(
            doc,
            &block,
            SHARED_BEGIN,
            SHARED_END,
            "Peers: the shared backend",
        );
        if let Err(e) = written {
            eprintln!("cannot update {}: {e}", doc.display());
            std::process::exit(1);
        }
        eprintln!("wrote {}", doc.display());
    }
}
