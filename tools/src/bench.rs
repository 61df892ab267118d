//! `softroce bench`: softroce's RC bandwidth, message rate and latency over
//! loopback UDP, measured in the same run as what this machine does with raw
//! UDP (batched, and with GSO/GRO), TCP and a UDP ping-pong, so that the
//! ratios say how far the userspace transport is from the kernel's floor
//! under the same load.
//!
//! Every row runs one sending and one receiving thread (the softroce rows
//! also have the two devices' engine threads), warms up for a fifth of
//! `--seconds`, then measures for `--seconds`: bytes and messages that
//! arrived, and the CPU time of the whole process (user + system, from
//! `getrusage`) spent meanwhile.
//!
//! Some rows are measured against a reference, the two in turns within
//! each round (the machine's other work moves whole runs by more than the
//! difference between the two, and falls on both alike): a stream to a
//! process that shares our device against one to a process on an address
//! of its own (`procs`), and datagrams to a socket of a shared port against
//! datagrams to a socket alone (`baselines::udp_steering`).

mod baselines;
mod plot;
mod procs;
mod rdma;

pub use procs::{peer, PeerArgs};

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use softroce::transport::Mtu;
use softroce::verbs::ContextOptions;

use crate::cli::{seconds, Zero};

/// Prints a line of the report; a closed stdout (`| head`) does not stop the run.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

#[derive(clap::Args)]
#[command(after_help = "Rows: udp (4 KiB datagrams, sendmmsg/recvmmsg), udp-gso (UDP_SEGMENT and UDP_GRO), \
    tcp (64 KiB writes), udp-lat (UDP ping-pong), udp-gso-lat (the same with RoCE's packet sizes and a \
    20-byte ACK behind each message in GSO trains: the wire of a SEND ping-pong whose every SEND asks for an \
    ACK, as signaled ones do; 8 B, 4 KiB and 1 MiB), tcp-lat (TCP ping-pong, 8 B and 1 MiB), then softroce between two devices on 127.0.0.1 and \
    127.0.0.2: rc-write, rc-send and rc-read streams (64 B to 4 MiB, path MTU 1024 and 4096, 1 and 4 QPs), \
    send-lat (SEND ping-pong, 8 B, 4 KiB and 1 MiB: a lone message, as in an MPI ping-pong), write-rate (64 B WRITEs, one post each) and write-rate-list (the same \
    posted 16 at a time, as ibv_post_send with a chain). Ping-pongs count the messages and bytes of \
    both directions. Ratios are softroce's figure over the \
    baseline's: GB/s for streams, messages/s for the write rates, median latency for send-lat (whose \
    ×gso is to udp-gso-lat, ×tcp to tcp-lat). Rows measured against a reference, in turns within each of 3 rounds (×ref: \
    the median round's msg/s over the reference's; below the table each round, and the median \
    difference in cost a message): shared-write, a WRITE stream from this process to another that \
    shares its device (both on 127.0.0.1, one UDP port, each packet steered to its QP's process), \
    against procs-write, the same to a process on an address of its own (127.0.0.2), slice by slice, \
    the cost being CPU time, all processes'; and udp-steered, 64 B datagrams sent by one thread to a \
    socket in a group of 8 sharing a port as softroce's processes do (the steering program and the \
    census filter on every packet), against udp-alone, to a socket bound alone, batch by batch, neither \
    socket read, so that each datagram goes the kernel's way in as far as the socket: the cost, the \
    median batch's time a datagram, is what steering costs a packet; and write-rate-idle, 64 B WRITEs on \
    one QP with the row's other QPs connected and idle on the same devices, against write-rate, the QP \
    alone, with what an idle pair costs to set up and tear down and in resident memory.")]
pub struct Args {
    /// How long each row is measured, after a warm-up of a fifth of that (not 0: rates divide by it).
    #[arg(long, value_name = "SECONDS", default_value = "0.5", value_parser = |s: &str| seconds(s, Zero::Refused))]
    seconds: Duration,
    /// A reduced set of rows, well under a minute.
    #[arg(long)]
    quick: bool,
    /// Run the rows this many times over, then print each row's median
    /// figures and ratios: on a shared machine a single run can be off by
    /// half, and a ratio taken within each round and then the median of
    /// those is what to quote.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// One JSON object per row on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw throughput against message size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// UDP port of both softroce devices [default: a free port]
    #[arg(long)]
    port: Option<u16>,
    /// Run only these tests' rows (comma-separated), say to profile one;
    /// ratios to baselines left out are null.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "TEST,...")]
    test: Vec<Test>,
    /// Run only the softroce rows of these message sizes (bytes, or with a K
    /// or M suffix: 64K,1M), say to profile one; the baselines still run.
    #[arg(long, value_delimiter = ',', value_name = "SIZE,...", value_parser = parse_size)]
    size: Vec<usize>,
    /// Open the softroce devices with busy polling: threads that wait for
    /// completions poll instead of sleeping (a core each).
    #[arg(long)]
    busy_poll: bool,
    /// Bytes of socket buffer the softroce devices ask for, each way, instead
    /// of 8 MiB: 212992 shows, even as root, how they run for a user whose
    /// net.core.rmem_max is a common distribution default.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    socket_buffer: Option<usize>,
    /// Print where each ping-pong's messages spend their time, stage by
    /// stage (post, send call, receipt, completion), for softroce's and the
    /// UDP baseline's threads alike; needs a build with the `stages`
    /// feature (`cargo build --release -p softroce-tools --features stages`).
    #[arg(long)]
    stages: bool,
}

/// `--stages`: the threads of the ping-pongs print their stages.
static STAGES: AtomicBool = AtomicBool::new(false);

/// Prints, under `label`, where this thread's messages spent their time
/// (`--stages`), and starts over.
pub(crate) fn print_stages(label: &str) {
    if STAGES.load(Ordering::Relaxed) {
        let spreads: Vec<String> = softroce::stages::report()
            .iter()
            .map(|s| format!("{} {} ({}-{})", s.interval, s.p50, s.p25, s.p75))
            .collect();
        eprintln!("stages of {label}, ns, median (quartiles): {}", spreads.join("; "));
    }
    softroce::stages::reset();
}

/// Bytes, or with a K or M suffix (`64K`, `1M`).
pub(crate) fn parse_size(text: &str) -> Result<usize, String> {
    let (digits, unit) = match text.strip_suffix(['K', 'k']) {
        Some(digits) => (digits, 1 << 10),
        None => match text.strip_suffix(['M', 'm']) {
            Some(digits) => (digits, 1 << 20),
            None => (text, 1),
        },
    };
    let count: usize = digits.parse().map_err(|e| format!("{e}"))?;
    count.checked_mul(unit).filter(|&bytes| bytes > 0).ok_or_else(|| format!("{text} is not a size in bytes above 0"))
}

