//! One QP under the sans-IO interface, for the transport scenarios and the
//! hostile-peer suite: requests and responses built by hand with `RoceRepr`
//! are fed to `Qp::handle_packet`, and what comes out of `poll_transmit` is
//! parsed back and checked field by field, together with completions,
//! events, timer deadlines, the QP state and every byte of memory. No
//! network is involved.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softroce::transport::*;
use softroce::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, Headers, NakCode, Opcode, Operation, Psn,
    RethRepr, RoceRepr, Syndrome, Transport, ROCE_UDP_PORT,
};

pub use super::roce::{bth, Build};

/// The QP under test lives at LOCAL, its connected peer at PEER.
pub const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
pub const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
pub const QPN: u32 = 0x11;
pub const PEER_QPN: u32 = 0x22;
pub const PD: u32 = 1;
pub const MTU: usize = 1024;
pub const QKEY: u32 = 0x1111_1111;
/// The QP's memory region, granting every access.
pub const KEY: u32 = 0x5eed_0001;
pub const VA: u64 = 0x10_0000;
/// Room for a WRITE of 200 packets.
pub const REGION_LEN: usize = 256 * 1024;
/// The first PSN the QP expects, and the first it sends: far from 0 and
/// from each other, with high bits set.
pub const RQ_PSN: u32 = 0x12_3456;
pub const SQ_PSN: u32 = 0xab_cdef;
/// Where the peer's memory is, for requests the QP sends.
pub const REMOTE_VA: u64 = 0x7700_0000;
pub const RKEY: u32 = 0x99;
pub const MAX_DEST_RD_ATOMIC: u8 = 4;
/// The code [`attr`] advertises in RNR NAKs.
pub const MIN_RNR_TIMER: u8 = 12;
/// [`attr`]'s local ACK timeout: 4.096 µs × 2^12, above the requester's
/// 16 ms floor (rxe-spec T-32).
pub const ACK_TIMEOUT: Duration = Duration::from_nanos(4096 << 12);
/// The only positive ACK syndrome rxe sends (0x1f: credits invalid).
pub const ACK: Syndrome = Syndrome::Ack { credits: 0x1f };

/// RC attributes granting every remote access.
pub fn attr() -> QpAttr {
    QpAttr {
        access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        path_mtu: Mtu::Mtu1024,
        timeout: 12,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: MIN_RNR_TIMER,
        max_rd_atomic: 4,
        max_dest_rd_atomic: MAX_DEST_RD_ATOMIC,
        qkey: QKEY,
        ..QpAttr::default()
    }
}

/// A packet the QP put on the wire (or a context sent a fake peer), parsed back.
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

    pub fn ack_req(&self) -> bool {
        self.header.bth.ack_req
    }

    pub fn aeth(&self) -> AethRepr {
        self.header.aeth.unwrap_or_else(|| panic!("no AETH in {self:?}"))
    }

    pub fn syndrome(&self) -> Syndrome {
        self.aeth().syndrome
    }

    pub fn msn(&self) -> u32 {
        self.aeth().msn
    }

    pub fn reth(&self) -> RethRepr {
        self.header.reth.unwrap_or_else(|| panic!("no RETH in {self:?}"))
    }
}

/// (opcode, PSN) of each packet.
pub fn op_psn(sent: &[Sent]) -> Vec<(Operation, u32)> {
    sent.iter().map(|s| (s.op(), s.psn())).collect()
}

/// (opcode, PSN, AckReq) of each packet.
pub fn op_psn_ack_req(sent: &[Sent]) -> Vec<(Operation, u32, bool)> {
    sent.iter().map(|s| (s.op(), s.psn(), s.ack_req())).collect()
}

/// (queue, wr_id, status, opcode) of each completion.
pub fn summary(wcs: &[(CqKind, WorkCompletion)]) -> Vec<(CqKind, u64, WcStatus, WcOpcode)> {
    wcs.iter().map(|(cq, wc)| (*cq, wc.wr_id, wc.status, wc.opcode)).collect()
}

/// Checks that `sent` is exactly one ACK/NAK to the peer with this PSN, syndrome and MSN.
pub fn assert_one_ack(sent: &[Sent], psn: u32, syndrome: Syndrome, msn: u32) {
    assert_eq!(sent.len(), 1, "expected one ACK, got {sent:#?}");
    let ack = &sent[0];
    assert_eq!(ack.op(), Operation::Acknowledge);
    assert_eq!(ack.psn(), psn);
    assert_eq!(ack.aeth(), AethRepr { syndrome, msn });
    assert_eq!(ack.header.bth.dest_qpn, PEER_QPN);
    assert_eq!(ack.dest, PEER);
    assert!(!ack.ack_req());
}

/// Every region of a memory, by key, to compare byte for byte.
pub type Snapshot = BTreeMap<u32, Region>;

/// A QP connected to PEER with its memory and a clock, driven by hand.
pub struct TestQp {
    pub qp: Qp,
    pub mem: MemoryTable,
    pub now: Duration,
    keys: Vec<u32>,
    buf: Vec<u8>,
}

impl TestQp {
    /// An RC QP in RTS with [`attr`].
    pub fn rc() -> TestQp {
        TestQp::new(QpType::Rc, attr())
    }

