//! Whatever bytes arrive, the wire and capture parsers must not panic, and
//! whatever they accept must survive a trip through its bytes: re-emitting and
//! re-parsing gives the same values, and a rebuilt packet's ICRC verifies.

#![no_main]

use std::net::Ipv4Addr;

use etherparse::{IpNumber, Ipv4Header, UdpHeader};
use libfuzzer_sys::fuzz_target;
use softroce::capture;
use softroce::wire::packet::build;
use softroce::wire::{icrc, IpHeader, Packet, RoceRepr, ROCE_UDP_PORT};

fuzz_target!(|data: &[u8]| {
    check_packet(data);
    check_roce(data);
    let (frames, _) = capture::read(data);
    for frame in &frames {
        if let Some(ip) = capture::ip_bytes(frame.link, &frame.data) {
            check_packet(ip);
        }
    }
});

/// An IP packet that parses re-emits to bytes that parse to the same values
/// (up to the lengths and IPv4 checksum `build` computes) with a valid ICRC,
/// and re-emitting those changes nothing.
fn check_packet(data: &[u8]) {
    let Ok(first) = Packet::parse(data) else { return };
    let _ = first.icrc_ok();
    let bytes = first.to_bytes().expect("a parsed packet re-emits");
    let again = Packet::parse(&bytes).expect("a re-emitted packet parses");
    assert_eq!(again.roce.header, first.roce.header);
    assert_eq!(again.roce.payload, first.roce.payload);
    assert_eq!(again.roce.pad, first.roce.pad);
    assert_eq!(again.udp, first.udp);
    assert_eq!(without_computed_fields(&again.ip), without_computed_fields(&first.ip));
    assert!(again.icrc_ok(), "rebuilt packet's ICRC");
    assert_eq!(again.to_bytes().expect("re-emits"), bytes);
    if let IpHeader::V4(h) = &again.ip {
        if h.options.is_empty() {
            assert_eq!(recover_id(&bytes), Some(h.identification));
        }
    }
}

/// A UDP payload that parses re-emits to bytes that parse to the same values,
/// and builds into a packet whose ICRC verifies.
fn check_roce(data: &[u8]) {
    let Ok(first) = RoceRepr::parse(data) else { return };
    let mut buf = vec![0u8; first.header.wire_len(first.payload.len())];
    let len = first.header.emit(&mut buf, first.payload).expect("a parsed header re-emits");
    assert_eq!(len, buf.len());
    let again = RoceRepr::parse(&buf).expect("re-emitted bytes parse");
    assert_eq!((again.header, again.payload, again.pad), (first.header, first.payload, first.pad));

    let id = first.header.bth.psn.value() as u16;
    let mut ip = Ipv4Header::new(0, 64, IpNumber::UDP, [10, 77, 0, 3], [10, 77, 0, 2]).unwrap();
    ip.identification = id;
    ip.dont_fragment = true;
    let udp =
        UdpHeader { source_port: 0xc000, destination_port: ROCE_UDP_PORT, length: 0, checksum: 0 };
    let bytes = build(&IpHeader::V4(ip), &udp, &first.header, first.payload).expect("builds");
    let packet = Packet::parse(&bytes).expect("a built packet parses");
    assert!(packet.icrc_ok(), "built packet's ICRC");
    assert_eq!(packet.roce.header, first.header);
    assert_eq!(recover_id(&bytes), Some(id));
}

/// The IP header with the fields `build` computes zeroed.
fn without_computed_fields(ip: &IpHeader) -> IpHeader {
    let mut ip = ip.clone();
    match &mut ip {
        IpHeader::V4(h) => (h.total_len, h.header_checksum) = (0, 0),
        IpHeader::V6(h) => h.payload_length = 0,
    }
    ip
}

/// The IPv4 ID as a UDP socket receiver recovers it (no options).
fn recover_id(bytes: &[u8]) -> Option<u16> {
    let src = Ipv4Addr::new(bytes[12], bytes[13], bytes[14], bytes[15]);
    let dst = Ipv4Addr::new(bytes[16], bytes[17], bytes[18], bytes[19]);
    icrc::verify_ipv4_unknown_id(src, dst, &bytes[20..28], &bytes[28..]).expect("well-formed")
}
