//! Every verb and opcode end to end over loopback UDP, with byte-exact
//! checks of the memory each operation may and may not touch.

mod support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use softroce::transport::{
    AsyncEvent, AttrMask, Mtu, PostSendError, QpAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, WcOpcode,
    WcStatus, WorkCompletion, GRH_LEN,
};
use softroce::verbs::{
    AckTimeout, AddressHandle, CompletionQueue, ConnectOptions, ContextOptions, Error, MemoryRegion, QueuePair,
};
use support::pattern;
use support::verbs::*;

/// About 1 MiB, a multiple of no MTU.
const LARGE: usize = (1 << 20) + 13;
/// Where messages start in the source region and land in the destination:
/// odd offsets, so no copy is aligned.
const SRC: usize = 3;
const DST: usize = 4099;
/// An 8-byte aligned word for atomics, and where their result lands.
const WORD: usize = 4096;
const RESULT: usize = 64;
const QKEY: u32 = 0x1234_5678;

/// One end of a connection as the operation checks use it.
struct End<'a> {
    qp: &'a QueuePair,
    cq: &'a CompletionQueue,
    mr: &'a MemoryRegion,
}

impl NodePair {
    fn ends(&self) -> (End<'_>, End<'_>) {
        (End { qp: &self.qp_a, cq: &self.a.cq, mr: &self.mr_a }, End { qp: &self.qp_b, cq: &self.b.cq, mr: &self.mr_b })
    }
}

/// A successful completion of `qp` with the given opcode and length.
fn success(wr_id: u64, qp: &QueuePair, opcode: WcOpcode, byte_len: usize) -> WorkCompletion {
    WorkCompletion { byte_len: byte_len as u32, ..WorkCompletion::new(wr_id, qp.qpn(), WcStatus::Success, opcode) }
}

/// Puts `len` fresh bytes at [`SRC`] of `src` and fills `dst`; returns the bytes.
fn stage(src: &MemoryRegion, dst: &MemoryRegion, len: usize) -> Vec<u8> {
    let data = pattern(len, len as u32);
    src.write(SRC, &data).unwrap();
    fill(dst, FILL);
    data
}

fn unsignaled(wr: SendWr) -> SendWr {
    SendWr { flags: SendFlags { signaled: false, ..wr.flags }, ..wr }
}

/// Runs `case` for messages of 0, 1, MTU-1, MTU, MTU+1 and about 1 MiB
/// bytes, on an RC connection of each path MTU.
fn for_each_size(case: impl Fn(&End<'_>, &End<'_>, usize)) {
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        let pair = NodePair::connected(QpType::Rc, &options(mtu));
        assert_eq!((pair.qp_a.query().path_mtu, pair.qp_b.query().path_mtu), (mtu, mtu));
        let (a, b) = pair.ends();
        let m = mtu.bytes();
        for len in [0, 1, m - 1, m, m + 1, LARGE] {
            // Shown if the case fails.
            eprintln!("{len} bytes at MTU {m}");
            case(&a, &b, len);
        }
    }
}

/// A SEND (with immediate data if `imm`) from `a` into a receive of `b`
/// with 64 bytes to spare.
fn send_case(a: &End<'_>, b: &End<'_>, len: usize, imm: Option<u32>) {
    let data = stage(a.mr, b.mr, len);
    b.qp.post_recv(RecvWr { wr_id: 7, sg_list: softroce::sg_list![b.mr.sge(DST, len + 64)] }).unwrap();
    let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
    a.qp.post_send(SendWr::new(8, op).with_sge(a.mr.sge(SRC, len))).unwrap();
    assert_eq!(next_wc(a.cq), success(8, a.qp, WcOpcode::Send, len));
    assert_eq!(next_wc(b.cq), WorkCompletion { imm, ..success(7, b.qp, WcOpcode::Recv, len) });
    assert_holds_only(b.mr, DST, &data);
}

/// An RDMA WRITE (with immediate data if `imm`) from `a` into `b`'s region.
fn write_case(a: &End<'_>, b: &End<'_>, len: usize, imm: Option<u32>) {
    let data = stage(a.mr, b.mr, len);
    let (remote_addr, rkey) = (b.mr.addr() + DST as u64, b.mr.rkey());
    let op = match imm {
        Some(imm) => {
            b.qp.post_recv(RecvWr { wr_id: 7, sg_list: softroce::sg_list![] }).unwrap();
            SendOp::RdmaWriteWithImm { remote_addr, rkey, imm }
        }
        None => SendOp::RdmaWrite { remote_addr, rkey },
    };
    a.qp.post_send(SendWr::new(8, op).with_sge(a.mr.sge(SRC, len))).unwrap();
    assert_eq!(next_wc(a.cq), success(8, a.qp, WcOpcode::RdmaWrite, len));
    if imm.is_some() {
        assert_eq!(next_wc(b.cq), WorkCompletion { imm, ..success(7, b.qp, WcOpcode::RecvRdmaWithImm, len) });
    }
    assert_holds_only(b.mr, DST, &data);
}

