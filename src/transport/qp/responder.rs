//! The responder: validates and executes requests from the peer and answers
//! them (ACK, NAK, RNR NAK, READ responses, atomic ACKs).
//!
//! Checks run in kernel rxe's order — PSN, opcode sequence, QP access rights,
//! receive resources, lengths, R_Key — and only a request that passes them all
//! touches memory.

use std::collections::VecDeque;
use std::net::IpAddr;

use tracing::{debug, trace};

use super::{Qp, LEND_FROM};
use crate::transport::attr::QpState;
use crate::transport::memory::{for_each_piece, AtomicOp, Memory};
use crate::transport::queue::{CqKind, Incoming, Transmit};
use crate::transport::srq::Srq;
use crate::transport::types::{Access, AsyncEvent, FlushPlacement, QpType, RecvWr, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::opcode::Position;
use crate::wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, NakCode, Opcode, Operation, Psn, RethRepr, RoceRepr, Syndrome, Transport,
};

/// Bytes of the GRH area at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// A multi-packet message being received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Message {
    Send,
    Write { addr: u64, rkey: u32, remaining: u64, total: u64 },
}

/// What the responder remembers of a READ or atomic, to answer a duplicate
/// without executing it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resource {
    Read { first: Psn, last: Psn, addr: u64, rkey: u32, len: u64 },
    Atomic { psn: Psn, original: u64 },
}

/// A response waiting to be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Response {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    /// READ response packets still to send, from `psn` on, read through
    /// `rkey` with `access`: the READ's own key and REMOTE_READ, or for a
    /// READ through a window the region behind it, with no right asked
    /// again ([`Memory::resolve`]).
    Read {
        psn: Psn,
        addr: u64,
        rkey: u32,
        access: Access,
        remaining: u64,
        first: bool,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        original: u64,
        msn: u32,
    },
}

impl Response {
    /// A FLUSH's answer, first or again: a READ response of no data.
    fn flush_answer(psn: Psn, reth: RethRepr, msn: u32) -> Response {
        Response::Read {
            psn,
            addr: reth.va,
            rkey: reth.rkey,
            access: Access::REMOTE_READ,
            remaining: 0,
            first: true,
            msn,
        }
    }
}

/// Responder progress.
#[derive(Debug, Clone, Default)]
pub(super) struct RespState {
    /// The PSN expected next.
    pub(super) psn: Psn,
    /// PSN after the last SEND/WRITE/atomic executed: a duplicate SEND or
    /// WRITE is acknowledged with the PSN before it (never a READ's PSN).
    pub(super) ack_psn: Psn,
    pub(super) msn: u32,
    /// A sequence NAK was sent and the expected PSN has not arrived since.
    pub(super) sent_psn_nak: bool,
    pub(super) message: Option<Message>,
    /// The receive WQE the current SEND fills, and how far.
    pub(super) recv: Option<RecvWr>,
    pub(super) recv_offset: u64,
    pub(super) resources: VecDeque<Resource>,
    pub(super) responses: VecDeque<Response>,
    /// UC: drop packets until the next FIRST or ONLY.
    pub(super) drop_msg: bool,
}

impl RespState {
    pub(super) fn reset_psn(&mut self, psn: Psn) {
        self.psn = psn;
        self.ack_psn = psn;
    }

    /// Forgets the message in progress; returns the receive WQE it held.
    pub(super) fn abandon(&mut self) -> Option<RecvWr> {
        self.message = None;
        self.recv_offset = 0;
        self.recv.take()
    }
}

/// Why a request is refused.
enum Refusal {
    Nak(NakCode),
    /// No receive WQE: RNR NAK (RC) or drop (UC).
    Rnr,
}

