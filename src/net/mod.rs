//! Networks that carry whole IP packets (IP + UDP + RoCE + ICRC) between
//! endpoints identified by IP address.
//!
//! - [`sim`]: a deterministic in-memory network with a virtual clock and fault
//!   injection, for tests and reproducible experiments.
//! - [`udp`]: real UDP sockets, to talk to kernel rxe, NICs and other processes.
//! - [`raw`]: whole Ethernet frames over `AF_PACKET` (needs `CAP_NET_RAW`), for
//!   strict ICRC checks and crafted packets in conformance tests and fuzzing.
//! - [`probe`]: one UDP socket that sends hand-built RoCE packets and reads
//!   what comes back, with no QP behind it: a probe and an attacker.
//!
//! The first three implement [`Link`], the interface engines drive.

pub mod bpf;
#[allow(unsafe_code)]
mod mmsg;
pub mod probe;
#[allow(unsafe_code)]
pub mod raw;
#[allow(unsafe_code)]
pub mod share;
pub mod sim;
pub mod udp;

use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::transport::Lent;

pub use probe::{Arrival, RoceSocket};
pub use raw::RawLink;
pub use sim::{Delivery, Faults, SimNet, Stats};
pub use udp::UdpLink;

/// Blocks until one of `fds` is readable or `timeout` passes; returns
/// which are: bit `i` for `fds[i]` (bit 63 for any from the 64th on), so 0
/// if none.
#[allow(unsafe_code)]
pub fn wait_readable(fds: &[RawFd], timeout: Duration) -> u64 {
    // On the stack for the usual few descriptors: engines wait on every
    // idle turn and must not allocate.
    const ON_STACK: usize = 16;
    let entry = |&fd: &RawFd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let mut stack = [libc::pollfd { fd: -1, events: 0, revents: 0 }; ON_STACK];
    let mut heap = Vec::new();
    let polls: &mut [libc::pollfd] = if fds.len() <= ON_STACK {
        for (poll, fd) in stack.iter_mut().zip(fds) {
            *poll = entry(fd);
        }
        &mut stack[..fds.len()]
    } else {
        heap.extend(fds.iter().map(entry));
        &mut heap
    };
    let spec = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `polls` is a valid array of `polls.len()` pollfd structs and
    // `spec` a valid timespec; no signal mask is given.
    let n = unsafe { libc::ppoll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, &spec, std::ptr::null()) };
    if n <= 0 {
        return 0;
    }
    polls.iter().enumerate().filter(|(_, p)| p.revents != 0).fold(0, |mask, (i, _)| mask | 1 << i.min(63))
}

/// A packet a QP hands to a link: RoCE bytes (BTH up to a placeholder ICRC),
/// which the link completes with the ICRC of the headers it puts below.
#[derive(Debug)]
pub struct Outgoing<'a> {
    /// Source address: one of the link's local addresses.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port (kernel rxe's per-connection choice, where the link
    /// can honour it).
    pub src_port: u16,
    /// The RoCE bytes; mutable so the link can fill in the ICRC in place.
    pub roce: &'a mut [u8],
}

/// A packet a link received and whose ICRC it verified: its RoCE bytes are
/// the first `len` bytes of the buffer given to [`Link::receive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Source address of the IP packet.
    pub src: IpAddr,
    /// UDP source port of the datagram (a connected QP may insist on its
    /// peer's).
    pub src_port: u16,
    /// Destination address: the local address it arrived at.
    pub dst: IpAddr,
    /// Length of the RoCE bytes, BTH through ICRC.
    pub len: usize,
}

/// What a link counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Packets sent.
    pub sent: u64,
    /// Batches the sent packets left in, so `sent` over this is how well
    /// sends are batched: on the UDP link, flushes of its send batch (one
    /// `sendmmsg` each, for up to its 32 trains or datagrams). Links that
    /// send packet by packet leave it 0.
    pub send_batches: u64,
    /// Of the packets sent, those whose payload the link was lent: read
    /// from registered memory by the send itself, not copied into the send
    /// buffer (rxe-spec T-36; a kernel without UDP GSO has the link copy
    /// them as it sends).
    pub lent: u64,
    /// Packets received, including those then dropped.
    pub received: u64,
    /// Received packets dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// Received packets dropped as malformed or too large for the buffer (on
    /// the UDP link, failed socket reads too).
    pub malformed: u64,
    /// Packets for a QP of another process sharing the UDP port that
    /// arrived here anyway and were passed on to it (`share`).
    pub forwarded: u64,
    /// Packets for another process sharing the port that were dropped
    /// because it left them unread (its queue stayed full).
    pub forward_dropped: u64,
    /// Packets for a process sharing the port that is gone, dropped as
    /// packets for a QP that does not exist are.
    pub ownerless: u64,
    /// Packets sent with an ICRC broken on purpose
    /// ([`UdpLink::corrupt_icrc_every`]).
    pub corrupted: u64,
}

