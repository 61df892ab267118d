//! UD multicast over loopback UDP (rxe-spec V-23): QPs attached to a group
//! each receive what is sent to it, detached ones nothing.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::support::verbs::*;
use softroce::transport::{QpType, RecvWr, SendOp, SendWr, WcStatus, GRH_LEN};
use softroce::verbs::{Gid, QueuePair};
use softroce::wire::BthRepr;

const QKEY: u32 = 0x1111_2222;

fn group(last: u8) -> Gid {
    Gid::from_ip(Ipv4Addr::new(239, 77, 0, last).into())
}

fn ud(node: &Node) -> QueuePair {
    let qp = node.qp(QpType::Ud);
    qp.activate(QKEY).unwrap();
    qp
}

/// Posts a receive on `qp` with room for 64 bytes of message.
fn receive(qp: &QueuePair, wr_id: u64, mr: &softroce::verbs::MemoryRegion) {
    qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![mr.sge(wr_id as usize * 256, GRH_LEN + 64)] }).unwrap();
}

#[test]
fn every_attached_qp_receives_a_send_to_the_group_and_a_detached_one_nothing() {
    let (a, b) = nodes(false);
    let sender = ud(&a);
    let (one, two) = (ud(&b), ud(&b));
    let mr_a = a.mr(4096);
    let mr_b = b.mr(4096);
    let g = group(1);
    one.attach_mcast(g).unwrap();
    two.attach_mcast(g).unwrap();
    one.attach_mcast(g).unwrap(); // twice is nothing
    for (id, qp) in [(1, &one), (2, &two), (3, &one), (4, &two)] {
        receive(qp, id, &mr_b);
    }
    mr_a.write(0, b"to the group").unwrap();
    let dest = a.pd.create_ah(g).ud_dest(BthRepr::MULTICAST_QPN, QKEY);
    let send = |id| SendWr::new(id, SendOp::Send).with_sge(mr_a.sge(0, 12)).with_ud(dest);
    sender.post_send(send(10)).unwrap();
    assert_eq!(next_wc(&a.cq).status, WcStatus::Success);
    let mut got: Vec<(u64, u32)> = (0..2).map(|_| next_wc(&b.cq)).map(|wc| (wc.wr_id, wc.src_qp)).collect();
    got.sort();
    assert_eq!(got, [(1, sender.qpn()), (2, sender.qpn())]);
    let mut text = [0u8; 12];
    mr_b.read(256 + GRH_LEN, &mut text).unwrap();
    assert_eq!(&text, b"to the group");
    // `two` leaves: the next send reaches `one` alone.
    two.detach_mcast(g).unwrap();
    assert!(two.detach_mcast(g).is_err(), "not attached any more");
    sender.post_send(send(11)).unwrap();
    assert_eq!(next_wc(&a.cq).status, WcStatus::Success);
    assert_eq!(next_wc(&b.cq).wr_id, 3);
    std::thread::sleep(Duration::from_millis(100));
    assert_no_wc(&b.cq);
}

#[test]
fn only_ud_qps_join_only_multicast_groups() {
    let (a, _b) = nodes(false);
    let rc = a.qp(QpType::Rc);
    assert!(rc.attach_mcast(group(2)).is_err(), "an RC QP");
    let qp = ud(&a);
    let unicast = Gid::from_ip(Ipv4Addr::new(127, 0, 0, 1).into());
    assert!(qp.attach_mcast(unicast).is_err(), "a unicast GID");
    qp.attach_mcast(group(2)).unwrap();
    // A destroyed QP leaves its groups: the group is free to join again.
    drop(qp);
    let again = ud(&a);
    again.attach_mcast(group(2)).unwrap();
}
