//! The shared backend over PostgreSQL (feature `postgres`, docs/shared.md). Several
//! `Engine`s on one database stand for separate processes; threads meet at a barrier on
//! the same key. Each test works in tables of its own (a random prefix).
//!
//! Run with `scripts/pg.sh test`: it starts a throwaway PostgreSQL, runs this file with
//! `IDEMKV_PG_URL` set, and stops the server. Without the URL every test fails and says so.
//! Raw SQL (row locks, roles, killing a connection) goes through `psql`, which the server's
//! package installs.
#![cfg(feature = "postgres")]

mod pg;

use idemkv::error::{DatabaseErrorKind, OpenErrorKind, TableError};
use idemkv::{
    Claim, ClaimError, ClaimOptions, Durability, Engine, KeyState, LeaseError, MockClock,
    OpenError, PostgresConfig, WriteSet,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn url() -> String {
    pg::env("IDEMKV_PG_URL", "shared")
}

/// A table prefix no other test (or earlier run) uses.
fn prefix(name: &str) -> String {
    format!("t{:08x}_{name}_", fastrand::u32(..))
}

fn config(prefix: &str) -> PostgresConfig {
    PostgresConfig::new(url()).table_prefix(prefix).pool_size(8)
}

fn engine(prefix: &str) -> Engine {
    Engine::builder()
        .postgres(config(prefix))
        .open()
        .expect("open a shared engine")
}

/// An engine whose statements the server cancels after `after` (`statement_timeout`).
fn engine_timing_out(prefix: &str, after: Duration) -> Engine {
    Engine::builder()
        .postgres(config(prefix).statement_timeout(after))
        .open()
        .expect("open a shared engine")
}

fn trips(e: &Engine) -> u64 {
    e.stats().db_round_trips
}

/// Statements sent other than the flushes that make acquisitions durable.
fn trips_but_flushes(e: &Engine) -> u64 {
    let s = e.stats();
    s.db_round_trips - s.db_flushes
}

/// Runs SQL through psql and returns its unaligned output.
fn psql(sql: &str) -> String {
    pg::psql(&url(), sql)
}

/// The table's key of the unscoped `key`, in hex: the scoped key (a byte of scope length,
/// zero, then the key).
fn hex(key: &[u8]) -> String {
    std::iter::once(&0u8)
        .chain(key)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A psql session that holds the row lock of `key` until dropped.
struct RowLock(Child);

impl RowLock {
    fn take(prefix: &str, key: &[u8]) -> RowLock {
        RowLock::hold(&format!(
            "SELECT 1 FROM \"{prefix}keys\" WHERE key = '\\x{}' FOR UPDATE",
            hex(key)
        ))
    }

    /// A session whose open transaction has inserted `key`, uncommitted: a claim of the key
    /// waits for its end on the insert's conflict check.
    fn insert(prefix: &str, key: &[u8]) -> RowLock {
        RowLock::hold(&format!(
            "INSERT INTO \"{prefix}keys\" (key, state, token, attempt, reap_at, first_claimed_at) \
             VALUES ('\\x{}', 'i', 1, 1, now(), now())",
            hex(key)
        ))
    }

    /// A session whose open transaction has inserted `key` as another process's claim
    /// would (a token from the sequence, a lease of an hour), uncommitted.
    fn insert_live(prefix: &str, key: &[u8]) -> RowLock {
        RowLock::hold(&format!(
            "INSERT INTO \"{prefix}keys\" (key, state, token, attempt, lease_until, reap_at, \
             first_claimed_at) VALUES ('\\x{}', 'i', nextval('\"{prefix}tokens\"'), 1, \
             now() + interval '1 hour', now() + interval '2 hours', now())",
            hex(key)
        ))
    }

    /// Commits the session's transaction and ends it.
    fn commit(mut self) {
        if let Some(stdin) = self.0.stdin.as_mut() {
            writeln!(stdin, "COMMIT;").expect("write to psql");
        }
        drop(self.0.stdin.take());
        let status = self.0.wait().expect("psql ends");
        assert!(status.success(), "psql failed to commit");
    }

    /// A session that runs `sql` in a transaction it keeps open until dropped.
    fn hold(sql: &str) -> RowLock {
        let mut session = RowLock(
            Command::new("psql")
                .args([&url(), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("run psql"),
        );
        let child = &mut session.0;
        let stdin = child.stdin.as_mut().expect("psql stdin");
        writeln!(stdin, "BEGIN; {sql}; \\echo locked").expect("write to psql");
        stdin.flush().expect("flush psql");
        let mut lines = BufReader::new(child.stdout.take().expect("psql stdout")).lines();
        for line in lines.by_ref() {
            if line.expect("read psql") == "locked" {
                return session;
            }
        }
        panic!("psql ended before it held the row lock");
    }
}

impl Drop for RowLock {
    fn drop(&mut self) {
        if let Some(stdin) = self.0.stdin.as_mut() {
            let _ = writeln!(stdin, "ROLLBACK;");
        }
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// Waits (bounded) until a backend of this test's objects (its table, or its claim
/// function) waits on a lock, and terminates it, as a server restart or a network cut
/// would end the connection mid-statement.
fn kill_blocked_connection(prefix: &str) {
    on_blocked_connection(prefix, "count(pg_terminate_backend(pid))");
}

/// Waits (bounded) until a backend of this test's objects waits on a lock.
fn wait_blocked_connection(prefix: &str) {
    on_blocked_connection(prefix, "count(*)");
}

fn on_blocked_connection(prefix: &str, select: &str) {
    let sql = format!(
        "SELECT {select} FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND query LIKE '%{prefix}%' \
           AND query NOT LIKE '%pg_stat_activity%' AND pid <> pg_backend_pid()"
    );
    let end = Instant::now() + Duration::from_secs(20);
    // Polls a state of the server (a backend blocked on the lock), not the passing of time.
    while Instant::now() < end {
        if psql(&sql) != "0" {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no connection of the engine blocked on the row lock");
}

#[test]
fn exactly_one_handler_runs_across_engines_and_every_delivery_gets_its_bytes() {
    let p = prefix("once");
    let engines: Vec<Engine> = (0..4).map(|_| engine(&p)).collect();
    let threads_per_engine = 6;
    for round in 0..3 {
        let key = format!("order-{round}");
        let runs = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(engines.len() * threads_per_engine));
        let mut handles = Vec::new();
        for (e, engine) in engines.iter().enumerate() {
            for t in 0..threads_per_engine {
                let (engine, runs, barrier, key) =
                    (engine.clone(), runs.clone(), barrier.clone(), key.clone());
                handles.push(std::thread::spawn(move || {
                    barrier.wait();
                    let opts = ClaimOptions::default().payload(key.as_bytes());
                    engine
                        .run(key.as_bytes(), &opts, |_lease| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, std::io::Error>(format!("winner {e}/{t}").into_bytes())
                        })
                        .expect("every delivery gets an outcome")
                }));
            }
        }
        let outcomes: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect();
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "round {round}: one handler run"
        );
        let fresh: Vec<_> = outcomes.iter().filter(|o| !o.replayed()).collect();
        assert_eq!(fresh.len(), 1, "round {round}: one delivery ran it");
        assert!(
            outcomes
                .iter()
                .all(|o| o.response() == fresh[0].response() && o.token() == fresh[0].token()),
            "round {round}: every delivery got the winner's bytes"
        );
    }
}

#[test]
fn concurrent_local_duplicates_make_one_round_trip() {
    let p = prefix("coalesce");
    let engine = engine(&p);
    let n = 8;

    // Waiting duplicates: one claim (and its flush) and one completion reach the database.
    let before = trips(&engine);
    let flushes = engine.stats().db_flushes;
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (engine, runs, barrier) = (engine.clone(), runs.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                engine
                    .run(b"dup", &ClaimOptions::default(), |_lease| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(b"once".to_vec())
                    })
                    .expect("outcome")
            })
        })
        .collect();
    let outcomes: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(outcomes.iter().all(|o| o.response() == b"once"));
    assert_eq!(outcomes.iter().filter(|o| o.replayed()).count(), n - 1);
    assert_eq!(engine.stats().db_flushes - flushes, 1, "one acquisition");
    assert_eq!(
        trips(&engine) - before,
        3,
        "{n} concurrent local duplicates: one claim, its flush and one completion statement"
    );

    // Non-waiting duplicates: one claim statement, one lease, the rest InProgress.
    let before = trips_but_flushes(&engine);
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (engine, barrier) = (engine.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                match engine.claim(b"dup-claim", &ClaimOptions::default()) {
                    Ok(Claim::Acquired(lease)) => Some(lease.detach()),
                    Ok(Claim::InProgress(_)) => None,
                    other => panic!("unexpected {other:?}"),
                }
            })
        })
        .collect();
    let won: Vec<_> = handles
        .into_iter()
        .filter_map(|h| h.join().expect("no panic"))
        .collect();
    assert_eq!(won.len(), 1, "one duplicate acquires");
    assert_eq!(
        trips_but_flushes(&engine) - before,
        1,
        "one claim statement for {n} duplicates"
    );
    assert!(engine.stats().in_progress >= (n - 1) as u64);
}

#[test]
fn a_cached_completion_is_replayed_without_a_round_trip() {
    let p = prefix("cache");
    let (a, b) = (engine(&p), engine(&p));
    let opts = ClaimOptions::default().payload(b"req");
    let first = a
        .run(b"k", &opts, |_| Ok::<_, std::io::Error>(b"stored".to_vec()))
        .expect("run");
    assert!(!first.replayed());

    let before = trips(&a);
    for _ in 0..3 {
        match a.claim(b"k", &opts).expect("claim") {
            Claim::Completed(s) => assert_eq!(s.response(), b"stored"),
            other => panic!("expected a replay, got {other:?}"),
        }
    }
    assert_eq!(
        trips(&a),
        before,
        "the completing engine replays from its cache"
    );

    // Another engine asks once, then replays from its own cache.
    let before = trips(&b);
    let again = b
        .run(b"k", &opts, |_| {
            Ok::<_, std::io::Error>(b"second run".to_vec())
        })
        .expect("run");
    assert!(again.replayed());
    assert_eq!(again.response(), b"stored");
    assert_eq!(trips(&b) - before, 1);
    let replay = b.run(b"k", &opts, |_| Ok::<_, std::io::Error>(b"x".to_vec()));
    assert_eq!(replay.expect("run").response(), b"stored");
    assert_eq!(
        trips(&b) - before,
        1,
        "the second replay came from the cache"
    );

    // The cached fingerprint refuses another request under the key, still without a trip.
    let other = ClaimOptions::default().payload(b"another request");
    assert_eq!(
        b.claim(b"k", &other).err(),
        Some(ClaimError::FingerprintMismatch)
    );
    assert_eq!(trips(&b) - before, 1);
    assert_eq!(a.stats().replays, 3);

    // Typed runs share the path.
    let typed = a
        .run_typed(b"typed", &opts, |_| {
            Ok::<_, std::io::Error>((7u32, "seven".to_string()))
        })
        .expect("typed run");
    let replay = b
        .run_typed(b"typed", &opts, |_| {
            Ok::<_, std::io::Error>((0u32, String::new()))
        })
        .expect("typed replay");
    assert_eq!(replay.value, typed.value);
    assert!(replay.replayed);
}

#[test]
fn an_old_token_is_fenced_after_another_engine_took_the_key_over() {
    let p = prefix("fence");
    let (a, b) = (engine(&p), engine(&p));
    let zero = ClaimOptions::default().lease(Duration::ZERO);
    let Claim::Acquired(old) = a.claim(b"k", &zero).expect("claim") else {
        panic!("a fresh key is acquired");
    };
    old_checkpoint(&a, &old);
    let Claim::Acquired(new) = b.claim(b"k", &ClaimOptions::default()).expect("claim") else {
        panic!("a lease of zero is over at once, on the database's clock");
    };
    assert_eq!(new.attempt(), 2);
    assert!(new.token() > old.token());
    assert_eq!(
        new.checkpoint().map(|c| (c.phase(), c.data().to_vec())),
        Some((1, b"half".to_vec()))
    );

    let (key, token) = (old.key().to_vec(), old.token());
    assert_eq!(
        a.extend(&key, token, Duration::from_secs(5)),
        Err(LeaseError::LeaseLost)
    );
    assert_eq!(
        a.checkpoint(&key, token, 2, b"late"),
        Err(LeaseError::LeaseLost)
    );
    assert_eq!(a.release(&key, token), Ok(false));
    assert_eq!(old.complete(b"stale"), Err(LeaseError::LeaseLost));
    new.complete(b"fresh").expect("the new holder completes");
    match a.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::Completed(s) => assert_eq!(s.response(), b"fresh"),
        other => panic!("expected the new holder's bytes, got {other:?}"),
    }
    assert!(a.stats().leases_lost >= 3);
    assert_eq!(b.stats().takeovers, 1);
}

fn old_checkpoint(e: &Engine, lease: &idemkv::Lease) {
    e.checkpoint(lease.key(), lease.token(), 1, b"half")
        .expect("the holder saves a checkpoint");
}

#[test]
fn takeover_waits_for_the_lease_end_on_the_database_clock() {
    let p = prefix("takeover");
    // The engines' own clocks jump an hour ahead: the database's clock decides.
    let clock = MockClock::new();
    let open = || {
        Engine::builder()
            .postgres(config(&p))
            .clock(clock.clone())
            .open()
            .expect("open")
    };
    let (a, b) = (open(), open());
    let lease = Duration::from_millis(300);
    let Claim::Acquired(held) = a
        .claim(b"k", &ClaimOptions::default().lease(lease))
        .expect("claim")
    else {
        panic!("acquired");
    };
    let held = held.detach(); // the holder dies without settling
    clock.advance(Duration::from_secs(3600));
    match b.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::InProgress(busy) => {
            assert!(busy.retry_after() <= lease && busy.retry_after() > Duration::ZERO);
            assert_eq!(busy.attempt(), 1);
        }
        other => panic!("the lease is live on the database's clock: {other:?}"),
    }
    let waiting = ClaimOptions::default().wait(Duration::from_secs(20));
    let Claim::Acquired(next) = b.claim_or_wait(b"k", &waiting).expect("claim") else {
        panic!("the waiter takes the key over once the lease ended");
    };
    assert_eq!(next.attempt(), 2);
    assert!(next.token() > held.token());
    assert_eq!(
        a.complete(held.key(), held.token(), b"late"),
        Err(LeaseError::LeaseLost)
    );
    next.complete(b"done").expect("complete");
    drop(a); // a closed process's leases are the database's to end; nothing else remains
    assert!(matches!(
        b.get(b"k").expect("get"),
        Some(KeyState::Completed { .. })
    ));
}

