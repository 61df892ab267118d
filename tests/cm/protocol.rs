//! The handshakes end to end through a [`Pipe`]: what each side reports,
//! what crosses the wire, and how losses are recovered.

use super::*;
use softroce::cm::protocol::{CmError, SidrReply, SidrRequest};
use softroce::wire::cm::{MessageRef, RejReason, SidrStatus, TransportService};
use softroce::wire::CmMessage;

/// The kernel's TID for a sender's own transactions: agent over the
/// byte-swapped Comm ID.
fn own_tid(id: CommId) -> u64 {
    (1 << 32) | u64::from(id.swap_bytes())
}

#[test]
fn connect_accept_rtu_establishes_both_sides() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    let id_a = pipe.connect(0x11);
    assert_eq!(id_a >> 24, 1, "our slot in the top byte");
    pipe.run();

    let [Event::Request { id: id_b, peer, req }, Event::Established { id: established }] = &pipe.b.take_events()[..]
    else {
        panic!("B: Request then Established")
    };
    assert_eq!(*id_b >> 24, 2);
    assert_eq!((*established, *peer), (*id_b, pipe.a.at));
    assert_eq!((req.local_comm_id, req.local_qpn, req.service_id), (id_a, 0x11, SERVICE));
    assert_eq!((req.transport_service, req.path_mtu, req.starting_psn), (TransportService::Rc, 3, Psn::new(0x77)));
    assert_eq!((req.remote_cm_response_timeout, req.local_cm_response_timeout, req.max_cm_retries), (20, 20, 15));
    assert_eq!(req.local_ca_guid, 0x0200_00ff_fe00_0001);
    let path = req.primary_path;
    assert_eq!((path.local_gid, path.remote_gid), (pipe.a.at.gid.to_bytes(), pipe.b.at.gid.to_bytes()));
    assert_eq!((path.local_lid, path.remote_lid, path.subnet_local, path.sl), (0xffff, 0xffff, false, 0));
    assert_eq!((path.hop_limit, path.local_ack_timeout), (64, 19));
    assert_eq!(&req.private_data[..5], b"hello");

    let [Event::Reply { id, rep }] = &pipe.a.take_events()[..] else { panic!("A: Reply") };
    assert_eq!(*id, id_a);
    assert_eq!((rep.local_comm_id, rep.remote_comm_id, rep.local_qpn), (*id_b, id_a, 0x111));
    assert_eq!(rep.starting_psn, Psn::new(0x111 * 11));
    assert_eq!(&rep.private_data[..7], b"welcome");

    // One of each message, in the REQ's transaction.
    let tid = own_tid(id_a);
    assert_eq!((pipe.a.sent_of(attr::REQ), pipe.b.sent_of(attr::REP), pipe.a.sent_of(attr::RTU)), (1, 1, 1));
    for t in pipe.a.sent.iter().chain(&pipe.b.sent) {
        assert_eq!(parsed(t).header.transaction_id, tid);
    }
    let stats = pipe.b.cm.stats();
    assert_eq!((stats.received.req, stats.sent.rep, stats.received.rtu, stats.live_ids), (1, 1, 1, 1));
    assert_eq!(pipe.a.cm.stats().live_ids, 1);
}

#[test]
fn reject_carries_private_data() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.b.auto_answer = false;
    let id_a = pipe.connect(0x12);
    pipe.deliver();
    let [Event::Request { id, .. }] = pipe.b.take_events()[..] else { panic!("a request") };
    pipe.b.cm.reject(pipe.now, id, RejReason::CONSUMER_DEFINED, b"not today").unwrap();
    pipe.run();
    let [Event::Rejected { id: rejected, reason, timed_out, private_data }] = &pipe.a.take_events()[..] else {
        panic!("A: Rejected")
    };
    assert_eq!((*rejected, *reason, *timed_out), (id_a, RejReason::CONSUMER_DEFINED, false));
    assert_eq!(&private_data[..9], b"not today");
    let rej = parsed(pipe.b.sent.last().unwrap());
    let CmMessage::Rej(rej_msg) = rej.message else { panic!("a REJ") };
    assert_eq!((rej_msg.local_comm_id, rej_msg.remote_comm_id, rej_msg.message_rejected), (id, id_a, MessageRef::Req));
    assert_eq!(rej.header.transaction_id, own_tid(id_a), "a REJ answers in the REQ's transaction");
    assert_eq!((pipe.a.cm.stats().live_ids, pipe.b.cm.stats().live_ids), (0, 0));
    assert_eq!(pipe.b.cm.reject(pipe.now, id, RejReason::CONSUMER_DEFINED, b""), Err(CmError::UnknownId));
}

