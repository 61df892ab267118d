//! The requester and the completer (rxe-spec/transport.md, "Requester" and
//! "Completer"): work requests in, requests out, responses in.

use std::time::Duration;

use softroce::transport::*;
use softroce::wire::{NakCode, Operation, RethRepr, Syndrome};

use crate::lending::transmit_lending;
use crate::support::pattern;
use crate::support::qp::*;

/// A requester whose region starts with `len` bytes of pattern.
pub(crate) fn requester(attr: QpAttr, len: usize) -> (TestQp, Vec<u8>) {
    let mut node = TestQp::new(QpType::Rc, attr);
    let data = pattern(len, 9);
    node.fill(0, &data);
    (node, data)
}

pub(crate) fn send(wr_id: u64, offset: u64, len: u32) -> SendWr {
    SendWr::new(wr_id, SendOp::Send).with_sge(sge(offset, len))
}

pub(crate) fn write(wr_id: u64, len: u32) -> SendWr {
    SendWr::new(wr_id, SendOp::RdmaWrite { remote_addr: REMOTE_VA, rkey: RKEY }).with_sge(sge(0, len))
}

pub(crate) fn read(wr_id: u64, offset: u64, len: u32) -> SendWr {
    SendWr::new(wr_id, SendOp::RdmaRead { remote_addr: REMOTE_VA, rkey: RKEY }).with_sge(sge(offset, len))
}

fn success(wr_id: u64, opcode: WcOpcode) -> (CqKind, u64, WcStatus, WcOpcode) {
    (CqKind::Send, wr_id, WcStatus::Success, opcode)
}

pub(crate) fn flushed(wr_id: u64, opcode: WcOpcode) -> (CqKind, u64, WcStatus, WcOpcode) {
    (CqKind::Send, wr_id, WcStatus::WrFlushErr, opcode)
}

#[test]
fn requester_segments_a_send_at_the_mtu() {
    let (mut node, data) = requester(attr(), 3000);
    node.post_send(send(1, 0, 3000));
    let sent = node.transmit();
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![
            (Operation::SendFirst, SQ_PSN, false),
            (Operation::SendMiddle, SQ_PSN + 1, false),
            (Operation::SendLast, SQ_PSN + 2, true),
        ]
    );
    assert!(sent.iter().all(|s| s.dest == PEER && s.header.bth.dest_qpn == PEER_QPN));
    let payload: Vec<u8> = sent.iter().flat_map(|s| s.payload.clone()).collect();
    assert_eq!(payload, data);
    assert_eq!(sent[0].payload.len(), MTU);
    assert!(node.transmit().is_empty());
}

#[test]
fn requester_asks_for_acks_every_64_packets_and_stops_at_the_window() {
    let packets = 200u32;
    let (mut node, data) = requester(attr(), packets as usize * MTU);
    node.post_send(write(1, packets * MTU as u32));

    let sent = node.transmit();
    assert_eq!(sent.len(), MAX_UNACKED_PSNS as usize, "the first window is {MAX_UNACKED_PSNS} PSNs, as rxe's");
    assert_eq!(sent[0].op(), Operation::WriteFirst);
    assert_eq!(sent[0].reth(), RethRepr { va: REMOTE_VA, rkey: RKEY, dma_len: packets * MTU as u32 });
    assert!(sent[1..].iter().all(|s| s.op() == Operation::WriteMiddle && s.header.reth.is_none()));
    let psns: Vec<u32> = sent.iter().map(Sent::psn).collect();
    assert_eq!(psns, (SQ_PSN..SQ_PSN + MAX_UNACKED_PSNS).collect::<Vec<_>>());
    let ack_reqs: Vec<usize> = sent.iter().enumerate().filter(|(_, s)| s.ack_req()).map(|(i, _)| i).collect();
    assert_eq!(ack_reqs, vec![MAX_PKTS_PER_ACK as usize - 1, 2 * MAX_PKTS_PER_ACK as usize - 1]);

    // Acknowledging the first 64 opens the window by 64 and grows it by 64:
    // 128 more go out, the rest of the message.
    node.feed(ack(SQ_PSN + 63), &[]);
    let rest = node.transmit();
    assert_eq!(rest.len(), 72);
    assert_eq!(rest[0].psn(), SQ_PSN + 128);
    assert_eq!(op_psn_ack_req(&rest).last(), Some(&(Operation::WriteLast, SQ_PSN + packets - 1, true)));
    let payload: Vec<u8> = sent.iter().chain(&rest).flat_map(|s| s.payload.clone()).collect();
    assert_eq!(payload, data);
    assert!(node.completions().is_empty());

    node.feed(ack(SQ_PSN + packets - 1), &[]);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![success(1, WcOpcode::RdmaWrite)]);
    assert_eq!(wcs[0].1.byte_len, packets * MTU as u32);
}

fn unsignaled(mut wr: SendWr) -> SendWr {
    wr.flags.signaled = false;
    wr
}

/// T-6: the end of an unsignaled message asks for no ACK (nobody waits for
/// its completion); a signaled one asks, and its ACK retires all before it.
#[test]
fn unsignaled_messages_ask_for_no_ack_and_a_signaled_one_asks_for_all() {
    let (mut node, _) = requester(attr(), 8 * MTU);
    for wr_id in 1..=3 {
        node.post_send(unsignaled(send(wr_id, 0, 100)));
    }
    node.post_send(write(4, 2 * MTU as u32));
    let sent = node.transmit();
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![
            (Operation::SendOnly, SQ_PSN, false),
            (Operation::SendOnly, SQ_PSN + 1, false),
            (Operation::SendOnly, SQ_PSN + 2, false),
            (Operation::WriteFirst, SQ_PSN + 3, false),
            (Operation::WriteLast, SQ_PSN + 4, true),
        ]
    );
    node.feed(ack(SQ_PSN + 4), &[]);
    assert_eq!(summary(&node.completions()), vec![success(4, WcOpcode::RdmaWrite)]);
    assert_eq!(node.qp.poll_timeout(), None, "nothing left to time or ask for");
}

