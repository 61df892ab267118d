//! Fault soak of RC over the simulated network: for thousands of seeds, a
//! random mix of SEND, WRITE, READ and atomics of random sizes at a random
//! MTU, from random initial PSNs (often just below 2^24, so messages wrap),
//! through loss, duplication, reordering and corruption at random rates of up
//! to 10% each. Every work request must complete exactly once, in order, with
//! success; every receive likewise with its byte count; and the memory of
//! both hosts must end up exactly as a model says, atomics applied once.
//!
//! A failing seed is named in the panic message; `SOFTROCE_SEED=N` replays
//! just that seed.
//!
//! Also: RNR retries with late receives, and a peer that stops answering.

use std::net::{IpAddr, Ipv4Addr};
use std::ops::{Range, RangeInclusive};
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

use softroce::engine::SimWorld;
use softroce::net::{Faults, SimNet};
use softroce::transport::*;
use softroce::wire::Psn;

// The stack fuzz target's requests, memory layout and model; the soak
// draws its scenarios itself.
use crate::fuzz_stack::{
    first_difference, sge, Bump, Kind, Model, Op, Rng, Stream, BASES, CMP_SWAP_AT, DATA, DST, FETCH_ADD_AT, KEYS, RECV,
    SRC,
};

const SEEDS: u64 = 2000;
/// The longest messages: at MTU 256, more packets than the PSN window.
const LONG: usize = 48 << 10;
const MTUS: [Mtu; 5] = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096];
const A: usize = 0;
const B: usize = 1;
const ADDR_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const ADDR_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
/// Virtual time after which a seed that has not settled has failed.
const DEADLINE: Duration = Duration::from_secs(2);

const ALL_ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// The host each region of a [`Model`] is on: A requests, B responds.
const HOSTS: [usize; 4] = [A, A, B, B];

const ALL_KINDS: [Kind; 7] =
    [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm, Kind::Read, Kind::CompareSwap, Kind::FetchAdd];

/// The draws the soak makes beyond the fuzz driver's.
trait Draws {
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64;
    fn micros(&mut self, max: usize) -> Duration;
}

impl Draws for Rng {
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn micros(&mut self, max: usize) -> Duration {
        Duration::from_micros(self.below(max + 1) as u64)
    }
}

/// `len` bytes at `offset` of `region` as up to `parts` SGEs, cut at random.
fn split(rng: &mut Rng, region: usize, offset: usize, len: usize, parts: usize) -> Vec<Sge> {
    let mut cuts: Vec<usize> = (1..1 + rng.below(parts)).map(|_| rng.below(len + 1)).collect();
    cuts.extend([0, len]);
    cuts.sort_unstable();
    cuts.windows(2).filter(|c| c[1] > c[0]).map(|c| sge(region, offset + c[0], c[1] - c[0])).collect()
}

/// Everything a seed decides.
#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    faults: Faults,
    mtu: Mtu,
    psn_a: u32,
    psn_b: u32,
    /// Local ACK timeout exponent.
    timeout: u8,
    retry_cnt: u8,
    rd_atomic: u8,
    rnr_timer: u8,
    ops: Vec<Op>,
    /// Sizes of SRC, DST, DATA and RECV.
    region_lens: [usize; 4],
}

