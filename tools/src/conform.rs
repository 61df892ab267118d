//! `softroce conform`: scripted packet-level scenarios against a RoCE peer
//! that runs only stock programs (perftest), each reported against the
//! rxe-spec statements it checks.
//!
//! perftest's TCP exchange is the way in: we announce QP numbers, PSNs and a
//! GID of our own, the peer connects its QPs to them, and from then on the
//! probe (`conform/probe.rs`) plays those QPs by hand. Against a server's QPs
//! we are the requester and probe its responder (`conform/responder.rs`);
//! a client's QPs come to us and we probe its requester with the answers we
//! give (`conform/requester.rs`).

mod probe;
mod requester;
mod responder;
mod session;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use softroce::wire::ROCE_UDP_PORT;

use crate::cli::{c_port, seconds, Zero};
use probe::Probe;
use session::{Program, QpNumbers, ServerSession, Setup};

/// The peer's programs and the TCP port of each, from `--port`.
const PEER_HELP: &str = "\
On HOST, keep each of these running in a loop (each run serves one batch of
checks; the servers' QP counts must be as shown), with LOCAL our address:

  while :; do ib_write_bw  -q 16 -p 18515; done
  while :; do ib_read_bw   -q 10 -p 18516; done
  while :; do ib_atomic_bw -q 8  -p 18517; done
  while :; do ib_send_bw   -q 8  -p 18518; done
  while :; do ib_write_bw  -q 6 -n 20 -s 4096 -p 18519 LOCAL; sleep 1; done
  while :; do ib_read_bw   -q 2 -n 5 -s 2048 -p 18520 LOCAL; sleep 1; done

Add -d/-x to select the device and GID as usual. Port numbers move with
--port. `softroce conform --self` starts the same programs (softroce perf)
on loopback itself.

Results: pass, deviation (expected vs seen, with the packet ladder),
skipped (with why) or error (the peer or the exchange failed). Exit status:
0 all passed or skipped, 1 deviations, 2 errors.";

#[derive(clap::Args)]
#[command(after_help = PEER_HELP)]
pub struct Args {
    /// The peer's address (IPv4).
    #[arg(value_name = "HOST", required_unless_present_any = ["self_peer", "list"])]
    host: Option<IpAddr>,
    /// Probe a softroce peer started here on loopback (127.0.77.2, with the
    /// probe on 127.0.77.1 and 127.0.77.3): the suite's own regression test.
    #[arg(long = "self", conflicts_with = "host")]
    self_peer: bool,
    /// Our address (default: the one the route to HOST leaves from).
    #[arg(long = "local-addr", value_name = "ADDR")]
    local_addr: Option<IpAddr>,
    /// A second local address, for the check of packets from a wrong source.
    #[arg(long = "alt-addr", value_name = "ADDR")]
    alt_addr: Option<IpAddr>,
    /// First of the six TCP ports of the peer's programs.
    #[arg(long, default_value_t = 18515, value_parser = c_port)]
    port: u16,
    /// UDP port of RoCE.
    #[arg(long = "roce-port", default_value_t = ROCE_UDP_PORT, value_parser = c_port)]
    roce_port: u16,
    /// Path MTU to ask for, in bytes (the peer may lower it).
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Seconds of silence after which the peer is taken to have said all it will.
    #[arg(long, default_value = "0.2", value_parser = |s: &str| seconds(s, Zero::Refused))]
    quiet: Duration,
    /// Seconds to wait for one of the peer's programs to be there.
    #[arg(long, default_value = "30", value_parser = |s: &str| seconds(s, Zero::Refused))]
    timeout: Duration,
    /// Print the checks (id, rxe-spec statements, what each checks) and exit.
    #[arg(long)]
    list: bool,
    /// Run only the checks whose id contains this.
    #[arg(long, value_name = "TEXT")]
    only: Option<String>,
    /// One JSON object per check on stdout (keys id, spec, title, result,
    /// expected, seen, detail, ladder) instead of the table.
    #[arg(long)]
    json: bool,
    /// Record every packet sent and received into this pcap file.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Write each check's packet ladder into DIR/ID.txt.
    #[arg(long, value_name = "DIR")]
    ladder: Option<PathBuf>,
}

/// What a check found.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Pass,
    Deviation { expected: String, seen: String },
    Skipped(String),
    Error(String),
}

