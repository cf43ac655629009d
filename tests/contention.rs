//! Contention tests: many real threads, released together by a `Barrier`, hammer the same
//! keys through `claim` and `run`, in every durability mode.
//!
//! What is checked (docs/design.md, invariants 1–3):
//! - one live lease per key at any instant (an exact holder counter while the clock stands
//!   still; ownership intervals in mock time while a ticker thread lets leases expire);
//! - fencing: every acquired token is larger than every token acquired for that key before
//!   the claim started, a superseded holder's late `complete` gets `LeaseLost`, and the
//!   stored response is the one of the latest token;
//! - indistinguishable losers: every caller of a key gets the winner's bytes, and the
//!   handler (the side effect) ran once.
//!
//! Time is a `MockClock`: nothing here waits for the engine's time to pass by sleeping.

use idemkv::*;
use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A lease no test outlives: with the clock standing still, nothing is ever taken over.
const LONG_LEASE: Duration = Duration::from_secs(3600);

struct Fixture {
    engine: Engine,
    clock: MockClock,
    mode: Durability,
    _dir: tempfile::TempDir,
}

fn open(mode: Durability, lease: Duration) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = MockClock::new();
    let mut builder = Engine::builder()
        .durability(mode)
        .clock(clock.clone())
        .lease(lease);
    if mode != Durability::None {
        builder = builder.path(dir.path().join("contention.redb"));
    }
    let engine = builder.open().expect("open engine");
    Fixture {
        engine,
        clock,
        mode,
        _dir: dir,
    }
}

/// Scales an iteration count down where the writer is in the loop (fsynced commits under
/// `Immediate`, up to `max_delay` per publication under `Buffered`).
fn scaled(mode: Durability, n: usize) -> usize {
    match mode {
        Durability::None => n,
        _ => (n / 2).max(2),
    }
}

/// Gives the other threads a chance to run into the window a holder keeps open.
fn widen(spins: usize) {
    for _ in 0..spins {
        thread::yield_now();
    }
}

/// A contender that panics would leave the others waiting at a barrier forever: make such a
/// panic end the whole test process at once instead of hanging. The message goes straight to
/// the process's stderr, because the harness's output capture dies with the process.
fn abort_on_contender_panic() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = thread::current().name().unwrap_or("").to_string();
            if name.starts_with("contender-") || name == "ticker" {
                let _ = writeln!(
                    std::io::stderr(),
                    "{name} {info}\naborting the test process so that no barrier hangs"
                );
                std::process::abort();
            }
            default(info);
        }));
    });
}

fn spawn_all<T: Send + 'static>(
    threads: usize,
    f: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    abort_on_contender_panic();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..threads)
        .map(|tid| {
            let f = f.clone();
            thread::Builder::new()
                .name(format!("contender-{tid}"))
                .spawn(move || f(tid))
                .expect("spawn")
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("a contender thread panicked"))
        .collect()
}

fn report(name: &str, mode: Durability, started: Instant, engine: &Engine) {
    let s = engine.stats();
    eprintln!(
        "{name} {mode:?}: {:?}, claims {}, acquired {}, takeovers {}, replays {}, in_progress {}, \
         releases {}, leases_lost {}, commits {}, batch_max {}",
        started.elapsed(),
        s.claims,
        s.acquired,
        s.takeovers,
        s.replays,
        s.in_progress,
        s.releases,
        s.leases_lost,
        s.commits,
        s.batch_max
    );
}

// ---------------------------------------------------------------------------------------
// 1. `claim`: exactly one holder, one acquisition, everyone sees the winner's bytes.
// ---------------------------------------------------------------------------------------

/// A winner's response bytes and token.
type Won = (Vec<u8>, u64);

