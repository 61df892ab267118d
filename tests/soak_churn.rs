//! The churn soak (rxe-spec/security.md): sixteen RC connections over two
//! loopback contexts carry mixed traffic, checked byte for byte, while QPs,
//! regions, CQs and a third context come and go — gracefully and in the
//! middle of traffic with timers running. At the end every destroyed QP
//! number and a sample of dead R_Keys are probed from the network, and once
//! the contexts are gone the process has exactly the threads and file
//! descriptors it started with.
//!
//! It runs for [`RUN`]: `cargo test --test soak_churn -- --ignored` (CI does).

mod support;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softroce::transport::{
    Mtu, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use softroce::verbs::{
    AckTimeout, CompletionQueue, ConnectOptions, Context, ContextOptions, Device, DeviceCounters, MemoryRegion,
    QueuePair,
};
use softroce::wire::{NakCode, Operation, Syndrome};
use support::fake_peer::FakePeer;
use support::qp::{rc, Build};
use support::verbs::{connect, free_port, options, wait_for, Node, ALL_ACCESS, IP_A, IP_B, LINK_MTU, WAIT};
use support::{pattern, Rng};

/// How long the churn goes on.
const RUN: Duration = Duration::from_secs(20);
const CONNECTIONS: usize = 16;
/// The third context, opened and killed every round.
const IP_C: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4));
/// Where the final probes come from.
const PROBE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 5));

/// Each region of a connection: what goes where.
const MR_LEN: usize = 64 * 1024;
const SEND_AT: usize = 0;
const SEND_MAX: usize = 8192;
const WRITE_AT: usize = 8192;
const WRITE_MAX: usize = 16384;
const READ_AT: usize = 32768;
const ATOMIC_AT: usize = MR_LEN - 8;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn signaled(wr_id: u64, op: SendOp) -> SendWr {
    SendWr { flags: SendFlags { signaled: true, ..SendFlags::default() }, ..SendWr::new(wr_id, op) }
}

fn random_mtu(rng: &mut Rng) -> Mtu {
    [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096][(rng.next_u32() % 5) as usize]
}

/// What a connection's round must produce.
struct Work {
    send: Vec<u8>,
    write: Vec<u8>,
}

/// Two connected RC QPs, A requester and B responder, with CQs and regions of their own.
struct Connection {
    qp_a: QueuePair,
    qp_b: QueuePair,
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    mr_a: MemoryRegion,
    mr_b: MemoryRegion,
    rounds: u64,
}

impl Connection {
    fn new(a: &Node, b: &Node, rng: &mut Rng) -> Connection {
        let (cq_a, cq_b) =
            (a.ctx.create_cq(64, Some(&a.channel)).unwrap(), b.ctx.create_cq(64, Some(&b.channel)).unwrap());
        let qp_a = a.pd.create_qp(QpType::Rc, &cq_a).build().unwrap();
        let qp_b = b.pd.create_qp(QpType::Rc, &cq_b).build().unwrap();
        let options = options(random_mtu(rng));
        connect(&qp_a, &qp_b, &options, &options);
        let (mr_a, mr_b) = (a.mr(MR_LEN), b.mr(MR_LEN));
        Connection { qp_a, qp_b, cq_a, cq_b, mr_a, mr_b, rounds: 0 }
    }

