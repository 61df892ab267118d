//! The hostile-peer suite (rxe-spec/security.md): what a peer on the
//! network, or an off-path attacker, can send softroce, and what softroce
//! does about it. No packet makes softroce touch memory outside a granted
//! region; nothing panics, hangs or grows without bound; packets injected
//! from off path are not accepted; QPs that should keep working keep working.
//!
//! Sans-IO tests drive one QP with packets built by hand with `RoceRepr`,
//! for exact control of every field, and check the exact answer (or
//! silence), the QP state, the completions and every byte of memory. Verbs
//! tests aim crafted datagrams at a real context over loopback UDP, where
//! the engine matters: unknown QPs, malformed datagrams, spoofed sources,
//! floods and teardown.

mod support;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use softroce::transport::memory::offset_in;
use softroce::transport::*;
use softroce::verbs::{ConnectOptions, ContextOptions, MemoryRegion, QueuePair};
use softroce::wire::{
    AtomicAckEthRepr, NakCode, Opcode, Operation as Op, Psn, RethRepr, RoceRepr, Syndrome, Transport, ROCE_UDP_PORT,
};
use support::fake_peer::FakePeer;
use support::qp::*;
use support::verbs::{
    assert_holds_only, connect, contents, fill, free_port, next_async_event, next_wc, nodes, options, wait_for, Node,
    ALL_ACCESS, FILL, IP_A, QUIET, WAIT,
};
use support::{pattern, Rng};

/// Duplicates in a flood.
const FLOOD: usize = 10_000;

/// The PSN `n` after (or, negative, before) `psn`, modulo 2^24.
fn psn_plus(psn: u32, n: i64) -> u32 {
    Psn::new((i64::from(psn) + n).rem_euclid(1 << 24) as u32).value()
}

/// (queue, wr_id, status) of each completion.
fn statuses(wcs: &[(CqKind, WorkCompletion)]) -> Vec<(CqKind, u64, WcStatus)> {
    wcs.iter().map(|(cq, wc)| (*cq, wc.wr_id, wc.status)).collect()
}

/// Where the tests post receive buffers in the target's region.
const RECV_AT: u64 = 0x8000;
/// An off-path attacker: any address but the peer's.
const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 66));

/// The target of the sans-IO attacks: an RC QP in RTS whose region holds a
/// pattern, not zeros, so that a write of zeros shows too.
fn target() -> TestQp {
    target_with(attr())
}

/// [`target`] with other attributes.
fn target_with(attr: QpAttr) -> TestQp {
    // Made once: a debug build takes a while over 256 KiB.
    static CONTENTS: OnceLock<Vec<u8>> = OnceLock::new();
    let mut t = TestQp::new(QpType::Rc, attr);
    t.fill(0, CONTENTS.get_or_init(|| pattern(REGION_LEN, 0x5a)));
    t
}

/// The current 64-bit word at `offset` of the target's region.
fn word(t: &TestQp, offset: u64) -> u64 {
    u64::from_ne_bytes(t.bytes(offset, 8).try_into().unwrap())
}

// ---------------------------------------------------------------------------
// 1. Memory safety at the boundary.
// ---------------------------------------------------------------------------

/// A request the target must refuse, and the NAK it must answer with.
struct Refusal {
    what: String,
    header: RoceRepr,
    payload: Vec<u8>,
    code: NakCode,
}

impl Refusal {
    fn new(what: impl Into<String>, header: RoceRepr, payload: Vec<u8>, code: NakCode) -> Refusal {
        Refusal { what: what.into(), header, payload, code }
    }
}

/// WRITE_ONLY, WRITE_FIRST, WRITE_ONLY_IMM, READ, CMP_SWAP and FETCH_ADD
/// at `va` with `rkey`, each to be refused with `code`.
fn every_remote_op(what: &str, va: u64, rkey: u32, code: NakCode) -> Vec<Refusal> {
    vec![
        Refusal::new(
            format!("{what}: WRITE_ONLY"),
            rc(Op::WriteOnly, RQ_PSN).ack_req().reth(va, rkey, 16),
            pattern(16, 1),
            code,
        ),
        Refusal::new(
            format!("{what}: WRITE_FIRST"),
            rc(Op::WriteFirst, RQ_PSN).reth(va, rkey, 4 * MTU as u32),
            pattern(MTU, 2),
            code,
        ),
        Refusal::new(
            format!("{what}: WRITE_ONLY_IMM"),
            RoceRepr { imm: Some(7), ..rc(Op::WriteOnlyImm, RQ_PSN).ack_req().reth(va, rkey, 16) },
            pattern(16, 3),
            code,
        ),
        Refusal::new(format!("{what}: READ"), rc(Op::ReadRequest, RQ_PSN).ack_req().reth(va, rkey, 16), vec![], code),
        Refusal::new(
            format!("{what}: CMP_SWAP"),
            rc(Op::CompareSwap, RQ_PSN).ack_req().atomic_eth(va, rkey, 1, 0),
            vec![],
            code,
        ),
        Refusal::new(
            format!("{what}: FETCH_ADD"),
            rc(Op::FetchAdd, RQ_PSN).ack_req().atomic_eth(va, rkey, 1, 0),
            vec![],
            code,
        ),
    ]
}

/// Feeds each refusal to a fresh target (`setup` applied, two receives
/// posted) and checks: exactly one NAK with its code for its PSN, to the
/// peer; the QP in ERR with the matching event; both receives flushed; no
/// byte of any region changed; silence afterwards.
fn assert_refusals(setup: fn(&mut TestQp), refusals: Vec<Refusal>) {
    for r in refusals {
        let what = &r.what;
        let mut t = target();
        setup(&mut t);
        t.post_recv(1, RECV_AT, 4096);
        t.post_recv(2, RECV_AT + 4096, 4096);
        let before = t.snapshot();
        t.feed(r.header, &r.payload);

        let sent = t.transmit();
        assert_eq!(sent.len(), 1, "{what}: {sent:#?}");
        let nak = &sent[0];
        let expected = (Op::Acknowledge, RQ_PSN, Syndrome::Nak(r.code), 0, PEER, PEER_QPN);
        assert_eq!(
            (nak.op(), nak.psn(), nak.syndrome(), nak.msn(), nak.dest, nak.header.bth.dest_qpn),
            expected,
            "{what}"
        );
        assert_eq!(t.qp.state(), QpState::Err, "{what}");
        let event = match r.code {
            NakCode::RemoteAccessError => AsyncEvent::QpAccessError { qpn: QPN },
            _ => AsyncEvent::QpRequestError { qpn: QPN },
        };
        assert_eq!(t.events(), vec![event], "{what}");
        let flushed = vec![(CqKind::Recv, 1, WcStatus::WrFlushErr), (CqKind::Recv, 2, WcStatus::WrFlushErr)];
        assert_eq!(statuses(&t.completions()), flushed, "{what}");
        t.assert_memory_is(&before, what);
        t.feed(rc(Op::SendOnly, RQ_PSN + 1).ack_req(), &[1; 4]);
        assert!(t.transmit().is_empty(), "{what}: answered in ERR");
    }
}

#[test]
fn wrong_rkeys_are_remote_access_errors() {
    let mut refusals = Vec::new();
    for bad in [KEY ^ 1, KEY ^ 0x8000_0000, 0, u32::MAX] {
        refusals.extend(every_remote_op(&format!("rkey {bad:#x}"), VA, bad, NakCode::RemoteAccessError));
    }
    assert_refusals(|_| {}, refusals);
}

const FOREIGN_KEY: u32 = 0xf0_0001;
const FOREIGN_VA: u64 = 0x4000_0000;

#[test]
fn rkeys_of_another_pd_are_remote_access_errors() {
    fn foreign(t: &mut TestQp) {
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        t.register(FOREIGN_KEY, Region { pd: PD + 1, addr: FOREIGN_VA, access, data: pattern(8192, 9) });
    }
    assert_refusals(foreign, every_remote_op("other PD", FOREIGN_VA, FOREIGN_KEY, NakCode::RemoteAccessError));
}

const READ_ONLY_KEY: u32 = 0xf0_0002;
const WRITE_ONLY_KEY: u32 = 0xf0_0003;
const NO_RIGHTS_KEY: u32 = 0xf0_0004;

#[test]
fn regions_without_the_right_are_remote_access_errors() {
    fn limited(t: &mut TestQp) {
        let region = |addr, access| Region { pd: PD, addr, access, data: pattern(8192, addr as u32) };
        t.register(READ_ONLY_KEY, region(0x5000_0000, Access::LOCAL_WRITE | Access::REMOTE_READ));
        t.register(WRITE_ONLY_KEY, region(0x6000_0000, Access::LOCAL_WRITE | Access::REMOTE_WRITE));
        t.register(NO_RIGHTS_KEY, region(0x7000_0000, Access::NONE));
    }
    let code = NakCode::RemoteAccessError;
    let mut refusals: Vec<Refusal> = every_remote_op("read-only region", 0x5000_0000, READ_ONLY_KEY, code)
        .into_iter()
        .filter(|r| r.header.bth.opcode.operation() != Op::ReadRequest)
        .collect();
    refusals.extend(
        every_remote_op("write-only region", 0x6000_0000, WRITE_ONLY_KEY, code)
            .into_iter()
            .filter(|r| !matches!(r.header.bth.opcode.operation(), Op::WriteOnly | Op::WriteFirst | Op::WriteOnlyImm)),
    );
    refusals.extend(every_remote_op("region without rights", 0x7000_0000, NO_RIGHTS_KEY, code));
    assert_refusals(limited, refusals);
}

const LOW_KEY: u32 = 0xf0_0005;

#[test]
fn ranges_wrapping_2_pow_64_are_remote_access_errors() {
    // A region at address 0: a range that wraps past 2^64 would land in it.
    fn low(t: &mut TestQp) {
        let region = Region { pd: PD, addr: 0, access: ALL_ACCESS, data: pattern(4096, 4) };
        t.register(LOW_KEY, region);
    }
    let code = NakCode::RemoteAccessError;
    let top = u64::MAX;
    let refusals = vec![
        Refusal::new(
            "WRITE_ONLY wrapping",
            rc(Op::WriteOnly, RQ_PSN).ack_req().reth(top - 3, LOW_KEY, 8),
            pattern(8, 1),
            code,
        ),
        Refusal::new(
            "WRITE_FIRST wrapping",
            rc(Op::WriteFirst, RQ_PSN).reth(top - 1023, LOW_KEY, 2048),
            pattern(MTU, 1),
            code,
        ),
        Refusal::new("READ wrapping", rc(Op::ReadRequest, RQ_PSN).ack_req().reth(top - 3, LOW_KEY, 8), vec![], code),
        Refusal::new(
            "READ of 4 GiB from the top",
            rc(Op::ReadRequest, RQ_PSN).reth(top, LOW_KEY, u32::MAX),
            vec![],
            code,
        ),
        Refusal::new("CMP_SWAP wrapping", rc(Op::CompareSwap, RQ_PSN).atomic_eth(top - 7, LOW_KEY, 1, 0), vec![], code),
        Refusal::new("FETCH_ADD wrapping", rc(Op::FetchAdd, RQ_PSN).atomic_eth(top - 7, LOW_KEY, 1, 0), vec![], code),
        Refusal::new(
            "WRITE_ONLY wrapping the main region",
            rc(Op::WriteOnly, RQ_PSN).reth(top - 7, KEY, 16),
            pattern(16, 1),
            code,
        ),
    ];
    assert_refusals(low, refusals);
}

