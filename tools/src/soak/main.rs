//! `softroce-soak [SECONDS]`: a long mixed soak of separate processes,
//! with kills, checked byte for byte (run by `tools/soak`; CI runs 60 s).
//!
//! Ten member processes (this program again, `member.rs`): four share the
//! device on 127.0.0.1 and its port, two more share 127.0.0.2, and two
//! pairs live in network namespaces of the soak's own, joined by a veth
//! pair whose packets an nftables injector drops and duplicates. Every
//! member serves rdma_cm connections and runs two clients that connect to
//! random peers of its host, run rounds (RC WRITE, READ, FETCH_ADD or
//! CMP_SWP and SEND, answered by the server; a UC SEND; a UD SEND), every
//! byte keyed by (connection, message number) and checked by its receiver,
//! and disconnect. Every few seconds a random member is SIGKILLed and
//! started again. At the end the figures are printed, and the soak exits
//! non-zero unless nothing was lost or corrupted, nothing hung, and no
//! thread, file descriptor or shared-port slot outlived its user.

mod member;
mod netns;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use member::Spec;
use softroce::net::sim::SplitMix64;

const HOST_A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const HOST_B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// The first member's rdma_cm port; each member listens on its own.
const CM_PORT: u16 = 7400;
/// A member whose counts do not move for this long has hung.
const HANG: Duration = Duration::from_secs(90);
/// A restarted member that lives this long must carry traffic again.
const REJOIN: Duration = Duration::from_secs(5);

