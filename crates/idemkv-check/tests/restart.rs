//! Close and reopen the same file: completions survive with their bytes, tokens keep
//! increasing, InFlight records of the dead process are recovered (taken over at once, or
//! honoured up to one lease), and records past their retention are gone.
//!
//! Every test runs under `Durability::Immediate` and `Durability::Buffered` (with a `flush`
//! before closing), with an injected `MockClock` that keeps running across the restart.

use common::{acquired, completed, in_progress};
use idemkv::admin::{FileReader, RecordInfo, RecordInfoState};
use idemkv::*;
use idemkv_check::backend as common;
use std::collections::HashMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tempfile::TempDir;

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);
const MS: Duration = Duration::from_millis(1);

fn file_modes() -> [Durability; 2] {
    [Durability::Immediate, Durability::buffered()]
}

/// A file and a clock that outlive the engines opened on them.
struct Site {
    dir: TempDir,
    clock: MockClock,
    mode: Durability,
}

impl Site {
    fn new(mode: Durability) -> Site {
        Site {
            dir: tempfile::tempdir().unwrap(),
            clock: MockClock::new(),
            mode,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("idem.redb")
    }

    fn builder(&self) -> EngineBuilder {
        Engine::builder()
            .path(self.path())
            .durability(self.mode)
            .clock(self.clock.clone())
            .lease(LEASE)
            .retention(RETENTION)
    }

    fn open(&self) -> Engine {
        self.builder().open().unwrap()
    }

    /// What a clean shutdown is documented to be: flush (Buffered), then close.
    fn shut(&self, engine: Engine) {
        engine.flush().unwrap();
        engine.close().unwrap();
        assert!(Path::new(&self.path()).exists());
    }
}

fn each_file_mode(f: impl Fn(&Site)) {
    for mode in file_modes() {
        let site = Site::new(mode);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(&site))) {
            eprintln!("--> failed in durability mode {mode:?}");
            resume_unwind(panic);
        }
    }
}

fn claim(engine: &Engine, key: &[u8]) -> Claim {
    engine.claim(key, &ClaimOptions::default()).unwrap()
}

