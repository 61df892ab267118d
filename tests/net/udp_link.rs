//! The engine over real UDP sockets on loopback: two hosts, 127.0.0.1 and
//! 127.0.0.2, on one port.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::Duration;

use softroce::engine::World;
use softroce::net::{Link, UdpLink};
use softroce::transport::*;
use softroce::wire::Psn;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A port free on both loopback addresses.
fn free_port() -> u16 {
    softroce::net::udp::free_port(&[A, B]).unwrap()
}

#[test]
fn rc_send_write_read_over_loopback_udp() {
    let mut w = World::real_time(UdpLink::new(free_port()));
    w.add_host(A).unwrap();
    w.add_host(B).unwrap();
    w.create_qp(0, 0x11, QpType::Rc, QpCap::default(), None);
    w.create_qp(1, 0x11, QpType::Rc, QpCap::default(), None);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    w.register(0, 1, 0x1000, 1 << 16, access);
    w.register(1, 2, 0x9000, 1 << 16, access);
    let attr = QpAttr {
        access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ,
        path_mtu: Mtu::Mtu1024,
        timeout: 14,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        ..QpAttr::default()
    };
    w.connect((0, 0x11), (1, 0x11), &attr, (Psn::new(7), Psn::new(900))).unwrap();
    let msg: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    w.hosts[0].mem.region_mut(1).unwrap().data[..msg.len()].copy_from_slice(&msg);

    let recv = RecvWr { wr_id: 9, sg_list: softroce::sg_list![Sge { addr: 0x9000, length: 16384, lkey: 2 }] };
    w.hosts[1].qp(0x11).post_recv(recv).unwrap();
    let src = Sge { addr: 0x1000, length: msg.len() as u32, lkey: 1 };
    let qp = w.hosts[0].qp(0x11);
    qp.post_send(SendWr::new(1, SendOp::Send).with_sge(src)).unwrap();
    qp.post_send(SendWr::new(2, SendOp::RdmaWrite { remote_addr: 0x9000 + 0x4000, rkey: 2 }).with_sge(src)).unwrap();
    let back = Sge { addr: 0x1000 + 0x8000, length: msg.len() as u32, lkey: 1 };
    qp.post_send(SendWr::new(3, SendOp::RdmaRead { remote_addr: 0x9000 + 0x4000, rkey: 2 }).with_sge(back)).unwrap();

    let done = w.run_until(Duration::from_secs(10), |w| w.hosts[0].completions.len() == 3);
    assert!(done, "completions: {:?}", w.hosts[0].completions);
    assert!(w.hosts[0].completions.iter().all(|(_, _, wc)| wc.status == WcStatus::Success));
    let b = &w.hosts[1].mem.region(2).unwrap().data;
    assert_eq!(&b[..msg.len()], &msg[..]);
    assert_eq!(&b[0x4000..0x4000 + msg.len()], &msg[..]);
    let a = &w.hosts[0].mem.region(1).unwrap().data;
    assert_eq!(&a[0x8000..0x8000 + msg.len()], &msg[..]);
    assert_eq!(w.hosts[1].completions[0].2.byte_len, msg.len() as u32);
    let stats = w.net.stats();
    assert_eq!(stats.icrc_errors, 0);
    assert!(stats.received >= 30, "{stats:?}");
}

#[test]
fn udp_link_drops_a_corrupted_datagram() {
    let port = free_port();
    let mut link = UdpLink::new(port);
    link.attach(B).unwrap();
    // A valid-looking packet with a wrong ICRC, sent from a plain socket.
    let mut roce = vec![0u8; 12 + 4];
    roce[0] = 0x11; // RC ACKNOWLEDGE needs an AETH; the ICRC check comes first anyway
    let sender = UdpSocket::bind((A, 0)).unwrap();
    sender.send_to(&roce, (B, port)).unwrap();
    let mut buf = vec![0u8; 2048];
    let mut got = None;
    for _ in 0..100 {
        softroce::net::wait_readable(&link.raw_fds(), Duration::from_millis(10));
        got = link.receive(Duration::ZERO, &mut buf);
        if link.stats().received > 0 {
            break;
        }
    }
    assert_eq!(got, None);
    assert_eq!(link.stats().icrc_errors, 1);
}

