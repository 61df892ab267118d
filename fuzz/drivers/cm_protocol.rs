//! The `cm_protocol` fuzz target: two communication managers
//! (`softroce::cm::protocol::Protocol`) and a wire between them that the
//! input runs. Each step delivers, repeats, drops or corrupts a MAD in
//! flight, injects raw bytes from the peer or a stranger, moves the clock
//! by anything from a microsecond to months, or makes a call (listen,
//! connect, accept, reject, ready to use, disconnect, destroy, SIDR) on an
//! ID either side knows. After every step:
//!
//! - nothing panicked;
//! - neither side holds more IDs than `max_connections`;
//! - every MAD sent parses as a CM Send, and goes to the peer it answers;
//! - every event names an ID of its side's slot;
//! - after `handle_timeout(now)`, no deadline is due at `now` any more.
//!
//! Shared by `fuzz/fuzz_targets/cm_protocol.rs` and `tests/cm` (through
//! `#[path]`), which runs it on inputs it draws itself. The input types
//! derive `Arbitrary` only when built by cargo-fuzz (`cfg(fuzzing)`).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

#[cfg(fuzzing)]
use arbitrary::Arbitrary;
use softroce::cm::protocol::{
    CommId, ConnectReply, ConnectRequest, Event, MadPeer, Protocol, ProtocolConfig, SidrReply, SidrRequest, Transmit,
};
use softroce::transport::{Mtu, QpType};
use softroce::verbs::Gid;
use softroce::wire::cm::{RejReason, SidrStatus};
use softroce::wire::mad::method;
use softroce::wire::{CmMad, Psn};

/// The services either side may listen on and connect to.
const SERVICES: [u64; 2] = [0x0106_1c06, 0x0111_1c06];
/// MADs in flight beyond this many per direction are lost.
const MAX_IN_FLIGHT: usize = 64;
/// Steps beyond this many are ignored.
const MAX_STEPS: usize = 256;

/// A run: the two sides' bounds and what happens.
#[cfg_attr(fuzzing, derive(Arbitrary))]
#[derive(Debug, Clone)]
pub struct Input {
    /// Each side's `max_connections`, 1 to 16.
    pub max_connections: u8,
    /// The backlog of a listen call, 0 to 7.
    pub backlog: u8,
    /// What happens, in order.
    pub steps: Vec<Step>,
}

/// One thing that happens. `side` picks a protocol (even: A, odd: B),
/// `pick` an ID it knows or a MAD in flight to it.
#[cfg_attr(fuzzing, derive(Arbitrary))]
#[derive(Debug, Clone)]
pub enum Step {
    /// The MAD in flight at `pick` reaches `side`, with `changes` (offset,
    /// byte) applied; `repeat` leaves it in flight to arrive again.
    Deliver { side: u8, pick: u8, repeat: bool, changes: Vec<(u8, u8)> },
    /// The MAD in flight at `pick` is lost.
    Lose { side: u8, pick: u8 },
    /// Raw bytes reach `side`, from its peer or (`stranger`) from elsewhere.
    Raw { side: u8, stranger: bool, bytes: Vec<u8> },
    /// The clock moves 2^(`log2_micros` % 45) µs: up to about a year.
    Advance { log2_micros: u8 },
    /// A call on `side`.
    Call { side: u8, call: Call, pick: u8, service: bool },
}

/// The calls of the protocol's interface.
#[cfg_attr(fuzzing, derive(Arbitrary))]
#[derive(Debug, Clone, Copy)]
pub enum Call {
    Listen,
    Unlisten,
    Connect,
    Accept,
    ReadyToUse,
    Reject,
    Disconnect,
    Destroy,
    SidrRequest,
    SidrReply,
}

struct Side {
    cm: Protocol,
    at: MadPeer,
    slot: u8,
    /// IDs it reported or returned, live or not.
    ids: Vec<CommId>,
    /// MADs on their way to it.
    in_flight: Vec<[u8; 256]>,
}