pub fn run(args: Args) -> ExitCode {
    match bench(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("softroce bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every row, printing each as it completes; false if a softroce row
/// failed (a baseline that fails is only unavailable).
fn bench(args: &Args) -> Result<bool, String> {
    if args.stages && !softroce::stages::RECORDED {
        return Err("--stages needs a build with the `stages` feature: \
                    cargo build --release -p softroce-tools --features stages"
            .to_owned());
    }
    STAGES.store(args.stages, Ordering::Relaxed);
    let timing = Timing { warmup: args.seconds / 5, seconds: args.seconds };
    let options =
        ContextOptions { busy_poll: args.busy_poll, socket_buffer: args.socket_buffer, ..ContextOptions::default() };
    let devices = rdma::Devices::open(args.port, options.clone())?;
    let rigs = Rigs { devices, options, procs: std::cell::OnceCell::new() };
    let host = Host::now();
    if !args.json {
        say!(
            "softroce bench: {} cores, Linux {}, load average {} at the start; {} s per row after {} s warm-up; tcp with {}{}",
            host.cores,
            host.kernel,
            host.load,
            timing.seconds.as_secs_f64(),
            timing.warmup.as_secs_f64(),
            baselines::tcp_congestion(),
            if args.busy_poll { "; softroce devices busy-poll" } else { "" }
        );
        if let Some(bytes) = args.socket_buffer {
            say!("softroce devices' socket buffers: {bytes} bytes asked for each way");
        }
        say!("{}", table_header());
    }
    if let Some(small) = receive_buffer().filter(|&bytes| bytes < SMALL_RECEIVE_BUFFER) {
        eprintln!(
            "softroce bench: the devices' sockets get {} KiB of receive buffer (net.core.rmem_max without \
             CAP_NET_ADMIN); RC windows shrink to fit it, and large messages move slower than they can. \
             For full speed: sysctl -w net.core.rmem_max=16777216",
            small / 1024
        );
    }
    let mut failed = 0;
    let named = |test: Test| args.test.contains(&test);
    let wanted = |c: &Case| {
        (args.test.is_empty() || named(c.test) || c.test.reference().is_some_and(named))
            && (args.size.is_empty() || !c.test.is_softroce() || args.size.contains(&c.size))
    };
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        if args.rounds > 1 && !args.json {
            say!("round {round} of {}", args.rounds);
        }
        let mut baselines = Baselines::default();
        let mut rows = Vec::new();
        for case in plan(args.quick).into_iter().filter(wanted) {
            let results = match reference(&case) {
                None => vec![(case, measure(&case, &rigs, &timing).and_then(|m| Figures::new(&m)))],
                Some(other) => match measure_in_turns(&case, &other, &rigs, &timing) {
                    Ok(turns) => {
                        let reference = Some(turns.reference);
                        let ours = Figures::new(&turns.ours).map(|f| Figures { reference, ..f });
                        vec![(other, Figures::new(&turns.theirs)), (case, ours)]
                    }
                    Err(why) => vec![(other, Err(why.clone())), (case, Err(why))],
                },
            };
            for (case, result) in results {
                let row = match result {
                    Ok(mut figures) => {
                        figures.ratios = case.test.is_softroce().then(|| baselines.ratios(&case, &figures));
                        baselines.learn(&case, &figures);
                        Row { case, result: Ok(figures) }
                    }
                    Err(why) => {
                        failed += usize::from(case.test.must_work());
                        Row { case, result: Err(why) }
                    }
                };
                if args.json {
                    let mut line = row.json();
                    line["round"] = json!(round);
                    say!("{line}");
                } else {
                    say!("{}", row.table_line());
                }
                rows.push(row);
            }
        }
        rounds.push(rows);
    }
    let rows = if rounds.len() > 1 {
        let medians = medians_of_rounds(&rounds);
        if args.json {
            for row in &medians {
                let mut line = row.json();
                line["round"] = Value::Null;
                line["median_of_rounds"] = json!(rounds.len());
                say!("{line}");
            }
        } else {
            say!(
                "medians of {} rounds (figures, and ratios each taken within its round), then each round's ratios",
                rounds.len()
            );
            say!("{}", table_header());
            for row in &medians {
                say!("{}", row.table_line());
            }
            for i in 0..medians.len() {
                let by_round: Vec<&Row> = rounds.iter().filter_map(|rows| rows.get(i)).collect();
                if let Some(line) = rounds_line(&by_round) {
                    say!("{line}");
                }
            }
        }
        medians
    } else {
        rounds.pop().unwrap_or_default()
    };
    if !args.json {
        say!("load average {} at the end", Host::now().load);
        say!("ratios: softroce / baseline (GB/s for streams, msg/s for the write rates, median latency for send-lat; latency above 1 is slower)");
        for row in &rows {
            if let Some(line) = row.reference_line() {
                say!("{line}");
            }
        }
        for row in &rows {
            if let Some(line) = row.share_line() {
                say!("{line}");
            }
        }
    }
    if let Some(path) = &args.plot {
        let svg = plot::svg(
            &rows,
            &format!("{} cores, Linux {}, {} s per row", host.cores, host.kernel, timing.seconds.as_secs_f64()),
        );
        std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if failed > 0 {
        eprintln!("softroce bench: {failed} softroce rows failed");
    }
    Ok(failed == 0)
}

/// What a row measures; the names are the JSON's and `--test`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    Udp,
    UdpGso,
    Tcp,
    UdpLat,
    UdpGsoLat,
    TcpLat,
    RcWrite,
    RcSend,
    RcRead,
    SendLat,
    WriteRate,
    WriteRateList,
    UdpAlone,
    UdpSteered,
    ProcsWrite,
    SharedWrite,
    WriteRateIdle,
}

impl Test {
    pub fn name(self) -> &'static str {
        match self {
            Test::Udp => "udp",
            Test::UdpGso => "udp-gso",
            Test::Tcp => "tcp",
            Test::UdpLat => "udp-lat",
            Test::UdpGsoLat => "udp-gso-lat",
            Test::TcpLat => "tcp-lat",
            Test::RcWrite => "rc-write",
            Test::RcSend => "rc-send",
            Test::RcRead => "rc-read",
            Test::SendLat => "send-lat",
            Test::WriteRate => "write-rate",
            Test::WriteRateList => "write-rate-list",
            Test::UdpAlone => "udp-alone",
            Test::UdpSteered => "udp-steered",
            Test::ProcsWrite => "procs-write",
            Test::SharedWrite => "shared-write",
            Test::WriteRateIdle => "write-rate-idle",
        }
    }

    fn is_softroce(self) -> bool {
        !matches!(
            self,
            Test::Udp
                | Test::UdpGso
                | Test::Tcp
                | Test::UdpLat
                | Test::UdpGsoLat
                | Test::TcpLat
                | Test::UdpAlone
                | Test::UdpSteered
        )
    }

    /// The test a row is measured against in alternation, round by round.
    fn reference(self) -> Option<Test> {
        match self {
            Test::SharedWrite => Some(Test::ProcsWrite),
            Test::WriteRateIdle => Some(Test::WriteRate),
            Test::UdpSteered => Some(Test::UdpAlone),
            _ => None,
        }
    }

    /// Whether a failure fails the run (else the row is only unavailable):
    /// softroce's rows, and the steering rows, which are softroce's code.
    fn must_work(self) -> bool {
        self.is_softroce() || matches!(self, Test::UdpAlone | Test::UdpSteered)
    }

    /// The figure a softroce row is compared to the baselines by.
    fn compared_by(self) -> &'static str {
        match self {
            Test::WriteRate | Test::WriteRateList | Test::WriteRateIdle => "msgs_per_s",
            Test::SendLat => "lat_p50_us",
            _ => "gbytes_per_s",
        }
    }
}

