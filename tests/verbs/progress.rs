//! Who drives progress: application threads that post or wait move their own
//! packets, and the engine thread takes over whatever they leave — timers
//! they armed, answers they owe, the passive side of a transfer.

use std::time::{Duration, Instant};

use crate::support::pattern;
use crate::support::roce::{bth, Build};
use crate::support::verbs::*;
use softroce::net::udp::UdpLink;
use softroce::net::{Link, Outgoing};
use softroce::transport::{Mtu, QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use softroce::verbs::{AckTimeout, ConnectOptions, ContextOptions, Endpoint, EngineCpus, Gid};
use softroce::wire::{Opcode, Operation, Psn, RoceRepr, Transport};

/// Node A breaks the ICRC of every other packet it sends.
fn lossy_pair() -> NodePair {
    let port = free_port(&[IP_A, IP_B]);
    let lossy = ContextOptions { port, corrupt_icrc_every: 2, ..ContextOptions::default() };
    let a = Node::open("lossy_a", IP_A, lossy);
    let b = Node::open("lossy_b", IP_B, ContextOptions { port, ..ContextOptions::default() });
    // A short ACK timeout: 8.4 ms, which the requester raises to its 16 ms
    // floor (rxe-spec T-32).
    let quick = ConnectOptions { timeout: AckTimeout::from_exponent(11).unwrap(), ..options(Mtu::Mtu1024) };
    NodePair::new((a, b), QpType::Rc, &quick, &quick)
}

#[test]
fn a_timer_armed_by_a_posting_thread_fires_on_the_engine_thread() {
    let p = lossy_pair();
    for wr_id in 0..2 {
        p.qp_b.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![p.mr_b.sge(0, 64)] }).unwrap();
    }
    // The first SEND arrives; the second is dropped by B for its ICRC. The
    // posting thread then never touches A again: only A's engine thread can
    // retransmit when the timer it did not arm expires.
    for wr_id in 0..2 {
        p.qp_a.post_send(SendWr::new(wr_id, SendOp::Send).with_sge(p.mr_a.sge(0, 64))).unwrap();
    }
    for wr_id in 0..2 {
        let wc = next_wc(&p.b.cq);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (wr_id, WcStatus::Success, WcOpcode::Recv));
    }
    let a = p.a.ctx.counters();
    assert!(a.link.corrupted >= 1 && a.qp.timeouts >= 1, "{a:?}");
    assert_eq!(p.b.ctx.counters().link.icrc_errors, a.link.corrupted);
}

