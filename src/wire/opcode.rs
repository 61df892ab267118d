//! The BTH opcode table for RC, UC and UD.
//!
//! An opcode is a transport prefix (top three bits) and an operation (low five
//! bits). The operation alone decides which extended headers follow the BTH and
//! whether payload follows them; UD adds a DETH. The table is kernel rxe's
//! (`rxe_opcode.c`), including FLUSH and ATOMIC_WRITE.

use core::fmt;

use super::{Error, Result};

/// Transport service, from the top three bits of the opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (prefix 0b000).
    Rc,
    /// Unreliable Connected (prefix 0b001).
    Uc,
    /// Unreliable Datagram (prefix 0b011).
    Ud,
}

impl Transport {
    /// The prefix in the opcode's top three bits.
    pub const fn prefix(self) -> u8 {
        match self {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
        }
    }

    /// Short name as used in opcode names.
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
        }
    }
}

/// The operation in the opcode's low five bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Operation {
    /// SEND First: the first packet of a multi-packet SEND, one MTU of data.
    SendFirst = 0x00,
    /// SEND Middle: one MTU of data inside a multi-packet SEND.
    SendMiddle = 0x01,
    /// SEND Last: the final packet of a multi-packet SEND.
    SendLast = 0x02,
    /// SEND Last with Immediate: the final packet, with ImmDt.
    SendLastImm = 0x03,
    /// SEND Only: a whole SEND in one packet.
    SendOnly = 0x04,
    /// SEND Only with Immediate: a whole SEND in one packet, with ImmDt.
    SendOnlyImm = 0x05,
    /// RDMA WRITE First: the first packet of a multi-packet WRITE, with the RETH.
    WriteFirst = 0x06,
    /// RDMA WRITE Middle: one MTU of data inside a multi-packet WRITE.
    WriteMiddle = 0x07,
    /// RDMA WRITE Last: the final packet of a multi-packet WRITE.
    WriteLast = 0x08,
    /// RDMA WRITE Last with Immediate: the final packet, with ImmDt; consumes a
    /// receive WQE at the responder.
    WriteLastImm = 0x09,
    /// RDMA WRITE Only: a whole WRITE in one packet, with the RETH.
    WriteOnly = 0x0a,
    /// RDMA WRITE Only with Immediate: one packet with RETH and ImmDt; consumes a
    /// receive WQE at the responder.
    WriteOnlyImm = 0x0b,
    /// RDMA READ Request: a RETH naming the range to read, no payload.
    ReadRequest = 0x0c,
    /// RDMA READ Response First: AETH and the first MTU of data.
    ReadResponseFirst = 0x0d,
    /// RDMA READ Response Middle: one MTU of data, no AETH.
    ReadResponseMiddle = 0x0e,
    /// RDMA READ Response Last: AETH and the final data.
    ReadResponseLast = 0x0f,
    /// RDMA READ Response Only: AETH and all the data in one packet.
    ReadResponseOnly = 0x10,
    /// ACKNOWLEDGE: an ACK, RNR NAK or NAK in its AETH, no payload.
    Acknowledge = 0x11,
    /// ATOMIC ACKNOWLEDGE: AETH and the AtomicAckETH with the original value.
    AtomicAcknowledge = 0x12,
    /// CmpSwap: an AtomicETH with the compare and swap values, no payload.
    CompareSwap = 0x13,
    /// FetchAdd: an AtomicETH with the value to add, no payload.
    FetchAdd = 0x14,
    /// SEND Last with Invalidate: the final packet, with an IETH naming the R_Key
    /// to invalidate (RC only).
    SendLastInv = 0x16,
    /// SEND Only with Invalidate: a whole SEND in one packet, with an IETH (RC
    /// only).
    SendOnlyInv = 0x17,
    /// FLUSH (IBTA annex A19, memory placement extensions): FETH and RETH, no
    /// payload.
    /// Parsed, but softroce's responder refuses it (NAK invalid request).
    Flush = 0x1c,
    /// ATOMIC WRITE: a RETH and exactly 8 bytes written as one unit. Parsed, but
    /// softroce's responder refuses it (NAK invalid request).
    AtomicWrite = 0x1d,
}