impl Verdict {
    fn name(&self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Deviation { .. } => "deviation",
            Verdict::Skipped(_) => "skipped",
            Verdict::Error(_) => "error",
        }
    }
}

/// A check ends early with its verdict.
#[derive(Debug)]
pub struct Stop(pub Verdict);

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Stop {
        Stop(Verdict::Error(e.to_string()))
    }
}

pub type Step<T = ()> = Result<T, Stop>;

/// A list of packet descriptions as a report shows it.
pub fn list(items: &[String]) -> String {
    if items.is_empty() {
        "nothing".to_owned()
    } else {
        items.join("; ")
    }
}

/// One check's result.
pub struct Outcome {
    pub id: &'static str,
    pub spec: &'static str,
    pub title: &'static str,
    pub verdict: Verdict,
    pub ladder: Vec<String>,
}

/// Where everything is.
pub struct Plan {
    pub local: IpAddr,
    pub peer: IpAddr,
    pub port: u16,
    pub setup: Setup,
    pub only: Option<String>,
}

impl Plan {
    fn wants(&self, id: &str) -> bool {
        self.only.as_deref().is_none_or(|o| id.contains(o))
    }

    fn tcp(&self, program: Program) -> SocketAddr {
        let offset = Program::SERVERS.iter().position(|&p| p == program).unwrap_or(0) as u16;
        SocketAddr::new(self.peer, self.port + offset)
    }
}

/// Runs the responder checks, a server session at a time.
fn probe_responders(probe: &mut Probe, plan: &Plan, numbers: &mut QpNumbers, report: &mut Report) {
    for program in Program::SERVERS {
        let checks: Vec<&responder::Check> =
            responder::CHECKS.iter().filter(|c| c.program == program && plan.wants(c.id)).collect();
        let mut session: Option<ServerSession> = None;
        // QP 0 of a session (first PSN near the wrap) is for the checks that want it.
        let mut next = 1;
        let mut wrap_used = false;
        // A SEND server's run ends with the first QP in error.
        let mut ended = false;
        let mut failed: Option<String> = None;
        for check in checks {
            let fresh = match &session {
                None => true,
                Some(s) => ended || if check.wrap { wrap_used } else { next >= s.qps.len() },
            };
            if fresh {
                if let Some(old) = session.take() {
                    finish(probe, old);
                }
                // A program that was not there once is not waited for again.
                let connected = match &failed {
                    Some(why) => Err(why.clone()),
                    None => {
                        ServerSession::connect(program, plan.tcp(program), program.server_qps(), &plan.setup, numbers)
                            .map_err(|e| e.0)
                    }
                };
                match connected {
                    Ok(s) => session = Some(s),
                    Err(why) => {
                        failed = Some(why.clone());
                        report.add(Outcome {
                            id: check.id,
                            spec: check.spec,
                            title: check.title,
                            verdict: Verdict::Error(why),
                            ladder: Vec::new(),
                        });
                        continue;
                    }
                }
                next = 1;
                wrap_used = false;
            }
            let s = session.as_ref().expect("a session");
            let r = if check.wrap {
                wrap_used = true;
                s.qps[0]
            } else {
                next += 1;
                s.qps[next - 1]
            };
            ended = check.fatal && program == Program::Send;
            let mut target = responder::Target { probe, r, mtu: s.mtu };
            let mut verdict = match (check.run)(&mut target) {
                Ok(()) => Verdict::Pass,
                Err(Stop(v)) => v,
            };
            // Whatever the peer still sends belongs to the check too.
            match probe.answers(r.ours) {
                Ok(late) if !late.is_empty() && verdict == Verdict::Pass => {
                    let seen: Vec<String> = late.iter().map(probe::Answer::describe).collect();
                    verdict = Verdict::Deviation { expected: "nothing more".into(), seen: list(&seen) };
                }
                Err(e) if verdict == Verdict::Pass => verdict = Verdict::Error(e.to_string()),
                _ => {}
            }
            report.add(Outcome {
                id: check.id,
                spec: check.spec,
                title: check.title,
                verdict,
                ladder: probe.take_ladder(r.ours),
            });
            probe.drop_pending();
        }
        if let Some(old) = session.take() {
            finish(probe, old);
        }
    }
}

/// Ends a server's run: a SEND server's QPs are put in error first (used
/// or not), which is the only way its program ends.
fn finish(probe: &mut Probe, session: ServerSession) {
    if session.is_send() {
        for r in session.qps.clone() {
            let _ = responder::retire(probe, r);
        }
    }
    session.finish();
}