#[test]
fn waiters_on_two_cqs_of_one_context_both_get_their_completions() {
    let (a, b) = nodes(false);
    let second_cq = a.ctx.create_cq(64, None).unwrap();
    let qp_1 = a.qp(QpType::Rc);
    let qp_2 = a.pd.create_qp(QpType::Rc, &second_cq).build().unwrap();
    let (peer_1, peer_2) = (b.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&qp_1, &peer_1, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
    connect(&qp_2, &peer_2, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
    let (mr_a, mr_b) = (a.mr(1 << 20), b.mr(1 << 20));
    const ROUNDS: u64 = 200;
    std::thread::scope(|s| {
        // Two threads wait at once: one drives progress, the other is
        // handed its completions (and drives when the first stops).
        for (qp, cq) in [(&qp_1, &a.cq), (&qp_2, &second_cq)] {
            let (mr_a, mr_b) = (&mr_a, &mr_b);
            s.spawn(move || {
                for i in 0..ROUNDS {
                    let op = SendOp::RdmaWrite { remote_addr: mr_b.addr(), rkey: mr_b.rkey() };
                    let mut wr = SendWr::new(i, op).with_sge(mr_a.sge(0, 64 << 10));
                    wr.flags.signaled = true;
                    qp.post_send(wr).unwrap();
                    let wc = cq.wait_one(WAIT).expect("a completion");
                    assert_eq!((wc.wr_id, wc.status, wc.qp_num), (i, WcStatus::Success, qp.qpn()));
                }
            });
        }
    });
    assert!(a.cq.poll_one().is_none() && second_cq.poll_one().is_none());
}

#[test]
fn a_wait_that_finds_nothing_returns_at_its_deadline() {
    let (a, _b) = nodes(false);
    let start = Instant::now();
    assert!(a.cq.wait_one(Duration::ZERO).is_none());
    assert!(a.cq.wait_one(Duration::from_millis(30)).is_none());
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(30) && waited < WAIT, "{waited:?}");
}

/// A thread that waited for its completion and went elsewhere leaves the
/// device to its engine. The ACK its wait owed, left for its next post to
/// carry, goes without that post: the engine, asleep since before the
/// wait, is rung as the wait ends (it was not, and the ACK waited for its
/// next look, 100 ms on, past the peer's 67 ms ACK timeout: a resend). And
/// the peer's next SEND is acknowledged once the handover is out, with
/// nobody on this side calling in.
#[test]
fn the_engine_takes_over_once_a_waiting_thread_has_gone() {
    let p = NodePair::connected(QpType::Rc, &options(Mtu::Mtu1024));
    for wr_id in 0..2 {
        p.qp_b.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![p.mr_b.sge(0, 64)] }).unwrap();
    }
    let send = |wr_id| p.qp_a.post_send(SendWr::new(wr_id, SendOp::Send).with_sge(p.mr_a.sge(0, 64))).unwrap();
    send(0);
    // B's thread waits for the first SEND, then never touches B again.
    assert_eq!(next_wc(&p.b.cq).status, WcStatus::Success);
    assert_eq!(next_wc(&p.a.cq).wr_id, 0);
    let start = Instant::now();
    send(1);
    // Its completion needs B's ACK, which only B's engine can send now.
    let wc = next_wc(&p.a.cq);
    let took = start.elapsed();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    assert!(took < Duration::from_millis(50), "the ACK took {took:?}");
    let counters = p.a.ctx.counters();
    assert_eq!(counters.qp.retries, 0, "{counters:?} {:?}", p.b.ctx.counters());
}

