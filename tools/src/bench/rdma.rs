//! The softroce rows: RC WRITE, SEND and READ streams and SEND ping-pongs
//! between two devices on loopback UDP (127.0.0.1 and 127.0.0.2), run the
//! way perftest runs them: a window of requests in flight per QP, every
//! few of them signaled, refilled as completions come. Rows with two
//! engines per side run a second pair of devices (127.0.0.3 and 127.0.0.4),
//! each with its own engine thread, half the QPs and its own application
//! threads.
//!
//! The application threads wait for completions by sleeping on the CQ, not
//! by spinning: spinning would take the cores the engines need (the
//! machines this runs on have few).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softroce::transport::{Access, Mtu, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus, WorkCompletion};
use softroce::verbs::{
    AckTimeout, CompletionQueue, ConnectOptions, Context, ContextOptions, Device, MemoryRegion, ProtectionDomain,
    QueuePair,
};

use softroce::stages::{self, Stage};

use super::{print_stages, Case, Conn, Measured, Meter, Test, Timing};

/// The requester's and the responder's address of each pair of devices.
const ADDRESSES: [(Ipv4Addr, Ipv4Addr); MAX_ENGINES] = [
    (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)),
    (Ipv4Addr::new(127, 0, 0, 3), Ipv4Addr::new(127, 0, 0, 4)),
];
/// Pairs of devices, so engine threads per side, a row can use.
pub const MAX_ENGINES: usize = 2;
/// Loopback's MTU, so that the active RoCE MTU is 4096.
pub(super) const LINK_MTU: u32 = 65536;
/// GID index of the IPv4 address (index 0 is the link-local GID).
pub(super) const GID_INDEX: usize = 1;
pub(super) const ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

/// Each side's memory region: what is sent or read from, then where WRITEs,
/// SENDs and READ responses land (every message of a run at the same place,
/// as in perftest).
pub(super) const SOURCE_AT: usize = 0;
pub(super) const SINK_AT: usize = 4 << 20;
const REGION_LEN: usize = 8 << 20;

/// Requests in flight per QP: perftest's default of 128, fewer for large
/// messages (the PSN window holds those back anyway).
const MAX_IN_FLIGHT: usize = 128;
const MAX_BYTES_IN_FLIGHT: usize = 32 << 20;
/// Bytes all the QPs of a stream keep posted before each keeps only a few
/// requests in flight ([`InFlight::for_stream`]).
const MAX_STREAM_BYTES: usize = 256 << 20;
/// Each QP's window is refilled in this many groups, the last request of
/// each signaled: completions cost little, as with perftest's `--cq-mod`.
const GROUPS: usize = 8;
/// Outstanding READs per QP, each way: what mlx5 NICs allow.
const RD_ATOMIC: u8 = 16;
/// The local ACK timeout: perftest's default, 4.096 µs << 14 = 67 ms.
const ACK_TIMEOUT: u8 = 14;
/// Receives kept posted per QP in the SEND stream: the QP's whole receive
/// queue, more than the sender ever has in flight, so no SEND meets RNR.
const RECV_DEPTH: usize = 256;
/// Completions a CQ holds: every signaled request and receive of 4 QPs.
pub(super) const CQ_DEPTH: usize = 4096;

/// A wait for a completion that must come fails the row after this.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Threads that wait for something that may not come check every so often
/// whether to stop.
const POLL: Duration = Duration::from_millis(20);

/// The two devices, open for the whole bench; each row connects its own QPs.
pub struct Devices {
    pairs: Vec<Pair>,
}

/// Two devices: `a` requests, `b` responds.
struct Pair {
    a: Side,
    b: Side,
}

/// One device, with a region for every row.
pub(super) struct Side {
    pub(super) ctx: Context,
    pub(super) pd: ProtectionDomain,
    pub(super) mr: MemoryRegion,
}

impl Side {
    pub(super) fn open(device: &Device, options: ContextOptions) -> softroce::verbs::Result<Side> {
        let ctx = Context::open(device, options)?;
        let pd = ctx.alloc_pd()?;
        let mr = pd.alloc_mr(REGION_LEN, ACCESS)?;
        // Touched, so that no run reads the kernel's shared zero page.
        mr.write(0, &vec![0xa5; REGION_LEN])?;
        Ok(Side { ctx, pd, mr })
    }

    /// Posts a receive of `size` bytes into the sink.
    fn recv(&self, qp: &QueuePair, wr_id: u64, size: usize) -> Result<(), String> {
        qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![self.mr.sge(SINK_AT, size)] })
            .map_err(|e| e.to_string())
    }
}

