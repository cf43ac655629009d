//! A message consumer whose local effects are exactly-once: consume, change local state and
//! emit messages in one completion (`docs/outbox.md`).
//!
//! The input log holds payments, some of them delivered twice or three times (a broker's
//! redeliveries). For each message the consumer claims its id and, in ONE completion,
//! adds the amount to the account's balance, counts the message as applied, records its
//! consumer offset, and emits a confirmation through the outbox. A relay thread publishes
//! the committed confirmations to an output file (append, then fsync) and marks them sent.
//!
//! Kill it at any moment and run it again: every payment is applied exactly once, and every
//! confirmation is published at least once (a confirmation published just before a crash,
//! and not yet marked sent, is published again; its outbox id says it is the same one).
//!
//! ```sh
//! cargo run --example outbox_consumer -- --dir /tmp/outbox-demo --messages 300
//! cargo run --example outbox_consumer -- --dir /tmp/outbox-demo --mode buffered   # resumes
//! ```
//!
//! `tests/outbox_crash.rs` runs this code under `kill -9` at random points.

use idemkv::{ClaimOptions, Durability, Engine, WriteSet};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The input log, the engine's file and the relay's output, in one directory.
pub const INPUT: &str = "input.log";
pub const FILE: &str = "consumer.redb";
pub const OUTPUT: &str = "confirmations.log";

/// Application tables.
pub const BALANCES: &str = "balances";
pub const APPLIED: &str = "applied";
pub const OFFSETS: &str = "offsets";

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// One payment of the input log: `<id> <account> <amount>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    pub id: String,
    pub account: String,
    pub amount: u64,
}

/// Writes an input log of `distinct` payments, about a third of them delivered again (some
/// right away, some later), from a fixed seed.
pub fn generate_input(path: &Path, distinct: u64, seed: u64) -> Result<(), Error> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut lines = String::new();
    let mut seen: Vec<String> = Vec::new();
    for n in 0..distinct {
        let line = format!("pay-{n} acct-{} {}\n", rng.u64(0..8), rng.u64(1..1000));
        lines.push_str(&line);
        seen.push(line);
        if rng.u8(0..3) == 0 {
            // A redelivery of a recent message (or of this one, at once).
            let back = rng.usize(0..seen.len().min(20));
            lines.push_str(&seen[seen.len() - 1 - back].clone());
        }
    }
    std::fs::write(path, lines)?;
    Ok(())
}

pub fn read_input(path: &Path) -> Result<Vec<Payment>, Error> {
    std::fs::read_to_string(path)?
        .lines()
        .map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                [id, account, amount] => Ok(Payment {
                    id: id.to_string(),
                    account: account.to_string(),
                    amount: amount.parse()?,
                }),
                _ => Err(format!("bad input line {line:?}").into()),
            }
        })
        .collect()
}

fn read_u64(engine: &Engine, table: &str, key: &[u8]) -> Result<u64, Error> {
    Ok(match engine.table_get(table, key)? {
        Some(bytes) => u64::from_le_bytes(bytes.as_slice().try_into()?),
        None => 0,
    })
}

/// How far the consumer got with the payment at an input position (for a caller that
/// watches it; `tests/outbox_crash.rs` times its kills by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The handler staged the payment's writes; its completion is about to be made.
    Staged(usize),
    /// The payment's completion returned (or it was a redelivery, replayed).
    Applied(usize),
}

/// Consumes the input from the recorded offset. Each payment is claimed by its id; the
/// winner stages its writes on the lease, and `run` commits them with the completion.
pub fn consume(
    engine: &Engine,
    input: &[Payment],
    mut progress: impl FnMut(Step),
) -> Result<usize, Error> {
    let start = read_u64(engine, OFFSETS, INPUT.as_bytes())? as usize;
    let mut fresh = 0;
    for (i, payment) in input.iter().enumerate().skip(start) {
        let opts = ClaimOptions::default().payload(payment.account.as_bytes());
        let out = engine.run(payment.id.as_bytes(), &opts, |lease| {
            let account = payment.account.as_bytes();
            let balance = read_u64(engine, BALANCES, account)?;
            let times = read_u64(engine, APPLIED, payment.id.as_bytes())?;
            let mut writes = WriteSet::new();
            writes
                .put(BALANCES, account, &(balance + payment.amount).to_le_bytes())?
                .put(APPLIED, payment.id.as_bytes(), &(times + 1).to_le_bytes())?
                .put(OFFSETS, INPUT.as_bytes(), &(i as u64 + 1).to_le_bytes())?
                .emit(
                    format!("{} {} {}", payment.id, payment.account, payment.amount).as_bytes(),
                )?;
            lease.stage(writes)?;
            progress(Step::Staged(i));
            Ok::<_, Error>(b"applied".to_vec())
        })?;
        if !out.replayed() {
            fresh += 1;
        }
        progress(Step::Applied(i));
    }
    Ok(fresh)
}

