//! `softroce perf`: the peer of perftest's `ib_send_bw`, `ib_write_bw`,
//! `ib_read_bw` and `ib_atomic_bw` (and, with `--lat`, of `ib_send_lat`,
//! `ib_write_lat`, `ib_read_lat` and `ib_atomic_lat`), with their main
//! options and defaults, their TCP exchange byte for byte (see
//! [`proto`]) and their result tables, so that either side of a pair can be
//! ours or perftest's (over kernel rxe, say). The facts come from perftest
//! 4.5-0.17 (version 6.06, Debian's `perftest 4.5+0.17-1`).
//!
//! What each test does, as perftest does it:
//!
//! - WRITE, READ and atomic BW: the client keeps `-t` requests in flight on
//!   each QP against the buffer the server announced, one in `-Q` signaled;
//!   the server's QPs only answer, in RTR, and the server waits for the
//!   client's last handshake, receives the client's results and prints them.
//! - With `-b` both sides do the client's part at once (for SEND, each
//!   also receives, the server sending once the first message arrived),
//!   trade their results and print the sums.
//! - SEND BW: the server pre-posts `-r` receives per QP and counts arrivals
//!   (its clock starts at the first), the client sends as above; each side
//!   prints its own figures. Handshakes separate the sizes of `-a`.
//! - Latency: WRITE is a ping-pong in memory (each side polls the last
//!   byte of its buffer for the iteration number the peer's WRITE carries),
//!   SEND a ping-pong of messages, READ and atomics a client-only loop of
//!   one request at a time.
//!
//! With `-D`, a BW run lasts that many seconds and counts the completions
//! (the SEND server: the receives, from its first) of the middle half, as
//! perftest's alarm-driven states do; requests still in flight at the end
//! are abandoned.
//!
//! Where we differ: timing uses the monotonic clock (perftest counts CPU
//! cycles) and completions are waited for, not busy-polled; the
//! CPU-frequency warning `-F` silences does not exist, so `-F` is accepted
//! and does nothing; latency tests use one QP; each side reads the other's
//! final `"done"`; the RoCE socket binds only the address of the GID we
//! announce. `--roce-port`, `--local-addr` and `--timeout` are ours
//! ([`PeerArgs`]).

pub(crate) mod proto;
mod report;
mod res;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use softroce::transport::Mtu;
use softroce::verbs::{ContextOptions, Device, Gid};

use crate::cli::{c_port, c_u32, fail, Fail, PeerArgs};
use proto::{BwReport, Comm, KeyMsg};
use report::{bw_header, bw_line, bw_sum_line, lat_line, LAT_HEADER, RESULT_LINE};
use res::Res;

/// `MAX_SIZE`: the largest message, and the buffer size of `-a`.
const MAX_SIZE: usize = 8 << 20;
/// perftest's page size and cache line size on x86-64, which it trades
/// with the peer and keeps the larger of.
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;

/// The operation a test measures (perftest's `VerbType`, in its order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Verb {
    /// SEND (`ib_send_bw`, `ib_send_lat`).
    Send,
    /// RDMA WRITE (`ib_write_bw`, `ib_write_lat`).
    Write,
    /// RDMA READ (`ib_read_bw`, `ib_read_lat`).
    Read,
    /// Atomics (`ib_atomic_bw`, `ib_atomic_lat`).
    Atomic,
}

impl Verb {
    /// perftest's `testsStr`.
    fn name(self) -> &'static str {
        match self {
            Verb::Send => "Send",
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Atomic => "Atomic",
        }
    }
}

/// The transport (`-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Conn {
    /// Reliable connection.
    #[value(name = "RC")]
    Rc,
    /// Unreliable connection (SEND and WRITE).
    #[value(name = "UC")]
    Uc,
    /// Unreliable datagram (SEND).
    #[value(name = "UD")]
    Ud,
}

impl Conn {
    /// perftest's `connStr`.
    fn name(self) -> &'static str {
        match self {
            Conn::Rc => "RC",
            Conn::Uc => "UC",
            Conn::Ud => "UD",
        }
    }
}

