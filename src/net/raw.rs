//! The raw link: RoCEv2 in whole Ethernet frames over an `AF_PACKET` socket
//! (through `pnet_datalink`), bound to one interface.
//!
//! Unlike the UDP link it sees and writes every header byte, which gives two
//! things the UDP link cannot:
//! - strict ICRC checks on receive: the sender's real IPv4 header, including
//!   the Identification a UDP socket hides, is known;
//! - crafting: [`RawLink::send_with_ip`] sends RoCE bytes under any IP header
//!   (ID, TTL, TOS, flow label…) with a correct ICRC, and
//!   [`RawLink::send_raw_ip`] sends any IP packet as it is (bad ICRCs, odd
//!   lengths), for conformance tests and fuzzing peers. It also honours the
//!   per-QP UDP source port of [`Outgoing::src_port`].
//!
//! It needs `CAP_NET_RAW`; [`RawLink::open`] fails with
//! [`io::ErrorKind::PermissionDenied`] without it.
//!
//! Receiving: the socket sees all traffic of the interface except its own
//! host's outgoing packets (`PACKET_IGNORE_OUTGOING`, Linux 4.20+); the link
//! keeps IPv4 or IPv6 UDP packets to its port addressed to an attached
//! address and skips everything else without counting it. IPv6 packets with
//! extension headers and non-first IPv4 fragments count as other traffic.
//! The ICRC check is [`icrc::verify`] over the received header bytes, what
//! `Packet::icrc_ok` does, on the link's own parse so ports other than 4791
//! work.
//! Filtering is done in userspace, so a busy interface costs a wakeup per
//! frame. The kernel's own stack also sees the packets (it may answer with
//! ICMP port unreachable when nothing listens on the port; the link ignores
//! that). On `lo` it drops IPv4 frames this link sends with 127/8 addresses
//! as martians unless `net.ipv4.conf.lo.route_localnet` is 1, so a kernel
//! peer (rxe, a UDP socket) on `lo` is reached over `::1` or with that
//! setting; other raw links on `lo` get the frames either way.
//!
//! Sending: the destination MAC is all zeros on a loopback interface;
//! otherwise it comes from [`RawLink::set_neighbour`] or, for IPv4, from the
//! kernel's neighbour table (`/proc/net/arp`, for this interface, complete
//! entries only), remembered after the first look-up. The link sends no ARP
//! requests and does no IPv6 neighbour discovery, and it does not route: the
//! destination must be on-link and already known, or sending fails with
//! [`io::ErrorKind::NotFound`] (IPv4) or [`io::ErrorKind::Unsupported`] (IPv6).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::RawFd;
use std::time::Duration;

use etherparse::{
    EtherType, Ethernet2Header, Ethernet2HeaderSlice, IpNumber, Ipv4HeaderSlice, Ipv6HeaderSlice, UdpHeader,
    UdpHeaderSlice,
};
use pnet_datalink::{Channel, DataLinkReceiver, DataLinkSender, NetworkInterface};

use super::{Link, LinkStats, Outgoing, Received};
use crate::wire::packet::{encapsulate, ip_header};
use crate::wire::roce::ICRC_LEN;
use crate::wire::{icrc, IpHeader, ROCE_UDP_PORT};

/// The largest frame read: an Ethernet header and a maximal IP packet (the
/// loopback MTU is 64 KiB). A shorter buffer would silently truncate.
const MAX_FRAME: usize = Ethernet2Header::LEN + u16::MAX as usize;

/// The shortest RoCE payload: a BTH and an ICRC.
const MIN_ROCE_LEN: usize = 12 + ICRC_LEN;

/// `SOL_PACKET` option from `<linux/if_packet.h>` that hides the host's
/// outgoing packets from the socket (the `libc` crate does not export it).
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// `ATF_COM` from `<net/if_arp.h>`: the neighbour entry is complete.
const ATF_COM: u32 = 0x2;

