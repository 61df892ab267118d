//! Counters other processes can read, as `rdma statistic` reads kernel
//! rxe's `hw_counters`: each open context writes its device's and its QPs'
//! counters to a file in a private per-user directory a few times a second,
//! and `softroce stat` reads them. Names are rxe's where one means the same.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use super::context::CounterSource;
use super::DeviceCounters;
use crate::transport::Counters;

/// How often a context rewrites its file.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(200);
/// The first line of a counters file, naming its format.
const MAGIC: &str = "softroce-stats 1";

/// A QP's counters under the names `softroce stat` shows.
pub fn qp_counters(c: &Counters) -> [(&'static str, u64); 16] {
    [
        ("sent_pkts", c.sent_packets),
        ("rcvd_pkts", c.received_packets),
        ("duplicate_request", c.duplicate_requests),
        // rxe counts every request out of sequence; softroce NAKs a gap
        // once and drops the rest silently (T-11), and counts the NAKs.
        ("out_of_seq_request", c.seq_naks_sent),
        ("rcvd_seq_err", c.seq_naks_received),
        ("rcvd_rnr_err", c.rnr_naks_received),
        ("send_rnr_err", c.rnr_naks_sent),
        ("completer_retry_err", c.retries),
        ("local_ack_timeout_err", c.timeouts),
        ("qp_dropped_pkts", c.dropped),
        // softroce's own: rxe counts none of these.
        ("sent_inv_req_nak", c.fatal_naks_sent.invalid_request),
        ("sent_access_nak", c.fatal_naks_sent.remote_access),
        ("sent_op_nak", c.fatal_naks_sent.remote_operational),
        ("rcvd_inv_req_nak", c.fatal_naks_received.invalid_request),
        ("rcvd_access_nak", c.fatal_naks_received.remote_access),
        ("rcvd_op_nak", c.fatal_naks_received.remote_operational),
    ]
}

/// A device's counters: the link's packets and drops, then its QPs' sums
/// (but their packet counts, which the link's include).
pub fn device_counters(d: &DeviceCounters) -> impl Iterator<Item = (&'static str, u64)> {
    let link = [
        ("sent_pkts", d.link.sent),
        ("rcvd_pkts", d.link.received),
        ("icrc_err", d.link.icrc_errors),
        ("malformed_pkts", d.link.malformed + d.malformed),
        ("unknown_qp_pkts", d.unknown_qp),
        // softroce's own: packets for another process sharing the port,
        // passed on to it (kernel rxe demultiplexes in one place).
        ("forwarded_pkts", d.link.forwarded),
        ("forward_drop_pkts", d.link.forward_dropped),
        // Sent with their payloads read from registered memory by the send
        // itself, never copied in userspace (rxe-spec T-36).
        ("lent_pkts", d.link.lent),
    ];
    link.into_iter()
        .chain(qp_counters(&d.qp).into_iter().filter(|(name, _)| !matches!(*name, "sent_pkts" | "rcvd_pkts")))
}

/// The per-user directory the files live in (`rundir::user_directory`).
pub fn directory() -> io::Result<PathBuf> {
    crate::rundir::user_directory("stats")
}

/// One context's published counters, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The process that has the context open.
    pub pid: u32,
    /// The device's name.
    pub device: String,
    /// Device counters, in order.
    pub device_counters: Vec<(String, u64)>,
    /// Each QP's number and counters.
    pub qps: Vec<(u32, Vec<(String, u64)>)>,
}

/// Writes the file's text into `text`, which keeps its capacity from one
/// period to the next: the publisher allocates nothing in steady state.
fn render(text: &mut String, pid: u32, device: &str, d: &DeviceCounters, qps: impl Iterator<Item = (u32, Counters)>) {
    use std::fmt::Write;
    text.clear();
    let _ = write!(text, "{MAGIC}\npid {pid}\ndevice {device}\n");
    for (name, value) in device_counters(d) {
        let _ = writeln!(text, "counter {name} {value}");
    }
    for (qpn, c) in qps {
        let _ = write!(text, "qp {qpn}");
        for (name, value) in qp_counters(&c) {
            let _ = write!(text, " {name} {value}");
        }
        text.push('\n');
    }
}