/// Four QPs stream WRITEs into a peer whose socket holds what a non-root
/// process gets on many distributions (`net.core.rmem_max` 212992, which
/// the kernel doubles): the engine splits the peer's buffer among the QPs
/// with packets in flight and each window fits its share (rxe-spec T-7), so
/// the data arrives whole with a go-back or three at the start. Windows that
/// ignore the buffer cost about a hundred here, and windows that each take
/// the whole buffer several hundred a second.
#[test]
fn qps_streaming_into_a_small_peer_buffer_fit_their_windows_into_it() {
    let port = free_port(&[IP_A, IP_B]);
    let small = ContextOptions { port, socket_buffer: Some(212_992), ..ContextOptions::default() };
    let (a, b) = (Node::open("small_a", IP_A, small.clone()), Node::open("small_b", IP_B, small));
    const QPS: usize = 4;
    const MESSAGE: usize = 256 << 10;
    const MESSAGES: u64 = 128;
    const DEPTH: u64 = 4;
    let (mr_a, mr_b) = (a.mr(MESSAGE), b.mr(QPS * MESSAGE));
    let data = pattern(MESSAGE, 7);
    mr_a.write(0, &data).unwrap();
    let qps: Vec<_> = (0..QPS)
        .map(|_| {
            let (qp, peer) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
            connect(&qp, &peer, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
            (qp, peer)
        })
        .collect();
    let post = |index: usize, wr_id: u64| {
        let op = SendOp::RdmaWrite { remote_addr: mr_b.addr() + (index * MESSAGE) as u64, rkey: mr_b.rkey() };
        qps[index].0.post_send(SendWr::new(wr_id, op).with_sge(mr_a.sge(0, MESSAGE))).unwrap();
    };
    let mut posted = [0u64; QPS];
    for (index, count) in posted.iter_mut().enumerate() {
        for _ in 0..DEPTH {
            post(index, *count);
            *count += 1;
        }
    }
    let mut done = [0u64; QPS];
    while done.iter().any(|&d| d < MESSAGES) {
        let wc = a.cq.wait_one(WAIT).expect("a WRITE completion");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let index = qps.iter().position(|(qp, _)| qp.qpn() == wc.qp_num).expect("one of the QPs");
        assert_eq!(wc.wr_id, done[index]);
        done[index] += 1;
        if posted[index] < MESSAGES {
            post(index, posted[index]);
            posted[index] += 1;
        }
    }
    let written = contents(&mr_b);
    for index in 0..QPS {
        assert!(written[index * MESSAGE..(index + 1) * MESSAGE] == data[..], "QP {index}'s region");
    }
    let sent = a.ctx.counters();
    assert!(sent.qp.retries <= 16, "{} go-backs for {} MiB: {sent:?}", sent.qp.retries, QPS * 32);
}

/// 256 QPs each post four 64 KiB WRITEs at once to a peer whose socket
/// holds 2 MiB (1 MiB asked for, which the kernel doubles): the smallest
/// windows (8 packets each) of the QPs alone come to five times that. The
/// device keeps what it has in flight within the buffer and the QPs take
/// turns (rxe-spec T-7a), so the data arrives whole and nothing overflows
/// the buffer: no QP goes back. With windows alone, every burst overflowed
/// it and the QPs went back thousands of times.
#[test]
fn many_qps_take_turns_at_a_small_peer_buffer_and_none_goes_back() {
    let port = free_port(&[IP_A, IP_B]);
    let small = ContextOptions { port, socket_buffer: Some(1 << 20), ..ContextOptions::default() };
    let (a, b) = (Node::open("turns_a", IP_A, small.clone()), Node::open("turns_b", IP_B, small));
    const QPS: usize = 256;
    const MESSAGE: usize = 64 << 10;
    const PER_QP: usize = 4;
    let cq = a.ctx.create_cq(QPS * PER_QP, None).unwrap();
    let (mr_a, mr_b) = (a.mr(MESSAGE), b.mr(QPS * MESSAGE));
    let data = pattern(MESSAGE, 5);
    // An ACK timeout of a second: a go-back here is a packet lost to the
    // buffer or a QP stopped with nothing asking for its ACK, not an engine
    // thread the host's scheduler kept from running for 67 ms.
    let patient = ConnectOptions { timeout: AckTimeout::from_exponent(18).unwrap(), ..options(Mtu::Mtu4096) };
    mr_a.write(0, &data).unwrap();
    let pairs: Vec<_> = (0..QPS)
        .map(|_| {
            let (qp, peer) = (a.pd.create_qp(QpType::Rc, &cq).build().unwrap(), b.qp(QpType::Rc));
            connect(&qp, &peer, &patient, &patient);
            (qp, peer)
        })
        .collect();
    for (index, (qp, _)) in pairs.iter().enumerate() {
        let op = SendOp::RdmaWrite { remote_addr: mr_b.addr() + (index * MESSAGE) as u64, rkey: mr_b.rkey() };
        for k in 0..PER_QP {
            qp.post_send(SendWr::new((index * PER_QP + k) as u64, op).with_sge(mr_a.sge(0, MESSAGE))).unwrap();
        }
    }
    for _ in 0..QPS * PER_QP {
        let wc = cq.wait_one(WAIT).expect("every WRITE completes");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    let written = contents(&mr_b);
    assert!(written.chunks(MESSAGE).all(|chunk| chunk == data), "every QP's region holds the WRITE");
    let sent = a.ctx.counters();
    assert_eq!(sent.qp.retries, 0, "{sent:?}");
}

#[test]
fn small_writes_posted_one_by_one_to_a_busy_qp_leave_in_batches() {
    let p = NodePair::connected(QpType::Rc, &options(Mtu::Mtu4096));
    const SIZE: usize = 64;
    const MESSAGES: u64 = 4096;
    const DEPTH: u64 = 128;
    const GROUP: u64 = 16;
    let data = pattern(MESSAGES as usize * SIZE, 3);
    p.mr_a.write(0, &data).unwrap();
    // perftest's way: keep DEPTH requests posted, one post each, the last
    // of every GROUP signaled, and refill a group per completion.
    let post_group = |first: u64| {
        for n in first..first + GROUP {
            let op = SendOp::RdmaWrite { remote_addr: p.mr_b.addr() + n * SIZE as u64, rkey: p.mr_b.rkey() };
            let mut wr = SendWr::new(n, op).with_sge(p.mr_a.sge(n as usize * SIZE, SIZE));
            wr.flags.signaled = (n + 1) % GROUP == 0;
            p.qp_a.post_send(wr).unwrap();
        }
    };
    let before = p.a.ctx.counters().link;
    let mut posted = 0;
    while posted < DEPTH {
        post_group(posted);
        posted += GROUP;
    }
    let mut done = 0;
    while done < MESSAGES {
        let wc = next_wc(&p.a.cq);
        assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, done + GROUP - 1), "{wc:?}");
        done += GROUP;
        if posted < MESSAGES {
            post_group(posted);
            posted += GROUP;
        }
    }
    assert!(contents(&p.mr_b)[..data.len()] == data[..]);
    let link = p.a.ctx.counters().link;
    let (sent, batches) = (link.sent - before.sent, link.send_batches - before.send_batches);
    // Each post sent at once would be a system call per packet (as it was):
    // while ACKs are on their way, posts gather into batches.
    assert!(sent >= MESSAGES && sent >= 4 * batches, "{sent} packets in {batches} batches");
}

