//! The child side: what one process of a shared device does. The parent
//! (`group.rs`) runs this test binary again with [`CHILD_ENV`] set to an
//! encoded [`Role`]; the `member` test then runs [`main`].
//!
//! Members meet through files in the group's directory, each written to a
//! temporary name and renamed, so a reader sees all of it or nothing:
//!
//! - `ep-<i>`: member `i`'s pid, uid, slot, UD QPN and, per peer, the RC QP
//!   connected to that peer (QPN, first PSN, GID) and where that peer's
//!   WRITEs land (address, R_Key);
//! - `ready-<i>`: its QPs are connected and its receives posted;
//! - `stop` (from the parent, timed traffic): stop posting; which members
//!   were killed, and when the events to measure around happened;
//! - `done-<i>`: its own sends to live peers completed;
//! - `result-<i>`: what it sent, received, verified and measured;
//! - `exit` (from the parent): members may now close their devices.
//!
//! The traffic, between every ordered pair of members at once:
//!
//! - RC: message `m` from `i` to `j` is an RDMA WRITE of a pattern known to
//!   both (its length and bytes a function of `i`, `j` and `m`) into slot
//!   `m % RING` of `j`'s region for `i`, then an inline SEND carrying `m`
//!   and a pattern of its own. RC delivers in order, so when the SEND's
//!   receive completes the WRITE has landed: `j` checks both, then reposts
//!   the receive. A sender keeps at most `WINDOW` messages outstanding and
//!   the receiver `RECEIVES` receives posted, so with `RING >= WINDOW +
//!   RECEIVES` no WRITE reaches a slot before its previous message was
//!   checked (a SEND completes only once it consumed a receive).
//! - UD: datagram `seq` from `i` to `j` carries `seq` and a pattern; `j`
//!   checks the bytes and the source QPN and counts each `seq` once.
//! - A newcomer (a process that joins later) pings each member's UD QP;
//!   members answer with a pong, which shows packets reach the newcomer's
//!   slot as well as leave it.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use softroce::verbs::{
    Access, AckTimeout, AddressHandle, CompletionQueue, ConnectOptions, Context, ContextOptions, Device, Error, Gid,
    MemoryRegion, ProtectionDomain, QpCap, QpType, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion, GRH_LEN,
};

use crate::support::{pattern, Rng};

/// The variable that makes this binary a member, holding its [`Role`].
pub const CHILD_ENV: &str = "SOFTROCE_SHARE_CHILD";
/// Every member's device is on this one address.
pub const ADDR: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// How long a member waits for anything before giving up (and failing).
const PATIENCE: Duration = Duration::from_secs(45);

/// RC messages a sender keeps outstanding per peer.
const WINDOW: u64 = 4;
/// Receives a member keeps posted per peer's RC QP.
const RECEIVES: u64 = 8;
/// WRITE slots per ordered pair: at least `WINDOW + RECEIVES` (see above).
const RING: u64 = 12;
/// The largest WRITE (its slot's size): two packets at MTU 4096.
const WRITE_MAX: usize = 6000;
/// The largest SEND, inline.
const SEND_MAX: usize = 240;
/// The largest UD datagram.
const UD_MAX: usize = 1024;
/// UD receives a member keeps posted.
const UD_RECEIVES: u64 = 1024;
/// UD sends a member keeps outstanding, and its send buffers.
const UD_WINDOW: u64 = 64;
const QKEY: u32 = 0x1111_1111;

/// Headers of SENDs and datagrams.
const RC_MAGIC: u32 = 0x5243_4d53;
const UD_MAGIC: u32 = 0x5544_4447;
const PING_MAGIC: u32 = 0x5049_4e47;
const PONG_MAGIC: u32 = 0x504f_4e47;

/// Kinds of work requests, in the top byte of `wr_id`.
const WR_WRITE: u64 = 1;
const WR_SEND: u64 = 2;
const WR_RECV: u64 = 3;
const WR_UD_SEND: u64 = 4;
const WR_UD_RECV: u64 = 5;

/// How long after an event the recovery gap is measured.
pub const GAP_WINDOW_NS: u64 = 300_000_000;

/// What a child process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A fixed number of RC messages and UD datagrams to every peer.
    Counted,
    /// Traffic to every peer until the parent writes `stop`.
    Timed,
    /// Joins late, pings the members in `peers`, waits for their pongs.
    Newcomer,
    /// Another user: tries to open the device and to bind its port.
    Intruder,
}

/// A child's orders, passed in [`CHILD_ENV`] as `key=value;...`.
#[derive(Debug, Clone)]
pub struct Role {
    pub dir: PathBuf,
    pub index: usize,
    /// Members of the traffic group: indices `0..count`.
    pub count: usize,
    pub port: u16,
    /// The parent's pid: the child gives up if it goes away.
    pub parent: u32,
    pub mode: Mode,
    /// Counted mode: RC messages and UD datagrams to each peer.
    pub rc_messages: u64,
    pub ud_datagrams: u64,
    /// Local ACK timeout of the RC QPs (its exponent).
    pub ack_timeout: u8,
    /// Microseconds between one RC message and the next to a peer (0: as
    /// fast as the window allows), and between UD datagrams.
    pub rc_pace_us: u64,
    pub ud_pace_us: u64,
    /// Newcomer: the members to ping.
    pub peers: Vec<usize>,
}

