//! The `stack` fuzz target: two RC QPs on two hosts of the simulated network,
//! with the fault rates (up to 20 % each), the network's seed, the path MTU,
//! the initial PSNs, the retry budget and a list of SENDs, WRITEs, READs and
//! atomics in both directions all chosen by the input. The run must settle
//! within a virtual-time bound, and then, for each direction:
//!
//! - the requester completed every work request exactly once, in order, with
//!   success; or, when the faults used up its retries, a run of successes,
//!   then RETRY_EXC_ERR, then only WR_FLUSH_ERR (and the QP is in ERR with
//!   one fatal event, and nothing else is);
//! - the requester's memory is what the successful requests made it, byte for
//!   byte (except where a failed READ may have placed part of its data);
//! - the responder's memory and receive completions are those of a prefix of
//!   the requests, at least the successful ones, each executed exactly once
//!   and in order (except where the first one not executed may have placed
//!   part of its data); FETCH_ADDs of distinct powers of sixteen show in the
//!   final word how often each was applied.
//!
//! Shared by `fuzz/fuzz_targets/stack.rs` and the tests in `tests/transport`
//! (through `#[path]`): `fuzz_regressions.rs` replays what it found, and the
//! fault soak (`soak.rs`) lays out its memory and requests as this driver
//! does and checks them against the same [`Model`]. The input types derive `Arbitrary` only when built by
//! cargo-fuzz (`cfg(fuzzing)`), so the tests need no `arbitrary`.

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::time::Duration;

#[cfg(fuzzing)]
use arbitrary::Arbitrary;
use softroce::engine::SimWorld;
use softroce::net::{Faults, SimNet};
use softroce::transport::{
    Access, AsyncEvent, CqKind, Mtu, QpAttr, QpCap, QpState, QpType, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
use softroce::wire::Psn;

const ADDRS: [IpAddr; 2] = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))];
const QPNS: [u32; 2] = [0x11, 0x22];
const MTUS: [Mtu; 5] = [Mtu::Mtu1024, Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu2048, Mtu::Mtu4096];
/// Requests beyond this many are ignored.
const MAX_OPS: usize = 16;
/// The longest message: at MTU 256, more packets than the PSN window.
const MAX_LEN: usize = 40 << 10;
/// The highest fault rate.
const MAX_RATE: f64 = 0.2;
/// Virtual time by which every run must have settled.
const DEADLINE: Duration = Duration::from_secs(60);
const ALL: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// Each host's regions, by index: the data SENDs and WRITEs send, where READ
/// and atomic results go, what the peer's requests target, and the receive
/// buffers. A direction's requests use its requester's first two and its
/// responder's last two, so the two directions share no memory.
pub(crate) const SRC: usize = 0;
pub(crate) const DST: usize = 1;
pub(crate) const DATA: usize = 2;
pub(crate) const RECV: usize = 3;
pub(crate) const KEYS: [u32; 4] = [0x10, 0x11, 0x12, 0x13];
pub(crate) const BASES: [u64; 4] = [0x10_0000, 0x20_0000, 0x30_0000, 0x40_0000];
/// Offsets in DATA of the FETCH_ADD and CMP_SWAP words; WRITEs and READs go after.
pub(crate) const FETCH_ADD_AT: usize = 0;
pub(crate) const CMP_SWAP_AT: usize = 8;

#[derive(Debug, Clone)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub struct Input {
    /// Seeds the network's faults and the memory layout and contents.
    pub seed: u64,
    pub faults: FaultRates,
    /// Index into the path MTUs (modulo their number).
    pub mtu: u8,
    pub psns: [StartPsn; 2],
    /// Local ACK timeout exponent: 6 plus this modulo 5.
    pub timeout: u8,
    /// Modulo 8.
    pub retry_cnt: u8,
    /// `max_rd_atomic` and `max_dest_rd_atomic`: 1 plus this modulo 8.
    pub rd_atomic: u8,
    pub ops: Vec<OpInput>,
}

/// Rates in 255ths of [`MAX_RATE`]; times in microseconds.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub struct FaultRates {
    pub drop: u8,
    pub duplicate: u8,
    pub reorder: u8,
    pub corrupt: u8,
    pub reorder_delay: u8,
    pub latency: u8,
    pub jitter: u8,
}

