//! The rows with a second process: an RC WRITE stream from a device of this
//! process to a responder in another (this program run again as the hidden
//! `softroce bench-peer`), either on an address of its own (`procs-write`:
//! 127.0.0.1 to 127.0.0.2, two devices on two addresses, as two processes
//! needed before they could share one) or on the same address and port
//! (`shared-write`: both on 127.0.0.1, one device shared, each packet
//! steered to its QP's process by the port's reuseport group, `net::share`).
//!
//! Both run in one round, in turns, slice by slice: two peers live through
//! the round, one on each address, each on a port of its own with a device
//! of ours to match (so that the two-address peer's port has no third
//! member), and the stream goes to one, then to the other. Whatever the
//! machine's other work does to a round, it does to both alike.
//!
//! A peer opens its device, prints its QP's endpoint and its region on
//! stdout, reads ours from stdin, connects, says `ready`, and lives until
//! its stdin closes. It only responds, so the two rows differ in nothing
//! but where the peer's device is. The CPU time of a slice is all three
//! processes' (a peer out of its turn sleeps).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::Duration;

use softroce::transport::{Mtu, QpType, SendOp};
use softroce::verbs::{CompletionQueue, ContextOptions, Device, Endpoint, QueuePair, RemoteRegion};

use super::rdma::{self, InFlight, Side};
use super::{Case, Measured, Meter, Timing};

/// This process's address, and the two-address peer's.
const HERE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const THERE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Slices of each row in a round: the round's time, cut in turns.
const SLICES: u32 = 5;

/// Our two requesting devices, open from the first such row on, each on a
/// port of its own (not the other rows' devices', whose groups would then
/// count a peer as a member): `alone` talks to the peer on 127.0.0.2,
/// `shared` to the peer that shares its address and port.
pub struct Procs {
    alone: (Side, u16),
    shared: (Side, u16),
    options: ContextOptions,
}

impl Procs {
    pub fn open(options: ContextOptions) -> Result<Procs, String> {
        let open = || -> Result<(Side, u16), String> {
            let mut why = String::new();
            // Another process may take a free port before we bind it: try a few.
            for _ in 0..10 {
                let all = [IpAddr::V4(HERE), IpAddr::V4(THERE)];
                let port = softroce::net::udp::free_port(&all).map_err(|e| format!("no free UDP port: {e}"))?;
                match Side::open(&device("bench_procs", HERE), ContextOptions { port, ..options.clone() }) {
                    Ok(side) => return Ok((side, port)),
                    Err(e) => why = e.to_string(),
                }
            }
            Err(format!("cannot open a requesting device: {why}"))
        };
        Ok(Procs { alone: open()?, shared: open()?, options })
    }

    /// One round of WRITE streams of `case.size` bytes on one QP to each
    /// of two new peer processes, [`SLICES`] slices each in turns (of
    /// `timing` cut as many times): what moved to the peer on 127.0.0.2,
    /// and what moved to the peer beside us on 127.0.0.1.
    pub fn round(&self, case: &Case, timing: &Timing) -> Result<(Measured, Measured), String> {
        let mtu = case.conn.expect("a softroce row").mtu;
        let mut peers = Vec::new();
        for ((side, port), addr) in [(&self.alone, THERE), (&self.shared, HERE)] {
            peers.push((side, Peer::start(addr, *port, &self.options)?));
        }
        let outcome = (|| {
            let mut streams = Vec::new();
            for (side, peer) in &mut peers {
                streams.push(Stream::connect(side, peer, case.size, mtu)?);
            }
            let slice = Timing { warmup: timing.warmup / SLICES, seconds: timing.seconds / SLICES };
            let pids: Vec<u32> = peers.iter().map(|(_, peer)| peer.child.id()).collect();
            let cpu = || super::cpu_time() + pids.iter().map(|&pid| child_cpu_time(pid)).sum::<Duration>();
            let mut runs = [Vec::new(), Vec::new()];
            for k in 0..SLICES as usize {
                // Which goes first alternates too.
                for i in [k % 2, 1 - k % 2] {
                    runs[i].push(streams[i].run(case.size, &slice, &cpu)?);
                }
            }
            let [alone, shared] = runs;
            Ok::<_, String>((Measured::sum(alone), Measured::sum(shared)))
        })();
        let mut ended = Ok(());
        for (_, peer) in peers {
            ended = ended.and(peer.end());
        }
        let measured = outcome?;
        ended?;
        Ok(measured)
    }
}

