//! softroce as `libibverbs.so.1` and `librdmacm.so.1`: a drop-in for rdma-core's verbs and
//! connection manager libraries (one file under both names, see `cm`).
//!
//! The cdylib exports the symbols of Debian bookworm's libibverbs.so.1 (rdma-core 44) at the
//! same versions (`symbols.txt`, checked by `tests/exports.rs`), so unmodified programs and the
//! provider libraries they pull in load against it. The rlib exists for tests.

// First: the export table's macros are used by the modules after it.
#[macro_use]
mod exports;

mod cm;
#[rustfmt::skip]
pub mod cm_sys;
mod cq;
mod device;
pub mod errno;
mod exit;
mod fork;
pub mod guard;
mod mw;
mod pd;
mod private;
mod qp;
mod srq;
mod strs;
mod sysfs;
#[rustfmt::skip]
pub mod sys;
mod unimplemented;
mod users;

pub use device::{VerbsDevice, ADDR_ENV, PCAP_ENV, PCAP_PACKETS_ENV, PORT_ENV};
