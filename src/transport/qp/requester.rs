//! The requester: turns send work requests into request packets.
//!
//! Segmentation at the path MTU, PSN assignment (a READ takes one PSN per
//! response packet), AckReq where an ACK is awaited (the end of a signaled
//! message, every quarter send queue of messages, [`ACK_ASK_DELAY`] after
//! one that did not ask) and every [`MAX_PKTS_PER_ACK`] packets (or quarter
//! window) within long ones, the window of [`MAX_UNACKED_PSNS`] growing to
//! [`MAX_WINDOW_PSNS`], fences, the max_rd_atomic limit, READs in pieces
//! the receive buffer holds after responses were lost ([`PIECED_READS`]),
//! and the go-back-N the completer asks for.

use std::time::Duration;

use tracing::{debug, trace};

use super::{Qp, LEND_FROM};
use crate::transport::attr::QpState;
use crate::transport::memory::{for_each_piece, Lent, MemError, Memory};
use crate::transport::queue::{Transmit, TRANSMIT_HEADROOM};
use crate::transport::timer::Timer;
use crate::transport::types::{Access, AsyncEvent, PsnRange, QpType, SendOp, WcStatus};
use crate::wire::{
    AtomicEthRepr, BthRepr, DethRepr, FethRepr, Headers, Opcode, Operation, Psn, RethRepr, RoceRepr, Transport,
};

/// Unacknowledged PSNs a requester may have in flight when it starts, and
/// again after every go-back (rxe's `RXE_MAX_UNACKED_PSNS`, its fixed window).
pub const MAX_UNACKED_PSNS: u32 = 128;
/// The most unacknowledged PSNs a requester's window grows to while the peer
/// acknowledges without loss: 2 MiB at MTU 4096, which a kernel socket
/// buffer of 8 MiB holds for four QPs. Larger windows only cost retries.
pub const MAX_WINDOW_PSNS: u32 = 512;
/// The smallest window a small peer buffer shrinks it to: a handful of
/// packets keeps a stream moving where a buffer is smaller still. Where
/// more QPs share a buffer than can each have this many in it, the driver
/// makes them take turns ([`Qp::set_allowance`]).
const MIN_WINDOW_PSNS: u32 = 8;

/// Bytes of a receiver's socket buffer one packet at path MTU `mtu` takes.
/// The kernel charges a receive buffer for whole allocations: a lone 4 KiB
/// datagram takes twice its bytes, a packet of a GSO train (how bulk leaves
/// the UDP link) 1.15-1.22 times; measured on Linux 6.18 by filling a
/// 416 KiB buffer.
pub const fn buffer_charge(mtu: usize) -> usize {
    5 * (mtu + TRANSMIT_HEADROOM) / 4
}
/// Packets a requester sends before asking for an ACK within a long message
/// (rxe's `RXE_MAX_PKT_PER_ACK`), while its window is at most four times
/// this; a larger window asks every quarter window.
pub const MAX_PKTS_PER_ACK: u32 = 64;
/// READs that go in pieces after responses to a READ were lost, where the
/// responses of one would not fit the receive buffer (rxe-spec T-7). Whole
/// READs are faster while the receiver keeps up, pieces never overflow it.
pub const PIECED_READS: u32 = 16;
/// The longest a message sent without AckReq waits before the requester
/// asks for its ACK (rxe-spec T-6): after that, or a quarter of the local
/// ACK timeout if shorter, it resends its last packet with AckReq. Traffic
/// of more than a quarter send queue's messages in that time asks by itself
/// (a ping-pong at 6.4k round trips a second with the default queue); at
/// 1 ms, a ping-pong slowed by a VM's stalls resent every millisecond and
/// the engine woke for it, and the round trips behind slowed further.
pub const ACK_ASK_DELAY: Duration = Duration::from_millis(10);