/// One row to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub test: Test,
    /// Bytes of each message (datagram, segment or write for the baselines).
    pub size: usize,
    /// The RC connections of a softroce row.
    pub conn: Option<Conn>,
}

/// The RC connections a softroce row runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    pub mtu: Mtu,
    pub qps: usize,
    /// Devices, so engine threads, per side; the QPs are split among them.
    pub engines: usize,
}

impl Case {
    fn baseline(test: Test, size: usize) -> Case {
        Case { test, size, conn: None }
    }

    fn softroce(test: Test, size: usize, mtu: Mtu, qps: usize) -> Case {
        Case { test, size, conn: Some(Conn { mtu, qps, engines: 1 }) }
    }

    /// A stream over `qps` QPs split among `engines` devices per side.
    fn engines(test: Test, size: usize, qps: usize, engines: usize) -> Case {
        Case { test, size, conn: Some(Conn { mtu: Mtu::Mtu4096, qps, engines }) }
    }
}

/// The baselines' sizes: the UDP link's largest packets, and TCP's writes.
const DATAGRAM: usize = 4096;
const TCP_WRITE: usize = 64 << 10;
/// 4 KiB segments per GSO super-datagram: the most under IPv4's 64 KiB limit.
const GSO_SEGMENTS: usize = 15;
/// The ping-pong sizes.
const PING_SMALL: usize = 8;
const PING_PAGE: usize = 4096;
/// A lone large message: what an MPI ping-pong of 1 MiB moves each way.
const PING_LARGE: usize = 1 << 20;
/// Message sizes of the full run: 64 B to 4 MiB in powers of 4.
const SIZES: [usize; 9] = [64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
const RC_STREAMS: [Test; 3] = [Test::RcWrite, Test::RcSend, Test::RcRead];
/// Rounds of a row measured against its reference (each with both in turns).
const ROUNDS: usize = 3;
/// The steering rows' datagrams: the size of the smallest RoCE packets.
const STEER_DATAGRAM: usize = 64;
/// Sockets in the steering row's group.
const STEER_MEMBERS: usize = 8;

/// QPs of the many-QP WRITE streams, all busy.
const MANY_QPS: [usize; 4] = [16, 256, 1024, 4096];

/// The rows to run, baselines first (the softroce rows' ratios need them).
fn plan(quick: bool) -> Vec<Case> {
    let mut cases = vec![
        Case::baseline(Test::Udp, DATAGRAM),
        Case::baseline(Test::UdpGso, DATAGRAM),
        Case::baseline(Test::Tcp, TCP_WRITE),
        Case::baseline(Test::UdpLat, PING_SMALL),
        Case::baseline(Test::UdpGsoLat, PING_SMALL),
        Case::baseline(Test::UdpGsoLat, PING_LARGE),
        Case::baseline(Test::TcpLat, PING_SMALL),
        Case::baseline(Test::TcpLat, PING_LARGE),
        Case::baseline(Test::UdpSteered, STEER_DATAGRAM),
    ];
    let mib = 1 << 20;
    if quick {
        for size in [4 << 10, 64 << 10, mib] {
            cases.push(Case::softroce(Test::RcWrite, size, Mtu::Mtu4096, 1));
        }
        cases.push(Case::softroce(Test::RcWrite, mib, Mtu::Mtu1024, 1));
        cases.push(Case::softroce(Test::RcWrite, mib, Mtu::Mtu4096, 4));
        cases.push(Case::engines(Test::RcWrite, mib, 4, rdma::MAX_ENGINES));
        cases.push(Case::softroce(Test::RcSend, mib, Mtu::Mtu4096, 1));
        cases.push(Case::softroce(Test::RcRead, mib, Mtu::Mtu4096, 1));
        for size in [PING_SMALL, PING_LARGE] {
            cases.push(Case::softroce(Test::SendLat, size, Mtu::Mtu4096, 1));
        }
    } else {
        cases.push(Case::baseline(Test::UdpLat, PING_PAGE));
        cases.push(Case::baseline(Test::UdpGsoLat, PING_PAGE));
        for test in RC_STREAMS {
            for mtu in [Mtu::Mtu4096, Mtu::Mtu1024] {
                for qps in [1, 4] {
                    cases.extend(SIZES.iter().map(|&size| Case::softroce(test, size, mtu, qps)));
                }
            }
        }
        for test in RC_STREAMS {
            for size in [64 << 10, mib] {
                cases.push(Case::engines(test, size, 2, rdma::MAX_ENGINES));
                cases.push(Case::engines(test, size, 4, rdma::MAX_ENGINES));
            }
        }
        for size in [PING_SMALL, PING_PAGE, PING_LARGE] {
            cases.push(Case::softroce(Test::SendLat, size, Mtu::Mtu4096, 1));
        }
        for qps in MANY_QPS {
            cases.push(Case::softroce(Test::RcWrite, 64 << 10, Mtu::Mtu4096, qps));
        }
    }
    cases.push(Case::softroce(Test::WriteRate, 64, Mtu::Mtu4096, 1));
    cases.push(Case::softroce(Test::WriteRateList, 64, Mtu::Mtu4096, 1));
    let shared_sizes: &[usize] = if quick { &[64, 1 << 20] } else { &[64, 64 << 10, 1 << 20] };
    for &size in shared_sizes {
        cases.push(Case::softroce(Test::SharedWrite, size, Mtu::Mtu4096, 1));
    }
    let idle_counts: &[usize] = if quick { &[1024] } else { &[16, 256, 1024, 4096] };
    for &qps in idle_counts {
        cases.push(Case::softroce(Test::WriteRateIdle, 64, Mtu::Mtu4096, qps));
    }
    cases
}

/// The case a row is measured against: the same but for the test.
fn reference(case: &Case) -> Option<Case> {
    let conn = match case.test {
        // Its reference is the busy QP alone.
        Test::WriteRateIdle => case.conn.map(|c| Conn { qps: 1, ..c }),
        _ => case.conn,
    };
    case.test.reference().map(|test| Case { test, conn, ..*case })
}

/// What the rows run on: the devices, open from the start, and the
/// two-process rows' devices, opened for the first of them.
struct Rigs {
    devices: rdma::Devices,
    options: ContextOptions,
    procs: std::cell::OnceCell<procs::Procs>,
}

impl Rigs {
    fn procs(&self) -> Result<&procs::Procs, String> {
        if let Some(procs) = self.procs.get() {
            return Ok(procs);
        }
        let procs = procs::Procs::open(self.options.clone())?;
        Ok(self.procs.get_or_init(|| procs))
    }
}

fn measure(case: &Case, rigs: &Rigs, timing: &Timing) -> Result<Measured, String> {
    let devices = &rigs.devices;
    match case.test {
        Test::Udp => baselines::udp_stream(case.size, 1, timing),
        Test::UdpGso => baselines::udp_stream(case.size, GSO_SEGMENTS, timing),
        Test::Tcp => baselines::tcp_stream(case.size, timing),
        Test::UdpLat => baselines::udp_ping_pong(case.size, false, timing),
        Test::UdpGsoLat => baselines::udp_ping_pong(case.size, true, timing),
        Test::TcpLat => baselines::tcp_ping_pong(case.size, timing),
        Test::RcWrite | Test::RcSend | Test::RcRead | Test::WriteRate | Test::WriteRateList => {
            devices.stream(case, timing)
        }
        Test::SendLat => devices.ping_pong(case, timing),
        Test::UdpAlone | Test::UdpSteered | Test::ProcsWrite | Test::SharedWrite | Test::WriteRateIdle => {
            Err("measured only in turns with its reference".to_owned())
        }
    }
}

/// A row and its reference measured in turns, [`ROUNDS`] rounds, each
/// with both in turns within it (`procs`, `baselines::udp_steering`).
fn measure_in_turns(case: &Case, reference: &Case, rigs: &Rigs, timing: &Timing) -> Result<Turns, String> {
    let (mut ours, mut theirs, mut ratios, mut extra_ns) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut qp_costs = Vec::new();
    let per_second = |m: &Measured| m.window.messages as f64 / m.window.elapsed.as_secs_f64();
    for _ in 0..ROUNDS {
        let (r, m) = match case.test {
            Test::UdpSteered => {
                // The median batch's time a datagram.
                let (r, m, extra) = baselines::udp_steering(case.size, STEER_MEMBERS, timing)?;
                extra_ns.push(extra);
                (r, m)
            }
            Test::SharedWrite => {
                // The CPU time of a message, all three processes'.
                let (r, m) = rigs.procs()?.round(case, timing)?;
                let cpu_ns = |m: &Measured| m.window.cpu.as_secs_f64() * 1e9 / m.window.messages.max(1) as f64;
                extra_ns.push(cpu_ns(&m) - cpu_ns(&r));
                (r, m)
            }
            Test::WriteRateIdle => {
                let round = rigs.devices.write_rate_among_idle(case, timing)?;
                let ns = |m: &Measured| m.window.elapsed.as_secs_f64() * 1e9 / m.window.messages.max(1) as f64;
                extra_ns.push(ns(&round.among_idle) - ns(&round.alone));
                qp_costs.push(QpCost {
                    setup_us: round.setup_us,
                    teardown_us: round.teardown_us,
                    rss_kib: round.rss_kib,
                });
                (round.alone, round.among_idle)
            }
            other => unreachable!("{} has no reference", other.name()),
        };
        ratios.push(per_second(&m) / per_second(&r));
        ours.push(m);
        theirs.push(r);
    }
    let reference = Reference { test: reference.test, ratios, extra_ns, qp_costs };
    Ok(Turns { ours: Measured::sum(ours), theirs: Measured::sum(theirs), reference })
}

/// A row and its reference, measured in turns: each over all its rounds,
/// and how they compared round by round.
struct Turns {
    ours: Measured,
    theirs: Measured,
    reference: Reference,
}

/// How long a row warms up and is measured.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub seconds: Duration,
}