/// An `AF_PACKET` channel on one Ethernet (or loopback) interface.
pub struct RawLink {
    interface: NetworkInterface,
    mac: [u8; 6],
    /// The socket shared by `tx` and `rx`, which own and close it.
    fd: RawFd,
    tx: Box<dyn DataLinkSender>,
    rx: Box<dyn DataLinkReceiver>,
    port: u16,
    local: BTreeSet<IpAddr>,
    neighbours: HashMap<IpAddr, [u8; 6]>,
    stats: LinkStats,
}

impl RawLink {
    /// A link on `interface_name` carrying RoCEv2 on the standard port 4791.
    pub fn open(interface_name: &str) -> io::Result<RawLink> {
        RawLink::with_port(interface_name, ROCE_UDP_PORT)
    }

    /// A link on `interface_name` that sends to and accepts UDP destination
    /// port `port` (another port than 4791 lets it talk to a [`super::UdpLink`]
    /// on a free port).
    pub fn with_port(interface_name: &str, port: u16) -> io::Result<RawLink> {
        let interface = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.name == interface_name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface named {interface_name}")))?;
        let fd = packet_socket()?;
        let config = pnet_datalink::Config {
            read_buffer_size: MAX_FRAME,
            // Zero: `next` polls without blocking; engines block in `wait_readable`.
            read_timeout: Some(Duration::ZERO),
            write_timeout: Some(Duration::from_secs(1)),
            promiscuous: false,
            socket_fd: Some(fd),
            ..Default::default()
        };
        // From here on pnet owns the socket and closes it, on error too.
        let (tx, rx) = match pnet_datalink::channel(&interface, config)? {
            Channel::Ethernet(tx, rx) => (tx, rx),
            _ => return Err(io::Error::new(io::ErrorKind::Unsupported, "not an Ethernet channel")),
        };
        let mac = interface.mac.map_or([0; 6], |m| m.octets());
        Ok(RawLink {
            interface,
            mac,
            fd,
            tx,
            rx,
            port,
            local: BTreeSet::new(),
            neighbours: HashMap::new(),
            stats: LinkStats::default(),
        })
    }

    /// The interface's MAC address, the source of every frame sent.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The addresses configured on the interface (candidates for
    /// [`Link::attach`]; any other address can be attached too).
    pub fn interface_addrs(&self) -> Vec<IpAddr> {
        self.interface.ips.iter().map(|net| net.ip()).collect()
    }

    /// Sends frames for `ip` to `mac`, overriding the kernel's neighbour table
    /// (the way to reach IPv6 peers, or peers the kernel has not resolved).
    pub fn set_neighbour(&mut self, ip: IpAddr, mac: [u8; 6]) {
        self.neighbours.insert(ip, mac);
    }

    /// Sends RoCE bytes (BTH through a placeholder ICRC) under the given IP
    /// header, from UDP port `src_port` to the link's port. Lengths, the IPv4
    /// checksum and the ICRC are computed; every other header field is the
    /// caller's, so crafted IDs, TTLs or TOS values still carry a good ICRC.
    pub fn send_with_ip(&mut self, ip: &IpHeader, src_port: u16, roce: &[u8]) -> io::Result<()> {
        let packet = self.encapsulate(ip, src_port, roce)?;
        self.send_raw_ip(&packet)
    }

