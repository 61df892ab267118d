//! End-to-end message tests of RC, UC and UD queue pairs over the simulated
//! network, without faults: every opcode, message sizes around the MTU and
//! beyond, every MTU, scatter/gather lists on both sides, inline, unsignaled
//! and solicited sends, Q_Keys, a shared receive queue, IPv6.
//!
//! Each case checks every completion on both hosts field by field, and every
//! byte of every registered region against a model: the bytes the operation
//! moved are where they belong and nothing else changed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use softroce::engine::SimWorld;
use softroce::net::{Faults, SimNet};
use softroce::transport::*;
use softroce::wire::Psn;

use crate::support::Rng;

const MTUS: [Mtu; 5] = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096];
const A: usize = 0;
const B: usize = 1;
const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
const QKEY: u32 = 0x0123_4567;
/// A's first PSN: every message of more than three packets wraps around 2^24.
const PSN_A: u32 = 0xff_fffd;
const PSN_B: u32 = 0x1234;
const SEND_ID: u64 = 0x5e4d;
const RECV_ID: u64 = 0x2ec5;
const IMM: u32 = 0xfeed_f00d;
/// More virtual time than any case needs.
const DEADLINE: Duration = Duration::from_secs(10);
/// Region size for messages up to 3 × 4096 + 17 bytes in any layout.
const REGION_LEN: usize = 64 << 10;
const MULTI_MB: usize = 4 << 20;

/// Where the cases put things, as offsets into the regions below.
const LOCAL_OFF: usize = 3;
const RECV_OFF: usize = 7;
const REMOTE_OFF: usize = 5;
const RESULT_OFF: usize = 0x18;
const ATOMIC_OFF: usize = 0x40;

const ALL_ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// A registered memory region: its host, key (lkey = rkey) and address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mr {
    host: usize,
    key: u32,
    base: u64,
}

impl Mr {
    fn addr(self, offset: usize) -> u64 {
        self.base + offset as u64
    }

    fn sge(self, offset: usize, len: usize) -> Sge {
        Sge { addr: self.addr(offset), length: len as u32, lkey: self.key }
    }
}

const A0: Mr = Mr { host: A, key: 0xa0, base: 0x1000_0000 };
const A1: Mr = Mr { host: A, key: 0xa1, base: 0x2000_0000 };
const B0: Mr = Mr { host: B, key: 0xb0, base: 0x3000_0000 };
const B1: Mr = Mr { host: B, key: 0xb1, base: 0x4000_0000 };
/// The region SEND_WITH_INVALIDATE invalidates.
const B_INV: Mr = Mr { host: B, key: 0xbf, base: 0x5000_0000 };
const B_INV_LEN: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    /// Addresses of hosts A, B, C, … in this family.
    fn host(self, index: usize) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1 + index as u8)),
            Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xa + index as u16)),
        }
    }
}

/// Registers `mr` with `len` bytes of pseudo-random contents, so that a write
/// of any value, zeros included, shows.
fn register_random(w: &mut SimWorld, mr: Mr, len: usize) {
    w.register(mr.host, mr.key, mr.base, len, ALL_ACCESS);
    let data = &mut w.hosts[mr.host].mem.region_mut(mr.key).unwrap().data;
    let mut rng = Rng::new(u64::from(mr.key) << 8 | mr.host as u64);
    for chunk in data.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes()[..chunk.len()]);
    }
}

/// The contents of a set of regions (`None` once a region is gone), as the
/// model expects them or as they are.
#[derive(Clone)]
struct Image(Vec<(Mr, Option<Vec<u8>>)>);

impl Image {
    fn of(w: &SimWorld, mrs: &[Mr]) -> Image {
        Image(mrs.iter().map(|&mr| (mr, w.hosts[mr.host].mem.region(mr.key).map(|r| r.data.clone()))).collect())
    }

    fn region(&self, host: usize, key: u32) -> (Mr, &[u8]) {
        let (mr, data) = self.0.iter().find(|(mr, _)| mr.host == host && mr.key == key).expect("known region");
        (*mr, data.as_deref().expect("region still registered"))
    }

    fn region_mut(&mut self, host: usize, key: u32) -> (Mr, &mut Vec<u8>) {
        let (mr, data) = self.0.iter_mut().find(|(mr, _)| mr.host == host && mr.key == key).expect("known region");
        (*mr, data.as_mut().expect("region still registered"))
    }

    fn read(&self, mr: Mr, offset: usize, len: usize) -> Vec<u8> {
        self.region(mr.host, mr.key).1[offset..offset + len].to_vec()
    }

    fn write(&mut self, mr: Mr, offset: usize, data: &[u8]) {
        self.region_mut(mr.host, mr.key).1[offset..offset + data.len()].copy_from_slice(data);
    }