#[test]
fn a_round_of_packets_asking_for_acks_gets_them_as_it_goes() {
    // The peer is a bare UDP link: its 48 packets leave as one GSO train,
    // which arrives whole, so the device handles them all in one round.
    let port = free_port(&[IP_A, IP_B]);
    let a = Node::open("early_ack", IP_A, ContextOptions { port, ..ContextOptions::default() });
    let mut peer = UdpLink::new(port);
    peer.bind(IP_B).unwrap();
    const PEER_QPN: u32 = 0x4242;
    const PSN: u32 = 0x1000;
    const PACKETS: u32 = 48;
    const MTU: usize = 1024;
    let qp = a.qp(QpType::Rc);
    qp.connect(&Endpoint { qpn: PEER_QPN, psn: Psn::new(PSN), gid: Gid::from_ip(IP_B) }, &options(Mtu::Mtu1024))
        .unwrap();
    let mr = a.mr(PACKETS as usize * MTU);
    let data = pattern(PACKETS as usize * MTU, 5);
    for k in 0..PACKETS {
        let operation = match k {
            0 => Operation::WriteFirst,
            k if k == PACKETS - 1 => Operation::WriteLast,
            _ => Operation::WriteMiddle,
        };
        let opcode = Opcode::new(Transport::Rc, operation).unwrap();
        let mut header = RoceRepr::new(bth(opcode, qp.qpn(), PSN + k));
        if k == 0 {
            header = header.reth(mr.addr(), mr.rkey(), data.len() as u32);
        }
        // An ACK asked for every 12 packets, as a requester does.
        if k % 12 == 11 {
            header = header.ack_req();
        }
        let payload = &data[k as usize * MTU..][..MTU];
        let mut roce = vec![0u8; header.wire_len(MTU)];
        header.emit(&mut roce, payload).unwrap();
        peer.transmit(Duration::ZERO, Outgoing { src: IP_B, dst: IP_A, src_port: port, roce: &mut roce }).unwrap();
    }
    peer.flush();
    assert_eq!(peer.stats().send_batches, 1, "one train");
    let mut acked = Vec::new();
    let deadline = Instant::now() + WAIT;
    let mut buf = vec![0u8; 4096];
    while acked.last() != Some(&(PSN + PACKETS - 1)) && Instant::now() < deadline {
        match peer.receive(Duration::ZERO, &mut buf) {
            Some(r) => acked.push(RoceRepr::parse(&buf[..r.len]).unwrap().header.bth.psn.value()),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    // Each ACK leaves once the packet asking for it is handled, not one for
    // the whole round at its end (the requester's window waits on them).
    assert_eq!(acked, [11, 23, 35, 47].map(|k| PSN + k));
    assert!(contents(&mr) == data);
}

/// 4096 RC QPs between two devices, each with two 64 KiB WRITEs posted at
/// once: 512 MiB wanting to be in flight against an 8 MiB socket buffer.
/// Every WRITE completes without a QP running out of retries, and the data
/// arrives whole (rxe-spec T-7, T-7a).
#[test]
fn four_thousand_busy_qps_all_complete_without_running_out_of_retries() {
    let (a, b) = nodes(false);
    const QPS: usize = 4096;
    const MESSAGE: usize = 64 << 10;
    const PER_QP: usize = 2;
    let cq = a.ctx.create_cq(QPS * PER_QP, None).unwrap();
    let (mr_a, mr_b) = (a.mr(MESSAGE), b.mr(MESSAGE));
    let data = pattern(MESSAGE, 11);
    mr_a.write(0, &data).unwrap();
    let pairs: Vec<_> = (0..QPS)
        .map(|_| {
            let (qp, peer) = (a.pd.create_qp(QpType::Rc, &cq).build().unwrap(), b.qp(QpType::Rc));
            connect(&qp, &peer, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
            (qp, peer)
        })
        .collect();
    for (index, (qp, _)) in pairs.iter().enumerate() {
        for k in 0..PER_QP {
            let op = SendOp::RdmaWrite { remote_addr: mr_b.addr(), rkey: mr_b.rkey() };
            qp.post_send(SendWr::new((index * PER_QP + k) as u64, op).with_sge(mr_a.sge(0, MESSAGE))).unwrap();
        }
    }
    let mut done = vec![0usize; QPS];
    for _ in 0..QPS * PER_QP {
        let wc = cq.wait_one(Duration::from_secs(60)).expect("every WRITE completes");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        done[wc.wr_id as usize / PER_QP] += 1;
    }
    assert!(done.iter().all(|&d| d == PER_QP));
    assert!(contents(&mr_b) == data, "the WRITEs' bytes");
}

/// rxe-spec T-33: B's ACK of A's last SEND is lost (B breaks the ICRC of
/// every other packet it sends); B's program destroys its QP, settles its
/// context and lets it go, as a program that exits does. A resends an ACK
/// timeout later, within the settling, and B's destroyed QP answers it: A's
/// SEND completes. Without the settling the resend finds nobody and A's
/// retries run out (RETRY_EXC_ERR).
#[test]
fn settling_answers_the_resend_of_a_lost_last_ack() {
    let port = free_port(&[IP_A, IP_B]);
    let a = Node::open("settle_a", IP_A, ContextOptions { port, ..ContextOptions::default() });
    let b = Node::open("settle_b", IP_B, ContextOptions { port, corrupt_icrc_every: 2, ..ContextOptions::default() });
    // 67 ms apart, twice: all within the settling's 200 ms.
    let quick =
        ConnectOptions { timeout: AckTimeout::from_exponent(14).unwrap(), retry_cnt: 2, ..options(Mtu::Mtu1024) };
    let NodePair { a, b, qp_a, qp_b, mr_a, mr_b } = NodePair::new((a, b), QpType::Rc, &quick, &quick);
    for wr_id in 0..2 {
        qp_b.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![mr_b.sge(0, 64)] }).unwrap();
    }
    for wr_id in 0..2 {
        qp_a.post_send(SendWr::new(wr_id, SendOp::Send).with_sge(mr_a.sge(0, 64))).unwrap();
        assert_eq!(next_wc(&b.cq).wr_id, wr_id);
        if wr_id == 0 {
            // B's first ACK arrives; its second, of the last SEND, will not.
            let wc = a.cq.wait_one(WAIT).expect("the first SEND completes");
            assert_eq!((wc.wr_id, wc.status), (0, WcStatus::Success));
        }
    }
    drop(qp_b);
    b.ctx.settle(Instant::now() + Duration::from_millis(200));
    let corrupted = b.ctx.counters().link.corrupted;
    drop((b, mr_b));
    let wc = a.cq.wait_one(WAIT).expect("the last SEND completes");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "B's settling answered A's resend");
    assert!(corrupted >= 1 && a.ctx.counters().qp.timeouts >= 1, "the last ACK was lost and resent for");
}

