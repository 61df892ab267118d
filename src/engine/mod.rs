//! Engines join the transport to a network: they move packets between QPs
//! and a link, run the timers and collect completions.
//!
//! - the threaded engine behind a verbs context (`threaded`): one thread per
//!   device that owns the UDP link, woken by a doorbell, while application
//!   threads drive progress themselves where they can (`handover`), with
//!   the knobs of `tuning`.
//! - [`World`]: a single-threaded engine over any [`crate::net::Link`], in
//!   virtual time (simulated networks: deterministic, for tests, fuzzing and
//!   teaching) or real time (UDP sockets).
//!
//! Both hand packets, timers and transmissions to the QPs the same way
//! (`dispatch`).
//!
//! The registry of raw memory ranges the engine writes into is the crate's
//! own: safe code outside it cannot register an address, so it cannot make
//! the engine write anywhere (regions come only from
//! [`crate::verbs::ProtectionDomain::reg_mr`], which is `unsafe`, or from
//! memory the crate allocates itself). This does not compile:
//!
//! ```compile_fail
//! use softroce::engine::RawRegion;
//! ```
//!
//! ```compile_fail
//! use softroce::engine::{Registry, RegistryAccess};
//! ```

mod budget;
mod clock;
mod dispatch;
#[allow(unsafe_code)]
mod eventfd;
mod handover;
#[allow(unsafe_code)]
mod registry;
pub(crate) mod threaded;
mod tuning;
pub mod world;

pub use eventfd::EventFd;
pub(crate) use registry::RawRegion;
pub use threaded::EngineCpus;

use std::io;

pub use world::{Host, World, PD};

use crate::net::SimNet;

/// A world on the simulated network, in virtual time.
pub type SimWorld<W = io::Sink> = World<SimNet<W>>;