/// An RDMA READ by `a` of `b`'s region.
fn read_case(a: &End<'_>, b: &End<'_>, len: usize) {
    let data = stage(b.mr, a.mr, len);
    let op = SendOp::RdmaRead { remote_addr: b.mr.addr() + SRC as u64, rkey: b.mr.rkey() };
    a.qp.post_send(SendWr::new(8, op).with_sge(a.mr.sge(DST, len))).unwrap();
    assert_eq!(next_wc(a.cq), success(8, a.qp, WcOpcode::RdmaRead, len));
    assert_holds_only(a.mr, DST, &data);
}

#[test]
fn rc_send_every_size() {
    for_each_size(|a, b, len| send_case(a, b, len, None));
}

#[test]
fn rc_send_with_imm_every_size() {
    for_each_size(|a, b, len| send_case(a, b, len, Some(0x0102_0304 ^ len as u32)));
}

#[test]
fn rc_rdma_write_every_size() {
    for_each_size(|a, b, len| write_case(a, b, len, None));
}

#[test]
fn rc_rdma_write_with_imm_every_size() {
    for_each_size(|a, b, len| write_case(a, b, len, Some(0xcafe_0000 | len as u32)));
}

#[test]
fn rc_rdma_read_every_size() {
    for_each_size(read_case);
}

/// Runs the atomic `op` (aimed at [`WORD`] of B's region, which holds
/// `before`) and checks the value returned to A and the one left at B.
fn atomic_case(pair: &NodePair, wr_id: u64, op: SendOp, before: u64, after: u64) {
    fill(&pair.mr_a, FILL);
    fill(&pair.mr_b, FILL);
    pair.mr_b.write(WORD, &before.to_ne_bytes()).unwrap();
    pair.qp_a.post_send(SendWr::new(wr_id, op).with_sge(pair.mr_a.sge(RESULT, 8))).unwrap();
    assert_eq!(next_wc(&pair.a.cq), success(wr_id, &pair.qp_a, op.wc_opcode(), 8));
    assert_holds_only(&pair.mr_a, RESULT, &before.to_ne_bytes());
    assert_holds_only(&pair.mr_b, WORD, &after.to_ne_bytes());
}

#[test]
fn rc_compare_swap_swaps_only_on_match() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu4096));
    let (remote_addr, rkey) = (pair.mr_b.addr() + WORD as u64, pair.mr_b.rkey());
    let old = 0x0123_4567_89ab_cdef;
    let new = 0xfedc_ba98_7654_3210;
    let matching = SendOp::CompareSwap { remote_addr, rkey, compare: old, swap: new };
    atomic_case(&pair, 1, matching, old, new);
    let mismatching = SendOp::CompareSwap { remote_addr, rkey, compare: old + 1, swap: new };
    atomic_case(&pair, 2, mismatching, old, old);
}

#[test]
fn rc_fetch_add_returns_the_old_value_and_wraps() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu4096));
    let (remote_addr, rkey) = (pair.mr_b.addr() + WORD as u64, pair.mr_b.rkey());
    atomic_case(&pair, 1, SendOp::FetchAdd { remote_addr, rkey, add: 0x1_0000_0001 }, 41, 0x1_0000_002a);
    atomic_case(&pair, 2, SendOp::FetchAdd { remote_addr, rkey, add: 3 }, u64::MAX - 1, 1);
}

