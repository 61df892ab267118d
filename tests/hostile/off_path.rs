//! Off-path injection (rxe-spec/security.md, ReDMArk): packets injected
//! from off path are not accepted.

use super::*;

/// An off-path attacker: any address but the peer's.
const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 66));

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
        t.qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![sge] }).unwrap();
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

#[test]
fn off_path_spray_at_a_real_context_gets_nothing_accepted() {
    const SPRAY: u32 = 20_000;
    let v = Victim::new("sprayed");
    for wr_id in 0..16 {
        v.qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![v.mr.sge(64 * wr_id as usize, 64)] }).unwrap();
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
fn rkeys_and_initial_psns_are_random() {
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
    // The top bit marks a memory window's key (rxe-spec V-16); the other
    // 31 are random.
    let key_bits = bit_counts(&keys, 32);
    assert!(in_range(&key_bits[..31]) && key_bits[31] == 0, "key bits: {key_bits:?}");
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