impl Role {
    pub fn encode(&self) -> String {
        let mode = match self.mode {
            Mode::Counted => "counted",
            Mode::Timed => "timed",
            Mode::Newcomer => "newcomer",
            Mode::Intruder => "intruder",
        };
        let peers: Vec<String> = self.peers.iter().map(usize::to_string).collect();
        format!(
            "dir={};index={};count={};port={};parent={};mode={mode};rc={};ud={};timeout={};rc_pace={};ud_pace={};peers={}",
            self.dir.display(),
            self.index,
            self.count,
            self.port,
            self.parent,
            self.rc_messages,
            self.ud_datagrams,
            self.ack_timeout,
            self.rc_pace_us,
            self.ud_pace_us,
            peers.join(",")
        )
    }

    pub fn decode(text: &str) -> Role {
        let fields: BTreeMap<&str, &str> = text.split(';').filter_map(|kv| kv.split_once('=')).collect();
        let get = |key: &str| *fields.get(key).unwrap_or_else(|| panic!("{CHILD_ENV} lacks {key}: {text}"));
        let num = |key: &str| get(key).parse::<u64>().unwrap_or_else(|e| panic!("{key} in {CHILD_ENV}: {e}"));
        Role {
            dir: PathBuf::from(get("dir")),
            index: num("index") as usize,
            count: num("count") as usize,
            port: num("port") as u16,
            parent: num("parent") as u32,
            mode: match get("mode") {
                "counted" => Mode::Counted,
                "timed" => Mode::Timed,
                "newcomer" => Mode::Newcomer,
                "intruder" => Mode::Intruder,
                other => panic!("unknown mode {other}"),
            },
            rc_messages: num("rc"),
            ud_datagrams: num("ud"),
            ack_timeout: num("timeout") as u8,
            rc_pace_us: num("rc_pace"),
            ud_pace_us: num("ud_pace"),
            peers: get("peers").split(',').filter(|p| !p.is_empty()).map(|p| p.parse().unwrap()).collect(),
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the host,
/// so the parent's kill times and the members' receive times compare.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Writes `name` in `dir` whole: to a temporary name, then renamed.
pub fn publish(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    fs::write(&tmp, text).unwrap_or_else(|e| panic!("writing {}: {e}", tmp.display()));
    fs::rename(&tmp, dir.join(name)).unwrap_or_else(|e| panic!("renaming to {name}: {e}"));
}

/// A published file's lines, split into words.
#[derive(Debug, Clone, Default)]
pub struct Lines(pub Vec<Vec<String>>);

impl Lines {
    pub fn read(path: &Path) -> Option<Lines> {
        let text = fs::read_to_string(path).ok()?;
        Some(Lines(text.lines().map(|l| l.split_whitespace().map(str::to_owned).collect()).collect()))
    }

    /// The words after `key` of each line that starts with it.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a [String]> + 'a {
        self.0.iter().filter(move |l| l.first().is_some_and(|k| k == key)).map(|l| &l[1..])
    }

    /// The rest of the first line starting with `key`, as one string.
    pub fn text(&self, key: &str) -> Option<String> {
        self.all(key).next().map(|words| words.join(" "))
    }

    /// The number of line `key N`.
    pub fn num(&self, key: &str) -> Option<u64> {
        self.all(key).next().and_then(|w| w.first()?.parse().ok())
    }

    /// The number of line `key <peer> N`.
    pub fn of(&self, key: &str, peer: usize) -> Option<u64> {
        self.all(key).find(|w| w.first().is_some_and(|p| *p == peer.to_string())).and_then(|w| w.get(1)?.parse().ok())
    }
}

/// What member `index` published in `ep-<index>`.
#[derive(Debug, Clone)]
pub struct Info {
    pub pid: u32,
    pub uid: u32,
    pub slot: u32,
    pub ud_qpn: u32,
    /// When it called `Context::open`, and when that returned.
    pub joining_ns: u64,
    pub joined_ns: u64,
    /// Per peer: QPN, first PSN, GID of its RC QP to that peer, and the
    /// address and R_Key of the slots that peer WRITEs into.
    pub rc: BTreeMap<usize, RcInfo>,
}

#[derive(Debug, Clone, Copy)]
pub struct RcInfo {
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
    pub addr: u64,
    pub rkey: u32,
}

impl Info {
    fn encode(&self) -> String {
        let mut text = format!(
            "pid {}\nuid {}\nslot {}\nud {}\njoining {}\njoined {}\n",
            self.pid, self.uid, self.slot, self.ud_qpn, self.joining_ns, self.joined_ns
        );
        for (peer, rc) in &self.rc {
            let gid: String = rc.gid.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
            text += &format!("rc {peer} {} {} {gid} {} {}\n", rc.qpn, rc.psn, rc.addr, rc.rkey);
        }
        text
    }

    pub fn read(dir: &Path, index: usize) -> Option<Info> {
        let lines = Lines::read(&dir.join(format!("ep-{index}")))?;
        let mut rc = BTreeMap::new();
        for w in lines.all("rc") {
            let n = |i: usize| w[i].parse::<u64>().unwrap();
            let mut gid = [0u8; 16];
            for (i, b) in gid.iter_mut().enumerate() {
                *b = u8::from_str_radix(&w[3][2 * i..2 * i + 2], 16).unwrap();
            }
            let info =
                RcInfo { qpn: n(1) as u32, psn: n(2) as u32, gid: Gid::from_bytes(gid), addr: n(4), rkey: n(5) as u32 };
            rc.insert(n(0) as usize, info);
        }
        Some(Info {
            pid: lines.num("pid")? as u32,
            uid: lines.num("uid")? as u32,
            slot: lines.num("slot")? as u32,
            ud_qpn: lines.num("ud")? as u32,
            joining_ns: lines.num("joining")?,
            joined_ns: lines.num("joined")?,
            rc,
        })
    }
}

/// The child's entry point: does what `spec` (a [`Role`]) says.
pub fn main(spec: &str) {
    let role = Role::decode(spec);
    // Die with the parent's test thread, whatever becomes of it.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } as u32 != role.parent {
        panic!("the parent is gone already");
    }
    match role.mode {
        Mode::Counted | Mode::Timed => Traffic::new(&role).run(),
        Mode::Newcomer => newcomer(&role),
        Mode::Intruder => intruder(&role),
    }
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

fn open(role: &Role) -> Result<Context, Error> {
    let options = ContextOptions { port: role.port, publish_counters: false, ..ContextOptions::default() };
    Context::open(&Device::for_address(ADDR), options)
}

/// Waits until `done()`, failing after [`PATIENCE`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn exists(dir: &Path, name: &str) -> bool {
    dir.join(name).exists()
}

/// A seed for the bytes of one message, from its kind, ends and number.
fn seed(kind: u64, from: usize, to: usize, n: u64) -> u32 {
    Rng::new(kind << 56 ^ (from as u64) << 48 ^ (to as u64) << 40 ^ n).next_u32()
}

fn write_len(from: usize, to: usize, m: u64) -> usize {
    1 + (seed(WR_WRITE, from, to, m) as usize % WRITE_MAX)
}

fn send_len(from: usize, to: usize, m: u64) -> usize {
    16 + (seed(WR_SEND, from, to, m) as usize % (SEND_MAX - 16))
}

fn ud_len(from: usize, to: usize, seq: u64) -> usize {
    16 + (seed(WR_UD_SEND, from, to, seq) as usize % (UD_MAX - 16))
}

/// The bytes of message `n` of `kind` from `from` to `to`: a window of a
/// pattern made once per kind and pair (making patterns byte by byte costs
/// a debug build more than the transfer), at an offset that differs for
/// each of 4093 messages in a row.
fn content(kind: u64, from: usize, to: usize, n: u64, len: usize) -> Vec<u8> {
    const SHIFTS: u64 = 4093;
    thread_local! {
        static BASES: std::cell::RefCell<BTreeMap<(u64, usize, usize), Vec<u8>>> = Default::default();
    }
    BASES.with(|bases| {
        let mut bases = bases.borrow_mut();
        let base = bases
            .entry((kind, from, to))
            .or_insert_with(|| pattern(SHIFTS as usize + WRITE_MAX, seed(kind, from, to, u64::MAX)));
        let at = (n % SHIFTS) as usize;
        base[at..at + len].to_vec()
    })
}

/// A message: a 16-byte header (magic, sender, number), then
/// [`content`] of `kind` to `to`.
fn message(magic: u32, kind: u64, from: usize, to: usize, n: u64, len: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&magic.to_be_bytes());
    bytes.extend_from_slice(&(from as u32).to_be_bytes());
    bytes.extend_from_slice(&n.to_be_bytes());
    bytes.extend_from_slice(&content(kind, from, to, n, len - 16));
    bytes
}

