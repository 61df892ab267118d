//! rdma_cm over loopback (rxe-spec/cm.md, M-60 on): ids that resolve,
//! connect, accept, reject and disconnect by address, with the QPs they
//! move. Each test opens its own contexts on a free UDP port, and pins its
//! event channels to them with `CmOptions::with_context`, so tests run in
//! parallel and never touch 4791.

#[path = "../support/mod.rs"]
mod support;

mod api;
mod connect;
mod ud;