    /// The bytes an SGE list on `host` covers, in order.
    fn gather(&self, host: usize, sges: &[Sge]) -> Vec<u8> {
        let mut out = Vec::new();
        for sge in sges {
            let (mr, data) = self.region(host, sge.lkey);
            let at = (sge.addr - mr.base) as usize;
            out.extend_from_slice(&data[at..at + sge.length as usize]);
        }
        out
    }

    /// Places `data` through an SGE list on `host`, as a receive or READ does.
    fn scatter(&mut self, host: usize, sges: &[Sge], mut data: &[u8]) {
        for sge in sges {
            let (mr, region) = self.region_mut(host, sge.lkey);
            let n = data.len().min(sge.length as usize);
            let at = (sge.addr - mr.base) as usize;
            region[at..at + n].copy_from_slice(&data[..n]);
            data = &data[n..];
        }
        assert!(data.is_empty(), "model: {} bytes do not fit the SGE list", data.len());
    }

    fn word(&self, mr: Mr, offset: usize) -> u64 {
        u64::from_ne_bytes(self.read(mr, offset, 8).try_into().unwrap())
    }

    fn invalidate(&mut self, mr: Mr) {
        self.0.iter_mut().find(|(m, _)| *m == mr).expect("known region").1 = None;
    }

    /// Asserts equality region by region, naming the first differing byte.
    fn assert_matches(&self, expected: &Image, ctx: &str) {
        for ((mr, got), (_, want)) in self.0.iter().zip(&expected.0) {
            match (got, want) {
                (Some(got), Some(want)) => {
                    if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
                        panic!(
                            "{ctx}: region {:#x} on host {} differs first at offset {at}: {:#04x}, expected {:#04x}",
                            mr.key, mr.host, got[at], want[at]
                        );
                    }
                }
                (None, None) => {}
                _ => panic!("{ctx}: region {:#x} registered: {}, expected: {}", mr.key, got.is_some(), want.is_some()),
            }
        }
    }
}

/// Attributes of every connection: all remote rights, a short ACK timeout.
fn qp_attr(mtu: Mtu) -> QpAttr {
    QpAttr {
        access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        path_mtu: mtu,
        qkey: QKEY,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 0,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    }
}

fn ideal_net() -> SimNet {
    SimNet::new(1, Faults { latency: Duration::from_micros(2), ..Faults::default() })
}

fn qp_cap() -> QpCap {
    QpCap { max_inline_data: 1024, ..QpCap::default() }
}

/// Message sizes around one MTU and beyond.
fn sizes(mtu: Mtu) -> [usize; 6] {
    let m = mtu.bytes();
    [0, 1, m - 1, m, m + 1, 3 * m + 17]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    SendInv,
    Write,
    WriteImm,
    Read,
    CompareSwap { matching: bool },
    FetchAdd,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::Send,
        Kind::SendImm,
        Kind::SendInv,
        Kind::Write,
        Kind::WriteImm,
        Kind::Read,
        Kind::CompareSwap { matching: true },
        Kind::CompareSwap { matching: false },
        Kind::FetchAdd,
    ];
    const UC: [Kind; 4] = [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm];

    fn is_send(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::SendInv)
    }

    fn consumes_recv(self) -> bool {
        self.is_send() || self == Kind::WriteImm
    }

    fn is_atomic(self) -> bool {
        matches!(self, Kind::CompareSwap { .. } | Kind::FetchAdd)
    }
}

/// How a message lies in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// One SGE on each side.
    Contiguous,
    /// Three SGEs of odd lengths on the local side, alternating between two
    /// regions; two receive SGEs in two regions.
    Scattered,
}

impl Layout {
    /// Lengths of the local SGEs holding a `len`-byte message (or a READ's
    /// destination).
    fn local_lens(self, len: usize) -> Vec<usize> {
        match self {
            Layout::Contiguous => vec![len],
            Layout::Scattered => {
                let a = ((len / 3) | 1).min(len);
                let b = (((len - a) / 2) | 1).min(len - a);
                vec![a, b, len - a - b]
            }
        }
    }

    /// Lengths of receive SGEs for a `len`-byte message, with room to spare.
    fn recv_lens(self, len: usize) -> Vec<usize> {
        match self {
            Layout::Contiguous => vec![len + 9],
            Layout::Scattered => {
                let a = (len / 2) | 1;
                vec![a, (len + 13).saturating_sub(a)]
            }
        }
    }
}

/// SGEs of the given lengths from `offset` on, alternating between two
/// regions with gaps between them; empty pieces are left out.
fn place(mrs: [Mr; 2], offset: usize, lens: &[usize]) -> Vec<Sge> {
    let mut next = [offset; 2];
    let pieces = lens.iter().enumerate().filter(|(_, len)| **len > 0);
    pieces
        .map(|(i, &len)| {
            let side = i % 2;
            let at = next[side];
            next[side] += len + 31;
            mrs[side].sge(at, len)
        })
        .collect()
}