fn parse(text: &str) -> Option<Published> {
    let mut lines = text.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let pid = lines.next()?.strip_prefix("pid ")?.parse().ok()?;
    let device = lines.next()?.strip_prefix("device ")?.to_string();
    let mut published = Published { pid, device, device_counters: Vec::new(), qps: Vec::new() };
    for line in lines {
        let mut words = line.split(' ');
        match words.next()? {
            "counter" => {
                let name = words.next()?.to_string();
                published.device_counters.push((name, words.next()?.parse().ok()?));
            }
            "qp" => {
                let qpn = words.next()?.parse().ok()?;
                let mut counters = Vec::new();
                while let (Some(name), Some(value)) = (words.next(), words.next()) {
                    counters.push((name.to_string(), value.parse().ok()?));
                }
                published.qps.push((qpn, counters));
            }
            _ => return None,
        }
    }
    Some(published)
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Every context's counters this user's processes publish, by process and
/// device. Files of processes that are gone (killed, say) are removed.
pub fn read_published() -> io::Result<Vec<Published>> {
    let dir = directory()?;
    let mut all = Vec::new();
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "stats") {
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else { continue };
        match parse(&text) {
            Some(p) if alive(p.pid) => all.push(p),
            _ => {
                let _ = fs::remove_file(&path);
            }
        }
    }
    all.sort_by(|a, b| (a.pid, &a.device).cmp(&(b.pid, &b.device)));
    Ok(all)
}

