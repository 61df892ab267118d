//! Devices and the verbs API over loopback UDP (rxe-spec/verbs.md): each
//! test opens its own devices on a free UDP port, so they run in parallel.
//! The verbs with every opcode are in `tests/verbs_ops.rs`, the choice of a
//! device by `SOFTROCE_DEVICE` in `tests/device_env.rs`.

#[path = "../support/mod.rs"]
mod support;

mod device;
mod errors;
mod progress;
mod smoke;
