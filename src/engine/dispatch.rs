//! What every engine does with a QP, whatever drives it: hand it a packet
//! the link received, run its due timers, and hand its packets to the link.
//! [`super::World`] and the threaded engine both go through these, so they
//! send alike.

use std::net::IpAddr;
use std::time::Duration;

use tracing::debug;

use crate::net::{Link, Outgoing, Received};
use crate::transport::{Incoming, Memory, Qp, QpType, Srq, TransmitOrder};
use crate::wire::packet::{rxe_source_port, rxe_ud_source_port};
use crate::wire::roce::RocePacket;
use crate::wire::Bth;

/// Hands `qp` a packet the link received, parsed; `srq` is the QP's SRQ, if
/// it has one.
pub(crate) fn deliver(
    qp: &mut Qp,
    now: Duration,
    from: &Received,
    pkt: &RocePacket<'_>,
    mem: &mut dyn Memory,
    srq: Option<&mut Srq>,
) {
    let incoming =
        Incoming { src: from.src, src_port: from.src_port, dst: from.dst, header: &pkt.header, payload: pkt.payload };
    qp.handle_packet(now, incoming, mem, srq);
}

/// Runs `qp`'s timers due at `now`; says whether any was.
pub(crate) fn run_due_timers(qp: &mut Qp, now: Duration) -> bool {
    let due = qp.poll_timeout().is_some_and(|t| t <= now);
    if due {
        qp.handle_timeout(now);
    }
    due
}

/// A link as QPs' packets leave on it: the local addresses they leave from,
/// and a buffer to build them in where the link lends none.
pub(crate) struct Egress<'a> {
    pub(crate) link: &'a mut dyn Link,
    pub(crate) locals: &'a [IpAddr],
    pub(crate) buf: &'a mut [u8],
}

impl Egress<'_> {
    /// Hands up to `limit` of `qp`'s packets to the link, in `order`, each
    /// from kernel rxe's UDP source port for the QP; returns how many. The
    /// link may keep reading payloads lent from `mem` until its next
    /// [`Link::flush`], which the caller makes before `mem`'s guard goes.
    pub(crate) fn transmit(
        &mut self,
        qp: &mut Qp,
        mem: &mut dyn Memory,
        now: Duration,
        limit: usize,
        order: TransmitOrder,
    ) -> usize {
        let mut sent = 0;
        let from = self.known_source(qp);
        while sent < limit {
            // Build in the link's send buffer where it has one: no copy there.
            let room = from.and_then(|src| self.link.send_buffer(src, self.buf.len()));
            let in_link = room.is_some();
            let space = room.unwrap_or(&mut *self.buf);
            let Some(t) = qp.poll_transmit(now, mem, space, order) else { break };
            let src_port = source_port(qp, Bth::new_unchecked(&space[..t.len]).dest_qpn());
            let src = source_for(self.locals, t.dest);
            let sent_now = if in_link && Some(src) != from {
                // A UD packet to the other IP version than the one address.
                Err(std::io::Error::other(format!("no local address of {}'s IP version", t.dest)))
            } else if in_link {
                self.link.transmit_built(now, src, t.dest, src_port, t.len, t.lent)
            } else {
                if let Some((at, payload)) = t.lent {
                    self.buf[at..at + payload.len()].copy_from_slice(payload.bytes());
                }
                self.link.transmit(now, Outgoing { src, dst: t.dest, src_port, roce: &mut self.buf[..t.len] })
            };
            if let Err(e) = sent_now {
                debug!(qpn = qp.qpn(), error = %e, "send failed");
            }
            sent += 1;
        }
        sent
    }

    /// The local address `qp`'s packets leave from, where it is known before
    /// one is built (to build it in that socket's buffer): a connected QP's
    /// peer is fixed, and a link of one address has no choice.
    fn known_source(&self, qp: &Qp) -> Option<IpAddr> {
        match (qp.qp_type(), qp.attr().dest, self.locals) {
            (QpType::Rc | QpType::Uc, Some(peer), _) => Some(source_for(self.locals, peer)),
            (_, _, [only]) => Some(*only),
            _ => None,
        }
    }
}

/// The UDP source port kernel rxe sends `qp`'s packets to `remote_qpn`
/// from: a connection's flow label port, or a UD QP's hash of its own QPN
/// (rxe-spec W-22).
fn source_port(qp: &Qp, remote_qpn: u32) -> u16 {
    match qp.qp_type() {
        QpType::Ud => rxe_ud_source_port(qp.qpn()),
        QpType::Rc | QpType::Uc => rxe_source_port(qp.qpn(), remote_qpn),
    }
}

/// The local address a packet to `dest` leaves from: the first of the same
/// IP version.
fn source_for(locals: &[IpAddr], dest: IpAddr) -> IpAddr {
    locals.iter().copied().find(|a| a.is_ipv4() == dest.is_ipv4()).unwrap_or(dest)
}