/// Every operation, in opcode order.
pub const OPERATIONS: [Operation; 25] = {
    use Operation::*;
    [
        SendFirst,
        SendMiddle,
        SendLast,
        SendLastImm,
        SendOnly,
        SendOnlyImm,
        WriteFirst,
        WriteMiddle,
        WriteLast,
        WriteLastImm,
        WriteOnly,
        WriteOnlyImm,
        ReadRequest,
        ReadResponseFirst,
        ReadResponseMiddle,
        ReadResponseLast,
        ReadResponseOnly,
        Acknowledge,
        AtomicAcknowledge,
        CompareSwap,
        FetchAdd,
        SendLastInv,
        SendOnlyInv,
        Flush,
        AtomicWrite,
    ]
};

/// A set of extended headers, in the order they appear on the wire:
/// DETH, FETH, RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Headers(u8);

impl Headers {
    /// No extended header.
    pub const NONE: Headers = Headers(0);
    /// Datagram ETH (8 bytes: Q_Key, source QP), on every UD packet.
    pub const DETH: Headers = Headers(1 << 0);
    /// Flush ETH (4 bytes: selectivity level, placement type).
    pub const FETH: Headers = Headers(1 << 1);
    /// RDMA ETH (16 bytes: virtual address, R_Key, DMA length).
    pub const RETH: Headers = Headers(1 << 2);
    /// ACK ETH (4 bytes: syndrome, MSN).
    pub const AETH: Headers = Headers(1 << 3);
    /// Atomic ETH (28 bytes: virtual address, R_Key, swap or add value, compare value).
    pub const ATOMIC_ETH: Headers = Headers(1 << 4);
    /// Atomic ACK ETH (8 bytes: the original value).
    pub const ATOMIC_ACK_ETH: Headers = Headers(1 << 5);
    /// Immediate data, ImmDt (4 bytes).
    pub const IMM: Headers = Headers(1 << 6);
    /// Invalidate ETH (4 bytes: the R_Key to invalidate).
    pub const IETH: Headers = Headers(1 << 7);

    /// Wire order, with names and lengths.
    pub const ORDER: [(Headers, &'static str, usize); 8] = [
        (Headers::DETH, "DETH", 8),
        (Headers::FETH, "FETH", 4),
        (Headers::RETH, "RETH", 16),
        (Headers::AETH, "AETH", 4),
        (Headers::ATOMIC_ETH, "AtomicETH", 28),
        (Headers::ATOMIC_ACK_ETH, "AtomicAckETH", 8),
        (Headers::IMM, "ImmDt", 4),
        (Headers::IETH, "IETH", 4),
    ];

    /// The headers of both.
    pub const fn union(self, other: Headers) -> Headers {
        Headers(self.0 | other.0)
    }

    /// Whether every header of `other` is in the set.
    pub const fn contains(self, other: Headers) -> bool {
        self.0 & other.0 == other.0
    }

    /// Total length of these headers in bytes: a lookup, as every packet
    /// built or parsed asks for it.
    pub const fn len(self) -> usize {
        Headers::LENS[self.0 as usize] as usize
    }

    /// [`Headers::len`] of every set, computed at compile time from [`Headers::ORDER`].
    const LENS: [u8; 256] = {
        let mut lens = [0u8; 256];
        let mut set = 0;
        while set < 256 {
            let mut i = 0;
            while i < Headers::ORDER.len() {
                let (h, _, len) = Headers::ORDER[i];
                if set as u8 & h.0 == h.0 {
                    lens[set] += len as u8;
                }
                i += 1;
            }
            set += 1;
        }
        lens
    };

    /// Whether the set has no header.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> =
            Headers::ORDER.iter().filter(|(h, _, _)| self.contains(*h)).map(|(_, name, _)| *name).collect();
        write!(f, "Headers({})", names.join("|"))
    }
}

/// Where a packet sits in its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// The first packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// The last packet of a multi-packet message.
    Last,
    /// The whole message in one packet; also ACKs, READ requests and atomics.
    Only,
}

impl Operation {
    /// The operation for the low five bits of an opcode, if defined.
    pub fn from_bits(bits: u8) -> Option<Operation> {
        OPERATIONS.iter().copied().find(|op| *op as u8 == bits)
    }