#[test]
fn release_extend_and_checkpoint_follow_the_state_machine() {
    let p = prefix("holder");
    let (a, b) = (engine(&p), engine(&p));
    let Claim::Acquired(mut lease) = a
        .claim(
            b"k",
            &ClaimOptions::default().lease(Duration::from_secs(30)),
        )
        .expect("claim")
    else {
        panic!("acquired");
    };
    lease.set_checkpoint(3, b"step three").expect("checkpoint");
    lease.extend(Duration::from_secs(600)).expect("extend");
    match b.get(b"k").expect("get") {
        Some(KeyState::InFlight {
            token,
            lease_remaining,
            checkpoint,
            ..
        }) => {
            assert_eq!(token, lease.token());
            assert!(
                lease_remaining > Duration::from_secs(500),
                "{lease_remaining:?}"
            );
            assert_eq!(checkpoint.map(|c| c.phase()), Some(3));
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
    assert!(matches!(
        b.claim(b"k", &ClaimOptions::default()),
        Ok(Claim::InProgress(_))
    ));
    let token = lease.token();
    assert_eq!(lease.release(), Ok(true));
    assert_eq!(
        a.release(b"k", token),
        Ok(false),
        "a second release holds nothing"
    );
    assert_eq!(b.get(b"k").expect("get"), None);
    let short = ClaimOptions::default().lease(Duration::from_secs(1));
    let Claim::Acquired(mut again) = b.claim(b"k", &short).expect("claim") else {
        panic!("a released key is Absent");
    };
    assert_eq!(again.attempt(), 1);
    assert!(again.checkpoint().is_none());
    assert!(again.token() > token);
    again.set_checkpoint(1, b"charged").expect("checkpoint");

    // A dropped lease decides nothing: the key stays held, for this process's front and for
    // the other process, until the lease ends; then it is taken over with its checkpoint.
    drop(again);
    for engine in [&b, &a] {
        assert!(matches!(
            engine.claim(b"k", &ClaimOptions::default()),
            Ok(Claim::InProgress(_))
        ));
    }
    let waiting = ClaimOptions::default().wait(Duration::from_secs(10));
    match b.claim_or_wait(b"k", &waiting) {
        Ok(Claim::Acquired(next)) => {
            assert_eq!(next.attempt(), 2);
            assert_eq!(next.checkpoint().map(|c| c.phase()), Some(1));
        }
        other => panic!("expected a takeover at the lease's end, got {other:?}"),
    }

    // Limits are checked before anything is sent.
    assert!(matches!(
        a.claim(b"", &ClaimOptions::default()),
        Err(ClaimError::KeyEmpty)
    ));
}

#[test]
fn the_async_api_runs_on_tokio() {
    let p = prefix("async");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (a, b) = (engine(&p), engine(&p));
    let runs = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..16 {
            let engine = if i % 2 == 0 { a.clone() } else { b.clone() };
            let runs = runs.clone();
            tasks.push(tokio::spawn(async move {
                engine
                    .run_async(b"async-key", &ClaimOptions::default(), |lease| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        lease.set_checkpoint(1, b"c").await?;
                        lease.extend(Duration::from_secs(60)).await?;
                        Ok::<_, LeaseError>(format!("token {}", lease.token()).into_bytes())
                    })
                    .await
                    .expect("outcome")
            }));
        }
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.expect("task"));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(outcomes
            .iter()
            .all(|o| o.response() == outcomes[0].response()));

        let Claim::Acquired(lease) = a
            .claim_async(b"other", &ClaimOptions::default())
            .await
            .expect("claim")
        else {
            panic!("acquired");
        };
        assert_eq!(lease.release_async().await, Ok(true));
        let Claim::Acquired(lease) = b
            .claim_or_wait_async(b"other", &ClaimOptions::default())
            .await
            .expect("claim")
        else {
            panic!("acquired after the release");
        };
        lease.complete_async(b"async done").await.expect("complete");
        a.flush_async().await.expect("flush");
        match a.claim_async(b"other", &ClaimOptions::default()).await {
            Ok(Claim::Completed(s)) => assert_eq!(s.response(), b"async done"),
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn a_connection_killed_mid_call_gives_outcome_unknown_and_loses_nothing() {
    let p = prefix("unknown");
    let (a, b) = (engine(&p), engine(&p));
    let Claim::Acquired(lease) = a.claim(b"k", &ClaimOptions::default()).expect("claim") else {
        panic!("acquired");
    };
    let token = lease.token();

    // A completion blocked behind a row lock loses its connection.
    let lock = RowLock::take(&p, b"k");
    let completing = std::thread::spawn(move || lease.complete(b"result"));
    kill_blocked_connection(&p);
    let answer = completing.join().expect("no panic");
    assert!(
        matches!(answer, Err(LeaseError::OutcomeUnknown(_))),
        "{answer:?}"
    );
    drop(lock);

    // A claim blocked the same way (a claim meeting a live row takes no lock: it waits only
    // for the insert of a key whose inserting transaction is still open).
    let lock = RowLock::insert(&p, b"other");
    let b2 = b.clone();
    let claiming = std::thread::spawn(move || b2.claim(b"other", &ClaimOptions::default()));
    kill_blocked_connection(&p);
    let answer = claiming.join().expect("no panic");
    assert!(
        matches!(answer, Err(ClaimError::OutcomeUnknown(_))),
        "{answer:?}"
    );
    drop(lock);

    // The pools reconnect; the completion, never committed, is made again by its holder.
    assert!(matches!(
        b.get(b"k").expect("get"),
        Some(KeyState::InFlight { .. })
    ));
    a.complete(b"k", token, b"result")
        .expect("the holder completes again");
    match b.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::Completed(s) => assert_eq!((s.response(), s.token()), (&b"result"[..], token)),
        other => panic!("{other:?}"),
    }
    // A repeated completion with the same token is answered as done.
    a.complete(b"k", token, b"result").expect("repeat");
}

/// Two completions under the same token that wait for the same row (a retry racing the
/// statement it retries, from two processes) both succeed: the one that writes, and the
/// other as a repeat once it reads the committed row, never `LeaseLost`.
#[test]
fn a_same_token_completion_committed_meanwhile_is_a_repeat() {
    let p = prefix("samecomplete");
    let (a, b) = (engine(&p), engine(&p));
    let lease = acquire(&a, b"k");
    let token = lease.token();
    let lock = RowLock::take(&p, b"k");
    let racers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|e| std::thread::spawn(move || e.complete(b"k", token, b"result")))
        .collect();
    wait_blocked_connections(&p, 2);
    drop(lock);
    for r in racers {
        r.join().expect("no panic").expect("written, or a repeat");
    }
    drop(lease);
    assert_eq!(completed(&b, b"k"), (b"result".to_vec(), token));
}

/// A claim that meets an insert made without the claim lock, still in flight, waits for its
/// commit and answers from the committed row in the same call: one round trip, not a
/// second ask.
#[test]
fn a_claim_meeting_an_insert_in_flight_answers_in_one_round_trip() {
    let p = prefix("inflight");
    let e = engine(&p);
    let lock = RowLock::insert_live(&p, b"k");
    let before = e.stats().db_round_trips;
    let e2 = e.clone();
    let claiming = std::thread::spawn(move || e2.claim(b"k", &ClaimOptions::default()));
    wait_blocked_connection(&p);
    lock.commit();
    match claiming.join().expect("no panic").expect("claim") {
        Claim::InProgress(busy) => assert_eq!(busy.attempt(), 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.stats().db_round_trips - before, 1);
}

/// Another process's claim that inserted the key and has not committed holds the key's
/// claim lock: a claim of the key answers at once that the key is held (it would time out
/// waiting for that commit), in one round trip; once that claim rolled back, the next
/// claim acquires the key.
#[test]
fn a_claim_meeting_another_claims_insert_in_flight_answers_at_once() {
    let p = prefix("claimlock");
    let e = engine_timing_out(&p, Duration::from_secs(2));
    let lock = RowLock::hold(&format!(
        "SELECT kind FROM \"{p}claim\"('\\x{}', NULL, NULL, 60000000, 86400000000, NULL, \
         NULL, false, false)",
        hex(b"k")
    ));
    let before = e.stats().db_round_trips;
    let lease = Duration::from_secs(7);
    match e.claim(b"k", &ClaimOptions::default().lease(lease)) {
        Ok(Claim::InProgress(busy)) => {
            assert_eq!(busy.attempt(), 1);
            assert!(busy.retry_after() <= lease, "{:?}", busy.retry_after());
        }
        other => panic!("expected the key held, got {other:?}"),
    }
    assert_eq!(e.stats().db_round_trips - before, 1);
    drop(lock);
    match e.claim(b"k", &ClaimOptions::default()) {
        Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
        other => panic!("expected the key free after the rollback, got {other:?}"),
    }
}

/// A database of schema version 5 (its claim function did not take the claim lock) is
/// upgraded in place to the function that does.
#[test]
fn a_database_of_schema_version_5_is_upgraded_once() {
    let p = prefix("upgrade5");
    as_version(
        &p,
        5,
        &format!(
            "DO $$ BEGIN EXECUTE replace(pg_get_functiondef('\"{p}claim\"'::regproc), \
             'pg_try_advisory_xact_lock(', 'pg_try_advisory_xact_lock_shared('); END $$;"
        ),
    );
    assert_eq!(claim_fn_takes_the_claim_lock(&p), "f");
    let e = engine(&p);
    assert_eq!(schema_version(&p), "8");
    assert_eq!(claim_fn_takes_the_claim_lock(&p), "t");
    assert_eq!(complete_fn_count(&p), "1");
    let Claim::Acquired(lease) = e.claim(b"k", &ClaimOptions::default()).expect("claim") else {
        panic!("acquired");
    };
    lease.complete(b"ok").expect("complete");
}

/// A database of schema version 6 (no completion function) is upgraded in place to the
/// current version: the claim function is replaced, the completion function installed,
/// and completions queued behind a busy lane, which call it, complete.
#[test]
fn a_database_of_schema_version_6_is_upgraded_once() {
    let p = prefix("upgrade6");
    // Version 6's claim function stands in as the current one, marked.
    as_version(
        &p,
        6,
        &format!(
            "DROP FUNCTION \"{p}complete\"; \
             DO $$ BEGIN EXECUTE replace(pg_get_functiondef('\"{p}claim\"'::regproc), \
             'BEGIN', 'BEGIN -- version 6'); END $$;"
        ),
    );
    assert_eq!(complete_fn_count(&p), "0");
    let marked = format!(
        "SELECT count(*) FROM pg_proc WHERE proname = '{p}claim' \
         AND prosrc LIKE '%-- version 6%'"
    );
    assert_eq!(psql(&marked), "1");
    let e = one_lane_engine(&p);
    let other = engine(&p);
    assert_eq!(schema_version(&p), "8");
    assert_eq!(complete_fn_count(&p), "1");
    assert_eq!(psql(&marked), "0", "the claim function is replaced");
    // Two completions queued behind one held by a row lock go as one batch.
    let blocked = acquire(&e, b"blocked");
    let queued: Vec<idemkv::Lease> = [&b"c-1"[..], b"c-2"]
        .into_iter()
        .map(|k| acquire(&e, k))
        .collect();
    let (lane, threads, lock) = complete_behind_a_busy_lane(&e, &p, blocked, queued);
    drop(lock);
    lane.join()
        .expect("no panic")
        .expect("the lane's completion");
    // Another engine reads what the batch stored (the first one's front caches it).
    for t in threads {
        let (answer, key) = t.join().expect("no panic");
        answer.expect("a batched completion");
        assert_eq!(completed(&other, &key).0, key);
    }
}

/// A database of schema version 7 (no lifetime token's table) is upgraded in place to 8:
/// the table is created unlogged, and an engine opened on it commits its claims early.
#[test]
fn a_database_of_schema_version_7_is_upgraded_once() {
    let p = prefix("upgrade7");
    as_version(&p, 7, &format!("DROP TABLE \"{p}life\";"));
    let e = engine(&p);
    assert_eq!(schema_version(&p), "8");
    assert_eq!(
        psql(&format!(
            "SELECT relpersistence FROM pg_class WHERE oid = '\"{p}life\"'::regclass"
        )),
        "u",
        "unlogged"
    );
    match e.claim(b"k", &ClaimOptions::default()) {
        Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.stats().db_flushes, 1, "the acquisition was flushed");
}

/// Creates the tables of `p` at the current version, runs `sql` (which takes away what
/// the versions after `version` added) and writes `version` in the version row.
fn as_version(p: &str, version: u32, sql: &str) {
    drop(engine(p));
    psql(&format!(
        "{sql} UPDATE \"{p}meta\" SET value = {version} WHERE name = 'schema_version'"
    ));
}

/// The schema version the meta table of the tables of `p` holds.
fn schema_version(p: &str) -> String {
    psql(&format!(
        "SELECT value FROM \"{p}meta\" WHERE name = 'schema_version'"
    ))
}

/// How many completion functions the tables of `p` have ("0" or "1").
fn complete_fn_count(p: &str) -> String {
    psql(&format!(
        "SELECT count(*) FROM pg_proc WHERE proname = '{p}complete'"
    ))
}

/// Whether the claim function of the tables of `p` takes the key's claim lock ("t"/"f").
fn claim_fn_takes_the_claim_lock(p: &str) -> String {
    psql(&format!(
        "SELECT bool_and(prosrc LIKE '%pg_try_advisory_xact_lock(%') FROM pg_proc \
         WHERE proname = '{p}claim'"
    ))
}

#[test]
fn a_statement_cancelled_at_its_timeout_is_a_typed_refusal() {
    let p = prefix("timeout");
    let a = engine_timing_out(&p, Duration::from_millis(300));
    let Claim::Acquired(lease) = a.claim(b"k", &ClaimOptions::default()).expect("claim") else {
        panic!("acquired");
    };
    let lock = RowLock::take(&p, b"k");
    let e = a.extend(b"k", lease.token(), Duration::from_secs(60));
    drop(lock);
    match e {
        Err(LeaseError::Database(e)) => {
            assert_eq!(e.kind(), DatabaseErrorKind::StatementTimeout, "{e}");
            assert_eq!(e.code(), Some("57014"));
            assert!(std::error::Error::source(&e).is_some());
        }
        other => panic!("expected a statement timeout, got {other:?}"),
    }
    // Nothing changed: the lease still holds the key.
    lease.complete(b"ok").expect("complete");
}

/// A claim answered by another holder's live row, or by a live completion, neither locks
/// the row nor waits for its lock: it is read-only (and so commits without a WAL flush).
#[test]
fn a_claim_answered_by_a_live_row_does_not_wait_for_its_lock() {
    let p = prefix("nolock");
    let a = engine(&p);
    let b = engine_timing_out(&p, Duration::from_millis(300));
    let Claim::Acquired(held) = a.claim(b"held", &ClaimOptions::default()).expect("claim") else {
        panic!("acquired");
    };
    let Claim::Acquired(done) = a.claim(b"done", &ClaimOptions::default()).expect("claim") else {
        panic!("acquired");
    };
    let done_token = done.token();
    done.complete(b"stored").expect("complete");

    // Both rows locked by another transaction (as a completion or an extension in flight
    // would lock them): a claim that locked them would time out.
    let locks = (RowLock::take(&p, b"held"), RowLock::take(&p, b"done"));
    match b.claim(b"held", &ClaimOptions::default()).expect("claim") {
        Claim::InProgress(busy) => assert_eq!(busy.attempt(), 1),
        other => panic!("{other:?}"),
    }
    match b.claim(b"done", &ClaimOptions::default()).expect("claim") {
        Claim::Completed(s) => assert_eq!((s.response(), s.token()), (&b"stored"[..], done_token)),
        other => panic!("{other:?}"),
    }
    drop(locks);
    held.complete(b"ok").expect("the holder still completes");
}

#[test]
fn engines_opening_at_once_create_the_schema_once() {
    let p = prefix("migrate");
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (barrier, p) = (barrier.clone(), p.clone());
            std::thread::spawn(move || {
                barrier.wait();
                Engine::builder().postgres(config(&p)).open()
            })
        })
        .collect();
    let engines: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("no panic").expect("every open succeeds"))
        .collect();
    assert_eq!(
        psql(&format!("SELECT name || '=' || value FROM \"{p}meta\"")),
        "schema_version=8"
    );
    let again = engine(&p);
    assert!(matches!(
        again.claim(b"k", &ClaimOptions::default()),
        Ok(Claim::Acquired(_))
    ));
    drop(engines);
    // A database of another schema version is refused, not misread.
    psql(&format!("UPDATE \"{p}meta\" SET value = 99"));
    match Engine::builder().postgres(config(&p)).open() {
        Err(OpenError::Database(e)) => assert_eq!(e.kind(), DatabaseErrorKind::Schema, "{e}"),
        other => panic!("expected a schema refusal, got {other:?}"),
    }
}

