//! The stock programs on the peer, and how we talk to them: perftest's TCP
//! exchange gives us QPs that the peer has connected to QPs we only pretend
//! to have. Against a server (`ib_write_bw` and friends without a host) we
//! are the client and get its responders to probe; against a client we are
//! the server and its requesters come to us.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softroce::verbs::Gid;

use crate::cli::Fail;
use crate::perf::proto::{BwReport, Comm, KeyMsg};

/// A perftest program the peer runs, and the flow of its exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `ib_write_bw`.
    Write,
    /// `ib_read_bw`.
    Read,
    /// `ib_atomic_bw`.
    Atomic,
    /// `ib_send_bw`.
    Send,
}

impl Program {
    /// The servers, in the order of their TCP ports from `--port`.
    pub const SERVERS: [Program; 4] = [Program::Write, Program::Read, Program::Atomic, Program::Send];

    /// The QPs its server runs with (`-q`), as `softroce conform --help` asks.
    pub fn server_qps(self) -> usize {
        match self {
            Program::Write => 16,
            Program::Read => 10,
            Program::Atomic | Program::Send => 8,
        }
    }

    /// `softroce perf`'s name for the test.
    pub fn test(self) -> &'static str {
        match self {
            Program::Write => "write",
            Program::Read => "read",
            Program::Atomic => "atomic",
            Program::Send => "send",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Program::Write => "ib_write_bw",
            Program::Read => "ib_read_bw",
            Program::Atomic => "ib_atomic_bw",
            Program::Send => "ib_send_bw",
        }
    }
}

/// One of the peer's QPs, connected to a QP number of ours that exists only
/// in the probe.
#[derive(Debug, Clone, Copy)]
pub struct Remote {
    /// Our QP number: the peer sends to it.
    pub ours: u32,
    /// The peer's QP number.
    pub qpn: u32,
    /// The PSN the peer's responder expects first (we chose it).
    pub psn: u32,
    /// The PSN the peer's requester starts at.
    pub peer_psn: u32,
    /// The peer's buffer for this QP.
    pub rkey: u32,
    pub vaddr: u64,
}

/// Our QP numbers: unique in a run, so a late packet of an earlier check
/// never lands in a later one.
pub struct QpNumbers(u32);

impl QpNumbers {
    pub fn new() -> QpNumbers {
        QpNumbers(0x00c0_0000)
    }

    fn next(&mut self) -> u32 {
        self.0 += 1;
        self.0 & 0x00ff_ffff
    }
}

/// The first PSN we announce for QP `i` of a session: the first is close to
/// the 2^24 wrap, for the checks that cross it; the others are spread out.
fn first_psn(i: usize) -> u32 {
    if i == 0 {
        0x00ff_fffd
    } else {
        (0x1000 * i as u32 + 0x123) & 0x00ff_ffff
    }
}

/// How the exchange goes, as far as the programs' messages.
pub struct Setup {
    pub local: IpAddr,
    pub mtu: u32,
    pub timeout: Duration,
}

fn key(ours: u32, psn: u32, local: IpAddr) -> KeyMsg {
    KeyMsg { lid: 0, out_reads: 16, qpn: ours, psn, rkey: 0, vaddr: 0, gid: Gid::from_ip(local).to_bytes(), srqn: 0 }
}

/// The perftest preamble: versions, page and cache line sizes, MTU.
fn preamble(comm: &mut Comm, mtu: u32) -> Result<u32, Fail> {
    comm.exchange_versions()?;
    comm.exchange_sys_data(4096, 64)?;
    comm.exchange_mtu(mtu)
}

/// A session with a perftest server: its QPs, ready to be probed.
pub struct ServerSession {
    comm: Comm,
    program: Program,
    mine: Vec<KeyMsg>,
    pub qps: Vec<Remote>,
    /// Path MTU in bytes.
    pub mtu: usize,
}