fn response_for(i: usize) -> Vec<u8> {
    let len = (i * 37) % 2000;
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

struct Done {
    response: Vec<u8>,
    token: u64,
    attempt: u32,
    expires_at: SystemTime,
}

#[test]
fn completions_are_served_with_their_bytes_after_reopen() {
    each_file_mode(|site| {
        let engine = site.open();
        // Eight writers at once, so that Immediate shares its fsyncs (group commit).
        let done = std::sync::Mutex::new(HashMap::<Vec<u8>, Done>::new());
        std::thread::scope(|s| {
            for t in 0..8usize {
                let (engine, done) = (&engine, &done);
                s.spawn(move || {
                    for i in (t..200).step_by(8) {
                        let key = format!("key-{i}").into_bytes();
                        let opts = ClaimOptions::default().payload(&key);
                        let mut lease = acquired(engine.claim(&key, &opts).unwrap());
                        if i % 10 == 0 {
                            // Some keys complete on a second attempt, after a takeover.
                            lease.set_checkpoint(1, b"half").unwrap();
                            lease.extend(Duration::ZERO).unwrap();
                            lease = acquired(engine.claim(&key, &opts).unwrap());
                            assert_eq!(lease.attempt(), 2);
                        }
                        let response = response_for(i);
                        let (token, attempt) = (lease.token(), lease.attempt());
                        lease.complete(&response).unwrap();
                        let d = Done {
                            response,
                            token,
                            attempt,
                            expires_at: UNIX_EPOCH,
                        };
                        done.lock().unwrap().insert(key, d);
                    }
                });
            }
        });
        let mut done = done.into_inner().unwrap();
        assert_eq!(done.len(), 200);
        site.clock.advance(Duration::from_secs(1));
        // A large response and an empty one.
        let big: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i % 251) as u8).collect();
        for (key, response) in [(&b"big"[..], big), (&b"empty"[..], Vec::new())] {
            let lease = acquired(claim(&engine, key));
            let token = lease.token();
            lease.complete(&response).unwrap();
            done.insert(
                key.to_vec(),
                Done {
                    response,
                    token,
                    attempt: 1,
                    expires_at: UNIX_EPOCH,
                },
            );
        }
        engine.flush().unwrap();
        for (key, d) in done.iter_mut() {
            match engine.get(key).unwrap() {
                Some(KeyState::Completed { expires_at, .. }) => d.expires_at = expires_at,
                other => panic!("expected Completed, got {other:?}"),
            }
        }
        site.shut(engine);

        // Twice: recovery of a recovered file must be as good as the first.
        for _ in 0..2 {
            let engine = site.open();
            assert_eq!(engine.stats().completed, done.len() as u64);
            assert_eq!(engine.stats().inflight, 0);
            for (key, d) in &done {
                assert_eq!(
                    engine.get(key).unwrap(),
                    Some(KeyState::Completed {
                        token: d.token,
                        attempt: d.attempt,
                        response: Arc::from(&d.response[..]),
                        expires_at: d.expires_at,
                    }),
                    "key {}",
                    String::from_utf8_lossy(key)
                );
                let stored = completed(claim(&engine, key));
                assert_eq!(stored.response(), &d.response[..]);
                assert_eq!(stored.token(), d.token);
                assert_eq!(stored.attempt(), d.attempt);
            }
            // Fingerprints survive too.
            assert_eq!(
                engine
                    .claim(b"key-1", &ClaimOptions::default().payload(b"other"))
                    .err(),
                Some(ClaimError::FingerprintMismatch)
            );
            // Completed keys still refuse other tokens after the restart; the same token is
            // still an idempotent repeat.
            let d = &done[&b"key-7"[..]];
            assert_eq!(engine.complete(b"key-7", d.token, b"x"), Ok(()));
            assert_eq!(
                engine.complete(b"key-7", d.token + 1, b"x"),
                Err(LeaseError::LeaseLost)
            );
            assert_eq!(
                completed(claim(&engine, b"key-7")).response(),
                &d.response[..]
            );
            site.shut(engine);
        }
    });
}

#[test]
fn close_makes_acknowledged_completions_durable_without_flush() {
    each_file_mode(|site| {
        let engine = site.open();
        for i in 0..20u32 {
            acquired(claim(&engine, &i.to_be_bytes()))
                .complete(&i.to_le_bytes())
                .unwrap();
        }
        engine.close().unwrap();
        let engine = site.open();
        for i in 0..20u32 {
            assert_eq!(
                completed(claim(&engine, &i.to_be_bytes())).response(),
                i.to_le_bytes()
            );
        }
    });
}

