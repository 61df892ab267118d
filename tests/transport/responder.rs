//! The responder (rxe-spec/transport.md, "Responder"): requests in,
//! responses out.

use std::net::IpAddr;

use softroce::transport::*;
use softroce::wire::{AethRepr, NakCode, Operation, RoceRepr, Syndrome, Transport};

use crate::lending::transmit_lending;
use crate::support::pattern;
use crate::support::qp::*;

#[test]
fn responder_acks_send_only_with_credits_and_msn() {
    let mut node = TestQp::rc();
    node.post_recv(7, 0x8000, 4096);
    let data = pattern(100, 1);
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &data);

    let sent = node.transmit();
    assert_one_ack(&sent, RQ_PSN, ACK, 1);
    assert_eq!(sent[0].aeth().syndrome.to_u8(), Ok(0x1f));
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![(CqKind::Recv, 7, WcStatus::Success, WcOpcode::Recv)]);
    assert_eq!(wcs[0].1.byte_len, 100);
    assert_eq!(node.bytes(0x8000, 100), data);
    assert!(node.transmit().is_empty());
}

#[test]
fn connected_qp_ignores_packets_from_other_addresses() {
    let mut node = TestQp::rc();
    node.post_recv(7, 0x8000, 4096);
    let spoofer: IpAddr = "10.0.0.66".parse().unwrap();
    node.feed_from(spoofer, rc(Operation::SendOnly, RQ_PSN).ack_req(), &pattern(100, 3));
    node.feed_from(spoofer, rc(Operation::Acknowledge, SQ_PSN).aeth(ACK, 1), &[]);
    assert!(node.transmit().is_empty());
    assert!(node.completions().is_empty());
    assert_eq!(node.qp.counters().dropped, 2);
    assert_eq!(node.bytes(0x8000, 100), vec![0; 100]);
    // The same SEND from the peer is executed.
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &pattern(100, 3));
    assert_one_ack(&node.transmit(), RQ_PSN, ACK, 1);
}

#[test]
fn responder_acks_multi_packet_send_once_on_last() {
    let mut node = TestQp::rc();
    node.post_recv(7, 0x8000, 4096);
    let data = pattern(2 * MTU + 500, 2);
    node.feed(rc(Operation::SendFirst, RQ_PSN), &data[..MTU]);
    assert!(node.transmit().is_empty());
    node.feed(rc(Operation::SendMiddle, RQ_PSN + 1), &data[MTU..2 * MTU]);
    assert!(node.transmit().is_empty());
    assert!(node.completions().is_empty());
    node.feed(rc(Operation::SendLast, RQ_PSN + 2).ack_req(), &data[2 * MTU..]);

    assert_one_ack(&node.transmit(), RQ_PSN + 2, ACK, 1);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![(CqKind::Recv, 7, WcStatus::Success, WcOpcode::Recv)]);
    assert_eq!(wcs[0].1.byte_len as usize, data.len());
    assert_eq!(node.bytes(0x8000, data.len()), data);
}

#[test]
fn responder_coalesces_acks_polled_late() {
    let mut node = TestQp::rc();
    node.post_recv(1, 0x8000, 256);
    node.post_recv(2, 0x9000, 256);
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &pattern(10, 1));
    node.feed(rc(Operation::SendOnly, RQ_PSN + 1).ack_req(), &pattern(20, 2));

    assert_one_ack(&node.transmit(), RQ_PSN + 1, ACK, 2);
    let wcs = node.completions();
    assert_eq!(wcs.iter().map(|(_, wc)| (wc.wr_id, wc.byte_len)).collect::<Vec<_>>(), vec![(1, 10), (2, 20)]);
}

