//! softroce: RoCEv2 with the semantics of Linux's Soft-RoCE driver (`rdma_rxe`),
//! in userspace Rust.
//!
//! The crate is layered bottom-up; each layer depends only on those below it:
//!
//! - [`wire`]: header views and value types for every RoCEv2 header, the opcode
//!   table, PSN arithmetic, the ICRC, and whole-packet parse and build.
//! - [`capture`]: reading and writing pcap/pcapng files of RoCEv2 traffic.

pub mod capture;
pub mod wire;