#[test]
fn rc_sge_lists_span_two_regions() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let (a2, b2) = (pair.a.mr(8192), pair.b.mr(8192));
    let (head, tail) = (pattern(2500, 1), pattern(1800, 2));
    let message = [head.as_slice(), tail.as_slice()].concat();
    pair.mr_a.write(SRC, &head).unwrap();
    a2.write(5, &tail).unwrap();
    let gather = [pair.mr_a.sge(SRC, head.len()), a2.sge(5, tail.len())];

    // SEND gathers from both of A's regions and scatters over both of B's.
    fill(&pair.mr_b, FILL);
    fill(&b2, FILL);
    let scatter = softroce::sg_list![pair.mr_b.sge(DST, 1000), b2.sge(11, 4000)];
    pair.qp_b.post_recv(RecvWr { wr_id: 1, sg_list: scatter }).unwrap();
    pair.qp_a.post_send(SendWr { sg_list: gather.as_slice().into(), ..SendWr::new(2, SendOp::Send) }).unwrap();
    assert_eq!(next_wc(&pair.a.cq), success(2, &pair.qp_a, WcOpcode::Send, message.len()));
    assert_eq!(next_wc(&pair.b.cq), success(1, &pair.qp_b, WcOpcode::Recv, message.len()));
    assert_holds_only(&pair.mr_b, DST, &message[..1000]);
    assert_holds_only(&b2, 11, &message[1000..]);

    // WRITE gathers them into one remote range...
    fill(&pair.mr_b, FILL);
    let write = SendOp::RdmaWrite { remote_addr: pair.mr_b.addr() + DST as u64, rkey: pair.mr_b.rkey() };
    pair.qp_a.post_send(SendWr { sg_list: gather.as_slice().into(), ..SendWr::new(3, write) }).unwrap();
    assert_eq!(next_wc(&pair.a.cq), success(3, &pair.qp_a, WcOpcode::RdmaWrite, message.len()));
    assert_holds_only(&pair.mr_b, DST, &message);

    // ...and READ scatters that range over two local regions.
    fill(&pair.mr_a, FILL);
    fill(&a2, FILL);
    let read = SendOp::RdmaRead { remote_addr: pair.mr_b.addr() + DST as u64, rkey: pair.mr_b.rkey() };
    let sg_list = softroce::sg_list![a2.sge(100, 3000), pair.mr_a.sge(DST, message.len() - 3000)];
    pair.qp_a.post_send(SendWr { sg_list, ..SendWr::new(4, read) }).unwrap();
    assert_eq!(next_wc(&pair.a.cq), success(4, &pair.qp_a, WcOpcode::RdmaRead, message.len()));
    assert_holds_only(&a2, 100, &message[..3000]);
    assert_holds_only(&pair.mr_a, DST, &message[3000..]);
}

#[test]
fn rc_inline_sends_and_writes_carry_the_posted_bytes() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let data = pattern(200, 9);
    let inline = |wr_id, op| SendWr {
        flags: SendFlags { inline: true, signaled: true, ..SendFlags::default() },
        inline_data: data.as_slice().into(),
        ..SendWr::new(wr_id, op)
    };
    fill(&pair.mr_b, FILL);
    pair.qp_b.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![pair.mr_b.sge(DST, 256)] }).unwrap();
    pair.qp_a.post_send(inline(2, SendOp::Send)).unwrap();
    assert_eq!(next_wc(&pair.a.cq), success(2, &pair.qp_a, WcOpcode::Send, data.len()));
    assert_eq!(next_wc(&pair.b.cq), success(1, &pair.qp_b, WcOpcode::Recv, data.len()));
    assert_holds_only(&pair.mr_b, DST, &data);

    fill(&pair.mr_b, FILL);
    let write = SendOp::RdmaWrite { remote_addr: pair.mr_b.addr() + 77, rkey: pair.mr_b.rkey() };
    pair.qp_a.post_send(inline(3, write)).unwrap();
    assert_eq!(next_wc(&pair.a.cq), success(3, &pair.qp_a, WcOpcode::RdmaWrite, data.len()));
    assert_holds_only(&pair.mr_b, 77, &data);
}

/// Posts three SENDs of 100 bytes from A, each into a receive of B, and
/// waits for the receives.
fn send_three(a: &End<'_>, b: &End<'_>, signaled: [bool; 3]) {
    for (wr_id, signaled) in (1..).zip(signaled) {
        b.qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![b.mr.sge(0, 100)] }).unwrap();
        let wr = SendWr::new(wr_id, SendOp::Send).with_sge(a.mr.sge(0, 100));
        a.qp.post_send(if signaled { wr } else { unsignaled(wr) }).unwrap();
    }
    for wr_id in 1..=3 {
        assert_eq!(next_wc(b.cq), success(wr_id, b.qp, WcOpcode::Recv, 100));
    }
}

#[test]
fn unsignaled_sends_complete_silently() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let (a, b) = pair.ends();
    send_three(&a, &b, [false, true, false]);
    assert_eq!(next_wc(&pair.a.cq), success(2, &pair.qp_a, WcOpcode::Send, 100));
    assert_no_wc(&pair.a.cq);
}