#[test]
fn responder_naks_a_psn_gap_once_then_stays_silent_until_the_expected_psn() {
    let mut node = TestQp::rc();
    for wr_id in 1..=4 {
        node.post_recv(wr_id, 0x1000 * wr_id, 256);
    }
    let seq_err = Syndrome::Nak(NakCode::PsnSequenceError);
    assert_eq!(seq_err.to_u8(), Ok(0x60));

    node.feed(rc(Operation::SendOnly, RQ_PSN + 2).ack_req(), &[1; 8]);
    assert_one_ack(&node.transmit(), RQ_PSN, seq_err, 0);
    for psn in [RQ_PSN + 3, RQ_PSN + 2, RQ_PSN + 4] {
        node.feed(rc(Operation::SendOnly, psn).ack_req(), &[2; 8]);
        assert!(node.transmit().is_empty(), "out-of-order PSN {psn} answered");
    }
    assert!(node.completions().is_empty());
    assert_eq!(node.qp.state(), QpState::Rts);

    // The expected PSN arrives: normal processing resumes.
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &[3; 8]);
    assert_one_ack(&node.transmit(), RQ_PSN, ACK, 1);
    node.feed(rc(Operation::SendOnly, RQ_PSN + 1).ack_req(), &[4; 8]);
    assert_one_ack(&node.transmit(), RQ_PSN + 1, ACK, 2);
    assert_eq!(summary(&node.completions()).len(), 2);

    // A later gap is NAKed again, with the new expected PSN.
    node.feed(rc(Operation::SendOnly, RQ_PSN + 5).ack_req(), &[5; 8]);
    assert_one_ack(&node.transmit(), RQ_PSN + 2, seq_err, 2);
    node.feed(rc(Operation::SendOnly, RQ_PSN + 6).ack_req(), &[6; 8]);
    assert!(node.transmit().is_empty());
    assert_eq!(node.qp.counters().seq_naks_sent, 2);
    assert_eq!(node.qp.state(), QpState::Rts);
}

#[test]
fn responder_reacks_duplicate_send_and_write_without_executing_them() {
    let mut node = TestQp::rc();
    node.post_recv(1, 0x8000, 256);
    node.post_recv(2, 0x9000, 256);
    let original = pattern(16, 1);
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &original);
    node.feed(rc(Operation::WriteOnly, RQ_PSN + 1).ack_req().reth(VA, KEY, 16), &original);
    assert_one_ack(&node.transmit(), RQ_PSN + 1, ACK, 2);
    assert_eq!(summary(&node.completions()), vec![(CqKind::Recv, 1, WcStatus::Success, WcOpcode::Recv)]);

    // Duplicates with other bytes, without AckReq: re-ACKed with the PSN
    // before the expected one, nothing executed.
    let other = pattern(16, 99);
    node.feed(rc(Operation::SendOnly, RQ_PSN), &other);
    assert_one_ack(&node.transmit(), RQ_PSN + 1, ACK, 2);
    node.feed(rc(Operation::WriteOnly, RQ_PSN + 1).reth(VA, KEY, 16), &other);
    assert_one_ack(&node.transmit(), RQ_PSN + 1, ACK, 2);
    assert!(node.completions().is_empty());
    assert_eq!(node.bytes(0, 16), original);
    assert_eq!(node.bytes(0x8000, 16), original);
    assert_eq!(node.qp.counters().duplicate_requests, 2);

    // The receive queue was not touched: the next SEND takes receive 2.
    node.feed(rc(Operation::SendOnly, RQ_PSN + 2).ack_req(), &other);
    assert_one_ack(&node.transmit(), RQ_PSN + 2, ACK, 3);
    assert_eq!(summary(&node.completions()), vec![(CqKind::Recv, 2, WcStatus::Success, WcOpcode::Recv)]);
    assert_eq!(node.bytes(0x9000, 16), other);
}