/// Requester progress.
#[derive(Debug, Clone, Default)]
pub(super) struct ReqState {
    /// Index in the send queue of the WQE to transmit next.
    pub(super) next: usize,
    /// PSN the next new WQE will get.
    pub(super) psn: Psn,
    /// Packets sent since the last one with AckReq.
    pub(super) noack_pkts: u32,
    /// The last packet sent with AckReq: its ACK is on its way until
    /// the completer passes it.
    pub(super) ack_asked: Option<Psn>,
    /// Messages ended without AckReq since the last packet with it.
    pub(super) noack_msgs: u32,
    /// One past the highest PSN sent: a packet before it is a resend.
    pub(super) sent_end: Psn,
    /// The next request packet asks for an ACK: [`Timer::AskForAck`]
    /// expired.
    pub(super) ask_next: bool,
    /// READ and atomic requests sent and not answered in full.
    pub(super) rd_atomic: u32,
    /// READs still to go in pieces since responses to one were lost
    /// ([`PIECED_READS`]).
    pub(super) pieced_reads: u32,
    /// PSNs the window has grown beyond [`MAX_UNACKED_PSNS`]: by every PSN
    /// acknowledged while the peer answers fast (doubling per round trip, as
    /// TCP's slow start), up to [`MAX_WINDOW_PSNS`]; halved by a slow round
    /// trip, none after a go-back.
    pub(super) grown: u32,
    /// The packet whose round trip is being timed, and when it left.
    pub(super) timed: Option<(Psn, Duration)>,
    /// Whether the last timed round trip took at most a quarter of the ACK
    /// timeout (`None` before the first): a peer slower than that (an
    /// emulated VM) would time out on a larger window, so it keeps rxe's.
    pub(super) fast_peer: Option<bool>,
    /// New packets the driver lets an RC requester put on the wire before
    /// it waits for another turn (`None`: no limit; [`Qp::set_allowance`]).
    pub(super) allowance: Option<u32>,
}

/// What one request packet carries.
struct Plan {
    repr: RoceRepr,
    /// Bytes of the message the payload starts at, and how many.
    offset: u64,
    len: usize,
    last: bool,
}

