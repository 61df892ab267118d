//! Two hosts on the simulated network, with faults and requests the input
//! chooses; see `fuzz/drivers/stack.rs` for what is checked.

#![no_main]

#[path = "../drivers/stack.rs"]
mod stack;

libfuzzer_sys::fuzz_target!(|input: stack::Input| stack::run(&input));