#[test]
fn unknown_service_is_rejected_with_reason_8() {
    let mut pipe = Pipe::new();
    let id_a = pipe.connect(0x13);
    pipe.run();
    let [Event::Rejected { id, reason, timed_out: false, .. }] = pipe.a.take_events()[..] else {
        panic!("A: Rejected")
    };
    assert_eq!((id, reason), (id_a, RejReason::INVALID_SERVICE_ID));
    let rej = parsed(&pipe.b.sent[0]);
    let CmMessage::Rej(rej_msg) = rej.message else { panic!("a REJ") };
    assert_eq!((rej_msg.local_comm_id, rej_msg.remote_comm_id), (0, id_a), "no local ID: nobody took the REQ");
    assert_eq!(rej_msg.message_rejected, MessageRef::Req);
    assert_eq!(rej.header.transaction_id, own_tid(id_a));
    assert!(pipe.b.events.is_empty());
    assert_eq!((pipe.b.cm.stats().rejected, pipe.b.cm.stats().live_ids), (1, 0));
}

#[test]
fn lost_req_is_resent() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.lose = lose_first(0, attr::REQ, 2);
    pipe.connect(0x14);
    pipe.run_for(Duration::from_secs(60));
    assert!(matches!(pipe.b.events[..], [Event::Request { .. }, Event::Established { .. }]));
    assert!(matches!(pipe.a.events[..], [Event::Reply { .. }]));
    assert_eq!(pipe.a.sent_of(REQ), 3);
    assert_eq!(pipe.a.cm.stats().retransmitted.req, 2);
    // Each retry waits the response timeout plus a round trip: 4.3 s + 2.1 s.
    let retry = Duration::from_nanos(4096 << 20) + Duration::from_nanos(4096 << 19);
    assert!(pipe.elapsed() >= retry * 2);
}

#[test]
fn lost_rep_is_resent() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.lose = lose_first(1, attr::REP, 1);
    pipe.connect(0x15);
    pipe.run_for(Duration::from_secs(60));
    assert!(matches!(pipe.b.events[..], [Event::Request { .. }, Event::Established { .. }]));
    assert!(matches!(pipe.a.events[..], [Event::Reply { .. }]));
    // B's REP retry (after the REQ's local response timeout, 4.3 s) comes
    // before A's REQ retry (6.4 s), and the retry was all it took.
    assert_eq!(pipe.b.sent_of(attr::REP), 2);
    assert_eq!(pipe.b.cm.stats().retransmitted.rep, 1);
}

#[test]
fn duplicate_req_after_accept_resends_the_rep() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.connect(0x16);
    // Deliver the REQ by hand, twice; the REP is answered in between.
    let req = pipe.a.cm.poll_transmit().unwrap();
    pipe.b.cm.handle_mad(pipe.now, pipe.a.at, &req.mad);
    let Some(Event::Request { id, .. }) = pipe.b.cm.poll_event() else { panic!("a request") };
    pipe.b.cm.accept(pipe.now, id, connect_reply(0x200)).unwrap();
    let rep = pipe.b.cm.poll_transmit().unwrap();
    pipe.b.cm.handle_mad(pipe.now, pipe.a.at, &req.mad);
    let again = pipe.b.cm.poll_transmit().expect("the REP again");
    assert_eq!(again.mad, rep.mad);
    let stats = pipe.b.cm.stats();
    assert_eq!((stats.duplicates.req, stats.retransmitted.rep, stats.live_ids), (1, 1, 1));
    assert!(pipe.b.cm.poll_event().is_none(), "no second request");
}

