//! Connection management: connecting queue pairs by IP address and port,
//! the way the Linux kernel's `ib_cm` and `rdma_cm` do it (IBTA chapter 12
//! and annex A11), so that a softroce process and a kernel one can connect
//! to each other.
//!
//! - [`protocol`]: the CM as a sans-IO state machine: MADs and time in; MADs,
//!   events and a deadline out.
//! - The rest is rdma_cm (librdmacm's object model) on top of it: an
//!   [`EventChannel`] delivers [`CmEvent`]s about [`CmId`]s, which resolve
//!   addresses and routes, listen, connect, accept, reject and disconnect,
//!   and move the QP attached to them through its states as librdmacm
//!   does. Each verbs [`Context`] carries one CM service: its GSI QP (QP 1)
//!   and a thread that drives the protocol.
//!
//! ```text
//! EventChannel --CmId::new--> CmId --resolve_addr--> ADDR_RESOLVED (a device, so a Context)
//!                                  --resolve_route-> ROUTE_RESOLVED
//!                                  --create_qp / attach_qp (INIT)
//!                                  --connect ------> REQ ... REP: QP to RTR, RTS; RTU: ESTABLISHED
//!                 listening CmId <--CONNECT_REQUEST (a new CmId) --accept: RTR, RTS, REP ... RTU: ESTABLISHED
//! ```
//!
//! A process has one [`Context`] per device ([`context_for`]), shared by its
//! CM ids and by whatever else opens the device, as a kernel device is
//! shared by everything in a process. Addresses resolve to the devices of
//! [`set_devices`] (by default those of `Device::list`), on the RoCE port
//! [`PORT_ENV`] names (4791 by default). Tests, and programs that opened
//! their device themselves, pin an event channel to a context instead:
//! `EventChannel::with_options(CmOptions::with_context(&context))` (see
//! `tests/cm/`, whose contexts are on free ports of 127.0.0.1 and 127.0.0.2).

mod addr;
mod channel;
mod id;
pub mod protocol;
mod service;

use std::io;

pub use addr::{context_for, set_context_opener, set_devices, ContextOpener};
pub use channel::EventChannel;
pub use id::CmId;
pub(crate) use service::{destroy_all_ids, resend_unanswered_until};

use crate::transport::Mtu;
use crate::verbs::{Context, ContextOptions, Error, Gid};
pub use crate::wire::cma::{PortSpace, RDMA_UDP_QKEY};
use crate::wire::ROCE_UDP_PORT;

/// The environment variable that names the RoCE UDP port of the contexts
/// the CM opens, if not 4791 (the same one the C ABI reads).
pub const PORT_ENV: &str = "SOFTROCE_PORT";

/// How the ids of an [`EventChannel`] reach their devices.
#[derive(Debug, Clone)]
pub struct CmOptions {
    /// The RoCE UDP port of the contexts the CM opens: [`PORT_ENV`], or 4791.
    pub port: u16,
    /// Use this context for every id of the channel instead of the
    /// process's context of the device that holds the address: tests, and
    /// programs that opened their device themselves. Addresses must be the
    /// context device's.
    pub context: Option<Context>,
    /// The CM response timeout code a context's CM advertises and waits
    /// by (4.096 µs × 2^code; the kernel's rdma_cm: 20, about 4 s), and
    /// how often it resends an unanswered message (the kernel's: 15).
    /// Taken when a channel's id is the first to use a context's CM; tests
    /// shorten them to see a peer go unanswered.
    pub response_timeout: u8,
    /// See [`CmOptions::response_timeout`].
    pub max_cm_retries: u8,
}

impl Default for CmOptions {
    fn default() -> CmOptions {
        let port = std::env::var(PORT_ENV).ok().and_then(|p| p.parse().ok()).unwrap_or(ROCE_UDP_PORT);
        CmOptions { port, context: None, response_timeout: 20, max_cm_retries: 15 }
    }
}

impl CmOptions {
    /// Options that use `context` for every id.
    pub fn with_context(context: &Context) -> CmOptions {
        CmOptions { context: Some(context.clone()), ..CmOptions::default() }
    }

    fn context_options(&self) -> ContextOptions {
        ContextOptions { port: self.port, ..ContextOptions::default() }
    }
}

