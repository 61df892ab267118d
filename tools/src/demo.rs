//! `softroce demo`: the whole stack at work on one host. Two devices on
//! loopback (127.0.0.1 and 127.0.0.2) speak RoCEv2 to each other over real UDP
//! sockets; an RC connection runs every operation once, checking each byte
//! and completion, then measures bandwidth and latency.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use softroce::transport::{Access, Mtu, QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};
use softroce::verbs::{
    self, CompletionQueue, ConnectOptions, Context, ContextOptions, Device, MemoryRegion, QueuePair,
};
use softroce::wire::ROCE_UDP_PORT;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::cli::{seconds, Zero};

/// Prints a line of the report. A closed stdout (`| head`) does not stop the
/// checks: the exit status still tells whether they passed.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

#[derive(clap::Args)]
#[command(after_help = "Prints one line per checked operation, then a summary of bandwidth, latency \
    and device counters. Exits non-zero if any byte or completion is wrong or a step times out.")]
pub struct Args {
    /// UDP port of both devices [default: 4791, or a free port if 4791 cannot be bound]
    #[arg(long)]
    port: Option<u16>,
    /// How long the bandwidth run lasts (it completes one window of 16 messages at least, so 0 is a run too).
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = |s: &str| seconds(s, Zero::Allowed))]
    seconds: Duration,
    /// Print the transport's per-packet trace of the checks on stderr (the benchmarks run untraced).
    #[arg(short, long)]
    verbose: bool,
}

/// The process's log filter; `-v` widens it while the checks run.
pub type LogFilter = reload::Handle<EnvFilter, Registry>;

/// The events the transport emits for each packet.
const PACKET_TRACE: &str = "softroce::transport=trace";

/// The devices: one address each, a link MTU so large that the active RoCE
/// MTU is the largest (4096), as on a jumbo-frame link.
const ADDRESS_A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const ADDRESS_B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const LINK_MTU: u32 = 65536;
/// GID index of the IPv4 address (index 0 is the link-local GID).
const GID_INDEX: usize = 1;
/// Every operation is allowed on both the memory regions and the QPs.
const ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// Every wait ends after this: a lost completion fails the demo, not hangs it.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of each checked transfer: several packets at every MTU.
const MESSAGE: usize = 10_000;
const IMM: u32 = 0x5eed_1234;

/// The bandwidth run: RDMA WRITEs of this size, this many in flight.
const BW_MESSAGE: usize = 1 << 20;
const BW_IN_FLIGHT: usize = 16;
/// The latency run: SEND ping-pong of this many bytes.
const PING: usize = 8;
const ROUND_TRIPS: usize = 2000;

/// The layout of each side's memory region: sources of SENDs and WRITEs,
/// receive buffers, targets of WRITEs and READs, the atomics' word and the
/// bandwidth run's source (its WRITEs land at 0).
const REGION_LEN: usize = 2 << 20;
const SOURCE_AT: usize = 0;
const RECV_AT: usize = 16 << 10;
/// Receive buffers are larger than the message, so byte_len must say how
/// much arrived rather than how much room there was.
const RECV_LEN: usize = 16 << 10;
const WRITE_AT: usize = 32 << 10;
const READ_AT: usize = 48 << 10;
const WORD_AT: usize = 64 << 10;
const BW_SOURCE_AT: usize = 1 << 20;

