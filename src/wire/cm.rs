//! Communication management messages (IBTA 12.6): how two ends set up, tear
//! down and resolve connections, as MADs of class 0x07 version 2 on QP 1.
//!
//! Each message fills the 232 data bytes of its MAD ([`super::mad`]): its
//! fields, then private data for the consumer up to the end. The field tables
//! below give each field as byte\[bit\] and width in bits, the IBTA's notation
//! (bit 0 is the most significant); they are the layouts of the Linux kernel's
//! `include/rdma/ibta_vol1_c12.h`, which is what a peer speaks.
//!
//! | message | attribute | purpose | private data |
//! | --- | --- | --- | --- |
//! | REQ | 0x0010 | request a connection | 92 bytes at 140 |
//! | MRA | 0x0011 | message receipt acknowledged: "more time, please" | 222 at 10 |
//! | REJ | 0x0012 | reject a REQ or REP | 148 at 84 |
//! | REP | 0x0013 | accept a REQ | 196 at 36 |
//! | RTU | 0x0014 | ready to use: the REP arrived, traffic may flow | 224 at 8 |
//! | DREQ | 0x0015 | request a disconnection | 220 at 12 |
//! | DREP | 0x0016 | confirm a disconnection | 224 at 8 |
//! | SIDR_REQ | 0x0017 | ask which UD QP serves a service ID | 216 at 16 |
//! | SIDR_REP | 0x0018 | answer a SIDR_REQ with a QPN and Q_Key | 136 at 96 |
//!
//! Like every wire type, a message is a view over bytes (`Req<T>`, …) and a
//! value (`ReqRepr`, …), gathered in [`CmMessage`]; [`CmMad`] adds the MAD
//! header. Parsing never panics. Reserved bits are ignored when read and
//! written as zero, so a message parses back to the same value and the
//! kernel's messages re-emit byte for byte. A value is only emitted if it
//! reads back unchanged: a field too wide for its bits is
//! [`Error::FieldOverflow`], a reserved code [`Error::ReservedValue`].

use super::bytes::{need, Bits};
use super::mad::{Mad, MadRepr, DATA_LEN};
use super::{Error, Psn, Result};

/// The CM class version of IBTA 1.2 onward, the one the kernel speaks.
pub const CLASS_VERSION: u8 = 2;

/// CM attribute IDs: which message a MAD carries.
pub mod attr {
    /// ClassPortInfo (not a connection message; not parsed here).
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Connection reject.
    pub const REJ: u16 = 0x0012;
    /// Connection reply.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnection request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnection reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path (path migration; not parsed here).
    pub const LAP: u16 = 0x0019;
    /// Alternate path response (not parsed here).
    pub const APR: u16 = 0x001a;
}

/// Private data of a REQ.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private data of an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Private data of a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Private data of a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private data of an RTU.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Private data of a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Private data of a DREP.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// Private data of a SIDR_REQ.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Private data of a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Additional rejection information of a REJ, at most.
pub const ARI_LEN: usize = 72;
/// Additional information of a SIDR_REP, at most.
pub const SIDR_INFO_LEN: usize = 72;

/// The time a 5-bit CM timeout code stands for: 4.096 µs × 2^code, in
/// nanoseconds (code 20 ≈ 4.3 s, code 31 ≈ 2.4 h; larger codes count as 31).
pub const fn timeout_nanos(code: u8) -> u64 {
    let code = if code > 31 { 31 } else { code };
    4096 << code
}

/// The bytes of a path MTU code (IBTA 9.6: 1 = 256 … 5 = 4096); `None` for
/// the reserved codes.
pub const fn mtu_bytes(code: u8) -> Option<u32> {
    match code {
        1..=5 => Some(128 << code),
        _ => None,
    }
}

/// A field value as a view reads and writes it: a typed value from the bits.
trait FieldValue: Sized {
    fn from_bits(bits: u64) -> Self;
    fn into_bits(self) -> u64;
}

macro_rules! int_field_value {
    ($($ty:ty),*) => {$(
        impl FieldValue for $ty {
            fn from_bits(bits: u64) -> Self {
                bits as $ty
            }
            fn into_bits(self) -> u64 {
                u64::from(self)
            }
        }
    )*};
}
int_field_value!(u8, u16, u32, u64);

impl FieldValue for bool {
    fn from_bits(bits: u64) -> Self {
        bits != 0
    }
    fn into_bits(self) -> u64 {
        u64::from(self)
    }
}

impl FieldValue for Psn {
    fn from_bits(bits: u64) -> Self {
        Psn::new(bits as u32)
    }
    fn into_bits(self) -> u64 {
        u64::from(self.value())
    }
}

impl FieldValue for TransportService {
    fn from_bits(bits: u64) -> Self {
        TransportService::from_code(bits as u8)
    }
    fn into_bits(self) -> u64 {
        u64::from(self.code())
    }
}

