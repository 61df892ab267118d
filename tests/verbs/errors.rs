//! Error paths of the verbs API over loopback UDP: completion statuses,
//! QP states and asynchronous events after local and remote errors,
//! refused verbs and the memory a failed operation must leave alone.

use std::time::{Duration, Instant};

use crate::support::pattern;
use crate::support::verbs::*;
use softroce::transport::{
    Access, AsyncEvent, AttrMask, ModifyError, Mtu, PostRecvError, PostSendError, QpAttr, QpCap, QpState, QpType,
    RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
use softroce::verbs::{AckTimeout, ConnectOptions, Error, MemoryRegion, QueuePair};

/// A completion without data, as errors and flushes have.
fn failed(wr_id: u64, qp: &QueuePair, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion::new(wr_id, qp.qpn(), status, opcode)
}

/// A SEND of the first 100 bytes of `mr`.
fn send(wr_id: u64, mr: &MemoryRegion) -> SendWr {
    SendWr::new(wr_id, SendOp::Send).with_sge(mr.sge(0, 100))
}

fn move_to(qp: &QueuePair, state: QpState) -> Result<(), Error> {
    qp.modify(&QpAttr { state, ..QpAttr::default() }, AttrMask::STATE)
}

/// After a failed request: A's QP is in ERR, says so with QP_FATAL, and
/// flushes what is posted next at once.
fn assert_requester_failed(pair: &NodePair) {
    assert_eq!(pair.qp_a.state(), QpState::Err);
    assert_eq!(next_async_event(&pair.a.ctx), AsyncEvent::QpFatal { qpn: pair.qp_a.qpn() });
    pair.qp_a.post_send(send(99, &pair.mr_a)).unwrap();
    assert_eq!(pair.a.cq.poll_one(), Some(failed(99, &pair.qp_a, WcStatus::WrFlushErr, WcOpcode::Send)));
}

/// After a request it refused: B's QP moves to ERR with `event`.
fn assert_responder_failed(pair: &NodePair, event: AsyncEvent) {
    wait_for("the responder to move to ERR", || pair.qp_b.state() == QpState::Err);
    assert_eq!(next_async_event(&pair.b.ctx), event);
}

/// Posts `wr` on A for B to refuse: the request completes with `status`,
/// both QPs move to ERR and B raises `event`.
fn assert_refused(pair: &NodePair, wr: SendWr, status: WcStatus, event: AsyncEvent) {
    let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
    pair.qp_a.post_send(wr).unwrap();
    assert_eq!(next_wc(&pair.a.cq), failed(wr_id, &pair.qp_a, status, opcode));
    assert_requester_failed(pair);
    assert_responder_failed(pair, event);
}

#[test]
fn bad_local_sges_fail_with_loc_prot_err_and_flush_what_follows() {
    let bad_sges: [fn(&NodePair) -> Sge; 3] = [
        // A key no region of the device has.
        |pair| Sge { lkey: pair.mr_a.lkey() ^ 0x5a5a_5a5a, ..pair.mr_a.sge(0, 100) },
        // The right key, but bytes past the end of the region.
        |pair| pair.mr_a.sge(MR_LEN - 50, 100),
        // A key of the peer's device.
        |pair| Sge { lkey: pair.mr_b.lkey(), ..pair.mr_a.sge(0, 100) },
    ];
    for bad_sge in bad_sges {
        let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
        fill(&pair.mr_b, FILL);
        pair.qp_b.post_recv(RecvWr { wr_id: 5, sg_list: softroce::sg_list![pair.mr_b.sge(0, 4096)] }).unwrap();
        pair.qp_a.post_send(SendWr::new(1, SendOp::Send).with_sge(bad_sge(&pair))).unwrap();
        pair.qp_a.post_send(send(2, &pair.mr_a)).unwrap();
        assert_eq!(next_wc(&pair.a.cq), failed(1, &pair.qp_a, WcStatus::LocProtErr, WcOpcode::Send));
        assert_eq!(next_wc(&pair.a.cq), failed(2, &pair.qp_a, WcStatus::WrFlushErr, WcOpcode::Send));
        assert_requester_failed(&pair);
        // Nothing reached the peer.
        assert_no_wc(&pair.b.cq);
        assert_holds_only(&pair.mr_b, 0, &[]);
        assert_eq!(pair.qp_b.state(), QpState::Rts);
    }
}

#[test]
fn rdma_write_past_the_rkey_range_fails_with_rem_access_err() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    fill(&pair.mr_b, FILL);
    pair.mr_a.write(0, &pattern(3000, 1)).unwrap();
    // Three packets: the first would fit, the message does not.
    let write = SendOp::RdmaWrite { remote_addr: pair.mr_b.addr() + (MR_LEN - 2048) as u64, rkey: pair.mr_b.rkey() };
    let wr = SendWr::new(1, write).with_sge(pair.mr_a.sge(0, 3000));
    assert_refused(&pair, wr, WcStatus::RemAccessErr, AsyncEvent::QpAccessError { qpn: pair.qp_b.qpn() });
    assert_holds_only(&pair.mr_b, 0, &[]);
}