/// The atomic operation (`-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AtomicType {
    /// Compare and swap (compare 0, swap 0).
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// Fetch and add (add 1).
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

#[derive(clap::Args)]
#[command(after_help = "Without SERVER, waits for a client; with it, connects to the server there. \
    The peer may be perftest's ib_<test>_bw (ib_<test>_lat with --lat) or softroce perf. \
    Give both sides the same test options. Use -x with the GID index of an IP address \
    (without it, the first IPv4 GID, as perftest picks); softroce binds that address alone.")]
pub struct Args {
    /// The test: send, write, read or atomic.
    #[arg(value_enum)]
    test: Verb,
    /// The server to connect to (host name or IPv4 address).
    #[arg(value_name = "SERVER")]
    server: Option<String>,
    /// Measure latency (the peer of `ib_<test>_lat`) instead of bandwidth.
    #[arg(long)]
    lat: bool,
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value = "18515", value_parser = c_port)]
    port: u16,
    /// Use this RDMA device (default: the first one, or $SOFTROCE_DEVICE).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Use this port of the device.
    #[arg(short = 'i', long = "ib-port", default_value = "1", value_parser = c_u32)]
    ib_port: u32,
    /// GID index (default: the first IPv4 one).
    #[arg(short = 'x', long = "gid-index", value_parser = c_u32)]
    gid_index: Option<u32>,
    /// Message size [default: 65536 for BW, 2 for latency, 8 for atomics].
    #[arg(short = 's', long = "size", value_parser = c_u32)]
    size: Option<u32>,
    /// Iterations [default: 5000 for WRITE BW, else 1000].
    #[arg(short = 'n', long = "iters", value_parser = c_u32)]
    iters: Option<u32>,
    /// Run sizes 2 to 2^23 (2 to the MTU for UD).
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 [default: the port's active MTU].
    #[arg(short = 'm', long = "mtu", value_parser = c_u32)]
    mtu: Option<u32>,
    /// Connection type: RC, UC (send, write) or UD (send).
    #[arg(short = 'c', long = "connection", value_enum, default_value = "RC")]
    conn: Conn,
    /// Number of QPs.
    #[arg(short = 'q', long = "qp", default_value = "1", value_parser = c_u32)]
    num_qps: u32,
    /// Requests in flight per QP [default: 128 for BW, 1 for latency].
    #[arg(short = 't', long = "tx-depth", value_parser = c_u32)]
    tx_depth: Option<u32>,
    /// Receives posted per QP (SEND) [default: 512].
    #[arg(short = 'r', long = "rx-depth", value_parser = c_u32)]
    rx_depth: Option<u32>,
    /// Signal one send in this many [default: 100; 1 above 8 KiB].
    #[arg(short = 'Q', long = "cq-mod", value_parser = c_u32)]
    cq_mod: Option<u32>,
    /// Post requests in lists of this many, one post each (BW tests;
    /// signals the last of each list unless -Q says otherwise).
    #[arg(short = 'l', long = "post_list", default_value = "1", value_parser = c_u32)]
    post_list: u32,
    /// Outstanding READs/atomics [default: the device's maximum].
    #[arg(short = 'o', long = "outs", value_parser = c_u32)]
    outs: Option<u32>,
    /// Atomic operation.
    #[arg(short = 'A', long = "atomic_type", value_enum)]
    atomic_type: Option<AtomicType>,
    /// Do not fail on CPU frequency changes (accepted; no effect here).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Bidirectional: both sides send (WRITE, READ, run atomics) at once
    /// and report the sum.
    #[arg(short = 'b', long = "bidirectional")]
    bidirectional: bool,
    /// Report average bandwidth only (no peak).
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    /// Run BW tests for this many seconds instead of -n iterations, counting
    /// the middle half (perftest's margins of a quarter on each side).
    #[arg(short = 'D', long = "duration", value_parser = c_u32)]
    duration: Option<u32>,
    /// Report in Gb/sec instead of MB/sec.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Peers reach our buffer through a type 2 memory window per QP, bound
    /// over a region that grants no remote right of its own (softroce only;
    /// RC WRITE, READ and atomics).
    #[arg(long)]
    mw: bool,
    #[command(flatten)]
    peer: PeerArgs,
    /// Bytes of socket buffer to ask for, each way, instead of 8 MiB:
    /// 212992 runs as a user whose net.core.rmem_max is a common
    /// distribution default does (softroce only).
    #[arg(long, value_name = "BYTES", value_parser = crate::bench::parse_size)]
    socket_buffer: Option<usize>,
}