/// T-6: unsignaled messages ask for an ACK every quarter of the send
/// queue, so that its slots come back before it fills.
#[test]
fn every_quarter_send_queue_of_unsignaled_messages_asks_for_an_ack() {
    let cap = QpCap { max_send_wr: 8, ..QpCap::default() };
    let mut node = TestQp::with_cap(QpType::Rc, attr(), SQ_PSN, RQ_PSN, cap);
    for wr_id in 1..=7 {
        node.post_send(unsignaled(send(wr_id, 0, 10)));
    }
    let asks: Vec<bool> = node.transmit().iter().map(Sent::ack_req).collect();
    assert_eq!(asks, vec![false, true, false, true, false, true, false]);
    node.feed(ack(SQ_PSN + 5), &[]);
    assert!(node.completions().is_empty(), "unsignaled requests complete silently");
    for wr_id in 8..=14 {
        node.post_send(unsignaled(send(wr_id, 0, 10)));
    }
    assert_eq!(node.transmit().len(), 7, "the ACK freed six slots of eight");
}

/// T-6: what went without AckReq is asked for after ACK_ASK_DELAY (or a
/// quarter of the ACK timeout): the last packet again, with AckReq. The
/// responder acknowledges it as a duplicate; no retry is spent.
#[test]
fn an_unsignaled_tail_is_asked_for_by_resending_its_last_packet() {
    let (mut node, data) = requester(attr(), 4 * MTU);
    node.post_send(unsignaled(send(1, 0, 100)));
    node.post_send(unsignaled(write(2, 2 * MTU as u32)));
    let sent = node.transmit();
    assert!(sent.iter().all(|s| !s.ack_req()), "{:?}", op_psn_ack_req(&sent));
    let start = node.now;
    let delay = ACK_ASK_DELAY.min(ACK_TIMEOUT / 4);
    assert_eq!(node.qp.poll_timeout(), Some(start + delay));

    node.advance_to(start + delay - Duration::from_nanos(1));
    assert!(node.transmit().is_empty(), "asked before the delay");
    node.expire();
    let again = node.transmit();
    assert_eq!(op_psn_ack_req(&again), vec![(Operation::WriteLast, SQ_PSN + 2, true)]);
    assert_eq!(again[0].payload, data[MTU..2 * MTU]);
    assert_eq!((node.qp.counters().retries, node.qp.counters().timeouts), (0, 0));
    assert!(node.qp.poll_timeout().is_some(), "the ACK timeout still runs");

    node.feed(ack(SQ_PSN + 2), &[]);
    assert!(node.completions().is_empty());
    assert_eq!(node.qp.poll_timeout(), None);
    // A new request goes out as usual, not the one asked for again.
    node.post_send(send(3, 0, 10));
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, SQ_PSN + 3, true)]);
}

/// T-6: while nothing has gone without AckReq there is nothing to ask for;
/// an ACK of everything cancels the ask.
#[test]
fn an_ack_of_everything_cancels_the_ask() {
    let (mut node, _) = requester(attr(), MTU);
    node.post_send(unsignaled(send(1, 0, 10)));
    node.post_send(unsignaled(send(2, 0, 10)));
    node.transmit();
    // The peer acknowledged on its own (as rxe's responder does at a
    // later request, or softroce's for a duplicate).
    node.feed(ack(SQ_PSN + 1), &[]);
    assert_eq!(node.qp.poll_timeout(), None);
    node.advance_to(node.now + ACK_ASK_DELAY);
    assert!(node.transmit().is_empty());
}

/// T-6: packets within a message that went without AckReq are not asked
/// for early: the rest of the message follows, and the window's ACKs
/// come in time. Only the ACK timeout runs while the window is full.
#[test]
fn a_message_cut_by_the_window_is_not_asked_for_early() {
    let (mut node, _) = requester(attr(), 200 * MTU);
    node.post_send(unsignaled(write(1, 200 * MTU as u32)));
    let sent = node.transmit();
    assert_eq!(sent.len(), MAX_UNACKED_PSNS as usize);
    // Ten PSNs acknowledged: ten more go, none of them asking.
    node.feed(ack(SQ_PSN + 9), &[]);
    let more = node.transmit();
    assert_eq!(more.len(), 10);
    assert!(more.iter().all(|s| s.op() == Operation::WriteMiddle && !s.ack_req()), "{:?}", op_psn_ack_req(&more));
    assert_eq!(node.qp.poll_timeout(), Some(node.now + ACK_TIMEOUT));
}

/// T-6: packets resent after a NAK ask at each message end, as rxe's do:
/// their ACK ends the recovery.
#[test]
fn resent_messages_ask_for_acks_at_each_end() {
    let (mut node, _) = requester(attr(), 4 * MTU);
    for wr_id in 1..=3 {
        node.post_send(unsignaled(send(wr_id, 0, 10)));
    }
    assert!(node.transmit().iter().all(|s| !s.ack_req()));
    node.feed(nak(SQ_PSN + 1, NakCode::PsnSequenceError), &[]);
    assert_eq!(
        op_psn_ack_req(&node.transmit()),
        vec![(Operation::SendOnly, SQ_PSN + 1, true), (Operation::SendOnly, SQ_PSN + 2, true)]
    );
    node.post_send(unsignaled(send(4, 0, 10)));
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, SQ_PSN + 3, false)], "new again");
}

/// A requester streaming one long WRITE, and the PSNs it has sent and had
/// acknowledged.
struct Stream {
    node: TestQp,
    next: u32,
    acked: u32,
}

impl Stream {
    fn new(packets: u32) -> Stream {
        let mut node = TestQp::rc();
        let len = packets as usize * MTU;
        let access = Access::LOCAL_WRITE;
        node.mem.register(KEY + 1, Region { pd: PD, addr: VA, access, data: vec![0; len] });
        let local = Sge { addr: VA, length: len as u32, lkey: KEY + 1 };
        node.post_send(SendWr::new(1, SendOp::RdmaWrite { remote_addr: REMOTE_VA, rkey: RKEY }).with_sge(local));
        Stream { node, next: SQ_PSN, acked: SQ_PSN }
    }