/// A network an engine drives QPs over. Links carry packets for a set of
/// local addresses; time is the engine's.
pub trait Link {
    /// Makes `addr` one of the link's local addresses.
    fn attach(&mut self, addr: IpAddr) -> io::Result<()>;

    /// Receives the datagrams sent to multicast group `group` from now on;
    /// links without multicast refuse.
    fn join_group(&mut self, group: IpAddr) -> io::Result<()> {
        let _ = group;
        Err(io::Error::new(io::ErrorKind::Unsupported, "this link has no multicast"))
    }

    /// Stops receiving the group's datagrams.
    fn leave_group(&mut self, group: IpAddr) {
        let _ = group;
    }

    /// Sends one packet, filling in its ICRC.
    fn transmit(&mut self, now: Duration, out: Outgoing<'_>) -> io::Result<()>;

    /// Room of `len` bytes to build the next packet from `src` in, inside
    /// the link's own send buffer, for links that can send it from there
    /// ([`Link::transmit_built`]): one copy fewer than [`Link::transmit`].
    /// `None` where the link has no such buffer, or none for `src`.
    fn send_buffer(&mut self, src: IpAddr, len: usize) -> Option<&mut [u8]> {
        let _ = (src, len);
        None
    }

    /// Sends the packet of `len` RoCE bytes just built at the start of the
    /// [`Link::send_buffer`] room taken for `src`, filling in its ICRC, as
    /// [`Link::transmit`] would. With `lent`, its payload is the lent bytes,
    /// to go at that offset, where the room was left unwritten: the link
    /// reads them until its next [`Link::flush`], which the caller makes
    /// before the lender's guard goes.
    fn transmit_built(
        &mut self,
        now: Duration,
        src: IpAddr,
        dst: IpAddr,
        src_port: u16,
        len: usize,
        lent: Option<(usize, Lent)>,
    ) -> io::Result<()> {
        let _ = (now, src, dst, src_port, len, lent);
        Err(io::Error::new(io::ErrorKind::Unsupported, "this link builds no packets in place"))
    }

    /// Sends whatever [`Link::transmit`] batched. Engines call it after each
    /// round of transmissions.
    fn flush(&mut self) {}

    /// The next packet that arrived by `now` with a good ICRC, if any; packets
    /// with a bad ICRC are dropped and counted.
    fn receive(&mut self, now: Duration, buf: &mut [u8]) -> Option<Received>;

    /// [`Link::receive`] without the copy where the link can avoid it: the
    /// packet's RoCE bytes stay in the link's own buffer, valid until the
    /// next call; links without one use `scratch`. Engines take packets this
    /// way, as each is parsed and handled before the next.
    fn receive_in_place<'a>(&'a mut self, now: Duration, scratch: &'a mut [u8]) -> Option<(Received, &'a [u8])> {
        let r = self.receive(now, scratch)?;
        Some((r, scratch.get(..r.len)?))
    }

    /// Whether the packet last received was not the last of a datagram
    /// that brought several (a GRO train's segments): the rest are already
    /// here, and nothing will signal them.
    fn amid_datagram(&self) -> bool {
        false
    }

    /// When the link will next have a packet, for links that know (virtual
    /// time); `None` for real networks.
    fn next_event(&self) -> Option<Duration>;

    /// The local addresses attached so far.
    fn local_addrs(&self) -> Vec<IpAddr>;

    /// File descriptors that become readable when a packet arrives (real
    /// networks); none for virtual-time links.
    fn raw_fds(&self) -> Vec<RawFd>;

    /// What the link has counted so far.
    fn stats(&self) -> LinkStats;

    /// Bytes of received packets the link holds before it drops more (a
    /// socket's receive buffer), if it has such a limit.
    fn receive_buffer(&self) -> Option<usize> {
        None
    }
}
