//! Property tests for the wire module: every value type survives a trip through
//! its bytes, packets the library builds parse back and verify, no input makes
//! a parser panic, and PSN arithmetic obeys its laws.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::support::captures;
use etherparse::{IpDscp, IpEcn, IpNumber, Ipv4Header, Ipv4Options, Ipv6FlowLabel, Ipv6Header, UdpHeader};
use pcap_file::DataLink;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use softroce::capture::{self, Frame, IpPcapWriter};
use softroce::wire::packet::build;
use softroce::wire::roce::pad_for;
use softroce::wire::{
    icrc, Aeth, AethRepr, AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, Bth, BthRepr, Deth, DethRepr,
    Error, Feth, FethRepr, Headers, IpHeader, NakCode, Opcode, Operation, Packet, Psn, Reth, RethRepr, RoceRepr,
    Syndrome, ROCE_UDP_PORT,
};

/// Largest payload generated: above one 1024-byte MTU, so every pad and
/// length class occurs.
const MAX_PAYLOAD: usize = 1100;

// ---------------------------------------------------------------- strategies

fn u24() -> impl Strategy<Value = u32> {
    0..=0x00ff_ffffu32
}

fn psn() -> impl Strategy<Value = Psn> {
    u24().prop_map(Psn::new)
}

fn opcode() -> impl Strategy<Value = Opcode> {
    select(Opcode::all().collect::<Vec<_>>())
}

fn bth_for(opcode: Opcode) -> impl Strategy<Value = BthRepr> {
    (any::<[bool; 5]>(), any::<u16>(), u24(), psn()).prop_map(
        move |([solicited, mig_req, fecn, becn, ack_req], pkey, dest_qpn, psn)| BthRepr {
            opcode,
            solicited,
            mig_req,
            pkey,
            fecn,
            becn,
            dest_qpn,
            ack_req,
            psn,
        },
    )
}

fn bth() -> impl Strategy<Value = BthRepr> {
    opcode().prop_flat_map(bth_for)
}

fn reth() -> impl Strategy<Value = RethRepr> {
    any::<(u64, u32, u32)>().prop_map(|(va, rkey, dma_len)| RethRepr { va, rkey, dma_len })
}

/// Every valid syndrome: ACK with any credit code, RNR NAK with any timer, and
/// the five NAK codes.
fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0..=0x1fu8).prop_map(|credits| Syndrome::Ack { credits }),
        (0..=0x1fu8).prop_map(|timer| Syndrome::RnrNak { timer }),
        select(vec![
            NakCode::PsnSequenceError,
            NakCode::InvalidRequest,
            NakCode::RemoteAccessError,
            NakCode::RemoteOperationalError,
            NakCode::InvalidRdRequest,
        ])
        .prop_map(Syndrome::Nak),
    ]
}

fn aeth() -> impl Strategy<Value = AethRepr> {
    (syndrome(), u24()).prop_map(|(syndrome, msn)| AethRepr { syndrome, msn })
}

fn atomic_eth() -> impl Strategy<Value = AtomicEthRepr> {
    any::<(u64, u32, u64, u64)>().prop_map(|(va, rkey, swap_add, compare)| AtomicEthRepr {
        va,
        rkey,
        swap_add,
        compare,
    })
}

fn atomic_ack_eth() -> impl Strategy<Value = AtomicAckEthRepr> {
    any::<u64>().prop_map(|original| AtomicAckEthRepr { original })
}

fn deth() -> impl Strategy<Value = DethRepr> {
    (any::<u32>(), u24()).prop_map(|(qkey, src_qpn)| DethRepr { qkey, src_qpn })
}

fn feth() -> impl Strategy<Value = FethRepr> {
    (0..=3u8, 0..=0xfu8).prop_map(|(selectivity, placement_type)| FethRepr { selectivity, placement_type })
}

/// A payload the opcode allows: none, exactly eight bytes (ATOMIC_WRITE), or
/// any length up to [`MAX_PAYLOAD`].
fn payload_for(opcode: Opcode) -> BoxedStrategy<Vec<u8>> {
    if !opcode.has_payload() {
        Just(Vec::new()).boxed()
    } else if opcode.operation() == Operation::AtomicWrite {
        vec(any::<u8>(), 8).boxed()
    } else {
        vec(any::<u8>(), 0..=MAX_PAYLOAD).boxed()
    }
}

