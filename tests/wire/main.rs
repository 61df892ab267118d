//! The wire format (rxe-spec/wire.md): real kernel-rxe captures, property
//! tests, and the fuzz seeds drawn from the captures.

#[path = "../support/mod.rs"]
mod support;

mod cm_golden;
mod cm_props;
mod fuzz_seeds;
mod golden;
mod props;
