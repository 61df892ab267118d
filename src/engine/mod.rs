//! Engines join the transport to a network: they move packets between QPs
//! and a link, run the timers and collect completions.
//!
//! - [`sim`]: a single-threaded engine over the simulated network, in
//!   virtual time — deterministic, for tests, fuzzing and teaching.

pub mod sim;

pub use sim::{Host, SimWorld};