#[test]
fn a_role_without_privileges_gets_typed_permission_errors() {
    let p = prefix("perm");
    let owner = engine(&p);
    let role = format!("{p}role");
    psql(&format!("CREATE ROLE \"{role}\" LOGIN"));
    let base = url();
    assert!(
        base.contains("://postgres@"),
        "the test expects the URL of scripts/pg.sh"
    );
    let as_role = |prefix: &str| {
        Engine::builder()
            .postgres(
                PostgresConfig::new(base.replace("://postgres@", &format!("://{role}@")))
                    .table_prefix(prefix),
            )
            .open()
    };
    // Not even the version row can be read.
    match as_role(&p) {
        Err(e) => {
            assert_eq!(e.kind(), OpenErrorKind::PermissionDenied, "{e}");
            assert!(std::error::Error::source(&e).is_some());
        }
        Ok(_) => panic!("a role without privileges must not open"),
    }
    // It may read the version (the open succeeds) but not claim.
    psql(&format!("GRANT SELECT ON \"{p}meta\" TO \"{role}\""));
    let weak = as_role(&p).expect("the version row is readable");
    match weak.claim(b"k", &ClaimOptions::default()) {
        Err(ClaimError::Database(e)) => {
            assert_eq!(e.kind(), DatabaseErrorKind::PermissionDenied, "{e}");
            assert_eq!(e.code(), Some("42501"));
        }
        other => panic!("expected a permission refusal, got {other:?}"),
    }
    assert!(matches!(
        owner.claim(b"k", &ClaimOptions::default()),
        Ok(Claim::Acquired(_))
    ));
    drop(weak);
    psql(&format!(
        "REVOKE ALL ON \"{p}meta\" FROM \"{role}\"; DROP ROLE \"{role}\""
    ));
}

/// Gives `EXECUTE` on the flush's function back to everyone when dropped, even if the test
/// that took it away fails.
struct FlushRevoked;

/// `REVOKE` or `GRANT` of every form of the flush's function (PostgreSQL 17 added one).
fn emit_privilege(change: &str) -> String {
    format!(
        "DO $$ DECLARE f regprocedure; BEGIN \
         FOR f IN SELECT oid::regprocedure FROM pg_proc \
                  WHERE proname = 'pg_logical_emit_message' LOOP \
             EXECUTE format('{change}', f); \
         END LOOP; END $$"
    )
}

impl FlushRevoked {
    fn now() -> FlushRevoked {
        psql(&emit_privilege("REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC"));
        FlushRevoked
    }
}

impl Drop for FlushRevoked {
    fn drop(&mut self) {
        psql(&emit_privilege("GRANT EXECUTE ON FUNCTION %s TO PUBLIC"));
    }
}

/// The lifetime token of the tables of `p` (empty: no row).
fn life_token(p: &str) -> String {
    psql(&format!("SELECT token FROM \"{p}life\" WHERE id = 1"))
}

/// A claim commits early and reads the server's lifetime token (an unlogged row that
/// crash recovery empties, and that another server has its own of) in its own statement;
/// its flush proves it durable only if it still reads that token. Here the acquisition's
/// flush waits behind a busy completion lane while the token is replaced, as a failover
/// to another server, or a crash-restart and a new token, between the claim's commit and
/// the flush would do (the flush then succeeds on its new connection): the acquisition is
/// `OutcomeUnknown` and the key stays held by the unknown lease. A claim that reads no
/// token at all (the first after a crash) is `OutcomeUnknown` at once, and the engine
/// writes a new token, under which the next acquisitions are given out.
#[test]
fn an_acquisition_whose_flush_finds_a_new_server_lifetime_is_unknown() {
    let p = prefix("life");
    let e = one_lane_engine(&p);
    let old = life_token(&p);
    assert!(!old.is_empty(), "the open wrote the lifetime token");
    let blocked = acquire(&e, b"blocked");
    let (lane, threads, lock) = complete_behind_a_busy_lane(&e, &p, blocked, Vec::new());
    let batched = e.stats().db_completions_batched;
    let claiming = {
        let e = e.clone();
        std::thread::spawn(move || e.claim(b"k", &ClaimOptions::default()))
    };
    // The claim committed, and its flush queued behind the busy lane.
    wait_until(|| e.stats().db_completions_batched == batched + 1);
    let state = psql(&format!(
        "SELECT state FROM \"{p}keys\" WHERE key = '\\x{}'",
        hex(b"k")
    ));
    assert_eq!(state, "i", "the claim committed before its flush");
    psql(&format!("UPDATE \"{p}life\" SET token = token + 1"));
    drop(lock);
    lane.join()
        .expect("no panic")
        .expect("the lane's completion");
    assert!(threads.is_empty());
    match claiming.join().expect("no panic") {
        Err(ClaimError::OutcomeUnknown(why)) => assert!(why.contains("restarted"), "{why}"),
        other => panic!("a claim the server may have lost must not be given out: {other:?}"),
    }
    match engine(&p).claim(b"k", &ClaimOptions::default()) {
        Ok(Claim::InProgress(busy)) => assert_eq!(busy.attempt(), 1),
        other => panic!("the unknown lease holds the key: {other:?}"),
    }

    // No token: the claim reads none, and is unknown without a flush.
    psql(&format!("DELETE FROM \"{p}life\""));
    let flushes = e.stats().db_flushes;
    match e.claim(b"k2", &ClaimOptions::default()) {
        Err(ClaimError::OutcomeUnknown(why)) => assert!(why.contains("restarted"), "{why}"),
        other => panic!("a claim that read no token must not be given out: {other:?}"),
    }
    assert_eq!(e.stats().db_flushes, flushes, "nothing to flush against");
    let new = life_token(&p);
    assert!(
        !new.is_empty() && new != old,
        "a new token: {old} then {new}"
    );
    match e.claim(b"after", &ClaimOptions::default()) {
        Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
        other => panic!("acquisitions under the new token are given out: {other:?}"),
    }
    assert_eq!(e.stats().db_flushes - flushes, 1);
}

/// Claims commit without waiting for the disk, and an acquisition is given out only after
/// a flush: when the flush fails, the claim (committed, its durability unknown) answers
/// `OutcomeUnknown`, and the key stays held by that unknown lease; a flush refused for want
/// of the privilege also makes the engine's later claims commit as any statement does. A
/// role that may not force the flush at open gets such claims from the start, and no
/// flush. (Superusers, which every other test connects as, are not affected by the
/// revoke.)
#[test]
fn an_acquisition_is_given_out_only_after_its_flush() {
    let p = prefix("flush");
    let owner = engine(&p);
    let role = format!("{p}role");
    psql(&format!(
        "CREATE ROLE \"{role}\" LOGIN; \
         GRANT ALL ON ALL TABLES IN SCHEMA public TO \"{role}\"; \
         GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO \"{role}\""
    ));
    let as_role = || {
        Engine::builder()
            .postgres(
                PostgresConfig::new(url().replace("://postgres@", &format!("://{role}@")))
                    .table_prefix(&p),
            )
            .open()
            .expect("the role opens")
    };
    let early = as_role();
    match early.claim(b"before", &ClaimOptions::default()) {
        Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
        other => panic!("{other:?}"),
    }
    assert_eq!(early.stats().db_flushes, 1, "the acquisition was flushed");
    {
        let _revoked = FlushRevoked::now();
        match early.claim(b"k", &ClaimOptions::default()) {
            Err(ClaimError::OutcomeUnknown(why)) => assert!(why.contains("flush"), "{why}"),
            other => panic!("an unflushed acquisition must not be given out: {other:?}"),
        }
        let state = psql(&format!(
            "SELECT state FROM \"{p}keys\" WHERE key = '\\x{}'",
            hex(b"k")
        ));
        assert_eq!(state.trim(), "i", "the claim itself committed");
        match early.claim(b"k", &ClaimOptions::default()) {
            Ok(Claim::InProgress(busy)) => assert_eq!(busy.attempt(), 1),
            other => panic!("the unknown lease holds the key: {other:?}"),
        }
        // The refusal turned its early commits off: no flush is asked any more.
        match early.claim(b"k4", &ClaimOptions::default()) {
            Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
            other => panic!("{other:?}"),
        }
        assert_eq!(early.stats().db_flushes, 2, "only the refused flush since");
        // Opened while it may not flush: its claims commit as any statement does.
        let plain = as_role();
        match plain.claim(b"k2", &ClaimOptions::default()) {
            Ok(Claim::Acquired(lease)) => lease.complete(b"ok").expect("complete"),
            other => panic!("{other:?}"),
        }
        assert_eq!(plain.stats().db_flushes, 0);
        // A superuser may always flush.
        assert!(matches!(
            owner.claim(b"k3", &ClaimOptions::default()),
            Ok(Claim::Acquired(_))
        ));
    }
    drop(early);
    psql(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""));
}

/// `url()` with the connections' `application_name` set, so that the server's view of an
/// engine's connections can be found.
fn url_named(app: &str) -> String {
    let base = url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}application_name={app}")
}

/// Connections the server has open for `app`.
fn connections_of(app: &str) -> u64 {
    let n = psql(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'"
    ));
    n.parse().expect("a count")
}

/// Ends every connection of `app` and waits (bounded) until their backends have exited;
/// returns how many there were. (Connections the engine opens meanwhile, such as its
/// listener's next one, are not waited for.)
fn end_connections(app: &str) -> usize {
    // The function in the select list runs only for the rows the filter keeps (in the
    // filter, the planner may run it first, on every backend of the server).
    let pids = psql(&format!(
        "SELECT string_agg(pid::text, ',') FROM \
         (SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity \
          WHERE application_name = '{app}') AS ended"
    ));
    let n = pids.split(',').filter(|p| !p.is_empty()).count();
    if n > 0 {
        let gone = format!("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid IN ({pids})");
        wait_until(|| psql(&gone) == "t");
    }
    n
}