#[test]
fn a_lingering_qp_reacks_resent_sends_and_writes_and_answers_nothing_else() {
    let mut node = TestQp::rc();
    node.post_recv(1, 0x8000, 256);
    node.post_recv(2, 0x9000, 256);
    let original = pattern(16, 1);
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &original);
    node.feed(rc(Operation::ReadRequest, RQ_PSN + 1).ack_req().reth(VA, KEY, 16), &[]);
    node.transmit();
    node.completions();
    node.qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    node.completions();
    node.qp.linger();

    // The ACK of the last SEND or WRITE executed, as for any duplicate.
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &pattern(16, 2));
    assert_one_ack(&node.transmit(), RQ_PSN, ACK, 2);
    // Not a READ replay (its memory may be gone), not a new SEND.
    node.feed(rc(Operation::ReadRequest, RQ_PSN + 1).ack_req().reth(VA, KEY, 16), &[]);
    node.feed(rc(Operation::SendOnly, RQ_PSN + 2).ack_req(), &pattern(16, 3));
    assert!(node.transmit().is_empty());
    assert!(node.completions().is_empty());
    assert_eq!(node.bytes(0x8000, 16), original);
    assert_eq!(node.bytes(0x9000, 16), vec![0; 16]);
}

/// A responder that has answered a 3000-byte READ at `RQ_PSN` of the bytes at `VA`.
fn responder_after_read() -> (TestQp, Vec<u8>) {
    let mut node = TestQp::rc();
    let data = pattern(3000, 7);
    node.fill(0, &data);
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(VA, KEY, 3000), &[]);
    let sent = node.transmit();
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![
            (Operation::ReadResponseFirst, RQ_PSN, false),
            (Operation::ReadResponseMiddle, RQ_PSN + 1, false),
            (Operation::ReadResponseLast, RQ_PSN + 2, false),
        ]
    );
    assert_eq!(sent[0].aeth(), AethRepr { syndrome: ACK, msn: 1 });
    assert_eq!(sent[1].header.aeth, None);
    assert_eq!(sent[2].aeth(), AethRepr { syndrome: ACK, msn: 1 });
    let payload: Vec<u8> = sent.iter().flat_map(|s| s.payload.clone()).collect();
    assert_eq!(payload, data);
    (node, data)
}

/// rxe-spec T-36: a READ response's payload of a whole 4 KiB is lent from
/// the region the READ reads, as a request's is; a shorter one is copied.
#[test]
fn read_responses_lend_whole_packets_and_copy_the_rest() {
    const M: usize = 4096;
    let mut node = TestQp::new(QpType::Rc, QpAttr { path_mtu: Mtu::Mtu4096, ..attr() });
    let data = pattern(2 * M + 100, 3);
    node.fill(0, &data);
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(VA, KEY, data.len() as u32), &[]);
    let sent = transmit_lending(&mut node);
    assert_eq!(sent.iter().map(|s| s.0).collect::<Vec<_>>(), [true, true, false]);
    assert_eq!(sent.iter().flat_map(|s| s.1.clone()).collect::<Vec<_>>(), data);
    // A READ of exactly one packet: its ONLY response (with an AETH) lent too.
    node.feed(rc(Operation::ReadRequest, RQ_PSN + 3).ack_req().reth(VA + M as u64, KEY, M as u32), &[]);
    assert_eq!(transmit_lending(&mut node), [(true, data[M..2 * M].to_vec())]);
}

#[test]
fn responder_replays_a_duplicate_read() {
    let (mut node, data) = responder_after_read();
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(VA, KEY, 3000), &[]);
    let sent = node.transmit();
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![
            (Operation::ReadResponseFirst, RQ_PSN, false),
            (Operation::ReadResponseMiddle, RQ_PSN + 1, false),
            (Operation::ReadResponseLast, RQ_PSN + 2, false),
        ]
    );
    let payload: Vec<u8> = sent.iter().flat_map(|s| s.payload.clone()).collect();
    assert_eq!(payload, data);
    assert_eq!(node.qp.counters().duplicate_requests, 1);

    // The replay did not move the expected PSN.
    node.post_recv(1, 0x8000, 64);
    node.feed(rc(Operation::SendOnly, RQ_PSN + 3).ack_req(), &[1; 4]);
    assert_one_ack(&node.transmit(), RQ_PSN + 3, ACK, 2);
}