/// rxe-spec T-6: an unsignaled SEND asks for no ACK; with nothing after it,
/// the requester asks on its own (its last packet again, which the peer
/// acknowledges as a duplicate) well before the ACK timeout, and the send
/// queue drains without a retry.
#[test]
fn an_unsignaled_send_alone_is_acknowledged_without_a_retry() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let (a, b) = pair.ends();
    b.qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![b.mr.sge(0, 100)] }).unwrap();
    a.qp.post_send(unsignaled(SendWr::new(2, SendOp::Send).with_sge(a.mr.sge(0, 100)))).unwrap();
    assert_eq!(next_wc(b.cq).status, WcStatus::Success);
    let drain = QpAttr { state: QpState::Sqd, en_sqd_async_notify: true, ..QpAttr::default() };
    a.qp.modify(&drain, AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY).unwrap();
    assert_eq!(next_async_event(&pair.a.ctx), AsyncEvent::SqDrained { qpn: a.qp.qpn() });
    let (sent, answered) = (pair.a.ctx.counters().qp, pair.b.ctx.counters().qp);
    assert_eq!((sent.retries, sent.timeouts), (0, 0));
    assert_eq!(answered.duplicate_requests, 1, "the ask is the SEND again");
    assert_no_wc(a.cq);
}

#[test]
fn sq_sig_all_signals_every_send() {
    let (node_a, node_b) = nodes(false);
    let qp_a = node_a.init(QpType::Rc).sig_all(true).build().unwrap();
    let qp_b = node_b.qp(QpType::Rc);
    connect(&qp_a, &qp_b, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    let (mr_a, mr_b) = (node_a.mr(4096), node_b.mr(4096));
    let a = End { qp: &qp_a, cq: &node_a.cq, mr: &mr_a };
    let b = End { qp: &qp_b, cq: &node_b.cq, mr: &mr_b };
    send_three(&a, &b, [false, false, true]);
    for wr_id in 1..=3 {
        assert_eq!(next_wc(&node_a.cq), success(wr_id, &qp_a, WcOpcode::Send, 100));
    }
    assert_no_wc(&node_a.cq);
}

#[test]
fn uc_send_and_write() {
    let pair = NodePair::connected(QpType::Uc, &options(Mtu::Mtu1024));
    let (a, b) = pair.ends();
    for len in [0, 1, 3000] {
        eprintln!("{len} bytes");
        send_case(&a, &b, len, None);
        send_case(&a, &b, len, Some(0xabcd));
        // UC completes a WRITE once it is on the wire; WRITE_WITH_IMM makes
        // the responder say when it has it.
        write_case(&a, &b, len, Some(0x1234));
    }
    // A plain WRITE, then one with immediate data: when the second is
    // received the first (sent before it on the same path) landed too.
    let data = stage(&pair.mr_a, &pair.mr_b, 3000);
    let (addr, rkey) = (pair.mr_b.addr(), pair.mr_b.rkey());
    let first = SendOp::RdmaWrite { remote_addr: addr + DST as u64, rkey };
    let second = SendOp::RdmaWriteWithImm { remote_addr: addr + 3 * DST as u64, rkey, imm: 5 };
    pair.qp_b.post_recv(RecvWr { wr_id: 9, sg_list: softroce::sg_list![] }).unwrap();
    pair.qp_a.post_send(SendWr::new(10, first).with_sge(pair.mr_a.sge(SRC, 1000))).unwrap();
    pair.qp_a.post_send(SendWr::new(11, second).with_sge(pair.mr_a.sge(SRC + 1000, 2000))).unwrap();
    assert_eq!(next_wc(&pair.a.cq), success(10, &pair.qp_a, WcOpcode::RdmaWrite, 1000));
    assert_eq!(next_wc(&pair.a.cq), success(11, &pair.qp_a, WcOpcode::RdmaWrite, 2000));
    let recv = next_wc(&pair.b.cq);
    assert_eq!(recv, WorkCompletion { imm: Some(5), ..success(9, &pair.qp_b, WcOpcode::RecvRdmaWithImm, 2000) });
    let mut landed = vec![FILL; 2 * DST + 2000];
    landed[..1000].copy_from_slice(&data[..1000]);
    landed[2 * DST..].copy_from_slice(&data[1000..]);
    assert_holds_only(&pair.mr_b, DST, &landed);
}

/// The length of a UD packet with `len` bytes of payload after its IP
/// header: UDP, BTH, DETH, ImmDt if any, payload and pad, ICRC.
fn ud_ip_payload_len(len: usize, imm: bool) -> usize {
    8 + 12 + 8 + if imm { 4 } else { 0 } + len.next_multiple_of(4) + 4
}

/// Checks the 40-byte GRH area of a UD receive: for IPv4, 20 zero bytes and
/// the IPv4 header of the packet; for IPv6, the IPv6 header.
fn assert_grh(area: &[u8], src: IpAddr, dst: IpAddr, len: usize, imm: bool) {
    let length = |field: &[u8], header: usize, what: &str| {
        let value = usize::from(u16::from_be_bytes([field[0], field[1]]));
        assert_eq!(value, header + ud_ip_payload_len(len, imm), "{what}");
    };
    match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            assert_eq!(area[..20], [0; 20], "the 20 bytes before the IPv4 header");
            let ip = &area[20..];
            assert_eq!(ip[0], 0x45, "IPv4, 20-byte header");
            length(&ip[2..4], 20, "total length");
            assert_eq!(ip[9], 17, "protocol UDP");
            let addr = |at: usize| Ipv4Addr::from(<[u8; 4]>::try_from(&ip[at..at + 4]).unwrap());
            assert_eq!((addr(12), addr(16)), (src, dst));
            let sum = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum::<u32>();
            assert_eq!((sum & 0xffff) + (sum >> 16), 0xffff, "header checksum");
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            assert_eq!(area[0] >> 4, 6, "IPv6");
            length(&area[4..6], 0, "payload length");
            assert_eq!(area[6], 17, "next header UDP");
            let addr = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&area[at..at + 16]).unwrap());
            assert_eq!((addr(8), addr(24)), (src, dst));
        }
        _ => panic!("mixed IP versions"),
    }
}

