//! The queue pair: state machine, queues, and the sans-IO interface through
//! which time and packets go in and packets, completions, events and timer
//! deadlines come out.
//!
//! The work itself is split as in kernel rxe's `rxe_qp { req, comp, resp }`:
//! one child module per role, each beside its own state. [`requester`]
//! turns work requests into packets, [`completer`] turns responses into
//! completions and retransmissions, [`responder`] executes the peer's
//! requests. The roles import nothing from one another (what they share is
//! in the leaves `queue`, `memory` and `types`), and the QP's fields are
//! private to this module and its roles. This file keeps the getters, the
//! `handle_*` and `poll_*` interface, and the mutators of the QP's state and
//! queues.

mod completer;
mod requester;
mod responder;

use std::collections::VecDeque;
use std::time::Duration;

use tracing::debug;

use super::attr::{check_modify, AttrMask, ModifyError, QpAttr, QpState};
use super::memory::{KeyUser, Memory};
use super::queue::{CqKind, Incoming, Transmit, Wqe, TRANSMIT_HEADROOM};
use super::srq::{PostRecvError, Srq};
use super::timer::{Timer, TimerTable, MIN_ACK_TIMEOUT};
use super::types::{AsyncEvent, QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::{Psn, RoceRepr};
use completer::CompState;
use requester::ReqState;
pub use requester::{buffer_charge, ACK_ASK_DELAY, MAX_PKTS_PER_ACK, MAX_UNACKED_PSNS, MAX_WINDOW_PSNS, PIECED_READS};
use responder::RespState;
pub use responder::{grh_area, GRH_LEN};

/// The shortest payload lent rather than copied (rxe-spec T-36): a whole
/// packet at MTU 4096. A smaller copy costs less than the two iovecs more a
/// lent payload takes (at MTU 1024, lent 1 KiB payloads ran 64 KiB streams
/// 7–27% slower than copied ones), and a lone datagram of one iovec leaves
/// by `sendto`.
const LEND_FROM: usize = 4096;

/// Capacities fixed at QP creation (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send work requests the send queue holds.
    pub max_send_wr: u32,
    /// Receive work requests the receive queue holds.
    pub max_recv_wr: u32,
    /// Scatter/gather elements a send work request may have.
    pub max_send_sge: u32,
    /// Scatter/gather elements a receive work request may have.
    pub max_recv_sge: u32,
    /// Bytes of inline data a send work request may carry.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> QpCap {
        QpCap { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 16, max_recv_sge: 16, max_inline_data: 256 }
    }
}

/// Why a send could not be posted. Nothing was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostSendError {
    /// Sends can be posted in RTS, SQD and SQE (and ERR, where they are flushed).
    InvalidState(QpState),
    /// The send queue already holds `max_send_wr` requests.
    QueueFull {
        /// The send queue's capacity.
        max_wr: u32,
    },
    /// More scatter/gather elements than `max_send_sge`.
    TooManySge {
        /// SGEs in the request.
        given: usize,
        /// The QP's `max_send_sge`.
        max: u32,
    },
    /// More inline data than `max_inline_data`.
    InlineTooLong {
        /// Bytes of inline data in the request.
        given: usize,
        /// The QP's `max_inline_data`.
        max: u32,
    },
    /// The operation does not exist for this QP type (e.g. READ on UC).
    UnsupportedOp(QpType),
    /// UD sends need a destination; connected QPs take none.
    Destination,
    /// A UD message must fit one packet of the path MTU.
    MessageTooLong {
        /// Bytes in the message.
        len: u64,
        /// The path MTU in bytes.
        max: u64,
    },
    /// An atomic needs one SGE of exactly 8 bytes for the original value.
    AtomicSge,
    /// ATOMIC WRITE carries exactly 8 bytes, FLUSH none.
    DataLength {
        /// The operation.
        op: WcOpcode,
        /// The bytes it carries.
        len: u64,
    },
}

