//! The users' duplicate-delivery kit (`idemkv::testing`): each pattern delivers its copies
//! as it promises, and the report counts what happened.

use idemkv::testing::{duplicates, CopyOutcome, Pattern};
use idemkv::{Durability, Engine};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn engine() -> Engine {
    Engine::builder()
        .durability(Durability::None)
        .open()
        .expect("open")
}

#[test]
fn retry_storm_runs_the_side_effect_once() {
    let engine = engine();
    let effects = AtomicUsize::new(0);
    let report = duplicates(&engine, b"storm")
        .copies(8)
        .pattern(Pattern::RetryStorm)
        .run(|_| {
            effects.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            Ok::<_, String>(b"done".to_vec())
        });
    assert_eq!(report.side_effects(), 1, "{report}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(report.committed(), 1);
    assert!(report.all_got(b"done"), "{report}");
}

#[test]
fn redelivery_while_working_waits_for_the_first_copy() {
    let engine = engine();
    let report = duplicates(&engine, b"redelivered")
        .copies(4)
        .pattern(Pattern::RedeliveryWhileWorking)
        .run(|_| Ok::<_, String>(b"once".to_vec()));
    assert_eq!(report.side_effects(), 1, "{report}");
    assert!(
        matches!(report.outcomes()[0], CopyOutcome::Ran { .. }),
        "{report}"
    );
    assert!(
        report.outcomes()[1..]
            .iter()
            .all(|o| matches!(o, CopyOutcome::Replayed { .. })),
        "{report}"
    );
}

#[test]
fn rebalance_shows_the_takeover_and_fences_the_first_copy() {
    let engine = engine();
    let tokens = std::sync::Mutex::new(Vec::new());
    let report = duplicates(&engine, b"rebalanced")
        .copies(3)
        .pattern(Pattern::Rebalance)
        .run(|lease| {
            tokens.lock().unwrap().push(lease.token());
            Ok::<_, String>(format!("by {}", lease.token()).into_bytes())
        });
    // Both consumers ran the side effect, but only the newer token's result was stored;
    // the first copy learned that its lease was lost.
    assert_eq!(report.side_effects(), 2, "{report}");
    assert_eq!(report.committed(), 1, "{report}");
    assert!(
        matches!(&report.outcomes()[0], CopyOutcome::Failed(why) if why.contains("lease lost")),
        "{report}"
    );
    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens[0] < tokens[1],
        "the takeover has the larger token: {tokens:?}"
    );
    match &report.outcomes()[1] {
        CopyOutcome::Ran { token, .. } => assert_eq!(*token, tokens[1]),
        other => panic!("copy 1: {other:?}\n{report}"),
    }
    assert!(
        matches!(report.outcomes()[2], CopyOutcome::Replayed { .. }),
        "{report}"
    );
}
