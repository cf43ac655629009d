//! One contract, two backends: seeded histories of calls run against the file engine and
//! against the shared backend (feature `postgres`, docs/shared.md), and every answer and
//! the final state of every key must agree (docs/testing.md, "The differential suite").
//!
//! Time is controlled on both sides, never waited for. The file engine reads a
//! `MockClock`. The shared backend decides leases and retention on the database's clock:
//! every statement reads it through an unqualified `clock_timestamp()`, and this suite's
//! connections put a schema of its own before `pg_catalog` in their `search_path`, whose
//! `clock_timestamp()` adds an offset the suite moves (`TestClock`). Nothing of the shipped
//! engine changes for it.
//!
//! Run with `scripts/pg.sh test`. `IDEMKV_DIFF_SEED` replays one run (the seed is printed
//! on a failure), `IDEMKV_DIFF_HISTORIES` and `IDEMKV_DIFF_OPS` set its size.
#![cfg(feature = "postgres")]

mod pg;

use idemkv::{
    Claim, ClaimError, ClaimOptions, Clock, Engine, KeyState, LeaseError, MockClock,
    PostgresConfig, WriteSet,
};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};

fn url() -> String {
    pg::env("IDEMKV_PG_URL", "shared_differential")
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}")),
        Err(_) => default,
    }
}

/// The engines' default lease and retention, in units of a minute. Every duration of the
/// suite is whole units and clock jumps are multiples of `STEP`, while leases and
/// retentions are not: a deadline is never within a unit of a checked instant, so the
/// database's own real time between statements (seconds at most over a history) never
/// decides an answer.
const UNIT: u64 = 60;
const LEASE: u64 = 13;
const RETENTION: u64 = 62;
const STEP: u64 = 5;
/// The last is longer than the shared backend's cap (about 100 years).
const LEASES: [u64; 5] = [0, 7, 13, 31, 200 * 365 * 24 * 60];
const OWN_RETENTION: u64 = 17;
/// The marker window of the histories run with markers (every other one).
const MARKERS: u64 = 23;
const KEYS: [&[u8]; 2] = [b"k1", b"k2"];
const SCOPES: [&[u8]; 2] = [b"", b"tenant"];

/// The shared backend's clock for this suite: a schema holding the offset and the
/// `clock_timestamp()` that adds it, and a psql session that moves it.
struct TestClock {
    schema: String,
    session: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    shift: Duration,
}