/// One work request and what the test expects of it.
#[derive(Debug, Clone, Copy)]
struct Case {
    kind: Kind,
    len: usize,
    layout: Layout,
    signaled: bool,
    solicited: bool,
    inline: bool,
}

impl Case {
    fn new(kind: Kind, len: usize) -> Case {
        Case { kind, len, layout: Layout::Contiguous, signaled: true, solicited: false, inline: false }
    }

    fn layout(self, layout: Layout) -> Case {
        Case { layout, ..self }
    }
}

/// Hosts A and B, each with one QP connected to the other and two random
/// regions (B has a third for SEND_WITH_INVALIDATE).
struct TwoHosts {
    w: SimWorld,
    qp_type: QpType,
    mtu: Mtu,
    family: Family,
}

impl TwoHosts {
    fn new(qp_type: QpType, mtu: Mtu, family: Family, region_len: usize) -> TwoHosts {
        let mut w = SimWorld::new(ideal_net());
        w.add_host(family.host(A)).unwrap();
        w.add_host(family.host(B)).unwrap();
        w.create_qp(A, QPN_A, qp_type, qp_cap(), None);
        w.create_qp(B, QPN_B, qp_type, qp_cap(), None);
        for mr in [A0, A1, B0, B1] {
            register_random(&mut w, mr, region_len);
        }
        register_random(&mut w, B_INV, B_INV_LEN);
        w.connect((A, QPN_A), (B, QPN_B), &qp_attr(mtu), (Psn::new(PSN_A), Psn::new(PSN_B))).unwrap();
        TwoHosts { w, qp_type, mtu, family }
    }

    fn image(&self) -> Image {
        Image::of(&self.w, &[A0, A1, B0, B1, B_INV])
    }

    fn qp(&mut self, host: usize) -> &mut Qp {
        self.w.hosts[host].qp([QPN_A, QPN_B][host])
    }

    fn ud_dest(&self, remote_qkey: u32) -> UdDest {
        UdDest { dest: self.family.host(B), remote_qpn: QPN_B, remote_qkey }
    }

    fn ctx(&self, case: &Case) -> String {
        format!("{:?} {:?} MTU {}: {case:?}", self.family, self.qp_type, self.mtu.bytes())
    }

    /// Posts one case (and its receive), runs the world until idle and checks
    /// completions, memory, events and QP states.
    fn run(&mut self, case: Case) {
        let ctx = self.ctx(&case);
        let before = self.image();
        let mut expected = before.clone();
        let ud = self.qp_type == QpType::Ud;

        let local = if case.kind.is_atomic() {
            vec![A0.sge(RESULT_OFF, 8)]
        } else {
            place([A0, A1], LOCAL_OFF, &case.layout.local_lens(case.len))
        };
        let remote_addr = B0.addr(REMOTE_OFF);
        let (rkey, original) = (B0.key, before.word(B0, ATOMIC_OFF));
        let op = match case.kind {
            Kind::Send => SendOp::Send,
            Kind::SendImm => SendOp::SendWithImm(IMM),
            Kind::SendInv => SendOp::SendWithInv(B_INV.key),
            Kind::Write => SendOp::RdmaWrite { remote_addr, rkey },
            Kind::WriteImm => SendOp::RdmaWriteWithImm { remote_addr, rkey, imm: IMM },
            Kind::Read => SendOp::RdmaRead { remote_addr, rkey },
            Kind::CompareSwap { matching } => SendOp::CompareSwap {
                remote_addr: B0.addr(ATOMIC_OFF),
                rkey,
                compare: if matching { original } else { !original },
                swap: 0x0123_4567_89ab_cdef,
            },
            Kind::FetchAdd => SendOp::FetchAdd { remote_addr: B0.addr(ATOMIC_OFF), rkey, add: 0x1_0000_0003 },
        };
        let mut wr = SendWr::new(SEND_ID, op);
        wr.sg_list = local.as_slice().into();
        wr.flags.signaled = case.signaled;
        wr.flags.solicited = case.solicited;
        let msg = match case.kind {
            Kind::Read => before.read(B0, REMOTE_OFF, case.len),
            _ => before.gather(A, &local),
        };
        if case.inline {
            wr.flags.inline = true;
            wr.inline_data = msg.as_slice().into();
            wr.sg_list.clear();
        }
        if ud {
            wr.ud = Some(self.ud_dest(QKEY));
        }
        // A UD receive starts with the GRH area.
        let delivered = if ud {
            // BTH, DETH, ImmDt if any, payload and pad, ICRC.
            let imm = if matches!(case.kind, Kind::SendImm) { 4 } else { 0 };
            let roce_len = 12 + 8 + imm + msg.len().next_multiple_of(4) + 4;
            [&grh_area(self.family.host(A), self.family.host(B), roce_len)[..], &msg].concat()
        } else {
            msg.clone()
        };
        let recv = case.kind.consumes_recv().then(|| RecvWr {
            wr_id: RECV_ID,
            sg_list: place([B1, B0], RECV_OFF, &case.layout.recv_lens(delivered.len())).into(),
        });
        if let Some(recv) = &recv {
            self.qp(B).post_recv(recv.clone()).unwrap_or_else(|e| panic!("{ctx}: post_recv: {e}"));
        }
        self.qp(A).post_send(wr).unwrap_or_else(|e| panic!("{ctx}: post_send: {e}"));
        self.w.run_idle(DEADLINE);

        match case.kind {
            Kind::Send | Kind::SendImm | Kind::SendInv => {
                expected.scatter(B, &recv.as_ref().unwrap().sg_list, &delivered)
            }
            Kind::Write | Kind::WriteImm => expected.write(B0, REMOTE_OFF, &msg),
            Kind::Read => expected.scatter(A, &local, &msg),
            Kind::CompareSwap { matching } => {
                let new = if matching { 0x0123_4567_89ab_cdef } else { original };
                expected.write(B0, ATOMIC_OFF, &new.to_ne_bytes());
                expected.write(A0, RESULT_OFF, &original.to_ne_bytes());
            }
            Kind::FetchAdd => {
                expected.write(B0, ATOMIC_OFF, &original.wrapping_add(0x1_0000_0003).to_ne_bytes());
                expected.write(A0, RESULT_OFF, &original.to_ne_bytes());
            }
        }
        if case.kind == Kind::SendInv {
            expected.invalidate(B_INV);
        }

        let mut want_a = Vec::new();
        if case.signaled {
            let mut wc = WorkCompletion::new(SEND_ID, QPN_A, WcStatus::Success, op.wc_opcode());
            wc.byte_len = if case.kind.is_atomic() { 8 } else { case.len as u32 };
            want_a.push((QPN_A, CqKind::Send, wc));
        }
        let mut want_b = Vec::new();
        if case.kind.consumes_recv() {
            let opcode = if case.kind == Kind::WriteImm { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv };
            let mut wc = WorkCompletion::new(RECV_ID, QPN_B, WcStatus::Success, opcode);
            wc.byte_len = delivered.len() as u32;
            wc.imm = matches!(case.kind, Kind::SendImm | Kind::WriteImm).then_some(IMM);
            wc.invalidated_rkey = (case.kind == Kind::SendInv).then_some(B_INV.key);
            wc.solicited = case.solicited;
            if ud {
                wc.src_qp = QPN_A;
                wc.grh = true;
            }
            want_b.push((QPN_B, CqKind::Recv, wc));
        }
        assert_eq!(self.w.hosts[A].completions, want_a, "{ctx}: completions on A");
        assert_eq!(self.w.hosts[B].completions, want_b, "{ctx}: completions on B");
        self.image().assert_matches(&expected, &ctx);
        self.assert_healthy(&ctx);
    }