fn header(bytes: &[u8]) -> (u32, usize, u64) {
    let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (word(0), word(4) as usize, u64::from_be_bytes(bytes[8..16].try_into().unwrap()))
}

fn wr_id(kind: u64, peer: usize, value: u64) -> u64 {
    kind << 56 | (peer as u64) << 48 | value
}

fn wr_parts(id: u64) -> (u64, usize, u64) {
    (id >> 56, (id >> 48 & 0xff) as usize, id & 0xffff_ffff_ffff)
}

/// Where things are in a member's one memory region.
struct Layout {
    count: usize,
}

impl Layout {
    /// WRITEs from `peer` land here.
    fn write_in(&self, peer: usize, m: u64) -> usize {
        (peer * RING as usize + (m % RING) as usize) * WRITE_MAX
    }
    /// WRITEs to `peer` leave from here.
    fn write_out(&self, peer: usize, m: u64) -> usize {
        self.write_in(self.count, 0) + self.write_in(peer, m)
    }
    fn send_in(&self, peer: usize, k: u64) -> usize {
        2 * self.write_in(self.count, 0) + (peer * RECEIVES as usize + k as usize) * SEND_MAX
    }
    fn ud_in(&self, k: u64) -> usize {
        self.send_in(self.count, 0) + k as usize * (GRH_LEN + UD_MAX)
    }
    fn ud_out(&self, k: u64) -> usize {
        self.ud_in(UD_RECEIVES) + (k % UD_WINDOW) as usize * UD_MAX
    }
    fn len(&self) -> usize {
        self.ud_out(UD_WINDOW - 1) + UD_MAX
    }
}

/// One peer, as a traffic member sees it.
struct Peer {
    qp: QueuePair,
    remote: RcInfo,
    ud_qpn: u32,
    /// RC messages posted, completed at this end, and received (checked).
    posted: u64,
    completed: u64,
    received: u64,
    next_due: u64,
    /// The first failed completion on the QP (the peer died, if all is well).
    error: Option<WcStatus>,
    /// When each message from the peer was checked.
    received_at: Vec<u64>,
    ud_sent: u64,
    ud_done: u64,
    ud_due: u64,
    ud_seen: Vec<bool>,
    ud_received: u64,
    ud_duplicates: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Posting.
    Traffic,
    /// Timed mode after `stop`: waiting for its sends to complete.
    Draining,
    /// `done` published: taking what the others still send.
    Settling { until: Option<u64> },
    /// `result` published: waiting for `exit`.
    Reported,
}

/// A member with RC and UD traffic to every other member.
struct Traffic {
    role: Role,
    me: usize,
    layout: Layout,
    ctx: Context,
    // Fields drop in order: QPs before the CQ, region and PD they use.
    peers: BTreeMap<usize, Peer>,
    ud: QueuePair,
    ah: AddressHandle,
    mr: MemoryRegion,
    cq: CompletionQueue,
    _pd: ProtectionDomain,
    info: Info,
    phase: Phase,
    /// Members the parent killed, and the events it wants gaps around.
    killed: Vec<usize>,
    events: Vec<u64>,
    stop_ns: u64,
    started_ns: u64,
    next_file_check: u64,
    ud_posted: u64,
    ud_completed: u64,
    pongs_owed: Vec<u32>,
    pings: u64,
}

