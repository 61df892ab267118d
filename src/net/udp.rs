//! The UDP link: RoCEv2 over ordinary UDP sockets, one per local address.
//!
//! The kernel adds the IP and UDP headers, so the link sends and receives
//! RoCE bytes (BTH … ICRC). Sockets are unconnected and set
//! `IP_PMTUDISC_DO`, so IPv4 packets leave with DF and Identification 0.
//!
//! Packets move in batches, and consecutive packets to one destination with
//! one length (the MTU-sized packets of a message) leave as one UDP GSO
//! super-datagram, which the kernel cuts into ordinary datagrams, each a
//! whole RoCE packet. The kernel numbers those segments' IPv4 IDs upward
//! from the super-datagram's 0, so the `k`th packet of a train carries ID
//! `k`, and its ICRC is computed over that header: it is the one a strict
//! peer (kernel rxe, a NIC) checks. Where the kernel refuses GSO the socket
//! falls back to single datagrams for good, and their ICRCs are redone for
//! ID 0. Received datagrams come coalesced where the kernel can (`UDP_GRO`)
//! and are split back into packets.
//!
//! On receive the sender's Identification is unknown, so IPv4 ICRCs are
//! checked "up to the ID" (`icrc::verify_ipv4_unknown_id`), packet by
//! packet; IPv6 headers have no such field and are checked exactly.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use etherparse::{IpNumber, Ipv6Header, UdpHeader};

use super::mmsg::{RecvBatch, SendBatch, MAX_DATAGRAM};
use super::share::{Forwarded, Member};
use super::{Link, LinkStats, Outgoing, Received};
use crate::capture::{Direction, LiveCapture};
use crate::transport::Lent;
use crate::wire::icrc;
use crate::wire::roce::ICRC_LEN;
use crate::wire::ROCE_UDP_PORT;

/// Sockets bound to local addresses, all on one UDP port; datagrams move in
/// batches (`sendmmsg`/`recvmmsg`).
pub struct UdpLink {
    port: u16,
    sockets: BTreeMap<IpAddr, (Arc<UdpSocket>, SendBatch)>,
    /// Sockets of the multicast groups joined, by group address.
    groups: BTreeMap<IpAddr, UdpSocket>,
    /// The link's place among the processes sharing its port, once joined.
    share: Option<Member>,
    /// A packet another member forwarded, and its length.
    forwarded: Vec<u8>,
    /// Looks that found the sockets empty since the inbox was last read
    /// ([`INBOX_EVERY`]).
    empty_looks: u32,
    /// Datagrams received and not yet handed out, and the address they came to.
    rx: RecvBatch,
    rx_local: Option<IpAddr>,
    stats: LinkStats,
    /// Header CRC states of recent packets sent and received.
    tx_icrc: icrc::PrefixCache,
    rx_icrc: icrc::PrefixCache,
    /// Break the ICRC of every this many packets sent (0: never).
    corrupt_every: u32,
    /// Bytes of socket buffer each way that sockets bound from now on ask for.
    socket_buffer: usize,
    /// Where every packet sent and received is recorded, if anywhere.
    capture: Option<LiveCapture>,
    /// rdma_cm requests for services no member of the shared port listens
    /// on yet, held for [`UNCLAIMED_GRACE`] (rxe-spec N-8).
    unclaimed: VecDeque<Unclaimed>,
    /// When the held requests are next looked at.
    unclaimed_check: Duration,
}

/// The inbox of packets other members forwarded is read at one look in
/// this many that find the sockets empty: a thread waiting for a packet
/// looks again and again, and a system call more each look made every
/// message wait longer (forwarded packets are rare: only those the
/// steering sent to the wrong member while it changed).
const INBOX_EVERY: u32 = 8;

/// A REQ or SIDR_REQ that arrived for a service nobody listens on.
#[derive(Debug)]
struct Unclaimed {
    until: Duration,
    service: u32,
    src: SocketAddr,
    local: IpAddr,
    roce: Vec<u8>,
}