#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum StartPsn {
    /// This many below 2^24.
    NearWrap(u8),
    Raw(u32),
}

#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub struct OpInput {
    /// Sent by the second host (else the first).
    pub from_b: bool,
    pub kind: Kind,
    pub size: Size,
    /// Scatter/gather elements the local buffer is cut into: 1 plus this modulo 3.
    pub pieces: u8,
    /// Immediate data or CMP_SWAP swap value.
    pub operand: u64,
    /// Whether a CMP_SWAP compares equal.
    pub matching: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CompareSwap,
    FetchAdd,
}

#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum Size {
    /// This many path MTUs (modulo 5) plus `delta` bytes.
    Mtus { mtus: u8, delta: i8 },
    /// Modulo [`MAX_LEN`] + 1.
    Bytes(u16),
}

/// Runs `input` and checks the outcome.
pub fn run(input: &Input) {
    let plan = Plan::new(input);
    let mut world = plan.world();
    let start = plan.streams.each_ref().map(|s| Model::of(&world, s.from));
    let requests: Vec<Vec<SendWr>> = plan.streams.iter().zip(&start).map(|(s, m)| s.work_requests(m)).collect();
    for stream in &plan.streams {
        for op in &stream.ops {
            if let Some(recv) = &op.recv {
                world.hosts[stream.to()].qp(QPNS[stream.to()]).post_recv(recv.clone()).expect("receive posts");
            }
        }
    }
    for (stream, requests) in plan.streams.iter().zip(&requests) {
        for wr in requests {
            world.hosts[stream.from].qp(QPNS[stream.from]).post_send(wr.clone()).expect("request posts");
        }
    }
    world.run_idle(DEADLINE);
    assert_eq!(world.next_event(), None, "still busy after {DEADLINE:?}");
    let failed = [0, 1].map(|h| plan.streams[h].check(&world, &start[h], &requests[h]));
    for h in [0, 1] {
        let qp = &world.hosts[h].qps[&QPNS[h]];
        let (state, events) =
            if failed[h] { (QpState::Err, vec![AsyncEvent::QpFatal { qpn: QPNS[h] }]) } else { (QpState::Rts, vec![]) };
        assert_eq!((qp.state(), &world.hosts[h].events), (state, &events), "state and events of host {h}");
    }
}

/// SplitMix64, for the choices the input leaves to its seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// Hands out disjoint ranges of a region, with small gaps.
pub(crate) struct Bump(pub(crate) usize);

impl Bump {
    pub(crate) fn take(&mut self, rng: &mut Rng, len: usize) -> usize {
        let at = self.0 + rng.below(16);
        self.0 = at + len;
        at
    }
}

pub(crate) fn sge(region: usize, offset: usize, len: usize) -> Sge {
    Sge { addr: BASES[region] + offset as u64, length: len as u32, lkey: KEYS[region] }
}

/// `len` bytes at `offset` of `region` as `parts` SGEs or fewer, cut at random.
fn split(rng: &mut Rng, region: usize, offset: usize, len: usize, parts: usize) -> Vec<Sge> {
    let mut cuts: Vec<usize> = (1..parts).map(|_| rng.below(len + 1)).collect();
    cuts.extend([0, len]);
    cuts.sort_unstable();
    cuts.windows(2).filter(|c| c[1] > c[0]).map(|c| sge(region, offset + c[0], c[1] - c[0])).collect()
}

/// A request with its buffers laid out.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub(crate) kind: Kind,
    pub(crate) len: usize,
    /// In the requester's SRC (SEND, WRITE) or DST (READ, atomics).
    pub(crate) local: Vec<Sge>,
    /// Offset in the responder's DATA.
    pub(crate) remote: usize,
    /// The receive it consumes, in the responder's RECV.
    pub(crate) recv: Option<RecvWr>,
    pub(crate) operand: u64,
    pub(crate) matching: bool,
}

/// The requests from host `from` to the other.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) from: usize,
    pub(crate) ops: Vec<Op>,
}