/// The test's parameters once perftest's defaults and dependencies
/// (`force_dependecies`) are applied.
pub struct Params {
    verb: Verb,
    conn: Conn,
    lat: bool,
    /// The message size; with `-a`, the largest (for the buffer).
    size: usize,
    size_requested: bool,
    all: bool,
    iters: u32,
    num_qps: usize,
    tx_depth: u32,
    rx_depth: u32,
    cq_mod: u32,
    /// `-l`: requests per post.
    post_list: u32,
    out_reads: u16,
    cmp_and_swap: bool,
    ib_port: u8,
    no_peak: bool,
    gbits: bool,
    /// `-b`: both sides send.
    duplex: bool,
    /// `-D`: the run's length and the margin before and after the sample.
    duration: Option<(Duration, Duration)>,
    timeout: Option<Duration>,
    /// `--mw`: the buffer is reached through memory windows.
    windows: bool,
}

impl Params {
    fn new(args: &Args) -> Result<Params, Fail> {
        let verb = args.test;
        let bw = !args.lat;
        let check = |what: &str, value: u32, min: u32, max: u32| -> Result<u32, Fail> {
            if value < min || value > max {
                fail(format!(" {what} should be between {min} and {max}"))
            } else {
                Ok(value)
            }
        };
        match (verb, args.conn) {
            (Verb::Read | Verb::Atomic, Conn::Uc | Conn::Ud) | (Verb::Write, Conn::Ud) => {
                return fail(format!(" {} is not supported with {} tests", args.conn.name(), verb.name()));
            }
            _ => {}
        }
        if args.mw && (verb == Verb::Send || args.conn != Conn::Rc) {
            return fail(" Memory windows (--mw) are for RC WRITE, READ and atomic tests");
        }
        if args.atomic_type.is_some() && verb != Verb::Atomic {
            return fail(" -A/--atomic_type is an option of atomic tests only");
        }
        let iters = check(
            "Iteration num",
            args.iters.unwrap_or(if bw && verb == Verb::Write { 5000 } else { 1000 }),
            5,
            100_000_000,
        )?;
        let size = match (verb, args.size) {
            (Verb::Atomic, Some(s)) if s != 8 => return fail("Message size cannot be changed for Atomic tests "),
            (Verb::Atomic, _) => 8,
            (_, Some(s)) => check("Message Size", s, 1, MAX_SIZE as u32)? as usize,
            (_, None) if bw => 65536,
            (_, None) => 2,
        };
        let num_qps = check("Num of qps", args.num_qps, 1, 16384)? as usize;
        if args.lat && num_qps > 1 {
            return fail("softroce perf runs latency tests on one QP: leave out -q");
        }
        let mut tx_depth = check("Tx depth", args.tx_depth.unwrap_or(if bw { 128 } else { 1 }), 1, 15000)?;
        let mut rx_depth =
            check("Rx depth", args.rx_depth.unwrap_or(if verb == Verb::Send { 512 } else { 1 }), 1, 16384)?;
        let requested_cq_mod = args.cq_mod.map(|m| check("CQ moderation", m, 1, 1024)).transpose()?;
        let mut cq_mod = requested_cq_mod.unwrap_or(100);
        if args.duration.is_none() {
            tx_depth = tx_depth.min(iters);
            if verb == Verb::Send {
                rx_depth = rx_depth.min(iters);
            }
            if matches!(args.conn, Conn::Uc | Conn::Ud) && args.rx_depth.is_none() {
                rx_depth = iters.min(16000);
            }
        }
        // Above 8 KiB perftest signals every request (unless told or -a).
        if size > 8192 && args.conn != Conn::Ud && !args.all && requested_cq_mod.is_none() {
            cq_mod = 1;
        }
        let post_list = check("Post list size", args.post_list, 1, 15000)?;
        if post_list > 1 {
            if args.lat {
                return fail("Post list is supported in BW tests only");
            }
            if args.duration.is_none() && iters % post_list != 0 {
                return fail("Number of iterations must be a multiple of post list size");
            }
            if tx_depth < post_list {
                return fail(" Tx depth must be at least the post list size");
            }
            match requested_cq_mod {
                None => {
                    cq_mod = post_list;
                    println!("{RESULT_LINE}");
                    println!("Post List requested - CQ moderation will be the size of the post list");
                }
                Some(m) if post_list % m != 0 => return fail(" Post list size must be a multiple of CQ moderation"),
                Some(_) => {}
            }
        }
        cq_mod = cq_mod.min(tx_depth);
        let max_reads = 128; // kernel rxe's and softroce's max_qp_rd_atom
        let out_reads = match (verb, args.outs) {
            (Verb::Read | Verb::Atomic, Some(o)) if o > 0 && o <= max_reads => o,
            (Verb::Read | Verb::Atomic, Some(o)) if o > max_reads => {
                eprintln!(" Number of outstanding reads is above max = {max_reads}\n Changing to that max value");
                max_reads
            }
            (Verb::Read | Verb::Atomic, _) => max_reads,
            _ => 1,
        } as u16;
        let ib_port = match u8::try_from(args.ib_port) {
            Ok(p) if p >= 1 => p,
            _ => return fail(" IB port should be 1 or more"),
        };
        if args.bidirectional && args.lat {
            return fail("softroce perf runs -b (bidirectional) with BW tests only");
        }
        let duration = match args.duration {
            Some(_) if args.lat => return fail("softroce perf runs latency tests by iterations only: leave out -D"),
            Some(_) if args.all => return fail("Duration mode currently doesn't support running on all sizes."),
            Some(0) => return fail(" Duration period should be positive"),
            Some(d) => Some((Duration::from_secs(d.into()), Duration::from_secs((d / 4).into()))),
            None => None,
        };
        let no_peak = args.no_peak
            || duration.is_some()
            || (bw && iters > 20000)
            || (bw && verb == Verb::Send && args.server.is_none() && !args.bidirectional);
        Ok(Params {
            verb,
            conn: args.conn,
            lat: args.lat,
            size: if args.all { MAX_SIZE } else { size },
            size_requested: args.size.is_some(),
            all: args.all,
            iters,
            num_qps,
            tx_depth,
            rx_depth,
            cq_mod,
            post_list,
            out_reads,
            cmp_and_swap: args.atomic_type == Some(AtomicType::CmpAndSwap),
            ib_port,
            no_peak,
            gbits: args.report_gbits,
            duplex: args.bidirectional,
            duration,
            timeout: args.peer.timeout,
            windows: args.mw,
        })
    }

