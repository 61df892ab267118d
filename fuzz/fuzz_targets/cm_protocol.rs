//! Two communication managers over a wire the input runs; see
//! `fuzz/drivers/cm_protocol.rs` for what is checked.

#![no_main]

#[path = "../drivers/cm_protocol.rs"]
mod cm_protocol;

libfuzzer_sys::fuzz_target!(|input: cm_protocol::Input| {
    cm_protocol::run(&input);
});