impl TestClock {
    fn new() -> TestClock {
        let schema = format!("clk{:08x}", fastrand::u32(..));
        pg::psql(
            &url(),
            &format!(
                "CREATE SCHEMA {schema};
CREATE TABLE {schema}.shift (us bigint NOT NULL);
INSERT INTO {schema}.shift VALUES (0);
CREATE FUNCTION {schema}.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE AS
$f$ SELECT pg_catalog.clock_timestamp() + (SELECT us FROM {schema}.shift) * interval '1 microsecond' $f$"
            ),
        );
        let mut session = Command::new("psql")
            .args([&url(), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run psql");
        let stdin = session.stdin.take().expect("psql stdin");
        let lines = BufReader::new(session.stdout.take().expect("psql stdout")).lines();
        let mut clock = TestClock {
            schema,
            session,
            stdin,
            lines,
            shift: Duration::ZERO,
        };
        // The engines' connections resolve `clock_timestamp()` to the suite's: a session
        // with the same settings sees the shift.
        clock.advance(Duration::from_secs(3600));
        let seen = pg::psql(
            &clock.url(),
            "SELECT (clock_timestamp() - pg_catalog.clock_timestamp() > interval '59 minutes')::text",
        );
        assert_eq!(seen, "true", "the search_path does not reach the clock");
        clock
    }

    /// The URL of the engines' connections: the suite's schema first, so their tables and
    /// their `clock_timestamp()` are its own.
    fn url(&self) -> String {
        let base = url();
        let sep = if base.contains('?') { '&' } else { '?' };
        format!(
            "{base}{sep}options=-c%20search_path%3D{}%2Cpg_catalog",
            self.schema
        )
    }

    fn advance(&mut self, d: Duration) {
        self.shift += d;
        writeln!(
            self.stdin,
            "UPDATE {}.shift SET us = {}; \\echo moved",
            self.schema,
            self.shift.as_micros()
        )
        .expect("write to psql");
        self.stdin.flush().expect("flush psql");
        let moved = self
            .lines
            .by_ref()
            .any(|l| l.expect("read psql") == "moved");
        assert!(moved, "psql ended before the clock moved");
    }

    /// The database's instant now, as the suite's clock gives it.
    fn now(&self) -> SystemTime {
        SystemTime::now() + self.shift
    }
}

impl Drop for TestClock {
    fn drop(&mut self) {
        let _ = writeln!(
            self.stdin,
            "SET client_min_messages = warning; DROP SCHEMA {} CASCADE;",
            self.schema
        );
        let _ = writeln!(self.stdin, "\\q");
        let _ = self.stdin.flush();
        let _ = self.session.wait();
    }
}

/// `n` units of the suite's time.
fn units(n: u64) -> Duration {
    Duration::from_secs(n * UNIT)
}

/// A duration in units, rounded to the nearest: both backends agree to it. The shared
/// backend caps what it sends at about 100 years (docs/design.md), so anything past half
/// of that reads as "forever".
fn in_units(d: Duration) -> u64 {
    let d = if d > CAP / 2 { CAP } else { d };
    (d.as_secs() + UNIT / 2) / UNIT
}

const CAP: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn units_until(at: SystemTime, now: SystemTime) -> i64 {
    match at.duration_since(now) {
        Ok(d) => in_units(d) as i64,
        Err(e) => -(in_units(e.duration()) as i64),
    }
}

/// Tokens by identity: each backend's tokens numbered in the order first seen.
#[derive(Default)]
struct Tokens(HashMap<u64, usize>);

impl Tokens {
    fn id(&mut self, token: u64) -> usize {
        let next = self.0.len();
        *self.0.entry(token).or_insert(next)
    }
}

/// One backend: its engine, its tokens by identity and the history's leases on it.
struct Side {
    engine: Engine,
    tokens: Tokens,
    /// Tokens of the leases the history acquired, in order (same index on both sides).
    leases: Vec<u64>,
}

/// A call's answer with everything the backends must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Acquired {
        token: usize,
        attempt: u32,
        checkpoint: Option<(u32, Vec<u8>)>,
    },
    InProgress {
        attempt: u32,
        retry_after: u64,
    },
    Completed {
        token: usize,
        attempt: u32,
        response: Vec<u8>,
        expires_in: i64,
    },
    Forgotten,
    ClaimErr(String),
    Done(Result<bool, String>),
    Absent,
    InFlight {
        token: usize,
        attempt: u32,
        remaining: u64,
        checkpoint: Option<(u32, Vec<u8>)>,
        failed: bool,
    },
    Swept(Result<u64, String>),
    Moved,
    Duplicates(Vec<String>),
    /// Concurrent claims' answers, sorted.
    Race(Vec<Answer>),
    /// The relay's messages' bytes, in id order.
    Relayed(Result<Vec<Vec<u8>>, String>),
    /// The application table's rows.
    Rows(Result<Vec<idemkv::TableRow>, String>),
}

fn lease_err(e: LeaseError) -> String {
    format!("{e:?}")
}

fn claim_err(e: ClaimError) -> String {
    format!("{e:?}")
}