/// How long a REQ or SIDR_REQ for a service no process sharing the port
/// listens on waits for a listener before it goes to this process's CM,
/// which refuses it: a server that listens again right after an exchange
/// (perftest's `-R`) is otherwise beaten by a client on the same host.
pub const UNCLAIMED_GRACE: Duration = Duration::from_millis(50);
/// How often held requests look for their listener.
const UNCLAIMED_RECHECK: Duration = Duration::from_millis(1);
/// Requests held at once; past this they are refused at once.
const MAX_UNCLAIMED: usize = 32;

impl UdpLink {
    /// A link whose sockets bind `port` (4791 to talk to other RoCE peers;
    /// another port lets tests run without privileges or conflicts).
    pub fn new(port: u16) -> UdpLink {
        UdpLink {
            port,
            sockets: BTreeMap::new(),
            groups: BTreeMap::new(),
            share: None,
            forwarded: Vec::new(),
            empty_looks: 0,
            rx: RecvBatch::default(),
            rx_local: None,
            stats: LinkStats::default(),
            tx_icrc: icrc::PrefixCache::default(),
            rx_icrc: icrc::PrefixCache::default(),
            corrupt_every: 0,
            socket_buffer: SOCKET_BUFFER,
            unclaimed: VecDeque::new(),
            unclaimed_check: Duration::ZERO,
            capture: None,
        }
    }

    /// Records every packet sent and received from now on into `capture`
    /// (a pcap file, a trace, or both), each as it is on the wire (rxe-spec V-13).
    pub fn capture(&mut self, capture: LiveCapture) {
        self.capture = Some(capture);
    }

    /// The socket buffer, each way, that sockets bound from now on ask for
    /// (8 MiB unless set). Without CAP_NET_ADMIN the kernel caps it at
    /// `net.core.rmem_max`/`wmem_max`; a smaller one shows, even as root,
    /// how softroce runs where those limits are low (RC windows fit the
    /// peer's buffer, rxe-spec T-7).
    pub fn socket_buffer(&mut self, bytes: usize) {
        self.socket_buffer = bytes;
    }

    /// Sends every `n`th packet with a wrong ICRC (0 turns it off): a
    /// conformance-test knob, to see a peer drop such packets and RC recover
    /// by retransmission.
    pub fn corrupt_icrc_every(&mut self, n: u32) {
        self.corrupt_every = n;
    }

    /// The standard RoCEv2 link on port 4791.
    pub fn standard() -> UdpLink {
        UdpLink::new(ROCE_UDP_PORT)
    }

    /// Binds a socket of its own to `addr` on the link's port: nobody
    /// else's process can use the port there ([`UdpLink::join`] shares it).
    pub fn bind(&mut self, addr: IpAddr) -> io::Result<()> {
        let socket = UdpSocket::bind(SocketAddr::new(addr, self.port))?;
        socket.set_nonblocking(true)?;
        self.add_socket(addr, Arc::new(socket))
    }

    /// Binds `addrs` on the link's port together with the user's other
    /// processes that do the same (`net::share`): each datagram reaches the
    /// process that owns its destination QP. Returns the link's slot: its
    /// QPNs must be `slot << 16 | n`.
    pub fn join(&mut self, addrs: &[IpAddr]) -> io::Result<u8> {
        let member = Member::join(self.port, addrs)?;
        for (addr, socket) in member.sockets() {
            self.add_socket(addr, socket)?;
        }
        let slot = member.slot();
        self.share = Some(member);
        Ok(slot)
    }

    /// The link's member of its port's group, once joined.
    pub fn member(&self) -> Option<&Member> {
        self.share.as_ref()
    }

