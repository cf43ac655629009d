//! The sweeper thread's handle: its schedule and its stop signal (the passes it runs are in
//! `sweep.rs`).

use crate::base::sync::{Condvar, Mutex};
use crate::runtime::constants::SWEEP_INTERVAL_DEFAULT;
use std::time::Duration;

/// The sweeper thread's schedule and stop signal.
pub(crate) struct Sweeper {
    interval: Option<Duration>,
    state: Mutex<SweeperState>,
    wake: Condvar,
}

#[derive(Default)]
struct SweeperState {
    stop: bool,
    nudged: bool,
}

impl Sweeper {
    pub(crate) fn new(interval: Option<Duration>) -> Self {
        Self {
            interval,
            state: Mutex::new(SweeperState::default()),
            wake: Condvar::new(),
        }
    }

    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.wake.notify_all();
    }

    /// Asks for a pass now (a mock clock jumped).
    pub(crate) fn nudge(&self) {
        self.state.lock().nudged = true;
        self.wake.notify_all();
    }

    /// Waits for the next pass; false once stopped.
    pub(crate) fn wait(&self) -> bool {
        let interval = self.interval.unwrap_or(SWEEP_INTERVAL_DEFAULT);
        let mut state = self.state.lock();
        if !state.stop && !state.nudged {
            self.wake.wait_for(&mut state, interval);
        }
        state.nudged = false;
        !state.stop
    }
}
