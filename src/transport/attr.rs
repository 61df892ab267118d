//! Queue pair states and the `ibv_modify_qp` attribute model: which attributes
//! each state transition requires and which it allows, per QP type (the
//! kernel's `qp_state_table`), and the ranges each attribute must lie in.

use std::fmt;
use std::net::IpAddr;

use super::types::{Access, QpType};
use crate::wire::Psn;

/// `ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// `IBV_QPS_RESET`: just created or reset; holds no work and ignores packets.
    Reset,
    /// `IBV_QPS_INIT`: receives may be posted; nothing is sent, and incoming
    /// packets are dropped.
    Init,
    /// `IBV_QPS_RTR`, ready to receive: the responder works.
    Rtr,
    /// `IBV_QPS_RTS`, ready to send: requester and responder both work.
    Rts,
    /// `IBV_QPS_SQD`, send queue drain: requests already started finish, new
    /// ones wait; the responder keeps working.
    Sqd,
    /// `IBV_QPS_SQE`, send queue error: where libibverbs puts a UC or UD QP
    /// whose send failed. softroce never enters it (no modify leads there and
    /// the transport moves to ERR instead); UC and UD QPs may leave it for RTS.
    Sqe,
    /// `IBV_QPS_ERR`: every request is flushed with `WR_FLUSH_ERR`.
    Err,
}

/// `ibv_qp_attr_mask`, with libibverbs' bit values.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(u32);

impl AttrMask {
    /// `IBV_QP_STATE`: `state`, the state to move to.
    pub const STATE: AttrMask = AttrMask(1 << 0);
    /// `IBV_QP_CUR_STATE`: `cur_state`, which must be the state the QP is in.
    pub const CUR_STATE: AttrMask = AttrMask(1 << 1);
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: `en_sqd_async_notify`.
    pub const EN_SQD_ASYNC_NOTIFY: AttrMask = AttrMask(1 << 2);
    /// `IBV_QP_ACCESS_FLAGS`: `access_flags`.
    pub const ACCESS_FLAGS: AttrMask = AttrMask(1 << 3);
    /// `IBV_QP_PKEY_INDEX`: `pkey_index`.
    pub const PKEY_INDEX: AttrMask = AttrMask(1 << 4);
    /// `IBV_QP_PORT`: `port`.
    pub const PORT: AttrMask = AttrMask(1 << 5);
    /// `IBV_QP_QKEY`: `qkey`.
    pub const QKEY: AttrMask = AttrMask(1 << 6);
    /// `IBV_QP_AV`: the address vector, here `dest`.
    pub const AV: AttrMask = AttrMask(1 << 7);
    /// `IBV_QP_PATH_MTU`: `path_mtu`.
    pub const PATH_MTU: AttrMask = AttrMask(1 << 8);
    /// `IBV_QP_TIMEOUT`: `timeout`.
    pub const TIMEOUT: AttrMask = AttrMask(1 << 9);
    /// `IBV_QP_RETRY_CNT`: `retry_cnt`.
    pub const RETRY_CNT: AttrMask = AttrMask(1 << 10);
    /// `IBV_QP_RNR_RETRY`: `rnr_retry`.
    pub const RNR_RETRY: AttrMask = AttrMask(1 << 11);
    /// `IBV_QP_RQ_PSN`: `rq_psn`.
    pub const RQ_PSN: AttrMask = AttrMask(1 << 12);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`: `max_rd_atomic`.
    pub const MAX_QP_RD_ATOMIC: AttrMask = AttrMask(1 << 13);
    /// `IBV_QP_ALT_PATH`: the alternate path; accepted where the kernel allows
    /// it, but there are no alternate-path values here and nothing is applied.
    pub const ALT_PATH: AttrMask = AttrMask(1 << 14);
    /// `IBV_QP_MIN_RNR_TIMER`: `min_rnr_timer`.
    pub const MIN_RNR_TIMER: AttrMask = AttrMask(1 << 15);
    /// `IBV_QP_SQ_PSN`: `sq_psn`.
    pub const SQ_PSN: AttrMask = AttrMask(1 << 16);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`: `max_dest_rd_atomic`.
    pub const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask(1 << 17);
    /// `IBV_QP_PATH_MIG_STATE`: path migration state; accepted where the kernel
    /// allows it, but there is no value here and nothing is applied.
    pub const PATH_MIG_STATE: AttrMask = AttrMask(1 << 18);
    /// `IBV_QP_CAP`: resizing the queues; no transition allows it.
    pub const CAP: AttrMask = AttrMask(1 << 19);
    /// `IBV_QP_DEST_QPN`: `dest_qpn`.
    pub const DEST_QPN: AttrMask = AttrMask(1 << 20);

