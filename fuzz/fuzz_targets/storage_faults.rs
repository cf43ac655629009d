//! A workload on a simulated disk that fails or loses power at the Nth I/O (write, set_len,
//! sync), then a reopen: every acknowledged record present, nothing never submitted, at most
//! the in-doubt batch differs, tokens never go backwards. See docs/testing.md.
#![no_main]

use idemkv::testkit::faults::{self, FaultCase};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|case: FaultCase| {
    if let Err(failure) = faults::run_case(&case) {
        panic!("storage_faults: {failure}\ncase: {case:?}");
    }
});