impl Devices {
    /// Opens the devices on `port`, or else on a free port, with `options`
    /// otherwise.
    pub fn open(port: Option<u16>, options: ContextOptions) -> Result<Devices, String> {
        let device = |name: String, ip: Ipv4Addr| {
            let [.., c, d] = ip.octets();
            Device::custom(&name, vec![IpAddr::V4(ip)], [0x02, 0, 0, 0, c, d], LINK_MTU)
        };
        let open = |port| -> softroce::verbs::Result<Devices> {
            let mut pairs = Vec::new();
            for (i, &(a, b)) in ADDRESSES.iter().enumerate() {
                let options = ContextOptions { port, ..options.clone() };
                let a = Side::open(&device(format!("bench_a{i}"), a), options.clone())?;
                let b = Side::open(&device(format!("bench_b{i}"), b), options)?;
                pairs.push(Pair { a, b });
            }
            Ok(Devices { pairs })
        };
        if let Some(port) = port {
            return open(port).map_err(|e| format!("cannot open the devices on port {port}: {e}"));
        }
        // Another process may take a free port before we bind it: try a few.
        let mut why = String::new();
        for _ in 0..10 {
            match open(free_port()?) {
                Ok(devices) => return Ok(devices),
                Err(e) => why = e.to_string(),
            }
        }
        Err(format!("cannot open the devices on a free port: {why}"))
    }

    /// Retransmissions so far, by both devices.
    fn retries(&self) -> u64 {
        self.pairs.iter().flat_map(|p| [&p.a, &p.b]).map(|s| s.ctx.counters().qp.retries).sum()
    }

    /// A stream of RC WRITEs, SENDs or READs of `case.size` bytes over
    /// `case.conn`'s QPs, counted as the requester's completions arrive.
    pub fn stream(&self, case: &Case, timing: &Timing) -> Result<Measured, String> {
        let conn = case.conn.expect("a softroce row");
        let pairs = self.pairs.get(..conn.engines).filter(|p| !p.is_empty() && conn.qps.is_multiple_of(p.len()));
        let pairs = pairs.ok_or_else(|| format!("{} QPs over {} engines per side", conn.qps, conn.engines))?;
        let links = pairs
            .iter()
            .map(|pair| Link::connect(pair, Conn { qps: conn.qps / pairs.len(), ..conn }))
            .collect::<Result<Vec<Link>, String>>()?;
        let in_flight = InFlight::for_stream(case.size, conn.qps);
        let retries = self.retries();
        let meter = Meter::default();
        let (window, results) = std::thread::scope(|s| {
            let runs: Vec<_> = pairs
                .iter()
                .zip(&links)
                .map(|(pair, link)| {
                    let meter = &meter;
                    s.spawn(move || pair.stream(case, link, in_flight, meter))
                })
                .collect();
            let window = meter.time(&in_flight.timing(timing, conn.qps));
            (window, runs.into_iter().map(joined).collect::<Vec<_>>())
        });
        results.into_iter().collect::<Result<Vec<()>, String>>()?;
        Ok(Measured { window, rtts: Vec::new(), retries: Some(self.retries() - retries), per_qp: meter.take_per_qp() })
    }
}

/// One round of `write-rate-idle`: the 64 B WRITE rate of one QP alone,
/// then the same with `case`'s other QPs connected and idle on the same
/// devices, and what those cost to set up and tear down.
pub struct IdleRound {
    pub alone: Measured,
    pub among_idle: Measured,
    /// Creating and connecting one idle pair of QPs (both sides), in µs.
    pub setup_us: f64,
    /// Destroying one, in µs.
    pub teardown_us: f64,
    /// The process's resident memory an idle pair adds, in KiB.
    pub rss_kib: f64,
}

impl Devices {
    /// [`IdleRound`]: the busy QP is a fresh one each time, the idle ones
    /// live only through the second measurement.
    pub fn write_rate_among_idle(&self, case: &Case, timing: &Timing) -> Result<IdleRound, String> {
        let conn = case.conn.expect("a softroce row");
        let busy = Case { test: Test::WriteRate, conn: Some(Conn { qps: 1, engines: 1, ..conn }), ..*case };
        let alone = self.stream(&busy, timing)?;
        let idle_pairs = conn.qps.saturating_sub(1).max(1);
        let rss_before = resident_kib();
        let started = Instant::now();
        let idle = Link::connect(&self.pairs[0], Conn { qps: idle_pairs, engines: 1, ..conn })?;
        let setup = started.elapsed();
        let rss_kib = (resident_kib() as f64 - rss_before as f64) / idle_pairs as f64;
        let among_idle = self.stream(&busy, timing)?;
        let started = Instant::now();
        drop(idle);
        let teardown = started.elapsed();
        let per_pair = |d: Duration| d.as_secs_f64() * 1e6 / idle_pairs as f64;
        Ok(IdleRound { alone, among_idle, setup_us: per_pair(setup), teardown_us: per_pair(teardown), rss_kib })
    }
}

