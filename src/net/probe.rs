//! A RoCE endpoint made of one UDP socket and nothing else: it sends packets
//! built by hand (any header, any PSN, a right or a deliberately wrong ICRC)
//! and hands back what arrives with its ICRC checked. No QP state, no
//! retransmission: the caller plays the protocol. `softroce conform` probes
//! peers with it; the hostile-network tests attack contexts with it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::wire::{icrc, RoceRepr};

/// One UDP socket speaking RoCEv2 to peers on `port` (IPv4).
pub struct RoceSocket {
    socket: UdpSocket,
    port: u16,
}

/// A datagram that arrived, as bytes: the caller parses it, so malformed
/// packets are seen too.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// Who sent it.
    pub from: SocketAddr,
    /// When it arrived.
    pub at: Instant,
    /// The UDP payload: BTH, extended headers, payload, pad, ICRC.
    pub roce: Vec<u8>,
    /// Whether its ICRC is that of the datagram as received (for some IPv4
    /// Identification, which a UDP socket does not show).
    pub icrc_ok: bool,
}

fn ipv4(addr: IpAddr) -> io::Result<Ipv4Addr> {
    match addr {
        IpAddr::V4(v4) => Ok(v4),
        IpAddr::V6(_) => Err(io::Error::new(io::ErrorKind::Unsupported, "RoceSocket speaks IPv4 only")),
    }
}

/// The UDP header the ICRC covers (its checksum is masked).
fn udp_header(src_port: u16, dst_port: u16, roce_len: usize) -> [u8; 8] {
    let mut udp = [0u8; 8];
    udp[..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + roce_len) as u16).to_be_bytes());
    udp
}

impl RoceSocket {
    /// A socket on `local`, talking to peers on the RoCE `port`. Bound to
    /// `port` itself, it hears what peers send to its address; bound to port
    /// 0, it is a sender that never hears an answer.
    pub fn bind(local: SocketAddr, port: u16) -> io::Result<RoceSocket> {
        ipv4(local.ip())?;
        let socket = UdpSocket::bind(local)?;
        // The ICRC covers the IPv4 Identification, which a receiver that
        // checks against the real header (kernel rxe) sees: DF and ID 0, as
        // `fill_icrc` assumes.
        super::udp::set_pmtudisc_do(&socket)?;
        // A peer's window of several QPs arrives in one burst: a default
        // buffer would drop what the probe then takes for the peer's gaps.
        let bytes = libc::c_int::try_from(super::udp::SOCKET_BUFFER).unwrap_or(libc::c_int::MAX);
        super::udp::set_buffer(&socket, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, bytes);
        Ok(RoceSocket { socket, port })
    }

    /// The address and port it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr().expect("a bound socket has an address")
    }

    /// Emits `header` and `payload` with a correct ICRC and sends them to
    /// `to`; returns the bytes sent.
    pub fn send(&self, to: IpAddr, header: &RoceRepr, payload: &[u8]) -> io::Result<Vec<u8>> {
        let mut roce = vec![0u8; header.wire_len(payload.len())];
        header.emit(&mut roce, payload).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.send_roce(to, &mut roce)?;
        Ok(roce)
    }

    /// Sends any bytes as a RoCE UDP payload, their last four bytes replaced
    /// by the ICRC a receiver computes (the bytes must hold a BTH and an ICRC).
    pub fn send_roce(&self, to: IpAddr, roce: &mut [u8]) -> io::Result<()> {
        self.fill_icrc(to, roce)?;
        self.send_datagram(to, roce)
    }

    /// Replaces the last four bytes of `roce` by the ICRC of the datagram
    /// this socket would send to `to`.
    pub fn fill_icrc(&self, to: IpAddr, roce: &mut [u8]) -> io::Result<()> {
        let (src, dst) = (ipv4(self.local_addr().ip())?, ipv4(to)?);
        let udp = udp_header(self.local_addr().port(), self.port, roce.len());
        // What a UDP receiver assumes: DF, Identification 0.
        let ip = icrc::ipv4_header(src, dst, (20 + udp.len() + roce.len()) as u16, 0, 0x40);
        icrc::fill(&ip, &udp, roce).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
    }

    /// Sends a datagram exactly as given.
    pub fn send_datagram(&self, to: IpAddr, bytes: &[u8]) -> io::Result<()> {
        let sent = self.socket.send_to(bytes, (to, self.port))?;
        if sent == bytes.len() {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::WriteZero, format!("sent {sent} of {} bytes", bytes.len())))
        }
    }

    /// The next datagram within `timeout`, or `None` when none came.
    pub fn receive(&self, timeout: Duration) -> io::Result<Option<Arrival>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                return Ok(None);
            };
            self.socket.set_read_timeout(Some(left))?;
            let (len, from) = match self.socket.recv_from(&mut buf) {
                Ok(got) => got,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let at = Instant::now();
            let roce = buf[..len].to_vec();
            let icrc_ok = match (from.ip(), self.local_addr().ip()) {
                (IpAddr::V4(src), IpAddr::V4(dst)) => {
                    let udp = udp_header(from.port(), self.local_addr().port(), len);
                    matches!(icrc::verify_ipv4_unknown_id(src, dst, &udp, &roce), Ok(Some(_)))
                }
                _ => false,
            };
            return Ok(Some(Arrival { from, at, roce, icrc_ok }));
        }
    }
}
