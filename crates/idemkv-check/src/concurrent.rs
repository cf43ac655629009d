//! `concurrent_claims`: per-thread scripts of calls on a few shared keys, run concurrently,
//! recorded, and checked by [`crate::history::check`] (per-key linearizability against the
//! spec, global token order).
//!
//! The same scripts run two ways:
//! - under shuttle (feature `shuttle`), with [`ByteScheduler`] taking every scheduling
//!   decision from bytes, so a failing interleaving replays from its bytes
//!   ([`check_under_shuttle`]); the engine runs with `Durability::None` (the writer thread
//!   and its crossbeam channel are outside what shuttle can schedule);
//! - on real threads with real parking_lot and crossbeam, in every durability mode
//!   ([`crate::stress`]).
//!
//! Scripts obey one rule so that every run ends: a thread calls `claim_or_wait` only while
//! it holds no lease, and every thread releases what it holds at the end of its script.
//! A waiter therefore always has a holder that will settle the key without blocking.

use crate::history::{self, Event, Recorder, Summary};
use crate::ops::FpSel;
use crate::spec::{self, ns, KeyOp, KeyRet, KeySpec, SpecConfig};
use crate::Bug;
use arbitrary::{Arbitrary, Unstructured};
use idemkv::{ClaimOptions, Clock, Durability, Engine, EngineBuilder, MockClock};
use std::collections::BTreeMap;
use std::time::Duration;

/// Keys the scripts share.
pub const KEYS: u8 = 2;
/// Most threads in a scenario.
pub const THREADS_MAX: usize = 4;
/// Fewest threads in a scenario.
pub const THREADS_MIN: usize = 2;
/// Most steps in one thread's script.
pub const STEPS_MAX: usize = 6;
/// The engine's default lease in these runs.
pub const LEASE: Duration = Duration::from_millis(20);
/// A lease that outlives every run.
pub const LONG_LEASE: Duration = Duration::from_secs(3600);
/// Retention in these runs.
pub const RETENTION: Duration = Duration::from_secs(3600);
/// How long `claim_or_wait` waits (the mock clock never gets there unless a script moves it).
pub const WAIT: Duration = Duration::from_secs(10 * 3600);

/// One step of a thread's script.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub enum Step {
    /// `claim` with a zero or a long lease (or `claim_or_wait`, when the thread holds no
    /// lease).
    Claim {
        /// Key (mod [`KEYS`]).
        key: u8,
        /// Long lease (otherwise zero: the next claim may take over at once).
        long: bool,
        /// Fingerprint.
        fingerprint: FpSel,
        /// Use `claim_or_wait`.
        wait: bool,
    },
    /// `complete` with one of the thread's tokens for the key.
    Complete {
        /// Key.
        key: u8,
        /// Which of the thread's tokens (0 = latest).
        which: u8,
        /// Response byte.
        response: u8,
    },
    /// `release` with one of the thread's tokens.
    Release {
        /// Key.
        key: u8,
        /// Which token.
        which: u8,
    },
    /// `extend` with one of the thread's tokens.
    Extend {
        /// Key.
        key: u8,
        /// Which token.
        which: u8,
        /// Long lease (otherwise zero).
        long: bool,
    },
    /// `checkpoint` with one of the thread's tokens.
    Checkpoint {
        /// Key.
        key: u8,
        /// Which token.
        which: u8,
        /// Phase.
        phase: u8,
    },
    /// `get`.
    Get {
        /// Key.
        key: u8,
    },
    /// Move the mock clock: 1 ms, past the default lease, or past retention.
    Advance {
        /// Which step.
        by: u8,
    },
}

/// One thread's script.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub struct Script {
    /// Its steps.
    pub steps: Vec<Step>,
}

/// The threads of one concurrent run.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub struct Scenario {
    /// One script per thread.
    pub threads: Vec<Script>,
}

impl Scenario {
    /// The scenario clamped to [`THREADS_MIN`]..=[`THREADS_MAX`] threads of at most
    /// [`STEPS_MAX`] steps (missing threads get one claim, so there is always a race).
    pub fn normalized(&self) -> Scenario {
        let mut threads: Vec<Script> = self.threads.iter().take(THREADS_MAX).cloned().collect();
        while threads.len() < THREADS_MIN {
            threads.push(Script {
                steps: vec![Step::Claim {
                    key: 0,
                    long: true,
                    fingerprint: FpSel(0),
                    wait: false,
                }],
            });
        }
        for t in &mut threads {
            t.steps.truncate(STEPS_MAX);
        }
        Scenario { threads }
    }