#[test]
fn tokens_keep_increasing_across_restarts() {
    each_file_mode(|site| {
        let mut max_issued = 0u64;
        let mut seen = Vec::new();
        let mut note = |token: u64, max: &mut u64| {
            seen.push(token);
            *max = (*max).max(token);
        };
        for round in 0..3u32 {
            let engine = site.open();
            let first = engine.stats().token_next;
            assert!(
                first > max_issued,
                "round {round}: token_next {first} not above {max_issued}"
            );
            let key = |s: &str| format!("{s}-{round}").into_bytes();

            // Completed.
            let lease = acquired(claim(&engine, &key("done")));
            assert!(lease.token() > max_issued);
            note(lease.token(), &mut max_issued);
            lease.complete(b"v").unwrap();
            // Released; and dropped unsettled (kept InFlight until its lease ends).
            let lease = acquired(claim(&engine, &key("released")));
            note(lease.token(), &mut max_issued);
            lease.release().unwrap();
            let lease = acquired(claim(&engine, &key("dropped")));
            note(lease.token(), &mut max_issued);
            drop(lease);
            // Taken over, then the taker released.
            let lease = acquired(
                engine
                    .claim(
                        &key("taken"),
                        &ClaimOptions::default().lease(Duration::ZERO),
                    )
                    .unwrap(),
            );
            note(lease.token(), &mut max_issued);
            let taker = acquired(claim(&engine, &key("taken")));
            note(taker.token(), &mut max_issued);
            assert!(taker.token() > lease.token());
            drop(taker);
            drop(lease);
            // A batch of claims that are all released: the highest of them was never in the
            // file as a live record at close.
            for i in 0..20 {
                let lease = acquired(claim(&engine, format!("burst-{round}-{i}").as_bytes()));
                note(lease.token(), &mut max_issued);
                lease.release().unwrap();
            }
            // Never completed: left InFlight at close.
            let open_lease = acquired(claim(&engine, &key("open")));
            note(open_lease.token(), &mut max_issued);
            assert!(engine.stats().token_next > max_issued);
            site.shut(engine);
            drop(open_lease);
            site.clock.advance(Duration::from_secs(1));
        }
        let engine = site.open();
        assert!(engine.stats().token_next > max_issued);
        for key in ["done-0", "open-2", "fresh"] {
            match claim(&engine, key.as_bytes()) {
                Claim::Acquired(lease) => {
                    assert!(lease.token() > max_issued, "{key}: {lease:?}")
                }
                Claim::Completed(stored) => assert_eq!(key, "done-0", "{stored:?}"),
                Claim::InProgress(busy) => panic!("{key}: {busy:?}"),
                Claim::Forgotten(forgotten) => {
                    panic!("unexpected Forgotten without markers: {forgotten:?}")
                }
            }
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, seen, "tokens were not issued in increasing order");
        sorted.dedup();
        assert_eq!(sorted.len(), seen.len(), "a token was issued twice");
    });
}

#[test]
fn inflight_records_are_taken_over_at_once_after_reopen() {
    each_file_mode(|site| {
        let engine = site.open();
        let fp = ClaimOptions::default().payload(b"body");
        let t0 = site.clock.wall();
        let mut with_cp = acquired(engine.claim(b"with-cp", &fp).unwrap());
        with_cp.set_checkpoint(2, b"step two").unwrap();
        let plain = acquired(claim(&engine, b"plain"));
        let forever = acquired(
            engine
                .claim(b"forever", &ClaimOptions::default().lease(Duration::MAX))
                .unwrap(),
        );
        // A key already on its second attempt.
        let a1 = acquired(
            engine
                .claim(b"second", &ClaimOptions::default().lease(Duration::ZERO))
                .unwrap(),
        );
        let mut a2 = acquired(claim(&engine, b"second"));
        assert_eq!(a2.attempt(), 2);
        a2.set_checkpoint(9, b"nine").unwrap();
        let old_tokens = [
            with_cp.token(),
            plain.token(),
            forever.token(),
            a1.token(),
            a2.token(),
        ];
        site.shut(engine);
        // The old process's leases cannot act any more.
        assert_eq!(with_cp.set_checkpoint(3, b"x"), Err(LeaseError::Closed));
        assert_eq!(plain.complete(b"x"), Err(LeaseError::Closed));
        drop((forever, a1, a2));

        // No clock movement at all: the records belong to a dead process.
        let engine = site.open();
        // Taken over at once means over at once: abandoned, not live.
        let stats = engine.stats();
        assert_eq!((stats.inflight, stats.abandoned), (0, 4));
        assert_eq!(
            engine.get(b"with-cp").unwrap(),
            Some(KeyState::InFlight {
                token: old_tokens[0],
                attempt: 1,
                lease_remaining: Duration::ZERO,
                checkpoint: Some(Checkpoint::new(2, b"step two")),
                first_claimed_at: Some(t0),
                attempt_started_at: Some(t0),
                failed: false,
            })
        );
        let max_old = *old_tokens.iter().max().unwrap();

        assert_eq!(
            engine
                .claim(b"with-cp", &ClaimOptions::default().payload(b"other"))
                .err(),
            Some(ClaimError::FingerprintMismatch)
        );
        let l = acquired(engine.claim(b"with-cp", &fp).unwrap());
        assert_eq!(l.attempt(), 2);
        assert_eq!(l.checkpoint(), Some(&Checkpoint::new(2, b"step two")));
        assert!(l.token() > max_old);
        assert_eq!(
            engine.complete(b"with-cp", old_tokens[0], b"stale"),
            Err(LeaseError::LeaseLost)
        );
        l.complete(b"resumed").unwrap();

        let l = acquired(claim(&engine, b"plain"));
        assert_eq!(l.attempt(), 2);
        assert!(l.checkpoint().is_none());
        assert!(l.token() > max_old);

        let l2 = acquired(claim(&engine, b"forever"));
        assert_eq!(l2.attempt(), 2);

        let l3 = acquired(claim(&engine, b"second"));
        assert_eq!(l3.attempt(), 3);
        assert_eq!(l3.checkpoint(), Some(&Checkpoint::new(9, b"nine")));
        assert_eq!(engine.stats().takeovers, 4);
        assert_eq!(engine.stats().inflight, 3);
        engine.flush().unwrap();
        assert_eq!(completed(claim(&engine, b"with-cp")).response(), b"resumed");
        drop((l, l2, l3));
    });
}