    fn add_socket(&mut self, addr: IpAddr, socket: Arc<UdpSocket>) -> io::Result<()> {
        if let IpAddr::V4(local) = addr {
            set_pmtudisc_do(&socket)?;
            super::share::send_multicast_from(&socket, local)?;
        } else {
            // Kernel rxe sends IPv6 UDP with a zero checksum (RFC 6935 allows
            // it for tunnels); Linux drops such datagrams unless asked not to.
            set_int_option(&socket, libc::SOL_UDP, UDP_NO_CHECK6_RX, 1)?;
        }
        // A full RC window (128 PSNs of 4 KiB, both directions of several
        // QPs) must fit in the socket buffers, or the kernel drops what RC
        // then has to retransmit.
        let bytes = libc::c_int::try_from(self.socket_buffer).unwrap_or(libc::c_int::MAX);
        set_buffer(&socket, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, bytes);
        set_buffer(&socket, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, bytes);
        // Kernels without UDP GSO (before 4.18) refuse the option, and would
        // ignore the per-message one, sending a train as one datagram; 0
        // leaves the socket's own setting off.
        let gso = set_int_option(&socket, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok();
        // Without GRO datagrams arrive one by one, which works too.
        let _ = set_int_option(&socket, libc::SOL_UDP, libc::UDP_GRO, 1);
        self.sockets.insert(addr, (socket, SendBatch::new(gso)));
        Ok(())
    }

    /// Receives the datagrams of IPv4 multicast group `group` (rxe-spec
    /// V-23), on the interface of the link's IPv4 address; joining again is
    /// nothing.
    pub fn join_group(&mut self, group: IpAddr) -> io::Result<()> {
        if self.groups.contains_key(&group) {
            return Ok(());
        }
        let IpAddr::V4(v4) = group else {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "IPv6 multicast groups are not supported"));
        };
        let local = self.sockets.keys().find_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        });
        let local = local.ok_or_else(|| io::Error::new(io::ErrorKind::AddrNotAvailable, "no IPv4 address"))?;
        let socket = super::share::group_socket(v4, local, self.port)?;
        self.groups.insert(group, socket);
        Ok(())
    }

    /// Stops receiving the group's datagrams.
    pub fn leave_group(&mut self, group: IpAddr) {
        self.groups.remove(&group);
    }

    /// Whether the socket of `addr` still sends GSO trains: false before
    /// [`UdpLink::bind`], where the kernel has no UDP GSO, and once it
    /// refused a train.
    pub fn gso(&self, addr: IpAddr) -> bool {
        self.sockets.get(&addr).is_some_and(|(_, batch)| batch.gso())
    }

    /// The next received packet of at most `limit` bytes with a good ICRC,
    /// and where its bytes are ([`UdpLink::bytes`]); counts the others, and
    /// passes on those that belong to another process sharing the port.
    fn next_packet(&mut self, now: Duration, limit: usize) -> Option<(Received, Held)> {
        loop {
            let released = self.release_unclaimed(now);
            let (src, local, held) = if let Some((src, local, len)) = released {
                if len > limit {
                    self.stats.malformed += 1;
                    continue;
                }
                (src, local, Held::Forwarded(len))
            } else {
                match (self.rx.pop(), self.rx_local) {
                    (Some((src, at)), Some(local)) => {
                        self.stats.received += 1;
                        let len = at.len();
                        let Some(src) = src.filter(|_| len > 0 && len <= limit.min(LARGEST_PACKET)) else {
                            self.stats.malformed += 1;
                            continue;
                        };
                        // Every process that joined a group has its own copy.
                        if let Some(member) = self.share.as_mut().filter(|_| !local.is_multicast()) {
                            let roce = self.rx.bytes(at.clone());
                            if let Some(owner) = member.owner_elsewhere(local, roce) {
                                match member.forward(owner, src, local, roce) {
                                    Forwarded::Passed => self.stats.forwarded += 1,
                                    Forwarded::InboxFull => self.stats.forward_dropped += 1,
                                    Forwarded::Ownerless => self.stats.ownerless += 1,
                                }
                                continue;
                            }
                            if self.unclaimed.len() < MAX_UNCLAIMED {
                                if let Some(service) = member.unclaimed_request(local, roce) {
                                    let until = now + UNCLAIMED_GRACE;
                                    self.unclaimed.push_back(Unclaimed {
                                        until,
                                        service,
                                        src,
                                        local,
                                        roce: roce.to_vec(),
                                    });
                                    self.unclaimed_check = now;
                                    continue;
                                }
                            }
                        }
                        (src, local, Held::Batch(at))
                    }
                    _ => {
                        if self.refill() {
                            continue;
                        }
                        let Some((src, local, len)) = self.receive_forwarded() else {
                            if let Some(capture) = &mut self.capture {
                                capture.flush();
                            }
                            return None;
                        };
                        // Forwarded packets come in bursts: the next empty
                        // look reads the inbox again.
                        self.empty_looks = INBOX_EVERY - 1;
                        self.stats.received += 1;
                        if len > limit {
                            self.stats.malformed += 1;
                            continue;
                        }
                        (src, local, Held::Forwarded(len))
                    }
                }
            };
            let roce = held.bytes(&self.rx, &self.forwarded);
            let Some(id) = icrc_check(&mut self.rx_icrc, src, local, self.port, roce) else {
                self.stats.icrc_errors += 1;
                if let Some(capture) = &mut self.capture {
                    capture.record(Direction::DroppedBadIcrc, src, SocketAddr::new(local, self.port), 0, roce);
                }
                continue;
            };
            if let Some(capture) = &mut self.capture {
                capture.record(Direction::Received, src, SocketAddr::new(local, self.port), id, roce);
            }
            let len = roce.len();
            return Some((Received { src: src.ip(), src_port: src.port(), dst: local, len }, held));
        }
    }

    /// A held request whose listener has appeared here, or whose grace is
    /// over, copied into `self.forwarded`; one whose listener appeared in
    /// another process goes on to it. Looks at most every
    /// [`UNCLAIMED_RECHECK`].
    fn release_unclaimed(&mut self, now: Duration) -> Option<(SocketAddr, IpAddr, usize)> {
        if self.unclaimed.is_empty() || now < self.unclaimed_check {
            return None;
        }
        let member = self.share.as_mut()?;
        let own = member.slot();
        let mut i = 0;
        while i < self.unclaimed.len() {
            let held = &self.unclaimed[i];
            match member.listener_now(held.local, held.service) {
                Some(slot) if slot != own => {
                    let held = self.unclaimed.remove(i).expect("an index in range");
                    match member.forward(slot, held.src, held.local, &held.roce) {
                        Forwarded::Passed => self.stats.forwarded += 1,
                        Forwarded::InboxFull => self.stats.forward_dropped += 1,
                        Forwarded::Ownerless => self.stats.ownerless += 1,
                    }
                }
                None if now < held.until => i += 1,
                // Listened on here, or nobody came: this process's CM answers.
                _ => {
                    let held = self.unclaimed.remove(i).expect("an index in range");
                    let len = held.roce.len();
                    self.forwarded.clear();
                    self.forwarded.extend_from_slice(&held.roce);
                    return Some((held.src, held.local, len));
                }
            }
        }
        self.unclaimed_check = now + UNCLAIMED_RECHECK;
        None
    }

    /// Refills the receive batch from the first socket with datagrams
    /// waiting; false if none has any.
    fn refill(&mut self) -> bool {
        for (&local, (socket, _)) in &self.sockets {
            match self.rx.fill(socket.as_raw_fd()) {
                Ok(0) => {}
                Ok(_) => {
                    self.rx_local = Some(local);
                    return true;
                }
                Err(_) => self.stats.malformed += 1,
            }
        }
        for (&group, socket) in &self.groups {
            match self.rx.fill(socket.as_raw_fd()) {
                Ok(0) => {}
                Ok(_) => {
                    self.rx_local = Some(group);
                    return true;
                }
                Err(_) => self.stats.malformed += 1,
            }
        }
        false
    }

    /// A packet another process sharing the port passed on, into
    /// `self.forwarded`; the inbox is read at every [`INBOX_EVERY`]th look
    /// that found the sockets empty.
    fn receive_forwarded(&mut self) -> Option<(SocketAddr, IpAddr, usize)> {
        let member = self.share.as_mut()?;
        self.empty_looks += 1;
        if self.empty_looks < INBOX_EVERY {
            return None;
        }
        self.empty_looks = 0;
        self.forwarded.resize(LARGEST_PACKET, 0);
        member.receive_forwarded(&mut self.forwarded)
    }

    /// The bytes of a packet [`UdpLink::next_packet`] returned.
    fn bytes(&self, held: &Held) -> &[u8] {
        held.bytes(&self.rx, &self.forwarded)
    }
}

