//! Completion queues (`ibv_cq`) and completion channels (`ibv_comp_channel`).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::context::ContextInner;
use super::error::{Error, Result};
use crate::engine::threaded::{Arm, ChannelShared, CqShared};
use crate::transport::WorkCompletion;

/// A completion queue (`ibv_cq`).
#[derive(Debug)]
pub struct CompletionQueue {
    pub(super) ctx: Arc<ContextInner>,
    pub(super) shared: Arc<CqShared>,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // QPs may still point at the queue: from now on nothing reaches it
        // and no event fires for it.
        self.shared.destroyed.store(true, Ordering::Release);
        self.shared.arm.store(Arm::Off as u8, Ordering::Release);
        self.shared.clear();
    }
}

impl CompletionQueue {
    /// Moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if self.shared.is_empty() {
            self.ctx.engine.poll_progress(&self.shared);
        }
        let mut n = 0;
        while n < out.len() {
            match self.shared.pop() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        if let Some(trace) = &self.ctx.trace {
            out[..n].iter().for_each(|wc| trace.completion(self.shared.id, wc));
        }
        n
    }

    /// Writes a completion the program got into the trace, if tracing.
    fn traced(&self, wc: Option<WorkCompletion>) -> Option<WorkCompletion> {
        if let (Some(trace), Some(wc)) = (&self.ctx.trace, &wc) {
            trace.completion(self.shared.id, wc);
        }
        wc
    }

    /// The next completion, if one is queued.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        if self.shared.is_empty() {
            self.ctx.engine.poll_progress(&self.shared);
        }
        self.traced(self.shared.pop())
    }

    /// The next completion already queued, without driving progress: for a
    /// thread that waits on the channel's descriptor and leaves receiving to
    /// the engine and to the threads that wait in their CQs (a poll that
    /// drives keeps the engine thread off the sockets for a while).
    pub(crate) fn poll_queued(&self) -> Option<WorkCompletion> {
        self.traced(self.shared.pop())
    }

    /// `ibv_resize_cq`: room for `cqe` completions (within the device's
    /// `max_cqe`), keeping those queued; fewer than are queued is refused.
    pub fn resize(&self, cqe: usize) -> Result<()> {
        let max_cqe = self.ctx.device.query_device().max_cqe;
        if cqe == 0 || cqe > max_cqe as usize {
            return Err(Error::Limit { what: "cqe", max: u64::from(max_cqe) });
        }
        // Completions owed now are counted: sends already on the wire.
        self.ctx.engine.poll_progress(&self.shared);
        self.shared
            .resize(cqe)
            .map_err(|queued| Error::InvalidArgument(format!("{queued} completions queued, more than {cqe}")))
    }

    /// How many completions are queued, not yet polled.
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty()
    }

    /// How many completions it holds at most (`ibv_cq.cqe`).
    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Waits up to `timeout` for a completion (blocking mode).
    pub fn wait_one(&self, timeout: Duration) -> Option<WorkCompletion> {
        self.traced(self.ctx.engine.wait_completion(&self.shared, timeout))
    }

    /// `ibv_req_notify_cq`: the next completion (or, with `solicited_only`,
    /// the next solicited or failed one) raises one event on the channel.
    pub fn req_notify(&self, solicited_only: bool) {
        // As in libibverbs, completions already queued raise no event: poll
        // after arming to catch them.
        let arm = if solicited_only { Arm::Solicited } else { Arm::Next };
        self.shared.arm.store(arm as u8, Ordering::Release);
    }

    /// Completions were lost because the queue was full.
    pub fn overflowed(&self) -> bool {
        self.shared.overflowed.load(Ordering::Relaxed)
    }

    /// Identifies this CQ in channel events.
    pub fn id(&self) -> u32 {
        self.shared.id
    }
}

/// A completion channel (`ibv_comp_channel`): its file descriptor is
/// readable while events wait, so it works with poll, epoll and async runtimes.
#[derive(Debug)]
pub struct CompletionChannel {
    pub(super) ctx: Arc<ContextInner>,
    pub(super) shared: Arc<ChannelShared>,
}

impl CompletionChannel {
    /// The next event: the id of the CQ that fired. Waits up to `timeout`.
    pub fn get_event(&self, timeout: Duration) -> Option<u32> {
        let events = &self.shared.events.1;
        if events.is_empty() {
            // Drives progress meanwhile, if nobody else does.
            self.ctx.engine.wait_event(&self.shared, timeout);
        }
        // The descriptor counts the events: it stays readable exactly while
        // events wait.
        let id = events.try_recv().ok();
        if id.is_some() {
            self.shared.fd.take_one();
        }
        id
    }
}

impl CompletionChannel {
    /// Takes the events already queued, without driving progress (see
    /// [`CompletionQueue::poll_queued`]).
    pub(crate) fn take_queued_events(&self) {
        while self.shared.events.1.try_recv().is_ok() {
            self.shared.fd.take_one();
        }
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.fd.as_raw_fd()
    }
}