    /// No events, both QPs in RTS, and (UC, UD) nothing sent by B.
    fn assert_healthy(&mut self, ctx: &str) {
        for host in [A, B] {
            let events = &self.w.hosts[host].events;
            assert!(events.is_empty(), "{ctx}: events on host {host}: {events:?}");
        }
        assert_eq!((self.qp(A).state(), self.qp(B).state()), (QpState::Rts, QpState::Rts), "{ctx}");
        if self.qp_type != QpType::Rc {
            assert_eq!(self.qp(B).counters().sent_packets, 0, "{ctx}: the responder sent packets");
            let sent_by_a = self.qp(A).counters().sent_packets;
            assert_eq!(self.w.net.stats().sent, sent_by_a, "{ctx}: packets on the wire not from A");
        }
    }
}

/// Runs `kinds` at every MTU, every size and both layouts.
fn matrix(qp_type: QpType, family: Family, mtus: &[Mtu], kinds: &[Kind]) {
    for &mtu in mtus {
        for &kind in kinds {
            let lens: Vec<usize> = if kind.is_atomic() { vec![8] } else { sizes(mtu).to_vec() };
            for len in lens {
                let layouts: &[Layout] =
                    if kind.is_atomic() { &[Layout::Contiguous] } else { &[Layout::Contiguous, Layout::Scattered] };
                for &layout in layouts {
                    TwoHosts::new(qp_type, mtu, family, REGION_LEN).run(Case::new(kind, len).layout(layout));
                }
            }
        }
    }
}

/// RC: every opcode at every MTU and size, in both layouts.
#[test]
fn every_opcode_size_and_mtu() {
    matrix(QpType::Rc, Family::V4, &MTUS, &Kind::ALL);
}

/// One 4 MiB message per MTU, a different opcode each time.
#[test]
fn rc_multi_megabyte() {
    let kinds = [Kind::Write, Kind::Send, Kind::Read, Kind::WriteImm, Kind::SendImm];
    for (mtu, kind) in MTUS.into_iter().zip(kinds) {
        TwoHosts::new(QpType::Rc, mtu, Family::V4, MULTI_MB + 4096).run(Case::new(kind, MULTI_MB));
    }
}

