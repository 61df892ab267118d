//! The raw (AF_PACKET) link on the loopback interface. Needs root
//! (CAP_NET_RAW); without it each test says so and passes vacuously.
//!
//! Every test uses its own addresses (127.77.N.x) or port, so tests running
//! in parallel, which all see all loopback traffic, do not disturb each other.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

use etherparse::{IpDscp, Ipv4Header, UdpHeader};
use softroce::net::{wait_readable, Link, LinkStats, Outgoing, RawLink, Received, UdpLink};
use softroce::wire::packet::{encapsulate, ip_header, rxe_source_port};
use softroce::wire::{icrc, BthRepr, IpHeader, Opcode, Operation, Psn, RoceRepr, Transport, ROCE_UDP_PORT};

fn v4(n: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 77, n, host))
}

/// A raw link on `lo`, or `None` (with a message) where AF_PACKET is not permitted.
fn open_lo(port: u16) -> Option<RawLink> {
    match RawLink::with_port("lo", port) {
        Ok(link) => Some(link),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            eprintln!("skipping: a raw link needs root (CAP_NET_RAW): {e}");
            None
        }
        Err(e) => panic!("opening a raw link on lo: {e}"),
    }
}

/// RC SEND_ONLY to `qpn` with `payload`, ICRC left zero.
fn send_only(qpn: u32, payload: &[u8]) -> Vec<u8> {
    let repr = RoceRepr::new(BthRepr {
        opcode: Opcode::new(Transport::Rc, Operation::SendOnly).unwrap(),
        solicited: false,
        mig_req: false,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: qpn,
        ack_req: true,
        psn: Psn::new(5),
    });
    let mut roce = vec![0u8; repr.wire_len(payload.len())];
    repr.emit(&mut roce, payload).unwrap();
    roce
}

fn payload() -> Vec<u8> {
    (0..1000u32).map(|i| (i * 7) as u8).collect()
}

/// Everything `link` returns within `window`, with the RoCE bytes.
fn collect(link: &mut RawLink, window: Duration) -> Vec<(Received, Vec<u8>)> {
    let deadline = Instant::now() + window;
    let mut buf = vec![0u8; 1 << 16];
    let mut got = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        wait_readable(&link.raw_fds(), left);
        while let Some(r) = link.receive(Duration::ZERO, &mut buf) {
            got.push((r, buf[..r.len].to_vec()));
        }
    }
    got
}

const WINDOW: Duration = Duration::from_millis(300);

fn transmit(link: &mut RawLink, src: IpAddr, dst: IpAddr, src_port: u16, roce: &mut [u8]) {
    link.transmit(Duration::ZERO, Outgoing { src, dst, src_port, roce }).unwrap();
}

#[test]
fn raw_to_raw_exact_bytes_with_strict_icrc() {
    let (a, b) = (v4(1, 1), v4(1, 2));
    let (Some(mut tx), Some(mut rx)) = (open_lo(ROCE_UDP_PORT), open_lo(ROCE_UDP_PORT)) else { return };
    assert_eq!(tx.mac(), [0; 6]);
    assert!(tx.interface_addrs().contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)));
    tx.attach(a).unwrap();
    rx.attach(b).unwrap();
    assert_eq!(rx.local_addrs(), vec![b]);

    let mut roce = send_only(0x12, &payload());
    let err = tx.transmit(Duration::ZERO, Outgoing { src: b, dst: a, src_port: 1, roce: &mut roce });
    assert_eq!(err.unwrap_err().kind(), io::ErrorKind::AddrNotAvailable);
    let src_port = rxe_source_port(0x11, 0x12);
    transmit(&mut tx, a, b, src_port, &mut roce);

    // The ICRC filled in place is the one over the headers sent (DF, ID 0).
    let udp = UdpHeader { source_port: src_port, destination_port: ROCE_UDP_PORT, length: 0, checksum: 0 };
    let expected = encapsulate(&ip_header(a, b).unwrap(), &udp, &send_only(0x12, &payload())).unwrap();
    assert_eq!(&expected[28..], &roce[..]);

    let got = collect(&mut rx, WINDOW);
    assert_eq!(got, vec![(Received { src: a, src_port, dst: b, len: roce.len() }, roce.clone())]);
    assert_eq!(rx.stats(), LinkStats { received: 1, ..LinkStats::default() });
    // The sender neither sees its own packet nor one addressed to someone else.
    assert_eq!(tx.receive(Duration::ZERO, &mut vec![0; 4096]), None);
    assert_eq!(tx.stats(), LinkStats { sent: 1, ..LinkStats::default() });
}

#[test]
fn one_link_with_both_addresses_gets_each_packet_once() {
    let (a, b) = (v4(2, 1), v4(2, 2));
    let Some(mut link) = open_lo(ROCE_UDP_PORT) else { return };
    link.attach(a).unwrap();
    link.attach(b).unwrap();
    let mut there = send_only(0x21, b"there");
    let mut back = send_only(0x22, b"and back again");
    transmit(&mut link, a, b, 0xc001, &mut there);
    transmit(&mut link, b, a, 0xc002, &mut back);
    let got = collect(&mut link, WINDOW);
    let expected = vec![
        (Received { src: a, src_port: 0xc001, dst: b, len: there.len() }, there),
        (Received { src: b, src_port: 0xc002, dst: a, len: back.len() }, back),
    ];
    assert_eq!(got, expected);
    assert_eq!(link.stats(), LinkStats { sent: 2, received: 2, ..LinkStats::default() });
}

