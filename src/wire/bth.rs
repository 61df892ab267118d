//! The Base Transport Header (12 bytes).
//!
//! ```text
//!  byte 0     opcode
//!  byte 1     SE | M | PadCnt(2) | TVer(4)
//!  bytes 2-3  P_Key
//!  byte 4     FECN | BECN | reserved(6)
//!  bytes 5-7  destination QP
//!  byte 8     AckReq | reserved(7)
//!  bytes 9-11 PSN
//! ```

use super::bytes::{get_u16, get_u24, need, set_u16, set_u24};
use super::{Error, Opcode, Psn, Result};

/// A read/write view of a BTH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Length of a BTH in bytes.
    pub const LEN: usize = 12;

    /// Wraps a buffer without checking its length; getters panic if it is short.
    pub const fn new_unchecked(buffer: T) -> Bth<T> {
        Bth { buffer }
    }

    /// Wraps a buffer after checking it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Bth<T>> {
        let bth = Bth::new_unchecked(buffer);
        bth.check_len()?;
        Ok(bth)
    }

    /// Fails with [`Error::Truncated`] unless the buffer holds a whole BTH.
    pub fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref(), Self::LEN)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The raw opcode byte.
    pub fn opcode_byte(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// SE, solicited event: the requester asks for a completion event at the
    /// responder when this message's receive completes (`IBV_SEND_SOLICITED`).
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[1] & 0x80 != 0
    }

    /// M, MigReq: path migration state, used by automatic path migration;
    /// softroce sends it clear.
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[1] & 0x40 != 0
    }

    /// PadCnt: pad bytes (0–3) between the payload and the ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[1] >> 4) & 0x3
    }

    /// TVer, the transport header version; 0 is the only valid one.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[1] & 0x0f
    }

    /// P_Key, the partition key.
    pub fn pkey(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }

    /// FECN, forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[4] & 0x80 != 0
    }

    /// BECN, backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[4] & 0x40 != 0
    }

    /// DestQP: the destination QP number (24 bits).
    pub fn dest_qpn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 5)
    }

    /// A, AckReq: the requester asks the responder to acknowledge this packet.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[8] & 0x80 != 0
    }

    /// PSN, the packet sequence number (24 bits).
    pub fn psn(&self) -> Psn {
        Psn::new(get_u24(self.buffer.as_ref(), 9))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Writes the opcode byte.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.buffer.as_mut()[0] = opcode.to_u8();
    }

    /// Writes SE, M, the pad count and version 0 (byte 1 as a whole).
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8) {
        self.buffer.as_mut()[1] = (u8::from(solicited) << 7) | (u8::from(mig_req) << 6) | ((pad_count & 0x3) << 4);
    }

    /// Writes the P_Key.
    pub fn set_pkey(&mut self, pkey: u16) {
        set_u16(self.buffer.as_mut(), 2, pkey);
    }

    /// Writes FECN and BECN; the reserved bits of byte 4 become zero.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[4] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }

    /// Writes the destination QP; only the low 24 bits of `qpn` are written.
    pub fn set_dest_qpn(&mut self, qpn: u32) {
        set_u24(self.buffer.as_mut(), 5, qpn);
    }

    /// Writes AckReq; the reserved bits of byte 8 become zero.
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.buffer.as_mut()[8] = u8::from(ack_req) << 7;
    }

    /// Writes the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        set_u24(self.buffer.as_mut(), 9, psn.value());
    }
}

/// The value of a BTH.
///
/// The pad count is not part of the value: it is derived from the payload
/// length when a whole packet is built ([`super::RoceRepr`]). The version is
/// always 0. Reserved bits are written as zero and ignored when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// The packet's transport and operation.
    pub opcode: Opcode,
    /// SE, solicited event.
    pub solicited: bool,
    /// M, MigReq (path migration state).
    pub mig_req: bool,
    /// P_Key, the partition key.
    pub pkey: u16,
    /// FECN, forward explicit congestion notification.
    pub fecn: bool,
    /// BECN, backward explicit congestion notification.
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qpn: u32,
    /// A, AckReq: acknowledge this packet.
    pub ack_req: bool,
    /// PSN, the packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// The default partition key, full membership.
    pub const DEFAULT_PKEY: u16 = 0xffff;
    /// The destination QP of a UD packet to a multicast group: every QP
    /// attached to the group receives it (IBTA 10.5.2.5).
    pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

    /// Reads a BTH, refusing a short buffer, a version other than 0 and an
    /// opcode outside the RC/UC/UD table.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        bth.check_len()?;
        if bth.version() != 0 {
            return Err(Error::BadVersion(bth.version()));
        }
        Ok(BthRepr {
            opcode: Opcode::from_u8(bth.opcode_byte())?,
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Writes the header with the given pad count.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>, pad_count: u8) -> Result<()> {
        bth.check_len()?;
        if self.dest_qpn > 0x00ff_ffff || pad_count > 3 {
            return Err(Error::FieldOverflow);
        }
        bth.set_opcode(self.opcode);
        bth.set_flags(self.solicited, self.mig_req, pad_count);
        bth.set_pkey(self.pkey);
        bth.set_ecn(self.fecn, self.becn);
        bth.set_dest_qpn(self.dest_qpn);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Operation, Transport};

    // RC SEND_ONLY to QP 0x11, PSN 0x6a3d2f, AckReq, pad 2, default P_Key,
    // as kernel rxe sends it.
    const BYTES: [u8; 12] = [0x04, 0x20, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x6a, 0x3d, 0x2f];

    fn repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::new(Transport::Rc, Operation::SendOnly).unwrap(),
            solicited: false,
            mig_req: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: 0x11,
            ack_req: true,
            psn: Psn::new(0x6a3d2f),
        }
    }

    #[test]
    fn view_reads_fields() {
        let bth = Bth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(bth.opcode_byte(), 0x04);
        assert_eq!(bth.pad_count(), 2);
        assert_eq!(bth.version(), 0);
        assert_eq!(bth.pkey(), 0xffff);
        assert_eq!(bth.dest_qpn(), 0x11);
        assert!(bth.ack_req());
        assert_eq!(bth.psn(), Psn::new(0x6a3d2f));
    }

    #[test]
    fn parse_and_emit() {
        assert_eq!(BthRepr::parse(&Bth::new_unchecked(&BYTES[..])), Ok(repr()));
        let mut out = [0u8; 12];
        repr().emit(&mut Bth::new_unchecked(&mut out[..]), 2).unwrap();
        assert_eq!(out, BYTES);
    }

    #[test]
    fn rejects_short_buffer_and_bad_version() {
        assert_eq!(Bth::new_checked(&BYTES[..11]).unwrap_err(), Error::Truncated { needed: 12, got: 11 });
        let mut v1 = BYTES;
        v1[1] |= 0x01;
        assert_eq!(BthRepr::parse(&Bth::new_unchecked(&v1[..])), Err(Error::BadVersion(1)));
    }

    #[test]
    fn emit_rejects_oversized_qpn() {
        let mut out = [0u8; 12];
        let r = BthRepr { dest_qpn: 1 << 24, ..repr() };
        assert_eq!(r.emit(&mut Bth::new_unchecked(&mut out[..]), 0), Err(Error::FieldOverflow));
    }
}