    /// Sends what the window allows; returns the packets.
    fn send(&mut self) -> Vec<Sent> {
        let sent = self.node.transmit();
        if let Some(last) = sent.last() {
            self.next = last.psn() + 1;
        }
        sent
    }

    /// PSNs in flight after each of `rounds` of "send what the window
    /// allows, then acknowledge the oldest `count`".
    fn rounds(&mut self, rounds: usize, count: u32) -> Vec<u32> {
        let mut in_flight = Vec::new();
        for _ in 0..rounds {
            self.send();
            in_flight.push(self.next - self.acked);
            self.acked += count;
            self.node.feed(ack(self.acked - 1), &[]);
        }
        in_flight
    }
}

#[test]
fn the_window_grows_while_acks_come_and_falls_back_to_rxes_on_a_go_back() {
    let mut stream = Stream::new(2000);
    // Every PSN acknowledged adds one to the window, up to MAX_WINDOW_PSNS.
    assert_eq!(stream.rounds(6, 64), vec![128, 192, 256, 320, 384, 448]);
    assert_eq!(stream.rounds(3, 128), vec![512, MAX_WINDOW_PSNS, MAX_WINDOW_PSNS]);
    // A big window asks for an ACK every quarter window.
    let sent = stream.send();
    assert_eq!(sent.len(), 128);
    assert_eq!(sent.iter().filter(|s| s.ack_req()).count(), 1, "one in {}", MAX_WINDOW_PSNS / 4);

    // A sequence NAK: the requester goes back, and the window is rxe's again.
    stream.node.feed(nak(stream.acked, NakCode::PsnSequenceError), &[]);
    let resent = stream.node.transmit();
    assert_eq!(resent.len(), MAX_UNACKED_PSNS as usize);
    assert_eq!(resent[0].psn(), stream.acked);
    assert_eq!(resent.iter().filter(|s| s.ack_req()).count(), 2, "every 64th again");
}

#[test]
fn a_slow_peer_keeps_rxes_window() {
    let mut stream = Stream::new(2000);
    // Each ACK comes after a third of the ACK timeout: more than a quarter.
    let ack_timeout = Duration::from_nanos(4096 << attr().timeout);
    let mut in_flight = Vec::new();
    for _ in 0..6 {
        stream.send();
        in_flight.push(stream.next - stream.acked);
        stream.node.now += ack_timeout / 3;
        stream.acked += 64;
        stream.node.feed(ack(stream.acked - 1), &[]);
    }
    assert_eq!(in_flight, vec![128; 6]);
}

#[test]
fn the_window_fits_the_peers_buffer_and_still_asks_for_acks_in_time() {
    let mut stream = Stream::new(2000);
    // 50 KiB hold 37 packets of MTU 1024 at 1.25 times their size each
    // (what the kernel charges for a packet of a GSO train).
    stream.node.qp.set_peer_buffer(Some(50 * 1024));
    let fits = 50 * 1024 / (5 * (MTU as u32 + TRANSMIT_HEADROOM as u32) / 4);
    assert_eq!(fits, 37);
    let sent = stream.send();
    assert_eq!(sent.len(), fits as usize);
    // An ACK is asked for within the window (every 18th), or it would only
    // move on by timeout.
    let asks: Vec<u32> = sent.iter().filter(|s| s.ack_req()).map(|s| s.psn() - SQ_PSN).collect();
    assert_eq!(asks, vec![17, 35]);
    // However fast the ACKs come, the window does not grow past the buffer.
    assert_eq!(stream.rounds(8, 11), vec![fits; 8]);
}

/// A driver that makes its QPs take turns at a shared buffer (rxe-spec
/// T-7a) gives a requester an allowance of new packets: the last of them
/// asks for the ACK that ends the turn, nothing new follows until the next
/// one, and a go-back resends what the turn sent all the same.
#[test]
fn a_turn_lets_out_its_allowance_asks_at_its_end_and_never_holds_a_resend() {
    let (mut node, _) = requester(attr(), 10 * MTU);
    node.post_send(unsignaled(write(1, 10 * MTU as u32)));
    node.qp.set_allowance(Some(4));
    let sent = node.transmit();
    let psn_ack_req: Vec<(u32, bool)> = sent.iter().map(|s| (s.psn() - SQ_PSN, s.ack_req())).collect();
    assert_eq!(psn_ack_req, vec![(0, false), (1, false), (2, false), (3, true)]);
    assert_eq!(node.qp.allowance(), Some(0));
    assert_eq!(node.qp.packets_in_flight(), 4);
    assert!(!node.qp.has_unasked_in_flight(), "the turn's last packet asked");
    assert!(node.transmit().is_empty(), "the turn is over");

    node.feed(ack(SQ_PSN + 1), &[]);
    assert_eq!(node.qp.packets_in_flight(), 2);
    node.feed(nak(SQ_PSN + 2, NakCode::PsnSequenceError), &[]);
    let resent: Vec<u32> = node.transmit().iter().map(|s| s.psn() - SQ_PSN).collect();
    assert_eq!(resent, vec![2, 3], "a resend is not held, a new packet is");

    node.qp.set_allowance(None);
    let rest: Vec<u32> = node.transmit().iter().map(|s| s.psn() - SQ_PSN).collect();
    assert_eq!(rest, (4..10).collect::<Vec<u32>>());
    assert_eq!(node.qp.packets_in_flight(), 8);
    assert!(node.qp.has_unasked_in_flight(), "an unsignaled message's end does not ask");
    node.feed(ack(SQ_PSN + 9), &[]);
    assert_eq!(node.qp.packets_in_flight(), 0);
}

