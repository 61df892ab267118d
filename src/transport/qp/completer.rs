//! The completer: turns ACKs, NAKs, READ responses and atomic ACKs into
//! completions, and drives retransmission (go-back-N after a sequence NAK, a
//! lost response or the local ACK timeout; a wait after an RNR NAK).

use std::time::Duration;

use tracing::debug;

use super::Qp;
use crate::transport::attr::QpState;
use crate::transport::memory::{for_each_piece, Memory};
use crate::transport::queue::Incoming;
use crate::transport::timer::Timer;
use crate::transport::types::{Access, AsyncEvent, QpType, SendOp, WcStatus};
use crate::wire::{NakCode, Operation, Psn, Syndrome};

/// Completer progress.
#[derive(Debug, Clone, Default)]
pub(super) struct CompState {
    /// Oldest PSN not yet acknowledged.
    pub(super) psn: Psn,
    pub(super) retry_left: u8,
    pub(super) rnr_left: u8,
    /// Where the requester resends from when the RNR wait
    /// ([`Timer::RnrWait`]) ends.
    pub(super) rnr_psn: Psn,
    /// A retry was already started for this `psn`: further gaps seen before
    /// progress must not start another.
    pub(super) retry_started_at: Option<Psn>,
    /// An ACK timeout went back: only the oldest unacknowledged packet goes
    /// out until the peer shows progress, so a peer that is slow rather than
    /// lossy is not buried under a window of duplicates per timeout.
    pub(super) probing: bool,
}

/// Outcome of retiring acknowledged WQEs up to a PSN.
enum Retire {
    /// Every WQE before the PSN completed.
    Done,
    /// A READ or atomic before the PSN never got its response: it was lost.
    LostResponse,
}

impl Qp {
    pub(super) fn handle_response(&mut self, now: Duration, pkt: Incoming<'_>, mem: &mut dyn Memory) {
        let hdr = pkt.header;
        let psn = hdr.bth.psn;
        let receiving = matches!(self.attr.state, QpState::Rts | QpState::Sqd | QpState::Sqe);
        if self.qp_type != QpType::Rc || !receiving || !self.is_from_peer(&pkt) {
            self.counters.dropped += 1;
            return;
        }
        // Only PSNs from the oldest unacknowledged to the last sent mean anything.
        if psn.is_before(self.comp.psn) || !psn.is_before(self.req.psn) {
            self.counters.dropped += 1;
            return;
        }
        let op = hdr.bth.opcode.operation();
        match (op, hdr.aeth.map(|a| a.syndrome)) {
            (Operation::Acknowledge, Some(Syndrome::Ack { .. })) => self.on_ack(now, psn),
            (Operation::Acknowledge, Some(Syndrome::RnrNak { timer })) => self.on_rnr_nak(now, psn, timer),
            (Operation::Acknowledge, Some(Syndrome::Nak(code))) => self.on_nak(now, psn, code),
            (Operation::AtomicAcknowledge, _) => {
                self.on_atomic_ack(now, psn, hdr.atomic_ack_eth.map(|a| a.original), mem)
            }
            (
                Operation::ReadResponseFirst
                | Operation::ReadResponseMiddle
                | Operation::ReadResponseLast
                | Operation::ReadResponseOnly,
                _,
            ) => self.on_read_response(now, psn, op, pkt.payload, mem),
            _ => self.counters.dropped += 1,
        }
        self.check_sq_drained();
    }

    /// Everything before `psn` is acknowledged: completes, in order, the
    /// SEND/WRITE WQEs that end before it and moves the oldest unacknowledged
    /// PSN up. A READ or atomic is passed only with its responses, so the
    /// PSN stops at its first missing response.
    fn retire_before(&mut self, now: Duration, psn: Psn) -> Retire {
        while let Some(wqe) = self.sq.front() {
            if wqe.wr.op.is_local() {
                if !wqe.sent {
                    break;
                }
                self.complete_done_local_ops();
                continue;
            }
            let Some(range) = wqe.psn else { break };
            if wqe.wr.op.is_read_or_atomic() {
                let target = if range.first.is_before(psn) { range.first } else { psn };
                if target.is_after(self.comp.psn) {
                    self.progress(now, target);
                }
                return if range.last().is_before(psn) { Retire::LostResponse } else { Retire::Done };
            }
            if !range.last().is_before(psn) {
                break;
            }
            let wqe = self.sq.pop_front().expect("front exists");
            self.req.next = self.req.next.saturating_sub(1);
            // An ATOMIC WRITE held a responder resource until its ACK.
            self.req.rd_atomic = self.req.rd_atomic.saturating_sub(wqe.rd_atomic_counted);
            self.complete_send(&wqe, WcStatus::Success);
        }
        if psn.is_after(self.comp.psn) {
            self.progress(now, psn);
        }
        Retire::Done
    }