fn peer(last: u8) -> MadPeer {
    MadPeer { gid: Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))), qpn: 1 }
}

/// How far a run got: events seen, by kind, on both sides.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reached {
    pub requests: usize,
    pub established: usize,
    pub rejected: usize,
    pub disconnected: usize,
    pub timewait_exits: usize,
    pub sidr_replies: usize,
}

/// Runs `input`, panicking if a check fails; says how far it got.
pub fn run(input: &Input) -> Reached {
    let mut reached = Reached::default();
    let max_connections = usize::from(input.max_connections % 16) + 1;
    let config = |slot: u8| ProtocolConfig {
        slot,
        local_ca_guid: u64::from(slot),
        max_connections,
        response_timeout: 20,
        max_cm_retries: 3,
    };
    let mut sides = [1u8, 2].map(|slot| Side {
        cm: Protocol::new(config(slot), u32::from(slot) << 20),
        at: peer(slot),
        slot,
        ids: Vec::new(),
        in_flight: Vec::new(),
    });
    let stranger = peer(99);
    let mut now = Instant::now();
    for step in input.steps.iter().take(MAX_STEPS) {
        match step {
            Step::Deliver { side, pick, repeat, changes } => {
                let (to, from) = pair(&mut sides, *side);
                if to.in_flight.is_empty() {
                    continue;
                }
                let at = usize::from(*pick) % to.in_flight.len();
                let mut mad = if *repeat { to.in_flight[at] } else { to.in_flight.remove(at) };
                for &(offset, byte) in changes {
                    mad[usize::from(offset)] = byte;
                }
                to.cm.handle_mad(now, from.at, &mad);
            }
            Step::Lose { side, pick } => {
                let to = &mut sides[usize::from(side % 2)];
                if !to.in_flight.is_empty() {
                    let at = usize::from(*pick) % to.in_flight.len();
                    to.in_flight.remove(at);
                }
            }
            Step::Raw { side, stranger: from_stranger, bytes } => {
                let (to, from) = pair(&mut sides, *side);
                to.cm.handle_mad(now, if *from_stranger { stranger } else { from.at }, bytes);
            }
            Step::Advance { log2_micros } => {
                now += Duration::from_micros(1 << (log2_micros % 45));
                for side in &mut sides {
                    side.cm.handle_timeout(now);
                    if let Some(next) = side.cm.poll_timeout() {
                        assert!(next > now, "a deadline due at {now:?} was left: {next:?}");
                    }
                }
            }
            Step::Call { side, call, pick, service } => {
                let (me, other) = pair(&mut sides, *side);
                call_on(me, other.at, now, *call, *pick, SERVICES[usize::from(*service)], input.backlog % 8);
            }
        }
        for index in 0..2 {
            collect(&mut sides, index, stranger, max_connections, &mut reached);
        }
    }
    reached
}

/// `sides[side % 2]` and the other one.
fn pair(sides: &mut [Side; 2], side: u8) -> (&mut Side, &mut Side) {
    let [a, b] = sides;
    if side.is_multiple_of(2) {
        (a, b)
    } else {
        (b, a)
    }
}