#[test]
fn duplicate_req_while_deciding_gets_an_mra_and_the_requester_waits() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.b.auto_answer = false;
    let id_a = pipe.connect(0x17);
    // B decides for a minute: A's REQ retry meets B's MRA, and A then waits
    // the MRA's 69 s instead of resending every 6.4 s.
    pipe.run_for(Duration::from_secs(60));
    assert_eq!(pipe.a.sent_of(REQ), 2, "one retry, then the MRA");
    assert_eq!(pipe.b.sent_of(attr::MRA), 1);
    let CmMessage::Mra(mra) = parsed(&pipe.b.sent[0]).message else { panic!("an MRA") };
    assert_eq!((mra.remote_comm_id, mra.message_mraed, mra.service_timeout), (id_a, MessageRef::Req, 24));
    let [Event::Request { id, .. }] = pipe.b.take_events()[..] else { panic!("one request") };
    pipe.b.cm.accept(pipe.now, id, connect_reply(0x201)).unwrap();
    pipe.a.auto_answer = true;
    pipe.run_for(Duration::from_secs(10));
    assert!(matches!(pipe.b.events[..], [Event::Established { .. }]));
    // The MRA's wait was the REQ's only: a lost DREQ is resent at the usual pace.
    pipe.lose = Box::new(|_, _| true);
    pipe.a.cm.disconnect(pipe.now, id_a, b"").unwrap();
    pipe.run_for(Duration::from_secs(10));
    assert_eq!(pipe.a.sent_of(attr::DREQ), 2);
}

#[test]
fn lost_rtu_is_recovered_by_the_rep_retry() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.lose = lose_first(0, attr::RTU, 1);
    pipe.connect(0x18);
    pipe.run_for(Duration::from_secs(60));
    assert!(matches!(pipe.b.events[..], [Event::Request { .. }, Event::Established { .. }]));
    // B resent its REP; A, established, answered with the RTU again.
    assert_eq!((pipe.b.sent_of(attr::REP), pipe.a.sent_of(attr::RTU)), (2, 2));
    assert_eq!(pipe.a.cm.stats().duplicates.rep, 1);
    assert_eq!(pipe.a.cm.stats().retransmitted.rtu, 1);
}

#[test]
fn a_lost_rtu_is_made_good_by_traffic_on_the_qp() {
    for traffic in [false, true] {
        // The soak's timing (response timeout 17, 4 retries): a REP goes every
        // 0.54 s, five times, where a DREQ is resent at the REQ's pace, 4.8 s.
        let mut pipe = Pipe::with_timing(17, 4);
        pipe.b.cm.listen(SERVICE, 16).unwrap();
        // A's RTU and its first DREQ are lost; A, done before B's REP is
        // due again, disconnects, and ignores B's repeated REPs from then on.
        let (mut rtu, mut dreq) = (lose_first(0, attr::RTU, 1), lose_first(0, attr::DREQ, 1));
        pipe.lose = Box::new(move |side, t| rtu(side, t) | dreq(side, t));
        let id_a = pipe.connect(0x23);
        pipe.deliver();
        let [Event::Request { id: id_b, .. }] = pipe.b.take_events()[..] else { panic!("B: a request") };
        pipe.a.take_events();
        pipe.a.cm.disconnect(pipe.now, id_a, b"").unwrap();
        pipe.deliver();
        let first_rep_retry = pipe.b.cm.poll_timeout().expect("B resends its REP");
        assert_eq!(pipe.b.cm.rep_due(first_rep_retry), [(id_b, 0x123)]);
        if traffic {
            // What the CM service does there when B's QP has received.
            pipe.now = first_rep_retry;
            pipe.b.cm.communication_established(id_b);
        }
        pipe.run();
        let (a, b) = (pipe.a.take_events(), pipe.b.take_events());
        if traffic {
            assert!(matches!(a[..], [Event::Disconnected { id }, Event::TimewaitExit { .. }] if id == id_a), "{a:?}");
            assert!(matches!(
                b[..],
                [Event::Established { .. }, Event::DisconnectRequest { .. }, Event::TimewaitExit { .. }]
            ));
            assert_eq!((pipe.b.sent_of(attr::REP), pipe.b.cm.stats().established_by_traffic), (1, 1));
        } else {
            // B gives up on a connection in use, and its REJ(TIMEOUT) ends
            // A's disconnect as a rejection: what the soak saw.
            let [Event::Rejected { id, reason, timed_out: false, .. }, ..] = a[..] else { panic!("A: {a:?}") };
            assert_eq!((id, reason), (id_a, RejReason::TIMEOUT));
            assert_eq!(pipe.b.sent_of(attr::REP), 5);
            assert!(matches!(b[..], [Event::Rejected { timed_out: true, .. }]), "{b:?}");
        }
    }
}

