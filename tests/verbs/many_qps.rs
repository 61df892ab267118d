//! Many QPs on one device (rxe-spec/verbs.md V-15): a round of the engine
//! touches only the QPs with something to do, so idle QPs cost nothing
//! and a QP its application holds stalls no other.

use std::sync::mpsc;

use crate::support::verbs::*;
use softroce::transport::{Mtu, QpType, SendOp, SendWr, WcStatus};
use softroce::verbs::QueuePair;

/// One RDMA WRITE of `len` bytes from the start of `p.mr_a` to `p.mr_b`.
fn write(p: &NodePair, wr_id: u64, len: usize) -> SendWr {
    let op = SendOp::RdmaWrite { remote_addr: p.mr_b.addr(), rkey: p.mr_b.rkey() };
    SendWr::new(wr_id, op).with_sge(p.mr_a.sge(0, len))
}

#[test]
fn a_qp_held_by_its_poster_stalls_no_other_qp_of_the_device() {
    let p = NodePair::connected(QpType::Rc, &options(Mtu::Mtu4096));
    let (held, peer) = (p.a.qp(QpType::Rc), p.b.qp(QpType::Rc));
    connect(&held, &peer, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
    let (holding_tx, holding) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        // `post_send_list` keeps the QP locked while it takes work requests
        // from the list: this list waits to be released before its first.
        let held = &held;
        let poster = s.spawn(move || {
            let list = std::iter::from_fn(|| {
                holding_tx.send(()).unwrap();
                release_rx.recv().ok();
                None
            });
            held.post_send_list(list).unwrap();
        });
        holding.recv().unwrap();
        for wr_id in 0..20 {
            p.qp_a.post_send(write(&p, wr_id, 4096)).unwrap();
            let wc = next_wc(&p.a.cq);
            assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
        }
        release.send(()).unwrap();
        poster.join().unwrap();
    });
}

#[test]
fn two_thousand_qps_with_data_in_flight_all_complete() {
    const QPS: usize = 2048;
    let p = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    let cq_a = p.a.ctx.create_cq(QPS, None).unwrap();
    let cq_b = p.b.ctx.create_cq(QPS, None).unwrap();
    let pairs: Vec<(QueuePair, QueuePair)> = (0..QPS)
        .map(|_| {
            let a = p.a.pd.create_qp(QpType::Rc, &cq_a).build().unwrap();
            let b = p.b.pd.create_qp(QpType::Rc, &cq_b).build().unwrap();
            connect(&a, &b, &options(Mtu::Mtu1024), &options(Mtu::Mtu1024));
            (a, b)
        })
        .collect();
    for (wr_id, (a, _)) in pairs.iter().enumerate() {
        a.post_send(write(&p, wr_id as u64, 4096)).unwrap();
    }
    let mut done = vec![false; QPS];
    for _ in 0..QPS {
        let wc = cq_a.wait_one(WAIT * 4).expect("a completion of every WRITE");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert!(!std::mem::replace(&mut done[wc.wr_id as usize], true), "{wc:?} twice");
    }
}

/// A QP created, connected and posted to while another thread drives the
/// device's progress (here: one spinning on an empty CQ) is sent from at
/// once, though the round under way took in the QP table before the QP
/// existed (it used to drop such a QP from its list and never send).
#[test]
fn a_qp_posted_to_while_another_thread_drives_sends_at_once() {
    let p = NodePair::connected(QpType::Rc, &options(Mtu::Mtu4096));
    let idle_cq = p.a.ctx.create_cq(16, None).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Bounded, so that a failure below ends the test rather than hangs it.
            let until = std::time::Instant::now() + WAIT * 4;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && std::time::Instant::now() < until {
                assert!(idle_cq.poll_one().is_none());
            }
        });
        for wr_id in 0..200 {
            let (a, b) = (p.a.qp(QpType::Rc), p.b.qp(QpType::Rc));
            connect(&a, &b, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
            a.post_send(write(&p, wr_id, 64)).unwrap();
            let wc = next_wc(&p.a.cq);
            assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}