    /// Sends a whole IP packet exactly as given, in an Ethernet frame to the
    /// neighbour its destination address resolves to. Nothing is checked or
    /// fixed beyond the version and the address.
    pub fn send_raw_ip(&mut self, ip_packet: &[u8]) -> io::Result<()> {
        let (ether_type, dst) = match ip_packet.first().map(|b| b >> 4) {
            Some(4) if ip_packet.len() >= 20 => {
                let dst: [u8; 4] = ip_packet[16..20].try_into().expect("four bytes");
                (EtherType::IPV4, IpAddr::from(dst))
            }
            Some(6) if ip_packet.len() >= 40 => {
                let dst: [u8; 16] = ip_packet[24..40].try_into().expect("sixteen bytes");
                (EtherType::IPV6, IpAddr::from(dst))
            }
            _ => return Err(invalid("not an IPv4 or IPv6 packet")),
        };
        let destination = self.neighbour(dst)?;
        let ethernet = Ethernet2Header { source: self.mac, destination, ether_type };
        let mut frame = Vec::with_capacity(Ethernet2Header::LEN + ip_packet.len());
        frame.extend_from_slice(&ethernet.to_bytes());
        frame.extend_from_slice(ip_packet);
        self.tx
            .send_to(&frame, None)
            .unwrap_or_else(|| Err(io::Error::new(io::ErrorKind::Unsupported, "channel cannot send")))?;
        self.stats.sent += 1;
        Ok(())
    }

    /// The IP packet carrying `roce` from `src_port` to the link's port, ICRC filled.
    fn encapsulate(&self, ip: &IpHeader, src_port: u16, roce: &[u8]) -> io::Result<Vec<u8>> {
        let udp = UdpHeader { source_port: src_port, destination_port: self.port, length: 0, checksum: 0 };
        encapsulate(ip, &udp, roce).map_err(|e| invalid(&e.to_string()))
    }

    /// The MAC address frames to `ip` go to.
    fn neighbour(&mut self, ip: IpAddr) -> io::Result<[u8; 6]> {
        if self.interface.is_loopback() {
            return Ok([0; 6]);
        }
        if let Some(mac) = self.neighbours.get(&ip) {
            return Ok(*mac);
        }
        let IpAddr::V4(v4) = ip else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("no neighbour for {ip}: IPv6 neighbour discovery is not done (RawLink::set_neighbour)"),
            ));
        };
        let table = std::fs::read_to_string("/proc/net/arp")?;
        let mac = arp_lookup(&table, v4, &self.interface.name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{ip} has no complete entry for {} in /proc/net/arp and this link sends no ARP \
                     requests: reach it through the kernel first (ping) or use RawLink::set_neighbour",
                    self.interface.name
                ),
            )
        })?;
        self.neighbours.insert(ip, mac);
        Ok(mac)
    }
}

impl Link for RawLink {
    fn attach(&mut self, addr: IpAddr) -> io::Result<()> {
        self.local.insert(addr);
        Ok(())
    }

    fn transmit(&mut self, _now: Duration, out: Outgoing<'_>) -> io::Result<()> {
        if !self.local.contains(&out.src) {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("{} is not attached to this link", out.src),
            ));
        }
        let ip = ip_header(out.src, out.dst).map_err(|e| invalid(&e.to_string()))?;
        let packet = self.encapsulate(&ip, out.src_port, out.roce)?;
        // The ICRC goes back to the caller too, as the other links fill it in place.
        out.roce.copy_from_slice(&packet[packet.len() - out.roce.len()..]);
        self.send_raw_ip(&packet)
    }

    fn receive(&mut self, _now: Duration, buf: &mut [u8]) -> Option<Received> {
        loop {
            // An error is the zero timeout (nothing pending) or a dead
            // interface; either way there is nothing to deliver now.
            let frame = self.rx.next().ok()?;
            let (ip, udp, roce, src, dst) = match classify(frame, self.port, &self.local) {
                Frame::Other => continue,
                Frame::Malformed => {
                    self.stats.received += 1;
                    self.stats.malformed += 1;
                    continue;
                }
                Frame::Roce { ip, udp, roce, src, dst } => (ip, udp, roce, src, dst),
            };
            self.stats.received += 1;
            if !icrc::verify(ip, udp, roce).unwrap_or(false) {
                self.stats.icrc_errors += 1;
                continue;
            }
            let Some(dest) = buf.get_mut(..roce.len()) else {
                self.stats.malformed += 1;
                continue;
            };
            dest.copy_from_slice(roce);
            let src_port = u16::from_be_bytes([udp[0], udp[1]]);
            return Some(Received { src, src_port, dst, len: roce.len() });
        }
    }

    fn next_event(&self) -> Option<Duration> {
        None
    }

    fn local_addrs(&self) -> Vec<IpAddr> {
        self.local.iter().copied().collect()
    }

    fn raw_fds(&self) -> Vec<RawFd> {
        vec![self.fd]
    }

    fn stats(&self) -> LinkStats {
        self.stats
    }
}

