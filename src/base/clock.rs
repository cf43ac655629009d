//! Time as the engine sees it: an injectable [`Clock`] with a monotonic and a wall reading.
//!
//! Leases and in-memory expiry run on the monotonic reading, so a wall-clock jump never
//! shortens or stretches a live lease. Persisted deadlines use wall time, because monotonic
//! readings mean nothing after a restart.

use crate::base::limits::WALL_OFFSET_AGE_NS_MAX;
use crate::base::sync::{Arc, AtomicU64, Mutex, Ordering, Weak};
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A callback the engine registers so that a mock clock can wake waiters when time jumps.
pub(crate) type ClockListener = dyn Fn() + Send + Sync;

/// A source of time. The engine reads it on every call; tests inject [`MockClock`].
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since an arbitrary fixed origin; never goes backwards.
    fn monotonic(&self) -> Duration;
    /// The wall-clock time; may jump in either direction.
    fn wall(&self) -> SystemTime;
    /// The [`MockClock`] this clock's time comes from, if any: the engine then wakes its
    /// waiting calls whenever that clock is advanced or set, so that they re-check their
    /// deadlines. A clock that wraps a mock clock returns it here; a real clock keeps the
    /// default (`None`), as time that passes by itself needs no wake-up.
    fn mock_clock(&self) -> Option<&MockClock> {
        None
    }
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

    fn mock_clock(&self) -> Option<&MockClock> {
        Some(self)
    }
}

impl MockClock {
    /// Registers a listener to call whenever time moves by other means than its own passing
    /// (every [`MockClock::advance`] and [`MockClock::set_wall`]).
    pub(crate) fn subscribe(&self, listener: Weak<ClockListener>) {
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

/// [`wall_ms`] rounded up to the next whole millisecond: a lease end as it is stored, never
/// before the real one.
pub(crate) fn wall_ms_ceil(t: SystemTime) -> u64 {
    let ns = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().div_ceil(1_000_000));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// Nanoseconds since the UNIX epoch of a wall-clock time (0 before it, as [`wall_ms`]).
fn wall_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, duration_ns)
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
///
/// With the system clock (the default), a transition reads one clock: the wall reading is
/// derived from the monotonic one by an offset re-measured at least every
/// [`WALL_OFFSET_AGE_NS_MAX`]. Both system clocks advance at the same (NTP-slewed) rate, so
/// the offset changes only when the wall clock is stepped (or a suspend stopped the
/// monotonic clock alone), and a step is seen within that age. A user's clock
/// ([`EngineBuilder::clock`](crate::EngineBuilder::clock)) is read as it is, both readings
/// on their own: a mock may move its wall clock alone.
#[derive(Debug, Clone)]
pub(crate) struct Time {
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    System(Arc<SystemSource>),
    Custom(Arc<dyn Clock>),
}

/// The system clocks: `Instant` since `origin`, and the wall clock as an offset from it.
/// Read by every transition on every thread and written ten times a second: on cache lines
/// of its own, so that no neighbour's writes take them away from the readers.
#[derive(Debug)]
#[repr(align(128))]
struct SystemSource {
    origin: Instant,
    wall: DerivedWall,
}

impl Time {
    /// Time from `clock`, or from the system clocks if `None`.
    pub(crate) fn new(clock: Option<Arc<dyn Clock>>) -> Self {
        let source = match clock {
            Some(clock) => Source::Custom(clock),
            None => {
                let origin = Instant::now();
                Source::System(Arc::new(SystemSource {
                    origin,
                    wall: DerivedWall::new(0, system_wall_ns()),
                }))
            }
        };
        Self { source }
    }

    /// The monotonic reading, in nanoseconds.
    pub(crate) fn mono_ns(&self) -> u64 {
        match &self.source {
            Source::System(sys) => duration_ns(sys.origin.elapsed()),
            Source::Custom(clock) => duration_ns(clock.monotonic()),
        }
    }

    /// The wall reading, in milliseconds since the Unix epoch (the tests' reading).
    #[cfg(test)]
    fn wall_ms(&self) -> u64 {
        self.now().1 / 1_000_000
    }

    /// The monotonic reading and the wall reading (since the Unix epoch), both in
    /// nanoseconds. With the system clock the wall reading comes with the monotonic one, at
    /// no extra read.
    pub(crate) fn now(&self) -> (u64, u64) {
        match &self.source {
            Source::System(sys) => {
                let mono_ns = duration_ns(sys.origin.elapsed());
                (mono_ns, sys.wall.wall_ns(mono_ns, system_wall_ns))
            }
            Source::Custom(clock) => (duration_ns(clock.monotonic()), wall_ns(clock.wall())),
        }
    }
}

fn system_wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, duration_ns)
}

/// The wall clock as an offset from a monotonic reading, measured again once it is older
/// than [`WALL_OFFSET_AGE_NS_MAX`]. The offset is one atomic word, so a reader never sees
/// half of a measurement; two threads measuring at once store equally good offsets.
#[derive(Debug)]
struct DerivedWall {
    /// Wall ns minus monotonic ns at the last measurement (wrapping: a wall clock set
    /// before the epoch reads as 0).
    offset_ns: AtomicU64,
    /// The monotonic reading of the last measurement.
    measured_ns: AtomicU64,
}

