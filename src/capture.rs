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
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, TsResolution};

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Capture time since the Unix epoch, as the file records it (zero for a
    /// pcapng simple packet, which has none).
    pub timestamp: Duration,
    /// Link type of the interface it was captured on ([`ip_bytes`] strips it).
    pub link: DataLink,
    /// The captured bytes, from the link-layer header on.
    pub data: Vec<u8>,
    /// Length of the frame on the wire; more than `data.len()` when the
    /// capture cut it short (snap length).
    pub orig_len: u32,
}

/// Why a capture could not be read completely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureError {
    /// What went wrong, and where in the file.
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
        frames.push(Frame {
            timestamp: packet.timestamp,
            link,
            orig_len: packet.orig_len,
            data: packet.data.into_owned(),
        });
    }
    Ok(())
}

fn read_pcapng(bytes: &[u8], frames: &mut Vec<Frame>) -> Result<(), CaptureError> {
    let mut reader = PcapNgReader::new(bytes).map_err(|e| error(format!("pcapng header: {e}")))?;
    // Interfaces are numbered per section, in the order they are declared:
    // (link type, timestamp units per second).
    let mut interfaces: Vec<(DataLink, u128)> = Vec::new();
    while let Some(block) = reader.next_block() {
        let block = block.map_err(|e| error(format!("pcapng block: {e}")))?;
        let (interface, ticks, data, orig_len) = match block {
            Block::SectionHeader(_) => {
                interfaces.clear();
                continue;
            }
            Block::InterfaceDescription(idb) => {
                let resolution = idb.options.iter().find_map(|o| match o {
                    InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                    _ => None,
                });
                interfaces.push((idb.linktype, ticks_per_second(resolution)));
                continue;
            }
            // pcap-file hands over the raw timestamp ticks as if they were nanoseconds.
            Block::EnhancedPacket(epb) => {
                (epb.interface_id, epb.timestamp.as_nanos(), epb.data.into_owned(), epb.original_len)
            }
            Block::SimplePacket(spb) => (0, 0, spb.data.into_owned(), spb.original_len),
            _ => continue,
        };
        let (link, per_second) = *interfaces
            .get(interface as usize)
            .ok_or_else(|| error(format!("pcapng packet on undeclared interface {interface}")))?;
        let nanos = ticks.saturating_mul(1_000_000_000) / per_second;
        let timestamp = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        frames.push(Frame { timestamp, link, data, orig_len });
    }
    Ok(())
}

/// Timestamp units per second from pcapng's `if_tsresol` option: 10^-n
/// seconds, or 2^-n when the top bit is set; microseconds when absent.
fn ticks_per_second(if_tsresol: Option<u8>) -> u128 {
    match if_tsresol {
        None => 1_000_000,
        Some(r) if r & 0x80 != 0 => 1u128.checked_shl(u32::from(r & 0x7f)).unwrap_or(u128::MAX),
        Some(r) => 10u128.checked_pow(u32::from(r)).unwrap_or(u128::MAX),
    }
}