#[test]
fn inline_sends() {
    let kinds = [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm];
    for qp_type in [QpType::Rc, QpType::Uc] {
        for kind in kinds {
            // Up to four packets of inline data at MTU 256.
            for len in [0, 1, 255, 256, 257, 1024] {
                let case = Case { inline: true, ..Case::new(kind, len) };
                TwoHosts::new(qp_type, Mtu::Mtu256, Family::V4, REGION_LEN).run(case);
            }
        }
    }
    let mut sim = TwoHosts::new(QpType::Rc, Mtu::Mtu256, Family::V4, REGION_LEN);
    let mut wr = SendWr::new(1, SendOp::Send);
    wr.flags.inline = true;
    wr.inline_data = vec![0; 1025].into();
    assert_eq!(sim.qp(A).post_send(wr), Err(PostSendError::InlineTooLong { given: 1025, max: 1024 }));
}

#[test]
fn solicited_flag_reaches_the_receive_completion() {
    for (qp_type, kinds) in [
        (QpType::Rc, &[Kind::Send, Kind::SendImm, Kind::SendInv, Kind::WriteImm][..]),
        (QpType::Uc, &[Kind::Send, Kind::SendImm, Kind::WriteImm]),
        (QpType::Ud, &[Kind::Send, Kind::SendImm]),
    ] {
        for &kind in kinds {
            let lens: &[usize] = if qp_type == QpType::Ud { &[0, 512] } else { &[0, 3 * 512 + 17] };
            for &len in lens {
                for solicited in [true, false] {
                    let case = Case { solicited, ..Case::new(kind, len) };
                    TwoHosts::new(qp_type, Mtu::Mtu512, Family::V4, REGION_LEN).run(case);
                }
            }
        }
    }
}

#[test]
fn unsignaled_requests_complete_silently() {
    let kinds = [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm];
    for qp_type in [QpType::Rc, QpType::Uc] {
        for kind in kinds {
            for len in [0, 3 * 1024 + 17] {
                let case = Case { signaled: false, ..Case::new(kind, len) };
                TwoHosts::new(qp_type, Mtu::Mtu1024, Family::V4, REGION_LEN).run(case);
            }
        }
    }
    for kind in [Kind::Read, Kind::FetchAdd] {
        let case = Case { signaled: false, ..Case::new(kind, if kind == Kind::Read { 5000 } else { 8 }) };
        TwoHosts::new(QpType::Rc, Mtu::Mtu1024, Family::V4, REGION_LEN).run(case);
    }
    let case = Case { signaled: false, ..Case::new(Kind::Send, 100) };
    TwoHosts::new(QpType::Ud, Mtu::Mtu1024, Family::V4, REGION_LEN).run(case);
}

/// Signaled and unsignaled SENDs mixed: only the signaled complete on the
/// sender, in order; every one completes on the receiver.
#[test]
fn unsignaled_mixed_with_signaled() {
    for qp_type in [QpType::Rc, QpType::Uc] {
        let mut sim = TwoHosts::new(qp_type, Mtu::Mtu1024, Family::V4, REGION_LEN);
        let lens = [10, 2000, 0, 300, 4097];
        let signaled = [true, false, false, true, false];
        for (i, &len) in lens.iter().enumerate() {
            let recv = RecvWr { wr_id: 100 + i as u64, sg_list: softroce::sg_list![B1.sge(i * 8192, 8192)] };
            sim.qp(B).post_recv(recv).unwrap();
            let mut wr = SendWr::new(i as u64, SendOp::Send).with_sge(A0.sge(i * 8192, len));
            wr.flags.signaled = signaled[i];
            sim.qp(A).post_send(wr).unwrap();
        }
        sim.w.run_idle(DEADLINE);
        let ids = |h: usize| {
            sim.w.hosts[h].completions.iter().map(|(_, _, wc)| (wc.wr_id, wc.status, wc.byte_len)).collect::<Vec<_>>()
        };
        let success = WcStatus::Success;
        assert_eq!(ids(A), [(0, success, 10), (3, success, 300)], "{qp_type:?}");
        let want_b: Vec<_> = lens.iter().enumerate().map(|(i, &len)| (100 + i as u64, success, len as u32)).collect();
        assert_eq!(ids(B), want_b, "{qp_type:?}");
        sim.assert_healthy(&format!("{qp_type:?}"));
    }
}