pub fn run(args: Args, log: &LogFilter) -> ExitCode {
    match demo(&args, log) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce demo: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo(args: &Args, log: &LogFilter) -> Result<(), String> {
    let (a, b, port) = open_devices(args.port)?;
    say!("softroce demo: RoCEv2 over UDP port {port} on loopback");
    for ctx in [&a, &b] {
        let device = ctx.device();
        let gid = device.gid(GID_INDEX).ok_or("a device without an IPv4 GID")?;
        say!(
            "  {}  {}  GID {gid}  link MTU {}, active MTU {}",
            device.name(),
            gid.to_ip(),
            device.link_mtu(),
            device.active_mtu().bytes()
        );
    }

    if args.verbose {
        packet_trace(log, true)?;
    }
    let pair = Pair::connect(&a, &b, a.device().active_mtu())?;
    let small = Pair::connect(&a, &b, Mtu::Mtu1024)?;
    for p in [&pair, &small] {
        p.run_checks()?;
    }
    drop(small);
    if args.verbose {
        packet_trace(log, false)?;
    }

    let bandwidth = pair.bandwidth(args.seconds)?;
    let wait = Wait::for_this_host();
    let latency = pair.latency(wait)?;
    say!("summary");
    say!(
        "  bandwidth  RDMA WRITE {} MiB x {BW_IN_FLIGHT} in flight, MTU {}: {:.2} GB/s ({:.2} Gbit/s), {:.0} msg/s, {} messages in {:.2} s",
        BW_MESSAGE >> 20,
        pair.mtu.bytes(),
        bandwidth.bytes_per_second() / 1e9,
        bandwidth.bytes_per_second() * 8.0 / 1e9,
        bandwidth.messages_per_second(),
        bandwidth.messages,
        bandwidth.elapsed.as_secs_f64()
    );
    say!(
        "  latency    SEND {PING} B ping-pong, {} round trips, {}: median {:.1} µs, p99 {:.1} µs (round trip)",
        latency.len(),
        wait.name(),
        micros(percentile(&latency, 50.0)),
        micros(percentile(&latency, 99.0))
    );
    for ctx in [&a, &b] {
        let c = ctx.counters();
        say!(
            "  counters   {}: {} packets sent, {} received, {} retries, {} timeouts, {} ICRC errors",
            ctx.device().name(),
            c.link.sent,
            c.link.received,
            c.qp.retries,
            c.qp.timeouts,
            c.link.icrc_errors
        );
    }
    Ok(())
}

/// Turns the per-packet trace on or off, on top of whatever SOFTROCE_LOG asks.
fn packet_trace(log: &LogFilter, on: bool) -> Result<(), String> {
    let mut filter = EnvFilter::from_env(crate::LOG_ENV);
    if on {
        filter = filter.add_directive(PACKET_TRACE.parse().expect("a valid directive"));
    }
    log.reload(filter).map_err(|e| format!("log filter: {e}"))
}

/// Opens the two devices on one UDP port: `port` if given, else 4791, else
/// (4791 taken, say by kernel rxe) a free one.
fn open_devices(port: Option<u16>) -> Result<(Context, Context, u16), String> {
    let devices = [
        Device::custom("demo_a", vec![ADDRESS_A], [0x02, 0, 0, 0, 0, 0x0a], LINK_MTU),
        Device::custom("demo_b", vec![ADDRESS_B], [0x02, 0, 0, 0, 0, 0x0b], LINK_MTU),
    ];
    if let Some(port) = port {
        return open_both(&devices, port).map_err(|e| format!("cannot open the devices: {e}"));
    }
    let why = match open_both(&devices, ROCE_UDP_PORT) {
        Ok(opened) => return Ok(opened),
        Err(e) => e,
    };
    // Another process may take a free port before we bind it: try a few.
    for _ in 0..10 {
        let port =
            softroce::net::udp::free_port(&[ADDRESS_A, ADDRESS_B]).map_err(|e| format!("no free UDP port: {e}"))?;
        if let Ok(opened) = open_both(&devices, port) {
            say!("port {ROCE_UDP_PORT} unavailable ({why}); using free port {port}");
            return Ok(opened);
        }
    }
    Err(format!("cannot open the devices on port {ROCE_UDP_PORT} ({why}) nor on a free port"))
}

fn open_both(devices: &[Device; 2], port: u16) -> verbs::Result<(Context, Context, u16)> {
    let options = ContextOptions { port, busy_poll: false, ..ContextOptions::default() };
    Ok((Context::open(&devices[0], options.clone())?, Context::open(&devices[1], options)?, port))
}

/// One end of a connection.
struct Side {
    /// The device's name, for messages.
    device: String,
    qp: QueuePair,
    /// Send and receive completions both come here.
    cq: CompletionQueue,
    mr: MemoryRegion,
}

impl Side {
    fn new(ctx: &Context) -> verbs::Result<Side> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(256, None)?;
        let qp = pd.create_qp(QpType::Rc, &cq).build()?;
        let mr = pd.alloc_mr(REGION_LEN, ACCESS)?;
        Ok(Side { device: ctx.device().name().to_owned(), qp, cq, mr })
    }

    /// The next completion, sleeping until it comes.
    fn completion(&self) -> Result<WorkCompletion, String> {
        self.cq.wait_one(STEP_TIMEOUT).ok_or_else(|| self.timed_out())
    }

    /// The next completion, waiting as `wait` says.
    fn completion_by(&self, wait: Wait) -> Result<WorkCompletion, String> {
        if let Wait::Block = wait {
            return self.completion();
        }
        let deadline = Instant::now() + STEP_TIMEOUT;
        while Instant::now() < deadline {
            for _ in 0..1024 {
                if let Some(wc) = self.cq.poll_one() {
                    return Ok(wc);
                }
                std::hint::spin_loop();
            }
        }
        Err(self.timed_out())
    }

    fn timed_out(&self) -> String {
        format!("{} QP {:#x}: no completion within {} s", self.device, self.qp.qpn(), STEP_TIMEOUT.as_secs())
    }

    fn bytes(&self, offset: usize, len: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0; len];
        self.mr.read(offset, &mut out).map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn put(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        self.mr.write(offset, data).map_err(|e| e.to_string())
    }

    fn word(&self, offset: usize) -> Result<u64, String> {
        self.mr.load_u64(offset).map_err(|e| e.to_string())
    }

    fn post_send(&self, wr: SendWr) -> Result<(), String> {
        self.qp.post_send(wr).map_err(|e| e.to_string())
    }

    fn post_recv(&self, wr: RecvWr) -> Result<(), String> {
        self.qp.post_recv(wr).map_err(|e| e.to_string())
    }
}

