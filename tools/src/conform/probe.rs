//! The probe's side of the wire: one RoCE socket (two with a second local
//! address, for packets from the wrong source), the packets of each of our
//! QPs kept as a ladder, and every packet into the pcap.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use softroce::capture::{Direction, LiveCapture};
use softroce::net::RoceSocket;
use softroce::wire::{Operation, RoceRepr, Syndrome};

use crate::dump::text::extended_headers;

/// A packet the peer sent us, parsed.
#[derive(Debug, Clone)]
pub struct Answer {
    pub header: RoceRepr,
    pub payload: Vec<u8>,
    pub at: Instant,
}

impl Answer {
    pub fn psn(&self) -> u32 {
        self.header.bth.psn.value()
    }

    pub fn op(&self) -> Operation {
        self.header.bth.opcode.operation()
    }

    /// What it says, as the checks write their expectations ([`describe`]).
    pub fn describe(&self) -> String {
        describe(&self.header, self.payload.len())
    }
}

/// A packet in the terms the checks compare: `ACK psn=5 msn=2`,
/// `NAK(invalid request) psn=5`, `RNR-NAK(12) psn=5`,
/// `RDMA_READ_RESPONSE_ONLY psn=5 len=64`, `ATOMIC_ACK psn=5 orig=0x7`,
/// or, for requests, the opcode, PSN and length.
pub fn describe(h: &RoceRepr, payload_len: usize) -> String {
    let psn = h.bth.psn.value();
    match (h.bth.opcode.operation(), h.aeth.map(|a| a.syndrome)) {
        (Operation::Acknowledge, Some(Syndrome::Ack { .. })) => {
            format!("ACK psn={psn} msn={}", h.aeth.map_or(0, |a| a.msn))
        }
        (Operation::Acknowledge, Some(Syndrome::RnrNak { timer })) => format!("RNR-NAK({timer}) psn={psn}"),
        (Operation::Acknowledge, Some(Syndrome::Nak(code))) => format!("NAK({}) psn={psn}", code.name()),
        (Operation::AtomicAcknowledge, _) => {
            format!("ATOMIC_ACK psn={psn} orig={:#x}", h.atomic_ack_eth.map_or(0, |a| a.original))
        }
        (op, _) => format!("{} psn={psn} len={payload_len}", op.name()),
    }
}

/// One line of a ladder: the packet in full, as `softroce dump` prints it.
fn ladder_line(h: &RoceRepr, payload_len: usize) -> String {
    let ack_req = if h.bth.ack_req { " ack_req" } else { "" };
    format!(
        "{} qp={:#x} psn={}{ack_req}{} len={payload_len}",
        h.bth.opcode,
        h.bth.dest_qpn,
        h.bth.psn.value(),
        extended_headers(h)
    )
}

/// A ladder: what went each way on one of our QPs, with times.
#[derive(Debug, Default, Clone)]
pub struct Ladder {
    start: Option<Instant>,
    pub lines: Vec<String>,
}

impl Ladder {
    fn push(&mut self, at: Instant, arrow: &str, text: String) {
        let start = *self.start.get_or_insert(at);
        let ms = at.saturating_duration_since(start).as_secs_f64() * 1e3;
        self.lines.push(format!("{ms:9.3} ms {arrow} {text}"));
    }
}

/// The probe: sends for our QPs, receives for them, records.
pub struct Probe {
    socket: RoceSocket,
    /// A socket on a second local address, for packets from the wrong source.
    alt: Option<RoceSocket>,
    pub peer: IpAddr,
    /// The RoCE UDP port.
    port: u16,
    /// How long the peer may stay silent before we take it has said all it
    /// will (the checks' "and nothing else").
    pub quiet: Duration,
    ladders: HashMap<u32, Ladder>,
    capture: Option<LiveCapture>,
    /// Packets that arrived for a QP while we waited for another
    /// ([`Probe::answers_upto`]).
    pending: Vec<Answer>,
}

impl Probe {
    pub fn new(
        local: IpAddr,
        alt: Option<IpAddr>,
        peer: IpAddr,
        port: u16,
        quiet: Duration,
        pcap: Option<&std::path::Path>,
    ) -> io::Result<Probe> {
        let bind = |addr: IpAddr, port_here: u16| {
            RoceSocket::bind(SocketAddr::new(addr, port_here), port)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot bind {addr}:{port_here}: {e}")))
        };
        let socket = bind(local, port)?;
        let alt = alt.map(|a| bind(a, 0)).transpose()?;
        let capture = pcap.map(|p| LiveCapture::create(p, u64::MAX)).transpose()?;
        Ok(Probe { socket, alt, peer, port, quiet, ladders: HashMap::new(), capture, pending: Vec::new() })
    }

    pub fn has_alt(&self) -> bool {
        self.alt.is_some()
    }

    fn record_sent(&mut self, ours: u32, from: SocketAddr, roce: &[u8], text: String) {
        let to = SocketAddr::new(self.peer, self.port);
        if let Some(c) = &mut self.capture {
            c.record(Direction::Sent, from, to, 0, roce);
        }
        self.ladders.entry(ours).or_default().push(Instant::now(), "→", text);
    }

