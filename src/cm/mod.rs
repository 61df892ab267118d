//! Connection management: connecting queue pairs by the IB Communication
//! Manager's protocol (IBTA chapter 12), the way the Linux kernel's `ib_cm`
//! and `rdma_cm` do it, so that a softroce process and a kernel one can
//! connect to each other by IP address.
//!
//! - [`protocol`]: the CM as a sans-IO state machine: MADs and time in; MADs,
//!   events and a deadline out.

pub mod protocol;
