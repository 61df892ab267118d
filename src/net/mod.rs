//! Networks that carry whole IP packets (IP + UDP + RoCE + ICRC) between
//! endpoints identified by IP address.
//!
//! - [`sim`]: a deterministic in-memory network with a virtual clock and fault
//!   injection, for tests and reproducible experiments.

pub mod sim;

pub use sim::{Delivery, Faults, SimNet, Stats};
