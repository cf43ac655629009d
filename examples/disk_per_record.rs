//! Measures the bytes the default engine's file holds per completed record.
//!
//! Run with `cargo run --release --example disk_per_record`. `IDEMKV_DISK_KEYS=100000` runs
//! a quicker, smaller measurement (the default is 900 000 records).
//!
//! Each case opens the default engine (`Durability::Immediate`, so the commit log is in
//! front of the file) on a fresh file, claims and completes N keys with a 64-byte response
//! from 16 threads, closes the engine, and reports:
//!
//! - the redb file's size divided by N while the engine still has it open (live) and once
//!   it is closed (at rest: a clean close compacts a file with enough unused pages), the
//!   latter against the budget of 1.5 × (key + response), and how long the close took;
//! - what redb reports of the closed file: the bytes of its entries per record (the record
//!   encoding and redb's key and offsets), how full its leaf pages are, and how much of the
//!   file no page uses, so that a change can be told apart as the encoding or page use;
//! - the commit log beside the file, whose size is fixed (preallocated), not per record.
//!
//! Keys are 16 bytes (a binary UUID) and 36 bytes (its text form).

#[path = "common/keys.rs"]
mod keys;

use idemkv::{ClaimOptions, Engine};
use redb::Database;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const RESPONSE: &[u8; 64] = b"a 64-byte response: an order id, a status and a few fields......";
const KEY_LENS: [usize; 2] = [16, 36];
const THREADS: u64 = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = keys();
    println!(
        "idemkv bytes on disk per completed record: {n} records, {}-byte responses, default engine",
        RESPONSE.len()
    );
    println!(
        "{:>5}  {:>10} {:>12} {:>9} {:>8}  {:>14} {:>10} {:>11}  {:>9} {:>8}",
        "key",
        "live B/rec",
        "at rest B/rec",
        "budget B",
        "verdict",
        "entries B/rec",
        "leaf fill",
        "file unused",
        "close",
        "log MiB"
    );
    for key_len in KEY_LENS {
        run_case(n, key_len)?;
    }
    Ok(())
}

fn run_case(n: u64, key_len: usize) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::Builder::new().prefix("idemkv-disk-").tempdir()?;
    let path = dir.path().join("disk.redb");
    let engine = Engine::open(&path)?;
    let next = AtomicU64::new(0);
    let started = Instant::now();
    let opts = ClaimOptions::default();
    std::thread::scope(|s| -> Result<(), String> {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    let mut key = vec![0u8; key_len];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        engine
                            .run(keys::make_key(i, &mut key), &opts, |_| {
                                Ok::<_, Infallible>(RESPONSE.to_vec())
                            })
                            .map_err(|e| e.to_string())?;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .map_err(|_| "a worker panicked".to_string())??;
        }
        Ok(())
    })?;
    let elapsed = started.elapsed();
    let live_bytes = std::fs::metadata(&path)?.len();
    let closing = Instant::now();
    engine.close()?;
    let close_time = closing.elapsed();

    let file_bytes = std::fs::metadata(&path)?.len();
    let log_bytes = std::fs::read_dir(dir.path())?
        .filter_map(Result::ok)
        .filter(|entry| entry.path() != path)
        .filter_map(|entry| entry.metadata().ok())
        .map(|meta| meta.len())
        .sum::<u64>();
    let db = Database::open(&path)?;
    let stats = db.begin_write()?.stats()?;
    let per = |bytes: u64| bytes as f64 / n as f64;
    let budget = 1.5 * (key_len + RESPONSE.len()) as f64;
    let verdict = if per(file_bytes) <= budget {
        "met"
    } else {
        "missed"
    };
    let page_bytes = stats.page_size() as u64;
    // How full redb's leaves are, and how much of the file no page uses: the two ways the
    // file outgrows the bytes of its entries.
    let leaf_fill = stats.stored_bytes() as f64 / (stats.leaf_pages() * page_bytes).max(1) as f64;
    let unused = 1.0 - (stats.allocated_pages() * page_bytes) as f64 / file_bytes.max(1) as f64;
    println!(
        "{:>4}B  {:>10.1} {:>12.1} {:>9.0} {:>8}  {:>14.1} {:>9.0}% {:>10.0}%  {:>9.2?} {:>8.1}   (load {:.1?})",
        key_len,
        per(live_bytes),
        per(file_bytes),
        budget,
        verdict,
        per(stats.stored_bytes()),
        leaf_fill * 100.0,
        unused * 100.0,
        close_time,
        log_bytes as f64 / f64::from(1 << 20),
        elapsed
    );
    Ok(())
}

fn keys() -> u64 {
    std::env::var("IDEMKV_DISK_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(900_000)
}