    /// Name as in the IBTA tables, without the transport.
    pub const fn name(self) -> &'static str {
        use Operation::*;
        match self {
            SendFirst => "SEND_FIRST",
            SendMiddle => "SEND_MIDDLE",
            SendLast => "SEND_LAST",
            SendLastImm => "SEND_LAST_WITH_IMMEDIATE",
            SendOnly => "SEND_ONLY",
            SendOnlyImm => "SEND_ONLY_WITH_IMMEDIATE",
            WriteFirst => "RDMA_WRITE_FIRST",
            WriteMiddle => "RDMA_WRITE_MIDDLE",
            WriteLast => "RDMA_WRITE_LAST",
            WriteLastImm => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
            WriteOnly => "RDMA_WRITE_ONLY",
            WriteOnlyImm => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            ReadRequest => "RDMA_READ_REQUEST",
            ReadResponseFirst => "RDMA_READ_RESPONSE_FIRST",
            ReadResponseMiddle => "RDMA_READ_RESPONSE_MIDDLE",
            ReadResponseLast => "RDMA_READ_RESPONSE_LAST",
            ReadResponseOnly => "RDMA_READ_RESPONSE_ONLY",
            Acknowledge => "ACKNOWLEDGE",
            AtomicAcknowledge => "ATOMIC_ACKNOWLEDGE",
            CompareSwap => "COMPARE_SWAP",
            FetchAdd => "FETCH_ADD",
            SendLastInv => "SEND_LAST_WITH_INVALIDATE",
            SendOnlyInv => "SEND_ONLY_WITH_INVALIDATE",
            Flush => "FLUSH",
            AtomicWrite => "ATOMIC_WRITE",
        }
    }

    /// Extended headers that follow the BTH (before any DETH a UD opcode adds).
    pub const fn headers(self) -> Headers {
        use Operation::*;
        match self {
            SendFirst | SendMiddle | SendLast | SendOnly | WriteMiddle | WriteLast | ReadResponseMiddle => {
                Headers::NONE
            }
            SendLastImm | SendOnlyImm | WriteLastImm => Headers::IMM,
            SendLastInv | SendOnlyInv => Headers::IETH,
            WriteFirst | WriteOnly | ReadRequest | AtomicWrite => Headers::RETH,
            WriteOnlyImm => Headers::RETH.union(Headers::IMM),
            ReadResponseFirst | ReadResponseLast | ReadResponseOnly | Acknowledge => Headers::AETH,
            AtomicAcknowledge => Headers::AETH.union(Headers::ATOMIC_ACK_ETH),
            CompareSwap | FetchAdd => Headers::ATOMIC_ETH,
            Flush => Headers::FETH.union(Headers::RETH),
        }
    }

    /// Whether payload follows the headers.
    pub const fn has_payload(self) -> bool {
        use Operation::*;
        !matches!(self, ReadRequest | Acknowledge | AtomicAcknowledge | CompareSwap | FetchAdd | Flush)
    }

    /// Position of the packet in its message.
    pub const fn position(self) -> Position {
        use Operation::*;
        match self {
            SendFirst | WriteFirst | ReadResponseFirst => Position::First,
            SendMiddle | WriteMiddle | ReadResponseMiddle => Position::Middle,
            SendLast | SendLastImm | SendLastInv | WriteLast | WriteLastImm | ReadResponseLast => Position::Last,
            _ => Position::Only,
        }
    }

    /// Sent by a requester (as opposed to a responder's ACK or READ response).
    pub const fn is_request(self) -> bool {
        use Operation::*;
        !matches!(
            self,
            ReadResponseFirst
                | ReadResponseMiddle
                | ReadResponseLast
                | ReadResponseOnly
                | Acknowledge
                | AtomicAcknowledge
        )
    }

    /// Whether `transport` defines this operation.
    pub const fn valid_for(self, transport: Transport) -> bool {
        use Operation::*;
        match transport {
            Transport::Rc => true,
            Transport::Uc => (self as u8) <= (WriteOnlyImm as u8),
            Transport::Ud => matches!(self, SendOnly | SendOnlyImm),
        }
    }
}

/// A valid BTH opcode of RC, UC or UD.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode {
    transport: Transport,
    operation: Operation,
}

