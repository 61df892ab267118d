//! Sorting captured frames into RoCEv2 packets, broken RoCEv2 packets and
//! other traffic.
//!
//! [`Packet::parse`] reports any damaged IP or UDP header as `BadIp`, which
//! cannot tell a broken RoCE packet from unrelated traffic. A frame counts as
//! RoCE when the UDP destination port 4791 can be read from it; only then is
//! a parse failure reported as malformed.
//!
//! A UD SEND to QP 1 carries a management datagram; [`gsi`] reads it as a
//! CM message where it is one.
//!
//! softroce sends one kind of datagram to the RoCE port that is not RoCE:
//! the census probes with which programs that share a device's port count
//! each other's sockets (`softroce::net::share`). They are named, not
//! called malformed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use softroce::capture::{self, Frame};
use softroce::net::bpf;
use softroce::wire::mad::{Mad, MadRepr, GSI_QPN, MAD_LEN};
use softroce::wire::{CmMad, Error, Packet, Transport, ROCE_UDP_PORT};

/// What one frame holds.
#[derive(Debug)]
pub enum Decoded<'a> {
    Roce(Packet<'a>),
    Malformed(Malformed),
    /// A census probe of softroce's shared port.
    CensusProbe(CensusProbe),
    /// Not RoCEv2: skipped without a word.
    Other,
}

/// A frame addressed to the RoCEv2 port that does not parse.
#[derive(Debug)]
pub struct Malformed {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub error: String,
}

/// A census probe: the coordinator of the programs that share a port sends
/// `position + 1` of them to the port, each with the census's nonce.
#[derive(Debug)]
pub struct CensusProbe {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub nonce: u32,
    pub position: u32,
}

pub fn decode(frame: &Frame) -> Decoded<'_> {
    let Some(ip) = capture::ip_bytes(frame.link, &frame.data) else {
        return Decoded::Other;
    };
    let error = match Packet::parse(ip) {
        Ok(pkt) => return Decoded::Roce(pkt),
        Err(Error::NotRoce) => return Decoded::Other,
        Err(e) => e,
    };
    let Some(fields) = IpFields::read(ip) else {
        return Decoded::Other;
    };
    if fields.udp_dst_port(ip) != Some(ROCE_UDP_PORT) {
        return Decoded::Other;
    }
    if let Some((nonce, position)) = fields.udp_payload(ip).and_then(bpf::parse_probe) {
        return Decoded::CensusProbe(CensusProbe { src: fields.src, dst: fields.dst, nonce, position });
    }
    Decoded::Malformed(Malformed {
        src: fields.src,
        dst: fields.dst,
        error: fields.problem(ip.len()).unwrap_or_else(|| error.to_string()),
    })
}

/// The few IP header fields needed to recognise RoCE, read leniently.
struct IpFields {
    src: IpAddr,
    dst: IpAddr,
    header_len: usize,
    total_len: usize,
    /// UDP, and where the UDP header would be (not a later fragment).
    udp: bool,
    fragment: bool,
}

impl IpFields {
    fn read(ip: &[u8]) -> Option<IpFields> {
        match ip.first()? >> 4 {
            4 => {
                let h: [u8; 20] = ip.get(..20)?.try_into().ok()?;
                let flags_offset = u16::from_be_bytes([h[6], h[7]]);
                Some(IpFields {
                    src: Ipv4Addr::new(h[12], h[13], h[14], h[15]).into(),
                    dst: Ipv4Addr::new(h[16], h[17], h[18], h[19]).into(),
                    header_len: usize::from(h[0] & 0xf) * 4,
                    total_len: usize::from(u16::from_be_bytes([h[2], h[3]])),
                    udp: h[9] == 17 && flags_offset & 0x1fff == 0,
                    fragment: flags_offset & 0x3fff != 0,
                })
            }
            6 => {
                let h: [u8; 40] = ip.get(..40)?.try_into().ok()?;
                let address = |at: usize| -> Option<IpAddr> {
                    let octets: [u8; 16] = h[at..at + 16].try_into().ok()?;
                    Some(Ipv6Addr::from(octets).into())
                };
                Some(IpFields {
                    src: address(8)?,
                    dst: address(24)?,
                    header_len: 40,
                    total_len: 40 + usize::from(u16::from_be_bytes([h[4], h[5]])),
                    udp: h[6] == 17,
                    fragment: false,
                })
            }
            _ => None,
        }
    }

    fn udp_dst_port(&self, ip: &[u8]) -> Option<u16> {
        let at = self.header_len + 2;
        let port = ip.get(at..at + 2)?;
        self.udp.then(|| u16::from_be_bytes([port[0], port[1]]))
    }

    /// The UDP payload, as far as the IP header's length says and the
    /// frame holds.
    fn udp_payload<'a>(&self, ip: &'a [u8]) -> Option<&'a [u8]> {
        let end = self.total_len.min(ip.len());
        ip.get(self.header_len + 8..end)
    }

    /// A more precise diagnosis than the library's `BadIp`, where one is easy.
    fn problem(&self, captured: usize) -> Option<String> {
        if self.fragment {
            Some("IPv4 fragment: RoCEv2 packets are never fragmented".to_string())
        } else if self.total_len > captured {
            Some(format!(
                "frame cut short: the IP header announces {} bytes, {captured} were captured \
                 (snap length too small?)",
                self.total_len
            ))
        } else {
            None
        }
    }
}

/// What the payload of a packet to QP 1 (the General Services Interface) is.
#[derive(Debug)]
pub enum Gsi {
    /// A CM message.
    Cm(Box<CmMad>),
    /// A MAD of another class or version, or one that is not 256 bytes.
    OtherMad(MadRepr),
    /// A CM MAD that does not parse, with the header it has and why.
    BadCm(MadRepr, Error),
    /// Too short to be a MAD.
    NotMad,
}

/// The management datagram of a UD packet to QP 1; `None` for any other packet.
pub fn gsi(pkt: &Packet<'_>) -> Option<Gsi> {
    let bth = &pkt.roce.header.bth;
    if bth.opcode.transport() != Transport::Ud || bth.dest_qpn != GSI_QPN {
        return None;
    }
    let payload = pkt.roce.payload;
    let Ok(header) = Mad::new_checked(payload).and_then(|mad| MadRepr::parse(&mad)) else {
        return Some(Gsi::NotMad);
    };
    if !header.is_cm() || payload.len() != MAD_LEN {
        return Some(Gsi::OtherMad(header));
    }
    Some(match CmMad::parse(payload) {
        Ok(mad) => Gsi::Cm(Box::new(mad)),
        Err(e) => Gsi::BadCm(header, e),
    })
}