impl Scenario {
    /// A seed's scenario: `ops` requests of the given kinds, fault rates of
    /// up to `max_rate` each.
    fn draw(seed: u64, ops: RangeInclusive<usize>, kinds: &[Kind], max_rate: f64) -> Scenario {
        let mut rng = Rng(seed ^ 0x5eed_5eed_5eed_5eed);
        let rate = |rng: &mut Rng| rng.unit() * max_rate;
        let faults = Faults {
            drop: rate(&mut rng),
            duplicate: rate(&mut rng),
            reorder: rate(&mut rng),
            corrupt: rate(&mut rng),
            reorder_delay: rng.micros(100),
            latency: Duration::from_micros(1) + rng.micros(20),
            jitter: rng.micros(5),
            corrupt_headers: false,
        };
        let mtu = MTUS[rng.below(MTUS.len())];
        let psn = |rng: &mut Rng| {
            let near_wrap = rng.below(2) == 0;
            if near_wrap {
                0xff_ffff - rng.below(64) as u32
            } else {
                rng.below(1 << 24) as u32
            }
        };
        let (psn_a, psn_b) = (psn(&mut rng), psn(&mut rng));
        let m = mtu.bytes();
        let src_len = LONG + 64;
        let (mut dst, mut data, mut recv) = (Bump(0), Bump(16), Bump(0));
        let (mut fetch_adds, mut recvs) = (0, 0);
        let count = ops.start() + rng.below(ops.end() - ops.start() + 1);
        let mut ops = Vec::with_capacity(count);
        for _ in 0..count {
            let kind = kinds[rng.below(kinds.len())];
            let len = match rng.below(10) {
                0 => 0,
                1 => 1,
                2 => m - 1,
                3 => m,
                4 => m + 1,
                5 => 2 * m + rng.below(3) - 1,
                6..=8 => rng.below(4 * m + 1),
                _ => rng.below(LONG + 1),
            };
            let mut op =
                Op { kind, len, local: Vec::new(), remote: 0, recv: None, operand: rng.next(), matching: false };
            let from_src = |rng: &mut Rng| {
                let at = rng.below(src_len - len + 1);
                split(rng, SRC, at, len, 3)
            };
            let mut take_recv = |rng: &mut Rng, len: usize| {
                let room = len + rng.below(9);
                let at = recv.take(rng, room);
                recvs += 1;
                Some(RecvWr { wr_id: recvs - 1, sg_list: split(rng, RECV, at, room, 2).into() })
            };
            match kind {
                Kind::Send | Kind::SendImm => {
                    op.local = from_src(&mut rng);
                    op.recv = take_recv(&mut rng, len);
                }
                Kind::Write | Kind::WriteImm => {
                    op.local = from_src(&mut rng);
                    op.remote = data.take(&mut rng, len);
                    if kind == Kind::WriteImm {
                        op.recv = take_recv(&mut rng, 8);
                    }
                }
                Kind::Read => {
                    let at = dst.take(&mut rng, len);
                    op.local = split(&mut rng, DST, at, len, 3);
                    op.remote = data.take(&mut rng, len);
                }
                Kind::CompareSwap | Kind::FetchAdd => {
                    op.len = 8;
                    op.local = vec![sge(DST, dst.take(&mut rng, 8), 8)];
                    op.remote = if kind == Kind::FetchAdd { FETCH_ADD_AT } else { CMP_SWAP_AT };
                    op.matching = rng.below(2) == 0;
                    if kind == Kind::FetchAdd {
                        // Distinct powers of two, four bits apart: the final
                        // value shows which were applied, and how often.
                        op.operand = 1 << (4 * fetch_adds);
                        fetch_adds += 1;
                    }
                }
            }
            ops.push(op);
        }
        Scenario {
            seed,
            faults,
            mtu,
            psn_a,
            psn_b,
            timeout: 6 + rng.below(5) as u8,
            retry_cnt: 7,
            rd_atomic: 1 + rng.below(8) as u8,
            rnr_timer: 1,
            ops,
            region_lens: [src_len, dst.0 + 16, data.0 + 16, recv.0 + 16],
        }
    }

    fn attr(&self) -> QpAttr {
        QpAttr {
            access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            path_mtu: self.mtu,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: 7,
            min_rnr_timer: self.rnr_timer,
            max_rd_atomic: self.rd_atomic,
            max_dest_rd_atomic: self.rd_atomic,
            ..QpAttr::default()
        }
    }

    /// Two connected RC QPs and the four regions, filled at random (the
    /// FETCH_ADD word starts at zero).
    fn world(&self) -> SimWorld {
        let mut w = SimWorld::new(SimNet::new(self.seed, self.faults));
        w.add_host(ADDR_A).unwrap();
        w.add_host(ADDR_B).unwrap();
        w.create_qp(A, QPN_A, QpType::Rc, QpCap::default(), None);
        w.create_qp(B, QPN_B, QpType::Rc, QpCap::default(), None);
        let mut rng = Rng(self.seed);
        for region in [SRC, DST, DATA, RECV] {
            let (host, key) = (HOSTS[region], KEYS[region]);
            w.register(host, key, BASES[region], self.region_lens[region], ALL_ACCESS);
            let data = &mut w.hosts[host].mem.region_mut(key).unwrap().data;
            for chunk in data.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next().to_le_bytes()[..chunk.len()]);
            }
        }
        let data = &mut w.hosts[B].mem.region_mut(KEYS[DATA]).unwrap().data;
        data[FETCH_ADD_AT..FETCH_ADD_AT + 8].fill(0);
        w.connect((A, QPN_A), (B, QPN_B), &self.attr(), (Psn::new(self.psn_a), Psn::new(self.psn_b))).unwrap();
        w
    }
}