#[test]
fn ranges_past_the_region_and_reads_larger_than_it_are_remote_access_errors() {
    let code = NakCode::RemoteAccessError;
    let end = VA + REGION_LEN as u64;
    let len = REGION_LEN as u32;
    let write = |va, dma_len| rc(Op::WriteOnly, RQ_PSN).ack_req().reth(va, KEY, dma_len);
    let read = |va, dma_len| rc(Op::ReadRequest, RQ_PSN).ack_req().reth(va, KEY, dma_len);
    let refusals = vec![
        Refusal::new("WRITE straddling the end", write(end - 8, 16), pattern(16, 1), code),
        Refusal::new("WRITE just past the end", write(end, 1), pattern(1, 1), code),
        Refusal::new("WRITE just before the start", write(VA - 1, 2), pattern(2, 1), code),
        Refusal::new("READ larger than the region", read(VA, len + 1), vec![], code),
        Refusal::new("READ of the region's length, one byte late", read(VA + 1, len), vec![], code),
        Refusal::new("READ straddling the end", read(end - 100, 200), vec![], code),
        Refusal::new("CMP_SWAP at the end", rc(Op::CompareSwap, RQ_PSN).atomic_eth(end, KEY, 1, 0), vec![], code),
        Refusal::new(
            "FETCH_ADD before the start",
            rc(Op::FetchAdd, RQ_PSN).atomic_eth(VA - 8, KEY, 1, 0),
            vec![],
            code,
        ),
        // The largest lengths a RETH can carry.
        Refusal::new("WRITE_ONLY of 2^31-1 bytes", write(VA, (1 << 31) - 1), pattern(16, 1), code),
        Refusal::new(
            "WRITE_FIRST of 2^31-1 bytes",
            rc(Op::WriteFirst, RQ_PSN).reth(VA, KEY, (1 << 31) - 1),
            pattern(MTU, 1),
            code,
        ),
        Refusal::new(
            "WRITE_FIRST of 2^32-1 bytes",
            rc(Op::WriteFirst, RQ_PSN).reth(VA, KEY, u32::MAX),
            pattern(MTU, 1),
            code,
        ),
        Refusal::new("READ of 2^31-1 bytes", read(VA, (1 << 31) - 1), vec![], code),
        Refusal::new("READ of 2^32-1 bytes", read(VA, u32::MAX), vec![], code),
    ];
    assert_refusals(|_| {}, refusals);
}

#[test]
fn misaligned_atomics_are_invalid_requests() {
    let mut refusals = Vec::new();
    for offset in 1..8 {
        for op in [Op::CompareSwap, Op::FetchAdd] {
            let header = rc(op, RQ_PSN).ack_req().atomic_eth(VA + offset, KEY, 1, 0);
            refusals.push(Refusal::new(format!("{op:?} at VA + {offset}"), header, vec![], NakCode::InvalidRequest));
        }
    }
    assert_refusals(|_| {}, refusals);
}

#[test]
fn aligned_atomics_at_the_edges_of_the_region_execute_exactly_there() {
    let mut t = target();
    let last = REGION_LEN as u64 - 8;
    let (first_word, last_word) = (word(&t, 0), word(&t, last));
    let before = t.snapshot();
    t.feed(rc(Op::FetchAdd, RQ_PSN).ack_req().atomic_eth(VA, KEY, 5, 0), &[]);
    t.feed(rc(Op::CompareSwap, RQ_PSN + 1).ack_req().atomic_eth(VA + last, KEY, 0xabcd, last_word), &[]);
    let sent = t.transmit();
    assert_eq!(op_psn(&sent), vec![(Op::AtomicAcknowledge, RQ_PSN), (Op::AtomicAcknowledge, RQ_PSN + 1)]);
    let originals: Vec<u64> = sent.iter().map(|s| s.header.atomic_ack_eth.unwrap().original).collect();
    assert_eq!(originals, vec![first_word, last_word]);
    let mut expected = before;
    let data = &mut expected.get_mut(&KEY).unwrap().data;
    data[..8].copy_from_slice(&first_word.wrapping_add(5).to_ne_bytes());
    data[last as usize..].copy_from_slice(&0xabcdu64.to_ne_bytes());
    t.assert_memory_is(&expected, "two atomics");
}

#[test]
fn a_region_deregistered_mid_read_naks_the_rest_of_the_read() {
    let mut t = target();
    t.feed(rc(Op::ReadRequest, RQ_PSN).ack_req().reth(VA, KEY, 3 * MTU as u32), &[]);
    let first = t.transmit_one().expect("the first response");
    assert_eq!((first.op(), first.psn(), first.payload.clone()), (Op::ReadResponseFirst, RQ_PSN, t.bytes(0, MTU)));
    let region = t.mem.deregister(KEY).unwrap();
    let rest = t.transmit();
    assert_eq!(op_psn(&rest), vec![(Op::Acknowledge, RQ_PSN + 1)]);
    assert_eq!(rest[0].syndrome(), Syndrome::Nak(NakCode::RemoteAccessError));
    assert_eq!(t.qp.state(), QpState::Err);
    assert_eq!(t.events(), vec![AsyncEvent::QpAccessError { qpn: QPN }]);
    assert_eq!(region.data, pattern(REGION_LEN, 0x5a), "a READ changed the region");
}

#[test]
fn a_region_deregistered_mid_write_naks_the_rest_of_the_write() {
    for deregistered_before in [Op::WriteMiddle, Op::WriteLast] {
        let mut t = target();
        let data = pattern(3 * MTU, 8);
        t.feed(rc(Op::WriteFirst, RQ_PSN).reth(VA, KEY, data.len() as u32), &data[..MTU]);
        let mut psn = RQ_PSN + 1;
        if deregistered_before == Op::WriteLast {
            t.feed(rc(Op::WriteMiddle, psn), &data[MTU..2 * MTU]);
            psn += 1;
        }
        assert!(t.transmit().is_empty());
        let region = t.mem.deregister(KEY).unwrap();
        let at = (psn - RQ_PSN) as usize * MTU;
        t.feed(rc(deregistered_before, psn).ack_req(), &data[at..at + MTU]);
        let sent = t.transmit();
        assert_eq!(op_psn(&sent), vec![(Op::Acknowledge, psn)], "{deregistered_before:?}");
        assert_eq!(sent[0].syndrome(), Syndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(t.qp.state(), QpState::Err);
        let mut expected = pattern(REGION_LEN, 0x5a);
        expected[..at].copy_from_slice(&data[..at]);
        assert!(region.data == expected, "{deregistered_before:?}: bytes after deregistration changed");
    }
}

#[test]
fn zero_length_requests_check_no_rkey_and_touch_nothing() {
    let mut t = target();
    t.post_recv(1, RECV_AT, 64);
    t.qp.post_recv(RecvWr { wr_id: 2, sg_list: vec![] }).unwrap();
    t.post_recv(3, RECV_AT + 64, 64);
    let before = t.snapshot();
    // IBTA: a zero-length READ or WRITE needs no valid R_Key or address.
    t.feed(rc(Op::WriteOnly, RQ_PSN).ack_req().reth(u64::MAX, 0xdead, 0), &[]);
    t.feed(rc(Op::ReadRequest, RQ_PSN + 1).ack_req().reth(u64::MAX, 0xdead, 0), &[]);
    t.feed(rc(Op::SendOnly, RQ_PSN + 2).ack_req(), &[]);
    t.feed(rc(Op::SendOnly, RQ_PSN + 3).ack_req(), &[]);
    let imm = RoceRepr { imm: Some(0x600d), ..rc(Op::WriteOnlyImm, RQ_PSN + 4).ack_req().reth(0, 0, 0) };
    t.feed(imm, &[]);
    let sent = t.transmit();
    let expected = vec![(Op::Acknowledge, RQ_PSN), (Op::ReadResponseOnly, RQ_PSN + 1), (Op::Acknowledge, RQ_PSN + 4)];
    assert_eq!(op_psn(&sent), expected);
    assert!(sent[1].payload.is_empty());
    assert_eq!(sent[2].msn(), 5);
    let wcs = t.completions();
    let got: Vec<_> = wcs.iter().map(|(_, wc)| (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm)).collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::Recv, 0, None),
            (2, WcStatus::Success, WcOpcode::Recv, 0, None),
            (3, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0, Some(0x600d)),
        ]
    );
    t.assert_memory_is(&before, "zero-length requests");
    assert_eq!(t.qp.state(), QpState::Rts);

    // A receive without buffers takes only zero bytes.
    t.qp.post_recv(RecvWr { wr_id: 4, sg_list: vec![] }).unwrap();
    t.feed(rc(Op::SendOnly, RQ_PSN + 5).ack_req(), &[1]);
    let sent = t.transmit();
    assert_eq!((sent[0].psn(), sent[0].syndrome()), (RQ_PSN + 5, Syndrome::Nak(NakCode::InvalidRequest)));
    assert_eq!(statuses(&t.completions()), vec![(CqKind::Recv, 4, WcStatus::LocLenErr)]);
    t.assert_memory_is(&before, "one byte into no buffer");
}

#[test]
fn payloads_longer_than_the_mtu_are_invalid_requests() {
    let too_long = MTU + 4;
    assert_refusals(
        |_| {},
        vec![
            Refusal::new(
                "SEND_ONLY",
                rc(Op::SendOnly, RQ_PSN).ack_req(),
                pattern(too_long, 1),
                NakCode::InvalidRequest,
            ),
            Refusal::new(
                "WRITE_ONLY",
                rc(Op::WriteOnly, RQ_PSN).ack_req().reth(VA, KEY, too_long as u32),
                pattern(too_long, 1),
                NakCode::InvalidRequest,
            ),
            Refusal::new(
                "WRITE_FIRST",
                rc(Op::WriteFirst, RQ_PSN).reth(VA, KEY, 4 * MTU as u32),
                pattern(too_long, 1),
                NakCode::InvalidRequest,
            ),
        ],
    );
}