/// An RC connection between the two devices: `a` is the requester, `b` the
/// responder (and, in the latency run, the one that answers).
struct Pair {
    a: Side,
    b: Side,
    mtu: Mtu,
}

/// What one check does, given its pair and its step (for wr_ids, data patterns
/// and the completions it saw).
type Check = fn(&Pair, &mut Step) -> Result<(), String>;

/// The checks in order: name, bytes moved, the check.
const CHECKS: [(&str, usize, Check); 8] = [
    ("SEND", MESSAGE, |p, s| p.send(s, None)),
    ("SEND_WITH_IMM", MESSAGE, |p, s| p.send(s, Some(IMM))),
    ("RDMA_WRITE", MESSAGE, |p, s| p.write(s, None)),
    ("RDMA_WRITE_WITH_IMM", MESSAGE, |p, s| p.write(s, Some(IMM))),
    ("RDMA_READ", MESSAGE, Pair::read),
    ("CMP_SWAP (equal)", 8, |p, s| p.compare_swap(s, true)),
    ("CMP_SWAP (not equal)", 8, |p, s| p.compare_swap(s, false)),
    ("FETCH_ADD", 8, Pair::fetch_add),
];

/// A check in progress.
struct Step {
    /// Numbers the check's work requests and seeds its data.
    id: u64,
    /// The completions seen, described for the report line.
    seen: Vec<String>,
}

impl Step {
    /// Waits for `side`'s next completion, records it and checks it.
    fn expect(&mut self, side: &Side, role: &str, want: Expected) -> Result<(), String> {
        let wc = side.completion()?;
        self.seen.push(format!("{role}: {}", describe(&wc)));
        check_completion(&wc, &want)
    }
}

impl Pair {
    fn connect(a: &Context, b: &Context, mtu: Mtu) -> Result<Pair, String> {
        let failed = |e: verbs::Error| format!("setting up the MTU {} connection: {e}", mtu.bytes());
        let (side_a, side_b) = (Side::new(a).map_err(failed)?, Side::new(b).map_err(failed)?);
        let ends = (side_a.qp.endpoint(GID_INDEX).map_err(failed)?, side_b.qp.endpoint(GID_INDEX).map_err(failed)?);
        let options = ConnectOptions { access: ACCESS, mtu: Some(mtu), ..ConnectOptions::default() };
        side_a.qp.connect(&ends.1, &options).map_err(failed)?;
        side_b.qp.connect(&ends.0, &options).map_err(failed)?;
        Ok(Pair { a: side_a, b: side_b, mtu })
    }

    /// Runs every check, one line each; stops at the first that fails.
    fn run_checks(&self) -> Result<(), String> {
        say!(
            "MTU {}: RC QP {:#x} ({ADDRESS_A}) <-> RC QP {:#x} ({ADDRESS_B})",
            self.mtu.bytes(),
            self.a.qp.qpn(),
            self.b.qp.qpn()
        );
        for (n, (name, bytes, check)) in CHECKS.iter().enumerate() {
            let mut step = Step { id: n as u64 + 1, seen: Vec::new() };
            let verdict = check(self, &mut step);
            let shown = match &verdict {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!("FAILED: {e}"),
            };
            say!("  {name:<21}{bytes:>6} B  {:<85} {shown}", step.seen.join("  "));
            verdict.map_err(|e| format!("{name} at MTU {}: {e}", self.mtu.bytes()))?;
        }
        Ok(())
    }