#[derive(Debug, Clone)]
enum Op {
    Claim {
        slot: usize,
        payload: Option<u8>,
        lease: Option<u64>,
        own_retention: bool,
        /// `ClaimOptions::rerun_forgotten`.
        rerun: bool,
    },
    /// A completion; `writes`: with a row of the application's table `t` and a message
    /// (an unscoped key's; a scoped one completes plainly).
    Complete {
        lease: usize,
        response: u8,
        writes: bool,
    },
    /// The outbox relay: up to `n` pending messages, marked sent.
    Relay {
        n: usize,
    },
    Release {
        lease: usize,
    },
    Fail {
        lease: usize,
    },
    Extend {
        lease: usize,
        units: u64,
    },
    /// A keep-alive renewal: the claim's own lease length again.
    KeepAlive {
        lease: usize,
    },
    Checkpoint {
        lease: usize,
        phase: u32,
        data: u8,
    },
    Get {
        slot: usize,
    },
    Advance {
        units: u64,
    },
    Sweep,
    /// `n` concurrent claims of a fresh key; `wait`: through `run`, each returning its
    /// own bytes (only the winner's may come back).
    Duplicates {
        n: usize,
        wait: bool,
    },
    /// `n` concurrent claims of a key of the history, whatever its state (a live lease, an
    /// expired or failed one to take over, a completion), half of them through a second
    /// shared engine (another process) so that they meet in the database.
    Race {
        slot: usize,
        n: usize,
        payload: Option<u8>,
    },
}

fn slot(i: usize) -> (&'static [u8], &'static [u8]) {
    (SCOPES[i / KEYS.len()], KEYS[i % KEYS.len()])
}

/// The history's claims by lease index: slot and lease length.
struct Claimed {
    slot: usize,
    lease: u64,
}

fn generate(rng: &mut fastrand::Rng, ops: usize) -> Vec<Op> {
    let slots = KEYS.len() * SCOPES.len();
    let mut out = Vec::with_capacity(ops);
    // The generator tracks how many leases exist so holder calls name one; which of them
    // is still current is for the backends to say.
    let mut leases = 0usize;
    for _ in 0..ops {
        let pick = rng.u32(0..100);
        let lease = |rng: &mut fastrand::Rng| {
            // Recent leases are the likelier ones to act on.
            let back = rng.usize(0..leases.min(4));
            leases - 1 - back
        };
        let op = match pick {
            _ if leases == 0 || pick < 30 => Op::Claim {
                slot: rng.usize(0..slots),
                payload: (rng.u8(0..4) > 0).then(|| rng.u8(0..2)),
                lease: rng.bool().then(|| LEASES[rng.usize(0..LEASES.len())]),
                own_retention: rng.u8(0..5) == 0,
                rerun: rng.u8(0..8) == 0,
            },
            30..=44 => Op::Complete {
                lease: lease(rng),
                response: rng.u8(..),
                writes: rng.bool(),
            },
            45..=51 => Op::Release { lease: lease(rng) },
            52..=58 => Op::Fail { lease: lease(rng) },
            59..=64 => Op::Extend {
                lease: lease(rng),
                units: LEASES[rng.usize(0..LEASES.len())],
            },
            65..=69 => Op::KeepAlive { lease: lease(rng) },
            70..=76 => Op::Checkpoint {
                lease: lease(rng),
                phase: rng.u32(0..4),
                data: rng.u8(..),
            },
            77..=84 => Op::Get {
                slot: rng.usize(0..slots),
            },
            85..=94 => Op::Advance {
                units: STEP * [1, 1, 2, 4, 13][rng.usize(0..5)],
            },
            95 => Op::Sweep,
            _ if pick == 99 && rng.bool() => Op::Relay { n: rng.usize(1..4) },
            96..=97 => Op::Race {
                slot: rng.usize(0..slots),
                n: rng.usize(2..5),
                payload: (rng.u8(0..4) > 0).then(|| rng.u8(0..2)),
            },
            _ => Op::Duplicates {
                n: rng.usize(2..6),
                wait: rng.bool(),
            },
        };
        if let Op::Claim { .. } | Op::Race { .. } = op {
            // Each claim may acquire; a holder call naming one that did not is skipped.
            leases += 1;
        }
        out.push(op);
    }
    out
}