/// A region of 2^31 bytes — as large as a READ can ask for — without the
/// RAM: byte `i` reads as `i as u8`; writes and atomics are refused.
struct Huge;

const HUGE_KEY: u32 = 0x4b19_0001;
const HUGE_VA: u64 = 0x7f00_0000_0000;
const HUGE_LEN: u64 = 1 << 31;

impl Memory for Huge {
    fn check(&self, key: u32, pd: u32, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        if key != HUGE_KEY {
            return Err(MemError::InvalidKey(key));
        }
        if pd != PD {
            return Err(MemError::WrongPd);
        }
        if !Access::REMOTE_READ.contains(access) {
            return Err(MemError::AccessDenied);
        }
        offset_in(HUGE_VA, HUGE_LEN, addr, len).map(|_| ())
    }

    fn read(&self, key: u32, pd: u32, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        self.check(key, pd, addr, out.len() as u64, access)?;
        for (i, b) in out.iter_mut().enumerate() {
            *b = (addr - HUGE_VA + i as u64) as u8;
        }
        Ok(())
    }

    fn write(&mut self, _: u32, _: u32, _: u64, _: &[u8], _: Access) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }

    fn atomic(&mut self, _: u32, _: u32, _: u64, _: AtomicOp) -> Result<u64, MemError> {
        Err(MemError::AccessDenied)
    }

    fn invalidate(&mut self, _: u32, _: u32) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }
}

#[test]
fn a_maximum_length_read_streams_and_a_retry_cuts_it_short() {
    let mut qp = Qp::new(QPN, QpType::Rc, PD, QpCap::default(), None);
    let at =
        QpAttr { dest: Some(PEER), dest_qpn: PEER_QPN, rq_psn: Psn::new(RQ_PSN), path_mtu: Mtu::Mtu4096, ..attr() };
    qp.connect(&at).unwrap();
    let mut mem = Huge;
    let mut buf = vec![0u8; 4096 + TRANSMIT_HEADROOM];
    let now = Duration::from_secs(1);
    let feed = |qp: &mut Qp, mem: &mut Huge, header: RoceRepr| {
        qp.handle_packet(
            now,
            Incoming { src: PEER, src_port: ROCE_UDP_PORT, dst: LOCAL, header: &header, payload: &[] },
            mem,
            None,
        );
    };
    let mut next = |qp: &mut Qp, mem: &Huge| {
        let tx = qp.poll_transmit(now, mem, &mut buf)?;
        let parsed = RoceRepr::parse(&buf[..tx.len]).unwrap();
        Some((parsed.header.bth.opcode.operation(), parsed.header.bth.psn.value(), parsed.payload.to_vec()))
    };
    let len = (1u32 << 31) - 1;
    let packets = len.div_ceil(4096);
    feed(&mut qp, &mut mem, rc(Op::ReadRequest, RQ_PSN).ack_req().reth(HUGE_VA, HUGE_KEY, len));
    // The PSN after the READ's responses: a zero-length SEND into a receive without buffers.
    qp.post_recv(RecvWr { wr_id: 1, sg_list: vec![] }).unwrap();
    feed(&mut qp, &mut mem, rc(Op::SendOnly, psn_plus(RQ_PSN, packets.into())).ack_req());
    for k in 0..256u32 {
        let (op, psn, payload) = next(&mut qp, &mem).expect("the READ streams");
        let expected_op = if k == 0 { Op::ReadResponseFirst } else { Op::ReadResponseMiddle };
        assert_eq!((op, psn), (expected_op, psn_plus(RQ_PSN, k.into())));
        assert!(payload.iter().enumerate().all(|(i, b)| *b == (k as usize * 4096 + i) as u8), "response {k}");
    }
    // The requester retries for the last response only: the replay replaces the stream.
    let last = packets - 1;
    let tail = len - last * 4096;
    feed(
        &mut qp,
        &mut mem,
        rc(Op::ReadRequest, psn_plus(RQ_PSN, last.into())).reth(HUGE_VA + u64::from(last) * 4096, HUGE_KEY, tail),
    );
    let (op, psn, payload) = next(&mut qp, &mem).unwrap();
    assert_eq!((op, psn, payload.len()), (Op::ReadResponseOnly, psn_plus(RQ_PSN, last.into()), tail as usize));
    assert!(payload.iter().enumerate().all(|(i, b)| *b == (last as usize * 4096 + i) as u8));
    let (op, psn, _) = next(&mut qp, &mem).unwrap();
    assert_eq!((op, psn), (Op::Acknowledge, psn_plus(RQ_PSN, packets.into())));
    assert!(next(&mut qp, &mem).is_none());
    assert_eq!(qp.state(), QpState::Rts);
}

// ---------------------------------------------------------------------------
// 2. Malformed packets, impossible sequences, PSNs far away, floods.
// ---------------------------------------------------------------------------

#[test]
fn impossible_opcode_sequences_are_invalid_requests_that_change_nothing() {
    use Op::*;
    let sequences: &[&[Op]] = &[
        &[SendMiddle],
        &[SendLast],
        &[SendLastImm],
        &[WriteMiddle],
        &[WriteLast],
        &[WriteLastImm],
        &[SendFirst, SendFirst],
        &[SendFirst, SendOnly],
        &[SendFirst, WriteMiddle],
        &[SendFirst, WriteOnly],
        &[SendFirst, ReadRequest],
        &[SendFirst, FetchAdd],
        &[WriteFirst, SendMiddle],
        &[WriteFirst, SendLast],
        &[WriteFirst, WriteFirst],
        &[WriteFirst, WriteOnly],
        &[WriteFirst, ReadRequest],
        &[WriteFirst, CompareSwap],
        &[SendFirst, SendMiddle, WriteLast],
    ];
    for sequence in sequences {
        let prefix = &sequence[..sequence.len() - 1];
        let feed = |t: &mut TestQp, ops: &[Op]| {
            for (i, &op) in ops.iter().enumerate() {
                let mut header =
                    complete(Opcode::new(Transport::Rc, op).unwrap(), QPN, RQ_PSN + i as u32, 4 * MTU as u32);
                header.bth.ack_req = false;
                let len = if op.has_payload() { MTU } else { 0 };
                t.feed(header, &pattern(len, i as u32));
            }
        };
        // What the valid prefix alone does, for comparison.
        let mut reference = target();
        reference.post_recv(1, RECV_AT, 8192);
        feed(&mut reference, prefix);
        assert!(reference.transmit().is_empty(), "{sequence:?}: the prefix is valid");

        let mut t = target();
        t.post_recv(1, RECV_AT, 8192);
        feed(&mut t, sequence);
        let sent = t.transmit();
        let psn = RQ_PSN + prefix.len() as u32;
        assert_eq!(op_psn(&sent), vec![(Acknowledge, psn)], "{sequence:?}");
        assert_eq!(sent[0].syndrome(), Syndrome::Nak(NakCode::InvalidRequest), "{sequence:?}");
        assert_eq!(t.qp.state(), QpState::Err, "{sequence:?}");
        t.assert_memory_is(&reference.snapshot(), &format!("{sequence:?}"));
    }
}

#[test]
fn responses_at_a_qp_that_asked_for_nothing_are_dropped() {
    let mut t = target();
    t.post_recv(1, RECV_AT, 64);
    let before = t.snapshot();
    let psns = [SQ_PSN, psn_plus(SQ_PSN, -1), SQ_PSN + 1, 0, 0xff_ffff];
    let mut fed = 0;
    for psn in psns {
        let responses = [
            (rc(Op::ReadResponseFirst, psn).aeth(ACK, 0), MTU),
            (rc(Op::ReadResponseMiddle, psn), MTU),
            (rc(Op::ReadResponseLast, psn).aeth(ACK, 0), 100),
            (rc(Op::ReadResponseOnly, psn).aeth(ACK, 0), 100),
            (rc(Op::Acknowledge, psn).aeth(ACK, 1), 0),
            (rc(Op::Acknowledge, psn).aeth(Syndrome::RnrNak { timer: 0 }, 0), 0),
            (rc(Op::Acknowledge, psn).aeth(Syndrome::Nak(NakCode::PsnSequenceError), 0), 0),
            (rc(Op::Acknowledge, psn).aeth(Syndrome::Nak(NakCode::RemoteAccessError), 0), 0),
            (
                RoceRepr {
                    atomic_ack_eth: Some(AtomicAckEthRepr { original: 7 }),
                    ..rc(Op::AtomicAcknowledge, psn).aeth(ACK, 1)
                },
                0,
            ),
        ];
        for (header, len) in responses {
            t.feed(header, &pattern(len, 3));
            fed += 1;
        }
    }
    assert!(t.transmit().is_empty());
    assert!(t.completions().is_empty());
    assert!(t.events().is_empty());
    assert_eq!(t.qp.counters().dropped, fed);
    assert_eq!((t.qp.state(), t.qp.poll_timeout()), (QpState::Rts, None));
    t.assert_memory_is(&before, "ghost responses");
    // Both halves of the QP work on.
    t.feed(rc(Op::SendOnly, RQ_PSN).ack_req(), &[1; 8]);
    assert_eq!(op_psn(&t.transmit()), vec![(Op::Acknowledge, RQ_PSN)]);
}

/// What a packet with some opcode byte does to a connected RC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Refused by the parser: it never reaches a QP.
    Malformed,
    /// Dropped by the QP, silently and counted.
    Dropped,
    /// Executed and answered with this operation.
    Executed(Op),
    /// NAKed with this code; the QP moved to ERR.
    Refused(NakCode),
}

/// The outcome softroce must give each opcode byte (every extended header
/// present, 16 bytes of payload, RETH and AtomicETH aimed at the region).
fn expected_outcome(byte: u8) -> Outcome {
    use Outcome::*;
    match byte {
        0x04 | 0x05 | 0x0a | 0x0b => Executed(Op::Acknowledge),
        0x0c => Executed(Op::ReadResponseOnly),
        0x13 | 0x14 => Executed(Op::AtomicAcknowledge),
        // FIRST with less than an MTU, MIDDLE/LAST without FIRST, SEND with
        // invalidate of a key that is not there, FLUSH, ATOMIC_WRITE.
        0x00..=0x03 | 0x06..=0x09 | 0x16 | 0x17 | 0x1c | 0x1d => Refused(NakCode::InvalidRequest),
        // Responses at a QP that asked for nothing.
        0x0d..=0x12 => Dropped,
        // UC and UD opcodes at an RC QP.
        0x20..=0x2b | 0x64 | 0x65 => Dropped,
        _ => Malformed,
    }
}