/// A READ's responses all come at once, so its request goes only when they
/// fit in the window after what is in flight; one larger than the window
/// goes alone. Before, a READ went when its first PSN fit, and a few 1 MiB
/// READs overflowed a 416 KiB socket buffer at once, over and over.
#[test]
fn a_read_goes_when_its_responses_fit_the_window_or_alone() {
    let (mut node, _) = requester(attr(), 32 * MTU);
    // A window of 16 PSNs.
    node.qp.set_peer_buffer(Some(16 * 5 * (MTU + TRANSMIT_HEADROOM) / 4));
    node.post_send(write(1, 10 * MTU as u32));
    node.post_send(read(2, 0, 8 * MTU as u32));
    node.post_send(read(3, 0, 20 * MTU as u32));
    let sent = node.transmit();
    assert_eq!(sent.len(), 10, "10 WRITE PSNs, and 8 READ responses would make 18");
    node.feed(ack(SQ_PSN + 9), &[]);
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::ReadRequest, SQ_PSN + 10, true)]);
    // READ 3 (20 PSNs, more than the window) waits for READ 2's responses.
    let response = vec![0x5a; MTU];
    for (k, op) in [Operation::ReadResponseFirst, Operation::ReadResponseMiddle].into_iter().enumerate() {
        node.feed(read_response(op, SQ_PSN + 10 + k as u32), &response);
        assert!(node.transmit().is_empty(), "READ 2 still has responses to come");
    }
    for k in 2..7 {
        node.feed(read_response(Operation::ReadResponseMiddle, SQ_PSN + 10 + k), &response);
    }
    node.feed(read_response(Operation::ReadResponseLast, SQ_PSN + 17), &response);
    let op = |wr_id, opcode| success(wr_id, opcode);
    assert_eq!(summary(&node.completions()), vec![op(1, WcOpcode::RdmaWrite), op(2, WcOpcode::RdmaRead)]);
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::ReadRequest, SQ_PSN + 18, true)]);
}

/// (PSN, remote address, length) of each READ request sent.
fn read_asks(sent: &[Sent]) -> Vec<(u32, u64, u32)> {
    sent.iter()
        .map(|s| {
            assert_eq!(s.op(), Operation::ReadRequest);
            let reth = s.header.reth.expect("a READ request has a RETH");
            (s.psn(), reth.va, reth.dma_len)
        })
        .collect()
}

/// Feeds the responses `from..to` (PSNs past SQ_PSN) to the READ request
/// that asked for `asked..end`.
fn answer(node: &mut TestQp, (from, to): (u32, u32), (asked, end): (u32, u32)) {
    let response = vec![0x5a; MTU];
    for psn in from..to {
        let op = match (psn == asked, psn + 1 == end) {
            (true, true) => Operation::ReadResponseOnly,
            (true, false) => Operation::ReadResponseFirst,
            (false, true) => Operation::ReadResponseLast,
            (false, false) => Operation::ReadResponseMiddle,
        };
        node.feed(read_response(op, SQ_PSN + psn), &response);
    }
}

/// Feeds every response to the READ request that asked for `from..to`.
fn answer_piece(node: &mut TestQp, from: u32, to: u32) {
    answer(node, (from, to), (from, to));
}

/// A requester whose buffer holds 16 packets, after a READ of 20 that lost
/// a response (a whole READ: nothing had been lost before) and was asked
/// for again from there. Returns the next PSN past SQ_PSN.
fn after_a_lost_read_response(attr: QpAttr) -> TestQp {
    let (mut node, _) = requester(attr, 40 * MTU);
    node.qp.set_peer_buffer(Some(16 * 5 * (MTU + TRANSMIT_HEADROOM) / 4));
    node.post_send(read(1, 0, 20 * MTU as u32));
    let m = MTU as u32;
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN, REMOTE_VA, 20 * m)]);
    answer(&mut node, (0, 3), (0, 20));
    answer(&mut node, (4, 5), (0, 20));
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN + 3, REMOTE_VA + u64::from(3 * m), 17 * m)]);
    answer_piece(&mut node, 3, 20);
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::RdmaRead)]);
    node
}

/// A 1 MiB READ into a 416 KiB socket buffer lost responses whenever the
/// receiving thread fell behind, thousands of times a second.
#[test]
fn after_lost_responses_a_read_larger_than_the_buffer_goes_in_pieces_two_at_a_time() {
    let mut node = after_a_lost_read_response(attr());
    node.post_send(read(2, 0, 20 * MTU as u32));
    let (m, b) = (MTU as u32, 20);
    let va = |k: u32| REMOTE_VA + u64::from(k * m);
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN + b, va(0), 8 * m), (SQ_PSN + b + 8, va(8), 8 * m)]);
    answer_piece(&mut node, b, b + 8);
    assert!(node.completions().is_empty(), "one piece of three");
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN + b + 16, va(16), 4 * m)], "the last piece, shorter");
    answer_piece(&mut node, b + 8, b + 16);
    assert!(node.transmit().is_empty());
    answer_piece(&mut node, b + 16, b + 20);
    assert_eq!(summary(&node.completions()), vec![success(2, WcOpcode::RdmaRead)]);
    assert_eq!(node.qp.counters().retries, 1, "the first READ's only");
}

/// Each piece is an outstanding READ for the responder, which remembers
/// max_dest_rd_atomic of them; a retry asks for no more than its piece, as
/// rxe drops a duplicate READ reaching past the one it remembers.
#[test]
fn read_pieces_count_against_max_rd_atomic_and_a_retry_stays_in_its_piece() {
    let mut node = after_a_lost_read_response(QpAttr { max_rd_atomic: 1, ..attr() });
    node.post_send(read(2, 0, 20 * MTU as u32));
    let (m, b) = (MTU as u32, 20);
    let va = |k: u32| REMOTE_VA + u64::from(k * m);
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN + b, va(0), 8 * m)], "one READ outstanding at a time");
    // Responses 0..3 arrive, 3 is lost, 4 tells: the retry asks for 3..8 only.
    answer(&mut node, (b, b + 3), (b, b + 8));
    answer(&mut node, (b + 4, b + 5), (b, b + 8));
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN + b + 3, va(3), 5 * m)]);
    answer_piece(&mut node, b + 3, b + 8);
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN + b + 8, va(8), 8 * m)]);
    answer_piece(&mut node, b + 8, b + 16);
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN + b + 16, va(16), 4 * m)]);
    answer_piece(&mut node, b + 16, b + 20);
    assert_eq!(summary(&node.completions()), vec![success(2, WcOpcode::RdmaRead)]);
    assert_eq!(node.qp.counters().retries, 2);
}