    /// A scenario from bytes (see [`Scenario::normalized`]).
    pub fn from_bytes(u: &mut Unstructured<'_>) -> arbitrary::Result<Scenario> {
        Ok(Scenario::arbitrary(u)?.normalized())
    }
}

impl Step {
    fn advance(by: u8) -> Duration {
        match by % 3 {
            0 => Duration::from_millis(1),
            1 => Duration::from_millis(30),
            _ => Duration::from_secs(2 * 3600),
        }
    }
}

/// The spec configuration of these runs in `mode`.
pub fn spec_config(mode: Durability) -> SpecConfig {
    SpecConfig {
        durability: mode,
        lease_ns: ns(LEASE),
        retention_ns: ns(RETENTION),
        response_len_max: 1 << 20,
        checkpoint_len_max: 64 << 10,
        check_wall: false,
        marker_retention_ns: None,
    }
}

/// The engine builder of these runs.
pub fn builder(mode: Durability, clock: &MockClock) -> EngineBuilder {
    Engine::builder()
        .durability(mode)
        .clock(clock.clone())
        .lease(LEASE)
        .retention(RETENTION)
}

/// The spec's starting state for every key, with `clock` as the engine saw it at open.
pub fn initial(clock: &MockClock) -> KeySpec {
    KeySpec::at_wall_ns(ns(clock.monotonic()), crate::wall_ns(clock.wall()))
}

/// Runs one thread's script, recording every call. A claim's lease is dropped unsettled at
/// once (it keeps its key; the script settles keys by token).
/// `prefix` names the keys (`{prefix}k{n}`); `allow_advance` turns clock steps into `get`s
/// when false.
pub fn run_script(
    engine: &Engine,
    clock: &MockClock,
    rec: &Recorder,
    thread: usize,
    script: &Script,
    prefix: &str,
    allow_advance: bool,
) {
    // Tokens this thread got per key, and the ones it still holds.
    let mut mine: BTreeMap<u8, Vec<u64>> = BTreeMap::new();
    let mut held: Vec<(u8, u64)> = Vec::new();
    let name = |k: u8| format!("{prefix}k{}", k % KEYS).into_bytes();
    let pick = |mine: &BTreeMap<u8, Vec<u64>>, k: u8, which: u8| -> u64 {
        match mine.get(&(k % KEYS)) {
            Some(list) if !list.is_empty() => {
                list[list.len() - 1 - usize::from(which) % list.len()]
            }
            _ => 0,
        }
    };
    for step in &script.steps {
        match *step {
            Step::Claim {
                key,
                long,
                fingerprint,
                wait,
            } => {
                let k = name(key);
                let lease = if long { LONG_LEASE } else { Duration::ZERO };
                let mut opts = ClaimOptions::default().lease(lease).wait(WAIT);
                if let Some(fp) = fingerprint.fingerprint() {
                    opts = opts.fingerprint(fp);
                }
                let wait = wait && held.is_empty();
                let op = KeyOp::Claim {
                    fingerprint: fingerprint.fingerprint(),
                    lease_ns: Some(ns(lease)),
                    wait,
                    retention_ms: None,
                };
                let ret = rec.call(thread, Some(&k), op, || {
                    let r = if wait {
                        engine.claim_or_wait(&k, &opts)
                    } else {
                        engine.claim(&k, &opts)
                    };
                    spec::claim_ret(r)
                });
                if let KeyRet::Acquired { token, .. } = ret {
                    mine.entry(key % KEYS).or_default().push(token);
                    held.push((key % KEYS, token));
                }
            }
            Step::Complete {
                key,
                which,
                response,
            } => {
                let k = name(key);
                let token = pick(&mine, key, which);
                let response = vec![response; 3];
                let op = KeyOp::Complete {
                    token,
                    response: response.clone(),
                    retention_ms: None,
                };
                rec.call(thread, Some(&k), op, || {
                    spec::unit_ret(engine.complete(&k, token, &response))
                });
                held.retain(|&(hk, ht)| !(hk == key % KEYS && ht == token));
            }
            Step::Release { key, which } => {
                let k = name(key);
                let token = pick(&mine, key, which);
                rec.call(thread, Some(&k), KeyOp::Release { token }, || {
                    spec::release_ret(engine.release(&k, token))
                });
                held.retain(|&(hk, ht)| !(hk == key % KEYS && ht == token));
            }
            Step::Extend { key, which, long } => {
                let k = name(key);
                let token = pick(&mine, key, which);
                let d = if long { LONG_LEASE } else { Duration::ZERO };
                let op = KeyOp::Extend {
                    token,
                    lease_ns: ns(d),
                };
                rec.call(thread, Some(&k), op, || {
                    spec::unit_ret(engine.extend(&k, token, d))
                });
            }
            Step::Checkpoint { key, which, phase } => {
                let k = name(key);
                let token = pick(&mine, key, which);
                let data = vec![phase; 2];
                let op = KeyOp::Checkpoint {
                    token,
                    phase: u32::from(phase),
                    data: data.clone(),
                };
                rec.call(thread, Some(&k), op, || {
                    spec::unit_ret(engine.checkpoint(&k, token, u32::from(phase), &data))
                });
            }
            Step::Advance { by } if allow_advance => {
                let d = Step::advance(by);
                rec.call(thread, None, KeyOp::Advance { ns: ns(d) }, || {
                    clock.advance(d);
                    KeyRet::Done
                });
            }
            Step::Get { key } | Step::Advance { by: key } => {
                let k = name(key);
                rec.call(thread, Some(&k), KeyOp::Get, || {
                    spec::get_ret(engine.get(&k))
                });
            }
        }
    }
    // Settle everything still held, so that waiters on other threads finish.
    for (key, token) in held {
        let k = name(key);
        rec.call(thread, Some(&k), KeyOp::Release { token }, || {
            spec::release_ret(engine.release(&k, token))
        });
    }
}