/// How much longer a window waits for its first arrival.
const MAX_EXTENSION: Duration = Duration::from_secs(10);

/// What a run's threads moved, and when they are to stop. The threads count
/// all along; [`Meter::time`] takes the difference across its window.
#[derive(Debug, Default)]
pub struct Meter {
    bytes: AtomicU64,
    messages: AtomicU64,
    measuring: AtomicBool,
    stopped: AtomicBool,
    /// Messages each QP completed within the window (streams).
    per_qp: std::sync::Mutex<Vec<u64>>,
}

impl Meter {
    pub fn add(&self, bytes: u64, messages: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.messages.fetch_add(messages, Ordering::Relaxed);
    }

    /// Within the measured window: latency samples taken now count.
    pub fn measuring(&self) -> bool {
        self.measuring.load(Ordering::Relaxed)
    }

    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Adds what some QPs each completed within the window.
    pub fn add_per_qp(&self, counts: &[u64]) {
        self.per_qp.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(counts);
    }

    /// What every QP completed within the window, taken.
    pub fn take_per_qp(&self) -> Vec<u64> {
        std::mem::take(&mut *self.per_qp.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Waits out the warm-up, measures one window while the run's threads
    /// work, then tells them to stop. A window in which nothing arrived (a
    /// slow debug build, a loaded machine) is extended until something does,
    /// for [`MAX_EXTENSION`] at most.
    pub fn time(&self, timing: &Timing) -> Window {
        self.time_with_cpu(timing, cpu_time)
    }

    /// [`Meter::time`], with the CPU time of the row taken from `cpu`.
    pub fn time_with_cpu(&self, timing: &Timing, cpu_time: impl Fn() -> Duration) -> Window {
        std::thread::sleep(timing.warmup);
        let (bytes, messages, cpu, start) = (self.bytes(), self.messages(), cpu_time(), Instant::now());
        self.measuring.store(true, Ordering::Relaxed);
        std::thread::sleep(timing.seconds);
        while self.bytes() == bytes && start.elapsed() < timing.seconds + MAX_EXTENSION {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.measuring.store(false, Ordering::Relaxed);
        let window = Window {
            bytes: self.bytes() - bytes,
            messages: self.messages() - messages,
            elapsed: start.elapsed(),
            cpu: cpu_time().saturating_sub(cpu),
        };
        self.stopped.store(true, Ordering::Relaxed);
        window
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }
}

/// User plus system CPU time of the whole process so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// What moved during a measured window.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub bytes: u64,
    pub messages: u64,
    pub elapsed: Duration,
    pub cpu: Duration,
}

/// The outcome of one run.
#[derive(Debug)]
pub struct Measured {
    pub window: Window,
    /// Round-trip times within the window, sorted (latency runs).
    pub rtts: Vec<Duration>,
    /// Retransmissions by both devices during the run (softroce runs).
    pub retries: Option<u64>,
    /// Messages each QP completed within the window (streams).
    pub per_qp: Vec<u64>,
}

impl Measured {
    /// Several runs of one row as one: their windows added up.
    fn sum(runs: Vec<Measured>) -> Measured {
        let mut all = Measured {
            window: Window { bytes: 0, messages: 0, elapsed: Duration::ZERO, cpu: Duration::ZERO },
            rtts: Vec::new(),
            retries: None,
            per_qp: Vec::new(),
        };
        for run in runs {
            let (w, r) = (&mut all.window, run.window);
            (w.bytes, w.messages, w.elapsed, w.cpu) =
                (w.bytes + r.bytes, w.messages + r.messages, w.elapsed + r.elapsed, w.cpu + r.cpu);
            // Rounds of one row run the same QPs: their counts are not
            // QPs sharing a stream, so no share is made of them.
            all.rtts.extend(run.rtts);
            all.retries = match (all.retries, run.retries) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            };
        }
        all.rtts.sort_unstable();
        all
    }
}

/// A row's figures.
#[derive(Debug, Clone, PartialEq)]
struct Figures {
    gbytes_per_s: f64,
    msgs_per_s: f64,
    cpu_s_per_gb: f64,
    /// Median and 99th percentile round trip in µs (latency rows).
    latency: Option<(f64, f64)>,
    retries: Option<u64>,
    /// Each QP's messages over the mean of all (its share of a fair split):
    /// the smallest, the median, the largest (rows of several QPs).
    share: Option<(f64, f64, f64)>,
    /// Against the baselines (softroce rows).
    ratios: Option<Ratios>,
    /// Against the reference measured in alternation (rows that have one).
    reference: Option<Reference>,
}

/// A row against its reference, from the rounds they were measured in turns.
#[derive(Debug, Clone, PartialEq)]
struct Reference {
    test: Test,
    /// Each round's messages a second over the reference's.
    ratios: Vec<f64>,
    /// Each round's cost of a message less the reference's, in ns: for
    /// the two-process rows the CPU time of all the processes, a figure
    /// that the machine's other work moves less than rates; for
    /// udp-steered the median batch's time a datagram; for write-rate-idle
    /// the time between messages.
    extra_ns: Vec<f64>,
    /// write-rate-idle: what each round's idle QPs cost.
    qp_costs: Vec<QpCost>,
}

/// What an idle pair of QPs cost in a write-rate-idle round.
#[derive(Debug, Clone, Copy, PartialEq)]
struct QpCost {
    setup_us: f64,
    teardown_us: f64,
    /// Resident memory the pair added (malloc may reuse what earlier rows
    /// freed: it can be 0 or below).
    rss_kib: f64,
}

impl Reference {
    fn ratio(&self) -> f64 {
        median(&self.ratios)
    }