/// Our address toward `peer`: the source the kernel's route picks (a UDP
/// socket "connected" there; nothing is sent).
fn route_source(peer: IpAddr) -> std::io::Result<IpAddr> {
    let s = UdpSocket::bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0))?;
    s.connect((peer, ROCE_UDP_PORT))?;
    Ok(s.local_addr()?.ip())
}

pub fn run(args: Args) -> ExitCode {
    if args.list {
        let mut out = std::io::stdout().lock();
        for (id, spec, title) in responder::CHECKS.iter().map(|c| (c.id, c.spec, c.title)).chain(requester::checks()) {
            let _ = writeln!(out, "{id:<38} {spec:<16} {title}");
        }
        return ExitCode::SUCCESS;
    }
    let mut report = Report { args: &args, outcomes: Vec::new() };
    match conform(&args, &mut report) {
        Ok(()) => report.finish(),
        Err(e) => {
            eprintln!("softroce conform: {e}");
            ExitCode::from(2)
        }
    }
}

fn conform(args: &Args, report: &mut Report) -> Result<(), String> {
    let (peer, local, alt) = if args.self_peer {
        let at = |last| IpAddr::V4(Ipv4Addr::new(127, 0, 77, last));
        (at(2), at(1), Some(at(3)))
    } else {
        let host = args.host.ok_or("HOST is required without --self")?;
        let local = match args.local_addr {
            Some(a) => a,
            None => route_source(host).map_err(|e| format!("no route to {host}: {e}"))?,
        };
        (host, local, args.alt_addr)
    };
    if !matches!((peer, local), (IpAddr::V4(_), IpAddr::V4(_))) {
        return Err("IPv4 addresses only".into());
    }
    let _peers = if args.self_peer { Some(SelfPeer::start(args, peer, local)?) } else { None };
    let mut probe =
        Probe::new(local, alt, peer, args.roce_port, args.quiet, args.pcap.as_deref()).map_err(|e| e.to_string())?;
    let plan = Plan {
        local,
        peer,
        port: args.port,
        setup: Setup { local, mtu: mtu_code(args.mtu)?, timeout: args.timeout },
        only: args.only.clone(),
    };
    let mut numbers = QpNumbers::new();
    probe_responders(&mut probe, &plan, &mut numbers, report);
    let listeners = requester::Listeners::bind(&plan).map_err(|e| e.to_string())?;
    requester::probe_requesters(&mut probe, &plan, &listeners, &mut numbers, report);
    probe.flush();
    Ok(())
}

/// `enum ibv_mtu` for a size in bytes.
fn mtu_code(bytes: u32) -> Result<u32, String> {
    match bytes {
        256 => Ok(1),
        512 => Ok(2),
        1024 => Ok(3),
        2048 => Ok(4),
        4096 => Ok(5),
        _ => Err(format!("--mtu {bytes}: one of 256, 512, 1024, 2048, 4096")),
    }
}

/// The results as they come: each check is printed, and its ladder
/// written, when it ends, so a run cut short keeps what it found.
pub struct Report<'a> {
    args: &'a Args,
    outcomes: Vec<&'static str>,
}

impl Report<'_> {
    pub fn add(&mut self, o: Outcome) {
        let mut out = std::io::stdout().lock();
        let _ = if self.args.json { writeln!(out, "{}", outcome_json(&o)) } else { write_row(&mut out, &o) };
        let _ = out.flush();
        if let Some(dir) = &self.args.ladder {
            if let Err(e) = write_ladder(dir, &o) {
                eprintln!("softroce conform: ladder in {}: {e}", dir.display());
            }
        }
        self.outcomes.push(o.verdict.name());
    }

    fn finish(self) -> ExitCode {
        let count = |name: &str| self.outcomes.iter().filter(|o| **o == name).count();
        let (pass, dev, skip, err) = (count("pass"), count("deviation"), count("skipped"), count("error"));
        let summary =
            format!("{} checks: {pass} pass, {dev} deviation, {skip} skipped, {err} error", self.outcomes.len());
        if self.args.json {
            eprintln!("{summary}");
        } else {
            println!("\n{summary}");
        }
        ExitCode::from(if err > 0 {
            2
        } else if dev > 0 {
            1
        } else {
            0
        })
    }
}