/// Over IPv6: the kernel drops IPv4 frames injected on `lo` with 127/8
/// addresses as martians (unless `route_localnet` is set).
#[test]
fn the_kernel_accepts_the_frame_and_sees_the_per_qp_source_port() {
    let one = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let socket = UdpSocket::bind((one, 0)).unwrap();
    allow_zero_udp6_checksums(&socket);
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let port = socket.local_addr().unwrap().port();
    let Some(mut link) = open_lo(port) else { return };
    link.attach(one).unwrap();
    let mut roce = send_only(0x31, &payload());
    let src_port = rxe_source_port(0x30, 0x31);
    transmit(&mut link, one, one, src_port, &mut roce);
    let mut buf = vec![0u8; 4096];
    let (len, from) = socket.recv_from(&mut buf).expect("the kernel dropped the frame");
    assert_eq!((from.ip(), from.port()), (one, src_port));
    assert_eq!(&buf[..len], &roce[..]);
}

/// RoCE leaves the UDP checksum zero, which IPv6 receivers drop unless the
/// socket allows it (kernel rxe's does).
fn allow_zero_udp6_checksums(socket: &UdpSocket) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a valid socket fd and a pointer to a c_int of the given size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_NO_CHECK6_RX,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "{}", io::Error::last_os_error());
}

#[test]
fn a_flipped_bit_or_a_changed_id_is_an_icrc_error() {
    let (a, b) = (v4(4, 1), v4(4, 2));
    let (Some(mut tx), Some(mut rx)) = (open_lo(ROCE_UDP_PORT), open_lo(ROCE_UDP_PORT)) else { return };
    rx.attach(b).unwrap();

    let IpHeader::V4(mut h) = ip_header(a, b).unwrap() else { unreachable!() };
    h.identification = 0x1234;
    let udp = UdpHeader { source_port: 0xc000, destination_port: ROCE_UDP_PORT, length: 0, checksum: 0 };
    let good = encapsulate(&IpHeader::V4(h.clone()), &udp, &send_only(0x41, &payload())).unwrap();

    let mut flipped = good.clone();
    flipped[28 + 500] ^= 0x08;
    // Another ID under the same ICRC, with a valid IP checksum: a UDP socket
    // cannot tell (it solves for the unknown ID), a strict check can.
    let mut other_id = good.clone();
    let (mut h2, _) = Ipv4Header::from_slice(&good).unwrap();
    h2.identification = 0x1235;
    h2.header_checksum = h2.calc_header_checksum();
    other_id[..20].copy_from_slice(&h2.to_bytes());
    let (ip, rest) = other_id.split_at(20);
    let (src, dst) = (h2.source.into(), h2.destination.into());
    assert_eq!(icrc::verify_ipv4_unknown_id(src, dst, &rest[..8], &rest[8..]), Ok(Some(0x1234)));
    assert_eq!(icrc::verify(ip, &rest[..8], &rest[8..]), Ok(false));

    tx.send_raw_ip(&flipped).unwrap();
    tx.send_raw_ip(&other_id).unwrap();
    tx.send_raw_ip(&good).unwrap();
    // Odd but legal fields, ICRC computed by the link: accepted.
    let mut odd = h.clone();
    odd.identification = 0x4321;
    odd.time_to_live = 3;
    odd.dscp = IpDscp::EF;
    let odd_roce = send_only(0x42, b"odd");
    tx.send_with_ip(&IpHeader::V4(odd.clone()), 0xc0de, &odd_roce).unwrap();

    let got = collect(&mut rx, WINDOW);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[0],
        (Received { src: a, src_port: udp.source_port, dst: b, len: good.len() - 28 }, good[28..].to_vec())
    );
    let odd_udp = UdpHeader { source_port: 0xc0de, ..udp };
    let odd_packet = encapsulate(&IpHeader::V4(odd), &odd_udp, &odd_roce).unwrap();
    assert_eq!(got[1], (Received { src: a, src_port: 0xc0de, dst: b, len: odd_roce.len() }, odd_packet[28..].to_vec()));
    assert_eq!(rx.stats(), LinkStats { received: 4, icrc_errors: 2, ..LinkStats::default() });
    assert_eq!(tx.stats().sent, 4);
}

