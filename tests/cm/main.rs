//! Connection management (rxe-spec/cm.md, M-20 onward): the IB CM of
//! `softroce::cm::protocol` without a network. Two `Protocol`s talk through
//! [`Pipe`], an in-memory wire that can lose MADs, under a fake clock that
//! jumps from deadline to deadline; the kernel's own MADs come from the
//! captures in `tests/data/cm`.
//!
//! - [`protocol`]: handshakes, rejections, losses, retries, teardown, SIDR;
//! - [`golden`]: the kernel's REQ from rping, answered; our REQ and REP
//!   against the kernel's;
//! - [`hostile`]: floods and garbage, and the bounds that hold under them,
//!   and the `cm_protocol` fuzz target's checks on random runs.
//!
//! And rdma_cm over loopback (M-60 onward): ids that resolve, connect,
//! accept, reject and disconnect by address, with the QPs they move. Each
//! of those tests opens its own contexts on a free UDP port and pins its
//! event channels to them with `CmOptions::with_context`, so tests run in
//! parallel and never touch 4791.
//!
//! - [`api`]: addresses, routes, ports, the process's contexts, QP INIT;
//! - [`connect`]: RC connections, data, rejection, disconnection, a shared port;
//! - [`ud`]: UD peers resolved by SIDR.

#[path = "../support/mod.rs"]
mod support;

// The `cm_protocol` fuzz target's driver (`fuzz/drivers`), run here on
// inputs drawn by the tests.
#[path = "../../fuzz/drivers/cm_protocol.rs"]
mod fuzz_cm_protocol;

mod api;
mod connect;
mod golden;
mod hostile;
mod protocol;
mod ud;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softroce::cm::protocol::{
    CommId, ConnectReply, ConnectRequest, Event, MadPeer, Protocol, ProtocolConfig, Transmit,
};
use softroce::transport::{Mtu, QpType};
use softroce::verbs::Gid;
use softroce::wire::cm::attr;
use softroce::wire::{CmMad, Psn};

/// The GSI peer at an IPv4 address.
fn peer(ip: [u8; 4]) -> MadPeer {
    MadPeer { gid: Gid::from_ip(IpAddr::V4(Ipv4Addr::from(ip))), qpn: 1 }
}

/// Rdma_cm's defaults: response timeout 20, 15 retries.
fn config(slot: u8, guid: u64) -> ProtocolConfig {
    ProtocolConfig { slot, local_ca_guid: guid, max_connections: 4096, response_timeout: 20, max_cm_retries: 15 }
}

/// The service ID of rdma_cm's TCP port space, port 7174.
const SERVICE: u64 = 0x0106_1c06;

/// A REQ from `from` to `to` for [`SERVICE`], with rping's parameters.
fn connect_request(from: MadPeer, to: MadPeer, qpn: u32) -> ConnectRequest {
    ConnectRequest {
        peer: to,
        service_id: SERVICE,
        local_gid: from.gid,
        qpn,
        qp_type: QpType::Rc,
        starting_psn: Psn::new(qpn * 7),
        path_mtu: Mtu::Mtu1024,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        local_ack_timeout: 19,
        srq: false,
        flow_control: true,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
        pkey: 0xffff,
        private_data: b"hello".to_vec(),
    }
}

/// A REP with `qpn`.
fn connect_reply(qpn: u32) -> ConnectReply {
    ConnectReply {
        qpn,
        starting_psn: Psn::new(qpn * 11),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        flow_control: true,
        private_data: b"welcome".to_vec(),
    }
}

/// The CM attribute of a transmit.
fn attribute(t: &Transmit) -> u16 {
    u16::from_be_bytes([t.mad[16], t.mad[17]])
}

/// One end of the pipe: a protocol, its address, what it reported.
struct End {
    cm: Protocol,
    at: MadPeer,
    events: Vec<Event>,
    /// Answer REQs with REP and REPs with RTU as they come.
    auto_answer: bool,
    /// Every MAD it sent, in order, delivered or not.
    sent: Vec<Transmit>,
}

impl End {
    /// An end with CM response timeout code `response_timeout` and
    /// `max_cm_retries` retries.
    fn new(slot: u8, ip: [u8; 4], response_timeout: u8, max_cm_retries: u8) -> End {
        let guid = 0x0200_00ff_fe00_0000 | u64::from(ip[3]);
        let config = ProtocolConfig { response_timeout, max_cm_retries, ..config(slot, guid) };
        End {
            cm: Protocol::new(config, u32::from(ip[3]) << 16),
            at: peer(ip),
            events: Vec::new(),
            auto_answer: true,
            sent: Vec::new(),
        }
    }