/// UD SEND and SEND_WITH_IMM of 1, 1000 and 4096 (the MTU) bytes from
/// `a` to `b` through an address handle for `b_ip`.
fn ud_sends(a: &End<'_>, b: &End<'_>, ah: &AddressHandle, (a_ip, b_ip): (IpAddr, IpAddr)) {
    for (wr_id, len, imm) in [(1, 1, None), (2, 1000, Some(0xfeed)), (3, 4096, None), (4, 1, Some(7))] {
        eprintln!("{len} bytes, immediate {imm:?}");
        let data = stage(a.mr, b.mr, len);
        b.qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![b.mr.sge(0, GRH_LEN + len)] }).unwrap();
        let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
        let wr = SendWr { ud: Some(ah.ud_dest(b.qp.qpn(), QKEY)), ..SendWr::new(wr_id, op) };
        a.qp.post_send(wr.with_sge(a.mr.sge(SRC, len))).unwrap();
        assert_eq!(next_wc(a.cq), success(wr_id, a.qp, WcOpcode::Send, len));
        let expected = WorkCompletion {
            imm,
            src_qp: a.qp.qpn(),
            grh: true,
            ..success(wr_id, b.qp, WcOpcode::Recv, GRH_LEN + len)
        };
        assert_eq!(next_wc(b.cq), expected);
        let received = contents(b.mr);
        assert_grh(&received[..GRH_LEN], a_ip, b_ip, len, imm.is_some());
        assert_holds_only(b.mr, 0, &[&received[..GRH_LEN], &data].concat());
    }
}

#[test]
fn ud_send_and_send_with_imm_through_an_address_handle() {
    let (node_a, node_b) = nodes(false);
    let (qp_a, qp_b) = (node_a.qp(QpType::Ud), node_b.qp(QpType::Ud));
    qp_a.activate(QKEY).unwrap();
    qp_b.activate(QKEY).unwrap();
    let (mr_a, mr_b) = (node_a.mr(8192), node_b.mr(8192));
    let ah = node_a.pd.create_ah(node_b.ctx.device().gid(1).unwrap());
    let a = End { qp: &qp_a, cq: &node_a.cq, mr: &mr_a };
    let b = End { qp: &qp_b, cq: &node_b.cq, mr: &mr_b };
    ud_sends(&a, &b, &ah, (IP_A, IP_B));
}