/// A QP of ours connected to a peer's, and what it writes where.
struct Stream<'a> {
    side: &'a Side,
    cq: CompletionQueue,
    qp: QueuePair,
    op: SendOp,
}

impl Stream<'_> {
    fn connect<'a>(side: &'a Side, peer: &mut Peer, size: usize, mtu: Mtu) -> Result<Stream<'a>, String> {
        let (theirs, region) = peer.endpoint()?;
        let failed = |e: softroce::verbs::Error| format!("connecting to the peer: {e}");
        let cq = side.ctx.create_cq(rdma::CQ_DEPTH, None).map_err(failed)?;
        let qp = side.pd.create_qp(QpType::Rc, &cq).build().map_err(failed)?;
        qp.connect(&theirs, &rdma::connect_options(mtu)).map_err(failed)?;
        peer.connect(&qp.endpoint(rdma::GID_INDEX).map_err(failed)?)?;
        debug_assert!(size <= rdma::SINK_AT);
        let op = SendOp::RdmaWrite { remote_addr: region.addr + rdma::SINK_AT as u64, rkey: region.rkey };
        Ok(Stream { side, cq, qp, op })
    }

    /// One slice: the stream from its start until the meter stops and
    /// what was in flight completes.
    fn run(&self, size: usize, timing: &Timing, cpu: &dyn Fn() -> Duration) -> Result<Measured, String> {
        let local = self.side.mr.sge(rdma::SOURCE_AT, size);
        let retries = self.side.ctx.counters().qp.retries;
        let meter = Meter::default();
        let (window, sent) = std::thread::scope(|s| {
            let sender = s.spawn(|| {
                rdma::post_stream(&[&self.qp], &self.cq, self.op, local, InFlight::for_size(size), false, &meter)
            });
            let window = meter.time_with_cpu(timing, cpu);
            (window, rdma::joined(sender))
        });
        sent?;
        Ok(Measured {
            window,
            rtts: Vec::new(),
            retries: Some(self.side.ctx.counters().qp.retries - retries),
            per_qp: Vec::new(),
        })
    }
}

/// A device on `addr` alone.
fn device(name: &str, addr: Ipv4Addr) -> Device {
    let [.., c, d] = addr.octets();
    Device::custom(name, vec![IpAddr::V4(addr)], [0x02, 0, 0, 0, c, d], rdma::LINK_MTU)
}