/// The UDP payload for opcode `byte`: a valid packet where the byte is an
/// opcode, else a BTH with it followed by zeros.
fn packet_with_opcode(byte: u8, dest_qpn: u32, psn: u32) -> Vec<u8> {
    match Opcode::from_u8(byte) {
        Ok(opcode) => {
            let len = match opcode.operation() {
                _ if !opcode.has_payload() => 0,
                Op::AtomicWrite => 8,
                _ => 16,
            };
            let header = complete(opcode, dest_qpn, psn, len as u32);
            let mut roce = vec![0u8; header.wire_len(len)];
            header.emit(&mut roce, &pattern(len, u32::from(byte))).unwrap();
            roce
        }
        Err(_) => {
            let mut roce = vec![0u8; 12 + 32 + 4];
            roce[0] = byte;
            roce[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
            roce[5..8].copy_from_slice(&dest_qpn.to_be_bytes()[1..]);
            roce[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
            roce
        }
    }
}

#[test]
fn every_opcode_byte_at_a_connected_qp() {
    let mut wrong = Vec::new();
    for byte in 0..=255u8 {
        let roce = packet_with_opcode(byte, QPN, RQ_PSN);
        let mut t = target();
        t.post_recv(1, RECV_AT, 4096);
        let before = t.snapshot();
        let outcome = match RoceRepr::parse(&roce) {
            Err(_) => Outcome::Malformed,
            Ok(pkt) => {
                let dropped = t.qp.counters().dropped;
                t.feed(pkt.header, pkt.payload);
                let sent = t.transmit();
                match (&sent[..], t.qp.state()) {
                    ([], QpState::Rts) if t.qp.counters().dropped == dropped + 1 => Outcome::Dropped,
                    ([nak], QpState::Err) => match nak.syndrome() {
                        Syndrome::Nak(code) => Outcome::Refused(code),
                        other => panic!("{byte:#04x}: {other:?} and ERR"),
                    },
                    ([answer], QpState::Rts) if answer.psn() == RQ_PSN => Outcome::Executed(answer.op()),
                    (sent, state) => panic!("{byte:#04x}: {state:?}, sent {sent:#?}"),
                }
            }
        };
        // Memory changes only where a request was executed (and where
        // SEND_ONLY_WITH_INVALIDATE placed data before its IETH failed).
        if !matches!(outcome, Outcome::Executed(_)) && byte != 0x17 {
            t.assert_memory_is(&before, &format!("opcode {byte:#04x}"));
        }
        if outcome != expected_outcome(byte) {
            wrong.push(format!("{byte:#04x}: {outcome:?}, expected {:?}", expected_outcome(byte)));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn packets_outside_the_default_partition_are_dropped() {
    let mut t = target();
    t.post_recv(1, RECV_AT, 64);
    let before = t.snapshot();
    // rxe's pkey_match against the default P_Key: 0x7fff with either membership.
    for pkey in [0x0000, 0x8000, 0x0001, 0x7ffe, 0xfffe, 0x1234, 0x8001] {
        let mut send = rc(Op::SendOnly, RQ_PSN).ack_req();
        send.bth.pkey = pkey;
        t.feed(send, &[1; 16]);
        let mut write = rc(Op::WriteOnly, RQ_PSN).ack_req().reth(VA, KEY, 16);
        write.bth.pkey = pkey;
        t.feed(write, &[2; 16]);
    }
    assert!(t.transmit().is_empty());
    assert!(t.completions().is_empty());
    assert_eq!(t.qp.counters().dropped, 14);
    t.assert_memory_is(&before, "foreign P_Keys");
    for (psn, pkey) in [(RQ_PSN, 0x7fff), (RQ_PSN + 1, 0xffff)] {
        let mut write = rc(Op::WriteOnly, psn).ack_req().reth(VA, KEY, 16);
        write.bth.pkey = pkey;
        t.feed(write, &[3; 16]);
        assert_eq!(op_psn(&t.transmit()), vec![(Op::Acknowledge, psn)], "P_Key {pkey:#06x}");
    }
}

#[test]
fn psns_half_the_space_away_are_naked_once_or_taken_for_duplicates() {
    let half = 1i64 << 23;
    let mut t = target();
    t.post_recv(1, RECV_AT, 64);
    let before = t.snapshot();
    let seq_err = Syndrome::Nak(NakCode::PsnSequenceError);

    // The farthest future PSN: one sequence NAK with the expected PSN, then silence.
    let far = psn_plus(RQ_PSN, half - 1);
    t.feed(rc(Op::SendOnly, far).ack_req(), &pattern(16, 1));
    let sent = t.transmit();
    assert_eq!((op_psn(&sent), sent[0].syndrome(), sent[0].msn()), (vec![(Op::Acknowledge, RQ_PSN)], seq_err, 0));
    t.feed(rc(Op::WriteOnly, psn_plus(RQ_PSN, half - 2)).ack_req().reth(VA, KEY, 16), &pattern(16, 2));
    t.feed(rc(Op::ReadRequest, psn_plus(RQ_PSN, 1)).ack_req().reth(VA, KEY, 16), &[]);
    assert!(t.transmit().is_empty());

    // Exactly half the space away, and the PSN just before: the past. A
    // duplicate SEND or WRITE is re-ACKed with the PSN before the expected
    // one and not executed; a READ nobody asked before is dropped.
    for distance in [half, -half + 1, -1] {
        let psn = psn_plus(RQ_PSN, distance);
        t.feed(rc(Op::SendOnly, psn).ack_req(), &pattern(16, 3));
        t.feed(rc(Op::WriteOnly, psn).ack_req().reth(VA, KEY, 16), &pattern(16, 4));
        t.feed(rc(Op::ReadRequest, psn).ack_req().reth(VA, KEY, 16), &[]);
        t.feed(rc(Op::FetchAdd, psn).ack_req().atomic_eth(VA, KEY, 1, 0), &[]);
        let sent = t.transmit();
        assert_eq!(op_psn(&sent), vec![(Op::Acknowledge, psn_plus(RQ_PSN, -1))], "distance {distance}");
        assert_eq!((sent[0].syndrome(), sent[0].msn()), (ACK, 0));
    }
    assert!(t.completions().is_empty());
    assert_eq!(t.qp.state(), QpState::Rts);
    t.assert_memory_is(&before, "far PSNs");

    // The expected PSN still works.
    t.feed(rc(Op::SendOnly, RQ_PSN).ack_req(), &pattern(16, 5));
    let sent = t.transmit();
    assert_eq!((op_psn(&sent), sent[0].msn()), (vec![(Op::Acknowledge, RQ_PSN)], 1));
    assert_eq!(statuses(&t.completions()), vec![(CqKind::Recv, 1, WcStatus::Success)]);
}

#[test]
fn a_flood_of_duplicate_sends_gets_bounded_answers_and_the_qp_works_on() {
    let mut t = target();
    t.post_recv(1, RECV_AT, 256);
    t.post_recv(2, RECV_AT + 256, 256);
    t.feed(rc(Op::SendOnly, RQ_PSN).ack_req(), &pattern(100, 1));
    assert_eq!(op_psn(&t.transmit()), vec![(Op::Acknowledge, RQ_PSN)]);
    assert_eq!(statuses(&t.completions()), vec![(CqKind::Recv, 1, WcStatus::Success)]);
    let after_first = t.snapshot();

    // Fed faster than answered: the ACKs coalesce into one.
    for _ in 0..FLOOD {
        t.feed(rc(Op::SendOnly, RQ_PSN).ack_req(), &pattern(100, 2));
    }
    let sent = t.transmit();
    assert_eq!((op_psn(&sent), sent[0].msn()), (vec![(Op::Acknowledge, RQ_PSN)], 1));
    // Answered as they come: one ACK each, never more.
    for _ in 0..FLOOD {
        t.feed(rc(Op::SendOnly, RQ_PSN).ack_req(), &pattern(100, 2));
        assert_eq!(op_psn(&t.transmit()), vec![(Op::Acknowledge, RQ_PSN)]);
    }
    assert_eq!(t.qp.counters().duplicate_requests, 2 * FLOOD as u64);
    assert!(t.completions().is_empty());
    t.assert_memory_is(&after_first, "duplicate SENDs");

    t.feed(rc(Op::SendOnly, RQ_PSN + 1).ack_req(), &pattern(100, 3));
    let sent = t.transmit();
    assert_eq!((op_psn(&sent), sent[0].msn()), (vec![(Op::Acknowledge, RQ_PSN + 1)], 2));
    assert_eq!(statuses(&t.completions()), vec![(CqKind::Recv, 2, WcStatus::Success)]);
    assert_eq!(t.bytes(RECV_AT + 256, 100), pattern(100, 3));
}

#[test]
fn a_flood_of_duplicate_reads_gets_bounded_answers_and_the_qp_works_on() {
    let mut t = target();
    let read = |k: u32| rc(Op::ReadRequest, RQ_PSN + 3 * k).ack_req().reth(VA + u64::from(k) * 4096, KEY, 3000);
    let replay_of = |k: u32| {
        let psn = RQ_PSN + 3 * k;
        vec![(Op::ReadResponseFirst, psn), (Op::ReadResponseMiddle, psn + 1), (Op::ReadResponseLast, psn + 2)]
    };
    // As many READs as the responder keeps for replay.
    for k in 0..u32::from(MAX_DEST_RD_ATOMIC) {
        t.feed(read(k), &[]);
    }
    assert_eq!(t.transmit().len(), 3 * usize::from(MAX_DEST_RD_ATOMIC));
    let before = t.snapshot();

    // Fed faster than answered: one replay of each READ stays queued.
    for i in 0..FLOOD {
        t.feed(read(i as u32 % u32::from(MAX_DEST_RD_ATOMIC)), &[]);
    }
    let sent = t.transmit();
    let all: Vec<_> = (0..u32::from(MAX_DEST_RD_ATOMIC)).flat_map(replay_of).collect();
    assert_eq!(op_psn(&sent), all);
    for (k, replay) in sent.chunks(3).enumerate() {
        let bytes: Vec<u8> = replay.iter().flat_map(|s| s.payload.clone()).collect();
        assert_eq!(bytes, t.bytes(k as u64 * 4096, 3000));
    }
    // Answered as they come: one replay each, never more.
    for i in 0..FLOOD {
        let k = i as u32 % u32::from(MAX_DEST_RD_ATOMIC);
        t.feed(read(k), &[]);
        assert_eq!(op_psn(&t.transmit()), replay_of(k));
    }
    assert_eq!(t.qp.counters().duplicate_requests, 2 * FLOOD as u64);
    t.assert_memory_is(&before, "duplicate READs");

    t.post_recv(1, RECV_AT, 64);
    let next = RQ_PSN + 3 * u32::from(MAX_DEST_RD_ATOMIC);
    t.feed(rc(Op::SendOnly, next).ack_req(), &[9; 8]);
    let sent = t.transmit();
    assert_eq!((op_psn(&sent), sent[0].msn()), (vec![(Op::Acknowledge, next)], u32::from(MAX_DEST_RD_ATOMIC) + 1));
}

/// Responses a responder keeps waiting at most (rxe-spec/security.md S-8).
const RESPONSE_QUEUE: usize = 2 * MAX_DEST_RD_ATOMIC as usize + 4;

#[test]
fn reads_beyond_max_dest_rd_atomic_lose_only_the_oldest_replays() {
    let mut t = target();
    let read = |i: u32| rc(Op::ReadRequest, RQ_PSN + i).ack_req().reth(VA + 64 * u64::from(i % 1000), KEY, 64);
    // A requester that ignores the limit: 20 READs, none waiting for an answer.
    for i in 0..20 {
        t.feed(read(i), &[]);
    }
    let sent = t.transmit();
    let answered: Vec<_> = (0..RESPONSE_QUEUE as u32).map(|i| (Op::ReadResponseOnly, RQ_PSN + i)).collect();
    assert_eq!(op_psn(&sent), answered);
    assert_eq!(t.qp.counters().dropped, 20 - RESPONSE_QUEUE as u64);
    // Its retries: only the newest max_dest_rd_atomic READs can be replayed.
    for i in 0..20 {
        t.feed(read(i), &[]);
    }
    let newest = 20 - u32::from(MAX_DEST_RD_ATOMIC);
    let replayed: Vec<_> = (newest..20).map(|i| (Op::ReadResponseOnly, RQ_PSN + i)).collect();
    assert_eq!(op_psn(&t.transmit()), replayed);

    // Sustained: every new READ answered as it comes, and still only the
    // newest ones replayed.
    for i in 20..2020 {
        t.feed(read(i), &[]);
        assert_eq!(op_psn(&t.transmit()), vec![(Op::ReadResponseOnly, RQ_PSN + i)]);
    }
    for i in 0..2020 {
        t.feed(read(i), &[]);
    }
    let replayed: Vec<_> =
        (2020 - u32::from(MAX_DEST_RD_ATOMIC)..2020).map(|i| (Op::ReadResponseOnly, RQ_PSN + i)).collect();
    assert_eq!(op_psn(&t.transmit()), replayed);
    assert_eq!(t.qp.state(), QpState::Rts);
    t.post_recv(1, RECV_AT, 64);
    t.feed(rc(Op::SendOnly, RQ_PSN + 2020).ack_req(), &[1; 8]);
    assert_eq!(op_psn(&t.transmit()), vec![(Op::Acknowledge, RQ_PSN + 2020)]);
}

#[test]
fn a_requester_within_its_limits_never_loses_an_answer() {
    // 16 READs outstanding, each followed by a SEND asking for an ACK, all
    // arriving before the responder sends anything (one engine batch).
    const READS: u32 = 16;
    let mut t = target_with(QpAttr { max_dest_rd_atomic: READS as u8, ..attr() });
    let mut expected = Vec::new();
    for i in 0..READS {
        let psn = RQ_PSN + 2 * i;
        t.post_recv(u64::from(i), RECV_AT + 64 * u64::from(i), 64);
        t.feed(rc(Op::ReadRequest, psn).ack_req().reth(VA, KEY, 16), &[]);
        t.feed(rc(Op::SendOnly, psn + 1).ack_req(), &[1; 8]);
        expected.extend([(Op::ReadResponseOnly, psn), (Op::Acknowledge, psn + 1)]);
    }
    assert_eq!(op_psn(&t.transmit()), expected);
    assert_eq!(t.qp.counters().dropped, 0);
}

// ---------------------------------------------------------------------------
// 3. Off-path injection (ReDMArk).
// ---------------------------------------------------------------------------

/// Packets the attacker sends in each phase.
const INJECTIONS: u32 = 100_000;

/// One guessed request: WRITE_ONLY, SEND_ONLY or READ at `psn` with `rkey`.
fn injection(i: u32, psn: u32, rkey: u32) -> (RoceRepr, Vec<u8>) {
    match i % 3 {
        0 => (rc(Op::WriteOnly, psn).ack_req().reth(VA, rkey, 32), vec![0xee; 32]),
        1 => (rc(Op::SendOnly, psn).ack_req(), vec![0xee; 32]),
        _ => (rc(Op::ReadRequest, psn).ack_req().reth(VA, rkey, 32), vec![]),
    }
}

#[test]
fn off_path_injection_gets_nothing_accepted() {
    let start = Instant::now();
    // The secrets, as a CSPRNG makes them (the attacker's generator is
    // independent of this one, which is all that matters).
    let mut secrets = Rng::new(0x5ec2_e75e_ed00_0001);
    let (key, rq_psn, sq_psn) = (secrets.next_u32(), secrets.psn(), secrets.psn());
    let mut t = TestQp::bare(QpType::Rc, attr(), sq_psn, rq_psn, QpCap::default());
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    t.register(key, Region { pd: PD, addr: VA, access, data: pattern(REGION_LEN, 0x5a) });
    for wr_id in 0..16 {
        let sge = Sge { addr: VA + RECV_AT + 64 * wr_id, length: 64, lkey: key };
        t.qp.post_recv(RecvWr { wr_id, sg_list: vec![sge] }).unwrap();
    }
    let before = t.snapshot();
    let mut attacker = Rng::new(0xa77a_c4e2);

    // Phase 1: from addresses other than the peer's, with random guesses and
    // even with the right PSN and key.
    for i in 0..INJECTIONS {
        let (psn, rkey) = if i % 2 == 0 { (attacker.psn(), attacker.next_u32()) } else { (rq_psn, key) };
        let (header, payload) = injection(i, psn, rkey);
        let src = IpAddr::V4(Ipv4Addr::from(attacker.next_u32() | 1));
        let src = if src == PEER { ATTACKER } else { src };
        t.feed_from(src, header, &payload);
        if i % 64 == 0 {
            assert!(t.transmit().is_empty(), "an answer to an off-path packet");
        }
    }
    assert!(t.transmit().is_empty());
    assert!(t.completions().is_empty());
    assert_eq!(t.qp.counters().dropped, u64::from(INJECTIONS));
    t.assert_memory_is(&before, "spoofed sources");
    let phase_1 = start.elapsed();

    // Phase 2: from the peer's own address (a spoofer), guessing PSN and key.
    let (mut psn_hits, mut key_hits, mut answers, mut naks) = (0, 0, 0, 0);
    for i in 0..INJECTIONS {
        let (psn, rkey) = (attacker.psn(), attacker.next_u32());
        psn_hits += u32::from(psn == rq_psn);
        key_hits += u32::from(rkey == key);
        let (header, payload) = injection(i, psn, rkey);
        t.feed(header, &payload);
        if i % 64 == 63 || i == INJECTIONS - 1 {
            for answer in t.transmit() {
                // What an injection can draw: a sequence NAK for the expected
                // PSN, and re-ACKs of what was acknowledged before — both
                // sent to the real peer, which ignores them.
                answers += 1;
                match answer.syndrome() {
                    Syndrome::Nak(NakCode::PsnSequenceError) => naks += 1,
                    Syndrome::Ack { .. } => {}
                    other => panic!("an injection drew {other:?}"),
                }
                assert_eq!((answer.op(), answer.msn(), answer.dest), (Op::Acknowledge, 0, PEER));
            }
        }
    }
    assert_eq!(psn_hits, 0, "the attacker guessed the PSN: rerun with another seed");
    assert!(t.completions().is_empty());
    assert_eq!(t.qp.state(), QpState::Rts);
    t.assert_memory_is(&before, "guessed PSNs and keys");
    let phase_2 = start.elapsed() - phase_1;

    // The peer's own next request is executed.
    t.feed(rc(Op::WriteOnly, rq_psn).ack_req().reth(VA, key, 4), &[1, 2, 3, 4]);
    let sent = t.transmit();
    assert_eq!((op_psn(&sent), sent[0].syndrome(), sent[0].msn()), (vec![(Op::Acknowledge, rq_psn)], ACK, 1));

    // Phase 3: forged responses at a requester with a READ and a SEND in
    // flight, from the peer's address with guessed PSNs. Only PSNs from the
    // oldest unacknowledged to the last sent mean anything.
    let read = SendOp::RdmaRead { remote_addr: 0x7700_0000, rkey: 0x99 };
    let read_sge = Sge { addr: VA + 0x4000, length: 16 * MTU as u32, lkey: key };
    t.qp.post_send(SendWr::new(1, read).with_sge(read_sge)).unwrap();
    t.qp.post_send(SendWr::new(2, SendOp::Send).with_sge(Sge { addr: VA, length: 64, lkey: key })).unwrap();
    let requests = t.transmit();
    assert_eq!(requests.len(), 2);
    // The READ's 16 response PSNs and the SEND's.
    let window = 17;
    let before = t.snapshot();
    let mut response_hits = 0;
    for i in 0..INJECTIONS {
        let psn = attacker.psn();
        response_hits += u32::from((0..window).contains(&Psn::new(psn).diff(Psn::new(sq_psn))));
        let (header, len) = match i % 3 {
            0 => (rc(Op::Acknowledge, psn).aeth(ACK, attacker.next_u32() & 0xff_ffff), 0),
            1 => (rc(Op::ReadResponseOnly, psn).aeth(ACK, 0), 64),
            _ => (rc(Op::Acknowledge, psn).aeth(Syndrome::Nak(NakCode::RemoteAccessError), 0), 0),
        };
        t.feed(header, &vec![0xee; len]);
    }
    assert_eq!(response_hits, 0, "the attacker guessed a PSN in flight: rerun with another seed");
    assert!(t.transmit().is_empty());
    assert!(t.completions().is_empty());
    assert_eq!(t.qp.state(), QpState::Rts);
    t.assert_memory_is(&before, "forged responses");
    let phase_3 = start.elapsed() - phase_1 - phase_2;

    eprintln!(
        "off-path injection, {INJECTIONS} packets a phase:\n\
         \x20 phase 1 (wrong source, half with the right PSN and key): 0 accepted, 0 answered, {phase_1:.2?}\n\
         \x20 phase 2 (peer's source, guessed PSN and key): {psn_hits} PSN hits (expected {:.4}), {key_hits} key hits \
         (expected {:.6}), 0 accepted, 0 bytes written; {answers} answers to the real peer ({naks} sequence NAKs), {phase_2:.2?}\n\
         \x20 phase 3 (forged responses, {window} PSNs in flight): {response_hits} hits (expected {:.4}), 0 accepted, {phase_3:.2?}",
        f64::from(INJECTIONS) / f64::from(1u32 << 24),
        f64::from(INJECTIONS) / 2f64.powi(32),
        f64::from(INJECTIONS) * f64::from(window as u32) / f64::from(1u32 << 24),
    );
}

/// A context on [`IP_A`] with one RC QP connected to a fake peer, and a
/// region of every access filled with [`FILL`].
struct Victim {
    node: Node,
    peer: FakePeer,
    qp: QueuePair,
    mr: MemoryRegion,
    port: u16,
}

/// The fake peer of a [`Victim`], another loopback address.
const FAKE_PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
/// An off-path attacker's address.
const OFF_PATH: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 66));
/// The fake peer's QP number and first PSN.
const FAKE_QPN: u32 = 0x4242;
const FAKE_PSN: u32 = 0x77_0000;

impl Victim {
    fn new(name: &str) -> Victim {
        Victim::pinned(name, false)
    }

    /// A victim whose QP, if `pin_port`, also insists on the peer's UDP
    /// source port (`ConnectOptions::peer_port`).
    fn pinned(name: &str, pin_port: bool) -> Victim {
        let port = free_port(&[IP_A, FAKE_PEER, OFF_PATH]);
        let node = Node::open(name, IP_A, ContextOptions { port, busy_poll: false, ..ContextOptions::default() });
        let peer = FakePeer::bind(FAKE_PEER, port);
        let qp = node.qp(QpType::Rc);
        let peer_port = pin_port.then_some(port);
        qp.connect(&peer.endpoint(FAKE_QPN, FAKE_PSN), &ConnectOptions { peer_port, ..options(Mtu::Mtu1024) }).unwrap();
        let mr = node.mr(1 << 16);
        fill(&mr, FILL);
        Victim { node, peer, qp, mr, port }
    }

    /// The fake peer's QP number the victim's QP is connected to.
    fn peer_qpn(&self) -> u32 {
        self.qp.query().dest_qpn
    }

    /// Sends `header`, aimed at the victim's QP, from the fake peer.
    fn send(&self, header: RoceRepr, payload: &[u8]) {
        self.peer.send(IP_A, &header.qpn(self.qp.qpn()), payload);
    }

    /// A SEND at `psn` is ACKed: the QP works.
    fn assert_works(&self, psn: u32) {
        let mr = self.node.mr(4096);
        self.qp.post_recv(RecvWr { wr_id: 0x600d, sg_list: vec![mr.sge(0, 64)] }).unwrap();
        self.send(rc(Op::SendOnly, psn).ack_req(), &[7; 16]);
        // Late answers to earlier packets may come first.
        let deadline = Instant::now() + WAIT;
        let acked =
            std::iter::from_fn(|| self.peer.receive(deadline.saturating_duration_since(Instant::now()))).any(|a| {
                (a.op(), a.psn(), a.syndrome(), a.header.bth.dest_qpn) == (Op::Acknowledge, psn, ACK, self.peer_qpn())
            });
        assert!(acked, "no ACK for PSN {psn:#x}");
        // Receives posted before (or flushed by an earlier QP) come first.
        let wc = std::iter::repeat_with(|| next_wc(&self.node.cq))
            .find(|wc| wc.qp_num == self.qp.qpn() && wc.status == WcStatus::Success)
            .unwrap();
        assert_eq!((wc.opcode, wc.byte_len), (WcOpcode::Recv, 16));
    }
}

#[test]
fn off_path_spray_at_a_real_context_gets_nothing_accepted() {
    const SPRAY: u32 = 20_000;
    let v = Victim::new("sprayed");
    for wr_id in 0..16 {
        v.qp.post_recv(RecvWr { wr_id, sg_list: vec![v.mr.sge(64 * wr_id as usize, 64)] }).unwrap();
    }
    let attacker = FakePeer::sender(OFF_PATH, v.port);
    let before = v.node.ctx.counters();
    let mut guesses = Rng::new(0x0ff_9a7);
    let start = Instant::now();
    for i in 0..SPRAY {
        // Half random guesses, half the right PSN and key: the address alone stops them.
        let (psn, rkey) = if i % 2 == 0 { (guesses.psn(), guesses.next_u32()) } else { (FAKE_PSN, v.mr.rkey()) };
        let (header, payload) = injection(i, psn, rkey);
        let header = RoceRepr { reth: header.reth.map(|r| RethRepr { va: v.mr.addr(), ..r }), ..header };
        attacker.send(IP_A, &header.qpn(v.qp.qpn()), &payload);
    }
    let sent_in = start.elapsed();
    // Wait until the engine has handled all the kernel did not drop.
    let mut seen = None;
    wait_for("the spray to be processed", || {
        std::thread::sleep(QUIET);
        let c = v.node.ctx.counters();
        let now = (c.link.received - before.link.received, c.qp.received_packets - before.qp.received_packets);
        let settled = seen == Some(now) && now.0 == now.1;
        seen = Some(now);
        settled
    });
    let after = v.node.ctx.counters();
    let received = after.link.received - before.link.received;
    let reached_qp = after.qp.received_packets - before.qp.received_packets;
    let dropped = after.qp.dropped - before.qp.dropped;
    eprintln!(
        "off-path spray at a real context: {SPRAY} sent in {sent_in:.2?}, {received} received, {reached_qp} reached the QP, \
         {dropped} dropped, {} accepted",
        reached_qp - dropped
    );
    assert!(received > u64::from(SPRAY) / 2, "the kernel dropped most of the spray: {received}");
    assert_eq!(after.link.icrc_errors, before.link.icrc_errors);
    assert_eq!((reached_qp, dropped), (received, received));
    assert!(v.node.cq.poll_one().is_none(), "a completion from an off-path packet");
    assert!(v.peer.receive_until_quiet(QUIET).is_empty(), "an answer to an off-path packet");
    assert_holds_only(&v.mr, 0, &[]);
    assert_eq!(v.qp.state(), QpState::Rts);
    v.assert_works(FAKE_PSN);
}

#[test]
fn rkeys_and_initial_psns_use_all_their_bits() {
    const N: usize = 10_000;
    let port = free_port(&[IP_A]);
    let node = Node::open("keys", IP_A, ContextOptions { port, busy_poll: false, ..ContextOptions::default() });
    let mrs: Vec<MemoryRegion> = (0..N).map(|_| node.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap()).collect();
    let keys: Vec<u32> = mrs.iter().map(|mr| mr.rkey()).collect();
    assert!(mrs.iter().all(|mr| mr.lkey() == mr.rkey()));
    assert_eq!(keys.iter().collect::<HashSet<_>>().len(), N, "two regions share a key");
    let sequential = keys.windows(2).filter(|w| w[1] == w[0].wrapping_add(1)).count();
    assert_eq!(sequential, 0, "keys follow each other");
    // Each bit set in about half the keys: N/2 ± 10 standard deviations (50).
    let bit_counts = |values: &[u32], bits: u32| -> Vec<usize> {
        (0..bits).map(|b| values.iter().filter(|v| *v >> b & 1 == 1).count()).collect()
    };
    let in_range = |counts: &[usize]| counts.iter().all(|c| (4500..=5500).contains(c));
    let key_bits = bit_counts(&keys, 32);
    assert!(in_range(&key_bits), "key bits: {key_bits:?}");
    drop(mrs);

    let qps: Vec<QueuePair> = (0..N).map(|_| node.qp(QpType::Rc)).collect();
    let psns: Vec<u32> = qps.iter().map(|qp| qp.endpoint(1).unwrap().psn.value()).collect();
    assert!(psns.iter().all(|p| *p < 1 << 24));
    let psn_bits = bit_counts(&psns, 24);
    assert!(in_range(&psn_bits), "PSN bits: {psn_bits:?}");
    let distinct_psns = psns.iter().collect::<HashSet<_>>().len();
    // About N²/2^25 = 3 collisions are expected among random 24-bit values.
    assert!(distinct_psns > N - 30, "{distinct_psns} distinct PSNs");
    eprintln!("{N} rkeys: bits set {key_bits:?}\n{N} initial PSNs ({distinct_psns} distinct): bits set {psn_bits:?}");
}

// ---------------------------------------------------------------------------
// 4. The real engine: unknown QPs, malformed datagrams, spoofed sources,
//    floods, deregistration and teardown.
// ---------------------------------------------------------------------------

#[test]
fn packets_for_unknown_or_destroyed_qps_are_counted_and_dropped() {
    let v = Victim::new("unknown_qps");
    let destroyed = v.node.qp(QpType::Rc);
    destroyed.connect(&v.peer.endpoint(FAKE_QPN + 1, FAKE_PSN), &options(Mtu::Mtu1024)).unwrap();
    let destroyed_qpn = destroyed.qpn();
    drop(destroyed);
    std::thread::sleep(QUIET);
    let before = v.node.ctx.counters();
    let qpns = [destroyed_qpn, 0, 1, 0xff_ffff, v.qp.qpn() + 1000];
    let ops = [Op::SendOnly, Op::WriteOnly, Op::ReadRequest, Op::Acknowledge, Op::CompareSwap];
    for qpn in qpns {
        for op in ops {
            let header = complete(Opcode::new(Transport::Rc, op).unwrap(), qpn, FAKE_PSN, 16);
            let header =
                RoceRepr { reth: header.reth.map(|r| RethRepr { va: v.mr.addr(), rkey: v.mr.rkey(), ..r }), ..header };
            v.peer.send(IP_A, &header, if op.has_payload() { &[0xee; 16] } else { &[] });
        }
    }
    let sent = (qpns.len() * ops.len()) as u64;
    wait_for("the packets to be counted", || v.node.ctx.counters().unknown_qp == before.unknown_qp + sent);
    let after = v.node.ctx.counters();
    assert_eq!(after.qp, before.qp, "a QP saw a packet for another");
    assert_eq!(after.malformed, before.malformed);
    assert!(v.peer.receive_until_quiet(QUIET).is_empty());
    assert_holds_only(&v.mr, 0, &[]);
    v.assert_works(FAKE_PSN);
}

#[test]
fn every_opcode_byte_at_a_real_context_is_counted_and_survived() {
    let v = Victim::new("all_opcodes");
    for wr_id in 0..4 {
        v.qp.post_recv(RecvWr { wr_id, sg_list: vec![v.mr.sge(4096 * wr_id as usize, 4096)] }).unwrap();
    }
    let before = v.node.ctx.counters();
    let mut malformed = 0;
    for byte in 0..=255u8 {
        let mut roce = packet_with_opcode(byte, v.qp.qpn(), FAKE_PSN);
        malformed += u64::from(RoceRepr::parse(&roce).is_err());
        v.peer.send_roce(IP_A, &mut roce);
    }
    wait_for("every datagram to be counted", || v.node.ctx.counters().link.received == before.link.received + 256);
    wait_for("every packet to be handled", || {
        let c = v.node.ctx.counters();
        c.malformed - before.malformed + c.qp.received_packets - before.qp.received_packets == 256
    });
    let after = v.node.ctx.counters();
    assert_eq!(after.malformed - before.malformed, malformed);
    assert_eq!(after.link.icrc_errors, before.link.icrc_errors);
    assert_eq!(after.unknown_qp, before.unknown_qp);
    // The first refused opcode (SEND_FIRST with 16 bytes) moved the QP to ERR.
    wait_for("ERR", || v.qp.state() == QpState::Err);
    eprintln!("256 opcode bytes at a real QP: {malformed} malformed, {} reached the QP", 256 - malformed);
    // The engine survived: a new QP works.
    let qp = v.node.qp(QpType::Rc);
    qp.connect(&v.peer.endpoint(FAKE_QPN + 1, FAKE_PSN), &options(Mtu::Mtu1024)).unwrap();
    let fresh = Victim { qp, ..v };
    fresh.assert_works(FAKE_PSN);
}

#[test]
fn malformed_datagrams_are_counted_and_dropped() {
    let v = Victim::new("malformed");
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: vec![v.mr.sge(0, 4096)] }).unwrap();
    let before = v.node.ctx.counters();
    let valid = |op, psn| {
        let header = rc(op, psn).ack_req().qpn(v.qp.qpn());
        let mut roce = vec![0u8; header.wire_len(16)];
        header.emit(&mut roce, &[0xee; 16]).unwrap();
        roce
    };
    // Dropped by the link: empty, too large for a receive slot.
    v.peer.send_datagram(IP_A, &[]);
    v.peer.send_datagram(IP_A, &vec![0u8; 65_000]);
    v.peer.send_datagram(IP_A, &vec![0u8; 9_217]);
    let link_malformed = 3;
    // ICRC errors: too short to hold a BTH and an ICRC, a flipped bit.
    for len in 1..16 {
        v.peer.send_datagram(IP_A, &vec![0u8; len]);
    }
    let mut flipped = valid(Op::SendOnly, FAKE_PSN);
    v.peer.fill_icrc(IP_A, &mut flipped);
    flipped[20] ^= 1;
    v.peer.send_datagram(IP_A, &flipped);
    let icrc_errors = 16;
    // A good ICRC over bytes that are not RoCE.
    let mut version_1 = valid(Op::SendOnly, FAKE_PSN);
    version_1[1] |= 0x01;
    let mut bad_pad = valid(Op::SendOnly, FAKE_PSN);
    bad_pad[1] |= 0x30;
    bad_pad.truncate(12 + 4);
    let mut reserved_syndrome = rc(Op::Acknowledge, FAKE_PSN).aeth(ACK, 0).qpn(v.qp.qpn()).emit_vec();
    reserved_syndrome[12] = 0x40;
    let mut read_with_payload =
        rc(Op::ReadRequest, FAKE_PSN).reth(v.mr.addr(), v.mr.rkey(), 16).qpn(v.qp.qpn()).emit_vec();
    read_with_payload.splice(12 + 16..12 + 16, [1, 2, 3, 4]);
    let mut every_truncation: Vec<Vec<u8>> = Opcode::all()
        .flat_map(|opcode| {
            let full = packet_with_opcode(opcode.to_u8(), v.qp.qpn(), FAKE_PSN);
            let headers = 12 + opcode.headers().len();
            (16..headers + 4).map(move |len| full[..len].to_vec())
        })
        .collect();
    let mut not_roce = vec![version_1, bad_pad, reserved_syndrome, read_with_payload];
    not_roce.append(&mut every_truncation);
    let engine_malformed = not_roce.len() as u64;
    for roce in &mut not_roce {
        assert!(RoceRepr::parse(roce).is_err(), "{roce:?} parses");
        v.peer.send_roce(IP_A, roce);
    }
    let total = link_malformed + icrc_errors + engine_malformed;
    wait_for("every datagram to be counted", || v.node.ctx.counters().link.received == before.link.received + total);
    wait_for("the engine to count its share", || {
        v.node.ctx.counters().malformed == before.malformed + engine_malformed
    });
    let after = v.node.ctx.counters();
    assert_eq!(after.link.malformed - before.link.malformed, link_malformed);
    assert_eq!(after.link.icrc_errors - before.link.icrc_errors, icrc_errors);
    assert_eq!(after.qp, before.qp, "a malformed packet reached a QP");
    assert!(v.peer.receive_until_quiet(QUIET).is_empty());
    assert_holds_only(&v.mr, 0, &[]);
    eprintln!("malformed datagrams: {link_malformed} dropped by the link, {icrc_errors} ICRC errors, {engine_malformed} not RoCE");
    v.assert_works(FAKE_PSN);
}

/// A header's bytes with a zero ICRC, for hand-made damage.
trait EmitVec {
    fn emit_vec(&self) -> Vec<u8>;
}

impl EmitVec for RoceRepr {
    fn emit_vec(&self) -> Vec<u8> {
        let mut roce = vec![0u8; self.wire_len(0)];
        self.emit(&mut roce, &[]).unwrap();
        roce
    }
}

#[test]
fn spoofed_sources_get_nothing_from_a_real_context() {
    let v = Victim::new("spoofed");
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: vec![v.mr.sge(0, 4096)] }).unwrap();
    let before = v.node.ctx.counters();
    // Someone who knows everything but cannot send from the peer's address.
    let spoofer = FakePeer::sender(OFF_PATH, v.port);
    let requests = [
        (rc(Op::SendOnly, FAKE_PSN).ack_req(), 64),
        (rc(Op::WriteOnly, FAKE_PSN).ack_req().reth(v.mr.addr(), v.mr.rkey(), 64), 64),
        (rc(Op::ReadRequest, FAKE_PSN).ack_req().reth(v.mr.addr(), v.mr.rkey(), 64), 0),
        (rc(Op::FetchAdd, FAKE_PSN).ack_req().atomic_eth(v.mr.addr(), v.mr.rkey(), 1, 0), 0),
        (rc(Op::Acknowledge, v.qp.endpoint(1).unwrap().psn.value()).aeth(ACK, 1), 0),
    ];
    for (header, len) in requests {
        spoofer.send(IP_A, &header.qpn(v.qp.qpn()), &vec![0xee; len]);
    }
    wait_for("the QP to drop them", || v.node.ctx.counters().qp.dropped == before.qp.dropped + 5);
    assert!(v.node.cq.poll_one().is_none());
    assert!(v.peer.receive_until_quiet(QUIET).is_empty());
    assert_holds_only(&v.mr, 0, &[]);
    assert_eq!(v.qp.state(), QpState::Rts);
    // The same SEND from the peer is executed.
    v.send(rc(Op::SendOnly, FAKE_PSN).ack_req(), &[0x5e; 64]);
    let ack = v.peer.receive(WAIT).expect("an ACK");
    assert_eq!((ack.op(), ack.psn(), ack.syndrome()), (Op::Acknowledge, FAKE_PSN, ACK));
    assert_holds_only(&v.mr, 0, &[0x5e; 64]);
}