/// A header with exactly the extended headers `opcode` calls for, and a payload.
fn roce_for(opcode: Opcode) -> impl Strategy<Value = (RoceRepr, Vec<u8>)> {
    let ext = (deth(), feth(), reth(), aeth(), atomic_eth(), atomic_ack_eth(), any::<(u32, u32)>());
    (bth_for(opcode), ext, payload_for(opcode)).prop_map(
        move |(bth, (deth, feth, reth, aeth, atomic_eth, atomic_ack_eth, (imm, ieth)), payload)| {
            let needs = |h: Headers| opcode.headers().contains(h);
            let repr = RoceRepr {
                bth,
                deth: needs(Headers::DETH).then_some(deth),
                feth: needs(Headers::FETH).then_some(feth),
                reth: needs(Headers::RETH).then_some(reth),
                aeth: needs(Headers::AETH).then_some(aeth),
                atomic_eth: needs(Headers::ATOMIC_ETH).then_some(atomic_eth),
                atomic_ack_eth: needs(Headers::ATOMIC_ACK_ETH).then_some(atomic_ack_eth),
                imm: needs(Headers::IMM).then_some(imm),
                ieth: needs(Headers::IETH).then_some(ieth),
            };
            (repr, payload)
        },
    )
}

/// IPv4 headers with any addresses, ID, DF, TTL, DSCP/ECN, and sometimes
/// options (up to the 40 bytes IHL allows).
fn ipv4() -> impl Strategy<Value = IpHeader> {
    let options = prop_oneof![Just(0usize), 1..=10usize].prop_flat_map(|words| vec(any::<u8>(), words * 4));
    (any::<([u8; 4], [u8; 4], u16, bool, u8)>(), 0..64u8, 0..4u8, options).prop_map(
        |((source, destination, id, df, ttl), dscp, ecn, options)| {
            let mut h = Ipv4Header::new(0, ttl, IpNumber::UDP, source, destination).unwrap();
            h.identification = id;
            h.dont_fragment = df;
            h.dscp = IpDscp::try_new(dscp).unwrap();
            h.ecn = IpEcn::try_new(ecn).unwrap();
            h.options = Ipv4Options::try_from(&options[..]).unwrap();
            IpHeader::V4(h)
        },
    )
}

fn ipv6() -> impl Strategy<Value = IpHeader> {
    (any::<(u8, u8, [u8; 16], [u8; 16])>(), 0..(1u32 << 20)).prop_map(
        |((traffic_class, hop_limit, source, destination), flow)| {
            IpHeader::V6(Ipv6Header {
                traffic_class,
                flow_label: Ipv6FlowLabel::try_new(flow).unwrap(),
                payload_length: 0,
                next_header: IpNumber::UDP,
                hop_limit,
                source,
                destination,
            })
        },
    )
}

/// UDP to the RoCEv2 port from any source port, with any checksum (the ICRC
/// masks it, and `build` keeps it).
fn udp() -> impl Strategy<Value = UdpHeader> {
    any::<(u16, u16)>().prop_map(|(source_port, checksum)| UdpHeader {
        source_port,
        destination_port: ROCE_UDP_PORT,
        length: 0,
        checksum,
    })
}

/// Everything `packet::build` takes, for one opcode.
type PacketParts = (IpHeader, UdpHeader, RoceRepr, Vec<u8>);

fn packet_parts_for(opcode: Opcode) -> impl Strategy<Value = PacketParts> {
    (prop_oneof![ipv4(), ipv6()], udp(), roce_for(opcode))
        .prop_map(|(ip, udp, (repr, payload))| (ip, udp, repr, payload))
}

/// Whole valid packets of any opcode, built by the library, and the real
/// packets of the captures.
fn valid_packet() -> impl Strategy<Value = Vec<u8>> {
    let built = opcode()
        .prop_flat_map(packet_parts_for)
        .prop_map(|(ip, udp, repr, payload)| build(&ip, &udp, &repr, &payload).unwrap());
    let captured: Vec<Vec<u8>> =
        captures::capture_names().iter().flat_map(|name| captures::roce_ip_packets(name)).collect();
    prop_oneof![built, select(captured)]
}

/// One change to a byte string.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR the byte at (index modulo length) with a nonzero mask.
    Flip(usize, u8),
    /// Keep only the first (index modulo length + 1) bytes.
    Truncate(usize),
    Append(Vec<u8>),
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let one = prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
        any::<usize>().prop_map(Mutation::Truncate),
        vec(any::<u8>(), 1..64).prop_map(Mutation::Append),
    ];
    vec(one, 1..4)
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        match m {
            Mutation::Flip(_, _) | Mutation::Truncate(_) if bytes.is_empty() => {}
            Mutation::Flip(at, mask) => {
                let at = at % bytes.len();
                bytes[at] ^= mask;
            }
            Mutation::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
            Mutation::Append(tail) => bytes.extend_from_slice(tail),
        }
    }
    bytes
}

