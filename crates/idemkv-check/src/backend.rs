//! Test helpers shared by the integration tests: unwrap a claim into the answer the test
//! expects, read a stored response, wait for another thread to reach a point.
//!
//! The fault-injecting storage the suites open engines on is the library's own,
//! `idemkv::fault::FaultyStorage`.

// ---------------------------------------------------------------------------------------
// Assertions shared by the suites: unwrap a claim into the answer the test expects.
// ---------------------------------------------------------------------------------------

#[track_caller]
pub fn acquired(claim: idemkv::Claim) -> idemkv::Lease {
    match claim {
        idemkv::Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[track_caller]
pub fn in_progress(claim: idemkv::Claim) -> idemkv::Busy {
    match claim {
        idemkv::Claim::InProgress(busy) => busy,
        other => panic!("expected InProgress, got {other:?}"),
    }
}

#[track_caller]
pub fn completed(claim: idemkv::Claim) -> idemkv::Stored {
    match claim {
        idemkv::Claim::Completed(stored) => stored,
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// The response stored under `key`, or `None` when the key is Absent (the claim that found
/// it so is released again). Any other answer fails the test.
#[track_caller]
pub fn stored_response(engine: &idemkv::Engine, key: &str) -> Option<Vec<u8>> {
    match engine.claim(key.as_bytes(), &idemkv::ClaimOptions::default()) {
        Ok(idemkv::Claim::Completed(stored)) => Some(stored.response().to_vec()),
        Ok(idemkv::Claim::Acquired(lease)) => {
            if let Err(e) = lease.release() {
                panic!("{key}: release: {e}");
            }
            None
        }
        other => panic!("{key}: expected Completed or Acquired, got {other:?}"),
    }
}

/// Waits (in real time, bounded) until `cond` holds: for another thread to reach a point.
#[track_caller]
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < give_up,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Waits (in real time, at most 10 s) until a sync of `storage` is held at its gate
/// (`FaultyStorage::close_gate`); fails the test if none comes.
#[track_caller]
pub fn wait_sync_held(storage: &idemkv::fault::FaultyStorage) {
    let held = storage.wait_blocked(std::time::Duration::from_secs(10));
    assert!(held, "no sync was held at the gate within 10 s");
}