/// A fixed-size view with getters and setters for its bit fields and byte
/// ranges. Setters drop bits beyond a field's width; values check their
/// fields when emitted.
macro_rules! cm_view {
    (
        $(#[$doc:meta])* $name:ident, $len:expr;
        fields { $( $(#[$fdoc:meta])* $get:ident / $set:ident: $ty:ty = ($byte:expr, $bit:expr, $width:expr); )* }
        bytes { $( $(#[$bdoc:meta])* $bget:ident / $bmut:ident = ($at:expr, $blen:expr); )* }
    ) => {
        fixed_view!($(#[$doc])* $name, $len);

        impl<T: AsRef<[u8]>> $name<T> {
            $(
                $(#[$fdoc])*
                pub fn $get(&self) -> $ty {
                    <$ty as FieldValue>::from_bits(const { Bits::new($byte, $bit, $width) }.get(self.buffer.as_ref()))
                }
            )*
            $(
                $(#[$bdoc])*
                pub fn $bget(&self) -> &[u8] {
                    &self.buffer.as_ref()[$at..$at + $blen]
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Writes [`Self::", stringify!($get), "`]; bits beyond the field's width are dropped.")]
                pub fn $set(&mut self, value: $ty) {
                    const { Bits::new($byte, $bit, $width) }.set(self.buffer.as_mut(), value.into_bits())
                }
            )*
            $(
                #[doc = concat!("[`Self::", stringify!($bget), "`], to write.")]
                pub fn $bmut(&mut self) -> &mut [u8] {
                    &mut self.buffer.as_mut()[$at..$at + $blen]
                }
            )*
        }
    };
}

/// The transport service type of a REQ (byte 43 bits 5-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportService {
    /// 0: Reliable Connected.
    Rc,
    /// 1: Unreliable Connected.
    Uc,
    /// 2: Reliable Datagram (neither rxe nor softroce speak it).
    Rd,
    /// 3: the extended transport type (byte 51) says which: 1 is XRC.
    Extended,
}

impl TransportService {
    /// The two-bit code.
    pub const fn code(self) -> u8 {
        match self {
            TransportService::Rc => 0,
            TransportService::Uc => 1,
            TransportService::Rd => 2,
            TransportService::Extended => 3,
        }
    }

    /// The service for the low two bits of `code`.
    pub const fn from_code(code: u8) -> TransportService {
        match code & 3 {
            0 => TransportService::Rc,
            1 => TransportService::Uc,
            2 => TransportService::Rd,
            _ => TransportService::Extended,
        }
    }
}

/// Which message an MRA acknowledges or a REJ rejects (two bits; 3 is reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageRef {
    /// 0: a REQ.
    Req,
    /// 1: a REP.
    Rep,
    /// 2: in an MRA, a LAP; in a REJ, no message in particular (the kernel's
    /// `CM_MSG_RESPONSE_OTHER`, e.g. a REJ for a stale connection).
    Other,
}

impl MessageRef {
    /// The two-bit code.
    pub const fn code(self) -> u8 {
        match self {
            MessageRef::Req => 0,
            MessageRef::Rep => 1,
            MessageRef::Other => 2,
        }
    }

    /// The reference for a code; 3 is [`Error::ReservedValue`].
    pub fn from_code(code: u8, field: &'static str) -> Result<MessageRef> {
        match code {
            0 => Ok(MessageRef::Req),
            1 => Ok(MessageRef::Rep),
            2 => Ok(MessageRef::Other),
            _ => Err(Error::ReservedValue { field, value: code.into() }),
        }
    }
}

/// A REJ's reason (the kernel's `enum ib_cm_rej_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejReason(pub u16);

impl RejReason {
    /// 1: no QP available.
    pub const NO_QP: RejReason = RejReason(1);
    /// 2: no EEC available.
    pub const NO_EEC: RejReason = RejReason(2);
    /// 3: no resources available.
    pub const NO_RESOURCES: RejReason = RejReason(3);
    /// 4: timeout: the sender gave up waiting for the answer.
    pub const TIMEOUT: RejReason = RejReason(4);
    /// 5: unsupported request.
    pub const UNSUPPORTED: RejReason = RejReason(5);
    /// 6: invalid communication ID.
    pub const INVALID_COMM_ID: RejReason = RejReason(6);
    /// 7: invalid communication instance.
    pub const INVALID_COMM_INSTANCE: RejReason = RejReason(7);
    /// 8: invalid service ID: nobody listens there.
    pub const INVALID_SERVICE_ID: RejReason = RejReason(8);
    /// 9: invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: RejReason = RejReason(9);
    /// 10: stale connection: the QP is still connected elsewhere.
    pub const STALE_CONN: RejReason = RejReason(10);
    /// 11: RDC does not exist.
    pub const RDC_NOT_EXIST: RejReason = RejReason(11);
    /// 12: primary remote port GID rejected.
    pub const INVALID_GID: RejReason = RejReason(12);
    /// 13: primary remote port LID rejected.
    pub const INVALID_LID: RejReason = RejReason(13);
    /// 14: primary SL rejected.
    pub const INVALID_SL: RejReason = RejReason(14);
    /// 15: primary traffic class rejected.
    pub const INVALID_TRAFFIC_CLASS: RejReason = RejReason(15);
    /// 16: primary hop limit rejected.
    pub const INVALID_HOP_LIMIT: RejReason = RejReason(16);
    /// 17: primary packet rate rejected.
    pub const INVALID_PACKET_RATE: RejReason = RejReason(17);
    /// 18: alternate remote port GID rejected.
    pub const INVALID_ALT_GID: RejReason = RejReason(18);
    /// 19: alternate remote port LID rejected.
    pub const INVALID_ALT_LID: RejReason = RejReason(19);
    /// 20: alternate SL rejected.
    pub const INVALID_ALT_SL: RejReason = RejReason(20);
    /// 21: alternate traffic class rejected.
    pub const INVALID_ALT_TRAFFIC_CLASS: RejReason = RejReason(21);
    /// 22: alternate hop limit rejected.
    pub const INVALID_ALT_HOP_LIMIT: RejReason = RejReason(22);
    /// 23: alternate packet rate rejected.
    pub const INVALID_ALT_PACKET_RATE: RejReason = RejReason(23);
    /// 24: port and CM redirection.
    pub const PORT_CM_REDIRECT: RejReason = RejReason(24);
    /// 25: port redirection.
    pub const PORT_REDIRECT: RejReason = RejReason(25);
    /// 26: invalid path MTU.
    pub const INVALID_MTU: RejReason = RejReason(26);
    /// 27: insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: RejReason = RejReason(27);
    /// 28: consumer-defined: the application said no (`rdma_reject`).
    pub const CONSUMER_DEFINED: RejReason = RejReason(28);
    /// 29: invalid RNR retry count.
    pub const INVALID_RNR_RETRY: RejReason = RejReason(29);
    /// 30: duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: RejReason = RejReason(30);
    /// 31: invalid class version.
    pub const INVALID_CLASS_VERSION: RejReason = RejReason(31);
    /// 32: invalid primary flow label.
    pub const INVALID_FLOW_LABEL: RejReason = RejReason(32);
    /// 33: invalid alternate flow label.
    pub const INVALID_ALT_FLOW_LABEL: RejReason = RejReason(33);
    /// 35: vendor option not supported (Enhanced Connection Establishment).
    pub const VENDOR_OPTION_NOT_SUPPORTED: RejReason = RejReason(35);

    /// The reason's name, e.g. "invalid service ID"; `None` for codes not defined.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "no QP",
            2 => "no EEC",
            3 => "no resources",
            4 => "timeout",
            5 => "unsupported request",
            6 => "invalid communication ID",
            7 => "invalid communication instance",
            8 => "invalid service ID",
            9 => "invalid transport service type",
            10 => "stale connection",
            11 => "RDC does not exist",
            12 => "invalid GID",
            13 => "invalid LID",
            14 => "invalid SL",
            15 => "invalid traffic class",
            16 => "invalid hop limit",
            17 => "invalid packet rate",
            18 => "invalid alternate GID",
            19 => "invalid alternate LID",
            20 => "invalid alternate SL",
            21 => "invalid alternate traffic class",
            22 => "invalid alternate hop limit",
            23 => "invalid alternate packet rate",
            24 => "port and CM redirection",
            25 => "port redirection",
            26 => "invalid path MTU",
            27 => "insufficient responder resources",
            28 => "consumer defined",
            29 => "invalid RNR retry count",
            30 => "duplicate local communication ID",
            31 => "invalid class version",
            32 => "invalid flow label",
            33 => "invalid alternate flow label",
            35 => "vendor option not supported",
            _ => return None,
        })
    }
}

/// A SIDR_REP's status (the kernel's `enum ib_cm_sidr_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    /// 1: service ID not supported.
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    /// 2: rejected by the service provider.
    pub const REJECT: SidrStatus = SidrStatus(2);
    /// 3: no QP available.
    pub const NO_QP: SidrStatus = SidrStatus(3);
    /// 4: redirected: the additional information says where.
    pub const REDIRECT: SidrStatus = SidrStatus(4);
    /// 5: unsupported class version.
    pub const UNSUPPORTED_VERSION: SidrStatus = SidrStatus(5);

    /// The status's name; `None` for codes not defined.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "success",
            1 => "service ID not supported",
            2 => "rejected",
            3 => "no QP",
            4 => "redirect",
            5 => "unsupported class version",
            _ => return None,
        })
    }
}

/// Checks a length field against the bytes it counts.
fn check_len_field(field: &'static str, len: u8, max: usize) -> Result<()> {
    if usize::from(len) > max {
        return Err(Error::ReservedValue { field, value: len.into() });
    }
    Ok(())
}

/// The first `N` bytes of `bytes` as an array (callers slice exactly `N`).
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

/// `data` as private data of `N` bytes, zero-padded; longer data is
/// [`Error::FieldOverflow`]. Applications hand over less than a message
/// holds; the wire always carries all of it.
pub fn private_data<const N: usize>(data: &[u8]) -> Result<[u8; N]> {
    if data.len() > N {
        return Err(Error::FieldOverflow);
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Ok(out)
}

// ------------------------------------------------------------------ paths

cm_view! {
    /// A path as a REQ describes it (44 bytes, the primary at byte 52, the
    /// alternate at 96): addresses, and how packets travel between them.
    CmPath, 44;
    fields {
        /// Local port LID; 0xffff on RoCE, which has no LIDs.
        local_lid / set_local_lid: u16 = (0, 0, 16);
        /// Remote port LID; 0xffff on RoCE.
        remote_lid / set_remote_lid: u16 = (2, 0, 16);
        /// Flow label (20 bits); on RoCEv2 it also picks the UDP source port.
        flow_label / set_flow_label: u32 = (36, 0, 20);
        /// Packet rate (6 bits, IBTA 9.6 rate code).
        packet_rate / set_packet_rate: u8 = (39, 2, 6);
        /// Traffic class: the IP DSCP and ECN byte.
        traffic_class / set_traffic_class: u8 = (40, 0, 8);
        /// Hop limit: the IP TTL.
        hop_limit / set_hop_limit: u8 = (41, 0, 8);
        /// Service level (4 bits).
        sl / set_sl: u8 = (42, 0, 4);
        /// Subnet local: both ends on one subnet (no GRH needed on IB).
        subnet_local / set_subnet_local: bool = (42, 4, 1);
        /// Local ACK timeout (5 bits, 4.096 µs × 2^t): the transport timeout
        /// the requester's QP uses.
        local_ack_timeout / set_local_ack_timeout: u8 = (43, 0, 5);
    }
    bytes {
        /// Local port GID: on RoCEv2 the requester's IP address.
        local_gid / local_gid_mut = (4, 16);
        /// Remote port GID: the responder's IP address.
        remote_gid / remote_gid_mut = (20, 16);
    }
}

/// The value of a [`CmPath`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPathRepr {
    /// Local port LID (0xffff on RoCE).
    pub local_lid: u16,
    /// Remote port LID (0xffff on RoCE).
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl CmPathRepr {
    /// Reads a path.
    pub fn parse<T: AsRef<[u8]>>(path: &CmPath<T>) -> Result<CmPathRepr> {
        path.check_len()?;
        Ok(CmPathRepr {
            local_lid: path.local_lid(),
            remote_lid: path.remote_lid(),
            local_gid: array(path.local_gid()),
            remote_gid: array(path.remote_gid()),
            flow_label: path.flow_label(),
            packet_rate: path.packet_rate(),
            traffic_class: path.traffic_class(),
            hop_limit: path.hop_limit(),
            sl: path.sl(),
            subnet_local: path.subnet_local(),
            local_ack_timeout: path.local_ack_timeout(),
        })
    }

    /// Writes the path's fields; the reserved bits are left as they are
    /// (a whole message is zeroed before its paths are written).
    fn write<T: AsRef<[u8]> + AsMut<[u8]>>(&self, path: &mut CmPath<T>) {
        path.set_local_lid(self.local_lid);
        path.set_remote_lid(self.remote_lid);
        path.local_gid_mut().copy_from_slice(&self.local_gid);
        path.remote_gid_mut().copy_from_slice(&self.remote_gid);
        path.set_flow_label(self.flow_label);
        path.set_packet_rate(self.packet_rate);
        path.set_traffic_class(self.traffic_class);
        path.set_hop_limit(self.hop_limit);
        path.set_sl(self.sl);
        path.set_subnet_local(self.subnet_local);
        path.set_local_ack_timeout(self.local_ack_timeout);
    }

    /// Whether the path is all zero: how a REQ says it has no alternate path.
    pub fn is_empty(&self) -> bool {
        *self == CmPathRepr::default()
    }
}

// ------------------------------------------------------------------ REQ

cm_view! {
    /// REQ, the connection request (IBTA table 106 as the kernel numbers it): who asks, for which
    /// service, with which QP, expecting which PSN, over which path.
    Req, DATA_LEN;
    fields {
        /// Local communication ID: the requester's handle for the connection.
        local_comm_id / set_local_comm_id: u32 = (0, 0, 32);
        /// Vendor ID (24 bits, bytes 5-7): Enhanced Connection Establishment.
        vendor_id / set_vendor_id: u32 = (5, 0, 24);
        /// Service ID: what the requester connects to (rdma_cm: port space and port).
        service_id / set_service_id: u64 = (8, 0, 64);
        /// Local CA GUID: the requester's device.
        local_ca_guid / set_local_ca_guid: u64 = (16, 0, 64);
        /// Local Q_Key (RD only; zero for RC).
        local_qkey / set_local_qkey: u32 = (28, 0, 32);
        /// Local QPN (24 bits): the requester's QP.
        local_qpn / set_local_qpn: u32 = (32, 0, 24);
        /// Responder resources: RDMA READs and atomics the requester accepts
        /// in flight from the responder.
        responder_resources / set_responder_resources: u8 = (35, 0, 8);
        /// Local EECN (24 bits, RD only).
        local_eecn / set_local_eecn: u32 = (36, 0, 24);
        /// Initiator depth: RDMA READs and atomics the requester will have in
        /// flight towards the responder.
        initiator_depth / set_initiator_depth: u8 = (39, 0, 8);
        /// Remote EECN (24 bits, RD only).
        remote_eecn / set_remote_eecn: u32 = (40, 0, 24);
        /// Remote CM response timeout (5 bits): how long the responder may
        /// take to answer.
        remote_cm_response_timeout / set_remote_cm_response_timeout: u8 = (43, 0, 5);
        /// Transport service type (2 bits).
        transport_service / set_transport_service: TransportService = (43, 5, 2);
        /// End-to-end flow control: the requester's QP sends credits.
        end_to_end_flow_control / set_end_to_end_flow_control: bool = (43, 7, 1);
        /// Starting PSN (24 bits): the first PSN the requester's QP expects
        /// to receive, so the responder's first send PSN (the kernel sets the
        /// passive side's `sq_psn` from it).
        starting_psn / set_starting_psn: Psn = (44, 0, 24);
        /// Local CM response timeout (5 bits): how long the requester takes to
        /// answer the responder.
        local_cm_response_timeout / set_local_cm_response_timeout: u8 = (47, 0, 5);
        /// Retry count (3 bits): transport retries on timeout.
        retry_count / set_retry_count: u8 = (47, 5, 3);
        /// P_Key of the connection.
        pkey / set_pkey: u16 = (48, 0, 16);
        /// Path packet payload MTU (4 bits, [`mtu_bytes`]).
        path_mtu / set_path_mtu: u8 = (50, 0, 4);
        /// RDC exists (RD only).
        rdc_exists / set_rdc_exists: bool = (50, 4, 1);
        /// RNR retry count (3 bits; 7 means without limit).
        rnr_retry_count / set_rnr_retry_count: u8 = (50, 5, 3);
        /// Max CM retries (4 bits): how often the requester resends the REQ.
        max_cm_retries / set_max_cm_retries: u8 = (51, 0, 4);
        /// SRQ: the requester's QP takes its receives from a shared queue.
        srq / set_srq: bool = (51, 4, 1);
        /// Extended transport type (3 bits; 1 = XRC when the transport
        /// service type is 3).
        extended_transport_type / set_extended_transport_type: u8 = (51, 5, 3);
        /// SAP supported (byte 139 bit 5).
        sap_supported / set_sap_supported: bool = (139, 5, 1);
    }
    bytes {
        /// The primary path's 44 bytes ([`CmPath`]).
        primary_path_bytes / primary_path_bytes_mut = (52, 44);
        /// The alternate path's 44 bytes; all zero when there is none.
        alternate_path_bytes / alternate_path_bytes_mut = (96, 44);
        /// Private data: rdma_cm puts its [`super::cma::CmaHeader`] first.
        private_data / private_data_mut = (140, REQ_PRIVATE_DATA_LEN);
    }
}

impl<T: AsRef<[u8]>> Req<T> {
    /// The primary path.
    pub fn primary_path(&self) -> CmPath<&[u8]> {
        CmPath::new_unchecked(self.primary_path_bytes())
    }
    /// The alternate path.
    pub fn alternate_path(&self) -> CmPath<&[u8]> {
        CmPath::new_unchecked(self.alternate_path_bytes())
    }
}

/// The value of a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport_service: TransportService,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN: the responder sends from it.
    pub starting_psn: Psn,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU code (4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary_path: CmPathRepr,
    /// The alternate path (all zero when there is none).
    pub alternate_path: CmPathRepr,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data.
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Reads a REQ; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(req: &Req<T>) -> Result<ReqRepr> {
        req.check_len()?;
        Ok(ReqRepr {
            local_comm_id: req.local_comm_id(),
            vendor_id: req.vendor_id(),
            service_id: req.service_id(),
            local_ca_guid: req.local_ca_guid(),
            local_qkey: req.local_qkey(),
            local_qpn: req.local_qpn(),
            responder_resources: req.responder_resources(),
            local_eecn: req.local_eecn(),
            initiator_depth: req.initiator_depth(),
            remote_eecn: req.remote_eecn(),
            remote_cm_response_timeout: req.remote_cm_response_timeout(),
            transport_service: req.transport_service(),
            end_to_end_flow_control: req.end_to_end_flow_control(),
            starting_psn: req.starting_psn(),
            local_cm_response_timeout: req.local_cm_response_timeout(),
            retry_count: req.retry_count(),
            pkey: req.pkey(),
            path_mtu: req.path_mtu(),
            rdc_exists: req.rdc_exists(),
            rnr_retry_count: req.rnr_retry_count(),
            max_cm_retries: req.max_cm_retries(),
            srq: req.srq(),
            extended_transport_type: req.extended_transport_type(),
            primary_path: CmPathRepr::parse(&req.primary_path())?,
            alternate_path: CmPathRepr::parse(&req.alternate_path())?,
            sap_supported: req.sap_supported(),
            private_data: array(req.private_data()),
        })
    }

    /// Writes the REQ over the whole data area, reserved bits zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, req: &mut Req<T>) -> Result<()> {
        req.check_len()?;
        req.buffer.as_mut()[..DATA_LEN].fill(0);
        req.set_local_comm_id(self.local_comm_id);
        req.set_vendor_id(self.vendor_id);
        req.set_service_id(self.service_id);
        req.set_local_ca_guid(self.local_ca_guid);
        req.set_local_qkey(self.local_qkey);
        req.set_local_qpn(self.local_qpn);
        req.set_responder_resources(self.responder_resources);
        req.set_local_eecn(self.local_eecn);
        req.set_initiator_depth(self.initiator_depth);
        req.set_remote_eecn(self.remote_eecn);
        req.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        req.set_transport_service(self.transport_service);
        req.set_end_to_end_flow_control(self.end_to_end_flow_control);
        req.set_starting_psn(self.starting_psn);
        req.set_local_cm_response_timeout(self.local_cm_response_timeout);
        req.set_retry_count(self.retry_count);
        req.set_pkey(self.pkey);
        req.set_path_mtu(self.path_mtu);
        req.set_rdc_exists(self.rdc_exists);
        req.set_rnr_retry_count(self.rnr_retry_count);
        req.set_max_cm_retries(self.max_cm_retries);
        req.set_srq(self.srq);
        req.set_extended_transport_type(self.extended_transport_type);
        self.primary_path.write(&mut CmPath::new_unchecked(req.primary_path_bytes_mut()));
        self.alternate_path.write(&mut CmPath::new_unchecked(req.alternate_path_bytes_mut()));
        req.set_sap_supported(self.sap_supported);
        req.private_data_mut().copy_from_slice(&self.private_data);
        read_back(self, ReqRepr::parse(req))
    }
}

/// Emitting is checked by reading back: a value whose fields fit reads back
/// the same; one that does not lost bits somewhere.
fn read_back<R: PartialEq>(value: &R, parsed: Result<R>) -> Result<()> {
    if parsed? == *value {
        Ok(())
    } else {
        Err(Error::FieldOverflow)
    }
}

// ------------------------------------------------------------------ MRA

cm_view! {
    /// MRA, message receipt acknowledgement (table 107): "your message
    /// arrived; I need this long to answer", which holds off the sender's
    /// retries.
    Mra, DATA_LEN;
    fields {
        /// Local communication ID: the MRA sender's.
        local_comm_id / set_local_comm_id: u32 = (0, 0, 32);
        /// Remote communication ID: the acknowledged message sender's.
        remote_comm_id / set_remote_comm_id: u32 = (4, 0, 32);
        /// Message MRAed (2 bits, [`MessageRef`]).
        message_mraed / set_message_mraed: u8 = (8, 0, 2);
        /// Service timeout (5 bits): the extra time asked for.
        service_timeout / set_service_timeout: u8 = (9, 0, 5);
    }
    bytes {
        /// Private data.
        private_data / private_data_mut = (10, MRA_PRIVATE_DATA_LEN);
    }
}

/// The value of an MRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MraRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub message_mraed: MessageRef,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl MraRepr {
    /// Reads an MRA; the reserved message code 3 is an error.
    pub fn parse<T: AsRef<[u8]>>(mra: &Mra<T>) -> Result<MraRepr> {
        mra.check_len()?;
        Ok(MraRepr {
            local_comm_id: mra.local_comm_id(),
            remote_comm_id: mra.remote_comm_id(),
            message_mraed: MessageRef::from_code(mra.message_mraed(), "MRA message MRAed")?,
            service_timeout: mra.service_timeout(),
            private_data: array(mra.private_data()),
        })
    }

    /// Writes the MRA over the whole data area.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, mra: &mut Mra<T>) -> Result<()> {
        mra.check_len()?;
        mra.buffer.as_mut()[..DATA_LEN].fill(0);
        mra.set_local_comm_id(self.local_comm_id);
        mra.set_remote_comm_id(self.remote_comm_id);
        mra.set_message_mraed(self.message_mraed.code());
        mra.set_service_timeout(self.service_timeout);
        mra.private_data_mut().copy_from_slice(&self.private_data);
        read_back(self, MraRepr::parse(mra))
    }
}

// ------------------------------------------------------------------ REJ

cm_view! {
    /// REJ, connection reject (table 108): refuses a REQ or a REP, with
    /// a reason and up to 72 bytes of additional rejection information (ARI).
    Rej, DATA_LEN;
    fields {
        /// Local communication ID: the rejecter's (zero if it never had one).
        local_comm_id / set_local_comm_id: u32 = (0, 0, 32);
        /// Remote communication ID: the rejected side's.
        remote_comm_id / set_remote_comm_id: u32 = (4, 0, 32);
        /// Message rejected (2 bits, [`MessageRef`]).
        message_rejected / set_message_rejected: u8 = (8, 0, 2);
        /// Rejection information length (7 bits): bytes of ARI that count.
        ari_length / set_ari_length: u8 = (9, 0, 7);
        /// Reason ([`RejReason`]).
        reason / set_reason: u16 = (10, 0, 16);
    }
    bytes {
        /// Additional rejection information, 72 bytes of which the first
        /// [`Self::ari_length`] count.
        ari / ari_mut = (12, ARI_LEN);
        /// Private data.
        private_data / private_data_mut = (84, REJ_PRIVATE_DATA_LEN);
    }
}

/// The value of a REJ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message rejected.
    pub message_rejected: MessageRef,
    /// ARI bytes that count (at most 72).
    pub ari_length: u8,
    /// Reason.
    pub reason: RejReason,
    /// Additional rejection information, all 72 bytes as sent.
    pub ari: [u8; ARI_LEN],
    /// Private data.
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl RejRepr {
    /// The ARI bytes that count.
    pub fn ari(&self) -> &[u8] {
        &self.ari[..usize::from(self.ari_length).min(ARI_LEN)]
    }

    /// Reads a REJ; a message code 3 and an ARI length above 72 are errors.
    pub fn parse<T: AsRef<[u8]>>(rej: &Rej<T>) -> Result<RejRepr> {
        rej.check_len()?;
        check_len_field("REJ rejection information length", rej.ari_length(), ARI_LEN)?;
        Ok(RejRepr {
            local_comm_id: rej.local_comm_id(),
            remote_comm_id: rej.remote_comm_id(),
            message_rejected: MessageRef::from_code(rej.message_rejected(), "REJ message rejected")?,
            ari_length: rej.ari_length(),
            reason: RejReason(rej.reason()),
            ari: array(rej.ari()),
            private_data: array(rej.private_data()),
        })
    }

    /// Writes the REJ over the whole data area.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, rej: &mut Rej<T>) -> Result<()> {
        rej.check_len()?;
        check_len_field("REJ rejection information length", self.ari_length, ARI_LEN)?;
        rej.buffer.as_mut()[..DATA_LEN].fill(0);
        rej.set_local_comm_id(self.local_comm_id);
        rej.set_remote_comm_id(self.remote_comm_id);
        rej.set_message_rejected(self.message_rejected.code());
        rej.set_ari_length(self.ari_length);
        rej.set_reason(self.reason.0);
        rej.ari_mut().copy_from_slice(&self.ari);
        rej.private_data_mut().copy_from_slice(&self.private_data);
        read_back(self, RejRepr::parse(rej))
    }
}

