//! The UDP payload of a RoCEv2 packet as one value: BTH, the extended headers
//! its opcode calls for, payload, pad and ICRC.

use super::bytes::{get_u32, need, set_u32};
use super::ext::{Aeth, AtomicAckEth, AtomicEth, Deth, Feth, Reth};
use super::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, Bth, BthRepr, DethRepr, Error, FethRepr, Headers, Operation, Result,
    RethRepr,
};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// BTH and extended headers of one packet. Exactly the headers the opcode calls
/// for are `Some`; [`RoceRepr::emit`] refuses any other combination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr {
    /// The Base Transport Header.
    pub bth: BthRepr,
    /// DETH (Q_Key, source QP): every UD packet.
    pub deth: Option<DethRepr>,
    /// FETH: FLUSH requests.
    pub feth: Option<FethRepr>,
    /// RETH (VA, R_Key, DMA length): WRITE first/only, READ requests, FLUSH and
    /// ATOMIC_WRITE.
    pub reth: Option<RethRepr>,
    /// AETH (syndrome, MSN): ACKs, atomic ACKs and READ responses but the middle ones.
    pub aeth: Option<AethRepr>,
    /// AtomicETH: compare-and-swap and fetch-and-add requests.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AtomicAckETH (original value): atomic ACKs.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt, the immediate data: the last or only packet of SEND and WRITE with
    /// immediate.
    pub imm: Option<u32>,
    /// IETH, the R_Key to invalidate: the last or only packet of SEND with
    /// invalidate.
    pub ieth: Option<u32>,
}

/// A parsed RoCEv2 UDP payload, borrowing its payload bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket<'a> {
    /// BTH and extended headers.
    pub header: RoceRepr,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// Pad count from the BTH (derived from the payload length on emit).
    pub pad: u8,
    /// The ICRC as it appears on the wire, read little-endian.
    pub icrc: u32,
}

/// Pad bytes that bring `payload_len` to a multiple of four.
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}

impl RoceRepr {
    /// A header with only the BTH; add the extended headers the opcode needs.
    pub const fn new(bth: BthRepr) -> RoceRepr {
        RoceRepr {
            bth,
            deth: None,
            feth: None,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            imm: None,
            ieth: None,
        }
    }

    /// The extended headers present in this value.
    pub fn present(&self) -> Headers {
        let has = |present: bool, h: Headers| if present { h } else { Headers::NONE };
        has(self.deth.is_some(), Headers::DETH)
            .union(has(self.feth.is_some(), Headers::FETH))
            .union(has(self.reth.is_some(), Headers::RETH))
            .union(has(self.aeth.is_some(), Headers::AETH))
            .union(has(self.atomic_eth.is_some(), Headers::ATOMIC_ETH))
            .union(has(self.atomic_ack_eth.is_some(), Headers::ATOMIC_ACK_ETH))
            .union(has(self.imm.is_some(), Headers::IMM))
            .union(has(self.ieth.is_some(), Headers::IETH))
    }

    /// BTH plus extended headers, in bytes.
    pub fn header_len(&self) -> usize {
        Bth::<&[u8]>::LEN + self.bth.opcode.headers().len()
    }