    fn extra_ns(&self) -> f64 {
        median(&self.extra_ns)
    }
}

/// Each row's medians over the rounds (every round ran the same rows in
/// the same order): its figures, and each ratio as the median of the
/// ratios taken within the rounds, so that a baseline and the row it is
/// compared with always shared a round; its retries are all rounds'
/// together, and a reference row's turns are all rounds' turns. A row that
/// failed in every round keeps its first error.
fn medians_of_rounds(rounds: &[Vec<Row>]) -> Vec<Row> {
    let first = rounds.first().map_or(&[][..], Vec::as_slice);
    first
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let measured: Vec<&Figures> =
                rounds.iter().filter_map(|rows| rows.get(i)).filter_map(|r| r.result.as_ref().ok()).collect();
            let result = match measured.first() {
                None => row.result.clone(),
                Some(some) => {
                    let of = |f: &dyn Fn(&Figures) -> Option<f64>| {
                        let values: Vec<f64> = measured.iter().filter_map(|m| f(m)).collect();
                        (!values.is_empty()).then(|| median(&values))
                    };
                    let ratio_of = |pick: fn(&Ratios) -> Option<f64>| of(&|m| m.ratios.as_ref().and_then(pick));
                    let references: Vec<&Reference> = measured.iter().filter_map(|m| m.reference.as_ref()).collect();
                    let reference = references.first().map(|r| Reference {
                        test: r.test,
                        ratios: references.iter().flat_map(|r| r.ratios.iter().copied()).collect(),
                        extra_ns: references.iter().flat_map(|r| r.extra_ns.iter().copied()).collect(),
                        qp_costs: references.iter().flat_map(|r| r.qp_costs.iter().copied()).collect(),
                    });
                    Ok(Figures {
                        gbytes_per_s: of(&|m| Some(m.gbytes_per_s)).unwrap_or(f64::NAN),
                        msgs_per_s: of(&|m| Some(m.msgs_per_s)).unwrap_or(f64::NAN),
                        cpu_s_per_gb: of(&|m| Some(m.cpu_s_per_gb)).unwrap_or(f64::NAN),
                        latency: of(&|m| m.p50()).zip(of(&|m| m.latency.map(|(_, p99)| p99))),
                        retries: some.retries.map(|_| measured.iter().filter_map(|m| m.retries).sum()),
                        share: some.share,
                        ratios: some.ratios.map(|_| Ratios {
                            udp: ratio_of(|r| r.udp),
                            udp_gso: ratio_of(|r| r.udp_gso),
                            tcp: ratio_of(|r| r.tcp),
                        }),
                        reference,
                    })
                }
            };
            Row { case: row.case, result }
        })
        .collect()
}

