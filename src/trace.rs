//! A trace of a program's verbs and CM calls and of the packets they put on
//! the wire, for learning what RDMA does (`softroce run --trace`).
//!
//! Every process tracing into one file appends to it, one line per event,
//! each line in one `write(2)` on a descriptor opened with `O_APPEND`: the
//! kernel puts each such write whole at the end of the file, so the lines of
//! processes tracing at once never mix, and a process killed by SIGKILL has
//! written every event up to its death (nothing is buffered). The lines are
//! in each process's order; `softroce run` (or `softroce trace`) sorts them
//! by time, pairs each packet's sending with its receipt and renders them
//! as text or HTML. The format is described in `docs/trace.md`.
//!
//! Tracing costs a system call and a formatted line per event, so it is for
//! understanding a program, not for measuring it; with tracing off a call
//! pays one branch on an `Option` and nothing else.

use std::cell::Cell;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::transport::{AttrMask, QpAttr, RecvWr, SendOp, SendWr, WorkCompletion};

/// The environment variable naming the file every device a process opens
/// traces into (what `softroce run --trace` sets).
pub const ENV: &str = "SOFTROCE_TRACE";

/// Events a process writes at most into one trace file; past that it stops
/// tracing, and the program runs on.
pub const MAX_EVENTS: u64 = 1_000_000;

/// One open trace file of this process.
#[derive(Debug)]
struct Sink {
    file: File,
    /// Events this process may still write.
    left: AtomicU64,
}

