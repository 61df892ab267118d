//! Extended transport headers: RETH, AETH, AtomicETH, AtomicAckETH, ImmDt,
//! IETH, DETH and FETH.
//!
//! Each is a view over a buffer (getters; setters for mutable buffers) and,
//! where it has more than one field, a value type with `parse`/`emit`. ImmDt and
//! IETH are a single 32-bit word and are represented as `u32` values.

use core::fmt;

use super::bytes::{get_u24, get_u32, get_u64, need, set_u24, set_u32, set_u64};
use super::{Error, Result};

fixed_view!(
    /// RDMA Extended Transport Header: virtual address, R_Key, DMA length.
    Reth,
    16
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Virtual address: where in the responder's region the transfer starts.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
    /// R_Key of the responder's region.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }
    /// DMA length: bytes of the whole message, not of this packet.
    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Writes the virtual address.
    pub fn set_va(&mut self, va: u64) {
        set_u64(self.buffer.as_mut(), 0, va)
    }
    /// Writes the R_Key.
    pub fn set_rkey(&mut self, rkey: u32) {
        set_u32(self.buffer.as_mut(), 8, rkey)
    }
    /// Writes the DMA length.
    pub fn set_dma_len(&mut self, len: u32) {
        set_u32(self.buffer.as_mut(), 12, len)
    }
}

/// The value of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RethRepr {
    /// Virtual address of the first byte the message writes or reads, as the
    /// responder's region addresses it.
    pub va: u64,
    /// R_Key of the responder's region.
    pub rkey: u32,
    /// DMA length: bytes in the whole message (a READ: bytes asked for).
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a RETH; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(reth: &Reth<T>) -> Result<RethRepr> {
        reth.check_len()?;
        Ok(RethRepr { va: reth.va(), rkey: reth.rkey(), dma_len: reth.dma_len() })
    }

    /// Writes the RETH; fails only on a short buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, reth: &mut Reth<T>) -> Result<()> {
        reth.check_len()?;
        reth.set_va(self.va);
        reth.set_rkey(self.rkey);
        reth.set_dma_len(self.dma_len);
        Ok(())
    }
}

fixed_view!(
    /// ACK Extended Transport Header: syndrome and message sequence number.
    Aeth,
    4
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// The raw syndrome byte (see [`Syndrome::from_u8`]).
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// MSN, the message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Writes the syndrome byte.
    pub fn set_syndrome(&mut self, syndrome: u8) {
        self.buffer.as_mut()[0] = syndrome
    }
    /// Writes the MSN; only its low 24 bits are written.
    pub fn set_msn(&mut self, msn: u32) {
        set_u24(self.buffer.as_mut(), 1, msn)
    }
}

/// NAK codes (AETH syndrome 0b011xxxxx).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0x60: a request arrived with a PSN after the expected one.
    PsnSequenceError,
    /// 0x61: unsupported or malformed request, or one the QP state forbids.
    InvalidRequest,
    /// 0x62: R_Key, bounds or access rights check failed.
    RemoteAccessError,
    /// 0x63: the responder could not complete a valid request.
    RemoteOperationalError,
    /// 0x64: invalid RD request (Reliable Datagram only; rxe never sends it).
    InvalidRdRequest,
}

impl NakCode {
    /// The low five bits of the syndrome (0–4).
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
        }
    }

    /// The NAK for the low five bits of a syndrome; `None` for the reserved 5–31.
    pub const fn from_code(code: u8) -> Option<NakCode> {
        Some(match code {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }

    /// Name as in the IBTA, e.g. "PSN sequence error".
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
        }
    }
}