    const NAMES: [(AttrMask, &'static str); 21] = [
        (AttrMask::STATE, "STATE"),
        (AttrMask::CUR_STATE, "CUR_STATE"),
        (AttrMask::EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
        (AttrMask::ACCESS_FLAGS, "ACCESS_FLAGS"),
        (AttrMask::PKEY_INDEX, "PKEY_INDEX"),
        (AttrMask::PORT, "PORT"),
        (AttrMask::QKEY, "QKEY"),
        (AttrMask::AV, "AV"),
        (AttrMask::PATH_MTU, "PATH_MTU"),
        (AttrMask::TIMEOUT, "TIMEOUT"),
        (AttrMask::RETRY_CNT, "RETRY_CNT"),
        (AttrMask::RNR_RETRY, "RNR_RETRY"),
        (AttrMask::RQ_PSN, "RQ_PSN"),
        (AttrMask::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (AttrMask::ALT_PATH, "ALT_PATH"),
        (AttrMask::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (AttrMask::SQ_PSN, "SQ_PSN"),
        (AttrMask::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (AttrMask::PATH_MIG_STATE, "PATH_MIG_STATE"),
        (AttrMask::CAP, "CAP"),
        (AttrMask::DEST_QPN, "DEST_QPN"),
    ];

    /// No attributes.
    pub const fn empty() -> AttrMask {
        AttrMask(0)
    }

    /// The `ibv_qp_attr_mask` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// A mask from `ibv_qp_attr_mask` bits, unknown bits kept (a modify refuses them).
    pub const fn from_bits(bits: u32) -> AttrMask {
        AttrMask(bits)
    }

    /// The attributes of both (also `|`).
    pub const fn union(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 | other.0)
    }

    /// Whether every attribute of `other` is in the mask.
    pub const fn contains(self, other: AttrMask) -> bool {
        self.0 & other.0 == other.0
    }

    /// The attributes of `self` that are not in `other`.
    pub const fn minus(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 & !other.0)
    }

    /// Whether no attribute is in the mask.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for AttrMask {
    type Output = AttrMask;
    fn bitor(self, rhs: AttrMask) -> AttrMask {
        self.union(rhs)
    }
}

impl fmt::Debug for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<String> =
            AttrMask::NAMES.iter().filter(|(m, _)| self.contains(*m)).map(|(_, n)| n.to_string()).collect();
        let known = AttrMask::NAMES.iter().fold(AttrMask(0), |a, (m, _)| a | *m);
        let unknown = self.minus(known);
        if !unknown.is_empty() {
            names.push(format!("{:#x}", unknown.0));
        }
        write!(f, "{}", names.join("|"))
    }
}

impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Path MTU (`ibv_mtu`: 1 = 256 … 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mtu {
    /// `IBV_MTU_256`.
    Mtu256 = 1,
    /// `IBV_MTU_512`.
    Mtu512 = 2,
    /// `IBV_MTU_1024`.
    Mtu1024 = 3,
    /// `IBV_MTU_2048`.
    Mtu2048 = 4,
    /// `IBV_MTU_4096`.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes: the most payload one packet carries.
    pub const fn bytes(self) -> usize {
        128 << (self as usize)
    }

    /// The `ibv_mtu` enum value.
    pub const fn from_ibv(value: u32) -> Option<Mtu> {
        Some(match value {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The largest MTU that fits `bytes`.
    pub const fn from_bytes(bytes: usize) -> Option<Mtu> {
        Some(match bytes {
            4096.. => Mtu::Mtu4096,
            2048.. => Mtu::Mtu2048,
            1024.. => Mtu::Mtu1024,
            512.. => Mtu::Mtu512,
            256.. => Mtu::Mtu256,
            _ => return None,
        })
    }
}

/// The values of `ibv_qp_attr` the transport uses. Which of them a call to
/// modify reads is decided by the mask, as in libibverbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// `qp_state`: the state to move to; in [`Qp::attr`](crate::transport::Qp::attr),
    /// the current one.
    pub state: QpState,
    /// `cur_qp_state`: the state the caller believes the QP is in.
    pub cur_state: QpState,
    /// `qp_access_flags`: the remote operations (WRITE, READ, atomics) this QP
    /// executes as responder.
    pub access_flags: Access,
    /// `pkey_index`: index in the P_Key table; only 0 (the default P_Key) exists.
    pub pkey_index: u16,
    /// `port_num`: only port 1 exists.
    pub port: u8,
    /// `qkey` (UD): the Q_Key incoming DETHs must carry, and the one sent when a
    /// work request asks for the QP's own.
    pub qkey: u32,
    /// The peer's address (from the address vector's GID).
    pub dest: Option<IpAddr>,
    /// The UDP source port the peer sends from, if a connected QP should
    /// accept packets from that port only (set with the address vector). A
    /// softroce extension against off-path injection: IBTA and rxe ignore
    /// the source port, so `None`, accepting any, is the default.
    pub peer_port: Option<u16>,
    /// `path_mtu`: payload per packet of a segmented message (connected QPs; UD
    /// uses the port's).
    pub path_mtu: Mtu,
    /// Local ACK timeout: 4.096 µs × 2^timeout; 0 waits forever.
    pub timeout: u8,
    /// Transport retries after a timeout or sequence NAK (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// `rq_psn`: the PSN the responder expects first.
    pub rq_psn: Psn,
    /// `sq_psn`: the PSN of the first request packet.
    pub sq_psn: Psn,
    /// READ/atomic requests this QP may have outstanding as requester.
    pub max_rd_atomic: u8,
    /// READ/atomic requests this QP accepts outstanding as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this responder advertises (0..=31).
    pub min_rnr_timer: u8,
    /// `dest_qp_num`: the peer's QP number (connected QPs), 24 bits.
    pub dest_qpn: u32,
    /// `en_sqd_async_notify`: raise `SqDrained` once the send queue drains in SQD.
    pub en_sqd_async_notify: bool,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            state: QpState::Reset,
            cur_state: QpState::Reset,
            access_flags: Access::NONE,
            pkey_index: 0,
            port: 1,
            qkey: 0,
            dest: None,
            peer_port: None,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            dest_qpn: 0,
            en_sqd_async_notify: false,
        }
    }
}

/// Device limits the attributes are checked against (rxe's values).
pub const MAX_RD_ATOMIC: u8 = 128;
/// The only port of a softroce device.
pub const PORT: u8 = 1;

/// Why a modify was refused; every variant names what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModifyError {
    /// The transition from the current state to the requested one is not allowed.
    InvalidTransition {
        /// The QP's current state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// Attributes the transition requires were not in the mask.
    MissingAttributes {
        /// The QP's current state.
        from: QpState,
        /// The state asked for.
        to: QpState,
        /// The required attributes that were not given.
        missing: AttrMask,
    },
    /// Attributes the transition does not allow were in the mask.
    UnexpectedAttributes {
        /// The QP's current state.
        from: QpState,
        /// The state asked for.
        to: QpState,
        /// The attributes given that the transition does not accept.
        unexpected: AttrMask,
    },
    /// CUR_STATE named a state the QP is not in.
    CurrentStateMismatch {
        /// The state the QP is in.
        actual: QpState,
        /// The state `cur_state` named.
        given: QpState,
    },
    /// An attribute value is out of range.
    InvalidValue {
        /// The attribute, by its `ibv_qp_attr` field name.
        attribute: &'static str,
        /// The value given.
        value: u64,
    },
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModifyError::InvalidTransition { from, to } => {
                write!(f, "QP state transition {from:?} -> {to:?} is not allowed")
            }
            ModifyError::MissingAttributes { from, to, missing } => {
                write!(f, "transition {from:?} -> {to:?} requires attributes {missing}")
            }
            ModifyError::UnexpectedAttributes { from, to, unexpected } => {
                write!(f, "transition {from:?} -> {to:?} does not accept attributes {unexpected}")
            }
            ModifyError::CurrentStateMismatch { actual, given } => {
                write!(f, "cur_qp_state is {given:?} but the QP is in {actual:?}")
            }
            ModifyError::InvalidValue { attribute, value } => {
                write!(f, "attribute {attribute} has invalid value {value}")
            }
        }
    }
}