/// Where a received packet's bytes are.
#[derive(Debug, Clone)]
enum Held {
    /// In the receive batch.
    Batch(Range<usize>),
    /// The first bytes of the forwarded-packet buffer.
    Forwarded(usize),
}

impl Held {
    fn bytes<'a>(&self, rx: &'a RecvBatch, forwarded: &'a [u8]) -> &'a [u8] {
        match self {
            Held::Batch(at) => rx.bytes(at.clone()),
            Held::Forwarded(len) => forwarded.get(..*len).unwrap_or_default(),
        }
    }
}

impl Drop for UdpLink {
    /// Leaves the port's group: packets already here for other members go
    /// on to them, and the steering is made right for the group without
    /// this link's sockets before they close.
    fn drop(&mut self) {
        let Some(member) = self.share.take() else { return };
        let (rx, sockets) = (&mut self.rx, &mut self.sockets);
        member.leave(|member| {
            loop {
                while let (Some((Some(src), at)), Some(local)) = (rx.pop(), self.rx_local) {
                    let roce = rx.bytes(at);
                    if let Some(owner) = member.owner_elsewhere(local, roce) {
                        member.forward(owner, src, local, roce);
                    }
                }
                let next = sockets.iter().find_map(|(&local, (socket, _))| {
                    rx.fill(socket.as_raw_fd()).is_ok_and(|n| n > 0).then_some(local)
                });
                match next {
                    Some(local) => self.rx_local = Some(local),
                    None => break,
                }
            }
            sockets.clear();
        });
    }
}

