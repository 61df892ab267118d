//! rust-ibverbs-check: programs written against the crates.io `ibverbs`
//! crate (0.9), which links the system `libibverbs.so.1`, run unmodified on
//! softroce through `softroce run`.
//!
//! ```text
//! rust-ibverbs-check loopback          what the crate's examples/loopback.rs does
//! rust-ibverbs-check pair              two QPs of one process connected to each other (RC, then UC)
//! rust-ibverbs-check errors            the crate's error paths give the errno rdma-core on rxe gives
//! rust-ibverbs-check contexts          two contexts of one device open at once, a QP of each connected
//!                                      to the other (as parallel `cargo test` threads each open the device)
//! rust-ibverbs-check parallel          four threads, each opening the device, looping a SEND back and
//!                                      closing it again, ten times (a crate's tests under `cargo test`)
//! rust-ibverbs-check server IP:PORT    one end of an RC connection between two processes
//! rust-ibverbs-check client IP:PORT    the other end; the endpoints cross over TCP
//! ```
//!
//! Every subcommand exits 0 only if every verb succeeded, every completion
//! came with the expected status, opcode, length and QP number, and every
//! byte arrived; polling gives up after ten seconds rather than spinning
//! forever as the example does.

use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ibverbs::{ibv_qp_type, ibv_wc, ibv_wc_opcode, CompletionQueue, Context, QueuePairEndpoint};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Linux's EINVAL, the errno every failure in `errors` should give.
const EINVAL: i32 = 22;

/// How long any wait for completions or a peer may take.
const DEADLINE: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result =
        match args.as_slice() {
            ["loopback"] => loopback(),
            ["pair"] => pair(),
            ["errors"] => errors(),
            ["contexts"] => contexts(),
        ["parallel"] => parallel(),
            ["server", addr] => two_process(true, addr),
            ["client", addr] => two_process(false, addr),
            _ => Err("usage: rust-ibverbs-check loopback | pair | errors | contexts | parallel | server IP:PORT | client IP:PORT"
                .into()),
        };
    match result {
        Ok(()) => println!("ok"),
        Err(e) => {
            eprintln!("rust-ibverbs-check {}: FAILED: {e}", args.join(" "));
            std::process::exit(1);
        }
    }
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

fn gid_text(gid: &ibverbs::Gid) -> Ipv6Addr {
    Ipv6Addr::from((u128::from(gid.subnet_prefix()) << 64) | u128::from(gid.interface_id()))
}

fn endpoint_text(e: &QueuePairEndpoint) -> String {
    let gid = e.gid.as_ref().map_or("none".to_string(), |g| gid_text(g).to_string());
    format!("qpn {:#x}, lid {}, gid {gid}", e.num, e.lid)
}