#[test]
fn total_loss_times_out_with_a_rej_timeout() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.lose = Box::new(|_, _| true);
    let id_a = pipe.connect(0x19);
    pipe.run();
    let [Event::Rejected { id, reason, timed_out: true, .. }] = pipe.a.take_events()[..] else {
        panic!("A: Rejected, timed out")
    };
    assert_eq!((id, reason), (id_a, RejReason::TIMEOUT));
    assert_eq!(pipe.a.sent_of(REQ), 16, "the REQ and 15 retries");
    let CmMessage::Rej(rej) = parsed(pipe.a.sent.last().unwrap()).message else { panic!("a REJ last") };
    assert_eq!((rej.reason, rej.ari_length), (RejReason::TIMEOUT, 8));
    assert_eq!(rej.ari[..8], 0x0200_00ff_fe00_0001u64.to_be_bytes(), "our CA GUID in the ARI");
    let stats = pipe.a.cm.stats();
    assert_eq!((stats.timed_out, stats.live_ids), (1, 0));
    // 16 waits of 6.4 s.
    assert!(pipe.elapsed() >= Duration::from_secs(100));
}

#[test]
fn a_rej_timeout_withdraws_the_request_on_the_passive_side() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.b.auto_answer = false;
    let id_a = pipe.connect(0x1a);
    pipe.deliver();
    // The consumer of A gives up (rdma_destroy_id): REJ(TIMEOUT) with its GUID.
    pipe.a.cm.destroy(pipe.now, id_a);
    pipe.deliver();
    let [Event::Request { id, .. }, Event::Rejected { id: gone, reason, .. }] = pipe.b.take_events()[..] else {
        panic!("B: Request then Rejected")
    };
    assert_eq!((gone, reason), (id, RejReason::TIMEOUT));
    assert_eq!((pipe.a.cm.stats().live_ids, pipe.b.cm.stats().live_ids), (0, 0));
    assert!(pipe.a.events.is_empty(), "a destroyed ID reports nothing");
}

#[test]
fn disconnect_from_either_side() {
    for initiator in 0..2 {
        let mut pipe = Pipe::new();
        pipe.b.cm.listen(SERVICE, 16).unwrap();
        let id_a = pipe.connect(0x20);
        pipe.run_for(Duration::from_secs(1));
        let Event::Request { id: id_b, .. } = pipe.b.events[0] else { panic!("a request") };
        pipe.a.take_events();
        pipe.b.take_events();
        let (closer, closer_id, other, other_id) = if initiator == 0 {
            (&mut pipe.a, id_a, &mut pipe.b, id_b)
        } else {
            (&mut pipe.b, id_b, &mut pipe.a, id_a)
        };
        closer.cm.disconnect(pipe.now, closer_id, b"bye").unwrap();
        let _ = other;
        pipe.run();
        let (closer, other) = if initiator == 0 { (&mut pipe.a, &mut pipe.b) } else { (&mut pipe.b, &mut pipe.a) };
        assert!(matches!(
            closer.take_events()[..],
            [Event::Disconnected { id }, Event::TimewaitExit { id: exit }] if id == closer_id && exit == closer_id
        ));
        let events = other.take_events();
        let [Event::DisconnectRequest { id, private_data }, Event::TimewaitExit { id: exit }] = &events[..] else {
            panic!("the other side: DisconnectRequest, TimewaitExit: {events:?}")
        };
        assert_eq!((*id, *exit, &private_data[..3]), (other_id, other_id, &b"bye"[..]));
        // The DREQ names the receiver's QP and starts the closer's own
        // transaction; the DREP answers in it.
        let dreq = closer.sent.iter().find(|t| is(attr::DREQ)(t)).map(parsed).unwrap();
        let drep = other.sent.iter().find(|t| is(attr::DREP)(t)).map(parsed).unwrap();
        assert_eq!(dreq.header.transaction_id, own_tid(closer_id));
        assert_eq!(drep.header.transaction_id, dreq.header.transaction_id);
        let CmMessage::Dreq(dreq) = dreq.message else { panic!() };
        assert_eq!(dreq.remote_qpn, if initiator == 0 { 0x120 } else { 0x20 });
        assert_eq!((closer.cm.stats().live_ids, other.cm.stats().live_ids), (0, 0));
    }
}