fn claim_one_winner(mode: Durability) {
    const THREADS: usize = 32;
    let rounds = scaled(mode, 48);
    let started = Instant::now();
    let fx = Arc::new(open(mode, LONG_LEASE));
    let barrier = Arc::new(Barrier::new(THREADS));
    let holders = Arc::new(AtomicUsize::new(0));
    let acquired: Arc<Vec<AtomicUsize>> =
        Arc::new((0..rounds).map(|_| AtomicUsize::new(0)).collect());
    // Set once the winner's `complete` has returned.
    let settled: Arc<Vec<AtomicBool>> =
        Arc::new((0..rounds).map(|_| AtomicBool::new(false)).collect());
    let winner: Arc<Vec<Mutex<Option<Won>>>> =
        Arc::new((0..rounds).map(|_| Mutex::new(None)).collect());

    let results = {
        let (fx, barrier, holders, acquired, settled, winner) = (
            fx.clone(),
            barrier.clone(),
            holders.clone(),
            acquired.clone(),
            settled.clone(),
            winner.clone(),
        );
        spawn_all(THREADS, move |tid| {
            let engine = &fx.engine;
            let opts = ClaimOptions::default().payload(b"same request");
            let mut seen: Vec<(Vec<u8>, u64)> = Vec::with_capacity(rounds);
            for round in 0..rounds {
                let key = format!("claim-{round}");
                barrier.wait();
                let got = loop {
                    let was_settled = settled[round].load(SeqCst);
                    match engine.claim(key.as_bytes(), &opts).expect("claim") {
                        Claim::Acquired(lease) => {
                            let before = holders.fetch_add(1, SeqCst);
                            assert_eq!(before, 0, "{key}: a second live lease was handed out");
                            assert!(!was_settled, "{key}: acquired after the winner completed");
                            acquired[round].fetch_add(1, SeqCst);
                            assert_eq!(lease.attempt(), 1, "{key}: no takeover can happen");
                            let token = lease.token();
                            // Hold the lease while the others keep claiming.
                            for _ in 0..20 {
                                widen(2);
                                assert_eq!(holders.load(SeqCst), 1, "{key}: two holders");
                            }
                            match engine.get(key.as_bytes()).expect("get") {
                                Some(KeyState::InFlight { token: t, .. }) => assert_eq!(t, token),
                                other => panic!("{key}: holder sees {other:?}"),
                            }
                            let bytes =
                                format!("{key} won by thread {tid} token {token}").into_bytes();
                            *winner[round].lock().unwrap() = Some((bytes.clone(), token));
                            holders.fetch_sub(1, SeqCst);
                            lease.complete(&bytes).expect("complete");
                            settled[round].store(true, SeqCst);
                            break (bytes, token);
                        }
                        Claim::InProgress(busy) => {
                            // Only Buffered may keep a completion unpublished after
                            // `complete` returned (it is not durable yet).
                            if was_settled {
                                assert!(
                                    matches!(mode, Durability::Buffered { .. }),
                                    "{key}: InProgress after the winner's complete returned \
                                     under {mode:?}"
                                );
                                assert!(busy.retry_after() <= Duration::from_secs(1));
                            }
                            thread::yield_now();
                        }
                        Claim::Completed(stored) => {
                            break (stored.response().to_vec(), stored.token());
                        }
                        Claim::Forgotten(forgotten) => {
                            panic!("unexpected Forgotten without markers: {forgotten:?}")
                        }
                    }
                };
                // Completed is final: another claim replays the same bytes. (The winner's
                // own completion may still be unpublished under Buffered: InProgress then.)
                loop {
                    match engine.claim(key.as_bytes(), &opts).expect("claim again") {
                        Claim::Completed(stored) => {
                            assert_eq!(stored.response(), &got.0[..], "{key}: replay changed");
                            assert_eq!(stored.token(), got.1);
                            break;
                        }
                        Claim::InProgress(_) if matches!(mode, Durability::Buffered { .. }) => {
                            thread::yield_now();
                        }
                        other => panic!("{key}: claim after Completed gave {other:?}"),
                    }
                }
                seen.push(got);
            }
            seen
        })
    };

    fx.engine.flush().expect("flush");
    for round in 0..rounds {
        assert_eq!(
            acquired[round].load(SeqCst),
            1,
            "round {round}: acquisitions"
        );
        let (bytes, token) = winner[round].lock().unwrap().clone().expect("a winner");
        for (tid, seen) in results.iter().enumerate() {
            assert_eq!(
                seen[round].0, bytes,
                "round {round}: thread {tid} got other bytes"
            );
            assert_eq!(
                seen[round].1, token,
                "round {round}: thread {tid} got other token"
            );
        }
        match fx.engine.claim(
            format!("claim-{round}").as_bytes(),
            &ClaimOptions::default(),
        ) {
            Ok(Claim::Completed(stored)) => assert_eq!(stored.response(), &bytes[..]),
            other => panic!("round {round}: after flush {other:?}"),
        }
    }
    assert_eq!(holders.load(SeqCst), 0);
    let stats = fx.engine.stats();
    assert_eq!(stats.acquired, rounds as u64);
    assert_eq!(stats.takeovers, 0);
    report("claim_one_winner", fx.mode, started, &fx.engine);
}