    /// SEND (with immediate data if `imm`) into a posted receive.
    fn send(&self, step: &mut Step, imm: Option<u32>) -> Result<(), String> {
        let data = pattern(MESSAGE, step.id);
        self.a.put(SOURCE_AT, &data)?;
        self.b.post_recv(RecvWr { wr_id: step.id, sg_list: softroce::sg_list![self.b.mr.sge(RECV_AT, RECV_LEN)] })?;
        let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
        self.a.post_send(SendWr::new(step.id, op).with_sge(self.a.mr.sge(SOURCE_AT, MESSAGE)))?;
        let len = MESSAGE as u32;
        step.expect(&self.a, "req", Expected { wr_id: step.id, opcode: WcOpcode::Send, byte_len: len, imm: None })?;
        step.expect(&self.b, "resp", Expected { wr_id: step.id, opcode: WcOpcode::Recv, byte_len: len, imm })?;
        check_bytes("received data", &self.b.bytes(RECV_AT, MESSAGE)?, &data)
    }

    /// RDMA WRITE; with immediate data it also consumes a receive (one with
    /// no buffer: the data goes where the WRITE says, not into the receive).
    fn write(&self, step: &mut Step, imm: Option<u32>) -> Result<(), String> {
        let data = pattern(MESSAGE, step.id);
        self.a.put(SOURCE_AT, &data)?;
        if imm.is_some() {
            self.b.post_recv(RecvWr { wr_id: step.id, sg_list: softroce::sg_list![] })?;
        }
        let (remote_addr, rkey) = (self.b.mr.addr() + WRITE_AT as u64, self.b.mr.rkey());
        let op = match imm {
            Some(imm) => SendOp::RdmaWriteWithImm { remote_addr, rkey, imm },
            None => SendOp::RdmaWrite { remote_addr, rkey },
        };
        self.a.post_send(SendWr::new(step.id, op).with_sge(self.a.mr.sge(SOURCE_AT, MESSAGE)))?;
        let len = MESSAGE as u32;
        step.expect(
            &self.a,
            "req",
            Expected { wr_id: step.id, opcode: WcOpcode::RdmaWrite, byte_len: len, imm: None },
        )?;
        match imm {
            Some(_) => {
                let want = Expected { wr_id: step.id, opcode: WcOpcode::RecvRdmaWithImm, byte_len: len, imm };
                step.expect(&self.b, "resp", want)?;
            }
            // The responder completed the WRITE before it acknowledged it,
            // so a completion, were there one, would be queued by now.
            None => {
                if let Some(wc) = self.b.cq.poll_one() {
                    return Err(format!("a plain RDMA WRITE completed at the responder: {}", describe(&wc)));
                }
            }
        }
        check_bytes("written data", &self.b.bytes(WRITE_AT, MESSAGE)?, &data)
    }

    /// RDMA READ of what the WRITEs left.
    fn read(&self, step: &mut Step) -> Result<(), String> {
        let written = self.b.bytes(WRITE_AT, MESSAGE)?;
        self.a.put(READ_AT, &[0; MESSAGE])?;
        let op = SendOp::RdmaRead { remote_addr: self.b.mr.addr() + WRITE_AT as u64, rkey: self.b.mr.rkey() };
        self.a.post_send(SendWr::new(step.id, op).with_sge(self.a.mr.sge(READ_AT, MESSAGE)))?;
        let want = Expected { wr_id: step.id, opcode: WcOpcode::RdmaRead, byte_len: MESSAGE as u32, imm: None };
        step.expect(&self.a, "req", want)?;
        check_bytes("read data", &self.a.bytes(READ_AT, MESSAGE)?, &written)
    }