impl std::fmt::Display for PostSendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostSendError::InvalidState(s) => write!(f, "cannot post sends in QP state {s:?}"),
            PostSendError::QueueFull { max_wr } => write!(f, "send queue full ({max_wr} WRs)"),
            PostSendError::TooManySge { given, max } => {
                write!(f, "{given} scatter/gather elements, at most {max} allowed")
            }
            PostSendError::InlineTooLong { given, max } => {
                write!(f, "{given} bytes of inline data, at most {max} allowed")
            }
            PostSendError::UnsupportedOp(t) => write!(f, "operation not supported on {t:?} QPs"),
            PostSendError::Destination => {
                write!(f, "UD sends need an address handle; connected QPs take none")
            }
            PostSendError::MessageTooLong { len, max } => {
                write!(f, "{len}-byte UD message exceeds the path MTU of {max}")
            }
            PostSendError::AtomicSge => write!(f, "atomics need one 8-byte scatter/gather element"),
            PostSendError::DataLength { op, len } => write!(f, "{op:?} carries {len} bytes of data"),
        }
    }
}

impl std::error::Error for PostSendError {}

/// Per-QP counters, like rxe's hw_counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets handed out by [`Qp::poll_transmit`], requests and responses.
    pub sent_packets: u64,
    /// Packets fed to [`Qp::handle_packet`], including those then dropped.
    pub received_packets: u64,
    /// Go-back-N restarts (timeouts, sequence NAKs, lost READ responses).
    pub retries: u64,
    /// Local ACK timer expiries.
    pub timeouts: u64,
    /// RNR NAKs received as requester.
    pub rnr_naks_received: u64,
    /// RNR NAKs sent as responder.
    pub rnr_naks_sent: u64,
    /// PSN sequence error NAKs received as requester.
    pub seq_naks_received: u64,
    /// PSN sequence error NAKs sent as responder.
    pub seq_naks_sent: u64,
    /// Duplicate requests (PSN before the expected one) seen as responder.
    pub duplicate_requests: u64,
    /// Fatal NAKs sent as responder, by kind: invalid request, remote
    /// access error, remote operational error (and invalid RD request).
    pub fatal_naks_sent: FatalNaks,
    /// Fatal NAKs received as requester, by kind.
    pub fatal_naks_received: FatalNaks,
    /// Packets dropped: wrong state, source, Q_Key, ghost responses, UC gaps.
    pub dropped: u64,
}

/// NAKs that end a connection (class B/C errors), counted by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FatalNaks {
    /// `NAK invalid request`.
    pub invalid_request: u64,
    /// `NAK remote access error`.
    pub remote_access: u64,
    /// `NAK remote operational error` and `NAK invalid RD request`.
    pub remote_operational: u64,
}

impl FatalNaks {
    /// Counts one NAK of `code`; sequence errors are not fatal, so not counted.
    pub(crate) fn count(&mut self, code: crate::wire::NakCode) {
        use crate::wire::NakCode;
        match code {
            NakCode::InvalidRequest => self.invalid_request += 1,
            NakCode::RemoteAccessError => self.remote_access += 1,
            NakCode::RemoteOperationalError | NakCode::InvalidRdRequest => self.remote_operational += 1,
            NakCode::PsnSequenceError => {}
        }
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &FatalNaks) {
        self.invalid_request += other.invalid_request;
        self.remote_access += other.remote_access;
        self.remote_operational += other.remote_operational;
    }
}

/// Which of a QP's packets [`Qp::poll_transmit`] hands out first, when it
/// has both requests and answers to its peer's (ACKs, READ responses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransmitOrder {
    /// Answers first, so a busy requester cannot starve the peer of ACKs:
    /// the order for a driver's rounds.
    ResponsesFirst,
    /// Requests first: for the thread that just posted them, since the peer
    /// waits for the request and the answers this QP owes can trail it in
    /// the same batch.
    RequestsFirst,
    /// Answers only: for a driver that leaves the requests for later
    /// ([`Qp::unacked_awaiting_ack`]).
    ResponsesOnly,
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    qpn: u32,
    qp_type: QpType,
    pd: u32,
    cap: QpCap,
    srq: Option<u32>,
    attr: QpAttr,
    sq: VecDeque<Wqe>,
    rq: VecDeque<RecvWr>,
    req: ReqState,
    comp: CompState,
    resp: RespState,
    /// The deadlines of the roles' timers.
    timers: TimerTable,
    completions: VecDeque<(CqKind, WorkCompletion)>,
    events: VecDeque<AsyncEvent>,
    counters: Counters,
    sqd_notified: bool,
    /// Bytes the peer can hold unread, if known: the window never puts more
    /// in flight (see [`Qp::set_peer_buffer`]).
    peer_buffer: Option<usize>,
    /// Packets of path MTU that `peer_buffer` holds (`u32::MAX` where it is
    /// not known), kept as the two change: the window asks for it several
    /// times a packet, and it takes a division.
    peer_buffer_psns: u32,
    /// Destroyed, and only answering duplicates of what it executed (see
    /// [`Qp::linger`]).
    lingering: bool,
}