struct Run {
    clock: MockClock,
    pg_clock: TestClock,
    prefix: String,
    file: Side,
    pg: Side,
    claimed: Vec<Claimed>,
    /// For each claim of the plan, in order (holder calls name claims by this number), the
    /// index of its lease in `claimed` when both sides acquired it.
    by_claim: Vec<Option<usize>>,
    dups: usize,
    /// Whether both engines keep markers.
    markers: bool,
    _dir: tempfile::TempDir,
}

fn marker_window(markers: bool) -> Option<Duration> {
    markers.then(|| units(MARKERS))
}

fn pg_engine(pg_clock: &TestClock, prefix: &str, clock: &MockClock, markers: bool) -> Engine {
    Engine::builder()
        .marker_retention(marker_window(markers))
        .postgres(
            PostgresConfig::new(pg_clock.url())
                .table_prefix(prefix)
                .pool_size(8),
        )
        .clock(clock.clone())
        .lease(units(LEASE))
        .retention(units(RETENTION))
        .sweep_interval(None)
        .open()
        .expect("open the shared engine")
}

impl Run {
    fn new(seed: u64, history: u64, pg_clock: TestClock) -> Run {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = MockClock::new();
        let markers = history % 2 == 1;
        let file = Engine::builder()
            .marker_retention(marker_window(markers))
            .path(dir.path().join("diff.redb"))
            .clock(clock.clone())
            .lease(units(LEASE))
            .retention(units(RETENTION))
            .sweep_interval(None)
            .open()
            .expect("open the file engine");
        let prefix = format!("d{:08x}_{history}_", seed as u32);
        let pg = pg_engine(&pg_clock, &prefix, &clock, markers);
        Run {
            clock,
            pg_clock,
            prefix,
            file: Side {
                engine: file,
                tokens: Tokens::default(),
                leases: Vec::new(),
            },
            pg: Side {
                engine: pg,
                tokens: Tokens::default(),
                leases: Vec::new(),
            },
            claimed: Vec::new(),
            by_claim: Vec::new(),
            dups: 0,
            markers,
            _dir: dir,
        }
    }

