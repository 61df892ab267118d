//! Who drives progress, and how the others learn what they must do.
//!
//! Progress is driven by whichever thread holds the engine's working state,
//! one at a time: an application thread that posts, polls or waits does the
//! work itself, and the engine thread does it otherwise. The rules of the
//! hand-over between them live here:
//!
//! - while an application thread drives, and for [`Tuning::handover`] after
//!   one last did, the engine thread keeps off the sockets, where it would
//!   only race that thread for each packet; after a post alone, only for
//!   [`Tuning::kick_handover`];
//! - a thread that changed what the QPs owe and could not drive rings the
//!   doorbell, which calls whoever drives in for a full round;
//! - a driver that lets go rings the engine if it sleeps past a timer the
//!   driver armed, or if it left answers unsent (which the engine otherwise
//!   sends before it next sleeps); an engine that is awake is not rung but
//!   told, and looks at the timers again before it sleeps.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::eventfd::EventFd;
use super::tuning::Tuning;

/// How long a program that was seen to leave its CQ once a poll found a
/// completion ([`Handover::engine_received`]) is taken to keep doing so.
const LEAVES_FOR: Duration = Duration::from_millis(100);

/// The hand-over of progress between application threads and the engine
/// thread. Points in time are on the transport's clock.
#[derive(Debug)]
pub(crate) struct Handover {
    /// Calls whoever drives progress in: the engine thread, or a waiting
    /// application thread, which also listens to it.
    doorbell: Option<EventFd>,
    /// The next round must look at every QP, not only at the sockets.
    full_round_wanted: AtomicBool,
    /// Application threads driving progress right now.
    drivers: AtomicUsize,
    /// When an application thread last drove progress (ns).
    driven_at: AtomicU64,
    /// When the sleeping engine thread wakes (ns); 0 while it is awake.
    engine_wake_at: AtomicU64,
    /// A thread that stopped driving left answers unsent.
    answers_owed: AtomicBool,
    /// A thread armed a QP timer while the engine was awake: the engine
    /// looks at the timers again before it sleeps.
    timer_armed: AtomicBool,
    /// What the last poll that found a completion set `driven_at` to (ns).
    found_at: AtomicU64,
    /// Until when (ns) polls that find a completion end the hand-over and
    /// wake the engine: the program was seen to leave its CQ after such a
    /// poll and wait elsewhere (perftest's `ib_write_lat` spins on memory).
    leaves_until: AtomicU64,
    /// Since the last poll that found a completion, the engine received
    /// packets while nobody polled: what keeps a program taken to leave.
    served_since_found: AtomicBool,
    /// [`Tuning::handover`].
    handover: Duration,
    /// [`Tuning::kick_handover`].
    kick_handover: Duration,
}

impl Default for Handover {
    /// A hand-over without a doorbell, for tests.
    fn default() -> Handover {
        Handover::new(None, &Tuning::default())
    }
}

impl Handover {
    pub(crate) fn new(doorbell: Option<EventFd>, tuning: &Tuning) -> Handover {
        Handover {
            doorbell,
            full_round_wanted: AtomicBool::new(false),
            drivers: AtomicUsize::new(0),
            driven_at: AtomicU64::new(0),
            engine_wake_at: AtomicU64::new(0),
            answers_owed: AtomicBool::new(false),
            timer_armed: AtomicBool::new(false),
            found_at: AtomicU64::new(0),
            leaves_until: AtomicU64::new(0),
            served_since_found: AtomicBool::new(false),
            handover: tuning.handover,
            kick_handover: tuning.kick_handover,
        }
    }

    /// Calls whoever drives progress in for a full round: for a thread that
    /// changed a QP (a post it could not send itself, a modify, a destroy).
    pub(crate) fn ring(&self) {
        self.full_round_wanted.store(true, Ordering::SeqCst);
        if let Some(d) = &self.doorbell {
            d.signal();
        }
    }

    /// Whether a full round was called in since the last call.
    pub(crate) fn take_full_round_call(&self) -> bool {
        self.full_round_wanted.load(Ordering::SeqCst) && self.full_round_wanted.swap(false, Ordering::SeqCst)
    }

