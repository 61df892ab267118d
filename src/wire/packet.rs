//! Whole RoCEv2 packets: IPv4 or IPv6, UDP to port 4791, then BTH … ICRC.
//!
//! The IP and UDP layers are `etherparse`'s; this module adds the RoCE layer
//! and the ICRC, which covers all three.

use etherparse::{IpNumber, Ipv4Header, Ipv6Header, UdpHeader};

use super::roce::{RocePacket, ICRC_LEN};
use super::{icrc, Error, Result, RoceRepr};

/// The IANA-assigned RoCEv2 UDP destination port.
pub const ROCE_UDP_PORT: u16 = 4791;

/// The IP header of a RoCEv2 packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpHeader {
    /// IPv4, options included.
    V4(Ipv4Header),
    /// IPv6 (with UDP as its next header: no extension headers).
    V6(Ipv6Header),
}

impl IpHeader {
    /// The source address.
    pub fn source(&self) -> std::net::IpAddr {
        match self {
            IpHeader::V4(h) => h.source.into(),
            IpHeader::V6(h) => h.source.into(),
        }
    }

    /// The destination address.
    pub fn destination(&self) -> std::net::IpAddr {
        match self {
            IpHeader::V4(h) => h.destination.into(),
            IpHeader::V6(h) => h.destination.into(),
        }
    }

    fn header_len(&self) -> usize {
        match self {
            IpHeader::V4(h) => h.header_len(),
            IpHeader::V6(_) => Ipv6Header::LEN,
        }
    }
}

/// A parsed RoCEv2 packet, borrowing the bytes it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The IP header, as received.
    pub ip: IpHeader,
    /// The UDP header, as received.
    pub udp: UdpHeader,
    /// The UDP payload: BTH and extended headers, payload, pad and ICRC.
    pub roce: RocePacket<'a>,
    /// The IP packet the view was parsed from, trimmed to the IP length.
    bytes: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Parses an IP packet. Errors: [`Error::BadIp`] when the IP or UDP layer is
    /// malformed or fragmented, [`Error::NotRoce`] when it is not UDP to port
    /// 4791, and any RoCE-layer error.
    pub fn parse(bytes: &'a [u8]) -> Result<Packet<'a>> {
        let (ip, ip_len, total) = match bytes.first().map(|b| b >> 4) {
            Some(4) => {
                let (h, _) = Ipv4Header::from_slice(bytes).map_err(|_| Error::BadIp)?;
                if h.is_fragmenting_payload() {
                    return Err(Error::BadIp);
                }
                let (len, total) = (h.header_len(), usize::from(h.total_len));
                if h.protocol != IpNumber::UDP {
                    return Err(Error::NotRoce);
                }
                (IpHeader::V4(h), len, total)
            }
            Some(6) => {
                let (h, _) = Ipv6Header::from_slice(bytes).map_err(|_| Error::BadIp)?;
                let total = Ipv6Header::LEN + usize::from(h.payload_length);
                if h.next_header != IpNumber::UDP {
                    return Err(Error::NotRoce);
                }
                (IpHeader::V6(h), Ipv6Header::LEN, total)
            }
            _ => return Err(Error::BadIp),
        };
        if total < ip_len || total > bytes.len() {
            return Err(Error::BadIp);
        }
        let bytes = &bytes[..total];
        let (udp, _) = UdpHeader::from_slice(&bytes[ip_len..]).map_err(|_| Error::BadIp)?;
        if udp.destination_port != ROCE_UDP_PORT {
            return Err(Error::NotRoce);
        }
        let udp_end = ip_len + usize::from(udp.length);
        if usize::from(udp.length) < UdpHeader::LEN || udp_end > total {
            return Err(Error::BadIp);
        }
        let roce = RoceRepr::parse(&bytes[ip_len + UdpHeader::LEN..udp_end])?;
        Ok(Packet { ip, udp, roce, bytes: &bytes[..udp_end] })
    }

    /// The bytes this packet was parsed from (IP header to ICRC).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The ICRC this packet should carry, computed over its real IP header.
    pub fn expected_icrc(&self) -> Result<u32> {
        let ip_len = self.ip.header_len();
        let udp_end = ip_len + UdpHeader::LEN;
        let covered = &self.bytes[udp_end..self.bytes.len() - ICRC_LEN];
        icrc::compute(&self.bytes[..ip_len], &self.bytes[ip_len..udp_end], covered)
    }

    /// Strict ICRC check over the real IP header.
    pub fn icrc_ok(&self) -> bool {
        self.expected_icrc().is_ok_and(|icrc| icrc == self.roce.icrc)
    }

    /// Re-emits this packet from its parsed values.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        build(&self.ip, &self.udp, &self.roce.header, self.roce.payload)
    }
}