#[test]
fn responder_replays_only_the_tail_a_partial_read_retry_asks_for() {
    let (mut node, data) = responder_after_read();
    let tail = (3000 - MTU) as u32;
    node.feed(rc(Operation::ReadRequest, RQ_PSN + 1).ack_req().reth(VA + MTU as u64, KEY, tail), &[]);
    let sent = node.transmit();
    // A retried READ is a new request message: its responses start with
    // FIRST (IBTA); kernel rxe would send MIDDLE here.
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![(Operation::ReadResponseFirst, RQ_PSN + 1, false), (Operation::ReadResponseLast, RQ_PSN + 2, false)]
    );
    assert_eq!(sent[0].payload, data[MTU..2 * MTU]);
    assert_eq!(sent[1].payload, data[2 * MTU..]);
}

#[test]
fn responder_drops_a_duplicate_read_outside_the_original() {
    let (mut node, _) = responder_after_read();
    let dropped = node.qp.counters().dropped;
    // Past the end of the original range.
    node.feed(rc(Operation::ReadRequest, RQ_PSN + 1).ack_req().reth(VA + 2048, KEY, 2000), &[]);
    // Before its start.
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(VA - 8, KEY, 16), &[]);
    // Another key.
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(VA, KEY + 1, 16), &[]);
    // A PSN no READ had.
    node.feed(rc(Operation::ReadRequest, RQ_PSN - 1).ack_req().reth(VA, KEY, 16), &[]);
    assert!(node.transmit().is_empty());
    assert_eq!(node.qp.counters().dropped, dropped + 4);
    assert_eq!(node.qp.state(), QpState::Rts);
}

#[test]
fn responder_replays_a_duplicate_atomic_without_executing_it_again() {
    let mut node = TestQp::rc();
    node.fill(0x100, &5u64.to_ne_bytes());
    let fetch_add = rc(Operation::FetchAdd, RQ_PSN).ack_req().atomic_eth(VA + 0x100, KEY, 3, 0);
    node.feed(fetch_add, &[]);
    let sent = node.transmit();
    assert_eq!(op_psn_ack_req(&sent), vec![(Operation::AtomicAcknowledge, RQ_PSN, false)]);
    assert_eq!(sent[0].aeth(), AethRepr { syndrome: ACK, msn: 1 });
    assert_eq!(sent[0].header.atomic_ack_eth.unwrap().original, 5);
    assert_eq!(node.bytes(0x100, 8), 8u64.to_ne_bytes());

    node.feed(fetch_add, &[]);
    let sent = node.transmit();
    assert_eq!(op_psn_ack_req(&sent), vec![(Operation::AtomicAcknowledge, RQ_PSN, false)]);
    assert_eq!(sent[0].header.atomic_ack_eth.unwrap().original, 5);
    assert_eq!(node.bytes(0x100, 8), 8u64.to_ne_bytes(), "the atomic ran twice");
}

#[test]
fn responder_rnr_naks_a_send_without_receive_until_one_is_posted() {
    let mut node = TestQp::rc();
    let rnr = Syndrome::RnrNak { timer: MIN_RNR_TIMER };
    assert_eq!(rnr.to_u8(), Ok(0x20 | MIN_RNR_TIMER));
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &[1; 32]);
    assert_one_ack(&node.transmit(), RQ_PSN, rnr, 0);
    assert!(node.completions().is_empty());

    // Nothing advanced: the retry is still the expected PSN, still without receive.
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &[1; 32]);
    assert_one_ack(&node.transmit(), RQ_PSN, rnr, 0);
    assert_eq!(node.qp.counters().rnr_naks_sent, 2);
    assert_eq!(node.qp.state(), QpState::Rts);

    node.post_recv(9, 0x8000, 64);
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &[1; 32]);
    assert_one_ack(&node.transmit(), RQ_PSN, ACK, 1);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![(CqKind::Recv, 9, WcStatus::Success, WcOpcode::Recv)]);
    assert_eq!(wcs[0].1.byte_len, 32);
}

