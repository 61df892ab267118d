//! The UDP link on a port shared with other links (rxe-spec/share.md): a
//! GRO train whose packets belong to two owners, as a remote host's NIC
//! may coalesce them, reaches one owner whole, and that owner passes the
//! other's packets on.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use softroce::net::{Link, UdpLink};
use softroce::wire::icrc;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// An RC SEND ONLY to `qpn` with a 48-byte payload and its ICRC, as sent
/// from `from` to A on `port`.
fn packet(qpn: u32, from: u16, port: u16) -> Vec<u8> {
    let mut p = vec![0u8; 12 + 48 + 4];
    p[0] = 0x04;
    p[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
    p[4..8].copy_from_slice(&qpn.to_be_bytes());
    p[8..12].copy_from_slice(&7u32.to_be_bytes());
    let IpAddr::V4(a) = A else { unreachable!() };
    let h = icrc::Ipv4Udp { src: B, dst: a, src_port: from, dst_port: port };
    let at = p.len() - 4;
    // The receiver checks IPv4 ICRCs up to the ID, which GSO numbers.
    let crc = icrc::compute_ipv4(&mut icrc::PrefixCache::default(), h, 0, 0x40, &p[..at]).unwrap();
    p[at..].copy_from_slice(&crc.to_le_bytes());
    p
}

/// The destination QPNs of what `link` receives within `wait`.
fn drain(link: &mut UdpLink, wait: Duration) -> Vec<u32> {
    let deadline = Instant::now() + wait;
    let mut buf = vec![0u8; 9216];
    let mut qpns = Vec::new();
    while Instant::now() < deadline {
        while let Some(r) = link.receive(Duration::ZERO, &mut buf) {
            qpns.push(u32::from_be_bytes(buf[4..8].try_into().unwrap()));
            assert_eq!(r.dst, A);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    qpns
}

/// rxe-spec N-4.
#[test]
fn a_train_of_two_owners_packets_reaches_both() {
    let port = softroce::net::udp::free_port(&[A]).unwrap();
    let (mut first, mut second) = (UdpLink::new(port), UdpLink::new(port));
    let (s1, s2) = (u32::from(first.join(&[A]).unwrap()), u32::from(second.join(&[A]).unwrap()));
    let sender = UdpSocket::bind((B, 0)).unwrap();
    let from = sender.local_addr().unwrap().port();
    let qpns = [s1 << 16 | 1, s2 << 16 | 2, s1 << 16 | 3, s2 << 16 | 4];
    let train: Vec<u8> = qpns.iter().flat_map(|&qpn| packet(qpn, from, port)).collect();
    let segment: libc::c_int = (train.len() / qpns.len()) as libc::c_int;
    // SAFETY: a valid socket and a c_int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            sender.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            (&segment as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "UDP GSO: {}", std::io::Error::last_os_error());
    sender.send_to(&train, (A, port)).unwrap();
    // The kernel steers the train by its first packet, to the first link.
    assert_eq!(drain(&mut first, Duration::from_millis(100)), [qpns[0], qpns[2]]);
    assert_eq!(drain(&mut second, Duration::from_millis(100)), [qpns[1], qpns[3]]);
    assert_eq!(first.stats().forwarded, 2);
    assert_eq!((second.stats().forwarded, second.stats().icrc_errors), (0, 0));
}

/// rxe-spec N-4: a link reads its inbox at one look in eight that find its
/// sockets empty (a system call more at every look made every message
/// wait longer), and a burst of forwarded packets one look after another.
#[test]
fn forwarded_packets_are_read_at_one_empty_look_in_eight() {
    let port = softroce::net::udp::free_port(&[A]).unwrap();
    let (mut first, mut second) = (UdpLink::new(port), UdpLink::new(port));
    let (s1, s2) = (u32::from(first.join(&[A]).unwrap()), u32::from(second.join(&[A]).unwrap()));
    let sender = UdpSocket::bind((B, 0)).unwrap();
    let from = sender.local_addr().unwrap().port();
    // Sent to the first link's socket (its QPN first), two of them for the second.
    let qpns = [s1 << 16 | 1, s2 << 16 | 2, s2 << 16 | 3];
    let train: Vec<u8> = qpns.iter().flat_map(|&qpn| packet(qpn, from, port)).collect();
    let segment = train.len() / qpns.len();
    // SAFETY: a valid socket and a c_int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            sender.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            (&(segment as libc::c_int) as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "UDP GSO: {}", std::io::Error::last_os_error());
    sender.send_to(&train, (A, port)).unwrap();
    assert_eq!(drain(&mut first, Duration::from_millis(100)), [qpns[0]]);
    assert_eq!(first.stats().forwarded, 2);
    let mut buf = vec![0u8; 9216];
    let looks: Vec<bool> = (0..10).map(|_| second.receive(Duration::ZERO, &mut buf).is_some()).collect();
    let mut expected = [false; 10];
    expected[7] = true;
    expected[8] = true;
    assert_eq!(looks, expected, "the 8th and 9th looks read the two forwarded packets");
}
