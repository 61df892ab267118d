//! The verbs API end to end over loopback UDP: two devices, one RC QP each.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softroce::transport::{Access, QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use softroce::verbs::*;

#[test]
fn rc_verbs_over_loopback() {
    let (ip_a, ip_b) = (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
    let options = ContextOptions {
        port: softroce::net::udp::free_port(&[ip_a, ip_b]).unwrap(),
        busy_poll: false,
        ..ContextOptions::default()
    };
    let dev_a = Device::custom("test_a", vec![ip_a], [2, 0, 0, 0, 0, 1], 65536);
    let dev_b = Device::custom("test_b", vec![ip_b], [2, 0, 0, 0, 0, 2], 65536);
    let (ctx_a, ctx_b) = (Context::open(&dev_a, options.clone()).unwrap(), Context::open(&dev_b, options).unwrap());
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let (mr_a, mr_b) = (pd_a.alloc_mr(1 << 20, access).unwrap(), pd_b.alloc_mr(1 << 20, access).unwrap());
    let (cq_a, cq_b) = (ctx_a.create_cq(64, None).unwrap(), ctx_b.create_cq(64, None).unwrap());
    let qp_a = pd_a.create_qp(QpType::Rc, &cq_a).build().unwrap();
    let qp_b = pd_b.create_qp(QpType::Rc, &cq_b).build().unwrap();
    let (ep_a, ep_b) = (qp_a.endpoint(1).unwrap(), qp_b.endpoint(1).unwrap());
    assert_eq!(ep_a.gid.to_ip(), ip_a);
    let opts = ConnectOptions { access, max_rd_atomic: 4, max_dest_rd_atomic: 4, ..ConnectOptions::default() };
    qp_a.connect(&ep_b, &opts).unwrap();
    qp_b.connect(&ep_a, &opts).unwrap();

    let msg: Vec<u8> = (0..100_000u32).map(|i| (i * 13 % 256) as u8).collect();
    mr_a.write(0, &msg).unwrap();
    qp_b.post_recv(RecvWr { wr_id: 77, sg_list: softroce::sg_list![mr_b.sge(0, msg.len())] }).unwrap();
    qp_a.post_send(SendWr::new(1, SendOp::SendWithImm(0xabcd)).with_sge(mr_a.sge(0, msg.len()))).unwrap();
    let write = SendOp::RdmaWrite { remote_addr: mr_b.addr() + 200_000, rkey: mr_b.rkey() };
    qp_a.post_send(SendWr::new(2, write).with_sge(mr_a.sge(0, msg.len()))).unwrap();
    let read = SendOp::RdmaRead { remote_addr: mr_b.addr() + 200_000, rkey: mr_b.rkey() };
    qp_a.post_send(SendWr::new(3, read).with_sge(mr_a.sge(400_000, msg.len()))).unwrap();
    mr_b.write(800_000, &40u64.to_ne_bytes()).unwrap();
    let fadd = SendOp::FetchAdd { remote_addr: mr_b.addr() + 800_000, rkey: mr_b.rkey(), add: 2 };
    qp_a.post_send(SendWr::new(4, fadd).with_sge(mr_a.sge(600_000, 8))).unwrap();

    let mut got = Vec::new();
    while got.len() < 4 {
        let wc = cq_a.wait_one(Duration::from_secs(10)).expect("send completion");
        got.push(wc);
    }
    let ids: Vec<(u64, WcStatus)> = got.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    assert_eq!(
        ids,
        vec![(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success), (4, WcStatus::Success)]
    );
    let recv = cq_b.wait_one(Duration::from_secs(10)).expect("receive completion");
    assert_eq!(
        (recv.wr_id, recv.opcode, recv.byte_len, recv.imm),
        (77, WcOpcode::Recv, msg.len() as u32, Some(0xabcd))
    );

    let mut buf = vec![0u8; msg.len()];
    mr_b.read(0, &mut buf).unwrap();
    assert_eq!(buf, msg);
    mr_b.read(200_000, &mut buf).unwrap();
    assert_eq!(buf, msg);
    mr_a.read(400_000, &mut buf).unwrap();
    assert_eq!(buf, msg);
    assert_eq!(mr_b.load_u64(800_000).unwrap(), 42);
    assert_eq!(mr_a.load_u64(600_000).unwrap(), 40);
    let counters = ctx_a.counters();
    assert!(counters.qp.sent_packets > 50 && counters.link.icrc_errors == 0, "{counters:?}");
}
