//! Management datagrams (MADs, IBTA 13.4): the 256-byte messages that
//! management classes exchange, here the communication manager's.
//!
//! On RoCEv2 a MAD of a general service class travels as the payload of a UD
//! SEND to QP 1, the General Services Interface (GSI): BTH, DETH with Q_Key
//! 0x80010000 and source QP 1, then exactly 256 bytes, of which the first 24
//! are the common header (IBTA 13.4.2) and the other 232 the class's data.
//!
//! ```text
//!  byte 0      BaseVersion (1)
//!  byte 1      MgmtClass (0x07: communication management)
//!  byte 2      ClassVersion (2 for the CM)
//!  byte 3      R (response bit) | Method (7 bits)
//!  bytes 4-5   Status
//!  bytes 6-7   ClassSpecific
//!  bytes 8-15  TransactionID
//!  bytes 16-17 AttributeID (which message: REQ 0x0010, REP 0x0013, ...)
//!  bytes 18-19 reserved
//!  bytes 20-23 AttributeModifier
//!  bytes 24-255 data
//! ```

use super::bytes::{get_u16, get_u32, get_u64, need, set_u16, set_u32, set_u64};
use super::{Error, Result};

/// Length of every MAD of base version 1.
pub const MAD_LEN: usize = 256;
/// Length of the common header.
pub const HEADER_LEN: usize = 24;
/// Length of the data that follows the common header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;

/// The QP number of the General Services Interface: every CM MAD is sent to
/// and from QP 1.
pub const GSI_QPN: u32 = 1;
/// The Q_Key of QP 1, the well-known GSI Q_Key.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The only MAD base version of InfiniBand (OPA's 0x80 is not spoken).
pub const BASE_VERSION: u8 = 1;

/// Management classes (MgmtClass).
pub mod class {
    /// Subnet management, LID routed.
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    /// Subnet administration.
    pub const SUBN_ADM: u8 = 0x03;
    /// Performance management.
    pub const PERF: u8 = 0x04;
    /// Baseboard management.
    pub const BM: u8 = 0x05;
    /// Device management.
    pub const DEV_MGT: u8 = 0x06;
    /// Communication management: connection setup and teardown.
    pub const CM: u8 = 0x07;
    /// SNMP tunnelling.
    pub const SNMP: u8 = 0x08;
    /// Subnet management, directed route.
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
}

/// Methods (the Method byte, with the response bit for responses).
pub mod method {
    /// Get: read an attribute.
    pub const GET: u8 = 0x01;
    /// Set: write an attribute.
    pub const SET: u8 = 0x02;
    /// Send: a datagram that expects no response MAD. Every CM message is a Send.
    pub const SEND: u8 = 0x03;
    /// Trap: an unsolicited notice.
    pub const TRAP: u8 = 0x05;
    /// Report: forward a subscribed event.
    pub const REPORT: u8 = 0x06;
    /// TrapRepress: stop repeating a trap.
    pub const TRAP_REPRESS: u8 = 0x07;
    /// The R bit: set in the method of a response.
    pub const RESPONSE: u8 = 0x80;
    /// GetResp: the answer to Get and Set.
    pub const GET_RESP: u8 = GET | RESPONSE;
    /// ReportResp: the answer to Report.
    pub const REPORT_RESP: u8 = REPORT | RESPONSE;
}

/// A read/write view of a MAD: the common header and the data after it.
#[derive(Debug, Clone)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Length of a MAD in bytes.
    pub const LEN: usize = MAD_LEN;

    /// Wraps a buffer without checking its length; getters panic if it is short.
    pub const fn new_unchecked(buffer: T) -> Mad<T> {
        Mad { buffer }
    }

    /// Wraps a buffer after checking it holds a whole MAD.
    pub fn new_checked(buffer: T) -> Result<Mad<T>> {
        let mad = Mad::new_unchecked(buffer);
        mad.check_len()?;
        Ok(mad)
    }

    /// Fails with [`Error::Truncated`] unless the buffer holds 256 bytes.
    pub fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref(), MAD_LEN)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// BaseVersion: 1.
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// MgmtClass: which management class the MAD belongs to ([`class`]).
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// ClassVersion: the version of the class's own format (2 for the CM).
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[2]
    }
    /// Method, with the response bit ([`method`]).
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[3]
    }
    /// Status: zero in requests; in responses, busy, redirect and an invalid
    /// field code in the low bits, class-specific bits above.
    pub fn status(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }
    /// ClassSpecific: zero for the CM.
    pub fn class_specific(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6)
    }
    /// TransactionID: chosen by the sender, copied into the answer.
    pub fn transaction_id(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 8)
    }
    /// AttributeID: for the CM, which message this is.
    pub fn attribute_id(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 16)
    }
    /// AttributeModifier: zero for most CM messages (rdma_cm's Enhanced
    /// Connection Establishment puts its options here in REQ and REP).
    pub fn attribute_modifier(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 20)
    }
    /// The 232 bytes after the header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..MAD_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    /// Writes BaseVersion.
    pub fn set_base_version(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v
    }
    /// Writes MgmtClass.
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v
    }
    /// Writes ClassVersion.
    pub fn set_class_version(&mut self, v: u8) {
        self.buffer.as_mut()[2] = v
    }
    /// Writes Method (with the response bit).
    pub fn set_method(&mut self, v: u8) {
        self.buffer.as_mut()[3] = v
    }
    /// Writes Status.
    pub fn set_status(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, v)
    }
    /// Writes ClassSpecific.
    pub fn set_class_specific(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 6, v)
    }
    /// Writes TransactionID.
    pub fn set_transaction_id(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 8, v)
    }
    /// Writes AttributeID, and zero into the reserved bytes after it.
    pub fn set_attribute_id(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 16, v);
        set_u16(self.buffer.as_mut(), 18, 0);
    }
    /// Writes AttributeModifier.
    pub fn set_attribute_modifier(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 20, v)
    }
    /// The 232 bytes after the header, to write.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..MAD_LEN]
    }
}

