//! Hostile peers for the tests that attack softroce:
//!
//! - [`Target`]: one QP under the sans-IO interface, with its memory, fed
//!   packets built by hand with `RoceRepr` — exact control over every field;
//! - [`FakePeer`]: a UDP socket that crafts RoCE packets (with a correct
//!   ICRC, which is no secret) for a real context and reads what comes back;
//! - [`Rng`]: a small deterministic generator for an attacker's guesses.

// Each test crate uses its own part of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use softroce::transport::*;
use softroce::verbs::{Endpoint, Gid};
use softroce::wire::{
    icrc, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, Headers, Opcode, Operation, Psn,
    RethRepr, RoceRepr, Syndrome, Transport, ROCE_UDP_PORT,
};

// ---------------------------------------------------------------------------
// The sans-IO target.
// ---------------------------------------------------------------------------

/// The QP under attack lives at LOCAL, its connected peer at PEER.
pub const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
pub const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
/// An off-path attacker: any address but the peer's.
pub const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 66));
pub const QPN: u32 = 0x11;
pub const PEER_QPN: u32 = 0x22;
pub const PD: u32 = 1;
pub const MTU: usize = 1024;
pub const QKEY: u32 = 0x1111_1111;
/// The target's memory region, granting every access.
pub const KEY: u32 = 0x5eed_0001;
pub const VA: u64 = 0x10_0000;
pub const REGION_LEN: usize = 64 * 1024;
/// Where receive buffers go in the region.
pub const RECV_AT: u64 = 0x8000;
/// The PSN the target expects first, and the first it sends.
pub const RQ_PSN: u32 = 0x12_3456;
pub const SQ_PSN: u32 = 0xab_cdef;
pub const MAX_DEST_RD_ATOMIC: u8 = 4;
pub const MIN_RNR_TIMER: u8 = 12;
/// The only positive ACK syndrome rxe sends (credits invalid).
pub const ACK: Syndrome = Syndrome::Ack { credits: 0x1f };

/// RC attributes granting every remote access.
pub fn attr() -> QpAttr {
    QpAttr {
        access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        path_mtu: Mtu::Mtu1024,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: MIN_RNR_TIMER,
        max_rd_atomic: 4,
        max_dest_rd_atomic: MAX_DEST_RD_ATOMIC,
        qkey: QKEY,
        ..QpAttr::default()
    }
}

/// A packet the target put on the wire (or a context sent a fake peer), parsed back.
#[derive(Debug, Clone)]
pub struct Sent {
    pub dest: IpAddr,
    pub header: RoceRepr,
    pub payload: Vec<u8>,
}

impl Sent {
    pub fn op(&self) -> Operation {
        self.header.bth.opcode.operation()
    }

    pub fn psn(&self) -> u32 {
        self.header.bth.psn.value()
    }

    pub fn syndrome(&self) -> Syndrome {
        self.header.aeth.unwrap_or_else(|| panic!("no AETH in {self:?}")).syndrome
    }

    pub fn msn(&self) -> u32 {
        self.header.aeth.unwrap_or_else(|| panic!("no AETH in {self:?}")).msn
    }
}

/// (opcode, PSN) of each packet.
pub fn shape(sent: &[Sent]) -> Vec<(Operation, u32)> {
    sent.iter().map(|s| (s.op(), s.psn())).collect()
}

/// Every region of a memory, by key, to compare byte for byte.
pub type Snapshot = BTreeMap<u32, Region>;

/// A QP in RTS with its memory and a clock, driven by hand.
pub struct Target {
    pub qp: Qp,
    pub mem: MemoryTable,
    pub now: Duration,
    keys: Vec<u32>,
    buf: Vec<u8>,
}

impl Target {
    /// An RC QP connected to PEER with [`attr`], and the region [`KEY`]
    /// holding a pattern (not zeros, so a write of zeros shows too).
    pub fn rc() -> Target {
        Target::new(QpType::Rc, attr(), SQ_PSN, RQ_PSN)
    }

    /// A QP of `qp_type` connected to PEER with `attr` and the given PSNs,
    /// and the region [`KEY`].
    pub fn new(qp_type: QpType, attr: QpAttr, sq_psn: u32, rq_psn: u32) -> Target {
        let mut target = Target::bare(qp_type, attr, sq_psn, rq_psn);
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        target.register(KEY, Region { pd: PD, addr: VA, access, data: pattern(REGION_LEN, 0x5a) });
        target
    }

    /// The same QP without memory.
    pub fn bare(qp_type: QpType, attr: QpAttr, sq_psn: u32, rq_psn: u32) -> Target {
        let mut qp = Qp::new(QPN, qp_type, PD, QpCap::default(), None);
        let at =
            QpAttr { dest: Some(PEER), dest_qpn: PEER_QPN, rq_psn: Psn::new(rq_psn), sq_psn: Psn::new(sq_psn), ..attr };
        qp.connect(&at).unwrap();
        Target { qp, mem: MemoryTable::new(), now: Duration::from_secs(1), keys: Vec::new(), buf: vec![0; 4096 + 64] }
    }

    /// Registers one more region.
    pub fn register(&mut self, key: u32, region: Region) {
        self.mem.register(key, region);
        self.keys.push(key);
    }

    /// Hands the QP a packet from its peer.
    pub fn feed(&mut self, header: RoceRepr, payload: &[u8]) {
        self.feed_from(PEER, header, payload);
    }