/// A blocking claim's and completion's statements run on a connection that the caller's
/// thread drives, beside the pool's (which the open used) and the listener's. An engine's
/// connections, both kinds together, stay within its `pool_size` (and the listener's one
/// more) while blocking threads and async tasks call it at once.
#[test]
fn blocking_calls_use_a_connection_of_their_own_within_the_pool_size() {
    let p = prefix("direct");
    let app = format!("idemkv_{p}");
    // Two lanes: two direct connections, and the pool keeps three.
    let pool_size = 5;
    let e = Engine::builder()
        .postgres(
            PostgresConfig::new(url_named(&app))
                .table_prefix(&p)
                .pool_size(pool_size),
        )
        .open()
        .expect("open");
    assert_eq!(
        connections_of(&app),
        2,
        "the pool's (the open's migration used it) and the listener's"
    );
    acquire(&e, b"one").complete(b"r").expect("complete");
    assert_eq!(
        connections_of(&app),
        3,
        "the blocking claim and completion ran on one more connection, not the pool's"
    );

    // Blocking threads and async tasks at once, on distinct keys, while another thread
    // samples the server's count of the engine's connections.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (done, app) = (done.clone(), app.clone());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::Acquire) {
                peak = peak.max(connections_of(&app));
            }
            peak
        })
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let start = Arc::new(Barrier::new(9));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (e, start) = (e.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..40 {
                    let key = format!("t{t}-{i}");
                    match e.claim(key.as_bytes(), &ClaimOptions::default()) {
                        Ok(Claim::Acquired(l)) => l.complete(b"r").expect("complete"),
                        other => panic!("{other:?}"),
                    }
                }
            })
        })
        .collect();
    start.wait();
    rt.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let e = e.clone();
                tokio::spawn(async move {
                    for i in 0..40 {
                        let key = format!("a{t}-{i}");
                        match e
                            .claim_async(key.as_bytes(), &ClaimOptions::default())
                            .await
                        {
                            Ok(Claim::Acquired(l)) => {
                                l.complete_async(b"r").await.expect("complete")
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
    });
    for t in threads {
        t.join().expect("thread");
    }
    done.store(true, Ordering::Release);
    let peak = sampler.join().expect("sampler");
    assert!(
        (3..=pool_size as u64 + 1).contains(&peak),
        "at most {peak} connections seen at once: pool_size {pool_size} and the listener"
    );
}

/// An async claim dropped while its statement waits on the server goes on without its
/// caller: the claim acquires once the key's other insert rolls back, and the lease is
/// released at once (`Stats::claims_cancelled`), so another engine acquires the key instead
/// of finding it held.
#[test]
fn an_async_claim_dropped_in_flight_releases_the_lease_it_acquires() {
    let p = prefix("dropped");
    let (e, other) = (engine(&p), engine(&p));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let lock = RowLock::insert(&p, b"k");
    let claiming = {
        let e = e.clone();
        rt.spawn(async move { e.claim_async(b"k", &ClaimOptions::default()).await })
    };
    // The task runs (sending the statement) while this thread waits for the server to show
    // the claim blocked on the uncommitted insert.
    let server = std::thread::spawn({
        let p = p.clone();
        move || wait_blocked_connection(&p)
    });
    rt.block_on(async {
        while !server.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    server.join().expect("the claim reached the server");
    claiming.abort();
    let aborted = rt.block_on(claiming);
    assert!(
        aborted.is_err_and(|e| e.is_cancelled()),
        "dropped before it ended"
    );
    assert_eq!(e.stats().claims_cancelled, 0);
    drop(lock);
    // Counted before the release is sent: the release is seen in the row.
    wait_until(|| e.stats().claims_cancelled == 1);
    wait_until(|| !matches!(other.get(b"k"), Ok(Some(KeyState::InFlight { .. }))));
    match other.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::Acquired(lease) => lease.complete(b"r").expect("complete"),
        other => panic!("the dropped claim's lease was released: {other:?}"),
    }
}

/// A blocking call made on a thread of the application's own runtime (inside its
/// `block_on`, where no runtime may be started) keeps the pool's connections: it is
/// answered, and does not panic.
#[test]
fn blocking_calls_inside_another_runtime_are_answered() {
    let p = prefix("nested");
    let e = engine(&p);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let token = rt.block_on(async {
        let lease = acquire(&e, b"k");
        let token = lease.token();
        lease.complete(b"r").expect("complete");
        token
    });
    assert_eq!(completed(&e, b"k"), (b"r".to_vec(), token));
}

/// The server ends a direct connection while it sits idle (as a restart would): the next
/// blocking claim notices before it sends anything, on a new connection, and is answered,
/// not made `OutcomeUnknown`; so is the completion.
#[test]
fn a_connection_ended_while_idle_is_replaced_before_the_next_statement() {
    let p = prefix("idle_end");
    let app = format!("idemkv_{p}");
    let e = Engine::builder()
        .postgres(PostgresConfig::new(url_named(&app)).table_prefix(&p))
        .open()
        .expect("open");
    for round in 0..3 {
        let key = format!("k{round}");
        acquire(&e, key.as_bytes())
            .complete(b"r")
            .expect("complete");
        // The direct one at least (the pool's and the listener's, when open).
        assert!(end_connections(&app) >= 1, "round {round}");
    }
    acquire(&e, b"last").complete(b"r").expect("complete");
    assert_eq!(completed(&e, b"last").0, b"r");
}

/// The server refusing for want of resources (SQLSTATE class 53: disk, memory or
/// connections) is a typed refusal: here a role whose connection limit is reached (53300),
/// the one such refusal a test can cause on demand.
#[test]
fn a_server_out_of_connections_gives_a_typed_refusal() {
    let p = prefix("full");
    let role = format!("{p}role");
    psql(&format!("CREATE ROLE \"{role}\" LOGIN CONNECTION LIMIT 0"));
    let opened = Engine::builder()
        .postgres(
            PostgresConfig::new(url().replace("://postgres@", &format!("://{role}@")))
                .table_prefix(&p),
        )
        .open();
    psql(&format!("DROP ROLE \"{role}\""));
    match opened {
        Err(OpenError::Database(e)) => {
            assert_eq!(e.kind(), DatabaseErrorKind::DiskFull, "{e}");
            assert_eq!(e.code(), Some("53300"));
        }
        Err(other) => panic!("expected a class-53 refusal, got {other}"),
        Ok(_) => panic!("a role at its connection limit must not open"),
    }
}

#[test]
fn settings_a_shared_engine_cannot_honour_are_refused_at_open() {
    let refused = |b: idemkv::EngineBuilder| match b.open() {
        Err(e) => e.kind(),
        Ok(_) => panic!("must be refused"),
    };
    let pg = || Engine::builder().postgres(config("t_refused_"));
    assert_eq!(
        refused(pg().durability(Durability::buffered())),
        OpenErrorKind::InvalidConfig
    );
    assert_eq!(refused(pg().path("x.redb")), OpenErrorKind::InvalidConfig);
    assert_eq!(
        refused(Engine::builder().postgres(config("Bad-Prefix"))),
        OpenErrorKind::InvalidConfig
    );
    // A marker window out of range is refused as on a file.
    assert_eq!(
        refused(pg().marker_retention(Some(Duration::ZERO))),
        OpenErrorKind::InvalidConfig
    );
    // Nothing listens on port 1: unavailable, typed.
    let closed = Engine::builder().postgres(
        PostgresConfig::new("postgres://postgres@127.0.0.1:1/postgres")
            .connect_timeout(Duration::from_secs(2)),
    );
    match closed.open() {
        Err(OpenError::Database(e)) => assert_eq!(e.kind(), DatabaseErrorKind::Unavailable),
        other => panic!("expected an unavailable database, got {other:?}"),
    }
}

#[test]
fn retention_is_swept_in_batches_on_the_database_clock() {
    let p = prefix("sweep");
    let a = Engine::builder()
        .postgres(config(&p))
        .retention(Duration::ZERO)
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .expect("open");
    for i in 0..5u32 {
        let key = format!("k{i}");
        a.run(key.as_bytes(), &ClaimOptions::default(), |_| {
            Ok::<_, std::io::Error>(b"r".to_vec())
        })
        .expect("run");
    }
    // Completed with zero retention: new again at once, and swept.
    let Claim::Acquired(lease) = a.claim(b"k0", &ClaimOptions::default()).expect("claim") else {
        panic!("a completion past its retention is Absent");
    };
    assert_eq!(lease.attempt(), 1);
    lease.complete(b"again").expect("complete");
    assert_eq!(a.admin().sweep_now(), Ok(5));
    assert_eq!(psql(&format!("SELECT count(*) FROM \"{p}keys\"")), "0");
}

/// Scopes hold on the shared table (two scopes' equal keys are two rows).
#[test]
fn scopes_hold_on_the_shared_table() {
    let e = engine(&prefix("t_scopes_"));
    let in_scope = |scope: &[u8]| ClaimOptions::default().scope(scope);
    let Ok(Claim::Acquired(a)) = e.claim(b"order-1", &in_scope(b"tenant-a")) else {
        panic!("tenant-a acquires");
    };
    let Ok(Claim::Acquired(b)) = e.claim(b"order-1", &in_scope(b"tenant-b")) else {
        panic!("tenant-b's equal key is another row");
    };
    assert_eq!((a.key(), a.scope()), (&b"order-1"[..], &b"tenant-a"[..]));
    a.complete(b"paid by a").expect("complete a");
    match e.claim(b"order-1", &in_scope(b"tenant-a")) {
        Ok(Claim::Completed(s)) => assert_eq!(s.response(), b"paid by a"),
        other => panic!("tenant-a replays, got {other:?}"),
    }
    assert!(matches!(
        e.claim(b"order-1", &in_scope(b"tenant-b")),
        Ok(Claim::InProgress(_))
    ));
    let token = b.token();
    e.complete_scoped(b"tenant-b", b"order-1", token, b"paid by b")
        .expect("completed through the engine by its token");
    match e.claim(b"order-1", &in_scope(b"tenant-b")) {
        Ok(Claim::Completed(s)) => assert_eq!(s.response(), b"paid by b"),
        other => panic!("tenant-b replays its own bytes, got {other:?}"),
    }
    // The lease object's release on drop is fenced by the InFlight state: it changes nothing.
    drop(b);
}

/// `get` takes keys up to the engine's longest, in any scope, as a claim does: the limit is
/// the caller's key's, not the stored scoped key's.
#[test]
fn get_reads_a_key_of_the_longest_length_in_a_scope() {
    let e = Engine::builder()
        .postgres(config(&prefix("t_getlong_")))
        .key_len_max(16)
        .open()
        .expect("open a shared engine");
    let key = [b'k'; 16];
    let opts = ClaimOptions::default().scope(b"tenant");
    let Ok(Claim::Acquired(lease)) = e.claim(&key, &opts) else {
        panic!("the longest key is claimed");
    };
    assert!(matches!(
        e.get_scoped(b"tenant", &key),
        Ok(Some(KeyState::InFlight { .. }))
    ));
    lease.complete(b"done").expect("complete");
    match e.get_scoped(b"tenant", &key) {
        Ok(Some(KeyState::Completed { response, .. })) => assert_eq!(&response[..], b"done"),
        other => panic!("the completion is read, got {other:?}"),
    }
    assert!(matches!(
        e.get_scoped(b"tenant", &[b'k'; 17]),
        Err(ClaimError::KeyTooLong { len: 17, max: 16 })
    ));
}

/// A waiter in one engine is woken by another engine's completion (its notification is
/// sent after the completing statement committed, in a transaction of its own) and reads
/// the completion: one claim and one re-ask, plus at most one ask per bounded poll (1 s)
/// that fell before the completion committed (a loaded machine can take that long between
/// the wait and the commit). A raw listener receives the notification, and the row it
/// announces is committed.
#[test]
fn a_waiter_in_another_engine_is_woken_after_the_commit_and_sees_the_completion() {
    let p = prefix("wake");
    let (a, b) = (engine(&p), engine(&p));
    let mut listener = pg::listen(&url(), &format!("{p}wake"));

    let lease_opts = ClaimOptions::default().lease(Duration::from_secs(60));
    let Claim::Acquired(lease) = a.claim(b"k", &lease_opts).expect("claim") else {
        panic!("a fresh key is acquired");
    };
    let before = trips(&b);
    let heard_before = b.stats().db_notifications;
    let spawned = Instant::now();
    let waiter = {
        let b = b.clone();
        std::thread::spawn(move || {
            b.claim_or_wait(b"k", &ClaimOptions::default().wait(Duration::from_secs(30)))
        })
    };
    // Polls the waiter's state (it has seen the key held and sleeps), not the time.
    let end = Instant::now() + Duration::from_secs(20);
    while b.stats().waits == 0 {
        assert!(Instant::now() < end, "the waiter never waited");
        std::thread::sleep(Duration::from_millis(5));
    }
    let token = lease.token();
    lease.complete(b"the winner's bytes").expect("complete");
    // The waiter's bounded poll (1 s) may have asked again while the completion was still
    // on its way; each poll that fits in this span is one ask more, and no other ask is.
    let polls = spawned.elapsed().as_secs();
    let Ok(Claim::Completed(stored)) = waiter.join().expect("no panic") else {
        panic!("the woken waiter reads the completion");
    };
    assert_eq!(stored.response(), b"the winner's bytes");
    assert_eq!(stored.token(), token);
    let asks = trips(&b) - before;
    assert!(
        (2..=2 + polls).contains(&asks),
        "one claim, one re-ask after the wake-up and at most {polls} polls: {asks} asks"
    );
    // The notification follows the commit, so a poll may have read the row first.
    wait_until(|| b.stats().db_notifications > heard_before);

    // The listener's notification names a key hash; the row it announces is committed.
    let seen = listener.run(&format!(
        "SELECT state FROM \"{p}keys\" WHERE key = '\\x{}';",
        hex(b"k")
    ));
    listener.close();
    let note = format!("notification \"{p}wake\" with payload \"");
    assert!(
        seen.iter().any(|l| l.contains(&note)),
        "no notification in {seen:?}"
    );
    assert!(seen.iter().any(|l| l == "c"), "{seen:?}");
}

/// `Lease::fail` on the shared table: the attempt ends at once and the row stays InFlight,
/// marked failed, with its checkpoint, fingerprint and first-claimed instant; another
/// engine takes it over at once (attempt + 1, checkpoint kept), a stale token's fail
/// changes nothing, and `run` with `OnHandlerError::Fail` and `fail_async` do the same.
#[test]
fn a_failed_attempt_is_taken_over_at_once_with_its_checkpoint() {
    let p = prefix("fail");
    let (a, b) = (engine(&p), engine(&p));
    let opts = ClaimOptions::default()
        .payload(b"body")
        .lease(Duration::from_secs(600));
    let Claim::Acquired(mut first) = a.claim(b"k", &opts).expect("claim") else {
        panic!("acquired");
    };
    let token = first.token();
    first.set_checkpoint(1, b"charged").expect("checkpoint");
    let first_claimed = match b.get(b"k").expect("get") {
        Some(KeyState::InFlight {
            failed: false,
            first_claimed_at: Some(first_claimed),
            attempt_started_at: Some(started),
            ..
        }) => {
            assert_eq!(started, first_claimed);
            first_claimed
        }
        other => panic!("{other:?}"),
    };
    assert!(first.fail().expect("fail"));
    match b.get(b"k").expect("get") {
        Some(KeyState::InFlight {
            failed: true,
            token: t,
            attempt: 1,
            checkpoint: Some(c),
            lease_remaining,
            ..
        }) => {
            assert_eq!((t, c.phase(), c.data()), (token, 1, &b"charged"[..]));
            assert!(lease_remaining.is_zero(), "{lease_remaining:?}");
        }
        other => panic!("{other:?}"),
    }
    // The fingerprint is kept: another payload is refused, not a takeover.
    assert!(matches!(
        b.claim(b"k", &ClaimOptions::default().payload(b"other")),
        Err(ClaimError::FingerprintMismatch)
    ));
    // The 600 s lease does not hold the failed key: the next claim takes it over now.
    let Claim::Acquired(second) = b.claim(b"k", &opts).expect("claim") else {
        panic!("the failed attempt is taken over at once");
    };
    assert_eq!(second.attempt(), 2);
    assert!(second.token() > token);
    assert_eq!(second.checkpoint().map(|c| c.phase()), Some(1));
    match a.get(b"k").expect("get") {
        Some(KeyState::InFlight {
            failed: false,
            first_claimed_at: Some(f),
            attempt_started_at: Some(s),
            ..
        }) => assert!(f == first_claimed && s >= f, "{f:?} {s:?}"),
        other => panic!("{other:?}"),
    }
    // A superseded token fails nothing.
    assert!(!a.fail(b"k", token).expect("a stale fail answers"));
    second.complete(b"done").expect("complete");

    // `run` with `OnHandlerError::Fail`: the handler's error leaves the key failed.
    let fail_opts = ClaimOptions::default().on_handler_error(idemkv::OnHandlerError::Fail);
    let err = a.run(b"r", &fail_opts, |_| {
        Err::<Vec<u8>, _>(std::io::Error::other("no"))
    });
    assert!(err.is_err());
    assert!(matches!(
        b.get(b"r").expect("get"),
        Some(KeyState::InFlight {
            failed: true,
            attempt: 1,
            ..
        })
    ));

    // `fail_async`.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let Claim::Acquired(lease) = a.claim_async(b"r", &opts).await.expect("claim") else {
            panic!("the failed key is taken over");
        };
        assert_eq!(lease.attempt(), 2);
        assert!(lease.fail_async().await.expect("fail"));
        let Claim::Acquired(lease) = b.claim_async(b"r", &opts).await.expect("claim") else {
            panic!("taken over again");
        };
        assert_eq!(lease.attempt(), 3);
        lease.complete_async(b"ok").await.expect("complete");
    });
}

