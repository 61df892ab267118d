//! What a packet means in the context of the packets before it: PSN order,
//! retransmissions, how far its message has got, and which request a response
//! answers.
//!
//! Requests and responses are tracked as separate flows even between the same
//! QPs: a host's requests to a QP and its responses to that QP's requests carry
//! the same addresses and destination QP, yet number their PSNs independently.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use softroce::wire::opcode::Position;
use softroce::wire::{AtomicEthRepr, Operation, Packet, Psn, Syndrome, Transport};

/// The path MTUs RoCE allows; the capture does not say which one a QP uses.
pub const PATH_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// Requests remembered per host pair for matching responses: more than any
/// rxe QP keeps in flight (`max_rd_atomic`), so memory stays bounded.
const AWAITING_LIMIT: usize = 256;

/// What one packet means given its flow.
#[derive(Debug, Clone, Copy)]
pub struct Analysis {
    pub role: Role,
    /// The PSN was already used on this flow: a resent request or response.
    pub retransmission: bool,
    /// Progress of the SEND, WRITE or READ response this packet belongs to.
    pub message: Option<Message>,
}

#[derive(Debug, Clone, Copy)]
pub enum Role {
    Request(Sequence),
    Response {
        /// PSN of the previous positive response (not a NAK) on this flow:
        /// the requests up to it were already acknowledged.
        acknowledged: Option<Psn>,
        /// The READ or atomic request this response answers, if captured.
        answers: Option<Answered>,
    },
}

/// How a request's PSN relates to the PSNs before it on its flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequence {
    /// First request seen on this flow.
    Start,
    /// The PSN right after the previous request's.
    InOrder { previous: Psn },
    /// In order after a READ request, which reserves one PSN per response
    /// packet: `reserved` of them.
    AfterRead { read: Psn, dma_len: u32, reserved: u32 },
    /// Earlier than the flow had got to.
    Behind { expected: Psn },
    /// Later than expected: `missing` PSNs were skipped (at least that many
    /// after a READ, whose span depends on the unknown path MTU).
    Ahead { expected: Psn, missing: u32 },
}

/// A READ or atomic request waiting for its response.
#[derive(Debug, Clone, Copy)]
pub struct Awaiting {
    pub psn: Psn,
    pub request: AwaitingRequest,
}

#[derive(Debug, Clone, Copy)]
pub enum AwaitingRequest {
    Read { dma_len: u32 },
    Atomic { operation: Operation, eth: AtomicEthRepr },
}

/// The request a response answers and where the response sits in its answer.
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    pub request: Awaiting,
    /// Response packets before this one (its PSN minus the request's).
    pub index: u32,
}

/// A SEND, RDMA WRITE or READ response message as seen so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub kind: MessageKind,
    pub packets: u32,
    pub bytes: u64,
    /// Total length known from the first packet's RETH or the READ request.
    pub announced: Option<u32>,
    /// Payload of the FIRST packet, which is always exactly one path MTU.
    pub path_mtu: Option<u32>,
    /// The message's first packet is in the capture.
    pub from_start: bool,
    pub complete: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    Send,
    Write,
    ReadResponse,
}

impl MessageKind {
    /// The kind of message an operation carries data for, if any.
    pub fn of(op: Operation) -> Option<MessageKind> {
        use Operation::*;
        match op {
            SendFirst | SendMiddle | SendLast | SendLastImm | SendOnly | SendOnlyImm | SendLastInv | SendOnlyInv => {
                Some(MessageKind::Send)
            }
            WriteFirst | WriteMiddle | WriteLast | WriteLastImm | WriteOnly | WriteOnlyImm => Some(MessageKind::Write),
            ReadResponseFirst | ReadResponseMiddle | ReadResponseLast | ReadResponseOnly => {
                Some(MessageKind::ReadResponse)
            }
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MessageKind::Send => "SEND",
            MessageKind::Write => "RDMA WRITE",
            MessageKind::ReadResponse => "READ response",
        }
    }
}

