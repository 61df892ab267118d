//! A deterministic, in-memory network with fault injection.
//!
//! [`SimNet`] is sans-IO: it has no clock and no sockets. The caller passes the
//! virtual time (a [`Duration`] since the simulation's epoch) to every call,
//! hands it packets with [`SimNet::send`], and takes them out, in delivery-time
//! order, with [`SimNet::poll_deliver`]; [`SimNet::next_delivery`] tells a
//! driver loop how far to advance its clock. Every random choice comes from one
//! seeded generator, so the same seed and the same sequence of calls give the
//! same run, bit for bit, on any platform and any version of this crate.
//!
//! Faults ([`Faults`]) are drop, duplicate, reorder, latency with jitter, and
//! corruption, set for the whole network and optionally per direction of a
//! link. An optional pcap capture records every packet as it is delivered.
//!
//! Memory is the caller's to bound: every packet in flight is held until it is
//! polled, so a driver that sends faster than it polls grows without limit.
//! [`SimNet::in_flight`] tells how many packets are held.

use std::cmp::Ordering;
use std::collections::binary_heap::PeekMut;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::io::{self, Write};
use std::net::IpAddr;
use std::ops::Range;
use std::time::Duration;

use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice, UdpHeader};

use super::{Link, LinkStats, Outgoing, Received};
use crate::capture::{CaptureError, IpPcapWriter};
use crate::wire::packet::{encapsulate, ip_header};
use crate::wire::{Packet, ROCE_UDP_PORT};

/// What can go wrong on a link, and how long a packet takes to cross it.
///
/// Rates are probabilities, drawn independently for every packet: 0 never,
/// 1 always (a rate above 1 acts as 1; below 0, or NaN, as 0). The default has
/// no faults and no latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Probability that a packet is lost.
    pub drop: f64,
    /// Probability that a packet that is not lost arrives twice. The copy
    /// travels on its own: its own jitter, reordering and corruption.
    pub duplicate: f64,
    /// Probability that a packet is held back by an extra delay, uniform in
    /// `[0, reorder_delay]`, so that packets sent after it can overtake it.
    /// Whether one does depends on the traffic: packets sent further apart than
    /// `reorder_delay` are not overtaken.
    pub reorder: f64,
    /// The longest a reordered packet is held back.
    pub reorder_delay: Duration,
    /// Probability that one random bit of a packet is flipped in flight.
    pub corrupt: f64,
    /// Where corruption may strike. When false (the default), only in bytes
    /// the ICRC covers after the IP and UDP headers (all of them but BTH byte 4,
    /// whose FECN, BECN and reserved bits it leaves out), so the packet stays
    /// routable and the receiver's ICRC check is what catches it: a CRC-32
    /// catches every single-bit error. When true, anywhere in the IP packet.
    /// Either way the packet is routed before it is corrupted, so it still
    /// reaches the endpoint it was sent to.
    pub corrupt_headers: bool,
    /// Fixed one-way latency of every packet.
    pub latency: Duration,
    /// Extra latency of every packet, uniform in `[0, jitter]`. Jitter alone
    /// never reorders: a link is FIFO, so a packet that is not reordered never
    /// arrives before one sent earlier in the same direction.
    pub jitter: Duration,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            // Has no effect until `reorder` is set, and then it should reorder.
            reorder_delay: Duration::from_micros(100),
            corrupt: 0.0,
            corrupt_headers: false,
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
        }
    }
}

/// Counts of what happened to packets, since the network was created.
///
/// Every sent packet is exactly one of undeliverable, dropped, or passed on;
/// a packet passed on is delivered once, or twice when duplicated, once it is
/// polled. Reordered and corrupted count copies, so a duplicate's copies count
/// separately.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets handed to [`SimNet::send`].
    pub sent: u64,
    /// Packets handed out by [`SimNet::poll_deliver`].
    pub delivered: u64,
    /// Packets lost to the `drop` fault.
    pub dropped: u64,
    /// Packets sent twice by the `duplicate` fault (counted once per packet).
    pub duplicated: u64,
    /// Copies held back by the `reorder` fault.
    pub reordered: u64,
    /// Copies with a bit flipped.
    pub corrupted: u64,
    /// Packets whose IP header is malformed or whose destination is not
    /// attached.
    pub undeliverable: u64,
}

/// A packet arriving at an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The endpoint it arrives at (its IP destination).
    pub to: IpAddr,
    /// Its arrival time, which may be earlier than the `now` it was polled at.
    pub at: Duration,
    /// The IP packet, as delivered (possibly corrupted).
    pub packet: Vec<u8>,
}

