//! The QP state machine (rxe-spec/transport.md, "Queue pair states").

use softroce::transport::*;
use softroce::wire::{Operation, Transport};

use crate::requester::{flushed, read, requester, send, write};
use crate::support::pattern;
use crate::support::qp::*;

/// The attributes RTR requires of an RC QP.
fn rc_rtr_mask() -> AttrMask {
    AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER
}

/// The attributes RTS requires of an RC QP.
fn rc_rts_mask() -> AttrMask {
    AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::SQ_PSN | AttrMask::MAX_QP_RD_ATOMIC
}

#[test]
fn modify_names_missing_and_unexpected_attributes() {
    let mut qp = Qp::new(QPN, QpType::Rc, PD, QpCap::default(), None);
    let base = QpAttr { dest: Some(PEER), dest_qpn: PEER_QPN, ..attr() };

    let rts = QpAttr { state: QpState::Rts, ..base };
    assert_eq!(
        qp.modify(&rts, AttrMask::STATE | rc_rts_mask()),
        Err(ModifyError::InvalidTransition { from: QpState::Reset, to: QpState::Rts })
    );

    let init = QpAttr { state: QpState::Init, ..base };
    let err = qp.modify(&init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT).unwrap_err();
    assert_eq!(
        err,
        ModifyError::MissingAttributes { from: QpState::Reset, to: QpState::Init, missing: AttrMask::ACCESS_FLAGS }
    );
    assert!(err.to_string().contains("ACCESS_FLAGS"), "{err}");
    let init_mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    let err = qp.modify(&init, init_mask | AttrMask::SQ_PSN).unwrap_err();
    assert_eq!(
        err,
        ModifyError::UnexpectedAttributes { from: QpState::Reset, to: QpState::Init, unexpected: AttrMask::SQ_PSN }
    );
    assert!(err.to_string().contains("SQ_PSN"), "{err}");
    assert_eq!(qp.state(), QpState::Reset);
    qp.modify(&init, init_mask).unwrap();

    let rtr = QpAttr { state: QpState::Rtr, ..base };
    let err = qp.modify(&rtr, AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN).unwrap_err();
    let missing = AttrMask::RQ_PSN | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
    assert_eq!(err, ModifyError::MissingAttributes { from: QpState::Init, to: QpState::Rtr, missing });
    let text = err.to_string();
    assert!(["RQ_PSN", "MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER"].iter().all(|n| text.contains(n)), "{text}");
    assert_eq!(qp.state(), QpState::Init);
    qp.modify(&rtr, AttrMask::STATE | rc_rtr_mask()).unwrap();

    let err = qp.modify(&rts, AttrMask::STATE | AttrMask::SQ_PSN).unwrap_err();
    let missing = AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
    assert_eq!(err, ModifyError::MissingAttributes { from: QpState::Rtr, to: QpState::Rts, missing });
    let err = qp.modify(&rts, AttrMask::STATE | rc_rts_mask() | AttrMask::RQ_PSN).unwrap_err();
    assert_eq!(
        err,
        ModifyError::UnexpectedAttributes { from: QpState::Rtr, to: QpState::Rts, unexpected: AttrMask::RQ_PSN }
    );
    assert_eq!(qp.state(), QpState::Rtr);
    qp.modify(&rts, AttrMask::STATE | rc_rts_mask()).unwrap();
    assert_eq!(qp.state(), QpState::Rts);
}

#[test]
fn moving_to_err_from_any_state_flushes_everything() {
    let to_err = QpAttr { state: QpState::Err, ..QpAttr::default() };

    // INIT and RTR hold receives only.
    for target in [QpState::Init, QpState::Rtr] {
        let mut qp = Qp::new(QPN, QpType::Rc, PD, QpCap::default(), None);
        let mut at = QpAttr { dest: Some(PEER), dest_qpn: PEER_QPN, state: QpState::Init, ..attr() };
        qp.modify(&at, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS).unwrap();
        if target == QpState::Rtr {
            at.state = QpState::Rtr;
            qp.modify(&at, AttrMask::STATE | rc_rtr_mask()).unwrap();
        }
        qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![sge(0, 64)] }).unwrap();
        qp.modify(&to_err, AttrMask::STATE).unwrap();
        assert_eq!(qp.state(), QpState::Err);
        let wcs: Vec<_> = std::iter::from_fn(|| qp.poll_completion()).collect();
        assert_eq!(summary(&wcs), vec![(CqKind::Recv, 1, WcStatus::WrFlushErr, WcOpcode::Recv)], "{target:?}");
    }

    // RTS: a send in flight, one not yet sent, and a receive.
    let (mut node, _) = requester(attr(), 100);
    node.post_send(send(1, 0, 100));
    assert_eq!(node.transmit().len(), 1);
    node.post_send(read(2, 0x8000, 100));
    node.post_recv(3, 0x9000, 64);
    node.qp.modify(&to_err, AttrMask::STATE).unwrap();
    assert_eq!(
        summary(&node.completions()),
        vec![
            flushed(1, WcOpcode::Send),
            flushed(2, WcOpcode::RdmaRead),
            (CqKind::Recv, 3, WcStatus::WrFlushErr, WcOpcode::Recv)
        ]
    );
    assert_eq!(node.qp.poll_timeout(), None);
    assert!(node.transmit().is_empty());
    // A late ACK for the flushed send changes nothing.
    node.feed(ack(SQ_PSN), &[]);
    assert!(node.completions().is_empty());

    // ERR → RESET empties the QP; it takes no receives until INIT.
    let reset = QpAttr { state: QpState::Reset, ..QpAttr::default() };
    node.qp.modify(&reset, AttrMask::STATE).unwrap();
    assert_eq!(node.qp.state(), QpState::Reset);
    assert_eq!(node.qp.post_recv(RecvWr { wr_id: 4, sg_list: softroce::sg_list![] }), Err(PostRecvError::InvalidState));
}