#[test]
fn srq_shared_by_two_qps_raises_its_limit_event() {
    const SLOT: usize = 4096;
    let (node_a, node_b) = nodes(false);
    let srq = node_b.pd.create_srq(16, 1).unwrap();
    let shared = node_b.init(QpType::Rc).srq(&srq);
    let senders = [node_a.qp(QpType::Rc), node_a.qp(QpType::Rc)];
    let receivers = [shared.build().unwrap(), shared.build().unwrap()];
    for (sender, receiver) in senders.iter().zip(&receivers) {
        connect(sender, receiver, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
    }
    let (mr_a, mr_b) = (node_a.mr(8 * SLOT), node_b.mr(8 * SLOT));
    fill(&mr_b, FILL);
    for slot in 0..6 {
        srq.post_recv(RecvWr { wr_id: 100 + slot as u64, sg_list: softroce::sg_list![mr_b.sge(slot * SLOT, SLOT)] })
            .unwrap();
    }
    srq.arm_limit(3);
    let mut landed = Vec::new();
    // The messages alternate between the QPs; each takes the oldest receive.
    for slot in 0..5 {
        let data = pattern(1000 + slot, slot as u32);
        mr_a.write(slot * SLOT, &data).unwrap();
        let sender = &senders[slot % 2];
        sender.post_send(SendWr::new(slot as u64, SendOp::Send).with_sge(mr_a.sge(slot * SLOT, data.len()))).unwrap();
        assert_eq!(next_wc(&node_a.cq), success(slot as u64, sender, WcOpcode::Send, data.len()));
        let receiver = &receivers[slot % 2];
        assert_eq!(next_wc(&node_b.cq), success(100 + slot as u64, receiver, WcOpcode::Recv, data.len()));
        landed.resize(slot * SLOT, FILL);
        landed.extend_from_slice(&data);
        assert_holds_only(&mr_b, 0, &landed);
        // 6 - (slot + 1) receives are left: the event fires, once, when
        // fewer than 3 are.
        // The async descriptor is readable exactly while an event waits.
        let async_fd = node_b.ctx.async_event_fd();
        if slot == 3 {
            assert_eq!(softroce::net::wait_readable(&[async_fd], Duration::from_secs(10)), 1);
            assert_eq!(next_async_event(&node_b.ctx), AsyncEvent::SrqLimitReached { srq: srq.id() });
            assert_eq!(softroce::net::wait_readable(&[async_fd], Duration::ZERO), 0);
        } else {
            std::thread::sleep(QUIET);
            assert_eq!(softroce::net::wait_readable(&[async_fd], Duration::ZERO), 0, "after message {slot}");
            assert_eq!(node_b.ctx.poll_async_event(), None, "after message {slot}");
        }
    }
}

/// A post to the SRQ wakes no engine, and needs none (rxe-spec V-10): the
/// SEND that met it empty comes again on the requester's RNR timer and
/// takes the receive.
#[test]
fn a_send_that_found_the_srq_empty_lands_once_a_receive_is_posted() {
    const REFILLS: u64 = 20;
    let (node_a, node_b) = nodes(false);
    let srq = node_b.pd.create_srq(REFILLS as u32 + 4, 1).unwrap();
    let (sender, receiver) = (node_a.qp(QpType::Rc), node_b.init(QpType::Rc).srq(&srq).build().unwrap());
    // The shortest RNR wait (10 µs), retried for ever.
    let responder = ConnectOptions { min_rnr_timer: 1, ..options(Mtu::Mtu1024) };
    connect(&sender, &receiver, &ConnectOptions { rnr_retry: 7, ..options(Mtu::Mtu1024) }, &responder);
    let (mr_a, mr_b) = (node_a.mr(4096), node_b.mr(4096));
    fill(&mr_b, FILL);
    let data = pattern(100, 7);
    mr_a.write(0, &data).unwrap();
    sender.post_send(SendWr::new(1, SendOp::Send).with_sge(mr_a.sge(0, data.len()))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while node_b.ctx.counters().qp.rnr_naks_sent == 0 {
        assert!(Instant::now() < deadline, "the SEND never met the empty SRQ");
        std::thread::sleep(Duration::from_millis(1));
    }
    srq.post_recv(RecvWr { wr_id: 100, sg_list: softroce::sg_list![mr_b.sge(0, 4096)] }).unwrap();
    assert_eq!(next_wc(&node_a.cq), success(1, &sender, WcOpcode::Send, data.len()));
    assert_eq!(next_wc(&node_b.cq), success(100, &receiver, WcOpcode::Recv, data.len()));
    assert_holds_only(&mr_b, 0, &data);
    // Refills of an idle device, as UCX's every few messages: the engine
    // sleeps through them (each ring used to wake it, and it slept again).
    std::thread::sleep(QUIET);
    let sleeps = node_b.ctx.counters().sleeps;
    for wr_id in 0..REFILLS {
        srq.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![mr_b.sge(0, 64)] }).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let woken = node_b.ctx.counters().sleeps - sleeps;
    assert!(woken < REFILLS / 4, "the engine woke {woken} times for {REFILLS} receives");
}

/// A connection whose next SENDs each find a receive.
fn channel_pair() -> NodePair {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    for wr_id in 0..4 {
        pair.qp_b.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![pair.mr_b.sge(0, 64)] }).unwrap();
    }
    pair
}