    /// Runs `op` on both sides; the two answers.
    fn step(&mut self, op: &Op) -> (Answer, Answer) {
        match *op {
            Op::Claim {
                slot: s,
                payload,
                lease,
                own_retention,
                rerun,
            } => {
                let (scope, key) = slot(s);
                let mut opts = ClaimOptions::default();
                if rerun {
                    opts = opts.rerun_forgotten();
                }
                if !scope.is_empty() {
                    opts = opts.scope(scope);
                }
                if let Some(p) = payload {
                    opts = opts.payload(&[p]);
                }
                if let Some(l) = lease {
                    opts = opts.lease(units(l));
                }
                if own_retention {
                    opts = opts.retention(units(OWN_RETENTION));
                }
                // A shared engine dates a replayed completion's end on its own wall clock
                // (the database's remaining retention from its own now); the file engine
                // on its clock.
                let mut f = claim(&mut self.file, key, &opts, self.clock.wall());
                if self.markers && matches!(f, Answer::InProgress { retry_after: 0, .. }) {
                    // A marker the file engine's sweep made is not published until its
                    // commit is (a 1 ms hint); the database's is its committed row. Asked
                    // again once the file's commits are in.
                    self.file.engine.flush().expect("flush");
                    f = claim(&mut self.file, key, &opts, self.clock.wall());
                }
                let p = claim(&mut self.pg, key, &opts, SystemTime::now());
                let acquired = matches!(f, Answer::Acquired { .. });
                let index = if acquired && matches!(p, Answer::Acquired { .. }) {
                    self.claimed.push(Claimed {
                        slot: s,
                        lease: lease.unwrap_or(LEASE),
                    });
                    Some(self.claimed.len() - 1)
                } else {
                    None
                };
                self.by_claim.push(index);
                (f, p)
            }
            Op::Complete {
                lease,
                response,
                writes,
            } => self.holder(lease, |e, scope, key, token, _| {
                let done = if writes && scope.is_empty() {
                    let mut w = WriteSet::new();
                    w.put("t", key, &[response])
                        .and_then(|w| w.emit(&[key, &[response][..]].concat()))
                        .expect("a small write set");
                    e.complete_with(key, token, &[response], &w)
                } else {
                    e.complete_scoped(scope, key, token, &[response])
                };
                Answer::Done(done.map(|()| true).map_err(lease_err))
            }),
            Op::Relay { n } => (relay(&self.file.engine, n), relay(&self.pg.engine, n)),
            Op::Release { lease } => self.holder(lease, |e, scope, key, token, _| {
                Answer::Done(e.release_scoped(scope, key, token).map_err(lease_err))
            }),
            Op::Fail { lease } => self.holder(lease, |e, scope, key, token, _| {
                Answer::Done(e.fail_scoped(scope, key, token).map_err(lease_err))
            }),
            Op::Extend { lease, units: n } => self.holder(lease, |e, scope, key, token, _| {
                Answer::Done(
                    e.extend_scoped(scope, key, token, units(n))
                        .map(|()| true)
                        .map_err(lease_err),
                )
            }),
            Op::KeepAlive { lease } => self.holder(lease, |e, scope, key, token, length| {
                Answer::Done(
                    e.extend_scoped(scope, key, token, units(length))
                        .map(|()| true)
                        .map_err(lease_err),
                )
            }),
            Op::Checkpoint { lease, phase, data } => {
                self.holder(lease, |e, scope, key, token, _| {
                    Answer::Done(
                        e.checkpoint_scoped(scope, key, token, phase, &[data])
                            .map(|()| true)
                            .map_err(lease_err),
                    )
                })
            }
            Op::Get { slot: s } => {
                // `get` gives the database's own instants.
                let now = (self.clock.wall(), self.pg_clock.now());
                (get(&mut self.file, s, now.0), get(&mut self.pg, s, now.1))
            }
            Op::Advance { units: n } => {
                let d = units(n);
                self.clock.advance(d);
                self.pg_clock.advance(d);
                // The shared engine's local front measures what it learned (a lease of this
                // process, a cached completion) on the process's monotonic clock, which a
                // jump of the database's clock does not move; in production both run at one
                // rate. So the jump is seen by a fresh engine, as by another process: the
                // database alone carries the state across.
                self.pg.engine = pg_engine(&self.pg_clock, &self.prefix, &self.clock, self.markers);
                (Answer::Moved, Answer::Moved)
            }
            Op::Sweep => {
                let swept = |e: &Engine| {
                    let n = e.admin().sweep_now().map_err(claim_err);
                    // With markers, a file engine counts a completion it turns into a
                    // marker when its sweep does it, not when a claim did (the database's
                    // claim changes nothing): the counts may differ, what every call
                    // answers afterwards may not.
                    Answer::Swept(if self.markers { n.map(|_| 0) } else { n })
                };
                (swept(&self.file.engine), swept(&self.pg.engine))
            }
            Op::Race {
                slot: s,
                n,
                payload,
            } => {
                let (scope, key) = slot(s);
                let mut opts = ClaimOptions::default();
                if !scope.is_empty() {
                    opts = opts.scope(scope);
                }
                if let Some(p) = payload {
                    opts = opts.payload(&[p]);
                }
                let peer = pg_engine(&self.pg_clock, &self.prefix, &self.clock, self.markers);
                let mut f = race(&mut self.file, None, key, &opts, n, self.clock.wall());
                if self.markers {
                    f = settled_markers(f);
                }
                let p = race(&mut self.pg, Some(&peer), key, &opts, n, SystemTime::now());
                let won = |a: &Answer| match a {
                    Answer::Race(all) => all
                        .iter()
                        .filter(|x| matches!(x, Answer::Acquired { .. }))
                        .count(),
                    _ => 0,
                };
                let index = (won(&f) == 1 && won(&p) == 1).then(|| {
                    self.claimed.push(Claimed {
                        slot: s,
                        lease: LEASE,
                    });
                    self.claimed.len() - 1
                });
                self.by_claim.push(index);
                (f, p)
            }
            Op::Duplicates { n, wait } => {
                self.dups += 1;
                let key = format!("dup-{}", self.dups);
                (
                    duplicates(&self.file.engine, key.as_bytes(), n, wait),
                    duplicates(&self.pg.engine, key.as_bytes(), n, wait),
                )
            }
        }
    }