impl std::error::Error for ModifyError {}

/// Required and optional attributes of a transition, or `None` if the
/// transition is not allowed for this QP type.
pub fn transition_masks(qp_type: QpType, from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as M;
    use QpState::*;
    let by_type = |rc: AttrMask, uc: AttrMask, ud: AttrMask| match qp_type {
        QpType::Rc => rc,
        QpType::Uc => uc,
        QpType::Ud => ud,
    };
    let none = M::empty();
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => (
            by_type(
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                M::PKEY_INDEX | M::PORT | M::QKEY,
            ),
            none,
        ),
        (Init, Init) => (
            none,
            by_type(
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                M::PKEY_INDEX | M::PORT | M::QKEY,
            ),
        ),
        (Init, Rtr) => (
            by_type(
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                none,
            ),
            by_type(
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                M::PKEY_INDEX | M::QKEY,
            ),
        ),
        (Rtr, Rts) => (
            by_type(M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC, M::SQ_PSN, M::SQ_PSN),
            by_type(
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
                M::CUR_STATE | M::QKEY,
            ),
        ),
        (Rts, Rts) | (Sqd, Rts) => (
            none,
            by_type(
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
                M::CUR_STATE | M::QKEY,
            ),
        ),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            none,
            by_type(
                M::AV
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
                M::PKEY_INDEX | M::QKEY,
            ),
        ),
        (Sqe, Rts) if qp_type != QpType::Rc => {
            (none, by_type(none, M::CUR_STATE | M::ACCESS_FLAGS, M::CUR_STATE | M::QKEY))
        }
        _ => return None,
    })
}