/// Pieces cost a request's round trip each: once PIECED_READS READs have
/// gone in pieces without a loss, READs go whole again.
#[test]
fn reads_go_whole_again_after_pieced_reads_without_loss() {
    let mut node = after_a_lost_read_response(attr());
    let m = MTU as u32;
    let mut next = 20;
    for wr_id in 0..u64::from(PIECED_READS) {
        node.post_send(read(10 + wr_id, 0, 20 * m));
        assert_eq!(read_asks(&node.transmit()).len(), 2, "READ {wr_id}: two pieces of three");
        answer_piece(&mut node, next, next + 8);
        answer_piece(&mut node, next + 8, next + 16);
        answer_piece(&mut node, next + 16, next + 20);
        node.transmit();
        next += 20;
    }
    node.post_send(read(99, 0, 20 * m));
    assert_eq!(read_asks(&node.transmit()), vec![(SQ_PSN + next, REMOTE_VA, 20 * m)]);
}

#[test]
fn coalesced_ack_completes_every_message_it_covers_in_order() {
    let (mut node, _) = requester(attr(), 8192);
    node.post_send(send(1, 0, 3000));
    node.post_send(send(2, 0, 100));
    node.post_send(send(3, 0, 2000));
    let psns: Vec<u32> = node.transmit().iter().map(Sent::psn).collect();
    assert_eq!(psns, (SQ_PSN..SQ_PSN + 6).collect::<Vec<_>>());

    // An ACK in the middle of the first message completes nothing.
    node.feed(ack(SQ_PSN + 1), &[]);
    assert!(node.completions().is_empty());

    node.feed(ack(SQ_PSN + 5), &[]);
    let wcs = node.completions();
    let op = WcOpcode::Send;
    assert_eq!(summary(&wcs), vec![success(1, op), success(2, op), success(3, op)]);
    assert_eq!(wcs.iter().map(|(_, wc)| wc.byte_len).collect::<Vec<_>>(), vec![3000, 100, 2000]);
    assert_eq!(node.qp.poll_timeout(), None);
}

#[test]
fn sequence_nak_goes_back_to_the_naked_psn_mid_message() {
    let (mut node, data) = requester(attr(), 3000);
    node.post_send(send(1, 0, 3000));
    node.post_send(send(2, 0, 100));
    assert_eq!(node.transmit().len(), 4);

    node.feed(nak(SQ_PSN + 1, NakCode::PsnSequenceError), &[]);
    assert!(node.completions().is_empty());
    let sent = node.transmit();
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![
            (Operation::SendMiddle, SQ_PSN + 1, false),
            (Operation::SendLast, SQ_PSN + 2, true),
            (Operation::SendOnly, SQ_PSN + 3, true),
        ]
    );
    assert_eq!(sent[0].payload, data[MTU..2 * MTU]);
    assert_eq!(sent[1].payload, data[2 * MTU..]);
    assert_eq!(node.qp.counters().seq_naks_received, 1);

    node.feed(ack(SQ_PSN + 3), &[]);
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::Send), success(2, WcOpcode::Send)]);
}

#[test]
fn rnr_nak_holds_transmission_until_the_rnr_timer_elapses() {
    let (mut node, _) = requester(attr(), 100);
    node.post_send(send(1, 0, 100));
    node.post_send(send(2, 0, 100));
    assert_eq!(node.transmit().len(), 2);

    node.now += Duration::from_micros(50);
    let timer = 14;
    node.feed(rnr_nak(SQ_PSN, timer), &[]);
    let wait = Duration::from_micros(u64::from(Syndrome::rnr_timer_micros(timer)));
    assert_eq!(wait, Duration::from_micros(1280));
    let deadline = node.now + wait;
    assert_eq!(node.qp.poll_timeout(), Some(deadline));
    assert!(node.transmit().is_empty());

    node.advance_to(deadline - Duration::from_nanos(1));
    assert!(node.transmit().is_empty());
    node.advance_to(deadline);
    let sent = node.transmit();
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![(Operation::SendOnly, SQ_PSN, true), (Operation::SendOnly, SQ_PSN + 1, true)]
    );
    assert_eq!(node.qp.poll_timeout(), Some(deadline + ACK_TIMEOUT));

    node.feed(ack(SQ_PSN + 1), &[]);
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::Send), success(2, WcOpcode::Send)]);
}

#[test]
fn rnr_retry_exhaustion_fails_the_request_and_flushes_the_rest() {
    let (mut node, _) = requester(QpAttr { rnr_retry: 2, ..attr() }, 100);
    node.post_send(send(1, 0, 100));
    node.post_send(send(2, 0, 100));
    assert_eq!(node.transmit().len(), 2);
    for _ in 0..2 {
        node.feed(rnr_nak(SQ_PSN, 1), &[]);
        assert!(node.transmit().is_empty());
        node.expire();
        assert_eq!(op_psn_ack_req(&node.transmit())[0], (Operation::SendOnly, SQ_PSN, true));
        assert!(node.completions().is_empty());
    }
    node.feed(rnr_nak(SQ_PSN, 1), &[]);
    assert_eq!(
        summary(&node.completions()),
        vec![(CqKind::Send, 1, WcStatus::RnrRetryExcErr, WcOpcode::Send), flushed(2, WcOpcode::Send)]
    );
    assert_eq!(node.qp.state(), QpState::Err);
    assert_eq!(node.events(), vec![AsyncEvent::QpFatal { qpn: QPN }]);
    assert_eq!(node.qp.poll_timeout(), None);

    node.post_send(send(3, 0, 100));
    assert_eq!(summary(&node.completions()), vec![flushed(3, WcOpcode::Send)]);
    assert!(node.transmit().is_empty());
}

