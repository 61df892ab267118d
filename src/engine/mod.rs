//! Engines join the transport to a network: they move packets between QPs
//! and a link, run the timers and collect completions.
//!
//! - [`World`]: a single-threaded engine over any [`crate::net::Link`], in
//!   virtual time (simulated networks: deterministic, for tests, fuzzing and
//!   teaching) or real time (UDP sockets).

pub mod world;

use std::io;

pub use world::{Host, World, PD};

use crate::net::SimNet;

/// A world on the simulated network, in virtual time.
pub type SimWorld<W = io::Sink> = World<SimNet<W>>;