// ---------------------------------------------------------------------------------------
// 2. `run`: the side effect runs once; every caller gets byte-identical responses.
// ---------------------------------------------------------------------------------------

fn run_once(mode: Durability) {
    const THREADS: usize = 33;
    let rounds = scaled(mode, 48);
    let started = Instant::now();
    let fx = Arc::new(open(mode, LONG_LEASE));
    let barrier = Arc::new(Barrier::new(THREADS));
    let effects: Arc<Vec<AtomicUsize>> =
        Arc::new((0..rounds).map(|_| AtomicUsize::new(0)).collect());

    let results = {
        let (fx, barrier, effects) = (fx.clone(), barrier.clone(), effects.clone());
        spawn_all(THREADS, move |tid| {
            let engine = &fx.engine;
            let opts = ClaimOptions::default().payload(b"charge 42");
            let mut out = Vec::with_capacity(rounds);
            for round in 0..rounds {
                let key = format!("run-{round}");
                barrier.wait();
                let outcome = engine
                    .run(key.as_bytes(), &opts, |lease| {
                        assert_eq!(lease.key(), key.as_bytes());
                        effects[round].fetch_add(1, SeqCst);
                        widen(20); // the "work": the others pile up waiting
                        Ok::<_, Infallible>(
                            format!("{key}: thread {tid} token {}", lease.token()).into_bytes(),
                        )
                    })
                    .map_err(|e| format!("{key}: thread {tid}: run failed: {e}"));
                out.push(outcome);
            }
            out
        })
    };

    // The side effect first: a second run is the bug, the errors it causes are its symptom.
    for round in 0..rounds {
        let key = format!("run-{round}");
        assert_eq!(effects[round].load(SeqCst), 1, "{key}: side effect count");
    }
    let results: Vec<Vec<Outcome>> = results
        .into_iter()
        .map(|outs| {
            outs.into_iter()
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    for round in 0..rounds {
        let key = format!("run-{round}");
        let fresh: Vec<usize> = (0..THREADS)
            .filter(|&tid| !results[tid][round].replayed())
            .collect();
        assert_eq!(
            fresh.len(),
            1,
            "{key}: callers with replayed=false: {fresh:?}"
        );
        let winner = &results[fresh[0]][round];
        let expected = format!("{key}: thread {} token {}", fresh[0], winner.token());
        assert_eq!(
            winner.response(),
            expected.as_bytes(),
            "{key}: winner's own bytes"
        );
        for (tid, outs) in results.iter().enumerate() {
            assert_eq!(
                outs[round].response(),
                winner.response(),
                "{key}: thread {tid} got different bytes"
            );
            assert_eq!(
                outs[round].token(),
                winner.token(),
                "{key}: thread {tid} token"
            );
        }
    }
    let stats = fx.engine.stats();
    assert_eq!(stats.acquired, rounds as u64, "one acquisition per key");
    assert_eq!(stats.completions, rounds as u64);
    report("run_once", fx.mode, started, &fx.engine);
}

/// `run` whose first handlers fail (retryable): each failure releases the key, one waiting
/// caller acquires it and runs the handler itself; never two handlers at once.
fn run_retry(mode: Durability) {
    const THREADS: usize = 32;
    const FAILS: usize = 3;
    let rounds = scaled(mode, 24);
    let started = Instant::now();
    let fx = Arc::new(open(mode, LONG_LEASE));
    let barrier = Arc::new(Barrier::new(THREADS));
    let calls: Arc<Vec<AtomicUsize>> = Arc::new((0..rounds).map(|_| AtomicUsize::new(0)).collect());
    let running = Arc::new(AtomicUsize::new(0));

    let results = {
        let (fx, barrier, calls, running) =
            (fx.clone(), barrier.clone(), calls.clone(), running.clone());
        spawn_all(THREADS, move |tid| {
            let engine = &fx.engine;
            let opts = ClaimOptions::default();
            let mut out = Vec::with_capacity(rounds);
            for round in 0..rounds {
                let key = format!("retry-{round}");
                barrier.wait();
                let result = engine.run(key.as_bytes(), &opts, |lease| {
                    let before = running.fetch_add(1, SeqCst);
                    assert_eq!(before, 0, "{key}: two handlers at once");
                    // A released key is Absent: every acquisition of it is a fresh claim.
                    assert_eq!(lease.attempt(), 1, "{key}: attempt after a release");
                    let call = calls[round].fetch_add(1, SeqCst);
                    widen(10);
                    running.fetch_sub(1, SeqCst);
                    if call < FAILS {
                        Err(format!("{key}: failure {call} in thread {tid}"))
                    } else {
                        Ok(format!("{key}: call {call} thread {tid}").into_bytes())
                    }
                });
                out.push(match result {
                    Ok(outcome) => Ok(outcome),
                    Err(RunError::Handler(e)) => Err(e),
                    Err(e) => panic!("{key}: thread {tid}: {e}"),
                });
            }
            out
        })
    };

    for round in 0..rounds {
        let key = format!("retry-{round}");
        assert_eq!(calls[round].load(SeqCst), FAILS + 1, "{key}: handler calls");
        let failed = results.iter().filter(|r| r[round].is_err()).count();
        assert_eq!(failed, FAILS, "{key}: callers that saw a handler failure");
        let ok: Vec<&Outcome> = results
            .iter()
            .filter_map(|r| r[round].as_ref().ok())
            .collect();
        let fresh: Vec<&&Outcome> = ok.iter().filter(|o| !o.replayed()).collect();
        assert_eq!(fresh.len(), 1, "{key}: callers with replayed=false");
        let expected = format!("{key}: call {FAILS} thread ");
        assert!(
            fresh[0].response().starts_with(expected.as_bytes()),
            "{key}: winner bytes"
        );
        for o in &ok {
            assert_eq!(o.response(), fresh[0].response(), "{key}: different bytes");
            assert_eq!(o.token(), fresh[0].token(), "{key}: different token");
        }
    }
    let stats = fx.engine.stats();
    assert_eq!(stats.releases, (rounds * FAILS) as u64);
    assert_eq!(stats.acquired, (rounds * (FAILS + 1)) as u64);
    report("run_retry", fx.mode, started, &fx.engine);
}

// ---------------------------------------------------------------------------------------
// 3. Many keys at once, with a small hot set.
// ---------------------------------------------------------------------------------------

fn many_keys(mode: Durability) {
    const THREADS: usize = 64;
    const HOT: u64 = 8;
    const COLD: u64 = 400;
    let ops = 200;
    let started = Instant::now();
    let fx = Arc::new(open(mode, LONG_LEASE));
    let barrier = Arc::new(Barrier::new(THREADS));
    let keys = (HOT + COLD) as usize;
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..keys).map(|_| AtomicUsize::new(0)).collect());

    // Per thread: (key index, response bytes, replayed).
    let results = {
        let (fx, barrier, runs) = (fx.clone(), barrier.clone(), runs.clone());
        spawn_all(THREADS, move |tid| {
            let engine = &fx.engine;
            let mut rng = fastrand::Rng::with_seed(0x5EED_0000 + tid as u64);
            let mut out = Vec::with_capacity(ops);
            barrier.wait();
            for _ in 0..ops {
                let k = if rng.u64(0..2) == 0 {
                    rng.u64(0..HOT)
                } else {
                    HOT + rng.u64(0..COLD)
                } as usize;
                let key = format!("many-{k}");
                let opts = ClaimOptions::default().payload(key.as_bytes());
                let outcome = engine
                    .run(key.as_bytes(), &opts, |lease| {
                        assert_eq!(lease.key(), key.as_bytes());
                        runs[k].fetch_add(1, SeqCst);
                        if k < HOT as usize {
                            widen(5);
                        }
                        Ok::<_, Infallible>(format!("{key} by {tid}").into_bytes())
                    })
                    .map_err(|e| format!("{key}: thread {tid}: run failed: {e}"));
                out.push((k, outcome));
            }
            out
        })
    };

    // The side effects first: a second run is the bug, the errors it causes its symptom.
    for (k, r) in runs.iter().enumerate() {
        assert!(
            r.load(SeqCst) <= 1,
            "many-{k}: handler ran {} times",
            r.load(SeqCst)
        );
    }
    let results: Vec<Vec<(usize, Vec<u8>, bool)>> = results
        .into_iter()
        .map(|outs| {
            outs.into_iter()
                .map(|(k, r)| match r {
                    Ok(o) => (k, o.response().to_vec(), o.replayed()),
                    Err(e) => panic!("{e}"),
                })
                .collect()
        })
        .collect();

    let mut by_key: HashMap<usize, (Vec<u8>, usize, usize)> = HashMap::new();
    for (tid, outs) in results.iter().enumerate() {
        for (k, bytes, replayed) in outs {
            let key = format!("many-{k}");
            let entry = by_key.entry(*k).or_insert_with(|| (bytes.clone(), 0, 0));
            assert_eq!(&entry.0, bytes, "{key}: thread {tid} got different bytes");
            assert!(
                bytes.starts_with(key.as_bytes()),
                "{key}: bytes of another key"
            );
            entry.1 += 1;
            if !replayed {
                entry.2 += 1;
            }
        }
    }
    for (k, (bytes, calls, fresh)) in &by_key {
        let key = format!("many-{k}");
        assert_eq!(
            runs[*k].load(SeqCst),
            1,
            "{key}: handler ran {} times",
            runs[*k].load(SeqCst)
        );
        assert_eq!(
            *fresh, 1,
            "{key}: {fresh} of {calls} callers were not replays"
        );
        match fx.engine.get(key.as_bytes()).expect("get") {
            Some(KeyState::Completed { response, .. }) => assert_eq!(&response[..], &bytes[..]),
            other => panic!("{key}: {other:?}"),
        }
    }
    for (k, r) in runs.iter().enumerate() {
        if !by_key.contains_key(&k) {
            assert_eq!(r.load(SeqCst), 0, "many-{k}: ran without a caller");
        }
    }
    assert!(by_key.len() > HOT as usize, "the cold set was used");
    let stats = fx.engine.stats();
    assert_eq!(stats.acquired, by_key.len() as u64);
    report("many_keys", fx.mode, started, &fx.engine);
}