/// `rdma_cm_event_type`, with its numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventKind {
    /// `resolve_addr` found the source address and its device.
    AddrResolved = 0,
    /// `resolve_addr` failed; the status says why (a negative errno).
    AddrError = 1,
    /// `resolve_route` found the path.
    RouteResolved = 2,
    /// `resolve_route` failed.
    RouteError = 3,
    /// A peer asks to connect: `id` is a new id, `listen_id` the listener.
    ConnectRequest = 4,
    /// The peer accepted, and the id has no QP to move: the program moves
    /// its own and calls [`CmId::establish`].
    ConnectResponse = 5,
    /// Moving the QP for a connection that the peer accepted failed.
    ConnectError = 6,
    /// The peer did not answer (status -ETIMEDOUT) or a SIDR request was
    /// refused (status: the SIDR_REP status).
    Unreachable = 7,
    /// The peer rejected: status is the IB reject reason (8: nobody listens).
    Rejected = 8,
    /// The connection is up (for UD: the SIDR reply arrived).
    Established = 9,
    /// The connection is down.
    Disconnected = 10,
    /// The device went away (not raised: softroce devices stay).
    DeviceRemoval = 11,
    /// A multicast join is done: the UD parameters say how to send to the
    /// group.
    MulticastJoin = 12,
    /// Multicast join failed (not raised: a join fails at once instead).
    MulticastError = 13,
    /// The address changed (not raised).
    AddrChange = 14,
    /// The connection's TimeWait is over: its QP may be reused.
    TimewaitExit = 15,
}

/// `rdma_conn_param`: what a connect or accept asks for, and what a
/// connection event reports of the peer's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// The consumer's private data (without the CMA header).
    pub private_data: Vec<u8>,
    /// READ/atomic requests this side accepts from the peer at once.
    pub responder_resources: u8,
    /// READ/atomic requests this side sends to the peer at once.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits, 7 = forever).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// The QP number to announce when the id has no QP; in events, the peer's.
    pub qp_num: u32,
    /// The Q_Key of a UD id in the IB port space (the UDP port space uses
    /// [`RDMA_UDP_QKEY`]).
    pub qkey: u32,
}

/// `rdma_ud_param`: how to reach the peer's UD QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// The peer's GID: the address handle's destination.
    pub dgid: Gid,
    /// The peer's QP number (0 in a request).
    pub qp_num: u32,
    /// The Q_Key its datagrams need (0 in a request).
    pub qkey: u32,
}

/// `rdma_route`'s path: what a connection's packets travel on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Our GID (the source address, IPv4-mapped).
    pub sgid: Gid,
    /// The peer's GID.
    pub dgid: Gid,
    /// The path MTU: the device's active MTU.
    pub path_mtu: Mtu,
    /// The default P_Key.
    pub pkey: u16,
    /// The hop limit the kernel puts in the path of a RoCE route.
    pub hop_limit: u8,
    /// Traffic class (0: the type of service of the id, which is 0).
    pub traffic_class: u8,
}

/// `rdma_cm_event`.
#[derive(Debug, Clone)]
pub struct CmEvent {
    /// The id the event is about (for a connect request, the new id).
    pub id: CmId,
    /// For a connect request, the listening id it came to.
    pub listen_id: Option<CmId>,
    /// What happened.
    pub kind: CmEventKind,
    /// 0, a negative errno, or what the kind says (a reject reason).
    pub status: i32,
    /// The peer's connection parameters: REQ, REP or REJ contents.
    pub conn: Option<ConnParam>,
    /// The peer's UD parameters: SIDR request or reply contents.
    pub ud: Option<UdParam>,
}

/// The verbs error for a protocol refusal: EADDRINUSE, ENOMEM or EINVAL to
/// the C ABI.
fn protocol_error(e: protocol::CmError) -> Error {
    match e {
        protocol::CmError::AddrInUse => Error::Io(io::Error::new(io::ErrorKind::AddrInUse, e.to_string())),
        protocol::CmError::NoResources => Error::Io(io::Error::new(io::ErrorKind::OutOfMemory, e.to_string())),
        _ => Error::InvalidArgument(e.to_string()),
    }
}

/// An error of kind `kind` (EADDRINUSE, ENODEV …) that says what happened.
fn io_error(kind: io::ErrorKind, what: String) -> Error {
    Error::Io(io::Error::new(kind, what))
}