/// A responder with two receives posted.
fn responder_with_receives(attr: QpAttr) -> TestQp {
    let mut node = TestQp::new(QpType::Rc, attr);
    node.post_recv(1, 0x8000, 4096);
    node.post_recv(2, 0x9000, 4096);
    node
}

/// The responder sent exactly one NAK `code` for `psn`, moved to ERR with
/// `event`, and flushed the receives it had not used.
fn assert_fatal_nak(node: &mut TestQp, psn: u32, code: NakCode, event: AsyncEvent, flushed: &[u64]) {
    assert_one_ack(&node.transmit(), psn, Syndrome::Nak(code), 0);
    let sent = node.qp.counters().fatal_naks_sent;
    let one_of_its_kind = match code {
        NakCode::InvalidRequest => FatalNaks { invalid_request: 1, ..FatalNaks::default() },
        NakCode::RemoteAccessError => FatalNaks { remote_access: 1, ..FatalNaks::default() },
        _ => FatalNaks { remote_operational: 1, ..FatalNaks::default() },
    };
    assert_eq!(sent, one_of_its_kind, "{code:?} counted by kind");
    assert_eq!(node.qp.state(), QpState::Err);
    assert_eq!(node.events(), vec![event]);
    let wcs = node.completions();
    let expected: Vec<_> = flushed.iter().map(|id| (CqKind::Recv, *id, WcStatus::WrFlushErr, WcOpcode::Recv)).collect();
    assert_eq!(summary(&wcs), expected);
    // Nothing more is answered in ERR.
    node.feed(rc(Operation::SendOnly, psn + 1).ack_req(), &[0; 4]);
    assert!(node.transmit().is_empty());
}

fn assert_invalid_request(node: &mut TestQp, psn: u32) {
    assert_eq!(Syndrome::Nak(NakCode::InvalidRequest).to_u8(), Ok(0x61));
    assert_fatal_nak(node, psn, NakCode::InvalidRequest, AsyncEvent::QpRequestError { qpn: QPN }, &[1, 2]);
}

#[test]
fn invalid_request_middle_without_first() {
    let mut node = responder_with_receives(attr());
    node.feed(rc(Operation::SendMiddle, RQ_PSN).ack_req(), &pattern(MTU, 1));
    assert_invalid_request(&mut node, RQ_PSN);
    assert_eq!(node.bytes(0x8000, MTU), vec![0; MTU]);
}

#[test]
fn invalid_request_first_shorter_than_the_mtu() {
    let mut node = responder_with_receives(attr());
    node.feed(rc(Operation::SendFirst, RQ_PSN), &pattern(MTU - 4, 1));
    assert_invalid_request(&mut node, RQ_PSN);
}

#[test]
fn invalid_request_write_last_longer_than_the_reth_length() {
    let mut node = responder_with_receives(attr());
    let data = pattern(MTU + 200, 3);
    node.feed(rc(Operation::WriteFirst, RQ_PSN).reth(VA, KEY, MTU as u32 + 100), &data[..MTU]);
    assert!(node.transmit().is_empty());
    node.feed(rc(Operation::WriteLast, RQ_PSN + 1).ack_req(), &data[MTU..]);
    assert_invalid_request(&mut node, RQ_PSN + 1);
    assert_eq!(node.bytes(0, MTU), data[..MTU]);
    assert_eq!(node.bytes(MTU as u64, 4096), vec![0; 4096]);
}

#[test]
fn invalid_request_read_without_remote_read_access() {
    let mut node = responder_with_receives(QpAttr { access_flags: Access::REMOTE_WRITE, ..attr() });
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(VA, KEY, 64), &[]);
    assert_invalid_request(&mut node, RQ_PSN);
}