    /// The sizes to run: one, or with `-a` the powers of two from 2 up to
    /// 2^23 (SEND over UD: up to the MTU; atomics: only 8).
    fn sizes(&self, mtu: Mtu) -> Vec<usize> {
        if !self.all || self.verb == Verb::Atomic {
            return vec![if self.verb == Verb::Atomic { 8 } else { self.size }];
        }
        let max = if self.conn == Conn::Ud { mtu.bytes() } else { MAX_SIZE };
        (1..24).map(|i| 1usize << i).filter(|&s| s <= max).collect()
    }
}

/// Runs the test; the exit status says whether it completed.
pub fn run(args: Args) -> ExitCode {
    let result = perf(&args);
    std::io::stdout().flush().ok();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(message)) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// The device to open and the GID to announce: `-x`'s, or perftest's
/// `get_best_gid_index` (the first IPv4 GID). The device is narrowed to that
/// GID's address, so the RoCE socket binds it alone (other programs may
/// hold the RoCE port on the interface's other addresses).
fn open_device(args: &Args) -> Result<(Device, usize, Gid), Fail> {
    let device = args.peer.device(args.device.as_deref()).map_err(|e| match &args.device {
        Some(name) => Fail(format!(" Unable to find the Infiniband/RoCE device {name}: {e}")),
        None => Fail(format!(" Unable to find the Infiniband/RoCE device: {e}")),
    })?;
    let table = device.gid_table();
    let index = match args.gid_index {
        Some(i) => i as usize,
        None => {
            let mut best = 0;
            for i in 1..table.len() {
                if table[i].is_ipv4_mapped() && !table[best].is_ipv4_mapped() {
                    best = i;
                }
            }
            best
        }
    };
    let gid = device.gid(index).ok_or_else(|| {
        Fail(format!(
            " GID index {index} does not exist (the table has {})\n Unable to set up socket connection",
            table.len()
        ))
    })?;
    let ip = gid.to_ip();
    let bindable = !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
    let device = if bindable { device.narrowed_to(ip) } else { device };
    Ok((device, index, gid))
}