/// The UDP header of a datagram of `roce_len` bytes.
fn udp_header(source_port: u16, destination_port: u16, roce_len: usize) -> Option<[u8; 8]> {
    let length = u16::try_from(UdpHeader::LEN + roce_len).ok()?;
    Some(UdpHeader { source_port, destination_port, length, checksum: 0 }.to_bytes())
}

/// Refuses a packet the link cannot send (before it is queued, where the
/// ICRC computation could no longer fail): shorter than a BTH and an ICRC,
/// larger than a UDP datagram, or between IP versions.
fn check(src: IpAddr, dst: IpAddr, len: usize) -> io::Result<()> {
    let invalid = |what: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, what.to_string()));
    if len < MIN_PACKET {
        return invalid("packet too short");
    }
    if len > MAX_DATAGRAM {
        return invalid("packet too large");
    }
    if src.is_ipv4() != dst.is_ipv4() {
        return invalid("source and destination are of different IP versions");
    }
    Ok(())
}

/// The ICRC of a packet from `src` to `dst`, both on `port`, sent with IPv4
/// Identification `id` (ignored for IPv6); `roce` includes the ICRC's place.
/// With `lent` (IPv4 only), the payload from that offset on is the lent
/// bytes, and `roce` holds the rest.
fn icrc_of(
    cache: &mut icrc::PrefixCache,
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    roce: &[u8],
    id: u16,
    lent: Option<(usize, Lent)>,
) -> io::Result<u32> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
    let covered = roce.len().checked_sub(ICRC_LEN).ok_or_else(|| invalid("packet too short"))?;
    let icrc = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            // What the kernel sends: DF, and the ID of the packet's place.
            // The lengths follow from `roce` (too large: an error).
            let h = icrc::Ipv4Udp { src: s, dst: d, src_port: port, dst_port: port };
            match lent {
                None => icrc::compute_ipv4(cache, h, id, 0x40, &roce[..covered]),
                Some((at, payload)) => {
                    let end = at + payload.len();
                    if end > covered {
                        return Err(invalid("a lent payload over the ICRC's place"));
                    }
                    let parts = [&roce[..at], payload.bytes(), &roce[end..covered]];
                    icrc::compute_ipv4_parts(cache, h, id, 0x40, parts)
                }
            }
        }
        (IpAddr::V6(s), IpAddr::V6(d)) if lent.is_none() => {
            let udp = udp_header(port, port, roce.len()).ok_or_else(|| invalid("packet too large"))?;
            let ip = ipv6_header(s.octets(), d.octets(), UdpHeader::LEN + roce.len());
            icrc::compute(&ip, &udp, &roce[..covered])
        }
        (IpAddr::V6(_), IpAddr::V6(_)) => return Err(invalid("a lent payload over IPv6")),
        _ => return Err(invalid("source and destination are of different IP versions")),
    };
    icrc.map_err(|e| invalid(&e.to_string()))
}

