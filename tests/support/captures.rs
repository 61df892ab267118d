//! The kernel-rxe captures in `tests/data` and the RoCEv2 IP packets they hold.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::PcapNgWriter;
use softroce::capture::{self, Frame};

/// The folder holding the captures.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The name (file stem) of every `.pcap` in `tests/data`, sorted.
pub fn capture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir())
        .expect("tests/data is readable")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "pcap"))
        .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The bytes of `tests/data/<name>.pcap`.
pub fn capture_bytes(name: &str) -> Vec<u8> {
    let path = data_dir().join(format!("{name}.pcap"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every IP packet to UDP port 4791 in a capture, in capture order.
///
/// Packets are selected by reading the IP and UDP headers by hand rather than
/// with `Packet::parse`, so a packet the library wrongly calls "not RoCE" is
/// still counted.
pub fn roce_ip_packets(name: &str) -> Vec<Vec<u8>> {
    let (frames, err) = capture::read(&capture_bytes(name));
    assert_eq!(err, None, "{name}: capture::read");
    frames
        .iter()
        .filter_map(|frame| capture::ip_bytes(frame.link, &frame.data))
        .filter(|ip| is_udp_to_roce_port(ip))
        .map(<[u8]>::to_vec)
        .collect()
}

/// Whether an IPv4 or IPv6 packet carries UDP to port 4791 (no IPv6 extension
/// headers: kernel rxe sends none).
fn is_udp_to_roce_port(ip: &[u8]) -> bool {
    let udp_at = match ip.first().map(|b| b >> 4) {
        Some(4) if ip.get(9) == Some(&17) => usize::from(ip[0] & 0x0f) * 4,
        Some(6) if ip.get(6) == Some(&17) => 40,
        _ => return false,
    };
    ip.get(udp_at + 2..udp_at + 4) == Some(&4791u16.to_be_bytes()[..])
}

/// Frames of one link type as a pcapng file, to reach `capture::read`'s
/// pcapng path (the captures and `IpPcapWriter` are pcap).
pub fn to_pcapng(frames: &[Frame]) -> Vec<u8> {
    let mut writer = PcapNgWriter::new(Vec::new()).expect("section header");
    let link = frames.first().expect("at least one frame").link;
    // pcap-file writes timestamps in nanoseconds whatever the interface says,
    // so say nanoseconds (if_tsresol 9).
    let interface = InterfaceDescriptionBlock {
        linktype: link,
        snaplen: 0xffff,
        options: vec![InterfaceDescriptionOption::IfTsResol(9)],
    };
    writer.write_pcapng_block(interface).expect("interface");
    for frame in frames {
        assert_eq!(frame.link, link, "one link type per file");
        let block = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: frame.timestamp,
            original_len: frame.orig_len,
            data: Cow::Borrowed(&frame.data),
            options: Vec::new(),
        };
        writer.write_pcapng_block(block).expect("packet");
    }
    writer.into_inner()
}