/// The CPUs thread `tid` of this process may run on.
fn cpus_of(tid: libc::pid_t) -> usize {
    // SAFETY: a zeroed cpu_set_t filled by the kernel, passed with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        libc::CPU_COUNT(&set) as usize
    }
}

/// The thread IDs of this process whose name is `name` (cut to the 15
/// bytes the kernel keeps).
fn threads_named(name: &str) -> Vec<libc::pid_t> {
    let name = &name[..name.len().min(15)];
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|task| std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim_end() == name))
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .collect()
}

/// Opens a device with `cpus` from a thread bound to one CPU; returns the
/// CPUs its engine thread may use.
fn engine_cpus_when_opened_on_one_cpu(name: &str, cpus: EngineCpus) -> usize {
    let port = free_port(&[IP_A]);
    let name = name.to_string();
    std::thread::spawn(move || {
        // SAFETY: as in cpus_of; the mask names one CPU this thread has.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            let first = (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &set)).unwrap();
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(first, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
        let node =
            Node::open(&name, IP_A, ContextOptions { port, engine_cpus: Some(cpus), ..ContextOptions::default() });
        let engine = threads_named(&format!("softroce-{name}"));
        assert_eq!(engine.len(), 1, "one engine thread named after {name}");
        let n = cpus_of(engine[0]);
        drop(node);
        n
    })
    .join()
    .unwrap()
}

#[test]
fn the_engine_thread_runs_on_the_devices_cpus_not_the_openers() {
    let process = cpus_of(0);
    if process < 2 {
        eprintln!("one CPU: nothing to widen to");
        return;
    }
    // An MPI rank bound to its core: its device's work may go elsewhere, as
    // kernel rxe's does (rxe-spec T-34).
    assert_eq!(engine_cpus_when_opened_on_one_cpu("cpus_d", EngineCpus::Device), process);
    // Unless asked to stay with the program, as under `taskset` alone.
    assert_eq!(engine_cpus_when_opened_on_one_cpu("cpus_o", EngineCpus::Opener), 1);
}

/// A device on an IPv4 and an IPv6 address (as `softroce run`'s `sr_lo`)
/// has a socket for each; an RC QP's packets all leave from the one its
/// peer's address picks, so whole 4 KiB payloads are lent from the region
/// there too, not copied in twice (rxe-spec T-36).
#[test]
fn a_device_of_two_addresses_sends_rc_payloads_from_registered_memory() {
    let v6: std::net::IpAddr = "::1".parse().unwrap();
    let device = ContextOptions { port: free_port(&[IP_A, IP_B, v6]), ..ContextOptions::default() };
    let a = Node::open_on("two_addrs_a", vec![IP_A, v6], device.clone());
    let b = Node::open("two_addrs_b", IP_B, device);
    let pair = NodePair::new((a, b), QpType::Rc, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
    const LEN: usize = 1 << 20;
    let data = pattern(LEN, 9);
    pair.mr_a.write(0, &data).unwrap();
    let before = pair.a.ctx.counters().link;
    let op = SendOp::RdmaWrite { remote_addr: pair.mr_b.addr(), rkey: pair.mr_b.rkey() };
    pair.qp_a.post_send(SendWr::new(1, op).with_sge(pair.mr_a.sge(0, LEN))).unwrap();
    let wc = next_wc(&pair.a.cq);
    assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, 1), "{wc:?}");
    assert!(contents(&pair.mr_b)[..LEN] == data[..]);
    let link = pair.a.ctx.counters().link;
    let (sent, lent) = (link.sent - before.sent, link.lent - before.lent);
    assert!(lent >= (LEN / 4096) as u64 && lent <= sent, "{lent} of {sent} packets lent");
}
