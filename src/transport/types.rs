//! Work requests, work completions and the values they carry, numbered as in
//! libibverbs (`ibv_wc_status`, `ibv_wc_opcode`, `ibv_access_flags`) so the
//! verbs layer and a future C ABI are thin.

use std::fmt;

use crate::wire::Psn;

/// Queue pair transport type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`): acknowledged and retransmitted, with
    /// SEND, WRITE, READ and atomics.
    Rc,
    /// Unreliable connected (`IBV_QPT_UC`): SEND and WRITE only, never
    /// acknowledged; a lost packet loses its message.
    Uc,
    /// Unreliable datagram (`IBV_QPT_UD`): single-packet SENDs, each addressed to
    /// any QP by its work request.
    Ud,
}

/// Memory access rights (`ibv_access_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read, which every region grants.
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the local side may write the region (receive
    /// buffers, READ and atomic results). Required with REMOTE_WRITE and
    /// REMOTE_ATOMIC, as in libibverbs.
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE to it.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on it.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region
    /// (IBTA C10-73); meaningless on a window itself.
    pub const MW_BIND: Access = Access(1 << 4);
    /// `IBV_ACCESS_ON_DEMAND`: the region is not pinned and its pages are
    /// reached as they come: a page no longer mapped is an access error,
    /// never a fault of the process (on-demand paging; a registration
    /// flag, not a right).
    pub const ON_DEMAND: Access = Access(1 << 6);
    /// `IBV_ACCESS_FLUSH_GLOBAL` (rdma-core 45): peers may FLUSH the region
    /// to global visibility.
    pub const FLUSH_GLOBAL: Access = Access(1 << 8);
    /// `IBV_ACCESS_FLUSH_PERSISTENT` (rdma-core 45): peers may FLUSH the
    /// region to persistence.
    pub const FLUSH_PERSISTENT: Access = Access(1 << 9);
    /// The rights a peer uses: READ, WRITE, atomics, FLUSH.
    const REMOTE: Access = Access(
        Access::REMOTE_WRITE.0
            | Access::REMOTE_READ.0
            | Access::REMOTE_ATOMIC.0
            | Access::FLUSH_GLOBAL.0
            | Access::FLUSH_PERSISTENT.0,
    );

    /// The `ibv_access_flags` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Rights from `ibv_access_flags` bits; bits we do not know are refused.
    pub const fn from_bits(bits: u32) -> Option<Access> {
        if bits & !0x35f == 0 {
            Some(Access(bits))
        } else {
            None
        }
    }

    /// The rights of both (also `|`).
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// Whether every right in `other` is granted.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether a peer's request asks for this: only such accesses may name
    /// a memory window, whose keys are remote keys only.
    pub const fn is_remote(self) -> bool {
        self.0 & Access::REMOTE.0 != 0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
            (Access::MW_BIND, "MW_BIND"),
            (Access::ON_DEMAND, "ON_DEMAND"),
            (Access::FLUSH_GLOBAL, "FLUSH_GLOBAL"),
            (Access::FLUSH_PERSISTENT, "FLUSH_PERSISTENT"),
        ];
        let set: Vec<&str> = names.iter().filter(|(a, _)| self.contains(*a)).map(|(_, n)| *n).collect();
        write!(f, "Access({})", set.join("|"))
    }
}

/// A scatter/gather element: `length` bytes at `addr` in the region of `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address of the first byte, in the region's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region the bytes lie in.
    pub lkey: u32,
}

