//! The programs of `docs/tutorial.md`: a first RDMA program, one step at a
//! time, meant to be run under a trace so that every call can be seen next
//! to the packets it puts on the wire.
//!
//! ```text
//! cargo build --release -p softroce-tools --example tutorial
//! target/release/softroce run --trace send.txt -- target/release/examples/tutorial send
//! ```
//!
//! Steps: `send`, `write`, `read`, `atomic`, `rnr`, `loss`. Each opens two
//! devices in this one process, "alice" on 127.0.0.1 and "bob" on 127.0.0.2,
//! connects an RC QP on each to the other, does its one thing and checks the
//! result. Two devices in one process keep the program short; split in two
//! programs, the only change is that the two endpoints travel over a socket
//! (as in `examples/rc_pingpong.rs`).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use softroce::verbs::{
    Access, CompletionQueue, ConnectOptions, Context, ContextOptions, Device, MemoryRegion, ProtectionDomain, QpType,
    QueuePair, RecvWr, SendOp, SendWr, WcStatus, WorkCompletion,
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Long enough for a loaded machine; a step that takes longer is broken.
const WAIT: Duration = Duration::from_secs(10);

/// What each device has after setup: the objects of the classic first program.
struct Side {
    // Dropped in this order: QP before the CQ and memory it uses.
    qp: QueuePair,
    mr: MemoryRegion,
    cq: CompletionQueue,
    _pd: ProtectionDomain,
    ctx: Context,
}

/// Opens a device on `addr`, allocates a PD, a CQ, an RC QP and 4 KiB of
/// registered memory that the peer may write, read and use atomically.
fn side(name: &str, addr: &str, mac_tail: u8, corrupt_every: u32) -> Result<Side> {
    let addr: IpAddr = addr.parse()?;
    let device = Device::custom(name, vec![addr], [2, 0, 0, 0, 0, mac_tail], 1500);
    let ctx =
        Context::open(&device, ContextOptions { corrupt_icrc_every: corrupt_every, ..ContextOptions::default() })?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let qp = pd.create_qp(QpType::Rc, &cq).build()?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(4096, access)?;
    Ok(Side { qp, mr, cq, _pd: pd, ctx })
}

/// Two connected sides: each QP learns the other's number, first PSN and
/// GID (its endpoint) and goes INIT, RTR, RTS. `corrupt_every` makes
/// alice send every so many packets with a wrong ICRC (0: none).
fn pair(corrupt_every: u32) -> Result<(Side, Side)> {
    let alice = side("alice", "127.0.0.1", 1, corrupt_every)?;
    let bob = side("bob", "127.0.0.2", 2, 0)?;
    let (to_alice, to_bob) = (alice.qp.endpoint(1)?, bob.qp.endpoint(1)?);
    let options = ConnectOptions { access: alice.mr.access(), ..ConnectOptions::default() };
    alice.qp.connect(&to_bob, &options)?;
    bob.qp.connect(&to_alice, &options)?;
    Ok((alice, bob))
}

/// The next completion of `cq`, which must be a success.
fn completion(cq: &CompletionQueue) -> Result<WorkCompletion> {
    let wc = cq.wait_one(WAIT).ok_or("no completion came")?;
    if wc.status != WcStatus::Success {
        return Err(format!("work request {} failed: {}", wc.wr_id, wc.status.as_str()).into());
    }
    Ok(wc)
}

/// SEND: bob posts a receive, alice sends into it.
fn send() -> Result<()> {
    let (alice, bob) = pair(0)?;
    let message = b"Hello, RDMA!";
    bob.qp.post_recv(RecvWr { wr_id: 1, sg_list: softroce::sg_list![bob.mr.sge(0, 4096)] })?;
    alice.mr.write(0, message)?;
    alice.qp.post_send(SendWr::new(2, SendOp::Send).with_sge(alice.mr.sge(0, message.len())))?;
    completion(&alice.cq)?;
    let received = completion(&bob.cq)?;
    let mut got = vec![0; received.byte_len as usize];
    bob.mr.read(0, &mut got)?;
    println!("send: bob received {:?}", String::from_utf8_lossy(&got));
    Ok(())
}