/// Names the first byte where `got` differs from `want`, if any.
fn first_difference_in(got: &Model, want: &Model) -> Option<String> {
    [SRC, DST, DATA, RECV].into_iter().find_map(|region| {
        let diff = first_difference(&got.0[region], &want.0[region], &[])?;
        Some(format!("region {:#x}: {diff}", KEYS[region]))
    })
}

/// The work requests of a scenario, and what they should produce.
struct Expected {
    sends: Vec<SendWr>,
    send_wcs: Vec<(u32, CqKind, WorkCompletion)>,
    recv_wcs: Vec<(u32, CqKind, WorkCompletion)>,
    memory: Model,
}

/// Runs the model over the scenario, from the initial memory: RC executes
/// every request once, in order.
fn expect(scenario: &Scenario, initial: &Model) -> Expected {
    let sends = Stream { from: A, ops: scenario.ops.clone() }.work_requests(initial);
    let mut memory = initial.clone();
    let (mut send_wcs, mut recv_wcs) = (Vec::new(), Vec::new());
    for (op, wr) in scenario.ops.iter().zip(&sends) {
        memory.apply(op, wr);
        let mut wc = WorkCompletion::new(wr.wr_id, QPN_A, WcStatus::Success, wr.op.wc_opcode());
        wc.byte_len = op.len as u32;
        send_wcs.push((QPN_A, CqKind::Send, wc));
        recv_wcs.extend(op.recv_completion(QPN_B).map(|wc| (QPN_B, CqKind::Recv, wc)));
    }
    Expected { sends, send_wcs, recv_wcs, memory }
}

/// A scenario's world with the expected outcome.
struct Run {
    scenario: Scenario,
    w: SimWorld,
    expected: Expected,
}

impl Run {
    fn new(scenario: Scenario) -> Run {
        let w = scenario.world();
        let expected = expect(&scenario, &Model::of(&w, A));
        Run { scenario, w, expected }
    }

    fn receives(&self) -> impl Iterator<Item = &RecvWr> {
        self.scenario.ops.iter().filter_map(|op| op.recv.as_ref())
    }

    fn post_recvs(&mut self, range: Range<usize>) {
        let recvs: Vec<RecvWr> = self.receives().skip(range.start).take(range.len()).cloned().collect();
        for recv in recvs {
            self.w.hosts[B].qp(QPN_B).post_recv(recv).unwrap();
        }
    }

    fn post_sends(&mut self, range: Range<usize>) {
        for wr in &self.expected.sends[range] {
            self.w.hosts[A].qp(QPN_A).post_send(wr.clone()).unwrap();
        }
    }

    /// The ACK timeout the requester waits: the attribute's, at least the floor (T-32).
    fn ack_timeout(&self) -> Duration {
        Duration::from_nanos(4096 << self.scenario.timeout).max(MIN_ACK_TIMEOUT)
    }

    /// Runs until nothing is left to do and checks every completion, the
    /// memory, the events and the QP states.
    fn finish(&mut self) {
        self.w.run_idle(DEADLINE);
        let w = &self.w;
        assert_eq!(w.next_event(), None, "still busy at the deadline");
        assert_eq!(w.hosts[A].completions, self.expected.send_wcs, "completions on A");
        assert_eq!(w.hosts[B].completions, self.expected.recv_wcs, "completions on B");
        let memory = Model::of(w, A);
        let (got, want) = (memory.word(FETCH_ADD_AT), self.expected.memory.word(FETCH_ADD_AT));
        assert_eq!(got, want, "FETCH_ADD word {got:#x}, expected {want:#x}: each nibble counts one addend");
        if let Some(diff) = first_difference_in(&memory, &self.expected.memory) {
            panic!("memory: {diff}");
        }
        for h in [A, B] {
            assert!(w.hosts[h].events.is_empty(), "events on host {h}: {:?}", w.hosts[h].events);
        }
        assert_eq!((w.hosts[A].qps[&QPN_A].state(), w.hosts[B].qps[&QPN_B].state()), (QpState::Rts, QpState::Rts));
    }
}

