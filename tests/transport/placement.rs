//! Memory windows, ATOMIC WRITE and FLUSH over the simulated network, with
//! and without faults (rxe-spec V-16, V-17, V-21): the window's key reaches
//! its range, a SEND with invalidate ends it, and every request executes
//! exactly once however the network loses, duplicates and reorders.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softroce::engine::SimWorld;
use softroce::net::{Faults, SimNet};
use softroce::transport::*;
use softroce::wire::Psn;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
const KEY_A: u32 = 1;
const KEY_B: u32 = 2;
const BASE_A: u64 = 0x10000;
const BASE_B: u64 = 0x20000;
/// The window on B: 4 KiB from here.
const WINDOW_AT: u64 = BASE_B + 0x1000;

fn world(faults: Faults, seed: u64) -> SimWorld {
    let mut w = SimWorld::new(SimNet::new(seed, Faults { latency: Duration::from_micros(5), ..faults }));
    w.add_host(A).unwrap();
    w.add_host(B).unwrap();
    w.create_qp(0, QPN_A, QpType::Rc, QpCap::default(), None);
    w.create_qp(1, QPN_B, QpType::Rc, QpCap::default(), None);
    w.register(0, KEY_A, BASE_A, 1 << 16, Access::LOCAL_WRITE);
    // B's region grants no remote right of its own: the window does.
    w.register(1, KEY_B, BASE_B, 1 << 16, Access::LOCAL_WRITE | Access::MW_BIND | Access::FLUSH_GLOBAL);
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
    w.connect((0, QPN_A), (1, QPN_B), &attr, (Psn::new(0xff_fff0), Psn::new(100))).unwrap();
    w
}

fn sge(addr: u64, length: u32) -> Sge {
    Sge { addr, length, lkey: KEY_A }
}

/// B binds a type 2 window over its region through its QP; returns the key.
fn bind(w: &mut SimWorld) -> u32 {
    let old = w.hosts[1].mem.windows_mut().alloc(softroce::engine::PD, WindowType::Type2, || 0x3456_7800);
    let bind = MwBind {
        mw_rkey: old,
        rkey: old + 1,
        mr_lkey: KEY_B,
        addr: WINDOW_AT,
        length: 0x1000,
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC | Access::FLUSH_GLOBAL,
    };
    w.hosts[1].qp(QPN_B).post_send(SendWr::new(9, SendOp::BindMw(bind))).unwrap();
    old + 1
}