/// The thread that keeps a context's file current; dropping it stops the
/// thread and removes the file.
#[derive(Debug)]
pub(super) struct Publisher {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Publishes `source`'s counters every [`PUBLISH_EVERY`] until dropped;
    /// `None` if the directory cannot be had (the context works without).
    pub(super) fn start(source: CounterSource) -> Option<Publisher> {
        let dir = directory().ok()?;
        let pid = std::process::id();
        // Several contexts of one process may open one device.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{pid}-{id}.stats"));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("softroce-stats".into())
            .spawn(move || {
                let temporary = path.with_extension("tmp");
                // Both buffers sized up front: they swap after each write, and
                // growing one in a later period would allocate then.
                let (mut text, mut last) = (String::with_capacity(1 << 14), String::with_capacity(1 << 14));
                let mut qps = Vec::with_capacity(64);
                loop {
                    source.qp_counters_into(&mut qps);
                    render(&mut text, pid, &source.device, &source.device_counters(), qps.iter().copied());
                    if text != last && fs::write(&temporary, &text).and_then(|()| fs::rename(&temporary, &path)).is_ok()
                    {
                        std::mem::swap(&mut text, &mut last);
                    }
                    if stopped.recv_timeout(PUBLISH_EVERY) != Err(RecvTimeoutError::Timeout) {
                        break;
                    }
                }
                let _ = fs::remove_file(&path);
            })
            .ok()?;
        Some(Publisher { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_file_reads_back() {
        let d = DeviceCounters { unknown_qp: 3, ..DeviceCounters::default() };
        let qp = Counters { sent_packets: 5, retries: 2, ..Counters::default() };
        let mut text = String::new();
        render(&mut text, 42, "sr_lo", &d, [(0x11, qp)].into_iter());
        let p = parse(&text).unwrap();
        assert_eq!((p.pid, p.device.as_str()), (42, "sr_lo"));
        assert!(p.device_counters.contains(&("unknown_qp_pkts".to_string(), 3)));
        assert_eq!(p.qps[0].0, 0x11);
        assert!(p.qps[0].1.contains(&("completer_retry_err".to_string(), 2)));
        assert_eq!(parse("not ours"), None);
    }

    /// Two devices on loopback, A breaking the ICRC of every 4th packet it
    /// sends: what B publishes counts exactly the packets A broke as ICRC
    /// errors, and A's QP publishes the retries that recovered them.
    #[test]
    fn published_counters_match_the_losses_injected() {
        use crate::verbs::{Access, ConnectOptions, Context, ContextOptions, Device, QpType, SendOp, SendWr};
        use std::net::IpAddr;
        let (ip_a, ip_b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let port = crate::net::udp::free_port(&[ip_a, ip_b]).unwrap();
        let a_options = ContextOptions { port, corrupt_icrc_every: 4, ..ContextOptions::default() };
        let a = Context::open(&Device::custom("stats_a", vec![ip_a], [2, 0, 0, 0, 0, 1], 4176), a_options).unwrap();
        let b_options = ContextOptions { port, ..ContextOptions::default() };
        let b = Context::open(&Device::custom("stats_b", vec![ip_b], [2, 0, 0, 0, 0, 2], 4176), b_options).unwrap();
        let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (cq_a, cq_b) = (a.create_cq(64, None).unwrap(), b.create_cq(64, None).unwrap());
        let (qp_a, qp_b) =
            (pd_a.create_qp(QpType::Rc, &cq_a).build().unwrap(), pd_b.create_qp(QpType::Rc, &cq_b).build().unwrap());
        let quick = ConnectOptions {
            timeout: crate::verbs::AckTimeout::from_exponent(10).unwrap(),
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            ..ConnectOptions::default()
        };
        qp_a.connect(&qp_b.endpoint(1).unwrap(), &quick).unwrap();
        qp_b.connect(&qp_a.endpoint(1).unwrap(), &quick).unwrap();
        let (mr_a, mr_b) =
            (pd_a.alloc_mr(1 << 16, Access::LOCAL_WRITE).unwrap(), pd_b.alloc_mr(1 << 16, quick.access).unwrap());
        for i in 0..8u64 {
            let write = SendOp::RdmaWrite { remote_addr: mr_b.addr(), rkey: mr_b.rkey() };
            qp_a.post_send(SendWr::new(i, write).with_sge(mr_a.sge(0, 1 << 16))).unwrap();
            let wc = cq_a.wait_one(Duration::from_secs(20)).expect("the WRITE completes");
            assert_eq!(wc.status, crate::verbs::WcStatus::Success);
        }
        let broken = a.counters().link.corrupted;
        assert!(broken > 0);
        // Within two publishing periods, the files say what the contexts do.
        std::thread::sleep(PUBLISH_EVERY * 2 + Duration::from_millis(100));
        let ours: Vec<Published> =
            read_published().unwrap().into_iter().filter(|p| p.pid == std::process::id()).collect();
        let find = |device: &str| ours.iter().find(|p| p.device == device).expect("published").clone();
        let value = |list: &[(String, u64)], name: &str| list.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        let (pa, pb) = (find("stats_a"), find("stats_b"));
        assert_eq!(value(&pb.device_counters, "icrc_err"), Some(broken));
        assert_eq!(value(&pb.device_counters, "icrc_err"), Some(b.counters().link.icrc_errors));
        // Eight 64 KiB WRITEs of whole 4 KiB packets from one region: lent.
        assert!(value(&pa.device_counters, "lent_pkts").unwrap() >= 8 * 16, "{:?}", pa.device_counters);
        let (qpn, qp) = pa.qps.iter().find(|(qpn, _)| *qpn == qp_a.qpn()).expect("A's QP").clone();
        assert_eq!(qpn, qp_a.qpn());
        assert!(value(&qp, "completer_retry_err").unwrap() > 0, "{qp:?}");
        // A closed context takes its file with it.
        drop((qp_a, qp_b, mr_a, mr_b, cq_a, cq_b, pd_a, pd_b, a, b));
        let left = read_published().unwrap();
        assert!(!left.iter().any(|p| p.pid == std::process::id() && p.device.starts_with("stats_")), "{left:?}");
    }
}