/// A deterministic in-memory network; see the [module documentation](self).
///
/// `W` is where the pcap capture goes, if there is one ([`SimNet::with_pcap`]).
pub struct SimNet<W: Write = io::Sink> {
    rng: SplitMix64,
    faults: Faults,
    endpoints: BTreeSet<IpAddr>,
    /// Per-direction state, keyed by (source, destination).
    links: BTreeMap<(IpAddr, IpAddr), Direction>,
    in_flight: BinaryHeap<InFlight>,
    /// Send order of the next copy scheduled; breaks ties in delivery time.
    next_seq: u64,
    stats: Stats,
    /// What the [`super::Link`] face of the network counted.
    link_stats: LinkStats,
    pcap: Option<IpPcapWriter<W>>,
    pcap_error: Option<CaptureError>,
}

/// One direction of a link between two endpoints.
#[derive(Debug, Default)]
struct Direction {
    /// Faults overriding the network's, set by [`SimNet::set_link_faults`].
    faults: Option<Faults>,
    /// Arrival time of the latest packet scheduled in FIFO order; no later
    /// packet that is not reordered arrives before it.
    fifo_tail: Duration,
}

impl SimNet {
    /// A network with no endpoints, whose random choices all derive from `seed`.
    pub fn new(seed: u64, faults: Faults) -> SimNet {
        SimNet {
            rng: SplitMix64(seed),
            faults,
            endpoints: BTreeSet::new(),
            links: BTreeMap::new(),
            in_flight: BinaryHeap::new(),
            next_seq: 0,
            stats: Stats::default(),
            link_stats: LinkStats::default(),
            pcap: None,
            pcap_error: None,
        }
    }

    /// Records every delivered packet, at its arrival time, to `pcap`.
    pub fn with_pcap<W: Write>(self, pcap: IpPcapWriter<W>) -> SimNet<W> {
        SimNet {
            rng: self.rng,
            faults: self.faults,
            endpoints: self.endpoints,
            links: self.links,
            in_flight: self.in_flight,
            next_seq: self.next_seq,
            stats: self.stats,
            link_stats: self.link_stats,
            pcap: Some(pcap),
            pcap_error: None,
        }
    }
}

impl<W: Write> SimNet<W> {
    /// Registers an endpoint; packets to addresses never attached are
    /// undeliverable.
    pub fn attach(&mut self, addr: IpAddr) {
        self.endpoints.insert(addr);
    }

    /// Overrides the network's faults for packets from `from` to `to` (one
    /// direction only), e.g. to lose only acknowledgements.
    pub fn set_link_faults(&mut self, from: IpAddr, to: IpAddr, faults: Faults) {
        self.links.entry((from, to)).or_default().faults = Some(faults);
    }

