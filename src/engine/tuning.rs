//! The threaded engine's knobs, in one place: how many packets each way of
//! driving progress moves, and how long each waits, polls or keeps off.
//!
//! Why the defaults are what they are, from measurements on 2-vCPU VMs and
//! loopback (the README's bench tables show the effect):
//!
//! - **Polling before sleeping.** A sleeping thread's wake-up costs little
//!   on one CPU, but the scheduler puts a thread woken while its waker keeps
//!   running onto an idle CPU, and waking an idle vCPU takes 30-70 µs: a UDP
//!   ping-pong whose two threads share a CPU answers in 4 µs there, a SEND
//!   ping-pong, which works between sending and sleeping, took 70-90 µs. So
//!   a waiter polls for about a loopback round trip ([`Tuning::wait_spin`]),
//!   and the engine thread for as long as a stream's packets and ACKs take
//!   to come back under a non-root user's 208 KiB socket buffer
//!   ([`Tuning::engine_spin`]); an idle device does not poll. A poller
//!   yields its CPU between polls after [`Tuning::yield_after`], longer than
//!   a ping-pong's round trip (which so never yields), so that threads that
//!   poll on fewer CPUs than they are (the engines of several devices) take
//!   turns. With a single CPU nothing polls: it would only delay the peer.
//! - **Handovers.** While an application thread drives progress the engine
//!   would only race it for each packet, so it keeps off for
//!   [`Tuning::handover`] after one last did; after a post alone only for
//!   about a loopback round trip ([`Tuning::kick_handover`]), after which
//!   the ACKs that move a transfer on would wait for a thread that may have
//!   gone. While a thread waits or polls, the engine looks again at the
//!   first clock tick after the handover (4 ms at the common 250 Hz): a
//!   wake-up that programs a timer of its own costs whichever thread it
//!   lands on 15-25 µs on a VM, a thousand times a second.
//! - **Quiet rounds.** A round that finds nothing to do is followed, for
//!   [`Tuning::quiet_span`], by rounds that look only at the sockets: the
//!   walk over every QP, its locks and the counters' publication are about
//!   a third of an idle round, so a packet waits less for the poll that
//!   finds it. Work posted meanwhile calls a full round in; what a missed
//!   change could wait is bounded by the span.
//! - **Batches.** A post to a QP whose ACK is on its way (a few messages'
//!   worth unacknowledged, [`Tuning::busy_unacked`], so a post or two after
//!   another still leaves at once) leaves its requests for the packets that
//!   ACK lets out, as one batch: a stream of posts each sent alone costs a
//!   system call per packet on both sides. An ACK asked for late in a long
//!   round leaves at once: a requester whose window is the peer's small
//!   socket buffer would otherwise stop for every round.
//! - **Lingering.** A destroyed RC QP answers resends of its last messages
//!   for many of the usual 67 ms ACK timeouts (timeout 14), as a peer
//!   resends them.

use std::time::Duration;

/// The threaded engine's knobs; see the [module documentation](self) for why
/// the defaults are what they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tuning {
    /// Packets a post sends from the posting thread before leaving the rest to the engine.
    pub(crate) kick_limit: usize,
    /// Unacknowledged PSNs from which a post's requests may wait for the ACK on its way.
    pub(crate) busy_unacked: u32,
    /// Packets a post sends at once even to a busy QP: a batch as large as waiting for the ACK would make.
    pub(crate) send_batch: u32,
    /// Packets a round receives at most before it runs timers and transmits.
    pub(crate) round_receive: usize,
    /// Packets a round sends from each QP at most.
    pub(crate) round_transmit: usize,
    /// Packets handled in a round after which one that asks for an ACK gets it at once.
    pub(crate) early_ack_after: u32,
    /// How long the engine keeps off after an application thread drove progress, and how long a
    /// waiter waits for a hand-off before it tries to drive again.
    pub(crate) handover: Duration,
    /// How long the engine keeps off after a post alone.
    pub(crate) kick_handover: Duration,
    /// How much later than a handover's end the engine may look again while a thread waits or polls.
    pub(crate) handover_slack: Duration,
    /// How long a waiting thread polls after its last packet before it sleeps.
    pub(crate) wait_spin: Duration,
    /// How long the engine thread polls after its last busy round before it sleeps.
    pub(crate) engine_spin: Duration,
    /// How long a polling waiter has seen nothing before it yields its CPU between polls.
    pub(crate) yield_after: Duration,
    /// How long after a full round that found nothing the rounds that receive nothing look only at the sockets.
    pub(crate) quiet_span: Duration,
    /// The longest the engine sleeps: it re-reads the QP table at least this often.
    pub(crate) idle: Duration,
    /// How long a destroy waits for the thread driving progress to let go,
    /// so that it sends its QP's last answers itself before it returns.
    pub(crate) destroy_wait: Duration,
    /// How long a destroyed RC QP answers resends of its last messages.
    pub(crate) linger: Duration,
    /// Destroyed QPs lingering at most, so churn cannot pile them up.
    pub(crate) max_lingering: usize,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            kick_limit: 64,
            busy_unacked: 32,
            send_batch: 16,
            round_receive: 64,
            round_transmit: 64,
            early_ack_after: 8,
            handover: Duration::from_millis(1),
            kick_handover: Duration::from_micros(100),
            handover_slack: Duration::from_millis(4),
            wait_spin: Duration::from_micros(20),
            engine_spin: Duration::from_micros(50),
            yield_after: Duration::from_micros(10),
            quiet_span: Duration::from_micros(20),
            idle: Duration::from_millis(100),
            destroy_wait: Duration::from_millis(2),
            linger: Duration::from_secs(1),
            max_lingering: 1024,
        }
    }
}

impl Tuning {
    /// The defaults for a machine with `cpus` CPUs: with one, nothing polls,
    /// since the peer would need the CPU a poller keeps.
    pub(crate) fn for_cpus(cpus: usize) -> Tuning {
        let tuning = Tuning::default();
        if cpus > 1 {
            return tuning;
        }
        Tuning { wait_spin: Duration::ZERO, engine_spin: Duration::ZERO, ..tuning }
    }
}