    /// A holder's call by the token of the history's lease `claim` (a generator index:
    /// the claim-op number), on both sides; a claim that acquired nowhere names nothing.
    fn holder(
        &mut self,
        claim: usize,
        call: impl Fn(&Engine, &[u8], &[u8], u64, u64) -> Answer,
    ) -> (Answer, Answer) {
        let Some(Some(i)) = self.by_claim.get(claim).copied() else {
            return (Answer::Moved, Answer::Moved);
        };
        let (scope, key) = slot(self.claimed[i].slot);
        let length = self.claimed[i].lease;
        (
            call(&self.file.engine, scope, key, self.file.leases[i], length),
            call(&self.pg.engine, scope, key, self.pg.leases[i], length),
        )
    }
}

fn checkpoint_of(c: Option<&idemkv::Checkpoint>) -> Option<(u32, Vec<u8>)> {
    c.map(|c| (c.phase(), c.data().to_vec()))
}

fn claim(side: &mut Side, key: &[u8], opts: &ClaimOptions, now: SystemTime) -> Answer {
    let result = side.engine.claim(key, opts);
    answer_of(side, result, now)
}

/// `n` threads claim `key` at once, every other one through `peer` when given; their
/// answers, sorted. An acquired lease joins the history's.
fn race(
    side: &mut Side,
    peer: Option<&Engine>,
    key: &[u8],
    opts: &ClaimOptions,
    n: usize,
    now: SystemTime,
) -> Answer {
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let engine = match peer {
                Some(p) if i % 2 == 1 => p.clone(),
                _ => side.engine.clone(),
            };
            let (barrier, key, opts) = (barrier.clone(), key.to_vec(), opts.clone());
            std::thread::spawn(move || {
                barrier.wait();
                engine.claim(&key, &opts)
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect();
    let mut answers: Vec<Answer> = results
        .into_iter()
        .map(|r| answer_of(side, r, now))
        .collect();
    answers.sort_by_key(|a| format!("{a:?}"));
    Answer::Race(answers)
}

fn answer_of(side: &mut Side, result: Result<Claim, ClaimError>, now: SystemTime) -> Answer {
    match result {
        Ok(Claim::Acquired(lease)) => {
            let answer = Answer::Acquired {
                token: side.tokens.id(lease.token()),
                attempt: lease.attempt(),
                checkpoint: checkpoint_of(lease.checkpoint()),
            };
            // Settled only by the history's explicit calls (or its lease's end).
            let detached = lease.detach();
            side.leases.push(detached.token());
            answer
        }
        Ok(Claim::InProgress(busy)) => Answer::InProgress {
            attempt: busy.attempt(),
            retry_after: in_units(busy.retry_after()),
        },
        Ok(Claim::Completed(stored)) => Answer::Completed {
            token: side.tokens.id(stored.token()),
            attempt: stored.attempt(),
            response: stored.response().to_vec(),
            expires_in: units_until(stored.expires_at(), now),
        },
        Ok(Claim::Forgotten(_)) => Answer::Forgotten,
        Err(e) => Answer::ClaimErr(claim_err(e)),
    }
}

fn get(side: &mut Side, s: usize, now: SystemTime) -> Answer {
    let (scope, key) = slot(s);
    match side.engine.get_scoped(scope, key) {
        Ok(None) => Answer::Absent,
        Ok(Some(KeyState::InFlight {
            token,
            attempt,
            lease_remaining,
            checkpoint,
            failed,
            ..
        })) => Answer::InFlight {
            token: side.tokens.id(token),
            attempt,
            remaining: in_units(lease_remaining),
            checkpoint: checkpoint_of(checkpoint.as_ref()),
            failed,
        },
        Ok(Some(KeyState::Completed {
            token,
            attempt,
            response,
            expires_at,
        })) => Answer::Completed {
            token: side.tokens.id(token),
            attempt,
            response: response.to_vec(),
            expires_in: units_until(expires_at, now),
        },
        Ok(Some(other)) => Answer::ClaimErr(format!("unexpected state {other:?}")),
        Err(e) => Answer::ClaimErr(claim_err(e)),
    }
}

/// `n` threads claim `key` at once. Without waiting: the multiset of answers, the one
/// winner completing after all answered. With waiting (`run`, each handler returning its
/// own bytes): whether each outcome was replayed, and whether all carry the same bytes.
fn duplicates(engine: &Engine, key: &[u8], n: usize, wait: bool) -> Answer {
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (engine, barrier, key) = (engine.clone(), barrier.clone(), key.to_vec());
            std::thread::spawn(move || {
                barrier.wait();
                if wait {
                    let opts = ClaimOptions::default().wait(Duration::from_secs(30));
                    match engine.run(&key, &opts, |_| {
                        Ok::<_, std::io::Error>(format!("copy {i}").into_bytes())
                    }) {
                        Ok(out) => (
                            format!("replayed={}", out.replayed()),
                            out.response().to_vec(),
                            None,
                        ),
                        Err(e) => (format!("error {e:?}"), Vec::new(), None),
                    }
                } else {
                    match engine.claim(&key, &ClaimOptions::default()) {
                        Ok(Claim::Acquired(lease)) => ("Acquired".into(), Vec::new(), Some(lease)),
                        Ok(Claim::InProgress(_)) => ("InProgress".into(), Vec::new(), None),
                        Ok(other) => (format!("{other:?}"), Vec::new(), None),
                        Err(e) => (format!("error {e:?}"), Vec::new(), None),
                    }
                }
            })
        })
        .collect();
    let mut kinds = Vec::new();
    let mut bytes = Vec::new();
    let mut winners = Vec::new();
    for h in handles {
        let (kind, response, lease) = h.join().expect("no panic");
        winners.extend(lease);
        kinds.push(kind);
        bytes.push(response);
    }
    // Settled once every copy answered: none of them may see the completion.
    for lease in winners {
        lease.complete(b"winner").expect("the winner completes");
    }
    kinds.sort();
    if wait {
        bytes.dedup();
        kinds.push(format!("distinct responses: {}", bytes.len()));
    }
    Answer::Duplicates(kinds)
}

