//! First end-to-end checks of the transport over the simulated network.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softroce::engine::SimWorld;
use softroce::net::{Faults, SimNet};
use softroce::transport::*;
use softroce::wire::Psn;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const ALL: Access = Access::LOCAL_WRITE;

fn world(faults: Faults, seed: u64) -> SimWorld {
    let mut w = SimWorld::new(SimNet::new(seed, Faults { latency: Duration::from_micros(5), ..faults }));
    w.add_host(A).unwrap();
    w.add_host(B).unwrap();
    w.create_qp(0, 0x11, QpType::Rc, QpCap::default(), None);
    w.create_qp(1, 0x22, QpType::Rc, QpCap::default(), None);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    w.register(0, 1, 0x10000, 1 << 20, access);
    w.register(1, 2, 0x20000, 1 << 20, access);
    let attr = QpAttr {
        access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        path_mtu: Mtu::Mtu1024,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    };
    w.connect((0, 0x11), (1, 0x22), &attr, (Psn::new(0xff_fff0), Psn::new(100))).unwrap();
    let _ = ALL;
    w
}

fn fill(w: &mut SimWorld, h: usize, key: u32, at: usize, data: &[u8]) {
    w.hosts[h].mem.region_mut(key).unwrap().data[at..at + data.len()].copy_from_slice(data);
}

fn bytes(w: &SimWorld, h: usize, key: u32, at: usize, len: usize) -> Vec<u8> {
    w.hosts[h].mem.region(key).unwrap().data[at..at + len].to_vec()
}

fn run_ops(faults: Faults, seed: u64) {
    let mut w = world(faults, seed);
    let msg: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
    fill(&mut w, 0, 1, 0, &msg);
    // SEND 5000 bytes into a posted receive.
    w.hosts[1]
        .qp(0x22)
        .post_recv(RecvWr {
            wr_id: 7,
            sg_list: softroce::sg_list![Sge { addr: 0x20000 + 0x8000, length: 8192, lkey: 2 }],
        })
        .unwrap();
    let sge = Sge { addr: 0x10000, length: 5000, lkey: 1 };
    w.hosts[0].qp(0x11).post_send(SendWr::new(1, SendOp::Send).with_sge(sge)).unwrap();
    // WRITE the same bytes to B at 0x20000.
    w.hosts[0]
        .qp(0x11)
        .post_send(SendWr::new(2, SendOp::RdmaWrite { remote_addr: 0x20000, rkey: 2 }).with_sge(sge))
        .unwrap();
    // READ them back into A at 0x10000 + 0x4000.
    let dst = Sge { addr: 0x10000 + 0x4000, length: 5000, lkey: 1 };
    w.hosts[0]
        .qp(0x11)
        .post_send(SendWr::new(3, SendOp::RdmaRead { remote_addr: 0x20000, rkey: 2 }).with_sge(dst))
        .unwrap();
    // FETCH_ADD twice on B's word at 0x20000 + 0x10000.
    for i in 0..2 {
        let res = Sge { addr: 0x10000 + 0x9000 + 8 * i, length: 8, lkey: 1 };
        w.hosts[0]
            .qp(0x11)
            .post_send(SendWr::new(4 + i, SendOp::FetchAdd { remote_addr: 0x30000, rkey: 2, add: 5 }).with_sge(res))
            .unwrap();
    }
    let done = w
        .run_until(Duration::from_secs(60), |w| w.hosts[0].completions.len() == 5 && w.hosts[1].completions.len() == 1);
    assert!(done, "seed {seed}: completions A {:?} B {:?}", w.hosts[0].completions, w.hosts[1].completions);
    let ids: Vec<u64> = w.hosts[0].completions.iter().map(|(_, _, wc)| wc.wr_id).collect();
    assert_eq!(ids, vec![1, 2, 3, 4, 5], "seed {seed}");
    assert!(
        w.hosts[0].completions.iter().all(|(_, _, wc)| wc.status == WcStatus::Success),
        "seed {seed}: {:?}",
        w.hosts[0].completions
    );
    let (_, cq, wc) = w.hosts[1].completions[0];
    assert_eq!((cq, wc.wr_id, wc.status, wc.byte_len), (CqKind::Recv, 7, WcStatus::Success, 5000));
    assert_eq!(bytes(&w, 1, 2, 0x8000, 5000), msg);
    assert_eq!(bytes(&w, 1, 2, 0, 5000), msg);
    assert_eq!(bytes(&w, 0, 1, 0x4000, 5000), msg);
    assert_eq!(bytes(&w, 1, 2, 0x10000, 8), 10u64.to_ne_bytes());
    assert_eq!(bytes(&w, 0, 1, 0x9000, 8), 0u64.to_ne_bytes());
    assert_eq!(bytes(&w, 0, 1, 0x9008, 8), 5u64.to_ne_bytes());
}

#[test]
fn rc_operations_without_faults() {
    run_ops(Faults::default(), 1);
}

#[test]
fn rc_operations_with_faults() {
    for seed in 0..200 {
        run_ops(Faults { drop: 0.1, duplicate: 0.1, reorder: 0.1, corrupt: 0.1, ..Faults::default() }, seed);
    }
}

#[test]
fn faults_really_happen() {
    let mut w = world(Faults { drop: 0.1, duplicate: 0.1, reorder: 0.1, corrupt: 0.1, ..Faults::default() }, 3);
    let sge = Sge { addr: 0x10000, length: 60000, lkey: 1 };
    for i in 0..20 {
        w.hosts[0]
            .qp(0x11)
            .post_send(SendWr::new(i, SendOp::RdmaWrite { remote_addr: 0x20000, rkey: 2 }).with_sge(sge))
            .unwrap();
    }
    assert!(w.run_until(Duration::from_secs(60), |w| w.hosts[0].completions.len() == 20));
    let s = w.net.stats().clone();
    let c = *w.hosts[0].qps[&0x11].counters();
    eprintln!(
        "net {s:?}\nA {c:?}\nB {:?}\nlink {:?}",
        w.hosts[1].qps[&0x22].counters(),
        softroce::net::Link::stats(&w.net)
    );
    assert!(s.dropped > 0 && s.corrupted > 0 && c.retries > 0);
}
