//! A QP's timers in one table, as quinn-proto keeps a connection's: each
//! timer is a deadline or nothing, the QP's next deadline is the earliest of
//! them, and an expired one is handled by what it is for.

use std::time::Duration;

/// The shortest local ACK timeout a requester waits, whatever the attribute
/// asks (rxe-spec T-32). Kernel rxe counts the timeout in jiffies, at least
/// one, so it never retries sooner than the next timer tick (up to 4 ms at
/// the usual 250 Hz), and it answers from the kernel, which a busy host does
/// not delay. softroce's peer answers from its own threads, which a busy
/// host can keep waiting for several scheduler slices: with a 4 ms floor,
/// `ib_write_bw -u 4` pairs among two CPU hogs and other work (load 13 on 2
/// cores) still failed 2 runs in 6, with 16 ms none in 6 at load 17-22.
pub const MIN_ACK_TIMEOUT: Duration = Duration::from_millis(16);

/// What a QP waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The wait an RNR NAK asked for: at its end the requester resends from
    /// the NAKed PSN, and until then it sends no requests.
    RnrWait,
    /// The local ACK timeout: nothing was acknowledged in time, so the
    /// requester goes back to the oldest unacknowledged PSN.
    AckTimeout,
    /// A message ended without AckReq and nothing asked since: its last
    /// packet goes again, asking (rxe-spec T-6).
    AskForAck,
}

impl Timer {
    /// Every timer, in the order due ones are handled.
    pub(crate) const ALL: [Timer; 3] = [Timer::RnrWait, Timer::AckTimeout, Timer::AskForAck];
}

/// A deadline, on the transport's clock, for each [`Timer`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TimerTable([Option<Duration>; Timer::ALL.len()]);

impl TimerTable {
    /// Arms `timer` for `at`, replacing its deadline if it had one.
    pub(crate) fn set(&mut self, timer: Timer, at: Duration) {
        self.0[timer as usize] = Some(at);
    }

    /// Disarms `timer`.
    pub(crate) fn stop(&mut self, timer: Timer) {
        self.0[timer as usize] = None;
    }

    /// Whether `timer` has a deadline.
    pub(crate) fn is_armed(&self, timer: Timer) -> bool {
        self.0[timer as usize].is_some()
    }

    /// The earliest deadline of any timer.
    pub(crate) fn next(&self) -> Option<Duration> {
        self.0.iter().flatten().min().copied()
    }

    /// Whether `timer` is due at `now`; if so it is disarmed, for the caller
    /// to handle.
    pub(crate) fn expire(&mut self, timer: Timer, now: Duration) -> bool {
        let due = self.0[timer as usize].is_some_and(|at| at <= now);
        if due {
            self.stop(timer);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_deadline_is_the_earliest_and_expiry_disarms() {
        let ms = Duration::from_millis;
        let mut timers = TimerTable::default();
        assert_eq!(timers.next(), None);
        timers.set(Timer::AckTimeout, ms(30));
        timers.set(Timer::AskForAck, ms(10));
        assert_eq!(timers.next(), Some(ms(10)));
        assert!(!timers.expire(Timer::AckTimeout, ms(29)), "not due yet");
        assert!(timers.expire(Timer::AskForAck, ms(10)), "due at its deadline");
        assert!(!timers.is_armed(Timer::AskForAck) && !timers.expire(Timer::AskForAck, ms(10)), "and only once");
        assert_eq!(timers.next(), Some(ms(30)));
        timers.stop(Timer::AckTimeout);
        assert_eq!(timers.next(), None);
    }
}