#[test]
fn lost_drep_is_recovered_from_timewait() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    let id_a = pipe.connect(0x21);
    pipe.run_for(Duration::from_secs(1));
    pipe.a.take_events();
    pipe.lose = lose_first(1, attr::DREP, 1);
    pipe.a.cm.disconnect(pipe.now, id_a, b"").unwrap();
    pipe.run();
    assert!(matches!(pipe.a.events[..], [Event::Disconnected { .. }, Event::TimewaitExit { .. }]));
    // A resent the DREQ; B, in TimeWait, sent the DREP again.
    assert_eq!((pipe.a.sent_of(attr::DREQ), pipe.b.sent_of(attr::DREP)), (2, 2));
    assert_eq!(pipe.b.cm.stats().duplicates.dreq, 1);
}

#[test]
fn unanswered_dreq_ends_in_timewait() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    let id_a = pipe.connect(0x22);
    pipe.run_for(Duration::from_secs(1));
    pipe.a.take_events();
    pipe.lose = Box::new(|_, _| true);
    pipe.a.cm.disconnect(pipe.now, id_a, b"").unwrap();
    pipe.run();
    assert!(matches!(pipe.a.events[..], [Event::Disconnected { .. }, Event::TimewaitExit { .. }]));
    assert_eq!(pipe.a.sent_of(attr::DREQ), 16);
}

#[test]
fn stale_dreq_is_answered_with_a_drep() {
    let mut pipe = Pipe::new();
    let dreq = CmMad::new(
        0xabcd,
        CmMessage::Dreq(softroce::wire::cm::DreqRepr {
            local_comm_id: 0x1234_5678,
            remote_comm_id: 0x0200_0042,
            remote_qpn: 0x11,
            private_data: [0; 220],
        }),
    );
    let mut mad = [0u8; 256];
    dreq.emit(&mut mad).unwrap();
    pipe.b.cm.handle_mad(pipe.now, pipe.a.at, &mad);
    let drep = pipe.b.cm.poll_transmit().expect("a DREP");
    assert_eq!(drep.to, pipe.a.at);
    let drep = parsed(&drep);
    let CmMessage::Drep(message) = drep.message else { panic!("a DREP") };
    assert_eq!((message.local_comm_id, message.remote_comm_id), (0x0200_0042, 0x1234_5678));
    assert_eq!(drep.header.transaction_id, 0xabcd);
    assert_eq!(pipe.b.cm.stats().live_ids, 0);
}

#[test]
fn backlog_overflow_drops_the_req_until_room_frees() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 1).unwrap();
    pipe.b.auto_answer = false;
    pipe.connect(0x30);
    pipe.connect(0x31);
    pipe.deliver();
    let [Event::Request { id, .. }] = pipe.b.take_events()[..] else { panic!("one request taken") };
    assert_eq!(pipe.b.cm.stats().refused, 1);
    assert!(pipe.b.sent.is_empty(), "no REJ: the requester may retry");
    pipe.b.cm.accept(pipe.now, id, connect_reply(0x300)).unwrap();
    pipe.run_for(Duration::from_secs(10));
    let requests = pipe.b.events.iter().filter(|e| matches!(e, Event::Request { .. })).count();
    assert_eq!(requests, 1, "the retry found room");
}

#[test]
fn listen_twice_is_addr_in_use_and_calls_check_state() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 1).unwrap();
    assert_eq!(pipe.b.cm.listen(SERVICE, 1), Err(CmError::AddrInUse));
    pipe.b.cm.unlisten(SERVICE);
    pipe.b.cm.listen(SERVICE, 1).unwrap();
    let id = pipe.connect(0x40);
    assert_eq!(pipe.a.cm.accept(pipe.now, id, connect_reply(1)), Err(CmError::InvalidState));
    assert_eq!(pipe.a.cm.ready_to_use(pipe.now, id, b""), Err(CmError::InvalidState));
    assert_eq!(pipe.a.cm.disconnect(pipe.now, id, b""), Err(CmError::InvalidState));
    assert_eq!(pipe.a.cm.disconnect(pipe.now, 7, b""), Err(CmError::UnknownId));
    let mut too_long = connect_request(pipe.a.at, pipe.b.at, 1);
    too_long.private_data = vec![0; 93];
    assert!(matches!(pipe.a.cm.connect(pipe.now, too_long), Err(CmError::InvalidArgument(_))));
    let mut ud = connect_request(pipe.a.at, pipe.b.at, 1);
    ud.qp_type = QpType::Ud;
    assert!(matches!(pipe.a.cm.connect(pipe.now, ud), Err(CmError::InvalidArgument(_))));
}