    /// Sends a packet for our QP `ours`, with a correct ICRC.
    pub fn send(&mut self, ours: u32, h: &RoceRepr, payload: &[u8]) -> io::Result<()> {
        let roce = self.socket.send(self.peer, h, payload)?;
        self.record_sent(ours, self.socket.local_addr(), &roce, ladder_line(h, payload.len()));
        Ok(())
    }

    /// Sends a packet from the second local address.
    pub fn send_from_alt(&mut self, ours: u32, h: &RoceRepr, payload: &[u8]) -> io::Result<()> {
        let alt = self.alt.as_ref().ok_or_else(|| io::Error::other("no second local address (--alt-addr)"))?;
        let roce = alt.send(self.peer, h, payload)?;
        let from = alt.local_addr();
        let text = format!("{} (from {})", ladder_line(h, payload.len()), from.ip());
        self.record_sent(ours, from, &roce, text);
        Ok(())
    }

    /// Sends bytes as they are, the ICRC recomputed over them when `fix_icrc`;
    /// `what` says in the ladder what is wrong with them.
    pub fn send_bytes(&mut self, ours: u32, mut roce: Vec<u8>, fix_icrc: bool, what: &str) -> io::Result<()> {
        if fix_icrc {
            self.socket.fill_icrc(self.peer, &mut roce)?;
        }
        self.socket.send_datagram(self.peer, &roce)?;
        let text = match RoceRepr::parse(&roce) {
            Ok(p) => format!("{} [{what}]", ladder_line(&p.header, p.payload.len())),
            Err(_) => format!("{} bytes [{what}]", roce.len()),
        };
        self.record_sent(ours, self.socket.local_addr(), &roce, text);
        Ok(())
    }

    /// The emitted bytes of a packet with its ICRC, to corrupt before
    /// [`Probe::send_bytes`].
    pub fn emit(&self, h: &RoceRepr, payload: &[u8]) -> io::Result<Vec<u8>> {
        let mut roce = vec![0u8; h.wire_len(payload.len())];
        h.emit(&mut roce, payload).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.socket.fill_icrc(self.peer, &mut roce)?;
        Ok(roce)
    }

    /// The next packet for any of our QPs within `timeout`. Packets that do
    /// not parse or fail their ICRC are recorded and reported as errors of
    /// the peer in the ladder of the QP they name, if any.
    pub fn next(&mut self, timeout: Duration) -> io::Result<Option<Answer>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(arrival) = self.socket.receive(left)? else { return Ok(None) };
            if let Some(c) = &mut self.capture {
                c.record(Direction::Received, arrival.from, self.socket.local_addr(), 0, &arrival.roce);
            }
            match RoceRepr::parse(&arrival.roce) {
                Ok(p) => {
                    let answer = Answer { header: p.header, payload: p.payload.to_vec(), at: arrival.at };
                    let mut text = ladder_line(&answer.header, answer.payload.len());
                    if !arrival.icrc_ok {
                        text.push_str(" icrc=BAD");
                    }
                    self.ladders.entry(p.header.bth.dest_qpn).or_default().push(arrival.at, "←", text);
                    if arrival.icrc_ok && arrival.from.ip() == self.peer {
                        return Ok(Some(answer));
                    }
                }
                Err(e) => {
                    let qpn = arrival.roce.get(5..8).map_or(0, |b| u32::from_be_bytes([0, b[0], b[1], b[2]]));
                    let text = format!("malformed packet from {}: {e}", arrival.from);
                    self.ladders.entry(qpn).or_default().push(arrival.at, "←", text);
                }
            }
        }
    }

    /// Everything the peer sends our QP `ours` until it has been quiet for
    /// [`Probe::quiet`]; packets for other QPs are kept for later.
    pub fn answers(&mut self, ours: u32) -> io::Result<Vec<Answer>> {
        self.answers_upto(ours, usize::MAX)
    }

    /// What the peer sends our QP `ours`, until `n` packets have come or it
    /// has been quiet for [`Probe::quiet`]; packets for other QPs are kept.
    pub fn answers_upto(&mut self, ours: u32, n: usize) -> io::Result<Vec<Answer>> {
        let (mut mine, mut kept): (Vec<Answer>, Vec<Answer>) =
            std::mem::take(&mut self.pending).into_iter().partition(|a| a.header.bth.dest_qpn == ours);
        while mine.len() < n {
            let Some(answer) = self.next(self.quiet)? else { break };
            if answer.header.bth.dest_qpn == ours {
                mine.push(answer);
            } else {
                kept.push(answer);
            }
        }
        self.pending = kept;
        Ok(mine)
    }

    /// Forgets packets kept for QPs whose checks are over.
    pub fn drop_pending(&mut self) {
        self.pending.clear();
    }

    /// The ladder of our QP `ours` so far, emptied.
    pub fn take_ladder(&mut self, ours: u32) -> Vec<String> {
        self.ladders.remove(&ours).map(|l| l.lines).unwrap_or_default()
    }

    pub fn flush(&mut self) {
        if let Some(c) = &mut self.capture {
            c.flush();
        }
    }
}