    /// Hands the QP a packet that claims to come from `src`.
    pub fn feed_from(&mut self, src: IpAddr, header: RoceRepr, payload: &[u8]) {
        let pkt = Incoming { src, src_port: ROCE_UDP_PORT, dst: LOCAL, header: &header, payload };
        self.qp.handle_packet(self.now, pkt, &mut self.mem, None);
    }

    /// Every packet the QP has to send now.
    pub fn transmit(&mut self) -> Vec<Sent> {
        std::iter::from_fn(|| self.transmit_one()).collect()
    }

    /// The next packet the QP has to send, if any.
    pub fn transmit_one(&mut self) -> Option<Sent> {
        let tx = self.qp.poll_transmit(self.now, &self.mem, &mut self.buf, TransmitOrder::ResponsesFirst)?;
        let parsed = RoceRepr::parse(&self.buf[..tx.len]).expect("the QP emits valid packets");
        Some(Sent { dest: tx.dest, header: parsed.header, payload: parsed.payload.to_vec() })
    }

    pub fn completions(&mut self) -> Vec<(CqKind, WorkCompletion)> {
        std::iter::from_fn(|| self.qp.poll_completion()).collect()
    }

    pub fn events(&mut self) -> Vec<AsyncEvent> {
        std::iter::from_fn(|| self.qp.poll_event()).collect()
    }

    /// Posts a receive of `len` bytes at [`RECV_AT`] + `offset` in the region.
    pub fn post_recv(&mut self, wr_id: u64, offset: u64, len: u32) {
        let sge = Sge { addr: VA + RECV_AT + offset, length: len, lkey: KEY };
        self.qp.post_recv(RecvWr { wr_id, sg_list: vec![sge] }).unwrap();
    }

    /// `len` bytes of the region at `offset`.
    pub fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let at = offset as usize;
        self.mem.region(KEY).expect("the region is registered").data[at..at + len].to_vec()
    }

    /// Every registered region, for [`Target::assert_memory_is`].
    pub fn snapshot(&self) -> Snapshot {
        self.keys.iter().filter_map(|&k| self.mem.region(k).map(|r| (k, r.clone()))).collect()
    }

    /// Asserts that memory is byte for byte `expected`, naming the first
    /// difference (regions are too large to print) and `what` did it.
    pub fn assert_memory_is(&self, expected: &Snapshot, what: &str) {
        let now = self.snapshot();
        assert_eq!(
            now.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{what}: registered keys changed"
        );
        for (key, region) in expected {
            let actual = &now[key];
            assert_eq!((actual.pd, actual.addr, actual.access), (region.pd, region.addr, region.access), "{what}");
            if let Some(i) = (0..region.data.len()).find(|&i| actual.data[i] != region.data[i]) {
                panic!(
                    "{what}: byte {i} of region {key:#x} changed: {:#04x} -> {:#04x}",
                    region.data[i], actual.data[i]
                );
            }
        }
    }
}

/// `len` bytes that differ from one `seed` to the next and do not repeat every 256.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(0x9e37_79b1) >> 24) as u8).collect()
}

/// A packet to [`QPN`] with only a BTH; add the other headers with [`Build`].
pub fn packet(transport: Transport, operation: Operation, psn: u32) -> RoceRepr {
    let opcode = Opcode::new(transport, operation).expect("operation valid for the transport");
    RoceRepr::new(bth(opcode, QPN, psn))
}

/// An RC packet to [`QPN`] with only a BTH.
pub fn rc(operation: Operation, psn: u32) -> RoceRepr {
    packet(Transport::Rc, operation, psn)
}

/// The packet of `opcode` to `dest_qpn` at `psn` with every extended header
/// it calls for, aimed at the target's region: RETH and AtomicETH at [`VA`]
/// with [`KEY`] (RETH length `len`), a positive AETH, DETH with [`QKEY`].
pub fn complete(opcode: Opcode, dest_qpn: u32, psn: u32, len: u32) -> RoceRepr {
    let headers = opcode.headers();
    let mut repr = RoceRepr::new(BthRepr { ack_req: true, ..bth(opcode, dest_qpn, psn) });
    let has = |h| headers.contains(h);
    repr.deth = has(Headers::DETH).then_some(DethRepr { qkey: QKEY, src_qpn: PEER_QPN });
    repr.feth = has(Headers::FETH).then_some(FethRepr { selectivity: 0, placement_type: 1 });
    repr.reth = has(Headers::RETH).then_some(RethRepr { va: VA, rkey: KEY, dma_len: len });
    repr.aeth = has(Headers::AETH).then_some(AethRepr { syndrome: ACK, msn: 0 });
    repr.atomic_eth = has(Headers::ATOMIC_ETH).then_some(AtomicEthRepr { va: VA, rkey: KEY, swap_add: 1, compare: 0 });
    repr.atomic_ack_eth = has(Headers::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr { original: 0 });
    repr.imm = has(Headers::IMM).then_some(0x1234_5678);
    repr.ieth = has(Headers::IETH).then_some(KEY ^ 0xffff);
    repr
}

pub use crate::roce_build::{bth, Build};

// ---------------------------------------------------------------------------
// A fake peer on a UDP socket, for real contexts.
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// The attacker's guesses.
// ---------------------------------------------------------------------------

/// SplitMix64: fast, deterministic, good enough for an attacker's guesses
/// (whose only requirement is independence from the secrets guessed).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A PSN: 24 random bits.
    pub fn psn(&mut self) -> u32 {
        self.next_u32() & 0x00ff_ffff
    }
}