    /// CMP_SWAP on a word that does (`equal`) or does not hold the compare
    /// value: either way the original comes back; only a match swaps.
    fn compare_swap(&self, step: &mut Step, equal: bool) -> Result<(), String> {
        const ORIGINAL: u64 = 0x0123_4567_89ab_cdef;
        const SWAP: u64 = 0xfedc_ba98_7654_3210;
        let compare = if equal { ORIGINAL } else { !ORIGINAL };
        let op = SendOp::CompareSwap {
            remote_addr: self.b.mr.addr() + WORD_AT as u64,
            rkey: self.b.mr.rkey(),
            compare,
            swap: SWAP,
        };
        self.atomic(step, op, ORIGINAL, if equal { SWAP } else { ORIGINAL })
    }

    /// FETCH_ADD with a carry across the 32-bit halves.
    fn fetch_add(&self, step: &mut Step) -> Result<(), String> {
        const ORIGINAL: u64 = 0xffff_ffff;
        let op = SendOp::FetchAdd { remote_addr: self.b.mr.addr() + WORD_AT as u64, rkey: self.b.mr.rkey(), add: 1 };
        self.atomic(step, op, ORIGINAL, 0x1_0000_0000)
    }

    /// Runs an atomic on the word at WORD_AT, set to `original` first, and
    /// checks the value returned and the word left.
    fn atomic(&self, step: &mut Step, op: SendOp, original: u64, after: u64) -> Result<(), String> {
        self.b.put(WORD_AT, &original.to_ne_bytes())?;
        self.a.put(WORD_AT, &[0; 8])?;
        self.a.post_send(SendWr::new(step.id, op).with_sge(self.a.mr.sge(WORD_AT, 8)))?;
        step.expect(&self.a, "req", Expected { wr_id: step.id, opcode: op.wc_opcode(), byte_len: 8, imm: None })?;
        let (returned, remote) = (self.a.word(WORD_AT)?, self.b.word(WORD_AT)?);
        step.seen.push(format!("returned {returned:#018x}, remote {remote:#018x}"));
        check_word("returned value", returned, original)?;
        check_word("remote word", remote, after)
    }

    /// RDMA WRITEs of BW_MESSAGE bytes, BW_IN_FLIGHT at a time, posted for
    /// `duration` (one window at least), each completion checked.
    fn bandwidth(&self, duration: Duration) -> Result<Bandwidth, String> {
        let data = pattern(BW_MESSAGE, 0xb0);
        self.a.put(BW_SOURCE_AT, &data)?;
        let op = SendOp::RdmaWrite { remote_addr: self.b.mr.addr(), rkey: self.b.mr.rkey() };
        let wr = |id| SendWr::new(id, op).with_sge(self.a.mr.sge(BW_SOURCE_AT, BW_MESSAGE));
        let start = Instant::now();
        for id in 0..BW_IN_FLIGHT as u64 {
            self.a.post_send(wr(id))?;
        }
        let (mut posted, mut done) = (BW_IN_FLIGHT as u64, 0);
        while done < posted {
            let wc = self.a.completion()?;
            let want = Expected { wr_id: done, opcode: WcOpcode::RdmaWrite, byte_len: BW_MESSAGE as u32, imm: None };
            check_completion(&wc, &want).map_err(|e| format!("bandwidth run: {e}"))?;
            done += 1;
            if start.elapsed() < duration {
                self.a.post_send(wr(posted))?;
                posted += 1;
            }
        }
        let elapsed = start.elapsed();
        check_bytes("bandwidth run: written data", &self.b.bytes(0, BW_MESSAGE)?, &data)?;
        Ok(Bandwidth { bytes: done * BW_MESSAGE as u64, messages: done, elapsed })
    }