    /// The events that came since the last call.
    fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// How many MADs of `attribute` it sent.
    fn sent_of(&self, attribute_id: u16) -> usize {
        self.sent.iter().filter(|t| attribute(t) == attribute_id).count()
    }
}

/// Whether the wire loses a MAD, given its sender (0 = a, 1 = b).
type Loss = Box<dyn FnMut(usize, &Transmit) -> bool>;

/// Two protocols and the wire between them, with a fake clock. `lose`
/// decides, for each MAD in flight (sender 0 = a, 1 = b), whether it is lost.
struct Pipe {
    a: End,
    b: End,
    now: Instant,
    start: Instant,
    lose: Loss,
}

impl Pipe {
    /// Two ends with rdma_cm's timing.
    fn new() -> Pipe {
        Pipe::with_timing(20, 15)
    }

    /// Two ends with CM response timeout code `response_timeout` and
    /// `max_cm_retries` retries.
    fn with_timing(response_timeout: u8, max_cm_retries: u8) -> Pipe {
        let now = Instant::now();
        Pipe {
            a: End::new(1, [10, 0, 0, 1], response_timeout, max_cm_retries),
            b: End::new(2, [10, 0, 0, 2], response_timeout, max_cm_retries),
            now,
            start: now,
            lose: Box::new(|_, _| false),
        }
    }

    /// Seconds since the pipe was made.
    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Delivers everything in flight, and answers what the ends auto-answer,
    /// until both are quiet.
    fn deliver(&mut self) {
        loop {
            let mut moved = false;
            for side in 0..2 {
                let (from, to) = if side == 0 { (&mut self.a, &mut self.b) } else { (&mut self.b, &mut self.a) };
                while let Some(t) = from.cm.poll_transmit() {
                    moved = true;
                    from.sent.push(t.clone());
                    assert_eq!(t.to, to.at, "every MAD goes to the other end");
                    if !(self.lose)(side, &t) {
                        to.cm.handle_mad(self.now, from.at, &t.mad);
                    }
                }
            }
            for end in [&mut self.a, &mut self.b] {
                while let Some(event) = end.cm.poll_event() {
                    moved = true;
                    if end.auto_answer {
                        answer(end, self.now, &event);
                    }
                    end.events.push(event);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Delivers, then jumps the clock from deadline to deadline, for at most `span`.
    fn run_for(&mut self, span: Duration) {
        let end = self.now + span;
        loop {
            self.deliver();
            let next = [self.a.cm.poll_timeout(), self.b.cm.poll_timeout()].into_iter().flatten().min();
            match next {
                Some(at) if at <= end => {
                    self.now = self.now.max(at);
                    self.a.cm.handle_timeout(self.now);
                    self.b.cm.handle_timeout(self.now);
                }
                _ => {
                    self.now = end;
                    return;
                }
            }
        }
    }

    /// Runs until no deadline is left (at most an hour of fake time).
    fn run(&mut self) {
        self.run_for(Duration::from_secs(3600));
        assert_eq!((self.a.cm.poll_timeout(), self.b.cm.poll_timeout()), (None, None), "an hour settles everything");
    }

    /// A connects to B, which listens: A's ID.
    fn connect(&mut self, qpn: u32) -> CommId {
        let req = connect_request(self.a.at, self.b.at, qpn);
        self.a.cm.connect(self.now, req).expect("connect")
    }
}

/// What an auto-answering end does with an event: accept every REQ, ready
/// every REP, answer every DREQ.
fn answer(end: &mut End, now: Instant, event: &Event) {
    match event {
        Event::Request { id, req, .. } => end.cm.accept(now, *id, connect_reply(req.local_qpn + 0x100)).unwrap(),
        Event::Reply { id, .. } => end.cm.ready_to_use(now, *id, b"").unwrap(),
        Event::DisconnectRequest { id, .. } => end.cm.disconnect(now, *id, b"").unwrap(),
        _ => {}
    }
}

/// The parsed MAD of a transmit.
fn parsed(t: &Transmit) -> CmMad {
    CmMad::parse(&t.mad).expect("we send only what parses")
}

/// Whether a transmit is a MAD of `attribute_id`.
fn is(attribute_id: u16) -> impl Fn(&Transmit) -> bool {
    move |t| attribute(t) == attribute_id
}

/// Loses the first `n` MADs of `attribute_id` that `side` sends.
fn lose_first(side: usize, attribute_id: u16, n: usize) -> Loss {
    let mut left = n;
    Box::new(move |s, t| {
        if s == side && attribute(t) == attribute_id && left > 0 {
            left -= 1;
            return true;
        }
        false
    })
}

/// The REQ attribute, for tests that name it often.
const REQ: u16 = attr::REQ;