#[test]
fn rdma_read_of_a_region_without_remote_read_fails_with_rem_access_err() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let unreadable = pair.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    unreadable.write(0, &pattern(4096, 2)).unwrap();
    fill(&pair.mr_a, FILL);
    let read = SendOp::RdmaRead { remote_addr: unreadable.addr(), rkey: unreadable.rkey() };
    let wr = SendWr::new(1, read).with_sge(pair.mr_a.sge(0, 4096));
    assert_refused(&pair, wr, WcStatus::RemAccessErr, AsyncEvent::QpAccessError { qpn: pair.qp_b.qpn() });
    assert_holds_only(&pair.mr_a, 0, &[]);
}

#[test]
fn rdma_write_to_a_qp_without_remote_write_fails_with_rem_inv_req_err() {
    let no_write = ConnectOptions { access: Access::LOCAL_WRITE | Access::REMOTE_READ, ..options(Mtu::Mtu1024) };
    let pair = NodePair::new(nodes(false), QpType::Rc, &options(Mtu::Mtu1024), &no_write);
    fill(&pair.mr_b, FILL);
    let write = SendOp::RdmaWrite { remote_addr: pair.mr_b.addr(), rkey: pair.mr_b.rkey() };
    let wr = SendWr::new(1, write).with_sge(pair.mr_a.sge(0, 100));
    assert_refused(&pair, wr, WcStatus::RemInvReqErr, AsyncEvent::QpRequestError { qpn: pair.qp_b.qpn() });
    assert_holds_only(&pair.mr_b, 0, &[]);
}

#[test]
fn rdma_write_to_a_deregistered_region_fails_with_rem_access_err() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let gone = pair.b.mr(4096);
    let write = SendOp::RdmaWrite { remote_addr: gone.addr(), rkey: gone.rkey() };
    drop(gone);
    let wr = SendWr::new(1, write).with_sge(pair.mr_a.sge(0, 100));
    assert_refused(&pair, wr, WcStatus::RemAccessErr, AsyncEvent::QpAccessError { qpn: pair.qp_b.qpn() });
}

#[test]
fn rdma_write_to_a_region_of_another_pd_fails_with_rem_access_err() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let other_pd = pair.b.ctx.alloc_pd().unwrap();
    let foreign = other_pd.alloc_mr(4096, ALL_ACCESS).unwrap();
    fill(&foreign, FILL);
    let write = SendOp::RdmaWrite { remote_addr: foreign.addr(), rkey: foreign.rkey() };
    let wr = SendWr::new(1, write).with_sge(pair.mr_a.sge(0, 100));
    assert_refused(&pair, wr, WcStatus::RemAccessErr, AsyncEvent::QpAccessError { qpn: pair.qp_b.qpn() });
    assert_holds_only(&foreign, 0, &[]);
}