/// The socket bound to `src` and its send batch. Most links have one
/// socket: it is taken without a search of the map, twice a packet (its
/// room, then its commit).
fn socket_at(
    sockets: &mut BTreeMap<IpAddr, (Arc<UdpSocket>, SendBatch)>,
    src: IpAddr,
) -> Option<&mut (Arc<UdpSocket>, SendBatch)> {
    if sockets.len() == 1 {
        sockets.iter_mut().next().filter(|(&local, _)| local == src).map(|(_, entry)| entry)
    } else {
        sockets.get_mut(&src)
    }
}

/// Sends what `batch` holds on `socket`, bound to `local`. A train the
/// kernel refuses leaves as single datagrams with ID 0, so the ICRCs of its
/// later packets change by what the ID did.
fn flush_batch(socket: &UdpSocket, batch: &mut SendBatch, local: IpAddr, stats: &mut LinkStats) -> io::Result<usize> {
    stats.send_batches += 1;
    batch.flush(socket.as_raw_fd(), &mut |_, roce, id| {
        // IPv6 has no ID; a packet has its ICRC's place.
        if local.is_ipv4() && roce.len() >= ICRC_LEN {
            // XOR keeps a deliberately broken ICRC broken.
            let at = roce.len() - ICRC_LEN;
            let old = u32::from_le_bytes([roce[at], roce[at + 1], roce[at + 2], roce[at + 3]]);
            roce[at..].copy_from_slice(&(old ^ icrc::ipv4_id_term(id, at)).to_le_bytes());
        }
    })
}

/// Counts a packet queued and fills in its ICRC `crc`, broken on purpose
/// every `corrupt_every`th packet; returns what it wrote.
fn seal(stats: &mut LinkStats, corrupt_every: u32, queued: &mut [u8], mut crc: u32) -> u32 {
    stats.sent += 1;
    if corrupt_every != 0 && stats.sent.is_multiple_of(u64::from(corrupt_every)) {
        crc ^= 1 << 24;
        stats.corrupted += 1;
    }
    // The ICRC was computed, so the packet holds an ICRC's place.
    let at = queued.len() - ICRC_LEN;
    queued[at..].copy_from_slice(&crc.to_le_bytes());
    crc
}

/// The error for a packet from an address the link has no socket for.
fn no_socket(addr: IpAddr) -> io::Error {
    io::Error::new(io::ErrorKind::AddrNotAvailable, format!("no socket bound to {addr}"))
}

/// Checks the ICRC of a datagram that arrived at `dst` on `port`, as well as
/// a UDP receiver can: the IPv4 ID it was sent with (0 for IPv6) if good.
fn icrc_check(cache: &mut icrc::PrefixCache, src: SocketAddr, dst: IpAddr, port: u16, roce: &[u8]) -> Option<u16> {
    match (src.ip(), dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = icrc::Ipv4Udp { src: s, dst: d, src_port: src.port(), dst_port: port };
            icrc::verify_ipv4_unknown_id_cached(cache, h, roce).ok().flatten()
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let udp = udp_header(src.port(), port, roce.len())?;
            let ip = ipv6_header(s.octets(), d.octets(), UdpHeader::LEN + roce.len());
            icrc::verify(&ip, &udp, roce).unwrap_or(false).then_some(0)
        }
        _ => None,
    }
}

/// An IPv6 header as the ICRC sees it (traffic class, flow label and hop
/// limit are masked, so zero will do).
fn ipv6_header(source: [u8; 16], destination: [u8; 16], udp_len: usize) -> [u8; 40] {
    Ipv6Header {
        traffic_class: 0,
        flow_label: Default::default(),
        payload_length: udp_len as u16,
        next_header: IpNumber::UDP,
        hop_limit: 0,
        source,
        destination,
    }
    .to_bytes()
}

