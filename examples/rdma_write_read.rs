//! One-sided RDMA: the server exposes a memory region, and the client
//! writes into it, reads it back and adds to a counter in it, without the
//! server's program taking part.
//!
//! ```text
//! cargo run --example rdma_write_read -- --local 127.0.0.1                # server
//! cargo run --example rdma_write_read -- --local 127.0.0.2 127.0.0.1      # client
//! ```
//!
//! The server registers a buffer with remote rights and sends its address,
//! R_Key and length over TCP along with its QP's endpoint. Each round the
//! client RDMA WRITEs a fresh pattern into the buffer, RDMA READs it back
//! and FETCH_ADDs 1 to the 64-bit counter at its start, checking what each
//! returned. At the end the server checks its own memory too.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use common::{OutOfBand, Result};
use softroce::verbs::{
    Access, CompletionQueue, ConnectOptions, Context, ContextOptions, Endpoint, MemoryRegion, ProtectionDomain, QpCap,
    QpType, QueuePair, SendOp, SendWr, WcOpcode, WcStatus,
};

/// The server's buffer: an 8-byte counter, then the data.
const COUNTER_LEN: usize = 8;

/// The counter starts just under 2^32, so the adds carry into the upper
/// half: atomics work on whole 64-bit words.
const COUNTER_START: u64 = 0xffff_ff00;

const SYNOPSIS: &str = "\
Usage:
  rdma_write_read            start a server and expose a buffer
  rdma_write_read <host>     connect to server at <host> and use its buffer";

