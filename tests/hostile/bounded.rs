//! No panic, no hang, bounded memory (rxe-spec/security.md): malformed
//! packets, impossible sequences, PSNs far away, floods.

use super::*;

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
/// present, 16 bytes of payload (8 for ATOMIC_WRITE), RETH and AtomicETH
/// aimed at the region).
fn expected_outcome(byte: u8) -> Outcome {
    use Outcome::*;
    match byte {
        // ATOMIC_WRITE carries its 8 bytes (`packet_with_opcode`).
        0x04 | 0x05 | 0x0a | 0x0b | 0x1d => Executed(Op::Acknowledge),
        0x0c => Executed(Op::ReadResponseOnly),
        0x13 | 0x14 => Executed(Op::AtomicAcknowledge),
        // The region grants no FLUSH right.
        0x1c => Refused(NakCode::RemoteAccessError),
        // FIRST with less than an MTU, MIDDLE/LAST without FIRST, SEND with
        // invalidate of a key that is not there.
        0x00..=0x03 | 0x06..=0x09 | 0x16 | 0x17 => Refused(NakCode::InvalidRequest),
        // Responses at a QP that asked for nothing.
        0x0d..=0x12 => Dropped,
        // UC and UD opcodes at an RC QP.
        0x20..=0x2b | 0x64 | 0x65 => Dropped,
        _ => Malformed,
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
