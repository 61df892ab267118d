//! Reading and writing packet captures (pcap and pcapng, via `pcap-file`).
//!
//! Captures hold link-layer frames; [`ip_bytes`] strips the link layer for the
//! link types RoCE traffic is captured on: Ethernet (with VLAN tags), Linux
//! cooked capture (v1 and v2) and raw IP.

use std::fmt;
use std::io::Write;
use std::time::Duration;

use etherparse::{EtherType, Ethernet2Header, SingleVlanHeader};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub timestamp: Duration,
    pub link: DataLink,
    pub data: Vec<u8>,
}

/// Why a capture could not be read completely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureError {
    pub message: String,
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CaptureError {}

fn error(message: impl Into<String>) -> CaptureError {
    CaptureError { message: message.into() }
}

/// Reads a whole pcap or pcapng file (detected by its magic number). Returns
/// the frames read and, when the file is damaged, the error that stopped the
/// reading: frames before the damage are still returned.
pub fn read(bytes: &[u8]) -> (Vec<Frame>, Option<CaptureError>) {
    let mut frames = Vec::new();
    let magic = bytes.get(..4).map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
    let result = match magic {
        Some(0x0a0d_0d0a) => read_pcapng(bytes, &mut frames),
        Some(0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1) => read_pcap(bytes, &mut frames),
        _ => Err(error("not a pcap or pcapng file (unknown magic number)")),
    };
    (frames, result.err())
}

fn read_pcap(bytes: &[u8], frames: &mut Vec<Frame>) -> Result<(), CaptureError> {
    let mut reader = PcapReader::new(bytes).map_err(|e| error(format!("pcap header: {e}")))?;
    let link = reader.header().datalink;
    while let Some(packet) = reader.next_packet() {
        let packet = packet.map_err(|e| error(format!("pcap record {}: {e}", frames.len() + 1)))?;
        frames.push(Frame { timestamp: packet.timestamp, link, data: packet.data.into_owned() });
    }
    Ok(())
}

fn read_pcapng(bytes: &[u8], frames: &mut Vec<Frame>) -> Result<(), CaptureError> {
    let mut reader = PcapNgReader::new(bytes).map_err(|e| error(format!("pcapng header: {e}")))?;
    // Interfaces are numbered per section, in the order they are declared.
    let mut links: Vec<DataLink> = Vec::new();
    while let Some(block) = reader.next_block() {
        let block = block.map_err(|e| error(format!("pcapng block: {e}")))?;
        let (interface, timestamp, data) = match block {
            Block::SectionHeader(_) => {
                links.clear();
                continue;
            }
            Block::InterfaceDescription(idb) => {
                links.push(idb.linktype);
                continue;
            }
            Block::EnhancedPacket(epb) => (epb.interface_id, epb.timestamp, epb.data.into_owned()),
            Block::SimplePacket(spb) => (0, Duration::ZERO, spb.data.into_owned()),
            _ => continue,
        };
        let link = *links
            .get(interface as usize)
            .ok_or_else(|| error(format!("pcapng packet on undeclared interface {interface}")))?;
        frames.push(Frame { timestamp, link, data });
    }
    Ok(())
}

/// The IP packet inside a frame, or `None` for link types and EtherTypes that
/// do not carry IPv4/IPv6.
pub fn ip_bytes(link: DataLink, data: &[u8]) -> Option<&[u8]> {
    match link {
        DataLink::ETHERNET => {
            let (eth, mut rest) = Ethernet2Header::from_slice(data).ok()?;
            let mut ether_type = eth.ether_type;
            while matches!(ether_type, EtherType::VLAN_TAGGED_FRAME | EtherType::PROVIDER_BRIDGING)
            {
                let (vlan, inner) = SingleVlanHeader::from_slice(rest).ok()?;
                ether_type = vlan.ether_type;
                rest = inner;
            }
            is_ip(ether_type.0).then_some(rest)
        }
        // Linux cooked capture v1: protocol at bytes 14-15 of a 16-byte header.
        DataLink::LINUX_SLL => {
            let proto = u16::from_be_bytes([*data.get(14)?, *data.get(15)?]);
            is_ip(proto).then(|| &data[16..])
        }
        // v2: protocol at bytes 0-1 of a 20-byte header.
        DataLink::LINUX_SLL2 => {
            let proto = u16::from_be_bytes([*data.first()?, *data.get(1)?]);
            data.get(20..).filter(|_| is_ip(proto))
        }
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => Some(data),
        _ => None,
    }
}

fn is_ip(ether_type: u16) -> bool {
    ether_type == EtherType::IPV4.0 || ether_type == EtherType::IPV6.0
}

/// Writes raw-IP frames to a pcap file, so any run (a simulated network, a
/// test) can be opened in `softroce dump` or Wireshark.
pub struct IpPcapWriter<W: Write> {
    inner: PcapWriter<W>,
}

impl<W: Write> IpPcapWriter<W> {
    pub fn new(writer: W) -> Result<Self, CaptureError> {
        let header = PcapHeader { datalink: DataLink::RAW, ..Default::default() };
        PcapWriter::with_header(writer, header)
            .map(|inner| IpPcapWriter { inner })
            .map_err(|e| error(format!("pcap header: {e}")))
    }

    /// Appends one IP packet with its timestamp.
    pub fn write(&mut self, timestamp: Duration, ip_packet: &[u8]) -> Result<(), CaptureError> {
        let len = u32::try_from(ip_packet.len()).map_err(|_| error("packet too large"))?;
        self.inner
            .write_packet(&PcapPacket::new(timestamp, len, ip_packet))
            .map(|_| ())
            .map_err(|e| error(format!("pcap write: {e}")))
    }

    pub fn into_inner(self) -> W {
        self.inner.into_writer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reads_back_raw_ip() {
        let mut w = IpPcapWriter::new(Vec::new()).unwrap();
        w.write(Duration::from_micros(5), &[0x45, 0, 0, 20]).unwrap();
        let bytes = w.into_inner();
        let (frames, err) = read(&bytes);
        assert_eq!(err, None);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].link, DataLink::RAW);
        assert_eq!(ip_bytes(frames[0].link, &frames[0].data), Some(&[0x45, 0, 0, 20][..]));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(read(b"").1.is_some());
        assert!(read(b"hello world, not a capture").1.is_some());
        let mut w = IpPcapWriter::new(Vec::new()).unwrap();
        w.write(Duration::ZERO, &[1; 100]).unwrap();
        let bytes = w.into_inner();
        for cut in 0..bytes.len() {
            let _ = read(&bytes[..cut]);
        }
        let (frames, err) = read(&bytes[..bytes.len() - 10]);
        assert!(frames.is_empty());
        assert!(err.is_some());
    }
}