/// `ctx_check_gid_compatibility`: both GIDs IPv4, or both IPv6.
fn check_gids(mine: &KeyMsg, theirs: &KeyMsg) -> Result<(), Fail> {
    if Gid::from_bytes(mine.gid).is_ipv4_mapped() != Gid::from_bytes(theirs.gid).is_ipv4_mapped() {
        return fail("\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.\n");
    }
    Ok(())
}

/// C's `%#0Nx`: `0x` and zero padding to `width` characters in all, except
/// that zero gets no `0x`.
fn alt_hex(value: u64, width: usize) -> String {
    if value == 0 {
        format!("{value:0width$x}")
    } else {
        format!("{value:#0width$x}")
    }
}

/// `ctx_print_pingpong_data`.
fn print_dest(side: &str, d: &KeyMsg, verb: Verb) {
    let mut line = format!(
        " {side} address: LID {} QPN {} PSN {}",
        alt_hex(d.lid.into(), 4),
        alt_hex(d.qpn.into(), 6),
        alt_hex(d.psn.into(), 6)
    );
    if verb == Verb::Read {
        line.push_str(&format!(" OUT {}", alt_hex(d.out_reads.into(), 4)));
    }
    if matches!(verb, Verb::Read | Verb::Write) {
        line.push_str(&format!(" RKey {} VAddr {}", alt_hex(d.rkey.into(), 8), alt_hex(d.vaddr, 16)));
    }
    println!("{line}");
    let gid: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    println!(" GID: {}", gid.join(":"));
}

/// `ctx_print_test_info`.
fn print_test_info(p: &Params, device: &str, client: bool, mtu: Mtu, gid_index: usize) {
    println!("{RESULT_LINE}");
    let mut title = format!("                    {} ", p.verb.name());
    if p.verb == Verb::Atomic {
        title.push_str(if p.cmp_and_swap { "CMP_AND_SWAP " } else { "FETCH_AND_ADD " });
    }
    if p.post_list > 1 {
        title.push_str("Post List ");
    }
    title.push_str(match (p.lat, p.duplex) {
        (true, _) => "Latency Test",
        (false, true) => "Bidirectional BW Test",
        (false, false) => "BW Test",
    });
    println!("{title}");
    println!(" Dual-port       : OFF\t\tDevice         : {device}");
    println!(" Number of qps   : {}\t\tTransport type : IB", p.num_qps);
    println!(" Connection type : {}\t\tUsing SRQ      : OFF", p.conn.name());
    println!(" PCIe relax order: Unsupported");
    println!(" ibv_wr* API     : OFF");
    if client || p.duplex {
        println!(" TX depth        : {}", p.tx_depth);
    }
    if p.post_list > 1 {
        println!(" Post List       : {}", p.post_list);
    }
    if p.verb == Verb::Send && !client {
        println!(" RX depth        : {}", p.rx_depth);
    }
    if !p.lat {
        println!(" CQ Moderation   : {}", p.cq_mod);
    }
    println!(" Mtu             : {}[B]", mtu.bytes());
    println!(" Link type       : Ethernet");
    println!(" GID index       : {gid_index}");
    if matches!(p.verb, Verb::Read | Verb::Atomic) {
        println!(" Outstand reads  : {}", p.out_reads);
    } else {
        println!(" Max inline data : 0[B]");
    }
    println!(" rdma_cm QPs\t : OFF");
    println!(" Data ex. method : Ethernet");
    println!("{RESULT_LINE}");
}