#[test]
fn honour_leases_keeps_inflight_until_the_deadline_capped_at_the_holders_own_lease() {
    each_file_mode(|site| {
        let engine = site.open();
        let with = |d: Duration| ClaimOptions::default().lease(d);
        let mut short = acquired(
            engine
                .claim(b"short", &with(Duration::from_secs(10)))
                .unwrap(),
        );
        short.set_checkpoint(1, b"cp").unwrap();
        let long = acquired(
            engine
                .claim(b"long", &with(Duration::from_secs(1000)))
                .unwrap(),
        );
        let forever = acquired(engine.claim(b"forever", &with(Duration::MAX)).unwrap());
        let lapsed = acquired(
            engine
                .claim(b"lapsed", &with(Duration::from_secs(2)))
                .unwrap(),
        );
        let extended = acquired(
            engine
                .claim(b"extended", &with(Duration::from_secs(10)))
                .unwrap(),
        );
        site.clock.advance(Duration::from_secs(1));
        extended.extend(Duration::from_secs(20)).unwrap(); // ends at 21 s
        let short_token = short.token();
        site.shut(engine);
        drop((short, long, forever, lapsed, extended));

        site.clock.advance(Duration::from_secs(4)); // now 5 s after the claims
        let engine = site
            .builder()
            .recovery(Recovery::HonourLeases)
            .open()
            .unwrap();
        assert_eq!(
            in_progress(claim(&engine, b"short")).retry_after(),
            Duration::from_secs(5)
        );
        // 995 s and "forever" left on the dead process's leases: each holder was given that
        // long, so that is what its side effects may still take.
        assert_eq!(
            in_progress(claim(&engine, b"long")).retry_after(),
            Duration::from_secs(995)
        );
        assert!(
            in_progress(claim(&engine, b"forever")).retry_after()
                > Duration::from_secs(100 * 365 * 86_400)
        );
        assert_eq!(
            in_progress(claim(&engine, b"extended")).retry_after(),
            Duration::from_secs(16)
        );
        // Its deadline passed while the engine was down: taken over at once.
        assert_eq!(acquired(claim(&engine, b"lapsed")).attempt(), 2);

        site.clock.advance(Duration::from_secs(5) - MS);
        in_progress(claim(&engine, b"short"));
        site.clock.advance(MS);
        let l = acquired(claim(&engine, b"short"));
        assert_eq!(l.attempt(), 2);
        assert!(l.token() > short_token);
        assert_eq!(l.checkpoint(), Some(&Checkpoint::new(1, b"cp")));

        site.clock.advance(Duration::from_secs(11)); // 16 s after reopen
        assert_eq!(acquired(claim(&engine, b"extended")).attempt(), 2);
        assert!(matches!(claim(&engine, b"long"), Claim::InProgress(_)));
        site.clock.advance(Duration::from_secs(995 - 16) - MS);
        assert!(matches!(claim(&engine, b"long"), Claim::InProgress(_)));
        site.clock.advance(MS);
        assert_eq!(acquired(claim(&engine, b"long")).attempt(), 2);
        assert!(matches!(claim(&engine, b"forever"), Claim::InProgress(_)));
        drop(l);
    });
}