/// Checks a recorded run of these scripts.
pub fn check_events(mode: Durability, init: &KeySpec, events: &[Event]) -> Result<Summary, String> {
    history::check(&spec_config(mode), init, events).map_err(|v| v.0)
}

/// Parses a sabotage name (`none`, `check-then-act`, `no-fencing`, `ack-before-commit`,
/// `publish-before-commit`, `skip-token-hwm`, `drop-old-removal`, `skip-replay-checksum`,
/// `skip-applier-drain`),
/// as the fuzz targets read it from `IDEMKV_SABOTAGE`.
pub fn bug_from_name(name: &str) -> Option<Bug> {
    match name {
        "" | "none" => Some(Bug::None),
        "check-then-act" | "CheckThenAct" => Some(Bug::CheckThenAct),
        "no-fencing" | "NoFencing" => Some(Bug::NoFencing),
        "ack-before-commit" | "AckBeforeCommit" => Some(Bug::AckBeforeCommit),
        "publish-before-commit" | "PublishBeforeCommit" => Some(Bug::PublishBeforeCommit),
        "skip-token-hwm" | "SkipTokenHwm" => Some(Bug::SkipTokenHwm),
        "drop-old-removal" | "DropOldRemoval" => Some(Bug::DropOldRemoval),
        "skip-replay-checksum" | "SkipReplayChecksum" => Some(Bug::SkipReplayChecksum),
        "skip-applier-drain" | "SkipApplierDrain" => Some(Bug::SkipApplierDrain),
        _ => None,
    }
}

/// The sabotage named by the environment variable `IDEMKV_SABOTAGE` (none if unset).
pub fn bug_from_env() -> Bug {
    match std::env::var("IDEMKV_SABOTAGE") {
        Ok(name) => match bug_from_name(&name) {
            Some(bug) => bug,
            None => panic!("IDEMKV_SABOTAGE={name:?}: not a sabotage name (see bug_from_name)"),
        },
        Err(_) => Bug::None,
    }
}

#[cfg(shuttle)]
pub use self::under_shuttle::{check_under_shuttle, ByteScheduler};

#[cfg(shuttle)]
mod under_shuttle {
    use super::*;
    use shuttle::scheduler::{Schedule, Scheduler, Task, TaskId};
    use std::sync::{Arc, Mutex, PoisonError};

    /// A shuttle scheduler that takes every decision from a byte string, so a run replays
    /// from its bytes. At each point where more than one thread can run it reads one byte:
    /// below 0x80 the current thread keeps running (if it can and is not yielding);
    /// otherwise the low seven bits pick a runnable thread. When the bytes run out, the
    /// current thread keeps running (then the lowest-numbered runnable one).
    #[derive(Debug, Clone)]
    pub struct ByteScheduler {
        bytes: Vec<u8>,
        pos: usize,
        started: bool,
        decisions: usize,
    }

    impl ByteScheduler {
        /// A scheduler for one execution driven by `bytes`.
        pub fn new(bytes: &[u8]) -> Self {
            Self {
                bytes: bytes.to_vec(),
                pos: 0,
                started: false,
                decisions: 0,
            }
        }