// ------------------------------------------------------------------ REP

cm_view! {
    /// REP, connection reply (table 110): accepts a REQ with the
    /// responder's QP and the PSN it expects. The ECE vendor ID is spread over the
    /// low bytes of three words (15, 19, 23).
    Rep, DATA_LEN;
    fields {
        /// Local communication ID: the responder's.
        local_comm_id / set_local_comm_id: u32 = (0, 0, 32);
        /// Remote communication ID: the requester's, from its REQ.
        remote_comm_id / set_remote_comm_id: u32 = (4, 0, 32);
        /// Local Q_Key (RD only).
        local_qkey / set_local_qkey: u32 = (8, 0, 32);
        /// Local QPN (24 bits): the responder's QP.
        local_qpn / set_local_qpn: u32 = (12, 0, 24);
        /// Vendor ID bits 23-16.
        vendor_id_high / set_vendor_id_high: u8 = (15, 0, 8);
        /// Local EECN (24 bits; the kernel puts an XRC target's QPN here).
        local_eecn / set_local_eecn: u32 = (16, 0, 24);
        /// Vendor ID bits 15-8.
        vendor_id_mid / set_vendor_id_mid: u8 = (19, 0, 8);
        /// Starting PSN (24 bits): the first PSN the responder's QP expects
        /// to receive, so the requester's first send PSN.
        starting_psn / set_starting_psn: Psn = (20, 0, 24);
        /// Vendor ID bits 7-0.
        vendor_id_low / set_vendor_id_low: u8 = (23, 0, 8);
        /// Responder resources the responder grants.
        responder_resources / set_responder_resources: u8 = (24, 0, 8);
        /// Initiator depth the responder will use.
        initiator_depth / set_initiator_depth: u8 = (25, 0, 8);
        /// Target ACK delay (5 bits): the responder's own ACK delay.
        target_ack_delay / set_target_ack_delay: u8 = (26, 0, 5);
        /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
        failover_accepted / set_failover_accepted: u8 = (26, 5, 2);
        /// End-to-end flow control.
        end_to_end_flow_control / set_end_to_end_flow_control: bool = (26, 7, 1);
        /// RNR retry count (3 bits) the requester's QP is to use.
        rnr_retry_count / set_rnr_retry_count: u8 = (27, 0, 3);
        /// SRQ: the responder's QP takes its receives from a shared queue.
        srq / set_srq: bool = (27, 3, 1);
        /// Local CA GUID: the responder's device.
        local_ca_guid / set_local_ca_guid: u64 = (28, 0, 64);
    }
    bytes {
        /// Private data.
        private_data / private_data_mut = (36, REP_PRIVATE_DATA_LEN);
    }
}