#[test]
fn rc_between_two_qps_of_one_host_over_ipv6_loopback() {
    let v6: IpAddr = "::1".parse().unwrap();
    let port = UdpSocket::bind((v6, 0)).unwrap().local_addr().unwrap().port();
    let mut w = World::real_time(UdpLink::new(port));
    w.add_host(v6).unwrap();
    w.create_qp(0, 0x11, QpType::Rc, QpCap::default(), None);
    w.create_qp(0, 0x12, QpType::Rc, QpCap::default(), None);
    w.register(0, 1, 0x1000, 1 << 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let attr = QpAttr { access_flags: Access::REMOTE_WRITE, path_mtu: Mtu::Mtu1024, ..QpAttr::default() };
    w.connect((0, 0x11), (0, 0x12), &attr, (Psn::new(1), Psn::new(2))).unwrap();
    let msg: Vec<u8> = (0..5000u32).map(|i| (i % 199) as u8).collect();
    w.hosts[0].mem.region_mut(1).unwrap().data[..msg.len()].copy_from_slice(&msg);
    let write = SendOp::RdmaWrite { remote_addr: 0x1000 + 0x8000, rkey: 1 };
    let sge = Sge { addr: 0x1000, length: msg.len() as u32, lkey: 1 };
    w.hosts[0].qp(0x11).post_send(SendWr::new(1, write).with_sge(sge)).unwrap();
    assert!(w.run_until(Duration::from_secs(10), |w| !w.hosts[0].completions.is_empty()));
    assert_eq!(w.hosts[0].completions[0].2.status, WcStatus::Success);
    assert_eq!(&w.hosts[0].mem.region(1).unwrap().data[0x8000..0x8000 + msg.len()], &msg[..]);
    assert_eq!(w.net.stats().icrc_errors, 0);
}

/// Sends `lens.len()` packets of those lengths from a link on `A` to a plain
/// socket on `B` (no GRO: the kernel hands each segment over alone) and
/// returns, for each datagram received, the IPv4 ID its ICRC was computed
/// for. `prepare` runs on the link's socket first.
fn ids_of_icrcs(lens: &[usize], prepare: impl FnOnce(&UdpLink)) -> (UdpLink, Vec<Option<u16>>) {
    let port = free_port();
    let receiver = UdpSocket::bind((B, port)).unwrap();
    receiver.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut link = UdpLink::new(port);
    link.attach(A).unwrap();
    prepare(&link);
    for (i, &len) in lens.iter().enumerate() {
        let mut roce: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
        // One destination QP owner (BTH byte 5), or trains would break there.
        roce[5] = 0;
        link.transmit(Duration::ZERO, softroce::net::Outgoing { src: A, dst: B, src_port: port, roce: &mut roce })
            .unwrap();
    }
    link.flush();
    let mut ids = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    for _ in lens {
        let (n, from) = receiver.recv_from(&mut buf).expect("a datagram was lost");
        assert_eq!(from, std::net::SocketAddr::new(A, port));
        let udp =
            etherparse::UdpHeader { source_port: port, destination_port: port, length: (8 + n) as u16, checksum: 0 };
        let (IpAddr::V4(a), IpAddr::V4(b)) = (A, B) else { unreachable!() };
        ids.push(softroce::wire::icrc::verify_ipv4_unknown_id(a, b, &udp.to_bytes(), &buf[..n]).unwrap());
    }
    (link, ids)
}

/// wire.md W-24: packets that leave as one GSO train carry IPv4 IDs 0, 1,
/// 2… (the kernel numbers segments up from the super-datagram's 0), and the
/// link computes each one's ICRC for its ID; a new length or the segment or
/// size limit starts a new train at 0.
#[test]
fn gso_trains_carry_icrcs_for_ids_counting_from_zero() {
    let lens = [[4124; 17].as_slice(), &[1000, 60, 60, 60]].concat();
    let (link, ids) = ids_of_icrcs(&lens, |_| {});
    assert!(link.gso(A));
    // 15 packets of 4124 bytes fit a 64 KiB datagram; then 2 more and a
    // shorter last, then a train of 60-byte ones.
    let expected: Vec<Option<u16>> =
        [(0..15).collect::<Vec<u16>>(), vec![0, 1, 2], vec![0, 1, 2]].concat().into_iter().map(Some).collect();
    assert_eq!(ids, expected);
    assert_eq!(link.stats().sent, lens.len() as u64);
}

/// wire.md W-24: where the kernel refuses GSO (here a socket without UDP
/// checksums, `SO_NO_CHECK`), the link sends single datagrams, all with ID
/// 0 and ICRCs to match, and stops trying.
#[test]
fn a_link_whose_socket_refuses_gso_sends_single_datagrams_with_id_zero() {
    let lens = [4124, 4124, 4124, 100];
    let (link, ids) = ids_of_icrcs(&lens, |link| {
        // The link's one socket is its one file descriptor.
        let fd = link.raw_fds()[0];
        let on: libc::c_int = 1;
        // SAFETY: a valid socket fd and a pointer to a c_int of the given size.
        let rc =
            unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_NO_CHECK, (&on as *const libc::c_int).cast(), 4) };
        assert_eq!(rc, 0);
    });
    assert_eq!(ids, vec![Some(0); lens.len()]);
    assert!(!link.gso(A));
}

