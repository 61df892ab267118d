//! Memory windows (`ibv_mw`): remote access to part of a memory region,
//! granted and revoked through a QP's send queue without registering again.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::context::ContextInner;
use super::MemoryRegion;
pub use crate::transport::memory::WindowType;
use crate::transport::{Access, MwBind};

/// A memory window (`ibv_mw`). Unbound when allocated: a
/// [`SendOp::BindMw`](super::SendOp::BindMw) request
/// ([`MemoryWindow::bind_request`]) binds it, with a completion
/// ([`WcOpcode::BindMw`](super::WcOpcode::BindMw)) once done.
#[derive(Debug)]
pub struct MemoryWindow {
    pub(super) ctx: Arc<ContextInner>,
    pub(super) kind: WindowType,
    /// The R_Key of the last bind posted through `QueuePair::bind_mw`
    /// (`ibv_mw.rkey`), or the key it was allocated with.
    pub(super) rkey: AtomicU32,
}

impl MemoryWindow {
    /// Its type.
    pub fn kind(&self) -> WindowType {
        self.kind
    }

    /// The R_Key peers name it by once its last bind completes.
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Relaxed)
    }

    /// A bind of the window to `[addr, addr + length)` of `mr` with
    /// `access` (remote rights; length 0 and no region unbind a type 1
    /// window), under a new R_Key: the low byte of the current one plus one
    /// (`ibv_inc_rkey`). Post it with [`QueuePair::bind_mw`](super::QueuePair::bind_mw)
    /// or as a [`SendOp::BindMw`](super::SendOp::BindMw) request.
    pub fn bind_request(&self, mr: Option<&MemoryRegion>, addr: u64, length: u64, access: Access) -> MwBind {
        let mw_rkey = self.rkey();
        let rkey = (mw_rkey & !0xff) | (mw_rkey.wrapping_add(1) & 0xff);
        MwBind { mw_rkey, rkey, mr_lkey: mr.map_or(0, MemoryRegion::lkey), addr, length, access }
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // Its key stops working at once (rxe: the window goes invalid).
        let mut registry = self.ctx.engine.shared.registry.write().unwrap_or_else(|e| e.into_inner());
        registry.windows_mut().dealloc(self.rkey());
    }
}
