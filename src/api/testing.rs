//! Duplicate deliveries for users' own tests: run your handler as N concurrent copies of the
//! same message against an engine, the way duplicates arrive in production, and count how many
//! times its side effect ran.
//!
//! ```
//! use idemkv::testing::{duplicates, Pattern};
//! use idemkv::{Durability, Engine};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//!
//! let engine = Engine::builder().durability(Durability::None).open()?;
//! let charges = AtomicUsize::new(0); // your database, say
//!
//! let report = duplicates(&engine, b"order-42")
//!     .copies(8)
//!     .pattern(Pattern::RedeliveryWhileWorking)
//!     .run(|_lease| {
//!         charges.fetch_add(1, Ordering::SeqCst); // the side effect
//!         Ok::<_, std::io::Error>(b"charged".to_vec())
//!     });
//!
//! assert_eq!(report.side_effects(), 1);          // the handler ran once...
//! assert_eq!(charges.load(Ordering::SeqCst), 1); // ...and your database agrees
//! assert!(report.all_got(b"charged"));           // every copy got the same answer
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Pattern::Rebalance`] shows the other half of the contract: when a consumer loses its
//! lease while it still works, a second copy takes over and its handler runs too (so
//! `side_effects()` is 2), and the first copy's completion is refused with `LeaseLost`.
//! Exactly-once effects then need the lease's fencing token downstream: write
//! `lease.token()` with the effect and refuse a write whose token is lower than the one
//! stored; `committed()` counts the completions the engine accepted (always at most one).

use crate::{ClaimOptions, Engine, Lease, RunError};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How the copies of the message arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pattern {
    /// Every copy at the same instant (released together from a barrier): a retry storm,
    /// or a consumer group that redelivers a batch to several consumers at once.
    RetryStorm,
    /// The first copy starts; the others arrive while its handler is still working (a
    /// visibility timeout expired, a deploy rolled); the first finishes only once they are
    /// all waiting or done.
    RedeliveryWhileWorking,
    /// The first copy's consumer loses its lease while it works (a consumer-group
    /// rebalance: its claim is made with a zero lease); the second copy takes over and runs
    /// to the end before the first one tries to complete; the rest arrive after.
    Rebalance,
}

/// What happened to one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CopyOutcome {
    /// Its handler ran and its response was stored.
    Ran {
        /// The stored response.
        response: Vec<u8>,
        /// The token it ran under.
        token: u64,
    },
    /// It received the stored response of another copy.
    Replayed {
        /// The stored response.
        response: Vec<u8>,
    },
    /// It did not produce an outcome (its handler failed, its lease was lost, it waited too
    /// long); the text says which.
    Failed(String),
}

/// What [`Duplicates::run`] observed.
#[derive(Debug, Clone)]
pub struct DuplicateReport {
    side_effects: usize,
    outcomes: Vec<CopyOutcome>,
    pattern: Pattern,
}

impl DuplicateReport {
    /// How many times the handler ran (started), over all copies.
    pub fn side_effects(&self) -> usize {
        self.side_effects
    }

    /// How many copies had their handler's response stored (at most one for a key).
    pub fn committed(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(o, CopyOutcome::Ran { .. }))
            .count()
    }

    /// Each copy's outcome, in copy order (copy 0 arrived first).
    pub fn outcomes(&self) -> &[CopyOutcome] {
        &self.outcomes
    }

    /// True if every copy got `response` (stored or replayed).
    pub fn all_got(&self, response: &[u8]) -> bool {
        self.outcomes.iter().all(|o| match o {
            CopyOutcome::Ran { response: r, .. } | CopyOutcome::Replayed { response: r } => {
                r == response
            }
            CopyOutcome::Failed(_) => false,
        })
    }

    /// The pattern that was run.
    pub fn pattern(&self) -> Pattern {
        self.pattern
    }
}

impl fmt::Display for DuplicateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:?}: {} copies, handler ran {} time(s), {} response(s) stored",
            self.pattern,
            self.outcomes.len(),
            self.side_effects,
            self.committed()
        )?;
        for (i, o) in self.outcomes.iter().enumerate() {
            writeln!(f, "  copy {i}: {o:?}")?;
        }
        Ok(())
    }
}

/// Builder of a duplicate-delivery run; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Duplicates<'a> {
    engine: &'a Engine,
    key: Vec<u8>,
    copies: usize,
    pattern: Pattern,
    opts: ClaimOptions,
    settle: Duration,
}

/// Starts a duplicate-delivery run of the message with idempotency key `key`: by default 2
/// copies, [`Pattern::RetryStorm`], `ClaimOptions::default()` with a 30 s wait.
pub fn duplicates<'a>(engine: &'a Engine, key: &[u8]) -> Duplicates<'a> {
    Duplicates {
        engine,
        key: key.to_vec(),
        copies: 2,
        pattern: Pattern::RetryStorm,
        opts: ClaimOptions::default().wait(Duration::from_secs(30)),
        settle: Duration::from_millis(200),
    }
}

/// Signals between the copies of [`Pattern::RedeliveryWhileWorking`] and
/// [`Pattern::Rebalance`].
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, bool)>, // (first copy is working, first copy may finish)
    cond: Condvar,
}

impl Gate {
    fn set(&self, f: impl FnOnce(&mut (bool, bool))) {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        self.cond.notify_all();
    }

    /// Waits until `ready` holds or `timeout` passes.
    fn wait(&self, timeout: Duration, ready: impl Fn(&(bool, bool)) -> bool) {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while !ready(&s) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            s = self
                .cond
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl<'a> Duplicates<'a> {
    /// Number of copies (at least 1).
    pub fn copies(mut self, copies: usize) -> Self {
        self.copies = copies.max(1);
        self
    }

    /// How the copies arrive.
    pub fn pattern(mut self, pattern: Pattern) -> Self {
        self.pattern = pattern;
        self
    }

    /// The claim options every copy uses (give a `wait` long enough for your handler).
    pub fn options(mut self, opts: ClaimOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Under [`Pattern::RedeliveryWhileWorking`], the longest the first copy is held once
    /// the others were started, if they neither finish nor start waiting (default 200 ms).
    pub fn settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// Delivers the copies, each through [`Engine::run`] with `handler`, and reports.
    pub fn run<E, F>(self, handler: F) -> DuplicateReport
    where
        F: Fn(&Lease) -> Result<Vec<u8>, E> + Sync,
        E: fmt::Debug,
    {
        let runs = AtomicUsize::new(0);
        let gate = Gate::default();
        let copies = self.copies;
        let deliver = |copy: usize, opts: &ClaimOptions| -> CopyOutcome {
            let wrapped = |lease: &Lease| {
                runs.fetch_add(1, Ordering::SeqCst);
                let result = handler(lease);
                if copy == 0 && self.pattern != Pattern::RetryStorm {
                    // The side effect is done but not yet acknowledged: let the others
                    // arrive, then finish.
                    gate.set(|s| s.0 = true);
                    gate.wait(Duration::from_secs(60), |s| s.1);
                }
                result
            };
            copy_outcome(self.engine.run(&self.key, opts, wrapped))
        };
        let mut outcomes: Vec<Option<CopyOutcome>> = vec![None; copies];
        let barrier = Barrier::new(copies);
        let first_opts = match self.pattern {
            Pattern::Rebalance => self.opts.clone().lease(Duration::ZERO),
            _ => self.opts.clone(),
        };
        std::thread::scope(|scope| match self.pattern {
            Pattern::RetryStorm => {
                let handles: Vec<_> = (0..copies)
                    .map(|i| {
                        let (barrier, deliver, opts) = (&barrier, &deliver, &self.opts);
                        scope.spawn(move || {
                            barrier.wait();
                            deliver(i, opts)
                        })
                    })
                    .collect();
                for (i, h) in handles.into_iter().enumerate() {
                    outcomes[i] = Some(joined(h));
                }
            }
            Pattern::RedeliveryWhileWorking | Pattern::Rebalance => {
                let first = {
                    let (deliver, opts) = (&deliver, &first_opts);
                    scope.spawn(move || deliver(0, opts))
                };
                // Wait for the first copy to be inside its handler (or done without it).
                gate.wait(Duration::from_secs(60), |s| s.0 || first.is_finished());
                let waits_before = self.engine.stats().waits;
                let mut rest = Vec::new();
                if self.pattern == Pattern::Rebalance && copies > 1 {
                    // The second copy takes over and finishes while the first still works.
                    let (deliver, opts) = (&deliver, &self.opts);
                    let second = scope.spawn(move || deliver(1, opts));
                    outcomes[1] = Some(joined(second));
                    gate.set(|s| s.1 = true);
                } else {
                    for i in 1..copies {
                        let (deliver, opts) = (&deliver, &self.opts);
                        rest.push((i, scope.spawn(move || deliver(i, opts))));
                    }
                    self.let_others_arrive(waits_before, || {
                        rest.iter().filter(|(_, h)| h.is_finished()).count() as u64
                    });
                    gate.set(|s| s.1 = true);
                }
                outcomes[0] = Some(joined(first));
                if self.pattern == Pattern::Rebalance {
                    for i in 2..copies {
                        let (deliver, opts) = (&deliver, &self.opts);
                        rest.push((i, scope.spawn(move || deliver(i, opts))));
                    }
                }
                for (i, h) in rest {
                    outcomes[i] = Some(joined(h));
                }
            }
        });
        DuplicateReport {
            side_effects: runs.load(Ordering::SeqCst),
            outcomes: outcomes
                .into_iter()
                .map(|o| o.unwrap_or_else(|| CopyOutcome::Failed("not delivered".into())))
                .collect(),
            pattern: self.pattern,
        }
    }

    /// Lets the copies after the first arrive: waits until each of them waits for the key
    /// (counted by the engine since `waits_before`) or has finished (`finished` counts
    /// them), at most the settle time.
    fn let_others_arrive(&self, waits_before: u64, finished: impl Fn() -> u64) {
        let deadline = Instant::now() + self.settle;
        while Instant::now() < deadline {
            let waiting = self.engine.stats().waits.saturating_sub(waits_before);
            if waiting + finished() >= (self.copies as u64).saturating_sub(1) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// What one copy's delivery came to.
fn copy_outcome<E: fmt::Debug>(result: Result<crate::Outcome, RunError<E>>) -> CopyOutcome {
    match result {
        Ok(out) if out.replayed() => CopyOutcome::Replayed {
            response: out.response().to_vec(),
        },
        Ok(out) => CopyOutcome::Ran {
            response: out.response().to_vec(),
            token: out.token(),
        },
        Err(RunError::Handler(e)) => CopyOutcome::Failed(format!("handler failed: {e:?}")),
        Err(e) => CopyOutcome::Failed(match e {
            RunError::Claim(c) => format!("claim failed: {c}"),
            RunError::Lease(l) => format!("completion refused: {l}"),
            RunError::StillInProgress { retry_after } => {
                format!("still in progress (retry after {retry_after:?})")
            }
            RunError::Codec(c) => format!("codec: {c}"),
            RunError::Handler(_) => unreachable!("matched above"),
            #[allow(unreachable_patterns)]
            _ => "failed".to_string(),
        }),
    }
}

/// The outcome of a copy's thread (a panic is a failure).
fn joined(handle: std::thread::ScopedJoinHandle<'_, CopyOutcome>) -> CopyOutcome {
    handle
        .join()
        .unwrap_or_else(|_| CopyOutcome::Failed("panicked".into()))
}
