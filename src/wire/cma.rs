//! What the RDMA connection manager (rdma_cm, the kernel's
//! `drivers/infiniband/core/cma.c`; IBTA annex A11, "RDMA IP CM service")
//! adds on top of the IB CM's messages to connect by IP address and port:
//!
//! - the **service ID** of a REQ or SIDR_REQ names a port space and a port:
//!   `0x0000_0000_PPPP_pppp`, with `PPPP` the port space (TCP 0x0106, UDP
//!   0x0111, IB 0x013F, IPoIB 0x0002) and `pppp` the destination port;
//! - the first 36 bytes of their **private data** are the CMA header: version
//!   0, the IP version in the upper nibble of byte 1, the *source* port, and
//!   the source and destination addresses as 16 bytes each. An IPv4 address
//!   takes the last four bytes, after twelve zeros (not the `::ffff:` of an
//!   IPv4-mapped IPv6 address). The consumer's private data follows.
//!
//! REP, REJ, RTU, DREQ and DREP carry the consumer's private data alone.
//!
//! ```text
//!  byte 0      cma_version (0)
//!  byte 1      IP version (4 or 6) << 4 | reserved (4 bits)
//!  bytes 2-3   source port
//!  bytes 4-19  source address
//!  bytes 20-35 destination address
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::bytes::{get_u16, need, set_u16};
use super::{Error, Result};

/// The only CMA header version.
pub const CMA_VERSION: u8 = 0x00;
/// Length of the CMA header: where the consumer's private data starts in a
/// REQ or SIDR_REQ.
pub const CMA_HEADER_LEN: usize = 36;
/// Private data a consumer may give `rdma_connect`: a REQ's 92 bytes less the
/// CMA header.
pub const MAX_REQ_USER_DATA: usize = super::cm::REQ_PRIVATE_DATA_LEN - CMA_HEADER_LEN;
/// Private data a consumer may give a SIDR_REQ (UDP port space).
pub const MAX_SIDR_REQ_USER_DATA: usize = super::cm::SIDR_REQ_PRIVATE_DATA_LEN - CMA_HEADER_LEN;
/// The Q_Key the kernel's rdma_cm gives UD QPs of the UDP port space
/// (`RDMA_UDP_QKEY`), as a SIDR_REP reports it.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// An rdma_cm port space: the namespace a port number lives in, bits 31-16
/// of the service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB` (0x0002): IP over InfiniBand.
    IpoIb,
    /// `RDMA_PS_TCP` (0x0106): reliable connections (RC), rping's and most
    /// applications'.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111): unreliable datagrams (UD), resolved by SIDR.
    Udp,
    /// `RDMA_PS_IB` (0x013F): any QP type.
    Ib,
}

impl PortSpace {
    /// The 16-bit code.
    pub const fn code(self) -> u16 {
        match self {
            PortSpace::IpoIb => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013f,
        }
    }

    /// The port space for a code; `None` for others.
    pub const fn from_code(code: u16) -> Option<PortSpace> {
        Some(match code {
            0x0002 => PortSpace::IpoIb,
            0x0106 => PortSpace::Tcp,
            0x0111 => PortSpace::Udp,
            0x013f => PortSpace::Ib,
            _ => return None,
        })
    }

    /// The name as librdmacm spells it, without `RDMA_PS_`: "TCP", "UDP", "IB", "IPOIB".
    pub const fn name(self) -> &'static str {
        match self {
            PortSpace::IpoIb => "IPOIB",
            PortSpace::Tcp => "TCP",
            PortSpace::Udp => "UDP",
            PortSpace::Ib => "IB",
        }
    }

    /// The service ID of `port` in this port space (the kernel's
    /// `cma_get_service_id`): `(port space << 16) | port`.
    pub const fn service_id(self, port: u16) -> u64 {
        ((self.code() as u64) << 16) | port as u64
    }

    /// The port space and port a service ID names, if it is one of rdma_cm's.
    pub const fn from_service_id(service_id: u64) -> Option<(PortSpace, u16)> {
        if service_id >> 32 != 0 {
            return None;
        }
        match PortSpace::from_code((service_id >> 16) as u16) {
            Some(ps) => Some((ps, service_id as u16)),
            None => None,
        }
    }
}