impl DerivedWall {
    fn new(mono_ns: u64, wall_ns: u64) -> Self {
        Self {
            offset_ns: AtomicU64::new(wall_ns.wrapping_sub(mono_ns)),
            measured_ns: AtomicU64::new(mono_ns),
        }
    }

    /// The wall clock at monotonic `mono_ns`, in ms (the tests' reading).
    #[cfg(test)]
    fn wall_ms(&self, mono_ns: u64, read_wall_ns: impl FnOnce() -> u64) -> u64 {
        self.wall_ns(mono_ns, read_wall_ns) / 1_000_000
    }

    /// The wall clock at monotonic `mono_ns`, in ns; `read_wall_ns` is called to measure
    /// the offset again if it is too old.
    fn wall_ns(&self, mono_ns: u64, read_wall_ns: impl FnOnce() -> u64) -> u64 {
        let measured = self.measured_ns.load(Ordering::Relaxed);
        let offset = if mono_ns.saturating_sub(measured) > WALL_OFFSET_AGE_NS_MAX
            && self
                .measured_ns
                .compare_exchange(measured, mono_ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let offset = read_wall_ns().wrapping_sub(mono_ns);
            self.offset_ns.store(offset, Ordering::Relaxed);
            offset
        } else {
            self.offset_ns.load(Ordering::Relaxed)
        };
        // A wall clock before the epoch (offset "negative" past the reading) reads as 0.
        let wall_ns = mono_ns.wrapping_add(offset);
        if offset > u64::MAX / 2 && wall_ns > mono_ns {
            0
        } else {
            wall_ns
        }
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

    const MS: u64 = 1_000_000;

    #[test]
    fn derived_wall_moves_with_the_monotonic_reading() {
        let wall_ns = 1_704_067_200_000 * MS;
        let w = DerivedWall::new(7 * MS, wall_ns);
        let unread = || -> u64 { unreachable!("a fresh offset is not measured again") };
        assert_eq!(w.wall_ms(7 * MS, unread), 1_704_067_200_000);
        assert_eq!(w.wall_ms(12 * MS + 999_999, unread), 1_704_067_200_005);
    }

    #[test]
    fn derived_wall_sees_a_step_once_its_offset_is_too_old() {
        let wall_ns = 1_704_067_200_000 * MS;
        let w = DerivedWall::new(0, wall_ns);
        let stepped = wall_ns + 60_000 * MS + WALL_OFFSET_AGE_NS_MAX;
        let mut reads = 0;
        // Within the age the offset stands, whatever the wall clock did.
        let young = w.wall_ms(WALL_OFFSET_AGE_NS_MAX, || {
            reads += 1;
            stepped
        });
        assert_eq!((young, reads), ((wall_ns + WALL_OFFSET_AGE_NS_MAX) / MS, 0));
        // Past it, one reading measures the offset again, and later readings keep it.
        let at = WALL_OFFSET_AGE_NS_MAX + 1;
        let old = w.wall_ms(at, || {
            reads += 1;
            stepped
        });
        assert_eq!((old, reads), (stepped / MS, 1));
        let later = w.wall_ms(at + 3 * MS, || {
            reads += 1;
            0
        });
        assert_eq!((later, reads), (stepped / MS + 3, 1));
    }

    #[test]
    fn derived_wall_before_the_epoch_reads_zero_never_wraps() {
        // The wall clock read 0 (set before the epoch) at monotonic 10 s.
        let w = DerivedWall::new(10_000 * MS, 0);
        let unread = || -> u64 { unreachable!("a fresh offset is not measured again") };
        assert_eq!(w.wall_ms(10_000 * MS + 4 * MS, unread), 4);
        // A reading taken just before that measurement (another thread's) is 0, not 2^64.
        assert_eq!(w.wall_ms(9_999 * MS, unread), 0);
    }

    #[test]
    fn system_time_gives_both_readings_close_to_the_system_clocks() {
        let time = Time::new(None);
        let before = wall_ms(SystemTime::now());
        let (mono_ns, wall_ns) = time.now();
        let wall = wall_ns / 1_000_000;
        let after = wall_ms(SystemTime::now());
        // The offset was measured at `Time::new`, microseconds before `before`.
        assert!(
            wall + 1 >= before && wall <= after,
            "{before} <= {wall} <= {after}"
        );
        assert!(time.mono_ns() >= mono_ns);
        let custom = Time::new(Some(Arc::new(MockClock::new())));
        let mock_wall_ms = wall_ms(UNIX_EPOCH + MOCK_WALL_START);
        assert_eq!(
            custom.now(),
            (0, duration_ns(MOCK_WALL_START)),
            "a user's clock, read as it is"
        );
        assert_eq!(custom.wall_ms(), mock_wall_ms);
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
