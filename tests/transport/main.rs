//! The transport (rxe-spec/transport.md) without a network, or over the
//! simulated one:
//!
//! - [`responder`], [`requester`] and [`qp_states`]: one QP driven by hand
//!   through its sans-IO interface ([`support::qp`]), every packet, timer and
//!   completion checked;
//! - [`smoke`] and [`messages`]: two hosts on the simulated network, every
//!   opcode, size and MTU, memory checked byte for byte;
//! - [`soak`]: thousands of seeds of faults, checked against the stack fuzz
//!   target's model;
//! - [`fuzz_regressions`]: what the fuzz targets found, replayed.

#[path = "../support/mod.rs"]
mod support;

// The fuzz targets' drivers (`fuzz/drivers`). The fuzzer builds every
// variant of their input types; the tests build only some.
#[allow(dead_code)]
#[path = "../../fuzz/drivers/responder.rs"]
mod fuzz_responder;
#[allow(dead_code)]
#[path = "../../fuzz/drivers/stack.rs"]
mod fuzz_stack;

mod fuzz_regressions;
mod lending;
mod messages;
mod placement;
mod qp_states;
mod requester;
mod responder;
mod smoke;
mod soak;