#[test]
fn refused_atomics_leave_both_words_alone() {
    let cases = [
        // Misaligned: an invalid request.
        (4, ALL_ACCESS, WcStatus::RemInvReqErr),
        // Aligned, in a region without REMOTE_ATOMIC.
        (8, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ, WcStatus::RemAccessErr),
    ];
    for (offset, access, status) in cases {
        let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
        let target = pair.b.pd.alloc_mr(4096, access).unwrap();
        fill(&target, FILL);
        fill(&pair.mr_a, FILL);
        let add = SendOp::FetchAdd { remote_addr: target.addr() + offset, rkey: target.rkey(), add: 1 };
        let event = match status {
            WcStatus::RemAccessErr => AsyncEvent::QpAccessError { qpn: pair.qp_b.qpn() },
            _ => AsyncEvent::QpRequestError { qpn: pair.qp_b.qpn() },
        };
        assert_refused(&pair, SendWr::new(1, add).with_sge(pair.mr_a.sge(0, 8)), status, event);
        assert_holds_only(&target, 0, &[]);
        assert_holds_only(&pair.mr_a, 0, &[]);
    }
}

#[test]
fn send_longer_than_the_receive_fails_on_both_sides() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    fill(&pair.mr_b, FILL);
    pair.qp_b.post_recv(RecvWr { wr_id: 5, sg_list: softroce::sg_list![pair.mr_b.sge(0, 99)] }).unwrap();
    let event = AsyncEvent::QpRequestError { qpn: pair.qp_b.qpn() };
    assert_refused(&pair, send(1, &pair.mr_a), WcStatus::RemInvReqErr, event);
    assert_eq!(next_wc(&pair.b.cq), failed(5, &pair.qp_b, WcStatus::LocLenErr, WcOpcode::Recv));
    assert_holds_only(&pair.mr_b, 0, &[]);
}

#[test]
fn ud_sends_with_the_wrong_qkey_are_dropped() {
    const QKEY: u32 = 0x0bad_cafe;
    let (node_a, node_b) = nodes(false);
    let (qp_a, qp_b) = (node_a.qp(QpType::Ud), node_b.qp(QpType::Ud));
    qp_a.activate(QKEY).unwrap();
    qp_b.activate(QKEY).unwrap();
    let (mr_a, mr_b) = (node_a.mr(4096), node_b.mr(4096));
    let ah = node_a.pd.create_ah(node_b.ctx.device().gid(1).unwrap());
    let send_with = |wr_id, qkey| {
        qp_b.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![mr_b.sge(0, 4096)] }).unwrap();
        let wr = SendWr { ud: Some(ah.ud_dest(qp_b.qpn(), qkey)), ..send(wr_id, &mr_a) };
        qp_a.post_send(wr).unwrap();
        // UD completes once sent, received or not.
        assert_eq!(next_wc(&node_a.cq).status, WcStatus::Success);
    };
    send_with(1, QKEY ^ 1);
    assert_no_wc(&node_b.cq);
    assert_eq!(node_b.ctx.counters().qp.dropped, 1);
    // A Q_Key with the high bit set stands for the sender's own (QKEY); the
    // receive the dropped message left takes it.
    send_with(2, 0x8000_0000);
    assert_eq!(next_wc(&node_b.cq).wr_id, 1);
}

#[test]
fn post_send_before_rts_is_refused() {
    let (node_a, node_b) = nodes(false);
    let (qp_a, qp_b) = (node_a.qp(QpType::Rc), node_b.qp(QpType::Rc));
    let mr = node_a.mr(4096);
    let post = || qp_a.post_send(SendWr::new(1, SendOp::Send).with_sge(mr.sge(0, 8)));
    assert!(matches!(post(), Err(Error::PostSend(PostSendError::InvalidState(QpState::Reset)))));
    let init = QpAttr { state: QpState::Init, access_flags: ALL_ACCESS, ..QpAttr::default() };
    qp_a.modify(&init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS).unwrap();
    assert!(matches!(post(), Err(Error::PostSend(PostSendError::InvalidState(QpState::Init)))));
    // Ready to receive is not ready to send either.
    let rtr = QpAttr { state: QpState::Rtr, dest: Some(IP_B), dest_qpn: qp_b.qpn(), ..init };
    let rtr_mask = AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    qp_a.modify(&rtr, AttrMask::STATE | rtr_mask).unwrap();
    let refused = post().unwrap_err();
    assert!(matches!(refused, Error::PostSend(PostSendError::InvalidState(QpState::Rtr))), "{refused:?}");
    assert_eq!(refused.to_string(), "post send: cannot post sends in QP state Rtr");
    assert_no_wc(&node_a.cq);
}