/// Send work request opcodes (`ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// `IBV_WR_SEND`: consumes a receive WQE at the peer.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: a SEND carrying this 32-bit immediate (ImmDt) to
    /// the receive completion.
    SendWithImm(u32),
    /// `IBV_WR_SEND_WITH_INV`: a SEND that invalidates the given R_Key (a
    /// type 2 memory window's) at the responder (RC only).
    SendWithInv(u32),
    /// `IBV_WR_ATOMIC_WRITE` (IBTA annex A19): writes the request's 8 bytes
    /// of data (one 8-byte SGE or inline) to the peer's 8-byte aligned
    /// word at once, never torn (RC only).
    AtomicWrite {
        /// Peer virtual address of the word, 8-byte aligned (RETH VA).
        remote_addr: u64,
        /// R_Key of the peer's region; it must grant REMOTE_WRITE.
        rkey: u32,
    },
    /// FLUSH (IBTA annex A19): makes what earlier requests placed in the
    /// peer's region globally visible, or persistent, before it completes
    /// (RC only; no data).
    Flush {
        /// Peer virtual address of the range (RETH VA).
        remote_addr: u64,
        /// R_Key of the peer's region; it must grant the FLUSH rights the
        /// placement asks for.
        rkey: u32,
        /// Bytes of the range; ignored when `whole_region`.
        len: u32,
        /// The whole region the key names, not the range (FETH selectivity).
        whole_region: bool,
        /// What the flush guarantees.
        placement: FlushPlacement,
    },
    /// `IBV_WR_BIND_MW`: binds a memory window to a range of a local MR. A
    /// local operation: it sends nothing and completes in send-queue order.
    BindMw(MwBind),
    /// `IBV_WR_LOCAL_INV`: invalidates a type 2 memory window bound through
    /// this QP, by its R_Key (a local operation).
    LocalInv(u32),
    /// `IBV_WR_RDMA_WRITE`: writes the data into the peer's memory; consumes no
    /// receive.
    RdmaWrite {
        /// Peer virtual address of the first byte written (RETH VA).
        remote_addr: u64,
        /// R_Key of the peer's region.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: a WRITE that also consumes a receive WQE at
    /// the peer, completing it with `imm`.
    RdmaWriteWithImm {
        /// Peer virtual address of the first byte written (RETH VA).
        remote_addr: u64,
        /// R_Key of the peer's region.
        rkey: u32,
        /// Immediate data (ImmDt) for the peer's receive completion.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`: reads the peer's memory into the local SGEs (RC only).
    RdmaRead {
        /// Peer virtual address of the first byte read (RETH VA).
        remote_addr: u64,
        /// R_Key of the peer's region.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: if the peer's 64-bit word equals `compare`,
    /// replaces it with `swap`; the original value goes to the local 8-byte SGE.
    CompareSwap {
        /// Peer virtual address of the word, 8-byte aligned (AtomicETH VA).
        remote_addr: u64,
        /// R_Key of the peer's region.
        rkey: u32,
        /// Value the word must hold for the swap to happen.
        compare: u64,
        /// Value written when it does.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: adds `add` to the peer's 64-bit word; the
    /// original value goes to the local 8-byte SGE.
    FetchAdd {
        /// Peer virtual address of the word, 8-byte aligned (AtomicETH VA).
        remote_addr: u64,
        /// R_Key of the peer's region.
        rkey: u32,
        /// Value added, wrapping at 2^64.
        add: u64,
    },
}

/// The FETH placement type of a FLUSH: bit 0 global visibility, bit 1
/// persistence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPlacement {
    /// Visible to every reader of the memory (`IB_FLUSH_GLOBAL`).
    Global = 1,
    /// Written to where it survives a power loss (`IB_FLUSH_PERSISTENT`).
    Persistent = 2,
    /// Both.
    GlobalAndPersistent = 3,
}

impl FlushPlacement {
    /// The placement of FETH bits, if they ask for one.
    pub const fn from_bits(bits: u8) -> Option<FlushPlacement> {
        match bits & 0x3 {
            1 => Some(FlushPlacement::Global),
            2 => Some(FlushPlacement::Persistent),
            3 => Some(FlushPlacement::GlobalAndPersistent),
            _ => None,
        }
    }

    /// The region rights it needs.
    pub const fn rights(self) -> Access {
        match self {
            FlushPlacement::Global => Access::FLUSH_GLOBAL,
            FlushPlacement::Persistent => Access::FLUSH_PERSISTENT,
            FlushPlacement::GlobalAndPersistent => Access::FLUSH_GLOBAL.union(Access::FLUSH_PERSISTENT),
        }
    }
}

impl SendOp {
    /// READ, compare-and-swap, fetch-and-add or FLUSH: the operations a
    /// response of their own answers (READ response, atomic ACK).
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } | SendOp::Flush { .. }
        )
    }

    /// The operations that take a responder resource: those of
    /// [`SendOp::is_read_or_atomic`] and ATOMIC WRITE. They count against
    /// `max_rd_atomic`, and a fence waits for them.
    pub const fn counts_rd_atomic(self) -> bool {
        self.is_read_or_atomic() || matches!(self, SendOp::AtomicWrite { .. })
    }

    /// A bind or a local invalidate: done by the requester itself, never on
    /// the wire.
    pub const fn is_local(self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv(_))
    }

    /// Compare-and-swap or fetch-and-add.
    pub const fn is_atomic(self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// The completion opcode this request produces.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::Flush { .. } => WcOpcode::Flush,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
        }
    }
}