        fn byte(&mut self) -> Option<u8> {
            let b = self.bytes.get(self.pos).copied();
            self.pos += 1;
            b
        }
    }

    impl Scheduler for ByteScheduler {
        fn new_execution(&mut self) -> Option<Schedule> {
            if self.started {
                return None;
            }
            self.started = true;
            self.pos = 0;
            Some(Schedule::new(0))
        }

        fn next_task(
            &mut self,
            runnable: &[&Task],
            current: Option<TaskId>,
            is_yielding: bool,
        ) -> Option<TaskId> {
            let first = runnable.first()?.id();
            if runnable.len() == 1 {
                return Some(first);
            }
            self.decisions += 1;
            let cur = current.filter(|c| runnable.iter().any(|t| t.id() == *c));
            match self.byte() {
                Some(b) if b < 0x80 && !is_yielding => cur.or(Some(first)),
                Some(b) => Some(runnable[usize::from(b & 0x7f) % runnable.len()].id()),
                None if is_yielding => {
                    // Run someone else, or a spinning thread would never let go.
                    let next = runnable.iter().map(|t| t.id()).find(|t| Some(*t) != cur);
                    next.or(Some(first))
                }
                None => cur.or(Some(first)),
            }
        }

        fn next_u64(&mut self) -> u64 {
            let mut v = 0u64;
            for _ in 0..8 {
                v = (v << 8) | u64::from(self.byte().unwrap_or(0));
            }
            v
        }
    }

    type Hook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

    /// Puts a panic hook back when dropped.
    struct RestoreHook(Option<Hook>);

    impl Drop for RestoreHook {
        fn drop(&mut self) {
            if let Some(hook) = self.0.take() {
                std::panic::set_hook(hook);
            }
        }
    }

    /// Runs `scenario` once under shuttle, scheduled by `schedule`, against an engine with
    /// `bug` switched on, and checks the history. A panic inside the run (a deadlock, a
    /// failed assertion in the engine) propagates; an incorrect history is an `Err`.
    pub fn check_under_shuttle(
        scenario: &Scenario,
        schedule: &[u8],
        bug: Bug,
    ) -> Result<Summary, String> {
        let scenario = Arc::new(scenario.normalized());
        type Out = Arc<Mutex<Option<(KeySpec, Vec<Event>)>>>;
        let out: Out = Arc::new(Mutex::new(None));
        let out2 = out.clone();
        let mut config = shuttle::Config::new();
        config.stack_size = 1 << 20;
        config.failure_persistence = shuttle::FailurePersistence::None;
        config.max_steps = shuttle::MaxSteps::FailAfter(200_000);
        config.silence_warnings = true;
        let runner = shuttle::Runner::new(ByteScheduler::new(schedule), config);
        // Shuttle installs a panic hook of its own; put the caller's back afterwards, so that
        // a panic outside an execution (a violation reported by the caller) prints normally.
        let _restore = RestoreHook(Some(std::panic::take_hook()));
        runner.run(move || {
            let clock = MockClock::new();
            // One stripe (the stripe hash is seeded at random, which would make a replay
            // differ) and no sweeper thread (a real thread cannot touch shuttle's locks).
            let engine = match builder(Durability::None, &clock)
                .tuning(idemkv::Tuning::default().stripes(1).sweep_interval(None))
                .open()
            {
                Ok(e) => e,
                Err(e) => panic!("open failed: {e}"),
            };
            crate::sabotage(&engine, bug);
            let init = initial(&clock);
            let rec = Arc::new(Recorder::new());
            let handles: Vec<_> = scenario
                .threads
                .iter()
                .enumerate()
                .map(|(i, script)| {
                    let engine = engine.clone();
                    let clock = clock.clone();
                    let rec = rec.clone();
                    let script = script.clone();
                    shuttle::thread::spawn(move || {
                        run_script(&engine, &clock, &rec, i, &script, "", true)
                    })
                })
                .collect();
            for h in handles {
                if h.join().is_err() {
                    panic!("a script thread panicked");
                }
            }
            let _ = engine.close();
            *out2.lock().unwrap_or_else(PoisonError::into_inner) = Some((init, rec.events()));
        });
        let taken = out.lock().unwrap_or_else(PoisonError::into_inner).take();
        let Some((init, events)) = taken else {
            return Err("the shuttle run produced no history".into());
        };
        check_events(Durability::None, &init, &events)
    }
}