/// Makes `call` on `me`, on the ID `pick` chooses. Errors are fine: the
/// input calls at random; only panics and broken checks are failures.
fn call_on(me: &mut Side, other: MadPeer, now: Instant, call: Call, pick: u8, service: u64, backlog: u8) {
    let id = if me.ids.is_empty() { 0 } else { me.ids[usize::from(pick) % me.ids.len()] };
    let cm = &mut me.cm;
    let _ = match call {
        Call::Listen => cm.listen(service, u32::from(backlog)),
        Call::Unlisten => {
            cm.unlisten(service);
            Ok(())
        }
        Call::Connect => {
            let request = ConnectRequest {
                peer: other,
                service_id: service,
                local_gid: me.at.gid,
                qpn: u32::from(pick) + 0x10,
                qp_type: if pick.is_multiple_of(2) { QpType::Rc } else { QpType::Uc },
                starting_psn: Psn::new(u32::from(pick) * 977),
                path_mtu: Mtu::Mtu1024,
                responder_resources: 1,
                initiator_depth: 1,
                retry_count: 7,
                rnr_retry_count: 7,
                local_ack_timeout: pick % 32,
                srq: false,
                flow_control: false,
                traffic_class: 0,
                hop_limit: pick,
                flow_label: 0,
                pkey: 0xffff,
                private_data: vec![pick; usize::from(pick) % 100],
            };
            cm.connect(now, request).map(|id| me.ids.push(id))
        }
        Call::Accept => {
            let reply = ConnectReply {
                qpn: u32::from(pick) + 0x20,
                starting_psn: Psn::new(u32::from(pick) * 131),
                responder_resources: 1,
                initiator_depth: 1,
                rnr_retry_count: 7,
                srq: false,
                flow_control: false,
                private_data: vec![pick; usize::from(pick) % 200],
            };
            cm.accept(now, id, reply)
        }
        Call::ReadyToUse => cm.ready_to_use(now, id, &[pick; 3]),
        Call::Reject => cm.reject(now, id, RejReason::CONSUMER_DEFINED, &vec![pick; usize::from(pick)]),
        Call::Disconnect => cm.disconnect(now, id, &[pick; 4]),
        Call::Destroy => {
            cm.destroy(now, id);
            Ok(())
        }
        Call::SidrRequest => {
            let request = SidrRequest { peer: other, service_id: service, pkey: 0xffff, private_data: vec![pick; 8] };
            cm.sidr_request(now, request).map(|id| me.ids.push(id))
        }
        Call::SidrReply => {
            let reply = SidrReply { status: SidrStatus::SUCCESS, qpn: 0x33, qkey: 0x0123_4567, private_data: vec![] };
            cm.sidr_reply(now, id, reply)
        }
    };
}

/// Takes `sides[index]`'s transmits and events, checking each, and puts the
/// MADs for the other side in flight to it.
fn collect(sides: &mut [Side; 2], index: usize, stranger: MadPeer, max_connections: usize, reached: &mut Reached) {
    let other_at = sides[1 - index].at;
    let side = &mut sides[index];
    assert!(side.cm.stats().live_ids <= max_connections, "{:?}", side.cm.stats());
    let mut outgoing: Vec<Transmit> = Vec::new();
    while let Some(t) = side.cm.poll_transmit() {
        let mad = CmMad::parse(&t.mad).expect("every MAD sent parses");
        assert_eq!(mad.header.method, method::SEND);
        assert!(t.to == other_at || t.to == stranger, "a MAD to nobody: {t:?}");
        outgoing.push(t);
    }
    while let Some(event) = side.cm.poll_event() {
        match event {
            Event::Request { .. } => reached.requests += 1,
            Event::Established { .. } => reached.established += 1,
            Event::Rejected { .. } => reached.rejected += 1,
            Event::Disconnected { .. } | Event::DisconnectRequest { .. } => reached.disconnected += 1,
            Event::TimewaitExit { .. } => reached.timewait_exits += 1,
            Event::SidrReply { .. } => reached.sidr_replies += 1,
            _ => {}
        }
        let id = match event {
            Event::Request { id, .. }
            | Event::Reply { id, .. }
            | Event::Established { id }
            | Event::Rejected { id, .. }
            | Event::DisconnectRequest { id, .. }
            | Event::Disconnected { id }
            | Event::TimewaitExit { id }
            | Event::SidrRequest { id, .. }
            | Event::SidrReply { id, .. }
            | Event::SidrTimeout { id } => id,
        };
        assert_eq!(id >> 24, u32::from(side.slot), "an event for another slot's ID: {event:?}");
        if !side.ids.contains(&id) && side.ids.len() < 64 {
            side.ids.push(id);
        }
    }
    let to = &mut sides[1 - index];
    for t in outgoing {
        if t.to == other_at && to.in_flight.len() < MAX_IN_FLIGHT {
            to.in_flight.push(t.mad);
        }
    }
}
