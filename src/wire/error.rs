use core::fmt;

/// Why a buffer is not a well-formed RoCEv2 packet (or header), or why a value
/// cannot be emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the header or packet requires.
    Truncated {
        /// Bytes required.
        needed: usize,
        /// Bytes the buffer holds.
        got: usize,
    },
    /// BTH transport header version other than 0.
    BadVersion(u8),
    /// Opcode not defined for its transport (or reserved).
    UnknownOpcode(u8),
    /// Transport we do not speak: RD, XRC, CNP and manufacturer-specific
    /// opcodes (neither does kernel rxe).
    UnsupportedTransport(u8),
    /// Payload plus pad is not a multiple of four bytes, or the pad count is
    /// larger than the bytes that follow the headers.
    BadPad {
        /// The BTH pad count.
        pad: u8,
        /// Bytes between the extended headers and the ICRC.
        available: usize,
    },
    /// The opcode carries no payload, yet bytes follow its headers.
    UnexpectedPayload {
        /// The opcode byte.
        opcode: u8,
        /// Bytes of payload found (or given, when emitting).
        len: usize,
    },
    /// ATOMIC_WRITE must carry exactly eight bytes.
    BadAtomicWriteLength(usize),
    /// AETH syndrome with the reserved type (0b010), reserved high bit, or a
    /// reserved NAK code.
    ReservedSyndrome(u8),
    /// A value being emitted has the wrong set of extended headers for its
    /// opcode, e.g. a WRITE_FIRST without RETH.
    HeaderMismatch {
        /// The opcode byte.
        opcode: u8,
    },
    /// A value does not fit its field (e.g. a QPN above 2^24).
    FieldOverflow,
    /// The IP or UDP layer is malformed.
    BadIp,
    /// Not UDP, or not destined to the RoCEv2 port.
    NotRoce,
    /// A MAD of another class or version than the one being parsed: the CM
    /// speaks base version 1, management class 0x07, class version 2.
    NotCm {
        /// The MAD's BaseVersion.
        base_version: u8,
        /// The MAD's MgmtClass.
        mgmt_class: u8,
        /// The MAD's ClassVersion.
        class_version: u8,
    },
    /// A CM attribute this stack does not parse (LAP, APR, ClassPortInfo or an
    /// undefined ID), or a message whose attribute does not match its header.
    UnknownCmAttribute(u16),
    /// A field holds a value its encoding reserves, or one out of its range
    /// (e.g. a REJ whose ARI length is above 72).
    ReservedValue {
        /// The field, as the IBTA names it.
        field: &'static str,
        /// The value found (or given, when emitting).
        value: u32,
    },
}

/// Result of wire operations.
pub type Result<T> = core::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { needed, got } => {
                write!(f, "truncated: need {needed} bytes, have {got}")
            }
            Error::BadVersion(v) => write!(f, "BTH version {v}, expected 0"),
            Error::UnknownOpcode(op) => write!(f, "unknown or reserved opcode {op:#04x}"),
            Error::UnsupportedTransport(op) => {
                write!(f, "opcode {op:#04x} belongs to an unsupported transport")
            }
            Error::BadPad { pad, available } => {
                write!(f, "pad count {pad} inconsistent with {available} bytes after the headers")
            }
            Error::UnexpectedPayload { opcode, len } => {
                write!(f, "opcode {opcode:#04x} carries no payload, found {len} bytes")
            }
            Error::BadAtomicWriteLength(len) => {
                write!(f, "ATOMIC_WRITE payload is {len} bytes, must be 8")
            }
            Error::ReservedSyndrome(s) => write!(f, "reserved AETH syndrome {s:#04x}"),
            Error::HeaderMismatch { opcode } => {
                write!(f, "extended headers do not match opcode {opcode:#04x}")
            }
            Error::FieldOverflow => write!(f, "value too large for its field"),
            Error::BadIp => write!(f, "malformed IP or UDP header"),
            Error::NotRoce => write!(f, "not a RoCEv2 packet (UDP port 4791)"),
            Error::NotCm { base_version, mgmt_class, class_version } => write!(
                f,
                "MAD base version {base_version}, class {mgmt_class:#04x} version {class_version}: not a CM MAD \
                 (1, 0x07, 2)"
            ),
            Error::UnknownCmAttribute(id) => write!(f, "CM attribute {id:#06x} is not a message this stack parses"),
            Error::ReservedValue { field, value } => write!(f, "{field} {value:#x} is reserved or out of range"),
        }
    }
}

impl std::error::Error for Error {}