#[test]
fn rnr_retry_7_retries_forever() {
    let (mut node, _) = requester(attr(), 100);
    node.post_send(send(1, 0, 100));
    assert_eq!(node.transmit().len(), 1);
    for _ in 0..20 {
        node.feed(rnr_nak(SQ_PSN, 1), &[]);
        assert!(node.transmit().is_empty());
        node.expire();
        assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, SQ_PSN, true)]);
    }
    assert_eq!(node.qp.counters().rnr_naks_received, 20);
    node.feed(ack(SQ_PSN), &[]);
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::Send)]);
    assert_eq!(node.qp.state(), QpState::Rts);
}

#[test]
fn local_ack_timeout_resends_from_the_oldest_unacked_psn() {
    let (mut node, data) = requester(attr(), 3000);
    node.post_send(send(1, 0, 3000));
    let start = node.now;
    assert_eq!(node.transmit().len(), 3);
    assert_eq!(ACK_TIMEOUT, Duration::from_nanos(16_777_216));
    assert_eq!(node.qp.poll_timeout(), Some(start + ACK_TIMEOUT));

    // Progress restarts the timer.
    node.now += Duration::from_millis(1);
    node.feed(ack(SQ_PSN), &[]);
    let deadline = node.now + ACK_TIMEOUT;
    assert_eq!(node.qp.poll_timeout(), Some(deadline));

    node.advance_to(deadline - Duration::from_nanos(1));
    assert!(node.transmit().is_empty());
    node.advance_to(deadline);
    // The oldest unacknowledged packet alone, asking for its ACK: the rest
    // waits until the peer shows it is alive (T-24).
    let sent = node.transmit();
    assert_eq!(op_psn_ack_req(&sent), vec![(Operation::SendMiddle, SQ_PSN + 1, true)]);
    assert_eq!(sent[0].payload, data[MTU..2 * MTU]);
    assert_eq!(node.qp.counters().timeouts, 1);
    assert_eq!(node.qp.poll_timeout(), Some(deadline + ACK_TIMEOUT));

    // Its ACK brings the rest.
    node.feed(ack(SQ_PSN + 1), &[]);
    let sent = node.transmit();
    assert_eq!(op_psn_ack_req(&sent), vec![(Operation::SendLast, SQ_PSN + 2, true)]);
    assert_eq!(sent[0].payload, data[2 * MTU..]);
    node.feed(ack(SQ_PSN + 2), &[]);
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::Send)]);
    assert_eq!(node.qp.poll_timeout(), None);
}

#[test]
fn retry_exhaustion_after_retry_cnt_timeouts() {
    let (mut node, _) = requester(QpAttr { retry_cnt: 2, ..attr() }, 100);
    node.post_send(send(1, 0, 100));
    node.post_send(send(2, 0, 100));
    assert_eq!(node.transmit().len(), 2);
    for _ in 0..2 {
        node.expire();
        let psns: Vec<u32> = node.transmit().iter().map(Sent::psn).collect();
        assert_eq!(psns, vec![SQ_PSN]);
    }
    node.expire();
    assert_eq!(
        summary(&node.completions()),
        vec![(CqKind::Send, 1, WcStatus::RetryExcErr, WcOpcode::Send), flushed(2, WcOpcode::Send)]
    );
    assert_eq!(node.qp.state(), QpState::Err);
    assert_eq!(node.events(), vec![AsyncEvent::QpFatal { qpn: QPN }]);
    assert!(node.transmit().is_empty());
    assert_eq!(node.qp.poll_timeout(), None);
}

#[test]
fn short_ack_timeouts_wait_at_least_the_floor() {
    assert_eq!(MIN_ACK_TIMEOUT, Duration::from_millis(16));
    for timeout in [1u8, 4, 10, 11, 12, 14] {
        let asked = Duration::from_nanos(4096 << timeout);
        let (mut node, _) = requester(QpAttr { timeout, retry_cnt: 1, ..attr() }, 100);
        node.post_send(send(1, 0, 100));
        let start = node.now;
        assert_eq!(node.transmit().len(), 1);
        let waited = asked.max(MIN_ACK_TIMEOUT);
        assert_eq!(node.qp.poll_timeout(), Some(start + waited), "timeout {timeout}");
        // Nothing goes again at the attribute's own time when that is shorter.
        node.advance_to(start + asked.min(waited - Duration::from_nanos(1)));
        assert!(node.transmit().is_empty(), "timeout {timeout}: resent before {waited:?}");
        node.advance_to(start + waited);
        assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, SQ_PSN, true)], "timeout {timeout}");
        // The retry runs out a floor later, not sooner.
        node.advance_to(start + 2 * waited - Duration::from_nanos(1));
        assert!(node.completions().is_empty(), "timeout {timeout}");
        node.advance_to(start + 2 * waited);
        assert_eq!(summary(&node.completions()), vec![(CqKind::Send, 1, WcStatus::RetryExcErr, WcOpcode::Send)]);
    }
}

#[test]
fn progress_restores_the_retry_budget() {
    let (mut node, _) = requester(QpAttr { retry_cnt: 2, ..attr() }, 100);
    node.post_send(send(1, 0, 100));
    node.post_send(send(2, 0, 100));
    assert_eq!(node.transmit().len(), 2);
    for _ in 0..2 {
        node.expire();
        assert_eq!(node.transmit().len(), 1);
    }
    node.feed(ack(SQ_PSN), &[]);
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::Send)]);
    for _ in 0..2 {
        node.expire();
        assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, SQ_PSN + 1, true)]);
        assert!(node.completions().is_empty());
    }
    node.expire();
    assert_eq!(summary(&node.completions()), vec![(CqKind::Send, 2, WcStatus::RetryExcErr, WcOpcode::Send)]);
}