/// Checks that the masked attribute values lie in their ranges.
pub fn check_values(attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
    let invalid = |attribute, value: u64| Err(ModifyError::InvalidValue { attribute, value });
    if mask.contains(AttrMask::PORT) && attr.port != PORT {
        return invalid("port_num", attr.port.into());
    }
    if mask.contains(AttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
        return invalid("pkey_index", attr.pkey_index.into());
    }
    if mask.contains(AttrMask::TIMEOUT) && attr.timeout > 31 {
        return invalid("timeout", attr.timeout.into());
    }
    if mask.contains(AttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
        return invalid("retry_cnt", attr.retry_cnt.into());
    }
    if mask.contains(AttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
        return invalid("rnr_retry", attr.rnr_retry.into());
    }
    if mask.contains(AttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return invalid("min_rnr_timer", attr.min_rnr_timer.into());
    }
    if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > MAX_RD_ATOMIC {
        return invalid("max_rd_atomic", attr.max_rd_atomic.into());
    }
    if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > MAX_RD_ATOMIC {
        return invalid("max_dest_rd_atomic", attr.max_dest_rd_atomic.into());
    }
    if mask.contains(AttrMask::DEST_QPN) && attr.dest_qpn > 0x00ff_ffff {
        return invalid("dest_qp_num", attr.dest_qpn.into());
    }
    if mask.contains(AttrMask::AV) && attr.dest.is_none() {
        return invalid("ah_attr (no destination GID)", 0);
    }
    Ok(())
}

