//! A RoCE peer (or attacker) made of one UDP socket, for tests that aim
//! crafted datagrams at a real context: the library's `RoceSocket`, with
//! every failure a test failure and what comes back parsed.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use softroce::net::RoceSocket;
use softroce::verbs::{Endpoint, Gid};
use softroce::wire::{Psn, RoceRepr};

use super::qp::Sent;

/// A RoCE peer (or attacker) made of one UDP socket: it sends packets it
/// builds itself and reads what a context sends to its address.
pub struct FakePeer {
    socket: RoceSocket,
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
        let socket = RoceSocket::bind(local, port).unwrap_or_else(|e| panic!("bind {local}: {e}"));
        FakePeer { socket }
    }

    pub fn addr(&self) -> IpAddr {
        self.socket.local_addr().ip()
    }

    /// What a QP needs to connect to this peer as QP `qpn` starting at `psn`.
    pub fn endpoint(&self, qpn: u32, psn: u32) -> Endpoint {
        Endpoint { qpn, psn: Psn::new(psn), gid: Gid::from_ip(self.addr()) }
    }

    /// Sends a packet to the context at `to`.
    pub fn send(&self, to: IpAddr, header: &RoceRepr, payload: &[u8]) {
        self.socket.send(to, header, payload).unwrap_or_else(|e| panic!("send to {to}: {e}"));
    }

    /// Sends any bytes as a RoCE UDP payload, their last four bytes replaced
    /// by the ICRC a receiver computes (the bytes must hold a BTH and an ICRC).
    pub fn send_roce(&self, to: IpAddr, roce: &mut [u8]) {
        self.socket.send_roce(to, roce).unwrap_or_else(|e| panic!("send to {to}: {e}"));
    }

    /// Replaces the last four bytes of `roce` by the ICRC of the datagram
    /// this peer would send to `to`.
    pub fn fill_icrc(&self, to: IpAddr, roce: &mut [u8]) {
        self.socket.fill_icrc(to, roce).expect("room for the ICRC");
    }

    /// Sends a datagram exactly as given.
    pub fn send_datagram(&self, to: IpAddr, bytes: &[u8]) {
        self.socket.send_datagram(to, bytes).unwrap_or_else(|e| panic!("send to {to}: {e}"));
    }

    /// The next packet a context sent here within `timeout`, its ICRC checked.
    pub fn receive(&self, timeout: Duration) -> Option<Sent> {
        let arrival = self.socket.receive(timeout).expect("receive")?;
        assert!(arrival.icrc_ok, "a context sent a bad ICRC");
        let parsed = RoceRepr::parse(&arrival.roce).expect("a context sends valid packets");
        Some(Sent { dest: self.addr(), header: parsed.header, payload: parsed.payload.to_vec() })
    }

    /// Everything that arrives until nothing has for `quiet`.
    pub fn receive_until_quiet(&self, quiet: Duration) -> Vec<Sent> {
        std::iter::from_fn(|| self.receive(quiet)).collect()
    }
}