#[test]
fn udp_link_packets_pass_the_strict_check() {
    let (a, b) = (v4(5, 1), v4(5, 2));
    let port = UdpSocket::bind((a, 0)).unwrap().local_addr().unwrap().port();
    let mut udp_link = UdpLink::new(port);
    udp_link.attach(a).unwrap();
    let Some(mut raw) = open_lo(port) else { return };
    raw.attach(b).unwrap();
    let mut roce = send_only(0x51, &payload());
    udp_link.transmit(Duration::ZERO, Outgoing { src: a, dst: b, src_port: 0, roce: &mut roce }).unwrap();
    udp_link.flush();
    // The UdpLink computed its ICRC assuming DF and ID 0; the raw link checks
    // it against the header the kernel really sent.
    let got = collect(&mut raw, WINDOW);
    assert_eq!(got, vec![(Received { src: a, src_port: port, dst: b, len: roce.len() }, roce)], "{:?}", raw.stats());
    assert_eq!(raw.stats(), LinkStats { received: 1, ..LinkStats::default() });
}

#[test]
fn other_traffic_is_ignored() {
    let (a, b, c) = (v4(6, 1), v4(6, 2), v4(6, 3));
    let listener = UdpSocket::bind((b, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (Some(mut tx), Some(mut rx)) = (open_lo(port), open_lo(port)) else { return };
    rx.attach(b).unwrap();
    tx.attach(a).unwrap();
    let plain = UdpSocket::bind((a, 0)).unwrap();
    let mut roce = send_only(0x61, &payload());
    // RoCE to an address the link does not have, and to another port.
    transmit(&mut tx, a, c, 0xc000, &mut roce);
    plain.send_to(&roce, (b, port + 1)).unwrap();
    // ICMP to the link's address: the kernel's port unreachable for this datagram.
    UdpSocket::bind((b, 0)).unwrap().send_to(b"hello", (c, port)).unwrap();
    assert!(collect(&mut rx, WINDOW).is_empty());
    assert_eq!(rx.stats(), LinkStats::default());
    // Too short to be RoCE yet addressed to the link: malformed, not returned.
    plain.send_to(b"hello", (b, port)).unwrap();
    assert!(collect(&mut rx, WINDOW).is_empty());
    assert_eq!(rx.stats(), LinkStats { received: 1, malformed: 1, ..LinkStats::default() });
}

#[test]
fn ipv6_over_loopback() {
    let one = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let port = UdpSocket::bind((one, 0)).unwrap().local_addr().unwrap().port();
    let Some(mut link) = open_lo(port) else { return };
    link.attach(one).unwrap();
    let mut roce = send_only(0x71, &payload());
    transmit(&mut link, one, one, 0xc071, &mut roce);
    let got = collect(&mut link, WINDOW);
    assert_eq!(got, vec![(Received { src: one, src_port: 0xc071, dst: one, len: roce.len() }, roce)]);
    assert_eq!(link.stats(), LinkStats { sent: 1, received: 1, ..LinkStats::default() });
}

/// wire.md W-24: the UDP link's GSO trains, cut into packets by the kernel,
/// pass the strict ICRC check: each segment's ICRC covers the IPv4 ID the
/// kernel really gave it (0, 1, 2… up the train). The test runs in a network
/// namespace of its own whose loopback has `gso_max_segs 1`, so the kernel
/// segments in software before the raw link sees the frames, as on a device
/// without UDP segmentation offload (a tap to a VM); the usual loopback
/// passes super-datagrams whole. Needs root for the namespace and `ip`.
#[test]
fn udp_link_gso_trains_pass_the_strict_check() {
    std::thread::spawn(|| {
        // SAFETY: unshare with CLONE_NEWNET moves only this thread (and the
        // processes it starts) into a new network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("skipping: no network namespace: {}", io::Error::last_os_error());
            return;
        }
        let ip = std::process::Command::new("ip").args(["link", "set", "lo", "up", "gso_max_segs", "1"]).status();
        if !ip.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("skipping: cannot set up loopback in the namespace: {ip:?}");
            return;
        }
        let (a, b) = (v4(8, 1), v4(8, 2));
        let port = ROCE_UDP_PORT;
        let mut udp_link = UdpLink::new(port);
        udp_link.attach(a).unwrap();
        let Some(mut raw) = open_lo(port) else { return };
        raw.attach(b).unwrap();
        let big: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
        // At MTU 4096, 20 full packets (a train of 15, one of 5) and a
        // shorter last; at MTU 1024, 70 (a train of 61, IDs up to 60, and
        // one of 9). One group at a time, so the raw socket's buffer holds it.
        let mut received = 0;
        for lens in [[vec![4096; 20], vec![100]].concat(), vec![1024; 70]] {
            let mut sent = Vec::new();
            for (i, &len) in lens.iter().enumerate() {
                let mut roce = send_only(0x80 + i as u32, &big[..len]);
                let out = Outgoing { src: a, dst: b, src_port: port, roce: &mut roce };
                udp_link.transmit(Duration::ZERO, out).unwrap();
                sent.push(roce);
            }
            udp_link.flush();
            assert!(udp_link.gso(a));
            let got: Vec<Vec<u8>> = collect(&mut raw, WINDOW).into_iter().map(|(_, roce)| roce).collect();
            received += lens.len() as u64;
            assert_eq!(raw.stats(), LinkStats { received, ..LinkStats::default() });
            assert_eq!(got, sent);
        }
    })
    .join()
    .unwrap();
}