fn run(faults: Faults, seed: u64) {
    let mut w = world(faults, seed);
    let rkey = bind(&mut w);
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 1) as u8).collect();
    w.hosts[0].mem.region_mut(KEY_A).unwrap().data[..3000].copy_from_slice(&data);
    w.hosts[0].mem.region_mut(KEY_A).unwrap().data[0x8000..0x8008].copy_from_slice(&40u64.to_ne_bytes());
    let qp = w.hosts[0].qp(QPN_A);
    // A WRITE of 3000 bytes through the window, an ATOMIC WRITE of 40 and a
    // FETCH_ADD of 2 on one word of it (42 only if each ran once, in
    // order), a FLUSH of what was written, a READ back.
    let write = SendOp::RdmaWrite { remote_addr: WINDOW_AT, rkey };
    qp.post_send(SendWr::new(1, write).with_sge(sge(BASE_A, 3000))).unwrap();
    let word = WINDOW_AT + 0x800;
    let atomic_write = SendOp::AtomicWrite { remote_addr: word, rkey };
    qp.post_send(SendWr::new(2, atomic_write).with_sge(sge(BASE_A + 0x8000, 8))).unwrap();
    let add = SendOp::FetchAdd { remote_addr: word, rkey, add: 2 };
    qp.post_send(SendWr::new(3, add).with_sge(sge(BASE_A + 0x8008, 8))).unwrap();
    let flush = SendOp::Flush {
        remote_addr: WINDOW_AT,
        rkey,
        len: 3000,
        whole_region: false,
        placement: FlushPlacement::Global,
    };
    qp.post_send(SendWr::new(4, flush)).unwrap();
    let read = SendOp::RdmaRead { remote_addr: WINDOW_AT, rkey };
    qp.post_send(SendWr::new(5, read).with_sge(sge(BASE_A + 0x4000, 3000))).unwrap();
    // Then a SEND with invalidate ends the window, and a WRITE through it fails.
    w.hosts[1]
        .qp(QPN_B)
        .post_recv(RecvWr { wr_id: 7, sg_list: softroce::sg_list![Sge { addr: BASE_B, length: 64, lkey: KEY_B }] })
        .unwrap();
    // Fenced: it waits for the READ's responses, which a retry could not
    // get once the window is gone (the fence is for exactly this).
    let mut invalidate = SendWr::new(6, SendOp::SendWithInv(rkey)).with_sge(sge(BASE_A, 16));
    invalidate.flags.fence = true;
    w.hosts[0].qp(QPN_A).post_send(invalidate).unwrap();
    // The WRITE after it goes once all is done: its NAK moves B to ERR,
    // and a READ whose responses were lost before could not be asked again.
    let done = w.run_until(Duration::from_secs(60), |w| w.hosts[0].completions.len() == 6);
    assert!(done, "seed {seed}: {:?}", w.hosts[0].completions);
    w.hosts[0].qp(QPN_A).post_send(SendWr::new(8, write).with_sge(sge(BASE_A, 16))).unwrap();
    let done = w.run_until(Duration::from_secs(60), |w| w.hosts[0].completions.len() == 7);
    let seen: Vec<(u64, WcStatus, WcOpcode)> =
        w.hosts[0].completions.iter().map(|(_, _, wc)| (wc.wr_id, wc.status, wc.opcode)).collect();
    assert!(done, "seed {seed}: {seen:?}");
    use WcOpcode::*;
    let ok = WcStatus::Success;
    // A lost NAK is never resent (B is in ERR): the WRITE then runs out of
    // retries instead. Either way it fails.
    let mut seen = seen;
    if let Some(last) = seen.last_mut().filter(|l| l.0 == 8 && l.1 == WcStatus::RetryExcErr) {
        last.1 = WcStatus::RemAccessErr;
    }
    let expected = [
        (1, ok, RdmaWrite),
        (2, ok, AtomicWrite),
        (3, ok, FetchAdd),
        (4, ok, Flush),
        (5, ok, RdmaRead),
        (6, ok, Send),
        (8, WcStatus::RemAccessErr, RdmaWrite),
    ];
    assert_eq!(seen, expected, "seed {seed}");
    let b = &w.hosts[1].mem.region(KEY_B).unwrap().data;
    let at = (WINDOW_AT - BASE_B) as usize;
    let mut want = data.clone();
    want[0x800..0x808].copy_from_slice(&42u64.to_ne_bytes());
    assert_eq!(&b[at..at + 3000], &want[..], "seed {seed}: B's window");
    let a = &w.hosts[0].mem.region(KEY_A).unwrap().data;
    assert_eq!(&a[0x4000..0x4000 + 3000], &want[..], "seed {seed}: the READ");
    assert_eq!(a[0x8008..0x8010], 40u64.to_ne_bytes(), "seed {seed}: FETCH_ADD found the ATOMIC WRITE's value");
    let recv: Vec<(u64, Option<u32>)> = w.hosts[1]
        .completions
        .iter()
        .filter(|(_, kind, _)| *kind == CqKind::Recv)
        .map(|(_, _, wc)| (wc.wr_id, wc.invalidated_rkey))
        .collect();
    assert_eq!(recv.first(), Some(&(7, Some(rkey))), "seed {seed}");
}

#[test]
fn windows_atomic_writes_and_flushes_without_faults() {
    run(Faults::default(), 1);
}

#[test]
fn windows_atomic_writes_and_flushes_execute_once_on_a_hostile_network() {
    let faults = Faults {
        drop: 0.1,
        duplicate: 0.1,
        reorder: 0.2,
        reorder_delay: Duration::from_micros(200),
        corrupt: 0.02,
        ..Faults::default()
    };
    for seed in 0..40 {
        run(faults, seed);
    }
}