    /// The oldest unacknowledged PSN moved to `psn`: retries are earned back
    /// and the timer restarts (or stops when nothing is in flight).
    fn progress(&mut self, now: Duration, psn: Psn) {
        self.adapt_window(now, psn);
        self.comp.psn = psn;
        self.comp.retry_left = self.attr.retry_cnt;
        self.comp.rnr_left = self.attr.rnr_retry;
        self.comp.retry_started_at = None;
        self.comp.probing = false;
        // Nothing sent is unacknowledged (a PSN handed to a request that the
        // window holds back is not in flight): no timeout runs.
        if self.comp.psn == self.req.sent_end {
            self.timers.stop(Timer::AckTimeout);
        } else {
            self.restart_ack_timer(now);
        }
        if self.comp.psn == self.req.sent_end {
            // Nothing sent is unacknowledged: nothing to ask for.
            self.timers.stop(Timer::AskForAck);
        }
    }

    /// A response revealed that responses before it were lost (an implied
    /// NAK): resend from the oldest unacknowledged PSN, once per gap, spending
    /// a transport retry as a sequence NAK does.
    fn retry_lost(&mut self) {
        if self.comp.retry_started_at != Some(self.comp.psn) && self.take_retry() {
            let psn = self.comp.psn;
            self.go_back_to(psn);
        }
    }

    fn on_ack(&mut self, now: Duration, psn: Psn) {
        // An ACK inside a READ/atomic's range (a re-ACK of a duplicate) says
        // nothing about that READ; one beyond it means its responses were lost.
        let through = match self.wqe_index_of(psn).map(|i| &self.sq[i]) {
            Some(w) if w.wr.op.is_read_or_atomic() => w.psn.expect("in range").first,
            _ => psn.wrapping_add(1),
        };
        if let Retire::LostResponse = self.retire_before(now, through) {
            self.retry_lost();
        }
    }

    fn on_rnr_nak(&mut self, now: Duration, psn: Psn, timer: u8) {
        self.counters.rnr_naks_received += 1;
        if let Retire::LostResponse = self.retire_before(now, psn) {
            self.retry_lost();
            return;
        }
        if self.attr.rnr_retry != 7 {
            if self.comp.rnr_left == 0 {
                self.fail_front(WcStatus::RnrRetryExcErr);
                return;
            }
            self.comp.rnr_left -= 1;
        }
        let wait = Duration::from_micros(u64::from(Syndrome::rnr_timer_micros(timer)));
        debug!(qpn = self.qpn, psn = psn.value(), ?wait, "RNR NAK");
        // Nothing is sent until the wait is over; then the requester goes
        // back to `psn` (see `handle_timeout`).
        self.timers.stop(Timer::AckTimeout);
        self.timers.set(Timer::RnrWait, now + wait);
        self.comp.rnr_psn = psn;
    }

    fn on_nak(&mut self, now: Duration, psn: Psn, code: NakCode) {
        if let Retire::LostResponse = self.retire_before(now, psn) {
            self.retry_lost();
            return;
        }
        match code {
            NakCode::PsnSequenceError => {
                self.counters.seq_naks_received += 1;
                // One retry per gap, like rxe's `started_retry`: a NAK the
                // network duplicated, or one drawn by requests sent behind an
                // RNR-NAKed one, asks for a go-back already under way. If the
                // resent packets are lost too, the ACK timer catches it.
                let under_way = self.comp.retry_started_at == Some(psn)
                    || (self.timers.is_armed(Timer::RnrWait) && self.comp.rnr_psn == psn);
                if !under_way && self.take_retry() {
                    self.go_back_to(psn);
                }
            }
            NakCode::InvalidRequest => {
                self.counters.fatal_naks_received.count(code);
                self.fail_front(WcStatus::RemInvReqErr)
            }
            NakCode::RemoteAccessError => {
                self.counters.fatal_naks_received.count(code);
                self.fail_front(WcStatus::RemAccessErr)
            }
            NakCode::RemoteOperationalError | NakCode::InvalidRdRequest => {
                self.counters.fatal_naks_received.count(code);
                self.fail_front(WcStatus::RemOpErr)
            }
        }
    }

    /// Spends one transport retry; when none is left the oldest WQE fails
    /// with RETRY_EXC_ERR and the QP goes to ERR.
    fn take_retry(&mut self) -> bool {
        if self.comp.retry_left == 0 {
            self.fail_front(WcStatus::RetryExcErr);
            return false;
        }
        self.comp.retry_left -= 1;
        true
    }