#[test]
fn modify_without_required_attributes_names_them() {
    let (node, _) = nodes(false);
    let qp = node.qp(QpType::Rc);
    let init = QpAttr { state: QpState::Init, ..QpAttr::default() };
    let refused = qp.modify(&init, AttrMask::STATE | AttrMask::PORT).unwrap_err();
    let missing = AttrMask::PKEY_INDEX | AttrMask::ACCESS_FLAGS;
    let expected = ModifyError::MissingAttributes { from: QpState::Reset, to: QpState::Init, missing };
    assert!(matches!(refused, Error::Modify(e) if e == expected), "{refused:?}");
    assert_eq!(refused.to_string(), "modify QP: transition Reset -> Init requires attributes ACCESS_FLAGS|PKEY_INDEX");
    assert_eq!(qp.state(), QpState::Reset);

    qp.modify(&init, AttrMask::STATE | AttrMask::PORT | missing).unwrap();
    let rtr = QpAttr { state: QpState::Rtr, dest: Some(IP_B), ..init };
    let refused = qp.modify(&rtr, AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "modify QP: transition Init -> Rtr requires attributes RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN"
    );
    assert_eq!(qp.state(), QpState::Init);
}

#[test]
fn moving_to_err_flushes_posted_receives_and_sends() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    for wr_id in [101, 102] {
        pair.qp_a.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![pair.mr_a.sge(0, 4096)] }).unwrap();
    }
    // B posts no receive and A retries RNR forever: the SENDs stay queued.
    for wr_id in 1..=3 {
        pair.qp_a.post_send(send(wr_id, &pair.mr_a)).unwrap();
    }
    wait_for("an RNR NAK", || pair.a.ctx.counters().qp.rnr_naks_received > 0);
    move_to(&pair.qp_a, QpState::Err).unwrap();
    let mut flushed: Vec<WorkCompletion> = (0..5).map(|_| next_wc(&pair.a.cq)).collect();
    flushed.sort_by_key(|wc| wc.wr_id);
    let expected: Vec<WorkCompletion> = [(1, WcOpcode::Send), (2, WcOpcode::Send), (3, WcOpcode::Send)]
        .into_iter()
        .chain([(101, WcOpcode::Recv), (102, WcOpcode::Recv)])
        .map(|(wr_id, opcode)| failed(wr_id, &pair.qp_a, WcStatus::WrFlushErr, opcode))
        .collect();
    assert_eq!(flushed, expected);
    assert_no_wc(&pair.a.cq);
    // In ERR, work requests complete as they are posted.
    pair.qp_a.post_send(send(4, &pair.mr_a)).unwrap();
    assert_eq!(pair.a.cq.poll_one(), Some(failed(4, &pair.qp_a, WcStatus::WrFlushErr, WcOpcode::Send)));
    pair.qp_a.post_recv(RecvWr { wr_id: 103, sg_list: softroce::sg_list![pair.mr_a.sge(0, 64)] }).unwrap();
    assert_eq!(pair.a.cq.poll_one(), Some(failed(103, &pair.qp_a, WcStatus::WrFlushErr, WcOpcode::Recv)));
    assert_eq!(pair.qp_a.state(), QpState::Err);
}

#[test]
fn flushes_reach_the_cq_of_their_queue() {
    let (node_a, node_b) = nodes(false);
    let recv_cq = node_a.ctx.create_cq(64, None).unwrap();
    let mr = node_a.mr(4096);
    let peer = node_b.qp(QpType::Rc);
    // The flushes of a move to ERR wait in the QP until the engine or the
    // next post hands them out: that post must not send them to its own CQ.
    for round in 0..10 {
        let qp = node_a.init(QpType::Rc).recv_cq(&recv_cq).build().unwrap();
        qp.connect(&peer.endpoint(1).unwrap(), &options(Mtu::Mtu1024)).unwrap();
        qp.post_recv(RecvWr { wr_id: 100 + round, sg_list: softroce::sg_list![mr.sge(0, 64)] }).unwrap();
        move_to(&qp, QpState::Err).unwrap();
        qp.post_send(SendWr::new(round, SendOp::Send).with_sge(mr.sge(0, 8))).unwrap();
        assert_eq!(next_wc(&node_a.cq), failed(round, &qp, WcStatus::WrFlushErr, WcOpcode::Send));
        assert_eq!(next_wc(&recv_cq), failed(100 + round, &qp, WcStatus::WrFlushErr, WcOpcode::Recv));
    }
    assert_no_wc(&node_a.cq);
}