impl Qp {
    pub(super) fn next_request(&mut self, now: Duration, mem: &mut dyn Memory, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(self.attr.state, QpState::Rts | QpState::Sqd) || self.timers.is_armed(Timer::RnrWait) {
            return None;
        }
        while let Some(wqe) = self.sq.get(self.req.next).filter(|w| w.wr.op.is_local()) {
            // One done before a go-back is not done again.
            if !wqe.sent && !self.run_local_op(self.req.next, mem) {
                return None;
            }
            self.req.next += 1;
            self.complete_done_local_ops();
        }
        let index = self.req.next;
        let wqe = self.sq.get(index)?;
        if wqe.psn.is_none() && !self.may_start(index) {
            return None;
        }
        let mtu = self.attr.path_mtu.bytes() as u64;
        let len = wqe.wr.length();
        let packets = len.div_ceil(mtu).max(1) as u32;
        let read = matches!(wqe.wr.op, SendOp::RdmaRead { .. });
        if wqe.psn.is_none() {
            let count = if wqe.wr.op.is_atomic() { 1 } else { packets };
            let first = self.req.psn;
            self.req.psn = first.wrapping_add(count);
            let counts_rd_atomic = wqe.wr.op.counts_rd_atomic();
            // Responses beyond the buffer are dropped if the receiver falls
            // behind, and asked for again: once that has happened, such
            // READs go in pieces of half the buffer, two in flight at a time.
            let buffer = self.peer_buffer_psns;
            let pieced = read && self.qp_type == QpType::Rc && packets > buffer && self.req.pieced_reads > 0;
            if pieced {
                self.req.pieced_reads -= 1;
            }
            let piece = if pieced { (buffer / 2).max(1) } else { packets };
            let wqe = &mut self.sq[index];
            wqe.psn = Some(PsnRange { first, count });
            wqe.read_piece = piece;
            if counts_rd_atomic {
                wqe.rd_atomic_counted = 1;
                wqe.pieces_requested = 1;
                self.req.rd_atomic += 1;
            }
        }
        // The window holds back every packet, not only a message's first:
        // a long WRITE waits for ACKs half-way (rxe checks per packet too,
        // but lets one more PSN out).
        let wqe = &self.sq[index];
        let psn = wqe.psn.expect("assigned above").first.wrapping_add(wqe.next_pkt);
        if self.qp_type == QpType::Rc && psn.diff(self.comp.psn) >= self.window() as i32 {
            return None;
        }
        // A new packet waits for the driver's next turn; a resend never does
        // (what it resends was charged to the turn that first sent it).
        if self.qp_type == QpType::Rc && self.req.allowance == Some(0) && !psn.is_before(self.req.sent_end) {
            return None;
        }
        // A READ request brings all its responses at once: it goes only
        // when they fit in the peer's buffer after what is in flight, or
        // when nothing else is (a larger READ then goes alone). A later
        // piece is one more outstanding READ request for the peer, within
        // max_rd_atomic as a new READ is.
        if self.qp_type == QpType::Rc && read {
            let range = wqe.psn.expect("assigned above");
            if wqe.asks_new_piece() && self.req.rd_atomic >= u32::from(self.attr.max_rd_atomic.max(1)) {
                return None;
            }
            let last = range.first.wrapping_add(wqe.piece_end(wqe.next_pkt, range.count) - 1);
            if psn != self.comp.psn && i64::from(last.diff(self.comp.psn)) >= i64::from(self.peer_buffer_psns) {
                return None;
            }
        }
        let plan = self.plan(index, packets, mtu);
        let dest = self.destination(index)?;
        let header_len = plan.repr.header_len();
        let total = plan.repr.wire_len(plan.len);
        plan.repr.emit_headers(buf, plan.len).ok()?;
        let lent = if plan.len >= LEND_FROM { self.lend(index, plan.offset, plan.len, mem) } else { Ok(None) };
        let lent = match lent {
            Ok(Some(lent)) => Some((header_len, lent)),
            Ok(None) => match self.gather(index, plan.offset, &mut buf[header_len..header_len + plan.len], mem) {
                Ok(()) => None,
                Err(e) => return self.local_protection_error(index, e),
            },
            Err(e) => return self.local_protection_error(index, e),
        };

        let wqe = &mut self.sq[index];
        if read {
            if wqe.asks_new_piece() {
                wqe.pieces_requested = wqe.piece_of(wqe.next_pkt) + 1;
                wqe.rd_atomic_counted += 1;
                self.req.rd_atomic += 1;
            }
            wqe.next_pkt = wqe.piece_end(wqe.next_pkt, packets);
        } else {
            wqe.next_pkt += 1;
        }
        let all_asked = if read { wqe.next_pkt >= packets } else { plan.last };
        if all_asked || wqe.wr.op.is_atomic() {
            wqe.sent = true;
            self.req.next += 1;
        }
        if self.qp_type == QpType::Rc {
            let end = wqe.psn.expect("assigned above").first.wrapping_add(wqe.next_pkt);
            if end.is_after(self.req.sent_end) {
                self.req.sent_end = end;
            }
            if !self.timers.is_armed(Timer::AckTimeout) {
                self.restart_ack_timer(now);
            }
            // A message that ended without asking is asked for within a
            // bound (T-6). A packet within a message needs no such bound:
            // more of the message follows, within the window.
            if plan.repr.bth.ack_req {
                self.timers.stop(Timer::AskForAck);
            } else if plan.last && !self.timers.is_armed(Timer::AskForAck) {
                self.timers.set(Timer::AskForAck, now + self.ack_ask_delay());
            }
            // Time the round trip of one packet at a time, never of a resent one.
            if plan.repr.bth.ack_req && self.req.timed.is_none() && self.comp.retry_started_at.is_none() {
                self.req.timed = Some((psn, now));
            }
        } else if plan.last {
            // UC and UD complete once the last packet is on the wire.
            let wqe = self.sq.remove(index).expect("index checked above");
            self.req.next -= 1;
            self.complete_send(&wqe, WcStatus::Success);
            self.check_sq_drained();
        }
        Some(Transmit { dest, len: total, lent })
    }