#[test]
fn invalid_request_misaligned_atomic() {
    let mut node = responder_with_receives(attr());
    node.feed(rc(Operation::FetchAdd, RQ_PSN).ack_req().atomic_eth(VA + 4, KEY, 1, 0), &[]);
    assert_invalid_request(&mut node, RQ_PSN);
    assert_eq!(node.bytes(0, 16), vec![0; 16]);
}

#[test]
fn responder_checks_psn_then_sequence_then_access_then_rkey() {
    // A PSN gap is NAKed as such even when the R_Key is bad too.
    let mut node = responder_with_receives(attr());
    node.feed(rc(Operation::WriteOnly, RQ_PSN + 3).ack_req().reth(VA, KEY + 7, 16), &[0xab; 16]);
    assert_one_ack(&node.transmit(), RQ_PSN, Syndrome::Nak(NakCode::PsnSequenceError), 0);
    assert_eq!(node.qp.state(), QpState::Rts);

    // A MIDDLE with no FIRST is an invalid request before its R_Key matters.
    node.feed(rc(Operation::WriteMiddle, RQ_PSN).ack_req(), &pattern(MTU, 1));
    assert_invalid_request(&mut node, RQ_PSN);

    // The QP's access flags are checked before the R_Key: a READ on a QP
    // without REMOTE_READ is an invalid request, not a remote access error.
    let mut node = responder_with_receives(QpAttr { access_flags: Access::REMOTE_WRITE, ..attr() });
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(VA, KEY + 7, 64), &[]);
    assert_invalid_request(&mut node, RQ_PSN);
    assert_eq!(node.bytes(0, 64), vec![0; 64]);
}

fn assert_remote_access_error(node: &mut TestQp, psn: u32) {
    assert_eq!(Syndrome::Nak(NakCode::RemoteAccessError).to_u8(), Ok(0x62));
    assert_fatal_nak(node, psn, NakCode::RemoteAccessError, AsyncEvent::QpAccessError { qpn: QPN }, &[1, 2]);
}

#[test]
fn remote_access_error_wrong_rkey() {
    let mut node = responder_with_receives(attr());
    node.feed(rc(Operation::WriteOnly, RQ_PSN).ack_req().reth(VA, KEY + 7, 16), &[0xab; 16]);
    assert_remote_access_error(&mut node, RQ_PSN);
    assert_eq!(node.bytes(0, 16), vec![0; 16]);
}

#[test]
fn remote_access_error_rkey_of_another_pd() {
    let mut node = responder_with_receives(attr());
    let foreign = Region { pd: PD + 1, addr: 0x4000_0000, access: Access::REMOTE_WRITE, data: vec![0; 64] };
    node.mem.register(5, foreign.clone());
    node.feed(rc(Operation::WriteOnly, RQ_PSN).ack_req().reth(0x4000_0000, 5, 16), &[0xab; 16]);
    assert_remote_access_error(&mut node, RQ_PSN);
    assert_eq!(node.mem.region(5), Some(&foreign));
}

#[test]
fn remote_access_error_write_out_of_bounds() {
    let mut node = responder_with_receives(attr());
    let end = VA + REGION_LEN as u64;
    node.feed(rc(Operation::WriteOnly, RQ_PSN).ack_req().reth(end - 8, KEY, 16), &[0xab; 16]);
    assert_remote_access_error(&mut node, RQ_PSN);
    assert!(node.bytes(0, REGION_LEN).iter().all(|b| *b == 0));
}

#[test]
fn remote_access_error_read_beyond_the_region_end() {
    let mut node = responder_with_receives(attr());
    let end = VA + REGION_LEN as u64;
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(end - 100, KEY, 200), &[]);
    assert_remote_access_error(&mut node, RQ_PSN);
}