/// Validates a modify against the current state and returns the new state.
pub fn check_modify(qp_type: QpType, current: QpState, attr: &QpAttr, mask: AttrMask) -> Result<QpState, ModifyError> {
    if mask.contains(AttrMask::CUR_STATE) && attr.cur_state != current {
        // libibverbs allows CUR_STATE only to tell the driver the state it is in.
        return Err(ModifyError::CurrentStateMismatch { actual: current, given: attr.cur_state });
    }
    let to = if mask.contains(AttrMask::STATE) { attr.state } else { current };
    let (required, optional) =
        transition_masks(qp_type, current, to).ok_or(ModifyError::InvalidTransition { from: current, to })?;
    let given = mask.minus(AttrMask::STATE);
    let missing = required.minus(given);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes { from: current, to, missing });
    }
    let unexpected = given.minus(required | optional);
    if !unexpected.is_empty() {
        return Err(ModifyError::UnexpectedAttributes { from: current, to, unexpected });
    }
    check_values(attr, mask)?;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_connect_sequence() {
        let mut attr = QpAttr { state: QpState::Init, ..QpAttr::default() };
        let init = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        assert_eq!(check_modify(QpType::Rc, QpState::Reset, &attr, init), Ok(QpState::Init));

        attr.state = QpState::Rtr;
        let rtr_missing = AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Init, &attr, rtr_missing),
            Err(ModifyError::MissingAttributes {
                from: QpState::Init,
                to: QpState::Rtr,
                missing: AttrMask::DEST_QPN | AttrMask::RQ_PSN | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER,
            })
        );
    }

    #[test]
    fn ud_needs_qkey_and_no_av() {
        let attr = QpAttr { state: QpState::Init, ..QpAttr::default() };
        let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        assert!(matches!(
            check_modify(QpType::Ud, QpState::Reset, &attr, mask),
            Err(ModifyError::MissingAttributes { missing: AttrMask::QKEY, .. })
        ));
        let rtr = QpAttr { state: QpState::Rtr, ..attr };
        assert_eq!(
            check_modify(QpType::Ud, QpState::Init, &rtr, AttrMask::STATE | AttrMask::AV),
            Err(ModifyError::UnexpectedAttributes { from: QpState::Init, to: QpState::Rtr, unexpected: AttrMask::AV })
        );
    }

    #[test]
    fn invalid_transitions_and_values() {
        let attr = QpAttr { state: QpState::Rts, ..QpAttr::default() };
        assert_eq!(
            check_modify(QpType::Rc, QpState::Reset, &attr, AttrMask::STATE),
            Err(ModifyError::InvalidTransition { from: QpState::Reset, to: QpState::Rts })
        );
        let any_to_err = QpAttr { state: QpState::Err, ..QpAttr::default() };
        assert_eq!(check_modify(QpType::Rc, QpState::Rtr, &any_to_err, AttrMask::STATE), Ok(QpState::Err));
        let bad_port = QpAttr { state: QpState::Init, port: 2, ..QpAttr::default() };
        let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Reset, &bad_port, mask),
            Err(ModifyError::InvalidValue { attribute: "port_num", value: 2 })
        );
        let sqe = QpAttr { state: QpState::Rts, ..QpAttr::default() };
        assert!(check_modify(QpType::Rc, QpState::Sqe, &sqe, AttrMask::STATE).is_err());
        assert!(check_modify(QpType::Uc, QpState::Sqe, &sqe, AttrMask::STATE).is_ok());
    }

    #[test]
    fn mtu_values() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_ibv(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_ibv(6), None);
        assert_eq!(Mtu::from_bytes(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(9000), Some(Mtu::Mtu4096));
    }
}