/// The first device, opened as the example does, with what the crate reads
/// of it printed: name, GUID, index and the GID table.
fn open_first() -> Result<Context> {
    let list = ibverbs::devices()?;
    let dev = list.iter().next().ok_or("no rdma device available")?;
    let name = dev.name().ok_or("ibv_get_device_name returned NULL")?.to_string_lossy().into_owned();
    // u64::from(Guid) is the __be64 that ibv_get_device_guid returned, so
    // from_be gives the GUID that ibv_devinfo prints as node_guid.
    let guid = u64::from_be(u64::from(dev.guid()?));
    let index = match dev.index() {
        Ok(i) => i.to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    let ctx = dev.open()?;
    println!(
        "device {name} (1 of {}): node_guid {:04x}:{:04x}:{:04x}:{:04x}, index {index}",
        list.len(),
        guid >> 48,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    );
    let gids = ctx.gid_table();
    ensure(!gids.is_empty(), || "the GID table is empty".into())?;
    for e in gids {
        println!(
            "  gid[{}] = {} (port {}, type {}, ifindex {})",
            e.gid_index,
            gid_text(&e.gid),
            e.port_num,
            e.gid_type,
            e.ndev_ifindex
        );
    }
    Ok(ctx)
}

/// The index of the RoCEv2 GID (the IPv4-mapped one), which `softroce run
/// --addr` makes GID 1.
fn roce_gid_index(ctx: &Context) -> Result<u32> {
    ctx.gid_table()
        .iter()
        .find(|e| gid_text(&e.gid).to_ipv4_mapped().is_some())
        .map(|e| e.gid_index)
        .ok_or_else(|| "no IPv4-mapped GID in the GID table".into())
}

/// Polls `cq` until `want` completions have come, each successful.
fn poll_n(cq: &CompletionQueue<'_>, want: usize, what: &str) -> Result<Vec<ibv_wc>> {
    let mut got = Vec::new();
    let mut buf = [ibv_wc::default(); 16];
    let start = Instant::now();
    while got.len() < want {
        let done = cq.poll(&mut buf[..])?;
        for wc in done.iter() {
            if let Some((status, vendor_err)) = wc.error() {
                return Err(format!(
                    "{what}: work request {} completed with status {status} (vendor_err {vendor_err})",
                    wc.wr_id()
                )
                .into());
            }
            got.push(*wc);
        }
        ensure(got.len() <= want, || format!("{what}: {} completions, wanted {want}", got.len()))?;
        ensure(start.elapsed() < DEADLINE, || {
            format!("{what}: {} of {want} completions after {DEADLINE:?}", got.len())
        })?;
        if done.is_empty() {
            std::thread::yield_now();
        }
    }
    Ok(got)
}

/// Checks a completion's opcode, QP number and (for receives) length.
fn check_wc(wc: &ibv_wc, opcode: ibv_wc_opcode::Type, qpn: u32, len: Option<usize>) -> Result<()> {
    ensure(wc.opcode() == opcode, || format!("wr {}: opcode {}, expected {opcode}", wc.wr_id(), wc.opcode()))?;
    ensure(wc.qp_num == qpn, || format!("wr {}: qp_num {:#x}, expected {qpn:#x}", wc.wr_id(), wc.qp_num))?;
    if let Some(len) = len {
        ensure(wc.len() == len, || format!("wr {}: byte_len {}, expected {len}", wc.wr_id(), wc.len()))?;
    }
    ensure(wc.imm_data().is_none(), || format!("wr {}: an immediate nobody sent", wc.wr_id()))
}

/// The crate's examples/loopback.rs, step for step: the first device, a CQ
/// of 16, a PD, an RC QP on GID 1 handshaken with its own endpoint, a
/// two-`u64` region, a receive into element 0 (wr 2) and a SEND of element 1
/// (wr 1), polled until both complete; element 0 must then hold 0x42.
fn loopback() -> Result<()> {
    let ctx = open_first()?;
    let cq = ctx.create_cq(16, 0)?;
    let pd = ctx.alloc_pd()?;

    let qp_builder = pd.create_qp(&cq, &cq, ibv_qp_type::IBV_QPT_RC).set_gid_index(1).build()?;
    let endpoint = qp_builder.endpoint();
    println!("endpoint: {}", endpoint_text(&endpoint));
    let mut qp = qp_builder.handshake(endpoint)?;

    let mut mr = pd.allocate::<u64>(2)?;
    mr[1] = 0x42;

    // SAFETY: both ranges lie in `mr`, which is registered and outlives the
    // two work requests: they are polled to completion below before `mr` is
    // dropped, and nothing touches element 0 until its receive completes.
    unsafe { qp.post_receive(&mut mr, ..1, 2) }?;
    // SAFETY: as above.
    unsafe { qp.post_send(&mut mr, 1.., 1) }?;

    let mut sent = false;
    let mut received = false;
    let mut completions = [ibv_wc::default(); 16];
    let start = Instant::now();
    while !sent || !received {
        ensure(start.elapsed() < DEADLINE, || format!("sent {sent}, received {received} after {DEADLINE:?}"))?;
        let completed = cq.poll(&mut completions[..])?;
        if completed.is_empty() {
            continue;
        }
        ensure(completed.len() <= 2, || format!("{} completions in one poll", completed.len()))?;
        for wr in completed {
            if let Some((status, vendor_err)) = wr.error() {
                return Err(format!("wr {}: status {status} (vendor_err {vendor_err})", wr.wr_id()).into());
            }
            match wr.wr_id() {
                1 => {
                    ensure(!sent, || "wr 1 completed twice".into())?;
                    check_wc(wr, ibv_wc_opcode::IBV_WC_SEND, endpoint.num, None)?;
                    sent = true;
                    println!("sent");
                }
                2 => {
                    ensure(!received, || "wr 2 completed twice".into())?;
                    check_wc(wr, ibv_wc_opcode::IBV_WC_RECV, endpoint.num, Some(8))?;
                    received = true;
                    ensure(mr[0] == 0x42, || format!("mr[0] = {:#x}, expected 0x42", mr[0]))?;
                    println!("received");
                }
                other => return Err(format!("a completion for wr {other}, which was never posted").into()),
            }
        }
    }
    Ok(())
}

fn pattern(seed: u8, len: usize) -> impl Iterator<Item = u8> {
    (0..len).map(move |i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
}

fn check_bytes(what: &str, got: &[u8], seed: u8) -> Result<()> {
    match got.iter().zip(pattern(seed, got.len())).position(|(a, b)| *a != b) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: byte {i} of {} is wrong", got.len()).into()),
    }
}

/// Two QPs of one process connected to each other through the crate's
/// handshake, each with its own CQ; each sends the other 64 KiB (many
/// packets) and receives 64 KiB, for RC and then UC.
fn pair() -> Result<()> {
    let ctx = open_first()?;
    let gid_index = roce_gid_index(&ctx)?;
    const LEN: usize = 64 * 1024;
    for (name, qp_type) in [("RC", ibv_qp_type::IBV_QPT_RC), ("UC", ibv_qp_type::IBV_QPT_UC)] {
        let cq_a = ctx.create_cq(16, 1)?;
        let cq_b = ctx.create_cq(16, 2)?;
        let pd = ctx.alloc_pd()?;
        let a = pd.create_qp(&cq_a, &cq_a, qp_type).set_gid_index(gid_index).build()?;
        let b = pd.create_qp(&cq_b, &cq_b, qp_type).set_gid_index(gid_index).build()?;
        let (ea, eb) = (a.endpoint(), b.endpoint());
        println!("{name} a: {}", endpoint_text(&ea));
        println!("{name} b: {}", endpoint_text(&eb));
        let mut qa = a.handshake(eb)?;
        let mut qb = b.handshake(ea)?;

        let mut send_a = pd.allocate::<u8>(LEN)?;
        let mut send_b = pd.allocate::<u8>(LEN)?;
        let mut recv_a = pd.allocate::<u8>(LEN)?;
        let mut recv_b = pd.allocate::<u8>(LEN)?;
        for (d, s) in send_a.iter_mut().zip(pattern(1, LEN)) {
            *d = s;
        }
        for (d, s) in send_b.iter_mut().zip(pattern(2, LEN)) {
            *d = s;
        }

        // SAFETY: each range lies in a registered region that outlives its
        // work request (every one is polled to completion below, before the
        // regions drop), and no region is read or written meanwhile.
        unsafe {
            qa.post_receive(&mut recv_a, .., 12)?;
            qb.post_receive(&mut recv_b, .., 22)?;
            qa.post_send(&mut send_a, .., 11)?;
            qb.post_send(&mut send_b, .., 21)?;
        }

        for (cq, qpn, send_id, what) in [(&cq_a, ea.num, 11, "a"), (&cq_b, eb.num, 21, "b")] {
            let wcs = poll_n(cq, 2, &format!("{name} {what}"))?;
            for wc in &wcs {
                if wc.wr_id() == send_id {
                    check_wc(wc, ibv_wc_opcode::IBV_WC_SEND, qpn, None)?;
                } else if wc.wr_id() == send_id + 1 {
                    check_wc(wc, ibv_wc_opcode::IBV_WC_RECV, qpn, Some(LEN))?;
                } else {
                    return Err(format!("{name} {what}: completion for unknown wr {}", wc.wr_id()).into());
                }
            }
        }
        check_bytes(&format!("{name} a received"), &recv_a, 2)?;
        check_bytes(&format!("{name} b received"), &recv_b, 1)?;
        println!("{name}: 64 KiB each way, both completions on both sides, data intact");
    }
    Ok(())
}

/// Checks that `result` failed with errno `want`. The crate reads `errno`
/// (`io::Error::last_os_error`) after a constructor returned NULL, and takes
/// the return value of `ibv_modify_qp` as the errno.
fn expect_errno<T>(what: &str, result: std::io::Result<T>, want: i32) -> Result<()> {
    match result {
        Ok(_) => Err(format!("{what}: succeeded, expected errno {want}").into()),
        Err(e) if e.raw_os_error() == Some(want) => {
            println!("{what}: {e}");
            Ok(())
        }
        Err(e) => Err(format!("{what}: {e} ({:?}), expected errno {want}", e.raw_os_error()).into()),
    }
}

/// The failures a program using the crate can meet, with the errno that
/// rdma-core gives on kernel rxe (whose limits softroce reports: max_cqe
/// 32767, max_qp_wr 16384).
fn errors() -> Result<()> {
    let ctx = open_first()?;
    // rxe_cq_chk_attr: cqe <= 0 or > max_cqe is EINVAL.
    expect_errno("create_cq(0)", ctx.create_cq(0, 0).map(drop), EINVAL)?;
    expect_errno("create_cq(1 << 20)", ctx.create_cq(1 << 20, 0).map(drop), EINVAL)?;
    let cq = ctx.create_cq(16, 0)?;
    let pd = ctx.alloc_pd()?;
    // rxe_qp_chk_cap: max_send_wr > max_qp_wr is EINVAL.
    expect_errno(
        "create_qp with max_send_wr 1 << 20",
        pd.create_qp(&cq, &cq, ibv_qp_type::IBV_QPT_RC).set_max_send_wr(1 << 20).build().map(drop),
        EINVAL,
    )?;
    // No set_gid_index: RTR with an address vector without a GRH, which
    // RoCE cannot route (rdma_check_ah_attr: EINVAL).
    let prepared = pd.create_qp(&cq, &cq, ibv_qp_type::IBV_QPT_RC).build()?;
    let endpoint = prepared.endpoint();
    expect_errno("RC handshake without a GID", prepared.handshake(endpoint), EINVAL)?;
    // The crate's handshake moves a UD QP to INIT without IBV_QP_QKEY,
    // which ib_modify_qp_is_ok requires (EINVAL).
    let prepared = pd.create_qp(&cq, &cq, ibv_qp_type::IBV_QPT_UD).build()?;
    let endpoint = prepared.endpoint();
    expect_errno("UD handshake (INIT without a Q_Key)", prepared.handshake(endpoint), EINVAL)?;
    // Everything above was released by its Drop, which asserts success: a
    // CQ and a PD still usable afterwards show nothing leaked a reference.
    let prepared = pd.create_qp(&cq, &cq, ibv_qp_type::IBV_QPT_RC).set_gid_index(roce_gid_index(&ctx)?).build()?;
    let endpoint = prepared.endpoint();
    prepared.handshake(endpoint)?;
    println!("an RC QP on the same PD and CQ still connects");
    Ok(())
}

/// Two contexts of the first device open at once, as a crate's tests do
/// when `cargo test` runs them in parallel threads and each opens the
/// device: rdma-core gives each `ibv_open_device` its own context. A QP of
/// each is connected to a QP of the other and each sends the other 4 KiB.
fn contexts() -> Result<()> {
    let first = open_first()?;
    let list = ibverbs::devices()?;
    let second = list
        .iter()
        .next()
        .ok_or("no rdma device available")?
        .open()
        .map_err(|e| format!("a second ibv_open_device of the device while the first context is open: {e}"))?;
    println!("two contexts of the device are open");
    const LEN: usize = 4096;
    let gid_index = roce_gid_index(&first)?;
    let (cq_a, cq_b) = (first.create_cq(16, 1)?, second.create_cq(16, 2)?);
    let (pd_a, pd_b) = (first.alloc_pd()?, second.alloc_pd()?);
    let a = pd_a.create_qp(&cq_a, &cq_a, ibv_qp_type::IBV_QPT_RC).set_gid_index(gid_index).build()?;
    let b = pd_b.create_qp(&cq_b, &cq_b, ibv_qp_type::IBV_QPT_RC).set_gid_index(gid_index).build()?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    ensure(ea.num != eb.num, || format!("both contexts' QPs are QP {:#x}", ea.num))?;
    let mut qa = a.handshake(eb)?;
    let mut qb = b.handshake(ea)?;
    let (mut send_a, mut recv_a) = (pd_a.allocate::<u8>(LEN)?, pd_a.allocate::<u8>(LEN)?);
    let (mut send_b, mut recv_b) = (pd_b.allocate::<u8>(LEN)?, pd_b.allocate::<u8>(LEN)?);
    for (d, s) in send_a.iter_mut().zip(pattern(3, LEN)) {
        *d = s;
    }
    for (d, s) in send_b.iter_mut().zip(pattern(4, LEN)) {
        *d = s;
    }
    // SAFETY: each range lies in a registered region that outlives its work
    // request (all are polled to completion below) and is not touched meanwhile.
    unsafe {
        qa.post_receive(&mut recv_a, .., 2)?;
        qb.post_receive(&mut recv_b, .., 2)?;
        qa.post_send(&mut send_a, .., 1)?;
        qb.post_send(&mut send_b, .., 1)?;
    }
    poll_n(&cq_a, 2, "context 1")?;
    poll_n(&cq_b, 2, "context 2")?;
    check_bytes("context 1 received", &recv_a, 4)?;
    check_bytes("context 2 received", &recv_b, 3)?;
    println!("4 KiB each way between the two contexts, data intact");
    Ok(())
}

/// What `cargo test` does with a crate's tests that each open the device:
/// four threads at once, each ten times opening the first device, looping
/// a SEND of its own round number back through an RC QP and closing it all.
fn parallel() -> Result<()> {
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 10;
    let one = |thread: u64, round: u64| -> Result<()> {
        let list = ibverbs::devices()?;
        let ctx = list.iter().next().ok_or("no rdma device available")?.open()?;
        let cq = ctx.create_cq(16, 0)?;
        let pd = ctx.alloc_pd()?;
        let prepared = pd.create_qp(&cq, &cq, ibv_qp_type::IBV_QPT_RC).set_gid_index(roce_gid_index(&ctx)?).build()?;
        let endpoint = prepared.endpoint();
        let mut qp = prepared.handshake(endpoint)?;
        let mut mr = pd.allocate::<u64>(2)?;
        mr[1] = thread << 32 | round;
        // SAFETY: as in `loopback`: both ranges lie in `mr`, which outlives
        // the requests (polled to completion below).
        unsafe {
            qp.post_receive(&mut mr, ..1, 2)?;
            qp.post_send(&mut mr, 1.., 1)?;
        }
        poll_n(&cq, 2, &format!("thread {thread} round {round}"))?;
        ensure(mr[0] == mr[1], || format!("thread {thread} round {round}: received {:#x}", mr[0]))
    };
    // Threads hand back their failure as text: Box<dyn Error> is not Send.
    let results: Vec<std::result::Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                s.spawn(move || {
                    (0..ROUNDS).try_for_each(|round| {
                        one(thread, round).map_err(|e| format!("thread {thread} round {round}: {e}"))
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
    });
    for r in results {
        r?;
    }
    println!("{THREADS} threads x {ROUNDS} rounds of open, loop back, close: all delivered");
    Ok(())
}

/// A line over the TCP side channel.
fn send_line(s: &mut TcpStream, line: &str) -> Result<()> {
    s.write_all(line.as_bytes())?;
    s.write_all(b"\n")?;
    Ok(())
}

fn recv_line(r: &mut BufReader<TcpStream>) -> Result<String> {
    let mut line = String::new();
    ensure(r.read_line(&mut line)? > 0, || "the peer closed the side channel".into())?;
    Ok(line.trim_end().to_string())
}

/// One end of an RC connection between two processes: the endpoints (the
/// crate's serde form) cross over TCP, each side receives 256 KiB from the
/// other and sends 256 KiB, and they say goodbye only when both are done.
fn two_process(server: bool, addr: &str) -> Result<()> {
    const LEN: usize = 256 * 1024;
    let role = if server { "server" } else { "client" };
    let ctx = open_first()?;
    let gid_index = roce_gid_index(&ctx)?;
    let cq = ctx.create_cq(16, 0)?;
    let pd = ctx.alloc_pd()?;
    // The ACK timeout of ibv_rc_pingpong and perftest (14: 67 ms), not the
    // crate's default 4 (65 µs): softroce times out after 4.096 µs × 2^4
    // as IBTA says, while kernel rxe rounds any timeout up to a jiffy (1 to
    // 10 ms); two processes that busy-poll, with two engine threads, on two
    // cores leave a peer off the CPU for longer than 7 × 65 µs often enough
    // that the crate's default fails with RETRY_EXC_ERR in about half the
    // runs.
    let prepared = pd.create_qp(&cq, &cq, ibv_qp_type::IBV_QPT_RC).set_gid_index(gid_index).set_timeout(14).build()?;
    let local = prepared.endpoint();

    let mut stream = if server {
        let listener = TcpListener::bind(addr)?;
        println!("{role}: listening on {addr}");
        listener.accept()?.0
    } else {
        let start = Instant::now();
        loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(e) if start.elapsed() < DEADLINE => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(format!("connect {addr}: {e}").into()),
            }
        }
    };
    stream.set_read_timeout(Some(DEADLINE))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    send_line(&mut stream, &serde_json::to_string(&local)?)?;
    let remote: QueuePairEndpoint = serde_json::from_str(&recv_line(&mut reader)?)?;
    println!("{role}: local {}", endpoint_text(&local));
    println!("{role}: remote {}", endpoint_text(&remote));
    let mut qp = prepared.handshake(remote)?;

    let (my_seed, their_seed) = if server { (7, 9) } else { (9, 7) };
    let mut send = pd.allocate::<u8>(LEN)?;
    let mut recv = pd.allocate::<u8>(LEN)?;
    for (d, s) in send.iter_mut().zip(pattern(my_seed, LEN)) {
        *d = s;
    }
    // SAFETY: `recv` is registered, outlives the request (polled below) and
    // is not touched until its completion.
    unsafe { qp.post_receive(&mut recv, .., 2) }?;
    send_line(&mut stream, "ready")?;
    ensure(recv_line(&mut reader)? == "ready", || "the peer did not say ready".into())?;
    // SAFETY: `send` is registered, outlives the request (polled below) and
    // is not written meanwhile.
    unsafe { qp.post_send(&mut send, .., 1) }?;

    for wc in poll_n(&cq, 2, role)? {
        match wc.wr_id() {
            1 => check_wc(&wc, ibv_wc_opcode::IBV_WC_SEND, local.num, None)?,
            2 => check_wc(&wc, ibv_wc_opcode::IBV_WC_RECV, local.num, Some(LEN))?,
            other => return Err(format!("completion for unknown wr {other}").into()),
        }
    }
    check_bytes(&format!("{role} received"), &recv, their_seed)?;
    // Both sides finish before either destroys its QP, so no ACK is lost.
    send_line(&mut stream, "done")?;
    ensure(recv_line(&mut reader)? == "done", || "the peer did not finish".into())?;
    println!("{role}: sent and received 256 KiB over RC, data intact");
    Ok(())
}