/// A SEND of 64 bytes from A; waits for B's receive and returns it.
fn send_to_b(pair: &NodePair, solicited: bool) -> WorkCompletion {
    let mut wr = SendWr::new(1, SendOp::Send).with_sge(pair.mr_a.sge(0, 64));
    wr.flags.solicited = solicited;
    pair.qp_a.post_send(wr).unwrap();
    assert_eq!(next_wc(&pair.a.cq).status, WcStatus::Success);
    next_wc(&pair.b.cq)
}

#[test]
fn comp_channel_fires_once_after_req_notify() {
    let pair = channel_pair();
    pair.b.cq.req_notify(false);
    assert!(!channel_readable(&pair.b.channel, Duration::ZERO), "readable before any completion");
    assert!(!send_to_b(&pair, false).solicited);
    assert!(channel_readable(&pair.b.channel, WAIT), "no event after the completion");
    assert_eq!(pair.b.channel.get_event(WAIT), Some(pair.b.cq.id()));
    assert!(!channel_readable(&pair.b.channel, Duration::ZERO), "readable after the event was taken");
    // The event disarmed the CQ.
    send_to_b(&pair, false);
    assert!(!channel_readable(&pair.b.channel, QUIET), "an event without arming again");
    assert_eq!(pair.b.channel.get_event(Duration::ZERO), None);
}

#[test]
fn comp_channel_solicited_only_waits_for_a_solicited_completion() {
    let pair = channel_pair();
    pair.b.cq.req_notify(true);
    assert!(!send_to_b(&pair, false).solicited);
    assert!(!channel_readable(&pair.b.channel, QUIET), "an unsolicited completion raised an event");
    assert!(send_to_b(&pair, true).solicited);
    assert!(channel_readable(&pair.b.channel, WAIT), "no event after the solicited completion");
    assert_eq!(pair.b.channel.get_event(WAIT), Some(pair.b.cq.id()));
}

#[test]
fn comp_channel_is_silent_without_arming() {
    let pair = channel_pair();
    send_to_b(&pair, true);
    send_to_b(&pair, false);
    assert!(!channel_readable(&pair.b.channel, QUIET), "readable without req_notify");
    assert!(!channel_readable(&pair.a.channel, Duration::ZERO), "readable without req_notify");
    assert_eq!(pair.b.channel.get_event(QUIET), None);
}

#[test]
fn counters_count_packets_without_icrc_errors() {
    const PACKETS: u64 = 10;
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let (a, b) = pair.ends();
    let (before_a, before_b) = (pair.a.ctx.counters(), pair.b.ctx.counters());
    send_case(&a, &b, PACKETS as usize * 1024, None);
    // The engines publish link counters once per loop: wait for them.
    wait_for("the packets to be counted", || {
        let (now_a, now_b) = (pair.a.ctx.counters(), pair.b.ctx.counters());
        now_a.qp.sent_packets >= before_a.qp.sent_packets + PACKETS
            && now_a.link.sent >= before_a.link.sent + PACKETS
            && now_b.qp.received_packets >= before_b.qp.received_packets + PACKETS
            && now_b.link.received >= before_b.link.received + PACKETS
            // At least one ACK back.
            && now_b.qp.sent_packets > before_b.qp.sent_packets
            && now_a.qp.received_packets > before_a.qp.received_packets
    });
    for counters in [pair.a.ctx.counters(), pair.b.ctx.counters()] {
        assert_eq!((counters.link.icrc_errors, counters.link.malformed), (0, 0), "{counters:?}");
    }
}