/// The process's resident set, in KiB (0 where /proc cannot say).
fn resident_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4
}

impl Pair {
    /// One pair's part of a stream: its sender (and for SENDs, its
    /// receiver) until the meter stops.
    fn stream(&self, case: &Case, link: &Link, in_flight: InFlight, meter: &Meter) -> Result<(), String> {
        let (size, remote) = (case.size, self.b.mr.remote());
        let (op, local) = match case.test {
            Test::RcWrite | Test::WriteRate | Test::WriteRateList | Test::WriteRateIdle => {
                let op = SendOp::RdmaWrite { remote_addr: remote.addr + SINK_AT as u64, rkey: remote.rkey };
                (op, self.a.mr.sge(SOURCE_AT, size))
            }
            Test::RcSend => (SendOp::Send, self.a.mr.sge(SOURCE_AT, size)),
            Test::RcRead => {
                let op = SendOp::RdmaRead { remote_addr: remote.addr + SOURCE_AT as u64, rkey: remote.rkey };
                (op, self.a.mr.sge(SINK_AT, size))
            }
            Test::Udp
            | Test::UdpGso
            | Test::Tcp
            | Test::UdpLat
            | Test::UdpGsoLat
            | Test::TcpLat
            | Test::SendLat
            | Test::UdpAlone
            | Test::UdpSteered
            | Test::ProcsWrite
            | Test::SharedWrite => unreachable!("not a stream between this process's devices"),
        };
        let sends = case.test == Test::RcSend;
        if sends {
            for (index, (_, qp)) in link.qps.iter().enumerate() {
                for _ in 0..RECV_DEPTH {
                    self.b.recv(qp, index as u64, size)?;
                }
            }
        }
        let sender_done = AtomicBool::new(false);
        let (sent, received) = std::thread::scope(|s| {
            let receiver = sends.then(|| s.spawn(|| link.repost_receives(self.b.mr.sge(SINK_AT, size), &sender_done)));
            let lists = case.test == Test::WriteRateList;
            let sent = link.post_stream(op, local, in_flight, lists, meter);
            sender_done.store(true, Ordering::Relaxed);
            (sent, receiver.map(joined))
        });
        sent?;
        received.transpose()?;
        Ok(())
    }
}

impl Devices {
    /// SEND ping-pong of `case.size` bytes on the first QP: one thread sends
    /// and waits for the answer, the other answers each SEND with one.
    pub fn ping_pong(&self, case: &Case, timing: &Timing) -> Result<Measured, String> {
        let conn = case.conn.expect("a softroce row");
        let pair = &self.pairs[0];
        let link = Link::connect(pair, conn)?;
        let size = case.size;
        let (qp_a, qp_b) = &link.qps[0];
        pair.a.recv(qp_a, 0, size)?;
        pair.b.recv(qp_b, 0, size)?;
        let send = |side: &Side, qp: &QueuePair| {
            stages::mark(Stage::Post);
            let mut wr = SendWr::new(0, SendOp::Send).with_sge(side.mr.sge(SOURCE_AT, size));
            // Unsignaled: only receives complete, so each wait sees the answer.
            wr.flags.signaled = false;
            qp.post_send(wr).map_err(|e| e.to_string())
        };
        let retries = self.retries();
        let meter = Meter::default();
        let pinger_done = AtomicBool::new(false);
        let (window, pinged, answered) = std::thread::scope(|s| {
            let pinger = s.spawn(|| {
                stages::reset();
                let mut rtts = Vec::new();
                let pinged = (|| {
                    while !meter.stopped() {
                        let start = Instant::now();
                        send(&pair.a, qp_a)?;
                        expect(link.wait_a(STEP_TIMEOUT)?, "ping-pong answer")?;
                        stages::mark(Stage::Completed);
                        let rtt = start.elapsed();
                        pair.a.recv(qp_a, 0, size)?;
                        if meter.measuring() {
                            rtts.push(rtt);
                        }
                        meter.add(2 * size as u64, 2);
                    }
                    Ok::<(), String>(())
                })();
                pinger_done.store(true, Ordering::Relaxed);
                print_stages(&format!("{} {}, the pinger", case.test.name(), case.size));
                pinged.map(|()| rtts)
            });
            let answerer = s.spawn(|| {
                stages::reset();
                while !pinger_done.load(Ordering::Relaxed) {
                    let Some(wc) = link.b_cq.wait_one(POLL) else { continue };
                    stages::mark(Stage::Completed);
                    expect(wc, "ping")?;
                    pair.b.recv(qp_b, 0, size)?;
                    send(&pair.b, qp_b)?;
                }
                print_stages(&format!("{} {}, the answerer", case.test.name(), case.size));
                Ok::<(), String>(())
            });
            let window = meter.time(timing);
            (window, joined(pinger), joined(answerer))
        });
        let mut rtts = pinged?;
        answered?;
        rtts.sort_unstable();
        Ok(Measured { window, rtts, retries: Some(self.retries() - retries), per_qp: Vec::new() })
    }
}

