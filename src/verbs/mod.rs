//! The verbs API: libibverbs' object model in idiomatic Rust, over real UDP
//! sockets.
//!
//! A [`Device`] is a network interface with a GID table shaped like kernel
//! rxe's; [`Context::open`] starts its engine thread. Protection domains,
//! memory regions, completion queues and channels, queue pairs, SRQs and
//! address handles follow `ibv_*` semantics: work requests and completions
//! carry the same fields and status codes, and QPs follow the
//! `ibv_modify_qp` state machine with its attribute masks.

mod context;
pub mod device;
mod error;
pub mod gid;

pub use context::{
    AddressHandle, CompletionChannel, CompletionQueue, ConnectOptions, Context, ContextOptions,
    DeviceCounters, Endpoint, MemoryRegion, ProtectionDomain, QpInit, QueuePair,
    SharedReceiveQueue,
};
pub use device::Device;
pub use error::{Error, Result};
pub use gid::Gid;