struct Plan {
    seed: u64,
    faults: Faults,
    attr: QpAttr,
    psns: [Psn; 2],
    streams: [Stream; 2],
    /// By host, then region.
    region_lens: [[usize; 4]; 2],
}

impl Plan {
    fn new(input: &Input) -> Plan {
        let mut rng = Rng(input.seed);
        let rate = |r: u8| f64::from(r) / 255.0 * MAX_RATE;
        let micros = |us: u8| Duration::from_micros(us.into());
        let f = input.faults;
        let faults = Faults {
            drop: rate(f.drop),
            duplicate: rate(f.duplicate),
            reorder: rate(f.reorder),
            corrupt: rate(f.corrupt),
            reorder_delay: micros(f.reorder_delay),
            latency: micros(1 + f.latency % 32),
            jitter: micros(f.jitter % 8),
            corrupt_headers: false,
        };
        let mtu = MTUS[usize::from(input.mtu) % MTUS.len()];
        let rd_atomic = 1 + input.rd_atomic % 8;
        let attr = QpAttr {
            access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            path_mtu: mtu,
            timeout: 6 + input.timeout % 5,
            retry_cnt: input.retry_cnt % 8,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: rd_atomic,
            max_dest_rd_atomic: rd_atomic,
            ..QpAttr::default()
        };
        let psns = input.psns.map(|p| match p {
            StartPsn::NearWrap(n) => Psn::new(0xff_ffff - u32::from(n)),
            StartPsn::Raw(psn) => Psn::new(psn),
        });

        let m = mtu.bytes();
        let src_len = MAX_LEN + 64;
        // By requester: bumps in its DST, and in the responder's DATA and RECV.
        let mut dst = [Bump(0), Bump(0)];
        let mut data = [Bump(16), Bump(16)];
        let mut recv = [Bump(0), Bump(0)];
        let mut streams = [Stream { from: 0, ops: Vec::new() }, Stream { from: 1, ops: Vec::new() }];
        let mut fetch_adds = [0, 0];
        for input in input.ops.iter().take(MAX_OPS) {
            let h = usize::from(input.from_b);
            let len = match input.size {
                Size::Mtus { mtus, delta } => {
                    (usize::from(mtus % 5) * m).saturating_add_signed(delta.into()).min(MAX_LEN)
                }
                Size::Bytes(n) => usize::from(n) % (MAX_LEN + 1),
            };
            let parts = 1 + usize::from(input.pieces % 3);
            let mut op = Op {
                kind: input.kind,
                len,
                local: Vec::new(),
                remote: 0,
                recv: None,
                operand: input.operand,
                matching: input.matching,
            };
            let receives = streams[h].ops.iter().filter(|op| op.recv.is_some()).count() as u64;
            let mut take_recv = |rng: &mut Rng, len: usize| {
                let room = len + rng.below(9);
                let at = recv[h].take(rng, room);
                Some(RecvWr { wr_id: receives, sg_list: split(rng, RECV, at, room, 2).into() })
            };
            match input.kind {
                Kind::Send | Kind::SendImm => {
                    let at = rng.below(src_len - len + 1);
                    op.local = split(&mut rng, SRC, at, len, parts);
                    op.recv = take_recv(&mut rng, len);
                }
                Kind::Write | Kind::WriteImm => {
                    let at = rng.below(src_len - len + 1);
                    op.local = split(&mut rng, SRC, at, len, parts);
                    op.remote = data[h].take(&mut rng, len);
                    if input.kind == Kind::WriteImm {
                        op.recv = take_recv(&mut rng, 0);
                    }
                }
                Kind::Read => {
                    let at = dst[h].take(&mut rng, len);
                    op.local = split(&mut rng, DST, at, len, parts);
                    op.remote = data[h].take(&mut rng, len);
                }
                Kind::CompareSwap | Kind::FetchAdd => {
                    op.len = 8;
                    op.local = vec![sge(DST, dst[h].take(&mut rng, 8), 8)];
                    if input.kind == Kind::FetchAdd {
                        op.remote = FETCH_ADD_AT;
                        // Distinct powers of sixteen: each nibble of the final
                        // word counts how often one addend was applied.
                        op.operand = 1 << (4 * (fetch_adds[h] % 16));
                        fetch_adds[h] += 1;
                    } else {
                        op.remote = CMP_SWAP_AT;
                    }
                }
            }
            streams[h].ops.push(op);
        }
        // Host h holds its own stream's DST and the peer's stream's DATA and RECV.
        let region_lens = [0, 1].map(|h| [src_len, dst[h].0 + 16, data[1 - h].0 + 16, recv[1 - h].0 + 16]);
        Plan { seed: input.seed, faults, attr, psns, streams, region_lens }
    }