    /// Posts a round: a SEND, a WRITE, a READ of what was written and a
    /// FETCH_ADD of the round counter, with fresh data and sizes.
    fn start(&mut self, rng: &mut Rng) -> Work {
        let seed = rng.next_u32();
        let send = pattern(rng.next_u32() as usize % SEND_MAX, seed);
        let write = pattern(1 + rng.next_u32() as usize % WRITE_MAX, seed ^ 1);
        self.mr_a.write(SEND_AT, &send).unwrap();
        self.mr_a.write(WRITE_AT, &write).unwrap();
        self.cq_a.req_notify(false);
        self.cq_b.req_notify(false);
        self.qp_b
            .post_recv(RecvWr { wr_id: self.rounds, sg_list: softroce::sg_list![self.mr_b.sge(SEND_AT, SEND_MAX)] })
            .unwrap();
        let (remote, rkey) = (self.mr_b.addr(), self.mr_b.rkey());
        let wrs = [
            signaled(1, SendOp::Send).with_sge(self.mr_a.sge(SEND_AT, send.len())),
            signaled(2, SendOp::RdmaWrite { remote_addr: remote + WRITE_AT as u64, rkey })
                .with_sge(self.mr_a.sge(WRITE_AT, write.len())),
            signaled(3, SendOp::RdmaRead { remote_addr: remote + WRITE_AT as u64, rkey })
                .with_sge(self.mr_a.sge(READ_AT, write.len())),
            signaled(4, SendOp::FetchAdd { remote_addr: remote + ATOMIC_AT as u64, rkey, add: 1 })
                .with_sge(self.mr_a.sge(ATOMIC_AT, 8)),
        ];
        for wr in wrs {
            self.qp_a.post_send(wr).unwrap();
        }
        Work { send, write }
    }

    /// Waits for the round's completions and checks every byte.
    fn finish(&mut self, work: Work) {
        let summary = |wc: WorkCompletion| (wc.wr_id, wc.status, wc.opcode);
        let sends: Vec<_> = (0..4).map(|_| summary(self.cq_a.wait_one(WAIT).expect("a send completion"))).collect();
        let expected =
            [(1, WcOpcode::Send), (2, WcOpcode::RdmaWrite), (3, WcOpcode::RdmaRead), (4, WcOpcode::FetchAdd)]
                .map(|(wr_id, opcode)| (wr_id, WcStatus::Success, opcode));
        assert_eq!(sends, expected, "QP {:#x}, round {}", self.qp_a.qpn(), self.rounds);
        let recv = self.cq_b.wait_one(WAIT).expect("a receive completion");
        assert_eq!(
            (recv.wr_id, recv.status, recv.byte_len as usize),
            (self.rounds, WcStatus::Success, work.send.len())
        );
        let bytes = |mr: &MemoryRegion, at, len| {
            let mut out = vec![0u8; len];
            mr.read(at, &mut out).unwrap();
            out
        };
        assert!(bytes(&self.mr_b, SEND_AT, work.send.len()) == work.send, "SEND data");
        assert!(bytes(&self.mr_b, WRITE_AT, work.write.len()) == work.write, "WRITE data");
        assert!(bytes(&self.mr_a, READ_AT, work.write.len()) == work.write, "READ data");
        assert_eq!(self.mr_a.load_u64(ATOMIC_AT).unwrap(), self.rounds, "FETCH_ADD original");
        assert_eq!(self.mr_b.load_u64(ATOMIC_AT).unwrap(), self.rounds + 1, "FETCH_ADD result");
        self.rounds += 1;
    }
}

/// What was destroyed, to probe at the end.
#[derive(Default)]
struct Graveyard {
    qpns_a: Vec<u32>,
    qpns_b: Vec<u32>,
    rkeys_b: Vec<u32>,
    cqs_a: HashSet<u32>,
    cqs_b: HashSet<u32>,
}

impl Graveyard {
    /// Destroys a connection: QPs first (in the middle of its traffic, if any),
    /// or CQs first, while the QPs still point at them.
    fn bury(&mut self, connection: Connection, cqs_first: bool, a: &Node, b: &Node) {
        let Connection { qp_a, qp_b, cq_a, cq_b, mr_a, mr_b, .. } = connection;
        self.qpns_a.push(qp_a.qpn());
        self.qpns_b.push(qp_b.qpn());
        self.rkeys_b.push(mr_b.rkey());
        let cqs = (cq_a.id(), cq_b.id());
        if cqs_first {
            drop((cq_a, cq_b));
            drop((qp_a, qp_b));
        } else {
            drop((qp_a, qp_b));
            drop((cq_a, cq_b));
        }
        drop((mr_a, mr_b));
        // Events raised before the CQs went may still wait; after this
        // look, none may name them.
        self.check_events(a, b);
        self.cqs_a.insert(cqs.0);
        self.cqs_b.insert(cqs.1);
    }