impl Qp {
    pub(super) fn handle_request(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory, mut srq: Option<&mut Srq>) {
        let hdr = pkt.header;
        if self.lingering {
            let resent = self.qp_type == QpType::Rc
                && self.is_from_peer(&pkt)
                && hdr.bth.psn.is_before(self.resp.psn)
                && !matches!(
                    hdr.bth.opcode.operation(),
                    Operation::ReadRequest | Operation::CompareSwap | Operation::FetchAdd | Operation::Flush
                );
            if resent {
                self.duplicate(pkt, mem);
            } else {
                self.counters.dropped += 1;
            }
            return;
        }
        let receiving = matches!(self.attr.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe);
        let transport = match self.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        };
        if !receiving || hdr.bth.opcode.transport() != transport {
            self.counters.dropped += 1;
            return;
        }
        if self.qp_type == QpType::Ud {
            self.ud_receive(pkt, mem, srq);
            return;
        }
        if !self.is_from_peer(&pkt) {
            self.counters.dropped += 1;
            return;
        }
        let psn = hdr.bth.psn;
        if !self.check_psn(pkt, mem) {
            return;
        }
        match self.execute(pkt, mem, srq.as_deref_mut()) {
            Ok(()) => {}
            // UC never answers: the rest of the message is dropped.
            Err(_) if self.qp_type == QpType::Uc => {
                self.counters.dropped += 1;
                self.resp.drop_msg = true;
                self.resp.message = None;
            }
            Err(Refusal::Rnr) => {
                self.counters.rnr_naks_sent += 1;
                let syndrome = Syndrome::RnrNak { timer: self.attr.min_rnr_timer };
                self.push_response(Response::Ack { psn, syndrome, msn: self.resp.msn });
            }
            Err(Refusal::Nak(code)) => self.nak_and_fail(psn, code),
        }
        if let Some(srq) = srq {
            if srq.poll_limit_event() {
                self.events.push_back(AsyncEvent::SrqLimitReached { srq: srq.id() });
            }
        }
    }

    /// PSN check. RC: the expected PSN proceeds; a later one gets one
    /// sequence NAK (then silence until the expected PSN arrives); an earlier
    /// one is a duplicate. UC: a gap drops packets until the next FIRST/ONLY,
    /// which resynchronises.
    fn check_psn(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory) -> bool {
        let psn = pkt.header.bth.psn;
        let d = psn.diff(self.resp.psn);
        if self.qp_type == QpType::Uc {
            if self.resp.drop_msg || d != 0 {
                let starts = matches!(pkt.header.bth.opcode.operation().position(), Position::First | Position::Only);
                self.resp.message = None;
                if !starts {
                    self.resp.drop_msg = true;
                    self.counters.dropped += 1;
                    return false;
                }
                self.resp.drop_msg = false;
                self.resp.psn = psn;
            }
            return true;
        }
        if d > 0 {
            if !self.resp.sent_psn_nak {
                self.resp.sent_psn_nak = true;
                self.counters.seq_naks_sent += 1;
                let syndrome = Syndrome::Nak(NakCode::PsnSequenceError);
                self.push_response(Response::Ack { psn: self.resp.psn, syndrome, msn: self.resp.msn });
            } else {
                self.counters.dropped += 1;
            }
            return false;
        }
        if d < 0 {
            self.duplicate(pkt, mem);
            return false;
        }
        self.resp.sent_psn_nak = false;
        true
    }

    /// Validates and executes an in-sequence request.
    fn execute(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory, srq: Option<&mut Srq>) -> Result<(), Refusal> {
        let hdr = pkt.header;
        let op = hdr.bth.opcode.operation();
        let psn = hdr.bth.psn;
        let mtu = self.attr.path_mtu.bytes();
        let position = op.position();
        use Operation::*;

        // Opcode sequence: MIDDLE/LAST continue the message in progress,
        // FIRST/ONLY may not interrupt one.
        let continues = matches!(position, Position::Middle | Position::Last);
        let is_send = matches!(
            op,
            SendFirst | SendMiddle | SendLast | SendLastImm | SendOnly | SendOnlyImm | SendLastInv | SendOnlyInv
        );
        let is_write = matches!(op, WriteFirst | WriteMiddle | WriteLast | WriteLastImm | WriteOnly | WriteOnlyImm);
        match (self.resp.message, continues) {
            (Some(Message::Send), true) if is_send => {}
            (Some(Message::Write { .. }), true) if is_write => {}
            (None, false) => {}
            _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
        }

        // The QP must allow the operation (FLUSH asks the region's rights
        // only, as in rxe).
        let needed = if is_write || op == AtomicWrite {
            Access::REMOTE_WRITE
        } else if op == ReadRequest {
            Access::REMOTE_READ
        } else if matches!(op, CompareSwap | FetchAdd) {
            Access::REMOTE_ATOMIC
        } else if is_send || op == Flush {
            Access::NONE
        } else {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        };
        if !self.attr.access_flags.contains(needed) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }

        // Receive resources: a SEND's first packet and a WRITE with immediate
        // each consume a receive WQE.
        let consumes_recv = (is_send && self.resp.recv.is_none()) || matches!(op, WriteLastImm | WriteOnlyImm);
        if consumes_recv && self.resp.recv.is_none() {
            let available = match srq.as_deref() {
                Some(s) => !s.is_empty(),
                None => !self.rq.is_empty(),
            };
            if !available {
                return Err(Refusal::Rnr);
            }
        }
        if matches!(op, ReadRequest | CompareSwap | FetchAdd | Flush | AtomicWrite) && self.attr.max_dest_rd_atomic == 0
        {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }

        // Lengths: FIRST and MIDDLE carry exactly one MTU, LAST and ONLY at most one.
        let len = pkt.payload.len();
        let length_ok = match position {
            Position::First | Position::Middle => len == mtu,
            _ => len <= mtu,
        };
        if !length_ok {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }

        if is_write {
            self.write(pkt, mem, srq)?;
        } else if is_send {
            self.send(pkt, mem, srq)?;
        } else if op == ReadRequest {
            self.read(pkt, mem)?;
            return Ok(());
        } else if op == Flush {
            self.flush_request(pkt, mem)?;
            return Ok(());
        } else if op == AtomicWrite {
            self.atomic_write(pkt, mem)?;
        } else {
            self.atomic(pkt, mem)?;
        }

        self.resp.psn = psn.wrapping_add(1);
        self.resp.ack_psn = self.resp.psn;
        if matches!(position, Position::Last | Position::Only) && !matches!(op, CompareSwap | FetchAdd) {
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        }
        if hdr.bth.ack_req && self.qp_type == QpType::Rc && !matches!(op, CompareSwap | FetchAdd) {
            self.push_response(Response::Ack { psn, syndrome: ack_syndrome(), msn: self.resp.msn });
        }
        Ok(())
    }

    fn take_recv(&mut self, srq: Option<&mut Srq>) -> Option<RecvWr> {
        match srq {
            Some(s) => s.take(),
            None => self.rq.pop_front(),
        }
    }

    fn send(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory, srq: Option<&mut Srq>) -> Result<(), Refusal> {
        let hdr = pkt.header;
        let position = hdr.bth.opcode.operation().position();
        if self.resp.recv.is_none() {
            self.resp.recv = self.take_recv(srq);
        }
        if matches!(position, Position::First | Position::Only) {
            // A UC message dropped half-way leaves its receive WQE for the next one.
            self.resp.recv_offset = 0;
        }
        let offset = self.resp.recv_offset;
        let recv = self.resp.recv.as_ref().ok_or(Refusal::Rnr)?;
        if offset + pkt.payload.len() as u64 > recv.length() {
            self.complete_recv_error(WcStatus::LocLenErr);
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let user = self.key_user();
        let placed = for_each_piece(&recv.sg_list, offset, pkt.payload.len(), |sge, addr, at, n| {
            mem.write(sge.lkey, user, addr, &pkt.payload[at..at + n], Access::LOCAL_WRITE)
        });
        if placed.is_err() {
            self.complete_recv_error(WcStatus::LocProtErr);
            return Err(Refusal::Nak(NakCode::RemoteOperationalError));
        }
        self.resp.recv_offset += pkt.payload.len() as u64;
        if matches!(position, Position::First | Position::Middle) {
            self.resp.message = Some(Message::Send);
            return Ok(());
        }
        let mut invalidated = None;
        if let Some(rkey) = hdr.ieth {
            if mem.invalidate(rkey, self.key_user()).is_err() {
                self.complete_recv_error(WcStatus::LocProtErr);
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            }
            invalidated = Some(rkey);
        }
        let recv = self.resp.abandon().expect("checked above");
        let mut wc = WorkCompletion::new(recv.wr_id, self.qpn, WcStatus::Success, WcOpcode::Recv);
        wc.byte_len = offset as u32 + pkt.payload.len() as u32;
        wc.imm = hdr.imm;
        wc.invalidated_rkey = invalidated;
        wc.solicited = hdr.bth.solicited;
        self.completions.push_back((CqKind::Recv, wc));
        Ok(())
    }

    fn complete_recv_error(&mut self, status: WcStatus) {
        if let Some(recv) = self.resp.abandon() {
            let wc = WorkCompletion::new(recv.wr_id, self.qpn, status, WcOpcode::Recv);
            self.completions.push_back((CqKind::Recv, wc));
        }
    }

    fn write(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory, srq: Option<&mut Srq>) -> Result<(), Refusal> {
        let hdr = pkt.header;
        let position = hdr.bth.opcode.operation().position();
        let (addr, rkey, remaining, total) = match (self.resp.message, hdr.reth) {
            (Some(Message::Write { addr, rkey, remaining, total }), _) => (addr, rkey, remaining, total),
            (None, Some(reth)) => {
                let len = u64::from(reth.dma_len);
                if len > 0 {
                    mem.check(reth.rkey, self.key_user(), reth.va, len, Access::REMOTE_WRITE)
                        .map_err(|_| Refusal::Nak(NakCode::RemoteAccessError))?;
                }
                (reth.va, reth.rkey, len, len)
            }
            _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
        };
        let len = pkt.payload.len() as u64;
        let ends = matches!(position, Position::Last | Position::Only);
        if len > remaining || (ends && len != remaining) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        if len > 0 {
            mem.write(rkey, self.key_user(), addr, pkt.payload, Access::REMOTE_WRITE)
                .map_err(|_| Refusal::Nak(NakCode::RemoteAccessError))?;
        }
        if !ends {
            self.resp.message = Some(Message::Write { addr: addr + len, rkey, remaining: remaining - len, total });
            return Ok(());
        }
        self.resp.message = None;
        if let Some(imm) = hdr.imm {
            // A receive a dropped UC SEND left behind is the oldest: it goes first.
            let recv = self.resp.recv.take().or_else(|| self.take_recv(srq)).ok_or(Refusal::Rnr)?;
            let mut wc = WorkCompletion::new(recv.wr_id, self.qpn, WcStatus::Success, WcOpcode::RecvRdmaWithImm);
            wc.byte_len = total as u32;
            wc.imm = Some(imm);
            wc.solicited = hdr.bth.solicited;
            self.completions.push_back((CqKind::Recv, wc));
        }
        Ok(())
    }

    fn read(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory) -> Result<(), Refusal> {
        let reth = pkt.header.reth.ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
        let len = u64::from(reth.dma_len);
        let (source, access) = if len > 0 {
            let region = mem
                .resolve(reth.rkey, self.key_user(), reth.va, len, Access::REMOTE_READ)
                .map_err(|_| Refusal::Nak(NakCode::RemoteAccessError))?;
            read_source(reth.rkey, region)
        } else {
            (reth.rkey, Access::REMOTE_READ)
        };
        let psn = pkt.header.bth.psn;
        let mtu = self.attr.path_mtu.bytes() as u64;
        let packets = len.div_ceil(mtu).max(1) as u32;
        let last = psn.wrapping_add(packets - 1);
        self.remember(Resource::Read { first: psn, last, addr: reth.va, rkey: reth.rkey, len });
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.resp.psn = last.wrapping_add(1);
        let msn = self.resp.msn;
        let read = Response::Read { psn, addr: reth.va, rkey: source, access, remaining: len, first: true, msn };
        self.push_response(read);
        Ok(())
    }

    fn atomic(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory) -> Result<(), Refusal> {
        let eth = pkt.header.atomic_eth.ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
        if eth.va % 8 != 0 {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let op = match pkt.header.bth.opcode.operation() {
            Operation::CompareSwap => AtomicOp::CompareSwap { compare: eth.compare, swap: eth.swap_add },
            _ => AtomicOp::FetchAdd { add: eth.swap_add },
        };
        let original =
            mem.atomic(eth.rkey, self.key_user(), eth.va, op).map_err(|_| Refusal::Nak(NakCode::RemoteAccessError))?;
        let psn = pkt.header.bth.psn;
        self.remember(Resource::Atomic { psn, original });
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.push_response(Response::AtomicAck { psn, original, msn: self.resp.msn });
        Ok(())
    }

    /// ATOMIC WRITE (IBTA annex A19): the packet's 8 bytes stored at once
    /// at an 8-byte aligned address. A duplicate is acknowledged as a
    /// WRITE's is, not stored again.
    fn atomic_write(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory) -> Result<(), Refusal> {
        let reth = pkt.header.reth.ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
        let bytes = <[u8; 8]>::try_from(pkt.payload).map_err(|_| Refusal::Nak(NakCode::InvalidRequest))?;
        if reth.dma_len != 8 || !reth.va.is_multiple_of(8) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let store = AtomicOp::Store { value: u64::from_ne_bytes(bytes) };
        mem.atomic(reth.rkey, self.key_user(), reth.va, store).map_err(|_| Refusal::Nak(NakCode::RemoteAccessError))?;
        Ok(())
    }

    /// FLUSH (IBTA annex A19): what was placed in the range (or the whole
    /// region) reaches the placement asked for, then a READ response of no
    /// data answers, as in rxe; a duplicate gets that answer again.
    fn flush_request(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory) -> Result<(), Refusal> {
        let invalid = Refusal::Nak(NakCode::InvalidRequest);
        let (Some(reth), Some(feth)) = (pkt.header.reth, pkt.header.feth) else { return Err(invalid) };
        let placement = FlushPlacement::from_bits(feth.placement_type).ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
        let range = match feth.selectivity {
            0 => Some((reth.va, u64::from(reth.dma_len))),
            1 => None,
            _ => return Err(invalid),
        };
        mem.flush(reth.rkey, self.key_user(), range, placement.rights())
            .map_err(|_| Refusal::Nak(NakCode::RemoteAccessError))?;
        let psn = pkt.header.bth.psn;
        self.remember(Resource::Read { first: psn, last: psn, addr: reth.va, rkey: reth.rkey, len: 0 });
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.resp.psn = psn.wrapping_add(1);
        self.push_response(Response::flush_answer(psn, reth, self.resp.msn));
        Ok(())
    }

    /// Keeps a READ/atomic for duplicate replay; the oldest goes when
    /// max_dest_rd_atomic are kept (a peer exceeding the limit only loses
    /// replays of its oldest requests).
    fn remember(&mut self, res: Resource) {
        let cap = usize::from(self.attr.max_dest_rd_atomic.max(1));
        while self.resp.resources.len() >= cap {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(res);
    }

    /// A request with a PSN before the expected one: the requester retried.
    fn duplicate(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory) {
        self.counters.duplicate_requests += 1;
        let hdr = pkt.header;
        let psn = hdr.bth.psn;
        let msn = self.resp.msn;
        match hdr.bth.opcode.operation() {
            Operation::ReadRequest => {
                let Some(reth) = hdr.reth else { return };
                let found = self.resp.resources.iter().find_map(|r| match *r {
                    Resource::Read { first, last, addr, rkey, len } if !psn.is_before(first) && !psn.is_after(last) => {
                        Some((first, last, addr, rkey, len))
                    }
                    _ => None,
                });
                let Some((first, last, addr, rkey, len)) = found else {
                    self.counters.dropped += 1;
                    return;
                };
                // The retry may ask for the rest of the original READ, no more.
                let asked = u64::from(reth.dma_len);
                let within = reth.rkey == rkey
                    && reth.va >= addr
                    && reth.va.checked_add(asked).is_some_and(|end| end <= addr + len);
                let resolved = match asked {
                    0 => Ok(rkey),
                    _ => mem.resolve(rkey, self.key_user(), reth.va, asked, Access::REMOTE_READ),
                };
                let (Ok(region), true) = (resolved, within) else {
                    self.counters.dropped += 1;
                    return;
                };
                let (source, access) = read_source(rkey, region);
                // A newer replay of the same READ replaces a queued one where
                // it stands, so responses stay in PSN order.
                let replay =
                    Response::Read { psn, addr: reth.va, rkey: source, access, remaining: asked, first: true, msn };
                let queued =
                    self.resp.responses.iter_mut().find(
                        |r| matches!(r, Response::Read { psn: p, .. } if !p.is_before(first) && !p.is_after(last)),
                    );
                match queued {
                    Some(queued) => *queued = replay,
                    None => self.push_response(replay),
                }
            }
            Operation::Flush => {
                let flushed =
                    self.resp.resources.iter().any(|r| matches!(*r, Resource::Read { first, .. } if first == psn));
                match (flushed, hdr.reth) {
                    (true, Some(reth)) => self.push_response(Response::flush_answer(psn, reth, msn)),
                    _ => self.counters.dropped += 1,
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let original = self.resp.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, original } if p == psn => Some(original),
                    _ => None,
                });
                match original {
                    Some(original) => self.push_response(Response::AtomicAck { psn, original, msn }),
                    None => self.counters.dropped += 1,
                }
            }
            _ => {
                let psn = self.resp.ack_psn.wrapping_sub(1);
                self.push_response(Response::Ack { psn, syndrome: ack_syndrome(), msn });
            }
        }
    }

    /// Queues a response. A positive ACK replaces one queued just before it
    /// (coalescing), and the queue is bounded: a peer flooding duplicates
    /// loses the surplus answers, never memory. The bound holds what a
    /// requester within max_dest_rd_atomic is owed: its READs and atomics,
    /// each with an ACK after it, and a final ACK.
    fn push_response(&mut self, resp: Response) {
        let positive = |r: &Response| matches!(r, Response::Ack { syndrome: Syndrome::Ack { .. }, .. });
        if positive(&resp) && self.resp.responses.back().is_some_and(positive) {
            self.resp.responses.pop_back();
        }
        let cap = 2 * usize::from(self.attr.max_dest_rd_atomic) + 4;
        if self.resp.responses.len() >= cap {
            self.counters.dropped += 1;
            return;
        }
        self.resp.responses.push_back(resp);
    }

    /// Class B/C errors: NAK the request and move the QP to ERR. The
    /// answers still queued for the requests before it go first, as in rxe,
    /// whose responder has sent them before it looks at the next request: a
    /// READ's responses, an atomic's ACK, the ACK of the last SEND. Nothing
    /// follows the NAK.
    fn nak_and_fail(&mut self, psn: Psn, code: NakCode) {
        debug!(qpn = self.qpn, psn = psn.value(), ?code, "NAK");
        self.counters.fatal_naks_sent.count(code);
        self.resp.responses.push_back(Response::Ack { psn, syndrome: Syndrome::Nak(code), msn: self.resp.msn });
        let event = match code {
            NakCode::RemoteAccessError => AsyncEvent::QpAccessError { qpn: self.qpn },
            _ => AsyncEvent::QpRequestError { qpn: self.qpn },
        };
        self.fail(event);
    }

    /// UD: Q_Key check, one receive WQE per message, the GRH area first.
    fn ud_receive(&mut self, pkt: Incoming<'_>, mem: &mut dyn Memory, srq: Option<&mut Srq>) {
        let hdr = pkt.header;
        let Some(deth) = hdr.deth else { return };
        if deth.qkey != self.attr.qkey {
            trace!(qpn = self.qpn, qkey = deth.qkey, "Q_Key mismatch");
            self.counters.dropped += 1;
            return;
        }
        let srq_id = srq.as_ref().map(|s| s.id());
        let limit_event;
        let recv = match srq {
            Some(s) => {
                let r = s.take();
                limit_event = s.poll_limit_event();
                r
            }
            None => {
                limit_event = false;
                self.rq.pop_front()
            }
        };
        if let (true, Some(srq)) = (limit_event, srq_id) {
            self.events.push_back(AsyncEvent::SrqLimitReached { srq });
        }
        let Some(recv) = recv else {
            self.counters.dropped += 1;
            return;
        };
        let total = GRH_LEN + pkt.payload.len();
        let mut wc = WorkCompletion::new(recv.wr_id, self.qpn, WcStatus::Success, WcOpcode::Recv);
        if total as u64 > recv.length() {
            wc.status = WcStatus::LocLenErr;
            self.completions.push_back((CqKind::Recv, wc));
            return;
        }
        let grh = grh_area(pkt.src, pkt.dst, hdr.wire_len(pkt.payload.len()));
        let user = self.key_user();
        let mut scatter = |offset: u64, data: &[u8]| {
            for_each_piece(&recv.sg_list, offset, data.len(), |sge, addr, at, n| {
                mem.write(sge.lkey, user, addr, &data[at..at + n], Access::LOCAL_WRITE)
            })
        };
        let placed = scatter(0, &grh).and_then(|()| scatter(GRH_LEN as u64, pkt.payload));
        if placed.is_err() {
            wc.status = WcStatus::LocProtErr;
        } else {
            wc.byte_len = total as u32;
            wc.imm = hdr.imm;
            wc.src_qp = deth.src_qpn;
            wc.grh = true;
            wc.solicited = hdr.bth.solicited;
        }
        self.completions.push_back((CqKind::Recv, wc));
    }

    /// Builds the next queued response into `buf`.
    pub(super) fn next_response(&mut self, mem: &dyn Memory, buf: &mut [u8]) -> Option<Transmit> {
        if self.attr.state == QpState::Reset {
            return None;
        }
        let dest = self.attr.dest?;
        let resp = *self.resp.responses.front()?;
        let bth = |operation, psn| BthRepr {
            opcode: Opcode::new(Transport::Rc, operation).expect("RC opcode"),
            solicited: false,
            mig_req: false,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: self.attr.dest_qpn,
            ack_req: false,
            psn,
        };
        let len = match resp {
            Response::Ack { psn, syndrome, msn } => {
                let mut repr = RoceRepr::new(bth(Operation::Acknowledge, psn));
                repr.aeth = Some(AethRepr { syndrome, msn });
                self.resp.responses.pop_front();
                repr.emit(buf, &[]).ok()?
            }
            Response::AtomicAck { psn, original, msn } => {
                let mut repr = RoceRepr::new(bth(Operation::AtomicAcknowledge, psn));
                repr.aeth = Some(AethRepr { syndrome: ack_syndrome(), msn });
                repr.atomic_ack_eth = Some(AtomicAckEthRepr { original });
                self.resp.responses.pop_front();
                repr.emit(buf, &[]).ok()?
            }
            Response::Read { psn, addr, rkey, access, remaining, first, msn } => {
                let mtu = self.attr.path_mtu.bytes() as u64;
                let n = remaining.min(mtu);
                let last = remaining <= mtu;
                let operation = match (first, last) {
                    (true, true) => Operation::ReadResponseOnly,
                    (true, false) => Operation::ReadResponseFirst,
                    (false, false) => Operation::ReadResponseMiddle,
                    (false, true) => Operation::ReadResponseLast,
                };
                let mut repr = RoceRepr::new(bth(operation, psn));
                if operation != Operation::ReadResponseMiddle {
                    repr.aeth = Some(AethRepr { syndrome: ack_syndrome(), msn });
                }
                let header_len = repr.header_len();
                let total = repr.emit_headers(buf, n as usize).ok()?;
                let payload = &mut buf[header_len..header_len + n as usize];
                let lent = if n as usize >= LEND_FROM {
                    mem.lend(rkey, self.key_user(), addr, payload.len(), access)
                } else {
                    Ok(None)
                };
                let lent = match lent {
                    Ok(None) if n > 0 => mem.read(rkey, self.key_user(), addr, payload, access).map(|()| None),
                    Ok(lent) => Ok(lent.map(|lent| (header_len, lent))),
                    Err(e) => Err(e),
                };
                let Ok(lent) = lent else {
                    // The region went away under the READ: it fails, and
                    // what was queued after it answers nothing any more.
                    self.resp.responses.clear();
                    self.nak_and_fail(psn, NakCode::RemoteAccessError);
                    return self.next_response(mem, buf);
                };
                let front = self.resp.responses.front_mut().expect("peeked above");
                if last {
                    self.resp.responses.pop_front();
                } else {
                    *front = Response::Read {
                        psn: psn.wrapping_add(1),
                        addr: addr + n,
                        rkey,
                        access,
                        remaining: remaining - n,
                        first: false,
                        msn,
                    };
                }
                return Some(Transmit { dest, len: total, lent });
            }
        };
        Some(Transmit { dest, len, lent: None })
    }
}

