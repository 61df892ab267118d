//! `softroce pingpong`: the peer of rdma-core's `ibv_rc_pingpong` (the
//! default), `ibv_uc_pingpong` (`--uc`), `ibv_ud_pingpong` (`--ud`) and
//! `ibv_srq_pingpong` (`--srq`), with their options, defaults, output lines
//! and out-of-band exchange, so that either side of a pair can be ours or
//! theirs (kernel rxe, say).
//!
//! The exchange is theirs byte for byte: over TCP (port 18515), the client
//! sends its address as the 52-byte C string `LID:QPN:PSN:GID`
//! (`%04x:%06x:%06x:` and the GID as 32 hex digits, its bytes in order), the
//! server moves its QP to RTS and answers with its own, and the client ends
//! with `done` and its NUL. `--srq` sends 256 such messages each way (one per
//! possible QP, unused ones all zeros) before `done`.
//!
//! The ping-pong is theirs too: every receive lands in one buffer (after a
//! 40-byte GRH area for UD), `rx_depth` receives are posted at the start and
//! topped up when one or fewer (`--srq`: the number of QPs or fewer) remain,
//! and a QP sends again once both its previous send and a receive completed.
//! The client sends first. With `-c` the client zeroes the first byte of every
//! page (4096 bytes) of its 0x7b-filled buffer (zero-filled for `--srq`), as
//! the C programs do; the server sends back what it received.
//!
//! Where we differ: `-c` checks every received message whole on either side
//! (the C server checks the first byte of each page of the last message,
//! the C client nothing), prints the pages that differed with the C line
//! `invalid data in page N` and then exits with status 1; `-l` (SL) is
//! accepted and has no effect on RoCE here; `-o` (ODP) and `-t` (completion
//! timestamps) fail as the C programs do on a device without them. Without
//! `-g` the local GID is sent as zeros, as in C; a peer that sends a zero GID
//! is reached at the address of its TCP connection (the C programs would try
//! LID routing, which RoCE does not have).
//! `--roce-port`, `--local-addr` and `--timeout` are ours ([`PeerArgs`]).

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use softroce::transport::{
    Access, AttrMask, Mtu, QpAttr, QpCap, QpState, QpType, RecvWr, SendOp, SendWr, UdDest, WcStatus, WorkCompletion,
    GRH_LEN,
};
use softroce::verbs::{
    CompletionChannel, CompletionQueue, Context, ContextOptions, Device, Gid, MemoryRegion, ProtectionDomain,
    QueuePair, SharedReceiveQueue,
};
use softroce::wire::Psn;

use crate::cli::{c_i32, c_number, c_port, c_u32, fail, Fail, PeerArgs};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
const MSG_LEN: usize = 52;
/// `sizeof "done"`.
const DONE: &[u8; 5] = b"done\0";
/// `ibv_srq_pingpong` exchanges this many addresses each way, whatever `-q`.
const SRQ_MAX_QP: usize = 256;
/// The Q_Key of `ibv_ud_pingpong`.
const UD_QKEY: u32 = 0x1111_1111;
/// The fill byte of the C programs' buffers (`ibv_srq_pingpong` zeroes its own).
const FILL: u8 = 0x7b;
/// The page size `-c` marks pages by: x86-64's, as on both sides of a pair.
const PAGE_SIZE: usize = 4096;

#[derive(clap::Args)]
#[command(after_help = "Without SERVER, waits for a client; with it, connects to the server there. \
    The peer may be ibv_rc_pingpong (default), ibv_uc_pingpong (--uc), ibv_ud_pingpong (--ud) \
    or ibv_srq_pingpong (--srq) from rdma-core, or softroce pingpong with the same transport. \
    Use -g with the GID index of an IP address (1 for the first IPv4 one): RoCE needs GIDs.")]