/// The peer process and its pipes.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn start(addr: Ipv4Addr, port: u16, options: &ContextOptions) -> Result<Peer, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program to run the peer: {e}"))?;
        let mut command = Command::new(exe);
        command.args(["bench-peer", "--addr", &addr.to_string(), "--port", &port.to_string()]);
        if let Some(bytes) = options.socket_buffer {
            command.args(["--socket-buffer", &bytes.to_string()]);
        }
        if options.busy_poll {
            command.arg("--busy-poll");
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the peer process: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Peer { child, stdin, stdout })
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err("the peer process ended early (its error is above)".to_owned()),
            Ok(_) => Ok(line.trim().to_owned()),
            Err(e) => Err(format!("reading from the peer: {e}")),
        }
    }

    /// The peer's QP and region.
    fn endpoint(&mut self) -> Result<(Endpoint, RemoteRegion), String> {
        let line = self.line()?;
        let parsed = line.split_once(' ').and_then(|(endpoint, region)| {
            let endpoint: [u8; Endpoint::LEN] = unhex(endpoint)?.try_into().ok()?;
            let region: [u8; RemoteRegion::LEN] = unhex(region)?.try_into().ok()?;
            Some((Endpoint::from_bytes(&endpoint), RemoteRegion::from_bytes(&region)))
        });
        parsed.ok_or_else(|| format!("the peer said {line:?}, not its endpoint"))
    }

    /// Gives the peer our QP and waits until its QP is connected.
    fn connect(&mut self, ours: &Endpoint) -> Result<(), String> {
        let stdin = self.stdin.as_mut().expect("open until the end");
        writeln!(stdin, "{}", hex(&ours.to_bytes())).map_err(|e| format!("writing to the peer: {e}"))?;
        match self.line()?.as_str() {
            "ready" => Ok(()),
            other => Err(format!("the peer said {other:?}, not ready")),
        }
    }

    /// Closes the peer's stdin, which ends it, and waits for it.
    fn end(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        let status = self.child.wait().map_err(|e| format!("waiting for the peer: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("the peer process failed: {status}"))
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// CPU time of process `pid`'s threads so far (`/proc/PID/task/*/schedstat`,
/// in ns); zero once it is gone.
fn child_cpu_time(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Duration::ZERO };
    let ns: u64 = tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    Duration::from_nanos(ns)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    text.len()
        .is_multiple_of(2)
        .then(|| (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect())
        .flatten()
}

/// `softroce bench-peer`: the responding side of the two-process rows.
#[derive(clap::Args)]
pub struct PeerArgs {
    /// The address of the peer's device.
    #[arg(long)]
    addr: Ipv4Addr,
    /// The RoCE UDP port.
    #[arg(long)]
    port: u16,
    #[arg(long)]
    socket_buffer: Option<usize>,
    #[arg(long)]
    busy_poll: bool,
}

pub fn peer(args: PeerArgs) -> ExitCode {
    match serve(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce bench-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &PeerArgs) -> Result<(), String> {
    let options = ContextOptions {
        port: args.port,
        busy_poll: args.busy_poll,
        socket_buffer: args.socket_buffer,
        ..ContextOptions::default()
    };
    let failed = |e: softroce::verbs::Error| e.to_string();
    let side = Side::open(&device("bench_peer", args.addr), options).map_err(failed)?;
    let cq = side.ctx.create_cq(rdma::CQ_DEPTH, None).map_err(failed)?;
    let qp = side.pd.create_qp(QpType::Rc, &cq).build().map_err(failed)?;
    let mut stdout = std::io::stdout().lock();
    let ours = qp.endpoint(rdma::GID_INDEX).map_err(failed)?;
    let said = writeln!(stdout, "{} {}", hex(&ours.to_bytes()), hex(&side.mr.remote().to_bytes()));
    said.and_then(|()| stdout.flush()).map_err(|e| e.to_string())?;
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    stdin.read_line(&mut line).map_err(|e| e.to_string())?;
    let theirs: [u8; Endpoint::LEN] =
        unhex(line.trim()).and_then(|b| b.try_into().ok()).ok_or_else(|| format!("not an endpoint: {line:?}"))?;
    qp.connect(&Endpoint::from_bytes(&theirs), &rdma::connect_options(Mtu::Mtu4096)).map_err(failed)?;
    writeln!(stdout, "ready").and_then(|()| stdout.flush()).map_err(|e| e.to_string())?;
    // Respond (the engine does) until the other side closes our stdin.
    let _ = stdin.read_to_end(&mut Vec::new());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(unhex("00ab10"), Some(vec![0, 0xab, 0x10]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn a_process_cpu_time_is_read_from_proc() {
        let mine = child_cpu_time(std::process::id());
        // Burn a little CPU, then see it counted.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        assert!(child_cpu_time(std::process::id()) > mine);
        assert_eq!(child_cpu_time(u32::MAX), Duration::ZERO);
    }
}
