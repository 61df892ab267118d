//! A responder fed hand-built requests; see `fuzz/drivers/responder.rs` for
//! what is checked.

#![no_main]

#[path = "../drivers/responder.rs"]
mod responder;

libfuzzer_sys::fuzz_target!(|input: responder::Input| responder::run(&input));