/// A read/write view of the CMA header at the start of a REQ's or
/// SIDR_REQ's private data.
#[derive(Debug, Clone)]
pub struct CmaHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CmaHeader<T> {
    /// Length of the header.
    pub const LEN: usize = CMA_HEADER_LEN;

    /// Wraps a buffer without checking its length; getters panic if it is short.
    pub const fn new_unchecked(buffer: T) -> CmaHeader<T> {
        CmaHeader { buffer }
    }

    /// Wraps a buffer after checking it holds a whole header.
    pub fn new_checked(buffer: T) -> Result<CmaHeader<T>> {
        let header = CmaHeader::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Fails with [`Error::Truncated`] unless the buffer holds 36 bytes.
    pub fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref(), CMA_HEADER_LEN)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// cma_version: 0.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// The IP version, 4 or 6 (upper nibble of byte 1).
    pub fn ip_version(&self) -> u8 {
        self.buffer.as_ref()[1] >> 4
    }
    /// The requester's source port (the destination port is in the service ID).
    pub fn port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }
    /// The source address's 16 bytes.
    pub fn src_addr(&self) -> &[u8] {
        &self.buffer.as_ref()[4..20]
    }
    /// The destination address's 16 bytes.
    pub fn dst_addr(&self) -> &[u8] {
        &self.buffer.as_ref()[20..36]
    }
    /// The consumer's private data after the header, when the buffer is all
    /// of a message's private data.
    pub fn user_data(&self) -> &[u8] {
        &self.buffer.as_ref()[CMA_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmaHeader<T> {
    /// Writes cma_version.
    pub fn set_version(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v
    }
    /// Writes the IP version into the upper nibble, zero into the lower.
    pub fn set_ip_version(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v << 4
    }
    /// Writes the source port.
    pub fn set_port(&mut self, port: u16) {
        set_u16(self.buffer.as_mut(), 2, port)
    }
    /// The source address's 16 bytes, to write.
    pub fn src_addr_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[4..20]
    }
    /// The destination address's 16 bytes, to write.
    pub fn dst_addr_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[20..36]
    }
}

/// The value of a CMA header: the connection's addresses as the requester
/// sees them. Both addresses are of one family, which is the IP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeaderRepr {
    /// The requester's port.
    pub src_port: u16,
    /// The requester's address.
    pub src: IpAddr,
    /// The address the requester connects to.
    pub dst: IpAddr,
}

/// An address from its 16 header bytes: IPv4 from the last four.
fn address(bytes: &[u8], ip_version: u8) -> IpAddr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&bytes[..16]);
    if ip_version == 4 {
        IpAddr::V4(Ipv4Addr::new(octets[12], octets[13], octets[14], octets[15]))
    } else {
        IpAddr::V6(Ipv6Addr::from(octets))
    }
}