impl Opcode {
    /// The opcode for a transport and operation, if that transport defines it.
    pub const fn new(transport: Transport, operation: Operation) -> Option<Opcode> {
        if operation.valid_for(transport) {
            Some(Opcode { transport, operation })
        } else {
            None
        }
    }

    /// Decodes an opcode byte.
    pub fn from_u8(byte: u8) -> Result<Opcode> {
        let transport = match byte >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            3 => Transport::Ud,
            _ => return Err(Error::UnsupportedTransport(byte)),
        };
        Operation::from_bits(byte & 0x1f).and_then(|op| Opcode::new(transport, op)).ok_or(Error::UnknownOpcode(byte))
    }

    /// The opcode byte.
    pub const fn to_u8(self) -> u8 {
        self.transport.prefix() | self.operation as u8
    }

    /// The transport, from the top three bits.
    pub const fn transport(self) -> Transport {
        self.transport
    }

    /// The operation, from the low five bits.
    pub const fn operation(self) -> Operation {
        self.operation
    }

    /// Extended headers that follow the BTH, DETH included for UD.
    pub const fn headers(self) -> Headers {
        match self.transport {
            Transport::Ud => Headers::DETH.union(self.operation.headers()),
            _ => self.operation.headers(),
        }
    }

    /// Whether payload follows the headers.
    pub const fn has_payload(self) -> bool {
        self.operation.has_payload()
    }

    /// Every opcode of RC, UC and UD.
    pub fn all() -> impl Iterator<Item = Opcode> {
        [Transport::Rc, Transport::Uc, Transport::Ud]
            .into_iter()
            .flat_map(|t| OPERATIONS.iter().filter_map(move |op| Opcode::new(t, *op)))
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}", self.transport.name(), self.operation.name())
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self, self.to_u8())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_size_matches_rxe() {
        // rxe: 25 RC opcodes (with FLUSH and ATOMIC_WRITE), 12 UC, 2 UD.
        assert_eq!(Opcode::all().filter(|o| o.transport() == Transport::Rc).count(), 25);
        assert_eq!(Opcode::all().filter(|o| o.transport() == Transport::Uc).count(), 12);
        assert_eq!(Opcode::all().filter(|o| o.transport() == Transport::Ud).count(), 2);
    }

    #[test]
    fn byte_round_trip_for_every_opcode() {
        for op in Opcode::all() {
            assert_eq!(Opcode::from_u8(op.to_u8()), Ok(op));
        }
    }

    #[test]
    fn every_byte_decodes_or_errors() {
        let valid = (0..=255u8).filter(|b| Opcode::from_u8(*b).is_ok()).count();
        assert_eq!(valid, 39);
        assert_eq!(Opcode::from_u8(0x15), Err(Error::UnknownOpcode(0x15)));
        assert_eq!(Opcode::from_u8(0x2c), Err(Error::UnknownOpcode(0x2c))); // UC READ
        assert_eq!(Opcode::from_u8(0x60), Err(Error::UnknownOpcode(0x60))); // UD SEND_FIRST
        assert_eq!(Opcode::from_u8(0x44), Err(Error::UnsupportedTransport(0x44))); // RD
        assert_eq!(Opcode::from_u8(0x81), Err(Error::UnsupportedTransport(0x81)));
        // CNP
    }

    #[test]
    fn known_values() {
        assert_eq!(Opcode::from_u8(0x0a).unwrap().to_string(), "RC_RDMA_WRITE_ONLY");
        assert_eq!(Opcode::from_u8(0x1c).unwrap().operation(), Operation::Flush);
        assert_eq!(Opcode::from_u8(0x1d).unwrap().operation(), Operation::AtomicWrite);
        assert_eq!(Opcode::from_u8(0x64).unwrap().to_string(), "UD_SEND_ONLY");
        let ud_imm = Opcode::from_u8(0x65).unwrap();
        assert_eq!(ud_imm.headers(), Headers::DETH.union(Headers::IMM));
        assert_eq!(ud_imm.headers().len(), 12);
        assert_eq!(Opcode::from_u8(0x12).unwrap().headers().len(), 12);
        assert_eq!(Opcode::from_u8(0x1c).unwrap().headers().len(), 20);
    }
}
