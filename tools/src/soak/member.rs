//! One member of the soak: a process with one context on its address and
//! the shared port, a server that accepts rdma_cm connections and checks
//! what arrives, and client threads that connect to peers, run checked
//! rounds (WRITE, READ, an atomic and a SEND on RC, a SEND on UC and one on
//! UD) and disconnect. It reports through files in the soak's directory:
//! `progress` (rewritten), `events` (appended, so that they survive a
//! SIGKILL) and, after a clean stop, `result`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softroce::cm::{CmEventKind, CmId, CmOptions, ConnParam, EventChannel, PortSpace};
use softroce::verbs::{
    Access, CompletionQueue, ConnectOptions, Context, ContextOptions, Device, Endpoint, Gid, MemoryRegion,
    ProtectionDomain, QpType, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use softroce::net::sim::SplitMix64;

use super::pattern;

/// How long any completion, answer or CM step may take before it counts
/// as lost: a dead peer's RC retries end after 8 timeouts of 2.1 s (the
/// CM's local ACK timeout), well within it.
pub const BOUND: Duration = Duration::from_secs(45);
/// How long a member waits after dropping everything for its threads to
/// be gone: longer than TimeWait (2^(19 − 8) ms = 2.05 s for rdma_cm's
/// ACK timeout code 19), through which a CM service whose DREQ went
/// unanswered keeps its context, as the kernel keeps such a cm_id.
const SETTLE: Duration = Duration::from_secs(4);
/// Client threads per member.
const CLIENTS: u64 = 2;
/// The Q_Key of the UD QPs.
const QKEY: u32 = 0x1111_2222;
/// A server that heard nothing on a connection for this long sends a
/// probe, whose retries end in an error if the client died.
const IDLE_PROBE: Duration = Duration::from_secs(5);
/// The message number of a probe.
const PROBE: u64 = u64::MAX;
/// Bytes of a message's header: connection, message number, WRITE length.
const HEADER: usize = 20;
/// Room for a UD datagram's GRH in a receive.
const GRH: usize = 40;
/// Receives posted per QP.
const RECVS: usize = 4;

const ALL: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// The server's region for one connection.
mod srv {
    pub const SLOT: usize = 4096 + super::GRH;
    pub const RC_RECV: usize = 0;
    pub const UC_RECV: usize = RC_RECV + super::RECVS * SLOT;
    pub const UD_RECV: usize = UC_RECV + super::RECVS * SLOT;
    pub const WRITE: usize = UD_RECV + super::RECVS * SLOT;
    pub const WRITE_MAX: usize = 8192;
    pub const ACK_OUT: usize = WRITE + WRITE_MAX;
    pub const PROBE_OUT: usize = ACK_OUT + 64;
    pub const ATOMIC: usize = PROBE_OUT + 64;
    pub const LEN: usize = ATOMIC + 8;
}

/// The client's region for one connection.
mod cli {
    pub const ACK_RECV: usize = 0;
    pub const ACK_SLOT: usize = 64;
    pub const SEND_OUT: usize = 4096;
    pub const UC_OUT: usize = 8192;
    pub const UD_OUT: usize = 12288;
    pub const WRITE_OUT: usize = 16384;
    pub const READ_IN: usize = WRITE_OUT + super::srv::WRITE_MAX;
    pub const ATOMIC_IN: usize = READ_IN + super::srv::WRITE_MAX;
    pub const PROBE_IN: usize = ATOMIC_IN + 8;
    pub const LEN: usize = PROBE_IN + 8;
}

/// What the parent tells a member.
pub struct Spec {
    pub dir: PathBuf,
    pub index: u32,
    pub generation: u32,
    pub addr: IpAddr,
    pub port: u16,
    pub cm_port: u16,
    pub peers: Vec<(u32, SocketAddr)>,
}

impl Spec {
    pub fn to_args(&self) -> Vec<String> {
        let peers: Vec<String> = self.peers.iter().map(|(i, a)| format!("{i}={a}")).collect();
        vec![
            "member".into(),
            self.dir.display().to_string(),
            self.index.to_string(),
            self.generation.to_string(),
            self.addr.to_string(),
            self.port.to_string(),
            self.cm_port.to_string(),
            peers.join(","),
        ]
    }

    pub fn from_args(args: &[String]) -> Result<Spec, String> {
        let [dir, index, generation, addr, port, cm_port, peers] = args else {
            return Err("member DIR INDEX GENERATION ADDR PORT CM_PORT PEERS".into());
        };
        let bad = |what: &str| format!("bad {what}");
        let peers = peers
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (i, a) = p.split_once('=').ok_or_else(|| bad("peer"))?;
                Ok((i.parse().map_err(|_| bad("peer"))?, a.parse().map_err(|_| bad("peer"))?))
            })
            .collect::<Result<_, String>>()?;
        Ok(Spec {
            dir: dir.into(),
            index: index.parse().map_err(|_| bad("index"))?,
            generation: generation.parse().map_err(|_| bad("generation"))?,
            addr: addr.parse().map_err(|_| bad("address"))?,
            port: port.parse().map_err(|_| bad("port"))?,
            cm_port: cm_port.parse().map_err(|_| bad("CM port"))?,
            peers,
        })
    }

    /// This generation's file of `kind`.
    pub fn file(dir: &Path, index: u32, generation: u32, kind: &str) -> PathBuf {
        dir.join(format!("m{index}.g{generation}.{kind}"))
    }
}