    /// The two hosts with their regions, filled at random (the FETCH_ADD
    /// words start at zero), and their QPs connected.
    fn world(&self) -> SimWorld {
        let mut world = SimWorld::new(SimNet::new(self.seed, self.faults));
        let mut rng = Rng(!self.seed);
        for h in [0, 1] {
            world.add_host(ADDRS[h]).expect("simulated hosts attach");
            world.create_qp(h, QPNS[h], QpType::Rc, QpCap::default(), None);
            for region in [SRC, DST, DATA, RECV] {
                world.register(h, KEYS[region], BASES[region], self.region_lens[h][region], ALL);
                let data = &mut world.hosts[h].mem.region_mut(KEYS[region]).expect("registered").data;
                data.iter_mut().for_each(|b| *b = rng.next() as u8);
            }
            let data = &mut world.hosts[h].mem.region_mut(KEYS[DATA]).expect("registered").data;
            data[FETCH_ADD_AT..FETCH_ADD_AT + 8].fill(0);
        }
        world.connect((0, QPNS[0]), (1, QPNS[1]), &self.attr, (self.psns[0], self.psns[1])).expect("QPs connect");
        world
    }
}

impl Stream {
    fn to(&self) -> usize {
        1 - self.from
    }

    /// The work requests, with CMP_SWAP compare values that match or not as
    /// chosen, given what the requests before them did.
    pub(crate) fn work_requests(&self, start: &Model) -> Vec<SendWr> {
        let mut model = start.clone();
        let requests: Vec<SendWr> = self
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let (remote_addr, rkey) = (BASES[DATA] + op.remote as u64, KEYS[DATA]);
                let imm = op.operand as u32;
                let send_op = match op.kind {
                    Kind::Send => SendOp::Send,
                    Kind::SendImm => SendOp::SendWithImm(imm),
                    Kind::Write => SendOp::RdmaWrite { remote_addr, rkey },
                    Kind::WriteImm => SendOp::RdmaWriteWithImm { remote_addr, rkey, imm },
                    Kind::Read => SendOp::RdmaRead { remote_addr, rkey },
                    Kind::CompareSwap => {
                        let current = model.word(op.remote);
                        let compare = if op.matching { current } else { current ^ 1 << 17 };
                        SendOp::CompareSwap { remote_addr, rkey, compare, swap: op.operand }
                    }
                    Kind::FetchAdd => SendOp::FetchAdd { remote_addr, rkey, add: op.operand },
                };
                let mut wr = SendWr::new(i as u64, send_op);
                wr.sg_list = op.local.as_slice().into();
                model.apply(op, &wr);
                wr
            })
            .collect();
        requests
    }

    /// Checks the completions and memory of both ends; returns whether the
    /// requester ran out of retries.
    fn check(&self, world: &SimWorld, start: &Model, requests: &[SendWr]) -> bool {
        let (x, y) = (self.from, self.to());
        let of = |h: usize, kind: CqKind| -> Vec<WorkCompletion> {
            world.hosts[h].completions.iter().filter(|c| c.1 == kind).map(|c| c.2).collect()
        };
        let n = requests.len();
        let sends = of(x, CqKind::Send);
        let done = sends.iter().take_while(|wc| wc.status == WcStatus::Success).count();
        let expected: Vec<WorkCompletion> = requests
            .iter()
            .enumerate()
            .map(|(i, wr)| {
                let status = match i.cmp(&done) {
                    std::cmp::Ordering::Less => WcStatus::Success,
                    std::cmp::Ordering::Equal => WcStatus::RetryExcErr,
                    std::cmp::Ordering::Greater => WcStatus::WrFlushErr,
                };
                let mut wc = WorkCompletion::new(wr.wr_id, QPNS[x], status, wr.op.wc_opcode());
                if status == WcStatus::Success {
                    wc.byte_len = wr.length() as u32;
                }
                wc
            })
            .collect();
        assert_eq!(sends, expected, "send completions on host {x}");

        // The requester's memory: what the successful requests did, and a
        // failed READ may have placed part of its data.
        let mut model = start.clone();
        for (op, wr) in self.ops.iter().zip(requests).take(done) {
            model.apply(op, wr);
        }
        let partial = self.ops.get(done).filter(|op| op.kind == Kind::Read).map(|op| model.ranges(&op.local));
        let got = Model::of(world, self.from);
        for region in [SRC, DST] {
            let except = partial.as_ref().map_or(&[][..], |p| &p[region][..]);
            if let Some(diff) = first_difference(&got.0[region], &model.0[region], except) {
                panic!("host {x}, region {region} after {done} of {n} requests: {diff}");
            }
        }

        // The responder: the effects of some prefix of the requests, at least
        // the successful ones; the first request left out may have placed
        // part of its data.
        let receives = of(y, CqKind::Recv);
        let flushed = world.hosts[y].qps[&QPNS[y]].state() == QpState::Err;
        let all_receives: Vec<&RecvWr> = self.ops.iter().filter_map(|op| op.recv.as_ref()).collect();
        let mut received: Vec<WorkCompletion> =
            self.ops[..done].iter().filter_map(|op| op.recv_completion(QPNS[y])).collect();
        // `m` indexes both the ops and the requests, and runs one past them.
        #[allow(clippy::needless_range_loop)]
        for m in done..=n {
            let partial = self.ops.get(m).filter(|op| op.places_in_pieces()).map(|op| model.placement(op));
            let matches = [DATA, RECV].into_iter().all(|region| {
                let except = partial.as_ref().map_or(&[][..], |p| &p[region][..]);
                first_difference(&got.0[region], &model.0[region], except).is_none()
            });
            let mut expected = received.clone();
            if flushed {
                let flush = all_receives[received.len()..]
                    .iter()
                    .map(|r| WorkCompletion::new(r.wr_id, QPNS[y], WcStatus::WrFlushErr, WcOpcode::Recv));
                expected.extend(flush);
            }
            if matches && receives == expected {
                return done < n;
            }
            if let Some(op) = self.ops.get(m) {
                model.apply(op, &requests[m]);
                received.extend(op.recv_completion(QPNS[y]));
            }
        }
        let diff = [DATA, RECV].iter().find_map(|&r| first_difference(&got.0[r], &model.0[r], &[]));
        panic!(
            "host {y} is in no state a prefix of {done}..={n} of the {n} requests from host {x} leaves; \
             against all {n}: {}; receive completions {receives:?}",
            diff.unwrap_or_else(|| "memory matches".into())
        );
    }
}