impl Sink {
    fn open(path: &Path) -> io::Result<Arc<Sink>> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let sink = Arc::new(Sink { file, left: AtomicU64::new(MAX_EVENTS) });
        let name = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
        sink.write("-", "process", format_args!("{}", name.trim().replace(char::is_whitespace, "_")));
        Ok(sink)
    }

    /// Writes one event line: `time-ns pid endpoint kind body`.
    fn write(&self, endpoint: &str, kind: &str, body: fmt::Arguments<'_>) {
        if self.left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_err() {
            return;
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        let line = format!("{now} {} {endpoint} {kind} {body}\n", std::process::id());
        // One write, so that processes appending at once do not interleave;
        // a full disk ends the trace, not the program.
        if (&self.file).write_all(line.as_bytes()).is_err() {
            self.left.store(0, Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// Calls made on this thread are not traced (see [`quietly`]).
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` without tracing the calls it makes on this thread: the
/// connection manager's own verbs calls on QP 1 are not the program's.
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> T {
    let was = QUIET.with(|q| q.replace(true));
    let result = f();
    QUIET.with(|q| q.set(was));
    result
}

/// Where one endpoint (a device of this process) writes its events.
#[derive(Debug, Clone)]
pub struct Tracer {
    sink: Arc<Sink>,
    /// The device's name: with the process id, what a trace's columns are.
    endpoint: Arc<str>,
}

/// Which way a packet went, as the device that recorded it saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sent by this device.
    Sent,
    /// Received by this device, its ICRC right.
    Received,
    /// Received by this device and dropped because its ICRC is wrong.
    DroppedBadIcrc,
}

impl Tracer {
    /// Traces `endpoint`'s events into `path`, created if needed and
    /// appended to.
    pub fn open(path: &Path, endpoint: &str) -> io::Result<Tracer> {
        Ok(Tracer { sink: Sink::open(path)?, endpoint: endpoint_name(endpoint) })
    }

    /// The tracer of `endpoint` in the file [`ENV`] names, if it names one;
    /// all endpoints of a process share one descriptor. A file that cannot
    /// be opened is said once on stderr, and the program runs untraced.
    pub fn from_env(endpoint: &str) -> Option<Tracer> {
        static SINK: OnceLock<Option<Arc<Sink>>> = OnceLock::new();
        let sink = SINK.get_or_init(|| {
            let path = PathBuf::from(std::env::var_os(ENV).filter(|p| !p.is_empty())?);
            Sink::open(&path).map_err(|e| eprintln!("softroce: cannot trace into {} ({ENV}): {e}", path.display())).ok()
        });
        Some(Tracer { sink: Arc::clone(sink.as_ref()?), endpoint: endpoint_name(endpoint) })
    }

    /// Says which addresses the endpoint has, so that a reader can tell
    /// which of its packets go to traced peers.
    pub fn device(&self, addresses: &[std::net::IpAddr]) {
        let list: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        self.sink.write(&self.endpoint, "device", format_args!("{}", list.join(",")));
    }

    /// A call the program made: `name` and what it said, with what it got.
    pub fn call(&self, name: &str, details: fmt::Arguments<'_>) {
        if QUIET.with(Cell::get) {
            return;
        }
        self.sink.write(&self.endpoint, "call", format_args!("{name} {details}"));
    }

    /// A packet the device sent or received: its addresses and ports, IPv4
    /// ID and RoCE bytes (BTH to ICRC) exactly as on the wire.
    pub fn packet(&self, direction: Direction, src: SocketAddr, dst: SocketAddr, id: u16, roce: &[u8]) {
        let kind = match direction {
            Direction::Sent => "sent",
            Direction::Received => "recv",
            Direction::DroppedBadIcrc => "drop",
        };
        self.sink.write(&self.endpoint, kind, format_args!("{src} {dst} {id} {}", Hex(roce)));
    }

    /// `ibv_post_send` of `wr` on QP `qpn`, and whether the QP took it.
    pub(crate) fn post_send(&self, qpn: u32, wr: &SendWr, result: Result<(), &dyn fmt::Display>) {
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum::<u64>() + wr.inline_data.len() as u64;
        self.call(
            "ibv_post_send",
            format_args!(
                "qp={qpn:#x} wr_id={} {} len={len}{}{} {}",
                wr.wr_id,
                Op(&wr.op),
                Flags(wr),
                Ud(wr),
                Outcome(result)
            ),
        );
    }

    /// `ibv_post_recv` of `wr` on QP `qpn`.
    pub(crate) fn post_recv(&self, qpn: u32, wr: &RecvWr, result: Result<(), &dyn fmt::Display>) {
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        self.call("ibv_post_recv", format_args!("qp={qpn:#x} wr_id={} len={len} {}", wr.wr_id, Outcome(result)));
    }

    /// `ibv_modify_qp` on QP `qpn`: the attributes `mask` sets.
    pub(crate) fn modify_qp(&self, qpn: u32, attr: &QpAttr, mask: AttrMask, result: Result<(), &dyn fmt::Display>) {
        self.call("ibv_modify_qp", format_args!("qp={qpn:#x} mask={mask}{} {}", Attrs(attr, mask), Outcome(result)));
    }

    /// `QueuePair::connect` of QP `qpn`: the INIT, RTR and RTS steps, three
    /// `ibv_modify_qp` calls in C, with the attributes they set.
    pub(crate) fn connect(&self, qpn: u32, attr: &QpAttr, result: Result<(), &dyn fmt::Display>) {
        let mask = AttrMask::ACCESS_FLAGS
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MIN_RNR_TIMER
            | AttrMask::MAX_QP_RD_ATOMIC
            | AttrMask::MAX_DEST_RD_ATOMIC;
        self.call("connect", format_args!("qp={qpn:#x} states=INIT,RTR,RTS{} {}", Attrs(attr, mask), Outcome(result)));
    }

    /// A completion `ibv_poll_cq` (or a wait) returned from CQ `cq`.
    pub(crate) fn completion(&self, cq: u32, wc: &WorkCompletion) {
        let imm = wc.imm.map(|i| format!(" imm={i:#x}")).unwrap_or_default();
        self.call(
            "ibv_poll_cq",
            format_args!(
                "cq={cq} -> wr_id={} status={} opcode={:?} len={} qp={:#x}{imm}",
                wc.wr_id,
                wc.status.as_str(),
                wc.opcode,
                wc.byte_len,
                wc.qp_num
            ),
        );
    }
}

/// Endpoint names are one word in the file.
fn endpoint_name(name: &str) -> Arc<str> {
    let name = name.replace(char::is_whitespace, "_");
    (if name.is_empty() { "-".to_string() } else { name }).into()
}

/// Bytes as lower-case hex.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    /// A chunk at a time: a `write!` per byte costs tens of microseconds
    /// for a 4 KiB packet.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 512];
        for chunk in self.0.chunks(text.len() / 2) {
            for (i, byte) in chunk.iter().enumerate() {
                text[2 * i] = DIGITS[usize::from(byte >> 4)];
                text[2 * i + 1] = DIGITS[usize::from(byte & 0xf)];
            }
            f.write_str(std::str::from_utf8(&text[..2 * chunk.len()]).map_err(|_| fmt::Error)?)?;
        }
        Ok(())
    }
}

/// `-> ok` or `-> error: why`.
struct Outcome<'a>(Result<(), &'a dyn fmt::Display>);

impl fmt::Display for Outcome<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Ok(()) => f.write_str("-> ok"),
            Err(e) => write!(f, "-> error: {e}"),
        }
    }
}

/// A send work request's opcode and the operands that go on the wire.
struct Op<'a>(&'a SendOp);

impl fmt::Display for Op<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self.0 {
            SendOp::Send => f.write_str("opcode=SEND"),
            SendOp::SendWithImm(imm) => write!(f, "opcode=SEND_WITH_IMM imm={imm:#x}"),
            SendOp::SendWithInv(rkey) => write!(f, "opcode=SEND_WITH_INV invalidate={rkey:#x}"),
            SendOp::RdmaWrite { remote_addr, rkey } => {
                write!(f, "opcode=RDMA_WRITE remote_addr={remote_addr:#x} rkey={rkey:#x}")
            }
            SendOp::RdmaWriteWithImm { remote_addr, rkey, imm } => {
                write!(f, "opcode=RDMA_WRITE_WITH_IMM remote_addr={remote_addr:#x} rkey={rkey:#x} imm={imm:#x}")
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                write!(f, "opcode=RDMA_READ remote_addr={remote_addr:#x} rkey={rkey:#x}")
            }
            SendOp::CompareSwap { remote_addr, rkey, compare, swap } => write!(
                f,
                "opcode=ATOMIC_CMP_AND_SWP remote_addr={remote_addr:#x} rkey={rkey:#x} compare={compare:#x} swap={swap:#x}"
            ),
            SendOp::FetchAdd { remote_addr, rkey, add } => {
                write!(f, "opcode=ATOMIC_FETCH_AND_ADD remote_addr={remote_addr:#x} rkey={rkey:#x} add={add:#x}")
            }
            SendOp::AtomicWrite { remote_addr, rkey } => {
                write!(f, "opcode=ATOMIC_WRITE remote_addr={remote_addr:#x} rkey={rkey:#x}")
            }
            SendOp::Flush { remote_addr, rkey, len, .. } => {
                write!(f, "opcode=FLUSH remote_addr={remote_addr:#x} rkey={rkey:#x} flush_len={len}")
            }
            SendOp::BindMw(bind) => write!(f, "opcode=BIND_MW mw_rkey={:#x} rkey={:#x}", bind.mw_rkey, bind.rkey),
            SendOp::LocalInv(rkey) => write!(f, "opcode=LOCAL_INV invalidate={rkey:#x}"),
        }
    }
}

/// ` flags=signaled|inline|...`, or nothing when none is set.
struct Flags<'a>(&'a SendWr);

impl fmt::Display for Flags<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flags = &self.0.flags;
        let set: Vec<&str> = [
            (flags.signaled, "signaled"),
            (flags.solicited, "solicited"),
            (flags.inline, "inline"),
            (flags.fence, "fence"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| *name)
        .collect();
        if set.is_empty() {
            Ok(())
        } else {
            write!(f, " flags={}", set.join("|"))
        }
    }
}

/// A UD request's destination.
struct Ud<'a>(&'a SendWr);

impl fmt::Display for Ud<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.ud {
            Some(ud) => write!(f, " dest={} remote_qp={:#x} remote_qkey={:#x}", ud.dest, ud.remote_qpn, ud.remote_qkey),
            None => Ok(()),
        }
    }
}

/// The attributes a mask sets, ` name=value` each.
struct Attrs<'a>(&'a QpAttr, AttrMask);

impl fmt::Display for Attrs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, mask) = (self.0, self.1);
        let set = |m: AttrMask| mask.contains(m);
        if set(AttrMask::STATE) {
            write!(f, " state={:?}", a.state)?;
        }
        if set(AttrMask::ACCESS_FLAGS) {
            write!(f, " access={:?}", a.access_flags)?;
        }
        if set(AttrMask::QKEY) {
            write!(f, " qkey={:#x}", a.qkey)?;
        }
        if set(AttrMask::AV) {
            match a.dest {
                Some(dest) => write!(f, " dest={dest}")?,
                None => f.write_str(" dest=none")?,
            }
        }
        if set(AttrMask::PATH_MTU) {
            write!(f, " path_mtu={}", a.path_mtu.bytes())?;
        }
        if set(AttrMask::DEST_QPN) {
            write!(f, " dest_qp={:#x}", a.dest_qpn)?;
        }
        if set(AttrMask::RQ_PSN) {
            write!(f, " rq_psn={}", a.rq_psn)?;
        }
        if set(AttrMask::SQ_PSN) {
            write!(f, " sq_psn={}", a.sq_psn)?;
        }
        if set(AttrMask::TIMEOUT) {
            write!(f, " timeout={}", a.timeout)?;
        }
        if set(AttrMask::RETRY_CNT) {
            write!(f, " retry_cnt={}", a.retry_cnt)?;
        }
        if set(AttrMask::RNR_RETRY) {
            write!(f, " rnr_retry={}", a.rnr_retry)?;
        }
        if set(AttrMask::MIN_RNR_TIMER) {
            write!(f, " min_rnr_timer={}", a.min_rnr_timer)?;
        }
        if set(AttrMask::MAX_QP_RD_ATOMIC) {
            write!(f, " max_rd_atomic={}", a.max_rd_atomic)?;
        }
        if set(AttrMask::MAX_DEST_RD_ATOMIC) {
            write!(f, " max_dest_rd_atomic={}", a.max_dest_rd_atomic)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    #[test]
    fn hex_is_two_lower_case_digits_per_byte() {
        let bytes: Vec<u8> = (0..=255).chain(0..=255).chain([0xab]).collect();
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(super::Hex(&bytes).to_string(), expected);
        assert_eq!(super::Hex(&[]).to_string(), "");
    }
    use std::time::Duration;

    use crate::verbs::{
        Access, ConnectOptions, Context, ContextOptions, Device, QpType, RecvWr, SendOp, SendWr, WcStatus,
    };

    /// Two devices tracing into one file: every packet each sent and
    /// received is a line of its own, once, and the calls are there with
    /// their arguments and results.
    #[test]
    fn every_packet_and_call_is_a_line() {
        // Addresses of its own: two tests that pick the same free port on
        // the same addresses at once see each other's packets.
        let (ip_a, ip_b): (IpAddr, IpAddr) = ("127.0.0.61".parse().unwrap(), "127.0.0.62".parse().unwrap());
        let port = crate::net::udp::free_port(&[ip_a, ip_b]).unwrap();
        let path = std::env::temp_dir().join(format!("softroce-trace-test-{}.events", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let options = ContextOptions { port, trace: Some(path.clone()), ..ContextOptions::default() };
        let a = Context::open(&Device::custom("trace_a", vec![ip_a], [2, 0, 0, 0, 0, 1], 1500), options.clone());
        let b = Context::open(&Device::custom("trace_b", vec![ip_b], [2, 0, 0, 0, 0, 2], 1500), options);
        let (a, b) = (a.unwrap(), b.unwrap());
        let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (cq_a, cq_b) = (a.create_cq(8, None).unwrap(), b.create_cq(8, None).unwrap());
        let (qp_a, qp_b) =
            (pd_a.create_qp(QpType::Rc, &cq_a).build().unwrap(), pd_b.create_qp(QpType::Rc, &cq_b).build().unwrap());
        qp_a.connect(&qp_b.endpoint(1).unwrap(), &ConnectOptions::default()).unwrap();
        qp_b.connect(&qp_a.endpoint(1).unwrap(), &ConnectOptions::default()).unwrap();
        let (mr_a, mr_b) =
            (pd_a.alloc_mr(4096, Access::LOCAL_WRITE).unwrap(), pd_b.alloc_mr(4096, Access::LOCAL_WRITE).unwrap());
        qp_b.post_recv(RecvWr { wr_id: 7, sg_list: crate::sg_list![mr_b.sge(0, 4096)] }).unwrap();
        qp_a.post_send(SendWr::new(9, SendOp::Send).with_sge(mr_a.sge(0, 3000))).unwrap();
        assert_eq!(cq_a.wait_one(Duration::from_secs(10)).unwrap().status, WcStatus::Success);
        assert_eq!(cq_b.wait_one(Duration::from_secs(10)).unwrap().byte_len, 3000);
        // A round publishes its link counters when it ends, after the
        // completions it delivered: wait for the round that sent the ACK
        // and the one that received it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let (link_a, link_b) = loop {
            let (link_a, link_b) = (a.counters().link, b.counters().link);
            if (link_b.sent >= 1 && link_a.received >= 1) || std::time::Instant::now() > deadline {
                break (link_a, link_b);
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        drop((qp_a, qp_b, mr_a, mr_b, cq_a, cq_b, pd_a, pd_b, a, b));

        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let count = |device: &str, kind: &str| {
            text.lines().filter(|l| l.split(' ').nth(2) == Some(device) && l.split(' ').nth(3) == Some(kind)).count()
                as u64
        };
        assert_eq!(count("trace_a", "sent"), link_a.sent);
        assert_eq!(count("trace_a", "recv"), link_a.received);
        assert_eq!(count("trace_b", "sent"), link_b.sent);
        assert_eq!(count("trace_b", "recv"), link_b.received);
        assert_eq!(link_a.sent, 3, "3000 bytes at MTU 1024");
        let has = |needle: &str| text.lines().any(|l| l.contains(needle));
        assert!(has("trace_b call ibv_post_recv qp="), "{text}");
        assert!(has(" wr_id=9 opcode=SEND len=3000 flags=signaled -> ok"), "{text}");
        assert!(has("ibv_poll_cq cq=") && has("-> wr_id=7 status=success opcode=Recv len=3000"), "{text}");
        assert!(has("connect qp=") && has("states=INIT,RTR,RTS"), "{text}");
    }
}