    /// Takes the channel events and asynchronous events that wait: no
    /// channel event may name a CQ destroyed before the previous look.
    fn check_events(&self, a: &Node, b: &Node) {
        for (node, dead) in [(a, &self.cqs_a), (b, &self.cqs_b)] {
            while let Some(id) = node.channel.get_event(Duration::ZERO) {
                assert!(!dead.contains(&id), "an event for destroyed CQ {id}");
            }
            while node.ctx.poll_async_event().is_some() {}
        }
    }
}

#[test]
#[ignore = "a 20-second soak; CI runs it with --ignored"]
fn churn_soak() {
    let (threads_before, fds_before) = (threads(), fds());
    let port = free_port(&[IP_A, IP_B, IP_C, PROBE]);
    let context = ContextOptions { port, busy_poll: false, ..ContextOptions::default() };
    let (a, b) = (Node::open("soak_a", IP_A, context.clone()), Node::open("soak_b", IP_B, context.clone()));
    let mut rng = Rng::new(0x50a6);
    let mut graves = Graveyard::default();
    let mut connections: Vec<Connection> = (0..CONNECTIONS).map(|_| Connection::new(&a, &b, &mut rng)).collect();
    let (mut rounds, mut context_churns, mut mr_churns, mut rss) = (0u64, 0u64, 0u64, Vec::new());
    let start = Instant::now();
    while start.elapsed() < RUN {
        // Mixed traffic on every connection at once.
        let work: Vec<Work> = connections.iter_mut().map(|p| p.start(&mut rng)).collect();
        for (connection, work) in connections.iter_mut().zip(work) {
            connection.finish(work);
        }

        // QP churn: one connection replaced gracefully, one in the middle of its
        // traffic (QPs first on even rounds, CQs first on odd ones).
        let k = (rounds as usize) % CONNECTIONS;
        let quiet = std::mem::replace(&mut connections[k], Connection::new(&a, &b, &mut rng));
        graves.bury(quiet, false, &a, &b);
        let k = (k + CONNECTIONS / 2) % CONNECTIONS;
        let mut busy = std::mem::replace(&mut connections[k], Connection::new(&a, &b, &mut rng));
        let _ = busy.start(&mut rng);
        graves.bury(busy, rounds % 2 == 1, &a, &b);

        // MR churn: regions come and go; a WRITE to one just deregistered
        // fails the connection that tries, which is replaced.
        for _ in 0..8 {
            let mr = b.pd.alloc_mr(4096 * (1 + rng.next_u32() as usize % 16), ALL_ACCESS).unwrap();
            graves.rkeys_b.push(mr.rkey());
        }
        let k = (k + 1) % CONNECTIONS;
        let extra = b.mr(4096);
        let (remote, rkey) = (extra.addr(), extra.rkey());
        let write = |wr_id| {
            signaled(wr_id, SendOp::RdmaWrite { remote_addr: remote, rkey }).with_sge(connections[k].mr_a.sge(0, 64))
        };
        connections[k].qp_a.post_send(write(10)).unwrap();
        let wc = connections[k].cq_a.wait_one(WAIT).expect("the WRITE's completion");
        assert_eq!((wc.wr_id, wc.status), (10, WcStatus::Success));
        graves.rkeys_b.push(rkey);
        drop(extra);
        connections[k].qp_a.post_send(write(11)).unwrap();
        let wc = connections[k].cq_a.wait_one(WAIT).expect("the failed WRITE's completion");
        assert_eq!((wc.wr_id, wc.status), (11, WcStatus::RemAccessErr));
        wait_for("the responder to move to ERR", || connections[k].qp_b.state() == QpState::Err);
        let failed = std::mem::replace(&mut connections[k], Connection::new(&a, &b, &mut rng));
        graves.bury(failed, false, &a, &b);
        mr_churns += 1;

        // Context churn: a third context works with A, then dies in the
        // middle of a transfer; A's QP waiting on it runs out of retries.
        churn_a_context(&a, context.clone(), &mut rng, &mut graves);
        context_churns += 1;

        graves.check_events(&a, &b);
        rounds += 1;
        if rounds == 1 || rounds % 16 == 0 {
            rss.push(rss_kib());
        }
    }
    rss.push(rss_kib());
    for connection in connections.drain(..) {
        graves.bury(connection, false, &a, &b);
    }

    // Nothing destroyed is still reachable from the network.
    probe_qpns(&a, port, &graves.qpns_a);
    probe_qpns(&b, port, &graves.qpns_b);
    probe_rkeys(&b, port, &graves.rkeys_b, &mut rng);

    let counters = (a.ctx.counters(), b.ctx.counters());
    drop((a, b));
    // Engine threads are joined when their contexts drop, but the kernel
    // removes an exited thread from /proc/self/task a moment after waking
    // its joiner: give it that moment (the count must still come back).
    let settle = Instant::now() + Duration::from_secs(2);
    while threads() != threads_before && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (threads_after, fds_after) = (threads(), fds());
    eprintln!(
        "churn soak, {:.1?}: {rounds} rounds of {CONNECTIONS} connections, {} QPs and {} regions destroyed, {context_churns} contexts \
         opened and killed, {mr_churns} writes to a dead region; threads {threads_before} -> {threads_after}, fds \
         {fds_before} -> {fds_after}; RSS KiB {rss:?}\nA: {:?}\nB: {:?}",
        start.elapsed(),
        graves.qpns_a.len() + graves.qpns_b.len(),
        graves.rkeys_b.len(),
        counters.0,
        counters.1,
    );
    assert_eq!(threads_after, threads_before, "threads leaked");
    assert_eq!(fds_after, fds_before, "file descriptors leaked");
    assert!(*rss.last().unwrap() < rss[0] + 64 * 1024, "memory grew: RSS KiB {rss:?}");
}