/// What a received frame is to the link.
#[derive(Debug, PartialEq, Eq)]
enum Frame<'a> {
    /// Not UDP to the link's port at an attached address.
    Other,
    /// Addressed to the link, but its IP or UDP layer is inconsistent or the
    /// RoCE part is too short.
    Malformed,
    /// RoCE bytes (BTH through ICRC) with the headers the ICRC covers.
    Roce { ip: &'a [u8], udp: &'a [u8], roce: &'a [u8], src: IpAddr, dst: IpAddr },
}

/// Sorts a frame: skips what is not for the link before judging the rest.
fn classify<'a>(frame: &'a [u8], port: u16, local: &BTreeSet<IpAddr>) -> Frame<'a> {
    let Ok(ethernet) = Ethernet2HeaderSlice::from_slice(frame) else { return Frame::Other };
    let packet = &frame[Ethernet2Header::LEN..];
    let (ip, src, dst, total, fragmented) = match ethernet.ether_type() {
        EtherType::IPV4 => {
            let Ok(h) = Ipv4HeaderSlice::from_slice(packet) else { return Frame::Other };
            // Later fragments carry no UDP header to recognise.
            if h.protocol() != IpNumber::UDP || h.fragments_offset().value() != 0 {
                return Frame::Other;
            }
            let (src, dst) = (h.source_addr().into(), h.destination_addr().into());
            (h.slice(), src, dst, usize::from(h.total_len()), h.more_fragments())
        }
        EtherType::IPV6 => {
            let Ok(h) = Ipv6HeaderSlice::from_slice(packet) else { return Frame::Other };
            if h.next_header() != IpNumber::UDP {
                return Frame::Other;
            }
            let (src, dst) = (h.source_addr().into(), h.destination_addr().into());
            (h.slice(), src, dst, h.slice().len() + usize::from(h.payload_length()), false)
        }
        _ => return Frame::Other,
    };
    let Ok(udp) = UdpHeaderSlice::from_slice(&packet[ip.len()..]) else { return Frame::Other };
    if udp.destination_port() != port || !local.contains(&dst) {
        return Frame::Other;
    }
    // From here the packet is for us: inconsistencies count as malformed.
    let udp_end = ip.len() + usize::from(udp.length());
    let udp_too_short = usize::from(udp.length()) < UdpHeader::LEN + MIN_ROCE_LEN;
    if fragmented || total > packet.len() || udp_end > total || udp_too_short {
        return Frame::Malformed;
    }
    let roce = &packet[ip.len() + UdpHeader::LEN..udp_end];
    Frame::Roce { ip, udp: udp.slice(), roce, src, dst }
}

/// Opens an `AF_PACKET` socket that does not see its host's outgoing
/// packets. Protocol 0 keeps it deaf until pnet binds it to the interface,
/// so no other interface's frames queue up meanwhile.
fn packet_socket() -> io::Result<RawFd> {
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let on: libc::c_int = 1;
    // SAFETY: a valid socket fd and a pointer to a c_int of the given size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            PACKET_IGNORE_OUTGOING,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        // SAFETY: `fd` is ours and used nowhere else.
        unsafe { libc::close(fd) };
        return Err(err);
    }
    Ok(fd)
}

/// The MAC of `ip` on `device` in a `/proc/net/arp` table, if its entry is complete.
fn arp_lookup(table: &str, ip: Ipv4Addr, device: &str) -> Option<[u8; 6]> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [addr, _hw_type, flags, mac, _mask, dev] = fields[..] else { return None };
        let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
        if addr.parse() != Ok(ip) || dev != device || flags & ATF_COM == 0 {
            return None;
        }
        parse_mac(mac)
    })
}