pub struct Args {
    /// The server to connect to (host name or address).
    #[arg(value_name = "SERVER")]
    server: Option<String>,
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value = "18515", value_parser = c_port)]
    port: u16,
    /// Use this RDMA device (default: the first one, or $SOFTROCE_DEVICE).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Use this port of the device.
    #[arg(short = 'i', long = "ib-port", default_value = "1", value_parser = c_u32)]
    ib_port: u32,
    /// Size of the messages [default: 4096; 1024 with --ud].
    #[arg(short = 's', long = "size", value_parser = c_u32)]
    size: Option<u32>,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 (not with --ud) [default: 1024].
    #[arg(short = 'm', long = "mtu", value_parser = mtu)]
    mtu: Option<Mtu>,
    /// Number of QPs (--srq only) [default: 16].
    #[arg(short = 'q', long = "num-qp", value_parser = c_u32)]
    num_qp: Option<u32>,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value = "500", value_parser = c_u32)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value = "1000", value_parser = c_u32)]
    iters: u32,
    /// Service level (accepted; no effect on RoCE here).
    #[arg(short = 'l', long = "sl", default_value = "0", value_parser = c_u32)]
    sl: u32,
    /// Sleep on CQ events instead of polling.
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local port GID index (1 names the first IPv4 address).
    #[arg(short = 'g', long = "gid-idx", value_parser = c_i32, allow_negative_numbers = true)]
    gid_idx: Option<i32>,
    /// Validate the received data.
    #[arg(short = 'c', long = "chk")]
    check: bool,
    /// Use on-demand paging (softroce devices have none).
    #[arg(short = 'o', long = "odp")]
    odp: bool,
    /// Get completions with timestamps (softroce devices have none).
    #[arg(short = 't', long = "ts")]
    ts: bool,
    /// Be the peer of ibv_uc_pingpong: an Unreliable Connection.
    #[arg(long, group = "transport")]
    uc: bool,
    /// Be the peer of ibv_ud_pingpong: Unreliable Datagrams.
    #[arg(long, group = "transport")]
    ud: bool,
    /// Be the peer of ibv_srq_pingpong: -q RC QPs sharing a receive queue.
    #[arg(long, group = "transport")]
    srq: bool,
    #[command(flatten)]
    peer: PeerArgs,
    /// Send every Nth packet with a broken ICRC, to see the peer drop it (and RC recover).
    #[arg(long = "corrupt-icrc", value_name = "N", default_value = "0")]
    corrupt_icrc: u32,
    /// At the end, print the device's packet counters (sent, received, ICRC errors, retries…).
    #[arg(long)]
    stats: bool,
}

fn mtu(text: &str) -> Result<Mtu, String> {
    match c_number(text)? {
        256 => Ok(Mtu::Mtu256),
        512 => Ok(Mtu::Mtu512),
        1024 => Ok(Mtu::Mtu1024),
        2048 => Ok(Mtu::Mtu2048),
        4096 => Ok(Mtu::Mtu4096),
        _ => Err(format!("{text} is not an IB MTU (256, 512, 1024, 2048 or 4096)")),
    }
}

/// Which C program we are the peer of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rc,
    Uc,
    Ud,
    Srq,
}

impl Kind {
    /// What the buffer is filled with at the start.
    fn fill(self) -> u8 {
        if self == Kind::Srq {
            0
        } else {
            FILL
        }
    }

    fn qp_type(self) -> QpType {
        match self {
            Kind::Rc | Kind::Srq => QpType::Rc,
            Kind::Uc => QpType::Uc,
            Kind::Ud => QpType::Ud,
        }
    }
}