/// A database created by schema version 1 (its DDL, run here) is upgraded in place by the
/// first of several engines opening at once, exactly once: rows claimed before keep
/// working (no attempt start recorded for them), and later opens find the current version.
#[test]
fn a_database_of_schema_version_1_is_upgraded_once() {
    upgraded_once("upgrade1", 1);
}

/// The same from schema version 2 (version 1's DDL and the columns version 2 added): the
/// upgrade installs the claim function, and claims go through it.
#[test]
fn a_database_of_schema_version_2_is_upgraded_once() {
    upgraded_once("upgrade2", 2);
}

/// The same from schema version 3 (version 2 and its claim function, of six arguments):
/// the upgrade adds the claim identity and replaces the function by the one that takes it.
#[test]
fn a_database_of_schema_version_3_is_upgraded_once() {
    upgraded_once("upgrade3", 3);
}

#[test]
fn a_database_of_schema_version_4_is_upgraded_once() {
    upgraded_once("upgrade4", 4);
}

fn upgraded_once(name: &str, from: u32) {
    let p = prefix(name);
    let v2 = if from >= 2 {
        format!(
            "ALTER TABLE \"{p}keys\" ADD COLUMN failed boolean NOT NULL DEFAULT false,
                ADD COLUMN attempt_started_at timestamptz, ADD COLUMN retention_us bigint;"
        )
    } else {
        String::new()
    };
    // Version 3's claim function, by its signature (the upgrade replaces it).
    let v3 = if from == 3 {
        format!(
            "CREATE FUNCTION \"{p}claim\"(bytea, bytea, bytea, bigint, bigint, bigint)
                RETURNS void LANGUAGE sql AS '';"
        )
    } else {
        String::new()
    };
    // Version 4's: the claim identity's column and the function of seven arguments.
    let v4 = if from >= 4 {
        format!(
            "ALTER TABLE \"{p}keys\" ADD COLUMN claim_id bytea;
            CREATE FUNCTION \"{p}claim\"(bytea, bytea, bytea, bigint, bigint, bigint, bytea)
                RETURNS void LANGUAGE sql AS '';"
        )
    } else {
        String::new()
    };
    psql(&format!(
        "CREATE TABLE \"{p}keys\" (
    key bytea PRIMARY KEY, state text NOT NULL CHECK (state IN ('i', 'c')),
    token bigint NOT NULL, attempt integer NOT NULL, fingerprint bytea,
    checkpoint_phase bigint, checkpoint bytea, response bytea, lease_until timestamptz,
    expires_at timestamptz, reap_at timestamptz NOT NULL,
    first_claimed_at timestamptz NOT NULL, completed_at timestamptz);
CREATE INDEX \"{p}keys_reap_at\" ON \"{p}keys\" (reap_at);
CREATE SEQUENCE \"{p}tokens\" AS bigint MINVALUE 1 NO CYCLE;
CREATE TABLE \"{p}meta\" (name text PRIMARY KEY, value bigint NOT NULL);
{v2}
{v3}
{v4}
INSERT INTO \"{p}meta\" VALUES ('schema_version', {from});
INSERT INTO \"{p}keys\" (key, state, token, attempt, lease_until, reap_at, first_claimed_at)
VALUES ('\\x{}', 'i', nextval('\"{p}tokens\"'), 1, now() + interval '1 hour',
        now() + interval '2 hours', now());",
        hex(b"old")
    ));
    let barrier = Arc::new(Barrier::new(3));
    let engines: Vec<Engine> = (0..3)
        .map(|_| {
            let (barrier, p) = (barrier.clone(), p.clone());
            std::thread::spawn(move || {
                barrier.wait();
                Engine::builder().postgres(config(&p)).open()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("no panic").expect("every open succeeds"))
        .collect();
    assert_eq!(schema_version(&p), "8");
    assert_eq!(claim_fn_takes_the_claim_lock(&p), "t");
    assert_eq!(complete_fn_count(&p), "1");
    assert_eq!(
        psql(&format!(
            "SELECT string_agg(pronargs::text, ',') FROM pg_proc WHERE proname = '{p}claim'"
        )),
        "9"
    );
    // The application's tables and the outbox exist and work.
    let Claim::Acquired(lease) = engines[0]
        .claim(b"with-writes", &ClaimOptions::default())
        .expect("claim")
    else {
        panic!("acquired");
    };
    let mut writes = WriteSet::new();
    writes
        .put("t", b"k", b"v")
        .expect("put")
        .emit(b"m")
        .expect("emit");
    lease
        .complete_with(b"r", &writes)
        .expect("complete with writes");
    assert_eq!(engines[1].table_get("t", b"k"), Ok(Some(b"v".to_vec())));
    match engines[0].get(b"old").expect("get") {
        Some(KeyState::InFlight {
            failed: false,
            first_claimed_at: Some(_),
            attempt_started_at: None,
            attempt: 1,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let Claim::Acquired(lease) = engines[1]
        .claim(b"new", &ClaimOptions::default())
        .expect("claim")
    else {
        panic!("acquired");
    };
    assert!(lease.fail().expect("the new column is written"));
    let own = ClaimOptions::default().retention(Duration::from_secs(7200));
    let Claim::Acquired(lease) = engines[2].claim(b"own", &own).expect("claim") else {
        panic!("acquired");
    };
    lease.complete(b"r").expect("the kept retention is read");
    // A claim identity is kept in the new column: the retry resumes the lease.
    let with_id = ClaimOptions::default().claim_id(42);
    let Claim::Acquired(first) = engines[1].claim(b"id", &with_id).expect("claim") else {
        panic!("acquired");
    };
    match engines[2].claim(b"id", &with_id).expect("claim") {
        Claim::Acquired(again) => assert_eq!(again.token(), first.token()),
        other => panic!("{other:?}"),
    }
    // The row claimed before the upgrade has no identity: nothing resumes it.
    assert!(matches!(
        engines[0].claim(b"old", &with_id).expect("claim"),
        Claim::InProgress(_)
    ));
    assert!(off_by_s(expires_at(&engines[0], b"own"), Duration::from_secs(7200)) < 60);
    // Opening again finds the current version and changes nothing.
    let again = engine(&p);
    assert!(matches!(
        again.get(b"new").expect("get"),
        Some(KeyState::InFlight { failed: true, .. })
    ));
}

/// How far `t` is from `expected` from now, in whole seconds either way.
fn off_by_s(t: std::time::SystemTime, expected: Duration) -> u64 {
    let want = std::time::SystemTime::now() + expected;
    match t.duration_since(want) {
        Ok(d) => d.as_secs(),
        Err(e) => e.duration().as_secs(),
    }
}

fn expires_at(e: &Engine, key: &[u8]) -> std::time::SystemTime {
    match e.get(key).expect("get") {
        Some(KeyState::Completed { expires_at, .. }) => expires_at,
        other => panic!("{other:?}"),
    }
}

/// A key's own retention on the shared table: the claim's (kept through a takeover of the
/// InFlight row unless the taking claim brings its own, and setting when an abandoned claim
/// is reaped), the completion's own over it, zero forgetting at once, and the limit.
/// Every instant is the database's; the checks allow a minute of clock difference.
#[test]
fn a_keys_own_retention_is_kept_through_takeovers_and_reported() {
    let p = prefix("own");
    let day = Duration::from_secs(24 * 3600);
    let hours = |h: u64| Duration::from_secs(h * 3600);
    let open = || {
        Engine::builder()
            .postgres(config(&p))
            .retention(day)
            .tuning(idemkv::Tuning::default().sweep_interval(None))
            .open()
            .expect("open")
    };
    let (a, b) = (open(), open());
    let own = |r: Duration| ClaimOptions::default().retention(r);

    // The claim's own retention decides the completion's expiry.
    let Claim::Acquired(l) = a.claim(b"claim-own", &own(hours(2))).expect("claim") else {
        panic!("acquired");
    };
    l.complete(b"r").expect("complete");
    assert!(off_by_s(expires_at(&b, b"claim-own"), hours(2)) < 60);

    // The completion's own wins over the claim's.
    let Claim::Acquired(l) = a.claim(b"done-own", &own(hours(2))).expect("claim") else {
        panic!("acquired");
    };
    let ten_days = Duration::from_secs(10 * 24 * 3600);
    l.complete_with_options(
        b"r",
        &idemkv::CompleteOptions::default().retention(ten_days),
    )
    .expect("complete");
    assert!(off_by_s(expires_at(&b, b"done-own"), ten_days) < 60);
    match b
        .claim(b"done-own", &ClaimOptions::default())
        .expect("claim")
    {
        Claim::Completed(s) => assert!(off_by_s(s.expires_at(), ten_days) < 60),
        other => panic!("{other:?}"),
    }

    // Zero forgets at once: the next claim is a fresh one.
    let Claim::Acquired(l) = a.claim(b"zero", &own(Duration::ZERO)).expect("claim") else {
        panic!("acquired");
    };
    l.complete(b"r").expect("complete");
    assert!(b.get(b"zero").expect("get").is_none());
    let Claim::Acquired(l) = b.claim(b"zero", &ClaimOptions::default()).expect("claim") else {
        panic!("forgotten at once");
    };
    assert_eq!(l.attempt(), 1);
    l.complete(b"r").expect("complete");
    assert!(
        off_by_s(expires_at(&a, b"zero"), day) < 60,
        "a fresh claim uses the engine's"
    );

    // Kept through a takeover (a lease of zero ends at once), unless the taker asks its own.
    let gone = ClaimOptions::default().lease(Duration::ZERO);
    for (key, taker, want) in [
        (&b"kept"[..], ClaimOptions::default(), hours(3)),
        (&b"replaced"[..], own(hours(5)), hours(5)),
    ] {
        let Claim::Acquired(first) = a
            .claim(key, &gone.clone().retention(hours(3)))
            .expect("claim")
        else {
            panic!("acquired");
        };
        // The abandoned claim is reaped its own retention after its lease's end.
        let reap = psql(&format!(
            "SELECT extract(epoch FROM reap_at - lease_until)::bigint FROM \"{p}keys\" \
             WHERE key = '\\x{}'",
            hex(key)
        ));
        assert_eq!(reap, "10800");
        let Claim::Acquired(second) = b.claim(key, &taker).expect("claim") else {
            panic!("the ended lease is taken over");
        };
        assert_eq!(second.attempt(), 2);
        second.complete(b"r").expect("complete");
        drop(first);
        assert!(off_by_s(expires_at(&a, key), want) < 60, "{key:?}");
    }

    // Past the limit: refused before anything is sent.
    assert!(matches!(
        a.claim(b"long", &own(Duration::from_secs(11 * 366 * 24 * 3600))),
        Err(ClaimError::RetentionTooLong { .. })
    ));
}

/// A copy of the tables without the claim function (a table-only dump, logical
/// replication) is a schema fault, not a refusal to retry: claims report
/// `DatabaseErrorKind::Schema`.
#[test]
fn a_missing_claim_function_is_a_schema_error() {
    let p = prefix("nofn");
    let e = engine(&p);
    psql(&format!("DROP FUNCTION \"{p}claim\""));
    match e.claim(b"k", &ClaimOptions::default()) {
        Err(ClaimError::Database(err)) => {
            assert_eq!(err.kind(), DatabaseErrorKind::Schema, "{err}")
        }
        other => panic!("{other:?}"),
    }
}

/// While the claim lane of a process is busy (a claim waits on another session's
/// uncommitted insert), the claims asked meanwhile queue, and go together in one statement
/// once the lane is free; each still gets its own key's answer: a replay, a key held
/// elsewhere, or a fresh acquisition.
#[test]
fn claims_queued_behind_a_busy_lane_share_a_statement_and_each_gets_its_answer() {
    let p = prefix("batch");
    let e = engine(&p);
    let other = engine(&p);
    let Claim::Acquired(done) = other
        .claim(b"done", &ClaimOptions::default())
        .expect("claim")
    else {
        panic!("acquired");
    };
    done.complete(b"the done bytes").expect("complete");
    let Claim::Acquired(_held) = other
        .claim(b"held", &ClaimOptions::default())
        .expect("claim")
    else {
        panic!("acquired");
    };
    let lock = RowLock::insert_live(&p, b"blocked");
    let claim_on = |key: &[u8]| {
        let (e, key) = (e.clone(), key.to_vec());
        std::thread::spawn(move || (e.claim(&key, &ClaimOptions::default()), key))
    };
    let lane = claim_on(b"blocked");
    wait_blocked_connection(&p);
    let batched = e.stats().db_claims_batched;
    let queued: Vec<_> = [&b"done"[..], b"held", b"fresh-1", b"fresh-2", b"fresh-3"]
        .into_iter()
        .map(claim_on)
        .collect();
    wait_until(|| e.stats().db_claims_batched == batched + 5);
    let before = trips_but_flushes(&e);
    lock.commit();
    match lane.join().expect("no panic") {
        (Ok(Claim::InProgress(busy)), _) => assert_eq!(busy.attempt(), 1),
        (other, _) => panic!("{other:?}"),
    }
    let mut leases = Vec::new();
    for q in queued {
        let (claim, key) = q.join().expect("no panic");
        match (&key[..], claim.expect("claim")) {
            (b"done", Claim::Completed(c)) => assert_eq!(c.response(), b"the done bytes"),
            (b"held", Claim::InProgress(busy)) => assert_eq!(busy.attempt(), 1),
            (k, Claim::Acquired(lease)) if k.starts_with(b"fresh") => leases.push(lease),
            (k, other) => panic!("{}: {other:?}", String::from_utf8_lossy(k)),
        }
    }
    assert_eq!(
        trips_but_flushes(&e) - before,
        1,
        "the five queued claims in one"
    );
    let mut tokens: Vec<u64> = leases.iter().map(|l| l.token()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "three fresh keys, three distinct tokens");

    for lease in leases {
        let key = lease.key().to_vec();
        lease.complete(&key).expect("complete");
    }
}

/// Every key of a batch gets a lone claim's answer, whatever its row: a new key is
/// acquired, an InFlight row whose lease is over is taken over (attempt 2, a greater token,
/// checkpoint kept), a live holder with another payload is a fingerprint mismatch, a live
/// holder with the same payload is in progress, a completion is replayed, and a key
/// inserted by another session while the batch ran is answered from its committed row.
#[test]
fn a_batch_answers_each_key_as_a_lone_claim_would_whatever_its_row() {
    let p = prefix("setbatch");
    let e = engine(&p);
    let other = engine(&p);
    let payload = |b: &[u8]| ClaimOptions::default().payload(b);
    let acquire = |key: &[u8], opts: &ClaimOptions| match other.claim(key, opts) {
        Ok(Claim::Acquired(lease)) => lease,
        got => panic!("{got:?}"),
    };
    let done = acquire(b"done", &payload(b"d"));
    done.complete(b"the done bytes").expect("complete");
    let mut over = acquire(b"over", &payload(b"o"));
    over.set_checkpoint(7, b"halfway").expect("checkpoint");
    let over_token = over.token();
    drop(over);
    psql(&format!(
        "UPDATE \"{p}keys\" SET lease_until = now() - interval '1 hour' WHERE key = '\\x{}'",
        hex(b"over")
    ));
    let _held = acquire(b"held", &payload(b"h"));
    let _theirs = acquire(b"theirs", &payload(b"t"));

    let lock = RowLock::insert_live(&p, b"blocked");
    let claim_on = |key: &[u8], opts: ClaimOptions| {
        let (e, key) = (e.clone(), key.to_vec());
        std::thread::spawn(move || (e.claim(&key, &opts), key))
    };
    let lane = claim_on(b"blocked", ClaimOptions::default());
    wait_blocked_connection(&p);
    let batched = e.stats().db_claims_batched;
    // A session inserts "late" and holds it uncommitted: the batch's insert waits for it.
    let late = RowLock::insert_live(&p, b"late");
    let asks = [
        (&b"done"[..], payload(b"d")),
        (b"fresh-1", payload(b"f1")),
        (b"held", payload(b"h")),
        (b"late", payload(b"l")),
        (b"over", payload(b"o")),
        (b"theirs", payload(b"not theirs")),
        (b"zz-fresh-2", ClaimOptions::default()),
    ];
    let queued: Vec<_> = asks.into_iter().map(|(k, o)| claim_on(k, o)).collect();
    wait_until(|| e.stats().db_claims_batched == batched + 7);
    let before = trips_but_flushes(&e);
    lock.commit();
    assert!(matches!(
        lane.join().expect("no panic").0,
        Ok(Claim::InProgress(_))
    ));
    late.commit();
    let mut fresh = Vec::new();
    for q in queued {
        let (claim, key) = q.join().expect("no panic");
        match (&key[..], claim) {
            (b"done", Ok(Claim::Completed(c))) => assert_eq!(c.response(), b"the done bytes"),
            (b"held" | b"late", Ok(Claim::InProgress(busy))) => assert_eq!(busy.attempt(), 1),
            (b"over", Ok(Claim::Acquired(lease))) => {
                assert_eq!(lease.attempt(), 2);
                assert!(lease.token() > over_token);
                assert_eq!(lease.checkpoint().map(|c| c.phase()), Some(7));
                fresh.push(lease);
            }
            (b"theirs", Err(ClaimError::FingerprintMismatch)) => {}
            (k, Ok(Claim::Acquired(lease))) if k.ends_with(b"fresh-1") || k.ends_with(b"2") => {
                assert_eq!(lease.attempt(), 1);
                fresh.push(lease);
            }
            (k, other) => panic!("{}: {other:?}", String::from_utf8_lossy(k)),
        }
    }
    assert_eq!(
        trips_but_flushes(&e) - before,
        1,
        "the seven queued claims in one statement"
    );
    let mut tokens: Vec<u64> = fresh.iter().map(|l| l.token()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        3,
        "two fresh keys and a takeover, three tokens"
    );
    for lease in fresh {
        lease.complete(b"ours").expect("complete");
    }
    assert_eq!(
        psql(&format!(
            "SELECT count(*) FROM \"{p}keys\" WHERE state = 'c'"
        ))
        .trim(),
        "4"
    );
}

/// Polls a state of the engine (not the passing of time) until `done`, for up to 20 s.
fn wait_until(done: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < end, "the state did not arrive");
        std::thread::yield_now();
    }
}

/// Four engines of eight threads claim the same keys, each thread in its own random order,
/// so batches of different processes overlap in every way: the keys of a batch are claimed
/// in sorted order, so no two batches deadlock, and each key is acquired exactly once.
#[test]
fn overlapping_batches_of_many_engines_acquire_each_key_once() {
    let p = prefix("overlap");
    let engines: Vec<Engine> = (0..4).map(|_| engine(&p)).collect();
    let keys: Vec<Vec<u8>> = (0..150).map(|i| format!("k-{i:03}").into_bytes()).collect();
    let acquired: Arc<Vec<AtomicUsize>> =
        Arc::new(keys.iter().map(|_| AtomicUsize::new(0)).collect());
    let barrier = Arc::new(Barrier::new(engines.len() * 8));
    let mut handles = Vec::new();
    for (n, e) in engines.iter().enumerate() {
        for t in 0..8 {
            let (e, keys, acquired, barrier) =
                (e.clone(), keys.clone(), acquired.clone(), barrier.clone());
            handles.push(std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed((n * 8 + t) as u64);
                let mut order: Vec<usize> = (0..keys.len()).collect();
                rng.shuffle(&mut order);
                barrier.wait();
                for i in order {
                    match e.claim(&keys[i], &ClaimOptions::default()) {
                        Ok(Claim::Acquired(lease)) => {
                            acquired[i].fetch_add(1, Ordering::SeqCst);
                            lease.complete(&keys[i]).expect("complete");
                        }
                        Ok(Claim::Completed(c)) => assert_eq!(c.response(), &keys[i][..]),
                        Ok(Claim::InProgress(_)) => {}
                        other => panic!("{}: {other:?}", String::from_utf8_lossy(&keys[i])),
                    }
                }
            }));
        }
    }
    for h in handles {
        h.join().expect("no panic");
    }
    for (i, a) in acquired.iter().enumerate() {
        assert_eq!(a.load(Ordering::SeqCst), 1, "key {i}");
    }
    // Eight threads share each engine's one claim lane: batches formed.
    let batched: u64 = engines.iter().map(|e| e.stats().db_claims_batched).sum();
    assert!(batched > 0);
}

/// An engine listens for other processes' wake-ups only while one of its claims waits: an
/// engine that never waited hears nothing, and one that begins to wait hears only what is
/// committed after its claim began.
#[test]
fn an_engine_hears_wake_ups_only_while_its_claims_wait() {
    let p = prefix("hear");
    let (a, b, c) = (engine(&p), engine(&p), engine(&p));
    let held = ClaimOptions::default().lease(Duration::from_secs(60));
    let waits = ClaimOptions::default().wait(Duration::from_secs(30));
    let wait_for = |waiter: &Engine, key: &'static [u8]| {
        let w = waiter.clone();
        let opts = waits.clone();
        let handle = std::thread::spawn(move || w.claim_or_wait(key, &opts));
        wait_until(|| waiter.stats().waits >= 1);
        handle
    };

    let Claim::Acquired(first) = a.claim(b"first", &held).expect("claim") else {
        panic!("acquired");
    };
    let waiter = wait_for(&b, b"first");
    first.complete(b"first bytes").expect("complete");
    match waiter.join().expect("no panic").expect("claim") {
        Claim::Completed(c) => assert_eq!(c.response(), b"first bytes"),
        other => panic!("{other:?}"),
    }
    wait_until(|| b.stats().db_notifications >= 1);

    // `c` never waited: the wake-up about "first" did not reach it. Now it waits.
    let Claim::Acquired(second) = a.claim(b"second", &held).expect("claim") else {
        panic!("acquired");
    };
    let waiter = wait_for(&c, b"second");
    second.complete(b"second bytes").expect("complete");
    match waiter.join().expect("no panic").expect("claim") {
        Claim::Completed(c) => assert_eq!(c.response(), b"second bytes"),
        other => panic!("{other:?}"),
    }
    wait_until(|| c.stats().db_notifications >= 1);
    assert_eq!(
        c.stats().db_notifications,
        1,
        "only the wake-up about \"second\""
    );
    assert_eq!(a.stats().db_notifications, 0, "`a` never waited");
}