/// The meaning of an AETH syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive ACK with an end-to-end credit code (0..=30 encodes a credit
    /// count, 31 means "credits invalid", as rxe always sends).
    Ack {
        /// The credit code, 0..=31.
        credits: u8,
    },
    /// Receiver Not Ready: retry after the time the 5-bit timer code encodes.
    RnrNak {
        /// The timer code, 0..=31 ([`Syndrome::rnr_timer_micros`]).
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// The credit code rxe sends: "no credit count".
    pub const INVALID_CREDITS: u8 = 0x1f;

    /// Decodes a syndrome byte; reserved types and NAK codes are
    /// [`Error::ReservedSyndrome`].
    pub fn from_u8(byte: u8) -> Result<Syndrome> {
        let value = byte & 0x1f;
        match byte >> 5 {
            0b000 => Ok(Syndrome::Ack { credits: value }),
            0b001 => Ok(Syndrome::RnrNak { timer: value }),
            0b011 => NakCode::from_code(value).map(Syndrome::Nak).ok_or(Error::ReservedSyndrome(byte)),
            _ => Err(Error::ReservedSyndrome(byte)),
        }
    }

    /// Encodes the syndrome byte; a credit count or timer above 31 is
    /// [`Error::FieldOverflow`].
    pub fn to_u8(self) -> Result<u8> {
        let (kind, value) = match self {
            Syndrome::Ack { credits } => (0b000, credits),
            Syndrome::RnrNak { timer } => (0b001, timer),
            Syndrome::Nak(code) => (0b011, code.code()),
        };
        if value > 0x1f {
            return Err(Error::FieldOverflow);
        }
        Ok((kind << 5) | value)
    }

    /// The RNR wait a timer code stands for (IBTA table 45), in microseconds.
    pub const fn rnr_timer_micros(code: u8) -> u32 {
        const TABLE: [u32; 32] = [
            655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680,
            10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
        ];
        TABLE[(code & 0x1f) as usize]
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Syndrome::Ack { credits } => write!(f, "ACK credits={credits}"),
            Syndrome::RnrNak { timer } => write!(f, "RNR NAK timer={timer} ({} us)", Syndrome::rnr_timer_micros(timer)),
            Syndrome::Nak(code) => write!(f, "NAK {}", code.name()),
        }
    }
}

/// The value of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads an AETH, refusing a short buffer and a reserved syndrome.
    pub fn parse<T: AsRef<[u8]>>(aeth: &Aeth<T>) -> Result<AethRepr> {
        aeth.check_len()?;
        Ok(AethRepr { syndrome: Syndrome::from_u8(aeth.syndrome())?, msn: aeth.msn() })
    }

    /// Writes the AETH, refusing a short buffer, an MSN above 24 bits and an
    /// unencodable syndrome.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, aeth: &mut Aeth<T>) -> Result<()> {
        aeth.check_len()?;
        if self.msn > 0x00ff_ffff {
            return Err(Error::FieldOverflow);
        }
        aeth.set_syndrome(self.syndrome.to_u8()?);
        aeth.set_msn(self.msn);
        Ok(())
    }
}

fixed_view!(
    /// Atomic Extended Transport Header: address, R_Key, swap (or add) and
    /// compare data.
    AtomicEth,
    28
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Virtual address of the 64-bit word at the responder.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
    /// R_Key of the responder's region.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }
    /// Swap data (CMP_SWAP) or add data (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 12)
    }
    /// Compare data (CMP_SWAP; unused by FETCH_ADD).
    pub fn compare(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Writes the virtual address.
    pub fn set_va(&mut self, va: u64) {
        set_u64(self.buffer.as_mut(), 0, va)
    }
    /// Writes the R_Key.
    pub fn set_rkey(&mut self, rkey: u32) {
        set_u32(self.buffer.as_mut(), 8, rkey)
    }
    /// Writes the swap or add data.
    pub fn set_swap_add(&mut self, value: u64) {
        set_u64(self.buffer.as_mut(), 12, value)
    }
    /// Writes the compare data.
    pub fn set_compare(&mut self, value: u64) {
        set_u64(self.buffer.as_mut(), 20, value)
    }
}

/// The value of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEthRepr {
    /// Virtual address of the 64-bit word, 8-byte aligned.
    pub va: u64,
    /// R_Key of the responder's region.
    pub rkey: u32,
    /// Swap data (CMP_SWAP) or add data (FETCH_ADD).
    pub swap_add: u64,
    /// Compare data (CMP_SWAP; unused by FETCH_ADD).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads an AtomicETH; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicEth<T>) -> Result<AtomicEthRepr> {
        eth.check_len()?;
        Ok(AtomicEthRepr { va: eth.va(), rkey: eth.rkey(), swap_add: eth.swap_add(), compare: eth.compare() })
    }

    /// Writes the AtomicETH; fails only on a short buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicEth<T>) -> Result<()> {
        eth.check_len()?;
        eth.set_va(self.va);
        eth.set_rkey(self.rkey);
        eth.set_swap_add(self.swap_add);
        eth.set_compare(self.compare);
        Ok(())
    }
}

