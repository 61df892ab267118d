//! Shared receive queues.

use std::collections::VecDeque;

use super::types::RecvWr;

/// Why a receive could not be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostRecvError {
    /// The queue holds `max_wr` receives already.
    QueueFull {
        /// The queue's capacity.
        max_wr: u32,
    },
    /// More scatter/gather elements than the queue was created with.
    TooManySge {
        /// SGEs in the request.
        given: usize,
        /// The most the queue accepts.
        max: u32,
    },
    /// The QP is in RESET, or uses an SRQ (post to the SRQ instead).
    InvalidState,
}

impl std::fmt::Display for PostRecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostRecvError::QueueFull { max_wr } => write!(f, "receive queue full ({max_wr} WRs)"),
            PostRecvError::TooManySge { given, max } => {
                write!(f, "{given} scatter/gather elements, at most {max} allowed")
            }
            PostRecvError::InvalidState => {
                write!(f, "receives cannot be posted to this QP in its current state")
            }
        }
    }
}

impl std::error::Error for PostRecvError {}

/// A receive queue several QPs draw from. When the number of posted receives
/// falls below an armed limit, the SRQ raises one limit event and disarms.
#[derive(Debug)]
pub struct Srq {
    id: u32,
    queue: VecDeque<RecvWr>,
    max_wr: u32,
    max_sge: u32,
    /// 0 = disarmed.
    limit: u32,
    limit_reached: bool,
}

impl Srq {
    /// An empty SRQ, limit disarmed, holding at most `max_wr` receives of at
    /// most `max_sge` SGEs each. `id` names it in events and to its QPs.
    pub fn new(id: u32, max_wr: u32, max_sge: u32) -> Srq {
        Srq { id, queue: VecDeque::new(), max_wr, max_sge, limit: 0, limit_reached: false }
    }

    /// The id given at creation.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Receives it holds at most.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// SGEs each receive may have.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// Receives posted and not yet taken by a QP.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no receive is posted.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`); 0 disarms.
    pub fn arm_limit(&mut self, limit: u32) {
        self.limit = limit;
    }

    /// The armed limit; 0 when disarmed (also after the event fired).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// `ibv_post_srq_recv`: queues a receive for any of the SRQ's QPs.
    pub fn post(&mut self, wr: RecvWr) -> Result<(), PostRecvError> {
        if wr.sg_list.len() > self.max_sge as usize {
            return Err(PostRecvError::TooManySge { given: wr.sg_list.len(), max: self.max_sge });
        }
        if self.queue.len() >= self.max_wr as usize {
            return Err(PostRecvError::QueueFull { max_wr: self.max_wr });
        }
        self.queue.push_back(wr);
        Ok(())
    }

    /// Takes the oldest receive; arms the limit event if the count fell below it.
    pub(crate) fn take(&mut self) -> Option<RecvWr> {
        let wr = self.queue.pop_front()?;
        if self.limit != 0 && (self.queue.len() as u32) < self.limit {
            self.limit = 0;
            self.limit_reached = true;
        }
        Some(wr)
    }

    /// Returns true once after the limit was crossed (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    pub fn poll_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_event_fires_once_then_disarms() {
        let mut srq = Srq::new(1, 4, 1);
        for i in 0..4 {
            srq.post(RecvWr { wr_id: i, sg_list: crate::sg_list![] }).unwrap();
        }
        assert_eq!(
            srq.post(RecvWr { wr_id: 9, sg_list: crate::sg_list![] }),
            Err(PostRecvError::QueueFull { max_wr: 4 })
        );
        srq.arm_limit(3);
        assert_eq!(srq.take().unwrap().wr_id, 0);
        assert!(!srq.poll_limit_event()); // 3 left, not below 3
        assert_eq!(srq.take().unwrap().wr_id, 1);
        assert!(srq.poll_limit_event());
        assert!(!srq.poll_limit_event());
        assert_eq!(srq.limit(), 0);
        srq.take();
        assert!(!srq.poll_limit_event());
    }
}
