//! The IB Communication Manager (IBTA chapter 12) as a sans-IO state machine,
//! in the manner of `quinn-proto` and of [`crate::transport`]: no sockets, no
//! clock, no threads. The caller hands in received MADs and the time, and
//! takes out MADs to send, events and the next deadline.
//!
//! Interface commit: the types and signatures; behaviour follows.

use std::collections::VecDeque;
use std::fmt;
use std::time::Instant;

use crate::transport::{Mtu, QpType};
use crate::verbs::Gid;
use crate::wire::cm::{RejReason, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr, SidrStatus};
use crate::wire::mad::MAD_LEN;
use crate::wire::Psn;

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
    /// (reason TIMEOUT, `timed_out`). The ID is gone.
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
    /// REJs we sent for requests nobody listens for.
    pub rejected: u64,
    /// REQs, REPs, DREQs and SIDR_REQs given up on after every retry.
    pub timed_out: u64,
    /// Transmits or events dropped because the user did not take them.
    pub queue_overflows: u64,
    /// IDs alive now.
    pub live_ids: usize,
}

/// The communication manager of one verbs context.
#[derive(Debug)]
pub struct Protocol {
    config: ProtocolConfig,
    random: u32,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: ProtocolStats,
}

impl Protocol {
    /// A protocol with no IDs; `random` seeds the low bits of Comm IDs.
    pub fn new(config: ProtocolConfig, random: u32) -> Protocol {
        Protocol {
            config,
            random,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: ProtocolStats::default(),
        }
    }

    /// Takes REQs and SIDR_REQs for `service_id`, at most `backlog` unanswered.
    pub fn listen(&mut self, service_id: u64, backlog: u32) -> Result<(), CmError> {
        let _ = (service_id, backlog, self.random, &self.config);
        Err(CmError::InvalidState)
    }

    /// Stops taking requests for `service_id`; requests already taken stay.
    pub fn unlisten(&mut self, service_id: u64) {
        let _ = service_id;
    }

    /// Sends a REQ; the answer comes as [`Event::Reply`] or [`Event::Rejected`].
    pub fn connect(&mut self, now: Instant, req: ConnectRequest) -> Result<CommId, CmError> {
        let _ = (now, req);
        Err(CmError::InvalidState)
    }

    /// Answers an [`Event::Request`] with a REP.
    pub fn accept(&mut self, now: Instant, id: CommId, rep: ConnectReply) -> Result<(), CmError> {
        let _ = (now, id, rep);
        Err(CmError::InvalidState)
    }

    /// Answers an [`Event::Reply`] with an RTU: the connection is established.
    pub fn ready_to_use(&mut self, now: Instant, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let _ = (now, id, private_data);
        Err(CmError::InvalidState)
    }

    /// Refuses a REQ or REP with a REJ; the ID is gone.
    pub fn reject(&mut self, now: Instant, id: CommId, reason: RejReason, private_data: &[u8]) -> Result<(), CmError> {
        let _ = (now, id, reason, private_data);
        Err(CmError::InvalidState)
    }

    /// Sends a DREQ, or the DREP if the peer's DREQ came first.
    pub fn disconnect(&mut self, now: Instant, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let _ = (now, id, private_data);
        Err(CmError::InvalidState)
    }

    /// Sends a SIDR_REQ; the answer comes as [`Event::SidrReply`] or
    /// [`Event::SidrTimeout`].
    pub fn sidr_request(&mut self, now: Instant, req: SidrRequest) -> Result<CommId, CmError> {
        let _ = (now, req);
        Err(CmError::InvalidState)
    }

    /// Answers an [`Event::SidrRequest`] with a SIDR_REP; the ID is gone.
    pub fn sidr_reply(&mut self, now: Instant, id: CommId, rep: SidrReply) -> Result<(), CmError> {
        let _ = (now, id, rep);
        Err(CmError::InvalidState)
    }

    /// The consumer forgets `id` (`rdma_destroy_id`): sends what its state
    /// requires (REJ if a REQ or REP is unanswered, DREQ if connected, DREP if
    /// a DREQ is unanswered) and frees it.
    pub fn destroy(&mut self, now: Instant, id: CommId) {
        let _ = (now, id);
    }

    /// A received MAD (the UD payload after the 40-byte GRH). Never panics:
    /// malformed or unexpected input is counted and dropped, or answered as
    /// the kernel answers it.
    pub fn handle_mad(&mut self, now: Instant, from: MadPeer, mad: &[u8]) {
        let _ = (now, from, mad);
        self.stats.malformed += 1;
    }

    /// Handles every deadline due at `now`: retries, give-ups, TimeWait ends.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
    }

    /// The next deadline, if any: call [`Protocol::handle_timeout`] then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        None
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
        self.stats
    }
}
