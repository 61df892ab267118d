//! Where a message's time goes, stage by stage: time stamps at fixed points
//! of its way (the application's post, the send system call, the receive
//! call that brings a packet, the completion's return), kept per thread as
//! the intervals between them. Instruction counts (`benches/icount.rs`) say
//! what softroce runs; these say how long each stage takes, the kernel's
//! calls included, so that a ping-pong's round trip can be split into what
//! the kernel takes and what softroce adds (docs/performance.md).
//!
//! Built only with the `stages` feature, which `softroce bench --stages`
//! needs; without it every [`mark`] is an empty inline function. A mark
//! reads the time stamp counter where there is one (~10 ns), so a message's
//! eight marks cost it well under its stages' spread.
//!
//! The interval from a send call to the packet's receipt crosses threads:
//! it is taken from the last send call any thread made, which is the
//! packet's own only when one message is in flight, as in a ping-pong.

/// A point of a message's way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The application starts posting its message.
    Post,
    /// A send system call begins.
    SendCall,
    /// That send call returned.
    SendReturn,
    /// A receive system call begins.
    ReceiveCall,
    /// The receive call returned a packet.
    Received,
    /// The receive call returned nothing.
    NothingReceived,
    /// The application has its completion (or, for a baseline, its datagram).
    Completed,
}

/// The intervals recorded, in the order [`report`] gives them (the
/// recorder's `Interval`s name theirs by their place here).
pub const INTERVALS: [&str; 8] = [
    "post -> send call",
    "send call",
    "a send call -> packet received",
    "packet received -> completion",
    "completion -> next post",
    "receive call that brought a packet",
    "receive call that brought nothing",
    "receive call -> next one, when empty",
];

/// Which of [`INTERVALS`] a sample belongs to.
#[cfg(feature = "stages")]
#[derive(Clone, Copy)]
enum Interval {
    PostToSendCall,
    SendCall,
    SendCallToReceived,
    ReceivedToCompleted,
    CompletedToPost,
    ReceiveCallWithPacket,
    ReceiveCallEmpty,
    EmptyPollPeriod,
}

/// One interval's spread on this thread, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread {
    /// Which of [`INTERVALS`].
    pub interval: &'static str,
    /// How many were recorded.
    pub count: usize,
    /// The 25th percentile.
    pub p25: u64,
    /// The median.
    pub p50: u64,
    /// The 75th percentile.
    pub p75: u64,
}

#[cfg(feature = "stages")]
mod recorder {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    use super::{Interval, Spread, Stage, INTERVALS};

    /// The last send call any thread began (ticks).
    static LAST_SEND_CALL: AtomicU64 = AtomicU64::new(0);

    /// Intervals longer than this are another thing (a sleep, a
    /// preemption) and are left out.
    const LONGEST: Duration = Duration::from_millis(1);

    #[derive(Default)]
    struct Recorder {
        /// When each stage was last marked on this thread (ticks; 0: not since it was used).
        at: [u64; 7],
        samples: [Vec<u64>; INTERVALS.len()],
    }

    thread_local! {
        static RECORDER: RefCell<Recorder> = RefCell::new(Recorder::default());
    }

