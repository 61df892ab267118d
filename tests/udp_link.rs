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

    let recv = RecvWr { wr_id: 9, sg_list: vec![Sge { addr: 0x9000, length: 16384, lkey: 2 }] };
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
    let port = loop {
        let s = UdpSocket::bind((v6, 0)).unwrap();
        break s.local_addr().unwrap().port();
    };
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