pub fn run(args: Args) -> ExitCode {
    match pingpong(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(Fail(message)) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// One side's address as the C programs exchange it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Dest {
    lid: u32,
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

impl Dest {
    /// `sprintf(msg, "%04x:%06x:%06x:%s", ...)` with the wire GID, and the NUL.
    fn to_wire(self) -> [u8; MSG_LEN] {
        let mut text = format!("{:04x}:{:06x}:{:06x}:", self.lid, self.qpn, self.psn);
        for byte in self.gid {
            text.push_str(&format!("{byte:02x}"));
        }
        let mut msg = [0u8; MSG_LEN];
        let n = text.len().min(MSG_LEN - 1);
        msg[..n].copy_from_slice(&text.as_bytes()[..n]);
        msg
    }

    /// `sscanf(msg, "%x:%x:%x:%s", ...)` and `wire_gid_to_gid`.
    fn from_wire(msg: &[u8]) -> Option<Dest> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).ok()?;
        let mut fields = text.splitn(4, ':');
        let mut hex = || u32::from_str_radix(fields.next()?, 16).ok();
        let (lid, qpn, psn) = (hex()?, hex()?, hex()?);
        let wire_gid = fields.next()?;
        if wire_gid.len() < 32 || !wire_gid.is_char_boundary(32) {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&wire_gid[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Dest { lid, qpn, psn, gid })
    }

    /// `gid.global.interface_id != 0`: whether the C programs address the
    /// peer by GID.
    fn has_gid(&self) -> bool {
        self.gid[8..].iter().any(|&b| b != 0)
    }
}

/// `inet_ntop(AF_INET6, ...)` as glibc writes it: the longest run of zero
/// groups (the first of equals, two groups or more) as `::`, and the last
/// four bytes dotted for IPv4-compatible and IPv4-mapped addresses.
fn inet_ntop6(raw: &[u8; 16]) -> String {
    let words: Vec<u16> = raw.chunks_exact(2).map(|p| u16::from_be_bytes([p[0], p[1]])).collect();
    // Runs of zero groups as (first group, length).
    let mut best: Option<(usize, usize)> = None;
    let mut cur: Option<(usize, usize)> = None;
    for (i, &w) in words.iter().enumerate() {
        if w == 0 {
            cur = Some(cur.map_or((i, 1), |(b, l)| (b, l + 1)));
        } else if let Some(run) = cur.take() {
            if best.is_none_or(|(_, l)| run.1 > l) {
                best = Some(run);
            }
        }
    }
    if let Some(run) = cur {
        if best.is_none_or(|(_, l)| run.1 > l) {
            best = Some(run);
        }
    }
    let best = best.filter(|&(_, l)| l >= 2);
    let mut out = String::new();
    let mut i = 0;
    while i < 8 {
        if let Some((base, len)) = best {
            if i >= base && i < base + len {
                if i == base {
                    out.push(':');
                }
                i += 1;
                continue;
            }
        }
        if i != 0 {
            out.push(':');
        }
        let ipv4_tail = best.is_some_and(|(base, len)| base == 0 && (len == 6 || (len == 5 && words[5] == 0xffff)));
        if i == 6 && ipv4_tail {
            out.push_str(&Ipv4Addr::new(raw[12], raw[13], raw[14], raw[15]).to_string());
            break;
        }
        out.push_str(&format!("{:x}", words[i]));
        i += 1;
    }
    if best.is_some_and(|(base, len)| base + len == 8) {
        out.push(':');
    }
    out
}

fn print_dest(label: &str, d: &Dest, colon_before_gid: bool) {
    let sep = if colon_before_gid { ":" } else { "," };
    println!("  {label} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}", d.lid, d.qpn, d.psn, inet_ntop6(&d.gid));
}

/// The device ([`PeerArgs::device`]), or the C programs' message for none.
fn open_device(args: &Args) -> Result<Device, Fail> {
    args.peer.device(args.device.as_deref()).map_err(|e| match (&args.device, e) {
        (Some(name), softroce::verbs::Error::NoSuchDevice { .. }) => Fail(format!("IB device {name} not found")),
        (Some(_), e) => Fail(e.to_string()),
        (None, e) => Fail(format!("No IB devices found ({e})")),
    })
}

/// The objects of one run (`struct pingpong_context`).
struct Pp {
    kind: Kind,
    ctx: Context,
    channel: Option<CompletionChannel>,
    cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
    qps: Vec<QueuePair>,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    size: usize,
    /// Bytes of each receive: the message, after the GRH area for UD.
    recv_len: usize,
    /// Where sent data starts in the buffer (after the GRH area for UD).
    data_offset: usize,
    /// UD: where sends go.
    ud_dest: Option<UdDest>,
    /// The port's LID, which the C programs exchange (0 on RoCE).
    lid: u16,
}

impl Pp {
    fn post_recv(&self, n: i64) -> i64 {
        let mut posted = 0;
        while posted < n {
            let wr = RecvWr { wr_id: RECV_WRID, sg_list: softroce::sg_list![self.mr.sge(0, self.recv_len)] };
            let ok = match &self.srq {
                Some(srq) => srq.post_recv(wr).is_ok(),
                None => self.qps[0].post_recv(wr).is_ok(),
            };
            if !ok {
                break;
            }
            posted += 1;
        }
        posted
    }

    fn post_send(&self, qp: usize) -> softroce::verbs::Result<()> {
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send).with_sge(self.mr.sge(self.data_offset, self.size));
        wr.ud = self.ud_dest;
        self.qps[qp].post_send(wr)
    }
}

/// Which pages of received messages differed from what the client sends.
struct Checker {
    expected: Vec<u8>,
    received: Vec<u8>,
    bad_pages: BTreeSet<usize>,
    bad_lengths: BTreeSet<u32>,
}

impl Checker {
    fn new(size: usize, fill: u8) -> Checker {
        Checker {
            expected: pattern(size, fill, true),
            received: vec![0; size],
            bad_pages: BTreeSet::new(),
            bad_lengths: BTreeSet::new(),
        }
    }

    fn check(&mut self, pp: &Pp, wc: &WorkCompletion) {
        let expected_len = (pp.size + pp.data_offset) as u32;
        if wc.byte_len != expected_len {
            self.bad_lengths.insert(wc.byte_len);
        }
        if pp.mr.read(pp.data_offset, &mut self.received).is_err() {
            return;
        }
        for (page, (got, want)) in self.received.chunks(PAGE_SIZE).zip(self.expected.chunks(PAGE_SIZE)).enumerate() {
            if got != want {
                self.bad_pages.insert(page);
            }
        }
    }

    /// Prints what differed; true when nothing did.
    fn report(&self, size: usize, data_offset: usize) -> bool {
        for len in &self.bad_lengths {
            println!("received {len} bytes instead of {}", size + data_offset);
        }
        for page in &self.bad_pages {
            println!("invalid data in page {page}");
        }
        self.bad_lengths.is_empty() && self.bad_pages.is_empty()
    }
}

