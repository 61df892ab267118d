//! Shared receive queues (`ibv_srq`).

use std::sync::{Arc, Mutex};

use super::context::ContextInner;
use super::error::Result;
use crate::engine::threaded::lock;
use crate::transport::{RecvWr, Srq};

/// A shared receive queue (`ibv_srq`).
#[derive(Debug)]
pub struct SharedReceiveQueue {
    pub(super) ctx: Arc<ContextInner>,
    pub(super) srq: Arc<Mutex<Srq>>,
    pub(super) id: u32,
}

impl SharedReceiveQueue {
    /// `ibv_post_srq_recv`: queues a receive for any of the SRQ's QPs.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        lock(&self.srq).post(wr)?;
        self.ctx.engine.shared.ring();
        Ok(())
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn arm_limit(&self, limit: u32) {
        lock(&self.srq).arm_limit(limit);
    }

    /// Identifies this SRQ in [`AsyncEvent::SrqLimitReached`].
    pub fn id(&self) -> u32 {
        self.id
    }
}
