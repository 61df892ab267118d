//! Scenario tests for the NAK, RNR and timeout paths of the transport.
//!
//! Each test drives one QP through its sans-IO interface ([`support::qp`]):
//! requests and responses are built by hand with `RoceRepr`, fed to
//! `Qp::handle_packet`, and what comes out of `poll_transmit` is parsed back
//! and checked field by field, together with completions, events, timer
//! deadlines, the QP state and memory. No network is involved.

#[path = "../support/mod.rs"]
mod support;

mod qp_states;
mod requester;
mod responder;