/// A wall clock that went back a day while the engine was down makes a recorded deadline
/// look a day further out: the honoured lease is still capped, by the length its holder was
/// given (600 s here, not the engine's 30 s, and not the day).
#[test]
fn an_honoured_lease_after_a_wall_clock_jump_is_capped_by_its_own_length() {
    each_file_mode(|site| {
        let engine = site.open();
        let long = ClaimOptions::default().lease(Duration::from_secs(600));
        let held = acquired(engine.claim(b"long", &long).unwrap());
        let plain = acquired(claim(&engine, b"plain"));
        site.shut(engine);
        drop((held, plain));
        let back = site.clock.wall() - Duration::from_secs(86_400);
        site.clock.set_wall(back);
        let engine = site
            .builder()
            .recovery(Recovery::HonourLeases)
            .open()
            .unwrap();
        assert_eq!(
            in_progress(claim(&engine, b"long")).retry_after(),
            Duration::from_secs(600)
        );
        assert_eq!(in_progress(claim(&engine, b"plain")).retry_after(), LEASE);
        site.clock.advance(Duration::from_secs(600) - MS);
        in_progress(claim(&engine, b"long"));
        site.clock.advance(MS);
        assert_eq!(acquired(claim(&engine, b"long")).attempt(), 2);
    });
}

/// A lease's stored end is never before its real one: claimed and extended at an instant a
/// fraction of a millisecond past the wall clock's grid, its reported and stored end are
/// rounded up, and a restart with `HonourLeases` at the real end's instant still finds it
/// held until the rounded end.
#[test]
fn a_lease_end_is_stored_and_reported_rounded_up_to_the_millisecond() {
    each_file_mode(|site| {
        site.clock.advance(Duration::from_micros(400));
        let engine = site.open();
        let real_end = site.clock.wall() + LEASE;
        let lease = acquired(claim(&engine, b"k"));
        let records = engine.admin().records();
        let reported = match records.iter().find(|r| r.key == b"k") {
            Some(RecordInfo {
                state: RecordInfoState::InFlight { lease_deadline, .. },
                ..
            }) => *lease_deadline,
            other => panic!("{other:?}"),
        };
        assert!(reported >= real_end, "{reported:?} before {real_end:?}");
        assert!(reported < real_end + MS);
        site.shut(engine);
        drop(lease);
        let reader = FileReader::open(site.path()).unwrap();
        let stored = match reader.get(b"k").unwrap() {
            Some(RecordInfo {
                state:
                    RecordInfoState::InFlight {
                        lease_deadline,
                        lease,
                        ..
                    },
                ..
            }) => {
                assert_eq!(lease, Some(LEASE));
                lease_deadline
            }
            other => panic!("{other:?}"),
        };
        drop(reader);
        assert!(stored >= real_end, "{stored:?} before {real_end:?}");
        // Reopened exactly at the real end: the key is still held for the 0.6 ms to the
        // stored end (a floored end would have let it go 0.4 ms early).
        site.clock.advance(LEASE);
        let engine = site
            .builder()
            .recovery(Recovery::HonourLeases)
            .open()
            .unwrap();
        assert!(matches!(claim(&engine, b"k"), Claim::InProgress(_)));
    });
}