// ----------------------------------------------------------------- helpers

/// Runs `test` on values of `strategy(opcode)` for every opcode, so that no
/// opcode is left to chance: a quarter of the usual case count (`PROPTEST_CASES`)
/// for each.
fn for_every_opcode<S: Strategy>(strategy: impl Fn(Opcode) -> S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let cases = (Config::default().cases / 4).max(1);
    for op in Opcode::all() {
        let mut runner = TestRunner::new(Config::with_cases(cases));
        if let Err(e) = runner.run(&strategy(op), &test) {
            panic!("{op}: {e}");
        }
    }
}

/// Whether `bytes` is a packet over IPv4 without options, as a UDP socket
/// receiver assumes; then returns the addresses, UDP header and UDP payload.
fn socket_view(bytes: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, &[u8], &[u8])> {
    (bytes.len() >= 28 && bytes[0] == 0x45).then(|| {
        let src = Ipv4Addr::new(bytes[12], bytes[13], bytes[14], bytes[15]);
        let dst = Ipv4Addr::new(bytes[16], bytes[17], bytes[18], bytes[19]);
        (src, dst, &bytes[20..28], &bytes[28..])
    })
}

/// A pcap and a pcapng file holding `ip` as a raw-IP frame.
fn captures_of(ip: &[u8]) -> [Vec<u8>; 2] {
    let mut pcap = IpPcapWriter::new(Vec::new()).unwrap();
    pcap.write(Duration::from_micros(1), ip).unwrap();
    let frame = Frame {
        timestamp: Duration::from_micros(1),
        link: DataLink::RAW,
        data: ip.to_vec(),
        orig_len: ip.len() as u32,
    };
    [pcap.into_inner(), captures::to_pcapng(&[frame])]
}

/// Feeds `bytes` to every parser the wire and capture modules offer, and what
/// they accept to the functions that work on parsed values. Only a panic fails.
fn exercise_parsers(bytes: &[u8]) {
    macro_rules! header {
        ($view:ident, $repr:ident) => {
            if let Ok(view) = $view::new_checked(bytes) {
                let _ = $repr::parse(&view);
            }
        };
    }
    header!(Bth, BthRepr);
    header!(Reth, RethRepr);
    header!(Aeth, AethRepr);
    header!(AtomicEth, AtomicEthRepr);
    header!(AtomicAckEth, AtomicAckEthRepr);
    header!(Deth, DethRepr);
    header!(Feth, FethRepr);
    if let Ok(roce) = RoceRepr::parse(bytes) {
        let mut out = vec![0u8; roce.header.wire_len(roce.payload.len())];
        let _ = roce.header.emit(&mut out, roce.payload);
    }
    parse_packet(bytes);
    let (frames, _) = capture::read(bytes);
    for frame in &frames {
        if let Some(ip) = capture::ip_bytes(frame.link, &frame.data) {
            parse_packet(ip);
        }
    }
    let (udp, roce) = bytes.split_at(bytes.len().min(8));
    let (src, dst) = (Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 3));
    let _ = icrc::verify_ipv4_unknown_id(src, dst, udp, roce);
    if let Some((src, dst, udp, roce)) = socket_view(bytes) {
        let _ = icrc::verify_ipv4_unknown_id(src, dst, udp, roce);
    }
}

/// Parses an IP packet and, if it parses, checks and re-emits it.
fn parse_packet(bytes: &[u8]) {
    if let Ok(p) = Packet::parse(bytes) {
        let _ = (p.icrc_ok(), p.expected_icrc(), p.to_bytes());
    }
}

// ------------------------------------------------------- header round trips

/// For a fixed-size header: `parse(emit(x)) == x`, emitting overwrites every
/// byte (reserved bits included), and a buffer one byte short is refused.
macro_rules! header_round_trip {
    ($test:ident, $strategy:expr, $view:ident, $repr:ident) => {
        proptest! {
            #[test]
            fn $test(value in $strategy) {
                let len = $view::<&[u8]>::LEN;
                let (mut zeros, mut ones) = (vec![0u8; len], vec![0xffu8; len]);
                value.emit(&mut $view::new_unchecked(&mut zeros[..])).unwrap();
                value.emit(&mut $view::new_unchecked(&mut ones[..])).unwrap();
                prop_assert_eq!(&zeros, &ones);
                prop_assert_eq!($repr::parse(&$view::new_checked(&zeros[..]).unwrap()), Ok(value));
                let mut short = vec![0u8; len - 1];
                prop_assert!(value.emit(&mut $view::new_unchecked(&mut short[..])).is_err());
                prop_assert!($view::new_checked(&zeros[..len - 1]).is_err());
            }
        }
    };
}

