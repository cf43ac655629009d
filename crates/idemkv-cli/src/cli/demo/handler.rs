//! The two ways of handling a delivery, and the consumer threads that run one over the plan:
//! the naive check-then-act handler, and the same work and charge inside `Engine::run`.

use super::accounting::{summarize, Charge, ColumnResult, Ledger, ThreadOut, WrongResponse};
use super::workload::{key_of, Broker, Delivery, Plan};
use super::{Column, DemoArgs};
use crate::cli::error::CliError;
use crate::cli::output;
use idemkv::{ClaimError, ClaimOptions, Engine, LeaseError, RunError};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Pause before a consumer retries a delivery the engine asked to retry later.
const RETRY_BACKOFF: Duration = Duration::from_millis(1);
/// Most retries of one delivery before the demo gives up on the engine.
const RETRIES_MAX: u32 = 1_000;

/// How a consumer handles a delivery.
pub(super) enum Handler<'e> {
    /// Check a processed-set, work, charge, then record: the race.
    Naive(Mutex<HashSet<u32>>),
    /// The same work and charge inside `Engine::run`.
    Guarded(&'e Engine),
}

impl Handler<'_> {
    pub(super) fn naive(messages: u32) -> Self {
        Handler::Naive(Mutex::new(HashSet::with_capacity(messages as usize)))
    }
}

/// The response a charge returns: what every copy of the message must get back.
fn receipt(msg: u32, amount_cents: u32, token: u64) -> Vec<u8> {
    format!(
        "receipt {}: charged {}.{:02} (token {token})",
        key_of(msg),
        amount_cents / 100,
        amount_cents % 100
    )
    .into_bytes()
}

fn progress_bar(args: &DemoArgs, label: &str, len: u64) -> ProgressBar {
    if args.no_progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{prefix:>16} [{bar:32}] {human_pos}/{human_len} deliveries  {msg:>10}  eta {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_prefix(label.to_string());
    pb
}

/// Delivers the whole plan through `handler` with `args.threads` consumers.
pub(super) fn run_column(
    plan: &Plan,
    args: &DemoArgs,
    column: Column,
    handler: Handler<'_>,
) -> Result<ColumnResult, CliError> {
    let ledger = Ledger::new(plan.messages.len());
    let broker = Broker::new(plan);
    let done = AtomicU64::new(0);
    let finished = AtomicBool::new(false);
    let pb = progress_bar(args, column.heading(), plan.deliveries);
    let started = Instant::now();

    let joined: Result<Vec<ThreadOut>, CliError> = std::thread::scope(|s| {
        let ticker = s.spawn(|| {
            while !finished.load(Ordering::Acquire) {
                let n = done.load(Ordering::Relaxed);
                pb.set_message(output::rate(n, started.elapsed()));
                pb.set_position(n);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let mut handles = Vec::new();
        let mut spawn_error = None;
        for t in 0..args.threads {
            let (broker, ledger, done, handler) = (&broker, &ledger, &done, &handler);
            let spawned = std::thread::Builder::new()
                .name(format!("consumer-{t}"))
                .spawn_scoped(s, move || {
                    let out = consume(t, plan, broker, handler, ledger, done, started);
                    if out.is_err() {
                        broker.stop();
                    }
                    out
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    broker.stop();
                    spawn_error = Some(CliError::io("starting consumer threads", e));
                    break;
                }
            }
        }
        let mut outs = Vec::new();
        let mut first_error = spawn_error;
        for h in handles {
            match h.join() {
                Ok(Ok(out)) => outs.push(out),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error
                        .get_or_insert(CliError::io("a consumer thread", "panicked (see above)"));
                }
            }
        }
        finished.store(true, Ordering::Release);
        let _ = ticker.join();
        match first_error {
            Some(e) => Err(e),
            None => Ok(outs),
        }
    });
    let elapsed = started.elapsed();
    pb.finish_and_clear();
    let outs = joined?;
    Ok(summarize(plan, column, ledger, outs, elapsed))
}

/// One consumer: takes deliveries until the broker runs dry.
fn consume(
    thread: u32,
    plan: &Plan,
    broker: &Broker<'_>,
    handler: &Handler<'_>,
    ledger: &Ledger,
    done: &AtomicU64,
    started: Instant,
) -> Result<ThreadOut, CliError> {
    let mut out = ThreadOut::default();
    while let Some(Delivery { msg, copy }) = broker.next() {
        let m = &plan.messages[msg as usize];
        let t0 = Instant::now();
        match handler {
            Handler::Naive(processed) => {
                // Check ...
                let seen = processed.lock().contains(&msg);
                if seen {
                    out.absorbed += 1;
                } else {
                    // ... then act: another copy can pass the same check meanwhile.
                    std::thread::sleep(m.work);
                    ledger.charge(None, msg);
                    processed.lock().insert(msg);
                }
            }
            Handler::Guarded(engine) => {
                let key = key_of(msg);
                let payload = format!("charge {} to the card of payment {msg}", m.amount_cents);
                let opts = ClaimOptions::default().payload(payload.as_bytes());
                let mut tries = 0u32;
                loop {
                    tries += 1;
                    if tries > RETRIES_MAX {
                        return Err(CliError::io(
                            format!("idemkv failed on {key} during the demo"),
                            format!("no outcome after {RETRIES_MAX} retries"),
                        ));
                    }
                    let result = engine.run(key.as_bytes(), &opts, |lease| {
                        let start = started.elapsed();
                        std::thread::sleep(m.work);
                        let charge = Charge {
                            msg,
                            copy,
                            token: lease.token(),
                            attempt: lease.attempt(),
                            thread,
                            start,
                            end: started.elapsed(),
                        };
                        ledger.charge(Some(charge), msg);
                        Ok::<_, Infallible>(receipt(msg, m.amount_cents, lease.token()))
                    });
                    match result {
                        Ok(outcome) => {
                            if outcome.replayed() {
                                out.absorbed += 1;
                            }
                            let winner = ledger.winner(msg);
                            if outcome.token() != winner
                                || outcome.response() != receipt(msg, m.amount_cents, winner)
                            {
                                out.wrong.push(WrongResponse {
                                    msg,
                                    winner,
                                    got_token: outcome.token(),
                                    got: outcome.response().to_vec(),
                                });
                            }
                            break;
                        }
                        // Back-pressure: the engine refused before doing anything. Retry,
                        // as a queue consumer would after a nack.
                        Err(RunError::StillInProgress { .. })
                        | Err(RunError::Claim(ClaimError::Overloaded(_))) => {
                            out.retries += 1;
                            std::thread::sleep(RETRY_BACKOFF);
                        }
                        // The handler ran (the card was charged) but another token owns the
                        // key now. Not fatal to the demo: it is evidence, and the ledger will
                        // show the double charge. A real consumer would see the delivery fail
                        // and get it again, so retry.
                        Err(RunError::Lease(LeaseError::LeaseLost)) => {
                            out.lease_lost += 1;
                            out.retries += 1;
                        }
                        Err(e) => {
                            return Err(CliError::io(
                                format!("idemkv failed on {key} during the demo"),
                                e,
                            ))
                        }
                    }
                }
            }
        }
        out.latencies_ns.push(t0.elapsed().as_nanos() as u64);
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(out)
}
