//! `ibv_rereg_mr` and a QP's move to RESET over loopback UDP (rxe-spec
//! V-18, V-19): a region changes in place under its keys, and a reset QP's
//! old completions leave its CQ.

use crate::support::verbs::*;
use softroce::transport::{Access, AttrMask, Mtu, QpAttr, QpState, QpType, RecvWr, SendOp, SendWr, WcStatus};
use softroce::verbs::{QueuePair, Rereg};

fn write_status(pair: &NodePair, len: usize) -> WcStatus {
    let op = SendOp::RdmaWrite { remote_addr: pair.mr_b.addr(), rkey: pair.mr_b.rkey() };
    pair.qp_a.post_send(SendWr::new(1, op).with_sge(pair.mr_a.sge(0, len))).unwrap();
    next_wc(&pair.a.cq).status
}

#[test]
fn a_region_rereg_takes_its_remote_rights_away() {
    let mut pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    assert_eq!(write_status(&pair, 64), WcStatus::Success);
    let keys = (pair.mr_b.lkey(), pair.mr_b.rkey());
    // SAFETY: no new memory.
    unsafe { pair.mr_b.rereg(Rereg { access: Some(Access::LOCAL_WRITE), ..Rereg::default() }) }.unwrap();
    assert_eq!((pair.mr_b.lkey(), pair.mr_b.rkey()), keys);
    assert_eq!(pair.mr_b.access(), Access::LOCAL_WRITE);
    assert_eq!(write_status(&pair, 64), WcStatus::RemAccessErr);
}

#[test]
fn a_region_moved_to_other_memory_or_another_domain_refuses_what_named_the_old() {
    let mut pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let mut other = vec![0u8; 4096];
    // A receive posted on the old bytes fails once the region moves.
    pair.qp_b.post_recv(RecvWr { wr_id: 5, sg_list: softroce::sg_list![pair.mr_b.sge(0, 64)] }).unwrap();
    // SAFETY: `other` outlives the region's use below (the pair is dropped first).
    unsafe { pair.mr_b.rereg(Rereg { memory: Some((other.as_mut_ptr(), other.len())), ..Rereg::default() }) }.unwrap();
    assert_eq!(pair.mr_b.addr(), other.as_ptr() as u64);
    pair.qp_a.post_send(SendWr::new(2, SendOp::Send).with_sge(pair.mr_a.sge(0, 64))).unwrap();
    assert_eq!(next_wc(&pair.a.cq).status, WcStatus::RemOpErr);
    assert_eq!(next_wc(&pair.b.cq).status, WcStatus::LocProtErr);
    // Another domain: B's QP may no longer use it. Bad rereg leaves it be.
    let pd = pair.b.ctx.alloc_pd().unwrap();
    let foreign = pair.a.ctx.alloc_pd().unwrap();
    // SAFETY (both): no new memory.
    assert!(unsafe { pair.mr_b.rereg(Rereg { pd: Some(&foreign), ..Rereg::default() }) }.is_err());
    unsafe { pair.mr_b.rereg(Rereg { pd: Some(&pd), ..Rereg::default() }) }.unwrap();
    let qp_a = pair.a.qp(QpType::Rc);
    let qp_b = pair.b.qp(QpType::Rc);
    connect(&qp_a, &qp_b, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    let op = SendOp::RdmaWrite { remote_addr: pair.mr_b.addr(), rkey: pair.mr_b.rkey() };
    qp_a.post_send(SendWr::new(3, op).with_sge(pair.mr_a.sge(0, 64))).unwrap();
    assert_eq!(next_wc(&pair.a.cq).status, WcStatus::RemAccessErr);
    drop((qp_a, qp_b, pair));
    drop(other);
}

#[test]
fn a_move_to_reset_takes_the_qps_unpolled_completions_off_its_cq() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let other = pair.b.qp(QpType::Rc);
    let move_to = |qp: &QueuePair, state| qp.modify(&QpAttr { state, ..QpAttr::default() }, AttrMask::STATE);
    other.init(&options(Mtu::Mtu1024)).unwrap();
    other.post_recv(RecvWr { wr_id: 9, sg_list: softroce::sg_list![pair.mr_b.sge(0, 64)] }).unwrap();
    pair.qp_b.post_recv(RecvWr { wr_id: 8, sg_list: softroce::sg_list![pair.mr_b.sge(0, 64)] }).unwrap();
    // Both flush into B's CQ; then B's QP is reset, unpolled.
    move_to(&pair.qp_b, QpState::Err).unwrap();
    move_to(&other, QpState::Err).unwrap();
    std::thread::sleep(QUIET * 2);
    move_to(&pair.qp_b, QpState::Reset).unwrap();
    let left = next_wc(&pair.b.cq);
    assert_eq!((left.wr_id, left.qp_num, left.status), (9, other.qpn(), WcStatus::WrFlushErr));
    assert_no_wc(&pair.b.cq);
}
