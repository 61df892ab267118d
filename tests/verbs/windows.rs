//! Memory windows over loopback UDP (rxe-spec/verbs.md V-16, V-17): binds
//! through the send queue, remote access through a window's key with its
//! range and rights only, remote and local invalidation, and what fails.

use crate::support::verbs::*;
use softroce::transport::{
    Access, AsyncEvent, Mtu, QpType, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use softroce::verbs::{MemoryRegion, MemoryWindow, WindowType};

/// Where windows open in B's region, and how long they are.
const AT: u64 = 4096;
const LEN: u64 = 4096;

/// A connected pair, B's region that windows may be bound to, and a window
/// of `kind` in B's domain.
fn setup(kind: WindowType) -> (NodePair, MemoryRegion, MemoryWindow) {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let mr = pair.b.pd.alloc_mr(MR_LEN, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = pair.b.pd.alloc_mw(kind).unwrap();
    (pair, mr, mw)
}

fn wc(wr_id: u64, qpn: u32, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion::new(wr_id, qpn, status, opcode)
}

/// Posts on B a bind of `mw` to bytes `AT..AT + LEN` of `mr` granting
/// `access`, and returns its completion and the window's new key.
fn bind(pair: &NodePair, mr: &MemoryRegion, mw: &MemoryWindow, access: Access) -> (WorkCompletion, u32) {
    let bind = mw.bind_request(Some(mr), mr.addr() + AT, LEN, access);
    pair.qp_b.bind_mw(mw, 7, bind, SendFlags { signaled: true, ..SendFlags::default() }).unwrap();
    (next_wc(&pair.b.cq), bind.rkey)
}

/// Binds as [`bind`] does, which must succeed.
fn bound(pair: &NodePair, mr: &MemoryRegion, mw: &MemoryWindow, access: Access) -> u32 {
    let (done, rkey) = bind(pair, mr, mw, access);
    assert_eq!(done, wc(7, pair.qp_b.qpn(), WcStatus::Success, WcOpcode::BindMw));
    assert_eq!(mw.rkey(), rkey);
    rkey
}

/// A WRITE of A's first `len` bytes to `offset` of B's region through
/// `rkey`: its status.
fn write(pair: &NodePair, mr: &MemoryRegion, rkey: u32, offset: u64, len: usize) -> WcStatus {
    let op = SendOp::RdmaWrite { remote_addr: mr.addr() + offset, rkey };
    pair.qp_a.post_send(SendWr::new(1, op).with_sge(pair.mr_a.sge(0, len))).unwrap();
    next_wc(&pair.a.cq).status
}

#[test]
fn a_type_1_window_opens_its_range_with_its_rights() {
    let (pair, mr, mw) = setup(WindowType::Type1);
    let old = mw.rkey();
    let rkey = bound(&pair, &mr, &mw, Access::REMOTE_WRITE);
    assert_eq!((rkey >> 8, rkey & 0xff), (old >> 8, (old + 1) & 0xff));
    fill(&mr, FILL);
    fill(&pair.mr_a, 0x3c);
    assert_eq!(write(&pair, &mr, rkey, AT, 100), WcStatus::Success);
    assert_holds_only(&mr, AT as usize, &[0x3c; 100]);
    // The region itself grants no remote right: its own key is refused.
    assert_eq!(write(&pair, &mr, mr.rkey(), AT, 100), WcStatus::RemAccessErr);
}

#[test]
fn a_type_1_window_refuses_bytes_past_its_end() {
    let (pair, mr, mw) = setup(WindowType::Type1);
    let rkey = bound(&pair, &mr, &mw, Access::REMOTE_WRITE);
    assert_eq!(write(&pair, &mr, rkey, AT + LEN - 50, 100), WcStatus::RemAccessErr);
    assert_eq!(next_async_event(&pair.b.ctx), AsyncEvent::QpAccessError { qpn: pair.qp_b.qpn() });
}

#[test]
fn a_type_1_window_bound_to_nothing_answers_no_more() {
    let (pair, mr, mw) = setup(WindowType::Type1);
    let rkey = bound(&pair, &mr, &mw, Access::REMOTE_WRITE);
    assert_eq!(write(&pair, &mr, rkey, AT, 8), WcStatus::Success);
    let unbind = mw.bind_request(None, 0, 0, Access::NONE);
    pair.qp_b.post_send(SendWr::new(8, SendOp::BindMw(unbind))).unwrap();
    assert_eq!(next_wc(&pair.b.cq), wc(8, pair.qp_b.qpn(), WcStatus::Success, WcOpcode::BindMw));
    assert_eq!(write(&pair, &mr, rkey, AT, 8), WcStatus::RemAccessErr);
}

#[test]
fn send_with_invalidate_revokes_a_type_2_window() {
    let (pair, mr, mw) = setup(WindowType::Type2);
    let rkey = bound(&pair, &mr, &mw, Access::REMOTE_WRITE);
    assert_eq!(write(&pair, &mr, rkey, AT, 100), WcStatus::Success);
    pair.qp_b.post_recv(RecvWr { wr_id: 5, sg_list: softroce::sg_list![pair.mr_b.sge(0, 64)] }).unwrap();
    let send = SendWr::new(2, SendOp::SendWithInv(rkey)).with_sge(pair.mr_a.sge(0, 10));
    pair.qp_a.post_send(send).unwrap();
    assert_eq!(next_wc(&pair.a.cq).status, WcStatus::Success);
    let recv = next_wc(&pair.b.cq);
    assert_eq!((recv.wr_id, recv.status, recv.invalidated_rkey), (5, WcStatus::Success, Some(rkey)));
    assert_eq!(write(&pair, &mr, rkey, AT, 100), WcStatus::RemAccessErr);
}

#[test]
fn a_local_invalidate_revokes_a_type_2_window_and_frees_it_for_a_bind() {
    let (pair, mr, mw) = setup(WindowType::Type2);
    let rkey = bound(&pair, &mr, &mw, Access::REMOTE_WRITE);
    pair.qp_b.post_send(SendWr::new(3, SendOp::LocalInv(rkey))).unwrap();
    assert_eq!(next_wc(&pair.b.cq), wc(3, pair.qp_b.qpn(), WcStatus::Success, WcOpcode::LocalInv));
    assert_eq!(write(&pair, &mr, rkey, AT, 100), WcStatus::RemAccessErr);
    // Free again: it binds under a new key, through a new connection (the
    // refused WRITE took both QPs to ERR).
    let (qp_a, qp_b) = (pair.a.qp(QpType::Rc), pair.b.qp(QpType::Rc));
    connect(&qp_a, &qp_b, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    let bind = mw.bind_request(Some(&mr), mr.addr() + AT, LEN, Access::REMOTE_READ);
    qp_b.post_send(SendWr::new(9, SendOp::BindMw(bind))).unwrap();
    assert_eq!(next_wc(&pair.b.cq), wc(9, qp_b.qpn(), WcStatus::Success, WcOpcode::BindMw));
    assert_ne!(rkey, bind.rkey);
    let read = SendOp::RdmaRead { remote_addr: mr.addr() + AT, rkey: bind.rkey };
    qp_a.post_send(SendWr::new(4, read).with_sge(pair.mr_a.sge(0, 64))).unwrap();
    assert_eq!(next_wc(&pair.a.cq).status, WcStatus::Success);
}

#[test]
fn a_bind_that_breaks_a_rule_fails_with_mw_bind_err_and_the_qp_with_it() {
    let (pair, _, mw) = setup(WindowType::Type2);
    // C10-73: the region does not allow binding.
    let plain = pair.b.pd.alloc_mr(MR_LEN, Access::LOCAL_WRITE).unwrap();
    let (done, _) = bind(&pair, &plain, &mw, Access::REMOTE_READ);
    assert_eq!(done, wc(7, pair.qp_b.qpn(), WcStatus::MwBindErr, WcOpcode::BindMw));
    assert_eq!(next_async_event(&pair.b.ctx), AsyncEvent::QpFatal { qpn: pair.qp_b.qpn() });
}

#[test]
fn a_type_1_window_is_never_invalidated() {
    let (pair, mr, mw) = setup(WindowType::Type1);
    let rkey = bound(&pair, &mr, &mw, Access::REMOTE_WRITE);
    pair.qp_b.post_send(SendWr::new(3, SendOp::LocalInv(rkey))).unwrap();
    assert_eq!(next_wc(&pair.b.cq), wc(3, pair.qp_b.qpn(), WcStatus::LocQpOpErr, WcOpcode::LocalInv));
}

#[test]
fn a_freed_window_answers_no_more() {
    let (pair, mr, mw) = setup(WindowType::Type2);
    let rkey = bound(&pair, &mr, &mw, Access::REMOTE_WRITE);
    assert_eq!(write(&pair, &mr, rkey, AT, 100), WcStatus::Success);
    drop(mw);
    assert_eq!(write(&pair, &mr, rkey, AT, 100), WcStatus::RemAccessErr);
}

#[test]
fn a_bind_completes_after_the_requests_before_it() {
    let (pair, mr, mw) = setup(WindowType::Type1);
    pair.qp_b.post_recv(RecvWr { wr_id: 5, sg_list: softroce::sg_list![pair.mr_b.sge(0, 4096)] }).unwrap();
    // B sends first, then binds: the bind completes second.
    let send = SendWr::new(1, SendOp::Send).with_sge(pair.mr_b.sge(0, 3000));
    pair.qp_a.post_recv(RecvWr { wr_id: 6, sg_list: softroce::sg_list![pair.mr_a.sge(0, 4096)] }).unwrap();
    let bind = mw.bind_request(Some(&mr), mr.addr() + AT, LEN, Access::REMOTE_READ);
    pair.qp_b.post_send_list([send, SendWr::new(2, SendOp::BindMw(bind))]).unwrap();
    let ids: Vec<(u64, WcOpcode)> = (0..2).map(|_| next_wc(&pair.b.cq)).map(|w| (w.wr_id, w.opcode)).collect();
    assert_eq!(ids, [(1, WcOpcode::Send), (2, WcOpcode::BindMw)]);
}

#[test]
fn a_destroyed_qp_takes_its_type_2_windows_with_it() {
    let (pair, mr, mw) = setup(WindowType::Type2);
    let rkey = bound(&pair, &mr, &mw, Access::REMOTE_WRITE);
    let NodePair { a, b, qp_a, qp_b, mr_a, .. } = pair;
    drop(qp_b);
    // Free again: it binds through another QP.
    let (qp_a2, qp_b2) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&qp_a2, &qp_b2, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    let bind = mw.bind_request(Some(&mr), mr.addr() + AT, LEN, Access::REMOTE_WRITE);
    qp_b2.bind_mw(&mw, 9, bind, SendFlags { signaled: true, ..SendFlags::default() }).unwrap();
    assert_eq!(next_wc(&b.cq), wc(9, qp_b2.qpn(), WcStatus::Success, WcOpcode::BindMw));
    assert_ne!(bind.rkey, rkey);
    let op = SendOp::RdmaWrite { remote_addr: mr.addr() + AT, rkey: bind.rkey };
    qp_a2.post_send(SendWr::new(1, op).with_sge(mr_a.sge(0, 8))).unwrap();
    assert_eq!(next_wc(&a.cq).status, WcStatus::Success);
    drop(qp_a);
}
