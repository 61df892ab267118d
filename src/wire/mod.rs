//! The RoCEv2 wire format.
//!
//! Every header is two things, in the style of smoltcp: a zero-copy view over a
//! byte buffer (`Bth<T: AsRef<[u8]>>`, with `new_checked`/`check_len`, getters and,
//! for mutable buffers, setters) and a plain value type (`BthRepr`) with symmetric
//! `parse`/`emit`. Parsing never panics, whatever the input: a short buffer, an
//! unknown opcode or an inconsistent length is an [`Error`].
//!
//! Layering, innermost first:
//! - [`Psn`]: 24-bit packet sequence numbers with window comparison.
//! - [`Opcode`]: the opcode table (which headers follow, whether payload follows).
//! - [`bth`] and [`ext`]: the base and extended transport headers.
//! - [`roce`]: the UDP payload of a RoCEv2 packet (BTH … ICRC) as one value.
//! - [`icrc`]: the invariant CRC, strict and "up to the unknown IPv4 ID".
//! - [`packet`]: whole IP packets (IPv4/IPv6 + UDP + RoCE), via `etherparse`.
//! - [`build`]: builders for hand-made packets (probes, tests, examples).
//!
//! Connection management rides on top, as the payload of UD SENDs to QP 1:
//! - [`mad`]: the 256-byte management datagram and its common header.
//! - [`cm`]: the communication manager's messages (REQ, REP, RTU, DREQ, …).
//! - [`cma`]: what rdma_cm adds: service IDs from port spaces, and the CMA
//!   header in the private data.

#[macro_use]
mod bytes;
mod error;

pub mod bth;
pub mod build;
pub mod cm;
pub mod cma;
pub mod ext;
pub mod icrc;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod roce;
pub mod train;

pub use bth::{Bth, BthRepr};
pub use cm::{CmMad, CmMessage};
pub use cma::{CmaHeader, CmaHeaderRepr, PortSpace};
pub use error::{Error, Result};
pub use ext::{
    Aeth, AethRepr, AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, Deth, DethRepr, Feth, FethRepr, Ieth,
    ImmDt, NakCode, Reth, RethRepr, Syndrome,
};
pub use mad::{Mad, MadRepr};
pub use opcode::{Headers, Opcode, Operation, Transport};
pub use packet::{IpHeader, Packet, ROCE_UDP_PORT};
pub use psn::Psn;
pub use roce::RoceRepr;