    /// Puts an IP packet on the wire at time `now`. Its destination is read
    /// from its IP header; a malformed header or an unattached destination
    /// makes it undeliverable. `now` should not go backwards between calls.
    pub fn send(&mut self, now: Duration, mut packet: Vec<u8>) {
        self.stats.sent += 1;
        let Some(route) = route(&packet).filter(|r| self.endpoints.contains(&r.to)) else {
            self.stats.undeliverable += 1;
            return;
        };
        let link = self.links.entry((route.from, route.to)).or_default();
        let faults = link.faults.unwrap_or(self.faults);
        if self.rng.chance(faults.drop) {
            self.stats.dropped += 1;
            return;
        }
        let copies = if self.rng.chance(faults.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for copy in 1..=copies {
            let mut packet = if copy < copies { packet.clone() } else { std::mem::take(&mut packet) };
            let mut at = now + faults.latency + self.rng.up_to(faults.jitter);
            if self.rng.chance(faults.reorder) {
                self.stats.reordered += 1;
                at += self.rng.up_to(faults.reorder_delay);
            } else {
                at = at.max(link.fifo_tail);
                link.fifo_tail = at;
            }
            if self.rng.chance(faults.corrupt) {
                if let Some((byte, bit)) = route.pick_bit(&mut self.rng, faults.corrupt_headers) {
                    packet[byte] ^= bit;
                    self.stats.corrupted += 1;
                }
            }
            self.in_flight.push(InFlight { at, seq: self.next_seq, to: route.to, packet });
            self.next_seq += 1;
        }
    }

    /// The next packet that has arrived by `now`: the earliest by arrival time,
    /// then by send order. Records it in the capture, if any.
    pub fn poll_deliver(&mut self, now: Duration) -> Option<Delivery> {
        let next = self.in_flight.peek_mut().filter(|p| p.at <= now)?;
        let InFlight { at, to, packet, .. } = PeekMut::pop(next);
        self.stats.delivered += 1;
        if let (Some(pcap), None) = (&mut self.pcap, &self.pcap_error) {
            self.pcap_error = pcap.write(at, &packet).err();
        }
        Some(Delivery { to, at, packet })
    }

    /// When the earliest packet in flight arrives, if any is in flight.
    pub fn next_delivery(&self) -> Option<Duration> {
        self.in_flight.peek().map(|p| p.at)
    }

    /// How many packets are in flight, i.e. sent but not yet polled.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// What the network has counted so far, faults included.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Ends the capture and returns its writer: `Ok(None)` without a capture,
    /// and the first write error if one stopped the capture early (nothing is
    /// recorded after it).
    pub fn into_pcap(self) -> Result<Option<W>, CaptureError> {
        match self.pcap_error {
            Some(e) => Err(e),
            None => Ok(self.pcap.map(IpPcapWriter::into_inner)),
        }
    }
}

/// Where a packet goes, read from its IP header.
struct Route {
    from: IpAddr,
    to: IpAddr,
    /// The bytes after the IP and UDP headers, up to the IP length (which may
    /// be shorter than the buffer).
    body: Range<usize>,
}

impl Route {
    /// Picks a bit to flip, as (byte offset, mask): anywhere in the IP packet
    /// when `headers`, otherwise in the body but not in BTH byte 4 (FECN, BECN
    /// and reserved bits), which the ICRC leaves out because switches may
    /// rewrite it. `None` when there is nothing to pick from.
    fn pick_bit(&self, rng: &mut SplitMix64, headers: bool) -> Option<(usize, u8)> {
        let (start, masked) = if headers { (0, None) } else { (self.body.start, Some(self.body.start + 4)) };
        let skip = masked.filter(|m| self.body.contains(m));
        let len = self.body.end - start - usize::from(skip.is_some());
        if len == 0 {
            return None;
        }
        let bit = rng.below(len as u64 * 8);
        let byte = start + (bit / 8) as usize;
        let byte = if skip.is_some_and(|m| byte >= m) { byte + 1 } else { byte };
        Some((byte, 1 << (bit % 8)))
    }
}

/// `None` when the IP header is malformed, or its length disagrees with the
/// buffer (shorter than the header, or longer than the bytes present).
fn route(packet: &[u8]) -> Option<Route> {
    let (from, to, header_len, ip_len) = match packet.first()? >> 4 {
        4 => {
            let h = Ipv4HeaderSlice::from_slice(packet).ok()?;
            let len = h.slice().len();
            (h.source_addr().into(), h.destination_addr().into(), len, usize::from(h.total_len()))
        }
        6 => {
            let h = Ipv6HeaderSlice::from_slice(packet).ok()?;
            let len = h.slice().len();
            let ip_len = len + usize::from(h.payload_length());
            (h.source_addr().into(), h.destination_addr().into(), len, ip_len)
        }
        _ => return None,
    };
    if ip_len < header_len || ip_len > packet.len() {
        return None;
    }
    let body_start = (header_len + UdpHeader::LEN).min(ip_len);
    Some(Route { from, to, body: body_start..ip_len })
}

/// A copy of a packet in flight, ordered so that the heap's top is the one
/// that arrives first (and, among equal arrival times, was sent first).
struct InFlight {
    at: Duration,
    seq: u64,
    to: IpAddr,
    packet: Vec<u8>,
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for InFlight {}

/// SplitMix64 (Steele, Lea and Flood, 2014): one word of state, good enough
/// statistically for fault injection, and written here rather than taken from
/// `rand` because `rand`'s `StdRng` does not promise the same output across
/// releases, and a seed must replay the same run forever. Public for the
/// other seeded choosers (`tools/soak`'s kills and patterns).
#[derive(Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next 32 random bits: the high half of [`Self::next_u64`].
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// True with probability `p`; draws once whatever `p` is.
    pub fn chance(&mut self, p: f64) -> bool {
        // The top 53 bits, as a float uniform in [0, 1).
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        unit < p
    }

    /// Uniform in `[0, n)` by multiply-and-shift; the bias, under n / 2^64, is
    /// far below anything a simulation can see.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, max]`, in nanoseconds.
    pub fn up_to(&mut self, max: Duration) -> Duration {
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.below(max.saturating_add(1)))
    }
}