#[test]
fn a_qp_pinned_to_its_peers_port_drops_the_peers_address_from_other_ports() {
    // A spoofer that can forge the peer's address but not its source port
    // (the peer holds it): by default it is the peer, as IBTA and rxe have it.
    let open = Victim::pinned("unpinned", false);
    open.qp.post_recv(RecvWr { wr_id: 1, sg_list: vec![open.mr.sge(0, 4096)] }).unwrap();
    let forger = FakePeer::sender(FAKE_PEER, open.port);
    forger.send(IP_A, &rc(Op::SendOnly, FAKE_PSN).ack_req().qpn(open.qp.qpn()), &[0x5e; 64]);
    let wc = next_wc(&open.node.cq);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (1, WcStatus::Success, 64));

    // Pinned to the peer's port, the QP drops it and stays the peer's.
    let v = Victim::pinned("pinned", true);
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: vec![v.mr.sge(0, 4096)] }).unwrap();
    let before = v.node.ctx.counters();
    let forger = FakePeer::sender(FAKE_PEER, v.port);
    let requests = [
        (rc(Op::SendOnly, FAKE_PSN).ack_req(), 64),
        (rc(Op::WriteOnly, FAKE_PSN).ack_req().reth(v.mr.addr(), v.mr.rkey(), 64), 64),
        (rc(Op::Acknowledge, v.qp.endpoint(1).unwrap().psn.value()).aeth(ACK, 1), 0),
    ];
    for (header, len) in requests {
        forger.send(IP_A, &header.qpn(v.qp.qpn()), &vec![0xee; len]);
    }
    wait_for("the QP to drop them", || v.node.ctx.counters().qp.dropped == before.qp.dropped + 3);
    assert!(v.node.cq.poll_one().is_none());
    assert!(v.peer.receive_until_quiet(QUIET).is_empty());
    assert_holds_only(&v.mr, 0, &[]);
    assert_eq!(v.qp.state(), QpState::Rts);
    v.send(rc(Op::SendOnly, FAKE_PSN).ack_req(), &[0x5e; 64]);
    let ack = v.peer.receive(WAIT).expect("an ACK");
    assert_eq!((ack.op(), ack.psn(), ack.syndrome()), (Op::Acknowledge, FAKE_PSN, ACK));
    assert_holds_only(&v.mr, 0, &[0x5e; 64]);
}

