//! Memory at the boundary (rxe-spec/security.md): no packet makes softroce
//! touch memory outside a granted region.

use super::*;

/// The current 64-bit word at `offset` of the target's region.
fn word(t: &TestQp, offset: u64) -> u64 {
    u64::from_ne_bytes(t.bytes(offset, 8).try_into().unwrap())
}

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
    t.qp.post_recv(RecvWr { wr_id: 2, sg_list: softroce::sg_list![] }).unwrap();
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
    t.qp.post_recv(RecvWr { wr_id: 4, sg_list: softroce::sg_list![] }).unwrap();
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
    fn check(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        if key != HUGE_KEY {
            return Err(MemError::InvalidKey(key));
        }
        if user.pd != PD {
            return Err(MemError::WrongPd);
        }
        if !Access::REMOTE_READ.contains(access) {
            return Err(MemError::AccessDenied);
        }
        offset_in(HUGE_VA, HUGE_LEN, addr, len).map(|_| ())
    }

    fn resolve(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<u32, MemError> {
        self.check(key, user, addr, len, access).map(|()| key)
    }

    fn read(&self, key: u32, user: KeyUser, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        self.check(key, user, addr, out.len() as u64, access)?;
        for (i, b) in out.iter_mut().enumerate() {
            *b = (addr - HUGE_VA + i as u64) as u8;
        }
        Ok(())
    }

    fn write(&mut self, _: u32, _: KeyUser, _: u64, _: &[u8], _: Access) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }

    fn atomic(&mut self, _: u32, _: KeyUser, _: u64, _: AtomicOp) -> Result<u64, MemError> {
        Err(MemError::AccessDenied)
    }

    fn invalidate(&mut self, _: u32, _: KeyUser) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }

    fn bind_window(&mut self, _: KeyUser, _: &MwBind) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }

    fn flush(&mut self, _: u32, _: KeyUser, _: Option<(u64, u64)>, _: Access) -> Result<(), MemError> {
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
    let mut next = |qp: &mut Qp, mem: &mut Huge| {
        let tx = qp.poll_transmit(now, mem, &mut buf, TransmitOrder::ResponsesFirst)?;
        let parsed = RoceRepr::parse(&buf[..tx.len]).unwrap();
        Some((parsed.header.bth.opcode.operation(), parsed.header.bth.psn.value(), parsed.payload.to_vec()))
    };
    let len = (1u32 << 31) - 1;
    let packets = len.div_ceil(4096);
    feed(&mut qp, &mut mem, rc(Op::ReadRequest, RQ_PSN).ack_req().reth(HUGE_VA, HUGE_KEY, len));
    // The PSN after the READ's responses: a zero-length SEND into a receive without buffers.
    qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![] }).unwrap();
    feed(&mut qp, &mut mem, rc(Op::SendOnly, psn_plus(RQ_PSN, packets.into())).ack_req());
    for k in 0..256u32 {
        let (op, psn, payload) = next(&mut qp, &mut mem).expect("the READ streams");
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
    let (op, psn, payload) = next(&mut qp, &mut mem).unwrap();
    assert_eq!((op, psn, payload.len()), (Op::ReadResponseOnly, psn_plus(RQ_PSN, last.into()), tail as usize));
    assert!(payload.iter().enumerate().all(|(i, b)| *b == (last as usize * 4096 + i) as u8));
    let (op, psn, _) = next(&mut qp, &mut mem).unwrap();
    assert_eq!((op, psn), (Op::Acknowledge, psn_plus(RQ_PSN, packets.into())));
    assert!(next(&mut qp, &mut mem).is_none());
    assert_eq!(qp.state(), QpState::Rts);
}
