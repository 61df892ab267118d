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
    /// from kernel rxe's UDP source port for the QP; returns how many.
    pub(crate) fn transmit(
        &mut self,
        qp: &mut Qp,
        mem: &mut dyn Memory,
        now: Duration,
        limit: usize,
        order: TransmitOrder,
    ) -> usize {
        let (sent, lent) = self.hand_over(qp, mem, now, limit, order);
        // Lent bytes are let go of while `mem`'s guard keeps them registered.
        if lent {
            self.link.release_lent();
        }
        sent
    }

    /// As [`Egress::transmit`], except that packets with lent payloads leave
    /// at once, the link's whole batch with them, while `mem`'s guard still
    /// keeps those payloads registered: for a caller that flushes before it
    /// is done anyway (a post), which would otherwise have the link copy
    /// them into its batch first (less than half a batch, as a message of
    /// up to 256 KiB is).
    pub(crate) fn transmit_sending_lent(
        &mut self,
        qp: &mut Qp,
        mem: &mut dyn Memory,
        now: Duration,
        limit: usize,
        order: TransmitOrder,
    ) -> usize {
        let (sent, lent) = self.hand_over(qp, mem, now, limit, order);
        if lent {
            self.link.flush();
        }
        sent
    }

    /// Builds up to `limit` of `qp`'s packets into the link: how many, and
    /// whether any payload was lent.
    fn hand_over(
        &mut self,
        qp: &mut Qp,
        mem: &mut dyn Memory,
        now: Duration,
        limit: usize,
        order: TransmitOrder,
    ) -> (usize, bool) {
        let mut sent = 0;
        let mut lent = false;
        while sent < limit {
            // Build in the link's send buffer where it has one: no copy there.
            let room = self.link.send_buffer(self.buf.len());
            let in_link = room.is_some();
            let space = room.unwrap_or(&mut *self.buf);
            let Some(t) = qp.poll_transmit(now, mem, space, order) else { break };
            let src_port = source_port(qp, Bth::new_unchecked(&space[..t.len]).dest_qpn());
            let src = source_for(self.locals, t.dest);
            let sent_now = if in_link {
                lent |= t.lent.is_some();
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
        (sent, lent)
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