// ---------------------------------------------------------------------------------------
// 4. Churn: holders release (retryable failures), stall past their lease while a ticker
//    thread moves the clock, or complete. Fencing across all of it.
// ---------------------------------------------------------------------------------------

/// One acquisition, as its holder saw it. Times are mock monotonic nanoseconds.
#[derive(Debug, Clone)]
struct Acq {
    tid: usize,
    token: u64,
    attempt: u32,
    /// Clock read after `claim` returned.
    start: u64,
    /// Latest instant the lease was certainly live and not given up: the earlier of
    /// (clock before the claim) + lease and the clock read before `release`/`complete`.
    end: u64,
    /// `release` result, if the holder released.
    released: Option<bool>,
    /// The holder's `complete` returned Ok.
    completed: bool,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("small duration")
}

fn mono(clock: &MockClock) -> u64 {
    ns(clock.monotonic())
}

fn response_for(key: &str, token: u64, tid: usize) -> Vec<u8> {
    format!("{key} token {token} thread {tid}").into_bytes()
}

fn churn(mode: Durability, ticker: bool) {
    const THREADS: usize = 32;
    const TICK: Duration = Duration::from_millis(1);
    let lease = Duration::from_millis(if ticker { 15 } else { 3_600_000 });
    // Every acquisition and release is a commit outside `None`: fewer keys there.
    let keys = match mode {
        Durability::None => 12,
        Durability::Buffered { .. } => 6,
        _ => 4,
    };
    // A key is completed only after this many acquisitions.
    let min_acq = scaled(mode, 40).min(24);
    let name = if ticker {
        "churn_expiry"
    } else {
        "churn_release"
    };
    let started = Instant::now();
    let fx = Arc::new(open(mode, lease));
    let barrier = Arc::new(Barrier::new(THREADS));
    let done = Arc::new(AtomicBool::new(false));
    let holders: Arc<Vec<AtomicUsize>> = Arc::new((0..keys).map(|_| AtomicUsize::new(0)).collect());
    let acq_count: Arc<Vec<AtomicUsize>> =
        Arc::new((0..keys).map(|_| AtomicUsize::new(0)).collect());
    // Largest token any holder of the key has reported acquiring.
    let max_seen: Arc<Vec<Mutex<u64>>> = Arc::new((0..keys).map(|_| Mutex::new(0)).collect());
    let log: Arc<Vec<Mutex<Vec<Acq>>>> =
        Arc::new((0..keys).map(|_| Mutex::new(Vec::new())).collect());
    let late_lost = Arc::new(AtomicU64::new(0));
    let lost_on_complete = Arc::new(AtomicU64::new(0));

    let tick_thread = ticker.then(|| {
        let (clock, done) = (fx.clock.clone(), done.clone());
        thread::Builder::new()
            .name("ticker".into())
            .spawn(move || {
                let mut ticks = 0u64;
                while !done.load(SeqCst) {
                    clock.advance(TICK);
                    ticks += 1;
                    // Pacing only: the engine never waits on this.
                    thread::sleep(Duration::from_micros(200));
                }
                ticks
            })
            .expect("spawn ticker")
    });

    let finals = {
        let (fx, barrier, holders, acq_count, max_seen, log, late_lost, lost_on_complete) = (
            fx.clone(),
            barrier.clone(),
            holders.clone(),
            acq_count.clone(),
            max_seen.clone(),
            log.clone(),
            late_lost.clone(),
            lost_on_complete.clone(),
        );
        spawn_all(THREADS, move |tid| {
            let engine = &fx.engine;
            let clock = &fx.clock;
            let lease_ns = ns(lease);
            let mut rng = fastrand::Rng::with_seed(0xC4u64 << 32 | tid as u64);
            let mut finals = Vec::with_capacity(keys);
            barrier.wait();
            for k in 0..keys {
                let key = format!("churn-{k}");
                let opts = ClaimOptions::default().payload(key.as_bytes());
                let fin = loop {
                    let floor = *max_seen[k].lock().unwrap();
                    let t_before = mono(clock);
                    let mut held = match engine.claim(key.as_bytes(), &opts).expect("claim") {
                        Claim::Acquired(held) => held,
                        Claim::InProgress(_) => {
                            thread::yield_now();
                            continue;
                        }
                        Claim::Completed(stored) => {
                            break (stored.response().to_vec(), stored.token());
                        }
                        Claim::Forgotten(forgotten) => {
                            panic!("unexpected Forgotten without markers: {forgotten:?}")
                        }
                    };
                    let start = mono(clock);
                    let token = held.token();
                    assert!(
                        token > floor,
                        "{key}: token {token} not above {floor}, acquired before this claim"
                    );
                    {
                        let mut m = max_seen[k].lock().unwrap();
                        *m = (*m).max(token);
                    }
                    if !ticker {
                        let before = holders[k].fetch_add(1, SeqCst);
                        assert_eq!(before, 0, "{key}: two live leases (token {token})");
                        assert_eq!(held.attempt(), 1, "{key}: takeover with a still clock");
                    }
                    if let Some(cp) = held.checkpoint() {
                        assert!(held.attempt() > 1, "{key}: checkpoint on a fresh claim");
                        let prev = u64::from_le_bytes(cp.data().try_into().expect("8 bytes"));
                        assert!(
                            prev < token,
                            "{key}: checkpoint from token {prev} >= {token}"
                        );
                    }
                    let n = acq_count[k].fetch_add(1, SeqCst) + 1;
                    let mut acq = Acq {
                        tid,
                        token,
                        attempt: held.attempt(),
                        start,
                        end: 0,
                        released: None,
                        completed: false,
                    };
                    let roll = rng.u64(0..8);
                    if roll < 3 {
                        // A checkpoint a takeover must receive. May be refused once the lease
                        // is taken over; never accepted after that.
                        match held.set_checkpoint(1, &token.to_le_bytes()) {
                            Ok(()) => {}
                            Err(LeaseError::LeaseLost) if ticker => {}
                            Err(e) => panic!("{key}: checkpoint: {e}"),
                        }
                    }
                    widen(rng.u64(0..6) as usize);
                    let certain_end = t_before + lease_ns;
                    let result = if n >= min_acq && roll < 2 {
                        acq.end = certain_end.min(mono(clock));
                        if !ticker {
                            holders[k].fetch_sub(1, SeqCst);
                        }
                        let bytes = response_for(&key, token, tid);
                        match held.complete(&bytes) {
                            Ok(()) => {
                                acq.completed = true;
                                Some((bytes, token))
                            }
                            Err(LeaseError::LeaseLost) if ticker => {
                                lost_on_complete.fetch_add(1, SeqCst);
                                None
                            }
                            Err(e) => panic!("{key}: complete of token {token}: {e}"),
                        }
                    } else if ticker && (roll < 5 || n == 1) {
                        // Stall past the lease: deadline <= start + lease, so from then on
                        // the lease is certainly over. The first holder of every key stalls,
                        // so every run sees takeovers and late completions refused.
                        acq.end = certain_end;
                        let over = start + lease_ns;
                        while mono(clock) < over {
                            thread::yield_now();
                        }
                        // Wait until another thread takes the key over (every other thread
                        // claims it until it is completed, which only a holder can do), then
                        // report late.
                        loop {
                            match engine.get(key.as_bytes()).expect("get") {
                                Some(KeyState::InFlight { token: t, .. }) if t == token => {
                                    thread::yield_now();
                                }
                                Some(KeyState::Completing { token: t })
                                | Some(KeyState::Completed { token: t, .. })
                                | Some(KeyState::InFlight { token: t, .. }) => {
                                    assert!(t > token, "{key}: state of older token {t}");
                                    break;
                                }
                                None => break,
                                Some(other) => panic!("{key}: {other:?}"),
                            }
                        }
                        let late = response_for(&key, token, tid);
                        assert_eq!(
                            held.complete(&late),
                            Err(LeaseError::LeaseLost),
                            "{key}: late complete of superseded token {token} accepted"
                        );
                        late_lost.fetch_add(1, SeqCst);
                        None
                    } else {
                        // A retryable failure: give the key back.
                        acq.end = certain_end.min(mono(clock));
                        if !ticker {
                            holders[k].fetch_sub(1, SeqCst);
                        }
                        let released = held.release().expect("release");
                        if !ticker {
                            assert!(released, "{key}: release of live token {token} refused");
                        }
                        acq.released = Some(released);
                        None
                    };
                    log[k].lock().unwrap().push(acq);
                    if let Some(fin) = result {
                        break fin;
                    }
                };
                finals.push(fin);
            }
            finals
        })
    };
    done.store(true, SeqCst);
    let ticks = tick_thread.map(|h| h.join().expect("ticker"));

    fx.engine.flush().expect("flush");
    for k in 0..keys {
        let key = format!("churn-{k}");
        let mut acqs = log[k].lock().unwrap().clone();
        acqs.sort_by_key(|a| a.token);
        assert!(
            acqs.len() >= min_acq,
            "{key}: only {} acquisitions",
            acqs.len()
        );
        for w in acqs.windows(2) {
            assert!(
                w[0].token < w[1].token,
                "{key}: token {} issued twice",
                w[0].token
            );
        }
        // One live lease at any instant: a lease begins only after every earlier lease of
        // the key was given up or certainly over.
        let mut ended = 0u64;
        for a in &acqs {
            assert!(
                a.start >= ended,
                "{key}: token {} (thread {}) live from {} while an earlier lease was live \
                 until {ended}",
                a.token,
                a.tid,
                a.start
            );
            if a.end > a.start {
                ended = ended.max(a.end);
            }
        }
        // Attempts: 1 after a successful release (or first claim), +1 after a takeover.
        assert_eq!(acqs[0].attempt, 1, "{key}: first attempt");
        for w in acqs.windows(2) {
            let want = if w[0].released == Some(true) {
                1
            } else {
                w[0].attempt + 1
            };
            assert_eq!(
                w[1].attempt, want,
                "{key}: token {} after {:?}",
                w[1].token, w[0]
            );
        }
        // Exactly one completion, by the latest token.
        let completed: Vec<&Acq> = acqs.iter().filter(|a| a.completed).collect();
        assert_eq!(completed.len(), 1, "{key}: completions {completed:?}");
        let last = acqs.last().expect("acquisitions");
        assert!(
            last.completed,
            "{key}: the completion is not from the latest token"
        );
        let expected = response_for(&key, last.token, last.tid);
        for (tid, fins) in finals.iter().enumerate() {
            assert_eq!(fins[k].0, expected, "{key}: thread {tid} saw other bytes");
            assert_eq!(fins[k].1, last.token, "{key}: thread {tid} saw other token");
        }
        match fx.engine.claim(key.as_bytes(), &ClaimOptions::default()) {
            Ok(Claim::Completed(stored)) => {
                assert_eq!(stored.response(), &expected[..]);
                assert_eq!(stored.token(), last.token);
            }
            other => panic!("{key}: final state {other:?}"),
        }
    }
    let stats = fx.engine.stats();
    if ticker {
        // The first holder of each key stalls until another takes the key over.
        assert!(
            stats.takeovers >= keys as u64,
            "{} takeovers for {keys} keys",
            stats.takeovers
        );
        assert!(
            late_lost.load(SeqCst) >= keys as u64,
            "{} late completes refused for {keys} keys",
            late_lost.load(SeqCst)
        );
    } else {
        assert_eq!(stats.takeovers, 0);
        assert!(stats.releases > 0);
    }
    eprintln!(
        "{name} {mode:?}: late LeaseLost {}, LeaseLost on complete {}, ticks {ticks:?}",
        late_lost.load(SeqCst),
        lost_on_complete.load(SeqCst)
    );
    report(name, fx.mode, started, &fx.engine);
}