#[test]
fn ud_send_error_stops_only_the_send_queue() {
    let mut node = TestQp::new(QpType::Ud, attr());
    let dest = UdDest { dest: PEER, remote_qpn: PEER_QPN, remote_qkey: QKEY };
    let bad = Sge { addr: VA, length: 64, lkey: KEY ^ 0xff };
    node.post_send(SendWr::new(1, SendOp::Send).with_sge(bad).with_ud(dest));
    node.post_send(SendWr::new(2, SendOp::Send).with_sge(sge(0, 64)).with_ud(dest));
    assert!(node.transmit().is_empty());
    assert_eq!(
        summary(&node.completions()),
        vec![(CqKind::Send, 1, WcStatus::LocProtErr, WcOpcode::Send), flushed(2, WcOpcode::Send)]
    );
    assert_eq!(node.qp.state(), QpState::Sqe);
    // Sends posted in SQE are flushed at once; receives still work.
    node.post_send(SendWr::new(3, SendOp::Send).with_sge(sge(0, 64)).with_ud(dest));
    assert_eq!(summary(&node.completions()), vec![flushed(3, WcOpcode::Send)]);
    node.post_recv(7, 0x8000, 40 + 256);
    node.feed(packet(Transport::Ud, Operation::SendOnly, 5).deth(QKEY, 0x33), &pattern(64, 1));
    assert_eq!(summary(&node.completions()), vec![(CqKind::Recv, 7, WcStatus::Success, WcOpcode::Recv)]);
    // SQE -> RTS resumes sending (the failed request had taken a PSN; UD
    // receivers do not check PSNs).
    node.qp.modify(&QpAttr { state: QpState::Rts, ..attr() }, AttrMask::STATE).unwrap();
    node.post_send(SendWr::new(4, SendOp::Send).with_sge(sge(0, 64)).with_ud(dest));
    assert_eq!(op_psn_ack_req(&node.transmit()), vec![(Operation::SendOnly, SQ_PSN + 1, false)]);
}

/// What a driver needs to batch posts to a busy QP (the threaded engine
/// lets a few wait for an ACK on its way): whether one is coming, over how
/// many unacknowledged PSNs, and how many packets are posted but unsent.
#[test]
fn a_requester_says_when_an_ack_is_on_its_way_and_what_waits_to_be_sent() {
    let (mut node, _) = requester(attr(), 32 * MTU);
    assert_eq!(node.qp.unacked_awaiting_ack(), None, "nothing sent");
    node.post_send(write(1, 10 * MTU as u32));
    node.post_send(write(2, 3 * MTU as u32));
    assert_eq!(node.qp.unsent_packets(100), 13);
    assert_eq!(node.qp.unsent_packets(5), 5, "counted only as far as asked");
    let sent = node.transmit();
    assert_eq!(sent.len(), 13);
    assert_eq!(node.qp.unsent_packets(100), 0);
    // Both WRITEs' last packets asked for an ACK.
    assert_eq!(node.qp.unacked_awaiting_ack(), Some(13));
    node.feed(ack(SQ_PSN + 9), &[]);
    assert_eq!(node.qp.unacked_awaiting_ack(), Some(3), "WRITE 2's ACK is still coming");
    node.post_send(read(3, 0, 4 * MTU as u32));
    assert_eq!(node.qp.unsent_packets(100), 1, "a READ is one request packet");
    node.feed(ack(SQ_PSN + 12), &[]);
    assert_eq!(node.qp.unacked_awaiting_ack(), None, "everything asked for is acknowledged");
}
