//! GSO and GRO trains: one UDP datagram that holds several RoCE packets.
//!
//! A sender with UDP GSO hands the kernel one datagram of equal-length
//! segments (the last may be shorter) and the kernel cuts it into packets
//! only on the way out; a receiver with UDP GRO gets such trains glued back.
//! A capture taken before the cut — `tcpdump -i lo`, or on a NIC that
//! offloads segmentation — therefore shows a train as one datagram, whose
//! ICRC, computed over the whole, is of course wrong: each packet has its
//! own, over its own IP and UDP lengths and its own IPv4 Identification
//! (the kernel numbers a train's segments from the datagram's ID on).
//!
//! [`split`] finds the segment length, cuts the datagram into the packets
//! that were (or will be) on the wire, each with its own IP and UDP headers,
//! and checks every packet's ICRC, recovering each IPv4 ID from it (W-16).
//! A datagram that does not cut into packets that all verify is not split:
//! the caller reports it whole.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::icrc;
use super::opcode::Opcode;
use super::roce::ICRC_LEN;

/// The smallest RoCE packet: a BTH and an ICRC.
const MIN_PACKET: usize = 12 + ICRC_LEN;
/// The most segments a GSO train has (`UDP_MAX_SEGMENTS`).
const MAX_SEGMENTS: usize = 128;

/// One packet of a train as it is on the wire: its whole IP packet, and
/// (IPv4) the Identification its ICRC says it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// IP header, UDP header and RoCE packet.
    pub packet: Vec<u8>,
    /// The IPv4 ID the ICRC was computed with; `None` for IPv6.
    pub ipv4_id: Option<u16>,
}

/// The IP header of `ip` and where its UDP payload is.
struct Datagram<'a> {
    ip_header: &'a [u8],
    udp_header: &'a [u8],
    payload: &'a [u8],
}

fn datagram(ip: &[u8]) -> Option<Datagram<'_>> {
    let header_len = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0xf) * 4;
            let fragment = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x3fff != 0;
            if ihl < 20 || *ip.get(9)? != 17 || fragment {
                return None;
            }
            ihl
        }
        6 if *ip.get(6)? == 17 => 40,
        _ => return None,
    };
    let udp_header = ip.get(header_len..header_len + 8)?;
    let udp_len = usize::from(u16::from_be_bytes([udp_header[4], udp_header[5]]));
    // A GRO'd or GSO'd datagram's UDP length may say the whole or be
    // anything the capture point left; trust the bytes that are there.
    let payload = ip.get(header_len + 8..)?;
    if udp_len != 0 && udp_len < 8 + MIN_PACKET {
        return None;
    }
    Some(Datagram { ip_header: &ip[..header_len], udp_header, payload })
}

/// Whether `bth` could open a RoCE packet: a known opcode, transport
/// version 0, and the reserved bits clear.
fn plausible_bth(bth: &[u8]) -> bool {
    bth.len() >= 12 && Opcode::from_u8(bth[0]).is_ok() && bth[1] & 0x0f == 0 && bth[4] & 0x3f == 0 && bth[8] & 0x7f == 0
}

/// Splits a datagram holding a train of RoCE packets into them, each
/// verified by its ICRC; `None` if `ip` is not such a train (a single
/// packet, not RoCE, or bytes that do not cut into packets that verify).
pub fn split(ip: &[u8]) -> Option<Vec<Segment>> {
    let d = datagram(ip)?;
    let n = d.payload.len();
    if n < 2 * MIN_PACKET || !plausible_bth(d.payload) {
        return None;
    }
    // Segments are 4-byte multiples (RoCE pads payloads). Each candidate
    // length must put a plausible BTH at every cut before its ICRC is tried.
    (MIN_PACKET..n)
        .step_by(4)
        .filter(|&len| n.div_ceil(len) <= MAX_SEGMENTS)
        .filter(|&len| (len..n).step_by(len).all(|at| plausible_bth(&d.payload[at..])))
        .find_map(|len| cut(&d, len))
}

/// The train of `len`-byte segments, if every one verifies.
fn cut(d: &Datagram<'_>, len: usize) -> Option<Vec<Segment>> {
    d.payload.chunks(len).map(|roce| segment(d, roce)).collect()
}

fn segment(d: &Datagram<'_>, roce: &[u8]) -> Option<Segment> {
    let udp_len = u16::try_from(8 + roce.len()).ok()?;
    let mut udp = [0u8; 8];
    udp[..4].copy_from_slice(&d.udp_header[..4]);
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    let mut packet = Vec::with_capacity(d.ip_header.len() + 8 + roce.len());
    let ipv4_id = match d.ip_header[0] >> 4 {
        4 => {
            let h = d.ip_header;
            let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
            let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
            let id = icrc::verify_ipv4_unknown_id(src, dst, &udp, roce).ok()??;
            let mut header = h.to_vec();
            let total = u16::try_from(h.len() + 8 + roce.len()).ok()?;
            header[2..4].copy_from_slice(&total.to_be_bytes());
            header[4..6].copy_from_slice(&id.to_be_bytes());
            header[10..12].copy_from_slice(&[0, 0]);
            let checksum = ipv4_checksum(&header);
            header[10..12].copy_from_slice(&checksum.to_be_bytes());
            packet.extend_from_slice(&header);
            Some(id)
        }
        _ => {
            let mut header: [u8; 40] = d.ip_header.try_into().ok()?;
            header[4..6].copy_from_slice(&udp_len.to_be_bytes());
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(&header[8..24]).ok()?);
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&header[24..40]).ok()?);
            let masked = icrc_ipv6_header(src, dst, udp_len);
            if !icrc::verify(&masked, &udp, roce).ok()? {
                return None;
            }
            packet.extend_from_slice(&header);
            None
        }
    };
    packet.extend_from_slice(&udp);
    packet.extend_from_slice(roce);
    Some(Segment { packet, ipv4_id })
}