/// Parses `aa:bb:cc:dd:ee:ff`.
fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
IP address       HW type     Flags       HW address            Mask     Device
192.0.2.1        0x1         0x2         02:fc:00:00:00:05     *        eth0
192.0.2.7        0x1         0x0         00:00:00:00:00:00     *        eth0
198.51.100.1     0x1         0x6         0a:0b:0c:0d:0e:0f     *        eth1
";

    #[test]
    fn arp_lookup_finds_complete_entries_of_the_device() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(arp_lookup(TABLE, ip("192.0.2.1"), "eth0"), Some([2, 0xfc, 0, 0, 0, 5]));
        assert_eq!(arp_lookup(TABLE, ip("198.51.100.1"), "eth1"), Some([10, 11, 12, 13, 14, 15]));
        // incomplete, other device, absent
        assert_eq!(arp_lookup(TABLE, ip("192.0.2.7"), "eth0"), None);
        assert_eq!(arp_lookup(TABLE, ip("192.0.2.1"), "eth1"), None);
        assert_eq!(arp_lookup(TABLE, ip("192.0.2.9"), "eth0"), None);
        assert_eq!(parse_mac("02:fc:00:00:00"), None);
        assert_eq!(parse_mac("02:fc:00:00:00:05:06"), None);
    }

    /// An Ethernet frame with a RoCE packet of `roce_len` bytes from 10.0.0.1
    /// to 10.0.0.2 on UDP port 4791.
    fn frame(roce_len: usize) -> Vec<u8> {
        let ip = ip_header("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()).unwrap();
        let udp = UdpHeader { source_port: 0xc000, destination_port: ROCE_UDP_PORT, length: 0, checksum: 0 };
        let mut roce = vec![0u8; roce_len];
        roce[0] = 0x04; // RC SEND_ONLY
        let packet = encapsulate(&ip, &udp, &roce).unwrap();
        let ethernet = Ethernet2Header { source: [0; 6], destination: [0; 6], ether_type: EtherType::IPV4 };
        [&ethernet.to_bytes()[..], &packet].concat()
    }

    #[test]
    fn classify_keeps_roce_for_attached_addresses_only() {
        let attached: BTreeSet<IpAddr> = ["10.0.0.2".parse().unwrap()].into();
        let good = frame(12 + 8 + ICRC_LEN);
        match classify(&good, ROCE_UDP_PORT, &attached) {
            Frame::Roce { ip, udp, roce, src, dst } => {
                assert_eq!((ip.len(), udp.len(), roce.len()), (20, 8, 24));
                assert_eq!((src, dst), ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()));
                assert!(icrc::verify(ip, udp, roce).unwrap());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(classify(&good, 4792, &attached), Frame::Other);
        assert_eq!(classify(&good, ROCE_UDP_PORT, &BTreeSet::new()), Frame::Other);
        // Ethernet padding after the IP packet is not RoCE.
        let mut padded = good.clone();
        padded.extend_from_slice(&[0xaa; 8]);
        let kept = classify(&padded, ROCE_UDP_PORT, &attached);
        assert!(matches!(kept, Frame::Roce { roce, .. } if roce.len() == 24), "{kept:?}");
        // For us but cut short, or too short to hold a BTH and an ICRC.
        assert_eq!(classify(&good[..good.len() - 1], ROCE_UDP_PORT, &attached), Frame::Malformed);
        let mut short = good[..Ethernet2Header::LEN + 20 + 8 + 12].to_vec();
        short[16..18].copy_from_slice(&(20u16 + 8 + 12).to_be_bytes()); // IP total length
        short[38..40].copy_from_slice(&(8u16 + 12).to_be_bytes()); // UDP length
        assert_eq!(classify(&short, ROCE_UDP_PORT, &attached), Frame::Malformed);
    }
}