/// A completion sends no notification when no process listens for its key (no claim
/// waits anywhere): a session that listens without taking part sees the release's
/// notification, sent after it, but never the completion's.
#[test]
fn a_completion_nobody_waits_for_sends_no_notification() {
    let p = prefix("quiet");
    let e = engine(&p);
    let mut listener = pg::listen(&url(), &format!("{p}wake"));

    let Claim::Acquired(done) = e.claim(b"done", &ClaimOptions::default()).expect("claim") else {
        panic!("acquired");
    };
    done.complete(b"bytes").expect("complete");
    let Claim::Acquired(released) = e
        .claim(b"released", &ClaimOptions::default())
        .expect("claim")
    else {
        panic!("acquired");
    };
    released.release().expect("release");
    // Notifications arrive in commit order: once the release's shows, the completion's
    // would have shown before it. They name the hash of the row's key: the scoped key (a
    // byte of scope length, no scope, the key).
    let row_hash = |key: &[u8]| {
        format!(
            "{:016x}",
            idemkv::admin::key_hash(&[&[0u8][..], key].concat())
        )
    };
    let (released_hash, done_hash) = (row_hash(b"released"), row_hash(b"done"));
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while !seen.iter().any(|l: &String| l.contains(&released_hash)) {
        assert!(
            Instant::now() < end,
            "the release's notification never came: {seen:?}"
        );
        seen.extend(listener.run("SELECT 1;"));
    }
    listener.close();
    assert!(
        !seen.iter().any(|l| l.contains(&done_hash)),
        "the completion notified: {seen:?}"
    );
}

/// A keep-alive renewal (an `extend` with the holder's token) that lands after the holder
/// failed the attempt does not revive it: it is `LeaseLost`, as on the file engine, and
/// the next claim still takes the key over at once with the checkpoint.
#[test]
fn an_extend_after_a_fail_is_lease_lost_and_the_takeover_stays_immediate() {
    let p = prefix("failext");
    let (a, b) = (engine(&p), engine(&p));
    let opts = ClaimOptions::default().lease(Duration::from_secs(600));
    let Claim::Acquired(mut first) = a.claim(b"k", &opts).expect("claim") else {
        panic!("acquired");
    };
    first.set_checkpoint(1, b"charged").expect("checkpoint");
    let (key, token) = (first.key().to_vec(), first.token());
    assert!(first.fail().expect("fail"));
    assert_eq!(
        a.extend(&key, token, Duration::from_secs(600)),
        Err(LeaseError::LeaseLost)
    );
    let Claim::Acquired(second) = b.claim(b"k", &opts).expect("claim") else {
        panic!("the failed attempt is taken over at once, renewal or not");
    };
    assert_eq!(second.attempt(), 2);
    assert!(second.token() > token);
    assert_eq!(
        second.checkpoint().map(|c| (c.phase(), c.data().to_vec())),
        Some((1, b"charged".to_vec()))
    );
    second.complete(b"done").expect("complete");
}

/// A claim bringing another payload than the holder's is refused with
/// `FingerprintMismatch` while the lease is live, as on the file engine, also when the
/// holder is this process (whose front knows the lease and answers without a round trip).
#[test]
fn a_live_lease_of_this_process_refuses_another_fingerprint() {
    let e = engine(&prefix("fplive"));
    let Claim::Acquired(lease) = e
        .claim(b"k", &ClaimOptions::default().payload(b"one"))
        .expect("claim")
    else {
        panic!("acquired");
    };
    for _ in 0..2 {
        assert!(matches!(
            e.claim(b"k", &ClaimOptions::default().payload(b"two")),
            Err(ClaimError::FingerprintMismatch)
        ));
    }
    assert!(matches!(
        e.claim(b"k", &ClaimOptions::default().payload(b"one")),
        Ok(Claim::InProgress(_))
    ));
    lease.complete(b"done").expect("complete");
}

/// A repeated completion by the same token with other bytes succeeds and changes nothing,
/// as on the file engine: every later claim replays the first completion's bytes, also in
/// the engine that made the repeat.
#[test]
fn a_repeated_completion_keeps_the_first_response() {
    let e = engine(&prefix("repeat"));
    let Claim::Acquired(lease) = e.claim(b"k", &ClaimOptions::default()).expect("claim") else {
        panic!("acquired");
    };
    let token = lease.token();
    lease.complete(b"first").expect("complete");
    e.complete(b"k", token, b"second")
        .expect("a repeat by the same token succeeds");
    match e.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::Completed(s) => assert_eq!(s.response(), b"first"),
        other => panic!("expected the stored completion, got {other:?}"),
    }
}

