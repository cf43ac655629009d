//! Sequences of claim / complete / release / extend / checkpoint / get / clock / flush /
//! restart, run against the sequential model of the state machine in every durability mode.
//! See docs/testing.md.
#![no_main]

use idemkv_check::ops::{self, OpsCase};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|case: OpsCase| {
    if let Err(failure) = ops::run_case_all_modes(&case) {
        panic!("ops_model: {failure}");
    }
});