fn main() {
    if let Err(e) = run() {
        eprintln!("rdma_write_read: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let opts = common::Options::parse(SYNOPSIS, "", 4096, |_, _| Ok(false));
    let device = common::open_device(&opts)?;
    let ctx = Context::open(
        &device,
        ContextOptions { port: opts.roce_port, busy_poll: opts.busy_poll, ..ContextOptions::default() },
    )?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let cap = QpCap { max_send_wr: 4, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qp = pd.create_qp(QpType::Rc, &cq).cap(cap).build()?;

    let oob = OutOfBand::listen(&opts)?;
    let local = qp.endpoint(opts.gid_index)?;
    common::print_address("local address:", &local);
    let mut stream = oob.connect(&opts)?;
    let remote = local.exchange(&mut stream)?;
    common::print_address("remote address:", &remote);

    if opts.is_client() {
        client(&opts, &pd, &qp, &cq, &remote, &mut stream)
    } else {
        server(&opts, &pd, &qp, &remote, &mut stream)
    }
}

/// Exposes a buffer, then waits for the client to finish and checks it.
fn server(
    opts: &common::Options,
    pd: &ProtectionDomain,
    qp: &QueuePair,
    remote: &Endpoint,
    stream: &mut TcpStream,
) -> Result<()> {
    // Two sets of rights gate a remote access: the QP's (which operations
    // its peer may perform at all) and the region's (which it may perform
    // on this memory). Remote rights on a region need LOCAL_WRITE too.
    let remote_rights = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(COUNTER_LEN + opts.size, Access::LOCAL_WRITE | remote_rights)?;
    mr.write(0, &COUNTER_START.to_ne_bytes())?;
    // As responder, accept two READs or atomics in flight at once.
    let connect = ConnectOptions {
        access: Access::LOCAL_WRITE | remote_rights,
        max_dest_rd_atomic: 2,
        ..ConnectOptions::default()
    };
    qp.connect(remote, &connect)?;

    // Sent only once the QP is connected, so it also says "ready".
    let region = RemoteRegion { addr: mr.addr(), rkey: mr.rkey(), len: mr.len() as u32 };
    stream.write_all(&region.to_bytes())?;
    println!("  local buffer:   addr 0x{:016x}, rkey 0x{:08x}, len {}", region.addr, region.rkey, region.len);

    // The client works on our memory while we wait; nothing happens in
    // this program, and no completion appears on our CQ.
    let mut done = [0u8; 8];
    stream.read_exact(&mut done)?;
    let rounds = u32::from_be_bytes([done[0], done[1], done[2], done[3]]);
    let bytes = u32::from_be_bytes([done[4], done[5], done[6], done[7]]) as usize;
    println!("peer wrote and read back {bytes} bytes {rounds} times");

    let result = check_server_memory(&mr, rounds, bytes);
    stream.write_all(if result.is_ok() { b"Y" } else { b"N" })?;
    let counter = result?;
    println!("checked: the data is the last round's pattern, the counter went 0x{COUNTER_START:x} -> 0x{counter:x}");
    Ok(())
}

/// The last round's pattern must be in the data, and the counter must have
/// grown by one per round. Returns the counter.
fn check_server_memory(mr: &MemoryRegion, rounds: u32, bytes: usize) -> Result<u64> {
    let counter = mr.load_u64(0)?;
    if counter != COUNTER_START + u64::from(rounds) {
        return Err(format!("counter is 0x{counter:x} after {rounds} adds to 0x{COUNTER_START:x}").into());
    }
    let (mut data, mut expected) = (vec![0u8; bytes], vec![0u8; bytes]);
    mr.read(COUNTER_LEN, &mut data)?;
    common::fill_pattern(rounds.wrapping_sub(1), &mut expected);
    if data != expected {
        return Err("the buffer does not hold the last round's pattern".into());
    }
    Ok(counter)
}

fn client(
    opts: &common::Options,
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: &Endpoint,
    stream: &mut TcpStream,
) -> Result<()> {
    // The client only issues requests, so its QP needs no remote rights.
    // Let the READ and the FETCH_ADD of a round be in flight together.
    qp.connect(remote, &ConnectOptions { max_rd_atomic: 2, ..ConnectOptions::default() })?;

    // The server sends its region once its QP is connected: from then on
    // our requests find it ready.
    let mut region = [0u8; RemoteRegion::LEN];
    stream.read_exact(&mut region)?;
    let region = RemoteRegion::from_bytes(&region);
    println!("  remote buffer:  addr 0x{:016x}, rkey 0x{:08x}, len {}", region.addr, region.rkey, region.len);
    let counter_addr = region.addr;
    let data_addr = region.addr + COUNTER_LEN as u64;
    let size = opts.size.min(region.len as usize - COUNTER_LEN);

    // Our buffer: [fetched counter value | pattern to write | data read back].
    // READ and atomic results are written into it, hence LOCAL_WRITE.
    let (fetched, source, read_back) = (0, COUNTER_LEN, COUNTER_LEN + size);
    let mr = pd.alloc_mr(COUNTER_LEN + 2 * size, Access::LOCAL_WRITE)?;

    let mut pattern = vec![0u8; size];
    let mut data = vec![0u8; size];
    let mut first_counter = 0;
    let start = Instant::now();
    for round in 0..opts.iters {
        common::fill_pattern(round, &mut pattern);
        mr.write(source, &pattern)?;

        // Three requests at once. An RC responder executes them in order,
        // so the READ sees what the WRITE wrote.
        let write = SendOp::RdmaWrite { remote_addr: data_addr, rkey: region.rkey };
        qp.post_send(SendWr::new(1, write).with_sge(mr.sge(source, size)))?;
        let read = SendOp::RdmaRead { remote_addr: data_addr, rkey: region.rkey };
        qp.post_send(SendWr::new(2, read).with_sge(mr.sge(read_back, size)))?;
        // The old value of the counter lands in our 8 bytes at `fetched`.
        let add = SendOp::FetchAdd { remote_addr: counter_addr, rkey: region.rkey, add: 1 };
        qp.post_send(SendWr::new(3, add).with_sge(mr.sge(fetched, COUNTER_LEN)))?;

        // Completions come back in the order the requests were posted.
        for (wr_id, opcode) in [(1, WcOpcode::RdmaWrite), (2, WcOpcode::RdmaRead), (3, WcOpcode::FetchAdd)] {
            let wc = cq.wait_one(common::COMPLETION_TIMEOUT).ok_or("timed out waiting for a completion")?;
            if wc.status != WcStatus::Success {
                return Err(
                    format!("Failed status {} ({}) for {:?}", wc.status.as_str(), wc.status as u32, wc.opcode).into()
                );
            }
            if (wc.wr_id, wc.opcode) != (wr_id, opcode) {
                return Err(format!(
                    "round {round}: completion {:?} for wr_id {}, expected {opcode:?}",
                    wc.opcode, wc.wr_id
                )
                .into());
            }
        }

        mr.read(read_back, &mut data)?;
        if data != pattern {
            return Err(format!("round {round}: RDMA READ returned other bytes than the RDMA WRITE wrote").into());
        }
        let old = mr.load_u64(fetched)?;
        if round == 0 {
            first_counter = old;
        } else if old != first_counter + u64::from(round) {
            return Err(format!(
                "round {round}: FETCH_ADD returned 0x{old:x}, expected 0x{:x}",
                first_counter + u64::from(round)
            )
            .into());
        }
    }
    let elapsed = start.elapsed();

    common::print_rate(2 * size as u64 * u64::from(opts.iters), opts.iters, elapsed);
    let last = first_counter + u64::from(opts.iters);
    println!(
        "checked: each RDMA READ returned what the RDMA WRITE before it wrote; FETCH_ADD took the counter from 0x{first_counter:x} to 0x{last:x}"
    );

    // Tell the server we are done, and hear what it found.
    let mut done = [0u8; 8];
    done[..4].copy_from_slice(&opts.iters.to_be_bytes());
    done[4..].copy_from_slice(&(size as u32).to_be_bytes());
    stream.write_all(&done)?;
    let mut verdict = [0u8; 1];
    stream.read_exact(&mut verdict)?;
    if verdict != *b"Y" {
        return Err("the server found its memory wrong".into());
    }
    println!("server checked its memory: ok");
    Ok(())
}

/// What a peer needs to reach a memory region: its address, R_Key and
/// length. 16 bytes on the wire, big-endian.
#[derive(Debug, Clone, Copy)]
struct RemoteRegion {
    addr: u64,
    rkey: u32,
    len: u32,
}

impl RemoteRegion {
    const LEN: usize = 16;

    fn to_bytes(self) -> [u8; RemoteRegion::LEN] {
        let mut b = [0u8; RemoteRegion::LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    fn from_bytes(b: &[u8; RemoteRegion::LEN]) -> RemoteRegion {
        RemoteRegion {
            addr: u64::from_be_bytes(b[..8].try_into().unwrap()),
            rkey: u32::from_be_bytes(b[8..12].try_into().unwrap()),
            len: u32::from_be_bytes(b[12..].try_into().unwrap()),
        }
    }
}
