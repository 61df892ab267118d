//! Golden tests: the wire module against real kernel-rxe traffic in
//! `tests/data` (see its README). Each expectation is a fact about those
//! captures; where practical it is checked from the raw bytes rather than
//! through the code under test.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};

use crate::support::captures;
use softroce::capture;
use softroce::wire::opcode::Position;
use softroce::wire::packet::rxe_source_port;
use softroce::wire::Operation::*;
use softroce::wire::Transport::{Rc, Uc, Ud};
use softroce::wire::{icrc, IpHeader, Opcode, Operation, Packet, Psn, Syndrome, Transport};

/// What a capture is known to hold.
struct Expected {
    name: &'static str,
    /// Packets to UDP port 4791.
    packets: usize,
    /// Every opcode that occurs, and no other.
    opcodes: &'static [(Transport, Operation)],
    /// Path MTU: the payload of every FIRST and MIDDLE packet.
    mtu: usize,
    /// Size of every message that carries data (the tool's `-s`), if any does.
    message_len: Option<usize>,
}

const SEND_AND_ACK: &[(Transport, Operation)] = &[(Rc, SendFirst), (Rc, SendMiddle), (Rc, SendLast), (Rc, Acknowledge)];

const CAPTURES: [Expected; 9] = [
    Expected {
        name: "rc_atomic_fadd",
        packets: 10,
        opcodes: &[(Rc, FetchAdd), (Rc, AtomicAcknowledge)],
        mtu: 1024,
        message_len: None,
    },
    Expected {
        name: "rc_read_bw",
        packets: 30,
        opcodes: &[(Rc, ReadRequest), (Rc, ReadResponseFirst), (Rc, ReadResponseMiddle), (Rc, ReadResponseLast)],
        mtu: 1024,
        message_len: Some(5000),
    },
    Expected { name: "rc_send_bw", packets: 20, opcodes: SEND_AND_ACK, mtu: 1024, message_len: Some(3000) },
    Expected { name: "rc_send_mtu1024", packets: 32, opcodes: SEND_AND_ACK, mtu: 1024, message_len: Some(3000) },
    Expected { name: "rc_send_mtu4096", packets: 32, opcodes: SEND_AND_ACK, mtu: 4096, message_len: Some(9000) },
    Expected {
        name: "rc_write_bw",
        packets: 30,
        opcodes: &[(Rc, WriteFirst), (Rc, WriteMiddle), (Rc, WriteLast), (Rc, Acknowledge)],
        mtu: 1024,
        message_len: Some(5000),
    },
    Expected {
        name: "srq_send",
        packets: 24,
        opcodes: &[(Rc, SendFirst), (Rc, SendLast), (Rc, Acknowledge)],
        mtu: 1024,
        message_len: Some(1500),
    },
    Expected {
        name: "uc_send_mtu1024",
        packets: 24,
        opcodes: &[(Uc, SendFirst), (Uc, SendMiddle), (Uc, SendLast)],
        mtu: 1024,
        message_len: Some(2500),
    },
    Expected { name: "ud_send", packets: 8, opcodes: &[(Ud, SendOnly)], mtu: 1024, message_len: Some(512) },
];

/// The Q_Key `ibv_ud_pingpong` uses.
const UD_QKEY: u32 = 0x1111_1111;

/// Parses every RoCE packet of a capture; panics naming the first that fails.
fn parse_all<'a>(name: &str, ips: &'a [Vec<u8>]) -> Vec<Packet<'a>> {
    ips.iter()
        .enumerate()
        .map(|(i, ip)| Packet::parse(ip).unwrap_or_else(|e| panic!("{name} packet {i}: {e}")))
        .collect()
}

/// Runs `check` on each capture with its IP packets and their parsed views.
fn for_each_capture(mut check: impl FnMut(&'static Expected, &[Vec<u8>], &[Packet<'_>])) {
    for expected in &CAPTURES {
        let ips = captures::roce_ip_packets(expected.name);
        let packets = parse_all(expected.name, &ips);
        check(expected, &ips, &packets);
    }
}