impl Traffic {
    /// Opens the device, makes the QPs and publishes `ep-<index>`.
    fn new(role: &Role) -> Traffic {
        let me = role.index;
        let joining_ns = mono_ns();
        let ctx = open(role).unwrap_or_else(|e| panic!("member {me} could not open the device: {e}"));
        let joined_ns = mono_ns();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(8192, None).unwrap();
        let layout = Layout { count: role.count };
        let mr = pd.alloc_mr(layout.len(), Access::LOCAL_WRITE.union(Access::REMOTE_WRITE)).unwrap();
        let rc_cap = QpCap {
            max_send_wr: 4 * WINDOW as u32,
            max_recv_wr: RECEIVES as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: SEND_MAX as u32,
        };
        let mut qps = BTreeMap::new();
        for peer in (0..role.count).filter(|&p| p != me) {
            qps.insert(peer, pd.create_qp(QpType::Rc, &cq).cap(rc_cap).build().unwrap());
        }
        let ud_cap = QpCap {
            max_send_wr: UD_WINDOW as u32,
            max_recv_wr: UD_RECEIVES as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let ud = pd.create_qp(QpType::Ud, &cq).cap(ud_cap).build().unwrap();
        ud.activate(QKEY).unwrap();
        let slot = ud.qpn() >> 16;
        let mut rc = BTreeMap::new();
        for (&peer, qp) in &qps {
            assert_eq!(qp.qpn() >> 16, slot, "QPN {:#x} of member {me} is not of its slot {slot}", qp.qpn());
            let ep = qp.endpoint(1).unwrap();
            let addr = mr.addr() + layout.write_in(peer, 0) as u64;
            rc.insert(peer, RcInfo { qpn: ep.qpn, psn: ep.psn.value(), gid: ep.gid, addr, rkey: mr.rkey() });
        }
        let info =
            Info { pid: std::process::id(), uid: uid(), slot, ud_qpn: ud.qpn(), joining_ns, joined_ns, rc: rc.clone() };
        publish(&role.dir, &format!("ep-{me}"), &info.encode());

        // Everyone's endpoints, then connect.
        let dir = role.dir.clone();
        wait_until("every member's endpoints", || (0..role.count).all(|i| exists(&dir, &format!("ep-{i}"))));
        let mut peers = BTreeMap::new();
        for (peer, qp) in qps {
            let theirs = Info::read(&role.dir, peer).expect("published whole");
            let remote = theirs.rc[&me];
            let endpoint = softroce::verbs::Endpoint {
                qpn: remote.qpn,
                psn: softroce::verbs::Psn::new(remote.psn),
                gid: remote.gid,
            };
            let options = ConnectOptions {
                access: Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
                timeout: AckTimeout::from_exponent(role.ack_timeout).expect("an exponent"),
                retry_cnt: 7,
                rnr_retry: 7,
                // 0.01 ms: a receiver short of receives is never kept waiting.
                min_rnr_timer: 1,
                ..ConnectOptions::default()
            };
            qp.connect(&endpoint, &options).unwrap();
            let peer_state = Peer {
                qp,
                remote,
                ud_qpn: theirs.ud_qpn,
                posted: 0,
                completed: 0,
                received: 0,
                next_due: 0,
                error: None,
                received_at: Vec::new(),
                ud_sent: 0,
                ud_done: 0,
                ud_due: 0,
                ud_seen: Vec::new(),
                ud_received: 0,
                ud_duplicates: 0,
            };
            peers.insert(peer, peer_state);
        }
        let ah = pd.create_ah(Gid::from_ip(ADDR));
        let member = Traffic {
            role: role.clone(),
            me,
            layout,
            ctx,
            peers,
            ud,
            ah,
            mr,
            cq,
            _pd: pd,
            info,
            phase: Phase::Traffic,
            killed: Vec::new(),
            events: Vec::new(),
            stop_ns: 0,
            started_ns: 0,
            next_file_check: 0,
            ud_posted: 0,
            ud_completed: 0,
            pongs_owed: Vec::new(),
            pings: 0,
        };
        for (&peer, p) in &member.peers {
            for k in 0..RECEIVES {
                member.post_rc_recv(p, peer, k);
            }
        }
        for k in 0..UD_RECEIVES {
            member.post_ud_recv(k);
        }
        member
    }

    fn post_rc_recv(&self, p: &Peer, peer: usize, k: u64) {
        let wr = RecvWr {
            wr_id: wr_id(WR_RECV, peer, k),
            sg_list: softroce::sg_list![self.mr.sge(self.layout.send_in(peer, k), SEND_MAX)],
        };
        if let Err(e) = p.qp.post_recv(wr) {
            assert!(p.error.is_some(), "member {}: receive for {peer}: {e}", self.me);
        }
    }

    fn post_ud_recv(&self, k: u64) {
        let wr = RecvWr {
            wr_id: wr_id(WR_UD_RECV, 0, k),
            sg_list: softroce::sg_list![self.mr.sge(self.layout.ud_in(k), GRH_LEN + UD_MAX)],
        };
        self.ud.post_recv(wr).unwrap();
    }

    fn run(mut self) {
        let dir = self.role.dir.clone();
        publish(&dir, &format!("ready-{}", self.me), "");
        wait_until("every member ready", || (0..self.role.count).all(|i| exists(&dir, &format!("ready-{i}"))));
        self.started_ns = mono_ns();
        let mut wcs = [WorkCompletion::new(0, 0, WcStatus::Success, WcOpcode::Send); 64];
        let deadline = Instant::now() + 3 * PATIENCE;
        loop {
            let now = mono_ns();
            if self.phase == Phase::Traffic {
                self.post_rc(now);
                self.post_ud(now);
            }
            self.post_pongs();
            let n = self.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                self.handle(wc);
            }
            if n == 0 {
                let wait = self.next_due(now).saturating_sub(now).clamp(50_000, 2_000_000);
                if let Some(wc) = self.cq.wait_one(Duration::from_nanos(wait)) {
                    self.handle(&wc);
                }
            }
            if now >= self.next_file_check {
                self.next_file_check = now + 5_000_000;
                if self.advance(now) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "member {}: still in {:?} after {:?}",
                    self.me,
                    self.phase,
                    3 * PATIENCE
                );
            }
        }
    }

    /// When the next message or datagram is due (far away if none is).
    fn next_due(&self, now: u64) -> u64 {
        if self.phase != Phase::Traffic {
            return now + 2_000_000;
        }
        self.peers.values().flat_map(|p| [p.next_due, p.ud_due]).min().unwrap_or(u64::MAX).max(now)
    }

    fn live(&self, peer: usize, p: &Peer) -> bool {
        p.error.is_none() && !self.killed.contains(&peer)
    }

    fn post_rc(&mut self, now: u64) {
        let counted = self.role.mode == Mode::Counted;
        let me = self.me;
        let peers: Vec<usize> = self.peers.keys().copied().collect();
        for peer in peers {
            loop {
                let p = &self.peers[&peer];
                let room = p.posted < p.completed + WINDOW && (!counted || p.posted < self.role.rc_messages);
                if !self.live(peer, p) || !room || now < p.next_due {
                    break;
                }
                let m = p.posted;
                let wlen = write_len(me, peer, m);
                let out = self.layout.write_out(peer, m);
                self.mr.write(out, &content(WR_WRITE, me, peer, m, wlen)).unwrap();
                let mut write = SendWr::new(
                    wr_id(WR_WRITE, peer, m),
                    SendOp::RdmaWrite {
                        remote_addr: p.remote.addr + (m % RING) * WRITE_MAX as u64,
                        rkey: p.remote.rkey,
                    },
                )
                .with_sge(self.mr.sge(out, wlen));
                write.flags.signaled = false;
                let mut send = SendWr::new(wr_id(WR_SEND, peer, m), SendOp::Send);
                send.flags.inline = true;
                send.inline_data = message(RC_MAGIC, WR_SEND, me, peer, m, send_len(me, peer, m)).into();
                let posted = p.qp.post_send_list([write, send]);
                let p = self.peers.get_mut(&peer).unwrap();
                if let Err((_, e)) = posted {
                    assert!(p.error.is_some(), "member {me}: posting to {peer}: {e}");
                    break;
                }
                p.posted += 1;
                if self.role.rc_pace_us > 0 {
                    p.next_due = now.max(p.next_due) + self.role.rc_pace_us * 1000;
                }
            }
        }
    }

    fn post_ud(&mut self, now: u64) {
        let me = self.me;
        let peers: Vec<usize> = self.peers.keys().copied().collect();
        for peer in peers {
            let p = &self.peers[&peer];
            let more = self.role.mode == Mode::Timed || p.ud_sent < self.role.ud_datagrams;
            if !self.live(peer, p) || !more || now < p.ud_due || self.ud_posted - self.ud_completed >= UD_WINDOW {
                continue;
            }
            let seq = p.ud_sent;
            let bytes = message(UD_MAGIC, WR_UD_SEND, me, peer, seq, ud_len(me, peer, seq));
            let qpn = p.ud_qpn;
            self.send_ud(wr_id(WR_UD_SEND, peer, seq), qpn, &bytes);
            let p = self.peers.get_mut(&peer).unwrap();
            p.ud_sent += 1;
            p.ud_due = now.max(p.ud_due) + self.role.ud_pace_us * 1000;
        }
    }

    fn send_ud(&mut self, id: u64, qpn: u32, bytes: &[u8]) {
        let out = self.layout.ud_out(self.ud_posted);
        self.mr.write(out, bytes).unwrap();
        let wr =
            SendWr::new(id, SendOp::Send).with_sge(self.mr.sge(out, bytes.len())).with_ud(self.ah.ud_dest(qpn, QKEY));
        self.ud.post_send(wr).unwrap();
        self.ud_posted += 1;
    }

    fn post_pongs(&mut self) {
        while self.ud_posted - self.ud_completed < UD_WINDOW {
            let Some(qpn) = self.pongs_owed.pop() else { break };
            let bytes = message(PONG_MAGIC, 0, self.me, 0, u64::from(qpn), 16);
            self.send_ud(wr_id(WR_UD_SEND, 0xff, 0), qpn, &bytes);
        }
    }

    fn handle(&mut self, wc: &WorkCompletion) {
        let me = self.me;
        let (kind, peer, value) = wr_parts(wc.wr_id);
        match kind {
            WR_WRITE | WR_SEND => {
                let p = self.peers.get_mut(&peer).expect("a peer's QP");
                if wc.status != WcStatus::Success {
                    p.error.get_or_insert(wc.status);
                    return;
                }
                assert_eq!(kind, WR_SEND, "member {me}: an unsignaled WRITE to {peer} completed");
                assert_eq!(value, p.completed, "member {me}: SENDs to {peer} completed out of order");
                p.completed += 1;
            }
            WR_RECV => {
                if wc.status != WcStatus::Success {
                    let p = self.peers.get_mut(&peer).expect("a peer's QP");
                    p.error.get_or_insert(wc.status);
                    return;
                }
                self.check_rc(peer, value, wc);
            }
            WR_UD_SEND => {
                assert_eq!(wc.status, WcStatus::Success, "member {me}: UD send to {peer}");
                self.ud_completed += 1;
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.ud_done += 1;
                }
            }
            WR_UD_RECV => {
                assert_eq!(wc.status, WcStatus::Success, "member {me}: UD receive");
                self.check_ud(value, wc);
                self.post_ud_recv(value);
            }
            _ => panic!("member {me}: a completion of no request of mine: {wc:?}"),
        }
    }

    /// Checks message `received` from `peer` (its SEND in receive `k`, its
    /// WRITE in its slot) and reposts the receive.
    fn check_rc(&mut self, peer: usize, k: u64, wc: &WorkCompletion) {
        let me = self.me;
        let p = &self.peers[&peer];
        let m = p.received;
        assert_eq!(wc.qp_num, p.qp.qpn(), "member {me}: a receive of {peer}'s QP completed on another");
        let slen = send_len(peer, me, m);
        assert_eq!(wc.byte_len as usize, slen, "member {me}: length of SEND {m} from {peer}");
        let mut got = vec![0; slen];
        self.mr.read(self.layout.send_in(peer, k), &mut got).unwrap();
        let expected = message(RC_MAGIC, WR_SEND, peer, me, m, slen);
        if got != expected {
            let (magic, from, n) = header(&got);
            panic!("member {me}: SEND {m} from {peer} is wrong (header: magic {magic:#x}, from {from}, number {n})");
        }
        let wlen = write_len(peer, me, m);
        let mut written = vec![0; wlen];
        self.mr.read(self.layout.write_in(peer, m), &mut written).unwrap();
        if written != content(WR_WRITE, peer, me, m, wlen) {
            panic!("member {me}: WRITE {m} from {peer} ({wlen} bytes, slot {}) is wrong", m % RING);
        }
        let p = self.peers.get_mut(&peer).unwrap();
        p.received += 1;
        p.received_at.push(mono_ns());
        let p = &self.peers[&peer];
        self.post_rc_recv(p, peer, k);
    }

    fn check_ud(&mut self, k: u64, wc: &WorkCompletion) {
        let me = self.me;
        assert!(wc.byte_len as usize >= GRH_LEN + 16, "member {me}: a datagram of {} bytes", wc.byte_len);
        let len = wc.byte_len as usize - GRH_LEN;
        let mut got = vec![0; len];
        self.mr.read(self.layout.ud_in(k) + GRH_LEN, &mut got).unwrap();
        let (magic, from, n) = header(&got);
        match magic {
            UD_MAGIC => {
                let p = self.peers.get_mut(&from).unwrap_or_else(|| panic!("member {me}: a datagram from {from}"));
                assert_eq!(wc.src_qp, p.ud_qpn, "member {me}: datagram {n} from {from} names another source QP");
                let expected = message(UD_MAGIC, WR_UD_SEND, from, me, n, ud_len(from, me, n));
                assert!(got == expected, "member {me}: datagram {n} from {from} is wrong ({len} bytes)");
                let n = n as usize;
                if p.ud_seen.len() <= n {
                    p.ud_seen.resize(n + 1, false);
                }
                if std::mem::replace(&mut p.ud_seen[n], true) {
                    p.ud_duplicates += 1;
                } else {
                    p.ud_received += 1;
                }
            }
            PING_MAGIC => {
                assert_eq!(u64::from(wc.src_qp), n, "member {me}: a ping from {:#x} says it is {n:#x}", wc.src_qp);
                self.pings += 1;
                self.pongs_owed.push(wc.src_qp);
            }
            _ => panic!("member {me}: a datagram of unknown magic {magic:#x} from QP {:#x}", wc.src_qp),
        }
    }

    /// Reads the group's files and moves through the phases; true once
    /// `exit` came.
    fn advance(&mut self, now: u64) -> bool {
        let dir = self.role.dir.clone();
        if self.phase == Phase::Traffic && self.role.mode == Mode::Timed {
            if let Some(stop) = Lines::read(&dir.join("stop")) {
                self.stop_ns = stop.num("stop").expect("stop time");
                self.killed = stop.all("killed").map(|w| w[0].parse().unwrap()).collect();
                self.events = stop.all("event").map(|w| w[1].parse().unwrap()).collect();
                self.phase = Phase::Draining;
            }
        }
        match self.phase {
            Phase::Traffic if self.role.mode == Mode::Counted => {
                let all_sent = self.peers.values().all(|p| {
                    p.error.is_some()
                        || (p.completed == self.role.rc_messages
                            && p.received == self.role.rc_messages
                            && p.ud_sent == self.role.ud_datagrams)
                });
                if all_sent && self.ud_completed == self.ud_posted {
                    publish(&dir, &format!("done-{}", self.me), "");
                    self.phase = Phase::Settling { until: None };
                }
            }
            Phase::Traffic => {}
            Phase::Draining => {
                let drained = self.peers.iter().all(|(&peer, p)| !self.live(peer, p) || p.completed == p.posted);
                if drained && self.ud_completed == self.ud_posted {
                    publish(&dir, &format!("done-{}", self.me), "");
                    self.phase = Phase::Settling { until: None };
                }
            }
            Phase::Settling { until: None } => {
                let members = (0..self.role.count).filter(|i| !self.killed.contains(i));
                if members.clone().all(|i| exists(&dir, &format!("done-{i}"))) {
                    // What is in flight arrives within this (UD has no ACK
                    // to wait for); in counted mode the last datagram ends it.
                    let all_ud = self.role.mode == Mode::Counted
                        && self.peers.values().all(|p| p.error.is_some() || p.ud_received == self.role.ud_datagrams);
                    self.phase = Phase::Settling { until: Some(if all_ud { now } else { now + 200_000_000 }) };
                }
            }
            Phase::Settling { until: Some(until) } => {
                if now >= until {
                    publish(&dir, &format!("result-{}", self.me), &self.result());
                    self.phase = Phase::Reported;
                }
            }
            Phase::Reported => return exists(&dir, "exit"),
        }
        false
    }

    fn result(&self) -> String {
        let mut text = format!("index {}\nslot {}\nuid {}\npings {}\n", self.me, self.info.slot, uid(), self.pings);
        let end = if self.stop_ns > 0 { self.stop_ns } else { mono_ns() };
        for (&peer, p) in &self.peers {
            text += &format!(
                "rc_posted {peer} {}\nrc_sent {peer} {}\nrc_recv {peer} {}\n",
                p.posted, p.completed, p.received
            );
            text += &format!(
                "ud_sent {peer} {}\nud_recv {peer} {}\nud_dup {peer} {}\n",
                p.ud_done, p.ud_received, p.ud_duplicates
            );
            if let Some(status) = p.error {
                text += &format!("rc_error {peer} {status:?}\n");
            }
            // Receives checked after traffic started and before `stop`.
            let times: Vec<u64> = p.received_at.iter().copied().filter(|&t| t < end).collect();
            let mut previous = self.started_ns;
            let mut longest = 0;
            for &t in &times {
                longest = longest.max(t - previous);
                previous = t;
            }
            text += &format!("max_gap {peer} {longest}\nafter_last_event {peer} {}\n", {
                let last = self.events.iter().max().copied().unwrap_or(u64::MAX);
                times.iter().filter(|&&t| t > last).count()
            });
            for (e, &event) in self.events.iter().enumerate() {
                text += &format!("gap {e} {peer} {}\n", gap_around(&times, event, end));
            }
        }
        let per_qp: BTreeMap<u32, softroce::transport::Counters> = self.ctx.qp_counters().into_iter().collect();
        for (&peer, p) in &self.peers {
            if let Some(c) = per_qp.get(&p.qp.qpn()) {
                text += &format!("rc_timeouts {peer} {}\nrc_retries {peer} {}\n", c.timeouts, c.retries);
            }
        }
        let c = self.ctx.counters();
        text += &format!(
            "counters forwarded={} ownerless={} unknown_qp={} retries={} timeouts={} seq_naks={} rnr_naks={} dropped={}\n",
            c.link.forwarded,
            c.link.ownerless,
            c.unknown_qp,
            c.qp.retries,
            c.qp.timeouts,
            c.qp.seq_naks_received,
            c.qp.rnr_naks_received,
            c.qp.dropped
        );
        text
    }
}