/// An unsignaled request that fails still completes, with its error, and
/// flushes the rest (unsignaled or not).
#[test]
fn unsignaled_error_completes() {
    let mut sim = TwoHosts::new(QpType::Rc, Mtu::Mtu1024, Family::V4, REGION_LEN);
    let before = sim.image();
    let unsignaled = |wr_id, op| {
        let mut wr = SendWr::new(wr_id, op).with_sge(A0.sge(0, 100));
        wr.flags.signaled = false;
        wr
    };
    let bad = SendOp::RdmaWrite { remote_addr: B0.addr(0), rkey: 0xdead };
    sim.qp(A).post_send(unsignaled(1, bad)).unwrap();
    sim.qp(A).post_send(unsignaled(2, SendOp::RdmaWrite { remote_addr: B0.addr(0), rkey: B0.key })).unwrap();
    sim.qp(A).post_send(SendWr::new(3, SendOp::Send)).unwrap();
    sim.w.run_idle(DEADLINE);
    let wc = |wr_id, status, opcode| (QPN_A, CqKind::Send, WorkCompletion::new(wr_id, QPN_A, status, opcode));
    assert_eq!(
        sim.w.hosts[A].completions,
        [
            wc(1, WcStatus::RemAccessErr, WcOpcode::RdmaWrite),
            wc(2, WcStatus::WrFlushErr, WcOpcode::RdmaWrite),
            wc(3, WcStatus::WrFlushErr, WcOpcode::Send),
        ]
    );
    assert_eq!(sim.w.hosts[A].events, [AsyncEvent::QpFatal { qpn: QPN_A }]);
    assert_eq!(sim.w.hosts[B].events, [AsyncEvent::QpAccessError { qpn: QPN_B }]);
    assert_eq!((sim.qp(A).state(), sim.qp(B).state()), (QpState::Err, QpState::Err));
    sim.image().assert_matches(&before, "failed WRITE");
}

/// UC: SEND and WRITE variants at every MTU and size; the responder sends
/// nothing, and the requester completes once the last packet is out.
#[test]
fn uc_sends_no_acks() {
    matrix(QpType::Uc, Family::V4, &MTUS, &Kind::UC);
}

#[test]
fn uc_refuses_read_atomics_and_invalidate() {
    let mut sim = TwoHosts::new(QpType::Uc, Mtu::Mtu1024, Family::V4, REGION_LEN);
    let rkey = B0.key;
    let result = A0.sge(RESULT_OFF, 8);
    for op in [
        SendOp::RdmaRead { remote_addr: B0.addr(0), rkey },
        SendOp::CompareSwap { remote_addr: B0.addr(0), rkey, compare: 0, swap: 1 },
        SendOp::FetchAdd { remote_addr: B0.addr(0), rkey, add: 1 },
        SendOp::SendWithInv(B_INV.key),
    ] {
        let wr = SendWr::new(1, op).with_sge(result);
        assert_eq!(sim.qp(A).post_send(wr), Err(PostSendError::UnsupportedOp(QpType::Uc)), "{op:?}");
    }
    sim.w.run_idle(DEADLINE);
    assert_eq!(sim.w.net.stats().sent, 0);
    assert!(sim.w.hosts[A].completions.is_empty());
}

/// The path MTU of a UD QP: the port's, as UD QPs take no PATH_MTU.
fn ud_mtu(sim: &mut TwoHosts) -> usize {
    sim.qp(A).attr().path_mtu.bytes()
}

/// UD SEND and SEND_WITH_IMM of every size that fits one packet: the
/// receive starts with the GRH area and reports the source QP.
#[test]
fn ud_send_and_send_with_imm() {
    for family in [Family::V4, Family::V6] {
        let m = ud_mtu(&mut TwoHosts::new(QpType::Ud, Mtu::Mtu1024, family, REGION_LEN));
        for kind in [Kind::Send, Kind::SendImm] {
            for len in [0, 1, m - 1, m] {
                for layout in [Layout::Contiguous, Layout::Scattered] {
                    TwoHosts::new(QpType::Ud, Mtu::Mtu1024, family, REGION_LEN)
                        .run(Case::new(kind, len).layout(layout));
                }
            }
        }
    }
}

#[test]
fn ud_send_larger_than_mtu_is_rejected() {
    let mut sim = TwoHosts::new(QpType::Ud, Mtu::Mtu1024, Family::V4, REGION_LEN);
    let m = ud_mtu(&mut sim);
    let mut wr = SendWr::new(1, SendOp::Send).with_sge(A0.sge(0, m + 1));
    wr.ud = Some(sim.ud_dest(QKEY));
    let too_long = PostSendError::MessageTooLong { len: m as u64 + 1, max: m as u64 };
    assert_eq!(sim.qp(A).post_send(wr), Err(too_long));
    sim.w.run_idle(DEADLINE);
    assert_eq!(sim.w.net.stats().sent, 0);
    assert!(sim.w.hosts[A].completions.is_empty());
}