/// A UDP port free on every address at the moment of asking.
fn free_port() -> Result<u16, String> {
    let all: Vec<IpAddr> = ADDRESSES.iter().flat_map(|&(a, b)| [IpAddr::V4(a), IpAddr::V4(b)]).collect();
    softroce::net::udp::free_port(&all).map_err(|e| format!("no free UDP port on {all:?}: {e}"))
}

/// A scoped thread's result; a panic is an error of the row.
pub(super) fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, Result<T, String>>) -> Result<T, String> {
    handle.join().unwrap_or_else(|_| Err("a bench thread panicked".to_owned()))
}

pub(super) fn expect(wc: WorkCompletion, what: &str) -> Result<(), String> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(format!("{what}: completion status {:?} ({})", wc.status, wc.status.as_str()))
    }
}

/// How many requests a QP keeps in flight, and how many of them are
/// refilled at once (the last of each such group is signaled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct InFlight {
    depth: u64,
    group: u64,
}

impl InFlight {
    pub(super) fn for_size(size: usize) -> InFlight {
        let depth = (MAX_BYTES_IN_FLIGHT / size.max(1)).clamp(GROUPS, MAX_IN_FLIGHT);
        InFlight { depth: depth as u64, group: (depth / GROUPS) as u64 }
    }

    /// How long a stream over `qps` QPs is measured: past [`InFlight::for_stream`]'s
    /// limit, long enough that each QP's fair share is several messages
    /// (four times `timing`): at 4096 QPs half a second holds about five
    /// 64 KiB messages a QP, where one message more or less is a fifth of
    /// a share.
    pub(super) fn timing(&self, timing: &Timing, qps: usize) -> Timing {
        let scale = if self.group == 1 && qps >= 1024 { 4 } else { 1 };
        Timing { warmup: timing.warmup, seconds: timing.seconds * scale }
    }

    /// For a stream over `qps` QPs: as [`InFlight::for_size`] while they
    /// post at most [`MAX_STREAM_BYTES`] in all; past that each keeps a few
    /// requests in flight, every one signaled, so that a QP's messages are
    /// counted one by one (with 4096 QPs a fair share of half a second is a
    /// handful of 64 KiB messages, fewer than a group).
    pub(super) fn for_stream(size: usize, qps: usize) -> InFlight {
        let alone = InFlight::for_size(size);
        if (alone.depth as usize).saturating_mul(size).saturating_mul(qps) <= MAX_STREAM_BYTES {
            return alone;
        }
        InFlight { depth: GROUPS as u64, group: 1 }
    }
}

/// RC connections between the devices for one row: `a` requests, `b`
/// responds; each side's QPs share one CQ.
struct Link {
    a_cq: CompletionQueue,
    b_cq: CompletionQueue,
    qps: Vec<(QueuePair, QueuePair)>,
}

/// How every row's QPs connect: perftest's attributes.
pub(super) fn connect_options(mtu: Mtu) -> ConnectOptions {
    ConnectOptions {
        access: ACCESS,
        mtu: Some(mtu),
        timeout: AckTimeout::from_exponent(ACK_TIMEOUT).expect("an exponent"),
        max_rd_atomic: RD_ATOMIC,
        max_dest_rd_atomic: RD_ATOMIC,
        ..ConnectOptions::default()
    }
}

/// Work request ids carry the QP's index above this many bits of sequence.
const SEQ_BITS: u32 = 40;