/// What a message carries: `fill` bytes, and with `-c` a zero at the start of
/// every page (the C programs' `buf[i] = i / page_size % sizeof(char)`).
fn pattern(size: usize, fill: u8, check: bool) -> Vec<u8> {
    let mut data = vec![fill; size];
    if check {
        for byte in data.iter_mut().step_by(PAGE_SIZE) {
            *byte = 0;
        }
    }
    data
}

/// Deadline bookkeeping for `--timeout`.
struct Watchdog {
    limit: Option<Duration>,
    last: Instant,
}

impl Watchdog {
    fn progress(&mut self) {
        self.last = Instant::now();
    }

    /// How long to block next; an error once the limit passed.
    fn slice(&self, what: &str) -> Result<Duration, Fail> {
        const SLICE: Duration = Duration::from_millis(100);
        match self.limit {
            None => Ok(SLICE),
            Some(limit) => {
                let waited = self.last.elapsed();
                if waited >= limit {
                    fail(format!("no progress for {:.1} seconds while {what}", waited.as_secs_f64()))
                } else {
                    Ok(SLICE.min(limit - waited))
                }
            }
        }
    }
}

fn pingpong(args: &Args) -> Result<bool, Fail> {
    let plan = Plan::new(args)?;
    let mut watchdog = Watchdog { limit: args.peer.timeout, last: Instant::now() };
    let device = open_device(args)?;
    let mut pp = Pp::init(args, &plan, &device)?;
    // Printed however the run ends: a failed run's counters say most.
    let _stats = args.stats.then(|| StatsAtExit(pp.ctx.clone()));
    let routs = pp.post_recv(i64::from(plan.rx_depth));
    if routs < i64::from(plan.rx_depth) {
        return fail(format!("Couldn't post receive ({routs})"));
    }
    if pp.channel.is_some() {
        pp.cq.req_notify(false);
    }
    let mine = local_dests(&pp, &device, args.gid_idx)?;
    connect_to_peer(args, &mut pp, &plan, &mine, &watchdog)?;
    watchdog.progress();

    let mut checker = args.check.then(|| Checker::new(plan.size, plan.kind.fill()));
    let elapsed = ping_pong(&pp, &plan, args.server.is_some(), routs, checker.as_mut(), &mut watchdog)?;
    print_rates(plan.size, plan.iters, elapsed);
    let valid = match &checker {
        Some(checker) => checker.report(plan.size, pp.data_offset),
        None => true,
    };
    io::stdout().flush().ok();
    if matches!(pp.kind, Kind::Rc | Kind::Srq) {
        pp.qps.clear();
        linger(&pp.ctx);
    }
    Ok(valid)
}

/// The run's shape, once the options are checked and defaulted as the C
/// program of the transport does.
struct Plan {
    kind: Kind,
    size: usize,
    path_mtu: Mtu,
    num_qp: usize,
    rx_depth: u32,
    iters: u32,
}

impl Plan {
    fn new(args: &Args) -> Result<Plan, Fail> {
        let kind = match (args.uc, args.ud, args.srq) {
            (true, _, _) => Kind::Uc,
            (_, true, _) => Kind::Ud,
            (_, _, true) => Kind::Srq,
            _ => Kind::Rc,
        };
        if kind == Kind::Ud && args.mtu.is_some() {
            return fail("-m/--mtu is not an option of ibv_ud_pingpong: UD uses the port's MTU");
        }
        if kind != Kind::Srq && args.num_qp.is_some() {
            return fail("-q/--num-qp is an option of ibv_srq_pingpong only: add --srq");
        }
        if args.ts && kind != Kind::Rc {
            return fail("-t/--ts is an option of ibv_rc_pingpong only");
        }
        let size = args.size.unwrap_or(if kind == Kind::Ud { 1024 } else { 4096 }) as usize;
        let path_mtu = args.mtu.unwrap_or(Mtu::Mtu1024);
        let num_qp = if kind == Kind::Srq { args.num_qp.unwrap_or(16) as usize } else { 1 };
        let rx_depth = args.rx_depth;
        if kind == Kind::Srq {
            if size < 1 {
                return fail("-s must be at least 1 with --srq");
            }
            if num_qp as u32 > rx_depth {
                return fail(format!(
                    "rx_depth {rx_depth} is too small for {num_qp} QPs -- must have at least one receive per QP."
                ));
            }
            if num_qp >= SRQ_MAX_QP {
                return fail(format!("num_qp {num_qp} must be less than {}", SRQ_MAX_QP - 1));
            }
        }
        Ok(Plan { kind, size, path_mtu, num_qp, rx_depth, iters: args.iters })
    }
}

