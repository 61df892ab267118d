//! How threads that drive progress wait: they poll a while after their last
//! packet before they sleep (rxe-spec V-10). In a test binary of its own,
//! since what it counts depends on having the CPUs to poll on: tests
//! running beside it in one binary would take them. Release builds only: a
//! debug build's rounds are slow enough that its gaps between windows pass
//! the polling time.

mod support;

use softroce::transport::{Mtu, QpType, SendOp, SendWr, WcStatus};
use softroce::verbs::ContextOptions;
use support::verbs::*;

#[test]
#[cfg_attr(debug_assertions, ignore = "times a release build's windows: `cargo test --release --test polling`")]
fn a_busy_engine_polls_through_the_gaps_between_windows() {
    // With one CPU nothing polls: the peer may need it.
    if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
        return;
    }
    // The host is shared: a run the scheduler starves counts its stalls as
    // sleeps, so the best of three runs is judged. A run in which the
    // engine's yield came back late is not: it then sleeps at once when
    // idle, as it must where threads that spin hold the CPUs (rxe-spec
    // T-35), and on a busy host that is every few runs. An engine that did
    // not poll never yields, and sleeps in every run, well past the bound.
    let mut counts = Vec::new();
    let mut contended = 0;
    for _ in 0..12 {
        let (sleeps, late_yields) = sleeps_in_64_mib();
        if late_yields > 0 {
            contended += 1;
            continue;
        }
        if sleeps < 40 {
            return;
        }
        counts.push(sleeps);
        if counts.len() == 3 {
            panic!("the target's engine slept {counts:?} times in 64 MiB, in three runs");
        }
    }
    eprintln!(
        "not judged: the engine's yields came back late in {contended} of 12 runs (a busy host); \
         the other runs slept {counts:?} times"
    );
}

/// How many times the passive side's engine slept while 64 WRITEs of 1 MiB
/// reached it, and how many of its yields came back late meanwhile.
fn sleeps_in_64_mib() -> (u64, u64) {
    let port = free_port(&[IP_A, IP_B]);
    let small = ContextOptions { port, socket_buffer: Some(212_992), ..ContextOptions::default() };
    let (a, b) = (Node::open("polling_a", IP_A, small.clone()), Node::open("polling_b", IP_B, small));
    const MESSAGE: usize = 1 << 20;
    const MESSAGES: u64 = 64;
    let (mr_a, mr_b) = (a.mr(MESSAGE), b.mr(MESSAGE));
    let (qp, peer) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&qp, &peer, &options(Mtu::Mtu4096), &options(Mtu::Mtu4096));
    let post = |wr_id| {
        let op = SendOp::RdmaWrite { remote_addr: mr_b.addr(), rkey: mr_b.rkey() };
        qp.post_send(SendWr::new(wr_id, op).with_sge(mr_a.sge(0, MESSAGE))).unwrap();
    };
    let (mut posted, mut done) = (0, 0);
    while posted < 4 {
        post(posted);
        posted += 1;
    }
    let before = b.ctx.counters();
    while done < MESSAGES {
        let wc = a.cq.wait_one(WAIT).expect("a WRITE completion");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        done += 1;
        if posted < MESSAGES {
            post(posted);
            posted += 1;
        }
    }
    // The passive side's engine alone handles 64 MiB in windows of at most
    // about 100 packets (the 416 KiB the kernel accounts): 160 windows or
    // more, each a sleep and a wake-up if the engine slept whenever a
    // round found nothing.
    let after = b.ctx.counters();
    (after.sleeps - before.sleeps, after.contended_yields - before.contended_yields)
}