fn churn_release(mode: Durability) {
    churn(mode, false);
}

fn churn_expiry(mode: Durability) {
    churn(mode, true);
}

macro_rules! in_every_mode {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[test]
                fn none() {
                    super::$name(Durability::None);
                }

                #[test]
                fn buffered() {
                    super::$name(Durability::buffered());
                }

                #[test]
                fn immediate() {
                    super::$name(Durability::Immediate);
                }
            }
        )*
    };
}

in_every_mode!(
    claim_one_winner,
    run_once,
    run_retry,
    many_keys,
    churn_release,
    churn_expiry
);

/// Every event is counted once, whichever stripe counted it and however many threads raced:
/// `stats()` adds up the counts each stripe keeps under its own lock, and the gauges that
/// admission compares end where the keys are.
#[test]
fn stats_add_up_every_stripes_events_under_concurrency() {
    const THREADS: u64 = 4;
    const KEYS: u64 = 400;
    let engine = Engine::builder()
        .durability(Durability::None)
        .clock(MockClock::new())
        .tuning(idemkv::Tuning::default().stripes(16))
        .open()
        .expect("open");
    let start = Arc::new(Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (engine, start) = (engine.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let opts = ClaimOptions::default();
                for i in 0..KEYS {
                    // Each thread's own keys: acquired, then completed.
                    let own = format!("own-{t}-{i}");
                    match engine.claim(own.as_bytes(), &opts).expect("claim") {
                        Claim::Acquired(lease) => lease.complete(b"r").expect("complete"),
                        other => panic!("a fresh key answered {other:?}"),
                    }
                    // Shared keys: one thread of the four acquires each, the rest see it
                    // in progress or replay it; every claim is counted once either way.
                    let shared = format!("shared-{i}");
                    if let Claim::Acquired(lease) =
                        engine.claim(shared.as_bytes(), &opts).expect("claim")
                    {
                        lease.complete(b"s").expect("complete");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let s = engine.stats();
    assert_eq!(s.claims, 2 * THREADS * KEYS);
    assert_eq!(s.acquired, THREADS * KEYS + KEYS);
    assert_eq!(s.completions, s.acquired);
    assert_eq!(s.replays + s.in_progress, (THREADS - 1) * KEYS);
    assert_eq!((s.inflight, s.completed), (0, THREADS * KEYS + KEYS));
}