    /// SEND ping-pong: `a` sends its round number, `b` sends it back; returns
    /// the round-trip times, sorted.
    fn latency(&self, wait: Wait) -> Result<Vec<Duration>, String> {
        let recv =
            |side: &Side| side.post_recv(RecvWr { wr_id: 0, sg_list: softroce::sg_list![side.mr.sge(RECV_AT, PING)] });
        let send = |side: &Side| {
            let mut wr = SendWr::new(0, SendOp::Send).with_sge(side.mr.sge(SOURCE_AT, PING));
            // Unsignaled: only the receives complete, so waits see nothing else.
            wr.flags.signaled = false;
            side.post_send(wr)
        };
        let arrived = |side: &Side, round: u64| -> Result<(), String> {
            let wc = side.completion_by(wait)?;
            check_completion(&wc, &Expected { wr_id: 0, opcode: WcOpcode::Recv, byte_len: PING as u32, imm: None })?;
            check_word(
                "ping-pong data",
                u64::from_ne_bytes(side.bytes(RECV_AT, PING)?.try_into().expect("8 bytes")),
                round,
            )
        };
        recv(&self.a)?;
        recv(&self.b)?;
        let mut times = Vec::with_capacity(ROUND_TRIPS);
        for round in 0..ROUND_TRIPS as u64 {
            let start = Instant::now();
            self.a.put(SOURCE_AT, &round.to_ne_bytes())?;
            send(&self.a)?;
            arrived(&self.b, round).map_err(|e| format!("latency run, ping {round}: {e}"))?;
            recv(&self.b)?;
            self.b.put(SOURCE_AT, &round.to_ne_bytes())?;
            send(&self.b)?;
            arrived(&self.a, round).map_err(|e| format!("latency run, pong {round}: {e}"))?;
            recv(&self.a)?;
            times.push(start.elapsed());
        }
        times.sort_unstable();
        Ok(times)
    }
}

/// How the latency run waits for completions.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Poll the CQ in a loop: no wake-up delay.
    Spin,
    /// Sleep until the engine delivers.
    Block,
}

impl Wait {
    /// Spinning wins when it has a core of its own beside the two engine
    /// threads; with fewer cores it takes theirs and delays what it waits for.
    fn for_this_host() -> Wait {
        match std::thread::available_parallelism() {
            Ok(cores) if cores.get() >= 3 => Wait::Spin,
            _ => Wait::Block,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Wait::Spin => "busy-poll",
            Wait::Block => "blocking waits",
        }
    }
}

/// The outcome of the bandwidth run.
struct Bandwidth {
    bytes: u64,
    messages: u64,
    elapsed: Duration,
}

impl Bandwidth {
    fn bytes_per_second(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64()
    }

    fn messages_per_second(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
}

/// The completion a step waits for.
#[derive(Debug, Clone, Copy)]
struct Expected {
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
}

fn check_completion(wc: &WorkCompletion, want: &Expected) -> Result<(), String> {
    if wc.status != WcStatus::Success {
        return Err(format!("completion status {:?} ({})", wc.status, wc.status.as_str()));
    }
    if wc.wr_id != want.wr_id {
        return Err(format!("completion of wr_id {} where {} was due", wc.wr_id, want.wr_id));
    }
    if wc.opcode != want.opcode {
        return Err(format!("completion opcode {} instead of {}", opcode_name(wc.opcode), opcode_name(want.opcode)));
    }
    if wc.byte_len != want.byte_len {
        return Err(format!("completion byte_len {} instead of {}", wc.byte_len, want.byte_len));
    }
    if wc.imm != want.imm {
        return Err(format!("immediate data {} instead of {}", show_imm(wc.imm), show_imm(want.imm)));
    }
    Ok(())
}

/// Compares memory with what should be there, saying where it differs.
fn check_bytes(what: &str, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} bytes instead of {}", got.len(), want.len()));
    }
    let mut wrong = got.iter().zip(want).enumerate().filter(|(_, (g, w))| g != w);
    let Some((first, (g, w))) = wrong.next() else { return Ok(()) };
    Err(format!(
        "{what}: {} of {} bytes wrong, the first at offset {first} ({g:#04x} instead of {w:#04x})",
        wrong.count() + 1,
        want.len()
    ))
}

fn check_word(what: &str, got: u64, want: u64) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what} {got:#018x} instead of {want:#018x}"))
    }
}

/// `len` pseudo-random bytes, different for each seed (splitmix64 of the
/// seed and the offset), so a misplaced or stale packet cannot look right.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let byte = |i: u64| {
        let mut z = (seed << 32 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ z >> 30).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ z >> 27).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ z >> 31) as u8
    };
    (0..len as u64).map(byte).collect()
}

fn describe(wc: &WorkCompletion) -> String {
    let imm = wc.imm.map(|imm| format!(" imm {imm:#010x}")).unwrap_or_default();
    format!("{} {} {}{imm}", wc.status.as_str(), opcode_name(wc.opcode), wc.byte_len)
}

fn show_imm(imm: Option<u32>) -> String {
    imm.map_or_else(|| "none".to_owned(), |imm| format!("{imm:#010x}"))
}