impl Link {
    fn connect(devices: &Pair, conn: Conn) -> Result<Link, String> {
        let failed =
            |e: softroce::verbs::Error| format!("connecting {} QPs at MTU {}: {e}", conn.qps, conn.mtu.bytes());
        // Every QP's signaled requests in flight, within the device's limit.
        let max_cqe = devices.a.ctx.device().query_device().max_cqe as usize;
        let depth = CQ_DEPTH.max(conn.qps * GROUPS).min(max_cqe);
        let (a_cq, b_cq) = (
            devices.a.ctx.create_cq(depth, None).map_err(failed)?,
            devices.b.ctx.create_cq(depth, None).map_err(failed)?,
        );
        let options = connect_options(conn.mtu);
        let mut qps = Vec::with_capacity(conn.qps);
        for _ in 0..conn.qps {
            let qp = |side: &Side, cq: &CompletionQueue| side.pd.create_qp(QpType::Rc, cq).build();
            let (qp_a, qp_b) = (qp(&devices.a, &a_cq).map_err(failed)?, qp(&devices.b, &b_cq).map_err(failed)?);
            qp_a.connect(&qp_b.endpoint(GID_INDEX).map_err(failed)?, &options).map_err(failed)?;
            qp_b.connect(&qp_a.endpoint(GID_INDEX).map_err(failed)?, &options).map_err(failed)?;
            qps.push((qp_a, qp_b));
        }
        Ok(Link { a_cq, b_cq, qps })
    }

    fn wait_a(&self, timeout: Duration) -> Result<WorkCompletion, String> {
        self.a_cq.wait_one(timeout).ok_or_else(|| format!("no completion within {} s", timeout.as_secs()))
    }

    /// Keeps `window` requests in flight on every QP until the meter stops
    /// ([`post_stream`]).
    fn post_stream(&self, op: SendOp, local: Sge, window: InFlight, lists: bool, meter: &Meter) -> Result<(), String> {
        let qps: Vec<&QueuePair> = self.qps.iter().map(|(a, _)| a).collect();
        post_stream(&qps, &self.a_cq, op, local, window, lists, meter)
    }

    /// Gives each SEND's receive (into `sink`) back to its QP until the
    /// sender is done.
    fn repost_receives(&self, sink: Sge, sender_done: &AtomicBool) -> Result<(), String> {
        while !sender_done.load(Ordering::Relaxed) {
            let Some(wc) = self.b_cq.wait_one(POLL) else { continue };
            expect(wc, "stream receive")?;
            let qp = &self.qps[wc.wr_id as usize].1;
            qp.post_recv(RecvWr { wr_id: wc.wr_id, sg_list: softroce::sg_list![sink] }).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Keeps `window` requests in flight on every one of `qps` (whose sends
/// complete on `cq`) until the meter stops, then waits for the last of
/// them; with `lists`, each group of them goes in one post.
pub(super) fn post_stream(
    qps: &[&QueuePair],
    cq: &CompletionQueue,
    op: SendOp,
    local: Sge,
    window: InFlight,
    lists: bool,
    meter: &Meter,
) -> Result<(), String> {
    let size = u64::from(local.length);
    let mut posted = vec![0u64; qps.len()];
    let mut done = vec![0u64; qps.len()];
    let mut in_window = vec![0u64; qps.len()];
    // A group ends with its one signaled request; `lists` posts it whole.
    let post_group = |qp: usize, posted: &mut u64| -> Result<(), String> {
        let first = *posted;
        let wrs = (first..first + window.group).map(|n| {
            let mut wr = SendWr::new((qp as u64) << SEQ_BITS | n, op).with_sge(local);
            wr.flags.signaled = (n + 1) % window.group == 0;
            wr
        });
        *posted += window.group;
        let qp = qps[qp];
        if lists {
            qp.post_send_list(wrs).map_err(|(_, e)| e.to_string())
        } else {
            wrs.into_iter().try_for_each(|wr| qp.post_send(wr)).map_err(|e| e.to_string())
        }
    };
    for (qp, posted) in posted.iter_mut().enumerate() {
        for _ in 0..window.depth / window.group {
            post_group(qp, posted)?;
        }
    }
    while posted != done {
        let wc =
            cq.wait_one(STEP_TIMEOUT).ok_or_else(|| format!("no completion within {} s", STEP_TIMEOUT.as_secs()))?;
        expect(wc, "stream request")?;
        let qp = (wc.wr_id >> SEQ_BITS) as usize;
        // RC completes in order: a signaled request vouches for those before it.
        let through = (wc.wr_id & ((1 << SEQ_BITS) - 1)) + 1;
        let newly = through - done[qp];
        done[qp] = through;
        meter.add(newly * size, newly);
        if meter.measuring() {
            in_window[qp] += newly;
        }
        if !meter.stopped() {
            post_group(qp, &mut posted[qp])?;
        }
    }
    meter.add_per_qp(&in_window);
    Ok(())
}