/// Sends UD messages with the given remote Q_Keys, each into a fresh receive
/// on B, and returns the receive wr_ids completed on B (the sends all complete
/// on A once on the wire).
fn ud_deliveries(sim: &mut TwoHosts, remote_qkeys: &[u32]) -> Vec<u64> {
    let first = sim.w.hosts[B].completions.len();
    let sent_before = sim.w.hosts[A].completions.len();
    for (i, &qkey) in remote_qkeys.iter().enumerate() {
        let wr_id = 1000 + first as u64 + i as u64;
        sim.qp(B).post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![B1.sge(0, GRH_LEN + 64)] }).unwrap();
        let mut wr = SendWr::new(wr_id, SendOp::Send).with_sge(A0.sge(0, 64));
        wr.ud = Some(sim.ud_dest(qkey));
        sim.qp(A).post_send(wr).unwrap();
    }
    sim.w.run_idle(DEADLINE);
    let sent = &sim.w.hosts[A].completions[sent_before..];
    assert_eq!(sent.len(), remote_qkeys.len());
    assert!(sent.iter().all(|(_, _, wc)| wc.status == WcStatus::Success));
    sim.w.hosts[B].completions[first..].iter().map(|(_, _, wc)| wc.wr_id).collect()
}

#[test]
fn ud_qkey_mismatch_is_dropped() {
    let mut sim = TwoHosts::new(QpType::Ud, Mtu::Mtu1024, Family::V4, REGION_LEN);
    let got = ud_deliveries(&mut sim, &[QKEY ^ 1, QKEY, 0, QKEY]);
    // The dropped messages leave their receives posted: the next message takes
    // the oldest one.
    assert_eq!(got, [1000, 1001]);
    assert_eq!(sim.qp(B).counters().dropped, 2);
}

/// A remote Q_Key with the high bit set sends the QP's own Q_Key instead.
#[test]
fn ud_controlled_qkey() {
    let mut sim = TwoHosts::new(QpType::Ud, Mtu::Mtu1024, Family::V4, REGION_LEN);
    assert_eq!(ud_deliveries(&mut sim, &[0x8000_0000, 0xffff_ffff]), [1000, 1001]);
    let other = QpAttr { state: QpState::Rts, qkey: QKEY ^ 0x10, ..QpAttr::default() };
    sim.qp(A).modify(&other, AttrMask::STATE | AttrMask::QKEY).unwrap();
    assert_eq!(ud_deliveries(&mut sim, &[0x8000_0000, QKEY]), [1002]);
    assert_eq!(sim.qp(B).counters().dropped, 1);
}

/// Three senders on three hosts to three QPs on one host that share an SRQ,
/// with multi-packet messages interleaving: every message lands in the
/// receive its QP took, and the limit event fires once.
#[test]
fn srq_shared_by_three_qps() {
    const SRQ: u32 = 5;
    const RECEIVER: usize = 3;
    const POSTED: usize = 16;
    const LIMIT: u32 = 6;
    let mtu = Mtu::Mtu1024;
    let m = mtu.bytes();
    let lens = [5 * m / 2, 1, 0, m + 1];
    let regions: Vec<Mr> = (0..=RECEIVER)
        .flat_map(|h| {
            [0, 1].map(|k| Mr { host: h, key: 0x10 * (h as u32 + 1) + k, base: 0x1_0000_0000 * (k as u64 + 1) })
        })
        .collect();

    let mut w = SimWorld::new(ideal_net());
    for h in 0..=RECEIVER {
        w.add_host(Family::V4.host(h)).unwrap();
    }
    for &mr in &regions {
        register_random(&mut w, mr, REGION_LEN);
    }
    let recv_mrs = [regions[2 * RECEIVER], regions[2 * RECEIVER + 1]];
    w.hosts[RECEIVER].srqs.insert(SRQ, Srq::new(SRQ, 64, 4));
    for sender in 0..RECEIVER {
        let (qpn_s, qpn_r) = (0x100 + sender as u32, 0x200 + sender as u32);
        w.create_qp(sender, qpn_s, QpType::Rc, qp_cap(), None);
        w.create_qp(RECEIVER, qpn_r, QpType::Rc, qp_cap(), Some(SRQ));
        w.connect((sender, qpn_s), (RECEIVER, qpn_r), &qp_attr(mtu), (Psn::new(PSN_A), Psn::new(PSN_B))).unwrap();
    }
    let recvs: Vec<RecvWr> = (0..POSTED)
        .map(|i| RecvWr { wr_id: i as u64, sg_list: place(recv_mrs, i * 4 * m, &[m + 3, 3 * m]).into() })
        .collect();
    let srq = w.hosts[RECEIVER].srqs.get_mut(&SRQ).unwrap();
    for recv in &recvs {
        srq.post(recv.clone()).unwrap();
    }
    srq.arm_limit(LIMIT);
    let before = Image::of(&w, &regions);
    // Message k of sender s lies at offset k * 8 KiB of its first region.
    let message = |s: usize, k: usize| regions[2 * s].sge(k * 8192, lens[k]);
    for k in 0..lens.len() {
        for s in 0..RECEIVER {
            let wr = SendWr::new(k as u64, SendOp::SendWithImm(s as u32)).with_sge(message(s, k));
            w.hosts[s].qp(0x100 + s as u32).post_send(wr).unwrap();
        }
    }
    w.run_idle(DEADLINE);

    let mut expected = before.clone();
    let mut next_of = [0usize; RECEIVER];
    let mut used = Vec::new();
    for &(qpn, cq, wc) in &w.hosts[RECEIVER].completions {
        let s = (qpn - 0x200) as usize;
        let k = next_of[s];
        next_of[s] += 1;
        assert_eq!((cq, wc.qp_num, wc.status, wc.opcode), (CqKind::Recv, qpn, WcStatus::Success, WcOpcode::Recv));
        assert_eq!((wc.byte_len as usize, wc.imm), (lens[k], Some(s as u32)), "message {k} of sender {s}");
        let data = before.gather(s, &[message(s, k)]);
        expected.scatter(RECEIVER, &recvs[wc.wr_id as usize].sg_list, &data);
        used.push(wc.wr_id);
    }
    assert_eq!(next_of, [lens.len(); RECEIVER]);
    used.sort_unstable();
    assert_eq!(used, (0..(RECEIVER * lens.len()) as u64).collect::<Vec<_>>(), "the oldest receives were taken");
    Image::of(&w, &regions).assert_matches(&expected, "SRQ");
    for s in 0..RECEIVER {
        let ids: Vec<u64> = w.hosts[s].completions.iter().map(|(_, _, wc)| wc.wr_id).collect();
        assert_eq!(ids, [0, 1, 2, 3], "sender {s}");
    }
    let srq = &w.hosts[RECEIVER].srqs[&SRQ];
    assert_eq!(srq.len(), POSTED - RECEIVER * lens.len());
    assert_eq!(srq.limit(), 0, "the limit event disarms");
    assert_eq!(w.hosts[RECEIVER].events, [AsyncEvent::SrqLimitReached { srq: SRQ }]);
}