/// PSNs a READ of `dma_len` bytes takes at a path MTU: one per response
/// packet, and at least one even for zero bytes.
pub fn read_span(dma_len: u32, path_mtu: u32) -> u32 {
    dma_len.div_ceil(path_mtu).max(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FlowKey {
    src: IpAddr,
    dst: IpAddr,
    dest_qpn: u32,
    requests: bool,
}

#[derive(Debug, Default)]
struct Flow {
    /// PSN of the previous request, or of the previous positive response.
    previous: Option<Psn>,
    /// Length of the previous request when it was a READ.
    previous_read_len: Option<u32>,
    /// One past the highest PSN used so far.
    sent_end: Option<Psn>,
    message: Option<Message>,
}

/// Per-flow state for one capture.
#[derive(Debug, Default)]
pub struct Tracker {
    flows: HashMap<FlowKey, Flow>,
    /// READ and atomic requests by (requester, responder) address.
    awaiting: HashMap<(IpAddr, IpAddr), VecDeque<Awaiting>>,
}

impl Tracker {
    /// Places a packet in its flow and updates the flow.
    pub fn observe(&mut self, pkt: &Packet<'_>) -> Analysis {
        let header = &pkt.roce.header;
        let bth = header.bth;
        let op = bth.opcode.operation();
        let (src, dst) = (pkt.ip.source(), pkt.ip.destination());
        let answers = if op.is_request() {
            self.remember_request(src, dst, pkt);
            None
        } else {
            self.find_request(dst, src, bth.psn, op)
        };

        let key = FlowKey { src, dst, dest_qpn: bth.dest_qpn, requests: op.is_request() };
        let flow = self.flows.entry(key).or_default();
        // ACKs legitimately repeat a PSN; anything else that goes back is resent.
        let resendable = op != Operation::Acknowledge && bth.opcode.transport() == Transport::Rc;
        let retransmission = resendable && flow.sent_end.is_some_and(|end| bth.psn.is_before(end));
        let (role, announced) = if op.is_request() {
            let sequence = match flow.previous {
                None => Sequence::Start,
                Some(previous) => sequence(previous, flow.previous_read_len, bth.psn),
            };
            flow.previous_read_len = header.reth.filter(|_| op == Operation::ReadRequest).map(|r| r.dma_len);
            (Role::Request(sequence), header.reth.map(|r| r.dma_len))
        } else {
            let announced = answers.and_then(|a| match a.request.request {
                AwaitingRequest::Read { dma_len } => Some(dma_len),
                AwaitingRequest::Atomic { .. } => None,
            });
            (Role::Response { acknowledged: flow.previous, answers }, announced)
        };

        let negative = header.aeth.is_some_and(|a| !matches!(a.syndrome, Syndrome::Ack { .. }));
        if !negative {
            flow.previous = Some(bth.psn);
        }
        let next = bth.psn.wrapping_add(1);
        flow.sent_end = Some(match flow.sent_end {
            Some(end) if end.is_after(next) => end,
            _ => next,
        });
        let message = advance(&mut flow.message, op, pkt.roce.payload.len(), announced);
        Analysis { role, retransmission, message }
    }

    /// Keeps READ and atomic requests for matching their responses.
    fn remember_request(&mut self, src: IpAddr, dst: IpAddr, pkt: &Packet<'_>) {
        let header = &pkt.roce.header;
        let (psn, op) = (header.bth.psn, header.bth.opcode.operation());
        let request = match (op, header.reth, header.atomic_eth) {
            (Operation::ReadRequest, Some(reth), _) => AwaitingRequest::Read { dma_len: reth.dma_len },
            (Operation::CompareSwap | Operation::FetchAdd, _, Some(eth)) => {
                AwaitingRequest::Atomic { operation: op, eth }
            }
            _ => return,
        };
        let queue = self.awaiting.entry((src, dst)).or_default();
        queue.retain(|a| a.psn != psn);
        if queue.len() == AWAITING_LIMIT {
            queue.pop_front();
        }
        queue.push_back(Awaiting { psn, request });
    }

    /// The newest request from `requester` to `responder` whose PSN span
    /// holds `psn`, for READ responses and ATOMIC ACKs.
    fn find_request(&self, requester: IpAddr, responder: IpAddr, psn: Psn, op: Operation) -> Option<Answered> {
        let read_response = matches!(
            op,
            Operation::ReadResponseFirst
                | Operation::ReadResponseMiddle
                | Operation::ReadResponseLast
                | Operation::ReadResponseOnly
        );
        if !read_response && op != Operation::AtomicAcknowledge {
            return None;
        }
        let queue = self.awaiting.get(&(requester, responder))?;
        queue.iter().rev().find_map(|awaiting| {
            let index = u32::try_from(psn.diff(awaiting.psn)).ok()?;
            let fits = match awaiting.request {
                AwaitingRequest::Read { dma_len } => read_response && index < read_span(dma_len, PATH_MTUS[0]),
                AwaitingRequest::Atomic { .. } => !read_response && index == 0,
            };
            fits.then_some(Answered { request: *awaiting, index })
        })
    }
}

fn sequence(previous: Psn, previous_read_len: Option<u32>, psn: Psn) -> Sequence {
    let (min_step, max_step) = match previous_read_len {
        Some(len) => (read_span(len, PATH_MTUS[4]), read_span(len, PATH_MTUS[0])),
        None => (1, 1),
    };
    let step = psn.diff(previous);
    if step < min_step as i32 {
        Sequence::Behind { expected: previous.wrapping_add(min_step) }
    } else if step > max_step as i32 {
        Sequence::Ahead { expected: previous.wrapping_add(max_step), missing: step as u32 - max_step }
    } else if let Some(dma_len) = previous_read_len {
        Sequence::AfterRead { read: previous, dma_len, reserved: step as u32 }
    } else {
        Sequence::InOrder { previous }
    }
}

/// Adds a packet to the message in progress on its flow.
fn advance(
    current: &mut Option<Message>,
    op: Operation,
    payload_len: usize,
    announced: Option<u32>,
) -> Option<Message> {
    let kind = MessageKind::of(op)?;
    let position = op.position();
    let mut message = match position {
        Position::First | Position::Only => Message {
            kind,
            packets: 0,
            bytes: 0,
            announced,
            path_mtu: (position == Position::First).then_some(payload_len as u32),
            from_start: true,
            complete: false,
        },
        Position::Middle | Position::Last => current.filter(|m| m.kind == kind && !m.complete).unwrap_or(Message {
            kind,
            packets: 0,
            bytes: 0,
            announced: None,
            path_mtu: None,
            from_start: false,
            complete: false,
        }),
    };
    message.packets += 1;
    message.bytes += payload_len as u64;
    message.complete = matches!(position, Position::Last | Position::Only);
    *current = Some(message);
    Some(message)
}