#[test]
fn sequence_naks_spend_one_retry_per_gap() {
    let (mut node, _) = requester(QpAttr { retry_cnt: 1, ..attr() }, 100);
    node.post_send(send(1, 0, 100));
    assert_eq!(node.transmit().len(), 1);
    node.feed(nak(SQ_PSN, NakCode::PsnSequenceError), &[]);
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, SQ_PSN, true)]);
    // The same NAK again (duplicated by the network) is not a new gap.
    node.feed(nak(SQ_PSN, NakCode::PsnSequenceError), &[]);
    assert!(node.transmit().is_empty());
    assert!(node.completions().is_empty());
    // The retry was spent: the next timeout exhausts the budget.
    node.expire();
    assert_eq!(summary(&node.completions()), vec![(CqKind::Send, 1, WcStatus::RetryExcErr, WcOpcode::Send)]);
    assert_eq!(node.qp.state(), QpState::Err);
}

#[test]
fn read_takes_one_psn_per_response_packet_and_places_the_data() {
    let (mut node, _) = requester(attr(), 100);
    node.post_send(read(1, 0x8000, 3000));
    node.post_send(send(2, 0, 100));
    let sent = node.transmit();
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![(Operation::ReadRequest, SQ_PSN, true), (Operation::SendOnly, SQ_PSN + 3, true)]
    );
    assert_eq!(sent[0].reth(), RethRepr { va: REMOTE_VA, rkey: RKEY, dma_len: 3000 });
    assert!(sent[0].payload.is_empty());

    let remote = pattern(3000, 42);
    node.feed(read_response(Operation::ReadResponseFirst, SQ_PSN), &remote[..MTU]);
    node.feed(read_response(Operation::ReadResponseMiddle, SQ_PSN + 1), &remote[MTU..2 * MTU]);
    assert!(node.completions().is_empty());
    node.feed(read_response(Operation::ReadResponseLast, SQ_PSN + 2), &remote[2 * MTU..]);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![success(1, WcOpcode::RdmaRead)]);
    assert_eq!(wcs[0].1.byte_len, 3000);
    assert_eq!(node.bytes(0x8000, 3000), remote);

    node.feed(ack(SQ_PSN + 3), &[]);
    assert_eq!(summary(&node.completions()), vec![success(2, WcOpcode::Send)]);
}

#[test]
fn lost_read_response_retries_a_read_for_the_rest_only() {
    let (mut node, _) = requester(attr(), 100);
    node.post_send(read(1, 0x8000, 3000));
    assert_eq!(node.transmit().len(), 1);

    let remote = pattern(3000, 43);
    node.feed(read_response(Operation::ReadResponseFirst, SQ_PSN), &remote[..MTU]);
    // The MIDDLE is lost; the LAST shows it.
    node.feed(read_response(Operation::ReadResponseLast, SQ_PSN + 2), &remote[2 * MTU..]);
    assert_eq!(node.bytes(0x8000 + 2 * MTU as u64, 3000 - 2 * MTU), vec![0; 3000 - 2 * MTU]);
    let sent = node.transmit();
    assert_eq!(op_psn_ack_req(&sent), vec![(Operation::ReadRequest, SQ_PSN + 1, true)]);
    let rest = 3000 - MTU as u32;
    assert_eq!(sent[0].reth(), RethRepr { va: REMOTE_VA + MTU as u64, rkey: RKEY, dma_len: rest });
    assert!(node.completions().is_empty());

    // The responder answers the retry as a new READ: FIRST then LAST.
    node.feed(read_response(Operation::ReadResponseFirst, SQ_PSN + 1), &remote[MTU..2 * MTU]);
    node.feed(read_response(Operation::ReadResponseLast, SQ_PSN + 2), &remote[2 * MTU..]);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![success(1, WcOpcode::RdmaRead)]);
    assert_eq!(wcs[0].1.byte_len, 3000);
    assert_eq!(node.bytes(0x8000, 3000), remote);
    assert_eq!(node.qp.poll_timeout(), None);
}

#[test]
fn atomic_ack_writes_the_original_value_locally() {
    let (mut node, _) = requester(attr(), 0);
    let op = SendOp::FetchAdd { remote_addr: REMOTE_VA, rkey: RKEY, add: 5 };
    node.post_send(SendWr::new(1, op).with_sge(sge(0x9000, 8)));
    let sent = node.transmit();
    assert_eq!(op_psn_ack_req(&sent), vec![(Operation::FetchAdd, SQ_PSN, true)]);
    let eth = sent[0].header.atomic_eth.unwrap();
    assert_eq!((eth.va, eth.rkey, eth.swap_add), (REMOTE_VA, RKEY, 5));

    node.feed(atomic_ack(SQ_PSN, 0x1234_5678_9abc), &[]);
    let wcs = node.completions();
    assert_eq!(summary(&wcs), vec![success(1, WcOpcode::FetchAdd)]);
    assert_eq!(wcs[0].1.byte_len, 8);
    assert_eq!(node.bytes(0x9000, 8), 0x1234_5678_9abcu64.to_ne_bytes());
}

#[test]
fn lost_atomic_ack_shown_by_a_later_ack_retries_the_atomic() {
    let (mut node, _) = requester(attr(), 100);
    let op = SendOp::CompareSwap { remote_addr: REMOTE_VA, rkey: RKEY, compare: 1, swap: 2 };
    node.post_send(SendWr::new(1, op).with_sge(sge(0x9000, 8)));
    node.post_send(send(2, 0, 100));
    let first = node.transmit();
    assert_eq!(
        op_psn_ack_req(&first),
        vec![(Operation::CompareSwap, SQ_PSN, true), (Operation::SendOnly, SQ_PSN + 1, true)]
    );

    node.feed(ack(SQ_PSN + 1), &[]);
    assert!(node.completions().is_empty());
    let retry = node.transmit();
    assert_eq!(op_psn_ack_req(&retry), op_psn_ack_req(&first));
    assert_eq!(retry[0].header.atomic_eth, first[0].header.atomic_eth);

    node.feed(atomic_ack(SQ_PSN, 1), &[]);
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::CompSwap)]);
    assert_eq!(node.bytes(0x9000, 8), 1u64.to_ne_bytes());
    node.feed(ack(SQ_PSN + 1), &[]);
    assert_eq!(summary(&node.completions()), vec![success(2, WcOpcode::Send)]);
}