    /// The RNR NAK's wait is over: the requester resends from the NAKed PSN.
    pub(super) fn end_rnr_wait(&mut self) {
        let psn = self.comp.rnr_psn;
        self.go_back_to(psn);
    }

    pub(super) fn on_ack_timeout(&mut self, now: Duration) {
        if self.comp.psn == self.req.sent_end || self.attr.state == QpState::Err {
            return;
        }
        self.counters.timeouts += 1;
        debug!(qpn = self.qpn, psn = self.comp.psn.value(), "local ACK timeout");
        if self.take_retry() {
            let psn = self.comp.psn;
            self.go_back_to(psn);
            self.comp.probing = true;
            self.restart_ack_timer(now);
        }
    }

    /// Completes the oldest WQE with an error and moves the QP to ERR, which
    /// flushes the rest.
    fn fail_front(&mut self, status: WcStatus) {
        if let Some(wqe) = self.sq.pop_front() {
            self.complete_send(&wqe, status);
        }
        self.fail(AsyncEvent::QpFatal { qpn: self.qpn });
    }

    fn on_read_response(&mut self, now: Duration, psn: Psn, op: Operation, payload: &[u8], mem: &mut dyn Memory) {
        if let Retire::LostResponse = self.retire_before(now, psn) {
            self.retry_lost();
            return;
        }
        let Some(wqe) = self.sq.front() else { return };
        let (Some(range), SendOp::RdmaRead { .. } | SendOp::Flush { .. }) = (wqe.psn, wqe.wr.op) else {
            // A READ response for a WQE that is not a READ: the responses
            // before it were lost or the peer is confused. Retry.
            self.retry_lost();
            return;
        };
        if psn != self.comp.psn {
            self.retry_lost();
            return;
        }
        let mtu = self.attr.path_mtu.bytes() as u64;
        let index = psn.diff(range.first) as u32;
        let offset = u64::from(index) * mtu;
        // The responses to one request (one piece of a READ that went in
        // several) end where that request did.
        let piece_end = wqe.piece_end(index, range.count);
        let end = wqe.piece_end_byte(index, range.count, mtu);
        let ends = matches!(op, Operation::ReadResponseLast | Operation::ReadResponseOnly);
        let len = payload.len() as u64;
        let well_formed = if ends { offset + len == end } else { len == mtu && offset + len < end };
        if !well_formed {
            self.fail_front(WcStatus::BadRespErr);
            return;
        }
        let user = self.key_user();
        let placed = for_each_piece(&wqe.wr.sg_list, offset, payload.len(), |sge, addr, at, n| {
            mem.write(sge.lkey, user, addr, &payload[at..at + n], Access::LOCAL_WRITE)
        });
        if placed.is_err() {
            self.fail_front(WcStatus::LocProtErr);
            return;
        }
        self.progress(now, psn.wrapping_add(1));
        if ends && piece_end < range.count {
            // A piece answered in full: one outstanding READ request less.
            if let Some(wqe) = self.sq.front_mut().filter(|w| w.rd_atomic_counted > 0) {
                wqe.rd_atomic_counted -= 1;
                self.req.rd_atomic = self.req.rd_atomic.saturating_sub(1);
            }
        } else if ends {
            self.finish_rd_atomic();
        }
    }

    fn on_atomic_ack(&mut self, now: Duration, psn: Psn, original: Option<u64>, mem: &mut dyn Memory) {
        if let Retire::LostResponse = self.retire_before(now, psn) {
            self.retry_lost();
            return;
        }
        let Some(wqe) = self.sq.front() else { return };
        if !(wqe.wr.op.is_atomic() && wqe.psn.is_some_and(|r| r.first == psn)) {
            self.retry_lost();
            return;
        }
        let (sge, user) = (wqe.wr.sg_list[0], self.key_user());
        let value = original.unwrap_or_default().to_ne_bytes();
        if mem.write(sge.lkey, user, sge.addr, &value, Access::LOCAL_WRITE).is_err() {
            self.fail_front(WcStatus::LocProtErr);
            return;
        }
        self.progress(now, psn.wrapping_add(1));
        self.finish_rd_atomic();
    }

    /// The READ/atomic at the front got all its responses: complete it.
    fn finish_rd_atomic(&mut self) {
        let wqe = self.sq.pop_front().expect("front checked by caller");
        self.req.next = self.req.next.saturating_sub(1);
        self.req.rd_atomic = self.req.rd_atomic.saturating_sub(wqe.rd_atomic_counted);
        self.complete_send(&wqe, WcStatus::Success);
    }
}