    /// Binds or invalidates as the local operation at `index` asks (rxe's
    /// `rxe_do_local_ops`), once fences let it start; says whether the send
    /// queue goes on past it. It completes in send-queue order, when every
    /// request before it has; a failure completes it at once and, as rxe
    /// does, moves the QP to ERR.
    fn run_local_op(&mut self, index: usize, mem: &mut dyn Memory) -> bool {
        if !self.may_start(index) {
            return false;
        }
        let user = self.key_user();
        let result = match self.sq[index].wr.op {
            SendOp::BindMw(bind) => mem.bind_window(user, &bind).map_err(|e| (e, WcStatus::MwBindErr)),
            SendOp::LocalInv(rkey) => mem.invalidate(rkey, user).map_err(|e| (e, WcStatus::LocQpOpErr)),
            _ => Ok(()),
        };
        if let Err((e, status)) = result {
            debug!(qpn = self.qpn, error = %e, "local operation failed");
            let wqe = self.sq.remove(index).expect("index checked by the caller");
            self.complete_send(&wqe, status);
            if self.qp_type == QpType::Rc {
                self.fail(AsyncEvent::QpFatal { qpn: self.qpn });
            } else {
                self.send_queue_error();
            }
            return false;
        }
        self.sq[index].sent = true;
        true
    }

    /// Completes the local operations done at the front of the send queue:
    /// nothing before them is outstanding.
    pub(super) fn complete_done_local_ops(&mut self) {
        while self.sq.front().is_some_and(|w| w.wr.op.is_local() && w.sent) {
            let wqe = self.sq.pop_front().expect("front exists");
            self.req.next = self.req.next.saturating_sub(1);
            self.complete_send(&wqe, WcStatus::Success);
        }
    }

    /// May the WQE at `index` start? Fences, max_rd_atomic, the PSN window
    /// and SQD all hold new work back.
    fn may_start(&self, index: usize) -> bool {
        let wr = &self.sq[index].wr;
        if self.attr.state == QpState::Sqd {
            return false;
        }
        if self.qp_type != QpType::Rc {
            return true;
        }
        if wr.flags.fence && self.req.rd_atomic > 0 {
            return false;
        }
        if wr.op.counts_rd_atomic() && self.req.rd_atomic >= u32::from(self.attr.max_rd_atomic.max(1)) {
            return false;
        }
        let in_flight = self.req.psn.diff(self.comp.psn);
        in_flight < self.window() as i32
    }

    fn destination(&self, index: usize) -> Option<std::net::IpAddr> {
        match &self.sq[index].wr.ud {
            Some(ud) => Some(ud.dest),
            None => self.attr.dest,
        }
    }