#[test]
fn remote_access_error_range_wrapping_2_pow_64() {
    // A region at address 0: a va + len that wraps past 2^64 lands inside it.
    let mut node = responder_with_receives(attr());
    let low = Region { pd: PD, addr: 0, access: Access::REMOTE_WRITE | Access::REMOTE_READ, data: vec![0; 64] };
    node.mem.register(4, low.clone());
    node.feed(rc(Operation::WriteOnly, RQ_PSN).ack_req().reth(u64::MAX - 3, 4, 8), &[0xab; 8]);
    assert_remote_access_error(&mut node, RQ_PSN);
    assert_eq!(node.mem.region(4), Some(&low));

    let mut node = responder_with_receives(attr());
    node.mem.register(4, low.clone());
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(u64::MAX - 3, 4, 8), &[]);
    assert_remote_access_error(&mut node, RQ_PSN);
}

#[test]
fn remote_access_error_region_deregistered_mid_write() {
    let mut node = responder_with_receives(attr());
    let data = pattern(3 * MTU, 4);
    node.feed(rc(Operation::WriteFirst, RQ_PSN).reth(VA, KEY, data.len() as u32), &data[..MTU]);
    assert!(node.transmit().is_empty());
    let region = node.mem.deregister(KEY).unwrap();
    node.feed(rc(Operation::WriteMiddle, RQ_PSN + 1), &data[MTU..2 * MTU]);
    assert_remote_access_error(&mut node, RQ_PSN + 1);
    assert_eq!(region.data[..MTU], data[..MTU]);
    assert!(region.data[MTU..].iter().all(|b| *b == 0));
}

#[test]
fn receive_buffer_too_small_completes_with_local_length_error() {
    let mut node = TestQp::rc();
    node.post_recv(1, 0x8000, 100);
    node.post_recv(2, 0x9000, 100);
    node.feed(rc(Operation::SendOnly, RQ_PSN).ack_req(), &pattern(200, 5));
    assert_one_ack(&node.transmit(), RQ_PSN, Syndrome::Nak(NakCode::InvalidRequest), 0);
    assert_eq!(
        summary(&node.completions()),
        vec![
            (CqKind::Recv, 1, WcStatus::LocLenErr, WcOpcode::Recv),
            (CqKind::Recv, 2, WcStatus::WrFlushErr, WcOpcode::Recv),
        ]
    );
    assert_eq!(node.qp.state(), QpState::Err);
    assert_eq!(node.events(), vec![AsyncEvent::QpRequestError { qpn: QPN }]);
}

fn uc(operation: Operation, psn: u32) -> RoceRepr {
    packet(Transport::Uc, operation, psn).ack_req()
}

#[test]
fn uc_responder_drops_the_rest_of_a_message_after_a_gap() {
    let mut node = TestQp::new(QpType::Uc, attr());
    node.post_recv(1, 0x8000, 4096);
    node.post_recv(2, 0x9000, 4096);
    let lost = pattern(3 * MTU, 1);
    node.feed(uc(Operation::SendFirst, RQ_PSN), &lost[..MTU]);
    // RQ_PSN + 1 is lost.
    node.feed(uc(Operation::SendLast, RQ_PSN + 2), &lost[2 * MTU..]);
    assert!(node.completions().is_empty());
    assert!(node.transmit().is_empty());

    // The next ONLY starts afresh, in the receive the broken message had taken.
    let next = pattern(200, 2);
    node.feed(uc(Operation::SendOnly, RQ_PSN + 3), &next);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![(CqKind::Recv, 1, WcStatus::Success, WcOpcode::Recv)]);
    assert_eq!(wcs[0].1.byte_len, 200);
    assert_eq!(node.bytes(0x8000, 200), next);

    // A MIDDLE with nothing before it is dropped, and so is its message.
    node.feed(uc(Operation::SendMiddle, RQ_PSN + 5), &lost[MTU..2 * MTU]);
    node.feed(uc(Operation::SendLast, RQ_PSN + 6), &lost[2 * MTU..]);
    assert!(node.completions().is_empty());

    // A FIRST resynchronises too.
    node.feed(uc(Operation::SendFirst, RQ_PSN + 8), &lost[..MTU]);
    node.feed(uc(Operation::SendLast, RQ_PSN + 9), &lost[MTU..2 * MTU]);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![(CqKind::Recv, 2, WcStatus::Success, WcOpcode::Recv)]);
    assert_eq!(wcs[0].1.byte_len as usize, 2 * MTU);
    assert_eq!(node.bytes(0x9000, 2 * MTU), lost[..2 * MTU]);

    assert!(node.transmit().is_empty(), "a UC responder never answers");
    assert_eq!(node.qp.state(), QpState::Rts);
}