/// Runs `check` on the parsed packets of one capture.
fn with_capture(name: &str, check: impl FnOnce(&[Packet<'_>])) {
    let ips = captures::roce_ip_packets(name);
    check(&parse_all(name, &ips));
}

fn opcode(p: &Packet<'_>) -> Opcode {
    p.roce.header.bth.opcode
}

/// Source, destination and destination QP: one direction of one connection.
type Flow = (IpAddr, IpAddr, u32);

fn flow(p: &Packet<'_>) -> Flow {
    (p.ip.source(), p.ip.destination(), p.roce.header.bth.dest_qpn)
}

/// Whether `reverse` travels the opposite way to `forward` (any QP).
fn is_reverse(forward: Flow, reverse: Flow) -> bool {
    forward.0 == reverse.1 && forward.1 == reverse.0
}

/// A message reassembled from its packets.
struct Message {
    flow: Flow,
    first_psn: Psn,
    packets: usize,
    len: usize,
}

/// The messages of every opcode that carries payload (READ responses included),
/// in the order they complete. Panics unless each flow's packets form whole
/// messages with consecutive PSNs.
fn messages(packets: &[Packet<'_>]) -> Vec<Message> {
    let mut open: HashMap<Flow, Message> = HashMap::new();
    let mut done = Vec::new();
    for p in packets.iter().filter(|p| opcode(p).has_payload()) {
        let (flow, psn, len) = (flow(p), p.roce.header.bth.psn, p.roce.payload.len());
        let start = Message { flow, first_psn: psn, packets: 1, len };
        match opcode(p).operation().position() {
            Position::Only => done.push(start),
            Position::First => {
                assert!(open.insert(flow, start).is_none(), "FIRST inside a message: {flow:?}")
            }
            Position::Middle | Position::Last => {
                let m = open.get_mut(&flow).unwrap_or_else(|| panic!("no FIRST: {flow:?}"));
                assert_eq!(psn, m.first_psn.wrapping_add(m.packets as u32), "{flow:?}");
                m.packets += 1;
                m.len += len;
                if opcode(p).operation().position() == Position::Last {
                    done.push(open.remove(&flow).unwrap());
                }
            }
        }
    }
    assert!(open.is_empty(), "messages without LAST");
    done
}

/// Where the BTH starts, from the IPv4 IHL (no IPv6 in these captures).
fn bth_at(ip: &[u8]) -> usize {
    assert_eq!(ip[0] >> 4, 4, "IPv4");
    usize::from(ip[0] & 0x0f) * 4 + 8
}

/// The ICRC check a receiver on a UDP socket can run: it knows the addresses,
/// the UDP header and the UDP payload, but not the IPv4 header itself.
fn recover_id(ip: &[u8]) -> Option<u16> {
    let bth = bth_at(ip);
    let udp = &ip[bth - 8..bth];
    let udp_end = bth - 8 + usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    icrc::verify_ipv4_unknown_id(src, dst, udp, &ip[bth..udp_end]).expect("well-formed input")
}

fn flipped(ip: &[u8], at: usize, bit: usize) -> Vec<u8> {
    let mut out = ip.to_vec();
    out[at] ^= 1 << (bit % 8);
    out
}

#[test]
fn every_capture_is_listed() {
    let listed: Vec<&str> = CAPTURES.iter().map(|c| c.name).collect();
    assert_eq!(captures::capture_names(), listed);
}

#[test]
fn captures_read_the_same_as_pcapng() {
    for name in captures::capture_names() {
        let (frames, err) = capture::read(&captures::capture_bytes(&name));
        assert_eq!(err, None, "{name}");
        assert_eq!(capture::read(&captures::to_pcapng(&frames)), (frames, None), "{name}");
    }
}

#[test]
fn every_roce_packet_parses() {
    for expected in &CAPTURES {
        let ips = captures::roce_ip_packets(expected.name);
        assert_eq!(ips.len(), expected.packets, "{}: RoCE packets", expected.name);
        let malformed: Vec<String> = ips
            .iter()
            .enumerate()
            .filter_map(|(i, ip)| Packet::parse(ip).err().map(|e| format!("packet {i}: {e}")))
            .collect();
        assert!(malformed.is_empty(), "{}: {malformed:?}", expected.name);
    }
}

#[test]
fn every_icrc_verifies_strictly() {
    for_each_capture(|expected, ips, packets| {
        for (i, (ip, p)) in ips.iter().zip(packets).enumerate() {
            assert!(p.icrc_ok(), "{} packet {i}", expected.name);
            let wire_icrc = u32::from_le_bytes(ip[ip.len() - 4..].try_into().unwrap());
            assert_eq!(p.roce.icrc, wire_icrc, "{} packet {i}", expected.name);
        }
    });
}

#[test]
fn re_emitting_reproduces_the_captured_bytes() {
    for_each_capture(|expected, ips, packets| {
        for (i, (ip, p)) in ips.iter().zip(packets).enumerate() {
            assert_eq!(p.bytes(), &ip[..], "{} packet {i}: bytes()", expected.name);
            assert_eq!(p.to_bytes().as_ref(), Ok(ip), "{} packet {i}: to_bytes()", expected.name);
        }
    });
}

#[test]
fn unknown_id_check_recovers_the_real_ipv4_id() {
    for_each_capture(|expected, ips, packets| {
        let mut last_id: HashMap<(IpAddr, IpAddr), u16> = HashMap::new();
        for (i, (ip, p)) in ips.iter().zip(packets).enumerate() {
            let at = format!("{} packet {i}", expected.name);
            let IpHeader::V4(h) = &p.ip else { panic!("{at}: not IPv4") };
            assert!(h.options.is_empty() && h.dont_fragment, "{at}: no options, DF");
            assert_ne!(h.identification, 0, "{at}");
            assert_eq!(recover_id(ip), Some(h.identification), "{at}");
            let direction = (p.ip.source(), p.ip.destination());
            if let Some(last) = last_id.insert(direction, h.identification) {
                let step = h.identification.wrapping_sub(last);
                assert!((1..0x8000).contains(&step), "{at}: ID {last} then {}", h.identification);
            }
        }
    });
}

#[test]
fn flipped_bits_fail_the_icrc() {
    let mut flipped_packets = 0;
    let mut false_accepts = Vec::new();
    for_each_capture(|expected, ips, packets| {
        for (i, (ip, p)) in ips.iter().zip(packets).enumerate() {
            let bth = bth_at(ip);
            let body = bth + p.roce.header.header_len();
            // A payload bit; with no payload, the last extended-header bit.
            let in_payload = match p.roce.payload.len() {
                0 => flipped(ip, body - 1, i),
                len => flipped(ip, body + (i * 97) % len, i),
            };
            // A bit of the destination QP (BTH bytes 5-7).
            let in_dest_qp = flipped(ip, bth + 5 + i % 3, i);
            for (what, bad) in [("payload", in_payload), ("dest QP", in_dest_qp)] {
                let at = format!("{} packet {i}, {what} bit", expected.name);
                let parsed = Packet::parse(&bad).unwrap_or_else(|e| panic!("{at}: {e}"));
                assert!(!parsed.icrc_ok(), "{at}: strict check passed");
                flipped_packets += 1;
                if let Some(id) = recover_id(&bad) {
                    false_accepts.push(format!("{at}: accepted as ID {id}"));
                }
            }
        }
    });
    assert_eq!(flipped_packets, 2 * CAPTURES.iter().map(|c| c.packets).sum::<usize>());
    assert_eq!(false_accepts.len(), 0, "{false_accepts:?}");
}

#[test]
fn masked_fields_do_not_change_the_icrc() {
    // (what, byte offset from the IP header or the BTH, new value)
    let changes = |ip: &[u8]| {
        let bth = bth_at(ip);
        [("TOS", 1, 0xb8), ("TTL", 8, 1), ("UDP checksum", bth - 2, 0x5a), ("BTH byte 4", bth + 4, 0xff)]
    };
    for_each_capture(|expected, ips, packets| {
        for (i, (ip, p)) in ips.iter().zip(packets).enumerate() {
            let IpHeader::V4(h) = &p.ip else { panic!("not IPv4") };
            let mut all = ip.clone();
            for (what, at, value) in changes(ip) {
                assert_ne!(ip[at], value, "{what} must actually change");
                let mut changed = ip.clone();
                changed[at] = value;
                all[at] = value;
                for (label, bytes) in [(what, &changed), ("all at once", &all)] {
                    let at = format!("{} packet {i}, {label}", expected.name);
                    let parsed = Packet::parse(bytes).unwrap_or_else(|e| panic!("{at}: {e}"));
                    assert!(parsed.icrc_ok(), "{at}: strict check failed");
                    assert_eq!(recover_id(bytes), Some(h.identification), "{at}");
                }
            }
        }
    });
}

#[test]
fn opcodes_are_those_of_the_workload() {
    for_each_capture(|expected, _, packets| {
        let seen: BTreeSet<u8> = packets.iter().map(|p| opcode(p).to_u8()).collect();
        let want: BTreeSet<u8> =
            expected.opcodes.iter().map(|&(t, op)| Opcode::new(t, op).expect("valid opcode").to_u8()).collect();
        assert_eq!(seen, want, "{}", expected.name);
    });
}

#[test]
fn read_requests_carry_reth_and_responses_aeth() {
    with_capture("rc_read_bw", |packets| {
        for (i, p) in packets.iter().enumerate() {
            let h = &p.roce.header;
            let op = opcode(p).operation();
            assert_eq!(h.reth.is_some(), op == ReadRequest, "packet {i} {op:?}: RETH");
            // IBTA: READ responses FIRST, LAST and ONLY carry an AETH, MIDDLE none.
            let wants_aeth = matches!(op, ReadResponseFirst | ReadResponseLast | ReadResponseOnly);
            assert_eq!(h.aeth.is_some(), wants_aeth, "packet {i} {op:?}: AETH");
            if let Some(aeth) = h.aeth {
                assert!(matches!(aeth.syndrome, Syndrome::Ack { .. }), "packet {i}: {aeth:?}");
            }
            if op == ReadRequest {
                assert_eq!(h.reth.unwrap().dma_len, 5000, "packet {i}");
                assert!(p.roce.payload.is_empty(), "packet {i}");
            }
        }
    });
}

/// `ib_atomic_bw` adds 1 to a different 8-byte cell each time (the buffer is
/// walked in 64-byte steps), so the original values it gets back are unrelated
/// memory contents; the ordering lives in the AETH's MSN instead.
#[test]
fn fetch_add_is_answered_by_atomic_ack() {
    let mut addresses = BTreeSet::new();
    let mut msns = Vec::new();
    with_capture("rc_atomic_fadd", |packets| {
        for (i, p) in packets.iter().enumerate() {
            let h = &p.roce.header;
            match opcode(p).operation() {
                FetchAdd => {
                    let eth = h.atomic_eth.unwrap_or_else(|| panic!("packet {i}: no AtomicETH"));
                    assert_eq!((eth.swap_add, eth.va % 8), (1, 0), "packet {i}: add 1, aligned");
                    assert!(addresses.insert(eth.va), "packet {i}: address reused");
                    assert!(h.aeth.is_none() && h.atomic_ack_eth.is_none(), "packet {i}");
                }
                AtomicAcknowledge => {
                    let aeth = h.aeth.unwrap_or_else(|| panic!("packet {i}: no AETH"));
                    assert!(matches!(aeth.syndrome, Syndrome::Ack { .. }), "packet {i}");
                    assert!(h.atomic_ack_eth.is_some() && h.atomic_eth.is_none(), "packet {i}");
                    msns.push(aeth.msn);
                }
                op => panic!("packet {i}: unexpected {op:?}"),
            }
            assert!(p.roce.payload.is_empty(), "packet {i}");
        }
    });
    assert_eq!(addresses.len(), 5);
    assert_eq!(msns, [1, 2, 3, 4, 5]);
}

#[test]
fn ud_sends_carry_deth_with_the_qkey() {
    with_capture("ud_send", |packets| {
        for (i, p) in packets.iter().enumerate() {
            let deth = p.roce.header.deth.unwrap_or_else(|| panic!("packet {i}: no DETH"));
            assert_eq!(deth.qkey, UD_QKEY, "packet {i}");
            assert_ne!(deth.src_qpn, 0, "packet {i}: QP 0 is reserved for SMI");
        }
    });
}

#[test]
fn first_and_middle_packets_fill_the_mtu() {
    for_each_capture(|expected, _, packets| {
        for (i, p) in packets.iter().enumerate().filter(|(_, p)| opcode(p).has_payload()) {
            let len = p.roce.payload.len();
            match opcode(p).operation().position() {
                Position::First | Position::Middle => {
                    assert_eq!(len, expected.mtu, "{} packet {i}", expected.name)
                }
                Position::Last | Position::Only => {
                    assert!(len <= expected.mtu, "{} packet {i}: {len} bytes", expected.name)
                }
            }
        }
    });
}

#[test]
fn messages_have_the_workload_size() {
    for_each_capture(|expected, _, packets| {
        let messages = messages(packets);
        let lens: Vec<usize> = messages.iter().map(|m| m.len).collect();
        match expected.message_len {
            Some(len) => {
                assert!(!lens.is_empty(), "{}: no messages", expected.name);
                assert!(lens.iter().all(|&l| l == len), "{}: {lens:?}", expected.name);
            }
            None => assert!(lens.is_empty(), "{}: {lens:?}", expected.name),
        }
        for p in packets.iter().filter(|p| opcode(p).operation() == WriteFirst) {
            assert_eq!(p.roce.header.reth.map(|r| r.dma_len as usize), expected.message_len);
        }
    });
}

#[test]
fn request_psns_advance_by_one_per_packet() {
    for_each_capture(|expected, _, packets| {
        let messages = messages(packets);
        let mut next: HashMap<Flow, Psn> = HashMap::new();
        let mut checked = 0;
        for (i, p) in packets.iter().enumerate().filter(|(_, p)| opcode(p).operation().is_request()) {
            let (flow, psn) = (flow(p), p.roce.header.bth.psn);
            if let Some(want) = next.get(&flow) {
                assert_eq!(psn, *want, "{} packet {i}", expected.name);
                checked += 1;
            }
            // A READ consumes one PSN per response packet.
            let advance = if opcode(p).operation() == ReadRequest {
                messages
                    .iter()
                    .find(|m| is_reverse(flow, m.flow) && m.first_psn == psn)
                    .unwrap_or_else(|| panic!("{} packet {i}: READ unanswered", expected.name))
                    .packets
            } else {
                1
            };
            next.insert(flow, psn.wrapping_add(advance as u32));
        }
        assert!(checked > 0, "{}: no flow with two requests", expected.name);
    });
}

#[test]
fn acks_name_an_ack_requested_psn() {
    for_each_capture(|expected, _, packets| {
        let acked: Vec<&Packet<'_>> =
            packets.iter().filter(|p| matches!(opcode(p).operation(), Acknowledge | AtomicAcknowledge)).collect();
        for ack in acked {
            let request = packets.iter().find(|p| {
                is_reverse(flow(ack), flow(p))
                    && p.roce.header.bth.ack_req
                    && p.roce.header.bth.psn == ack.roce.header.bth.psn
            });
            assert!(request.is_some(), "{}: ACK of {}", expected.name, ack.roce.header.bth.psn);
            let aeth = ack.roce.header.aeth.expect("AETH");
            assert!(matches!(aeth.syndrome, Syndrome::Ack { .. }), "{}: {aeth:?}", expected.name);
        }
    });
}

/// RC and UC QPs send from the UDP port kernel rxe derives from the two QPNs
/// (`rxe_source_port`; UD QPs hash their own QPN instead). A sender's own QPN
/// is not in its packets, but it is the destination QP of some packet coming
/// back.
#[test]
fn connected_qps_send_from_their_flow_label_port() {
    for_each_capture(|expected, _, packets| {
        for (i, p) in packets.iter().enumerate().filter(|(_, p)| opcode(p).transport() != Ud) {
            let dest = p.roce.header.bth.dest_qpn;
            let local_qpns: BTreeSet<u32> =
                packets.iter().filter(|q| is_reverse(flow(p), flow(q))).map(|q| q.roce.header.bth.dest_qpn).collect();
            let port = p.udp.source_port;
            assert!(
                local_qpns.iter().any(|&local| rxe_source_port(local, dest) == port),
                "{} packet {i}: port {port:#x}, QP {dest:#x}, local QPs {local_qpns:x?}",
                expected.name
            );
        }
    });
}