/// What `IBV_WR_BIND_MW` asks (`ibv_mw_bind_info` plus the keys): the
/// window named by `mw_rkey` opens `[addr, addr + length)` of the MR named
/// by `mr_lkey`, with `access`, and answers to `rkey` from then on. A type 1
/// window bound with length 0 is unbound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window's R_Key as it stands: a bind naming an older key fails.
    pub mw_rkey: u32,
    /// The window's R_Key once bound: its index (upper 24 bits) stays, the
    /// low byte is the consumer's (`ibv_inc_rkey` of the old one, usually).
    pub rkey: u32,
    /// Local key of the MR the window opens (ignored when `length` is 0).
    pub mr_lkey: u32,
    /// Address of the window's first byte, inside the MR.
    pub addr: u64,
    /// Length of the window in bytes.
    pub length: u64,
    /// The remote rights it grants; READ alone needs nothing of the MR,
    /// WRITE and atomics need the MR's LOCAL_WRITE (IBTA C10-74).
    pub access: Access,
}

/// Where a UD send goes: the address vector of an address handle plus the
/// remote QP and Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// IP address of the destination (from the address handle's GID).
    pub dest: std::net::IpAddr,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// A Q_Key with the high bit set means "use the QP's own Q_Key".
    pub remote_qkey: u32,
}

/// `ibv_send_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags {
    /// Wait for all earlier READ and atomic requests to complete first.
    pub fence: bool,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Set the solicited event bit on the last packet.
    pub solicited: bool,
    /// The data is in `inline_data`, copied at post time, not in the SGEs.
    pub inline: bool,
}

/// A work request's scatter/gather list. One entry (what most verbs
/// programs post) is held in the request itself, so that such a post
/// allocates nothing and the thread that completes it frees nothing; more
/// go to the heap. One and not two: a second would make a [`SendWr`] too
/// large to move without a call to `memcpy` (each post moves it a few
/// times), which costs about what the allocation saved. [`sg_list!`] makes
/// one as `vec!` makes a `Vec`, and a `Vec<Sge>` or `&[Sge]` converts
/// `into()` one.
///
/// [`sg_list!`]: crate::sg_list
pub type SgList = smallvec::SmallVec<[Sge; 1]>;

/// The data of an inline send, copied from the program's buffers at post
/// time. Up to 16 bytes (a latency test's message, a small header) are held
/// in the request, as one SGE is ([`SgList`]), so such a post allocates
/// nothing; the request stays as large as with a `Vec`.
pub type InlineData = smallvec::SmallVec<[u8; 16]>;

/// A [`SgList`](crate::transport::SgList) of the entries given, as `vec!`
/// makes a `Vec`: `RecvWr { wr_id, sg_list: sg_list![mr.sge(0, 64)] }`.
#[macro_export]
macro_rules! sg_list {
    ($sge:expr; $n:expr) => {
        $crate::transport::SgList::from_elem($sge, $n)
    };
    ($($sge:expr),* $(,)?) => {
        <$crate::transport::SgList as ::core::iter::FromIterator<$crate::transport::Sge>>::from_iter([$($sge),*])
    };
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation and its remote-side arguments.
    pub op: SendOp,
    /// Local memory the data comes from (or, for READ and atomics, goes to).
    pub sg_list: SgList,
    /// Fencing, completion and solicited-event behaviour, and whether the data
    /// is inline.
    pub flags: SendFlags,
    /// Data of an inline send, copied at post time.
    pub inline_data: InlineData,
    /// Destination of a UD send.
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A signaled request with no data; set `sg_list` or `inline_data`.
    pub fn new(wr_id: u64, op: SendOp) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg_list: SgList::new(),
            flags: SendFlags { signaled: true, ..SendFlags::default() },
            inline_data: InlineData::new(),
            ud: None,
        }
    }

    /// Appends an SGE to `sg_list`.
    pub fn with_sge(mut self, sge: Sge) -> SendWr {
        self.sg_list.push(sge);
        self
    }

    /// Addresses a UD send.
    pub fn with_ud(mut self, dest: UdDest) -> SendWr {
        self.ud = Some(dest);
        self
    }

    /// Bytes of data the request moves (8 for atomics).
    pub fn length(&self) -> u64 {
        if self.op.is_atomic() {
            8
        } else if self.flags.inline {
            self.inline_data.len() as u64
        } else {
            self.sg_list.iter().map(|s| u64::from(s.length)).sum()
        }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Buffers a received message is scattered into, in order.
    pub sg_list: SgList,
}

