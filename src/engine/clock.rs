//! The transport's clock for the threaded engine: time since the engine
//! started, read several times a message. `Instant::elapsed` costs about 100
//! instructions a read (a checked, normalizing subtraction of two
//! `timespec`s); this one reads the same `CLOCK_MONOTONIC` and subtracts
//! nanoseconds.

use std::time::{Duration, Instant};

/// Time since the engine started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    /// `CLOCK_MONOTONIC` at the start, in nanoseconds,
    origin: u64,
    /// and as an `Instant`, to place deadlines given as one.
    origin_instant: Instant,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        Clock { origin_instant: Instant::now(), origin: monotonic_nanos() }
    }

    /// Time since the start.
    pub(crate) fn now(&self) -> Duration {
        Duration::from_nanos(monotonic_nanos().saturating_sub(self.origin))
    }

    /// `at` on this clock (zero if before its start).
    pub(crate) fn at(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin_instant)
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock `Instant` reads.
#[allow(unsafe_code)]
fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a timespec for the kernel (vDSO) to fill;
    // it cannot fail for CLOCK_MONOTONIC.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // Non-negative on Linux: seconds since boot, and nanoseconds below 10^9.
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_runs_with_instant_and_places_its_deadlines() {
        let clock = Clock::start();
        let before = clock.now();
        let deadline = Instant::now() + Duration::from_millis(20);
        std::thread::sleep(Duration::from_millis(20));
        let after = clock.now();
        assert!(after >= before + Duration::from_millis(20), "{before:?} then {after:?}");
        // The deadline, placed on the clock, has passed by `after`, and lies
        // within the span the two clocks' origins differ by (microseconds).
        let placed = clock.at(deadline);
        assert!(placed <= after && placed + Duration::from_millis(1) >= before + Duration::from_millis(20));
        assert_eq!(clock.at(Instant::now() - Duration::from_secs(3600)), Duration::ZERO);
    }
}