fixed_view!(
    /// Atomic ACK Extended Transport Header: the original remote value.
    AtomicAckEth,
    8
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// The value the word held before the atomic.
    pub fn original(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Writes the original value.
    pub fn set_original(&mut self, value: u64) {
        set_u64(self.buffer.as_mut(), 0, value)
    }
}

/// The value of an AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEthRepr {
    /// The value the word held before the atomic.
    pub original: u64,
}

impl AtomicAckEthRepr {
    /// Reads an AtomicAckETH; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicAckEth<T>) -> Result<AtomicAckEthRepr> {
        eth.check_len()?;
        Ok(AtomicAckEthRepr { original: eth.original() })
    }

    /// Writes the AtomicAckETH; fails only on a short buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicAckEth<T>) -> Result<()> {
        eth.check_len()?;
        eth.set_original(self.original);
        Ok(())
    }
}

fixed_view!(
    /// Immediate data: 32 bits delivered to the receiver's completion.
    ImmDt,
    4
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate data.
    pub fn imm(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Writes the immediate data.
    pub fn set_imm(&mut self, imm: u32) {
        set_u32(self.buffer.as_mut(), 0, imm)
    }
}

fixed_view!(
    /// Invalidate Extended Transport Header: the R_Key to invalidate.
    Ieth,
    4
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// The R_Key the responder is to invalidate.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Writes the R_Key.
    pub fn set_rkey(&mut self, rkey: u32) {
        set_u32(self.buffer.as_mut(), 0, rkey)
    }
}

fixed_view!(
    /// Datagram Extended Transport Header: Q_Key and source QP (UD).
    Deth,
    8
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Q_Key, which must match the destination QP's.
    pub fn qkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
    /// Source QP number (24 bits).
    pub fn src_qpn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Writes the Q_Key.
    pub fn set_qkey(&mut self, qkey: u32) {
        set_u32(self.buffer.as_mut(), 0, qkey)
    }
    /// Writes the source QP; the reserved byte 4 becomes zero.
    pub fn set_src_qpn(&mut self, qpn: u32) {
        self.buffer.as_mut()[4] = 0;
        set_u24(self.buffer.as_mut(), 5, qpn)
    }
}

/// The value of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DethRepr {
    /// Q_Key, which must match the destination QP's.
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qpn: u32,
}

impl DethRepr {
    /// Reads a DETH; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(deth: &Deth<T>) -> Result<DethRepr> {
        deth.check_len()?;
        Ok(DethRepr { qkey: deth.qkey(), src_qpn: deth.src_qpn() })
    }

    /// Writes the DETH, refusing a short buffer and a source QP above 24 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, deth: &mut Deth<T>) -> Result<()> {
        deth.check_len()?;
        if self.src_qpn > 0x00ff_ffff {
            return Err(Error::FieldOverflow);
        }
        deth.set_qkey(self.qkey);
        deth.set_src_qpn(self.src_qpn);
        Ok(())
    }
}

fixed_view!(
    /// FLUSH Extended Transport Header: selectivity level (bits 5-4) and
    /// placement type (bits 3-0) of a 32-bit word.
    Feth,
    4
);

impl<T: AsRef<[u8]>> Feth<T> {
    /// Selectivity level, bits 5–4.
    pub fn selectivity(&self) -> u8 {
        ((get_u32(self.buffer.as_ref(), 0) >> 4) & 0x3) as u8
    }
    /// Placement type, bits 3–0.
    pub fn placement_type(&self) -> u8 {
        (get_u32(self.buffer.as_ref(), 0) & 0xf) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Feth<T> {
    /// Writes both fields; reserved bits become zero.
    pub fn set_fields(&mut self, selectivity: u8, placement_type: u8) {
        let word = (u32::from(selectivity & 0x3) << 4) | u32::from(placement_type & 0xf);
        set_u32(self.buffer.as_mut(), 0, word)
    }
}

/// The value of a FETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FethRepr {
    /// 0: the range in the RETH (`IB_FLUSH_RANGE`), 1: the whole memory
    /// region (`IB_FLUSH_MR`).
    pub selectivity: u8,
    /// Bit 0: global visibility, bit 1: persistence.
    pub placement_type: u8,
}

impl FethRepr {
    /// Reads a FETH; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(feth: &Feth<T>) -> Result<FethRepr> {
        feth.check_len()?;
        Ok(FethRepr { selectivity: feth.selectivity(), placement_type: feth.placement_type() })
    }