/// The value of a MAD's common header. The data is not part of it: a class
/// parses it (the CM: [`super::cm::CmMessage`]). The two reserved bytes are
/// written as zero and ignored when read; every other byte pattern is a valid
/// header, whatever class it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadRepr {
    /// BaseVersion (1).
    pub base_version: u8,
    /// MgmtClass ([`class`]).
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// Method with the response bit ([`method`]).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub transaction_id: u64,
    /// AttributeID.
    pub attribute_id: u16,
    /// AttributeModifier.
    pub attribute_modifier: u32,
}

impl MadRepr {
    /// A CM Send header (base version 1, class 0x07 version 2, method Send,
    /// status 0) for the given attribute and transaction.
    pub const fn cm_send(attribute_id: u16, transaction_id: u64) -> MadRepr {
        MadRepr {
            base_version: BASE_VERSION,
            mgmt_class: class::CM,
            class_version: super::cm::CLASS_VERSION,
            method: method::SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Whether the header names the CM class in the version this stack speaks.
    pub const fn is_cm(&self) -> bool {
        self.base_version == BASE_VERSION
            && self.mgmt_class == class::CM
            && self.class_version == super::cm::CLASS_VERSION
    }

    /// Reads the header; fails only on a buffer shorter than a MAD.
    pub fn parse<T: AsRef<[u8]>>(mad: &Mad<T>) -> Result<MadRepr> {
        mad.check_len()?;
        Ok(MadRepr {
            base_version: mad.base_version(),
            mgmt_class: mad.mgmt_class(),
            class_version: mad.class_version(),
            method: mad.method(),
            status: mad.status(),
            class_specific: mad.class_specific(),
            transaction_id: mad.transaction_id(),
            attribute_id: mad.attribute_id(),
            attribute_modifier: mad.attribute_modifier(),
        })
    }

    /// Writes the header, leaving the data alone; fails only on a short buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, mad: &mut Mad<T>) -> Result<()> {
        mad.check_len()?;
        mad.set_base_version(self.base_version);
        mad.set_mgmt_class(self.mgmt_class);
        mad.set_class_version(self.class_version);
        mad.set_method(self.method);
        mad.set_status(self.status);
        mad.set_class_specific(self.class_specific);
        mad.set_transaction_id(self.transaction_id);
        mad.set_attribute_id(self.attribute_id);
        mad.set_attribute_modifier(self.attribute_modifier);
        Ok(())
    }

    /// Fails with [`Error::NotCm`] unless this is a CM header.
    pub fn check_cm(&self) -> Result<()> {
        if self.is_cm() {
            Ok(())
        } else {
            Err(Error::NotCm {
                base_version: self.base_version,
                mgmt_class: self.mgmt_class,
                class_version: self.class_version,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header of the REQ kernel rdma_cm sent in tests/data/cm/rping.pcap.
    const HEADER: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x52, 0xac, 0xe7, 0x8b, 0x00, 0x10,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    fn repr() -> MadRepr {
        MadRepr { transaction_id: 0x2_52ac_e78b, ..MadRepr::cm_send(0x0010, 0) }
    }

    fn mad() -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        mad[..HEADER_LEN].copy_from_slice(&HEADER);
        mad
    }

    #[test]
    fn mad_header_fields() {
        let bytes = mad();
        let view = Mad::new_checked(&bytes[..]).unwrap();
        assert_eq!((view.base_version(), view.mgmt_class(), view.class_version()), (1, class::CM, 2));
        assert_eq!(view.method(), method::SEND);
        assert_eq!((view.status(), view.class_specific()), (0, 0));
        assert_eq!(view.transaction_id(), 0x2_52ac_e78b);
        assert_eq!(view.attribute_id(), 0x0010);
        assert_eq!(view.attribute_modifier(), 0);
        assert_eq!(view.data().len(), DATA_LEN);
        assert_eq!(MadRepr::parse(&view), Ok(repr()));
        assert!(repr().is_cm());
    }

    #[test]
    fn mad_header_round_trips() {
        let mut out = [0xffu8; MAD_LEN];
        repr().emit(&mut Mad::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out[..HEADER_LEN], HEADER, "reserved bytes 18-19 written as zero");
        assert!(out[HEADER_LEN..].iter().all(|&b| b == 0xff), "data left alone");
        let odd = MadRepr {
            base_version: 0x80,
            mgmt_class: class::SUBN_DIRECTED_ROUTE,
            class_version: 7,
            method: method::GET_RESP,
            status: 0x801c,
            class_specific: 0xabcd,
            transaction_id: u64::MAX,
            attribute_id: 0xffff,
            attribute_modifier: 0xdead_beef,
        };
        odd.emit(&mut Mad::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(MadRepr::parse(&Mad::new_unchecked(&out[..])), Ok(odd));
        assert_eq!(odd.check_cm(), Err(Error::NotCm { base_version: 0x80, mgmt_class: 0x81, class_version: 7 }));
    }

    #[test]
    fn short_mad_is_an_error() {
        let bytes = mad();
        assert_eq!(Mad::new_checked(&bytes[..255]).unwrap_err(), Error::Truncated { needed: 256, got: 255 });
        assert_eq!(MadRepr::parse(&Mad::new_unchecked(&bytes[..24])), Err(Error::Truncated { needed: 256, got: 24 }));
    }
}