fn sidr_request(pipe: &Pipe, service_id: u64) -> SidrRequest {
    SidrRequest { peer: pipe.b.at, service_id, pkey: 0xffff, private_data: b"who serves?".to_vec() }
}

#[test]
fn sidr_resolves_a_listened_service() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(0x0111_1c06, 4).unwrap();
    let id_a = pipe.a.cm.sidr_request(pipe.now, sidr_request(&pipe, 0x0111_1c06)).unwrap();
    pipe.deliver();
    let [Event::SidrRequest { id, peer, req }] = &pipe.b.take_events()[..] else { panic!("a SIDR request") };
    assert_eq!((*peer, req.request_id, req.service_id), (pipe.a.at, id_a, 0x0111_1c06));
    let reply = SidrReply { status: SidrStatus::SUCCESS, qpn: 0x99, qkey: 0x0123_4567, private_data: b"me".to_vec() };
    pipe.b.cm.sidr_reply(pipe.now, *id, reply).unwrap();
    pipe.run();
    let [Event::SidrReply { id, rep }] = &pipe.a.take_events()[..] else { panic!("a SIDR reply") };
    assert_eq!((*id, rep.status, rep.qpn, rep.qkey), (id_a, SidrStatus::SUCCESS, 0x99, 0x0123_4567));
    assert_eq!(rep.service_id, 0x0111_1c06);
    let tid = parsed(&pipe.a.sent[0]).header.transaction_id;
    assert_eq!((tid, parsed(&pipe.b.sent[0]).header.transaction_id), (own_tid(id_a), own_tid(id_a)));
    assert_eq!((pipe.a.cm.stats().live_ids, pipe.b.cm.stats().live_ids), (0, 0));
}

#[test]
fn sidr_for_an_unknown_service_is_unsupported() {
    let mut pipe = Pipe::new();
    let id_a = pipe.a.cm.sidr_request(pipe.now, sidr_request(&pipe, 0x0111_0001)).unwrap();
    pipe.run();
    let [Event::SidrReply { id, rep }] = &pipe.a.take_events()[..] else { panic!("a SIDR reply") };
    assert_eq!((*id, rep.status), (id_a, SidrStatus::UNSUPPORTED));
    assert!(pipe.b.events.is_empty());
}

#[test]
fn sidr_times_out_and_repeats_are_dropped() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(0x0111_1c06, 4).unwrap();
    pipe.b.auto_answer = false;
    // B never answers: A resends 15 times, B takes the first and drops the
    // rest as repeats, and A gives up.
    let id_a = pipe.a.cm.sidr_request(pipe.now, sidr_request(&pipe, 0x0111_1c06)).unwrap();
    pipe.run();
    assert!(matches!(pipe.a.events[..], [Event::SidrTimeout { id }] if id == id_a));
    assert_eq!(pipe.a.sent_of(attr::SIDR_REQ), 16);
    assert!(matches!(pipe.b.events[..], [Event::SidrRequest { .. }]));
    assert_eq!(pipe.b.cm.stats().duplicates.sidr_req, 15);
    assert_eq!(pipe.a.cm.stats().live_ids, 0);
}

#[test]
fn three_percent_loss_still_connects_every_pair() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 0).unwrap();
    let mut rng = crate::support::Rng::new(0x5eed);
    pipe.lose = Box::new(move |_, _| rng.next_u32() % 100 < 3);
    let ids: Vec<CommId> = (0..300).map(|i| pipe.connect(0x1000 + i)).collect();
    pipe.run_for(Duration::from_secs(600));
    let established = pipe.b.events.iter().filter(|e| matches!(e, Event::Established { .. })).count();
    let replied = pipe.a.events.iter().filter(|e| matches!(e, Event::Reply { .. })).count();
    assert_eq!((established, replied), (300, 300));
    assert!(pipe.a.cm.stats().retransmitted.req + pipe.b.cm.stats().retransmitted.rep > 0, "some were lost");
    // Then every pair disconnects, through the same losses.
    for id in ids {
        pipe.a.cm.disconnect(pipe.now, id, b"").unwrap();
    }
    pipe.run();
    let exits = |e: &End| e.events.iter().filter(|e| matches!(e, Event::TimewaitExit { .. })).count();
    assert_eq!((exits(&pipe.a), exits(&pipe.b)), (300, 300));
    assert_eq!((pipe.a.cm.stats().live_ids, pipe.b.cm.stats().live_ids), (0, 0));
}