/// The value of a REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Starting PSN: the requester sends from it.
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl RepRepr {
    /// Reads a REP; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(rep: &Rep<T>) -> Result<RepRepr> {
        rep.check_len()?;
        Ok(RepRepr {
            local_comm_id: rep.local_comm_id(),
            remote_comm_id: rep.remote_comm_id(),
            local_qkey: rep.local_qkey(),
            local_qpn: rep.local_qpn(),
            vendor_id: u32::from_be_bytes([0, rep.vendor_id_high(), rep.vendor_id_mid(), rep.vendor_id_low()]),
            local_eecn: rep.local_eecn(),
            starting_psn: rep.starting_psn(),
            responder_resources: rep.responder_resources(),
            initiator_depth: rep.initiator_depth(),
            target_ack_delay: rep.target_ack_delay(),
            failover_accepted: rep.failover_accepted(),
            end_to_end_flow_control: rep.end_to_end_flow_control(),
            rnr_retry_count: rep.rnr_retry_count(),
            srq: rep.srq(),
            local_ca_guid: rep.local_ca_guid(),
            private_data: array(rep.private_data()),
        })
    }

    /// Writes the REP over the whole data area.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, rep: &mut Rep<T>) -> Result<()> {
        rep.check_len()?;
        rep.buffer.as_mut()[..DATA_LEN].fill(0);
        let [top, high, mid, low] = self.vendor_id.to_be_bytes();
        if top != 0 {
            return Err(Error::FieldOverflow);
        }
        rep.set_local_comm_id(self.local_comm_id);
        rep.set_remote_comm_id(self.remote_comm_id);
        rep.set_local_qkey(self.local_qkey);
        rep.set_local_qpn(self.local_qpn);
        rep.set_vendor_id_high(high);
        rep.set_local_eecn(self.local_eecn);
        rep.set_vendor_id_mid(mid);
        rep.set_starting_psn(self.starting_psn);
        rep.set_vendor_id_low(low);
        rep.set_responder_resources(self.responder_resources);
        rep.set_initiator_depth(self.initiator_depth);
        rep.set_target_ack_delay(self.target_ack_delay);
        rep.set_failover_accepted(self.failover_accepted);
        rep.set_end_to_end_flow_control(self.end_to_end_flow_control);
        rep.set_rnr_retry_count(self.rnr_retry_count);
        rep.set_srq(self.srq);
        rep.set_local_ca_guid(self.local_ca_guid);
        rep.private_data_mut().copy_from_slice(&self.private_data);
        read_back(self, RepRepr::parse(rep))
    }
}