/// The limit event fires when the count drops below the limit, not at it,
/// and only once until re-armed; UD QPs on an SRQ raise it too.
#[test]
fn srq_limit_event_fires_once() {
    const SRQ: u32 = 9;
    for qp_type in [QpType::Rc, QpType::Ud] {
        let mut w = SimWorld::new(ideal_net());
        w.add_host(Family::V4.host(A)).unwrap();
        w.add_host(Family::V4.host(B)).unwrap();
        register_random(&mut w, A0, REGION_LEN);
        register_random(&mut w, B0, REGION_LEN);
        w.hosts[B].srqs.insert(SRQ, Srq::new(SRQ, 16, 1));
        w.create_qp(A, QPN_A, qp_type, qp_cap(), None);
        w.create_qp(B, QPN_B, qp_type, qp_cap(), Some(SRQ));
        w.connect((A, QPN_A), (B, QPN_B), &qp_attr(Mtu::Mtu1024), (Psn::new(PSN_A), Psn::new(PSN_B))).unwrap();
        let srq = w.hosts[B].srqs.get_mut(&SRQ).unwrap();
        for i in 0..8 {
            srq.post(RecvWr { wr_id: i, sg_list: softroce::sg_list![B0.sge(i as usize * 256, 256)] }).unwrap();
        }
        srq.arm_limit(5);
        let send = |w: &mut SimWorld, n: u64| {
            for i in 0..n {
                let mut wr = SendWr::new(i, SendOp::Send).with_sge(A0.sge(0, 100));
                if qp_type == QpType::Ud {
                    wr.ud = Some(UdDest { dest: Family::V4.host(B), remote_qpn: QPN_B, remote_qkey: QKEY });
                }
                w.hosts[A].qp(QPN_A).post_send(wr).unwrap();
            }
            w.run_idle(DEADLINE);
        };
        let limit_events =
            |w: &SimWorld| w.hosts[B].events.iter().filter(|e| **e == AsyncEvent::SrqLimitReached { srq: SRQ }).count();
        send(&mut w, 3); // 5 left: not below the limit
        assert_eq!(limit_events(&w), 0, "{qp_type:?}");
        send(&mut w, 1); // 4 left
        assert_eq!(limit_events(&w), 1, "{qp_type:?}");
        send(&mut w, 2); // 2 left, disarmed
        assert_eq!(limit_events(&w), 1, "{qp_type:?}");
        w.hosts[B].srqs.get_mut(&SRQ).unwrap().arm_limit(2);
        send(&mut w, 1); // 1 left
        assert_eq!(limit_events(&w), 2, "{qp_type:?}");
        assert_eq!(w.hosts[B].completions.len(), 7, "{qp_type:?}");
        assert_eq!(w.hosts[B].events.len(), 2, "{qp_type:?}: {:?}", w.hosts[B].events);
    }
}

/// Every opcode and size over IPv6 (unique local addresses).
#[test]
fn ipv6_endpoints() {
    matrix(QpType::Rc, Family::V6, &[Mtu::Mtu1024, Mtu::Mtu4096], &Kind::ALL);
    matrix(QpType::Uc, Family::V6, &[Mtu::Mtu256], &Kind::UC);
}
