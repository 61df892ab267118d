//! `ibv_rc_pingpong` in Rust: two processes bounce a message back and forth
//! over a Reliable Connected queue pair, and report bandwidth and latency.
//!
//! ```text
//! cargo run --example rc_pingpong -- --local 127.0.0.1                  # server
//! cargo run --example rc_pingpong -- --local 127.0.0.2 127.0.0.1 -c     # client
//! ```
//!
//! The steps are those of the C program: open a device, allocate a PD,
//! register a buffer, create a CQ and an RC QP, swap QP number, PSN and GID
//! over TCP, connect the QP and post receives, then let the client send
//! first and each side answer every message it receives.

mod common;

use std::time::Instant;

use common::{OutOfBand, Result};
use softroce::verbs::{
    Access, ConnectOptions, Context, ContextOptions, MemoryRegion, Mtu, QpCap, QpType, QueuePair, RecvWr, SendOp,
    SendWr, WcStatus,
};

/// Work request ids: a completion's `wr_id` says which kind it is.
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

const SYNOPSIS: &str = "\
Usage:
  rc_pingpong            start a server and wait for connection
  rc_pingpong <host>     connect to server at <host>";

const EXTRA_HELP: &str = "  -m, --mtu=<size>       path MTU (default the port's active MTU)
  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
  -e, --events           sleep on CQ events (default: block on the CQ)
  -c, --check            check the data of every message received";

fn main() {
    if let Err(e) = run() {
        eprintln!("rc_pingpong: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let (mut mtu, mut rx_depth, mut use_events, mut check) = (None, 500u32, false, false);
    let opts = common::Options::parse(SYNOPSIS, EXTRA_HELP, 4096, |flag, args| {
        match flag {
            "-m" | "--mtu" => {
                let bytes: usize = args.value(flag)?;
                let exact = Mtu::from_bytes(bytes).filter(|m| m.bytes() == bytes);
                mtu = Some(exact.ok_or_else(|| format!("--mtu {bytes}: not 256, 512, 1024, 2048 or 4096"))?);
            }
            "-r" | "--rx-depth" => rx_depth = args.value(flag)?,
            "-e" | "--events" => use_events = true,
            "-c" | "--check" | "--chk" => check = true,
            _ => return Ok(false),
        }
        Ok(true)
    });
    if rx_depth < 2 {
        return Err("--rx-depth must be at least 2".into());
    }
    let (size, iters) = (opts.size, opts.iters);

    // The device, and a context on it: this starts the engine thread that
    // moves packets between the UDP socket and the queue pairs.
    let device = common::open_device(&opts)?;
    let ctx = Context::open(
        &device,
        ContextOptions { port: opts.roce_port, busy_poll: opts.busy_poll, ..ContextOptions::default() },
    )?;
    let channel = if use_events { Some(ctx.create_comp_channel()?) } else { None };
    let pd = ctx.alloc_pd()?;

    // One registered buffer: the message we send at offset 0, the one we
    // receive at offset `size`. Sends and receives only need local rights.
    let mr = pd.alloc_mr(2 * size, Access::LOCAL_WRITE)?;
    mr.write(0, &vec![0x7b; size])?;

    // One CQ for both queues, with room for every receive and the send.
    let cq = ctx.create_cq(rx_depth as usize + 1, channel.as_ref())?;
    let cap = QpCap { max_send_wr: 1, max_recv_wr: rx_depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qp = pd.create_qp(QpType::Rc, &cq).cap(cap).build()?;
    if channel.is_some() {
        // Ask for an event on the next completion (each wait re-arms).
        cq.req_notify(false);
    }

    // What the peer needs to reach this QP: QP number, first PSN and GID.
    let oob = OutOfBand::listen(&opts)?;
    let local = qp.endpoint(opts.gid_index)?;
    common::print_address("local address:", &local);

    let mut stream = oob.connect(&opts)?;
    let remote = local.exchange(&mut stream)?;
    common::print_address("remote address:", &remote);

    // RESET -> INIT -> RTR -> RTS, with the C program's attributes. Receives
    // can be posted from INIT on; posting them before the sync below means
    // the peer's first message always finds one.
    qp.connect(&remote, &ConnectOptions { mtu, ..ConnectOptions::default() })?;
    let mut routs = post_receives(&qp, &mr, size, rx_depth)?;
    common::sync(&mut stream)?;

    // `pending` holds the ids still to complete before the next send: a
    // side sends again only when its last send is done and the answer came.
    let mut pending = RECV_WRID;
    if opts.is_client() {
        post_send(&qp, &mr, size, check.then_some(0))?;
        pending |= SEND_WRID;
    }

    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wcs = Vec::new();
    while rcnt < iters || scnt < iters {
        common::wait_completions(&cq, channel.as_ref(), &mut wcs)?;
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                let status = wc.status;
                return Err(
                    format!("Failed status {} ({}) for wr_id {}", status.as_str(), status as u32, wc.wr_id).into()
                );
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if check {
                        check_message(&mr, size, rcnt, wc.byte_len)?;
                    }
                    // Top the receive queue up before it runs dry.
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_receives(&qp, &mr, size, rx_depth - routs)?;
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}").into()),
            }
            pending &= !wc.wr_id;
            if scnt < iters && pending == 0 {
                post_send(&qp, &mr, size, check.then_some(scnt))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let elapsed = start.elapsed();

    common::print_rate(size as u64 * u64::from(iters) * 2, iters, elapsed);
    Ok(())
}

/// Posts `n` receives, each for a whole message into the receive half of
/// the buffer. Returns `n`.
fn post_receives(qp: &QueuePair, mr: &MemoryRegion, size: usize, n: u32) -> Result<u32> {
    for _ in 0..n {
        qp.post_recv(RecvWr { wr_id: RECV_WRID, sg_list: softroce::sg_list![mr.sge(size, size)] })?;
    }
    Ok(n)
}

/// Sends the message in the first half of the buffer; with `--check`, first
/// fills it with the pattern of message number `seq`.
fn post_send(qp: &QueuePair, mr: &MemoryRegion, size: usize, seq: Option<u32>) -> Result<()> {
    if let Some(seq) = seq {
        let mut message = vec![0u8; size];
        common::fill_pattern(seq, &mut message);
        mr.write(0, &message)?;
    }
    // `SendWr::new` is signaled: every send completes on the CQ.
    qp.post_send(SendWr::new(SEND_WRID, SendOp::Send).with_sge(mr.sge(0, size)))?;
    Ok(())
}

/// Checks that received message number `seq` is whole and holds its pattern.
fn check_message(mr: &MemoryRegion, size: usize, seq: u32, byte_len: u32) -> Result<()> {
    if byte_len as usize != size {
        return Err(format!("message {seq}: received {byte_len} bytes, expected {size}").into());
    }
    let (mut got, mut expected) = (vec![0u8; size], vec![0u8; size]);
    mr.read(size, &mut got)?;
    common::fill_pattern(seq, &mut expected);
    match got.iter().zip(&expected).position(|(a, b)| a != b) {
        Some(at) => Err(format!("message {seq}: byte {at} is {:#04x}, expected {:#04x}", got[at], expected[at]).into()),
        None => Ok(()),
    }
}