#[test]
fn busy_poll_contexts_move_data() {
    let pair = NodePair::new(nodes(true), QpType::Rc, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
    let (a, b) = pair.ends();
    send_case(&a, &b, 100_000, Some(1));
    write_case(&a, &b, 100_000, None);
    read_case(&a, &b, 100_000);
}

/// Loopback IPv6 has one address, so both ends are QPs of one device on ::1.
#[test]
fn ipv6_loopback_between_two_qps_of_one_device() {
    let ip = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let node = Node::open(
        "node_v6",
        ip,
        ContextOptions { port: free_port(&[ip]), busy_poll: false, ..ContextOptions::default() },
    );
    let cq_2 = node.ctx.create_cq(64, None).unwrap();
    let second = |qp_type| node.pd.create_qp(qp_type, &cq_2).build().unwrap();
    let (mr_1, mr_2) = (node.mr(MR_LEN), node.mr(MR_LEN));

    let (rc_1, rc_2) = (node.qp(QpType::Rc), second(QpType::Rc));
    assert_eq!(rc_1.endpoint(1).unwrap().gid.to_ip(), ip);
    connect(&rc_1, &rc_2, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    let one = End { qp: &rc_1, cq: &node.cq, mr: &mr_1 };
    let two = End { qp: &rc_2, cq: &cq_2, mr: &mr_2 };
    for len in [1, 1024, 5000] {
        eprintln!("{len} bytes");
        send_case(&one, &two, len, Some(3));
        write_case(&one, &two, len, None);
        read_case(&one, &two, len);
    }

    let (ud_1, ud_2) = (node.qp(QpType::Ud), second(QpType::Ud));
    ud_1.activate(QKEY).unwrap();
    ud_2.activate(QKEY).unwrap();
    let ah = node.pd.create_ah(node.ctx.device().gid(1).unwrap());
    let one = End { qp: &ud_1, cq: &node.cq, mr: &mr_1 };
    let two = End { qp: &ud_2, cq: &cq_2, mr: &mr_2 };
    ud_sends(&one, &two, &ah, (ip, ip));
}

#[test]
fn a_qp_destroyed_right_after_its_last_receive_still_acknowledges_it() {
    // The classic examples destroy their QPs as soon as the last receive
    // completes; the ACK of that message is still queued in the engine and
    // must go out, or the peer retries into a QP that is gone.
    for round in 0..20 {
        let options =
            ConnectOptions { timeout: AckTimeout::from_exponent(14).unwrap(), retry_cnt: 1, ..options(Mtu::Mtu1024) };
        let NodePair { a, b, qp_a, qp_b, mr_a, mr_b } = NodePair::connected(QpType::Rc, &options);
        qp_b.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![mr_b.sge(0, 64)] }).unwrap();
        qp_a.post_send(SendWr::new(2, SendOp::Send).with_sge(mr_a.sge(0, 64))).unwrap();
        // Spin, so the drop races the engine's next step as closely as it can.
        let received = loop {
            if let Some(wc) = b.cq.poll_one() {
                break wc;
            }
            std::hint::spin_loop();
        };
        drop(qp_b);
        assert_eq!(received.status, WcStatus::Success, "round {round}");
        let wc = next_wc(&a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (2, WcStatus::Success),
            "round {round}: {wc:?} {:?} {:?}",
            a.ctx.counters(),
            b.ctx.counters()
        );
        drop((a, qp_a, mr_a, mr_b));
    }
}

#[test]
fn a_posted_list_runs_in_order_up_to_the_request_the_qp_refuses() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let data = stage(&pair.mr_a, &pair.mr_b, 3000);
    let rkey = pair.mr_b.rkey();
    let write = |wr_id: u64, at: usize, len: usize| {
        let op = SendOp::RdmaWrite { remote_addr: pair.mr_b.addr() + (DST + at) as u64, rkey };
        SendWr::new(wr_id, op).with_sge(pair.mr_a.sge(SRC + at, len))
    };
    let too_many_sges = SendWr { sg_list: softroce::sg_list![pair.mr_a.sge(SRC, 1); 17], ..write(3, 0, 0) };
    let list = [write(1, 0, 1000), write(2, 1000, 2000), too_many_sges, write(4, 0, 1)];

    let (bad, error) = pair.qp_a.post_send_list(list).unwrap_err();
    assert_eq!(bad, 2, "libibverbs' bad_wr: the third");
    assert!(matches!(error, Error::PostSend(PostSendError::TooManySge { given: 17, max: 16 })), "{error}");
    assert_eq!(next_wc(&pair.a.cq), success(1, &pair.qp_a, WcOpcode::RdmaWrite, 1000));
    assert_eq!(next_wc(&pair.a.cq), success(2, &pair.qp_a, WcOpcode::RdmaWrite, 2000));
    assert_holds_only(&pair.mr_b, DST, &data);
    assert_eq!(pair.a.cq.wait_one(Duration::from_millis(100)), None, "nothing after the refused one");
}
