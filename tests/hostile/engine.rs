//! The real engine (rxe-spec/security.md): unknown QPs, malformed
//! datagrams, spoofed sources, floods, deregistration and teardown, aimed at
//! a real context over loopback UDP.

use super::*;

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
        v.qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![v.mr.sge(4096 * wr_id as usize, 4096)] }).unwrap();
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
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![v.mr.sge(0, 4096)] }).unwrap();
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
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![v.mr.sge(0, 4096)] }).unwrap();
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
    open.qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![open.mr.sge(0, 4096)] }).unwrap();
    let forger = FakePeer::sender(FAKE_PEER, open.port);
    forger.send(IP_A, &rc(Op::SendOnly, FAKE_PSN).ack_req().qpn(open.qp.qpn()), &[0x5e; 64]);
    let wc = next_wc(&open.node.cq);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (1, WcStatus::Success, 64));

    // Pinned to the peer's port, the QP drops it and stays the peer's.
    let v = Victim::pinned("pinned", true);
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![v.mr.sge(0, 4096)] }).unwrap();
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
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![v.mr.sge(0, 4096)] }).unwrap();
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
    v.qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![v.mr.sge(0, 64)] }).unwrap();
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
        qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![mr.sge(0, 64)] }).unwrap();
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
            qp_b.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![mr_b.sge(0, 1024)] }).unwrap();
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