/// Builds a whole packet. Lengths (IP total/payload length, UDP length), the
/// IPv4 header checksum, the pad and the ICRC are computed; everything else is
/// taken from the arguments, including the UDP checksum (rxe sends zero).
pub fn build(ip: &IpHeader, udp: &UdpHeader, roce: &RoceRepr, payload: &[u8]) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; roce.wire_len(payload.len())];
    roce.emit(&mut bytes, payload)?;
    encapsulate(ip, udp, &bytes)
}

/// Wraps RoCE bytes (BTH through a placeholder ICRC, as `RoceRepr::emit`
/// writes them) in IP and UDP headers and fills in the ICRC.
pub fn encapsulate(ip: &IpHeader, udp: &UdpHeader, roce: &[u8]) -> Result<Vec<u8>> {
    let udp_len = UdpHeader::LEN + roce.len();
    let ip_len = ip.header_len();
    let mut out = vec![0u8; ip_len + udp_len];
    let mut udp = udp.clone();
    udp.length = u16::try_from(udp_len).map_err(|_| Error::FieldOverflow)?;
    match ip {
        IpHeader::V4(h) => {
            let mut h = h.clone();
            h.set_payload_len(udp_len).map_err(|_| Error::FieldOverflow)?;
            h.header_checksum = h.calc_header_checksum();
            out[..ip_len].copy_from_slice(&h.to_bytes());
        }
        IpHeader::V6(h) => {
            let mut h = h.clone();
            h.set_payload_length(udp_len).map_err(|_| Error::FieldOverflow)?;
            out[..ip_len].copy_from_slice(&h.to_bytes());
        }
    }
    out[ip_len..ip_len + UdpHeader::LEN].copy_from_slice(&udp.to_bytes());
    let (headers, roce_bytes) = out.split_at_mut(ip_len + UdpHeader::LEN);
    roce_bytes.copy_from_slice(roce);
    icrc::fill(&headers[..ip_len], &headers[ip_len..], roce_bytes)?;
    Ok(out)
}

/// The UDP source port kernel rxe uses for a connection: the flow label the
/// kernel derives from the two QPNs (`rdma_calc_flow_label`) folded into 14
/// bits above 0xC000 (`rdma_flow_label_to_udp_sport`), so flows of different
/// QP pairs spread over ECMP paths and RSS queues.
pub fn rxe_source_port(local_qpn: u32, remote_qpn: u32) -> u16 {
    let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
    v ^= v >> 20;
    v ^= v >> 40;
    let flow_label = (v & 0xf_ffff) as u32;
    let low = (flow_label & 0x3fff) ^ (flow_label >> 14);
    0xc000 | low as u16
}

/// The UDP source port kernel rxe gives a UD QP: 0xC000 plus 14 bits of a
/// golden-ratio hash of its QPN (`hash_32(qpn, 14)`).
pub fn rxe_ud_source_port(qpn: u32) -> u16 {
    0xc000 + (qpn.wrapping_mul(0x61c8_8647) >> (32 - 14)) as u16
}

