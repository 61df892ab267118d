//! `ibv_resize_cq` over loopback UDP (rxe-spec V-20).

use crate::support::verbs::*;
use softroce::transport::{Mtu, QpType, SendOp, SendWr};

#[test]
fn a_resized_cq_keeps_its_completions_in_order_and_refuses_to_shrink_below_them() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let cq = pair.a.ctx.create_cq(3, None).unwrap();
    let qp = pair.a.pd.create_qp(QpType::Rc, &cq).build().unwrap();
    let peer = pair.b.qp(QpType::Rc);
    connect(&qp, &peer, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
    cq.resize(1).unwrap();
    assert_eq!(cq.capacity(), 1);
    cq.resize(8).unwrap();
    let write = |id| SendWr::new(id, SendOp::RdmaWrite { remote_addr: pair.mr_b.addr(), rkey: pair.mr_b.rkey() });
    for id in 0..5 {
        qp.post_send(write(id).with_sge(pair.mr_a.sge(0, 64))).unwrap();
    }
    wait_for("five completions queued", || cq.len() == 5);
    // Shrinking below what is queued fails and changes nothing.
    assert!(cq.resize(4).is_err());
    assert_eq!(cq.capacity(), 8);
    cq.resize(5).unwrap();
    let ids: Vec<u64> = (0..5).map(|_| next_wc(&cq).wr_id).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    assert!(cq.resize(0).is_err(), "no CQ of 0 entries");
}