/// One row's ratios to the baselines, round by round: the spread behind a
/// median.
fn rounds_line(by_round: &[&Row]) -> Option<String> {
    let row = by_round.first()?;
    let ratios: Vec<Ratios> = by_round.iter().filter_map(|r| r.result.as_ref().ok()?.ratios).collect();
    let mut parts = Vec::new();
    for (label, pick) in
        [("×udp", (|r: &Ratios| r.udp) as fn(&Ratios) -> Option<f64>), ("×gso", |r| r.udp_gso), ("×tcp", |r| r.tcp)]
    {
        let values: Vec<String> = ratios.iter().filter_map(pick).map(|v| format!("{v:.3}")).collect();
        if !values.is_empty() {
            parts.push(format!("{label} {}", values.join(" ")));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let c = &row.case;
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let conn = c.conn.map_or(String::new(), |c| {
        format!(", MTU {}, {}, {}", c.mtu.bytes(), plural(c.qps, "QP"), plural(c.engines, "engine"))
    });
    Some(format!("{} {}{conn}: {}", c.test.name(), size_label(c.size), parts.join("; ")))
}

/// The median of some figures (the mean of the middle two of an even count).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

impl Figures {
    fn new(m: &Measured) -> Result<Figures, String> {
        let w = &m.window;
        if w.bytes == 0 {
            return Err(format!("nothing arrived in {:.2} s", w.elapsed.as_secs_f64()));
        }
        let seconds = w.elapsed.as_secs_f64();
        let gbytes = w.bytes as f64 / 1e9;
        let latency = match m.rtts.as_slice() {
            [] => None,
            rtts => Some((micros(percentile(rtts, 50.0)), micros(percentile(rtts, 99.0)))),
        };
        let share = (m.per_qp.len() > 1).then(|| {
            let mean = m.per_qp.iter().sum::<u64>() as f64 / m.per_qp.len() as f64;
            let shares: Vec<f64> = m.per_qp.iter().map(|&n| n as f64 / mean.max(f64::MIN_POSITIVE)).collect();
            (
                shares.iter().copied().fold(f64::INFINITY, f64::min),
                median(&shares),
                shares.iter().copied().fold(0.0, f64::max),
            )
        });
        Ok(Figures {
            gbytes_per_s: gbytes / seconds,
            msgs_per_s: w.messages as f64 / seconds,
            cpu_s_per_gb: w.cpu.as_secs_f64() / gbytes,
            latency,
            retries: m.retries,
            share,
            ratios: None,
            reference: None,
        })
    }

    fn p50(&self) -> Option<f64> {
        self.latency.map(|(p50, _)| p50)
    }
}

/// A softroce row's figure over each baseline's; `None` where the baseline
/// is unavailable or has no comparable figure.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Ratios {
    udp: Option<f64>,
    udp_gso: Option<f64>,
    tcp: Option<f64>,
}

/// `value` over `baseline`, if there is a baseline to divide by.
fn ratio(value: f64, baseline: Option<f64>) -> Option<f64> {
    baseline.filter(|b| b.is_finite() && *b > 0.0).map(|b| value / b)
}

/// The baselines' figures, as their rows complete.
#[derive(Debug, Default)]
struct Baselines {
    udp: Option<Figures>,
    udp_gso: Option<Figures>,
    tcp: Option<Figures>,
    /// Ping-pong median round trips by message size: UDP plain and with
    /// ACKs, and TCP.
    udp_lat: Vec<(usize, f64)>,
    udp_gso_lat: Vec<(usize, f64)>,
    tcp_lat: Vec<(usize, f64)>,
}

impl Baselines {
    fn learn(&mut self, case: &Case, figures: &Figures) {
        match case.test {
            Test::Udp => self.udp = Some(figures.clone()),
            Test::UdpGso => self.udp_gso = Some(figures.clone()),
            Test::Tcp => self.tcp = Some(figures.clone()),
            Test::UdpLat => self.udp_lat.extend(figures.p50().map(|p50| (case.size, p50))),
            Test::UdpGsoLat => self.udp_gso_lat.extend(figures.p50().map(|p50| (case.size, p50))),
            Test::TcpLat => self.tcp_lat.extend(figures.p50().map(|p50| (case.size, p50))),
            _ => {}
        }
    }

    /// Streams compare GB/s; the message-rate row compares messages with
    /// datagrams (a byte stream has no packet rate); ping-pongs compare the
    /// median with UDP's at the same size, plain and with the ACKs.
    fn ratios(&self, case: &Case, figures: &Figures) -> Ratios {
        let gbytes = |b: &Option<Figures>| b.as_ref().map(|f| f.gbytes_per_s);
        let msgs = |b: &Option<Figures>| b.as_ref().map(|f| f.msgs_per_s);
        match case.test {
            Test::WriteRate | Test::WriteRateList => Ratios {
                udp: ratio(figures.msgs_per_s, msgs(&self.udp)),
                udp_gso: ratio(figures.msgs_per_s, msgs(&self.udp_gso)),
                tcp: None,
            },
            Test::SendLat => {
                let at_size =
                    |lat: &[(usize, f64)]| lat.iter().find(|(size, _)| *size == case.size).map(|(_, p50)| *p50);
                let p50 = |baseline| figures.p50().and_then(|p50| ratio(p50, baseline));
                Ratios {
                    udp: p50(at_size(&self.udp_lat)),
                    udp_gso: p50(at_size(&self.udp_gso_lat)),
                    tcp: p50(at_size(&self.tcp_lat)),
                }
            }
            _ => Ratios {
                udp: ratio(figures.gbytes_per_s, gbytes(&self.udp)),
                udp_gso: ratio(figures.gbytes_per_s, gbytes(&self.udp_gso)),
                tcp: ratio(figures.gbytes_per_s, gbytes(&self.tcp)),
            },
        }
    }
}

/// A measured row, or why it has no figures.
#[derive(Debug)]
struct Row {
    case: Case,
    result: Result<Figures, String>,
}

fn table_header() -> String {
    format!(
        "{:<15} {:>7} {:>4} {:>3} {:>3} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "test",
        "size",
        "MTU",
        "QPs",
        "eng",
        "GB/s",
        "msg/s",
        "CPU s/GB",
        "p50 µs",
        "p99 µs",
        "×udp",
        "×gso",
        "×tcp",
        "×ref",
        "retries"
    )
}

impl Row {
    fn table_line(&self) -> String {
        let c = &self.case;
        let (mtu, qps, engines) = c.conn.map_or(("-".to_owned(), "-".to_owned(), "-".to_owned()), |c| {
            (c.mtu.bytes().to_string(), c.qps.to_string(), c.engines.to_string())
        });
        let head = format!("{:<15} {:>7} {:>4} {:>3} {:>3}", c.test.name(), size_label(c.size), mtu, qps, engines);
        let f = match &self.result {
            Ok(f) => f,
            Err(why) if c.test.must_work() => return format!("{head} FAILED: {why}"),
            Err(why) => return format!("{head} unavailable: {why}"),
        };
        let or_dash = |v: Option<f64>, decimals: usize| v.map_or("-".to_owned(), |v| format!("{v:.decimals$}"));
        let ratios = f.ratios.unwrap_or_default();
        format!(
            "{head} {:>8.3} {:>8} {:>8.2} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7}",
            f.gbytes_per_s,
            si(f.msgs_per_s),
            f.cpu_s_per_gb,
            or_dash(f.p50(), 1),
            or_dash(f.latency.map(|(_, p99)| p99), 1),
            or_dash(ratios.udp, 3),
            or_dash(ratios.udp_gso, 3),
            or_dash(ratios.tcp, 3),
            or_dash(f.reference.as_ref().map(Reference::ratio), 3),
            f.retries.map_or("-".to_owned(), |r| r.to_string()),
        )
    }

    /// For a stream over many QPs: how evenly they shared it.
    fn share_line(&self) -> Option<String> {
        let (c, f) = (&self.case, self.result.as_ref().ok()?);
        let (min, med, max) = f.share.filter(|_| c.conn.is_some_and(|c| c.qps >= 16))?;
        Some(format!(
            "{} {}, {} QPs: each QP's messages over a fair share: min {min:.2}, median {med:.2}, max {max:.2}",
            c.test.name(),
            size_label(c.size),
            c.conn.map_or(0, |c| c.qps),
        ))
    }

    /// For a row measured against a reference: how it compared, each round.
    fn reference_line(&self) -> Option<String> {
        let (c, f) = (&self.case, self.result.as_ref().ok()?);
        let r = f.reference.as_ref()?;
        let list = |values: &[f64], decimals: usize| {
            values.iter().map(|v| format!("{v:.decimals$}")).collect::<Vec<_>>().join(" ")
        };
        let cost = match c.test {
            Test::UdpSteered => format!(
                "steering costs a packet {:+.0} ns on its way in, {STEER_MEMBERS} sockets in the group (the median \
                 batch's time a datagram, less the socket alone's; rounds {})",
                r.extra_ns(),
                list(&r.extra_ns, 0)
            ),
            Test::WriteRateIdle => {
                let costs = |f: fn(&QpCost) -> f64| median(&r.qp_costs.iter().map(f).collect::<Vec<_>>());
                format!(
                    "{:+.0} ns between messages with {} idle QP pairs (rounds {}); a pair costs {:.1} µs to set up \
                     and {:.1} µs to tear down (medians of rounds) and at most {:.2} KiB resident (the first round's: \
                     later ones reuse its memory)",
                    r.extra_ns(),
                    c.conn.map_or(0, |c| c.qps.saturating_sub(1)),
                    list(&r.extra_ns, 0),
                    costs(|c| c.setup_us),
                    costs(|c| c.teardown_us),
                    r.qp_costs.iter().map(|c| c.rss_kib).fold(0.0, f64::max),
                )
            }
            _ => format!("{:+.0} ns of CPU a message, all processes (rounds {})", r.extra_ns(), list(&r.extra_ns, 0)),
        };
        Some(format!(
            "{} {}: {:.3}× {} (the median of {} rounds in turns: {}); {cost}",
            c.test.name(),
            size_label(c.size),
            r.ratio(),
            r.test.name(),
            r.ratios.len(),
            list(&r.ratios, 3),
        ))
    }

    /// A row with figures has every key, `null` where one does not apply; a
    /// row without has `error` (softroce) or `unavailable` (baselines).
    fn json(&self) -> Value {
        let c = &self.case;
        let mut row = json!({
            "test": c.test.name(),
            "size": c.size,
            "mtu": c.conn.map(|c| c.mtu.bytes()),
            "qps": c.conn.map(|c| c.qps),
            "engines": c.conn.map(|c| c.engines),
        });
        let (figures, ratio_of) = match &self.result {
            Ok(f) => {
                let ratios = f.ratios.unwrap_or_default();
                let figures = json!({
                    "gbytes_per_s": f.gbytes_per_s,
                    "msgs_per_s": f.msgs_per_s,
                    "cpu_s_per_gb": f.cpu_s_per_gb,
                    "lat_p50_us": f.p50(),
                    "lat_p99_us": f.latency.map(|(_, p99)| p99),
                    "ratio_udp": ratios.udp,
                    "ratio_udp_gso": ratios.udp_gso,
                    "ratio_tcp": ratios.tcp,
                    "retries": f.retries,
                    "qp_share_min_median_max": f.share.map(|(min, med, max)| [min, med, max]),
                    "reference": f.reference.as_ref().map(|r| r.test.name()),
                    "ratio_ref": f.reference.as_ref().map(Reference::ratio),
                    "ratio_ref_rounds": f.reference.as_ref().map(|r| r.ratios.clone()),
                    "ref_extra_cpu_ns_per_msg": f.reference.as_ref().map(Reference::extra_ns),
                    "idle_qp_costs": f.reference.as_ref().filter(|r| !r.qp_costs.is_empty()).map(|r| {
                        r.qp_costs
                            .iter()
                            .map(|c| json!({ "setup_us": c.setup_us, "teardown_us": c.teardown_us, "rss_kib": c.rss_kib }))
                            .collect::<Vec<_>>()
                    }),
                });
                (figures, c.test.is_softroce().then(|| c.test.compared_by()))
            }
            Err(why) => {
                let key = if c.test.is_softroce() { "error" } else { "unavailable" };
                (json!({ key: why }), None)
            }
        };
        let fields = row.as_object_mut().expect("an object");
        fields.extend(figures.as_object().expect("an object").clone());
        fields.insert("ratio_of".to_owned(), json!(ratio_of));
        if c.test == Test::Tcp {
            fields.insert("congestion".to_owned(), json!(baselines::tcp_congestion()));
        }
        row
    }
}

/// Below this much receive buffer a device's windows are smaller than a
/// loopback round trip needs (the 8 MiB the UDP link asks for, doubled by
/// the kernel's accounting, is 16 MiB).
const SMALL_RECEIVE_BUFFER: usize = 4 << 20;

/// The receive buffer a softroce UDP link gets on this machine, as its RC
/// windows see it.
fn receive_buffer() -> Option<usize> {
    use softroce::net::{Link, UdpLink};
    let addr = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut link = UdpLink::new(softroce::net::udp::free_port(&[addr]).ok()?);
    link.bind(addr).ok()?;
    link.receive_buffer()
}

/// The nearest-rank percentile `p` of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `64 B`, `4 KiB`, `1 MiB`: sizes as the table and the plot show them.
fn size_label(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// A rate with an SI suffix, four significant digits at most.
fn si(value: f64) -> String {
    match value {
        v if v >= 1e6 => format!("{:.3}M", v / 1e6),
        v if v >= 1e3 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

/// The machine the run is on, for the report.
struct Host {
    cores: usize,
    kernel: String,
    load: String,
}

impl Host {
    fn now() -> Host {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_else(|_| "?".to_owned());
        let load: Vec<String> = read("/proc/loadavg").split_whitespace().take(3).map(str::to_owned).collect();
        Host {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            load: load.join(" "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(gbytes_per_s: f64, msgs_per_s: f64, latency: Option<(f64, f64)>) -> Figures {
        Figures {
            gbytes_per_s,
            msgs_per_s,
            cpu_s_per_gb: 1.0,
            latency,
            retries: None,
            share: None,
            ratios: None,
            reference: None,
        }
    }

    /// A row's median ratio is the median of the ratios taken within each
    /// round, not its median figure over the baseline's: a baseline and
    /// the row compared with it share a round's conditions.
    #[test]
    fn medians_of_rounds_take_each_ratio_within_its_round() {
        let tcp = Case::baseline(Test::Tcp, TCP_WRITE);
        let write = Case::softroce(Test::RcWrite, 1 << 20, Mtu::Mtu4096, 1);
        let round = |tcp_gbs: f64, write_gbs: f64| {
            let mut ours = figures(write_gbs, 1.0, None);
            ours.ratios = Some(Ratios { tcp: Some(write_gbs / tcp_gbs), ..Ratios::default() });
            vec![Row { case: tcp, result: Ok(figures(tcp_gbs, 1.0, None)) }, Row { case: write, result: Ok(ours) }]
        };
        let mut failed = round(1.0, 1.0);
        failed[1].result = Err("nothing arrived".to_owned());
        let rounds = [round(1.0, 2.0), round(4.0, 2.0), failed, round(2.5, 3.0)];
        let medians = medians_of_rounds(&rounds);
        assert_eq!(medians.len(), 2);
        let (tcp_row, write_row) = (medians[0].result.as_ref().unwrap(), medians[1].result.as_ref().unwrap());
        assert_eq!(tcp_row.gbytes_per_s, 1.75);
        // The write row failed in one round: its medians are of the other three.
        assert_eq!(write_row.gbytes_per_s, 2.0);
        // Ratios 2, 0.5 and 1.2: the median is 1.2, where the median figures' ratio would be 2.0 / 1.75.
        assert_eq!(write_row.ratios.unwrap().tcp, Some(1.2));
        let line = rounds_line(&rounds.iter().map(|r| &r[1]).collect::<Vec<_>>()).unwrap();
        assert_eq!(line, "rc-write 1 MiB, MTU 4096, 1 QP, 1 engine: ×tcp 2.000 0.500 1.200");
        // A row that failed in every round keeps its error.
        let all_failed = [failed_round(), failed_round()];
        assert!(medians_of_rounds(&all_failed)[0].result.is_err());
    }

    fn failed_round() -> Vec<Row> {
        vec![Row { case: Case::baseline(Test::Tcp, TCP_WRITE), result: Err("refused".to_owned()) }]
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=200).map(Duration::from_micros).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_micros(100));
        assert_eq!(percentile(&samples, 99.0), Duration::from_micros(198));
        let odd: Vec<Duration> = (1..=5).map(Duration::from_micros).collect();
        assert_eq!(percentile(&odd, 50.0), Duration::from_micros(3));
        assert_eq!(percentile(&odd, 99.0), Duration::from_micros(5));
        assert_eq!(percentile(&samples[..1], 50.0), Duration::from_micros(1));
        assert_eq!(percentile(&samples[..1], 99.0), Duration::from_micros(1));
    }

    #[test]
    fn figures_come_from_the_window() {
        let window = Window {
            bytes: 2_000_000_000,
            messages: 1000,
            elapsed: Duration::from_secs(2),
            cpu: Duration::from_secs(3),
        };
        let rtts = vec![Duration::from_micros(10), Duration::from_micros(20), Duration::from_micros(90)];
        let f = Figures::new(&Measured { window, rtts, retries: Some(4), per_qp: Vec::new() }).unwrap();
        assert_eq!((f.gbytes_per_s, f.msgs_per_s, f.cpu_s_per_gb), (1.0, 500.0, 1.5));
        assert_eq!(f.latency, Some((20.0, 90.0)));
        let empty = Window { bytes: 0, ..window };
        assert!(Figures::new(&Measured { window: empty, rtts: Vec::new(), retries: None, per_qp: Vec::new() }).is_err());
    }

    #[test]
    fn a_ratio_needs_a_positive_baseline() {
        assert_eq!(ratio(1.0, Some(4.0)), Some(0.25));
        assert_eq!(ratio(3.0, Some(1.5)), Some(2.0));
        assert_eq!(ratio(1.0, None), None);
        assert_eq!(ratio(1.0, Some(0.0)), None);
        assert_eq!(ratio(1.0, Some(f64::NAN)), None);
    }

    #[test]
    fn each_kind_of_row_is_compared_by_its_figure() {
        let mut baselines = Baselines::default();
        baselines.learn(&Case::baseline(Test::Udp, DATAGRAM), &figures(2.0, 500_000.0, None));
        baselines.learn(&Case::baseline(Test::Tcp, TCP_WRITE), &figures(4.0, 60_000.0, None));
        baselines.learn(&Case::baseline(Test::UdpLat, PING_SMALL), &figures(0.001, 50_000.0, Some((10.0, 30.0))));
        baselines.learn(&Case::baseline(Test::UdpGsoLat, PING_SMALL), &figures(0.001, 40_000.0, Some((14.0, 30.0))));
        baselines.learn(&Case::baseline(Test::TcpLat, PING_LARGE), &figures(5.0, 5000.0, Some((400.0, 500.0))));
        // udp-gso never arrived: unavailable.

        let write = Case::softroce(Test::RcWrite, 1 << 20, Mtu::Mtu4096, 1);
        assert_eq!(
            baselines.ratios(&write, &figures(1.0, 1000.0, None)),
            Ratios { udp: Some(0.5), udp_gso: None, tcp: Some(0.25) }
        );

        let rate = Case::softroce(Test::WriteRate, 64, Mtu::Mtu4096, 1);
        assert_eq!(
            baselines.ratios(&rate, &figures(0.01, 250_000.0, None)),
            Ratios { udp: Some(0.5), udp_gso: None, tcp: None }
        );

        let lat = Case::softroce(Test::SendLat, PING_SMALL, Mtu::Mtu4096, 1);
        assert_eq!(
            baselines.ratios(&lat, &figures(0.0, 1.0, Some((35.0, 80.0)))),
            Ratios { udp: Some(3.5), udp_gso: Some(2.5), tcp: None }
        );
        // No UDP ping-pong of 4 KiB to compare with.
        let page = Case::softroce(Test::SendLat, PING_PAGE, Mtu::Mtu4096, 1);
        assert_eq!(baselines.ratios(&page, &figures(0.0, 1.0, Some((35.0, 80.0)))), Ratios::default());
        // 1 MiB: TCP's ping-pong alone.
        let large = Case::softroce(Test::SendLat, PING_LARGE, Mtu::Mtu4096, 1);
        assert_eq!(
            baselines.ratios(&large, &figures(2.0, 2000.0, Some((600.0, 900.0)))),
            Ratios { udp: None, udp_gso: None, tcp: Some(1.5) }
        );
    }

    #[test]
    fn the_quick_plan_has_the_required_rows() {
        let quick = plan(true);
        assert!(quick.contains(&Case::softroce(Test::RcWrite, 1 << 20, Mtu::Mtu4096, 1)));
        assert!(quick.contains(&Case::softroce(Test::SendLat, 8, Mtu::Mtu4096, 1)));
        assert!(quick.contains(&Case::softroce(Test::SendLat, PING_LARGE, Mtu::Mtu4096, 1)));
        assert!(quick.contains(&Case::baseline(Test::TcpLat, PING_LARGE)));
        let full = plan(false);
        let streams = |engines| {
            full.iter().filter(|c| RC_STREAMS.contains(&c.test) && c.conn.is_some_and(|c| c.engines == engines)).count()
        };
        assert_eq!(streams(1), 3 * 2 * 2 * SIZES.len() + MANY_QPS.len());
        // Two sizes, 2 and 4 QPs, over two engines per side.
        assert_eq!(streams(rdma::MAX_ENGINES), 3 * 2 * 2);
        assert!(quick.iter().any(|c| c.conn.is_some_and(|c| c.engines == rdma::MAX_ENGINES)));
        // Baselines run before anything is compared with them.
        for cases in [&quick, &full] {
            let first_softroce = cases.iter().position(|c| c.test.is_softroce()).unwrap();
            assert!(cases[first_softroce..].iter().all(|c| c.test.is_softroce()));
        }
    }

    #[test]
    fn a_row_against_its_reference_takes_the_median_round() {
        let r = Reference {
            test: Test::ProcsWrite,
            ratios: vec![0.9, 1.25, 1.0],
            extra_ns: vec![5.0, -1.0, 20.0],
            qp_costs: Vec::new(),
        };
        assert_eq!((r.ratio(), r.extra_ns()), (1.0, 5.0));
        assert_eq!(median(&[3.0, 1.0, 4.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        // A row's figures are over all its rounds.
        let window = |messages, secs| Window {
            bytes: messages * 64,
            messages,
            elapsed: Duration::from_secs(secs),
            cpu: Duration::from_millis(messages),
        };
        let runs = [window(900, 1), window(1000, 2), window(1000, 1)];
        let all = Measured::sum(
            runs.map(|window| Measured { window, rtts: Vec::new(), retries: Some(1), per_qp: Vec::new() }).into(),
        );
        assert_eq!((all.window.messages, all.window.elapsed, all.retries), (2900, Duration::from_secs(4), Some(3)));
        assert_eq!(all.window.cpu, Duration::from_millis(2900));
    }

    #[test]
    fn rows_with_a_reference_are_planned_and_named() {
        for quick in [true, false] {
            let cases = plan(quick);
            let shared: Vec<usize> = cases.iter().filter(|c| c.test == Test::SharedWrite).map(|c| c.size).collect();
            assert!(shared.contains(&64) && shared.contains(&(1 << 20)), "{shared:?}");
            assert!(cases.contains(&Case::baseline(Test::UdpSteered, STEER_DATAGRAM)));
            // The references are measured with them, not planned apart.
            assert!(!cases.iter().any(|c| matches!(c.test, Test::ProcsWrite | Test::UdpAlone)));
        }
        let shared = Case::softroce(Test::SharedWrite, 64, Mtu::Mtu4096, 1);
        assert_eq!(reference(&shared), Some(Case::softroce(Test::ProcsWrite, 64, Mtu::Mtu4096, 1)));
        assert_eq!(reference(&Case::baseline(Test::UdpSteered, 64)), Some(Case::baseline(Test::UdpAlone, 64)));
        assert_eq!(reference(&Case::baseline(Test::Udp, 64)), None);
        assert!(Test::UdpSteered.must_work() && !Test::UdpSteered.is_softroce() && !Test::UdpGso.must_work());
    }

    #[test]
    fn sizes_and_rates_read_well() {
        assert_eq!([64, 4096, 1 << 20, 1536].map(size_label), ["64 B", "4 KiB", "1 MiB", "1536 B"]);
        assert_eq!([12.0, 61_234.0, 1_234_567.0].map(si), ["12", "61.2k", "1.235M"]);
    }

    #[test]
    fn test_names_are_the_options_names() {
        use clap::ValueEnum;
        for test in Test::value_variants() {
            assert_eq!(Test::from_str(test.name(), false), Ok(*test));
        }
    }

    #[test]
    fn sizes_take_k_and_m_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999999999M").is_err());
    }
}