#[test]
fn crossed_dreqs_both_end_in_timewait() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    let id_a = pipe.connect(0x23);
    pipe.run_for(Duration::from_secs(1));
    let Event::Request { id: id_b, .. } = pipe.b.events[0] else { panic!("a request") };
    pipe.a.take_events();
    pipe.b.take_events();
    // Both disconnect before either DREQ arrives: each takes the other's
    // DREQ as a request, answers it, and the DREPs end both.
    pipe.a.cm.disconnect(pipe.now, id_a, b"").unwrap();
    pipe.b.cm.disconnect(pipe.now, id_b, b"").unwrap();
    pipe.run();
    for end in [&pipe.a, &pipe.b] {
        assert!(matches!(end.events[..], [Event::DisconnectRequest { .. }, Event::TimewaitExit { .. }]));
        assert_eq!((end.sent_of(attr::DREQ), end.sent_of(attr::DREP)), (1, 1));
        assert_eq!(end.cm.stats().live_ids, 0);
    }
}

#[test]
fn a_dreq_in_timewait_gets_a_drep_never_the_rtu() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    let id_a = pipe.connect(0x24);
    pipe.run_for(Duration::from_secs(1));
    let Event::Request { id: id_b, .. } = pipe.b.events[0] else { panic!("a request") };
    pipe.a.cm.disconnect(pipe.now, id_a, b"").unwrap();
    pipe.deliver();
    // A is in TimeWait after B's DREP; a DREQ from B (a late one) comes.
    let dreq = softroce::wire::cm::DreqRepr {
        local_comm_id: id_b,
        remote_comm_id: id_a,
        remote_qpn: 0x24,
        private_data: [0; 220],
    };
    let mut mad = [0u8; 256];
    CmMad::new(0x77, CmMessage::Dreq(dreq)).emit(&mut mad).unwrap();
    pipe.a.cm.handle_mad(pipe.now, pipe.b.at, &mad);
    let answer = parsed(&pipe.a.cm.poll_transmit().expect("an answer"));
    let CmMessage::Drep(drep) = answer.message else { panic!("a DREP, not {answer:?}") };
    assert_eq!((drep.local_comm_id, drep.remote_comm_id, answer.header.transaction_id), (id_a, id_b, 0x77));
}

#[test]
fn duplicate_rep_before_ready_to_use_gets_an_mra() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.a.auto_answer = false;
    let id_a = pipe.connect(0x25);
    // A readies its QP for a minute: B's REP retries meet A's MRA, and B
    // then waits the MRA's 69 s.
    pipe.run_for(Duration::from_secs(60));
    assert_eq!((pipe.b.sent_of(attr::REP), pipe.a.sent_of(attr::MRA)), (2, 1));
    let CmMessage::Mra(mra) = parsed(&pipe.a.sent[1]).message else { panic!("an MRA after the REQ") };
    assert_eq!((mra.local_comm_id, mra.message_mraed, mra.service_timeout), (id_a, MessageRef::Rep, 24));
    pipe.a.cm.ready_to_use(pipe.now, id_a, b"").unwrap();
    pipe.run_for(Duration::from_secs(1));
    assert!(matches!(pipe.b.events[..], [Event::Request { .. }, Event::Established { .. }]));
}

#[test]
fn destroy_sends_what_the_state_requires() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    pipe.b.auto_answer = false;
    // A request being decided: REJ(consumer defined).
    let first = pipe.connect(0x26);
    pipe.deliver();
    let [Event::Request { id, .. }] = pipe.b.take_events()[..] else { panic!("a request") };
    pipe.b.cm.destroy(pipe.now, id);
    pipe.deliver();
    assert!(matches!(
        pipe.a.take_events()[..],
        [Event::Rejected { id, reason: RejReason::CONSUMER_DEFINED, .. }] if id == first
    ));
    // An established connection: one DREQ, not resent, and silence.
    pipe.b.auto_answer = true;
    let second = pipe.connect(0x27);
    pipe.run_for(Duration::from_secs(1));
    pipe.a.take_events();
    pipe.lose = Box::new(|_, _| true);
    pipe.a.cm.destroy(pipe.now, second);
    pipe.run();
    assert_eq!(pipe.a.sent_of(attr::DREQ), 1);
    assert!(pipe.a.events.is_empty());
    assert_eq!(pipe.a.cm.stats().live_ids, 0);
}

