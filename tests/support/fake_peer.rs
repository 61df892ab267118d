//! A RoCE peer (or attacker) made of one UDP socket, for tests that aim
//! crafted datagrams at a real context: it computes a correct ICRC, which
//! is no secret, and checks the ICRC of what comes back.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use softroce::verbs::{Endpoint, Gid};
use softroce::wire::{icrc, Psn, RoceRepr};

use super::qp::Sent;

/// A RoCE peer (or attacker) made of one UDP socket: it sends packets it
/// builds itself and reads what a context sends to its address.
pub struct FakePeer {
    socket: UdpSocket,
    /// The RoCE port of the contexts it talks to.
    port: u16,
}

impl FakePeer {
    /// A peer at `addr` on the RoCE `port`, so it hears what a context sends
    /// to `addr`.
    pub fn bind(addr: IpAddr, port: u16) -> FakePeer {
        FakePeer::on(SocketAddr::new(addr, port), port)
    }

    /// A sender at `addr` on a port of its own, sending to the RoCE `port`:
    /// an off-path attacker, who never hears an answer.
    pub fn sender(addr: IpAddr, port: u16) -> FakePeer {
        FakePeer::on(SocketAddr::new(addr, 0), port)
    }

    fn on(local: SocketAddr, port: u16) -> FakePeer {
        let socket = UdpSocket::bind(local).unwrap_or_else(|e| panic!("bind {local}: {e}"));
        FakePeer { socket, port }
    }

    pub fn addr(&self) -> IpAddr {
        self.socket.local_addr().unwrap().ip()
    }

    /// What a QP needs to connect to this peer as QP `qpn` starting at `psn`.
    pub fn endpoint(&self, qpn: u32, psn: u32) -> Endpoint {
        Endpoint { qpn, psn: Psn::new(psn), gid: Gid::from_ip(self.addr()) }
    }

    /// Sends a packet to the context at `to`.
    pub fn send(&self, to: IpAddr, header: &RoceRepr, payload: &[u8]) {
        let mut roce = vec![0u8; header.wire_len(payload.len())];
        header.emit(&mut roce, payload).expect("a consistent packet");
        self.send_roce(to, &mut roce);
    }

    /// Sends any bytes as a RoCE UDP payload, their last four bytes replaced
    /// by the ICRC a receiver computes (the bytes must hold a BTH and an ICRC).
    pub fn send_roce(&self, to: IpAddr, roce: &mut [u8]) {
        self.fill_icrc(to, roce);
        self.send_datagram(to, roce);
    }

    /// Replaces the last four bytes of `roce` by the ICRC of the datagram
    /// this peer would send to `to`.
    pub fn fill_icrc(&self, to: IpAddr, roce: &mut [u8]) {
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (self.addr(), to) else { panic!("IPv4 only") };
        let src_port = self.socket.local_addr().unwrap().port();
        let udp_len = 8 + roce.len();
        let mut udp = [0u8; 8];
        udp[..2].copy_from_slice(&src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&self.port.to_be_bytes());
        udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        // What a UDP receiver assumes: DF, Identification 0.
        let ip = icrc::ipv4_header(src, dst, (20 + udp_len) as u16, 0, 0x40);
        icrc::fill(&ip, &udp, roce).expect("room for the ICRC");
    }

    /// Sends a datagram exactly as given.
    pub fn send_datagram(&self, to: IpAddr, bytes: &[u8]) {
        let sent = self.socket.send_to(bytes, (to, self.port)).unwrap_or_else(|e| panic!("send to {to}: {e}"));
        assert_eq!(sent, bytes.len());
    }

    /// The next packet a context sent here within `timeout`, its ICRC checked.
    pub fn receive(&self, timeout: Duration) -> Option<Sent> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            self.socket.set_read_timeout(Some(left)).unwrap();
            let Ok((len, from)) = self.socket.recv_from(&mut buf) else { continue };
            let roce = &buf[..len];
            let (IpAddr::V4(src), IpAddr::V4(dst)) = (from.ip(), self.addr()) else { panic!("IPv4 only") };
            let mut udp = [0u8; 8];
            udp[..2].copy_from_slice(&from.port().to_be_bytes());
            udp[2..4].copy_from_slice(&self.port.to_be_bytes());
            udp[4..6].copy_from_slice(&((8 + len) as u16).to_be_bytes());
            let id = icrc::verify_ipv4_unknown_id(src, dst, &udp, roce);
            assert!(matches!(id, Ok(Some(_))), "a context sent a bad ICRC");
            let parsed = RoceRepr::parse(roce).expect("a context sends valid packets");
            return Some(Sent { dest: self.addr(), header: parsed.header, payload: parsed.payload.to_vec() });
        }
    }

    /// Everything that arrives until nothing has for `quiet`.
    pub fn receive_until_quiet(&self, quiet: Duration) -> Vec<Sent> {
        std::iter::from_fn(|| self.receive(quiet)).collect()
    }
}