/// Opens a context on [`IP_C`], runs a WRITE and a SEND from it to a QP of
/// A, then drops the whole context with a long WRITE in flight: A's READ
/// from the dead context fails with RETRY_EXC_ERR.
fn churn_a_context(a: &Node, context: ContextOptions, rng: &mut Rng, graves: &mut Graveyard) {
    let device = Device::custom("soak_c", vec![IP_C], [2, 0, 0, 0, 0, 3], LINK_MTU);
    let c = Context::open(&device, context).unwrap();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(64, None).unwrap();
    let qp_c = pd.create_qp(QpType::Rc, &cq).sig_all(true).build().unwrap();
    let mr_c = pd.alloc_mr(1 << 20, ALL_ACCESS).unwrap();
    let qp_a = a.qp(QpType::Rc);
    let mr_a = a.mr(1 << 20);
    let mtu = random_mtu(rng);
    // A finds C dead after 3 timeouts of 16 ms (4.2 ms raised to the floor, rxe-spec T-32).
    let a_options = ConnectOptions { timeout: AckTimeout::from_exponent(10).unwrap(), retry_cnt: 2, ..options(mtu) };
    connect(&qp_a, &qp_c, &a_options, &options(mtu));

    let data = pattern(4096, rng.next_u32());
    mr_c.write(0, &data).unwrap();
    qp_a.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![mr_a.sge(8192, 4096)] }).unwrap();
    qp_c.post_send(
        SendWr::new(1, SendOp::RdmaWrite { remote_addr: mr_a.addr(), rkey: mr_a.rkey() }).with_sge(mr_c.sge(0, 4096)),
    )
    .unwrap();
    qp_c.post_send(SendWr::new(2, SendOp::Send).with_sge(mr_c.sge(0, 4096))).unwrap();
    for wr_id in 1..=2 {
        let wc = cq.wait_one(WAIT).expect("a completion at C");
        assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
    }
    let recv = a.cq.wait_one(WAIT).expect("A's receive");
    assert_eq!((recv.wr_id, recv.status, recv.byte_len), (1, WcStatus::Success, 4096));
    let mut got = vec![0u8; 4096];
    mr_a.read(0, &mut got).unwrap();
    assert!(got == data, "WRITE from C");
    mr_a.read(8192, &mut got).unwrap();
    assert!(got == data, "SEND from C");

    // C dies in the middle of a 1 MiB WRITE to A; then A READs from it.
    qp_c.post_send(
        SendWr::new(3, SendOp::RdmaWrite { remote_addr: mr_a.addr(), rkey: mr_a.rkey() })
            .with_sge(mr_c.sge(0, 1 << 20)),
    )
    .unwrap();
    let read =
        signaled(7, SendOp::RdmaRead { remote_addr: mr_c.addr(), rkey: mr_c.rkey() }).with_sge(mr_a.sge(0, 1 << 20));
    drop((qp_c, mr_c, cq, pd, c));
    qp_a.post_send(read).unwrap();
    let wc = a.cq.wait_one(WAIT).expect("the READ's failure");
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RetryExcErr));
    graves.qpns_a.push(qp_a.qpn());
}