/// An address's 16 header bytes: twelve zeros and the IPv4 address, or the IPv6 address.
fn address_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut octets = [0u8; 16];
            octets[12..].copy_from_slice(&v4.octets());
            octets
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl CmaHeaderRepr {
    /// The IP version of the addresses.
    pub const fn ip_version(&self) -> u8 {
        match self.src {
            IpAddr::V4(_) => 4,
            IpAddr::V6(_) => 6,
        }
    }

    /// Reads a header. A version other than 0 or an IP version other than 4
    /// or 6 is [`Error::ReservedValue`]; the twelve bytes before an IPv4
    /// address are not looked at (the kernel does not either).
    pub fn parse<T: AsRef<[u8]>>(header: &CmaHeader<T>) -> Result<CmaHeaderRepr> {
        header.check_len()?;
        if header.version() != CMA_VERSION {
            return Err(Error::ReservedValue { field: "CMA version", value: header.version().into() });
        }
        let ip_version = header.ip_version();
        if ip_version != 4 && ip_version != 6 {
            return Err(Error::ReservedValue { field: "CMA IP version", value: ip_version.into() });
        }
        Ok(CmaHeaderRepr {
            src_port: header.port(),
            src: address(header.src_addr(), ip_version),
            dst: address(header.dst_addr(), ip_version),
        })
    }

    /// Writes the header as the kernel does; addresses of two families are
    /// [`Error::ReservedValue`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut CmaHeader<T>) -> Result<()> {
        header.check_len()?;
        if self.src.is_ipv4() != self.dst.is_ipv4() {
            return Err(Error::ReservedValue { field: "CMA destination address family", value: 0 });
        }
        header.set_version(CMA_VERSION);
        header.set_ip_version(self.ip_version());
        header.set_port(self.src_port);
        header.src_addr_mut().copy_from_slice(&address_bytes(self.src));
        header.dst_addr_mut().copy_from_slice(&address_bytes(self.dst));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CMA header of the REQ rping sent in tests/data/cm/rping.pcap.
    const RPING: [u8; 36] = [
        0x00, 0x40, 0x89, 0xf4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 77, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        10, 77, 0, 2,
    ];

    #[test]
    fn cma_header_ipv4() {
        let repr = CmaHeaderRepr::parse(&CmaHeader::new_checked(&RPING[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            CmaHeaderRepr {
                src_port: 0x89f4,
                src: Ipv4Addr::new(10, 77, 0, 3).into(),
                dst: Ipv4Addr::new(10, 77, 0, 2).into()
            }
        );
        let mut out = [0xffu8; 36];
        repr.emit(&mut CmaHeader::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, RPING, "twelve zero bytes before an IPv4 address, not ::ffff:");
    }

    #[test]
    fn cma_header_ipv6_and_errors() {
        let repr = CmaHeaderRepr {
            src_port: 50000,
            src: "fe80::5054:ff:fe77:3".parse().unwrap(),
            dst: "2001:db8::2".parse().unwrap(),
        };
        let mut out = [0u8; 40];
        repr.emit(&mut CmaHeader::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out[..4], [0x00, 0x60, 0xc3, 0x50]);
        let header = CmaHeader::new_unchecked(&out[..]);
        assert_eq!(CmaHeaderRepr::parse(&header), Ok(repr));
        assert_eq!(header.user_data().len(), 4);

        let mut bad = RPING;
        bad[0] = 1;
        assert_eq!(
            CmaHeaderRepr::parse(&CmaHeader::new_unchecked(&bad[..])),
            Err(Error::ReservedValue { field: "CMA version", value: 1 })
        );
        let mut bad = RPING;
        bad[1] = 0x50;
        assert_eq!(
            CmaHeaderRepr::parse(&CmaHeader::new_unchecked(&bad[..])),
            Err(Error::ReservedValue { field: "CMA IP version", value: 5 })
        );
        assert_eq!(
            CmaHeaderRepr::parse(&CmaHeader::new_unchecked(&RPING[..35])),
            Err(Error::Truncated { needed: 36, got: 35 })
        );
        let mixed = CmaHeaderRepr { dst: Ipv4Addr::LOCALHOST.into(), ..repr };
        assert!(mixed.emit(&mut CmaHeader::new_unchecked(&mut out[..])).is_err());
    }

    #[test]
    fn service_ids() {
        assert_eq!(PortSpace::Tcp.service_id(7174), 0x0000_0000_0106_1c06);
        assert_eq!(PortSpace::Udp.service_id(7174), 0x0000_0000_0111_1c06);
        assert_eq!(PortSpace::Ib.service_id(1), 0x0000_0000_013f_0001);
        assert_eq!(PortSpace::IpoIb.service_id(0xffff), 0x0000_0000_0002_ffff);
        for ps in [PortSpace::IpoIb, PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib] {
            assert_eq!(PortSpace::from_code(ps.code()), Some(ps));
            assert_eq!(PortSpace::from_service_id(ps.service_id(4791)), Some((ps, 4791)));
        }
        assert_eq!(PortSpace::from_service_id(0x0000_0000_0107_0001), None);
        assert_eq!(PortSpace::from_service_id(0x0200_0000_0106_0001), None, "an IB CM-assigned ID");
        assert_eq!((MAX_REQ_USER_DATA, MAX_SIDR_REQ_USER_DATA), (56, 180));
    }
}