impl Pp {
    /// `pp_init_ctx`: the context on `device`, the completion queue (and
    /// channel with `-e`), the buffer, the SRQ of `--srq`, and the QPs in INIT.
    fn init(args: &Args, plan: &Plan, device: &Device) -> Result<Pp, Fail> {
        let (kind, size, num_qp, rx_depth) = (plan.kind, plan.size, plan.num_qp, plan.rx_depth);
        let ib_port = u8::try_from(args.ib_port).unwrap_or(u8::MAX);
        if args.ib_port < 1 {
            return fail("-i: IB ports start at 1");
        }
        let port_attr = device.query_port(ib_port).map_err(|e| Fail(format!("Couldn't get port info: {e}")))?;
        if kind == Kind::Ud && size > port_attr.active_mtu.bytes() {
            return fail(format!("Requested size larger than port MTU ({})", port_attr.active_mtu.bytes()));
        }
        let ctx = Context::open(
            device,
            ContextOptions { corrupt_icrc_every: args.corrupt_icrc, ..args.peer.context_options() },
        )
        .map_err(|e| Fail(format!("Couldn't get context for {}: {e}", device.name())))?;
        if args.odp {
            return fail("The device isn't ODP capable or does not support RC send and receive with ODP");
        }
        if args.ts {
            return fail("The device isn't completion timestamp capable");
        }
        let channel = if args.events {
            Some(ctx.create_comp_channel().map_err(|e| Fail(format!("Couldn't create completion channel: {e}")))?)
        } else {
            None
        };
        let pd = ctx.alloc_pd().map_err(|e| Fail(format!("Couldn't allocate PD: {e}")))?;
        let data_offset = if kind == Kind::Ud { GRH_LEN } else { 0 };
        let recv_len = size + data_offset;
        let mr = pd
            .alloc_mr(recv_len.max(1), Access::LOCAL_WRITE)
            .map_err(|e| Fail(format!("Couldn't register MR: {e}")))?;
        mr.write(0, &vec![kind.fill(); recv_len])?;
        let cqe = rx_depth as usize + if kind == Kind::Srq { num_qp } else { 1 };
        let cq = ctx.create_cq(cqe, channel.as_ref()).map_err(|e| Fail(format!("Couldn't create CQ: {e}")))?;
        let srq = if kind == Kind::Srq {
            Some(pd.create_srq(rx_depth, 1).map_err(|e| Fail(format!("Couldn't create SRQ: {e}")))?)
        } else {
            None
        };
        let cap = QpCap {
            max_send_wr: 1,
            max_recv_wr: if kind == Kind::Srq { 0 } else { rx_depth },
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut qps = Vec::with_capacity(num_qp);
        for i in 0..num_qp {
            let mut init = pd.create_qp(kind.qp_type(), &cq).cap(cap);
            if let Some(srq) = &srq {
                init = init.srq(srq);
            }
            let qp = init.build().map_err(|e| Fail(format!("Couldn't create QP[{i}]: {e}")))?;
            let mut attr = QpAttr { state: QpState::Init, port: ib_port, pkey_index: 0, ..QpAttr::default() };
            let mask = if kind == Kind::Ud {
                attr.qkey = UD_QKEY;
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY
            } else {
                attr.access_flags = Access::NONE;
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS
            };
            qp.modify(&attr, mask).map_err(|e| Fail(format!("Failed to modify QP to INIT: {e}")))?;
            qps.push(qp);
        }
        let lid = port_attr.lid;
        Ok(Pp { kind, ctx, channel, cq, srq, qps, pd, mr, size, recv_len, data_offset, ud_dest: None, lid })
    }
}

/// Our address for each QP (`my_dest`), with the GID of `-g` or zeros.
fn local_dests(pp: &Pp, device: &Device, gid_idx: Option<i32>) -> Result<Vec<Dest>, Fail> {
    let gid = match gid_idx {
        Some(index) if index >= 0 => match device.gid(index as usize) {
            Some(gid) => gid.to_bytes(),
            None => return fail(format!("can't read sgid of index {index}")),
        },
        _ => [0u8; 16],
    };
    let mut mine = Vec::with_capacity(pp.qps.len());
    for qp in &pp.qps {
        let endpoint = qp.endpoint(0)?;
        mine.push(Dest { lid: u32::from(pp.lid), qpn: qp.qpn(), psn: endpoint.psn.value(), gid });
    }
    Ok(mine)
}

/// Trades addresses with the peer over TCP (the client connects to
/// SERVER, the server listens) and moves the QPs to RTS, printing both
/// sides' addresses as the C programs do.
fn connect_to_peer(args: &Args, pp: &mut Pp, plan: &Plan, mine: &[Dest], watchdog: &Watchdog) -> Result<(), Fail> {
    let exchange_count = if plan.kind == Kind::Srq { SRQ_MAX_QP } else { 1 };
    let mut wire_mine = mine.to_vec();
    wire_mine.resize(exchange_count, Dest::default());
    let print_mine = || {
        for d in mine {
            print_dest("local address: ", d, plan.kind == Kind::Ud);
        }
    };
    let print_remote = |remote: &[Dest]| {
        for d in &remote[..plan.num_qp] {
            print_dest("remote address:", d, false);
        }
    };
    match &args.server {
        Some(server) => {
            print_mine();
            let (remote, peer) = client_exchange(server, args.port, &wire_mine, watchdog)?;
            print_remote(&remote);
            connect(pp, plan.path_mtu, mine, &remote, peer)
        }
        None => {
            let listener = listen(args.port)?;
            print_mine();
            let remote = server_exchange(&listener, pp, plan.path_mtu, mine, &wire_mine, watchdog)?;
            print_remote(&remote);
            Ok(())
        }
    }
}

/// The ping-pong itself, from the client's first sends (with `-c`, of the
/// checked pattern) until every QP has received and sent `iters` messages:
/// a QP sends again once both its last send and a receive completed, and
/// receives are topped up when few remain. Returns how long it took.
fn ping_pong(
    pp: &Pp,
    plan: &Plan,
    client: bool,
    mut routs: i64,
    mut checker: Option<&mut Checker>,
    watchdog: &mut Watchdog,
) -> Result<Duration, Fail> {
    let (kind, num_qp, rx_depth, iters) = (plan.kind, plan.num_qp, plan.rx_depth, plan.iters);
    let mut pending = vec![if client { RECV_WRID | SEND_WRID } else { RECV_WRID }; num_qp];
    if client {
        if checker.is_some() {
            pp.mr.write(pp.data_offset, &pattern(plan.size, kind.fill(), true))?;
        }
        for qp in 0..num_qp {
            if let Err(e) = pp.post_send(qp) {
                return fail(format!("Couldn't post send: {e}"));
            }
        }
    }

    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let num_wc = if kind == Kind::Srq { num_qp + rx_depth as usize } else { 2 };
    let refill_at = if kind == Kind::Srq { num_qp as i64 } else { 1 };
    let mut batch: Vec<WorkCompletion> = Vec::with_capacity(num_wc);
    while rcnt < iters || scnt < iters {
        let what = format!("waiting for completions (received {rcnt}, sent {scnt} of {iters})");
        next_completions(pp, &mut batch, num_wc, watchdog, &what)?;
        for wc in &batch {
            if wc.status != WcStatus::Success {
                return fail(format!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status.as_str(),
                    wc.status as u32,
                    wc.wr_id as i32
                ));
            }
            let qp = match pp.qps.iter().position(|qp| qp.qpn() == wc.qp_num) {
                Some(i) => i,
                None => return fail(format!("Couldn't find QPN {:06x}", wc.qp_num)),
            };
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= refill_at {
                        routs += pp.post_recv(i64::from(rx_depth) - routs);
                        if routs < i64::from(rx_depth) {
                            return fail(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    if let Some(checker) = checker.as_deref_mut() {
                        checker.check(pp, wc);
                    }
                    rcnt += 1;
                }
                other => return fail(format!("Completion for unknown wr_id {}", other as i32)),
            }
            pending[qp] &= !wc.wr_id;
            if scnt < iters && pending[qp] == 0 {
                if let Err(e) = pp.post_send(qp) {
                    return fail(format!("Couldn't post send: {e}"));
                }
                pending[qp] = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok(start.elapsed())
}

/// Waits for completions (for a CQ event with `-e`) and takes up to `max`
/// of them into `batch`; `what` says what is waited for if `--timeout`
/// passes.
fn next_completions(
    pp: &Pp,
    batch: &mut Vec<WorkCompletion>,
    max: usize,
    watchdog: &mut Watchdog,
    what: &str,
) -> Result<(), Fail> {
    batch.clear();
    if let Some(channel) = &pp.channel {
        let id = loop {
            if let Some(id) = channel.get_event(watchdog.slice(what)?) {
                break id;
            }
        };
        if id != pp.cq.id() {
            return fail(format!("CQ event for unknown CQ {id}"));
        }
        pp.cq.req_notify(false);
    } else {
        let first = loop {
            if let Some(wc) = pp.cq.poll_one() {
                break wc;
            }
            if let Some(wc) = pp.cq.wait_one(watchdog.slice(what)?) {
                break wc;
            }
        };
        batch.push(first);
    }
    while batch.len() < max {
        match pp.cq.poll_one() {
            Some(wc) => batch.push(wc),
            None => break,
        }
    }
    if !batch.is_empty() {
        watchdog.progress();
    }
    Ok(())
}

/// The C programs' two result lines, computed as they do in float
/// microseconds (from gettimeofday).
fn print_rates(size: usize, iters: u32, elapsed: Duration) {
    let usec = elapsed.as_micros() as f32;
    let bytes = size as i64 * i64::from(iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        f64::from(usec) / 1_000_000.0,
        bytes as f64 * 8.0 / f64::from(usec)
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        f64::from(usec) / 1_000_000.0,
        f64::from(usec / iters as f32)
    );
}
/// How long the device must hear nothing before a finished run leaves: more
/// than the 67 ms ACK timeout (14) the C programs give the peer.
const LINGER_QUIET: Duration = Duration::from_millis(150);
/// The longest a finished run stays for the peer.
const LINGER_MAX: Duration = Duration::from_secs(2);

/// Keeps the device open, its destroyed RC QPs lingering (rxe-spec V-12),
/// until it has heard nothing for [`LINGER_QUIET`]. The C programs exit at
/// once: if the ACK of the peer's last SEND was lost, the peer resends it
/// to nobody and (rxe, retrying forever) never ends. Staying a moment lets
/// the lingering QP acknowledge it again.
fn linger(ctx: &Context) {
    let start = Instant::now();
    let mut heard = ctx.counters().link.received;
    while start.elapsed() < LINGER_MAX {
        std::thread::sleep(LINGER_QUIET);
        let now = ctx.counters().link.received;
        if now == heard {
            return;
        }
        heard = now;
    }
}

/// Prints our `--stats` line when dropped: what the device's link and QPs
/// counted, so a test harness can see packets dropped for a bad ICRC and
/// RC's retransmissions.
struct StatsAtExit(Context);

impl Drop for StatsAtExit {
    fn drop(&mut self) {
        let c = self.0.counters();
        println!(
            "softroce: sent {} packets ({} with a broken ICRC), received {}, ICRC errors {}, malformed {}, \
             retries {}, timeouts {}, sequence NAKs received {}, duplicates {}",
            c.link.sent,
            c.link.corrupted,
            c.link.received,
            c.link.icrc_errors,
            c.link.malformed + c.malformed,
            c.qp.retries,
            c.qp.timeouts,
            c.qp.seq_naks_received,
            c.qp.duplicate_requests
        );
        io::stdout().flush().ok();
    }
}

/// `pp_connect_ctx`: RTR then RTS with the C programs' attributes, and for
/// UD the address handle.
fn connect(pp: &mut Pp, path_mtu: Mtu, mine: &[Dest], remote: &[Dest], peer: IpAddr) -> Result<(), Fail> {
    // ibv_srq_pingpong addresses every QP by the first remote GID.
    let dest_ip = if remote[0].has_gid() { Gid::from_bytes(remote[0].gid).to_ip() } else { peer };
    for (i, qp) in pp.qps.iter().enumerate() {
        let theirs = &remote[i];
        let base = QpAttr {
            dest: Some(dest_ip),
            path_mtu,
            dest_qpn: theirs.qpn & 0x00ff_ffff,
            rq_psn: Psn::new(theirs.psn),
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: Psn::new(mine[i].psn),
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        let (rtr, rts) = match pp.kind {
            Kind::Rc | Kind::Srq => (
                AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MAX_DEST_RD_ATOMIC
                    | AttrMask::MIN_RNR_TIMER,
                AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::SQ_PSN
                    | AttrMask::MAX_QP_RD_ATOMIC,
            ),
            Kind::Uc => (AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN, AttrMask::SQ_PSN),
            Kind::Ud => (AttrMask::empty(), AttrMask::SQ_PSN),
        };
        let which = if pp.kind == Kind::Srq { format!("QP[{i}]") } else { "QP".to_owned() };
        qp.modify(&QpAttr { state: QpState::Rtr, ..base }, AttrMask::STATE | rtr)
            .map_err(|e| Fail(format!("Failed to modify {which} to RTR: {e}")))?;
        qp.modify(&QpAttr { state: QpState::Rts, ..base }, AttrMask::STATE | rts)
            .map_err(|e| Fail(format!("Failed to modify {which} to RTS: {e}")))?;
    }
    if pp.kind == Kind::Ud {
        let ah = pp.pd.create_ah(Gid::from_ip(dest_ip));
        pp.ud_dest = Some(ah.ud_dest(remote[0].qpn & 0x00ff_ffff, UD_QKEY));
    }
    Ok(())
}

fn read_timeout(watchdog: &Watchdog) -> Option<Duration> {
    watchdog.limit.map(|l| l.max(Duration::from_millis(1)))
}

/// `pp_client_exch_dest`: send ours, read theirs, send `done`. Returns their
/// addresses and the address of the server.
fn client_exchange(server: &str, port: u16, mine: &[Dest], watchdog: &Watchdog) -> Result<(Vec<Dest>, IpAddr), Fail> {
    let couldnt = || Fail(format!("Couldn't connect to {server}:{port}"));
    let addrs: Vec<SocketAddr> =
        (server, port).to_socket_addrs().map_err(|e| Fail(format!("{e} for {server}:{port}")))?.collect();
    let mut stream = addrs.iter().find_map(|a| TcpStream::connect(a).ok()).ok_or_else(couldnt)?;
    stream.set_read_timeout(read_timeout(watchdog))?;
    let peer = stream.peer_addr()?.ip().to_canonical();
    for d in mine {
        stream.write_all(&d.to_wire()).map_err(|e| Fail(format!("Couldn't send local address: {e}")))?;
    }
    let mut theirs = Vec::with_capacity(mine.len());
    for _ in mine {
        let mut msg = [0u8; MSG_LEN];
        stream
            .read_exact(&mut msg)
            .map_err(|e| Fail(format!("client read/write: {e}\nCouldn't read/write remote address")))?;
        theirs.push(parse(&msg)?);
    }
    stream.write_all(DONE).map_err(|e| Fail(format!("client read/write: {e}\nCouldn't read/write remote address")))?;
    Ok((theirs, peer))
}

fn parse(msg: &[u8; MSG_LEN]) -> Result<Dest, Fail> {
    Dest::from_wire(msg).ok_or_else(|| {
        let text = String::from_utf8_lossy(msg.split(|&b| b == 0).next().unwrap_or_default()).into_owned();
        Fail(format!("Couldn't parse remote address {text:?}"))
    })
}

/// The TCP listener of the server, on every address as with AI_PASSIVE.
fn listen(port: u16) -> Result<TcpListener, Fail> {
    TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
        .map_err(|e| Fail(format!("Couldn't listen to port {port}: {e}")))
}

/// `pp_server_exch_dest`: read theirs, connect, send ours, read `done`.
fn server_exchange(
    listener: &TcpListener,
    pp: &mut Pp,
    path_mtu: Mtu,
    mine: &[Dest],
    wire_mine: &[Dest],
    watchdog: &Watchdog,
) -> Result<Vec<Dest>, Fail> {
    let (mut stream, peer) = listener.accept().map_err(|e| Fail(format!("accept() failed: {e}")))?;
    stream.set_read_timeout(read_timeout(watchdog))?;
    let mut theirs = Vec::with_capacity(wire_mine.len());
    for i in 0..wire_mine.len() {
        let mut msg = [0u8; MSG_LEN];
        stream
            .read_exact(&mut msg)
            .map_err(|e| Fail(format!("server read: {e}\nCouldn't read remote address [{i}]")))?;
        theirs.push(parse(&msg)?);
    }
    connect(pp, path_mtu, mine, &theirs, peer.ip().to_canonical())
        .map_err(|Fail(m)| Fail(format!("{m}\nCouldn't connect to remote QP")))?;
    for d in wire_mine {
        stream.write_all(&d.to_wire()).map_err(|e| Fail(format!("Couldn't send/recv local address: {e}")))?;
    }
    let mut done = [0u8; DONE.len()];
    stream.read_exact(&mut done).map_err(|e| Fail(format!("Couldn't send/recv local address: {e}")))?;
    Ok(theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_is_the_c_programs() {
        let gid = Gid::from_ip("10.77.0.2".parse().unwrap()).to_bytes();
        let d = Dest { lid: 0, qpn: 0x11, psn: 0xabcdef, gid };
        let msg = d.to_wire();
        assert_eq!(&msg[..51], b"0000:000011:abcdef:00000000000000000000ffff0a4d0002");
        assert_eq!(msg[51], 0);
        assert_eq!(Dest::from_wire(&msg), Some(d));
        assert!(d.has_gid());
        assert!(!Dest::default().has_gid());
        assert_eq!(&Dest::default().to_wire()[..51], b"0000:000000:000000:00000000000000000000000000000000");
    }

    #[test]
    fn gids_print_as_inet_ntop_does() {
        let text = |s: &str| inet_ntop6(&s.parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(text("::ffff:10.77.0.2"), "::ffff:10.77.0.2");
        assert_eq!(text("::"), "::");
        assert_eq!(text("::1"), "::1");
        assert_eq!(text("::1.2.3.4"), "::1.2.3.4");
        assert_eq!(text("fe80::5054:ff:fe12:3456"), "fe80::5054:ff:fe12:3456");
        assert_eq!(text("1:0:0:2:0:0:0:3"), "1:0:0:2::3");
        assert_eq!(text("1:0:0:2:0:0:3:4"), "1::2:0:0:3:4");
        assert_eq!(text("1:2:3:4:5:6:7:0"), "1:2:3:4:5:6:7:0");
        assert_eq!(text("1:2:3:4:5:6:0:0"), "1:2:3:4:5:6::");
    }

    #[test]
    fn check_pattern_zeroes_page_starts() {
        let p = pattern(8193, FILL, true);
        assert_eq!((p[0], p[1], p[4096], p[4097], p[8192]), (0, FILL, 0, FILL, 0));
        assert!(pattern(100, FILL, false).iter().all(|&b| b == FILL));
        assert!(pattern(100, Kind::Srq.fill(), true).iter().all(|&b| b == 0));
    }
}