/// `ibv_wc_opcode` names without the `IBV_WC_` prefix.
fn opcode_name(opcode: WcOpcode) -> &'static str {
    match opcode {
        WcOpcode::Send => "SEND",
        WcOpcode::RdmaWrite => "RDMA_WRITE",
        WcOpcode::RdmaRead => "RDMA_READ",
        WcOpcode::CompSwap => "COMP_SWAP",
        WcOpcode::FetchAdd => "FETCH_ADD",
        WcOpcode::BindMw => "BIND_MW",
        WcOpcode::LocalInv => "LOCAL_INV",
        WcOpcode::Flush => "FLUSH",
        WcOpcode::AtomicWrite => "ATOMIC_WRITE",
        WcOpcode::Recv => "RECV",
        WcOpcode::RecvRdmaWithImm => "RECV_RDMA_WITH_IMM",
    }
}

/// The nearest-rank percentile `p` of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(opcode: WcOpcode, byte_len: u32, imm: Option<u32>) -> WorkCompletion {
        let mut wc = WorkCompletion::new(7, 0x11, WcStatus::Success, opcode);
        wc.byte_len = byte_len;
        wc.imm = imm;
        wc
    }

    const WANT: Expected = Expected { wr_id: 7, opcode: WcOpcode::RecvRdmaWithImm, byte_len: 10_000, imm: Some(IMM) };

    #[test]
    fn the_right_completion_passes() {
        assert_eq!(check_completion(&completion(WcOpcode::RecvRdmaWithImm, 10_000, Some(IMM)), &WANT), Ok(()));
    }

    #[test]
    fn each_wrong_completion_field_fails() {
        let mut failed = completion(WcOpcode::RecvRdmaWithImm, 10_000, Some(IMM));
        failed.status = WcStatus::RemAccessErr;
        let mut other_wr = completion(WcOpcode::RecvRdmaWithImm, 10_000, Some(IMM));
        other_wr.wr_id = 8;
        let wrong = [
            (failed, "RemAccessErr"),
            (other_wr, "wr_id 8"),
            (completion(WcOpcode::Recv, 10_000, Some(IMM)), "opcode RECV"),
            (completion(WcOpcode::RecvRdmaWithImm, 9_999, Some(IMM)), "byte_len 9999"),
            (completion(WcOpcode::RecvRdmaWithImm, 10_000, None), "immediate data none"),
            (completion(WcOpcode::RecvRdmaWithImm, 10_000, Some(IMM + 1)), "0x5eed1235"),
        ];
        for (wc, says) in wrong {
            let e = check_completion(&wc, &WANT).unwrap_err();
            assert!(e.contains(says), "{e:?} should say {says:?}");
        }
    }

    #[test]
    fn a_wrong_byte_fails_and_is_located() {
        let want = pattern(MESSAGE, 3);
        assert_eq!(check_bytes("data", &want, &want), Ok(()));
        let mut got = want.clone();
        got[4097] ^= 0x20;
        let e = check_bytes("data", &got, &want).unwrap_err();
        assert!(e.contains("1 of 10000 bytes wrong, the first at offset 4097"), "{e}");
        got.truncate(4096);
        assert!(check_bytes("data", &got, &want).unwrap_err().contains("4096 bytes instead of 10000"));
    }

    #[test]
    fn a_stale_buffer_fails() {
        // Data of an earlier step, or memory never written, must not pass.
        let want = pattern(MESSAGE, 4);
        assert!(check_bytes("data", &pattern(MESSAGE, 3), &want).is_err());
        assert!(check_bytes("data", &[0; MESSAGE], &want).is_err());
    }

    #[test]
    fn a_wrong_word_fails() {
        assert_eq!(check_word("remote word", 42, 42), Ok(()));
        assert_eq!(
            check_word("remote word", 40, 42).unwrap_err(),
            "remote word 0x0000000000000028 instead of 0x000000000000002a"
        );
    }

    #[test]
    fn a_pattern_shifted_by_any_offset_does_not_match() {
        // A packet placed at the wrong offset leaves wrong bytes.
        let p = pattern(MESSAGE, 1);
        assert!((1..MESSAGE - 64).all(|shift| p[shift..shift + 64] != p[..64]));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=200).map(Duration::from_micros).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_micros(100));
        assert_eq!(percentile(&samples, 99.0), Duration::from_micros(198));
        assert_eq!(percentile(&samples[..1], 99.0), Duration::from_micros(1));
    }
}
