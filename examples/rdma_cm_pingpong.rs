//! rping's ping-pong over rdma_cm: a client connects to a server by IP
//! address and port, and they bounce a message back and forth over the
//! connected RC QP, with SENDs and an RDMA WRITE.
//!
//! ```text
//! cargo run --example rdma_cm_pingpong -- server 127.0.0.1:7471
//! cargo run --example rdma_cm_pingpong -- client 127.0.0.1:7471 [rounds]
//! ```
//!
//! The RoCE UDP port is 4791, or `SOFTROCE_PORT`. Each round, the client
//! SENDs "ping N"; the server RDMA WRITEs those bytes back into the
//! client's buffer (whose address and R_Key came in the connect request's
//! private data) and then SENDs "pong N", which reaches the client after
//! the WRITE has landed. The client then says "bye" and disconnects.

use std::error::Error;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use softroce::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
use softroce::verbs::{
    Access, CompletionQueue, MemoryRegion, QpType, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// How long any step may take.
const STEP: Duration = Duration::from_secs(10);
/// The buffer: received messages at 0, the echo written at ECHO, SENDs
/// taken from OUT and RDMA WRITEs from WRITTEN. Two sources, as the QP
/// reads a request's bytes when it sends it, after later posts may have
/// rewritten a shared one.
const BUFFER: usize = 4096;
const ECHO: usize = 1024;
const OUT: usize = 2048;
const WRITTEN: usize = 3072;

/// The client's last message, before it disconnects.
const BYE: &[u8] = b"bye";

const USAGE: &str = "usage: rdma_cm_pingpong server ADDR:PORT | client ADDR:PORT [ROUNDS]";

fn main() {
    if let Err(e) = run() {
        eprintln!("rdma_cm_pingpong: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr: SocketAddr = args.get(1).ok_or(USAGE)?.parse()?;
    match args[0].as_str() {
        "server" => server(addr),
        "client" => client(addr, args.get(2).map_or(Ok(10), |n| n.parse())?),
        _ => Err(USAGE.into()),
    }
}

/// The next event, which must be `kind`.
fn expect(channel: &EventChannel, kind: CmEventKind) -> Result<CmEvent> {
    let event = channel.get_event(Some(STEP)).ok_or_else(|| format!("no event while waiting for {kind:?}"))?;
    if event.kind != kind || event.status != 0 {
        return Err(format!("{:?} (status {}) while waiting for {kind:?}", event.kind, event.status).into());
    }
    Ok(event)
}

/// What each side sets up on its id's context: a buffer peers may write,
/// a CQ, and the QP the CM connects.
struct Connection {
    id: CmId,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

impl Connection {
    fn new(id: CmId) -> Result<Connection> {
        let context = id.context().ok_or("the id has no device")?;
        let pd = context.alloc_pd()?;
        let mr = pd.alloc_mr(BUFFER, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        let cq = context.create_cq(16, None)?;
        let qp = id.create_qp(pd.create_qp(QpType::Rc, &cq))?;
        qp.post_recv(RecvWr { wr_id: 0, sg_list: softroce::sg_list![mr.sge(0, ECHO)] })?;
        Ok(Connection { id, mr, cq, qp })
    }

    /// Where peers write to us: address and R_Key, for the private data.
    fn region(&self) -> Vec<u8> {
        let mut data = (self.mr.addr() + ECHO as u64).to_be_bytes().to_vec();
        data.extend_from_slice(&self.mr.rkey().to_be_bytes());
        data
    }

    fn params(&self) -> ConnParam {
        let (responder_resources, initiator_depth, retry_count, rnr_retry_count) = (1, 1, 7, 7);
        ConnParam {
            private_data: self.region(),
            responder_resources,
            initiator_depth,
            retry_count,
            rnr_retry_count,
            ..ConnParam::default()
        }
    }

    /// Waits for the next completion of `opcode`.
    fn complete(&self, opcode: WcOpcode) -> Result<u32> {
        let wc = self.cq.wait_one(STEP).ok_or_else(|| format!("no {opcode:?} completion"))?;
        if wc.status != WcStatus::Success || wc.opcode != opcode {
            return Err(format!("{:?} completed with {:?}, waiting for {opcode:?}", wc.opcode, wc.status).into());
        }
        Ok(wc.byte_len)
    }

    /// The message received next (reposting its receive).
    fn receive(&self) -> Result<Vec<u8>> {
        let len = self.complete(WcOpcode::Recv)? as usize;
        let mut message = vec![0; len];
        self.mr.read(0, &mut message)?;
        self.qp.post_recv(RecvWr { wr_id: 0, sg_list: softroce::sg_list![self.mr.sge(0, ECHO)] })?;
        Ok(message)
    }

    /// Posts `op` with `data`. Unsignaled: the answer to a message is what
    /// says it arrived, and a completion could come after that answer's.
    fn post(&self, op: SendOp, data: &[u8]) -> Result<()> {
        let source = if matches!(op, SendOp::RdmaWrite { .. }) { WRITTEN } else { OUT };
        self.mr.write(source, data)?;
        let mut wr = SendWr::new(1, op).with_sge(self.mr.sge(source, data.len()));
        wr.flags.signaled = false;
        self.qp.post_send(wr)?;
        Ok(())
    }
}

/// The peer's buffer from its private data.
fn peer_region(private_data: &[u8]) -> Result<(u64, u32)> {
    let addr = private_data.get(..8).ok_or("short private data")?;
    let rkey = private_data.get(8..12).ok_or("short private data")?;
    Ok((u64::from_be_bytes(addr.try_into()?), u32::from_be_bytes(rkey.try_into()?)))
}

fn server(addr: SocketAddr) -> Result<()> {
    let channel = EventChannel::new()?;
    let listener = CmId::new(&channel, PortSpace::Tcp)?;
    listener.bind_addr(addr)?;
    listener.listen(1)?;
    println!("listening on {addr}");
    let request = channel.get_event(None).ok_or("no connect request")?;
    if request.kind != CmEventKind::ConnectRequest {
        return Err(format!("{:?} while listening", request.kind).into());
    }
    let (remote_addr, rkey) = peer_region(&request.conn.as_ref().ok_or("a request without parameters")?.private_data)?;
    let connection = Connection::new(request.id)?;
    connection.id.accept(&connection.params())?;
    expect(&channel, CmEventKind::Established)?;
    println!("connected to {}", connection.id.peer_addr().ok_or("no peer")?);

    let mut rounds = 0;
    loop {
        let ping = connection.receive()?;
        if ping == BYE {
            break;
        }
        // The SEND goes after the WRITE: when it arrives, the echo is there.
        connection.post(SendOp::RdmaWrite { remote_addr, rkey }, &ping)?;
        connection.post(SendOp::Send, &answer(&ping))?;
        rounds += 1;
    }
    expect(&channel, CmEventKind::Disconnected)?;
    connection.id.disconnect()?;
    println!("{rounds} rounds; disconnected");
    Ok(())
}

fn client(addr: SocketAddr, rounds: u32) -> Result<()> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel, PortSpace::Tcp)?;
    let start = Instant::now();
    id.resolve_addr(None, addr, STEP)?;
    expect(&channel, CmEventKind::AddrResolved)?;
    id.resolve_route(STEP)?;
    expect(&channel, CmEventKind::RouteResolved)?;
    let connection = Connection::new(id)?;
    connection.id.connect(&connection.params())?;
    let established = expect(&channel, CmEventKind::Established)?;
    let setup = start.elapsed();
    let (remote_addr, rkey) = peer_region(&established.conn.ok_or("no REP parameters")?.private_data)?;
    println!("connected to {addr} in {setup:.1?}; the server's buffer is at {remote_addr:#x}, R_Key {rkey:#x}");

    let start = Instant::now();
    for round in 0..rounds {
        let ping = format!("ping {round}");
        connection.post(SendOp::Send, ping.as_bytes())?;
        let pong = connection.receive()?;
        let mut echo = vec![0; ping.len()];
        connection.mr.read(ECHO, &mut echo)?;
        if echo != ping.as_bytes() || pong != format!("pong {round}").as_bytes() {
            return Err(format!("round {round}: echo {echo:?}, answer {pong:?}").into());
        }
    }
    let elapsed = start.elapsed();
    println!("{rounds} rounds in {elapsed:.1?}: {:.1?} a round trip", elapsed / rounds.max(1));
    // Signaled: disconnecting flushes what the QP has not sent yet.
    connection.mr.write(OUT, BYE)?;
    connection.qp.post_send(SendWr::new(1, SendOp::Send).with_sge(connection.mr.sge(OUT, BYE.len())))?;
    connection.complete(WcOpcode::Send)?;
    connection.id.disconnect()?;
    expect(&channel, CmEventKind::Disconnected)?;
    println!("disconnected");
    Ok(())
}

/// "pong N" for "ping N".
fn answer(ping: &[u8]) -> Vec<u8> {
    match ping.strip_prefix(b"ping") {
        Some(round) => [b"pong", round].concat(),
        None => ping.to_vec(),
    }
}