impl Op {
    /// Whether the responder may have placed part of the data when it stops
    /// half-way: SENDs and WRITEs (a READ changes nothing there, an atomic
    /// one word at once).
    fn places_in_pieces(&self) -> bool {
        matches!(self.kind, Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm)
    }

    /// The receive completion this request produces on success.
    pub(crate) fn recv_completion(&self, qpn: u32) -> Option<WorkCompletion> {
        let recv = self.recv.as_ref()?;
        let (opcode, imm) = match self.kind {
            Kind::WriteImm => (WcOpcode::RecvRdmaWithImm, Some(self.operand as u32)),
            Kind::SendImm => (WcOpcode::Recv, Some(self.operand as u32)),
            _ => (WcOpcode::Recv, None),
        };
        let mut wc = WorkCompletion::new(recv.wr_id, qpn, WcStatus::Success, opcode);
        wc.byte_len = self.len as u32;
        wc.imm = imm;
        Some(wc)
    }
}

/// The four regions one direction's requests use: SRC and DST of the
/// requester, DATA and RECV of the responder.
#[derive(Clone)]
pub(crate) struct Model(pub(crate) [Vec<u8>; 4]);

impl Model {
    /// The regions of requests from host `requester` to the other.
    pub(crate) fn of(world: &SimWorld, requester: usize) -> Model {
        Model([SRC, DST, DATA, RECV].map(|region| {
            let host = if region == SRC || region == DST { requester } else { 1 - requester };
            world.hosts[host].mem.region(KEYS[region]).expect("registered").data.clone()
        }))
    }