#[test]
fn send_without_a_receive_exhausts_rnr_retries() {
    for rnr_retry in [0, 2] {
        let requester = ConnectOptions { rnr_retry, ..options(Mtu::Mtu1024) };
        // The shortest RNR wait the responder can ask for (10 µs).
        let responder = ConnectOptions { min_rnr_timer: 1, ..options(Mtu::Mtu1024) };
        let pair = NodePair::new(nodes(false), QpType::Rc, &requester, &responder);
        pair.qp_a.post_send(send(1, &pair.mr_a)).unwrap();
        assert_eq!(next_wc(&pair.a.cq), failed(1, &pair.qp_a, WcStatus::RnrRetryExcErr, WcOpcode::Send));
        assert_requester_failed(&pair);
        let naks = u64::from(rnr_retry) + 1;
        assert_eq!(pair.a.ctx.counters().qp.rnr_naks_received, naks, "rnr_retry {rnr_retry}");
        assert_eq!(pair.b.ctx.counters().qp.rnr_naks_sent, naks, "rnr_retry {rnr_retry}");
        // A receiver not ready is no error of the responder's.
        assert_eq!(pair.qp_b.state(), QpState::Rts);
    }
}

#[test]
fn dead_peer_exhausts_transport_retries_in_time() {
    const TIMEOUT: u8 = 12;
    // 4.096 µs × 2^timeout, waited once for the request and once per retry.
    let ack_timeout = Duration::from_nanos(4096 << TIMEOUT);
    let requester =
        ConnectOptions { timeout: AckTimeout::from_exponent(TIMEOUT).unwrap(), retry_cnt: 1, ..options(Mtu::Mtu1024) };
    let pair = NodePair::new(nodes(false), QpType::Rc, &requester, &options(Mtu::Mtu1024));
    // Everything of B goes: its engine stops and its socket closes.
    drop(pair.qp_b);
    drop(pair.mr_b);
    drop(pair.b);
    let start = Instant::now();
    pair.qp_a.post_send(send(1, &pair.mr_a)).unwrap();
    let wc = next_wc(&pair.a.cq);
    let elapsed = start.elapsed();
    assert_eq!(wc, failed(1, &pair.qp_a, WcStatus::RetryExcErr, WcOpcode::Send));
    assert!(elapsed >= 2 * ack_timeout && elapsed < 2 * ack_timeout + Duration::from_secs(1), "{elapsed:?}");
    let counters = pair.a.ctx.counters().qp;
    assert_eq!((counters.timeouts, counters.retries), (2, 1), "{counters:?}");
    assert_eq!(pair.qp_a.state(), QpState::Err);
}

#[test]
fn overflowing_a_cq_is_reported() {
    let (node_a, node_b) = nodes(false);
    let small = node_a.ctx.create_cq(2, None).unwrap();
    let qp_a = node_a.pd.create_qp(QpType::Rc, &small).recv_cq(&node_a.cq).build().unwrap();
    let qp_b = node_b.qp(QpType::Rc);
    connect(&qp_a, &qp_b, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    let (mr_a, mr_b) = (node_a.mr(4096), node_b.mr(4096));
    for wr_id in 1..=4 {
        qp_b.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![mr_b.sge(0, 100)] }).unwrap();
    }
    let send_and_receive = |wr_id| {
        qp_a.post_send(send(wr_id, &mr_a)).unwrap();
        assert_eq!(next_wc(&node_b.cq).wr_id, wr_id);
    };
    send_and_receive(1);
    send_and_receive(2);
    // Full is not overflowed.
    std::thread::sleep(QUIET);
    assert!(!small.overflowed());
    send_and_receive(3);
    send_and_receive(4);
    wait_for("the overflow", || small.overflowed());
    // The fourth's ACK may trail the overflow the third caused (the two are
    // acknowledged apart or together): let it come before the CQ is read,
    // or its completion finds the room the reading makes.
    std::thread::sleep(QUIET);
    let kept: Vec<u64> = std::iter::from_fn(|| small.poll_one()).map(|wc| wc.wr_id).collect();
    assert_eq!(kept, [1, 2]);
    assert!(!node_b.cq.overflowed());
}