impl Link for UdpLink {
    fn attach(&mut self, addr: IpAddr) -> io::Result<()> {
        self.bind(addr)
    }

    fn join_group(&mut self, group: IpAddr) -> io::Result<()> {
        UdpLink::join_group(self, group)
    }

    fn leave_group(&mut self, group: IpAddr) {
        UdpLink::leave_group(self, group);
    }

    fn transmit(&mut self, _now: Duration, out: Outgoing<'_>) -> io::Result<()> {
        check(out.src, out.dst, out.roce.len())?;
        let (socket, batch) = socket_at(&mut self.sockets, out.src).ok_or_else(|| no_socket(out.src))?;
        let dest = SocketAddr::new(out.dst, self.port);
        let mut flushed = Ok(0);
        let (copy, id) = match batch.push(dest, out.roce)? {
            Some(queued) => queued,
            None => {
                flushed = flush_batch(socket, batch, out.src, &mut self.stats);
                batch.push(dest, out.roce)?.ok_or_else(|| io::Error::other("an empty batch has no room"))?
            }
        };
        let crc = icrc_of(&mut self.tx_icrc, out.src, dest.ip(), dest.port(), copy, id, None)?;
        let crc = seal(&mut self.stats, self.corrupt_every, copy, crc);
        if let Some(capture) = &mut self.capture {
            capture.record(Direction::Sent, SocketAddr::new(out.src, self.port), dest, id, copy);
        }
        // The caller's bytes get the same ICRC.
        let at = out.roce.len() - ICRC_LEN;
        out.roce[at..].copy_from_slice(&crc.to_le_bytes());
        flushed.map(drop)
    }

    /// The batch of the socket at `src`. A full batch is sent first.
    fn send_buffer(&mut self, src: IpAddr, len: usize) -> Option<&mut [u8]> {
        let (socket, batch) = socket_at(&mut self.sockets, src)?;
        if batch.room(len).is_none() {
            // Errors mean dropped packets, which RC retransmits.
            let _ = flush_batch(socket, batch, src, &mut self.stats);
        }
        batch.room(len)
    }

    fn transmit_built(
        &mut self,
        _now: Duration,
        src: IpAddr,
        dst: IpAddr,
        _src_port: u16,
        len: usize,
        lent: Option<(usize, Lent)>,
    ) -> io::Result<()> {
        check(src, dst, len)?;
        let (_, batch) = socket_at(&mut self.sockets, src).ok_or_else(|| no_socket(src))?;
        let dest = SocketAddr::new(dst, self.port);
        // A capture records whole packets, and IPv6's ICRC is computed over
        // one slice: both take the payload copied into its place.
        let lent = match lent {
            Some((at, payload)) if self.capture.is_none() && dst.is_ipv4() => Some((at, payload)),
            Some((at, payload)) => {
                let place = batch.room(len).and_then(|room| room.get_mut(at..at + payload.len()));
                place
                    .ok_or_else(|| io::Error::other("no room was taken for the packet"))?
                    .copy_from_slice(payload.bytes());
                None
            }
            None => None,
        };
        let built = match lent {
            Some((at, payload)) => batch.commit_lent(dest, len, at, payload)?,
            None => batch.commit(dest, len)?,
        };
        let (queued, id) = built.ok_or_else(|| io::Error::other("no room was taken for the packet"))?;
        self.stats.lent += u64::from(lent.is_some());
        let crc = icrc_of(&mut self.tx_icrc, src, dst, dest.port(), queued, id, lent)?;
        seal(&mut self.stats, self.corrupt_every, queued, crc);
        if let Some(capture) = &mut self.capture {
            capture.record(Direction::Sent, SocketAddr::new(src, self.port), dest, id, queued);
        }
        Ok(())
    }

    fn flush(&mut self) {
        for (&local, (socket, batch)) in &mut self.sockets {
            if !batch.is_empty() {
                let _ = flush_batch(socket, batch, local, &mut self.stats);
            }
        }
        if let Some(capture) = &mut self.capture {
            capture.flush();
        }
    }