/// Publishes every committed confirmation: appends them to `output` (one line each:
/// `<outbox id> <payment> <account> <amount>`), fsyncs, then marks them sent. Returns how
/// many it published.
pub fn relay(engine: &Engine, output: &mut File) -> Result<usize, Error> {
    let outbox = engine.outbox();
    let mut published = 0;
    loop {
        let batch = outbox.pending(64)?;
        if batch.is_empty() {
            return Ok(published);
        }
        let mut lines = String::new();
        for m in &batch {
            lines.push_str(&format!(
                "{} {}\n",
                m.id(),
                String::from_utf8_lossy(m.payload())
            ));
        }
        // Published (durable in the output) before it is marked sent: a crash in between
        // publishes it again, never loses it.
        output.write_all(lines.as_bytes())?;
        output.sync_data()?;
        let ids: Vec<u64> = batch.iter().map(|m| m.id()).collect();
        outbox.mark_sent(&ids)?;
        published += batch.len();
    }
}

pub fn open_output(dir: &Path) -> Result<File, Error> {
    Ok(OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(OUTPUT))?)
}

pub fn open_engine(dir: &Path, durability: Durability) -> Result<Engine, Error> {
    Ok(Engine::builder()
        .path(dir.join(FILE))
        .durability(durability)
        .open()?)
}

/// Runs the consumer over the whole input with a relay thread beside it, then publishes
/// what is left. `progress` as for [`consume`].
pub fn run(dir: &Path, durability: Durability, progress: impl FnMut(Step)) -> Result<(), Error> {
    let input = read_input(&dir.join(INPUT))?;
    let engine = open_engine(dir, durability)?;
    let stop = Arc::new(AtomicBool::new(false));
    let relay_thread = {
        let (engine, stop) = (engine.clone(), stop.clone());
        let mut output = open_output(dir)?;
        std::thread::spawn(move || -> Result<(), Error> {
            while !stop.load(Ordering::Acquire) {
                if relay(&engine, &mut output)? == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            Ok(())
        })
    };
    let consumed = consume(&engine, &input, progress);
    stop.store(true, Ordering::Release);
    let relayed = relay_thread
        .join()
        .map_err(|_| "the relay thread panicked")?;
    consumed?;
    relayed?;
    // Make the last completions durable (Buffered), then publish what they emitted.
    engine.flush()?;
    relay(&engine, &mut open_output(dir)?)?;
    engine.close()?;
    Ok(())
}

/// What the files say after a run, checked against the input.
#[derive(Debug, Default)]
pub struct Report {
    pub distinct: usize,
    pub published_lines: usize,
    pub republished: usize,
}

/// Checks the exactly-once promises: every balance is the sum over the distinct payments of
/// its account, every payment was applied once, every payment's confirmation was recorded
/// under exactly one outbox id and published at least once, and nothing is left pending.
pub fn verify(dir: &Path, durability: Durability) -> Result<Report, Error> {
    let input = read_input(&dir.join(INPUT))?;
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let mut distinct = BTreeSet::new();
    for p in &input {
        if distinct.insert(p.id.clone()) {
            *expected.entry(p.account.clone()).or_default() += p.amount;
        }
    }
    let engine = open_engine(dir, durability)?;
    for (account, sum) in &expected {
        let balance = read_u64(&engine, BALANCES, account.as_bytes())?;
        if balance != *sum {
            return Err(format!("{account}: balance {balance}, expected {sum}").into());
        }
    }
    for id in &distinct {
        let times = read_u64(&engine, APPLIED, id.as_bytes())?;
        if times != 1 {
            return Err(format!("{id} was applied {times} times").into());
        }
    }
    if !engine.outbox().pending(1)?.is_empty() {
        return Err("confirmations are still pending".into());
    }
    engine.close()?;
    // Outbox ids per payment, from the published lines (a line cut by a kill is ignored).
    let text = std::fs::read_to_string(dir.join(OUTPUT))?;
    let mut ids: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut lines = 0;
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [outbox_id, payment, _, _] = parts.as_slice() else {
            return Err(format!("bad output line {line:?}").into());
        };
        ids.entry(payment.to_string())
            .or_default()
            .insert(outbox_id.parse()?);
        lines += 1;
    }
    for id in &distinct {
        match ids.get(id).map(BTreeSet::len) {
            Some(1) => {}
            None => return Err(format!("{id}: no confirmation was published").into()),
            Some(n) => return Err(format!("{id}: {n} confirmations were recorded").into()),
        }
    }
    if ids.len() != distinct.len() {
        return Err("a confirmation names a payment that is not in the input".into());
    }
    Ok(Report {
        distinct: distinct.len(),
        published_lines: lines,
        republished: lines - distinct.len(),
    })
}

fn main() -> Result<(), Error> {
    let mut dir = std::env::temp_dir().join("idemkv-outbox-demo");
    let mut messages = 300u64;
    let mut durability = Durability::Immediate;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--dir" => dir = PathBuf::from(value()?),
            "--messages" => messages = value()?.parse()?,
            "--mode" => {
                durability = match value()?.as_str() {
                    "immediate" => Durability::Immediate,
                    "buffered" => Durability::buffered(),
                    other => return Err(format!("unknown mode {other:?}").into()),
                }
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    std::fs::create_dir_all(&dir)?;
    if !dir.join(INPUT).exists() {
        generate_input(&dir.join(INPUT), messages, 42)?;
    }
    println!(
        "consuming {} (mode {durability:?})",
        dir.join(INPUT).display()
    );
    run(&dir, durability, |_| {})?;
    let report = verify(&dir, durability)?;
    println!(
        "ok: {} payments applied once each; {} confirmations published ({} again after a crash)",
        report.distinct, report.published_lines, report.republished
    );
    Ok(())
}