#[test]
fn a_write_stream_into_a_region_deregistered_half_way_is_naked() {
    let v = Victim::new("dereg_mid_write");
    const LEN: usize = 4 * 1024;
    let data = pattern(LEN, 11);
    let mut memory = vec![FILL; 2 * LEN];
    // SAFETY: `memory` outlives the region and is read only after it is dropped.
    let mr = unsafe { v.node.pd.reg_mr(memory.as_mut_ptr(), memory.len(), ALL_ACCESS) }.unwrap();
    let (va, rkey) = (mr.addr(), mr.rkey());
    v.send(rc(Op::WriteFirst, FAKE_PSN).reth(va, rkey, LEN as u32), &data[..1024]);
    wait_for("the first packet's bytes", || contents(&mr)[..1024] == data[..1024]);
    drop(mr);
    v.send(rc(Op::WriteMiddle, FAKE_PSN + 1), &data[1024..2048]);
    v.send(rc(Op::WriteMiddle, FAKE_PSN + 2), &data[2048..3072]);
    v.send(rc(Op::WriteLast, FAKE_PSN + 3).ack_req(), &data[3072..]);
    let sent = v.peer.receive_until_quiet(Duration::from_millis(300));
    assert_eq!(op_psn(&sent), vec![(Op::Acknowledge, FAKE_PSN + 1)]);
    assert_eq!(sent[0].syndrome(), Syndrome::Nak(NakCode::RemoteAccessError));
    wait_for("ERR", || v.qp.state() == QpState::Err);
    assert_eq!(next_async_event(&v.node.ctx), AsyncEvent::QpAccessError { qpn: v.qp.qpn() });
    assert_eq!(memory[..1024], data[..1024]);
    assert!(memory[1024..].iter().all(|b| *b == FILL), "bytes changed after deregistration");
}

