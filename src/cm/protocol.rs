//! The IB Communication Manager (IBTA chapter 12) as a sans-IO state machine,
//! in the manner of `quinn-proto` and of [`crate::transport`]: no sockets, no
//! clock, no threads. The caller hands in received MADs and the time, and
//! takes out MADs to send, events and the next deadline:
//!
//! ```text
//!   handle_mad(now, from, mad) ─┐                 ┌─> poll_transmit() -> Transmit { to, mad }
//!   handle_timeout(now) ────────┼──> Protocol ────┼─> poll_event()    -> Event
//!   connect / accept / ... ─────┘                 └─> poll_timeout()  -> Instant
//! ```
//!
//! It behaves as the Linux kernel's `ib_cm` (`drivers/infiniband/core/cm.c`)
//! does under `rdma_cm` (`cma.c`), so that either end may be a kernel:
//! the same messages in the same transactions, the same retries and waits,
//! the same answers to repeats, strays and requests nobody listens for.
//! Where it differs, rxe-spec/cm.md says so (M-20 onward).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use crate::transport::{Mtu, QpType};
use crate::verbs::Gid;
use crate::wire::cm::{
    attr, private_data, timeout_nanos, CmPathRepr, DrepRepr, DreqRepr, MessageRef, MraRepr, RejReason, RejRepr,
    RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, SidrStatus, TransportService, ARI_LEN, DREP_PRIVATE_DATA_LEN,
    DREQ_PRIVATE_DATA_LEN, MRA_PRIVATE_DATA_LEN, REJ_PRIVATE_DATA_LEN, SIDR_INFO_LEN, SIDR_REP_PRIVATE_DATA_LEN,
};
use crate::wire::mad::{method, MAD_LEN};
use crate::wire::{CmMad, CmMessage, Psn};

/// Our local communication ID (for SIDR: our request ID). Its top byte is
/// [`ProtocolConfig::slot`], so that answers reach this process when several
/// share a port.
pub type CommId = u32;

/// How a [`Protocol`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolConfig {
    /// Top byte of every local Comm ID and SIDR request ID.
    pub slot: u8,
    /// Our CA GUID (the device's node GUID), sent in REQ and REP.
    pub local_ca_guid: u64,
    /// Most IDs alive at once, so that a flood of requests cannot grow the
    /// table without bound.
    pub max_connections: usize,
    /// The CM response timeout code we advertise (kernel rdma_cm: 20).
    pub response_timeout: u8,
    /// How often a REQ, REP, DREQ or SIDR_REQ is resent (kernel rdma_cm: 15).
    pub max_cm_retries: u8,
}

/// Where a MAD came from or goes to: the peer's GID (the GRH source; an
/// IPv4-mapped address for RoCEv2 over IPv4) and its GSI QPN (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadPeer {
    /// The peer port's GID.
    pub gid: Gid,
    /// The peer's GSI QP number.
    pub qpn: u32,
}

/// What the active side asks for, filled by the rdma_cm layer from the route
/// and the QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Where the REQ goes.
    pub peer: MadPeer,
    /// The service the peer listens on.
    pub service_id: u64,
    /// The primary path's source GID.
    pub local_gid: Gid,
    /// Our QP.
    pub qpn: u32,
    /// [`QpType::Rc`] or [`QpType::Uc`].
    pub qp_type: QpType,
    /// The PSN our QP expects to receive first.
    pub starting_psn: Psn,
    /// The path MTU.
    pub path_mtu: Mtu,
    /// RDMA READs and atomics we accept at once as responder.
    pub responder_resources: u8,
    /// RDMA READs and atomics we issue at once.
    pub initiator_depth: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits; 7 is infinite).
    pub rnr_retry_count: u8,
    /// The local ACK timeout code of the primary path.
    pub local_ack_timeout: u8,
    /// Whether our QP receives from an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Primary path traffic class.
    pub traffic_class: u8,
    /// Primary path hop limit.
    pub hop_limit: u8,
    /// Primary path flow label (20 bits).
    pub flow_label: u32,
    /// The partition key.
    pub pkey: u16,
    /// The whole private data (CMA header included), at most 92 bytes.
    pub private_data: Vec<u8>,
}

/// What the passive side answers a REQ with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectReply {
    /// Our QP.
    pub qpn: u32,
    /// The PSN our QP expects to receive first.
    pub starting_psn: Psn,
    /// RDMA READs and atomics we accept at once as responder.
    pub responder_resources: u8,
    /// RDMA READs and atomics we issue at once.
    pub initiator_depth: u8,
    /// RNR retries the peer's QP should use (3 bits).
    pub rnr_retry_count: u8,
    /// Whether our QP receives from an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Private data, at most 196 bytes.
    pub private_data: Vec<u8>,
}

/// A service ID resolution request (UD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRequest {
    /// Where the SIDR_REQ goes.
    pub peer: MadPeer,
    /// The service to resolve.
    pub service_id: u64,
    /// The partition key.
    pub pkey: u16,
    /// Private data (CMA header included), at most 216 bytes.
    pub private_data: Vec<u8>,
}

/// The answer to a SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReply {
    /// Whether the service is there.
    pub status: SidrStatus,
    /// The UD QP serving it.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// Private data, at most 136 bytes.
    pub private_data: Vec<u8>,
}

/// A MAD to send.
#[derive(Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub to: MadPeer,
    /// The whole 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

impl fmt::Debug for Transmit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transmit").field("to", &self.to).field("attribute", &[self.mad[16], self.mad[17]]).finish()
    }
}

/// Everything the protocol tells its user. `id` is always our [`CommId`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A REQ for a listened service: answer with [`Protocol::accept`] or
    /// [`Protocol::reject`].
    Request {
        /// The new ID.
        id: CommId,
        /// Where the REQ came from.
        peer: MadPeer,
        /// The REQ.
        req: ReqRepr,
    },
    /// Our REQ was answered: move the QP to RTR and RTS, then call
    /// [`Protocol::ready_to_use`] (or [`Protocol::reject`]).
    Reply {
        /// Our ID.
        id: CommId,
        /// The REP.
        rep: RepRepr,
    },
    /// The RTU arrived (passive side): the connection is established.
    Established {
        /// Our ID.
        id: CommId,
    },
    /// A REJ arrived, or our REQ or REP went unanswered through every retry
    /// (reason TIMEOUT, `timed_out`). The ID is gone; or, if the REJ came
    /// once REPs were exchanged, it waits out TimeWait ([`Event::TimewaitExit`]).
    Rejected {
        /// Our ID.
        id: CommId,
        /// The REJ's reason.
        reason: RejReason,
        /// Whether we gave up waiting rather than being rejected.
        timed_out: bool,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// A DREQ arrived: call [`Protocol::disconnect`] to answer it.
    DisconnectRequest {
        /// Our ID.
        id: CommId,
        /// The DREQ's private data.
        private_data: Vec<u8>,
    },
    /// A DREP arrived, or our DREQ went unanswered: the connection is down
    /// and the ID waits out TimeWait.
    Disconnected {
        /// Our ID.
        id: CommId,
    },
    /// TimeWait is over: the ID is gone.
    TimewaitExit {
        /// Our ID.
        id: CommId,
    },
    /// A SIDR_REQ for a listened service: answer with [`Protocol::sidr_reply`].
    SidrRequest {
        /// The new ID.
        id: CommId,
        /// Where it came from.
        peer: MadPeer,
        /// The SIDR_REQ.
        req: SidrReqRepr,
    },
    /// The SIDR_REP to our SIDR_REQ. The ID is gone.
    SidrReply {
        /// Our request ID.
        id: CommId,
        /// The SIDR_REP.
        rep: SidrRepRepr,
    },
    /// Our SIDR_REQ went unanswered through every retry. The ID is gone.
    SidrTimeout {
        /// Our request ID.
        id: CommId,
    },
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// The ID is not in a state where the call makes sense.
    InvalidState,
    /// No such ID.
    UnknownId,
    /// Somebody already listens on the service.
    AddrInUse,
    /// The ID table is full.
    NoResources,
    /// An argument does not fit its field.
    InvalidArgument(&'static str),
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::InvalidState => f.write_str("the ID is not in a state for this"),
            CmError::UnknownId => f.write_str("no such communication ID"),
            CmError::AddrInUse => f.write_str("the service is already listened on"),
            CmError::NoResources => f.write_str("too many communication IDs"),
            CmError::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
        }
    }
}

