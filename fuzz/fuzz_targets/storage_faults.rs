//! A workload on a simulated file and commit log (`Immediate` runs the default, logged path)
//! where one of them fails or loses power at its Nth I/O (write, set_len, sync), then a reopen: every acknowledged record present, nothing never submitted, at most
//! the in-doubt batch differs, tokens never go backwards. See docs/testing.md.
//! `IDEMKV_SABOTAGE=<name>` arms a deliberate bug (`concurrent::bug_from_name`), such as
//! `ack-before-commit`, `skip-token-hwm` or `drop-old-removal`, in a build with
//! RUSTFLAGS="--cfg idemkv_sabotage".
#![no_main]

use idemkv_check::concurrent;
use idemkv_check::faults::{self, FaultCase};
use idemkv_check::Bug;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn bug() -> Bug {
    static BUG: OnceLock<Bug> = OnceLock::new();
    *BUG.get_or_init(concurrent::bug_from_env)
}

fuzz_target!(|case: FaultCase| {
    if let Err(failure) = faults::run_case_with(&case, bug()) {
        panic!("storage_faults: {failure}\ncase: {case:?}");
    }
});