/// The TCP connection: the client connects over IPv4 as perftest does; the
/// server accepts one client on any IPv4 address.
fn tcp_connect(args: &Args) -> Result<TcpStream, Fail> {
    match &args.server {
        Some(server) => {
            let couldnt = || {
                Fail(format!(
                    "Couldn't connect to {server}:{}\nUnable to open file descriptor for socket connection",
                    args.port
                ))
            };
            let addrs: Vec<SocketAddr> = (server.as_str(), args.port)
                .to_socket_addrs()
                .map_err(|e| Fail(format!("Problem in resolving basic address and port: {e}")))?
                .filter(SocketAddr::is_ipv4)
                .collect();
            addrs.iter().find_map(|a| TcpStream::connect(a).ok()).ok_or_else(couldnt)
        }
        None => {
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.port))
                .map_err(|e| Fail(format!("Couldn't listen to port {}: {e}", args.port)))?;
            println!("\n************************************");
            println!("* Waiting for client to connect... *");
            println!("************************************");
            std::io::stdout().flush().ok();
            let (stream, _) = listener.accept().map_err(|e| Fail(format!("accept() failed: {e}")))?;
            Ok(stream)
        }
    }
}

fn perf(args: &Args) -> Result<(), Fail> {
    let mut p = Params::new(args)?;
    let client = args.server.is_some();
    let (device, gid_index, gid) = open_device(args)?;
    let port = device
        .query_port(p.ib_port)
        .map_err(|e| Fail(format!(" Unable to query port {} attributes: {e}", p.ib_port)))?;
    let active = device.active_mtu();
    // set_mtu
    let my_mtu = match args.mtu {
        None => active,
        Some(bytes) => match Mtu::from_bytes(bytes as usize).filter(|m| m.bytes() == bytes as usize) {
            Some(m) if m as u32 > active as u32 => {
                println!("Requested mtu is higher than active mtu \nChanging to active mtu - {}", active as u32);
                active
            }
            Some(m) => m,
            None => {
                eprintln!(" Invalid MTU - {bytes} \n Please choose mtu from {{256,512,1024,2048,4096}}\n Will run with the port active mtu - {}", active as u32);
                active
            }
        },
    };

    let stream = tcp_connect(args)?;
    let mut comm = Comm::new(stream, client, p.timeout)?;
    comm.exchange_versions()?;
    let (cycle, cache_line) = comm.exchange_sys_data(CYCLE_BUFFER, CACHE_LINE)?;
    let mtu = Mtu::from_ibv(comm.exchange_mtu(my_mtu as u32)?).unwrap_or(my_mtu);
    if p.conn == Conn::Ud && p.size > mtu.bytes() {
        if p.all || !p.size_requested {
            eprintln!(" Max msg size in UD is MTU {}\n Changing to this MTU", mtu.bytes());
            p.size = mtu.bytes();
        } else {
            return fail(" Max message size in UD cannot be greater than MTU ");
        }
    }

    let options = ContextOptions { socket_buffer: args.socket_buffer, ..args.peer.context_options() };
    let mut res = Res::new(&device, options, &p, cycle as usize, cache_line as usize)?;
    let mine = res.key_messages(&p, gid, port.lid)?;
    print_test_info(&p, device.name(), client, mtu, gid_index);
    match (p.lat, p.verb) {
        (false, Verb::Send) => send_bw(&mut comm, &mut res, &p, mtu, &mine, client)?,
        (false, _) => rdma_bw(&mut comm, &mut res, &p, mtu, &mine, client)?,
        (true, Verb::Send) => send_lat(&mut comm, &mut res, &p, mtu, &mine, client)?,
        (true, _) => rdma_lat(&mut comm, &mut res, &p, mtu, &mine, client)?,
    }
    Ok(())
}