/// A GSO train reaches a link coalesced (UDP GRO) and comes out packet by
/// packet, without a copy, each ICRC checked on its own: a broken one in the
/// middle of a train is dropped alone.
#[test]
fn gro_trains_are_split_and_checked_packet_by_packet() {
    let port = free_port();
    let (mut tx, mut rx) = (UdpLink::new(port), UdpLink::new(port));
    tx.attach(A).unwrap();
    rx.attach(B).unwrap();
    tx.corrupt_icrc_every(5);
    let mut sent = Vec::new();
    for i in 0..21usize {
        let len = if i == 20 { 100 } else { 4124 };
        let mut roce: Vec<u8> = (0..len).map(|j| (i * 7 + j) as u8).collect();
        tx.transmit(Duration::ZERO, softroce::net::Outgoing { src: A, dst: B, src_port: port, roce: &mut roce })
            .unwrap();
        sent.push(roce);
    }
    tx.flush();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    for _ in 0..200 {
        softroce::net::wait_readable(&rx.raw_fds(), Duration::from_millis(10));
        // As the engine takes them: in the link's own buffer.
        while let Some((r, roce)) = rx.receive_in_place(Duration::ZERO, &mut buf) {
            assert_eq!((r.src, r.src_port, r.dst, r.len), (A, port, B, roce.len()));
            got.push(roce.to_vec());
        }
        if rx.stats().received == 21 {
            break;
        }
    }
    let kept: Vec<Vec<u8>> = sent.into_iter().enumerate().filter(|(i, _)| (i + 1) % 5 != 0).map(|(_, p)| p).collect();
    assert_eq!(got, kept);
    assert_eq!(rx.stats(), softroce::net::LinkStats { received: 21, icrc_errors: 4, ..Default::default() });
}

/// Packets the link cannot send are refused before anything is queued.
#[test]
fn impossible_packets_are_refused() {
    let mut link = UdpLink::new(free_port());
    link.attach(A).unwrap();
    let v6: IpAddr = "::1".parse().unwrap();
    for (dst, len) in [(B, 15), (B, 65_508), (v6, 100)] {
        let mut roce = vec![0u8; len];
        let out = softroce::net::Outgoing { src: A, dst, src_port: 0, roce: &mut roce };
        assert_eq!(
            link.transmit(Duration::ZERO, out).unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput,
            "{dst} {len}"
        );
    }
    link.flush();
    assert_eq!(link.stats().sent, 0);
}