#[test]
fn ud_responder_checks_the_qkey_and_writes_the_grh() {
    let mut node = TestQp::new(QpType::Ud, attr());
    node.post_recv(1, 0x8000, 40 + 256);
    let ud = |qkey| packet(Transport::Ud, Operation::SendOnly, 5).deth(qkey, 0x33);
    let data = pattern(100, 3);

    node.feed(ud(QKEY ^ 1), &data);
    assert!(node.completions().is_empty());
    assert_eq!(node.qp.counters().dropped, 1);

    node.feed(ud(QKEY), &data);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![(CqKind::Recv, 1, WcStatus::Success, WcOpcode::Recv)]);
    let wc = wcs[0].1;
    assert!(wc.grh);
    assert_eq!(wc.src_qp, 0x33);
    assert_eq!(wc.byte_len, 140);

    let grh = node.bytes(0x8000, GRH_LEN);
    // UDP payload: BTH, DETH, payload (a multiple of 4 here), ICRC.
    assert_eq!(grh, grh_area(PEER, LOCAL, 12 + 8 + data.len() + 4));
    assert_eq!(grh[..20], [0; 20]);
    let ip = &grh[20..];
    assert_eq!(ip[0], 0x45);
    assert_eq!(ip[9], 17);
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, 20 + 8 + 12 + 8 + data.len() + 4);
    let octets = |a: IpAddr| match a {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(_) => unreachable!(),
    };
    assert_eq!(ip[12..16], octets(PEER));
    assert_eq!(ip[16..20], octets(LOCAL));
    assert_eq!(node.bytes(0x8000 + GRH_LEN as u64, data.len()), data);
    assert!(node.transmit().is_empty());
}

#[test]
fn a_fatal_nak_goes_after_the_answers_owed_before_it_and_nothing_after() {
    let mut node = responder_with_receives(attr());
    // Queued, not yet sent: a READ's response, a sequence NAK for a request
    // from the future, then a WRITE with a wrong R_Key at the expected PSN.
    node.feed(rc(Operation::ReadRequest, RQ_PSN).ack_req().reth(VA, KEY, 16), &[]);
    node.feed(rc(Operation::WriteOnly, RQ_PSN + 5).ack_req().reth(VA, KEY, 16), &[0xab; 16]);
    node.feed(rc(Operation::WriteOnly, RQ_PSN + 1).ack_req().reth(VA, KEY + 7, 16), &[0xab; 16]);
    let sent: Vec<(Operation, u32, Option<Syndrome>)> =
        node.transmit().iter().map(|s| (s.op(), s.psn(), s.header.aeth.map(|a| a.syndrome))).collect();
    assert_eq!(
        sent,
        [
            (Operation::ReadResponseOnly, RQ_PSN, Some(Syndrome::Ack { credits: Syndrome::INVALID_CREDITS })),
            (Operation::Acknowledge, RQ_PSN + 1, Some(Syndrome::Nak(NakCode::PsnSequenceError))),
            (Operation::Acknowledge, RQ_PSN + 1, Some(Syndrome::Nak(NakCode::RemoteAccessError))),
        ]
    );
    assert!(node.transmit().is_empty());
}