/// Trades every QP's key message; the peer must have as many QPs.
fn exchange_all(comm: &mut Comm, mine: &[KeyMsg]) -> Result<Vec<KeyMsg>, Fail> {
    mine.iter().map(|m| comm.hand_shake(m)).collect()
}

/// Prints our addresses, then trades them again, printing the peer's.
fn print_and_exchange(comm: &mut Comm, mine: &[KeyMsg], verb: Verb) -> Result<Vec<KeyMsg>, Fail> {
    for m in mine {
        print_dest("local", m, verb);
    }
    let mut theirs = Vec::with_capacity(mine.len());
    for m in mine {
        let t = comm.hand_shake(m)?;
        print_dest("remote", &t, verb);
        theirs.push(t);
    }
    Ok(theirs)
}

fn print_bw_header(p: &Params) {
    println!("{RESULT_LINE}");
    println!("{}", bw_header(p.gbits));
}

/// `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw` (`write_bw.c` and friends),
/// also bidirectional.
fn rdma_bw(comm: &mut Comm, res: &mut Res, p: &Params, mtu: Mtu, mine: &[KeyMsg], client: bool) -> Result<(), Fail> {
    let theirs = exchange_all(comm, mine)?;
    check_gids(&mine[0], &theirs[0])?;
    res.connect(p, mtu, mine, &theirs, client || p.duplex)?;
    let theirs = print_and_exchange(comm, mine, p.verb)?;
    // "An additional handshake is required after moving qp to RTR."
    comm.hand_shake(&mine[0])?;
    if !client && !p.duplex {
        // The server's QPs only answer: wait for the client's end.
        print_bw_header(p);
        comm.hand_shake(&mine[0])?;
        let theirs = comm.exchange_bw_reports(&BwReport::default())?;
        println!("{}", bw_line(&theirs, p.gbits));
        println!("{RESULT_LINE}");
        return comm.close(&mine[0]);
    }
    print_bw_header(p);
    let mut last = BwReport::default();
    for size in p.sizes(mtu) {
        if p.duplex {
            // Both sides start together, and with -a finish together.
            comm.hand_shake(&mine[0])?;
        }
        let (times, total) = res.run_bw(p, &theirs, size, !client)?;
        last = times.report(size as u64, total, p.cq_mod.into(), p.gbits);
        if p.duplex {
            if p.all {
                comm.hand_shake(&mine[0])?;
            }
            let peer = comm.exchange_bw_reports(&last)?;
            println!("{}", bw_sum_line(&last, &peer, p.gbits));
        } else {
            println!("{}", bw_line(&last, p.gbits));
        }
        std::io::stdout().flush().ok();
    }
    println!("{RESULT_LINE}");
    if !p.duplex {
        comm.hand_shake(&mine[0])?;
        comm.exchange_bw_reports(&last)?;
    }
    comm.close(&mine[0])
}

