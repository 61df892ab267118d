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
    /// `ibv_post_srq_recv`: queues a receive for any of the SRQ's QPs. As
    /// with [`super::QueuePair::post_recv`], the engine is not woken: a
    /// receive gives it nothing to send (a peer that met RNR retries on its
    /// own timer). UCX's rc_verbs refills its SRQ every few messages, and
    /// each ring woke a sleeping engine that took a CPU from the program.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        lock(&self.srq).post(wr)?;
        Ok(())
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn arm_limit(&self, limit: u32) {
        lock(&self.srq).arm_limit(limit);
    }

    /// Receives it holds at most, SGEs per receive, and the armed limit (0:
    /// disarmed): `ibv_query_srq`'s `max_wr`, `max_sge` and `srq_limit`.
    pub fn attr(&self) -> (u32, u32, u32) {
        let srq = lock(&self.srq);
        (srq.max_wr(), srq.max_sge(), srq.limit())
    }

    /// Identifies this SRQ in [`AsyncEvent::SrqLimitReached`](super::AsyncEvent::SrqLimitReached).
    pub fn id(&self) -> u32 {
        self.id
    }
}