/// Packets an engine builds in the link's own send buffer leave as those
/// handed to `transmit` do, in the same GSO trains (IDs counting up), with
/// one copy fewer; a link with two sockets offers each one's buffer, and
/// none for an address it does not have.
#[test]
fn packets_built_in_the_send_buffer_join_the_trains() {
    let port = free_port();
    let receiver = UdpSocket::bind((B, port)).unwrap();
    receiver.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut link = UdpLink::new(port);
    link.attach(A).unwrap();
    // One destination QP owner (BTH byte 5), or trains would break there.
    let packet = |i: usize| -> Vec<u8> { (0..1000).map(|j| if j == 5 { 0 } else { (i * 17 + j) as u8 }).collect() };
    for i in 0..6 {
        if i % 2 == 0 {
            let room = link.send_buffer(A, 4096 + 64).expect("room to build in");
            room[..1000].copy_from_slice(&packet(i));
            link.transmit_built(Duration::ZERO, A, B, port, 1000, None).unwrap();
        } else {
            let mut roce = packet(i);
            link.transmit(Duration::ZERO, softroce::net::Outgoing { src: A, dst: B, src_port: port, roce: &mut roce })
                .unwrap();
        }
    }
    // A packet between IP versions is refused, and nothing was taken for it.
    let v6: IpAddr = "::1".parse().unwrap();
    assert!(link.transmit_built(Duration::ZERO, A, v6, port, 1000, None).is_err());
    link.flush();
    assert_eq!(link.stats().sent, 6);
    let (IpAddr::V4(a), IpAddr::V4(b)) = (A, B) else { unreachable!() };
    let mut buf = vec![0u8; 4096];
    for i in 0..6 {
        let n = receiver.recv(&mut buf).expect("a packet was lost");
        assert_eq!(&buf[..n - 4], &packet(i)[..996]);
        let udp =
            etherparse::UdpHeader { source_port: port, destination_port: port, length: (8 + n) as u16, checksum: 0 };
        let id = softroce::wire::icrc::verify_ipv4_unknown_id(a, b, &udp.to_bytes(), &buf[..n]).unwrap();
        assert_eq!(id, Some(i as u16));
    }
    drop(receiver);
    link.attach(B).unwrap();
    assert!(link.send_buffer(A, 4096).is_some() && link.send_buffer(B, 4096).is_some());
    assert!(link.send_buffer("127.0.0.3".parse().unwrap(), 4096).is_none());
}

#[test]
fn the_link_reports_its_sockets_receive_buffer() {
    let mut link = UdpLink::new(free_port());
    assert_eq!(link.receive_buffer(), None, "no socket yet");
    link.bind(A).unwrap();
    let granted = link.receive_buffer().expect("a bound link has a receive buffer");
    // 8 MiB asked for: granted with CAP_NET_ADMIN, else capped at
    // net.core.rmem_max; the kernel reports twice that, its bookkeeping.
    let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max").unwrap().trim().parse().unwrap();
    assert!(granted == 2 * (8 << 20) || granted == 2 * rmem_max.min(8 << 20), "{granted}, rmem_max {rmem_max}");
}

#[test]
fn a_link_asks_for_the_socket_buffer_it_is_given() {
    let mut link = UdpLink::new(free_port());
    link.socket_buffer(212_992);
    link.bind(A).unwrap();
    let granted = link.receive_buffer().expect("a bound link has a receive buffer");
    // Twice what was asked (the kernel's bookkeeping), or of rmem_max
    // where that is lower and the process may not exceed it.
    let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max").unwrap().trim().parse().unwrap();
    assert!(granted == 2 * 212_992 || granted == 2 * rmem_max.min(212_992), "{granted}, rmem_max {rmem_max}");
}