impl ServerSession {
    /// Connects to the server of `program` at `peer:port` (trying until
    /// `setup.timeout`, as the peer's loop may be restarting it) and
    /// exchanges `n` QPs.
    pub fn connect(
        program: Program,
        peer: SocketAddr,
        n: usize,
        setup: &Setup,
        numbers: &mut QpNumbers,
    ) -> Result<ServerSession, Fail> {
        let deadline = Instant::now() + setup.timeout;
        let stream = loop {
            match TcpStream::connect_timeout(&peer, Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(Fail(format!("no {} server at {peer}: {e}", program.name())));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let mut comm = Comm::new(stream, true, Some(setup.timeout))?;
        let mtu = preamble(&mut comm, setup.mtu)?;
        let mine: Vec<KeyMsg> = (0..n).map(|i| key(numbers.next(), first_psn(i), setup.local)).collect();
        let theirs = exchange(&mut comm, &mine)?;
        if program == Program::Send {
            comm.hand_shake(&mine[0])?;
            exchange(&mut comm, &mine)?;
            // The server has posted its receives after this one.
            comm.hand_shake(&mine[0])?;
        } else {
            exchange(&mut comm, &mine)?;
            // "An additional handshake is required after moving qp to RTR."
            comm.hand_shake(&mine[0])?;
        }
        let qps = remotes(&mine, &theirs);
        let mtu = 128usize << mtu.clamp(1, 5);
        Ok(ServerSession { comm, program, mine, qps, mtu })
    }

    pub fn is_send(&self) -> bool {
        self.program == Program::Send
    }

    /// Ends the run as a client would (RDMA tests: the last handshake, the
    /// report, "done"), so the server exits and its loop starts the next.
    /// A SEND server waits for its messages instead: its QPs must have been
    /// put in error first, which ends it.
    pub fn finish(mut self) {
        if self.program != Program::Send {
            let _ = self.comm.hand_shake(&self.mine[0]);
            let _ = self.comm.exchange_bw_reports(&BwReport::default());
            let _ = self.comm.close(&self.mine[0]);
        }
    }
}

/// The peer's QPs, each with the QP of ours it connected to.
fn remotes(mine: &[KeyMsg], theirs: &[KeyMsg]) -> Vec<Remote> {
    mine.iter()
        .zip(theirs)
        .map(|(m, t)| Remote { ours: m.qpn, qpn: t.qpn, psn: m.psn, peer_psn: t.psn, rkey: t.rkey, vaddr: t.vaddr })
        .collect()
}

fn exchange(comm: &mut Comm, mine: &[KeyMsg]) -> Result<Vec<KeyMsg>, Fail> {
    mine.iter().map(|m| comm.hand_shake(m)).collect()
}

/// A session with a perftest client, which we serve: its requesters send
/// to us. The exchange's end runs on its own thread while the probe answers.
pub struct ClientSession {
    pub qps: Vec<Remote>,
    pub mtu: usize,
    done: std::thread::JoinHandle<Result<(), Fail>>,
}

impl ClientSession {
    /// Waits on `listener` (until `setup.timeout`) for a client with `n` QPs.
    pub fn accept(
        listener: &TcpListener,
        n: usize,
        setup: &Setup,
        numbers: &mut QpNumbers,
    ) -> Result<ClientSession, Fail> {
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + setup.timeout;
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(Fail(format!(
                        "no client came to {} within {:?}",
                        listener.local_addr()?,
                        setup.timeout
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        };
        stream.set_nonblocking(false)?;
        let mut comm = Comm::new(stream, false, Some(setup.timeout))?;
        let mtu = preamble(&mut comm, setup.mtu)?;
        let mine: Vec<KeyMsg> = (0..n).map(|i| key(numbers.next(), first_psn(i + 1), setup.local)).collect();
        let theirs = exchange(&mut comm, &mine)?;
        exchange(&mut comm, &mine)?;
        comm.hand_shake(&mine[0])?;
        let qps = remotes(&mine, &theirs);
        let first = mine[0];
        // The client's end: a handshake, its report, "done"; a client that
        // fails never sends them, and the read times out or sees EOF.
        let done = std::thread::spawn(move || {
            comm.hand_shake(&first)?;
            comm.exchange_bw_reports(&BwReport::default())?;
            comm.close(&first)
        });
        Ok(ClientSession { qps, mtu: 128usize << mtu.clamp(1, 5), done })
    }

    /// Whether the client has finished its run (cleanly or not).
    pub fn finished(&self) -> bool {
        self.done.is_finished()
    }
}