#[test]
fn remote_invalidation_of_a_plain_mr_is_refused() {
    let v = Victim::new("invalidate");
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: vec![v.mr.sge(0, 4096)] }).unwrap();
    v.send(rc(Op::SendOnlyInv, FAKE_PSN).ack_req().ieth(v.mr.rkey()), &[1; 16]);
    let nak = v.peer.receive(WAIT).expect("a NAK");
    assert_eq!(
        (nak.op(), nak.psn(), nak.syndrome()),
        (Op::Acknowledge, FAKE_PSN, Syndrome::Nak(NakCode::InvalidRequest))
    );
    let wc = next_wc(&v.node.cq);
    assert_eq!((wc.wr_id, wc.status, wc.invalidated_rkey), (1, WcStatus::LocProtErr, None));
    wait_for("ERR", || v.qp.state() == QpState::Err);
    // The region is still registered: another QP may write it.
    let qp = v.node.qp(QpType::Rc);
    qp.connect(&v.peer.endpoint(FAKE_QPN + 1, FAKE_PSN), &options(Mtu::Mtu1024)).unwrap();
    v.peer.send(
        IP_A,
        &rc(Op::WriteOnly, FAKE_PSN).ack_req().reth(v.mr.addr() + 8192, v.mr.rkey(), 4).qpn(qp.qpn()),
        &[9; 4],
    );
    let ack = v.peer.receive(WAIT).expect("an ACK");
    assert_eq!((ack.psn(), ack.syndrome()), (FAKE_PSN, ACK));
    let mut written = [0u8; 4];
    v.mr.read(8192, &mut written).unwrap();
    assert_eq!(written, [9; 4]);
}