    /// The time stamp counter where there is one, else the monotonic clock (ns).
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    fn ticks() -> u64 {
        // SAFETY: RDTSC reads a counter; it has no memory effects.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn ticks() -> u64 {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }

    /// Ticks per nanosecond, measured once over 20 ms.
    fn ticks_per_ns() -> f64 {
        static RATE: OnceLock<f64> = OnceLock::new();
        *RATE.get_or_init(|| {
            let (t0, i0) = (ticks(), Instant::now());
            std::thread::sleep(Duration::from_millis(20));
            let (t1, elapsed) = (ticks(), i0.elapsed());
            (t1.wrapping_sub(t0) as f64 / elapsed.as_nanos() as f64).max(f64::MIN_POSITIVE)
        })
    }

    pub fn mark(stage: Stage) {
        let now = ticks();
        let longest = (LONGEST.as_nanos() as f64 * ticks_per_ns()) as u64;
        RECORDER.with(|r| {
            let mut r = r.borrow_mut();
            let record = |r: &mut Recorder, interval: Interval, since: u64| {
                let d = now.wrapping_sub(since);
                if since != 0 && d <= longest {
                    r.samples[interval as usize].push(d);
                }
            };
            match stage {
                Stage::Post => {
                    let since = r.at[Stage::Completed as usize];
                    record(&mut r, Interval::CompletedToPost, since);
                }
                Stage::SendCall => {
                    let since = std::mem::take(&mut r.at[Stage::Post as usize]);
                    record(&mut r, Interval::PostToSendCall, since);
                    LAST_SEND_CALL.store(now, Ordering::Relaxed);
                }
                Stage::SendReturn => {
                    let since = r.at[Stage::SendCall as usize];
                    record(&mut r, Interval::SendCall, since);
                }
                Stage::ReceiveCall => {
                    let since = std::mem::take(&mut r.at[Stage::NothingReceived as usize]);
                    if since != 0 {
                        let started = r.at[Stage::ReceiveCall as usize];
                        record(&mut r, Interval::EmptyPollPeriod, started);
                    }
                }
                Stage::Received => {
                    let since = r.at[Stage::ReceiveCall as usize];
                    record(&mut r, Interval::ReceiveCallWithPacket, since);
                    record(&mut r, Interval::SendCallToReceived, LAST_SEND_CALL.load(Ordering::Relaxed));
                }
                Stage::NothingReceived => {
                    let since = r.at[Stage::ReceiveCall as usize];
                    record(&mut r, Interval::ReceiveCallEmpty, since);
                }
                Stage::Completed => {
                    let since = std::mem::take(&mut r.at[Stage::Received as usize]);
                    record(&mut r, Interval::ReceivedToCompleted, since);
                }
            }
            r.at[stage as usize] = now;
        });
    }

    pub fn reset() {
        // The rate is measured now, not at a first mark amid the traffic.
        ticks_per_ns();
        RECORDER.with(|r| *r.borrow_mut() = Recorder::default());
    }

    pub fn report() -> Vec<Spread> {
        let rate = ticks_per_ns();
        RECORDER.with(|r| {
            let mut r = r.borrow_mut();
            INTERVALS
                .iter()
                .zip(r.samples.iter_mut())
                .filter(|(_, samples)| !samples.is_empty())
                .map(|(&interval, samples)| {
                    samples.sort_unstable();
                    let at = |q: usize| (samples[(samples.len() - 1) * q / 4] as f64 / rate).round() as u64;
                    Spread { interval, count: samples.len(), p25: at(1), p50: at(2), p75: at(3) }
                })
                .collect()
        })
    }
}

/// Whether this build records stages (the `stages` feature).
pub const RECORDED: bool = cfg!(feature = "stages");

/// Marks `stage` on this thread now.
#[inline(always)]
pub fn mark(stage: Stage) {
    #[cfg(feature = "stages")]
    recorder::mark(stage);
    #[cfg(not(feature = "stages"))]
    let _ = stage;
}

/// Forgets what this thread recorded (after a warm-up, say).
pub fn reset() {
    #[cfg(feature = "stages")]
    recorder::reset();
}

/// This thread's intervals so far, those with any recorded.
pub fn report() -> Vec<Spread> {
    #[cfg(feature = "stages")]
    return recorder::report();
    #[cfg(not(feature = "stages"))]
    Vec::new()
}

#[cfg(all(test, feature = "stages"))]
mod tests {
    use super::*;

    #[test]
    fn a_ping_pongs_marks_give_each_interval_once_a_message() {
        reset();
        for _ in 0..3 {
            mark(Stage::Post);
            mark(Stage::SendCall);
            mark(Stage::SendReturn);
            mark(Stage::ReceiveCall);
            mark(Stage::NothingReceived);
            mark(Stage::ReceiveCall);
            mark(Stage::Received);
            mark(Stage::Completed);
        }
        let report = report();
        let count = |name: &str| report.iter().find(|s| s.interval == name).map(|s| s.count);
        assert_eq!(count("post -> send call"), Some(3));
        assert_eq!(count("send call"), Some(3));
        assert_eq!(count("a send call -> packet received"), Some(3));
        assert_eq!(count("packet received -> completion"), Some(3));
        assert_eq!(count("completion -> next post"), Some(2), "the first post follows no completion");
        assert_eq!(count("receive call that brought a packet"), Some(3));
        assert_eq!(count("receive call that brought nothing"), Some(3));
        assert_eq!(count("receive call -> next one, when empty"), Some(3));
        assert!(report.iter().all(|s| s.p25 <= s.p50 && s.p50 <= s.p75));
    }
}