    /// The doorbell's descriptor, for the drivers' waits.
    pub(crate) fn doorbell_fd(&self) -> Option<RawFd> {
        self.doorbell.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Reads the doorbell, the last of `fds`, if `ready` (from
    /// [`crate::net::wait_readable`] on them) says it rang: reading it
    /// every wake-up would cost a system call each.
    pub(crate) fn drain_doorbell(&self, fds: &[RawFd], ready: u64) {
        let doorbell_bit = 1 << fds.len().saturating_sub(1).min(63);
        if let Some(d) = self.doorbell.as_ref().filter(|_| ready & doorbell_bit != 0) {
            d.drain();
        }
    }

    /// A thread posted and sent its QP's packets at `now`: the engine keeps
    /// off only [`Tuning::kick_handover`] for it (a poller or waiter holds
    /// it off longer), since the poster may not be back for the ACKs.
    pub(crate) fn posted(&self, now: Duration) {
        let mark = nanos(now).saturating_sub(nanos(self.handover.saturating_sub(self.kick_handover)));
        self.driven_at.fetch_max(mark, Ordering::SeqCst);
    }

    /// The thread whose round let go at `now` ([`Handover::release`]) is not
    /// going to wait (it destroyed a QP): the engine keeps off only a
    /// [`Tuning::kick_handover`], as after a post, unless another driver
    /// let go since.
    pub(crate) fn drove_once(&self, now: Duration) {
        let mark = nanos(now).saturating_sub(nanos(self.handover.saturating_sub(self.kick_handover)));
        let _ = self.driven_at.compare_exchange(nanos(now), mark, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// An application thread drives progress until the guard is dropped.
    pub(crate) fn driving(&self) -> Driving<'_> {
        self.drivers.fetch_add(1, Ordering::SeqCst);
        Driving(self)
    }

    /// Whether an application thread drives progress right now.
    pub(crate) fn is_driven(&self) -> bool {
        self.drivers.load(Ordering::SeqCst) > 0
    }

    /// A driver lets go at `now`, with answers `owed` if its round ended
    /// early, after a poll that `found` a completion or not. Says whether
    /// the engine must be rung: it is asleep for long and answers are owed,
    /// or asleep past the earliest QP timer, which `next_timer` finds
    /// (asked only when the engine is not due back within a handover
    /// anyway: a spinning poller would pay for that look at every QP on
    /// every poll), or asleep while a program that leaves its CQ after a
    /// completion (see [`Handover::engine_received`]) just did.
    pub(crate) fn release(
        &self,
        now: Duration,
        owed: bool,
        found: bool,
        next_timer: impl FnOnce() -> Option<Duration>,
    ) -> bool {
        // A program that spins on its CQ polls again within a microsecond,
        // and its next poll holds the engine off again.
        let leaves = self.leaves(now);
        let leaving = found && leaves;
        if leaves && !found && !self.served_since_found.load(Ordering::SeqCst) {
            // Back at the CQ before the engine had anything to do: this
            // program spins on its CQ after all.
            self.leaves_until.store(0, Ordering::Relaxed);
        }
        let mark = if leaving { nanos(now.saturating_sub(self.handover)).max(1) } else { nanos(now) };
        self.driven_at.store(mark, Ordering::SeqCst);
        if found {
            self.found_at.store(mark, Ordering::SeqCst);
            self.served_since_found.store(false, Ordering::SeqCst);
        }
        // A round that ended at the driver's completion left the answers it
        // owes (an ACK, say) for the thread's next post to carry. Should it
        // never post, the engine sends them: it sees this before it sleeps,
        // or is rung if already asleep for long.
        if owed {
            self.answers_owed.store(true, Ordering::SeqCst);
        }
        let wake = self.engine_wake_at.load(Ordering::SeqCst);
        let soon = wake != 0 && wake <= nanos(now + self.handover);
        let next_timer = if soon { None } else { next_timer() };
        let asleep_long = wake != 0 && !soon;
        (owed && asleep_long) || (leaving && wake != 0) || next_timer.is_some_and(|t| self.engine_sleeps_past(t))
    }

    /// Whether the program is taken, at `now`, to leave its CQ once a poll
    /// finds a completion: the engine then keeps off at most a
    /// [`Tuning::kick_handover`] at a time, on time, since it may be the
    /// one that found it.
    pub(crate) fn leaves(&self, now: Duration) -> bool {
        nanos(now) < self.leaves_until.load(Ordering::Relaxed)
    }

    /// The engine thread received packets in a round at `now`. If no
    /// application thread has polled since a poll found a completion, the
    /// program left its CQ then and waits for something the engine alone
    /// moves: perftest's `ib_write_lat` polls until its WRITE completes,
    /// then spins on memory for the peer's. For [`LEAVES_FOR`] from now,
    /// such polls end the hand-over at once and wake the engine, instead
    /// of holding it off as for a program that spins on its CQ, for whom
    /// the engine's packets would wait up to a handover and a clock tick
    /// (4 ms a message in `ib_write_lat`).
    pub(crate) fn engine_received(&self, now: Duration) {
        let found = self.found_at.load(Ordering::SeqCst);
        if found != 0 && !self.is_driven() && self.driven_at.load(Ordering::SeqCst) == found {
            self.served_since_found.store(true, Ordering::SeqCst);
            self.leaves_until.store(nanos(now + LEAVES_FOR), Ordering::Relaxed);
        }
    }

    /// A poll found the engine driving and could not: the program is at
    /// its CQ, whatever it found before.
    pub(crate) fn polled_without_driving(&self) {
        if self.found_at.load(Ordering::Relaxed) != 0 {
            self.found_at.store(0, Ordering::SeqCst);
        }
    }

    /// Whether the engine thread is asleep until after `timer`: then it
    /// must be rung to honour it. An engine that is awake is told instead
    /// ([`Handover::engine_may_sleep_until`]): ringing it cost a system call
    /// and woke a thread that was up anyway, at every poll of a program
    /// that spins on its CQ (seven a message in ib_send_lat).
    pub(crate) fn engine_sleeps_past(&self, timer: Duration) -> bool {
        let mut wake = self.engine_wake_at.load(Ordering::SeqCst);
        if wake == 0 {
            self.timer_armed.store(true, Ordering::SeqCst);
            // It may have gone to sleep meanwhile, without seeing the flag.
            wake = self.engine_wake_at.load(Ordering::SeqCst);
        }
        wake != 0 && nanos(timer) < wake
    }

    /// How long the engine keeps off the sockets at `now`: a whole handover
    /// while an application thread drives, else what is left of it since
    /// one last did; `None` once the engine is on its own.
    pub(crate) fn engine_keeps_off(&self, now: Duration) -> Option<Duration> {
        if self.is_driven() {
            return Some(self.handover);
        }
        let since = nanos(now).saturating_sub(self.driven_at.load(Ordering::SeqCst));
        let left = nanos(self.handover).saturating_sub(since);
        (left > 0).then(|| Duration::from_nanos(left))
    }

    /// The engine thread goes to sleep until `at`, or until rung.
    pub(crate) fn engine_sleeps_until(&self, at: Duration) {
        self.engine_wake_at.store(nanos(at).max(1), Ordering::SeqCst);
    }

    /// The engine thread is awake.
    pub(crate) fn engine_wakes(&self) {
        self.engine_wake_at.store(0, Ordering::SeqCst);
    }

    /// The engine thread, idle, would sleep until `at`: it may, unless a
    /// driver left answers owed, which it then sends first, or armed a
    /// timer while it was awake, which a round then finds.
    pub(crate) fn engine_may_sleep_until(&self, at: Duration) -> bool {
        self.engine_sleeps_until(at);
        let owed = self.answers_owed.swap(false, Ordering::SeqCst);
        let armed = self.timer_armed.swap(false, Ordering::SeqCst);
        if owed || armed {
            self.engine_wakes();
            return false;
        }
        true
    }
}

/// An application thread driving progress ([`Handover::driving`]).
pub(crate) struct Driving<'a>(&'a Handover);

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        self.0.drivers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `t` in nanoseconds, saturating.
pub(crate) fn nanos(t: Duration) -> u64 {
    u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const T: Duration = Duration::from_secs(5);

    #[test]
    fn the_engine_keeps_off_while_a_thread_drives_and_a_handover_after() {
        let h = Handover::default();
        assert_eq!(h.engine_keeps_off(T), None, "nobody drove yet");
        let driving = h.driving();
        assert!(h.is_driven());
        assert_eq!(h.engine_keeps_off(T), Some(MS), "a whole handover while one drives");
        drop(driving);
        assert!(!h.release(T, false, false, || None));
        assert_eq!(h.engine_keeps_off(T + MS / 4), Some(MS * 3 / 4), "what is left of it after");
        assert_eq!(h.engine_keeps_off(T + MS), None);
    }

    #[test]
    fn a_post_holds_the_engine_off_only_a_kick_handover() {
        let h = Handover::default();
        h.posted(T);
        assert_eq!(h.engine_keeps_off(T), Some(Duration::from_micros(100)));
        assert!(!h.release(T, false, false, || None));
        h.posted(T);
        assert_eq!(h.engine_keeps_off(T), Some(MS), "a post never shortens a waiter's handover");
    }

    #[test]
    fn a_round_from_a_thread_that_does_not_wait_holds_the_engine_off_a_kick_handover() {
        let h = Handover::default();
        assert!(!h.release(T, false, false, || None));
        h.drove_once(T);
        assert_eq!(h.engine_keeps_off(T), Some(Duration::from_micros(100)));
        assert!(!h.release(T + MS / 2, false, false, || None));
        h.drove_once(T);
        assert_eq!(h.engine_keeps_off(T + MS / 2), Some(MS), "a later driver's handover stays whole");
    }

    #[test]
    fn a_release_rings_the_engine_only_if_it_sleeps_past_the_next_timer() {
        let h = Handover::default();
        assert!(!h.release(T, false, false, || Some(T + MS)), "an awake engine is not rung");
        assert!(!h.engine_may_sleep_until(T + 10 * MS), "but looks at the timers before it sleeps");
        assert!(h.engine_may_sleep_until(T + 10 * MS), "once");
        assert!(h.release(T, false, false, || Some(T + 5 * MS)), "it would sleep past the timer");
        assert!(!h.release(T, false, false, || Some(T + 20 * MS)), "it wakes before the timer");
        assert!(!h.release(T, false, false, || None));
        h.engine_sleeps_until(T + MS / 2);
        let never = || -> Option<Duration> { panic!("the QPs' timers are looked at") };
        assert!(!h.release(T, false, false, never), "an engine back within a handover needs no look at the timers");
    }

    #[test]
    fn answers_owed_ring_a_long_sleeper_and_keep_the_engine_up_once() {
        let h = Handover::default();
        h.engine_sleeps_until(T + 10 * MS);
        assert!(h.release(T, true, false, || None), "asleep for long: rung to send them");
        h.engine_wakes();
        assert!(!h.engine_may_sleep_until(T + 10 * MS), "the engine sends them before it sleeps");
        assert!(h.engine_may_sleep_until(T + 10 * MS), "and only once");
    }

    #[test]
    fn a_program_that_leaves_its_cq_after_a_completion_hands_over_at_once() {
        let h = Handover::default();
        // A poll finds its completion; the engine, asleep, is not rung yet.
        h.engine_sleeps_until(T + 10 * MS);
        assert!(!h.release(T, false, true, || None));
        assert_eq!(h.engine_keeps_off(T), Some(MS));
        // Packets come and nobody polled since: the program left the CQ.
        h.engine_received(T + 2 * MS);
        assert!(h.leaves(T + 2 * MS));
        // From now on such a poll ends the hand-over and wakes the engine.
        h.engine_sleeps_until(T + 10 * MS);
        assert!(h.release(T + 3 * MS, false, true, || None), "the sleeping engine is rung");
        assert_eq!(h.engine_keeps_off(T + 3 * MS), None);
        // The engine places the peer's packets; the program's next polls
        // hold it off again, and it is still taken to leave.
        h.engine_received(T + 4 * MS);
        assert!(!h.release(T + 5 * MS, false, false, || None));
        assert_eq!(h.engine_keeps_off(T + 5 * MS), Some(MS));
        assert!(h.leaves(T + 5 * MS));
        assert!(!h.leaves(T + 4 * MS + LEAVES_FOR), "for a while after the last time it was seen");
    }

    #[test]
    fn a_program_back_at_its_cq_before_the_engine_had_work_is_not_taken_to_leave() {
        let h = Handover::default();
        assert!(!h.release(T, false, true, || None));
        h.engine_received(T + MS);
        assert!(h.leaves(T + MS));
        // A found poll rings the engine, but the program polls again at once.
        h.engine_sleeps_until(T + 10 * MS);
        assert!(h.release(T + 2 * MS, false, true, || None));
        assert!(!h.release(T + 2 * MS, false, false, || None));
        assert!(!h.leaves(T + 2 * MS));
        // Nor is one whose poll found the engine driving.
        assert!(!h.release(T + 3 * MS, false, true, || None));
        h.polled_without_driving();
        h.engine_received(T + 4 * MS);
        assert!(!h.leaves(T + 4 * MS));
    }

    #[test]
    fn a_program_that_spins_on_its_cq_is_not_taken_to_leave() {
        let h = Handover::default();
        assert!(!h.release(T, false, true, || None));
        // It polls again before the engine sees a packet.
        assert!(!h.release(T + MS / 100, false, false, || None));
        h.engine_received(T + MS / 50);
        assert!(!h.leaves(T + MS / 50));
        // So is one whose poll thread drives right now.
        assert!(!h.release(T + MS / 10, false, true, || None));
        let driving = h.driving();
        h.engine_received(T + MS / 5);
        drop(driving);
        assert!(!h.leaves(T + MS / 5));
        h.engine_sleeps_until(T + 10 * MS);
        assert!(!h.release(T + MS, false, true, || None), "its polls ring nobody");
    }

    #[test]
    fn a_ring_calls_in_one_full_round() {
        let h = Handover::new(Some(EventFd::new().unwrap()), &Tuning::default());
        assert!(!h.take_full_round_call());
        h.ring();
        let fds = [h.doorbell_fd().unwrap()];
        assert_eq!(crate::net::wait_readable(&fds, Duration::ZERO), 1, "the doorbell rang");
        h.drain_doorbell(&fds, 1);
        assert_eq!(crate::net::wait_readable(&fds, Duration::ZERO), 0, "and was read");
        assert!(h.take_full_round_call());
        assert!(!h.take_full_round_call(), "one call, one full round");
    }
}