#[test]
fn remote_rights_without_local_write_are_refused() {
    let (node, _) = nodes(false);
    for access in [Access::REMOTE_WRITE, Access::REMOTE_ATOMIC, Access::REMOTE_WRITE | Access::REMOTE_READ] {
        let refused = node.pd.alloc_mr(4096, access).unwrap_err();
        assert!(matches!(refused, Error::InvalidArgument(_)), "{access:?}: {refused:?}");
        assert!(refused.to_string().contains("LOCAL_WRITE"), "{refused}");
    }
    for access in [Access::REMOTE_READ, Access::LOCAL_WRITE | Access::REMOTE_WRITE] {
        node.pd.alloc_mr(4096, access).unwrap();
    }
}

#[test]
fn gid_index_out_of_range_is_refused() {
    let (node, _) = nodes(false);
    let qp = node.qp(QpType::Rc);
    // GID 0 is the link-local GID, GID 1 the address: the table ends there.
    assert_eq!(qp.endpoint(1).unwrap().gid.to_ip(), IP_A);
    for index in [2, usize::MAX] {
        let refused = qp.endpoint(index).unwrap_err();
        assert!(matches!(refused, Error::InvalidArgument(_)), "{refused:?}");
        assert!(refused.to_string().contains(&format!("GID index {index}")), "{refused}");
    }
}

#[test]
fn region_copies_out_of_bounds_are_refused_and_change_nothing() {
    let (node, _) = nodes(false);
    let mr = node.mr(4096);
    fill(&mr, FILL);
    let mut out = [0u8; 8];
    for offset in [4096 - 7, 4096, usize::MAX - 3] {
        assert!(matches!(mr.read(offset, &mut out), Err(Error::InvalidArgument(_))), "read at {offset}");
        assert!(matches!(mr.write(offset, &[1; 8]), Err(Error::InvalidArgument(_))), "write at {offset}");
        assert!(mr.load_u64(offset).is_err(), "load_u64 at {offset}");
    }
    assert_eq!(out, [0; 8]);
    assert_holds_only(&mr, 0, &[]);
    assert!(mr.load_u64(4).is_err(), "misaligned load_u64");
    mr.write(4096 - 8, &[1; 8]).unwrap();
    assert_holds_only(&mr, 4096 - 8, &[1; 8]);
}

#[test]
fn malformed_requests_are_refused_at_post_time() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let cap = QpCap::default();
    let too_many = SendWr {
        sg_list: softroce::sg_list![pair.mr_a.sge(0, 1); cap.max_send_sge as usize + 1],
        ..send(1, &pair.mr_a)
    };
    let inline = SendWr {
        flags: SendFlags { inline: true, ..SendFlags::default() },
        inline_data: vec![0; cap.max_inline_data as usize + 1].into(),
        ..SendWr::new(2, SendOp::Send)
    };
    let atomic = SendOp::FetchAdd { remote_addr: pair.mr_b.addr(), rkey: pair.mr_b.rkey(), add: 1 };
    let short_atomic = SendWr::new(3, atomic).with_sge(pair.mr_a.sge(0, 4));
    let mut with_destination = send(4, &pair.mr_a);
    with_destination.ud = Some(pair.a.pd.create_ah(pair.b.ctx.device().gid(1).unwrap()).ud_dest(1, 1));
    let refusals = [
        (too_many, PostSendError::TooManySge { given: 17, max: 16 }),
        (inline, PostSendError::InlineTooLong { given: 257, max: 256 }),
        (short_atomic, PostSendError::AtomicSge),
        (with_destination, PostSendError::Destination),
    ];
    for (wr, expected) in refusals {
        let refused = pair.qp_a.post_send(wr).unwrap_err();
        assert!(matches!(refused, Error::PostSend(e) if e == expected), "{refused:?}");
    }

    let uc = NodePair::connected(QpType::Uc, &options(Mtu::Mtu1024));
    let read = SendOp::RdmaRead { remote_addr: uc.mr_b.addr(), rkey: uc.mr_b.rkey() };
    let refused = uc.qp_a.post_send(SendWr::new(5, read).with_sge(uc.mr_a.sge(0, 8))).unwrap_err();
    assert!(matches!(refused, Error::PostSend(PostSendError::UnsupportedOp(QpType::Uc))), "{refused:?}");

    let srq = pair.b.pd.create_srq(4, 1).unwrap();
    let on_srq = pair.b.init(QpType::Rc).srq(&srq).build().unwrap();
    let refused = on_srq.post_recv(RecvWr { wr_id: 6, sg_list: softroce::sg_list![] }).unwrap_err();
    assert!(matches!(refused, Error::PostRecv(PostRecvError::InvalidState)), "{refused:?}");

    // Nothing was queued: the QPs work on.
    assert_no_wc(&pair.a.cq);
    pair.qp_b.post_recv(RecvWr { wr_id: 7, sg_list: softroce::sg_list![pair.mr_b.sge(0, 100)] }).unwrap();
    pair.qp_a.post_send(send(8, &pair.mr_a)).unwrap();
    assert_eq!(next_wc(&pair.a.cq).status, WcStatus::Success);
}