/// A file engine's claim that turns an expired completion into its marker answers the
/// claims racing it `InProgress` (a 1 ms hint) until the marker's commit is published;
/// the database's marker is its committed row, which every claim reads. Such answers
/// stand for the `Forgotten` they become a millisecond later.
fn settled_markers(race: Answer) -> Answer {
    let Answer::Race(mut all) = race else {
        return race;
    };
    // The claims of a race ask alike: each answers, once the marker is committed, what
    // the claim that made it did (`Forgotten`, or a fingerprint mismatch).
    let settled = all
        .iter()
        .find(|a| matches!(a, Answer::Forgotten | Answer::ClaimErr(_)))
        .cloned();
    if let Some(settled) = settled {
        for a in &mut all {
            if matches!(a, Answer::InProgress { retry_after: 0, .. }) {
                *a = settled.clone();
            }
        }
        all.sort_by_key(|a| format!("{a:?}"));
    }
    Answer::Race(all)
}

/// Up to `n` pending messages' bytes, marked sent.
fn relay(engine: &Engine, n: usize) -> Answer {
    let outbox = engine.outbox();
    Answer::Relayed(
        outbox
            .pending(n)
            .and_then(|batch| {
                let ids: Vec<u64> = batch.iter().map(|m| m.id()).collect();
                outbox.mark_sent(&ids)?;
                Ok(batch.iter().map(|m| m.payload().to_vec()).collect())
            })
            .map_err(|e| format!("{e:?}")),
    )
}