// ------------------------------------------------------------------ RTU, DREQ, DREP

cm_view! {
    /// RTU, ready to use (table 111): the requester got the REP and its
    /// QP is ready; the responder may now send.
    Rtu, DATA_LEN;
    fields {
        /// Local communication ID: the requester's.
        local_comm_id / set_local_comm_id: u32 = (0, 0, 32);
        /// Remote communication ID: the responder's.
        remote_comm_id / set_remote_comm_id: u32 = (4, 0, 32);
    }
    bytes {
        /// Private data.
        private_data / private_data_mut = (8, RTU_PRIVATE_DATA_LEN);
    }
}

cm_view! {
    /// DREQ, disconnection request (table 112), from either end.
    Dreq, DATA_LEN;
    fields {
        /// Local communication ID: the sender's.
        local_comm_id / set_local_comm_id: u32 = (0, 0, 32);
        /// Remote communication ID: the receiver's.
        remote_comm_id / set_remote_comm_id: u32 = (4, 0, 32);
        /// Remote QPN/EECN (24 bits): the receiver's QP, as a check.
        remote_qpn / set_remote_qpn: u32 = (8, 0, 24);
    }
    bytes {
        /// Private data.
        private_data / private_data_mut = (12, DREQ_PRIVATE_DATA_LEN);
    }
}

cm_view! {
    /// DREP, disconnection reply (table 113).
    Drep, DATA_LEN;
    fields {
        /// Local communication ID: the sender's.
        local_comm_id / set_local_comm_id: u32 = (0, 0, 32);
        /// Remote communication ID: the DREQ sender's.
        remote_comm_id / set_remote_comm_id: u32 = (4, 0, 32);
    }
    bytes {
        /// Private data.
        private_data / private_data_mut = (8, DREP_PRIVATE_DATA_LEN);
    }
}

/// The value of an RTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtuRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

impl RtuRepr {
    /// Reads an RTU; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(rtu: &Rtu<T>) -> Result<RtuRepr> {
        rtu.check_len()?;
        Ok(RtuRepr {
            local_comm_id: rtu.local_comm_id(),
            remote_comm_id: rtu.remote_comm_id(),
            private_data: array(rtu.private_data()),
        })
    }

    /// Writes the RTU over the whole data area.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, rtu: &mut Rtu<T>) -> Result<()> {
        rtu.check_len()?;
        rtu.set_local_comm_id(self.local_comm_id);
        rtu.set_remote_comm_id(self.remote_comm_id);
        rtu.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// The value of a DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits).
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl DreqRepr {
    /// Reads a DREQ; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(dreq: &Dreq<T>) -> Result<DreqRepr> {
        dreq.check_len()?;
        Ok(DreqRepr {
            local_comm_id: dreq.local_comm_id(),
            remote_comm_id: dreq.remote_comm_id(),
            remote_qpn: dreq.remote_qpn(),
            private_data: array(dreq.private_data()),
        })
    }

    /// Writes the DREQ over the whole data area.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, dreq: &mut Dreq<T>) -> Result<()> {
        dreq.check_len()?;
        if self.remote_qpn > 0x00ff_ffff {
            return Err(Error::FieldOverflow);
        }
        dreq.buffer.as_mut()[..DATA_LEN].fill(0);
        dreq.set_local_comm_id(self.local_comm_id);
        dreq.set_remote_comm_id(self.remote_comm_id);
        dreq.set_remote_qpn(self.remote_qpn);
        dreq.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// The value of a DREP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DrepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PRIVATE_DATA_LEN],
}