/// A device of its own on 127.0.0.1, nobody to talk to: for what creation
/// grants or refuses.
fn lone_node(name: &str) -> Node {
    let ip = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let options = softroce::verbs::ContextOptions {
        port: free_port(&[ip]),
        busy_poll: false,
        ..softroce::verbs::ContextOptions::default()
    };
    Node::open(name, ip, options)
}

#[test]
fn queue_pair_capacities_beyond_the_device_limits_are_refused() {
    let node = lone_node("limits");
    let limits = node.ctx.device().query_device();
    let too_many = QpCap { max_send_wr: limits.max_qp_wr + 1, ..QpCap::default() };
    let init = node.init(QpType::Rc);
    match init.cap(too_many).build() {
        Err(Error::Limit { what: "max_send_wr", max }) => assert_eq!(max, u64::from(limits.max_qp_wr)),
        other => panic!("expected a max_send_wr limit error, got {other:?}"),
    }
    let inline = QpCap { max_inline_data: limits.max_inline_data + 1, ..QpCap::default() };
    assert!(matches!(init.cap(inline).build(), Err(Error::Limit { what: "max_inline_data", .. })));
}

#[test]
fn a_queue_pair_gets_the_capacities_kernel_rxe_grants() {
    let node = lone_node("granted");
    let cap = |max_send_wr, max_recv_wr, max_send_sge, max_inline_data| QpCap {
        max_send_wr,
        max_recv_wr,
        max_send_sge,
        max_recv_sge: 2,
        max_inline_data,
    };
    // Rings of 2^k - 1 entries; a send WQE of max(SGEs x 16, inline) bytes.
    for (asked, granted) in [
        (cap(100, 10, 1, 0), cap(127, 15, 1, 16)),
        (cap(128, 0, 2, 100), cap(255, 0, 6, 100)),
        (cap(1, 1, 4, 64), cap(1, 1, 4, 64)),
    ] {
        let qp = node.init(QpType::Rc).cap(asked).build().unwrap();
        assert_eq!(qp.cap(), granted, "asked {asked:?}");
    }
    // An SRQ's QP receives from the SRQ: its receive side stays as asked.
    let srq = node.pd.create_srq(4, 1).unwrap();
    let on_srq = node.init(QpType::Rc).srq(&srq).cap(cap(7, 10, 1, 0)).build().unwrap();
    assert_eq!(on_srq.cap(), cap(7, 10, 1, 16));
}

#[test]
fn ud_qps_activate_and_connected_qps_connect_and_not_the_other_way_round() {
    let (node_a, node_b) = nodes(false);
    let (ud, rc) = (node_a.qp(QpType::Ud), node_a.qp(QpType::Rc));
    let peer = node_b.qp(QpType::Rc).endpoint(1).unwrap();
    assert!(matches!(ud.connect(&peer, &ConnectOptions::default()), Err(Error::InvalidArgument(_))));
    assert!(matches!(rc.activate(0x1234), Err(Error::InvalidArgument(_))));
    assert_eq!((ud.state(), rc.state()), (QpState::Reset, QpState::Reset));
    ud.activate(0x1234).unwrap();
    assert_eq!((ud.state(), ud.query().qkey), (QpState::Rts, 0x1234));
}
