//! `Buffered` with `durable_claims(false)`: a claim of a key with no state in memory queues
//! no write, its lease's first durable act writes the key's whole record, and admission
//! counts each lease left unwritten in the backlog as it would count its queued record.
//! (Crashes at every I/O point of such a workload: `idemkv-check`'s
//! `storage_faults_every_io_point_buffered_lazy_claims`.)

use idemkv::*;
use std::path::Path;
use std::time::Duration;

/// Longer than any test: with the clock standing still, no lease ends.
const LONG_LEASE: Duration = Duration::from_secs(3600);

fn open(path: &Path, clock: &MockClock, durable_claims: bool) -> Engine {
    Engine::builder()
        .path(path)
        .clock(clock.clone())
        .durability(Durability::buffered())
        .durable_claims(durable_claims)
        .lease(LONG_LEASE)
        .inflight_max(1 << 16)
        .sweep_interval(None)
        .open()
        .expect("open")
}

/// A `Buffered` engine with lazy claims on a new file in a new directory (kept while the
/// engine is), and its admission limit, which before the writer's rate is measured is the
/// limit's floor.
fn open_lazy() -> (tempfile::TempDir, Engine, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = open(&dir.path().join("lazy.redb"), &MockClock::new(), false);
    let limit = usize::try_from(engine.stats().queue_claims_max).expect("limit");
    (dir, engine, limit)
}

/// The lease of a claim of a new key, or the error that refused the claim.
fn try_acquire(engine: &Engine, key: &[u8]) -> Result<Lease, ClaimError> {
    match engine.claim(key, &ClaimOptions::default()) {
        Ok(Claim::Acquired(lease)) => Ok(lease),
        Err(e) => Err(e),
        Ok(other) => panic!("claim of the new key {key:?}: {other:?}"),
    }
}

fn acquire(engine: &Engine, key: &[u8]) -> Lease {
    try_acquire(engine, key).unwrap_or_else(|e| panic!("claim of {key:?}: {e:?}"))
}

/// The same four leases with and without durable claims: one left open, one checkpointed,
/// one completed, one released; then a flush, a close and a reopen. Only the open lease's
/// claim differs: written (and InFlight after the reopen) with durable claims, never
/// written (and Absent) without; and without, the writer committed one operation per
/// lease instead of two.
#[test]
fn a_new_keys_claim_is_written_only_by_its_leases_first_durable_act() {
    for durable_claims in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("unwritten.redb");
        let clock = MockClock::new();
        let engine = open(&path, &clock, durable_claims);
        let open_lease = acquire(&engine, b"open");
        let mut checkpointed = acquire(&engine, b"checkpointed");
        checkpointed.set_checkpoint(1, b"half").expect("checkpoint");
        acquire(&engine, b"done")
            .complete(b"resp")
            .expect("complete");
        assert!(acquire(&engine, b"released").release().expect("release"));
        engine.flush().expect("flush");
        assert_eq!(
            engine.stats().claims_unwritten,
            u64::from(!durable_claims),
            "durable_claims({durable_claims}): only the open lease's claim is unwritten"
        );
        let writes = if durable_claims { 4 + 3 } else { 3 };
        assert_eq!(
            engine.stats().committed_ops,
            writes,
            "durable_claims({durable_claims}): four claims, a checkpoint, a completion and a release"
        );
        engine.close().expect("close");
        drop((open_lease, checkpointed, engine));

        let engine = open(&path, &clock, durable_claims);
        match (durable_claims, engine.get(b"open").expect("get")) {
            (true, Some(KeyState::InFlight { attempt: 1, .. })) | (false, None) => {}
            (_, other) => {
                panic!("durable_claims({durable_claims}): the open lease's key: {other:?}")
            }
        }
        match engine.get(b"checkpointed").expect("get") {
            Some(KeyState::InFlight {
                attempt: 1,
                checkpoint: Some(c),
                ..
            }) => assert_eq!((c.phase(), c.data()), (1, &b"half"[..])),
            other => panic!("the checkpointed key: {other:?}"),
        }
        match engine.get(b"done").expect("get") {
            Some(KeyState::Completed { response, .. }) => assert_eq!(&*response, b"resp"),
            other => panic!("the completed key: {other:?}"),
        }
        assert_eq!(engine.get(b"released").expect("get"), None);
        // A retry of the open lease's key takes the recovered claim over as a second
        // attempt, or acquires a key it finds Absent as a first one.
        match engine.claim(b"open", &ClaimOptions::default()) {
            Ok(Claim::Acquired(lease)) => {
                assert_eq!(lease.attempt(), if durable_claims { 2 } else { 1 })
            }
            other => panic!("durable_claims({durable_claims}): a retry: {other:?}"),
        }
        engine.close().expect("close");
    }
}

/// Claims that queue nothing are refused at the admission limit all the same: each lease
/// left unwritten counts in the backlog, for the write its next act will queue. A
/// completion moves a lease's place to the queue, so only its commit makes room.
#[test]
fn unwritten_claims_are_admitted_against_the_backlog() {
    let (_dir, engine, limit) = open_lazy();
    let mut leases = Vec::new();
    let refused = loop {
        assert!(leases.len() <= limit, "admitted past the limit of {limit}");
        let key = format!("k{}", leases.len());
        match try_acquire(&engine, key.as_bytes()) {
            Ok(lease) => leases.push(lease),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(refused, ClaimError::Overloaded(Limit::WriterQueue)),
        "{refused:?}"
    );
    assert_eq!(
        leases.len(),
        limit,
        "refused at the limit, as a queued claim is"
    );
    let stats = engine.stats();
    assert_eq!(stats.committed_ops, 0, "no claim queued a write");
    assert_eq!(stats.claims_unwritten, limit as u64);

    let done = leases.pop().expect("a lease");
    done.complete(b"r").expect("complete");
    assert!(
        matches!(
            engine.claim(b"next", &ClaimOptions::default()),
            Err(ClaimError::Overloaded(Limit::WriterQueue))
        ),
        "a completion not yet durable still counts"
    );
    engine.flush().expect("flush");
    leases.push(acquire(&engine, b"next"));
    assert_eq!(engine.stats().claims_unwritten, limit as u64);
    // Every way a lease ends or writes its record takes its place out of the count.
    for (i, mut lease) in leases.drain(..).enumerate() {
        match i % 3 {
            0 => lease.complete(b"r"),
            1 => lease.release().map(drop),
            _ => lease.set_checkpoint(1, b"c"),
        }
        .expect("the lease's act");
    }
    assert_eq!(engine.stats().claims_unwritten, 0);
    engine.close().expect("close");
}

/// Only unwritten leases count: leases whose record is written (here by a checkpoint) may
/// be live past the admission limit, as with durable claims.
#[test]
fn written_leases_do_not_count_against_the_backlog() {
    let (_dir, engine, limit) = open_lazy();
    let mut leases = Vec::new();
    for i in 0..limit + 100 {
        let key = format!("k{i}");
        let mut lease = match try_acquire(&engine, key.as_bytes()) {
            Ok(lease) => lease,
            Err(ClaimError::Overloaded(Limit::WriterQueue)) => {
                // The checkpoints fill the backlog: their commit makes room.
                engine.flush().expect("flush");
                acquire(&engine, key.as_bytes())
            }
            Err(e) => panic!("claim {i}: {e:?}"),
        };
        lease.set_checkpoint(1, b"c").expect("checkpoint");
        leases.push(lease);
    }
    let stats = engine.stats();
    assert_eq!(stats.inflight, (limit + 100) as u64);
    assert_eq!(stats.claims_unwritten, 0);
    engine.close().expect("close");
}
