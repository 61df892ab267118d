//! Work requests, work completions and the values they carry, numbered as in
//! libibverbs (`ibv_wc_status`, `ibv_wc_opcode`, `ibv_access_flags`) so the
//! verbs layer and a future C ABI are thin.

use std::fmt;

use crate::wire::Psn;

/// Queue pair transport type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc,
    Uc,
    Ud,
}

/// Memory access rights (`ibv_access_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    pub const NONE: Access = Access(0);
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    pub const REMOTE_READ: Access = Access(1 << 2);
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);

    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Rights from `ibv_access_flags` bits; bits we do not know are refused.
    pub const fn from_bits(bits: u32) -> Option<Access> {
        if bits & !0xf == 0 {
            Some(Access(bits))
        } else {
            None
        }
    }

    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
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
        ];
        let set: Vec<&str> =
            names.iter().filter(|(a, _)| self.contains(*a)).map(|(_, n)| *n).collect();
        write!(f, "Access({})", set.join("|"))
    }
}

/// A scatter/gather element: `length` bytes at `addr` in the region of `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Send work request opcodes (`ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm(u32),
    /// SEND that invalidates the given R_Key at the responder.
    SendWithInv(u32),
    RdmaWrite { remote_addr: u64, rkey: u32 },
    RdmaWriteWithImm { remote_addr: u64, rkey: u32, imm: u32 },
    RdmaRead { remote_addr: u64, rkey: u32 },
    CompareSwap { remote_addr: u64, rkey: u32, compare: u64, swap: u64 },
    FetchAdd { remote_addr: u64, rkey: u32, add: u64 },
}

impl SendOp {
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(self, SendOp::RdmaRead { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

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
        }
    }
}

/// Where a UD send goes: the address vector of an address handle plus the
/// remote QP and Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub dest: std::net::IpAddr,
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

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sg_list: Vec<Sge>,
    pub flags: SendFlags,
    /// Data of an inline send, copied at post time.
    pub inline_data: Vec<u8>,
    /// Destination of a UD send.
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A signaled request with no data; set `sg_list` or `inline_data`.
    pub fn new(wr_id: u64, op: SendOp) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg_list: Vec::new(),
            flags: SendFlags { signaled: true, ..SendFlags::default() },
            inline_data: Vec::new(),
            ud: None,
        }
    }

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
    pub wr_id: u64,
    pub sg_list: Vec<Sge>,
}

impl RecvWr {
    pub fn length(&self) -> u64 {
        self.sg_list.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// `ibv_wc_status`, with libibverbs' numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    FatalErr = 19,
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
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    pub imm: Option<u32>,
    /// R_Key invalidated by a SEND_WITH_INVALIDATE.
    pub invalidated_rkey: Option<u32>,
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
    QpFatal { qpn: u32 },
    /// A receive error on the responder side (`IBV_EVENT_QP_REQ_ERR` for invalid
    /// requests, `IBV_EVENT_QP_ACCESS_ERR` for access violations).
    QpRequestError { qpn: u32 },
    QpAccessError { qpn: u32 },
    /// The send queue drained after a move to SQD (`IBV_EVENT_SQ_DRAINED`).
    SqDrained { qpn: u32 },
    /// The SRQ's count of posted receives fell below its armed limit.
    SrqLimitReached { srq: u32 },
    /// The QP entered ERR and its last WQE was consumed (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached { qpn: u32 },
    /// The port's link is up (`IBV_EVENT_PORT_ACTIVE`), raised when a context opens.
    PortActive { port: u8 },
}

/// First PSN and PSN count of a work request once it is on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PsnRange {
    pub first: Psn,
    pub count: u32,
}

impl PsnRange {
    pub fn last(&self) -> Psn {
        self.first.wrapping_add(self.count.saturating_sub(1))
    }

    pub fn contains(&self, psn: Psn) -> bool {
        let d = psn.diff(self.first);
        d >= 0 && (d as u32) < self.count
    }
}
