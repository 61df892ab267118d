//! The verbs API: libibverbs' object model in idiomatic Rust, over real UDP
//! sockets.
//!
//! A [`Device`] is a network interface with a GID table shaped like kernel
//! rxe's; [`Context::open`] starts its engine thread. Protection domains,
//! memory regions, completion queues and channels, queue pairs, SRQs and
//! address handles follow `ibv_*` semantics: work requests and completions
//! carry the same fields and status codes, and QPs follow the
//! `ibv_modify_qp` state machine with its attribute masks.
//!
//! The objects, and what makes each:
//!
//! ```text
//! Device --Context::open--> Context: engine thread, UDP socket on the device's addresses
//!                             |-- alloc_pd ------------> ProtectionDomain
//!                             |                           |-- alloc_mr, reg_mr -> MemoryRegion (addr, lkey, rkey)
//!                             |                           |-- alloc_mw --------> MemoryWindow (bound by a send WR)
//!                             |                           |-- create_qp -------> QueuePair (on CQs, maybe an SRQ)
//!                             |                           |-- create_srq ------> SharedReceiveQueue
//!                             |                           '-- create_ah -------> AddressHandle (a UD destination)
//!                             |-- create_cq -----------> CompletionQueue (maybe with a channel)
//!                             '-- create_comp_channel -> CompletionChannel
//! ```
//!
//! Dropping an object destroys it (there is no `ibv_destroy_*` to call),
//! and PDs, MRs, CQs, QPs and SRQs keep their context, and so its engine,
//! alive. To connect two QPs, each side gets its [`Endpoint`] (QP number,
//! first PSN, GID), sends it to the other out of band
//! ([`Endpoint::exchange`] over a TCP stream) and passes the peer's to
//! [`QueuePair::connect`]. A memory region's bytes may change under the
//! program at any time (the engine and remote peers write them), so they
//! are reached by copying: [`MemoryRegion::read`], [`MemoryRegion::write`].
//!
//! The crate-level documentation has a complete example; `examples/` has
//! `rc_pingpong`, `ud_pingpong` and `rdma_write_read`, written after
//! libibverbs' C examples.

mod ah;
mod context;
mod cq;
pub mod device;
mod endpoint;
mod error;
pub mod gid;
#[allow(unsafe_code)]
mod mr;
mod mw;
#[allow(unsafe_code)]
mod pd;
mod qp;
mod srq;
pub mod stats;

pub use crate::engine::EngineCpus;
pub use ah::AddressHandle;
pub(crate) use context::{open_contexts, WeakContext};
pub use context::{CaptureOptions, Context, ContextOptions, DeviceCounters};
pub use cq::{CompletionChannel, CompletionQueue};
pub use device::{Device, DeviceAttr, PortAttr};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use gid::Gid;
pub use mr::{MemoryRegion, RemoteRegion, Rereg};
pub use mw::{MemoryWindow, WindowType};
pub use pd::{Advice, ProtectionDomain, QpBuilder, GSI_QKEY, GSI_QPN};
pub(crate) use qp::QpController;
pub use qp::{AckTimeout, ConnectOptions, QueuePair};
pub use srq::SharedReceiveQueue;
// The transport's value types that verbs calls take and return, so that a
// program imports everything from here.
pub use crate::transport::{
    Access, AsyncEvent, AttrMask, InlineData, Mtu, MwBind, QpAttr, QpCap, QpState, QpType, RecvWr, SendFlags, SendOp,
    SendWr, SgList, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};
pub use crate::wire::Psn;