/// `ib_send_bw` (`send_bw.c`): both sides report.
fn send_bw(comm: &mut Comm, res: &mut Res, p: &Params, mtu: Mtu, mine: &[KeyMsg], client: bool) -> Result<(), Fail> {
    let theirs = exchange_all(comm, mine)?;
    check_gids(&mine[0], &theirs[0])?;
    res.connect(p, mtu, mine, &theirs, client || p.duplex)?;
    comm.hand_shake(&mine[0])?;
    let theirs = print_and_exchange(comm, mine, p.verb)?;
    print_bw_header(p);
    for size in p.sizes(mtu) {
        if !client || p.duplex {
            for q in 0..p.num_qps {
                res.post_recvs(p, q, size, p.rx_depth)?;
            }
        }
        // The client may not send before the receives are up.
        comm.hand_shake(&mine[0])?;
        let (times, total) =
            if client || p.duplex { res.run_bw(p, &theirs, size, !client)? } else { res.run_bw_server(p, size)? };
        let report = times.report(size as u64, total, p.cq_mod.into(), p.gbits);
        if p.duplex && p.duration.is_none() {
            let peer = comm.exchange_bw_reports(&report)?;
            println!("{}", bw_sum_line(&report, &peer, p.gbits));
        } else {
            println!("{}", bw_line(&report, p.gbits));
        }
        std::io::stdout().flush().ok();
        if p.all {
            comm.hand_shake(&mine[0])?;
        }
    }
    println!("{RESULT_LINE}");
    comm.close(&mine[0])
}

fn print_lat_header() {
    println!("{RESULT_LINE}");
    println!("{LAT_HEADER}");
}

/// `ib_write_lat`, `ib_read_lat`, `ib_atomic_lat`.
fn rdma_lat(comm: &mut Comm, res: &mut Res, p: &Params, mtu: Mtu, mine: &[KeyMsg], client: bool) -> Result<(), Fail> {
    comm.hand_shake(&mine[0])?;
    let theirs = exchange_all(comm, mine)?;
    check_gids(&mine[0], &theirs[0])?;
    res.connect(p, mtu, mine, &theirs, true)?;
    let theirs = print_and_exchange(comm, mine, p.verb)?;
    comm.hand_shake(&mine[0])?;
    if p.verb == Verb::Write {
        // Both sides ping-pong; no more TCP after this.
        print_lat_header();
        for size in p.sizes(mtu) {
            let posted = res.run_lat_write(p, &theirs[0], size, !client)?;
            println!("{}", lat_line(size as u64, &posted, true));
            std::io::stdout().flush().ok();
        }
        println!("{RESULT_LINE}");
        return Ok(());
    }
    if !client {
        // Only the client posts: wait for its end.
        comm.close(&mine[0])?;
        println!("{RESULT_LINE}");
        return Ok(());
    }
    print_lat_header();
    for size in p.sizes(mtu) {
        let posted = res.run_lat(p, &theirs[0], size)?;
        println!("{}", lat_line(size as u64, &posted, false));
        std::io::stdout().flush().ok();
    }
    comm.close(&mine[0])?;
    println!("{RESULT_LINE}");
    Ok(())
}

/// `ib_send_lat` (`send_lat.c`).
fn send_lat(comm: &mut Comm, res: &mut Res, p: &Params, mtu: Mtu, mine: &[KeyMsg], client: bool) -> Result<(), Fail> {
    let theirs = exchange_all(comm, mine)?;
    check_gids(&mine[0], &theirs[0])?;
    res.connect(p, mtu, mine, &theirs, true)?;
    comm.hand_shake(&mine[0])?;
    let theirs = print_and_exchange(comm, mine, p.verb)?;
    print_lat_header();
    for size in p.sizes(mtu) {
        res.post_recvs(p, 0, size, p.rx_depth)?;
        // "Sync between the client and server so the client won't send
        // packets before the server has posted his receive wqes."
        comm.hand_shake(&mine[0])?;
        let posted = res.run_lat_send(p, &theirs[0], size, client)?;
        println!("{}", lat_line(size as u64, &posted, true));
        std::io::stdout().flush().ok();
    }
    println!("{RESULT_LINE}");
    comm.close(&mine[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_prints_as_c_alternate_form() {
        assert_eq!(alt_hex(0, 4), "0000");
        assert_eq!(alt_hex(0x11, 6), "0x0011");
        assert_eq!(alt_hex(0xabcdef, 6), "0xabcdef");
        assert_eq!(alt_hex(0x80, 4), "0x80");
        assert_eq!(alt_hex(0x7f00_1234_5000, 16), "0x007f0012345000");
        assert_eq!(alt_hex(0x1234, 8), "0x001234");
    }
}