    pub fn new(qp_type: QpType, attr: QpAttr) -> TestQp {
        TestQp::with_psns(qp_type, attr, SQ_PSN, RQ_PSN)
    }

    pub fn with_psns(qp_type: QpType, attr: QpAttr, sq_psn: u32, rq_psn: u32) -> TestQp {
        TestQp::with_cap(qp_type, attr, sq_psn, rq_psn, QpCap::default())
    }

    /// A QP of `qp_type` in RTS with `attr`, the given PSNs and capacities,
    /// and the region [`KEY`] of zeros.
    pub fn with_cap(qp_type: QpType, attr: QpAttr, sq_psn: u32, rq_psn: u32, cap: QpCap) -> TestQp {
        let mut t = TestQp::bare(qp_type, attr, sq_psn, rq_psn, cap);
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        t.register(KEY, Region { pd: PD, addr: VA, access, data: vec![0; REGION_LEN] });
        t
    }

    /// The same QP without memory.
    pub fn bare(qp_type: QpType, attr: QpAttr, sq_psn: u32, rq_psn: u32, cap: QpCap) -> TestQp {
        let mut qp = Qp::new(QPN, qp_type, PD, cap, None);
        let at =
            QpAttr { dest: Some(PEER), dest_qpn: PEER_QPN, rq_psn: Psn::new(rq_psn), sq_psn: Psn::new(sq_psn), ..attr };
        qp.connect(&at).unwrap();
        TestQp { qp, mem: MemoryTable::new(), now: Duration::from_secs(1), keys: Vec::new(), buf: vec![0; 4096 + 64] }
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
        let tx = self.qp.poll_transmit(self.now, &mut self.mem, &mut self.buf, TransmitOrder::ResponsesFirst)?;
        let parsed = RoceRepr::parse(&self.buf[..tx.len]).expect("the QP emits valid packets");
        Some(Sent { dest: tx.dest, header: parsed.header, payload: parsed.payload.to_vec() })
    }

    pub fn completions(&mut self) -> Vec<(CqKind, WorkCompletion)> {
        std::iter::from_fn(|| self.qp.poll_completion()).collect()
    }

    pub fn events(&mut self) -> Vec<AsyncEvent> {
        std::iter::from_fn(|| self.qp.poll_event()).collect()
    }

    /// Moves the clock to `t` and lets the QP's timers fire.
    pub fn advance_to(&mut self, t: Duration) {
        self.now = t;
        self.qp.handle_timeout(t);
    }

    /// Moves the clock to the QP's next deadline and lets it fire.
    pub fn expire(&mut self) {
        let t = self.qp.poll_timeout().expect("a timer is running");
        self.advance_to(t);
    }

    pub fn post_send(&mut self, wr: SendWr) {
        self.qp.post_send(wr).unwrap();
    }

    /// Posts a receive of `len` bytes at `offset` in the region.
    pub fn post_recv(&mut self, wr_id: u64, offset: u64, len: u32) {
        self.qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![sge(offset, len)] }).unwrap();
    }

    /// `len` bytes of the region at `offset`.
    pub fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let at = offset as usize;
        self.mem.region(KEY).expect("the region is registered").data[at..at + len].to_vec()
    }

    /// Writes `data` into the region at `offset`.
    pub fn fill(&mut self, offset: u64, data: &[u8]) {
        let at = offset as usize;
        self.mem.region_mut(KEY).expect("the region is registered").data[at..at + data.len()].copy_from_slice(data);
    }

    /// Every registered region, for [`TestQp::assert_memory_is`].
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
            // Compared whole first: a debug build's byte loop is slow.
            if actual.data == region.data {
                continue;
            }
            if let Some(i) = (0..region.data.len()).find(|&i| actual.data[i] != region.data[i]) {
                panic!(
                    "{what}: byte {i} of region {key:#x} changed: {:#04x} -> {:#04x}",
                    region.data[i], actual.data[i]
                );
            }
        }
    }
}

/// `length` bytes at `offset` in the QP's region.
pub fn sge(offset: u64, length: u32) -> Sge {
    Sge { addr: VA + offset, length, lkey: KEY }
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

pub fn ack(psn: u32) -> RoceRepr {
    rc(Operation::Acknowledge, psn).aeth(ACK, 0)
}

pub fn nak(psn: u32, code: NakCode) -> RoceRepr {
    rc(Operation::Acknowledge, psn).aeth(Syndrome::Nak(code), 0)
}

pub fn rnr_nak(psn: u32, timer: u8) -> RoceRepr {
    rc(Operation::Acknowledge, psn).aeth(Syndrome::RnrNak { timer }, 0)
}

pub fn read_response(operation: Operation, psn: u32) -> RoceRepr {
    let repr = rc(operation, psn);
    if operation == Operation::ReadResponseMiddle {
        repr
    } else {
        repr.aeth(ACK, 0)
    }
}

pub fn atomic_ack(psn: u32, original: u64) -> RoceRepr {
    let mut repr = rc(Operation::AtomicAcknowledge, psn).aeth(ACK, 0);
    repr.atomic_ack_eth = Some(AtomicAckEthRepr { original });
    repr
}

/// The packet of `opcode` to `dest_qpn` at `psn` with every extended header
/// it calls for, aimed at the QP's region: RETH and AtomicETH at [`VA`]
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