/// RDMA WRITE: alice writes 3000 bytes straight into bob's memory; bob's
/// program posts nothing and gets no completion.
fn write() -> Result<()> {
    let (alice, bob) = pair(0)?;
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    alice.mr.write(0, &data)?;
    let op = SendOp::RdmaWrite { remote_addr: bob.mr.addr(), rkey: bob.mr.rkey() };
    alice.qp.post_send(SendWr::new(3, op).with_sge(alice.mr.sge(0, data.len())))?;
    completion(&alice.cq)?;
    let mut landed = vec![0; data.len()];
    bob.mr.read(0, &mut landed)?;
    check(landed == data, "the written bytes are not in bob's memory")?;
    println!("write: {} bytes landed in bob's memory; bob's CQ is empty: {}", data.len(), bob.cq.is_empty());
    Ok(())
}

/// RDMA READ: alice reads bytes of bob's memory into hers.
fn read() -> Result<()> {
    let (alice, bob) = pair(0)?;
    let text = b"bob's memory, read by alice without bob's program doing anything";
    bob.mr.write(0, text)?;
    let op = SendOp::RdmaRead { remote_addr: bob.mr.addr(), rkey: bob.mr.rkey() };
    alice.qp.post_send(SendWr::new(4, op).with_sge(alice.mr.sge(0, text.len())))?;
    completion(&alice.cq)?;
    let mut got = vec![0; text.len()];
    alice.mr.read(0, &mut got)?;
    println!("read: alice read {:?}", String::from_utf8_lossy(&got));
    Ok(())
}

/// ATOMIC FETCH_AND_ADD: alice adds 5 to a counter in bob's memory and gets
/// the value it had.
fn atomic() -> Result<()> {
    let (alice, bob) = pair(0)?;
    bob.mr.write(0, &40u64.to_ne_bytes())?;
    let op = SendOp::FetchAdd { remote_addr: bob.mr.addr(), rkey: bob.mr.rkey(), add: 5 };
    alice.qp.post_send(SendWr::new(5, op).with_sge(alice.mr.sge(0, 8)))?;
    completion(&alice.cq)?;
    let (before, after) = (alice.mr.load_u64(0)?, bob.mr.load_u64(0)?);
    check(before == 40 && after == 45, "the counter did not go from 40 to 45")?;
    println!("atomic: the counter was {before}, is now {after}");
    Ok(())
}

/// RNR: alice sends before bob has posted a receive. Bob answers "receiver
/// not ready"; alice waits and tries again until bob's receive is there.
fn rnr() -> Result<()> {
    let (alice, bob) = pair(0)?;
    alice.mr.write(0, b"too early")?;
    alice.qp.post_send(SendWr::new(6, SendOp::Send).with_sge(alice.mr.sge(0, 9)))?;
    // Bob posts his receive only once his device has said "not ready": on
    // a busy machine the SEND may take longer than any fixed sleep.
    let since = Instant::now();
    while bob.ctx.counters().qp.rnr_naks_sent == 0 {
        check(since.elapsed() < WAIT, "bob's device sent no RNR NAK")?;
        std::thread::sleep(Duration::from_millis(1));
    }
    bob.qp.post_recv(RecvWr { wr_id: 7, sg_list: softroce::sg_list![bob.mr.sge(0, 4096)] })?;
    completion(&alice.cq)?;
    let received = completion(&bob.cq)?;
    println!("rnr: bob received {} bytes once it had posted a receive", received.byte_len);
    Ok(())
}

/// A lost packet: alice's device sends every third packet with a wrong
/// ICRC, which bob's device drops as if the network had lost it. Alice
/// WRITEs four packets' worth; the third is lost, bob asks for it again
/// with a NAK, and the resent fourth is lost too, which alice's ACK timer
/// catches.
fn loss() -> Result<()> {
    let (alice, bob) = pair(3)?;
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
    alice.mr.write(0, &data)?;
    let op = SendOp::RdmaWrite { remote_addr: bob.mr.addr(), rkey: bob.mr.rkey() };
    alice.qp.post_send(SendWr::new(8, op).with_sge(alice.mr.sge(0, data.len())))?;
    completion(&alice.cq)?;
    let mut landed = vec![0; data.len()];
    bob.mr.read(0, &mut landed)?;
    check(landed == data, "the written bytes are not in bob's memory")?;
    println!("loss: all {} bytes arrived despite the lost packets", data.len());
    Ok(())
}

fn check(ok: bool, what: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn main() {
    let step = std::env::args().nth(1).unwrap_or_default();
    let result = match step.as_str() {
        "send" => send(),
        "write" => write(),
        "read" => read(),
        "atomic" => atomic(),
        "rnr" => rnr(),
        "loss" => loss(),
        _ => {
            eprintln!("usage: tutorial send|write|read|atomic|rnr|loss");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("tutorial {step}: {e}");
        std::process::exit(1);
    }
}