/// The key and right a READ's responses read through: its own key with
/// REMOTE_READ, or the region a window of it reached, checked already.
fn read_source(rkey: u32, region: u32) -> (u32, Access) {
    if region == rkey {
        (rkey, Access::REMOTE_READ)
    } else {
        (region, Access::NONE)
    }
}

/// rxe never advertises end-to-end credits.
fn ack_syndrome() -> Syndrome {
    Syndrome::Ack { credits: Syndrome::INVALID_CREDITS }
}

/// The 40 bytes a UD receive starts with: the IPv6 header, or for IPv4 twenty
/// zero bytes and then the IPv4 header, as kernel rxe writes them. `roce_len`
/// is the packet's UDP payload (BTH through ICRC), so the lengths match what
/// was on the wire.
pub fn grh_area(src: IpAddr, dst: IpAddr, roce_len: usize) -> [u8; GRH_LEN] {
    let mut grh = [0u8; GRH_LEN];
    let udp_len = 8 + roce_len;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = crate::wire::icrc::ipv4_header(s, d, (20 + udp_len) as u16, 0, 0x40);
            h[8] = 64; // TTL
            let sum = etherparse::Ipv4Header::from_slice(&h).map(|(hdr, _)| hdr.calc_header_checksum());
            h[10..12].copy_from_slice(&sum.unwrap_or(0).to_be_bytes());
            grh[20..].copy_from_slice(&h);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            grh[0] = 0x60;
            grh[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            grh[6] = 17;
            grh[7] = 64;
            grh[8..24].copy_from_slice(&s.octets());
            grh[24..40].copy_from_slice(&d.octets());
        }
        _ => {}
    }
    grh
}
