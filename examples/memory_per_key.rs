//! Measures the memory idemkv holds per completed key: the growth of the process's resident
//! set (RSS, allocator included) while 1 M keys are claimed and completed.
//!
//! Run with `cargo run --release --example memory_per_key` (Linux: RSS is read from
//! `/proc/self/status`). `IDEMKV_MEMORY_KEYS=100000` runs a quick, smaller measurement.
//!
//! Each case runs in its own child process, so no case inherits another's heap. A case
//! claims and completes N keys (phase 1), then N more (phase 2), with a 32-byte response
//! each, and reports the RSS growth of each phase divided by N:
//!
//! - `None` (memory only): the index, plus each response, which a memory-only engine keeps.
//! - `Buffered` on a file in the temporary directory: phase 1 also fills redb's page cache
//!   (capped at 64 MiB) and the writer's buffers; by phase 2 those are at their steady
//!   size, so phase 2's growth is the index alone. Responses stay in the file.
//!
//! With the engine's default 256 stripes, both phases end at the same load factor of the
//! index's tables (they double when 7/8 full: 1 M and 2 M keys both sit just after a
//! doubling), so the two phases are comparable.
//!
//! A last case measures markers (`EngineBuilder::marker_retention`): each phase completes N
//! keys, moves a mock clock past their retention and sweeps, so each phase leaves N markers
//! and frees its completions. Phase 2's completions reuse what phase 1's freed, so its growth
//! is the markers alone (memory-only engine: markers are the same in memory under every
//! mode, and a memory-only engine keeps redb's page cache out of the measurement).

#[path = "common/keys.rs"]
mod keys;

use idemkv::{Claim, ClaimError, ClaimOptions, Durability, Engine, MockClock};
use std::process::Command;
use std::time::{Duration, Instant};

const RESPONSE: &[u8; 32] = b"a typical 32-byte response......";
const KEY_LENS: [usize; 2] = [16, 36];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--case" {
        let key_len: usize = args[3].parse()?;
        return run_case(&args[2], key_len);
    }
    let n = keys();
    println!(
        "idemkv memory per completed key: RSS growth over {n} keys per phase, {}-byte responses, \
         system allocator",
        RESPONSE.len()
    );
    println!(
        "{:<10} {:>5}  {:>16} {:>16} {:>18}",
        "mode", "key", "phase 1 (B/key)", "phase 2 (B/key)", "index_bytes (B/key)"
    );
    let exe = std::env::current_exe()?;
    for mode in ["none", "buffered"] {
        for key_len in KEY_LENS {
            let out = Command::new(&exe)
                .args(["--case", mode, &key_len.to_string()])
                .output()?;
            if !out.status.success() {
                return Err(format!(
                    "case {mode} {key_len} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
                .into());
            }
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
    }
    println!();
    println!("idemkv memory per marker: {n} markers per phase, memory-only engine");
    println!(
        "{:<10} {:>5}  {:>16} {:>16} {:>18}",
        "mode", "key", "phase 1 (B/mk)", "phase 2 (B/mk)", "index_bytes (B/mk)"
    );
    let out = Command::new(&exe)
        .args(["--case", "markers", "16"])
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "case markers failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    print!("{}", String::from_utf8_lossy(&out.stdout));
    Ok(())
}

/// The markers case: each phase leaves `n` markers (see the module docs).
fn run_markers(key_len: usize) -> Result<(), Box<dyn std::error::Error>> {
    let n = keys();
    let retention = Duration::from_secs(3600);
    let clock = MockClock::new();
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(clock.clone())
        .retention(retention)
        .marker_retention(Some(Duration::from_secs(30 * 24 * 3600)))
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()?;
    let opts = ClaimOptions::default();
    let mut key = vec![0u8; key_len];
    let mut phase = |from: u64| -> Result<(u64, u64), Box<dyn std::error::Error>> {
        for i in from..from + n {
            claim_complete(&engine, keys::make_key(i, &mut key), &opts)?;
        }
        clock.advance(retention);
        engine.admin().sweep_now()?;
        let stats = engine.stats();
        if stats.markers != from + n || stats.completed != 0 {
            return Err(format!("expected {} markers: {stats:?}", from + n).into());
        }
        Ok((rss_bytes()?, stats.index_bytes))
    };
    let rss0 = rss_bytes()?;
    let started = Instant::now();
    let (rss1, index1) = phase(0)?;
    let (rss2, index2) = phase(n)?;
    let elapsed = started.elapsed();
    engine.close()?;
    let per = |bytes: u64| bytes as f64 / n as f64;
    println!(
        "{:<10} {:>4}B  {:>16.0} {:>16.0} {:>18.0}   ({:.1?})",
        "markers",
        key_len,
        per(rss1.saturating_sub(rss0)),
        per(rss2.saturating_sub(rss1)),
        per(index2.saturating_sub(index1)),
        elapsed
    );
    Ok(())
}

/// One measurement, in this (child) process.
fn run_case(mode: &str, key_len: usize) -> Result<(), Box<dyn std::error::Error>> {
    if mode == "markers" {
        return run_markers(key_len);
    }
    let n = keys();
    let dir = tempfile::Builder::new()
        .prefix("idemkv-memory-")
        .tempdir()?;
    let builder = Engine::builder();
    let builder = match mode {
        "none" => builder.durability(Durability::None),
        "buffered" => builder
            .durability(Durability::buffered())
            .path(dir.path().join("memory.redb")),
        other => return Err(format!("unknown mode {other}").into()),
    };
    let engine = builder.open()?;
    let opts = ClaimOptions::default();
    let mut key = vec![0u8; key_len];

    let rss0 = rss_bytes()?;
    let started = Instant::now();
    for i in 0..n {
        claim_complete(&engine, keys::make_key(i, &mut key), &opts)?;
    }
    engine.flush()?;
    let rss1 = rss_bytes()?;
    for i in n..2 * n {
        claim_complete(&engine, keys::make_key(i, &mut key), &opts)?;
    }
    engine.flush()?;
    let rss2 = rss_bytes()?;
    let stats = engine.stats();
    let elapsed = started.elapsed();
    engine.close()?;
    drop(dir);

    let per_key = |bytes: u64, keys: u64| bytes as f64 / keys as f64;
    println!(
        "{:<10} {:>4}B  {:>16.0} {:>16.0} {:>18.0}   ({:.1?})",
        mode,
        key_len,
        per_key(rss1.saturating_sub(rss0), n),
        per_key(rss2.saturating_sub(rss1), n),
        per_key(stats.index_bytes, 2 * n),
        elapsed
    );
    Ok(())
}

/// Claims and completes a fresh key, waiting for the writer when its queue is full.
fn claim_complete(
    engine: &Engine,
    key: &[u8],
    opts: &ClaimOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        match engine.claim(key, opts) {
            Ok(Claim::Acquired(lease)) => {
                lease.complete(RESPONSE)?;
                return Ok(());
            }
            Ok(other) => return Err(format!("a fresh key was answered {other:?}").into()),
            Err(ClaimError::Overloaded(_)) => engine.flush()?,
            Err(e) => return Err(e.into()),
        }
    }
}

fn keys() -> u64 {
    std::env::var("IDEMKV_MEMORY_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// Resident set size of this process (`VmRSS` in `/proc/self/status`, Linux).
fn rss_bytes() -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS line in /proc/self/status")?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024)
}