    fn receive(&mut self, now: Duration, buf: &mut [u8]) -> Option<Received> {
        let (r, held) = self.next_packet(now, buf.len())?;
        buf[..r.len].copy_from_slice(self.bytes(&held));
        Some(r)
    }

    fn receive_in_place<'a>(&'a mut self, now: Duration, _scratch: &'a mut [u8]) -> Option<(Received, &'a [u8])> {
        let (r, held) = self.next_packet(now, LARGEST_PACKET)?;
        Some((r, self.bytes(&held)))
    }

    fn amid_datagram(&self) -> bool {
        self.rx.amid_slot()
    }

    /// When held rdma_cm requests are next looked at, if any are held.
    fn next_event(&self) -> Option<Duration> {
        (!self.unclaimed.is_empty()).then_some(self.unclaimed_check)
    }

    fn local_addrs(&self) -> Vec<IpAddr> {
        self.sockets.keys().copied().collect()
    }

    fn raw_fds(&self) -> Vec<RawFd> {
        let inbox = self.share.as_ref().map(Member::inbox_fd);
        let groups = self.groups.values().map(UdpSocket::as_raw_fd);
        self.sockets.values().map(|(s, _)| s.as_raw_fd()).chain(groups).chain(inbox).collect()
    }

    fn stats(&self) -> LinkStats {
        self.stats
    }

    /// The smallest receive buffer of the link's sockets, as the kernel
    /// accounts it (twice what was granted, for its bookkeeping).
    fn receive_buffer(&self) -> Option<usize> {
        self.sockets.values().filter_map(|(socket, _)| receive_buffer_of(socket)).min()
    }
}

/// `SO_RCVBUF` of `socket`.
#[allow(unsafe_code)]
fn receive_buffer_of(socket: &UdpSocket) -> Option<usize> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket fd, and a c_int with its length for the kernel to fill.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then(|| usize::try_from(value).ok()).flatten()
}

/// A UDP port every address in `addrs` can bind right now: devices that
/// talk to each other share one RoCE port, so tests and demos that cannot
/// have 4791 need one free on all their addresses.
pub fn free_port(addrs: &[IpAddr]) -> io::Result<u16> {
    let (&first, rest) =
        addrs.split_first().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to probe"))?;
    loop {
        let probe = UdpSocket::bind((first, 0))?;
        let port = probe.local_addr()?.port();
        if rest.iter().all(|&addr| UdpSocket::bind((addr, port)).is_ok()) {
            return Ok(port);
        }
    }
}

/// The shortest packet: a BTH and an ICRC.
const MIN_PACKET: usize = 12 + ICRC_LEN;

/// The largest datagram taken for a packet: a 4096-byte payload with every
/// header has room to spare, as have jumbo frames. Anything larger is
/// malformed, not worth an ICRC check (a GRO slot could hold 64 KiB).
const LARGEST_PACKET: usize = 9216;

/// Bytes of socket buffer to ask for in each direction.
pub(crate) const SOCKET_BUFFER: usize = 8 << 20;

/// Sets a socket buffer size: the privileged option first (beyond
/// `net.core.rmem_max`), else the ordinary one, which the kernel caps. A
/// refusal leaves the default, which only costs throughput.
pub(crate) fn set_buffer(socket: &UdpSocket, forced: libc::c_int, plain: libc::c_int, bytes: libc::c_int) {
    if set_int_option(socket, libc::SOL_SOCKET, forced, bytes).is_err() {
        let _ = set_int_option(socket, libc::SOL_SOCKET, plain, bytes);
    }
}

/// `UDP_NO_CHECK6_RX` from linux/udp.h: accept zero UDP checksums over IPv6.
const UDP_NO_CHECK6_RX: libc::c_int = 102;

/// Sets `IP_MTU_DISCOVER` to `IP_PMTUDISC_DO`: DF on, and (for unconnected
/// sockets) IPv4 Identification 0.
pub(crate) fn set_pmtudisc_do(socket: &UdpSocket) -> io::Result<()> {
    set_int_option(socket, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
}

#[allow(unsafe_code)]
fn set_int_option(socket: &UdpSocket, level: libc::c_int, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid socket fd and a pointer to a c_int of the given size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
