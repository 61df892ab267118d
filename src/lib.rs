//! softroce: RoCEv2 with the semantics of Linux's Soft-RoCE driver (`rdma_rxe`),
//! in userspace Rust.
//!
//! The crate is layered bottom-up; each layer depends only on those below it:
//!
//! - [`wire`]: header views and value types for every RoCEv2 header, the opcode
//!   table, PSN arithmetic, the ICRC, and whole-packet parse and build.
//! - [`capture`]: reading and writing pcap/pcapng files of RoCEv2 traffic.
//! - [`net`]: networks that carry whole IP packets between endpoints; [`net::sim`]
//!   is a deterministic in-memory one with fault injection.
//! - [`transport`]: the RC/UC/UD queue pair as a sans-IO state machine
//!   (requester, responder, completer), with checked access to memory.
//! - [`engine`]: joins QPs to a network; [`engine::sim`] drives them over the
//!   simulated network in virtual time.

pub mod capture;
pub mod engine;
pub mod net;
pub mod transport;
pub mod verbs;
pub mod wire;