impl std::error::Error for CmError {}

/// Messages counted by kind, in attribute order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageCounts {
    /// REQ.
    pub req: u64,
    /// MRA.
    pub mra: u64,
    /// REJ.
    pub rej: u64,
    /// REP.
    pub rep: u64,
    /// RTU.
    pub rtu: u64,
    /// DREQ.
    pub dreq: u64,
    /// DREP.
    pub drep: u64,
    /// SIDR_REQ.
    pub sidr_req: u64,
    /// SIDR_REP.
    pub sidr_rep: u64,
}

/// Counters, as the kernel's `cm_tx_msgs`, `cm_tx_retries`, `cm_rx_msgs`,
/// `cm_rx_duplicates`, and what was dropped and why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProtocolStats {
    /// Messages sent, first transmissions and answers.
    pub sent: MessageCounts,
    /// Messages sent again by a retry timer.
    pub retransmitted: MessageCounts,
    /// Messages received and parsed.
    pub received: MessageCounts,
    /// Received messages that repeated one already handled.
    pub duplicates: MessageCounts,
    /// MADs dropped unparsed: truncated, not the CM class version 2, not a
    /// Send, an attribute not handled, a reserved value.
    pub malformed: u64,
    /// Messages dropped for naming no live ID, or one whose state does not
    /// expect them.
    pub unmatched: u64,
    /// REQs and SIDR_REQs dropped for a full backlog or ID table.
    pub refused: u64,
    /// REJs and SIDR_REPs ("unsupported") we sent for requests nobody
    /// listens for.
    pub rejected: u64,
    /// REQs, REPs, DREQs and SIDR_REQs given up on after every retry.
    pub timed_out: u64,
    /// Passive connections established by traffic on their QP, their RTU
    /// lost ([`Protocol::communication_established`]).
    pub established_by_traffic: u64,
    /// Transmits or events dropped because the user did not take them.
    pub queue_overflows: u64,
    /// IDs alive now.
    pub live_ids: usize,
}

/// How long a peer may wait for us after our MRA: 4.096 µs × 2^24 ≈ 69 s,
/// the kernel's `CM_MRA_SETTING`.
const MRA_SERVICE_TIMEOUT: u8 = 24;

/// The target ACK delay a REP announces: rxe's local CA ACK delay
/// (`RXE_LOCAL_CA_ACK_DELAY`), which the kernel's cm copies from the device.
const TARGET_ACK_DELAY: u8 = 15;

/// The high half of our transaction IDs: the kernel puts its MAD agent's
/// number there; ours is the first agent's.
const TID_AGENT: u64 = 1 << 32;

/// Comm IDs carry the slot in their top byte and a counter in the other 24
/// bits, so at most this many can be alive at once.
const COMM_IDS_PER_SLOT: usize = (1 << 24) - 1;

/// Queued transmits and events beyond this many per allowed ID are dropped
/// (and counted): a user that stops polling cannot make us grow.
const QUEUED_PER_ID: usize = 4;

/// Where an ID is in the IB CM's state machine (the kernel's `ib_cm_state`,
/// less IDLE and LISTEN, which are not table entries here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: our REQ is out; it is resent until a REP, REJ or MRA comes.
    ReqSent,
    /// Active: the peer sent an MRA for our REQ: we wait as long as it asked.
    MraReqRcvd,
    /// Active: the REP came and the consumer readies its QP. Like the
    /// kernel's rdma_cm we have "prepared an MRA": a repeated REP gets one.
    RepRcvd,
    /// Passive: a REQ came and the consumer decides. A repeated REQ gets an
    /// MRA (the kernel's rdma_cm prepares one for every REQ).
    ReqRcvd,
    /// Passive: our REP is out; it is resent until the RTU comes.
    RepSent,
    /// Passive: the peer sent an MRA for our REP.
    MraRepRcvd,
    /// Both sides: the RTU went or came.
    Established,
    /// Our DREQ is out; it is resent until the DREP comes.
    DreqSent,
    /// The peer's DREQ came; the consumer's `disconnect` answers it.
    DreqRcvd,
    /// Disconnected: the ID lingers to answer repeated DREQs, then goes.
    TimeWait,
    /// Our SIDR_REQ is out; it is resent until the SIDR_REP comes.
    SidrReqSent,
    /// A SIDR_REQ came; the consumer's `sidr_reply` answers it.
    SidrReqRcvd,
}

/// One live Comm ID or SIDR request ID.
#[derive(Debug)]
struct Connection {
    state: State,
    /// Where its messages go.
    peer: MadPeer,
    /// The transaction our messages carry: our own for REQ, RTU, DREQ and
    /// SIDR_REQ; the peer's REQ's for REP, MRA, REJ; the peer's DREQ's for DREP.
    tid: u64,
    /// The peer's Comm ID, 0 until known (the active side learns it from the REP).
    remote_comm_id: u32,
    /// The peer's CA GUID, 0 until known.
    remote_ca_guid: u64,
    /// Our QP: a DREQ must name it.
    local_qpn: u32,
    /// The peer's QP: our DREQ names it.
    remote_qpn: u32,
    /// The service it was requested for (a SIDR_REP repeats it).
    service_id: u64,
    /// How long the peer may take to answer a REQ, REP or DREQ of ours (the
    /// kernel's `timeout_ms`).
    response_time: Duration,
    /// How long the timer waits before resending: `response_time`, or
    /// longer once the peer sent an MRA for the message.
    retry_wait: Duration,
    /// The path's local ACK timeout code: TimeWait and an MRA's extra wait
    /// are counted from it, as the kernel counts them from the path's.
    ack_timeout: u8,
    /// Resends left for `resend`.
    retries_left: u8,
    /// When the timer fires: a resend, a give-up or the end of TimeWait.
    deadline: Option<Instant>,
    /// The message the timer resends: REQ, REP, DREQ or SIDR_REQ.
    resend: Option<[u8; MAD_LEN]>,
    /// The answer a repeated message gets again: the RTU for a repeated REP,
    /// the DREP for a repeated DREQ.
    answer: Option<[u8; MAD_LEN]>,
    /// The listened service whose backlog this unanswered request counts against.
    backlog_of: Option<u64>,
    /// The consumer destroyed it: it only lingers, and reports nothing.
    orphaned: bool,
    /// The DREQ it was destroyed with or after, until a DREP answers it:
    /// the kernel sends it no more, but a process about to exit sends it
    /// again ([`Protocol::resend_unanswered`]).
    dreq_unanswered: Option<[u8; MAD_LEN]>,
}

impl Connection {
    /// A connection in `state` with `peer`, under transaction `tid`, for
    /// `service_id`; nothing else known yet, no timer, nothing to resend.
    fn new(state: State, peer: MadPeer, tid: u64, service_id: u64) -> Connection {
        Connection {
            state,
            peer,
            tid,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            local_qpn: 0,
            remote_qpn: 0,
            service_id,
            response_time: Duration::ZERO,
            retry_wait: Duration::ZERO,
            ack_timeout: 0,
            retries_left: 0,
            deadline: None,
            resend: None,
            answer: None,
            backlog_of: None,
            orphaned: false,
            dreq_unanswered: None,
        }
    }
}

/// A listened service.
#[derive(Debug, Clone, Copy)]
struct Listener {
    /// Most requests unanswered at once.
    backlog: usize,
    /// Requests unanswered now.
    pending: usize,
}