impl RecvWr {
    /// Total bytes the SGEs hold: the longest message this receive accepts.
    pub fn length(&self) -> u64 {
        self.sg_list.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// `ibv_wc_status`, with libibverbs' numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a received message did not fit the receive buffers.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: an internal QP consistency error. Not produced by
    /// softroce.
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_PROT_ERR`: a local SGE failed the key, protection domain,
    /// rights or bounds check; or, on a receive, the R_Key a SEND with
    /// invalidate named could not be invalidated.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: the request was outstanding when the QP entered
    /// ERR, or was posted in ERR.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`: a memory window bind broke a rule (window, MR,
    /// protection domain, rights, bounds or state).
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: a malformed response, e.g. a READ response of the
    /// wrong length.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`: a local access violation on a receive. Not
    /// produced by softroce (it reports [`WcStatus::LocProtErr`]).
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid (NAK
    /// invalid request).
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: the responder refused the access (NAK remote
    /// access error).
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation (NAK
    /// remote operational error).
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: `retry_cnt` timeouts or sequence NAKs passed
    /// without progress.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the responder answered with more RNR NAKs than
    /// `rnr_retry` allows.
    RnrRetryExcErr = 13,
    /// `IBV_WC_FATAL_ERR`. Not produced by softroce.
    FatalErr = 19,
    /// `IBV_WC_GENERAL_ERR`. Not produced by softroce.
    GeneralErr = 21,
}

impl WcStatus {
    /// The string `ibv_wc_status_str` gives.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::FatalErr => "fatal error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

/// `ibv_wc_opcode`, with libibverbs' numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`: a SEND of any kind completed.
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`: a WRITE, with or without immediate, completed.
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`: a memory window bind.
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`: a local invalidate.
    LocalInv = 6,
    /// `IBV_WC_FLUSH` (rdma-core 45).
    Flush = 8,
    /// `IBV_WC_ATOMIC_WRITE`.
    AtomicWrite = 9,
    /// `IBV_WC_RECV`: a receive consumed by a SEND.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive consumed by a WRITE with immediate
    /// (its data went to the WRITE's address, not to the receive buffers).
    RecvRdmaWithImm = 129,
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The `wr_id` of the completed work request.
    pub wr_id: u64,
    /// Whether it succeeded, and why not.
    pub status: WcStatus,
    /// What kind of request completed.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data of a SEND or WRITE with immediate (`IBV_WC_WITH_IMM`).
    pub imm: Option<u32>,
    /// R_Key invalidated by a SEND_WITH_INVALIDATE.
    pub invalidated_rkey: Option<u32>,
    /// The local QP the request was posted to (or, for an SRQ receive, that
    /// consumed it).
    pub qp_num: u32,
    /// Source QP of a UD receive.
    pub src_qp: u32,
    /// A 40-byte GRH area precedes the data (UD receives).
    pub grh: bool,
    /// The message carried the solicited event bit.
    pub solicited: bool,
}

impl WorkCompletion {
    /// A completion with nothing but identity, status and opcode.
    pub const fn new(wr_id: u64, qp_num: u32, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: 0,
            grh: false,
            solicited: false,
        }
    }
}

/// Asynchronous events a QP or SRQ raises (`ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The QP moved to ERR because of an error it detected (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// The QP.
        qpn: u32,
    },
    /// A receive error on the responder side (`IBV_EVENT_QP_REQ_ERR`): it NAKed
    /// an invalid request or a remote operational error and moved to ERR.
    QpRequestError {
        /// The responder QP.
        qpn: u32,
    },
    /// The responder NAKed a request with a remote access error and moved to
    /// ERR (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// The responder QP.
        qpn: u32,
    },
    /// The send queue drained after a move to SQD (`IBV_EVENT_SQ_DRAINED`).
    SqDrained {
        /// The QP.
        qpn: u32,
    },
    /// The SRQ's count of posted receives fell below its armed limit.
    SrqLimitReached {
        /// The SRQ's id ([`Srq::id`](crate::transport::Srq::id)).
        srq: u32,
    },
    /// The QP entered ERR and its last WQE was consumed (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached {
        /// The QP, which uses an SRQ.
        qpn: u32,
    },
    /// The port's link is up (`IBV_EVENT_PORT_ACTIVE`), raised when a context opens.
    PortActive {
        /// The port number (always 1).
        port: u8,
    },
}

/// First PSN and PSN count of a work request once it is on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PsnRange {
    /// PSN of the first packet (for a READ, of the first response).
    pub first: Psn,
    /// Number of PSNs the request takes.
    pub count: u32,
}

impl PsnRange {
    /// The last PSN of the range.
    pub fn last(&self) -> Psn {
        self.first.wrapping_add(self.count.saturating_sub(1))
    }

    /// Whether `psn` lies in the range, across the 2^24 wrap.
    pub fn contains(&self, psn: Psn) -> bool {
        let d = psn.diff(self.first);
        d >= 0 && (d as u32) < self.count
    }
}