fn write_row(out: &mut impl Write, o: &Outcome) -> std::io::Result<()> {
    writeln!(out, "{:<38} {:<9} {:<16} {}", o.id, o.verdict.name(), o.spec, o.title)?;
    match &o.verdict {
        Verdict::Pass => {}
        Verdict::Skipped(why) | Verdict::Error(why) => writeln!(out, "{:>40}{why}", "")?,
        Verdict::Deviation { expected, seen } => {
            writeln!(out, "{:>40}expected: {expected}", "")?;
            writeln!(out, "{:>40}seen:     {seen}", "")?;
            for line in &o.ladder {
                writeln!(out, "{:>42}{line}", "")?;
            }
        }
    }
    Ok(())
}

fn outcome_json(o: &Outcome) -> serde_json::Value {
    let (expected, seen, detail) = match &o.verdict {
        Verdict::Deviation { expected, seen } => (Some(expected.as_str()), Some(seen.as_str()), None),
        Verdict::Skipped(why) | Verdict::Error(why) => (None, None, Some(why.as_str())),
        Verdict::Pass => (None, None, None),
    };
    json!({
        "id": o.id,
        "spec": o.spec,
        "title": o.title,
        "result": o.verdict.name(),
        "expected": expected,
        "seen": seen,
        "detail": detail,
        "ladder": o.ladder,
    })
}

fn write_ladder(dir: &std::path::Path, o: &Outcome) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut text = format!("{} [{}] {}\n{}\n\n", o.id, o.spec, o.title, o.verdict.name());
    for line in &o.ladder {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(dir.join(format!("{}.txt", o.id)), text)
}

/// `--self`: the peer's programs, as `softroce perf` on loopback, each
/// restarted when it exits, as PEER_HELP asks of a real peer; all killed
/// when this is dropped.
struct SelfPeer {
    stop: Arc<AtomicBool>,
    children: Arc<Mutex<Vec<Option<Child>>>>,
    loops: Vec<std::thread::JoinHandle<()>>,
}

impl SelfPeer {
    fn start(args: &Args, peer: IpAddr, local: IpAddr) -> Result<SelfPeer, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let port = |offset: u16| (args.port + offset).to_string();
        let peer_addr = peer.to_string();
        let local_addr = local.to_string();
        let servers = Program::SERVERS.iter().enumerate().map(|(i, p)| {
            let args = [p.test(), "-q", &p.server_qps().to_string(), "-p", &port(i as u16)].map(str::to_owned);
            (args.to_vec(), Duration::ZERO)
        });
        let clients = requester::CLIENTS.iter().enumerate().map(|(i, c)| {
            let mut args = vec![c.program.test().to_owned(), "-q".to_owned(), c.qps.to_string()];
            args.extend(c.options.iter().map(|&o| o.to_owned()));
            args.extend(["-p".to_owned(), port(4 + i as u16), local_addr.clone()]);
            (args, Duration::from_millis(200))
        });
        let programs: Vec<(Vec<String>, Duration)> = servers.chain(clients).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let children = Arc::new(Mutex::new((0..programs.len()).map(|_| None).collect::<Vec<_>>()));
        let mut loops = Vec::new();
        for (i, (test_args, pause)) in programs.into_iter().enumerate() {
            let (exe, stop, children, peer_addr) = (exe.clone(), stop.clone(), children.clone(), peer_addr.clone());
            let roce_port = args.roce_port.to_string();
            loops.push(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let child = Command::new(&exe)
                        .arg("perf")
                        .args(&test_args)
                        .args(["--local-addr", &peer_addr, "--roce-port", &roce_port, "--timeout", "60"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn();
                    let Ok(child) = child else { return };
                    children.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(child);
                    loop {
                        std::thread::sleep(Duration::from_millis(20));
                        let mut guard = children.lock().unwrap_or_else(|e| e.into_inner());
                        match guard[i].as_mut().map(|c| c.try_wait()) {
                            Some(Ok(None)) => continue,
                            _ => {
                                guard[i] = None;
                                break;
                            }
                        }
                    }
                    std::thread::sleep(pause);
                }
            }));
        }
        Ok(SelfPeer { stop, children, loops })
    }
}

impl Drop for SelfPeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // A loop may start one more run before it sees the stop: kill until
        // every loop has ended.
        while !self.loops.iter().all(|l| l.is_finished()) {
            for child in self.children.lock().unwrap_or_else(|e| e.into_inner()).iter_mut().flatten() {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for handle in self.loops.drain(..) {
            let _ = handle.join();
        }
    }
}