#[test]
fn completions_past_their_retention_are_absent_after_reopen() {
    each_file_mode(|site| {
        let retention = Duration::from_secs(100);
        let engine = site.builder().retention(retention).open().unwrap();
        let old = acquired(claim(&engine, b"old"));
        let old_token = old.token();
        old.complete(b"old response").unwrap();
        site.clock.advance(Duration::from_secs(50));
        let young = acquired(claim(&engine, b"young"));
        let young_token = young.token();
        young.complete(b"young response").unwrap();
        let forever = acquired(claim(&engine, b"ancient"));
        forever.complete(b"ancient").unwrap();
        site.shut(engine);

        // Exactly at "old"'s expiry instant.
        site.clock.advance(Duration::from_secs(50));
        let engine = site.builder().retention(retention).open().unwrap();
        assert_eq!(engine.get(b"old").unwrap(), None);
        assert_eq!(engine.stats().completed, 2);
        assert_eq!(
            engine.complete(b"old", old_token, b"old response"),
            Err(LeaseError::LeaseLost)
        );
        let reclaimed = acquired(claim(&engine, b"old"));
        assert!(reclaimed.token() > young_token);
        assert_eq!(reclaimed.attempt(), 1);
        in_progress(claim(&engine, b"old")); // never the old response
        reclaimed.complete(b"new response").unwrap();
        engine.flush().unwrap();
        assert_eq!(
            completed(claim(&engine, b"old")).response(),
            b"new response"
        );

        // "young" has 50 s left (stored with millisecond precision).
        assert_eq!(
            completed(claim(&engine, b"young")).response(),
            b"young response"
        );
        site.clock.advance(Duration::from_secs(50) - MS);
        assert_eq!(
            completed(claim(&engine, b"young")).response(),
            b"young response"
        );
        site.clock.advance(MS);
        assert_eq!(engine.get(b"young").unwrap(), None);
        site.shut(engine);

        // At 199 s: everything from before is gone; the key re-claimed at 100 s is served
        // until 200 s.
        site.clock.advance(Duration::from_secs(49));
        let engine = site.builder().retention(retention).open().unwrap();
        for key in [&b"young"[..], b"ancient"] {
            assert_eq!(engine.get(key).unwrap(), None);
        }
        assert_eq!(
            completed(claim(&engine, b"old")).response(),
            b"new response"
        );
        site.clock.advance(Duration::from_secs(1));
        assert_eq!(engine.get(b"old").unwrap(), None);
    });
}

#[test]
fn max_retention_survives_reopen_without_overflow() {
    each_file_mode(|site| {
        let engine = site.builder().retention(Duration::MAX).open().unwrap();
        acquired(claim(&engine, b"k")).complete(b"kept").unwrap();
        site.shut(engine);
        site.clock
            .advance(Duration::from_secs(200 * 365 * 24 * 3600));
        let engine = site.builder().retention(Duration::MAX).open().unwrap();
        assert_eq!(completed(claim(&engine, b"k")).response(), b"kept");
        site.clock
            .advance(Duration::from_secs(200 * 365 * 24 * 3600));
        assert_eq!(completed(claim(&engine, b"k")).response(), b"kept");
    });
}

#[test]
fn released_keys_stay_absent_after_reopen() {
    each_file_mode(|site| {
        let engine = site.open();
        let mut a = acquired(claim(&engine, b"explicit"));
        a.set_checkpoint(1, b"cp").unwrap();
        a.release().unwrap();
        let c = acquired(claim(&engine, b"by-token"));
        engine.release(b"by-token", c.token()).unwrap();
        // Released, then claimed again and completed.
        acquired(claim(&engine, b"again")).release().unwrap();
        acquired(claim(&engine, b"again"))
            .complete(b"second")
            .unwrap();
        site.shut(engine);
        drop(c);

        let engine = site.open();
        assert_eq!(engine.stats().inflight, 0);
        for key in [&b"explicit"[..], b"by-token"] {
            assert_eq!(engine.get(key).unwrap(), None);
            let l = acquired(claim(&engine, key));
            assert_eq!(l.attempt(), 1, "a released key came back as a takeover");
            assert!(l.checkpoint().is_none());
        }
        assert_eq!(completed(claim(&engine, b"again")).response(), b"second");
    });
}