#[test]
fn max_rd_atomic_1_holds_the_second_read_until_the_first_completes() {
    let (mut node, _) = requester(QpAttr { max_rd_atomic: 1, ..attr() }, 0);
    node.post_send(read(1, 0x8000, 1000));
    node.post_send(read(2, 0x9000, 1000));
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::ReadRequest, SQ_PSN, true)]);
    assert!(node.transmit().is_empty());

    node.feed(read_response(Operation::ReadResponseOnly, SQ_PSN), &pattern(1000, 1));
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::RdmaRead)]);
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::ReadRequest, SQ_PSN + 1, true)]);
}

#[test]
fn fenced_send_waits_for_the_outstanding_read() {
    let (mut node, _) = requester(attr(), 100);
    node.post_send(read(1, 0x8000, 1000));
    let mut fenced = send(2, 0, 100);
    fenced.flags.fence = true;
    node.post_send(fenced);
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::ReadRequest, SQ_PSN, true)]);

    node.feed(read_response(Operation::ReadResponseOnly, SQ_PSN), &pattern(1000, 1));
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::RdmaRead)]);
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, SQ_PSN + 1, true)]);
}

#[test]
fn fatal_naks_complete_with_remote_errors_and_flush_the_rest() {
    let counted = |invalid_request, remote_access, remote_operational| FatalNaks {
        invalid_request,
        remote_access,
        remote_operational,
    };
    for (code, status, kind) in [
        (NakCode::RemoteAccessError, WcStatus::RemAccessErr, counted(0, 1, 0)),
        (NakCode::InvalidRequest, WcStatus::RemInvReqErr, counted(1, 0, 0)),
        (NakCode::RemoteOperationalError, WcStatus::RemOpErr, counted(0, 0, 1)),
    ] {
        let (mut node, _) = requester(attr(), 100);
        node.post_send(send(1, 0, 100));
        node.post_send(write(2, 100));
        node.post_send(send(3, 0, 100));
        assert_eq!(node.transmit().len(), 3);

        // The NAK implicitly acknowledges the SEND before it.
        node.feed(nak(SQ_PSN + 1, code), &[]);
        assert_eq!(
            summary(&node.completions()),
            vec![
                success(1, WcOpcode::Send),
                (CqKind::Send, 2, status, WcOpcode::RdmaWrite),
                flushed(3, WcOpcode::Send),
            ],
            "{code:?}"
        );
        assert_eq!(node.qp.state(), QpState::Err);
        assert_eq!(node.events(), vec![AsyncEvent::QpFatal { qpn: QPN }]);
        assert_eq!(node.qp.poll_timeout(), None);
        assert_eq!(node.qp.counters().fatal_naks_received, kind, "{code:?} counted by kind");

        node.post_send(send(4, 0, 100));
        assert_eq!(summary(&node.completions()), vec![flushed(4, WcOpcode::Send)]);
        assert!(node.transmit().is_empty());
    }
}

#[test]
fn psns_wrap_around_at_2_pow_24() {
    let mut node = TestQp::with_psns(QpType::Rc, attr(), 0xff_fffe, RQ_PSN);
    node.post_send(send(1, 0, 5 * MTU as u32 - 10));
    let sent = node.transmit();
    assert_eq!(
        op_psn_ack_req(&sent),
        vec![
            (Operation::SendFirst, 0xff_fffe, false),
            (Operation::SendMiddle, 0xff_ffff, false),
            (Operation::SendMiddle, 0, false),
            (Operation::SendMiddle, 1, false),
            (Operation::SendLast, 2, true),
        ]
    );
    node.feed(ack(2), &[]);
    assert_eq!(summary(&node.completions()), vec![success(1, WcOpcode::Send)]);
    node.post_send(send(2, 0, 10));
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, 3, true)]);
}

/// rxe-spec T-36: an RC request's payload of a whole 4 KiB or more is lent
/// when one registered piece holds it; a packet whose payload spans two SGEs,
/// inline data, a shorter payload, and any UC or UD send (complete once
/// built, so their buffers may be reused before the link sends them) are
/// copied.
#[test]
fn rc_payloads_are_lent_from_one_registered_piece_and_the_rest_copied() {
    const M: usize = 4096;
    let attr = || QpAttr { path_mtu: Mtu::Mtu4096, ..attr() };
    // One SGE: every packet lent.
    let (mut node, data) = requester(attr(), 4 * M);
    node.post_send(write(1, 3 * M as u32));
    let sent = transmit_lending(&mut node);
    assert_eq!(sent.iter().map(|s| s.0).collect::<Vec<_>>(), [true; 3]);
    assert_eq!(sent.iter().flat_map(|s| s.1.clone()).collect::<Vec<_>>(), data[..3 * M]);
    // Two SGEs that meet inside the second packet: that one is copied, and
    // so is the last, of 100 bytes.
    let (mut node, data) = requester(attr(), 4 * M);
    node.post_send(send(2, 0, M as u32 + 100).with_sge(sge(2 * M as u64, 2 * M as u32)));
    let sent = transmit_lending(&mut node);
    assert_eq!(sent.iter().map(|s| s.0).collect::<Vec<_>>(), [true, false, true, false]);
    let expected = [&data[..M + 100], &data[2 * M..4 * M]].concat();
    assert_eq!(sent.iter().flat_map(|s| s.1.clone()).collect::<Vec<_>>(), expected);
    // Inline data, and a payload too short to be worth it.
    let (mut node, _) = requester(attr(), M);
    let mut wr = SendWr::new(3, SendOp::Send);
    wr.flags.inline = true;
    wr.inline_data = vec![7; 64].into();
    node.post_send(wr);
    node.post_send(send(5, 0, M as u32 - 1));
    assert_eq!(transmit_lending(&mut node), [(false, vec![7; 64]), (false, data[..M - 1].to_vec())]);
    // UC.
    let mut node = TestQp::new(QpType::Uc, attr());
    node.fill(0, &data[..M]);
    node.post_send(send(4, 0, M as u32));
    assert_eq!(transmit_lending(&mut node), [(false, data[..M].to_vec())]);
}