/// Waits (bounded) until `n` backends of this test's objects wait on a lock.
fn wait_blocked_connections(prefix: &str, n: usize) {
    let sql = format!(
        "SELECT count(*) >= {n} FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND query LIKE '%{prefix}%' \
           AND query NOT LIKE '%pg_stat_activity%' AND pid <> pg_backend_pid()"
    );
    let end = Instant::now() + Duration::from_secs(20);
    // Polls a state of the server (backends blocked on the lock), not the passing of time.
    while Instant::now() < end {
        if psql(&sql) == "t" {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("fewer than {n} connections of the engines blocked on the row lock");
}

/// The takeover of an expired lease is one conditional statement: two processes that both
/// read the row as over and then race to take it over, each blocked on the row's lock
/// until it is free, cannot both win. The second re-checks the lease on the row the first
/// wrote, finds it live and answers `InProgress`. (A takeover that read the row and then
/// updated it without the lease-over condition in the same statement would hand the key
/// to both.)
#[test]
fn two_engines_racing_the_takeover_of_an_expired_lease_acquire_it_once() {
    let p = prefix("race");
    let (a, b, c) = (engine(&p), engine(&p), engine(&p));
    let Claim::Acquired(old) = a
        .claim(b"k", &ClaimOptions::default().lease(Duration::ZERO))
        .expect("claim")
    else {
        panic!("acquired");
    };
    // The holder dies without settling; its lease of zero is over on the database's clock.
    let old = old.detach();
    let lock = RowLock::take(&p, b"k");
    let long = ClaimOptions::default().lease(Duration::from_secs(600));
    let racers: Vec<_> = [b.clone(), c.clone()]
        .into_iter()
        .map(|e| {
            let long = long.clone();
            std::thread::spawn(move || e.claim(b"k", &long).expect("claim"))
        })
        .collect();
    // Both read the row as over and wait on its lock inside their takeover.
    wait_blocked_connections(&p, 2);
    drop(lock);
    let answers: Vec<Claim> = racers
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect();
    let mut acquired = Vec::new();
    for answer in answers {
        match answer {
            Claim::Acquired(lease) => acquired.push(lease),
            Claim::InProgress(busy) => assert_eq!(busy.attempt(), 2),
            other => panic!("expected Acquired or InProgress, got {other:?}"),
        }
    }
    assert_eq!(acquired.len(), 1, "exactly one racer takes the key over");
    let winner = acquired.pop().expect("one winner");
    assert_eq!(winner.attempt(), 2);
    assert!(winner.token() > old.token());
    winner.complete(b"once").expect("complete");
    assert_eq!(b.stats().takeovers + c.stats().takeovers, 1);
}

/// A TCP proxy to the server that, once armed, cuts the next answer the server sends: the
/// answer's bytes are dropped and both sides closed, as a network failure right after the
/// server committed would (the server commits an autocommitted statement before it sends
/// any of its answer).
struct CuttingProxy {
    port: u16,
    armed: Arc<std::sync::atomic::AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl CuttingProxy {
    fn start() -> CuttingProxy {
        use std::io::{Read, Write};
        use std::net::{Shutdown, TcpListener, TcpStream};
        let (host_port, _) = url()
            .rsplit_once('/')
            .map(|(head, db)| {
                (
                    head.rsplit_once('@').map_or(head, |(_, hp)| hp).to_string(),
                    db.to_string(),
                )
            })
            .expect("a URL of scripts/pg.sh");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("its address").port();
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (armed2, cuts2) = (armed.clone(), cuts.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let (Ok(mut client), Ok(mut server)) = (client, TcpStream::connect(&host_port))
                else {
                    continue;
                };
                let (Ok(mut client_w), Ok(mut server_r)) = (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut client, &mut server);
                    let _ = server.shutdown(Shutdown::Both);
                });
                let (armed, cuts) = (armed2.clone(), cuts2.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64 << 10];
                    loop {
                        let n = match server_r.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if armed.swap(false, Ordering::SeqCst) {
                            cuts.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        if client_w.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = client_w.shutdown(Shutdown::Both);
                    let _ = server_r.shutdown(Shutdown::Both);
                });
            }
        });
        CuttingProxy { port, armed, cuts }
    }

    /// The server's URL through the proxy.
    fn url(&self) -> String {
        let url = url();
        let (head, db) = url.rsplit_once('/').expect("a URL of scripts/pg.sh");
        let (head, _) = head.rsplit_once(':').expect("a URL with a port");
        format!("{head}:{}/{db}", self.port)
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// A claim whose answer is lost after the server committed it answers `OutcomeUnknown`: it
/// holds the key under a token its caller never saw. Retried with the same claim identity
/// it gets that lease back (same token, attempt 1), from this process or another; any other
/// claim finds the key held, and the same identity with another payload is refused.
#[test]
fn a_claim_whose_answer_is_lost_after_its_commit_is_resumed_by_its_claim_id() {
    const ID: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
    let p = prefix("resume");
    let proxy = CuttingProxy::start();
    let cut = Engine::builder()
        .postgres(
            PostgresConfig::new(proxy.url())
                .table_prefix(&p)
                .pool_size(1),
        )
        .open()
        .expect("open through the proxy");
    let direct = engine(&p);
    // The proxy's one connection is open and idle.
    let Claim::Acquired(warm) = cut.claim(b"warm", &ClaimOptions::default()).expect("claim") else {
        panic!("acquired");
    };
    warm.complete(b"w").expect("complete");

    let opts = ClaimOptions::default().payload(b"charge 42").claim_id(ID);
    proxy.arm();
    let answer = cut.claim(b"pay", &opts);
    assert!(
        matches!(answer, Err(ClaimError::OutcomeUnknown(_))),
        "{answer:?}"
    );
    assert_eq!(proxy.cuts(), 1);
    let token = match direct.get(b"pay").expect("get") {
        Some(KeyState::InFlight {
            token, attempt: 1, ..
        }) => token,
        other => panic!("the claim committed: {other:?}"),
    };

    // Another identity, or none: the key is held.
    for other in [
        ClaimOptions::default()
            .payload(b"charge 42")
            .claim_id(ID ^ 1),
        ClaimOptions::default().payload(b"charge 42"),
    ] {
        assert!(matches!(
            direct.claim(b"pay", &other).expect("claim"),
            Claim::InProgress(_)
        ));
    }
    assert!(matches!(
        direct.claim(
            b"pay",
            &ClaimOptions::default().payload(b"charge 43").claim_id(ID)
        ),
        Err(ClaimError::FingerprintMismatch)
    ));
    // The same identity, from the process that lost the answer: the lease.
    let lease = match cut.claim(b"pay", &opts).expect("claim") {
        Claim::Acquired(lease) => lease,
        other => panic!("expected the lease back, got {other:?}"),
    };
    assert_eq!((lease.token(), lease.attempt()), (token, 1));
    // And from another process, while it is held: the same lease again.
    match direct.claim(b"pay", &opts).expect("claim") {
        Claim::Acquired(again) => {
            assert_eq!((again.token(), again.attempt()), (token, 1));
            std::mem::forget(again);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(cut.stats().takeovers + direct.stats().takeovers, 0);
    lease.complete(b"charged").expect("complete");
    match direct.claim(b"pay", &opts).expect("claim") {
        Claim::Completed(s) => assert_eq!((s.response(), s.token()), (&b"charged"[..], token)),
        other => panic!("{other:?}"),
    }
}

fn acquire(e: &Engine, key: &[u8]) -> idemkv::Lease {
    match e.claim(key, &ClaimOptions::default()).expect("claim") {
        Claim::Acquired(lease) => lease,
        other => panic!("{key:?}: expected to acquire, got {other:?}"),
    }
}

/// The stored response and token a claim of the completed `key` answers with.
fn completed(e: &Engine, key: &[u8]) -> (Vec<u8>, u64) {
    match e.claim(key, &ClaimOptions::default()).expect("claim") {
        Claim::Completed(s) => (s.response().to_vec(), s.token()),
        other => panic!("{key:?}: expected a completion, got {other:?}"),
    }
}

/// Writes and messages attached to a completion commit in its statement, and only when it
/// wrote the row: another engine reads them at once; a fenced-out holder's and a repeat's
/// apply nothing; a checkpoint's writes commit with it. Reads page by key as on a file.
#[test]
fn writes_and_messages_commit_with_the_completion_and_only_with_it() {
    let p = prefix("writes");
    let (a, b) = (engine(&p), engine(&p));
    let lease = acquire(&a, b"m1");
    let mut w = WriteSet::new();
    w.put("balances", b"alice", b"150")
        .expect("put")
        .put("balances", b"bob", b"x")
        .expect("put")
        .put("balances", b"bob", b"20")
        .expect("put")
        .put("offsets", b"orders", b"1")
        .expect("put")
        .put("balances", b"carol", b"5")
        .expect("put")
        .delete("balances", b"carol")
        .expect("delete")
        .emit(b"m1 applied")
        .expect("emit")
        .emit(b"m1 second")
        .expect("emit");
    let token = lease.token();
    lease
        .complete_with(b"ok", &w)
        .expect("complete with writes");
    // The row's last write wins; another engine sees every write at once.
    assert_eq!(b.table_get("balances", b"alice"), Ok(Some(b"150".to_vec())));
    assert_eq!(b.table_get("balances", b"bob"), Ok(Some(b"20".to_vec())));
    assert_eq!(b.table_get("balances", b"carol"), Ok(None));
    assert_eq!(
        b.table_range("balances", b"", None, 10).expect("range"),
        vec![
            (b"alice".to_vec(), b"150".to_vec()),
            (b"bob".to_vec(), b"20".to_vec())
        ]
    );
    assert_eq!(
        b.table_range("balances", b"alice\0", None, 10)
            .expect("the next page"),
        vec![(b"bob".to_vec(), b"20".to_vec())]
    );
    assert_eq!(
        b.table_prefix("offsets", b"ord", 10).expect("prefix"),
        vec![(b"orders".to_vec(), b"1".to_vec())]
    );
    assert!(matches!(
        b.table_range("balances", b"", None, 10_001),
        Err(TableError::LimitTooLarge { .. })
    ));
    // A repeat by the same token applies nothing again.
    let mut again = WriteSet::new();
    again
        .put("balances", b"alice", b"999")
        .expect("put")
        .emit(b"never")
        .expect("emit");
    a.complete_with(b"m1", token, b"ok", &again)
        .expect("a repeat succeeds");
    assert_eq!(b.table_get("balances", b"alice"), Ok(Some(b"150".to_vec())));
    // A holder fenced out by a takeover applies nothing.
    let short = Engine::builder()
        .postgres(config(&p))
        .lease(Duration::from_millis(1))
        .open()
        .expect("open");
    let old = acquire(&short, b"m2");
    psql(&format!(
        "UPDATE \"{p}keys\" SET lease_until = clock_timestamp() - interval '1 second'"
    ));
    let new = acquire(&b, b"m2");
    assert_eq!(new.attempt(), 2);
    assert_eq!(
        old.complete_with(b"late", &again),
        Err(LeaseError::LeaseLost)
    );
    assert_eq!(b.table_get("balances", b"alice"), Ok(Some(b"150".to_vec())));
    // A checkpoint's writes commit with it; a fenced checkpoint's do not.
    let mut cp = WriteSet::new();
    cp.put("progress", b"m2", b"phase 1").expect("put");
    b.checkpoint_with(b"m2", new.token(), 1, b"c", &cp)
        .expect("checkpoint with writes");
    assert_eq!(
        a.table_get("progress", b"m2"),
        Ok(Some(b"phase 1".to_vec()))
    );
    assert_eq!(
        a.checkpoint_with(b"m2", new.token() + 1000, 2, b"c", &again),
        Err(LeaseError::LeaseLost)
    );
    new.complete(b"done").expect("complete");
    // Only the committed completion's messages are pending, in id order.
    let pending = a.outbox().pending(100).expect("pending");
    let payloads: Vec<&[u8]> = pending.iter().map(|m| m.payload()).collect();
    assert_eq!(payloads, vec![&b"m1 applied"[..], &b"m1 second"[..]]);
    assert!(pending[0].id() < pending[1].id());
    // Taken by this relay: another relay is not offered them while it holds them.
    assert!(b.outbox().pending(100).expect("pending").is_empty());
    let ids: Vec<u64> = pending.iter().map(|m| m.id()).collect();
    a.outbox().mark_sent(&ids).expect("mark sent");
    assert_eq!(psql(&format!("SELECT count(*) FROM \"{p}outbox\"")), "0");
}

/// Two relays (engines standing for processes) drain one outbox at once: every message is
/// published by exactly one of them; a message taken by a relay that never marks it
/// (crashed) is offered again once its time is over, and only then.
#[test]
fn two_relays_share_the_outbox_and_none_gets_a_message_twice() {
    let p = prefix("relays");
    let producer = engine(&p);
    const N: usize = 300;
    for i in 0..N {
        let lease = acquire(&producer, format!("k{i}").as_bytes());
        let mut w = WriteSet::new();
        w.emit(format!("msg {i}").as_bytes()).expect("emit");
        lease.complete_with(b"ok", &w).expect("complete");
    }
    let relays = [engine(&p), engine(&p)];
    let barrier = Barrier::new(2);
    let got: Vec<Vec<(u64, Vec<u8>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = relays
            .iter()
            .map(|r| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let outbox = r.outbox();
                    let mut mine = Vec::new();
                    loop {
                        let batch = outbox.pending(7).expect("pending");
                        if batch.is_empty() {
                            return mine;
                        }
                        let ids: Vec<u64> = batch.iter().map(|m| m.id()).collect();
                        mine.extend(batch.iter().map(|m| (m.id(), m.payload().to_vec())));
                        outbox.mark_sent(&ids).expect("mark sent");
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    let mut all: Vec<(u64, Vec<u8>)> = got.concat();
    assert!(got.iter().all(|g| !g.is_empty()), "both relays took work");
    all.sort();
    let n = all.len();
    all.dedup_by_key(|m| m.0);
    assert_eq!(all.len(), n, "no message was published by both relays");
    let mut payloads: Vec<Vec<u8>> = all.into_iter().map(|m| m.1).collect();
    payloads.sort();
    let mut want: Vec<Vec<u8>> = (0..N).map(|i| format!("msg {i}").into_bytes()).collect();
    want.sort();
    assert_eq!(payloads, want, "every message was published");

    // A relay that takes a message and never marks it: not offered again while its time
    // runs, offered again after it (its end moved into the past here, not waited for).
    let lease = acquire(&producer, b"crash");
    let mut w = WriteSet::new();
    w.emit(b"orphan").expect("emit");
    lease.complete_with(b"ok", &w).expect("complete");
    let taken = relays[0].outbox().pending(10).expect("pending");
    assert_eq!(taken.len(), 1);
    assert!(relays[1].outbox().pending(10).expect("pending").is_empty());
    psql(&format!(
        "UPDATE \"{p}outbox\" SET taken_until = clock_timestamp() - interval '1 second'"
    ));
    let again = relays[1].outbox().pending(10).expect("pending");
    assert_eq!(again, taken, "the same id and bytes, offered again");
}

/// Markers on the shared table: a completion past its retention answers a late duplicate
/// `Forgotten` for the marker window (a claim with another fingerprint is refused, one
/// that asks to rerun acquires it as new), and the key is new after the window; an engine
/// without markers takes such a row over as new.
#[test]
fn markers_answer_late_duplicates_on_the_shared_table() {
    let p = prefix("markers");
    let day = Duration::from_secs(24 * 3600);
    let with_markers = || {
        Engine::builder()
            .postgres(config(&p))
            .marker_retention(Some(day))
            .tuning(idemkv::Tuning::default().sweep_interval(None))
            .open()
            .expect("open with markers")
    };
    let a = with_markers();
    let fp = ClaimOptions::default().fingerprint(7u64);
    for key in [&b"late"[..], b"rerun", b"other-fp", b"plain"] {
        let Claim::Acquired(lease) = a.claim(key, &fp).expect("claim") else {
            panic!("acquired");
        };
        lease.complete(b"done").expect("complete");
    }
    // The retention ends (moved into the past here); the marker window goes on.
    psql(&format!(
        "UPDATE \"{p}keys\" SET expires_at = clock_timestamp() - interval '1 second', \
         reap_at = clock_timestamp() - interval '1 second'"
    ));
    // A fresh engine: no cached completion answers for the database.
    let b = with_markers();
    match b.claim(b"late", &fp).expect("claim") {
        Claim::Forgotten(f) => {
            assert_eq!(f.attempt(), 1);
            assert!(f.kept_until() > std::time::SystemTime::now() + day / 2);
            assert!(f.completed_at() <= std::time::SystemTime::now());
            assert!(f.completed_at() > std::time::SystemTime::now() - Duration::from_secs(600));
        }
        other => panic!("expected Forgotten, got {other:?}"),
    }
    assert!(matches!(
        b.claim_or_wait(b"late", &fp),
        Ok(Claim::Forgotten(_))
    ));
    assert!(matches!(
        b.run(b"late", &fp, |_| Ok::<_, std::io::Error>(b"again".to_vec())),
        Err(idemkv::RunError::Forgotten(_))
    ));
    assert!(b.get(b"late").expect("get").is_none(), "Absent to get");
    assert_eq!(
        b.claim(b"other-fp", &ClaimOptions::default().fingerprint(8u64))
            .map(|_| ()),
        Err(ClaimError::FingerprintMismatch)
    );
    let Claim::Acquired(lease) = b
        .claim(b"rerun", &fp.clone().rerun_forgotten())
        .expect("claim")
    else {
        panic!("rerun_forgotten acquires the key as new");
    };
    assert_eq!(lease.attempt(), 1);
    lease.release().expect("release");
    assert!(
        matches!(b.claim(b"rerun", &fp).expect("claim"), Claim::Acquired(_)),
        "the marker is gone for good"
    );
    // An engine without markers takes the row over as new.
    let plain = Engine::builder()
        .postgres(config(&p))
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
        .expect("open");
    assert!(matches!(
        plain.claim(b"plain", &fp).expect("claim"),
        Claim::Acquired(_)
    ));
    // The sweeper drops the response of a completion past its retention and keeps the
    // row (the marker) to the marker's end.
    assert_eq!(b.admin().sweep_now(), Ok(2));
    assert_eq!(
        psql(&format!(
            "SELECT count(*) FROM \"{p}keys\" WHERE state = 'c' AND response IS NULL"
        )),
        "2"
    );
    assert!(matches!(
        b.claim(b"late", &fp).expect("claim"),
        Claim::Forgotten(_)
    ));
    // After the window the key is new.
    psql(&format!(
        "UPDATE \"{p}keys\" SET marker_until = clock_timestamp() - interval '1 second' \
         WHERE state = 'c'"
    ));
    assert!(matches!(
        b.claim(b"late", &fp).expect("claim"),
        Claim::Acquired(_)
    ));
}

/// The application's own SQL joins the completion's transaction: its rows commit with the
/// completion; its error rolls both back and leaves the key held; a fenced-out holder's
/// hook never runs.
#[test]
fn the_applications_own_statements_commit_with_the_completion() {
    let p = prefix("hook");
    let app = format!("{p}app_balances");
    psql(&format!(
        "CREATE TABLE \"{app}\" (account text PRIMARY KEY, amount bigint NOT NULL)"
    ));
    let e = engine(&p);
    let insert = format!("INSERT INTO \"{app}\" VALUES ($1, $2)");
    let lease = pg_lease(acquire(&e, b"pay-1"));
    let sql = insert.clone();
    lease
        .complete_in_transaction(b"paid", move |tx| {
            Box::pin(async move {
                tx.execute(sql.as_str(), &[&"alice", &150i64]).await?;
                Ok(())
            })
        })
        .expect("complete in the transaction");
    assert_eq!(
        psql(&format!(
            "SELECT amount FROM \"{app}\" WHERE account = 'alice'"
        )),
        "150"
    );
    match e.claim(b"pay-1", &ClaimOptions::default()).expect("claim") {
        Claim::Completed(s) => assert_eq!(s.response(), b"paid"),
        other => panic!("{other:?}"),
    }
    // The hook fails (a duplicate account): nothing commits, the key stays held.
    let lease = pg_lease(acquire(&e, b"pay-2"));
    let token = lease.lease().token();
    let sql = insert.clone();
    let failed = lease.complete_in_transaction(b"paid twice", move |tx| {
        Box::pin(async move {
            tx.execute(sql.as_str(), &[&"bob", &1i64]).await?;
            tx.execute(sql.as_str(), &[&"alice", &1i64]).await?;
            Ok(())
        })
    });
    match failed {
        Err(LeaseError::Database(d)) => assert_eq!(d.code(), Some("23505")),
        other => panic!("expected the hook's error, got {other:?}"),
    }
    assert_eq!(
        psql(&format!(
            "SELECT count(*) FROM \"{app}\" WHERE account = 'bob'"
        )),
        "0"
    );
    assert!(matches!(
        e.get(b"pay-2").expect("get"),
        Some(KeyState::InFlight { token: t, .. }) if t == token
    ));
    // A fenced-out holder: LeaseLost, and its hook does not run.
    let ran = Arc::new(AtomicUsize::new(0));
    let short = Engine::builder()
        .postgres(config(&p))
        .lease(Duration::from_millis(1))
        .open()
        .expect("open");
    let old = acquire(&short, b"pay-3");
    psql(&format!(
        "UPDATE \"{p}keys\" SET lease_until = clock_timestamp() - interval '1 second' \
         WHERE state = 'i'"
    ));
    let _new = acquire(&e, b"pay-3");
    let counter = ran.clone();
    let lost = pg_lease(old).complete_in_transaction(b"late", move |_tx| {
        counter.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    });
    assert_eq!(lost, Err(LeaseError::LeaseLost));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // A lease of an engine over a file is never a PostgresLease: it comes back whole, and
    // completes as any lease does.
    let file = Engine::builder()
        .durability(Durability::None)
        .open()
        .expect("open");
    let lease = acquire(&file, b"k");
    let token = lease.token();
    let back = lease.into_postgres().expect_err("a file engine's lease");
    assert_eq!(back.token(), token);
    back.complete(b"x").expect("complete");
    match file.claim(b"k", &ClaimOptions::default()).expect("claim") {
        Claim::Completed(s) => assert_eq!(s.response(), b"x"),
        other => panic!("{other:?}"),
    }
}

fn pg_lease(lease: idemkv::Lease) -> idemkv::postgres::PostgresLease {
    lease.into_postgres().expect("a shared engine's lease")
}

/// An engine of the tables of `p` with one completion lane, which a test can keep busy.
fn one_lane_engine(p: &str) -> Engine {
    Engine::builder()
        .postgres(config(p).complete_lanes(1))
        .open()
        .expect("open")
}

/// Keeps the one completion lane of `e` busy (`blocked` completes on a thread while another
/// transaction holds its row), completes each of `queued` on a thread of its own, and
/// returns once all of them queued behind the lane: the lane's thread, the queued threads
/// (each answers its completion and its key) and the row lock, whose drop frees the lane.
#[allow(clippy::type_complexity)]
fn complete_behind_a_busy_lane(
    e: &Engine,
    p: &str,
    blocked: idemkv::Lease,
    queued: Vec<idemkv::Lease>,
) -> (
    std::thread::JoinHandle<Result<(), LeaseError>>,
    Vec<std::thread::JoinHandle<(Result<(), LeaseError>, Vec<u8>)>>,
    RowLock,
) {
    let lock = RowLock::take(p, b"blocked");
    let lane = std::thread::spawn(move || blocked.complete(b"blocked bytes"));
    wait_blocked_connection(p);
    let batched = e.stats().db_completions_batched;
    let n = queued.len() as u64;
    let threads: Vec<_> = queued
        .into_iter()
        .map(|lease| {
            std::thread::spawn(move || {
                let key = lease.key().to_vec();
                (lease.complete(&key), key)
            })
        })
        .collect();
    wait_until(|| e.stats().db_completions_batched == batched + n);
    (lane, threads, lock)
}

/// While the completion lane of a process is busy (a completion waits on a row lock), the
/// completions asked meanwhile queue, and go together in one statement, one commit, once
/// the lane is free; each is fenced by its own token: a completion whose token no longer
/// holds its key is refused (`LeaseLost`) and the others of the batch apply.
#[test]
fn completions_queued_behind_a_busy_lane_share_a_commit_and_a_fenced_one_is_refused() {
    let p = prefix("cbatch");
    let e = one_lane_engine(&p);
    let other = engine(&p);
    let blocked = acquire(&e, b"blocked");
    let queued: Vec<idemkv::Lease> = [&b"fenced"[..], b"c-1", b"c-2"]
        .into_iter()
        .map(|k| acquire(&e, k))
        .collect();
    // Another holder's token on `fenced`, as after a takeover.
    psql(&format!(
        "UPDATE \"{p}keys\" SET token = token + 1000 WHERE key = '\\x{}'",
        hex(b"fenced")
    ));

    let (lane, threads, lock) = complete_behind_a_busy_lane(&e, &p, blocked, queued);
    let before = e.stats().db_round_trips;
    drop(lock);
    lane.join()
        .expect("no panic")
        .expect("the lane's completion");
    for t in threads {
        match t.join().expect("no panic") {
            (Err(LeaseError::LeaseLost), key) => assert_eq!(key, b"fenced"),
            (Ok(_), key) => assert!(key.starts_with(b"c-")),
            (other, key) => panic!("{}: {other:?}", String::from_utf8_lossy(&key)),
        }
    }
    assert_eq!(
        e.stats().db_round_trips - before,
        1,
        "the three queued completions in one statement"
    );
    for key in [&b"c-1"[..], b"c-2"] {
        match other.claim(key, &ClaimOptions::default()).expect("claim") {
            Claim::Completed(c) => assert_eq!(c.response(), key),
            other => panic!("{other:?}"),
        }
    }
    match other
        .claim(b"blocked", &ClaimOptions::default())
        .expect("claim")
    {
        Claim::Completed(c) => assert_eq!(c.response(), b"blocked bytes"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        other
            .claim(b"fenced", &ClaimOptions::default())
            .expect("claim"),
        Claim::InProgress(_)
    ));
}

/// An acquisition waits for its flush in the completions' queue: queued behind a busy
/// completion lane, it rides on the next batch of completions, whose commit is the flush
/// when it stores a response; when none of the batch's completions stores one (each was
/// fenced out), a flush statement is sent for it. Either way the claim is answered only
/// after the batch. A batch that stores a response but no longer reads the claim's
/// lifetime token (deleted here, as a crash-restart would) does not stand for its flush:
/// the flush statement finds no token either, and the acquisition is `OutcomeUnknown`.
#[test]
fn an_acquisition_queued_behind_the_completions_is_flushed_by_their_batch() {
    let cases = [
        (&b"c-1"[..], false, false, 0),
        (b"fenced", true, false, 1),
        (b"c-2", false, true, 1),
    ];
    for (queued_key, fenced, life_gone, flushes) in cases {
        let p = prefix("flushq");
        let e = one_lane_engine(&p);
        let blocked = acquire(&e, b"blocked");
        let queued = acquire(&e, queued_key);
        if fenced {
            psql(&format!(
                "UPDATE \"{p}keys\" SET token = token + 1000 WHERE key = '\\x{}'",
                hex(queued_key)
            ));
        }
        let (lane, threads, lock) = complete_behind_a_busy_lane(&e, &p, blocked, vec![queued]);
        let (before, batched) = (e.stats().db_flushes, e.stats().db_completions_batched);
        let fresh_key = [queued_key, b"-fresh"].concat();
        let claiming = {
            let (e, key) = (e.clone(), fresh_key.clone());
            std::thread::spawn(move || e.claim(&key, &ClaimOptions::default()))
        };
        wait_until(|| e.stats().db_completions_batched == batched + 1);
        assert!(
            !claiming.is_finished(),
            "the acquisition waits for its flush"
        );
        if life_gone {
            psql(&format!("DELETE FROM \"{p}life\""));
        }
        drop(lock);
        lane.join()
            .expect("no panic")
            .expect("the lane's completion");
        for t in threads {
            match t.join().expect("no panic") {
                (Err(LeaseError::LeaseLost), _) => assert!(fenced),
                (Ok(()), _) => assert!(!fenced),
                (other, key) => panic!("{}: {other:?}", String::from_utf8_lossy(&key)),
            }
        }
        match claiming.join().expect("no panic") {
            Ok(Claim::Acquired(lease)) if !life_gone => lease.complete(b"ok").expect("complete"),
            Err(ClaimError::OutcomeUnknown(_)) if life_gone => {}
            other => panic!("life gone: {life_gone}: {other:?}"),
        }
        assert_eq!(e.stats().db_flushes - before, flushes, "fenced: {fenced}");
    }
}

/// A completion batch whose connection dies mid-statement (as in a server restart) reports
/// an unknown outcome to every completion of the batch, never a success, and commits
/// nothing: each holder completes again.
#[test]
fn a_completion_batch_cut_off_mid_statement_is_unknown_and_commits_nothing() {
    let p = prefix("cbatchcut");
    let e = one_lane_engine(&p);
    let other = engine(&p);
    let blocked = acquire(&e, b"blocked");
    let (c1, c2) = (acquire(&e, b"c-1"), acquire(&e, b"c-2"));
    let tokens = [c1.token(), c2.token()];

    let lock = RowLock::take(&p, b"blocked");
    let lock_c2 = RowLock::take(&p, b"c-2");
    let lane = std::thread::spawn(move || blocked.complete(b"blocked bytes"));
    wait_blocked_connection(&p);
    let batched = e.stats().db_completions_batched;
    let c1 = std::thread::spawn(move || c1.complete(b"c-1"));
    wait_until(|| e.stats().db_completions_batched == batched + 1);
    let c2 = std::thread::spawn(move || c2.complete(b"c-2"));
    wait_until(|| e.stats().db_completions_batched == batched + 2);
    drop(lock);
    lane.join()
        .expect("no panic")
        .expect("the lane's completion");
    // The batch of `c-1` and `c-2` now waits on `c-2`'s row lock: its connection dies.
    kill_blocked_connection(&p);
    for answer in [c1.join().expect("no panic"), c2.join().expect("no panic")] {
        assert!(
            matches!(answer, Err(LeaseError::OutcomeUnknown(_))),
            "{answer:?}"
        );
    }
    drop(lock_c2);
    for (key, token) in [(&b"c-1"[..], tokens[0]), (b"c-2", tokens[1])] {
        assert!(
            matches!(
                other.get(key).expect("get"),
                Some(KeyState::InFlight { .. })
            ),
            "nothing of the batch committed"
        );
        e.complete(key, token, key)
            .expect("the holder completes again");
        match other.claim(key, &ClaimOptions::default()).expect("claim") {
            Claim::Completed(c) => assert_eq!((c.response(), c.token()), (key, token)),
            other => panic!("{other:?}"),
        }
    }
}
