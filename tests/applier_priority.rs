//! The default engine's applier (the commit log's background commits to the file) runs
//! below the priority of the thread that opened the engine (docs/design.md, "The commit
//! log"). A test binary of its own: every applier thread in this process is this test's,
//! so none is seen between getting its name and lowering its priority.
#![cfg(target_os = "linux")]

use idemkv::{Claim, ClaimOptions, Engine};

/// A thread's nice value, field 19 of its `/proc` `stat` (its name, field 2, may hold spaces
/// and parentheses: the fields are counted after its last parenthesis).
fn nice_of(stat: &str) -> Option<i32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(16)?
        .parse()
        .ok()
}

/// The nice value of each of this process's threads named `name`, from `/proc`.
fn nice_of_threads(name: &str) -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .expect("tasks")
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if comm.trim_end() != name {
                return None;
            }
            nice_of(&std::fs::read_to_string(dir.join("stat")).ok()?)
        })
        .collect()
}

#[test]
fn the_applier_runs_below_the_priority_of_the_thread_that_opened_the_engine() {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
    let own = nice_of(&stat).expect("the opening thread's nice value");
    assert!(
        nice_of_threads("idemkv-applier").is_empty(),
        "no engine yet"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = Engine::open(dir.path().join("idem.redb")).expect("open");
    let appliers = nice_of_threads("idemkv-applier");
    assert_eq!(appliers.len(), 1, "the default engine has one applier");
    // Lowered by 10, at most to 19 (where an opener at 19 already is).
    assert_eq!(appliers[0], (own + 10).min(19), "the opener runs at {own}");
    // The engine works as ever: a claim and its completion, durable.
    let Ok(Claim::Acquired(lease)) = engine.claim(b"k", &ClaimOptions::default()) else {
        panic!("a new key is acquired");
    };
    lease.complete(b"r").expect("complete");
    engine.close().expect("close");
}