    /// Bytes from the BTH to the end of the ICRC for a payload of this length.
    pub fn wire_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + usize::from(pad_for(payload_len)) + ICRC_LEN
    }

    /// Parses a UDP payload (BTH through ICRC). Checks the version, the opcode,
    /// that every header fits, that the pad count agrees with a length that is a
    /// multiple of four, and that opcodes without payload carry none. The ICRC
    /// is returned, not checked: that needs the IP and UDP headers ([`super::icrc`]).
    pub fn parse(buf: &[u8]) -> Result<RocePacket<'_>> {
        let bth_view = Bth::new_checked(buf)?;
        let bth = BthRepr::parse(&bth_view)?;
        let opcode = bth.opcode;
        let headers = opcode.headers();
        let header_len = Bth::<&[u8]>::LEN + headers.len();
        need(buf, header_len + ICRC_LEN)?;

        let mut repr = RoceRepr::new(bth);
        if !headers.is_empty() {
            repr.parse_extended(headers, &buf[Bth::<&[u8]>::LEN..header_len])?;
        }

        let pad = bth_view.pad_count();
        let available = buf.len() - header_len - ICRC_LEN;
        if !available.is_multiple_of(4) || usize::from(pad) > available {
            return Err(Error::BadPad { pad, available });
        }
        // With headers and the total both multiples of four, the pad count
        // alone decides where the payload ends.
        let payload_len = available - usize::from(pad);
        check_payload_len(opcode.operation(), opcode.to_u8(), payload_len)?;

        let icrc_at = buf.len() - ICRC_LEN;
        Ok(RocePacket {
            header: repr,
            payload: &buf[header_len..header_len + payload_len],
            pad,
            icrc: u32::from_le_bytes([buf[icrc_at], buf[icrc_at + 1], buf[icrc_at + 2], buf[icrc_at + 3]]),
        })
    }

    /// Reads the extended `headers`, which fill `buf`, in wire order.
    fn parse_extended(&mut self, headers: Headers, buf: &[u8]) -> Result<()> {
        let mut at = 0;
        let mut next = |len: usize| {
            let field = at..at + len;
            at += len;
            field
        };
        if headers.contains(Headers::DETH) {
            self.deth = Some(DethRepr::parse(&Deth::new_unchecked(&buf[next(Headers::DETH.len())]))?);
        }
        if headers.contains(Headers::FETH) {
            self.feth = Some(FethRepr::parse(&Feth::new_unchecked(&buf[next(Headers::FETH.len())]))?);
        }
        if headers.contains(Headers::RETH) {
            self.reth = Some(RethRepr::parse(&Reth::new_unchecked(&buf[next(Headers::RETH.len())]))?);
        }
        if headers.contains(Headers::AETH) {
            self.aeth = Some(AethRepr::parse(&Aeth::new_unchecked(&buf[next(Headers::AETH.len())]))?);
        }
        if headers.contains(Headers::ATOMIC_ETH) {
            self.atomic_eth =
                Some(AtomicEthRepr::parse(&AtomicEth::new_unchecked(&buf[next(Headers::ATOMIC_ETH.len())]))?);
        }
        if headers.contains(Headers::ATOMIC_ACK_ETH) {
            self.atomic_ack_eth =
                Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(&buf[next(Headers::ATOMIC_ACK_ETH.len())]))?);
        }
        if headers.contains(Headers::IMM) {
            self.imm = Some(get_u32(&buf[next(Headers::IMM.len())], 0));
        }
        if headers.contains(Headers::IETH) {
            self.ieth = Some(get_u32(&buf[next(Headers::IETH.len())], 0));
        }
        Ok(())
    }

    /// Writes headers, payload and zero pad into `buf`, leaving the four ICRC
    /// bytes zero, and returns the length written ([`RoceRepr::wire_len`]).
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        let total = self.emit_headers(buf, payload.len())?;
        let at = self.header_len();
        buf[at..at + payload.len()].copy_from_slice(payload);
        Ok(total)
    }

    /// Writes everything but the payload for a payload of `payload_len`
    /// bytes: headers, zero pad and a zero ICRC. The caller then writes the
    /// payload at [`RoceRepr::header_len`], straight from where it lives.
    pub fn emit_headers(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        let opcode = self.bth.opcode;
        let headers = opcode.headers();
        if self.present() != headers {
            return Err(Error::HeaderMismatch { opcode: opcode.to_u8() });
        }
        check_payload_len(opcode.operation(), opcode.to_u8(), payload_len)?;
        let header_len = Bth::<&[u8]>::LEN + headers.len();
        let pad = pad_for(payload_len);
        let total = header_len + payload_len + usize::from(pad) + ICRC_LEN;
        need(buf, total)?;
        let buf = &mut buf[..total];

        self.bth.emit(&mut Bth::new_unchecked(&mut buf[..]), pad)?;
        // Most packets (the middle and last ones of a message, plain ACKs
        // but for their AETH) carry few extended headers or none.
        if !headers.is_empty() {
            self.emit_extended(&mut buf[Bth::<&[u8]>::LEN..header_len])?;
        }
        buf[header_len + payload_len..].fill(0);
        Ok(total)
    }

    /// Writes the extended headers, which `present()` says fill `buf`, in
    /// wire order.
    fn emit_extended(&self, buf: &mut [u8]) -> Result<()> {
        let mut at = 0;
        let mut next = |len: usize| {
            let field = at..at + len;
            at += len;
            field
        };
        if let Some(d) = self.deth {
            d.emit(&mut Deth::new_unchecked(&mut buf[next(Headers::DETH.len())]))?;
        }
        if let Some(f) = self.feth {
            f.emit(&mut Feth::new_unchecked(&mut buf[next(Headers::FETH.len())]))?;
        }
        if let Some(r) = self.reth {
            r.emit(&mut Reth::new_unchecked(&mut buf[next(Headers::RETH.len())]))?;
        }
        if let Some(a) = self.aeth {
            a.emit(&mut Aeth::new_unchecked(&mut buf[next(Headers::AETH.len())]))?;
        }
        if let Some(a) = self.atomic_eth {
            a.emit(&mut AtomicEth::new_unchecked(&mut buf[next(Headers::ATOMIC_ETH.len())]))?;
        }
        if let Some(a) = self.atomic_ack_eth {
            a.emit(&mut AtomicAckEth::new_unchecked(&mut buf[next(Headers::ATOMIC_ACK_ETH.len())]))?;
        }
        if let Some(v) = self.imm {
            set_u32(&mut buf[next(Headers::IMM.len())], 0, v);
        }
        if let Some(v) = self.ieth {
            set_u32(&mut buf[next(Headers::IETH.len())], 0, v);
        }
        Ok(())
    }
}