/// An IPv6 header as the ICRC covers it (its masked fields zero).
fn icrc_ipv6_header(src: Ipv6Addr, dst: Ipv6Addr, payload_len: u16) -> [u8; 40] {
    let mut h = [0u8; 40];
    h[0] = 0x60;
    h[4..6].copy_from_slice(&payload_len.to_be_bytes());
    h[6] = 17;
    h[8..24].copy_from_slice(&src.octets());
    h[24..40].copy_from_slice(&dst.octets());
    h
}

/// The IPv4 header checksum of `header` (its checksum field zero).
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Packet;

    /// A train as a GSO sender builds it: `lengths.len()` RoCE packets of the
    /// given lengths, each with the ICRC of IPv4 ID `first_id + i`, glued
    /// behind one IPv4 and UDP header.
    fn train(lengths: &[usize], first_id: u16) -> Vec<u8> {
        let (src, dst) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
        let mut payload = Vec::new();
        for (i, &len) in lengths.iter().enumerate() {
            let mut roce = vec![0u8; len];
            roce[0] = 0x0a; // RC RDMA WRITE ONLY
            roce[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
            roce[7] = 0x11;
            roce[11] = i as u8;
            for (k, b) in roce[12..len - ICRC_LEN].iter_mut().enumerate() {
                *b = (k * 7 + i) as u8;
            }
            let mut udp = [0u8; 8];
            udp[..2].copy_from_slice(&4791u16.to_be_bytes());
            udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
            udp[4..6].copy_from_slice(&((8 + len) as u16).to_be_bytes());
            let ip = icrc::ipv4_header(src, dst, (28 + len) as u16, first_id + i as u16, 0x40);
            icrc::fill(&ip, &udp, &mut roce).unwrap();
            payload.extend_from_slice(&roce);
        }
        let mut packet = icrc::ipv4_header(src, dst, (28 + payload.len()) as u16, first_id, 0x40).to_vec();
        packet[8] = 64;
        let mut udp = [0u8; 8];
        udp[..2].copy_from_slice(&4791u16.to_be_bytes());
        udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
        udp[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        packet.extend_from_slice(&udp);
        packet.extend_from_slice(&payload);
        packet
    }

    #[test]
    fn a_train_splits_into_packets_that_each_verify_with_their_own_id() {
        let datagram = train(&[1044, 1044, 1044, 300], 7);
        assert!(!Packet::parse(&datagram).unwrap().icrc_ok(), "the whole is not one packet");
        let segments = split(&datagram).expect("a train");
        assert_eq!(segments.iter().map(|s| s.ipv4_id).collect::<Vec<_>>(), [Some(7), Some(8), Some(9), Some(10)]);
        for (i, s) in segments.iter().enumerate() {
            let pkt = Packet::parse(&s.packet).unwrap();
            assert!(pkt.icrc_ok(), "segment {i}");
            assert_eq!(pkt.roce.header.bth.psn.value(), i as u32);
        }
        assert_eq!(segments[3].packet.len(), 20 + 8 + 300);
    }

    /// softroce's own traffic captured on lo (tests/data/README.md): every
    /// datagram is one packet that verifies or a train whose packets all do.
    #[test]
    fn every_datagram_of_a_loopback_capture_verifies_whole_or_as_a_train() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/softroce/lo_trains.pcap");
        let (frames, damage) = crate::capture::read(&std::fs::read(path).unwrap());
        assert!(damage.is_none());
        let (mut packets, mut trains) = (0, 0);
        for frame in &frames {
            let ip = crate::capture::ip_bytes(frame.link, &frame.data).unwrap();
            if Packet::parse(ip).is_ok_and(|p| p.icrc_ok()) {
                packets += 1;
                continue;
            }
            let segments = split(ip).expect("a datagram that is not one good packet is a train");
            assert!(segments.len() >= 2);
            for s in &segments {
                assert!(Packet::parse(&s.packet).unwrap().icrc_ok());
            }
            packets += segments.len();
            trains += 1;
        }
        assert_eq!((packets, trains), (166, 30));
    }

    #[test]
    fn a_single_packet_or_a_damaged_train_is_not_split() {
        let one = train(&[1044], 0);
        assert_eq!(split(&one), None);
        let mut damaged = train(&[516, 516, 516], 0);
        let at = damaged.len() - 100;
        damaged[at] ^= 1;
        assert_eq!(split(&damaged), None);
        assert_eq!(split(&[]), None);
        assert_eq!(split(&[0x45; 60]), None);
    }

    proptest::proptest! {
        /// Any bytes, behind a plausible IPv4 and UDP header or not, give a
        /// train or `None`, never a panic.
        #[test]
        fn split_never_panics(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048), framed: bool) {
            let mut ip = Vec::new();
            if framed {
                ip.extend_from_slice(&icrc::ipv4_header(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0, 0, 0x40));
                ip.extend_from_slice(&[0x12, 0xb7, 0x12, 0xb7, 0, 0, 0, 0]);
            }
            ip.extend_from_slice(&body);
            let _ = split(&ip);
        }
    }
}