/// The simulated network as an engine's link: it adds IP and UDP headers on
/// the way in, and checks the ICRC strictly on the way out (it has the whole
/// header), dropping and counting bad packets.
impl<W: Write> Link for SimNet<W> {
    fn attach(&mut self, addr: IpAddr) -> io::Result<()> {
        SimNet::attach(self, addr);
        Ok(())
    }

    fn transmit(&mut self, now: Duration, out: Outgoing<'_>) -> io::Result<()> {
        let udp = UdpHeader { source_port: out.src_port, destination_port: ROCE_UDP_PORT, length: 0, checksum: 0 };
        let packet = ip_header(out.src, out.dst)
            .and_then(|ip| encapsulate(&ip, &udp, out.roce))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.link_stats.sent += 1;
        self.send(now, packet);
        Ok(())
    }

    fn receive(&mut self, now: Duration, buf: &mut [u8]) -> Option<Received> {
        while let Some(delivery) = self.poll_deliver(now) {
            self.link_stats.received += 1;
            let Ok(pkt) = Packet::parse(&delivery.packet) else {
                self.link_stats.malformed += 1;
                continue;
            };
            if !pkt.icrc_ok() {
                self.link_stats.icrc_errors += 1;
                continue;
            }
            let bytes = pkt.bytes();
            let roce = &bytes[bytes.len() - usize::from(pkt.udp.length) + UdpHeader::LEN..];
            let Some(dest) = buf.get_mut(..roce.len()) else {
                self.link_stats.malformed += 1;
                continue;
            };
            dest.copy_from_slice(roce);
            let (src, dst) = (pkt.ip.source(), pkt.ip.destination());
            return Some(Received { src, src_port: pkt.udp.source_port, dst, len: roce.len() });
        }
        None
    }

    fn next_event(&self) -> Option<Duration> {
        self.next_delivery()
    }

    fn local_addrs(&self) -> Vec<IpAddr> {
        self.endpoints.iter().copied().collect()
    }

    fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        Vec::new()
    }

    fn stats(&self) -> LinkStats {
        self.link_stats
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::capture;
    use crate::wire::packet::build;
    use crate::wire::{BthRepr, Opcode, Operation, Packet, Psn, RoceRepr, Transport, ROCE_UDP_PORT};

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    /// IPv4 (no options) + UDP.
    const HEADERS_LEN: usize = 28;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// A RoCE send from `from` to `to` carrying `psn`, with a payload whose
    /// length varies with it.
    fn packet(from: IpAddr, to: IpAddr, psn: u32) -> Vec<u8> {
        let ip = ip_header(from, to).expect("same address family");
        let udp = UdpHeader { source_port: 0xc000, destination_port: ROCE_UDP_PORT, length: 0, checksum: 0 };
        let roce = RoceRepr::new(BthRepr {
            opcode: Opcode::new(Transport::Rc, Operation::SendOnly).unwrap(),
            solicited: false,
            mig_req: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: 0x11,
            ack_req: false,
            psn: Psn::new(psn),
        });
        build(&ip, &udp, &roce, &vec![0x5a; psn as usize % 64]).unwrap()
    }

    fn psn(packet: &[u8]) -> u32 {
        Packet::parse(packet).unwrap().roce.header.bth.psn.value()
    }

    /// A network with endpoints A and B attached.
    fn net_ab(seed: u64, faults: Faults) -> SimNet {
        let mut net = SimNet::new(seed, faults);
        net.attach(A);
        net.attach(B);
        net
    }

    /// Sends `n` packets A → B, one every microsecond, polling as the clock
    /// advances, then drains the network.
    fn run<W: Write>(net: &mut SimNet<W>, n: u32) -> Vec<Delivery> {
        let mut out = Vec::new();
        for i in 0..n {
            let now = us(u64::from(i));
            out.extend(std::iter::from_fn(|| net.poll_deliver(now)));
            net.send(now, packet(A, B, i));
        }
        while let Some(at) = net.next_delivery() {
            out.extend(std::iter::from_fn(|| net.poll_deliver(at)));
        }
        out
    }

    #[test]
    fn splitmix64_reference_output() {
        let mut rng = SplitMix64(1234567);
        let out: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            out,
            [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821]
        );
    }

    #[test]
    fn no_faults_delivers_in_order_after_latency() {
        let mut net = net_ab(1, Faults { latency: us(10), ..Faults::default() });
        for i in 0..100 {
            net.send(us(i), packet(A, B, i as u32));
            net.send(us(i), packet(B, A, i as u32));
        }
        assert_eq!(net.next_delivery(), Some(us(10)));
        assert_eq!(net.poll_deliver(us(9)), None);
        for i in 0..100 {
            for to in [B, A] {
                let d = net.poll_deliver(us(i + 10)).unwrap();
                assert_eq!((d.to, d.at, psn(&d.packet)), (to, us(i + 10), i as u32));
                assert_eq!(d.packet, packet(if to == B { A } else { B }, to, i as u32));
            }
            assert_eq!(net.poll_deliver(us(i + 10)), None);
        }
        assert_eq!(net.next_delivery(), None);
        let expected = Stats { sent: 200, delivered: 200, ..Stats::default() };
        assert_eq!(net.stats(), &expected);
    }

    #[test]
    fn ipv6_endpoints() {
        let (a, b) = (IpAddr::V6(Ipv6Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::from(2)));
        let mut net = SimNet::new(1, Faults::default());
        net.attach(b);
        net.send(Duration::ZERO, packet(a, b, 7));
        let d = net.poll_deliver(Duration::ZERO).unwrap();
        assert_eq!((d.to, psn(&d.packet)), (b, 7));
    }

    #[test]
    fn undeliverable_packets() {
        let mut net = SimNet::new(1, Faults::default());
        net.attach(A);
        net.send(Duration::ZERO, packet(B, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)), 1));
        net.send(Duration::ZERO, Vec::new());
        net.send(Duration::ZERO, vec![0x45; 60]);
        net.send(Duration::ZERO, packet(B, A, 1)[..40].to_vec()); // truncated
        assert_eq!(net.stats().undeliverable, 4);
        assert_eq!(net.in_flight(), 0);
        net.send(Duration::ZERO, packet(B, A, 1));
        assert_eq!(net.stats().undeliverable, 4);
        assert_eq!(net.poll_deliver(Duration::ZERO).unwrap().to, A);
    }

    #[test]
    fn drop_all_or_none() {
        let mut net = net_ab(1, Faults { drop: 1.0, ..Faults::default() });
        assert!(run(&mut net, 500).is_empty());
        assert_eq!((net.stats().sent, net.stats().dropped), (500, 500));

        let mut net = net_ab(1, Faults { drop: 0.0, ..Faults::default() });
        assert_eq!(run(&mut net, 500).len(), 500);
        assert_eq!(net.stats().dropped, 0);
    }

    #[test]
    fn drop_rate_is_approximately_right() {
        let mut net = net_ab(7, Faults { drop: 0.1, ..Faults::default() });
        let delivered = run(&mut net, 10_000).len() as u64;
        let dropped = net.stats().dropped;
        // Binomial(10000, 0.1): σ = 30.
        assert!((900..=1100).contains(&dropped), "dropped {dropped}");
        assert_eq!(delivered + dropped, 10_000);
    }

    #[test]
    fn duplicate_all() {
        let mut net = net_ab(1, Faults { duplicate: 1.0, ..Faults::default() });
        let psns: Vec<u32> = run(&mut net, 300).iter().map(|d| psn(&d.packet)).collect();
        let expected: Vec<u32> = (0..300).flat_map(|i| [i, i]).collect();
        assert_eq!(psns, expected);
        assert_eq!((net.stats().duplicated, net.stats().delivered), (300, 600));
    }

    #[test]
    fn reorder_half() {
        let faults = Faults { reorder: 0.5, reorder_delay: us(50), latency: us(10), ..Faults::default() };
        let mut net = net_ab(3, faults);
        let psns: Vec<u32> = run(&mut net, 1000).iter().map(|d| psn(&d.packet)).collect();
        let overtaken = psns.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(overtaken > 100, "only {overtaken} packets overtaken");
        let mut sorted = psns.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        let reordered = net.stats().reordered;
        assert!((400..=600).contains(&reordered), "reordered {reordered}");
    }

    #[test]
    fn jitter_keeps_fifo_order() {
        let faults = Faults { latency: us(5), jitter: us(20), ..Faults::default() };
        let mut net = net_ab(5, faults);
        let deliveries = run(&mut net, 1000);
        let psns: Vec<u32> = deliveries.iter().map(|d| psn(&d.packet)).collect();
        assert_eq!(psns, (0..1000).collect::<Vec<_>>());
        let delays: BTreeSet<Duration> = deliveries.iter().map(|d| d.at - us(u64::from(psn(&d.packet)))).collect();
        assert!(delays.len() > 100, "jitter had little effect");
        assert!(*delays.first().unwrap() >= us(5));
    }

    #[test]
    fn corrupt_all_is_caught_by_icrc_not_ip() {
        let mut net = net_ab(9, Faults { corrupt: 1.0, ..Faults::default() });
        let deliveries = run(&mut net, 500);
        assert_eq!(deliveries.len(), 500);
        assert_eq!(net.stats().corrupted, 500);
        // Without reordering or jitter, packets arrive in the order sent.
        for (i, d) in deliveries.iter().enumerate() {
            let original = packet(A, B, i as u32);
            assert_eq!(flipped_bits(&original, &d.packet), 1);
            assert_eq!(d.packet[..HEADERS_LEN], original[..HEADERS_LEN]);
            assert!(!Packet::parse(&d.packet).is_ok_and(|p| p.icrc_ok()));
        }
    }

    #[test]
    fn corrupt_headers_reaches_the_headers() {
        let faults = Faults { corrupt: 1.0, corrupt_headers: true, ..Faults::default() };
        let mut net = net_ab(9, faults);
        let mut in_headers = 0;
        for (i, d) in run(&mut net, 500).iter().enumerate() {
            let original = packet(A, B, i as u32);
            assert_eq!(flipped_bits(&original, &d.packet), 1);
            in_headers += usize::from(d.packet[..HEADERS_LEN] != original[..HEADERS_LEN]);
        }
        // 28 of the 40 to 116 bytes of these packets are headers.
        assert!(in_headers > 50, "only {in_headers} flips in the headers");
    }

    fn flipped_bits(a: &[u8], b: &[u8]) -> u32 {
        a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
    }

    #[test]
    fn link_faults_apply_to_one_direction() {
        let mut net = net_ab(1, Faults::default());
        net.set_link_faults(A, B, Faults { drop: 1.0, ..Faults::default() });
        for i in 0..10 {
            net.send(us(i), packet(A, B, i as u32));
            net.send(us(i), packet(B, A, i as u32));
        }
        let tos: Vec<IpAddr> = std::iter::from_fn(|| net.poll_deliver(us(10))).map(|d| d.to).collect();
        assert_eq!(tos, [A; 10]);
        assert_eq!(net.stats().dropped, 10);
    }

    /// A run with every fault, in both directions, captured to pcap.
    fn faulty_run(seed: u64) -> (Vec<Delivery>, Stats, Vec<u8>) {
        let faults = Faults {
            drop: 0.1,
            duplicate: 0.1,
            reorder: 0.2,
            reorder_delay: us(30),
            corrupt: 0.1,
            corrupt_headers: false,
            latency: us(10),
            jitter: us(5),
        };
        let pcap = capture::IpPcapWriter::new(Vec::new()).unwrap();
        let mut net = net_ab(seed, faults).with_pcap(pcap);
        let mut out = run(&mut net, 300);
        for i in 0..300 {
            net.send(us(400 + i), packet(B, A, i as u32));
        }
        out.extend(std::iter::from_fn(|| net.poll_deliver(Duration::MAX)));
        let stats = net.stats().clone();
        (out, stats, net.into_pcap().unwrap().unwrap())
    }

    #[test]
    fn same_seed_same_run() {
        let first = faulty_run(42);
        assert_eq!(first, faulty_run(42));
        let other = faulty_run(43);
        assert_ne!(first.0, other.0);
        assert_ne!(first.1, other.1);
        assert_ne!(first.2, other.2);
    }

    #[test]
    fn pcap_records_deliveries() {
        let (deliveries, stats, pcap) = faulty_run(42);
        assert!(stats.dropped > 0 && stats.duplicated > 0 && stats.corrupted > 0);
        let (frames, err) = capture::read(&pcap);
        assert_eq!(err, None);
        assert_eq!(frames.len(), deliveries.len());
        assert_eq!(stats.delivered, deliveries.len() as u64);
        let mut icrc_ok = 0;
        for (frame, d) in frames.iter().zip(&deliveries) {
            // The capture keeps the virtual time to the nanosecond.
            assert_eq!(frame.timestamp, d.at);
            let ip = capture::ip_bytes(frame.link, &frame.data).unwrap();
            assert_eq!(ip, d.packet);
            if let Ok(p) = Packet::parse(ip) {
                icrc_ok += usize::from(p.icrc_ok());
            }
        }
        assert_eq!(icrc_ok as u64, stats.delivered - stats.corrupted);
    }
}