/// The communication manager of one verbs context: every Comm ID and SIDR
/// request ID of the context, and the services it listens on.
///
/// State is bounded: at most [`ProtocolConfig::max_connections`] IDs, each
/// listener's backlog of unanswered requests, and queues of a few transmits
/// and events per ID. Whatever arrives beyond is dropped and counted.
#[derive(Debug)]
pub struct Protocol {
    config: ProtocolConfig,
    /// Most IDs alive at once.
    capacity: usize,
    /// The low 24 bits of the next Comm ID to try.
    next_id: u32,
    ids: HashMap<CommId, Connection>,
    /// The peer's Comm ID and CA GUID → ours: finds repeated REQs, and the
    /// target of a REJ(TIMEOUT), which names only those.
    by_remote: HashMap<(u32, u64), CommId>,
    /// The peer's request ID and GID → ours, for SIDR_REQs being answered:
    /// finds repeated SIDR_REQs.
    sidr_by_remote: HashMap<(u32, Gid), CommId>,
    /// The peer's QPN and CA GUID → ours, for connections short of
    /// TimeWait: a REQ or REP from a QP still connected here is stale.
    by_remote_qpn: HashMap<(u32, u64), CommId>,
    listeners: HashMap<u64, Listener>,
    /// Every armed deadline, earliest first.
    timers: BTreeSet<(Instant, CommId)>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: ProtocolStats,
    /// IDs with a DREQ no DREP answered yet after their consumer destroyed
    /// them ([`Protocol::resend_unanswered`]).
    unanswered: usize,
}

impl Protocol {
    /// A protocol with no IDs; `random` picks where Comm IDs start counting.
    pub fn new(config: ProtocolConfig, random: u32) -> Protocol {
        Protocol {
            capacity: config.max_connections.min(COMM_IDS_PER_SLOT),
            config,
            next_id: random & 0x00ff_ffff,
            ids: HashMap::new(),
            by_remote: HashMap::new(),
            sidr_by_remote: HashMap::new(),
            by_remote_qpn: HashMap::new(),
            listeners: HashMap::new(),
            timers: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: ProtocolStats::default(),
            unanswered: 0,
        }
    }