#[test]
fn a_req_from_a_qp_still_connected_is_stale() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    let old = pipe.connect(0x50);
    pipe.run_for(Duration::from_secs(1));
    let Event::Request { id: old_b, .. } = pipe.b.events[0] else { panic!("a request") };
    pipe.a.take_events();
    pipe.b.take_events();
    // A asks again from the same QP (as a restarted peer would): B refuses
    // the REQ as stale and disconnects the connection it still has.
    let new = pipe.connect(0x50);
    pipe.run();
    let events = pipe.a.take_events();
    assert!(events.contains(&Event::Rejected {
        id: new,
        reason: RejReason::STALE_CONN,
        timed_out: false,
        private_data: vec![0; 148]
    }));
    assert!(events.iter().any(|e| matches!(e, Event::DisconnectRequest { id, .. } if *id == old)));
    assert!(pipe.b.events.iter().any(|e| matches!(e, Event::Disconnected { id } if *id == old_b)));
    let CmMessage::Rej(rej) = parsed(pipe.b.sent.iter().find(|t| is(attr::REJ)(t)).unwrap()).message else {
        panic!("a REJ")
    };
    assert_eq!((rej.local_comm_id, rej.remote_comm_id, rej.message_rejected), (0, new, MessageRef::Req));
    // Once the old connection is gone, the QP connects again.
    pipe.a.take_events();
    pipe.b.take_events();
    pipe.connect(0x50);
    pipe.run_for(Duration::from_secs(1));
    assert!(matches!(pipe.b.events[..], [Event::Request { .. }, Event::Established { .. }]));
}

#[test]
fn an_exit_answers_the_dreq_and_resends_its_own_until_answered() {
    let mut pipe = Pipe::new();
    pipe.b.cm.listen(SERVICE, 16).unwrap();
    let first = pipe.connect(0x28);
    pipe.run_for(Duration::from_secs(1));
    pipe.a.take_events();
    // B's consumer got the DREQ and exits without destroying its id: the
    // exit destroys it, and the DREP goes.
    pipe.b.auto_answer = false;
    pipe.a.cm.disconnect(pipe.now, first, b"").unwrap();
    pipe.deliver();
    assert!(matches!(
        pipe.b.take_events()[..],
        [Event::Request { .. }, Event::Established { .. }, Event::DisconnectRequest { .. }]
    ));
    assert!(pipe.a.take_events().is_empty(), "A waits for the DREP");
    pipe.b.cm.destroy_all(pipe.now);
    pipe.deliver();
    assert!(matches!(pipe.a.take_events()[..], [Event::Disconnected { id }] if id == first));
    assert!(!pipe.b.cm.has_unanswered(), "a DREP waits for nothing");

    // A destroys an established id; its DREQ is lost. The kernel would
    // leave it there; a process about to exit sends it again until the DREP.
    pipe.b.auto_answer = true;
    let second = pipe.connect(0x29);
    pipe.run_for(Duration::from_secs(1));
    pipe.a.take_events();
    pipe.b.take_events();
    pipe.lose = lose_first(0, attr::DREQ, 1);
    pipe.a.cm.destroy(pipe.now, second);
    pipe.deliver();
    assert!(pipe.b.events.is_empty(), "the DREQ was lost");
    assert!(pipe.a.cm.has_unanswered());
    assert!(pipe.a.cm.resend_unanswered());
    pipe.deliver();
    assert!(matches!(pipe.b.take_events()[..], [Event::DisconnectRequest { .. }]));
    assert_eq!((pipe.a.sent_of(attr::DREQ), pipe.b.sent_of(attr::DREP)), (3, 2));
    assert!(!pipe.a.cm.has_unanswered() && !pipe.a.cm.resend_unanswered(), "the DREP answered it");
    assert!(pipe.a.events.is_empty(), "a destroyed id reports nothing");
}