/// Runs `check` for every seed (or only `SOFTROCE_SEED`), naming the seed
/// and its scenario when one fails.
fn for_each_seed(seeds: Range<u64>, draw: impl Fn(u64) -> Scenario, check: impl Fn(Run)) {
    let seeds: Vec<u64> = match std::env::var("SOFTROCE_SEED") {
        Ok(seed) => vec![seed.parse().expect("SOFTROCE_SEED is a number")],
        Err(_) => seeds.collect(),
    };
    for seed in seeds {
        let scenario = draw(seed);
        let run = Run::new(scenario.clone());
        if let Err(panic) = panic::catch_unwind(AssertUnwindSafe(|| check(run))) {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            panic!("seed {seed} failed (replay with SOFTROCE_SEED={seed}): {msg}\n{scenario:#?}");
        }
    }
}

#[test]
fn rc_fault_soak() {
    for_each_seed(0..SEEDS, |seed| Scenario::draw(seed, 1..=16, &ALL_KINDS, 0.1), |mut run| run.post_all_and_finish());
}

/// The same faults with a receive buffer of 12 packets: READs longer than
/// that go in pieces once a response was lost (rxe-spec T-7), and retries
/// of a piece stay within it.
#[test]
fn rc_fault_soak_with_read_pieces() {
    let kinds = [Kind::Read, Kind::Read, Kind::Write, Kind::FetchAdd];
    for_each_seed(
        0..SEEDS,
        |seed| Scenario::draw(seed, 1..=16, &kinds, 0.1),
        |mut run| {
            let packet = 5 * (run.scenario.mtu.bytes() + TRANSMIT_HEADROOM) / 4;
            run.w.hosts[A].qp(QPN_A).set_peer_buffer(Some(12 * packet));
            let sends = run.expected.sends.len();
            run.post_sends(0..sends);
            run.finish();
        },
    );
}

impl Run {
    /// Makes about half the requests unsignaled (a seeded choice): they
    /// complete silently, and ask for no ACK (rxe-spec T-6).
    fn unsignal_some(&mut self) {
        let mut rng = Rng(self.scenario.seed ^ 0x0051_6e41);
        let Expected { sends, send_wcs, .. } = &mut self.expected;
        let mut signaled = Vec::new();
        for (wr, wc) in sends.iter_mut().zip(send_wcs.drain(..)) {
            wr.flags.signaled = rng.below(2) == 0;
            if wr.flags.signaled {
                signaled.push(wc);
            }
        }
        *send_wcs = signaled;
    }

    /// Posts every receive, then every request, and runs to the end with
    /// [`Run::finish`]'s checks.
    fn post_all_and_finish(&mut self) {
        let all = self.receives().count();
        self.post_recvs(0..all);
        let sends = self.expected.sends.len();
        self.post_sends(0..sends);
        self.finish();
    }
}

/// The same faults with about half the requests unsignaled: those that end
/// a run of them are asked for after a delay, through drops, duplicates,
/// reordering and corruption.
#[test]
fn rc_fault_soak_with_unsignaled_requests() {
    for_each_seed(
        0..SEEDS,
        |seed| Scenario::draw(seed, 1..=16, &ALL_KINDS, 0.1),
        |mut run| {
            run.unsignal_some();
            run.post_all_and_finish();
        },
    );
}

/// Without faults, unsignaled requests at the end are asked for before the
/// ACK timeout: no timeout, no retry.
#[test]
fn an_unsignaled_tail_needs_no_timeout() {
    for_each_seed(
        0..50,
        |seed| fault_free(seed, 8, 7),
        |mut run| {
            run.unsignal_some();
            if let Some(last) = run.expected.sends.last_mut() {
                last.flags.signaled = false;
            }
            run.expected.send_wcs.retain(|(_, _, wc)| wc.wr_id != 7);
            run.post_all_and_finish();
            let counters = run.w.hosts[A].qps[&QPN_A].counters();
            assert_eq!((counters.timeouts, counters.retries), (0, 0));
        },
    );
}

