//! Time as the engine sees it: an injectable [`Clock`] with a monotonic and a wall reading.
//!
//! Leases and in-memory expiry run on the monotonic reading, so a wall-clock jump never
//! shortens or stretches a live lease. Persisted deadlines use wall time, because monotonic
//! readings mean nothing after a restart.

use crate::sync::{Arc, AtomicU64, Mutex, Ordering, Weak};
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A callback the engine registers so that a clock can wake waiters when time jumps.
pub type ClockListener = dyn Fn() + Send + Sync;

/// A source of time. The engine reads it on every call; tests inject [`MockClock`].
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since an arbitrary fixed origin; never goes backwards.
    fn monotonic(&self) -> Duration;
    /// The wall-clock time; may jump in either direction.
    fn wall(&self) -> SystemTime;
    /// Registers a listener to call whenever time moves by other means than its own passing.
    /// Real clocks ignore it; [`MockClock`] calls it on every [`MockClock::advance`].
    fn subscribe(&self, _listener: Weak<ClockListener>) {}
}

/// The real clock: `Instant` for monotonic time and `SystemTime` for wall time.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose monotonic origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to. Cloning shares the same time.
///
/// ```
/// use idemkv::{Clock, MockClock};
/// use std::time::Duration;
/// let clock = MockClock::new();
/// let before = clock.monotonic();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.monotonic() - before, Duration::from_secs(5));
/// ```
#[derive(Clone, Default)]
pub struct MockClock {
    inner: Arc<MockInner>,
}

#[derive(Default)]
struct MockInner {
    monotonic_ns: AtomicU64,
    wall_ns: AtomicU64,
    listeners: Mutex<Vec<Weak<ClockListener>>>,
}

impl fmt::Debug for MockClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockClock")
            .field("monotonic", &self.monotonic())
            .field("wall", &self.wall())
            .finish()
    }
}

/// Wall time a new mock clock starts at, since the epoch: 2024-01-01T00:00:00Z, far from
/// both ends.
const MOCK_WALL_START: Duration = Duration::from_secs(1_704_067_200);

impl MockClock {
    /// A mock clock at monotonic zero and wall time 2024-01-01T00:00:00Z.
    pub fn new() -> Self {
        let clock = Self::default();
        clock.set_wall(UNIX_EPOCH + MOCK_WALL_START);
        clock
    }

    /// Moves both readings forward by `d` and wakes every waiting engine call.
    pub fn advance(&self, d: Duration) {
        let ns = duration_ns(d);
        let _ = self
            .inner
            .monotonic_ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_add(ns))
            });
        let _ = self
            .inner
            .wall_ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_add(ns))
            });
        self.notify();
    }

    /// Sets the wall reading alone, as an NTP step or an operator would; monotonic time stays.
    /// A time before the UNIX epoch reads as the epoch.
    pub fn set_wall(&self, at: SystemTime) {
        let since_epoch = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        self.inner
            .wall_ns
            .store(duration_ns(since_epoch), Ordering::SeqCst);
        self.notify();
    }

    fn notify(&self) {
        // Collect first: a listener must not run under the list lock.
        let live: Vec<Arc<ClockListener>> = {
            let mut listeners = self.inner.listeners.lock();
            listeners.retain(|l| l.strong_count() > 0);
            listeners.iter().filter_map(Weak::upgrade).collect()
        };
        for listener in live {
            listener();
        }
    }
}

impl Clock for MockClock {
    fn monotonic(&self) -> Duration {
        Duration::from_nanos(self.inner.monotonic_ns.load(Ordering::SeqCst))
    }

    fn wall(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.inner.wall_ns.load(Ordering::SeqCst))
    }

    fn subscribe(&self, listener: Weak<ClockListener>) {
        self.inner.listeners.lock().push(listener);
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (about 584 years).
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A duration in milliseconds, saturating at `u64::MAX`.
pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the UNIX epoch of a wall-clock time, as the engine stores it. A time
/// before the epoch is a broken clock; reading it as the epoch keeps every persisted deadline
/// in the future of the file's own records, which is conservative. Saturates at `u64::MAX`.
pub(crate) fn wall_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, duration_ms)
}

/// The wall-clock time `ms` milliseconds after the UNIX epoch. A platform whose
/// `SystemTime` cannot hold it gets a time it can (halving until one fits), so a far-future
/// deadline stays far in the future.
pub(crate) fn wall_time(ms: u64) -> SystemTime {
    let mut d = Duration::from_millis(ms);
    loop {
        if let Some(t) = UNIX_EPOCH.checked_add(d) {
            return t;
        }
        d /= 2;
    }
}

/// The wall-clock instant (ms) of the monotonic instant `at_ns`, given that the monotonic
/// clock reads `now_ns` when the wall clock reads `wall_now_ms`. An instant in the past is
/// rounded up to the millisecond, so a persisted lease end is never earlier than the real
/// one (an abandoned claim is then never reaped early after a restart).
pub(crate) fn wall_ms_at(wall_now_ms: u64, now_ns: u64, at_ns: u64) -> u64 {
    if at_ns >= now_ns {
        wall_now_ms.saturating_add((at_ns - now_ns) / 1_000_000)
    } else {
        wall_now_ms.saturating_sub((now_ns - at_ns) / 1_000_000)
    }
}

/// The engine's view of a clock: readings as integers, as the index stores them.
#[derive(Debug, Clone)]
pub(crate) struct Time {
    clock: Arc<dyn Clock>,
}

impl Time {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self { clock }
    }

    /// Monotonic nanoseconds.
    pub(crate) fn mono_ns(&self) -> u64 {
        duration_ns(self.clock.monotonic())
    }

    /// Wall milliseconds since the epoch.
    pub(crate) fn wall_ms(&self) -> u64 {
        wall_ms(self.clock.wall())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_ms_and_wall_time_round_trip() {
        for ms in [0, 1, 1_704_067_200_123, u64::from(u32::MAX) * 1000] {
            assert_eq!(wall_ms(wall_time(ms)), ms);
        }
        assert_eq!(wall_time(1_500), UNIX_EPOCH + Duration::from_millis(1_500));
    }

    #[test]
    fn wall_ms_reads_a_time_before_the_epoch_as_zero() {
        let before = UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(wall_ms(before), 0);
        assert_eq!(wall_ms(UNIX_EPOCH + Duration::from_micros(2_999)), 2);
    }

    #[test]
    fn mock_clock_set_wall_moves_the_wall_reading_alone() {
        let clock = MockClock::new();
        let mono = clock.monotonic();
        let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        clock.set_wall(at);
        assert_eq!(clock.wall(), at);
        assert_eq!(clock.monotonic(), mono);
        clock.set_wall(UNIX_EPOCH - Duration::from_secs(1));
        assert_eq!(clock.wall(), UNIX_EPOCH);
    }
}
