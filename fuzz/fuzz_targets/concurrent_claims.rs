//! Per-thread scripts plus a thread schedule, both from the input, run under shuttle with a
//! scheduler that reads its decisions from the input; the recorded history is checked per
//! key for linearizability and globally for token order. `IDEMKV_SABOTAGE=check-then-act`
//! or `=no-fencing` switches a deliberate bug on, to watch the target catch it.
//! Built with RUSTFLAGS="--cfg shuttle --cfg idemkv_sabotage"; see docs/testing.md.
#![no_main]

#[cfg(not(shuttle))]
compile_error!(
    "concurrent_claims runs under shuttle: build it with \
     RUSTFLAGS=\"--cfg shuttle --cfg idemkv_sabotage\" (docs/testing.md)"
);

use idemkv_check::concurrent::{self, Scenario};
use idemkv_check::Bug;
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn bug() -> Bug {
    static BUG: OnceLock<Bug> = OnceLock::new();
    *BUG.get_or_init(concurrent::bug_from_env)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(scenario) = Scenario::from_bytes(&mut u) else {
        return;
    };
    let schedule = u.take_rest();
    if let Err(violation) = concurrent::check_under_shuttle(&scenario, schedule, bug()) {
        panic!("concurrent_claims: {violation}\nscenario: {scenario:?}");
    }
});
