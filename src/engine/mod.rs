//! Engines join the transport to a network: they move packets between QPs
//! and a link, run the timers and collect completions.
//!
//! - the threaded engine behind a verbs context (`threaded`): one thread per
//!   device that owns the UDP link, woken by a doorbell.
//! - [`World`]: a single-threaded engine over any [`crate::net::Link`], in
//!   virtual time (simulated networks: deterministic, for tests, fuzzing and
//!   teaching) or real time (UDP sockets).

mod eventfd;
mod registry;
pub(crate) mod threaded;
pub mod world;

pub use eventfd::EventFd;
pub use registry::{RawRegion, Registry, RegistryAccess};

use std::io;

pub use world::{Host, World, PD};

use crate::net::SimNet;

/// A world on the simulated network, in virtual time.
pub type SimWorld<W = io::Sink> = World<SimNet<W>>;