/// The longest wait between successive receives `times` that ends at or
/// after `event` and starts within [`GAP_WINDOW_NS`] of it: how long the
/// traffic stalled around it. If nothing came after `event` at all, the
/// wait until `end` counts.
pub fn gap_around(times: &[u64], event: u64, end: u64) -> u64 {
    let before = times.iter().rev().find(|&&t| t < event).copied().unwrap_or(event);
    let mut previous = before;
    let mut longest = 0;
    let mut any = false;
    for &t in times.iter().filter(|&&t| t >= event) {
        if previous >= event + GAP_WINDOW_NS {
            break;
        }
        longest = longest.max(t - previous);
        previous = t;
        any = true;
    }
    if any {
        longest
    } else {
        end.saturating_sub(before)
    }
}

/// A process that joins after the others: takes a slot, pings each member
/// in `role.peers` on its UD QP until it answers, and reports.
fn newcomer(role: &Role) {
    let me = role.index;
    let joining_ns = mono_ns();
    let ctx = open(role).unwrap_or_else(|e| panic!("the newcomer could not open the device: {e}"));
    let joined_ns = mono_ns();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mr = pd.alloc_mr(64 * (GRH_LEN + UD_MAX), Access::LOCAL_WRITE).unwrap();
    let ud = pd.create_qp(QpType::Ud, &cq).build().unwrap();
    ud.activate(QKEY).unwrap();
    for k in 0..32 {
        let wr =
            RecvWr { wr_id: k, sg_list: softroce::sg_list![mr.sge(k as usize * (GRH_LEN + UD_MAX), GRH_LEN + UD_MAX)] };
        ud.post_recv(wr).unwrap();
    }
    let info = Info {
        pid: std::process::id(),
        uid: uid(),
        slot: ud.qpn() >> 16,
        ud_qpn: ud.qpn(),
        joining_ns,
        joined_ns,
        rc: BTreeMap::new(),
    };
    publish(&role.dir, &format!("ep-{me}"), &info.encode());
    let members: BTreeMap<u32, usize> =
        role.peers.iter().map(|&p| (Info::read(&role.dir, p).expect("a member's endpoints").ud_qpn, p)).collect();
    let ah = pd.create_ah(Gid::from_ip(ADDR));
    let ping = message(PING_MAGIC, 0, me, 0, u64::from(ud.qpn()), 16);
    let send_at = 32 * (GRH_LEN + UD_MAX);
    mr.write(send_at, &ping).unwrap();
    let mut answered: BTreeMap<usize, u64> = BTreeMap::new();
    let mut pings = 0u64;
    let mut outstanding = 0;
    let deadline = Instant::now() + PATIENCE;
    let mut next_round = Instant::now();
    while answered.len() < members.len() {
        assert!(Instant::now() < deadline, "the newcomer had pongs from only {answered:?} of {:?}", role.peers);
        if Instant::now() >= next_round && outstanding == 0 {
            for (&qpn, peer) in &members {
                if !answered.contains_key(peer) {
                    let wr = SendWr::new(u64::MAX, SendOp::Send)
                        .with_sge(mr.sge(send_at, 16))
                        .with_ud(ah.ud_dest(qpn, QKEY));
                    ud.post_send(wr).unwrap();
                    outstanding += 1;
                    pings += 1;
                }
            }
            next_round = Instant::now() + Duration::from_millis(20);
        }
        let Some(wc) = cq.wait_one(Duration::from_millis(5)) else { continue };
        assert_eq!(wc.status, WcStatus::Success, "newcomer: {wc:?}");
        if wc.wr_id == u64::MAX {
            outstanding -= 1;
            continue;
        }
        let mut got = [0u8; 16];
        mr.read(wc.wr_id as usize * (GRH_LEN + UD_MAX) + GRH_LEN, &mut got).unwrap();
        let (magic, from, n) = header(&got);
        assert_eq!(
            (magic, n),
            (PONG_MAGIC, u64::from(ud.qpn())),
            "newcomer: not a pong for it, from QP {:#x}",
            wc.src_qp
        );
        assert_eq!(
            members.get(&wc.src_qp),
            Some(&from),
            "newcomer: a pong from QP {:#x} says it is member {from}",
            wc.src_qp
        );
        answered.entry(from).or_insert_with(mono_ns);
        let k = wc.wr_id;
        let wr =
            RecvWr { wr_id: k, sg_list: softroce::sg_list![mr.sge(k as usize * (GRH_LEN + UD_MAX), GRH_LEN + UD_MAX)] };
        ud.post_recv(wr).unwrap();
    }
    let mut text = format!("index {me}\nslot {}\nuid {}\npings {pings}\n", info.slot, uid());
    for (peer, at) in &answered {
        text += &format!("pong {peer} {}\n", at - joined_ns);
    }
    publish(&role.dir, &format!("result-{me}"), &text);
    wait_until("exit", || exists(&role.dir, "exit"));
    // Late pongs may still be coming: the QP and CQ go, then the context.
    drop(ud);
    drop(cq);
    drop(mr);
}