fn check_payload_len(op: Operation, opcode: u8, len: usize) -> Result<()> {
    if !op.has_payload() && len != 0 {
        return Err(Error::UnexpectedPayload { opcode, len });
    }
    if op == Operation::AtomicWrite && len != 8 {
        return Err(Error::BadAtomicWriteLength(len));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Opcode, Psn, Syndrome, Transport};

    fn bth(op: Operation, transport: Transport) -> BthRepr {
        BthRepr {
            opcode: Opcode::new(transport, op).unwrap(),
            solicited: false,
            mig_req: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: 0x11,
            ack_req: true,
            psn: Psn::new(100),
        }
    }

    #[test]
    fn ack_bytes() {
        let mut repr = RoceRepr::new(bth(Operation::Acknowledge, Transport::Rc));
        repr.bth.ack_req = false;
        repr.aeth = Some(AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn: 3 });
        let mut buf = [0u8; 20];
        assert_eq!(repr.emit(&mut buf, &[]), Ok(20));
        assert_eq!(buf, [0x11, 0x00, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 100, 0x1f, 0, 0, 3, 0, 0, 0, 0]);
        let parsed = RoceRepr::parse(&buf).unwrap();
        assert_eq!(parsed.header, repr);
        assert!(parsed.payload.is_empty());
    }

    #[test]
    fn pad_is_derived_and_checked() {
        let repr = RoceRepr::new(bth(Operation::SendOnly, Transport::Rc));
        let mut buf = [0u8; 12 + 8 + 4];
        assert_eq!(repr.emit(&mut buf, b"hello"), Ok(24));
        assert_eq!((buf[1] >> 4) & 3, 3);
        let parsed = RoceRepr::parse(&buf).unwrap();
        assert_eq!(parsed.payload, b"hello");
        assert_eq!(parsed.pad, 3);
        // The same bytes with pad 1 read as a 7-byte payload.
        buf[1] = 0x10;
        assert_eq!(RoceRepr::parse(&buf).unwrap().payload, b"hello\0\0");
        // Length not a multiple of 4.
        assert_eq!(RoceRepr::parse(&buf[..23]), Err(Error::BadPad { pad: 1, available: 7 }));
        // More pad than bytes after the headers.
        let mut empty = [0u8; 16];
        repr.emit(&mut empty, &[]).unwrap();
        empty[1] = 0x20;
        assert_eq!(RoceRepr::parse(&empty), Err(Error::BadPad { pad: 2, available: 0 }));
    }

    #[test]
    fn no_payload_opcodes_reject_payload() {
        let mut repr = RoceRepr::new(bth(Operation::ReadRequest, Transport::Rc));
        repr.reth = Some(RethRepr { va: 0, rkey: 1, dma_len: 4096 });
        let mut buf = [0u8; 64];
        assert_eq!(repr.emit(&mut buf, b"x"), Err(Error::UnexpectedPayload { opcode: 0x0c, len: 1 }));
        let n = repr.emit(&mut buf, &[]).unwrap();
        assert_eq!(n, 32);
        let mut longer = buf[..36].to_vec();
        longer[28..32].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(RoceRepr::parse(&longer), Err(Error::UnexpectedPayload { opcode: 0x0c, len: 4 }));
    }

    #[test]
    fn headers_must_match_opcode() {
        let repr = RoceRepr::new(bth(Operation::WriteFirst, Transport::Rc));
        let mut buf = [0u8; 64];
        assert_eq!(repr.emit(&mut buf, &[]), Err(Error::HeaderMismatch { opcode: 0x06 }));
    }

    #[test]
    fn truncated_headers() {
        let mut repr = RoceRepr::new(bth(Operation::SendOnly, Transport::Ud));
        repr.deth = Some(DethRepr { qkey: 0x1111_1111, src_qpn: 5 });
        let mut buf = [0u8; 24];
        assert_eq!(repr.emit(&mut buf, &[]), Ok(24));
        for len in 0..24 {
            assert!(matches!(RoceRepr::parse(&buf[..len]), Err(Error::Truncated { .. })));
        }
        assert_eq!(RoceRepr::parse(&buf).unwrap().header.deth.unwrap().src_qpn, 5);
    }
}
