//! What passes through a QP's queues: send work queue entries, the packets
//! that come in and go out, and which completion queue a completion is for.
//!
//! A leaf: the QP and each of its roles use these, and they know nothing of
//! the QP.

use std::net::IpAddr;

use super::memory::Lent;
#[cfg(doc)]
use super::memory::Memory;
use super::types::{PsnRange, SendWr};
use crate::wire::RoceRepr;

/// Bytes beyond the path MTU a transmit buffer needs: the largest header
/// set (BTH, DETH, RETH, ImmDt…), pad and ICRC.
pub const TRANSMIT_HEADROOM: usize = 64;

/// Which completion queue a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqKind {
    /// The send CQ: completions of send work requests.
    Send,
    /// The receive CQ: completions of receive work requests.
    Recv,
}

/// A packet the QP wants sent: its RoCE bytes (BTH up to and including a zero
/// ICRC placeholder) are at the start of the buffer given to `poll_transmit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// IP address to send the packet to.
    pub dest: IpAddr,
    /// Length of the RoCE bytes in the buffer, BTH through ICRC.
    pub len: usize,
    /// The payload, where the memory lent it ([`Memory::lend`]): it goes at
    /// this offset of the packet, whose bytes there are left unwritten.
    pub lent: Option<(usize, Lent)>,
}

/// A received packet as the QP sees it.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    /// IP source address (a connected QP accepts only its peer's).
    pub src: IpAddr,
    /// UDP source port (checked when the QP has a `peer_port`).
    pub src_port: u16,
    /// IP destination address (UD receives copy it into the GRH area).
    pub dst: IpAddr,
    /// BTH and extended headers, parsed.
    pub header: &'a RoceRepr,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
}

/// A send work request on the send queue.
#[derive(Debug, Clone)]
pub(crate) struct Wqe {
    pub(crate) wr: SendWr,
    /// PSNs, assigned at first transmission. A READ takes one per response packet.
    pub(crate) psn: Option<PsnRange>,
    /// Index of the next packet to (re)send; for a READ, the first response
    /// packet the next request asks for.
    pub(crate) next_pkt: u32,
    /// All packets handed to the wire.
    pub(crate) sent: bool,
    /// READ or atomic requests counted against max_rd_atomic and not yet
    /// answered in full.
    pub(crate) rd_atomic_counted: u32,
    /// Response packets each READ request asks for at most, fixed when the
    /// READ starts: after a loss, a READ whose responses would overflow the
    /// receive buffer goes as several requests (rxe-spec T-7), its pieces.
    pub(crate) read_piece: u32,
    /// Pieces of the READ requested at least once (each counted once).
    pub(crate) pieces_requested: u32,
}

impl Wqe {
    /// A request just posted: no PSNs yet, nothing sent.
    pub(crate) fn new(wr: SendWr) -> Wqe {
        Wqe { wr, psn: None, next_pkt: 0, sent: false, rd_atomic_counted: 0, read_piece: 0, pieces_requested: 0 }
    }

    /// Which READ piece holds response packet `index`.
    pub(crate) fn piece_of(&self, index: u32) -> u32 {
        index / self.read_piece.max(1)
    }

    /// The first response packet past the READ piece that holds packet
    /// `index`, of a READ of `packets` response packets.
    pub(crate) fn piece_end(&self, index: u32, packets: u32) -> u32 {
        self.piece_of(index).saturating_add(1).saturating_mul(self.read_piece.max(1)).min(packets)
    }

    /// The same end in bytes of the READ, at `mtu` bytes a packet.
    pub(crate) fn piece_end_byte(&self, index: u32, packets: u32, mtu: u64) -> u64 {
        (u64::from(self.piece_end(index, packets)) * mtu).min(self.wr.length())
    }

    /// Whether the next request of this READ starts a piece not asked for
    /// before: one more outstanding READ request for the peer.
    pub(crate) fn asks_new_piece(&self) -> bool {
        self.piece_of(self.next_pkt) >= self.pieces_requested
    }
}
