//! softroce: RoCEv2 with the semantics of Linux's Soft-RoCE driver (`rdma_rxe`),
//! in userspace Rust.
//!
//! The crate is layered bottom-up; each layer depends only on those below it:
//!
//! - [`wire`]: header views and value types for every RoCEv2 header, the opcode
//!   table, PSN arithmetic, the ICRC, and whole-packet parse and build.
//! - [`capture`]: reading and writing pcap/pcapng files of RoCEv2 traffic.
//! - [`trace`]: a timeline of a program's calls and the packets they cause.
//! - [`net`]: networks that carry whole IP packets between endpoints; [`net::sim`]
//!   is a deterministic in-memory one with fault injection.
//! - [`transport`]: the RC/UC/UD queue pair as a sans-IO state machine
//!   (requester, responder, completer), with checked access to memory.
//! - [`engine`]: joins QPs to a network; [`engine::SimWorld`] drives them over
//!   the simulated network in virtual time.
//! - [`verbs`]: the libibverbs-style API over real UDP sockets: devices,
//!   contexts, protection domains, memory regions, CQs and QPs. Start here
//!   to move data.
//! - [`cm`]: connecting QPs by IP address and port, as rdma_cm does: the IB
//!   CM's protocol over each context's GSI QP, and librdmacm's ids and
//!   events on top (`examples/rdma_cm_pingpong.rs`).
//!
//! # Example
//!
//! Two devices on loopback addresses, an RC queue pair on each, and an RDMA
//! WRITE from one into the memory of the other. Two programs on two hosts
//! would do the same, each with its half, swapping endpoints over TCP
//! ([`verbs::Endpoint::exchange`]); `examples/` has such programs.
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr};
//! use std::time::Duration;
//!
//! use softroce::verbs::{Access, ConnectOptions, Context, ContextOptions, Device, QpType, SendOp, SendWr, WcStatus};
//!
//! # /// A UDP port free on both addresses.
//! # fn free_port(a: IpAddr, b: IpAddr) -> u16 {
//! #     loop {
//! #         let probe = std::net::UdpSocket::bind((a, 0)).unwrap();
//! #         let port = probe.local_addr().unwrap().port();
//! #         if std::net::UdpSocket::bind((b, port)).is_ok() {
//! #             return port;
//! #         }
//! #     }
//! # }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A device per address; with one address, GID index 1 is that address.
//! let (ip_a, ip_b) = (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
//! let dev_a = Device::custom("sr_a", vec![ip_a], [2, 0, 0, 0, 0, 1], 65536);
//! let dev_b = Device::custom("sr_b", vec![ip_b], [2, 0, 0, 0, 0, 2], 65536);
//!
//! // Both use the same RoCE UDP port: 4791 by default, a free one here.
//! let options = ContextOptions { port: free_port(ip_a, ip_b), ..ContextOptions::default() };
//! let (ctx_a, ctx_b) = (Context::open(&dev_a, options.clone())?, Context::open(&dev_b, options)?);
//! let (pd_a, pd_b) = (ctx_a.alloc_pd()?, ctx_b.alloc_pd()?);
//!
//! // A's buffer is only read locally; B's may be written by its peer.
//! let source = pd_a.alloc_mr(4096, Access::LOCAL_WRITE)?;
//! let target = pd_b.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//!
//! let (cq_a, cq_b) = (ctx_a.create_cq(16, None)?, ctx_b.create_cq(16, None)?);
//! let (qp_a, qp_b) = (pd_a.create_qp(QpType::Rc, &cq_a).build()?, pd_b.create_qp(QpType::Rc, &cq_b).build()?);
//!
//! // Each QP connects to the other's endpoint (QP number, first PSN, GID).
//! // B's QP must also allow remote writes.
//! let (ep_a, ep_b) = (qp_a.endpoint(1)?, qp_b.endpoint(1)?);
//! qp_a.connect(&ep_b, &ConnectOptions::default())?;
//! let writable = ConnectOptions { access: Access::LOCAL_WRITE | Access::REMOTE_WRITE, ..ConnectOptions::default() };
//! qp_b.connect(&ep_a, &writable)?;
//!
//! // Write 17 bytes to offset 100 of B's buffer, by its address and R_Key.
//! let message = b"hello over RoCEv2";
//! source.write(0, message)?;
//! let write = SendOp::RdmaWrite { remote_addr: target.addr() + 100, rkey: target.rkey() };
//! qp_a.post_send(SendWr::new(1, write).with_sge(source.sge(0, message.len())))?;
//!
//! // The completion comes once B has acknowledged the data.
//! let wc = cq_a.wait_one(Duration::from_secs(10)).expect("the WRITE completes");
//! assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
//!
//! // The bytes are in B's memory, and B's program was not involved: an
//! // RDMA WRITE consumes no receive and completes nothing on B's side.
//! let mut landed = [0u8; 17];
//! target.read(100, &mut landed)?;
//! assert_eq!(&landed, message);
//! assert!(cq_b.poll_one().is_none());
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
// Unsafe code is allowed only where it is needed (system calls, registered
// memory, SIMD), module by module or function by function, each block with
// the reason it is sound.
#![deny(unsafe_code)]

pub mod capture;
pub mod cm;
pub mod engine;
pub mod net;
pub mod rundir;
pub mod stages;
pub mod trace;
pub mod transport;
pub mod verbs;
pub mod wire;

/// What a program that exits owes its peers leaves before it does, as it
/// would from a kernel driver that outlives the process: every CM id still
/// held is destroyed as the kernel destroys an exiting process's (a DREP
/// to the DREQ received, a DREQ, a REJ), and every open context settles
/// ([`verbs::Context::settle`]). Returns once that is done, or a few
/// milliseconds after `limit` whatever happens: the work runs on a thread
/// of its own, so a lock held by a thread that the signal whose handler
/// exits interrupted cannot hold the exit up. The C library calls it at
/// exit (rxe-spec C-23, M-73).
pub fn settle_before_exit(limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    let (done, finished) = std::sync::mpsc::channel();
    let settling = std::thread::Builder::new().name("softroce-exit".into()).spawn(move || {
        cm::destroy_all_ids();
        let contexts = verbs::open_contexts();
        std::thread::scope(|scope| {
            scope.spawn(|| cm::resend_unanswered_until(deadline));
            for context in &contexts {
                scope.spawn(|| context.settle(deadline));
            }
        });
        let _ = done.send(());
    });
    if settling.is_ok() {
        // A few milliseconds more for the last round begun before the deadline.
        let wait = deadline.saturating_duration_since(std::time::Instant::now()) + std::time::Duration::from_millis(5);
        let _ = finished.recv_timeout(wait);
    }
}

/// A 32-bit value from the kernel's CSPRNG: keys and initial PSNs must not be
/// guessable by an off-path attacker (ReDMArk, USENIX Security 2021).
#[allow(unsafe_code)]
pub(crate) fn random_u32() -> u32 {
    let mut v = [0u8; 4];
    let mut filled = 0;
    while filled < 4 {
        // SAFETY: writes at most the remaining bytes of `v`.
        let n = unsafe { libc::getrandom(v[filled..].as_mut_ptr().cast(), 4 - filled, 0) };
        if n > 0 {
            filled += n as usize;
        }
    }
    u32::from_ne_bytes(v)
}