/// The IP header softroce sends from `src` to `dst`: DF set and ID 0 (what an
/// unconnected UDP socket with `IP_PMTUDISC_DO` sends), TTL 64, and for IPv6
/// hop limit 64. Lengths are filled in by [`encapsulate`].
pub fn ip_header(src: std::net::IpAddr, dst: std::net::IpAddr) -> Result<IpHeader> {
    use std::net::IpAddr;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h =
                Ipv4Header::new(0, 64, IpNumber::UDP, s.octets(), d.octets()).map_err(|_| Error::FieldOverflow)?;
            h.dont_fragment = true;
            Ok(IpHeader::V4(h))
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => Ok(IpHeader::V6(Ipv6Header {
            traffic_class: 0,
            flow_label: Default::default(),
            payload_length: 0,
            next_header: IpNumber::UDP,
            hop_limit: 64,
            source: s.octets(),
            destination: d.octets(),
        })),
        _ => Err(Error::BadIp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BthRepr, Opcode, Operation, Psn, Transport};

    fn send_only() -> RoceRepr {
        RoceRepr::new(BthRepr {
            opcode: Opcode::new(Transport::Rc, Operation::SendOnly).unwrap(),
            solicited: false,
            mig_req: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: 0x11,
            ack_req: true,
            psn: Psn::new(1),
        })
    }

    fn udp() -> UdpHeader {
        UdpHeader { source_port: 0xc000, destination_port: ROCE_UDP_PORT, length: 0, checksum: 0 }
    }

    #[test]
    fn ipv4_build_parse_round_trip() {
        let mut ip = Ipv4Header::new(0, 64, IpNumber::UDP, [10, 0, 0, 1], [10, 0, 0, 2]).unwrap();
        ip.dont_fragment = true;
        ip.identification = 0x1234;
        let bytes = build(&IpHeader::V4(ip), &udp(), &send_only(), b"payload").unwrap();
        let pkt = Packet::parse(&bytes).unwrap();
        assert!(pkt.icrc_ok());
        assert_eq!(pkt.roce.payload, b"payload");
        assert_eq!(pkt.roce.header, send_only());
        assert_eq!(pkt.to_bytes().unwrap(), bytes);
    }

    #[test]
    fn ipv6_build_parse_round_trip() {
        let ip = Ipv6Header {
            traffic_class: 0,
            flow_label: Default::default(),
            payload_length: 0,
            next_header: IpNumber::UDP,
            hop_limit: 64,
            source: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            destination: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        };
        let bytes = build(&IpHeader::V6(ip), &udp(), &send_only(), &[9; 4000]).unwrap();
        let mut pkt_bytes = bytes.clone();
        let pkt = Packet::parse(&bytes).unwrap();
        assert!(pkt.icrc_ok());
        assert_eq!(pkt.to_bytes().unwrap(), bytes);
        // hop limit is masked, a payload byte is not
        pkt_bytes[7] = 1;
        assert!(Packet::parse(&pkt_bytes).unwrap().icrc_ok());
        pkt_bytes[100] ^= 1;
        assert!(!Packet::parse(&pkt_bytes).unwrap().icrc_ok());
    }

    #[test]
    fn source_port_matches_kernel_rxe() {
        // QP 0x11 talking to QP 0x11: port 0xc121 in tests/data/rc_send_bw.pcap.
        assert_eq!(rxe_source_port(0x11, 0x11), 0xc121);
        assert_ne!(rxe_source_port(0x11, 0x12), 0xc121);
        assert!(rxe_source_port(0xff_ffff, 0xff_fffe) >= 0xc000);
        // UD QP 0x11: port 0xdf94 in tests/data/ud_send.pcap.
        assert_eq!(rxe_ud_source_port(0x11), 0xdf94);
    }

    #[test]
    fn not_roce() {
        let ip = Ipv4Header::new(0, 64, IpNumber::UDP, [10, 0, 0, 1], [10, 0, 0, 2]).unwrap();
        let mut u = udp();
        u.destination_port = 53;
        let bytes = build(&IpHeader::V4(ip), &u, &send_only(), b"").unwrap();
        assert_eq!(Packet::parse(&bytes), Err(Error::NotRoce));
        assert_eq!(Packet::parse(&[]), Err(Error::BadIp));
        assert_eq!(Packet::parse(&bytes[..30]), Err(Error::BadIp));
    }
}
