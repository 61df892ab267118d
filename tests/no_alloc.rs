//! The steady-state data path allocates nothing: a counting global
//! allocator watches every thread of the process (applications and
//! engines) while two contexts move thousands of packets over loopback UDP.
//! Neither packets, ACKs, completions and the link's batches, nor a work
//! request with one SGE or up to 16 bytes inline (`SgList`, `InlineData`).

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use softroce::transport::{Mtu, QpType, RecvWr, SendOp, SendWr, WcStatus};
use support::verbs::{next_wc, options, NodePair};

/// The system allocator, counting allocations while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: defers to `System` for everything; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is System's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes per message: 64 packets at MTU 4096.
const MESSAGE: usize = 256 << 10;
/// Messages per operation and round.
const MESSAGES: u64 = 100;
/// Allocations a counted round tolerates: far fewer than its hundreds of
/// work requests and thousands of packets.
const SLACK: u64 = 10;

/// Runs `round` once to warm up (buffers, queues and maps reach their
/// steady size), then again counting; returns the allocations and the
/// packets sent by both sides in the counted round.
fn count(pair: &NodePair, mut round: impl FnMut(&NodePair)) -> (u64, u64) {
    round(pair);
    let packets = |p: &NodePair| p.a.ctx.counters().link.sent + p.b.ctx.counters().link.sent;
    let before = packets(pair);
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    round(pair);
    COUNTING.store(false, Ordering::SeqCst);
    (ALLOCATIONS.load(Ordering::SeqCst), packets(pair) - before)
}

fn write_round(p: &NodePair) {
    for i in 0..MESSAGES {
        let op = SendOp::RdmaWrite { remote_addr: p.mr_b.addr(), rkey: p.mr_b.rkey() };
        p.qp_a.post_send(SendWr::new(i, op).with_sge(p.mr_a.sge(0, MESSAGE))).unwrap();
        assert_eq!(next_wc(&p.a.cq).status, WcStatus::Success);
    }
}

fn read_round(p: &NodePair) {
    for i in 0..MESSAGES {
        let op = SendOp::RdmaRead { remote_addr: p.mr_b.addr(), rkey: p.mr_b.rkey() };
        p.qp_a.post_send(SendWr::new(i, op).with_sge(p.mr_a.sge(0, MESSAGE))).unwrap();
        assert_eq!(next_wc(&p.a.cq).status, WcStatus::Success);
    }
}

fn send_round(p: &NodePair) {
    for i in 0..MESSAGES {
        p.qp_b.post_recv(RecvWr { wr_id: i, sg_list: softroce::sg_list![p.mr_b.sge(0, MESSAGE)] }).unwrap();
        p.qp_a.post_send(SendWr::new(i, SendOp::Send).with_sge(p.mr_a.sge(0, MESSAGE))).unwrap();
        assert_eq!(next_wc(&p.a.cq).status, WcStatus::Success);
        assert_eq!(next_wc(&p.b.cq).status, WcStatus::Success);
    }
}

/// SENDs of 8 bytes inline, as latency tests post them.
fn inline_round(p: &NodePair) {
    for i in 0..MESSAGES {
        p.qp_b.post_recv(RecvWr { wr_id: i, sg_list: softroce::sg_list![p.mr_b.sge(0, 8)] }).unwrap();
        let mut wr = SendWr::new(i, SendOp::Send);
        wr.flags.inline = true;
        wr.inline_data.extend_from_slice(&i.to_le_bytes());
        p.qp_a.post_send(wr).unwrap();
        assert_eq!(next_wc(&p.a.cq).status, WcStatus::Success);
        assert_eq!(next_wc(&p.b.cq).status, WcStatus::Success);
    }
}

#[test]
fn the_data_path_allocates_nothing_per_work_request_or_packet() {
    let pair = NodePair::connected(QpType::Rc, &options(Mtu::Mtu4096));
    // Each SEND message posts a receive too.
    type Round = (&'static str, fn(&NodePair), u64, u64);
    let rounds: [Round; 4] = [
        ("WRITE", write_round, MESSAGES, MESSAGES * 64),
        ("READ", read_round, MESSAGES, MESSAGES * 64),
        ("SEND", send_round, 2 * MESSAGES, MESSAGES * 64),
        ("inline SEND", inline_round, 2 * MESSAGES, MESSAGES),
    ];
    for (name, round, work_requests, least_packets) in rounds {
        let (allocations, packets) = count(&pair, round);
        let report =
            format!("{name}: {allocations} allocations for {work_requests} work requests and {packets} packets");
        eprintln!("{report}");
        assert!(packets >= least_packets, "{report}");
        assert!(allocations <= SLACK, "{report}");
    }
}