    /// Takes REQs and SIDR_REQs for `service_id`, at most `backlog`
    /// unanswered at once (0: as many as the ID table holds).
    pub fn listen(&mut self, service_id: u64, backlog: u32) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::AddrInUse);
        }
        let backlog = match usize::try_from(backlog) {
            Ok(0) | Err(_) => self.capacity,
            Ok(n) => n.min(self.capacity),
        };
        self.listeners.insert(service_id, Listener { backlog, pending: 0 });
        Ok(())
    }

    /// Stops taking requests for `service_id`; requests already taken stay.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// Sends a REQ; the answer comes as [`Event::Reply`] or [`Event::Rejected`].
    pub fn connect(&mut self, now: Instant, req: ConnectRequest) -> Result<CommId, CmError> {
        let transport_service = match req.qp_type {
            QpType::Rc => TransportService::Rc,
            QpType::Uc => TransportService::Uc,
            QpType::Ud => return Err(CmError::InvalidArgument("a UD QP connects by SIDR")),
        };
        let private_data = private_data(&req.private_data).map_err(|_| CmError::InvalidArgument("private data"))?;
        let id = self.allocate_id()?;
        // The kernel leaves LIDs to the routed path (0xffff) unless the peer
        // is one hop away, and marks only such paths subnet-local.
        let one_hop = req.hop_limit <= 1;
        let message = ReqRepr {
            local_comm_id: id,
            vendor_id: 0,
            service_id: req.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: 0,
            local_qpn: req.qpn,
            responder_resources: req.responder_resources,
            local_eecn: 0,
            initiator_depth: req.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.config.response_timeout,
            transport_service,
            end_to_end_flow_control: req.flow_control,
            starting_psn: req.starting_psn,
            local_cm_response_timeout: self.config.response_timeout,
            retry_count: req.retry_count,
            pkey: req.pkey,
            path_mtu: req.path_mtu as u8,
            rdc_exists: false,
            rnr_retry_count: req.rnr_retry_count,
            max_cm_retries: self.config.max_cm_retries,
            srq: req.srq,
            extended_transport_type: 0,
            primary_path: CmPathRepr {
                local_lid: if one_hop { 0 } else { PERMISSIVE_LID },
                remote_lid: if one_hop { 0 } else { PERMISSIVE_LID },
                local_gid: req.local_gid.to_bytes(),
                remote_gid: req.peer.gid.to_bytes(),
                flow_label: req.flow_label,
                packet_rate: 0,
                traffic_class: req.traffic_class,
                hop_limit: req.hop_limit,
                sl: 0,
                subnet_local: one_hop,
                local_ack_timeout: req.local_ack_timeout,
            },
            alternate_path: CmPathRepr::default(),
            sap_supported: false,
            private_data,
        };
        let tid = own_tid(id);
        let mad = build(tid, CmMessage::Req(message))?;
        // The kernel's REQ timeout: the peer's response time plus a round
        // trip of two packet lifetimes (the ACK timeout is one lifetime, doubled).
        let response_time = cm_time(self.config.response_timeout) + cm_time(req.local_ack_timeout);
        let connection = Connection {
            local_qpn: req.qpn,
            ack_timeout: req.local_ack_timeout,
            ..Connection::new(State::ReqSent, req.peer, tid, req.service_id)
        };
        Ok(self.open_request(now, id, connection, mad, response_time))
    }

    /// Files our new request `id` and sends its first message, `mad`, which
    /// the timer resends every `response_time` until an answer comes.
    fn open_request(
        &mut self,
        now: Instant,
        id: CommId,
        connection: Connection,
        mad: [u8; MAD_LEN],
        response_time: Duration,
    ) -> CommId {
        let peer = connection.peer;
        let retries_left = self.config.max_cm_retries;
        let connection =
            Connection { response_time, retry_wait: response_time, retries_left, resend: Some(mad), ..connection };
        self.ids.insert(id, connection);
        self.transmit(peer, mad);
        self.set_deadline(id, Some(now + response_time));
        id
    }

    /// Answers an [`Event::Request`] with a REP, resent until the RTU comes.
    pub fn accept(&mut self, now: Instant, id: CommId, rep: ConnectReply) -> Result<(), CmError> {
        let private_data = private_data(&rep.private_data).map_err(|_| CmError::InvalidArgument("private data"))?;
        let connection = self.ids.get(&id).ok_or(CmError::UnknownId)?;
        if connection.state != State::ReqRcvd {
            return Err(CmError::InvalidState);
        }
        let message = RepRepr {
            local_comm_id: id,
            remote_comm_id: connection.remote_comm_id,
            local_qkey: 0,
            local_qpn: rep.qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: rep.starting_psn,
            responder_resources: rep.responder_resources,
            initiator_depth: rep.initiator_depth,
            target_ack_delay: TARGET_ACK_DELAY,
            failover_accepted: 0,
            end_to_end_flow_control: rep.flow_control,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
            local_ca_guid: self.config.local_ca_guid,
            private_data,
        };
        let mad = build(connection.tid, CmMessage::Rep(message))?;
        let peer = connection.peer;
        let deadline = now + connection.response_time;
        let connection = self.ids.get_mut(&id).ok_or(CmError::UnknownId)?;
        connection.state = State::RepSent;
        connection.local_qpn = rep.qpn;
        connection.resend = Some(mad);
        self.release_backlog(id);
        self.transmit(peer, mad);
        self.set_deadline(id, Some(deadline));
        Ok(())
    }

    /// Answers an [`Event::Reply`] with an RTU: the connection is established.
    pub fn ready_to_use(&mut self, _now: Instant, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let data = wire_private_data(private_data)?;
        let connection = self.ids.get_mut(&id).ok_or(CmError::UnknownId)?;
        if connection.state != State::RepRcvd {
            return Err(CmError::InvalidState);
        }
        let message = RtuRepr { local_comm_id: id, remote_comm_id: connection.remote_comm_id, private_data: data };
        let mad = build(connection.tid, CmMessage::Rtu(message))?;
        connection.state = State::Established;
        connection.answer = Some(mad);
        let peer = connection.peer;
        self.transmit(peer, mad);
        Ok(())
    }

    /// Refuses the peer's REQ or REP, or withdraws our REQ, with a REJ. The
    /// ID is gone at once, or after TimeWait if the peer may already hold a
    /// REP of ours.
    pub fn reject(&mut self, now: Instant, id: CommId, reason: RejReason, private_data: &[u8]) -> Result<(), CmError> {
        let data = wire_private_data(private_data)?;
        let state = self.ids.get(&id).ok_or(CmError::UnknownId)?.state;
        match state {
            State::ReqSent | State::MraReqRcvd | State::ReqRcvd | State::RepRcvd => {
                self.send_rej(id, reason, &[], data);
                self.remove(id);
            }
            State::RepSent | State::MraRepRcvd => {
                self.send_rej(id, reason, &[], data);
                self.enter_timewait(now, id);
            }
            _ => return Err(CmError::InvalidState),
        }
        Ok(())
    }

    /// Sends a DREQ, resent until the DREP comes; or, if the peer's DREQ came
    /// first, answers it with the DREP. Either way the ID ends in TimeWait.
    pub fn disconnect(&mut self, now: Instant, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let connection = self.ids.get(&id).ok_or(CmError::UnknownId)?;
        match connection.state {
            State::Established => {
                let data = wire_private_data(private_data)?;
                self.send_dreq(now, id, data);
                Ok(())
            }
            State::DreqRcvd => {
                let data = wire_private_data(private_data)?;
                self.send_drep(now, id, data);
                Ok(())
            }
            _ => Err(CmError::InvalidState),
        }
    }

    /// Sends a SIDR_REQ; the answer comes as [`Event::SidrReply`] or
    /// [`Event::SidrTimeout`].
    pub fn sidr_request(&mut self, now: Instant, req: SidrRequest) -> Result<CommId, CmError> {
        let private_data = private_data(&req.private_data).map_err(|_| CmError::InvalidArgument("private data"))?;
        let id = self.allocate_id()?;
        let tid = own_tid(id);
        let message = SidrReqRepr { request_id: id, pkey: req.pkey, service_id: req.service_id, private_data };
        let mad = build(tid, CmMessage::SidrReq(message))?;
        let response_time = cm_time(self.config.response_timeout);
        let connection = Connection::new(State::SidrReqSent, req.peer, tid, req.service_id);
        Ok(self.open_request(now, id, connection, mad, response_time))
    }

    /// Answers an [`Event::SidrRequest`] with a SIDR_REP; the ID is gone.
    pub fn sidr_reply(&mut self, _now: Instant, id: CommId, rep: SidrReply) -> Result<(), CmError> {
        let private_data = private_data(&rep.private_data).map_err(|_| CmError::InvalidArgument("private data"))?;
        let connection = self.ids.get(&id).ok_or(CmError::UnknownId)?;
        if connection.state != State::SidrReqRcvd {
            return Err(CmError::InvalidState);
        }
        let message = SidrRepRepr {
            request_id: connection.remote_comm_id,
            status: rep.status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: rep.qpn,
            service_id: connection.service_id,
            qkey: rep.qkey,
            additional_info: [0; SIDR_INFO_LEN],
            private_data,
        };
        let mad = build(connection.tid, CmMessage::SidrRep(message))?;
        let peer = connection.peer;
        self.transmit(peer, mad);
        self.remove(id);
        Ok(())
    }

    /// The consumer forgets `id` (`rdma_destroy_id`). Like the kernel's
    /// `cm_destroy_id`, it first sends what the state requires: REJ(TIMEOUT)
    /// for our unanswered REQ, REJ(consumer defined) for a REQ or REP not
    /// answered, one DREQ if connected, the DREP if the peer's DREQ waits, a
    /// rejecting SIDR_REP. An ID that may still see its peer's repeats
    /// lingers in TimeWait to answer them, silently.
    pub fn destroy(&mut self, now: Instant, id: CommId) {
        let Some(connection) = self.ids.get_mut(&id) else { return };
        connection.orphaned = true;
        match connection.state {
            State::ReqSent | State::MraReqRcvd => {
                let guid = self.config.local_ca_guid.to_be_bytes();
                self.send_rej(id, RejReason::TIMEOUT, &guid, [0; REJ_PRIVATE_DATA_LEN]);
                self.remove(id);
            }
            State::ReqRcvd | State::RepRcvd => {
                self.send_rej(id, RejReason::CONSUMER_DEFINED, &[], [0; REJ_PRIVATE_DATA_LEN]);
                self.remove(id);
            }
            State::RepSent | State::MraRepRcvd => {
                self.send_rej(id, RejReason::CONSUMER_DEFINED, &[], [0; REJ_PRIVATE_DATA_LEN]);
                self.enter_timewait(now, id);
            }
            State::Established => {
                // One DREQ, not resent: the kernel enters TimeWait at once.
                self.send_dreq(now, id, [0; DREQ_PRIVATE_DATA_LEN]);
                self.keep_unanswered_dreq(id);
                self.enter_timewait(now, id);
            }
            State::DreqSent => {
                self.keep_unanswered_dreq(id);
                self.enter_timewait(now, id);
            }
            State::DreqRcvd => self.send_drep(now, id, [0; DREP_PRIVATE_DATA_LEN]),
            State::TimeWait => {}
            State::SidrReqSent => self.remove(id),
            State::SidrReqRcvd => {
                self.send_sidr_rep_status(id, SidrStatus::REJECT);
                self.remove(id);
            }
        }
    }

    /// Destroys every ID the consumer still holds, as the kernel destroys
    /// a process's ids when it exits (`ucma_close`): each gets what
    /// [`Protocol::destroy`] sends for its state (a DREP to a DREQ that was
    /// received, a DREQ, a REJ), and requests no consumer took yet are
    /// rejected.
    pub fn destroy_all(&mut self, now: Instant) {
        let held: Vec<CommId> = self.ids.iter().filter(|(_, c)| !c.orphaned).map(|(&id, _)| id).collect();
        for id in held {
            self.destroy(now, id);
        }
    }

    /// Sends once more every DREQ that IDs were destroyed with and that no
    /// DREP answered yet; says whether there were any. For a process about
    /// to exit, which would otherwise leave a lost DREQ's peer waiting for
    /// its DISCONNECTED (the kernel's CM, which outlives the process, does
    /// not resend it either). A repeat is harmless: a peer that answered
    /// answers the repeat with its DREP again.
    pub fn resend_unanswered(&mut self) -> bool {
        if self.unanswered == 0 {
            return false;
        }
        let unanswered: Vec<(MadPeer, [u8; MAD_LEN])> =
            self.ids.values().filter_map(|c| c.dreq_unanswered.map(|mad| (c.peer, mad))).collect();
        for &(peer, mad) in &unanswered {
            self.retransmit(peer, mad);
        }
        !unanswered.is_empty()
    }

    /// Whether an ID destroyed with a DREQ still waits for its DREP.
    pub fn has_unanswered(&self) -> bool {
        self.unanswered > 0
    }

    /// A received MAD (the UD payload after the 40-byte GRH). Never panics:
    /// malformed or unexpected input is counted and dropped, or answered as
    /// the kernel answers it.
    pub fn handle_mad(&mut self, now: Instant, from: MadPeer, mad: &[u8]) {
        let parsed = match CmMad::parse(mad) {
            // The kernel's MAD layer hands the CM only Sends.
            Ok(parsed) if parsed.header.method == method::SEND => parsed,
            _ => {
                self.stats.malformed += 1;
                return;
            }
        };
        if let Some(count) = count_of(&mut self.stats.received, parsed.message.attribute_id()) {
            *count += 1;
        }
        let tid = parsed.header.transaction_id;
        match parsed.message {
            CmMessage::Req(req) => self.on_req(now, from, tid, req),
            CmMessage::Mra(mra) => self.on_mra(now, from, mra),
            CmMessage::Rej(rej) => self.on_rej(now, from, rej),
            CmMessage::Rep(rep) => self.on_rep(now, from, tid, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(from, rtu),
            CmMessage::Dreq(dreq) => self.on_dreq(from, tid, dreq),
            CmMessage::Drep(drep) => self.on_drep(now, from, drep),
            CmMessage::SidrReq(req) => self.on_sidr_req(from, tid, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(from, rep),
        }
    }

    /// Handles every deadline due at `now`: resends, give-ups, TimeWait ends.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            if let Some(connection) = self.ids.get_mut(&id) {
                connection.deadline = None;
                self.on_deadline(now, id);
            }
        }
    }

    /// The next deadline, if any: call [`Protocol::handle_timeout`] then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(at, _)| at)
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The counters.
    pub fn stats(&self) -> ProtocolStats {
        ProtocolStats { live_ids: self.ids.len(), ..self.stats }
    }

    // ------------------------------------------------------------ receiving

    /// A REQ: a repeat of one we hold, one from a QP still connected here,
    /// or a new request for a listener (cm_match_req).
    fn on_req(&mut self, now: Instant, from: MadPeer, tid: u64, req: ReqRepr) {
        if let Some(&id) = self.by_remote.get(&(req.local_comm_id, req.local_ca_guid)) {
            self.on_duplicate_req(id, from);
            return;
        }
        if let Some(&old) = self.by_remote_qpn.get(&(req.local_qpn, req.local_ca_guid)) {
            self.on_stale(now, old, from, tid, (0, req.local_comm_id), MessageRef::Req);
            return;
        }
        let Some(listener) = self.listeners.get(&req.service_id).copied() else {
            // Nobody listens: REJ(invalid service ID) in the REQ's
            // transaction, with no local ID (cm_match_req, cm_issue_rej).
            self.stats.rejected += 1;
            let rej = RejRepr {
                local_comm_id: 0,
                remote_comm_id: req.local_comm_id,
                message_rejected: MessageRef::Req,
                ari_length: 0,
                reason: RejReason::INVALID_SERVICE_ID,
                ari: [0; ARI_LEN],
                private_data: [0; REJ_PRIVATE_DATA_LEN],
            };
            self.send_message(from, tid, CmMessage::Rej(rej));
            return;
        };
        // A full backlog or table drops the REQ without a REJ: the kernel's
        // ucma refuses it with -ENOMEM, and its cm then neither rejects nor
        // remembers, so that the requester's retry may find room.
        if listener.pending >= listener.backlog || !self.can_report() {
            self.stats.refused += 1;
            return;
        }
        let Ok(id) = self.allocate_id() else {
            self.stats.refused += 1;
            return;
        };
        let connection = Connection {
            remote_comm_id: req.local_comm_id,
            remote_ca_guid: req.local_ca_guid,
            remote_qpn: req.local_qpn,
            // The requester said how long it takes to answer our REP.
            response_time: cm_time(req.local_cm_response_timeout),
            retry_wait: cm_time(req.local_cm_response_timeout),
            ack_timeout: req.primary_path.local_ack_timeout,
            retries_left: req.max_cm_retries,
            backlog_of: Some(req.service_id),
            ..Connection::new(State::ReqRcvd, from, tid, req.service_id)
        };
        self.ids.insert(id, connection);
        self.by_remote.insert((req.local_comm_id, req.local_ca_guid), id);
        self.by_remote_qpn.insert((req.local_qpn, req.local_ca_guid), id);
        if let Some(listener) = self.listeners.get_mut(&req.service_id) {
            listener.pending += 1;
        }
        self.event(Event::Request { id, peer: from, req });
    }

    /// A REQ or REP from a QP that `old` is still connected to: the peer
    /// lost that connection (say, it restarted). As the kernel does, the new
    /// message is refused with REJ(stale connection), under `ids` (ours,
    /// theirs) and in its transaction, and `old` is disconnected if it was
    /// established; the peer can try again once `old` is gone.
    fn on_stale(
        &mut self,
        now: Instant,
        old: CommId,
        from: MadPeer,
        tid: u64,
        ids: (CommId, u32),
        message_rejected: MessageRef,
    ) {
        self.stats.rejected += 1;
        let rej = RejRepr {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            message_rejected,
            ari_length: 0,
            reason: RejReason::STALE_CONN,
            ari: [0; ARI_LEN],
            private_data: [0; REJ_PRIVATE_DATA_LEN],
        };
        self.send_message(from, tid, CmMessage::Rej(rej));
        if self.ids.get(&old).is_some_and(|c| c.state == State::Established) {
            self.send_dreq(now, old, [0; DREQ_PRIVATE_DATA_LEN]);
        }
    }

    /// A REQ we already hold came again (cm_dup_req_handler).
    fn on_duplicate_req(&mut self, id: CommId, from: MadPeer) {
        self.stats.duplicates.req += 1;
        let Some(connection) = self.ids.get(&id) else { return };
        if connection.peer.gid != from.gid {
            self.stats.unmatched += 1;
            return;
        }
        match connection.state {
            // The consumer is still deciding: tell the requester to wait.
            State::ReqRcvd => self.send_mra(id, MessageRef::Req),
            // Our REP was lost, or crossed the repeat: send it again now
            // rather than at our next retry.
            State::RepSent | State::MraRepRcvd => {
                if let Some(rep) = connection.resend {
                    let peer = connection.peer;
                    self.retransmit(peer, rep);
                }
            }
            State::TimeWait => self.send_rej(id, RejReason::STALE_CONN, &[], [0; REJ_PRIVATE_DATA_LEN]),
            _ => {}
        }
    }

    /// An MRA: the peer needs longer to answer our REQ or REP.
    fn on_mra(&mut self, now: Instant, from: MadPeer, mra: MraRepr) {
        let before_rep = mra.message_mraed == MessageRef::Req;
        let Some(connection) = self.lookup(mra.remote_comm_id, mra.local_comm_id, before_rep, from) else {
            return;
        };
        let next = match (connection.state, mra.message_mraed) {
            (State::ReqSent, MessageRef::Req) => State::MraReqRcvd,
            (State::RepSent, MessageRef::Rep) => State::MraRepRcvd,
            (State::MraReqRcvd, _) | (State::MraRepRcvd, _) => {
                self.stats.duplicates.mra += 1;
                return;
            }
            _ => {
                self.stats.unmatched += 1;
                return;
            }
        };
        // The kernel's wait: the service timeout plus a packet lifetime.
        let wait = cm_time(mra.service_timeout) + cm_time(connection.ack_timeout);
        connection.state = next;
        connection.retry_wait = wait;
        let id = mra.remote_comm_id;
        self.set_deadline(id, Some(now + wait));
    }

    /// A REJ: our REQ or REP refused, or the peer gave up (cm_rej_handler).
    fn on_rej(&mut self, now: Instant, from: MadPeer, rej: RejRepr) {
        let id = if rej.reason == RejReason::TIMEOUT {
            // A requester that gave up names only its own Comm ID, and its CA
            // GUID in the ARI (cm_acquire_rejected_id).
            let guid = u64::from_be_bytes([
                rej.ari[0], rej.ari[1], rej.ari[2], rej.ari[3], rej.ari[4], rej.ari[5], rej.ari[6], rej.ari[7],
            ]);
            match self.by_remote.get(&(rej.local_comm_id, guid)) {
                Some(&id) => id,
                None => {
                    self.stats.unmatched += 1;
                    return;
                }
            }
        } else {
            rej.remote_comm_id
        };
        let before_rep = rej.reason != RejReason::TIMEOUT && rej.message_rejected == MessageRef::Req;
        let Some(connection) = self.lookup(id, rej.local_comm_id, before_rep, from) else { return };
        let stale = rej.reason == RejReason::STALE_CONN;
        let ends_in_timewait = match connection.state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd | State::ReqRcvd => stale,
            State::DreqSent | State::RepRcvd | State::Established => true,
            _ => {
                self.stats.unmatched += 1;
                return;
            }
        };
        if !connection.orphaned {
            let private_data = rej.private_data.to_vec();
            self.event(Event::Rejected { id, reason: rej.reason, timed_out: false, private_data });
        }
        if ends_in_timewait {
            self.enter_timewait(now, id);
        } else {
            self.remove(id);
        }
    }

    /// A REP: the answer to our REQ, or a repeat of it (cm_rep_handler,
    /// cm_dup_rep_handler).
    fn on_rep(&mut self, now: Instant, from: MadPeer, tid: u64, rep: RepRepr) {
        let Some(connection) = self.ids.get_mut(&rep.remote_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        if connection.peer.gid != from.gid {
            self.stats.unmatched += 1;
            return;
        }
        let id = rep.remote_comm_id;
        match connection.state {
            State::ReqSent | State::MraReqRcvd => {
                if self.by_remote.contains_key(&(rep.local_comm_id, rep.local_ca_guid)) {
                    // Another ID of ours already talks to that peer ID.
                    self.stats.unmatched += 1;
                    return;
                }
                if let Some(&old) = self.by_remote_qpn.get(&(rep.local_qpn, rep.local_ca_guid)) {
                    // The REP is dropped; our REQ goes on being resent.
                    self.on_stale(now, old, from, tid, (id, rep.local_comm_id), MessageRef::Rep);
                    return;
                }
                connection.state = State::RepRcvd;
                connection.remote_comm_id = rep.local_comm_id;
                connection.remote_ca_guid = rep.local_ca_guid;
                connection.remote_qpn = rep.local_qpn;
                connection.resend = None;
                let orphaned = connection.orphaned;
                self.by_remote.insert((rep.local_comm_id, rep.local_ca_guid), id);
                self.by_remote_qpn.insert((rep.local_qpn, rep.local_ca_guid), id);
                self.set_deadline(id, None);
                if !orphaned {
                    self.event(Event::Reply { id, rep });
                }
            }
            _ if connection.remote_comm_id == rep.local_comm_id => {
                self.stats.duplicates.rep += 1;
                match connection.state {
                    State::RepRcvd => self.send_mra(id, MessageRef::Rep),
                    // Our RTU was lost: the kernel sends it again.
                    State::Established => {
                        if let Some(rtu) = connection.answer {
                            let peer = connection.peer;
                            self.retransmit(peer, rtu);
                        }
                    }
                    _ => {}
                }
            }
            _ => self.stats.unmatched += 1,
        }
    }

    /// An RTU: the passive side's connection is established.
    fn on_rtu(&mut self, from: MadPeer, rtu: RtuRepr) {
        let id = rtu.remote_comm_id;
        if self.lookup(id, rtu.local_comm_id, false, from).is_none() {
            return;
        }
        if !self.establish(id) {
            self.stats.duplicates.rtu += 1;
        }
    }

    /// The passive side's connections whose REP is due to be resent or
    /// given up at `now`, with their QPs: one whose QP has received from
    /// the peer is [`Protocol::communication_established`] first.
    pub fn rep_due(&self, now: Instant) -> Vec<(CommId, u32)> {
        self.timers
            .iter()
            .take_while(|&&(at, _)| at <= now)
            .filter_map(|&(_, id)| self.ids.get(&id).map(|c| (id, c)))
            .filter(|(_, c)| matches!(c.state, State::RepSent | State::MraRepRcvd))
            .map(|(id, c)| (id, c.local_qpn))
            .collect()
    }

    /// Data came in on the connection's QP before the RTU (the verbs'
    /// Communication Established event, `ib_cm_notify`): the peer has the
    /// REP and is established, so this side is too, as if the RTU had come.
    /// Without it, a lost RTU left the passive side resending its REP to an
    /// active side that might have moved on (a DREQ sent, which ignores a
    /// repeated REP), and giving up with REJ(TIMEOUT) on a connection in use.
    pub fn communication_established(&mut self, id: CommId) {
        if self.establish(id) {
            self.stats.established_by_traffic += 1;
        }
    }

    /// RepSent or MraRepRcvd to Established; whether it moved.
    fn establish(&mut self, id: CommId) -> bool {
        let Some(connection) = self.ids.get_mut(&id) else { return false };
        if !matches!(connection.state, State::RepSent | State::MraRepRcvd) {
            return false;
        }
        connection.state = State::Established;
        connection.resend = None;
        let orphaned = connection.orphaned;
        self.set_deadline(id, None);
        if !orphaned {
            self.event(Event::Established { id });
        }
        true
    }

    /// A DREQ: the peer disconnects (cm_dreq_handler).
    fn on_dreq(&mut self, from: MadPeer, tid: u64, dreq: DreqRepr) {
        let id = dreq.remote_comm_id;
        let known = self.ids.get(&id).is_some_and(|c| c.remote_comm_id == dreq.local_comm_id && c.peer.gid == from.gid);
        if !known {
            // Our side is already gone (its DREP was lost, or it never
            // was): the kernel answers with a DREP all the same, so that
            // the peer stops asking.
            self.stats.duplicates.dreq += 1;
            let drep = DrepRepr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; DREP_PRIVATE_DATA_LEN],
            };
            self.send_message(from, tid, CmMessage::Drep(drep));
            return;
        }
        let Some(connection) = self.ids.get_mut(&id) else { return };
        if connection.local_qpn != dreq.remote_qpn {
            self.stats.unmatched += 1;
            return;
        }
        match connection.state {
            State::RepSent | State::MraRepRcvd | State::Established | State::DreqSent => {
                connection.state = State::DreqRcvd;
                connection.tid = tid;
                connection.resend = None;
                let orphaned = connection.orphaned;
                self.set_deadline(id, None);
                if !orphaned {
                    self.event(Event::DisconnectRequest { id, private_data: dreq.private_data.to_vec() });
                }
            }
            State::TimeWait => {
                self.stats.duplicates.dreq += 1;
                // Our DREP was lost, or the DREQs crossed: a DREP (again, if
                // we sent one) in the new DREQ's transaction.
                let sent = connection.answer.filter(|mad| attribute_of(mad) == attr::DREP);
                let private_data = match sent.map(|mad| CmMad::parse(&mad).map(|m| m.message)) {
                    Some(Ok(CmMessage::Drep(drep))) => drep.private_data,
                    _ => [0; DREP_PRIVATE_DATA_LEN],
                };
                let drep = DrepRepr { local_comm_id: id, remote_comm_id: connection.remote_comm_id, private_data };
                let peer = connection.peer;
                if let Ok(mad) = build(tid, CmMessage::Drep(drep)) {
                    if sent.is_some() {
                        self.retransmit(peer, mad);
                    } else {
                        self.transmit(peer, mad);
                    }
                }
            }
            State::DreqRcvd => self.stats.duplicates.dreq += 1,
            _ => self.stats.unmatched += 1,
        }
    }

    /// A DREP: our DREQ is answered (cm_drep_handler).
    fn on_drep(&mut self, now: Instant, from: MadPeer, drep: DrepRepr) {
        let id = drep.remote_comm_id;
        let Some(connection) = self.lookup(id, drep.local_comm_id, false, from) else { return };
        match connection.state {
            State::DreqSent | State::DreqRcvd => {
                if !connection.orphaned {
                    self.event(Event::Disconnected { id });
                }
                self.enter_timewait(now, id);
            }
            State::TimeWait if connection.dreq_unanswered.is_some() => {
                connection.dreq_unanswered = None;
                self.unanswered -= 1;
            }
            _ => self.stats.duplicates.drep += 1,
        }
    }

    /// Keeps the DREQ `id` is waiting on as unanswered: its consumer is
    /// going, and the DREQ will not be resent by the timer.
    fn keep_unanswered_dreq(&mut self, id: CommId) {
        let Some(connection) = self.ids.get_mut(&id) else { return };
        let dreq = connection.resend.filter(|mad| attribute_of(mad) == attr::DREQ);
        if dreq.is_some() && connection.dreq_unanswered.is_none() {
            self.unanswered += 1;
        }
        connection.dreq_unanswered = dreq.or(connection.dreq_unanswered);
    }

    /// A SIDR_REQ: a new request for a listener, a repeat, or one nobody
    /// serves (cm_sidr_req_handler).
    fn on_sidr_req(&mut self, from: MadPeer, tid: u64, req: SidrReqRepr) {
        if self.sidr_by_remote.contains_key(&(req.request_id, from.gid)) {
            self.stats.duplicates.sidr_req += 1;
            return;
        }
        let status = match self.listeners.get(&req.service_id) {
            None => Some(SidrStatus::UNSUPPORTED),
            // The kernel's ucma refuses past its backlog, and its cm then
            // answers for the ID it destroys: rejected.
            Some(listener) if listener.pending >= listener.backlog || !self.can_report() => Some(SidrStatus::REJECT),
            Some(_) => None,
        };
        if let Some(status) = status {
            if status == SidrStatus::UNSUPPORTED {
                self.stats.rejected += 1;
            } else {
                self.stats.refused += 1;
            }
            let rep = SidrRepRepr {
                request_id: req.request_id,
                status,
                additional_info_length: 0,
                vendor_id: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                additional_info: [0; SIDR_INFO_LEN],
                private_data: [0; SIDR_REP_PRIVATE_DATA_LEN],
            };
            self.send_message(from, tid, CmMessage::SidrRep(rep));
            return;
        }
        let Ok(id) = self.allocate_id() else {
            self.stats.refused += 1;
            return;
        };
        let connection = Connection {
            remote_comm_id: req.request_id,
            backlog_of: Some(req.service_id),
            ..Connection::new(State::SidrReqRcvd, from, tid, req.service_id)
        };
        self.ids.insert(id, connection);
        self.sidr_by_remote.insert((req.request_id, from.gid), id);
        if let Some(listener) = self.listeners.get_mut(&req.service_id) {
            listener.pending += 1;
        }
        self.event(Event::SidrRequest { id, peer: from, req });
    }

    /// A SIDR_REP: the answer to our SIDR_REQ (cm_sidr_rep_handler).
    fn on_sidr_rep(&mut self, from: MadPeer, rep: SidrRepRepr) {
        let id = rep.request_id;
        let Some(connection) = self.lookup(id, 0, true, from) else { return };
        if connection.state != State::SidrReqSent {
            self.stats.duplicates.sidr_rep += 1;
            return;
        }
        if !connection.orphaned {
            self.event(Event::SidrReply { id, rep });
        }
        self.remove(id);
    }

    /// The ID a message names as its receiver's, if it is alive, talks to
    /// `from`, and knows the sender by `remote_comm_id`; or, `before_rep`,
    /// does not know the sender yet, as the kernel's `cm_acquire_id(id, 0)`.
    /// Counts the miss.
    fn lookup(&mut self, id: CommId, remote_comm_id: u32, before_rep: bool, from: MadPeer) -> Option<&mut Connection> {
        let expected_remote = if before_rep { 0 } else { remote_comm_id };
        match self.ids.get_mut(&id) {
            Some(connection) if connection.remote_comm_id == expected_remote && connection.peer.gid == from.gid => {
                Some(connection)
            }
            _ => {
                self.stats.unmatched += 1;
                None
            }
        }
    }

    // --------------------------------------------------------------- timers

    /// `id`'s timer fired.
    fn on_deadline(&mut self, now: Instant, id: CommId) {
        let Some(connection) = self.ids.get_mut(&id) else { return };
        if connection.state == State::TimeWait {
            let orphaned = connection.orphaned;
            self.remove(id);
            if !orphaned {
                self.event(Event::TimewaitExit { id });
            }
            return;
        }
        if connection.retries_left > 0 {
            if let Some(mad) = connection.resend {
                connection.retries_left -= 1;
                let (peer, next) = (connection.peer, now + connection.retry_wait);
                self.retransmit(peer, mad);
                self.set_deadline(id, Some(next));
            }
            return;
        }
        self.stats.timed_out += 1;
        let orphaned = connection.orphaned;
        match connection.state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                // IBTA 12.9.7: a side that gives up says so, with its CA
                // GUID for the peer to find the connection by.
                let guid = self.config.local_ca_guid.to_be_bytes();
                self.send_rej(id, RejReason::TIMEOUT, &guid, [0; REJ_PRIVATE_DATA_LEN]);
                if !orphaned {
                    let private_data = Vec::new();
                    self.event(Event::Rejected { id, reason: RejReason::TIMEOUT, timed_out: true, private_data });
                }
                self.remove(id);
            }
            State::DreqSent => {
                if !orphaned {
                    self.event(Event::Disconnected { id });
                }
                self.enter_timewait(now, id);
            }
            State::SidrReqSent => {
                if !orphaned {
                    self.event(Event::SidrTimeout { id });
                }
                self.remove(id);
            }
            _ => {}
        }
    }

    /// Arms (or with `None` disarms) `id`'s one timer.
    fn set_deadline(&mut self, id: CommId, at: Option<Instant>) {
        let Some(connection) = self.ids.get_mut(&id) else { return };
        if let Some(old) = connection.deadline.take() {
            self.timers.remove(&(old, id));
        }
        if let Some(at) = at {
            connection.deadline = Some(at);
            self.timers.insert((at, id));
        }
    }

    // -------------------------------------------------------------- sending

    /// Sends a DREQ naming the peer's QP and moves to DREQ_SENT.
    fn send_dreq(&mut self, now: Instant, id: CommId, private_data: [u8; DREQ_PRIVATE_DATA_LEN]) {
        let Some(connection) = self.ids.get_mut(&id) else { return };
        let message = DreqRepr {
            local_comm_id: id,
            remote_comm_id: connection.remote_comm_id,
            remote_qpn: connection.remote_qpn,
            private_data,
        };
        // A DREQ starts our own transaction (cm_format_dreq, cm_form_tid).
        let Ok(mad) = build(own_tid(id), CmMessage::Dreq(message)) else { return };
        connection.state = State::DreqSent;
        connection.resend = Some(mad);
        connection.retries_left = self.config.max_cm_retries;
        connection.retry_wait = connection.response_time;
        let (peer, deadline) = (connection.peer, now + connection.response_time);
        self.transmit(peer, mad);
        self.set_deadline(id, Some(deadline));
    }

    /// Answers the peer's DREQ and enters TimeWait, keeping the DREP for
    /// repeats of the DREQ.
    fn send_drep(&mut self, now: Instant, id: CommId, private_data: [u8; DREP_PRIVATE_DATA_LEN]) {
        let Some(connection) = self.ids.get_mut(&id) else { return };
        let message = DrepRepr { local_comm_id: id, remote_comm_id: connection.remote_comm_id, private_data };
        let Ok(mad) = build(connection.tid, CmMessage::Drep(message)) else { return };
        connection.answer = Some(mad);
        let peer = connection.peer;
        self.transmit(peer, mad);
        self.enter_timewait(now, id);
    }

    /// Sends a REJ for `id` in its state's form (cm_format_rej): no local ID
    /// and "REQ" before we took the request on, "REP" after the peer's REP.
    fn send_rej(&mut self, id: CommId, reason: RejReason, ari: &[u8], private_data: [u8; REJ_PRIVATE_DATA_LEN]) {
        let Some(connection) = self.ids.get(&id) else { return };
        // With rdma_cm's prepared MRA, a REQ being decided on is rejected
        // under our ID (the kernel's MRA_REQ_SENT case).
        let message_rejected = match connection.state {
            State::ReqRcvd => MessageRef::Req,
            State::RepRcvd => MessageRef::Rep,
            _ => MessageRef::Other,
        };
        let mut ari_bytes = [0u8; ARI_LEN];
        let ari_length = ari.len().min(ARI_LEN);
        ari_bytes[..ari_length].copy_from_slice(&ari[..ari_length]);
        let rej = RejRepr {
            local_comm_id: id,
            remote_comm_id: connection.remote_comm_id,
            message_rejected,
            ari_length: ari_length as u8,
            reason,
            ari: ari_bytes,
            private_data,
        };
        let (peer, tid) = (connection.peer, connection.tid);
        self.send_message(peer, tid, CmMessage::Rej(rej));
    }

    /// Sends an MRA asking the peer to wait [`MRA_SERVICE_TIMEOUT`] for us.
    fn send_mra(&mut self, id: CommId, message_mraed: MessageRef) {
        let Some(connection) = self.ids.get(&id) else { return };
        let mra = MraRepr {
            local_comm_id: id,
            remote_comm_id: connection.remote_comm_id,
            message_mraed,
            service_timeout: MRA_SERVICE_TIMEOUT,
            private_data: [0; MRA_PRIVATE_DATA_LEN],
        };
        let (peer, tid) = (connection.peer, connection.tid);
        self.send_message(peer, tid, CmMessage::Mra(mra));
    }

    /// Answers `id`'s SIDR_REQ with a bare status.
    fn send_sidr_rep_status(&mut self, id: CommId, status: SidrStatus) {
        let Some(connection) = self.ids.get(&id) else { return };
        let rep = SidrRepRepr {
            request_id: connection.remote_comm_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: 0,
            service_id: connection.service_id,
            qkey: 0,
            additional_info: [0; SIDR_INFO_LEN],
            private_data: [0; SIDR_REP_PRIVATE_DATA_LEN],
        };
        let (peer, tid) = (connection.peer, connection.tid);
        self.send_message(peer, tid, CmMessage::SidrRep(rep));
    }

    /// Emits and queues a message built from values already checked.
    fn send_message(&mut self, to: MadPeer, tid: u64, message: CmMessage) {
        if let Ok(mad) = build(tid, message) {
            self.transmit(to, mad);
        }
    }

    /// Queues a first transmission.
    fn transmit(&mut self, to: MadPeer, mad: [u8; MAD_LEN]) {
        if self.push_transmit(to, mad) {
            if let Some(count) = count_of(&mut self.stats.sent, attribute_of(&mad)) {
                *count += 1;
            }
        }
    }

    /// Queues a message sent before.
    fn retransmit(&mut self, to: MadPeer, mad: [u8; MAD_LEN]) {
        if self.push_transmit(to, mad) {
            if let Some(count) = count_of(&mut self.stats.retransmitted, attribute_of(&mad)) {
                *count += 1;
            }
        }
    }

    fn push_transmit(&mut self, to: MadPeer, mad: [u8; MAD_LEN]) -> bool {
        if self.transmits.len() >= self.queue_limit() {
            self.stats.queue_overflows += 1;
            return false;
        }
        self.transmits.push_back(Transmit { to, mad });
        true
    }

    fn event(&mut self, event: Event) {
        if self.events.len() >= self.queue_limit() {
            self.stats.queue_overflows += 1;
            return;
        }
        self.events.push_back(event);
    }

    /// Whether an event would be queued: a request the consumer cannot be
    /// told of is refused rather than taken on.
    fn can_report(&self) -> bool {
        self.events.len() < self.queue_limit()
    }

    fn queue_limit(&self) -> usize {
        self.capacity.saturating_mul(QUEUED_PER_ID).max(64)
    }

    // ------------------------------------------------------------------ IDs

    /// A Comm ID not in use: the slot in the top byte, the next free value
    /// of the counter below it, never 0.
    fn allocate_id(&mut self) -> Result<CommId, CmError> {
        if self.ids.len() >= self.capacity {
            return Err(CmError::NoResources);
        }
        let slot = u32::from(self.config.slot) << 24;
        loop {
            let id = slot | self.next_id;
            self.next_id = (self.next_id + 1) & 0x00ff_ffff;
            if id != 0 && !self.ids.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    /// Moves `id` to TimeWait, which lasts as the kernel's: the path's ACK
    /// timeout, counted as `cm_convert_to_ms` counts it.
    fn enter_timewait(&mut self, now: Instant, id: CommId) {
        self.release_backlog(id);
        self.forget_remote_qpn(id);
        let Some(connection) = self.ids.get_mut(&id) else { return };
        connection.state = State::TimeWait;
        connection.resend = None;
        let wait = timewait(connection.ack_timeout);
        self.set_deadline(id, Some(now + wait));
    }

    /// Frees `id` and everything that names it.
    fn remove(&mut self, id: CommId) {
        self.release_backlog(id);
        self.forget_remote_qpn(id);
        self.set_deadline(id, None);
        let Some(connection) = self.ids.remove(&id) else { return };
        if connection.dreq_unanswered.is_some() {
            self.unanswered -= 1;
        }
        let remote = (connection.remote_comm_id, connection.remote_ca_guid);
        if self.by_remote.get(&remote) == Some(&id) {
            self.by_remote.remove(&remote);
        }
        let sidr = (connection.remote_comm_id, connection.peer.gid);
        if self.sidr_by_remote.get(&sidr) == Some(&id) {
            self.sidr_by_remote.remove(&sidr);
        }
    }

    /// `id`'s peer QP may connect anew: the kernel forgets it on entering
    /// TimeWait (`cm_cleanup_timewait`).
    fn forget_remote_qpn(&mut self, id: CommId) {
        let Some(connection) = self.ids.get(&id) else { return };
        let remote = (connection.remote_qpn, connection.remote_ca_guid);
        if self.by_remote_qpn.get(&remote) == Some(&id) {
            self.by_remote_qpn.remove(&remote);
        }
    }

    /// `id`'s request is answered (or dropped): its listener may take another.
    fn release_backlog(&mut self, id: CommId) {
        let Some(service) = self.ids.get_mut(&id).and_then(|c| c.backlog_of.take()) else { return };
        if let Some(listener) = self.listeners.get_mut(&service) {
            listener.pending = listener.pending.saturating_sub(1);
        }
    }
}

/// The LID of a routed path: RoCE has no LIDs (the kernel's `IB_LID_PERMISSIVE`).
const PERMISSIVE_LID: u16 = 0xffff;

/// Our transaction ID for messages that start a transaction: the kernel's
/// `cm_form_tid`, its MAD agent's number over the Comm ID in little-endian
/// byte order (a `__be32` put into a `u64`).
fn own_tid(id: CommId) -> u64 {
    TID_AGENT | u64::from(id.swap_bytes())
}

/// 4.096 µs × 2^code.
fn cm_time(code: u8) -> Duration {
    Duration::from_nanos(timeout_nanos(code))
}

/// TimeWait for a path ACK timeout code: the kernel's `cm_convert_to_ms`,
/// 2^(code − 8) ms.
fn timewait(ack_timeout: u8) -> Duration {
    Duration::from_millis(1 << ack_timeout.min(31).saturating_sub(8))
}

/// A whole 256-byte MAD, or the reason a value does not fit.
fn build(tid: u64, message: CmMessage) -> Result<[u8; MAD_LEN], CmError> {
    let mut mad = [0u8; MAD_LEN];
    CmMad::new(tid, message).emit(&mut mad).map_err(|_| CmError::InvalidArgument("a value does not fit its field"))?;
    Ok(mad)
}

/// Private data for a message that holds `N` bytes.
fn wire_private_data<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    private_data(data).map_err(|_| CmError::InvalidArgument("private data"))
}

/// The attribute ID of an emitted MAD.
fn attribute_of(mad: &[u8; MAD_LEN]) -> u16 {
    u16::from_be_bytes([mad[16], mad[17]])
}

/// The counter of an attribute in `counts`.
fn count_of(counts: &mut MessageCounts, attribute: u16) -> Option<&mut u64> {
    Some(match attribute {
        attr::REQ => &mut counts.req,
        attr::MRA => &mut counts.mra,
        attr::REJ => &mut counts.rej,
        attr::REP => &mut counts.rep,
        attr::RTU => &mut counts.rtu,
        attr::DREQ => &mut counts.dreq,
        attr::DREP => &mut counts.drep,
        attr::SIDR_REQ => &mut counts.sidr_req,
        attr::SIDR_REP => &mut counts.sidr_rep,
        _ => return None,
    })
}