impl DrepRepr {
    /// Reads a DREP; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(drep: &Drep<T>) -> Result<DrepRepr> {
        drep.check_len()?;
        Ok(DrepRepr {
            local_comm_id: drep.local_comm_id(),
            remote_comm_id: drep.remote_comm_id(),
            private_data: array(drep.private_data()),
        })
    }

    /// Writes the DREP over the whole data area.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, drep: &mut Drep<T>) -> Result<()> {
        drep.check_len()?;
        drep.set_local_comm_id(self.local_comm_id);
        drep.set_remote_comm_id(self.remote_comm_id);
        drep.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}

// ------------------------------------------------------------------ SIDR

cm_view! {
    /// SIDR_REQ, service ID resolution request (table 119): which UD QP
    /// and Q_Key serve this service ID?
    SidrReq, DATA_LEN;
    fields {
        /// Request ID: the requester's handle, echoed in the reply.
        request_id / set_request_id: u32 = (0, 0, 32);
        /// P_Key the requester will send with.
        pkey / set_pkey: u16 = (4, 0, 16);
        /// Service ID asked about.
        service_id / set_service_id: u64 = (8, 0, 64);
    }
    bytes {
        /// Private data: rdma_cm puts its [`super::cma::CmaHeader`] first.
        private_data / private_data_mut = (16, SIDR_REQ_PRIVATE_DATA_LEN);
    }
}

cm_view! {
    /// SIDR_REP, service ID resolution reply (table 120). The ECE vendor
    /// ID is split: bits 23-8 at bytes 6-7, bits 7-0 at byte 11.
    SidrRep, DATA_LEN;
    fields {
        /// Request ID, from the SIDR_REQ.
        request_id / set_request_id: u32 = (0, 0, 32);
        /// Status ([`SidrStatus`]).
        status / set_status: u8 = (4, 0, 8);
        /// Additional information length: bytes of it that count.
        additional_info_length / set_additional_info_length: u8 = (5, 0, 8);
        /// Vendor ID bits 23-8.
        vendor_id_high / set_vendor_id_high: u16 = (6, 0, 16);
        /// QPN (24 bits) that serves the service ID.
        qpn / set_qpn: u32 = (8, 0, 24);
        /// Vendor ID bits 7-0.
        vendor_id_low / set_vendor_id_low: u8 = (11, 0, 8);
        /// Service ID, from the SIDR_REQ.
        service_id / set_service_id: u64 = (12, 0, 64);
        /// Q_Key to send to that QP with.
        qkey / set_qkey: u32 = (20, 0, 32);
    }
    bytes {
        /// Additional information (72 bytes; e.g. where a redirect points).
        additional_info / additional_info_mut = (24, SIDR_INFO_LEN);
        /// Private data.
        private_data / private_data_mut = (96, SIDR_REP_PRIVATE_DATA_LEN);
    }
}

/// The value of a SIDR_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data.
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl SidrReqRepr {
    /// Reads a SIDR_REQ; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(req: &SidrReq<T>) -> Result<SidrReqRepr> {
        req.check_len()?;
        Ok(SidrReqRepr {
            request_id: req.request_id(),
            pkey: req.pkey(),
            service_id: req.service_id(),
            private_data: array(req.private_data()),
        })
    }

    /// Writes the SIDR_REQ over the whole data area.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, req: &mut SidrReq<T>) -> Result<()> {
        req.check_len()?;
        req.buffer.as_mut()[..DATA_LEN].fill(0);
        req.set_request_id(self.request_id);
        req.set_pkey(self.pkey);
        req.set_service_id(self.service_id);
        req.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// The value of a SIDR_REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Additional information bytes that count (at most 72).
    pub additional_info_length: u8,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Additional information, all 72 bytes as sent.
    pub additional_info: [u8; SIDR_INFO_LEN],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl SidrRepRepr {
    /// Reads a SIDR_REP; an additional information length above 72 is an error.
    pub fn parse<T: AsRef<[u8]>>(rep: &SidrRep<T>) -> Result<SidrRepRepr> {
        rep.check_len()?;
        check_len_field("SIDR_REP additional information length", rep.additional_info_length(), SIDR_INFO_LEN)?;
        Ok(SidrRepRepr {
            request_id: rep.request_id(),
            status: SidrStatus(rep.status()),
            additional_info_length: rep.additional_info_length(),
            vendor_id: (u32::from(rep.vendor_id_high()) << 8) | u32::from(rep.vendor_id_low()),
            qpn: rep.qpn(),
            service_id: rep.service_id(),
            qkey: rep.qkey(),
            additional_info: array(rep.additional_info()),
            private_data: array(rep.private_data()),
        })
    }

    /// Writes the SIDR_REP over the whole data area.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, rep: &mut SidrRep<T>) -> Result<()> {
        rep.check_len()?;
        check_len_field("SIDR_REP additional information length", self.additional_info_length, SIDR_INFO_LEN)?;
        rep.buffer.as_mut()[..DATA_LEN].fill(0);
        rep.set_request_id(self.request_id);
        rep.set_status(self.status.0);
        rep.set_additional_info_length(self.additional_info_length);
        rep.set_vendor_id_high((self.vendor_id >> 8) as u16);
        rep.set_qpn(self.qpn);
        rep.set_vendor_id_low(self.vendor_id as u8);
        rep.set_service_id(self.service_id);
        rep.set_qkey(self.qkey);
        rep.additional_info_mut().copy_from_slice(&self.additional_info);
        rep.private_data_mut().copy_from_slice(&self.private_data);
        read_back(self, SidrRepRepr::parse(rep))
    }
}

// ------------------------------------------------------------------ messages

/// Any CM message this stack speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// Connection request.
    Req(ReqRepr),
    /// Message receipt acknowledgement.
    Mra(MraRepr),
    /// Connection reject.
    Rej(RejRepr),
    /// Connection reply.
    Rep(RepRepr),
    /// Ready to use.
    Rtu(RtuRepr),
    /// Disconnection request.
    Dreq(DreqRepr),
    /// Disconnection reply.
    Drep(DrepRepr),
    /// Service ID resolution request.
    SidrReq(SidrReqRepr),
    /// Service ID resolution reply.
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// The attribute ID that names this message in its MAD header.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The message's name, e.g. "REQ", "SIDR_REP".
    pub const fn name(&self) -> &'static str {
        match attribute_name(self.attribute_id()) {
            Some(name) => name,
            None => "?",
        }
    }

    /// The sender's communication ID (the request ID of SIDR messages).
    pub const fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
            CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(m) => m.request_id,
        }
    }

    /// The receiver's communication ID; a REQ and SIDR messages carry none.
    pub const fn remote_comm_id(&self) -> Option<u32> {
        match self {
            CmMessage::Mra(m) => Some(m.remote_comm_id),
            CmMessage::Rej(m) => Some(m.remote_comm_id),
            CmMessage::Rep(m) => Some(m.remote_comm_id),
            CmMessage::Rtu(m) => Some(m.remote_comm_id),
            CmMessage::Dreq(m) => Some(m.remote_comm_id),
            CmMessage::Drep(m) => Some(m.remote_comm_id),
            CmMessage::Req(_) | CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => None,
        }
    }

    /// The consumer's private data, all of it as the wire carries it.
    pub fn private_data(&self) -> &[u8] {
        match self {
            CmMessage::Req(m) => &m.private_data,
            CmMessage::Mra(m) => &m.private_data,
            CmMessage::Rej(m) => &m.private_data,
            CmMessage::Rep(m) => &m.private_data,
            CmMessage::Rtu(m) => &m.private_data,
            CmMessage::Dreq(m) => &m.private_data,
            CmMessage::Drep(m) => &m.private_data,
            CmMessage::SidrReq(m) => &m.private_data,
            CmMessage::SidrRep(m) => &m.private_data,
        }
    }

    /// Parses the 232 data bytes of a CM MAD whose header names `attribute_id`.
    pub fn parse(attribute_id: u16, data: &[u8]) -> Result<CmMessage> {
        need(data, DATA_LEN)?;
        Ok(match attribute_id {
            attr::REQ => CmMessage::Req(ReqRepr::parse(&Req::new_unchecked(data))?),
            attr::MRA => CmMessage::Mra(MraRepr::parse(&Mra::new_unchecked(data))?),
            attr::REJ => CmMessage::Rej(RejRepr::parse(&Rej::new_unchecked(data))?),
            attr::REP => CmMessage::Rep(RepRepr::parse(&Rep::new_unchecked(data))?),
            attr::RTU => CmMessage::Rtu(RtuRepr::parse(&Rtu::new_unchecked(data))?),
            attr::DREQ => CmMessage::Dreq(DreqRepr::parse(&Dreq::new_unchecked(data))?),
            attr::DREP => CmMessage::Drep(DrepRepr::parse(&Drep::new_unchecked(data))?),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(&SidrReq::new_unchecked(data))?),
            attr::SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(&SidrRep::new_unchecked(data))?),
            other => return Err(Error::UnknownCmAttribute(other)),
        })
    }

    /// Writes the message over the 232 data bytes of a MAD.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        need(data, DATA_LEN)?;
        let data = &mut data[..DATA_LEN];
        match self {
            CmMessage::Req(m) => m.emit(&mut Req::new_unchecked(data)),
            CmMessage::Mra(m) => m.emit(&mut Mra::new_unchecked(data)),
            CmMessage::Rej(m) => m.emit(&mut Rej::new_unchecked(data)),
            CmMessage::Rep(m) => m.emit(&mut Rep::new_unchecked(data)),
            CmMessage::Rtu(m) => m.emit(&mut Rtu::new_unchecked(data)),
            CmMessage::Dreq(m) => m.emit(&mut Dreq::new_unchecked(data)),
            CmMessage::Drep(m) => m.emit(&mut Drep::new_unchecked(data)),
            CmMessage::SidrReq(m) => m.emit(&mut SidrReq::new_unchecked(data)),
            CmMessage::SidrRep(m) => m.emit(&mut SidrRep::new_unchecked(data)),
        }
    }
}

