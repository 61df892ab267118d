//! `ibv_ud_pingpong` in Rust: the ping-pong of `rc_pingpong` over an
//! Unreliable Datagram queue pair.
//!
//! ```text
//! cargo run --example ud_pingpong -- --local 127.0.0.1                  # server
//! cargo run --example ud_pingpong -- --local 127.0.0.2 127.0.0.1 -c     # client
//! ```
//!
//! What changes from RC: a UD QP is never connected to a peer. Each send
//! names its destination through an address handle (the peer's GID) plus the
//! peer's QP number and Q_Key; a message must fit in one packet (the port's
//! MTU); and every receive buffer starts with 40 bytes where the Global
//! Route Header of the packet is placed, so the data lands after it.

mod common;

use std::time::Instant;

use common::{OutOfBand, Result};
use softroce::verbs::{
    Access, Context, ContextOptions, MemoryRegion, QpCap, QpType, QueuePair, RecvWr, SendOp, SendWr, UdDest, WcStatus,
    GRH_LEN,
};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Both QPs use this Q_Key; a datagram with another one is dropped.
const QKEY: u32 = 0x1111_1111;

const SYNOPSIS: &str = "\
Usage:
  ud_pingpong            start a server and wait for connection
  ud_pingpong <host>     connect to server at <host>";

const EXTRA_HELP: &str = "  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
  -c, --check            check the data of every message received";

fn main() {
    if let Err(e) = run() {
        eprintln!("ud_pingpong: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let (mut rx_depth, mut check) = (500u32, false);
    let opts = common::Options::parse(SYNOPSIS, EXTRA_HELP, 2048, |flag, args| {
        match flag {
            "-r" | "--rx-depth" => rx_depth = args.value(flag)?,
            "-c" | "--check" | "--chk" => check = true,
            _ => return Ok(false),
        }
        Ok(true)
    });
    if rx_depth < 2 {
        return Err("--rx-depth must be at least 2".into());
    }
    let (size, iters) = (opts.size, opts.iters);

    let device = common::open_device(&opts)?;
    let mtu = device.active_mtu().bytes();
    if size > mtu {
        return Err(format!("Requested size larger than port MTU ({mtu})").into());
    }
    let ctx = Context::open(
        &device,
        ContextOptions { port: opts.roce_port, busy_poll: opts.busy_poll, ..ContextOptions::default() },
    )?;
    let pd = ctx.alloc_pd()?;

    // The buffer: [GRH area | received message][message to send].
    let mr = pd.alloc_mr(GRH_LEN + 2 * size, Access::LOCAL_WRITE)?;
    mr.write(GRH_LEN + size, &vec![0x7b; size])?;

    let cq = ctx.create_cq(rx_depth as usize + 1, None)?;
    let cap = QpCap { max_send_wr: 1, max_recv_wr: rx_depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qp = pd.create_qp(QpType::Ud, &cq).cap(cap).build()?;

    let oob = OutOfBand::listen(&opts)?;
    let local = qp.endpoint(opts.gid_index)?;
    common::print_address("local address:", &local);

    let mut stream = oob.connect(&opts)?;
    let remote = local.exchange(&mut stream)?;
    common::print_address("remote address:", &remote);

    // A UD QP has no peer: it is only made ready (INIT with the Q_Key, RTR,
    // RTS); where datagrams go is the address handle's business.
    qp.activate(QKEY)?;
    let ah = pd.create_ah(remote.gid);
    let dest = ah.ud_dest(remote.qpn, QKEY);
    let mut routs = post_receives(&qp, &mr, size, rx_depth)?;
    // Unlike RC, a datagram that reaches a QP not yet ready is simply lost.
    common::sync(&mut stream)?;

    let mut pending = RECV_WRID;
    if opts.is_client() {
        post_send(&qp, &mr, size, dest, check.then_some(0))?;
        pending |= SEND_WRID;
    }

    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wcs = Vec::new();
    while rcnt < iters || scnt < iters {
        common::wait_completions(&cq, None, &mut wcs)?;
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
                        // A UD completion also says who sent the datagram.
                        if wc.src_qp != remote.qpn || !wc.grh {
                            return Err(format!("message {rcnt} from QP {:#x}, grh {}", wc.src_qp, wc.grh).into());
                        }
                        check_message(&mr, size, rcnt, wc.byte_len)?;
                    }
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
                post_send(&qp, &mr, size, dest, check.then_some(scnt))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let elapsed = start.elapsed();

    common::print_rate(size as u64 * u64::from(iters) * 2, iters, elapsed);
    Ok(())
}

/// Posts `n` receives, each with room for the GRH and a whole message.
fn post_receives(qp: &QueuePair, mr: &MemoryRegion, size: usize, n: u32) -> Result<u32> {
    for _ in 0..n {
        qp.post_recv(RecvWr { wr_id: RECV_WRID, sg_list: softroce::sg_list![mr.sge(0, GRH_LEN + size)] })?;
    }
    Ok(n)
}

/// Sends the message at the end of the buffer to `dest`; with `--check`,
/// first fills it with the pattern of message number `seq`.
fn post_send(qp: &QueuePair, mr: &MemoryRegion, size: usize, dest: UdDest, seq: Option<u32>) -> Result<()> {
    if let Some(seq) = seq {
        let mut message = vec![0u8; size];
        common::fill_pattern(seq, &mut message);
        mr.write(GRH_LEN + size, &message)?;
    }
    let wr = SendWr::new(SEND_WRID, SendOp::Send).with_sge(mr.sge(GRH_LEN + size, size));
    qp.post_send(SendWr { ud: Some(dest), ..wr })?;
    Ok(())
}

/// Checks that received message number `seq` is whole and holds its
/// pattern. The completion's length counts the GRH area too.
fn check_message(mr: &MemoryRegion, size: usize, seq: u32, byte_len: u32) -> Result<()> {
    if byte_len as usize != GRH_LEN + size {
        return Err(format!("message {seq}: received {byte_len} bytes, expected {GRH_LEN} + {size}").into());
    }
    let (mut got, mut expected) = (vec![0u8; size], vec![0u8; size]);
    mr.read(GRH_LEN, &mut got)?;
    common::fill_pattern(seq, &mut expected);
    match got.iter().zip(&expected).position(|(a, b)| a != b) {
        Some(at) => Err(format!("message {seq}: byte {at} is {:#04x}, expected {:#04x}", got[at], expected[at]).into()),
        None => Ok(()),
    }
}
