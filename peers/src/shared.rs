//! idemkv's shared backend (PostgreSQL) in the side-by-side benchmark, in one process and
//! in several: the binary runs itself as `--shared-child` processes that each deliver
//! every key `D / processes` times, walking the keys in the same order, so a key's copies
//! reach every process at about the same moment. Each process counts its database round
//! trips (`Stats::db_round_trips`); the parent adds them up, with the deliveries and the
//! side effects of every process (a key run by two processes is a double execution).

use crate::workload::{self, AsyncPeer, Delivery, Measured, Peer, Workload};
use idemkv::{Claim, ClaimOptions, Engine, PostgresConfig};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shared engine of one process, a pooled connection per worker.
pub struct Shared {
    engine: Engine,
    opts: ClaimOptions,
    /// Side effects this process ran, per key.
    ran: Vec<AtomicU32>,
}

impl Shared {
    /// Opens a shared engine on the tables named by `prefix` (created if missing).
    pub fn open(conninfo: &str, prefix: &str, pool: usize, n: usize) -> Result<Self, String> {
        let mut cfg = PostgresConfig::new(conninfo)
            .table_prefix(prefix)
            .pool_size(pool.clamp(1, 1024));
        // TLS for the engine's connections (what TLS costs): with the server's CA set here,
        // the conninfo's default `sslmode=prefer` encrypts them. The child processes of the
        // multi-process rows inherit it; the harness's own connections stay plain.
        if let Some(ca) = std::env::var_os("IDEMKV_PEERS_PG_ROOT_CERT") {
            cfg = cfg.tls_root_cert(ca);
        }
        let engine = Engine::builder()
            .postgres(cfg)
            .lease(crate::systems::LEASE)
            .retention(crate::systems::RETENTION)
            .open()
            .map_err(|e| format!("idemkv shared open: {e}"))?;
        Ok(Shared {
            engine,
            opts: ClaimOptions::default(),
            ran: (0..n).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// Statements this process sent for its callers.
    pub fn round_trips(&self) -> u64 {
        self.engine.stats().db_round_trips
    }
}

impl Peer for Shared {
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
        match self.engine.claim(key, &self.opts) {
            Ok(Claim::Acquired(lease)) => {
                effect();
                self.ran_once(key);
                lease
                    .complete(response)
                    .map(|()| Delivery::Executed)
                    .map_err(|e| format!("complete: {e}"))
            }
            Ok(Claim::InProgress(_)) | Ok(Claim::Completed(_)) | Ok(Claim::Forgotten(_)) => {
                Ok(Delivery::Duplicate)
            }
            Err(e) => Err(format!("claim: {e}")),
        }
    }

    fn round_trips(&self) -> Option<u64> {
        Some(Shared::round_trips(self))
    }
}

impl Shared {
    fn ran_once(&self, key: &[u8]) {
        if let Some(slot) = workload::key_index(key).and_then(|k| self.ran.get(k)) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl AsyncPeer for Shared {
    /// `claim_async`, then `Lease::complete_async`: the same calls awaited.
    async fn deliver_async(
        &self,
        key: &[u8],
        response: &[u8],
        effect: &(dyn Fn() + Sync),
    ) -> Result<Delivery, String> {
        match self.engine.claim_async(key, &self.opts).await {
            Ok(Claim::Acquired(lease)) => {
                effect();
                self.ran_once(key);
                lease
                    .complete_async(response)
                    .await
                    .map(|()| Delivery::Executed)
                    .map_err(|e| format!("complete: {e}"))
            }
            Ok(Claim::InProgress(_)) | Ok(Claim::Completed(_)) | Ok(Claim::Forgotten(_)) => {
                Ok(Delivery::Duplicate)
            }
            Err(e) => Err(format!("claim: {e}")),
        }
    }
}

/// Runs the workload on `peer` with C threads (the blocking API) or C tasks on a tokio
/// runtime of `ASYNC_RUNTIME_THREADS` threads (the async API).
fn run_workload(peer: &Arc<Shared>, w: &Workload, async_api: bool) -> Result<Measured, String> {
    if async_api {
        workload::run_async(peer, w)
    } else {
        workload::run(&**peer, w)
    }
}

/// Fresh tables for one run: a prefix no earlier run used, and a checkpoint so that each
/// run starts alike (as the naive PostgreSQL peer's `TRUNCATE; CHECKPOINT`).
fn fresh_prefix(conninfo: &str) -> Result<String, String> {
    let mut c = postgres::Client::connect(conninfo, postgres::NoTls)
        .map_err(|e| format!("postgres connect: {e}"))?;
    c.batch_execute("CHECKPOINT")
        .map_err(|e| format!("postgres checkpoint: {e}"))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Ok(format!("peers_{}_{nanos:09}_", std::process::id()))
}

/// Drops a run's tables (what the sweeper would reach only after the retention).
fn drop_tables(conninfo: &str, prefix: &str) {
    if let Ok(mut c) = postgres::Client::connect(conninfo, postgres::NoTls) {
        let _ = c.batch_execute(&format!(
            "DROP TABLE IF EXISTS \"{prefix}keys\", \"{prefix}meta\"; \
             DROP SEQUENCE IF EXISTS \"{prefix}tokens\""
        ));
    }
}

/// One process: C workers (threads, or tasks with `async_api`) on one shared engine.
pub fn run_one_process(conninfo: &str, w: &Workload, async_api: bool) -> Result<Measured, String> {
    let prefix = fresh_prefix(conninfo)?;
    let result = (|| {
        let peer = Arc::new(Shared::open(conninfo, &prefix, w.c, w.n)?);
        let mut m = run_workload(&peer, w, async_api)?;
        m.note = Some(format!("1 process, a pool of {} connections", w.c));
        Ok(m)
    })();
    drop_tables(conninfo, &prefix);
    result
}

/// What a child reports when its run ends, one line after `done`.
struct ChildDone {
    m: Measured,
}

fn encode(m: &Measured) -> String {
    format!(
        "{} {} {} {} {} {} {} {} {} {} {}",
        m.deliveries,
        m.executed,
        m.duplicates,
        m.errors,
        m.elapsed.as_nanos(),
        m.p50_ns,
        m.p99_ns,
        m.dup_p50_ns,
        m.dup_p99_ns,
        m.round_trips.unwrap_or(0),
        u8::from(m.cut_short)
    )
}

fn decode(s: &str) -> Result<ChildDone, String> {
    let v: Vec<u64> = s
        .split(' ')
        .map(|x| {
            x.parse::<u64>()
                .map_err(|_| format!("bad child report {s:?}"))
        })
        .collect::<Result<_, _>>()?;
    if v.len() != 11 {
        return Err(format!("bad child report {s:?}"));
    }
    Ok(ChildDone {
        m: Measured {
            deliveries: v[0],
            executed: v[1],
            duplicates: v[2],
            errors: v[3],
            elapsed: Duration::from_nanos(v[4]),
            p50_ns: v[5],
            p99_ns: v[6],
            dup_p50_ns: v[7],
            dup_p99_ns: v[8],
            round_trips: Some(v[9]),
            cut_short: v[10] == 1,
            ..Measured::default()
        },
    })
}

/// `processes` processes of `C / processes` workers each (threads, or tasks with
/// `async_api`), every key delivered `D / processes` times in each.
pub fn run_processes(
    conninfo: &str,
    w: &Workload,
    processes: usize,
    dir: &Path,
    async_api: bool,
) -> Result<Measured, String> {
    if !w.d.is_multiple_of(processes) || !w.c.is_multiple_of(processes) {
        return Err(format!(
            "D ({}) and C ({}) must be multiples of the {processes} processes",
            w.d, w.c
        ));
    }
    let prefix = fresh_prefix(conninfo)?;
    let result = run_children(conninfo, w, processes, dir, &prefix, async_api);
    drop_tables(conninfo, &prefix);
    result
}

fn run_children(
    conninfo: &str,
    w: &Workload,
    processes: usize,
    dir: &Path,
    prefix: &str,
    async_api: bool,
) -> Result<Measured, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut children = Vec::new();
    for p in 0..processes {
        let out = dir.join(format!("ran-{p}.bin"));
        let child = Command::new(&exe)
            .arg("--shared-child")
            .args(["--pg", conninfo, "--prefix", prefix])
            .args(["--n", &w.n.to_string()])
            .args(["--d", &(w.d / processes).to_string()])
            .args(["--c", &(w.c / processes).to_string()])
            .args(["--time-limit", &w.time_limit.as_secs().to_string()])
            .args(["--response-bytes", &w.response.len().to_string()])
            .args(["--out", &out.to_string_lossy()])
            .args(["--async", if async_api { "1" } else { "0" }])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn a child: {e}"))?;
        children.push((child, out));
    }
    let mut lines = Vec::new();
    for (child, _) in &mut children {
        let stdout = child.stdout.take().ok_or("child stdout")?;
        lines.push(BufReader::new(stdout).lines());
    }
    for l in &mut lines {
        match l.next() {
            Some(Ok(s)) if s == "ready" => {}
            other => return Err(format!("a child did not get ready: {other:?}")),
        }
    }
    // Every child is connected and waiting: start them together.
    let start = Instant::now();
    for (child, _) in &mut children {
        let stdin = child.stdin.as_mut().ok_or("child stdin")?;
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("start a child: {e}"))?;
    }
    let mut reports = Vec::new();
    for l in &mut lines {
        match l.next() {
            Some(Ok(s)) => match s.strip_prefix("done ") {
                Some(rest) => reports.push(decode(rest)?),
                None => return Err(format!("a child failed: {s}")),
            },
            other => return Err(format!("a child ended early: {other:?}")),
        }
    }
    let wall = start.elapsed();
    let mut runs = vec![0u32; w.n];
    for (mut child, out) in children {
        let _ = child.wait();
        let bytes = std::fs::read(&out).map_err(|e| format!("read {}: {e}", out.display()))?;
        for (k, c) in bytes.chunks_exact(4).enumerate() {
            if let Some(slot) = runs.get_mut(k) {
                *slot += u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
    let mut m = Measured {
        elapsed: wall,
        round_trips: Some(0),
        ..Measured::default()
    };
    let (mut p50, mut dup_p50) = (0u64, 0u64);
    for r in &reports {
        let c = &r.m;
        m.deliveries += c.deliveries;
        m.executed += c.executed;
        m.duplicates += c.duplicates;
        m.errors += c.errors;
        m.cut_short |= c.cut_short;
        m.round_trips = Some(m.round_trips.unwrap_or(0) + c.round_trips.unwrap_or(0));
        p50 += c.p50_ns;
        dup_p50 += c.dup_p50_ns;
        m.p99_ns = m.p99_ns.max(c.p99_ns);
        m.dup_p99_ns = m.dup_p99_ns.max(c.dup_p99_ns);
    }
    let n = reports.len().max(1) as u64;
    m.p50_ns = p50 / n;
    m.dup_p50_ns = dup_p50 / n;
    for &r in &runs {
        if r >= 1 {
            m.keys_run += 1;
        }
        if r > 1 {
            m.double_keys += 1;
            m.extra_runs += u64::from(r - 1);
        }
    }
    m.note = Some(format!(
        "{processes} processes × {} workers, a pool of {} connections each; p50: mean of the \
         processes' medians, p99: the largest",
        w.c / processes,
        w.c / processes,
    ));
    Ok(m)
}

/// The child's side: `--shared-child` and the flags `run_children` passes.
pub fn child_main(args: &[String]) -> Result<(), String> {
    let mut conninfo = String::new();
    let mut prefix = String::new();
    let mut out = String::new();
    let mut async_api = false;
    let mut w = Workload {
        n: 0,
        d: 1,
        c: 1,
        time_limit: Duration::from_secs(4),
        response: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: {value}"))
        };
        match flag.as_str() {
            "--pg" => conninfo = value.clone(),
            "--prefix" => prefix = value.clone(),
            "--out" => out = value.clone(),
            "--async" => async_api = num()? == 1,
            "--n" => w.n = num()?,
            "--d" => w.d = num()?.max(1),
            "--c" => w.c = num()?.max(1),
            "--time-limit" => w.time_limit = Duration::from_secs(num()? as u64),
            "--response-bytes" => w.response = (0..num()?).map(|i| b'a' + (i % 26) as u8).collect(),
            _ => return Err(format!("unknown child flag {flag}")),
        }
    }
    let peer = Arc::new(Shared::open(&conninfo, &prefix, w.c, w.n)?);
    let mut stdout = std::io::stdout().lock();
    let say = |stdout: &mut std::io::StdoutLock<'_>, s: &str| {
        writeln!(stdout, "{s}").and_then(|()| stdout.flush())
    };
    say(&mut stdout, "ready").map_err(|e| e.to_string())?;
    let mut go = String::new();
    std::io::stdin()
        .read_line(&mut go)
        .map_err(|e| e.to_string())?;
    let m = match run_workload(&peer, &w, async_api) {
        Ok(m) => m,
        Err(e) => {
            let _ = say(&mut stdout, &format!("failed {e}"));
            return Err(e);
        }
    };
    let ran: Vec<u8> = peer
        .ran
        .iter()
        .flat_map(|r| r.load(Ordering::Relaxed).to_le_bytes())
        .collect();
    std::fs::write(&out, ran).map_err(|e| format!("write {out}: {e}"))?;
    say(&mut stdout, &format!("done {}", encode(&m))).map_err(|e| e.to_string())?;
    Ok(())
}