    /// Writes the FETH, refusing fields wider than their bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, feth: &mut Feth<T>) -> Result<()> {
        feth.check_len()?;
        if self.selectivity > 0x3 || self.placement_type > 0xf {
            return Err(Error::FieldOverflow);
        }
        feth.set_fields(self.selectivity, self.placement_type);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reth_bytes() {
        let bytes = [0x00, 0x00, 0x55, 0x55, 0x66, 0x77, 0x80, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x13, 0x88];
        let repr = RethRepr::parse(&Reth::new_unchecked(&bytes[..])).unwrap();
        assert_eq!(repr, RethRepr { va: 0x5555_6677_8000, rkey: 0x1234, dma_len: 5000 });
        let mut out = [0u8; 16];
        repr.emit(&mut Reth::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn aeth_syndromes() {
        let ack = AethRepr::parse(&Aeth::new_unchecked(&[0x1f, 0, 0, 7][..])).unwrap();
        assert_eq!(ack, AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn: 7 });
        let rnr = Syndrome::from_u8(0x2e).unwrap();
        assert_eq!(rnr, Syndrome::RnrNak { timer: 14 });
        assert_eq!(Syndrome::rnr_timer_micros(14), 1280);
        for (byte, code) in [
            (0x60, NakCode::PsnSequenceError),
            (0x61, NakCode::InvalidRequest),
            (0x62, NakCode::RemoteAccessError),
            (0x63, NakCode::RemoteOperationalError),
        ] {
            assert_eq!(Syndrome::from_u8(byte), Ok(Syndrome::Nak(code)));
            assert_eq!(Syndrome::Nak(code).to_u8(), Ok(byte));
        }
        assert_eq!(Syndrome::from_u8(0x65), Err(Error::ReservedSyndrome(0x65)));
        assert_eq!(Syndrome::from_u8(0x40), Err(Error::ReservedSyndrome(0x40)));
        assert_eq!(Syndrome::from_u8(0x80), Err(Error::ReservedSyndrome(0x80)));
    }

    #[test]
    fn every_syndrome_byte_parses_or_errors_and_round_trips() {
        for byte in 0..=255u8 {
            if let Ok(s) = Syndrome::from_u8(byte) {
                assert_eq!(s.to_u8(), Ok(byte));
            }
        }
    }

    #[test]
    fn atomic_eth_bytes() {
        let mut bytes = [0u8; 28];
        bytes[7] = 0x08; // va 8
        bytes[11] = 0x42; // rkey 0x42
        bytes[19] = 0x01; // add 1
        let repr = AtomicEthRepr::parse(&AtomicEth::new_unchecked(&bytes[..])).unwrap();
        assert_eq!(repr, AtomicEthRepr { va: 8, rkey: 0x42, swap_add: 1, compare: 0 });
        let mut out = [0u8; 28];
        repr.emit(&mut AtomicEth::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn deth_bytes() {
        let bytes = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x12];
        let repr = DethRepr::parse(&Deth::new_unchecked(&bytes[..])).unwrap();
        assert_eq!(repr, DethRepr { qkey: 0x1111_1111, src_qpn: 0x12 });
        let mut out = [0xffu8; 8];
        repr.emit(&mut Deth::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn feth_bits() {
        let repr = FethRepr::parse(&Feth::new_unchecked(&[0, 0, 0, 0x12][..])).unwrap();
        assert_eq!(repr, FethRepr { selectivity: 1, placement_type: 2 });
        let mut out = [0u8; 4];
        repr.emit(&mut Feth::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, [0, 0, 0, 0x12]);
    }

    #[test]
    fn short_buffers_are_errors() {
        assert!(Reth::new_checked(&[0u8; 15][..]).is_err());
        assert!(Aeth::new_checked(&[0u8; 3][..]).is_err());
        assert!(AtomicEth::new_checked(&[0u8; 27][..]).is_err());
        assert!(AtomicAckEth::new_checked(&[0u8; 7][..]).is_err());
        assert!(Deth::new_checked(&[0u8; 7][..]).is_err());
        assert!(ImmDt::new_checked(&[0u8; 3][..]).is_err());
        assert!(Ieth::new_checked(&[0u8; 3][..]).is_err());
        assert!(Feth::new_checked(&[0u8; 3][..]).is_err());
    }
}