/// With rnr_retry = 7 the requester retries after RNR NAKs for as long as
/// it takes: receives posted long after the sends still get every message.
/// (Without faults: with no progress for that long, lost RNR NAKs would
/// rightly spend the finite transport retry budget.)
#[test]
fn rnr_retry_forever_with_late_receives() {
    const LATE: Duration = Duration::from_millis(10);
    let scenario = |seed| {
        let kinds = [Kind::Send, Kind::SendImm, Kind::WriteImm, Kind::Read];
        let mut s = Scenario::draw(seed, 4..=10, &kinds, 0.0);
        // 0.32 ms between RNR retries: about 30 of them before LATE.
        s.rnr_timer = 10;
        s
    };
    for_each_seed(0..20, scenario, |mut run| {
        let all = run.receives().count();
        run.post_recvs(0..1.min(all));
        let sends = run.expected.sends.len();
        run.post_sends(0..sends);
        run.w.run_until(LATE, |_| false);
        run.w.now = LATE;
        run.post_recvs(1.min(all)..all);
        run.finish();
        let rnr_naks = run.w.hosts[A].qps[&QPN_A].counters().rnr_naks_received;
        assert!(all < 2 || rnr_naks > 7, "{all} receives, only {rnr_naks} RNR NAKs");
    });
}

/// A scenario of `ops` requests without faults, with the shortest ACK
/// timeout (attribute 8, 1 ms, raised to the 16 ms floor).
fn fault_free(seed: u64, ops: usize, retry_cnt: u8) -> Scenario {
    let mut scenario = Scenario::draw(seed, ops..=ops, &ALL_KINDS, 0.0);
    scenario.timeout = 8;
    scenario.retry_cnt = retry_cnt;
    scenario
}

/// Runs the first `ops` requests of a fault-free run to completion, then cuts
/// the link both ways and posts the rest; returns when the cut was made.
fn cut_after(run: &mut Run, ops: usize) -> Duration {
    let all = run.receives().count();
    run.post_recvs(0..all);
    run.post_sends(0..ops);
    run.w.run_idle(DEADLINE);
    assert_eq!(run.w.hosts[A].completions, run.expected.send_wcs[..ops]);
    let dead = Faults { drop: 1.0, ..Faults::default() };
    run.w.net.set_link_faults(ADDR_A, ADDR_B, dead);
    run.w.net.set_link_faults(ADDR_B, ADDR_A, dead);
    let sends = run.expected.sends.len();
    run.post_sends(ops..sends);
    run.w.now
}

/// When the peer stops answering, the requester resends once per ACK
/// timeout, retry_cnt times, then fails the oldest outstanding request with
/// RETRY_EXC_ERR, flushes the rest and moves to ERR.
#[test]
fn dead_peer_exhausts_the_retries() {
    const DONE: usize = 3;
    const OPS: usize = 8;
    for_each_seed(
        0..20,
        |seed| fault_free(seed, OPS, seed as u8 % 8),
        |mut run| {
            let retry_cnt = u32::from(run.scenario.retry_cnt);
            let cut = cut_after(&mut run, DONE);
            run.w.run_idle(cut + DEADLINE);
            let elapsed = run.w.now - cut;
            let timeout = run.ack_timeout();
            assert!(
                elapsed > timeout * retry_cnt && elapsed <= timeout * (retry_cnt + 1),
                "failed after {elapsed:?}, ACK timeout {timeout:?}"
            );
            let mut want = run.expected.send_wcs[..DONE].to_vec();
            for (i, wr) in run.expected.sends.iter().enumerate().skip(DONE) {
                let status = if i == DONE { WcStatus::RetryExcErr } else { WcStatus::WrFlushErr };
                want.push((QPN_A, CqKind::Send, WorkCompletion::new(i as u64, QPN_A, status, wr.op.wc_opcode())));
            }
            let qp = &run.w.hosts[A].qps[&QPN_A];
            assert_eq!(run.w.hosts[A].completions, want);
            assert_eq!(qp.state(), QpState::Err);
            assert_eq!(qp.counters().timeouts, u64::from(retry_cnt) + 1);
            assert_eq!(run.w.hosts[A].events, [AsyncEvent::QpFatal { qpn: QPN_A }]);
            assert_eq!(run.w.hosts[B].qps[&QPN_B].state(), QpState::Rts);
        },
    );
}
