//! Event channels (`rdma_event_channel`): where the events of ids arrive.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{CmEvent, CmOptions};
use crate::engine::EventFd;
use crate::verbs::Result;

/// A queue of [`CmEvent`]s with a descriptor that is readable while events
/// wait, for `poll`, epoll and async runtimes (the fd of librdmacm's channel).
/// Clones are the same channel.
#[derive(Debug, Clone)]
pub struct EventChannel {
    pub(super) shared: Arc<ChannelShared>,
}

#[derive(Debug)]
pub(super) struct ChannelShared {
    events: Mutex<VecDeque<CmEvent>>,
    arrived: Condvar,
    /// Counts the waiting events.
    fd: EventFd,
    /// What ids created on the channel reach their devices with.
    pub(super) options: CmOptions,
}

impl EventChannel {
    /// `rdma_create_event_channel`, with [`CmOptions::default`].
    pub fn new() -> Result<EventChannel> {
        EventChannel::with_options(CmOptions::default())
    }

    /// A channel whose ids find their devices as `options` say.
    pub fn with_options(options: CmOptions) -> Result<EventChannel> {
        let shared = ChannelShared {
            events: Mutex::new(VecDeque::new()),
            arrived: Condvar::new(),
            fd: EventFd::counting()?,
            options,
        };
        Ok(EventChannel { shared: Arc::new(shared) })
    }

    /// The descriptor: readable while events wait. Reading it is the
    /// channel's business; poll it, then [`EventChannel::get_event`].
    pub fn fd(&self) -> RawFd {
        self.shared.fd.as_raw_fd()
    }

    /// `rdma_get_cm_event`: the next event, waiting up to `timeout` (forever
    /// with `None`); `None` if none came.
    pub fn get_event(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut events = self.shared.events.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(event) = events.pop_front() {
                self.shared.fd.take_one();
                drop(events);
                trace_event(&event);
                return Some(event);
            }
            events = match deadline {
                None => self.shared.arrived.wait(events).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
                    self.shared.arrived.wait_timeout(events, left).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
    }

    /// The next event if one waits.
    pub fn try_get_event(&self) -> Option<CmEvent> {
        self.get_event(Some(Duration::ZERO))
    }

    /// Whether both are the same channel.
    pub fn same_as(&self, other: &EventChannel) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl ChannelShared {
    /// Queues `event` and wakes its readers.
    pub(super) fn push(&self, event: CmEvent) {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        events.push_back(event);
        self.fd.signal();
        drop(events);
        self.arrived.notify_one();
    }
}

/// Writes an event the program got into the trace of its id's device, if traced.
fn trace_event(event: &CmEvent) {
    let Some(context) = event.id.context() else { return };
    let Some(trace) = context.tracer() else { return };
    let peer = event.id.peer_addr().map_or_else(|| "-".to_string(), |a| a.to_string());
    let qp = event.conn.as_ref().map(|c| format!(" peer_qp={:#x}", c.qp_num)).unwrap_or_default();
    trace.call("rdma_get_cm_event", format_args!("-> {:?} status={} peer={peer}{qp}", event.kind, event.status));
}