header_round_trip!(reth_round_trips, reth(), Reth, RethRepr);
header_round_trip!(aeth_round_trips, aeth(), Aeth, AethRepr);
header_round_trip!(atomic_eth_round_trips, atomic_eth(), AtomicEth, AtomicEthRepr);
header_round_trip!(atomic_ack_eth_round_trips, atomic_ack_eth(), AtomicAckEth, AtomicAckEthRepr);
header_round_trip!(deth_round_trips, deth(), Deth, DethRepr);
header_round_trip!(feth_round_trips, feth(), Feth, FethRepr);

proptest! {
    /// The BTH takes the pad count from its caller, so it has its own test.
    #[test]
    fn bth_round_trips(value in bth(), pad in 0..=3u8) {
        let (mut zeros, mut ones) = ([0u8; 12], [0xffu8; 12]);
        value.emit(&mut Bth::new_unchecked(&mut zeros[..]), pad).unwrap();
        value.emit(&mut Bth::new_unchecked(&mut ones[..]), pad).unwrap();
        prop_assert_eq!(zeros, ones);
        let view = Bth::new_checked(&zeros[..]).unwrap();
        prop_assert_eq!(view.pad_count(), pad);
        prop_assert_eq!(view.version(), 0);
        prop_assert_eq!(BthRepr::parse(&view), Ok(value));
        prop_assert!(value.emit(&mut Bth::new_unchecked(&mut [0u8; 11][..]), pad).is_err());
    }
}

// -------------------------------------------------- whole-value round trips

#[test]
fn roce_repr_round_trips_for_every_opcode() {
    for_every_opcode(roce_for, |(repr, payload)| {
        let len = repr.wire_len(payload.len());
        let headers = repr.bth.opcode.headers().len();
        prop_assert_eq!(len, 12 + headers + payload.len() + usize::from(pad_for(payload.len())) + 4);
        prop_assert_eq!(len % 4, 0);
        // Garbage in the buffer must not leak into pad or ICRC.
        let mut buf = vec![0xa5u8; len + 7];
        prop_assert_eq!(repr.emit(&mut buf, &payload), Ok(len));
        let parsed = RoceRepr::parse(&buf[..len]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parsed.header, repr);
        prop_assert_eq!(parsed.payload, &payload[..]);
        prop_assert_eq!(parsed.pad, pad_for(payload.len()));
        prop_assert_eq!(parsed.icrc, 0);
        prop_assert!(buf[12 + headers + payload.len()..len].iter().all(|&b| b == 0));
        Ok(())
    });
}

