//! Devices and the verbs API over loopback UDP (rxe-spec/verbs.md): each
//! test opens its own devices on a free UDP port, so they run in parallel.
//!
//! Two binaries of their own belong here: `tests/device_env.rs` (the choice
//! of a device by `SOFTROCE_DEVICE`, which sets the environment) and
//! `tests/verbs_ops.rs` (every verb and opcode), which rxe-spec/cabi.md
//! names by that path.

#[path = "../support/mod.rs"]
mod support;

mod device;
mod errors;
mod gsi;
mod many_qps;
mod multicast;
mod placement;
mod progress;
mod rereg;
mod resize;
mod smoke;
mod windows;