/// Another user: tries to open the device on the members' address and
/// port, then to bind the port in the ways a program might, and reports
/// what each attempt gave.
fn intruder(role: &Role) {
    let mut text = format!("uid {}\n", uid());
    match open(role) {
        Ok(_) => text += "open ok\n",
        Err(e) => {
            let kind = match &e {
                Error::Io(io) => format!("{:?}", io.kind()),
                other => format!("not-io:{other:?}"),
            };
            text += &format!(
                "open_errno {}\nopen_kind {kind}\nopen_text {}\n",
                e.errno(),
                e.to_string().replace('\n', " ")
            );
        }
    }
    for case in BIND_CASES {
        let outcome = match try_bind(&case, role.port) {
            Ok(()) => "ok".to_string(),
            Err(e) => e.raw_os_error().unwrap_or(-1).to_string(),
        };
        text += &format!("bind {} {outcome}\n", case.name);
    }
    publish(&role.dir, &format!("result-{}", role.index), &text);
}

/// One way to bind the members' port.
#[derive(Debug, Clone, Copy)]
pub struct BindCase {
    pub name: &'static str,
    addr: IpAddr,
    reuse_port: bool,
    reuse_addr: bool,
    v6_only: bool,
}

const fn case(name: &'static str, addr: IpAddr, reuse_port: bool, reuse_addr: bool, v6_only: bool) -> BindCase {
    BindCase { name, addr, reuse_port, reuse_addr, v6_only }
}