    /// Headers and payload extent of the next packet of the WQE at `index`.
    fn plan(&mut self, index: usize, packets: u32, mtu: u64) -> Plan {
        let transport = match self.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        };
        let wqe = &self.sq[index];
        let range = wqe.psn.expect("assigned before planning");
        let k = wqe.next_pkt;
        let len = wqe.wr.length();
        let op = wqe.wr.op;
        let first = k == 0;
        let last = k + 1 >= packets;
        let offset = u64::from(k) * mtu;
        let psn = range.first.wrapping_add(k);
        let seg = |first_op, middle_op, last_op, only_op| match (first, last) {
            (true, true) => only_op,
            (true, false) => first_op,
            (false, false) => middle_op,
            (false, true) => last_op,
        };
        use Operation::*;
        let (operation, payload_len, is_last) = match op {
            SendOp::Send => (seg(SendFirst, SendMiddle, SendLast, SendOnly), 0, last),
            SendOp::SendWithImm(_) => (seg(SendFirst, SendMiddle, SendLastImm, SendOnlyImm), 0, last),
            SendOp::SendWithInv(_) => (seg(SendFirst, SendMiddle, SendLastInv, SendOnlyInv), 0, last),
            SendOp::RdmaWrite { .. } => (seg(WriteFirst, WriteMiddle, WriteLast, WriteOnly), 0, last),
            SendOp::RdmaWriteWithImm { .. } => (seg(WriteFirst, WriteMiddle, WriteLastImm, WriteOnlyImm), 0, last),
            SendOp::RdmaRead { .. } => (ReadRequest, usize::MAX, true),
            SendOp::CompareSwap { .. } => (CompareSwap, usize::MAX, true),
            SendOp::FetchAdd { .. } => (FetchAdd, usize::MAX, true),
            SendOp::AtomicWrite { .. } => (AtomicWrite, 0, true),
            SendOp::Flush { .. } => (Flush, usize::MAX, true),
            SendOp::BindMw(_) | SendOp::LocalInv(_) => unreachable!("local operations run before planning"),
        };
        let opcode = Opcode::new(transport, operation).expect("operation valid for the QP type");
        let payload_len = if payload_len == usize::MAX { 0 } else { (len - offset).min(mtu) as usize };
        // A message's end asks for the ACK where someone waits for it: a
        // signaled completion, a quarter of the send queue's slots, a resend
        // (its ACK ends a recovery). A probe after a timeout asks too:
        // nothing follows it until one comes.
        let resend = psn.is_before(self.req.sent_end);
        let ends_asking = is_last
            && (wqe.wr.flags.signaled
                || op.counts_rd_atomic()
                || resend
                || self.req.noack_msgs + 1 >= (self.cap.max_send_wr / 4).max(1));
        // The last new packet of a turn asks too: its ACK is what frees the
        // turn's share of the peer's buffer for the QPs waiting.
        let mut turn_ends = false;
        if self.qp_type == QpType::Rc && !resend {
            if let Some(left) = &mut self.req.allowance {
                turn_ends = *left == 1;
                *left = left.saturating_sub(1);
            }
        }
        let needs_ack = self.qp_type == QpType::Rc
            && (ends_asking
                || turn_ends
                || operation == ReadRequest
                || self.req.noack_pkts + 1 >= self.ack_every()
                || self.comp.probing
                || self.req.ask_next);
        self.req.noack_pkts = if needs_ack { 0 } else { self.req.noack_pkts + 1 };
        self.req.noack_msgs = if needs_ack { 0 } else { self.req.noack_msgs + u32::from(is_last) };
        if needs_ack {
            self.req.ack_asked = Some(psn);
            self.req.ask_next = false;
        }
        let (dest_qpn, deth) = match &wqe.wr.ud {
            Some(ud) => {
                let qkey = if ud.remote_qkey & 0x8000_0000 != 0 { self.attr.qkey } else { ud.remote_qkey };
                (ud.remote_qpn, Some(DethRepr { qkey, src_qpn: self.qpn }))
            }
            None => (self.attr.dest_qpn, None),
        };
        let mut repr = RoceRepr::new(BthRepr {
            opcode,
            solicited: is_last && wqe.wr.flags.solicited && !matches!(op, SendOp::RdmaWrite { .. }),
            mig_req: false,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: needs_ack,
            psn,
        });
        repr.deth = deth;
        let headers = opcode.headers();
        match op {
            SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaWriteWithImm { remote_addr, rkey, .. }
                if headers.contains(Headers::RETH) =>
            {
                repr.reth = Some(RethRepr { va: remote_addr, rkey, dma_len: len as u32 });
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                // A retried READ asks only for what has not arrived yet, and
                // no further than its piece: the responder knows the piece.
                let end = wqe.piece_end_byte(k, packets, mtu);
                repr.reth = Some(RethRepr { va: remote_addr + offset, rkey, dma_len: (end - offset) as u32 });
            }
            SendOp::CompareSwap { remote_addr, rkey, compare, swap } => {
                repr.atomic_eth = Some(AtomicEthRepr { va: remote_addr, rkey, swap_add: swap, compare });
            }
            SendOp::FetchAdd { remote_addr, rkey, add } => {
                repr.atomic_eth = Some(AtomicEthRepr { va: remote_addr, rkey, swap_add: add, compare: 0 });
            }
            SendOp::AtomicWrite { remote_addr, rkey } => {
                repr.reth = Some(RethRepr { va: remote_addr, rkey, dma_len: 8 });
            }
            SendOp::Flush { remote_addr, rkey, len, whole_region, placement } => {
                repr.reth = Some(RethRepr { va: remote_addr, rkey, dma_len: len });
                repr.feth = Some(FethRepr { selectivity: u8::from(whole_region), placement_type: placement as u8 });
            }
            _ => {}
        }
        if headers.contains(Headers::IMM) {
            repr.imm = match op {
                SendOp::SendWithImm(imm) | SendOp::RdmaWriteWithImm { imm, .. } => Some(imm),
                _ => None,
            };
        }
        if headers.contains(Headers::IETH) {
            if let SendOp::SendWithInv(rkey) = op {
                repr.ieth = Some(rkey);
            }
        }
        Plan { repr, offset, len: payload_len, last: is_last }
    }

    /// Completes the request at `index`, whose memory could not be read,
    /// with a local protection error; RC's QP goes to the error state.
    #[cold]
    fn local_protection_error(&mut self, index: usize, e: MemError) -> Option<Transmit> {
        trace!(qpn = self.qpn, error = %e, "local protection error");
        let wqe = self.sq.remove(index).expect("index checked above");
        self.complete_send(&wqe, WcStatus::LocProtErr);
        if self.qp_type == QpType::Rc {
            self.fail(AsyncEvent::QpFatal { qpn: self.qpn });
        } else {
            self.send_queue_error();
        }
        None
    }

    /// The `len` payload bytes at `offset` of the message at `index`, lent
    /// by the memory where one registered piece holds them all. RC only: its
    /// send completes on the ACK, after the link sent the bytes, where a UC
    /// or UD send completes once built and the application may then reuse
    /// them before they leave.
    fn lend(&self, index: usize, offset: u64, len: usize, mem: &dyn Memory) -> Result<Option<Lent>, MemError> {
        let wqe = &self.sq[index];
        if self.qp_type != QpType::Rc || wqe.wr.flags.inline {
            return Ok(None);
        }
        let mut pieces = 0;
        let mut piece = None;
        for_each_piece(&wqe.wr.sg_list, offset, len, |sge, addr, _, _| {
            pieces += 1;
            piece = Some((sge.lkey, addr));
            Ok::<(), MemError>(())
        })?;
        match piece {
            Some((lkey, addr)) if pieces == 1 => mem.lend(lkey, self.key_user(), addr, len, Access::NONE),
            _ => Ok(None),
        }
    }

    /// Copies `out.len()` bytes of the WQE's data, starting at `offset` of
    /// the message, from its SGEs (or inline data).
    fn gather(&self, index: usize, offset: u64, out: &mut [u8], mem: &dyn Memory) -> Result<(), MemError> {
        let wqe = &self.sq[index];
        if wqe.wr.flags.inline {
            let start = offset as usize;
            out.copy_from_slice(&wqe.wr.inline_data[start..start + out.len()]);
            return Ok(());
        }
        for_each_piece(&wqe.wr.sg_list, offset, out.len(), |sge, addr, at, n| {
            mem.read(sge.lkey, self.key_user(), addr, &mut out[at..at + n], Access::NONE)
        })
    }

    /// Unacknowledged PSNs the requester may have in flight now: rxe's 128
    /// plus what the window has grown, within the peer's buffer; 1 while
    /// probing after a timeout.
    pub(super) fn window(&self) -> u32 {
        if self.comp.probing {
            return 1;
        }
        let grown = MAX_UNACKED_PSNS + self.req.grown;
        grown.min(self.peer_buffer_psns).max(MIN_WINDOW_PSNS)
    }

    /// PSNs up to `psn` (exclusive) are acknowledged: the window grows by
    /// them while round trips are short against the ACK timeout, and halves
    /// on a long one.
    pub(super) fn adapt_window(&mut self, now: Duration, psn: Psn) {
        if let Some((timed, sent_at)) = self.req.timed {
            if timed.is_before(psn) {
                self.req.timed = None;
                let round_trip = now.saturating_sub(sent_at);
                let fast = self.ack_timeout().is_none_or(|t| round_trip * 4 <= t);
                self.req.fast_peer = Some(fast);
                if !fast {
                    self.req.grown /= 2;
                }
            }
        }
        if self.req.fast_peer == Some(true) {
            let acked = psn.diff(self.comp.psn).max(0) as u32;
            self.req.grown = (self.req.grown + acked).min(MAX_WINDOW_PSNS - MAX_UNACKED_PSNS);
        }
    }

    /// Packets sent between two that ask for an ACK: half of rxe's window
    /// (64), a quarter of a larger one, half of a smaller one, so that an
    /// ACK always comes back before the window closes.
    fn ack_every(&self) -> u32 {
        let window = self.window();
        (window / 4).max(MAX_PKTS_PER_ACK.min(window / 2)).max(1)
    }

    /// A message ended without AckReq and nothing asked since: the last
    /// packet sent goes again, asking, and the responder acknowledges the
    /// duplicate (C9-105). (Were it a READ's or an atomic's, whose
    /// responses answer for it, the next packet would ask instead.)
    pub(super) fn ask_for_ack(&mut self) {
        if self.comp.psn == self.req.sent_end || self.attr.state == QpState::Err {
            return;
        }
        self.req.ask_next = true;
        let last = self.req.sent_end.wrapping_sub(1);
        let Some(index) = self.wqe_index_of(last) else { return };
        let wqe = &mut self.sq[index];
        if wqe.wr.op.is_read_or_atomic() {
            return;
        }
        let range = wqe.psn.expect("found by its PSN");
        wqe.next_pkt = last.diff(range.first) as u32;
        wqe.sent = false;
        self.req.next = index;
    }

    /// How long a packet sent without AckReq waits for one that asks.
    fn ack_ask_delay(&self) -> Duration {
        self.ack_timeout().map_or(ACK_ASK_DELAY, |t| ACK_ASK_DELAY.min(t / 4))
    }

    /// Go-back-N: the requester resends from `psn`, which must be an
    /// unacknowledged PSN of a WQE already sent.
    pub(super) fn go_back_to(&mut self, psn: Psn) {
        let Some(index) = self.wqe_index_of(psn) else { return };
        self.counters.retries += 1;
        debug!(qpn = self.qpn, psn = psn.value(), "go back");
        if matches!(self.sq[index].wr.op, SendOp::RdmaRead { .. }) {
            // READ responses were lost: the next READs go in pieces the
            // receive buffer holds.
            self.req.pieced_reads = PIECED_READS;
        }
        for (i, wqe) in self.sq.iter_mut().enumerate().skip(index) {
            if wqe.wr.op.is_local() {
                continue;
            }
            let Some(range) = wqe.psn else { break };
            wqe.next_pkt = if i == index { psn.diff(range.first) as u32 } else { 0 };
            wqe.sent = false;
        }
        self.req.next = index;
        self.comp.retry_started_at = Some(self.comp.psn);
        // The peer or the path did not keep up: back to rxe's window.
        self.req.grown = 0;
        self.req.timed = None;
    }
}