/// The IP packet inside a frame, or `None` for link types and EtherTypes that
/// do not carry IPv4/IPv6.
pub fn ip_bytes(link: DataLink, data: &[u8]) -> Option<&[u8]> {
    match link {
        DataLink::ETHERNET => {
            let (eth, mut rest) = Ethernet2Header::from_slice(data).ok()?;
            let mut ether_type = eth.ether_type;
            while matches!(ether_type, EtherType::VLAN_TAGGED_FRAME | EtherType::PROVIDER_BRIDGING) {
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
    /// Starts a pcap file on `writer`: raw IP link type, nanosecond timestamps.
    pub fn new(writer: W) -> Result<Self, CaptureError> {
        let header =
            PcapHeader { datalink: DataLink::RAW, ts_resolution: TsResolution::NanoSecond, ..Default::default() };
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

    /// The writer, with everything written so far.
    pub fn into_inner(self) -> W {
        self.inner.into_writer()
    }
}

/// What a link records as it sends and receives: a pcap capture, a trace
/// ([`crate::trace`]), or both. The link holds one `Option` of this, so a
/// link that records nothing pays one branch per packet.
#[derive(Debug, Default)]
pub struct LiveCapture {
    pcap: Option<LivePcap>,
    trace: Option<crate::trace::Tracer>,
}

/// A pcap capture a link writes: one RoCE packet per record, with the IP
/// and UDP headers it has on the wire (after GSO cuts its train; the IPv4
/// ID of a received packet recovered from its ICRC), up to a number of
/// packets. Records are buffered and written out when the link flushes, so
/// a program that dies loses at most the last round's.
struct LivePcap {
    writer: IpPcapWriter<SharedFile>,
    file: SharedFile,
    left: u64,
}

/// The capture file, shared between the pcap writer and the flushes.
#[derive(Clone)]
struct SharedFile(std::sync::Arc<std::sync::Mutex<std::io::BufWriter<std::fs::File>>>);

impl SharedFile {
    fn with<T>(&self, f: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.with(|f| f.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.with(|f| f.flush())
    }
}

impl fmt::Debug for LivePcap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LivePcap").field("left", &self.left).finish_non_exhaustive()
    }
}

impl LivePcap {
    fn record(&mut self, src: SocketAddr, dst: SocketAddr, id: u16, roce: &[u8]) {
        if self.left == 0 {
            return;
        }
        let Some(packet) = wire_packet(src, dst, id, roce) else { return };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        if self.writer.write(now, &packet).is_err() {
            // A full disk ends the capture, not the traffic.
            self.left = 0;
            return;
        }
        self.left -= 1;
    }
}

impl LiveCapture {
    /// A pcap capture into `path` (created or truncated) of at most
    /// `max_packets` packets.
    pub fn create(path: &std::path::Path, max_packets: u64) -> std::io::Result<LiveCapture> {
        let file = std::fs::File::create(path)?;
        let file =
            SharedFile(std::sync::Arc::new(std::sync::Mutex::new(std::io::BufWriter::with_capacity(1 << 16, file))));
        let writer = IpPcapWriter::new(file.clone()).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(LiveCapture { pcap: Some(LivePcap { writer, file, left: max_packets }), trace: None })
    }

    /// Also writes every packet into `tracer`'s trace.
    pub fn trace(&mut self, tracer: crate::trace::Tracer) {
        self.trace = Some(tracer);
    }

    /// Records one RoCE packet (`roce`, BTH to ICRC, exactly as sent or
    /// received) between the given addresses and ports, with IPv4 ID `id`.
    pub fn record(&mut self, direction: Direction, src: SocketAddr, dst: SocketAddr, id: u16, roce: &[u8]) {
        if let Some(trace) = &self.trace {
            trace.packet(direction, src, dst, id, roce);
        }
        if direction == Direction::DroppedBadIcrc {
            // The pcap holds what the link accepted and sent.
            return;
        }
        if let Some(pcap) = &mut self.pcap {
            pcap.record(src, dst, id, roce);
        }
    }

    /// Writes buffered records out.
    pub fn flush(&mut self) {
        if let Some(pcap) = &mut self.pcap {
            let _ = pcap.file.flush();
        }
    }
}

impl Drop for LiveCapture {
    fn drop(&mut self) {
        self.flush();
    }
}

pub use crate::trace::Direction;
use std::net::SocketAddr;

/// The IP packet of `roce` from `src` to `dst` as it is on the wire: DF and
/// ID `id` for IPv4, TTL and hop limit 64, a zero UDP checksum (as rxe
/// sends), and the ICRC as it is in `roce`, right or wrong.
pub fn wire_packet(src: SocketAddr, dst: SocketAddr, id: u16, roce: &[u8]) -> Option<Vec<u8>> {
    let mut ip = crate::wire::packet::ip_header(src.ip(), dst.ip()).ok()?;
    let udp_len = u16::try_from(8 + roce.len()).ok()?;
    let mut out = Vec::with_capacity(40 + usize::from(udp_len));
    match &mut ip {
        crate::wire::IpHeader::V4(h) => {
            h.identification = id;
            h.set_payload_len(usize::from(udp_len)).ok()?;
            h.header_checksum = h.calc_header_checksum();
            out.extend_from_slice(&h.to_bytes());
        }
        crate::wire::IpHeader::V6(h) => {
            h.set_payload_length(usize::from(udp_len)).ok()?;
            out.extend_from_slice(&h.to_bytes());
        }
    }
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(roce);
    Some(out)
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
    fn pcapng_timestamps_follow_if_tsresol() {
        assert_eq!(ticks_per_second(None), 1_000_000);
        assert_eq!(ticks_per_second(Some(9)), 1_000_000_000);
        assert_eq!(ticks_per_second(Some(0x80 | 10)), 1024);
        assert_eq!(ticks_per_second(Some(0x7f)), u128::MAX);
    }

    #[test]
    fn pcap_keeps_nanoseconds() {
        let mut w = IpPcapWriter::new(Vec::new()).unwrap();
        w.write(Duration::from_nanos(1_234_567_891), &[0x45]).unwrap();
        let (frames, _) = read(&w.into_inner());
        assert_eq!(frames[0].timestamp, Duration::from_nanos(1_234_567_891));
        assert_eq!(frames[0].orig_len, 1);
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

    /// A device recording its traffic: every record is one packet, as on
    /// the wire, whose ICRC verifies strictly with the IPv4 ID recorded,
    /// although the WRITEs left in GSO trains; sent and received packets
    /// are all there.
    #[test]
    fn a_live_capture_holds_every_packet_as_on_the_wire() {
        use crate::verbs::{
            Access, CaptureOptions, ConnectOptions, Context, ContextOptions, Device, QpType, SendOp, SendWr, WcStatus,
        };
        use std::net::IpAddr;
        let (ip_a, ip_b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let port = crate::net::udp::free_port(&[ip_a, ip_b]).unwrap();
        let path = std::env::temp_dir().join(format!("softroce-live-capture-{}.pcap", std::process::id()));
        let a_options = ContextOptions { port, capture: Some(CaptureOptions::new(&path)), ..ContextOptions::default() };
        let a = Context::open(&Device::custom("cap_a", vec![ip_a], [2, 0, 0, 0, 0, 1], 65536), a_options).unwrap();
        let b_options = ContextOptions { port, ..ContextOptions::default() };
        let b = Context::open(&Device::custom("cap_b", vec![ip_b], [2, 0, 0, 0, 0, 2], 65536), b_options).unwrap();
        let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (cq_a, cq_b) = (a.create_cq(64, None).unwrap(), b.create_cq(64, None).unwrap());
        let (qp_a, qp_b) =
            (pd_a.create_qp(QpType::Rc, &cq_a).build().unwrap(), pd_b.create_qp(QpType::Rc, &cq_b).build().unwrap());
        let writable =
            ConnectOptions { access: Access::LOCAL_WRITE | Access::REMOTE_WRITE, ..ConnectOptions::default() };
        qp_a.connect(&qp_b.endpoint(1).unwrap(), &writable).unwrap();
        qp_b.connect(&qp_a.endpoint(1).unwrap(), &writable).unwrap();
        let (mr_a, mr_b) =
            (pd_a.alloc_mr(1 << 18, Access::LOCAL_WRITE).unwrap(), pd_b.alloc_mr(1 << 18, writable.access).unwrap());
        for i in 0..4 {
            let write = SendOp::RdmaWrite { remote_addr: mr_b.addr(), rkey: mr_b.rkey() };
            qp_a.post_send(SendWr::new(i, write).with_sge(mr_a.sge(0, 1 << 18))).unwrap();
            assert_eq!(cq_a.wait_one(Duration::from_secs(10)).unwrap().status, WcStatus::Success);
        }
        let link = a.counters().link;
        drop((qp_a, qp_b, mr_a, mr_b, cq_a, cq_b, pd_a, pd_b, a, b));
        let (frames, damage) = read(&std::fs::read(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(damage.is_none());
        assert_eq!(frames.len() as u64, link.sent + link.received, "every packet, once");
        for (i, frame) in frames.iter().enumerate() {
            // The test's port is not 4791, so check the ICRC by hand.
            let ip = ip_bytes(frame.link, &frame.data).unwrap();
            assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, ip.len(), "record {i}: one IP packet");
            let (header, rest) = ip.split_at(20);
            let (udp, roce) = rest.split_at(8);
            assert!(crate::wire::icrc::verify(header, udp, roce).unwrap(), "record {i}'s ICRC verifies");
        }
        assert!(frames.iter().filter(|f| f.data.len() > 4000).count() >= 4 * 64, "4 KiB WRITE packets");
    }
}