const ANY4: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
const ANY6: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
const MAPPED: IpAddr = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());

pub const BIND_CASES: [BindCase; 15] = [
    case("addr", ADDR, false, false, false),
    case("addr+reuseport", ADDR, true, false, false),
    case("addr+reuseaddr", ADDR, false, true, false),
    case("addr+both", ADDR, true, true, false),
    case("any4", ANY4, false, false, false),
    case("any4+reuseport", ANY4, true, false, false),
    case("any4+reuseaddr", ANY4, false, true, false),
    case("any4+both", ANY4, true, true, false),
    case("any6-dual", ANY6, false, false, false),
    case("any6-dual+reuseport", ANY6, true, false, false),
    case("any6-dual+reuseaddr", ANY6, false, true, false),
    case("any6-dual+both", ANY6, true, true, false),
    case("mapped-dual", MAPPED, false, false, false),
    case("any6-v6only", ANY6, false, false, true),
    case("any6-v6only+both", ANY6, true, true, true),
];

/// Binds a UDP socket as `case` says on `port`, and closes it.
fn try_bind(case: &BindCase, port: u16) -> io::Result<()> {
    let family = if case.addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2); the descriptor is closed below.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let set = |level, option, on: bool| -> io::Result<()> {
        let value: libc::c_int = on.into();
        // SAFETY: a c_int option of its size.
        let rc = unsafe {
            libc::setsockopt(fd, level, option, (&value as *const libc::c_int).cast(), size_of::<libc::c_int>() as u32)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    let bound = (|| {
        set(libc::SOL_SOCKET, libc::SO_REUSEPORT, case.reuse_port)?;
        set(libc::SOL_SOCKET, libc::SO_REUSEADDR, case.reuse_addr)?;
        if case.addr.is_ipv6() {
            set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, case.v6_only)?;
        }
        // SAFETY: zero is a valid sockaddr_storage.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match SocketAddr::new(case.addr, port) {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>().write(sin) };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: 0,
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>().write(sin6) };
                size_of::<libc::sockaddr_in6>()
            }
        };
        // SAFETY: `storage` holds a sockaddr of `len` bytes.
        if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len as libc::socklen_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })();
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    bound
}