/// What a member counts; the parent sums the last snapshot of each generation.
#[derive(Default)]
struct Tally {
    rounds: AtomicU64,
    rc_received: AtomicU64,
    rc_bytes: AtomicU64,
    uc_sent: AtomicU64,
    uc_received: AtomicU64,
    uc_bytes: AtomicU64,
    uc_duplicates: AtomicU64,
    uc_late: AtomicU64,
    ud_sent: AtomicU64,
    ud_received: AtomicU64,
    ud_bytes: AtomicU64,
    ud_duplicates: AtomicU64,
    ud_late: AtomicU64,
    connections: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    served: AtomicU64,
    abandoned: AtomicU64,
    probes: AtomicU64,
}

struct Shared {
    spec: Spec,
    ctx: Context,
    cm: CmOptions,
    tally: Tally,
    events: Mutex<File>,
    stop: AtomicBool,
    close: AtomicBool,
}

impl Shared {
    /// Appends an event line at once: a SIGKILL must not lose it.
    fn event(&self, line: String) {
        let mut file = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

fn threads() -> usize {
    fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

fn fds() -> usize {
    fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The seed of the bytes of message `n` of connection `conn`, of kind `kind`.
fn seed(conn: u64, n: u64, kind: u8) -> u32 {
    let mut rng = SplitMix64(conn ^ n.rotate_left(24) ^ u64::from(kind) << 56);
    rng.next_u32()
}

/// A message: header, then its pattern.
fn message(conn: u64, n: u64, write_len: u32, len: usize, kind: u8) -> Vec<u8> {
    let mut m = Vec::with_capacity(len.max(HEADER));
    m.extend_from_slice(&conn.to_be_bytes());
    m.extend_from_slice(&n.to_be_bytes());
    m.extend_from_slice(&write_len.to_be_bytes());
    m.extend(pattern(len.saturating_sub(HEADER), seed(conn, n, kind)));
    m
}

/// The header of a received message, if its bytes are the pattern it names.
fn check_message(bytes: &[u8], kind: u8) -> Option<(u64, u64, u32)> {
    let conn = u64::from_be_bytes(bytes.get(0..8)?.try_into().ok()?);
    let n = u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
    let write_len = u32::from_be_bytes(bytes.get(16..20)?.try_into().ok()?);
    (bytes[HEADER..] == pattern(bytes.len() - HEADER, seed(conn, n, kind))[..]).then_some((conn, n, write_len))
}

/// A checked header, for an event line.
fn header(checked: Option<(u64, u64, u32)>) -> String {
    match checked {
        Some((conn, n, _)) => format!("conn {conn:#x} number {n}"),
        None => "with bytes that are not its pattern".into(),
    }
}

fn read(mr: &MemoryRegion, at: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    let _ = mr.read(at, &mut out);
    out
}

pub fn main(spec: Spec) -> Result<(), String> {
    let (threads_before, fds_before) = (threads(), fds());
    let events = OpenOptions::new()
        .create(true)
        .append(true)
        .open(Spec::file(&spec.dir, spec.index, spec.generation, "events"))
        .map_err(|e| format!("events file: {e}"))?;
    let device = Device::holding(spec.addr).map_err(|e| format!("device of {}: {e}", spec.addr))?;
    let ctx = Context::open(&device, ContextOptions { port: spec.port, busy_poll: false, ..ContextOptions::default() })
        .map_err(|e| format!("opening {}: {e}", spec.addr))?;
    // CM timeouts shorter than the kernel's (4 s, 15 retries), so that a
    // REQ to a killed member is given up within seconds, yet longer than the
    // injector's slow lane holds a packet.
    let cm = CmOptions { response_timeout: 17, max_cm_retries: 4, ..CmOptions::with_context(&ctx) };
    let shared = Arc::new(Shared {
        spec,
        ctx,
        cm,
        tally: Tally::default(),
        events: Mutex::new(events),
        stop: AtomicBool::new(false),
        close: AtomicBool::new(false),
    });
    let server = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new().name("soak-server".into()).spawn(move || serve(&shared))
    }
    .map_err(|e| e.to_string())?;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new().name(format!("soak-client-{k}")).spawn(move || client(&shared, k))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;

    let (dir, index, generation) = (shared.spec.dir.clone(), shared.spec.index, shared.spec.generation);
    let file = |kind: &str| Spec::file(&dir, index, generation, kind);
    let mut clients = Some(clients);
    loop {
        write_progress(&shared, &file("progress"));
        if !shared.stop.load(Ordering::Relaxed) && dir.join("stop").exists() {
            shared.stop.store(true, Ordering::Relaxed);
            for client in clients.take().into_iter().flatten() {
                let _ = client.join();
            }
            write_progress(&shared, &file("progress"));
            fs::write(file("clients-done"), "").map_err(|e| e.to_string())?;
        }
        if shared.stop.load(Ordering::Relaxed) && dir.join("close").exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    shared.close.store(true, Ordering::Relaxed);
    let _ = server.join();
    write_progress(&shared, &file("progress"));
    let slot = shared.ctx.slot();
    drop(shared);
    // Exited threads leave /proc/self/task a moment after their joiner
    // wakes, and a context lives on while its CM waits out TimeWait for a
    // DREQ no DREP answered (a killed peer's).
    let settle = Instant::now() + SETTLE;
    while threads() != threads_before && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(10));
    }
    let result = format!("slot {slot}\nthreads {threads_before} {}\nfds {fds_before} {}\n", threads(), fds());
    fs::write(file("result"), result).map_err(|e| e.to_string())
}

fn write_progress(shared: &Shared, path: &Path) {
    let t = &shared.tally;
    let c = shared.ctx.counters();
    let mut text = format!("slot {}\n", shared.ctx.slot());
    for (name, value) in [
        ("rounds", t.rounds.load(Ordering::Relaxed)),
        ("rc_received", t.rc_received.load(Ordering::Relaxed)),
        ("rc_bytes", t.rc_bytes.load(Ordering::Relaxed)),
        ("uc_sent", t.uc_sent.load(Ordering::Relaxed)),
        ("uc_received", t.uc_received.load(Ordering::Relaxed)),
        ("uc_bytes", t.uc_bytes.load(Ordering::Relaxed)),
        ("uc_duplicates", t.uc_duplicates.load(Ordering::Relaxed)),
        ("uc_late", t.uc_late.load(Ordering::Relaxed)),
        ("ud_sent", t.ud_sent.load(Ordering::Relaxed)),
        ("ud_received", t.ud_received.load(Ordering::Relaxed)),
        ("ud_bytes", t.ud_bytes.load(Ordering::Relaxed)),
        ("ud_duplicates", t.ud_duplicates.load(Ordering::Relaxed)),
        ("ud_late", t.ud_late.load(Ordering::Relaxed)),
        ("connections", t.connections.load(Ordering::Relaxed)),
        ("accepted", t.accepted.load(Ordering::Relaxed)),
        ("refused", t.refused.load(Ordering::Relaxed)),
        ("served", t.served.load(Ordering::Relaxed)),
        ("abandoned", t.abandoned.load(Ordering::Relaxed)),
        ("probes", t.probes.load(Ordering::Relaxed)),
        ("retries", c.qp.retries),
        ("timeouts", c.qp.timeouts),
        ("seq_naks_sent", c.qp.seq_naks_sent),
        ("duplicate_requests", c.qp.duplicate_requests),
        ("rnr_naks_sent", c.qp.rnr_naks_sent),
        ("packets_sent", c.link.sent),
        ("packets_received", c.link.received),
        ("forwarded", c.link.forwarded),
        ("forward_dropped", c.link.forward_dropped),
        ("unknown_qp", c.unknown_qp),
    ] {
        let _ = writeln!(text, "{name} {value}");
    }
    let tmp = path.with_extension("tmp");
    if fs::write(&tmp, text).is_ok() {
        let _ = fs::rename(tmp, path);
    }
}

/// A connection's verbs resources: created for it, destroyed with it.
struct Resources {
    rc: QueuePair,
    uc: QueuePair,
    ud: QueuePair,
    mr: MemoryRegion,
    cq: CompletionQueue,
    pd: ProtectionDomain,
}

impl Resources {
    fn new(id: &CmId, ctx: &Context, len: usize) -> softroce::verbs::Result<Resources> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(64, None)?;
        let mr = pd.alloc_mr(len, ALL)?;
        let rc = id.create_qp(pd.create_qp(QpType::Rc, &cq))?;
        let uc = pd.create_qp(QpType::Uc, &cq).build()?;
        let ud = pd.create_qp(QpType::Ud, &cq).build()?;
        ud.activate(QKEY)?;
        Ok(Resources { pd, cq, mr, rc, uc, ud })
    }

    fn recv(&self, qp: &QueuePair, wr_id: u64, at: usize, len: usize) -> bool {
        qp.post_recv(RecvWr { wr_id, sg_list: softroce::sg_list![self.mr.sge(at, len)] }).is_ok()
    }

    fn uc_connect(&self, peer: &Endpoint, ctx: &Context) -> softroce::verbs::Result<()> {
        let options = ConnectOptions {
            access: Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
            mtu: Some(ctx.device().active_mtu()),
            ..ConnectOptions::default()
        };
        self.uc.connect(peer, &options)
    }
}

fn conn_param(private_data: Vec<u8>) -> ConnParam {
    ConnParam {
        private_data,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

/// One accepted connection at the server.
struct Served {
    id: CmId,
    res: Resources,
    conn: u64,
    /// The client's member and generation.
    client: (u32, u32),
    next_rc: u64,
    /// UC messages and UD datagrams received, by number.
    uc_seen: BTreeSet<u64>,
    ud_seen: BTreeSet<u64>,
    last_heard: Instant,
    /// An ACK or probe is on its way.
    answering: bool,
}

fn serve(shared: &Shared) {
    let spec = &shared.spec;
    let fail = |what: String| shared.event(format!("fatal server {what}"));
    let Ok(channel) = EventChannel::with_options(shared.cm.clone()) else { return fail("no event channel".into()) };
    let Ok(listener) = CmId::new(&channel, PortSpace::Tcp) else { return fail("no CM id".into()) };
    if let Err(e) = listener.bind_addr(SocketAddr::new(spec.addr, spec.cm_port)).and_then(|()| listener.listen(64)) {
        return fail(format!("listen on {}:{}: {e}", spec.addr, spec.cm_port));
    }
    let mut served: Vec<Served> = Vec::new();
    let mut wcs = vec![WorkCompletion::new(0, 0, WcStatus::Success, WcOpcode::Send); 16];
    while !shared.close.load(Ordering::Relaxed) {
        let mut busy = false;
        while let Some(event) = channel.try_get_event() {
            busy = true;
            match event.kind {
                CmEventKind::ConnectRequest => {
                    let data = event.conn.map(|c| c.private_data).unwrap_or_default();
                    match accept(shared, event.id, &data) {
                        Ok(s) => served.push(s),
                        Err(e) => shared.event(format!("server-setup-failed {e}")),
                    }
                }
                CmEventKind::Disconnected => {
                    if let Some(at) = served.iter().position(|s| s.id.same_as(&event.id)) {
                        let gone = served.swap_remove(at);
                        let _ = gone.id.disconnect();
                        shared.tally.served.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // The client gave up before the connection was up (its CM
                // timed out and rejected, or it could not move its QP).
                CmEventKind::Rejected | CmEventKind::Unreachable | CmEventKind::ConnectError => {
                    if let Some(at) = served.iter().position(|s| s.id.same_as(&event.id)) {
                        served.swap_remove(at);
                        shared.tally.abandoned.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {}
            }
        }
        let mut failed = Vec::new();
        for (k, s) in served.iter_mut().enumerate() {
            let n = s.res.cq.poll(&mut wcs);
            busy |= n > 0;
            for wc in &wcs[..n] {
                if !handle(shared, s, wc) {
                    failed.push(k);
                    break;
                }
            }
            if !s.answering && s.last_heard.elapsed() > IDLE_PROBE {
                let probe = message(s.conn, PROBE, 0, 32, b'P');
                let _ = s.res.mr.write(srv::PROBE_OUT, &probe);
                let wr = SendWr::new(201, SendOp::Send).with_sge(s.res.mr.sge(srv::PROBE_OUT, probe.len()));
                s.answering = s.res.rc.post_send(wr).is_ok();
                s.last_heard = Instant::now();
                shared.tally.probes.fetch_add(1, Ordering::Relaxed);
            }
        }
        for k in failed.into_iter().rev() {
            let gone = served.swap_remove(k);
            let _ = gone.id.disconnect();
        }
        if !busy {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for s in served {
        let _ = s.id.disconnect();
    }
}

fn accept(shared: &Shared, id: CmId, data: &[u8]) -> Result<Served, String> {
    let field = |at: usize, len: usize| data.get(at..at + len).ok_or("short private data");
    let client_member = u32::from_be_bytes(field(0, 4)?.try_into().map_err(|_| "bad")?);
    let client_generation = u32::from_be_bytes(field(4, 4)?.try_into().map_err(|_| "bad")?);
    let conn = u64::from_be_bytes(field(8, 8)?.try_into().map_err(|_| "bad")?);
    let uc_peer = Endpoint::from_bytes(field(16, Endpoint::LEN)?.try_into().map_err(|_| "bad")?);
    let res = Resources::new(&id, &shared.ctx, srv::LEN).map_err(|e| e.to_string())?;
    res.uc_connect(&uc_peer, &shared.ctx).map_err(|e| e.to_string())?;
    for i in 0..RECVS {
        let posted = res.recv(&res.rc, i as u64, srv::RC_RECV + i * srv::SLOT, srv::SLOT)
            && res.recv(&res.uc, (RECVS + i) as u64, srv::UC_RECV + i * srv::SLOT, srv::SLOT)
            && res.recv(&res.ud, (2 * RECVS + i) as u64, srv::UD_RECV + i * srv::SLOT, srv::SLOT);
        if !posted {
            return Err("posting receives".into());
        }
    }
    let mut reply = Vec::new();
    reply.extend_from_slice(&shared.spec.index.to_be_bytes());
    reply.extend_from_slice(&shared.spec.generation.to_be_bytes());
    reply.extend_from_slice(&res.uc.endpoint(1).map_err(|e| e.to_string())?.to_bytes());
    reply.extend_from_slice(&res.ud.qpn().to_be_bytes());
    reply.extend_from_slice(&res.mr.addr().to_be_bytes());
    reply.extend_from_slice(&res.mr.rkey().to_be_bytes());
    id.accept(&conn_param(reply)).map_err(|e| e.to_string())?;
    shared.tally.accepted.fetch_add(1, Ordering::Relaxed);
    Ok(Served {
        id,
        res,
        conn,
        client: (client_member, client_generation),
        next_rc: 0,
        uc_seen: BTreeSet::new(),
        ud_seen: BTreeSet::new(),
        last_heard: Instant::now(),
        answering: false,
    })
}

/// Checks one completion at the server; false if the connection failed.
fn handle(shared: &Shared, s: &mut Served, wc: &WorkCompletion) -> bool {
    let (member, generation) = s.client;
    if wc.status != WcStatus::Success {
        // A flush follows a disconnect or an earlier error: not news.
        if wc.status != WcStatus::WrFlushErr {
            shared.event(format!(
                "peer-error side=server peer={member} peer_gen={generation} conn={:#x} status={:?}",
                s.conn, wc.status
            ));
        }
        return wc.status == WcStatus::WrFlushErr;
    }
    s.last_heard = Instant::now();
    if wc.opcode != WcOpcode::Recv {
        s.answering = false;
        return true;
    }
    let slot = wc.wr_id as usize % RECVS;
    let corrupt = |what: &str| {
        shared.event(format!("corrupt side=server peer={member} peer_gen={generation} conn={:#x} {what}", s.conn));
    };
    let base = |area: usize| area + slot * srv::SLOT;
    if wc.qp_num == s.res.rc.qpn() {
        let bytes = read(&s.res.mr, base(srv::RC_RECV), wc.byte_len as usize);
        match check_message(&bytes, b'S') {
            Some((conn, n, write_len)) if conn == s.conn && n == s.next_rc => {
                let written = read(&s.res.mr, srv::WRITE, write_len as usize);
                if written != pattern(write_len as usize, seed(conn, n, b'W')) {
                    corrupt(&format!("write of message {n}"));
                }
                let counter = s.res.mr.load_u64(srv::ATOMIC).unwrap_or(0);
                if counter != n + 1 {
                    corrupt(&format!("atomic counter {counter} after message {n}"));
                }
                shared.tally.rc_received.fetch_add(1, Ordering::Relaxed);
                s.next_rc += 1;
                let ack = message(conn, n, 0, 32, b'A');
                let _ = s.res.mr.write(srv::ACK_OUT, &ack);
                let wr = SendWr::new(200, SendOp::Send).with_sge(s.res.mr.sge(srv::ACK_OUT, ack.len()));
                s.answering = true;
                if let Err(e) = s.res.rc.post_send(wr) {
                    shared.event(format!("fatal server answer to {member}/{generation} conn={:#x}: {e}", s.conn));
                    return false;
                }
            }
            other => corrupt(&format!("RC message {}, expected number {}", header(other), s.next_rc)),
        }
        return repost(shared, s, &s.res.rc, wc.wr_id, base(srv::RC_RECV));
    }
    if wc.qp_num == s.res.uc.qpn() {
        let bytes = read(&s.res.mr, base(srv::UC_RECV), wc.byte_len as usize);
        match check_message(&bytes, b'U') {
            // UC loses messages, and delivers a duplicated or late
            // one-packet message too: a FIRST or ONLY packet starts a
            // message whatever its PSN (rxe-spec T-18). Only its bytes
            // must be right.
            Some((conn, n, _)) if conn == s.conn => {
                tally_unreliable(&mut s.uc_seen, n, &shared.tally.uc_duplicates, &shared.tally.uc_late);
                shared.tally.uc_received.fetch_add(1, Ordering::Relaxed);
                shared.tally.uc_bytes.fetch_add(u64::from(wc.byte_len), Ordering::Relaxed);
            }
            other => corrupt(&format!("UC message {}", header(other))),
        }
        return repost(shared, s, &s.res.uc, wc.wr_id, base(srv::UC_RECV));
    }
    let bytes = read(&s.res.mr, base(srv::UD_RECV) + GRH, (wc.byte_len as usize).saturating_sub(GRH));
    match check_message(&bytes, b'D') {
        Some((conn, n, _)) if conn == s.conn => {
            tally_unreliable(&mut s.ud_seen, n, &shared.tally.ud_duplicates, &shared.tally.ud_late);
            shared.tally.ud_received.fetch_add(1, Ordering::Relaxed);
            shared.tally.ud_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        other => corrupt(&format!("UD datagram {}", header(other))),
    }
    repost(shared, s, &s.res.ud, wc.wr_id, base(srv::UD_RECV))
}

/// Counts message `n` of an unreliable transport as a duplicate, or as
/// late if a later one came first.
fn tally_unreliable(seen: &mut BTreeSet<u64>, n: u64, duplicates: &AtomicU64, late: &AtomicU64) {
    if seen.last().is_some_and(|&last| n < last) {
        late.fetch_add(1, Ordering::Relaxed);
    }
    if !seen.insert(n) {
        duplicates.fetch_add(1, Ordering::Relaxed);
    }
}

/// Reposts a receive at the server; a failure is news.
fn repost(shared: &Shared, s: &Served, qp: &QueuePair, wr_id: u64, at: usize) -> bool {
    let posted = s.res.recv(qp, wr_id, at, srv::SLOT);
    if !posted {
        shared.event(format!("fatal server repost conn={:#x}", s.conn));
    }
    posted
}

/// A client thread: connects to random peers, one at a time, until stopped.
fn client(shared: &Shared, k: u64) {
    let spec = &shared.spec;
    let mut rng = SplitMix64(u64::from(spec.index) << 40 ^ u64::from(spec.generation) << 20 ^ k ^ 0x50a4);
    let mut serial = 0u64;
    while !shared.stop.load(Ordering::Relaxed) && !spec.peers.is_empty() {
        let (peer, addr) = spec.peers[rng.next_u32() as usize % spec.peers.len()];
        let conn = u64::from(spec.index) << 48 | u64::from(spec.generation) << 32 | k << 24 | serial;
        serial += 1;
        let rounds = 1 + u64::from(rng.next_u32() % 40);
        if let Err(e) = connection(shared, &mut rng, conn, peer, addr, rounds) {
            shared.event(e);
        }
    }
}

/// The next CM event, if it is `kind`; else what came instead and its
/// status (no event within [`BOUND`]: `DeviceRemoval`, never raised).
fn expect(channel: &EventChannel, kind: CmEventKind) -> Result<softroce::cm::CmEvent, (CmEventKind, i32)> {
    match channel.get_event(Some(BOUND)) {
        Some(event) if event.kind == kind && event.status == 0 => Ok(event),
        Some(event) => Err((event.kind, event.status)),
        None => Err((CmEventKind::DeviceRemoval, 0)),
    }
}

/// One connection: set up, `rounds` checked rounds, disconnect. An error
/// line for the events file if something went wrong.
fn connection(
    shared: &Shared,
    rng: &mut SplitMix64,
    conn: u64,
    peer: u32,
    addr: SocketAddr,
    rounds: u64,
) -> Result<(), String> {
    let spec = &shared.spec;
    let refused = |step: &str, (kind, _): (CmEventKind, i32)| {
        shared.tally.refused.fetch_add(1, Ordering::Relaxed);
        if kind == CmEventKind::DeviceRemoval {
            shared.event(format!("cm-timeout peer={peer} conn={conn:#x} step={step}"));
        }
        Ok(())
    };
    let channel = EventChannel::with_options(shared.cm.clone()).map_err(|e| format!("fatal channel: {e}"))?;
    let id = CmId::new(&channel, PortSpace::Tcp).map_err(|e| format!("fatal id: {e}"))?;
    id.resolve_addr(Some(SocketAddr::new(spec.addr, 0)), addr, BOUND).map_err(|e| format!("fatal resolve: {e}"))?;
    if let Err(got) = expect(&channel, CmEventKind::AddrResolved) {
        return refused("addr", got);
    }
    id.resolve_route(BOUND).map_err(|e| format!("fatal route: {e}"))?;
    if let Err(got) = expect(&channel, CmEventKind::RouteResolved) {
        return refused("route", got);
    }
    let res = Resources::new(&id, &shared.ctx, cli::LEN).map_err(|e| format!("fatal resources: {e}"))?;
    for i in 0..2 {
        res.recv(&res.rc, 100 + i, cli::ACK_RECV + i as usize * cli::ACK_SLOT, cli::ACK_SLOT);
    }
    let mut request = Vec::new();
    request.extend_from_slice(&spec.index.to_be_bytes());
    request.extend_from_slice(&spec.generation.to_be_bytes());
    request.extend_from_slice(&conn.to_be_bytes());
    request.extend_from_slice(&res.uc.endpoint(1).map_err(|e| format!("fatal endpoint: {e}"))?.to_bytes());
    id.connect(&conn_param(request)).map_err(|e| format!("fatal connect: {e}"))?;
    let established = match expect(&channel, CmEventKind::Established) {
        Ok(event) => event,
        Err(got) => return refused("connect", got),
    };
    let reply = established.conn.map(|c| c.private_data).unwrap_or_default();
    let short = || format!("corrupt side=client peer={peer} conn={conn:#x} reply {reply:?}");
    let field = |at: usize, len: usize| reply.get(at..at + len).ok_or_else(short);
    let peer_gen = u32::from_be_bytes(field(4, 4)?.try_into().map_err(|_| short())?);
    let uc_peer = Endpoint::from_bytes(field(8, Endpoint::LEN)?.try_into().map_err(|_| short())?);
    let ud_qpn = u32::from_be_bytes(field(32, 4)?.try_into().map_err(|_| short())?);
    let remote = u64::from_be_bytes(field(36, 8)?.try_into().map_err(|_| short())?);
    let rkey = u32::from_be_bytes(field(44, 4)?.try_into().map_err(|_| short())?);
    res.uc_connect(&uc_peer, &shared.ctx).map_err(|e| format!("fatal UC connect: {e}"))?;
    let ud_dest = res.pd.create_ah(Gid::from_ip(addr.ip())).ud_dest(ud_qpn, QKEY);
    shared.tally.connections.fetch_add(1, Ordering::Relaxed);
    let who = format!("peer={peer} peer_gen={peer_gen} conn={conn:#x}");
    let mtu = shared.ctx.device().active_mtu().bytes();

    for n in 0..rounds {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let write_len = 1 + rng.next_u32() as usize % srv::WRITE_MAX;
        let written = pattern(write_len, seed(conn, n, b'W'));
        let send = message(conn, n, write_len as u32, HEADER + rng.next_u32() as usize % (4096 - HEADER), b'S');
        let uc = message(conn, n, 0, HEADER + rng.next_u32() as usize % (4096 - HEADER), b'U');
        let ud = message(conn, n, 0, HEADER + rng.next_u32() as usize % (mtu - HEADER), b'D');
        let mr = &res.mr;
        let wrote = [(cli::WRITE_OUT, &written), (cli::SEND_OUT, &send), (cli::UC_OUT, &uc), (cli::UD_OUT, &ud)]
            .iter()
            .all(|(at, data)| mr.write(*at, data).is_ok());
        if !wrote {
            return Err(format!("fatal region write {who}"));
        }
        let atomic = match n % 2 {
            0 => SendOp::FetchAdd { remote_addr: remote + srv::ATOMIC as u64, rkey, add: 1 },
            _ => SendOp::CompareSwap { remote_addr: remote + srv::ATOMIC as u64, rkey, compare: n, swap: n + 1 },
        };
        let posts = [
            (
                &res.rc,
                SendWr::new(1, SendOp::RdmaWrite { remote_addr: remote + srv::WRITE as u64, rkey })
                    .with_sge(mr.sge(cli::WRITE_OUT, write_len)),
            ),
            (
                &res.rc,
                SendWr::new(2, SendOp::RdmaRead { remote_addr: remote + srv::WRITE as u64, rkey })
                    .with_sge(mr.sge(cli::READ_IN, write_len)),
            ),
            (&res.rc, SendWr::new(3, atomic).with_sge(mr.sge(cli::ATOMIC_IN, 8))),
            (&res.rc, SendWr::new(4, SendOp::Send).with_sge(mr.sge(cli::SEND_OUT, send.len()))),
            (&res.uc, SendWr::new(5, SendOp::Send).with_sge(mr.sge(cli::UC_OUT, uc.len()))),
            (
                &res.ud,
                SendWr { ud: Some(ud_dest), ..SendWr::new(6, SendOp::Send).with_sge(mr.sge(cli::UD_OUT, ud.len())) },
            ),
        ];
        for (qp, wr) in posts {
            if let Err(e) = qp.post_send(wr) {
                return Err(format!("fatal post {who} message {n}: {e}"));
            }
        }
        // Six send completions and the server's answer. A server killed
        // after its QP acknowledged the SEND leaves nothing to retry: a
        // READ of its counter every IDLE_PROBE gives the wait a request
        // whose retries end in an error if it is gone.
        let (mut pending, mut answered) = (0b111_1110u32, false);
        let deadline = Instant::now() + BOUND;
        let mut probe_at = Instant::now() + IDLE_PROBE;
        while pending != 0 || !answered {
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("lost side=client {who} message={n} pending={pending:#b} answered={answered}"));
            }
            if now >= probe_at && pending == 0 {
                let read = SendOp::RdmaRead { remote_addr: remote + srv::ATOMIC as u64, rkey };
                if let Err(e) = res.rc.post_send(SendWr::new(7, read).with_sge(mr.sge(cli::PROBE_IN, 8))) {
                    return Err(format!("fatal probe {who}: {e}"));
                }
                pending |= 1 << 7;
                shared.tally.probes.fetch_add(1, Ordering::Relaxed);
            }
            if now >= probe_at {
                probe_at = now + IDLE_PROBE;
            }
            let Some(wc) = res.cq.wait_one(deadline.min(probe_at).saturating_duration_since(now)) else { continue };
            if wc.status != WcStatus::Success {
                return Err(format!("peer-error side=client {who} message={n} wr={} status={:?}", wc.wr_id, wc.status));
            }
            if wc.opcode != WcOpcode::Recv {
                pending &= !(1 << wc.wr_id);
                continue;
            }
            let at = cli::ACK_RECV + (wc.wr_id as usize - 100) * cli::ACK_SLOT;
            let bytes = read(mr, at, wc.byte_len as usize);
            match check_message(&bytes, b'A') {
                Some((c, m, _)) if c == conn && m == n => answered = true,
                Some((c, PROBE, _)) if c == conn && check_message(&bytes, b'P').is_some() => {}
                _ => match check_message(&bytes, b'P') {
                    Some((c, PROBE, _)) if c == conn => {}
                    other => return Err(format!("corrupt side=client {who} answer {other:?} to message {n}")),
                },
            }
            res.recv(&res.rc, wc.wr_id, at, cli::ACK_SLOT);
        }
        if read(mr, cli::READ_IN, write_len) != written {
            return Err(format!("corrupt side=client {who} READ of message {n}"));
        }
        let original = mr.load_u64(cli::ATOMIC_IN).unwrap_or(u64::MAX);
        if original != n {
            return Err(format!("corrupt side=client {who} atomic of message {n} returned {original}"));
        }
        let t = &shared.tally;
        t.rounds.fetch_add(1, Ordering::Relaxed);
        t.rc_bytes.fetch_add((send.len() + 2 * write_len + 8) as u64, Ordering::Relaxed);
        t.uc_sent.fetch_add(1, Ordering::Relaxed);
        t.ud_sent.fetch_add(1, Ordering::Relaxed);
    }
    id.disconnect().map_err(|e| format!("fatal disconnect {who}: {e}"))?;
    // A live peer answers the DREQ; a killed one leaves the CM's retries
    // to end in DISCONNECTED too. Anything else is the CM's failure.
    if let Err((kind, status)) = expect(&channel, CmEventKind::Disconnected) {
        return Err(format!("cm-error side=client {who} disconnect ended in {kind:?} status={status}"));
    }
    Ok(())
}