/// The final state of every key of the history, on one side, then the application
/// table's rows and the messages still pending.
fn final_state(side: &mut Side, now: SystemTime) -> Vec<Answer> {
    let mut all: Vec<Answer> = (0..KEYS.len() * SCOPES.len())
        .map(|s| get(side, s, now))
        .collect();
    all.push(Answer::Rows(
        side.engine
            .table_range("t", b"", None, 100)
            .map_err(|e| format!("{e:?}")),
    ));
    all.push(relay(&side.engine, 1000));
    all
}

fn run_history(
    seed: u64,
    history: u64,
    ops: usize,
    pg_clock: TestClock,
) -> Result<TestClock, String> {
    let mut rng = fastrand::Rng::with_seed(seed ^ history.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let plan = generate(&mut rng, ops);
    let mut run = Run::new(seed, history, pg_clock);
    let mut log = Vec::new();
    for (n, op) in plan.iter().enumerate() {
        let (f, p) = run.step(op);
        log.push(format!("{n:3} {op:?} -> {f:?}"));
        if f != p {
            return Err(format!(
                "history {history} (seed {seed}) differs at op {n}: {op:?}\n  file:     {f:?}\n  postgres: {p:?}\nhistory so far:\n{}",
                log.join("\n")
            ));
        }
        if let Answer::Duplicates(kinds) = &f {
            // Exactly one winner on each side, whatever the other side says.
            let winners = kinds
                .iter()
                .filter(|k| *k == "Acquired" || *k == "replayed=false")
                .count();
            if winners != 1 || kinds.iter().any(|k| k.starts_with("distinct responses: 2")) {
                return Err(format!("history {history} (seed {seed}) op {n}: {kinds:?}"));
            }
        }
    }
    let f = final_state(&mut run.file, run.clock.wall());
    let now = run.pg_clock.now();
    let p = final_state(&mut run.pg, now);
    if f != p {
        return Err(format!(
            "history {history} (seed {seed}): final states differ\n  file:     {f:?}\n  postgres: {p:?}\nhistory:\n{}",
            log.join("\n")
        ));
    }
    Ok(run.pg_clock)
}

#[test]
fn histories_answer_the_same_on_the_file_engine_and_on_postgres() {
    let seed = env_u64("IDEMKV_DIFF_SEED", fastrand::u64(..));
    let histories = env_u64("IDEMKV_DIFF_HISTORIES", 50);
    let ops = env_u64("IDEMKV_DIFF_OPS", 80) as usize;
    eprintln!("differential suite: IDEMKV_DIFF_SEED={seed} IDEMKV_DIFF_HISTORIES={histories} IDEMKV_DIFF_OPS={ops}");
    let started = Instant::now();
    let mut pg_clock = TestClock::new();
    for h in 0..histories {
        match run_history(seed, h, ops, pg_clock) {
            Ok(clock) => pg_clock = clock,
            Err(e) => panic!("{e}\nreplay with IDEMKV_DIFF_SEED={seed}"),
        }
    }
    eprintln!(
        "differential suite: {histories} histories of {ops} operations in {:?}",
        started.elapsed()
    );
}