#[test]
fn a_flood_of_duplicates_at_a_real_context_leaves_the_qp_working() {
    let v = Victim::new("duplicates");
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: vec![v.mr.sge(0, 64)] }).unwrap();
    v.send(rc(Op::SendOnly, FAKE_PSN).ack_req(), &[1; 64]);
    v.send(rc(Op::ReadRequest, FAKE_PSN + 1).ack_req().reth(v.mr.addr() + 4096, v.mr.rkey(), 3000), &[]);
    let first: Vec<Sent> = (0..4).map(|_| v.peer.receive(WAIT).expect("an answer")).collect();
    let expected = vec![
        (Op::Acknowledge, FAKE_PSN),
        (Op::ReadResponseFirst, FAKE_PSN + 1),
        (Op::ReadResponseMiddle, FAKE_PSN + 2),
        (Op::ReadResponseLast, FAKE_PSN + 3),
    ];
    assert_eq!(op_psn(&first), expected);
    let before = v.node.ctx.counters();
    for i in 0..FLOOD {
        if i % 2 == 0 {
            v.send(rc(Op::SendOnly, FAKE_PSN).ack_req(), &[2; 64]);
        } else {
            v.send(rc(Op::ReadRequest, FAKE_PSN + 1).ack_req().reth(v.mr.addr() + 4096, v.mr.rkey(), 3000), &[]);
        }
    }
    let answers = v.peer.receive_until_quiet(Duration::from_millis(300));
    let after = v.node.ctx.counters();
    let duplicates = after.qp.duplicate_requests - before.qp.duplicate_requests;
    eprintln!("{FLOOD} duplicates at a real context: {duplicates} reached the QP, {} answers", answers.len());
    // At most one ACK per duplicate SEND, one 3-packet replay per duplicate READ.
    assert!(answers.len() as u64 <= 2 * duplicates, "{} answers to {duplicates} duplicates", answers.len());
    let replay = FAKE_PSN + 1..=FAKE_PSN + 3;
    let expected = |a: &Sent| match a.op() {
        Op::Acknowledge => (a.psn(), a.syndrome()) == (FAKE_PSN, ACK),
        Op::ReadResponseFirst | Op::ReadResponseMiddle | Op::ReadResponseLast => replay.contains(&a.psn()),
        _ => false,
    };
    assert!(answers.iter().all(expected), "unexpected answers to duplicates");
    assert!(v.node.cq.wait_one(QUIET).is_some_and(|wc| wc.wr_id == 1));
    assert!(v.node.cq.poll_one().is_none(), "a duplicate SEND completed");
    assert_holds_only(&v.mr, 0, &[1; 64]);
    v.assert_works(FAKE_PSN + 4);
}

#[test]
fn a_dropped_cq_gets_no_more_completions_or_events() {
    let (a, b) = nodes(false);
    let channel = a.ctx.create_comp_channel().unwrap();
    let cq = a.ctx.create_cq(16, Some(&channel)).unwrap();
    let qp = a.pd.create_qp(QpType::Rc, &cq).build().unwrap();
    let peer = b.qp(QpType::Rc);
    connect(&qp, &peer, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    let mr = a.mr(4096);
    for wr_id in 0..4 {
        qp.post_recv(RecvWr { wr_id, sg_list: vec![mr.sge(0, 64)] }).unwrap();
    }
    cq.req_notify(false);
    drop(cq);
    // Sends complete and receives flush, with nowhere to go.
    qp.post_send(SendWr::new(9, SendOp::RdmaWrite { remote_addr: 0, rkey: 0 })).unwrap();
    std::thread::sleep(QUIET);
    qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    assert_eq!(channel.get_event(QUIET), None, "an event for a destroyed CQ");
    // Another CQ on the channel still gets its events.
    let other = a.ctx.create_cq(16, Some(&channel)).unwrap();
    let qp2 = a.pd.create_qp(QpType::Rc, &other).build().unwrap();
    let peer2 = b.qp(QpType::Rc);
    connect(&qp2, &peer2, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    other.req_notify(false);
    qp2.post_send(SendWr::new(10, SendOp::RdmaWrite { remote_addr: 0, rkey: 0 })).unwrap();
    assert_eq!(channel.get_event(WAIT), Some(other.id()));
    assert_eq!(other.poll_one().map(|wc| (wc.wr_id, wc.status)), Some((10, WcStatus::Success)));
}

#[test]
fn a_destroyed_qp_completes_nothing_after_destroy_returns() {
    let (a, b) = nodes(false);
    let (mr_a, mr_b) = (a.mr(1 << 16), b.mr(1 << 16));
    let mut late = Vec::new();
    for round in 0..40 {
        let (qp_a, qp_b) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
        connect(&qp_a, &qp_b, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
        for wr_id in 0..128 {
            qp_b.post_recv(RecvWr { wr_id, sg_list: vec![mr_b.sge(0, 1024)] }).unwrap();
        }
        for wr_id in 0..128 {
            let wr = SendWr {
                flags: SendFlags { signaled: true, ..SendFlags::default() },
                ..SendWr::new(wr_id, SendOp::Send)
            };
            qp_a.post_send(wr.with_sge(mr_a.sge(0, 1024))).unwrap();
        }
        // Destroy each side in the middle of the traffic.
        let _ = b.cq.wait_one(WAIT);
        let (qpn_a, qpn_b) = (qp_a.qpn(), qp_b.qpn());
        if round % 2 == 0 {
            drop(qp_b);
            while b.cq.poll_one().is_some() {}
            let _ = a.cq.wait_one(Duration::from_millis(2));
            drop(qp_a);
        } else {
            drop(qp_a);
            while a.cq.poll_one().is_some() {}
            drop(qp_b);
        }
        while a.cq.poll_one().is_some() {}
        while b.cq.poll_one().is_some() {}
        std::thread::sleep(Duration::from_millis(20));
        for (cq, qpn) in [(&a.cq, qpn_a), (&b.cq, qpn_b)] {
            let of_qp = std::iter::from_fn(|| cq.poll_one()).filter(|wc| wc.qp_num == qpn);
            late.extend(of_qp.map(|wc| (round, qpn, wc.wr_id, wc.opcode, wc.status)));
        }
    }
    assert!(late.is_empty(), "completions after destroy (round, QPN, wr_id, opcode, status): {late:?}");
}

#[test]
fn a_destroyed_qp_answers_a_resend_of_its_last_message_for_a_while_and_nothing_else() {
    let victim = Victim::new("lingering");
    victim.assert_works(FAKE_PSN);
    let (qpn, peer_qpn) = (victim.qp.qpn(), victim.peer_qpn());
    let Victim { node, peer, qp, .. } = victim;
    drop(qp);
    let resend = |psn: u32| peer.send(IP_A, &rc(Op::SendOnly, psn).ack_req().qpn(qpn), &[7; 16]);
    let answers = || peer.receive_until_quiet(QUIET);

    // The ACK of the last SEND was lost, say: the peer resends it, and hears it again.
    resend(FAKE_PSN);
    let acks: Vec<_> = answers().iter().map(|a| (a.op(), a.psn(), a.syndrome(), a.header.bth.dest_qpn)).collect();
    assert_eq!(acks, vec![(Op::Acknowledge, FAKE_PSN, ACK, peer_qpn)]);
    // A new message is not taken: the QP is gone.
    resend(FAKE_PSN + 1);
    assert!(answers().is_empty(), "an answer to a request after destroy");
    assert!(node.cq.poll_one().is_none(), "a completion after destroy");
    // After a while nothing answers at all.
    std::thread::sleep(Duration::from_millis(1100));
    let before = node.ctx.counters().unknown_qp;
    resend(FAKE_PSN);
    assert!(answers().is_empty(), "an answer long after destroy");
    wait_for("the resend to count as for an unknown QP", || node.ctx.counters().unknown_qp > before);
}