/// The name of a CM attribute ID, e.g. "REQ"; `None` for IDs not defined.
pub const fn attribute_name(attribute_id: u16) -> Option<&'static str> {
    Some(match attribute_id {
        attr::CLASS_PORT_INFO => "ClassPortInfo",
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LAP",
        attr::APR => "APR",
        _ => return None,
    })
}

/// A whole CM MAD: the common header and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// The MAD header; its attribute ID is the message's.
    pub header: MadRepr,
    /// The message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM Send MAD carrying `message` in transaction `transaction_id`.
    pub const fn new(transaction_id: u64, message: CmMessage) -> CmMad {
        CmMad { header: MadRepr::cm_send(message.attribute_id(), transaction_id), message }
    }

    /// Parses a MAD (the payload of a UD SEND to QP 1): it must be 256 bytes
    /// at least, of the CM class version 2, and carry a message parsed here.
    pub fn parse(buf: &[u8]) -> Result<CmMad> {
        let mad = Mad::new_checked(buf)?;
        let header = MadRepr::parse(&mad)?;
        header.check_cm()?;
        let message = CmMessage::parse(header.attribute_id, mad.data())?;
        Ok(CmMad { header, message })
    }

    /// Writes the 256-byte MAD; the header must be the CM's and name the
    /// message's attribute.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        self.header.check_cm()?;
        if self.header.attribute_id != self.message.attribute_id() {
            return Err(Error::UnknownCmAttribute(self.header.attribute_id));
        }
        let mut mad = Mad::new_checked(buf)?;
        self.header.emit(&mut mad)?;
        self.message.emit(mad.data_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::mad::{HEADER_LEN, MAD_LEN};

    /// A MAD with the given header attribute and data bytes set at offsets.
    fn data_with(bytes: &[(usize, &[u8])]) -> [u8; DATA_LEN] {
        let mut data = [0u8; DATA_LEN];
        for (at, b) in bytes {
            data[*at..*at + b.len()].copy_from_slice(b);
        }
        data
    }

    /// The REQ kernel rdma_cm (rping) sent in tests/data/cm/rping.pcap, up to
    /// its private data's CMA header.
    fn rping_req() -> [u8; DATA_LEN] {
        data_with(&[
            (0, &[0x8b, 0xe7, 0xac, 0x52]),
            (8, &[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]),
            (16, &[0x50, 0x54, 0x00, 0xff, 0xfe, 0x77, 0x00, 0x03]),
            (32, &[0x00, 0x00, 0x11, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0xa0]),
            (44, &[0x74, 0x39, 0xd2, 0xa7, 0xff, 0xff, 0x37, 0xf0, 0xff, 0xff, 0xff, 0xff]),
            (56, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 3]),
            (72, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2]),
            (88, &[0x0d, 0x09, 0x20, 0x00, 0x00, 0x40, 0x00, 0x98]),
            (140, &[0x00, 0x40, 0x89, 0xf4]),
            (140 + 4 + 12, &[10, 77, 0, 3]),
            (140 + 20 + 12, &[10, 77, 0, 2]),
        ])
    }

    #[test]
    fn req_fields_of_a_kernel_req() {
        let bytes = rping_req();
        let req = Req::new_checked(&bytes[..]).unwrap();
        assert_eq!(req.local_comm_id(), 0x8be7_ac52);
        assert_eq!(req.service_id(), 0x0000_0000_0106_1c06, "RDMA_PS_TCP, port 7174");
        assert_eq!(req.local_qpn(), 0x11);
        assert_eq!((req.responder_resources(), req.initiator_depth()), (1, 1));
        assert_eq!(req.remote_cm_response_timeout(), 20);
        assert_eq!(req.transport_service(), TransportService::Rc);
        assert_eq!(req.starting_psn(), Psn::new(0x7439d2));
        assert_eq!((req.local_cm_response_timeout(), req.retry_count()), (20, 7));
        assert_eq!((req.pkey(), req.path_mtu(), req.rnr_retry_count(), req.max_cm_retries()), (0xffff, 3, 7, 15));
        let path = req.primary_path();
        assert_eq!((path.local_lid(), path.remote_lid()), (0xffff, 0xffff));
        assert_eq!(path.local_gid()[12..], [10, 77, 0, 3]);
        assert_eq!(path.flow_label(), 0x0d092);
        assert_eq!((path.traffic_class(), path.hop_limit(), path.sl()), (0, 64, 0));
        assert_eq!(path.local_ack_timeout(), 19);
        assert!(CmPathRepr::parse(&req.alternate_path()).unwrap().is_empty());

        let repr = ReqRepr::parse(&req).unwrap();
        let mut out = [0xa5u8; DATA_LEN];
        repr.emit(&mut Req::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, bytes);
    }

    /// Every field of a REQ at its largest value lands in exactly its bits:
    /// setting one field to all ones changes only the bits the kernel's
    /// layout gives it.
    #[test]
    fn req_bit_fields_are_exact() {
        let mut bytes = [0u8; DATA_LEN];
        let mut req = Req::new_unchecked(&mut bytes[..]);
        req.set_local_qpn(0xff_ffff);
        req.set_remote_cm_response_timeout(31);
        req.set_end_to_end_flow_control(true);
        req.set_retry_count(7);
        req.set_rnr_retry_count(7);
        req.set_srq(true);
        req.set_sap_supported(true);
        let mut expected = [0u8; DATA_LEN];
        expected[32..35].fill(0xff);
        expected[43] = 0b1111_1001;
        expected[47] = 0b0000_0111;
        expected[50] = 0b0000_0111;
        expected[51] = 0b0000_1000;
        expected[139] = 0b0000_0100;
        assert_eq!(bytes, expected);

        let mut bytes = [0u8; DATA_LEN];
        let mut req = Req::new_unchecked(&mut bytes[..]);
        req.set_transport_service(TransportService::Extended);
        req.set_extended_transport_type(1);
        req.set_path_mtu(5);
        req.set_rdc_exists(true);
        req.set_max_cm_retries(15);
        req.set_vendor_id(0x12_3456);
        let mut expected = [0u8; DATA_LEN];
        expected[5..8].copy_from_slice(&[0x12, 0x34, 0x56]);
        expected[43] = 0b0000_0110;
        expected[50] = 0b0101_1000;
        expected[51] = 0b1111_0001;
        assert_eq!(bytes, expected);

        // A path's flow label, packet rate, SL, subnet local and timeout.
        let mut block = [0u8; 44];
        let mut path = CmPath::new_unchecked(&mut block[..]);
        path.set_flow_label(0xf_ffff);
        path.set_packet_rate(0x3f);
        path.set_sl(0xf);
        path.set_subnet_local(true);
        path.set_local_ack_timeout(31);
        assert_eq!(block[36..40], [0xff, 0xff, 0xf0, 0x3f]);
        assert_eq!(block[42..44], [0xf8, 0xf8]);
    }

    #[test]
    fn req_emit_refuses_oversized_fields() {
        let repr = ReqRepr::parse(&Req::new_unchecked(&rping_req()[..])).unwrap();
        let mut out = [0u8; DATA_LEN];
        for bad in [
            ReqRepr { local_qpn: 1 << 24, ..repr },
            ReqRepr { retry_count: 8, ..repr },
            ReqRepr { remote_cm_response_timeout: 32, ..repr },
            ReqRepr { path_mtu: 16, ..repr },
            ReqRepr { vendor_id: 1 << 24, ..repr },
            ReqRepr { primary_path: CmPathRepr { flow_label: 1 << 20, ..repr.primary_path }, ..repr },
            ReqRepr { alternate_path: CmPathRepr { sl: 16, ..repr.alternate_path }, ..repr },
        ] {
            assert_eq!(bad.emit(&mut Req::new_unchecked(&mut out[..])), Err(Error::FieldOverflow), "{bad:?}");
        }
    }

    #[test]
    fn rep_vendor_id_spreads_over_three_words() {
        let repr = RepRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            local_qkey: 0,
            local_qpn: 0xab_cdef,
            vendor_id: 0x11_2233,
            local_eecn: 0,
            starting_psn: Psn::new(0xff_ffff),
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 31,
            failover_accepted: 1,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 0x5054_00ff_fe77_0002,
            private_data: [0; REP_PRIVATE_DATA_LEN],
        };
        let mut out = [0u8; DATA_LEN];
        repr.emit(&mut Rep::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out[12..28], [0xab, 0xcd, 0xef, 0x11, 0, 0, 0, 0x22, 0xff, 0xff, 0xff, 0x33, 1, 1, 0xfb, 0xf0]);
        assert_eq!(RepRepr::parse(&Rep::new_unchecked(&out[..])), Ok(repr));
        let mut out2 = [0u8; DATA_LEN];
        let bad = RepRepr { vendor_id: 1 << 24, ..repr };
        assert_eq!(bad.emit(&mut Rep::new_unchecked(&mut out2[..])), Err(Error::FieldOverflow));
    }

    #[test]
    fn mra_and_rej_refuse_reserved_codes() {
        let data = data_with(&[(8, &[0xc0])]);
        assert_eq!(
            CmMessage::parse(attr::MRA, &data),
            Err(Error::ReservedValue { field: "MRA message MRAed", value: 3 })
        );
        assert_eq!(
            CmMessage::parse(attr::REJ, &data),
            Err(Error::ReservedValue { field: "REJ message rejected", value: 3 })
        );
        // ARI length 73: one more than the ARI holds.
        let data = data_with(&[(9, &[73 << 1])]);
        assert_eq!(
            CmMessage::parse(attr::REJ, &data),
            Err(Error::ReservedValue { field: "REJ rejection information length", value: 73 })
        );
        let data = data_with(&[(5, &[73])]);
        assert!(matches!(CmMessage::parse(attr::SIDR_REP, &data), Err(Error::ReservedValue { value: 73, .. })));
    }

    #[test]
    fn rej_with_ari() {
        let mut ari = [0u8; ARI_LEN];
        ari[..16].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x52, 0x54, 0, 0xff, 0xfe, 0x77, 0, 2]);
        let repr = RejRepr {
            local_comm_id: 0,
            remote_comm_id: 0x8be7_ac52,
            message_rejected: MessageRef::Req,
            ari_length: 16,
            reason: RejReason::INVALID_GID,
            ari,
            private_data: [0; REJ_PRIVATE_DATA_LEN],
        };
        let mut out = [0u8; DATA_LEN];
        repr.emit(&mut Rej::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out[8..12], [0x00, 16 << 1, 0x00, 12]);
        let back = RejRepr::parse(&Rej::new_unchecked(&out[..])).unwrap();
        assert_eq!(back, repr);
        assert_eq!(back.ari().len(), 16);
        assert_eq!(RejReason::INVALID_SERVICE_ID.name(), Some("invalid service ID"));
        assert_eq!(RejReason(34).name(), None);
    }

    #[test]
    fn sidr_rep_vendor_id_and_status() {
        let repr = SidrRepRepr {
            request_id: 7,
            status: SidrStatus::SUCCESS,
            additional_info_length: 0,
            vendor_id: 0xab_cd12,
            qpn: 0x12,
            service_id: 0x0000_0000_0111_4e20,
            qkey: 0x0111_4e20,
            additional_info: [0; SIDR_INFO_LEN],
            private_data: [0; SIDR_REP_PRIVATE_DATA_LEN],
        };
        let mut out = [0u8; DATA_LEN];
        repr.emit(&mut SidrRep::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out[4..12], [0, 0, 0xab, 0xcd, 0, 0, 0x12, 0x12]);
        assert_eq!(SidrRepRepr::parse(&SidrRep::new_unchecked(&out[..])), Ok(repr));
        assert_eq!(SidrStatus::NO_QP.name(), Some("no QP"));
    }

    #[test]
    fn cm_mad_checks_class_and_attribute() {
        let message = CmMessage::Rtu(RtuRepr { local_comm_id: 1, remote_comm_id: 2, private_data: [0; 224] });
        let mad = CmMad::new(0x1234, message);
        let mut out = [0u8; MAD_LEN];
        mad.emit(&mut out).unwrap();
        assert_eq!(out[..4], [1, 7, 2, 3]);
        assert_eq!(out[16..18], [0x00, 0x14]);
        assert_eq!(CmMad::parse(&out), Ok(mad));

        let mut other_class = out;
        other_class[1] = 0x03;
        assert_eq!(CmMad::parse(&other_class), Err(Error::NotCm { base_version: 1, mgmt_class: 3, class_version: 2 }));
        let mut lap = out;
        lap[17] = 0x19;
        assert_eq!(CmMad::parse(&lap), Err(Error::UnknownCmAttribute(attr::LAP)));
        let mismatched = CmMad { header: MadRepr { attribute_id: attr::REQ, ..mad.header }, ..mad };
        assert_eq!(mismatched.emit(&mut out), Err(Error::UnknownCmAttribute(attr::REQ)));
        assert_eq!(CmMad::parse(&out[..MAD_LEN - 1]), Err(Error::Truncated { needed: 256, got: 255 }));
        assert_eq!(
            CmMessage::parse(attr::REQ, &out[HEADER_LEN..MAD_LEN - 1]),
            Err(Error::Truncated { needed: 232, got: 231 })
        );
        assert_eq!(mad.emit(&mut [0u8; 100]), Err(Error::Truncated { needed: 256, got: 100 }));
    }

    #[test]
    fn private_data_lengths_fill_the_mad() {
        for (start, len) in [
            (140, REQ_PRIVATE_DATA_LEN),
            (10, MRA_PRIVATE_DATA_LEN),
            (84, REJ_PRIVATE_DATA_LEN),
            (36, REP_PRIVATE_DATA_LEN),
            (8, RTU_PRIVATE_DATA_LEN),
            (12, DREQ_PRIVATE_DATA_LEN),
            (8, DREP_PRIVATE_DATA_LEN),
            (16, SIDR_REQ_PRIVATE_DATA_LEN),
            (96, SIDR_REP_PRIVATE_DATA_LEN),
        ] {
            assert_eq!(start + len, DATA_LEN);
        }
        assert_eq!(private_data::<4>(&[1, 2]), Ok([1, 2, 0, 0]));
        assert_eq!(private_data::<1>(&[1, 2]), Err(Error::FieldOverflow));
    }

    #[test]
    fn timeouts_and_mtus() {
        assert_eq!(timeout_nanos(0), 4096);
        assert_eq!(timeout_nanos(20), 4_294_967_296);
        assert_eq!(timeout_nanos(31), timeout_nanos(40));
        assert_eq!((mtu_bytes(1), mtu_bytes(3), mtu_bytes(5)), (Some(256), Some(1024), Some(4096)));
        assert_eq!((mtu_bytes(0), mtu_bytes(6)), (None, None));
    }
}