impl Qp {
    /// A QP in RESET. `srq` names the shared receive queue it draws receives
    /// from, if any; the caller passes that SRQ to [`Qp::handle_packet`].
    pub fn new(qpn: u32, qp_type: QpType, pd: u32, cap: QpCap, srq: Option<u32>) -> Qp {
        Qp {
            qpn,
            qp_type,
            pd,
            cap,
            srq,
            attr: QpAttr::default(),
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: ReqState::default(),
            comp: CompState::default(),
            resp: RespState::default(),
            timers: TimerTable::default(),
            completions: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
            sqd_notified: false,
            peer_buffer: None,
            peer_buffer_psns: u32::MAX,
            lingering: false,
        }
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// UD QPs take no path MTU attribute; they use the port's (as rxe), which
    /// the engine that owns the port sets here.
    pub fn set_ud_mtu(&mut self, mtu: super::attr::Mtu) {
        if self.qp_type == QpType::Ud {
            self.attr.path_mtu = mtu;
            self.count_peer_buffer();
        }
    }

    /// The transport type, fixed at creation.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.attr.state
    }

    /// The id of the SRQ this QP draws receives from, if any.
    pub fn srq(&self) -> Option<u32> {
        self.srq
    }

    /// Current attributes (`ibv_query_qp`).
    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }

    /// Packet, retry and NAK counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// `ibv_modify_qp`: validates the transition and the masked attributes,
    /// then applies them. Nothing changes when it fails.
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        let from = self.attr.state;
        let to = check_modify(self.qp_type, from, attr, mask)?;
        let a = &mut self.attr;
        let copy = |m: AttrMask| mask.contains(m);
        if copy(AttrMask::ACCESS_FLAGS) {
            a.access_flags = attr.access_flags;
        }
        if copy(AttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if copy(AttrMask::PORT) {
            a.port = attr.port;
        }
        if copy(AttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if copy(AttrMask::AV) {
            a.dest = attr.dest;
            a.peer_port = attr.peer_port;
        }
        if copy(AttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if copy(AttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if copy(AttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            self.comp.retry_left = attr.retry_cnt;
        }
        if copy(AttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            self.comp.rnr_left = attr.rnr_retry;
        }
        if copy(AttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
            self.resp.reset_psn(attr.rq_psn);
        }
        if copy(AttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
            self.req.psn = attr.sq_psn;
            self.req.sent_end = attr.sq_psn;
            self.comp.psn = attr.sq_psn;
        }
        if copy(AttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if copy(AttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if copy(AttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if copy(AttrMask::DEST_QPN) {
            a.dest_qpn = attr.dest_qpn;
        }
        if copy(AttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if copy(AttrMask::PATH_MTU) {
            self.count_peer_buffer();
        }
        debug!(qpn = self.qpn, ?from, ?to, ?mask, "modify QP");
        self.enter(to);
        Ok(())
    }

    /// RESET → INIT → RTR → RTS, from whichever of the first three states
    /// the QP is in, each step with exactly the attributes this QP type
    /// requires (what `ibv_rc_pingpong` and most programs do to connect):
    /// `attr` holds the values.
    pub fn connect(&mut self, attr: &QpAttr) -> Result<(), ModifyError> {
        let steps = [QpState::Init, QpState::Rtr, QpState::Rts];
        let first = match self.attr.state {
            QpState::Reset => 0,
            QpState::Init => 1,
            QpState::Rtr => 2,
            from => return Err(ModifyError::InvalidTransition { from, to: QpState::Rts }),
        };
        for &to in &steps[first..] {
            let from = self.attr.state;
            let (required, _) = super::attr::transition_masks(self.qp_type, from, to)
                .ok_or(ModifyError::InvalidTransition { from, to })?;
            self.modify(&QpAttr { state: to, ..*attr }, AttrMask::STATE | required)?;
        }
        Ok(())
    }

    /// Capacities the QP was created with (`ibv_query_qp`'s `cap`).
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// Who this QP's keys are checked for.
    fn key_user(&self) -> KeyUser {
        KeyUser { pd: self.pd, qpn: self.qpn }
    }

    /// Moves to `to`, doing what entering that state entails.
    fn enter(&mut self, to: QpState) {
        let from = self.attr.state;
        self.attr.state = to;
        self.attr.cur_state = to;
        match to {
            QpState::Reset => {
                let (qpn, qp_type, pd, cap, srq) = (self.qpn, self.qp_type, self.pd, self.cap, self.srq);
                let port_mtu = self.attr.path_mtu;
                *self = Qp::new(qpn, qp_type, pd, cap, srq);
                self.set_ud_mtu(port_mtu);
            }
            QpState::Err if from != QpState::Err => self.flush(),
            QpState::Sqd => self.sqd_notified = false,
            _ => {}
        }
    }

    /// Moves to ERR because of an error the QP detected, raising `event`.
    fn fail(&mut self, event: AsyncEvent) {
        if self.attr.state != QpState::Err {
            self.events.push_back(event);
            self.enter(QpState::Err);
        }
    }

    /// A UC or UD send failed locally: the send queue stops (SQE) and its
    /// other requests are flushed, while the receive side keeps working, as
    /// IBTA specifies; `modify` to RTS resumes sending.
    fn send_queue_error(&mut self) {
        self.flush_send_queue();
        self.attr.state = QpState::Sqe;
        self.attr.cur_state = QpState::Sqe;
    }

    fn flush_send_queue(&mut self) {
        for wqe in self.sq.drain(..) {
            let wc = WorkCompletion::new(wqe.wr.wr_id, self.qpn, WcStatus::WrFlushErr, wqe.wr.op.wc_opcode());
            self.completions.push_back((CqKind::Send, wc));
        }
        self.req.next = 0;
    }

    /// Completes every outstanding work request with WR_FLUSH_ERR.
    fn flush(&mut self) {
        self.flush_send_queue();
        self.req.rd_atomic = 0;
        self.timers.stop(Timer::AckTimeout);
        self.timers.stop(Timer::RnrWait);
        let in_progress = self.resp.abandon();
        for wr in in_progress.into_iter().chain(self.rq.drain(..)) {
            let wc = WorkCompletion::new(wr.wr_id, self.qpn, WcStatus::WrFlushErr, WcOpcode::Recv);
            self.completions.push_back((CqKind::Recv, wc));
        }
        if self.srq.is_some() {
            self.events.push_back(AsyncEvent::LastWqeReached { qpn: self.qpn });
        }
    }

    /// `ibv_post_send`. In ERR and SQE the request is accepted and flushed at once.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostSendError> {
        let state = self.attr.state;
        if !matches!(state, QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err) {
            return Err(PostSendError::InvalidState(state));
        }
        self.validate_send(&wr)?;
        if matches!(state, QpState::Err | QpState::Sqe) {
            let wc = WorkCompletion::new(wr.wr_id, self.qpn, WcStatus::WrFlushErr, wr.op.wc_opcode());
            self.completions.push_back((CqKind::Send, wc));
            return Ok(());
        }
        self.sq.push_back(Wqe::new(wr));
        Ok(())
    }

    fn validate_send(&self, wr: &SendWr) -> Result<(), PostSendError> {
        if self.sq.len() >= self.cap.max_send_wr as usize {
            return Err(PostSendError::QueueFull { max_wr: self.cap.max_send_wr });
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(PostSendError::TooManySge { given: wr.sg_list.len(), max: self.cap.max_send_sge });
        }
        // An ATOMIC WRITE's 8 bytes may ride inline whatever the cap
        // (`ibv_wr_atomic_write` copies them at post, as rxe's provider does).
        let capped = !matches!(wr.op, SendOp::AtomicWrite { .. });
        if capped && wr.flags.inline && wr.inline_data.len() > self.cap.max_inline_data as usize {
            return Err(PostSendError::InlineTooLong { given: wr.inline_data.len(), max: self.cap.max_inline_data });
        }
        let supported = match self.qp_type {
            QpType::Rc => true,
            // UC has no SEND_WITH_INVALIDATE opcodes, and binds windows but
            // invalidates none (rxe's opcode table).
            QpType::Uc => !wr.op.counts_rd_atomic() && !matches!(wr.op, SendOp::SendWithInv(_) | SendOp::LocalInv(_)),
            QpType::Ud => matches!(wr.op, SendOp::Send | SendOp::SendWithImm(_)),
        };
        if !supported {
            return Err(PostSendError::UnsupportedOp(self.qp_type));
        }
        if (self.qp_type == QpType::Ud) != wr.ud.is_some() {
            return Err(PostSendError::Destination);
        }
        let mtu = self.attr.path_mtu.bytes() as u64;
        if self.qp_type == QpType::Ud && wr.length() > mtu {
            return Err(PostSendError::MessageTooLong { len: wr.length(), max: mtu });
        }
        if wr.op.is_atomic() && (wr.sg_list.len() != 1 || wr.sg_list[0].length != 8) {
            return Err(PostSendError::AtomicSge);
        }
        let data_len = match wr.op {
            SendOp::AtomicWrite { .. } => Some(8),
            SendOp::Flush { .. } => Some(0),
            _ => None,
        };
        if let Some(len) = data_len.filter(|&len| wr.length() != len) {
            return Err(PostSendError::DataLength { op: wr.op.wc_opcode(), len });
        }
        Ok(())
    }

    /// `ibv_post_recv`. In ERR the request is accepted and flushed at once.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostRecvError> {
        if self.srq.is_some() || self.attr.state == QpState::Reset {
            return Err(PostRecvError::InvalidState);
        }
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(PostRecvError::TooManySge { given: wr.sg_list.len(), max: self.cap.max_recv_sge });
        }
        if self.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(PostRecvError::QueueFull { max_wr: self.cap.max_recv_wr });
        }
        if self.attr.state == QpState::Err {
            let wc = WorkCompletion::new(wr.wr_id, self.qpn, WcStatus::WrFlushErr, WcOpcode::Recv);
            self.completions.push_back((CqKind::Recv, wc));
            return Ok(());
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// The next completion, in the order the QP produced them.
    pub fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        self.completions.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// Feeds one received packet addressed to this QP. `srq` must be the SRQ
    /// this QP was created with, if any.
    pub fn handle_packet(&mut self, now: Duration, pkt: Incoming<'_>, mem: &mut dyn Memory, srq: Option<&mut Srq>) {
        let _span = tracing::trace_span!("qp", qpn = self.qpn).entered();
        let bth = &pkt.header.bth;
        tracing::trace!(opcode = %bth.opcode, psn = bth.psn.value(), len = pkt.payload.len(), src = %pkt.src, "rx");
        self.counters.received_packets += 1;
        // Only the default partition exists: P_Key 0x7fff, full or limited
        // member (rxe's pkey_match against 0xffff).
        if bth.pkey & 0x7fff != 0x7fff {
            self.counters.dropped += 1;
            return;
        }
        if pkt.header.bth.opcode.operation().is_request() {
            self.handle_request(pkt, mem, srq);
        } else {
            self.handle_response(now, pkt, mem);
        }
    }

    /// Whether a packet for this connected QP comes from its peer: the peer's
    /// address, and its source port when one was configured.
    fn is_from_peer(&self, pkt: &Incoming<'_>) -> bool {
        Some(pkt.src) == self.attr.dest && self.attr.peer_port.is_none_or(|port| port == pkt.src_port)
    }

    /// Writes the next packet to send into `buf` (which must hold the path
    /// MTU plus [`TRANSMIT_HEADROOM`] bytes; a smaller one yields nothing)
    /// and says where it goes; `order` says whether requests or answers go
    /// first.
    pub fn poll_transmit(
        &mut self,
        now: Duration,
        mem: &mut dyn Memory,
        buf: &mut [u8],
        order: TransmitOrder,
    ) -> Option<Transmit> {
        let needed = self.attr.path_mtu.bytes() + TRANSMIT_HEADROOM;
        if buf.len() < needed {
            tracing::warn!(qpn = self.qpn, needed, got = buf.len(), "transmit buffer too small");
            return None;
        }
        let _span = tracing::trace_span!("qp", qpn = self.qpn).entered();
        let tx = match order {
            TransmitOrder::ResponsesFirst => {
                self.next_response(mem, buf).or_else(|| self.next_request(now, mem, buf))?
            }
            TransmitOrder::RequestsFirst => {
                self.next_request(now, mem, buf).or_else(|| self.next_response(mem, buf))?
            }
            TransmitOrder::ResponsesOnly => self.next_response(mem, buf)?,
        };
        self.counters.sent_packets += 1;
        if tracing::enabled!(tracing::Level::TRACE) {
            if let Ok(sent) = RoceRepr::parse(&buf[..tx.len]) {
                let bth = sent.header.bth;
                tracing::trace!(opcode = %bth.opcode, psn = bth.psn.value(), len = sent.payload.len(), dest = %tx.dest, "tx");
            }
        }
        Some(tx)
    }

    /// The application destroyed this QP: it completes and executes nothing
    /// more, but an RC QP still answers a duplicate of a SEND or WRITE it
    /// executed with the ACK it had sent, in case that ACK was lost (the way
    /// TCP's TIME_WAIT answers a resent FIN). Without it a peer whose last
    /// message's ACK was lost resends it to nobody until its retries run
    /// out (rxe, which treats 7 as infinite, until forever). Nothing else is
    /// answered: not a new request, not a READ or atomic, whose memory may
    /// be gone with the QP.
    pub fn linger(&mut self) {
        self.lingering = true;
    }

    /// Whether [`Qp::linger`] was called.
    pub fn is_lingering(&self) -> bool {
        self.lingering
    }

    /// Sets the bytes the peer can hold unread: the RC window then never puts
    /// more packets in flight than fit, whatever it has grown to. A peer on a
    /// UDP socket drops what overflows its receive buffer, which a non-root
    /// process cannot raise above `net.core.rmem_max` (208 KiB on many
    /// distributions, against rxe's 128 PSNs of 4 KiB), and each drop costs a
    /// go-back. softroce's engine passes each QP with packets in flight a
    /// share of the device's budget (rxe-spec T-7a), at most its own
    /// socket's buffer (the peer's where both ends run on one host); rxe's
    /// receive path has no such limit, so the estimate is only cautious
    /// there.
    pub fn set_peer_buffer(&mut self, bytes: Option<usize>) {
        if bytes != self.peer_buffer {
            self.peer_buffer = bytes;
            self.count_peer_buffer();
        }
    }

    /// Recounts `peer_buffer_psns` after the buffer or the path MTU changed.
    fn count_peer_buffer(&mut self) {
        self.peer_buffer_psns = self.peer_buffer.map_or(u32::MAX, |bytes| {
            u32::try_from(bytes / buffer_charge(self.attr.path_mtu.bytes())).unwrap_or(u32::MAX)
        });
    }

    /// Lets an RC requester put `packets` more new packets on the wire
    /// (`None`: no limit), the last of them asking for an ACK, and then
    /// wait until the driver gives it another turn; resends and responses
    /// are never held. A driver whose QPs share one receive buffer at their
    /// peers takes turns with it when they want more in flight than the
    /// buffer holds (rxe-spec T-7a).
    pub fn set_allowance(&mut self, packets: Option<u32>) {
        self.req.allowance = packets;
    }

    /// What is left of the turn [`Qp::set_allowance`] gave.
    pub fn allowance(&self) -> Option<u32> {
        self.req.allowance
    }

    /// Request packets on the wire and not yet acknowledged (RC; 0 for
    /// other QPs and once the QP is in error, whose sends are flushed).
    pub fn packets_in_flight(&self) -> u32 {
        if self.qp_type != QpType::Rc || !matches!(self.attr.state, QpState::Rts | QpState::Sqd) {
            return 0;
        }
        self.req.sent_end.diff(self.comp.psn).max(0) as u32
    }

    /// Whether the last round trip timed took at most a quarter of the ACK
    /// timeout (rxe-spec T-7; `None` before one was timed): a slower peer
    /// is sent no more than rxe's window, and a driver sends it no more
    /// than that in all (T-7a).
    pub fn peer_is_fast(&self) -> Option<bool> {
        self.req.fast_peer
    }

    /// Whether request packets are in flight after the last one that asked
    /// for an ACK: stopped now, the QP would wait for its ACK timeout (or
    /// the ask of T-6 at a message's end).
    pub fn has_unasked_in_flight(&self) -> bool {
        let last = self.req.sent_end.wrapping_sub(1);
        self.packets_in_flight() > 0 && self.req.ack_asked.is_none_or(|asked| asked.is_before(last))
    }

    /// New packets the RC window lets out now (`u32::MAX` for other QPs).
    pub fn window_space(&self) -> u32 {
        if self.qp_type != QpType::Rc {
            return u32::MAX;
        }
        self.window().saturating_sub(self.packets_in_flight())
    }

    /// PSNs handed out to requests and not yet acknowledged, when an ACK
    /// is on its way for some of them (a packet that asked for one is
    /// unacknowledged): the ACK's arrival will open the window again, so a
    /// driver may leave new requests to go with the packets it lets out.
    pub fn unacked_awaiting_ack(&self) -> Option<u32> {
        let asked = self.req.ack_asked?;
        let pending =
            self.qp_type == QpType::Rc && !self.comp.psn.is_after(asked) && self.timers.is_armed(Timer::AckTimeout);
        pending.then(|| self.req.psn.diff(self.comp.psn).max(0) as u32)
    }

    /// Packets of the posted requests not sent yet, counted up to `up_to`.
    pub fn unsent_packets(&self, up_to: u32) -> u32 {
        let mtu = self.attr.path_mtu.bytes() as u64;
        let mut unsent = 0u32;
        for wqe in self.sq.iter().skip(self.req.next) {
            if unsent >= up_to {
                break;
            }
            let packets = if wqe.wr.op.is_read_or_atomic() { 1 } else { wqe.wr.length().div_ceil(mtu).max(1) };
            let packets = u32::try_from(packets).unwrap_or(u32::MAX);
            unsent = unsent.saturating_add(packets.saturating_sub(wqe.next_pkt));
        }
        unsent.min(up_to)
    }

    /// The earliest time [`Qp::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.timers.next()
    }

    /// Handles every timer due at `now`: the end of an RNR wait, the local
    /// ACK timeout, an ACK to ask for.
    pub fn handle_timeout(&mut self, now: Duration) {
        for timer in Timer::ALL {
            if self.timers.expire(timer, now) {
                match timer {
                    Timer::RnrWait => self.end_rnr_wait(),
                    Timer::AckTimeout => self.on_ack_timeout(now),
                    Timer::AskForAck => self.ask_for_ack(),
                }
            }
        }
    }

    /// The local ACK timeout: 4.096 µs × 2^timeout, at least
    /// [`MIN_ACK_TIMEOUT`], or none for 0.
    pub(crate) fn ack_timeout(&self) -> Option<Duration> {
        match self.attr.timeout {
            0 => None,
            t => Some(Duration::from_nanos(4096u64 << t).max(MIN_ACK_TIMEOUT)),
        }
    }

    /// Arms the local ACK timer a full timeout from `now` (none where the
    /// timeout is infinite).
    fn restart_ack_timer(&mut self, now: Duration) {
        match self.ack_timeout() {
            Some(timeout) => self.timers.set(Timer::AckTimeout, now + timeout),
            None => self.timers.stop(Timer::AckTimeout),
        }
    }

    fn complete_send(&mut self, wqe: &Wqe, status: WcStatus) {
        if status != WcStatus::Success || wqe.wr.flags.signaled {
            let mut wc = WorkCompletion::new(wqe.wr.wr_id, self.qpn, status, wqe.wr.op.wc_opcode());
            if status == WcStatus::Success {
                wc.byte_len = wqe.wr.length() as u32;
            }
            self.completions.push_back((CqKind::Send, wc));
        }
    }

    /// The WQE that holds `psn`, by index in the send queue.
    fn wqe_index_of(&self, psn: Psn) -> Option<usize> {
        self.sq.iter().position(|w| w.psn.is_some_and(|r| r.contains(psn)))
    }

    /// SQD: once nothing is in flight, say so (if asked to) once.
    fn check_sq_drained(&mut self) {
        if self.attr.state == QpState::Sqd && !self.sqd_notified && self.sq.iter().all(|w| w.psn.is_none()) {
            self.sqd_notified = true;
            if self.attr.en_sqd_async_notify {
                self.events.push_back(AsyncEvent::SqDrained { qpn: self.qpn });
            }
        }
    }
}