/// Sends a SEND, a WRITE and a READ to each QP number from the network: the
/// context counts every one as a packet for an unknown QP.
fn probe_qpns(node: &Node, port: u16, qpns: &[u32]) {
    let probe = FakePeer::sender(PROBE, port);
    let at = match node.ctx.device().gid(1).unwrap().to_ip() {
        ip @ IpAddr::V4(_) => ip,
        other => panic!("{other}"),
    };
    let before = node.ctx.counters();
    for &qpn in qpns {
        probe.send(at, &rc(Operation::SendOnly, 0).ack_req().qpn(qpn), &[1; 16]);
        probe.send(at, &rc(Operation::WriteOnly, 0).ack_req().reth(0, 0, 16).qpn(qpn), &[2; 16]);
        probe.send(at, &rc(Operation::ReadRequest, 0).ack_req().reth(0, 0, 16).qpn(qpn), &[]);
    }
    let sent = 3 * qpns.len() as u64;
    let deadline = Instant::now() + WAIT;
    // The link's counts are published after each round, the QP lookups' at once.
    let counted =
        |c: DeviceCounters| c.unknown_qp - before.unknown_qp >= sent && c.link.received - before.link.received >= sent;
    while !counted(node.ctx.counters()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = node.ctx.counters();
    let received = after.link.received - before.link.received;
    assert!(
        received >= sent,
        "{received} of {sent} probes received, {} counted as unknown QP: the kernel dropped some (send fewer at a time) \
         or the engine stalled",
        after.unknown_qp - before.unknown_qp
    );
    assert_eq!(after.unknown_qp - before.unknown_qp, sent, "a destroyed QP number still reaches a QP");
    assert_eq!(after.qp.received_packets, before.qp.received_packets);
}

/// WRITEs with dead R_Keys, each from a fresh QP of a fake peer: every one
/// is a remote access error.
fn probe_rkeys(node: &Node, port: u16, rkeys: &[u32], rng: &mut Rng) {
    let peer = FakePeer::bind(PROBE, port);
    let at = node.ctx.device().gid(1).unwrap().to_ip();
    for i in 0..8 {
        let rkey = rkeys[rng.next_u32() as usize % rkeys.len()];
        let qp = node.qp(QpType::Rc);
        qp.connect(&peer.endpoint(0x100 + i, 0), &options(Mtu::Mtu1024)).unwrap();
        peer.send(at, &rc(Operation::WriteOnly, 0).ack_req().reth(0x10_0000, rkey, 16).qpn(qp.qpn()), &[3; 16]);
        let nak = peer.receive(WAIT).expect("an answer");
        assert_eq!((nak.psn(), nak.syndrome()), (0, Syndrome::Nak(NakCode::RemoteAccessError)), "R_Key {rkey:#x}");
    }
}