    /// The region and offset an SGE names.
    fn locate(sge: &Sge) -> (usize, usize) {
        let region = KEYS.iter().position(|k| *k == sge.lkey).expect("known key");
        (region, (sge.addr - BASES[region]) as usize)
    }

    fn gather(&self, sges: &[Sge]) -> Vec<u8> {
        let mut out = Vec::new();
        for sge in sges {
            let (region, at) = Model::locate(sge);
            out.extend_from_slice(&self.0[region][at..at + sge.length as usize]);
        }
        out
    }

    fn scatter(&mut self, sges: &[Sge], mut data: &[u8]) {
        for sge in sges {
            let (region, at) = Model::locate(sge);
            let n = data.len().min(sge.length as usize);
            self.0[region][at..at + n].copy_from_slice(&data[..n]);
            data = &data[n..];
        }
        assert!(data.is_empty(), "model: the data fits its SGEs");
    }

    pub(crate) fn word(&self, at: usize) -> u64 {
        u64::from_ne_bytes(self.0[DATA][at..at + 8].try_into().expect("8 bytes"))
    }

    /// Byte ranges of the SGEs, by region.
    fn ranges(&self, sges: &[Sge]) -> [Vec<Range<usize>>; 4] {
        let mut ranges = [vec![], vec![], vec![], vec![]];
        for sge in sges {
            let (region, at) = Model::locate(sge);
            ranges[region].push(at..at + sge.length as usize);
        }
        ranges
    }

    /// Where a SEND or WRITE places its data at the responder.
    fn placement(&self, op: &Op) -> [Vec<Range<usize>>; 4] {
        match &op.recv {
            Some(recv) if matches!(op.kind, Kind::Send | Kind::SendImm) => self.ranges(&recv.sg_list),
            _ => {
                let mut ranges = [vec![], vec![], vec![], vec![]];
                ranges[DATA].push(op.remote..op.remote + op.len);
                ranges
            }
        }
    }

    /// Executes a request once, as RC does.
    pub(crate) fn apply(&mut self, op: &Op, wr: &SendWr) {
        match wr.op {
            SendOp::Send | SendOp::SendWithImm(_) => {
                let message = self.gather(&op.local);
                self.scatter(&op.recv.as_ref().expect("a SEND consumes a receive").sg_list, &message);
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => {
                let message = self.gather(&op.local);
                self.0[DATA][op.remote..op.remote + op.len].copy_from_slice(&message);
            }
            SendOp::RdmaRead { .. } => {
                let message = self.0[DATA][op.remote..op.remote + op.len].to_vec();
                self.scatter(&op.local, &message);
            }
            SendOp::CompareSwap { compare, swap, .. } => {
                let original = self.word(op.remote);
                let new = if original == compare { swap } else { original };
                self.0[DATA][op.remote..op.remote + 8].copy_from_slice(&new.to_ne_bytes());
                self.scatter(&op.local, &original.to_ne_bytes());
            }
            SendOp::FetchAdd { add, .. } => {
                let original = self.word(op.remote);
                self.0[DATA][op.remote..op.remote + 8].copy_from_slice(&original.wrapping_add(add).to_ne_bytes());
                self.scatter(&op.local, &original.to_ne_bytes());
            }
            SendOp::SendWithInv(_)
            | SendOp::BindMw(_)
            | SendOp::LocalInv(_)
            | SendOp::AtomicWrite { .. }
            | SendOp::Flush { .. } => unreachable!("not generated"),
        }
    }
}

/// The first byte where `got` and `want` differ outside `except`, described.
pub(crate) fn first_difference(got: &[u8], want: &[u8], except: &[Range<usize>]) -> Option<String> {
    if got == want {
        return None;
    }
    let at = (0..got.len().max(want.len()))
        .find(|&i| !except.iter().any(|r| r.contains(&i)) && got.get(i) != want.get(i))?;
    Some(format!("first difference at offset {at}: {:?}, expected {:?}", got.get(at), want.get(at)))
}