#[test]
fn built_packets_parse_verify_and_re_emit_for_every_opcode() {
    for_every_opcode(packet_parts_for, |(ip, udp, repr, payload)| {
        let bytes = build(&ip, &udp, &repr, &payload).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let p = Packet::parse(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(p.icrc_ok());
        prop_assert_eq!(p.roce.header, repr);
        prop_assert_eq!(p.roce.payload, &payload[..]);
        prop_assert_eq!(p.udp.source_port, udp.source_port);
        prop_assert_eq!(p.udp.checksum, udp.checksum);
        prop_assert_eq!(p.bytes(), &bytes[..]);
        prop_assert_eq!(p.to_bytes(), Ok(bytes.clone()));
        // A socket receiver recovers exactly the ID the packet was built with.
        if let (IpHeader::V4(h), Some((src, dst, udp, roce))) = (&ip, socket_view(&bytes)) {
            prop_assert_eq!(icrc::verify_ipv4_unknown_id(src, dst, udp, roce), Ok(Some(h.identification)));
        }
        Ok(())
    });
}

/// Bytes of a built packet whose change alters the IP, UDP or RoCE framing, or
/// that the ICRC masks: flipping any other bit must be caught.
fn is_framing_or_masked(bytes: &[u8], at: usize) -> bool {
    let (ip_len, masked_ip): (usize, &[usize]) = match bytes[0] >> 4 {
        4 => (usize::from(bytes[0] & 0x0f) * 4, &[0, 1, 2, 3, 8, 10, 11]),
        _ => (40, &[0, 1, 2, 3, 4, 5, 7]),
    };
    match at {
        _ if at < ip_len => masked_ip.contains(&at),
        _ if at < ip_len + 8 => at - ip_len >= 4, // UDP length and checksum
        _ => at == ip_len + 8 + 4,                // BTH byte 4
    }
}

proptest! {
    #[test]
    fn one_flipped_covered_bit_fails_the_icrc(
        (ip, udp, repr, payload) in opcode().prop_flat_map(packet_parts_for),
        at in any::<usize>(),
        bit in 0..8u8,
    ) {
        let mut bytes = build(&ip, &udp, &repr, &payload).unwrap();
        let covered: Vec<usize> =
            (0..bytes.len()).filter(|&i| !is_framing_or_masked(&bytes, i)).collect();
        let at = covered[at % covered.len()];
        bytes[at] ^= 1 << bit;
        if let Ok(p) = Packet::parse(&bytes) {
            prop_assert!(!p.icrc_ok(), "byte {} bit {} went unnoticed", at, bit);
        }
    }
}

proptest! {
    #[test]
    fn other_ports_and_protocols_are_not_roce(
        (ip, udp, repr, payload) in opcode().prop_flat_map(packet_parts_for),
        port in any::<u16>().prop_filter("RoCE port", |p| *p != ROCE_UDP_PORT),
        protocol in any::<u8>().prop_filter("UDP", |p| *p != 17),
    ) {
        let other_port = UdpHeader { destination_port: port, ..udp.clone() };
        let bytes = build(&ip, &other_port, &repr, &payload).unwrap();
        prop_assert_eq!(Packet::parse(&bytes), Err(Error::NotRoce));
        let mut bytes = build(&ip, &udp, &repr, &payload).unwrap();
        let protocol_at = if let IpHeader::V4(_) = ip { 9 } else { 6 };
        bytes[protocol_at] = protocol;
        prop_assert_eq!(Packet::parse(&bytes), Err(Error::NotRoce));
    }
}

// ------------------------------------------------------------ never panics

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..2048)) {
        exercise_parsers(&bytes);
    }

    #[test]
    fn arbitrary_capture_bodies_never_panic(
        magic in select(vec![0xa1b2_c3d4u32, 0xd4c3_b2a1, 0xa1b2_3c4d, 0x4d3c_b2a1, 0x0a0d_0d0a]),
        body in vec(any::<u8>(), 0..512),
    ) {
        let mut bytes = magic.to_le_bytes().to_vec();
        bytes.extend_from_slice(&body);
        exercise_parsers(&bytes);
    }

    #[test]
    fn mutated_packets_never_panic(packet in valid_packet(), mutations in mutations()) {
        exercise_parsers(&mutate(packet, &mutations));
    }

    #[test]
    fn mutated_captures_never_panic(packet in valid_packet(), mutations in mutations()) {
        for capture in captures_of(&packet) {
            let (frames, err) = capture::read(&capture);
            prop_assert_eq!(err, None);
            prop_assert_eq!(&frames[0].data, &packet);
            exercise_parsers(&mutate(capture, &mutations));
        }
    }
}

// ---------------------------------------------------------------- PSN laws

proptest! {
    #[test]
    fn psn_diff_is_antisymmetric_except_at_half_the_space(
        a in psn(),
        // b - a: any distance, with exactly half the space drawn half the time.
        offset in prop_oneof![u24(), Just(Psn::HALF)],
    ) {
        let b = a.wrapping_add(offset);
        let (ab, ba) = (a.diff(b), b.diff(a));
        let half = Psn::HALF as i32;
        prop_assert!((-half..half).contains(&ab));
        if offset == Psn::HALF {
            prop_assert_eq!((ab, ba), (-half, -half));
        } else {
            prop_assert_eq!(ab, -ba);
        }
    }

    #[test]
    fn psn_wrapping_add_then_diff_gives_the_distance(a in psn(), n in 0..Psn::HALF) {
        let b = a.wrapping_add(n);
        prop_assert_eq!(b.diff(a), n as i32);
        prop_assert_eq!(b.wrapping_sub(n), a);
        prop_assert_eq!(b.value(), (a.value() + n) % (1 << 24));
    }

    #[test]
    fn psn_ordering_agrees_with_diff(a in psn(), b in psn()) {
        let d = a.diff(b);
        prop_assert_eq!(a.is_after(b), d > 0);
        prop_assert_eq!(a.is_before(b), d < 0);
        prop_assert_eq!(a.cmp_window(b), d.cmp(&0));
        prop_assert!(!(a.is_after(b) && b.is_after(a)));
        prop_assert_eq!(a == b, d == 0);
    }

    #[test]
    fn psn_new_keeps_the_low_24_bits(value in any::<u32>()) {
        prop_assert_eq!(Psn::new(value).value(), value & 0x00ff_ffff);
    }
}