/// `len` bytes that differ from one `seed` to the next (tests/support's).
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(0x9e37_79b1) >> 24) as u8).collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("member") {
        return match Spec::from_args(&args[1..]).and_then(member::main) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("softroce-soak member: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let seconds = match args.first().map(|s| s.parse::<u64>()) {
        None => 60,
        Some(Ok(s)) if s > 0 => s,
        _ => {
            eprintln!("usage: softroce-soak [SECONDS] (default 60)");
            return ExitCode::from(2);
        }
    };
    match soak(Duration::from_secs(seconds)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("softroce-soak: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Where a member runs.
struct Place {
    addr: IpAddr,
    port: u16,
    namespace: Option<String>,
}

/// A member's current process: generation 0, or the one that replaced the
/// last one killed.
struct Running {
    peers: Vec<(u32, SocketAddr)>,
    place: usize,
    generation: u32,
    child: Child,
    spawned: Instant,
    /// Its counts of work done as last seen, and since when they stand still.
    last_counts: (Vec<u64>, Instant),
}

impl Drop for Running {
    /// Whatever ends the soak, no member outlives it (a child already
    /// waited for is not signalled again).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(dir: &Path, index: u32, generation: u32, place: &Place, peers: &[(u32, SocketAddr)]) -> Result<Child, String> {
    let spec = Spec {
        dir: dir.to_path_buf(),
        index,
        generation,
        addr: place.addr,
        port: place.port,
        cm_port: CM_PORT + index as u16,
        peers: peers.to_vec(),
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = match &place.namespace {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let log = fs::File::create(Spec::file(dir, index, generation, "log")).map_err(|e| e.to_string())?;
    command
        .args(spec.to_args())
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting member {index}: {e}"))
}

/// A generation's progress counts, by name.
fn counts(dir: &Path, index: u32, generation: u32) -> BTreeMap<String, u64> {
    let text = fs::read_to_string(Spec::file(dir, index, generation, "progress")).unwrap_or_default();
    text.lines().filter_map(|l| l.split_once(' ')).filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?))).collect()
}

fn soak(duration: Duration) -> Result<bool, String> {
    let dir = std::env::temp_dir().join(format!("softroce-soak-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let port = softroce::net::udp::free_port(&[HOST_A, HOST_B]).map_err(|e| e.to_string())?;
    let lossy = netns::Lossy::create(std::process::id())?;
    let places = [
        Place { addr: HOST_A, port, namespace: None },
        Place { addr: HOST_B, port, namespace: None },
        Place { addr: netns::ADDR_A, port: 4791, namespace: Some(lossy.names[0].clone()) },
        Place { addr: netns::ADDR_B, port: 4791, namespace: Some(lossy.names[1].clone()) },
    ];
    // Member index -> place.
    let layout: Vec<usize> = vec![0, 0, 0, 0, 1, 1, 2, 2, 3, 3];
    let host = |p: usize| p < 2;
    let mut running: Vec<Running> = Vec::new();
    for (index, &place) in layout.iter().enumerate() {
        let peers: Vec<(u32, SocketAddr)> = layout
            .iter()
            .enumerate()
            .filter(|&(j, &q)| j != index && host(q) == host(place))
            .map(|(j, &q)| (j as u32, SocketAddr::new(places[q].addr, CM_PORT + j as u16)))
            .collect();
        let child = spawn(&dir, index as u32, 0, &places[place], &peers)?;
        running.push(Running {
            peers,
            place,
            generation: 0,
            child,
            spawned: Instant::now(),
            last_counts: (Vec::new(), Instant::now()),
        });
    }

    let start = Instant::now();
    let mut rng = SplitMix64(u64::from(std::process::id()));
    let mut killed: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut failures: Vec<String> = Vec::new();
    let mut next_kill = start + Duration::from_secs(3 + rng.below(4));
    // Members killed and when each starts again.
    let mut restart: Vec<(usize, Instant)> = Vec::new();
    // Restarted generations and how long they lived.
    let mut restarts: Vec<(u32, u32, Duration)> = Vec::new();
    while start.elapsed() < duration || !restart.is_empty() {
        std::thread::sleep(Duration::from_millis(100));
        let now = Instant::now();
        for &(index, _) in restart.iter().filter(|(_, at)| now >= *at) {
            let r = &mut running[index];
            r.generation += 1;
            r.child = spawn(&dir, index as u32, r.generation, &places[r.place], &r.peers)?;
            r.spawned = now;
            r.last_counts = (Vec::new(), now);
        }
        restart.retain(|(_, at)| now < *at);
        if restart.is_empty() && now >= next_kill && start.elapsed() + Duration::from_secs(5) < duration {
            // One member, or one time in four two at once (both of a
            // namespace, say: its group is left empty with a stale state).
            let mut victims = vec![rng.below(running.len() as u64) as usize];
            if rng.below(4) == 0 {
                victims.push((victims[0] + 1 + rng.below(running.len() as u64 - 1) as usize) % running.len());
            }
            for index in victims {
                let r = &mut running[index];
                let _ = r.child.kill();
                let _ = r.child.wait();
                killed.insert((index as u32, r.generation));
                if r.generation > 0 {
                    restarts.push((index as u32, r.generation, now - r.spawned));
                }
                restart.push((index, now + Duration::from_millis(300 + rng.below(1200))));
            }
            next_kill = now + Duration::from_secs(3 + rng.below(5));
        }
        for (index, r) in running.iter_mut().enumerate() {
            if restart.iter().any(|&(i, _)| i == index) {
                continue;
            }
            if let Ok(Some(status)) = r.child.try_wait() {
                // A crash: recorded, and the member started again so that
                // the soak goes on.
                let log = Spec::file(&dir, index as u32, r.generation, "log");
                failures.push(format!(
                    "member {index} generation {} exited by itself ({status}): {}",
                    r.generation,
                    log.display()
                ));
                r.generation += 1;
                r.child = spawn(&dir, index as u32, r.generation, &places[r.place], &r.peers)?;
                r.spawned = now;
                r.last_counts = (Vec::new(), now);
                continue;
            }
            let c = counts(&dir, index as u32, r.generation);
            let moving: Vec<u64> =
                ["rounds", "accepted", "served", "refused"].iter().map(|k| c.get(*k).copied().unwrap_or(0)).collect();
            if moving != r.last_counts.0 {
                r.last_counts = (moving, now);
            } else if now - r.last_counts.1 > HANG {
                failures
                    .push(format!("hang: member {index} generation {} made no progress for {HANG:?}", r.generation));
                r.last_counts.1 = now;
            }
        }
    }
    let ran = start.elapsed();
    let end = Instant::now();
    restarts.extend(
        running
            .iter()
            .enumerate()
            .filter(|(_, r)| r.generation > 0)
            .map(|(i, r)| (i as u32, r.generation, end - r.spawned)),
    );

    // Stop: clients finish their round and disconnect; then servers close.
    fs::write(dir.join("stop"), "").map_err(|e| e.to_string())?;
    let bound = member::BOUND * 2;
    let all_done =
        |kind: &str| running.iter().enumerate().all(|(i, r)| Spec::file(&dir, i as u32, r.generation, kind).exists());
    let deadline = Instant::now() + bound;
    while !all_done("clients-done") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if !all_done("clients-done") {
        failures.push(format!("hang: clients did not stop within {bound:?}"));
    }
    fs::write(dir.join("close"), "").map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    for (index, r) in running.iter_mut().enumerate() {
        loop {
            match r.child.try_wait() {
                Ok(Some(status)) if status.success() => break,
                Ok(Some(status)) => {
                    failures.push(format!("member {index} ended with {status}"));
                    break;
                }
                _ if Instant::now() > deadline => {
                    failures.push(format!("hang: member {index} did not exit"));
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    break;
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    let injected = lossy.counts();

    // Slots: once everyone is gone, no port directory keeps a member.
    let host_ns = fs::metadata("/proc/self/ns/net").map(|m| m.ino()).map_err(|e| e.to_string())?;
    let mut port_dirs = vec![port_dir(port, host_ns)];
    for ns in &lossy.names {
        let inode = fs::metadata(format!("/run/netns/{ns}")).map(|m| m.ino()).map_err(|e| e.to_string())?;
        port_dirs.push(port_dir(4791, inode));
    }
    let leaked_slots: usize = port_dirs.iter().map(|d| live_slots(d)).sum();
    for d in port_dirs.iter().filter(|d| live_slots(d) > 0) {
        failures.push(format!("slots left in {}", d.display()));
    }
    drop(lossy);

    let report = Report::gather(&dir, &running, &killed, &restarts);
    let ok = report.print(ran, port, &injected, leaked_slots, &failures);
    if ok {
        let _ = fs::remove_dir_all(&dir);
    } else {
        println!("soak FAILED; the members' files are kept in {}", dir.display());
    }
    Ok(ok)
}

/// Where `net::share` keeps a port's state in a namespace (named, not made
/// as `rundir::host_directory` would: its absence is what is checked).
fn port_dir(port: u16, netns: u64) -> PathBuf {
    let uid = fs::metadata("/proc/self").map_or(0, |m| m.uid());
    Path::new("/tmp").join(format!("softroce-{uid}")).join(format!("port-{port}-net{netns}"))
}

/// Slots a port directory still gives a member: its members' inboxes and
/// the slots its state lists with sockets.
fn live_slots(dir: &Path) -> usize {
    let mut slots = BTreeSet::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(slot) = name.strip_prefix("slot-").and_then(|s| s.strip_suffix(".sock")) {
            slots.insert(slot.to_owned());
        }
    }
    let state = fs::read_to_string(dir.join("state")).unwrap_or_default();
    for line in state.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 4 && f[0] == "slot" {
            slots.insert(f[1].to_owned());
        }
    }
    slots.len()
}

/// Everything the members' files say.
#[derive(Default)]
struct Report {
    totals: BTreeMap<String, u64>,
    generations: usize,
    killed: usize,
    expected_errors: usize,
    lost: Vec<String>,
    corrupted: Vec<String>,
    hangs: Vec<String>,
    /// rdma_cm steps of live peers that ended in an unexpected event.
    cm_errors: Vec<String>,
    other: Vec<String>,
    leaked_threads: i64,
    leaked_fds: i64,
    survivors: usize,
    never_rejoined: Vec<String>,
}

impl Report {
    fn gather(
        dir: &Path,
        running: &[Running],
        killed: &BTreeSet<(u32, u32)>,
        restarts: &[(u32, u32, Duration)],
    ) -> Report {
        let mut report = Report { killed: killed.len(), ..Report::default() };
        for (index, r) in running.iter().enumerate() {
            let index = index as u32;
            for generation in 0..=r.generation {
                report.generations += 1;
                for (k, v) in counts(dir, index, generation) {
                    if k != "slot" {
                        *report.totals.entry(k).or_default() += v;
                    }
                }
                let events = fs::read_to_string(Spec::file(dir, index, generation, "events")).unwrap_or_default();
                for line in events.lines() {
                    report.judge(index, generation, line, killed);
                }
            }
            let result = fs::read_to_string(Spec::file(dir, index, r.generation, "result")).unwrap_or_default();
            let pair = |name: &str| {
                let line = result.lines().find(|l| l.starts_with(name))?;
                let v: Vec<i64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
                Some((*v.first()?, *v.get(1)?))
            };
            match (pair("threads "), pair("fds ")) {
                (Some((t0, t1)), Some((f0, f1))) => {
                    report.survivors += 1;
                    report.leaked_threads += (t1 - t0).max(0);
                    report.leaked_fds += (f1 - f0).max(0);
                    if t1 != t0 || f1 != f0 {
                        report.other.push(format!("member {index}: threads {t0} -> {t1}, fds {f0} -> {f1}"));
                    }
                }
                _ => report.hangs.push(format!("member {index} generation {} wrote no result", r.generation)),
            }
        }
        // A restarted member must have taken a slot on the shared port again
        // and carried traffic there, as a client or a server, unless it was
        // killed again before it could.
        for &(index, generation, _) in restarts.iter().filter(|(_, _, lived)| *lived >= REJOIN) {
            let c = counts(dir, index, generation);
            let worked = ["rounds", "accepted"].iter().any(|k| c.get(*k).copied().unwrap_or(0) > 0);
            if !worked || c.get("slot").is_none_or(|&s| s == 0) {
                report.never_rejoined.push(format!("member {index} generation {generation} carried no traffic"));
            }
        }
        report
    }

    /// Sorts an event line: an error is expected only on a QP whose peer
    /// was killed.
    fn judge(&mut self, index: u32, generation: u32, line: &str, killed: &BTreeSet<(u32, u32)>) {
        let field = |name: &str| {
            line.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse::<u32>().ok())
        };
        let at = format!("member {index} generation {generation}: {line}");
        match line.split_whitespace().next().unwrap_or("") {
            "peer-error" => match (field("peer"), field("peer_gen")) {
                (Some(p), Some(g)) if killed.contains(&(p, g)) => self.expected_errors += 1,
                _ => self.lost.push(at),
            },
            "lost" => self.lost.push(at),
            "cm-error" => match (field("peer"), field("peer_gen")) {
                (Some(p), Some(g)) if killed.contains(&(p, g)) => self.expected_errors += 1,
                _ => self.cm_errors.push(at),
            },
            "corrupt" => self.corrupted.push(at),
            "cm-timeout" => self.hangs.push(at),
            _ => self.other.push(at),
        }
    }

    fn print(
        &self,
        ran: Duration,
        port: u16,
        injected: &netns::Injected,
        leaked_slots: usize,
        failures: &[String],
    ) -> bool {
        let t = |k: &str| self.totals.get(k).copied().unwrap_or(0);
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        println!("softroce soak: {:.0} s, 10 member processes in {} generations", ran.as_secs_f64(), self.generations);
        println!(
            "  4 share {HOST_A} and 2 share {HOST_B} (UDP port {port}); 2 + 2 in network namespaces on {} and {} (port 4791), joined by a veth whose packets are dropped, duplicated and reordered",
            netns::ADDR_A,
            netns::ADDR_B
        );
        println!(
            "messages: {} RC rounds (WRITE, READ, FETCH_ADD/CMP_SWP, SEND and the server's answer; {} SENDs checked by servers), {:.1} MiB; UC {} sent, {} received ({} twice, {} late, {:.1} MiB); UD {} sent, {} received ({} twice, {} late, {:.1} MiB); every byte checked",
            t("rounds"),
            t("rc_received"),
            mib(t("rc_bytes")),
            t("uc_sent"),
            t("uc_received"),
            t("uc_duplicates"),
            t("uc_late"),
            mib(t("uc_bytes")),
            t("ud_sent"),
            t("ud_received"),
            t("ud_duplicates"),
            t("ud_late"),
            mib(t("ud_bytes"))
        );
        println!(
            "connections: {} made over rdma_cm ({} accepted, {} closed by disconnect, {} given up by the client before they were up), {} refused or unanswered (peer down), {} keep-alive probes",
            t("connections"),
            t("accepted"),
            t("served"),
            t("abandoned"),
            t("refused"),
            t("probes")
        );
        println!(
            "processes: {} SIGKILLed and restarted; {} errors on QPs whose peer was killed (expected: retries end in an error)",
            self.killed, self.expected_errors
        );
        println!(
            "injector (nftables and HTB on the veth, both directions): {} packets seen, {} dropped, {} duplicated, {} sent through the 1 Mbit/s lane ({} of them held back there while later packets passed, {} dropped as it was full)",
            injected.offered,
            injected.dropped,
            injected.duplicated,
            injected.slowed,
            injected.held_back,
            injected.lane_dropped
        );
        println!(
            "devices: {} packets sent, {} received; {} retries, {} ACK timeouts, {} sequence NAKs sent, {} duplicate requests, {} RNR NAKs sent, {} forwarded between members, {} forward drops, {} for unknown QPs",
            t("packets_sent"),
            t("packets_received"),
            t("retries"),
            t("timeouts"),
            t("seq_naks_sent"),
            t("duplicate_requests"),
            t("rnr_naks_sent"),
            t("forwarded"),
            t("forward_dropped"),
            t("unknown_qp")
        );
        let hangs = self.hangs.len() + failures.iter().filter(|f| f.starts_with("hang")).count();
        println!(
            "checks: {} lost, {} corrupted, {hangs} hangs, {} rdma_cm failures; leaked over {} surviving processes: {} threads, {} fds; {leaked_slots} shared-port slots left after all exited; {} restarts (living {REJOIN:?} or more) that never rejoined",
            self.lost.len(),
            self.corrupted.len(),
            self.cm_errors.len(),
            self.survivors,
            self.leaked_threads,
            self.leaked_fds,
            self.never_rejoined.len()
        );
        for line in self
            .lost
            .iter()
            .chain(&self.corrupted)
            .chain(&self.hangs)
            .chain(&self.cm_errors)
            .chain(&self.other)
            .chain(&self.never_rejoined)
            .chain(failures)
        {
            println!("  {line}");
        }
        self.lost.is_empty()
            && self.corrupted.is_empty()
            && hangs == 0
            && self.cm_errors.is_empty()
            && self.other.is_empty()
            && self.never_rejoined.is_empty()
            && failures.is_empty()
            && leaked_slots == 0
            && self.leaked_threads == 0
            && self.leaked_fds == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_expected_only_from_killed_peers() {
        let killed = BTreeSet::from([(3, 0)]);
        let mut report = Report::default();
        report.judge(1, 0, "peer-error side=client peer=3 peer_gen=0 conn=0x1 status=RetryExcErr", &killed);
        report.judge(1, 0, "peer-error side=server peer=3 peer_gen=1 conn=0x2 status=RetryExcErr", &killed);
        report.judge(1, 0, "lost side=client peer=3 peer_gen=0 conn=0x3 message=4", &killed);
        report.judge(2, 0, "corrupt side=server peer=1 peer_gen=0 conn=0x4 UC message", &killed);
        report.judge(2, 0, "cm-timeout peer=1 conn=0x5 step=connect", &killed);
        report.judge(2, 0, "fatal post", &killed);
        report.judge(1, 0, "cm-error side=client peer=2 peer_gen=0 conn=0x6 disconnect ended in Rejected", &killed);
        assert_eq!(report.expected_errors, 1);
        assert_eq!(report.lost.len(), 2, "{:?}", report.lost);
        assert_eq!((report.corrupted.len(), report.hangs.len(), report.other.len()), (1, 1, 1));
        assert_eq!(report.cm_errors.len(), 1);
    }

    #[test]
    fn a_port_directory_left_behind_counts_its_live_slots() {
        let dir = std::env::temp_dir().join(format!("softroce-soak-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(live_slots(&dir.join("absent")), 0);
        fs::write(dir.join("slot-3.sock"), "").unwrap();
        let state = "softroce-shared-port 1\nslot 3 used 5 127.0.0.1=77\nslot 4 used 6 127.0.0.1=78\nslot 5 used 7\n";
        fs::write(dir.join("state"), state).unwrap();
        assert_eq!(live_slots(&dir), 2, "slots 3 and 4 are held; 5 was left");
        fs::remove_dir_all(&dir).unwrap();
    }
}
