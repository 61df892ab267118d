//! The transport's own cost, with no sockets, no threads and no ICRC: two
//! RC QPs over in-memory regions, the requester's packets handed straight to
//! the responder and its ACKs or READ responses straight back, until the
//! message completes. What `softroce bench` measures on top of this is the
//! kernel's UDP path, the ICRC and the engine; what this measures is the
//! part a change to `src/transport/` or `src/wire/` moves, without the noise
//! of a shared machine's scheduler.
//!
//! Also the parse and header emit of one 4 KiB WRITE middle packet, the
//! per-packet floor of both sides.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softroce::transport::{
    Access, AttrMask, Incoming, MemoryTable, Mtu, Qp, QpAttr, QpCap, QpState, QpType, RecvWr, Region, SendOp, SendWr,
    Sge, TransmitOrder, TRANSMIT_HEADROOM,
};
use softroce::wire::{Psn, RoceRepr};

const PD: u32 = 1;
const KEY: u32 = 0x100;
const VA: u64 = 0x10_0000;
const REGION: usize = 4 << 20;
const ADDR_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const ADDR_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

/// One side: a QP in RTS towards the other, and its memory.
struct Side {
    qp: Qp,
    mem: MemoryTable,
    addr: IpAddr,
}

impl Side {
    fn new(qpn: u32, peer_qpn: u32, addr: IpAddr, peer: IpAddr, mtu: Mtu) -> Side {
        let mut qp =
            Qp::new(qpn, QpType::Rc, PD, QpCap { max_send_wr: 1024, max_recv_wr: 1024, ..QpCap::default() }, None);
        let mut attr = QpAttr {
            state: QpState::Init,
            access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ,
            path_mtu: mtu,
            dest: Some(peer),
            dest_qpn: peer_qpn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            ..QpAttr::default()
        };
        let init = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        qp.modify(&attr, init).expect("RESET to INIT");
        attr.state = QpState::Rtr;
        attr.rq_psn = Psn::new(0x100);
        let rtr = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        qp.modify(&attr, rtr).expect("INIT to RTR");
        attr.state = QpState::Rts;
        attr.sq_psn = Psn::new(0x100);
        let rts = AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
        qp.modify(&attr, rts).expect("RTR to RTS");
        let mut mem = MemoryTable::new();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        mem.register(KEY, Region { pd: PD, addr: VA, access, data: vec![0x5a; REGION] });
        Side { qp, mem, addr }
    }
}

/// Two connected QPs and a packet buffer.
struct Pair {
    a: Side,
    b: Side,
    buf: Vec<u8>,
    now: Duration,
}

impl Pair {
    fn new(mtu: Mtu) -> Pair {
        Pair {
            a: Side::new(0x11, 0x12, ADDR_A, ADDR_B, mtu),
            b: Side::new(0x12, 0x11, ADDR_B, ADDR_A, mtu),
            buf: vec![0; 4096 + TRANSMIT_HEADROOM],
            now: Duration::from_secs(1),
        }
    }

    /// Moves every packet either side has until neither has any; returns
    /// how many moved.
    fn pump(&mut self) -> usize {
        let mut moved = 0;
        loop {
            let before = moved;
            moved += deliver(&mut self.a, &mut self.b, &mut self.buf, self.now);
            moved += deliver(&mut self.b, &mut self.a, &mut self.buf, self.now);
            if moved == before {
                return moved;
            }
        }
    }

    /// Posts `wr` on A (and a receive on B for a SEND), pumps until A's
    /// completion; returns the packets moved.
    fn run(&mut self, wr: SendWr, len: u32) -> usize {
        if matches!(wr.op, SendOp::Send) {
            let sink = Sge { addr: VA, length: len, lkey: KEY };
            self.b.qp.post_recv(RecvWr { wr_id: 0, sg_list: softroce::sg_list![sink] }).expect("post_recv");
        }
        self.a.qp.post_send(wr).expect("post_send");
        let moved = self.pump();
        let (_, wc) = self.a.qp.poll_completion().expect("the message completes");
        assert_eq!(wc.status, softroce::transport::WcStatus::Success, "{wc:?}");
        while self.b.qp.poll_completion().is_some() {}
        moved
    }
}

/// Hands every packet `from` has to `to`.
fn deliver(from: &mut Side, to: &mut Side, buf: &mut [u8], now: Duration) -> usize {
    let mut moved = 0;
    while let Some(tx) = from.qp.poll_transmit(now, &mut from.mem, buf, TransmitOrder::ResponsesFirst) {
        let pkt = RoceRepr::parse(&buf[..tx.len]).expect("the QP emits valid packets");
        let incoming = Incoming {
            src: from.addr,
            src_port: softroce::wire::ROCE_UDP_PORT,
            dst: to.addr,
            header: &pkt.header,
            payload: pkt.payload,
        };
        to.qp.handle_packet(now, incoming, &mut to.mem, None);
        moved += 1;
    }
    moved
}

fn request(op: SendOp, len: u32) -> SendWr {
    let mut wr = SendWr::new(1, op).with_sge(Sge { addr: VA, length: len, lkey: KEY });
    wr.flags.signaled = true;
    wr
}

fn messages(c: &mut Criterion) {
    let mut group = c.benchmark_group("transport");
    for (name, mtu, len) in [("mtu4096", Mtu::Mtu4096, 1u32 << 20), ("mtu1024", Mtu::Mtu1024, 1 << 20)] {
        group.throughput(Throughput::Bytes(u64::from(len)));
        let remote = SendOp::RdmaWrite { remote_addr: VA + (2 << 20), rkey: KEY };
        let read = SendOp::RdmaRead { remote_addr: VA + (2 << 20), rkey: KEY };
        for (op_name, op) in [("write_1mib", remote), ("send_1mib", SendOp::Send), ("read_1mib", read)] {
            let mut pair = Pair::new(mtu);
            group.bench_function(BenchmarkId::new(op_name, name), |b| b.iter(|| pair.run(request(op, len), len)));
        }
    }
    group.throughput(Throughput::Elements(1));
    let mut pair = Pair::new(Mtu::Mtu4096);
    let remote = SendOp::RdmaWrite { remote_addr: VA + (2 << 20), rkey: KEY };
    group.bench_function("write_64b", |b| b.iter(|| pair.run(request(remote, 64), 64)));
    group.finish();
}

fn packets(c: &mut Criterion) {
    // One WRITE middle packet of 4 KiB, as the requester builds it.
    let mut pair = Pair::new(Mtu::Mtu4096);
    let remote = SendOp::RdmaWrite { remote_addr: VA + (2 << 20), rkey: KEY };
    pair.a.qp.post_send(request(remote, 3 * 4096)).expect("post_send");
    let mut packets = Vec::new();
    while let Some(tx) =
        pair.a.qp.poll_transmit(pair.now, &mut pair.a.mem, &mut pair.buf, TransmitOrder::ResponsesFirst)
    {
        packets.push(pair.buf[..tx.len].to_vec());
    }
    let middle = &packets[1];
    let repr = RoceRepr::parse(middle).expect("valid").header;

    let mut group = c.benchmark_group("wire_4k_write_middle");
    group.throughput(Throughput::Bytes(middle.len() as u64));
    group.bench_function("parse", |b| b.iter(|| RoceRepr::parse(black_box(middle)).map(|p| p.payload.len())));
    let mut out = vec![0u8; middle.len()];
    group.bench_function("emit_headers", |b| b.iter(|| black_box(&repr).emit_headers(&mut out, 4096)));
    group.finish();
}

criterion_group!(benches, messages, packets);
criterion_main!(benches);
