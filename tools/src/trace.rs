//! `softroce trace` (and `softroce run --trace`): the events that processes
//! traced into one file (the library's `softroce::trace`), merged into one
//! timeline in time order and rendered as text or as one HTML page.
//!
//! Each packet is recorded by the device that sent it and again by the one
//! that received it, when both are traced; the timeline pairs the two
//! records into one arrow at the time it was sent, and says when it arrived,
//! that it was dropped for a bad ICRC, or that no traced device took it in.
//! Packets are decoded and explained by `softroce dump`'s code.

mod html;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use softroce::capture::wire_packet;
use softroce::wire::{icrc, NakCode, Operation, Packet, Syndrome, Transport, ROCE_UDP_PORT};

use crate::dump::explain::Explainer;
use crate::dump::flow::{Analysis, Tracker};
use crate::dump::{decode, text};

#[derive(clap::Args)]
#[command(after_help = "Trace a program with `softroce run --trace FILE -- CMD`, or set SOFTROCE_TRACE=EVENTS \
    (or ContextOptions::trace in Rust) and render the events file here. Only polls that returned completions \
    are traced.")]
pub struct Args {
    /// Event files that processes traced into (SOFTROCE_TRACE).
    #[arg(required = true)]
    events: Vec<PathBuf>,
    /// Where the timeline goes: a text file, or an HTML page for a name
    /// ending in .html; `-` is standard output.
    #[arg(short, long, default_value = "-")]
    output: PathBuf,
    /// Under each packet in the text, what its fields mean and the rxe-spec
    /// statements that govern it (the HTML page always has them).
    #[arg(long)]
    explain: bool,
}

pub fn run(args: Args) -> ExitCode {
    let mut events = Vec::new();
    for path in &args.events {
        match std::fs::read_to_string(path) {
            Ok(text) => events.push(text),
            Err(e) => {
                eprintln!("softroce trace: {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let mut timeline = Timeline::build(&events.concat());
    timeline.explain = args.explain;
    let to = if args.output.as_os_str() == "-" { Output::Stdout } else { Output::File(args.output) };
    match timeline.write(&to) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce trace: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Where a rendered timeline goes.
pub enum Output {
    Stdout,
    Stderr,
    /// Text, or HTML when the name ends in `.html`.
    File(PathBuf),
}

/// One line of an events file.
#[derive(Debug)]
struct Event {
    time: u128,
    pid: u32,
    endpoint: String,
    what: What,
}

#[derive(Debug)]
enum What {
    Process(String),
    Device(Vec<IpAddr>),
    Call { name: String, details: String },
    Packet { kind: PacketKind, src: SocketAddr, dst: SocketAddr, id: u16, roce: Vec<u8> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PacketKind {
    Sent,
    Received,
    Dropped,
}

impl Event {
    /// Parses `time pid endpoint kind rest`; `None` for a line that is not one.
    fn parse(line: &str) -> Option<Event> {
        let mut fields = line.splitn(5, ' ');
        let time = fields.next()?.parse().ok()?;
        let pid = fields.next()?.parse().ok()?;
        let endpoint = fields.next()?.to_string();
        let kind = fields.next()?;
        let rest = fields.next().unwrap_or("");
        let what = match kind {
            "process" => What::Process(rest.to_string()),
            "device" => What::Device(rest.split(',').filter_map(|a| a.parse().ok()).collect()),
            "call" => {
                let (name, details) = rest.split_once(' ').unwrap_or((rest, ""));
                What::Call { name: name.to_string(), details: details.to_string() }
            }
            "sent" | "recv" | "drop" => {
                let mut parts = rest.split(' ');
                let src = parts.next()?.parse().ok()?;
                let dst = parts.next()?.parse().ok()?;
                let id = parts.next()?.parse().ok()?;
                let roce = unhex(parts.next()?)?;
                let kind = match kind {
                    "sent" => PacketKind::Sent,
                    "recv" => PacketKind::Received,
                    _ => PacketKind::Dropped,
                };
                What::Packet { kind, src, dst, id, roce }
            }
            _ => return None,
        };
        Some(Event { time, pid, endpoint, what })
    }
}

/// The destination QP in a packet's BTH.
fn dest_qpn(roce: &[u8]) -> Option<u32> {
    let b = roce.get(5..8)?;
    Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// A column of the timeline: a traced device of one process, or a peer
/// address that nothing traced.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub pid: Option<u32>,
    pub device: String,
    pub process: String,
    pub addresses: Vec<IpAddr>,
    /// The QPs the program created on it.
    pub qps: Vec<u32>,
}

impl Endpoint {
    /// `pid 1234 ibv_rc_pingpong, device rxe0 (127.0.0.1)`, or `peer 10.0.0.2 (not traced)`.
    pub fn describe(&self) -> String {
        let addresses: Vec<String> = self.addresses.iter().map(ToString::to_string).collect();
        match self.pid {
            Some(pid) => {
                let qps: Vec<String> = self.qps.iter().map(|q| format!("{q:#x}")).collect();
                let qps = if qps.is_empty() { String::new() } else { format!(", QP {}", qps.join(", ")) };
                format!("pid {pid} {}, device {} ({}){qps}", self.process, self.device, addresses.join(", "))
            }
            None => format!("peer {} (not traced)", addresses.join(", ")),
        }
    }
}

/// What became of a packet after it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The receiving traced device took it in, this many ns later.
    Delivered(u128),
    /// The receiving device dropped it: its ICRC is wrong.
    DroppedBadIcrc,
    /// Its address is a traced device's, yet no traced device recorded it:
    /// lost on the way (or the receiver ended first).
    NotReceived,
    /// Sent to a peer that nothing traced.
    ToUntraced,
    /// Received (or dropped) from a peer that nothing traced.
    FromUntraced { dropped: bool },
}

/// One packet on the timeline, decoded.
#[derive(Debug)]
pub struct PacketRow {
    pub from: usize,
    pub to: usize,
    pub fate: Fate,
    /// `RC SEND_ONLY qp=… psn=… ack_req=1 … icrc=ok`.
    pub summary: String,
    /// `softroce dump --explain`'s lines.
    pub explanation: Vec<String>,
    /// The rxe-spec statements that govern it.
    pub rules: Vec<&'static str>,
    /// A NAK or a bad ICRC: something a learner should look at.
    pub alarm: bool,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

#[derive(Debug)]
pub enum RowKind {
    Opened,
    Call {
        name: String,
        details: String,
        /// How many times in a row it was made.
        repeated: usize,
    },
    Packet(Box<PacketRow>),
}

#[derive(Debug)]
pub struct Row {
    /// Nanoseconds since the first event.
    pub time: u128,
    /// The endpoint of a call; the sender of a packet.
    pub endpoint: usize,
    pub kind: RowKind,
}

/// The merged, decoded events.
#[derive(Debug, Default)]
pub struct Timeline {
    pub endpoints: Vec<Endpoint>,
    pub rows: Vec<Row>,
    /// Lines that were not events (a file cut short by a full disk).
    pub unreadable: usize,
    /// The text explains each packet under it.
    pub explain: bool,
}

impl Timeline {
    /// Merges the lines of events files (any order of lines) into rows.
    pub fn build(text: &str) -> Timeline {
        let mut timeline = Timeline::default();
        let mut events: Vec<Event> = Vec::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            match Event::parse(line) {
                Some(event) => events.push(event),
                None => timeline.unreadable += 1,
            }
        }
        events.sort_by_key(|e| e.time);
        let start = events.first().map_or(0, |e| e.time);

        let mut processes: HashMap<u32, String> = HashMap::new();
        let mut columns: HashMap<(u32, String), usize> = HashMap::new();
        for event in &events {
            match &event.what {
                What::Process(name) => {
                    processes.insert(event.pid, name.clone());
                }
                What::Device(addresses) => {
                    let process = processes.get(&event.pid).cloned().unwrap_or_default();
                    let index = timeline.endpoint(&mut columns, event.pid, &event.endpoint, &process);
                    timeline.endpoints[index].addresses.clone_from(addresses);
                }
                _ => {}
            }
        }

        // Each receipt goes with the latest unmatched sending of the same
        // bytes between the same addresses before it (a lost packet and its
        // retransmission are the same bytes; the one received is the later).
        let mut sendings: HashMap<(SocketAddr, SocketAddr, &[u8]), Vec<usize>> = HashMap::new();
        for (i, event) in events.iter().enumerate() {
            if let What::Packet { kind: PacketKind::Sent, src, dst, roce, .. } = &event.what {
                sendings.entry((*src, *dst, roce.as_slice())).or_default().push(i);
            }
        }
        let mut receipt_of: HashMap<usize, usize> = HashMap::new();
        let mut matched: Vec<bool> = vec![false; events.len()];
        for (i, event) in events.iter().enumerate() {
            let What::Packet { kind: PacketKind::Received | PacketKind::Dropped, src, dst, roce, .. } = &event.what
            else {
                continue;
            };
            let Some(candidates) = sendings.get(&(*src, *dst, roce.as_slice())) else { continue };
            let found =
                candidates.iter().rev().find(|&&s| events[s].time <= event.time && !receipt_of.contains_key(&s));
            if let Some(&s) = found {
                receipt_of.insert(s, i);
                matched[i] = true;
            }
        }

        // Which traced endpoint each QP is on, from the calls that created them.
        let mut owners: HashMap<u32, usize> = HashMap::new();
        for event in &events {
            if let What::Call { name, details } = &event.what {
                let qpn = details.split(' ').find_map(|w| u32::from_str_radix(w.strip_prefix("qp=0x")?, 16).ok());
                if let (Some(qpn), "ibv_create_qp") = (qpn, name.as_str()) {
                    let endpoint = (event.pid, event.endpoint.clone());
                    if let Some(&index) = columns.get(&endpoint) {
                        owners.insert(qpn, index);
                        timeline.endpoints[index].qps.push(qpn);
                    }
                }
            }
        }

        let mut tracker = Tracker::default();
        let mut explainer = Explainer::default();
        for (i, event) in events.iter().enumerate() {
            let process = processes.get(&event.pid).cloned().unwrap_or_default();
            let time = event.time - start;
            match &event.what {
                What::Process(_) => {}
                What::Device(_) => {
                    let endpoint = timeline.endpoint(&mut columns, event.pid, &event.endpoint, &process);
                    timeline.rows.push(Row { time, endpoint, kind: RowKind::Opened });
                }
                What::Call { name, details } => {
                    let endpoint = timeline.endpoint(&mut columns, event.pid, &event.endpoint, &process);
                    // A run of the same call (500 receives posted at the
                    // start) is one row with a count.
                    if let Some(Row { endpoint: last, kind: RowKind::Call { name: n, details: d, repeated }, .. }) =
                        timeline.rows.last_mut()
                    {
                        if *last == endpoint && n == name && d == details {
                            *repeated += 1;
                            continue;
                        }
                    }
                    let kind = RowKind::Call { name: name.clone(), details: details.clone(), repeated: 1 };
                    timeline.rows.push(Row { time, endpoint, kind });
                }
                What::Packet { kind, src, dst, id, roce } => {
                    if matched[i] {
                        continue;
                    }
                    let here = timeline.endpoint(&mut columns, event.pid, &event.endpoint, &process);
                    let (from, to, fate) = match kind {
                        PacketKind::Sent => match receipt_of.get(&i).map(|&r| &events[r]) {
                            Some(receipt) => {
                                let to = timeline.endpoint(&mut columns, receipt.pid, &receipt.endpoint, "");
                                let dropped = matches!(receipt.what, What::Packet { kind: PacketKind::Dropped, .. });
                                let fate = if dropped {
                                    Fate::DroppedBadIcrc
                                } else {
                                    Fate::Delivered(receipt.time - event.time)
                                };
                                (here, to, fate)
                            }
                            None => match dest_qpn(roce).and_then(|qpn| owners.get(&qpn)) {
                                Some(&to) => (here, to, Fate::NotReceived),
                                None => (here, timeline.peer(dst.ip()), Fate::ToUntraced),
                            },
                        },
                        PacketKind::Received | PacketKind::Dropped => {
                            let dropped = *kind == PacketKind::Dropped;
                            (timeline.peer(src.ip()), here, Fate::FromUntraced { dropped })
                        }
                    };
                    let Some(packet) = decode_packet(&mut tracker, &mut explainer, *src, *dst, *id, roce, fate) else {
                        continue;
                    };
                    let row = PacketRow { from, to, fate, src: *src, dst: *dst, ..packet };
                    timeline.rows.push(Row { time, endpoint: from, kind: RowKind::Packet(Box::new(row)) });
                }
            }
        }
        timeline
    }

    fn endpoint(
        &mut self,
        columns: &mut HashMap<(u32, String), usize>,
        pid: u32,
        device: &str,
        process: &str,
    ) -> usize {
        *columns.entry((pid, device.to_string())).or_insert_with(|| {
            self.endpoints.push(Endpoint {
                pid: Some(pid),
                device: device.to_string(),
                process: process.to_string(),
                addresses: Vec::new(),
                qps: Vec::new(),
            });
            self.endpoints.len() - 1
        })
    }

    /// The column of an untraced peer at `ip`.
    fn peer(&mut self, ip: IpAddr) -> usize {
        if let Some(i) = self.endpoints.iter().position(|e| e.pid.is_none() && e.addresses == [ip]) {
            return i;
        }
        self.endpoints.push(Endpoint {
            pid: None,
            device: String::new(),
            process: String::new(),
            addresses: vec![ip],
            qps: Vec::new(),
        });
        self.endpoints.len() - 1
    }

    /// Letters name the endpoints in text: A, B, …, Z, then E27, E28, ….
    pub fn letter(index: usize) -> String {
        match u8::try_from(index).ok().filter(|i| *i < 26) {
            Some(i) => char::from(b'A' + i).to_string(),
            None => format!("E{}", index + 1),
        }
    }

    /// Renders into `to`.
    pub fn write(&self, to: &Output) -> Result<(), String> {
        match to {
            Output::Stdout => std::io::stdout().write_all(self.text().as_bytes()).map_err(|e| e.to_string()),
            Output::Stderr => std::io::stderr().write_all(self.text().as_bytes()).map_err(|e| e.to_string()),
            Output::File(path) => {
                let html = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("html"));
                let rendered = if html { html::page(self) } else { self.text() };
                std::fs::write(path, rendered).map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }

    /// The timeline as text: the endpoints, then one line per event.
    pub fn text(&self) -> String {
        let mut out = String::from("softroce trace: time in seconds since the first event; endpoints:\n");
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            let _ = writeln!(out, "  {:<3} {}", Timeline::letter(i), endpoint.describe());
        }
        out.push('\n');
        for row in &self.rows {
            let time = format!("{:>10.6}", row.time as f64 / 1e9);
            let who = Timeline::letter(row.endpoint);
            let _ = match &row.kind {
                RowKind::Opened => {
                    let endpoint = &self.endpoints[row.endpoint];
                    writeln!(out, "{time} {who:<7} opened device {} ({})", endpoint.device, addresses(endpoint))
                }
                RowKind::Call { name, details, repeated } => {
                    writeln!(out, "{time} {who:<7} {name} {details}{}", times(*repeated))
                }
                RowKind::Packet(p) => {
                    let arrow = format!("{who}->{}", Timeline::letter(p.to));
                    let line = writeln!(out, "{time} {arrow:<7} {}  [{}]", p.summary, fate_text(p.fate));
                    if self.explain {
                        for explanation in &p.explanation {
                            let _ = writeln!(out, "{:19}| {explanation}", "");
                        }
                        for id in &p.rules {
                            if let Some((page, text)) = statement(id) {
                                let _ = writeln!(out, "{:19}| rxe-spec/{page} {text}", "");
                            }
                        }
                    }
                    line
                }
            };
        }
        if self.unreadable > 0 {
            let _ = writeln!(out, "({} lines of the events file were not events and are left out)", self.unreadable);
        }
        out
    }
}

/// ` (x500)` for a call made many times in a row.
pub fn times(repeated: usize) -> String {
    if repeated > 1 {
        format!(" (x{repeated})")
    } else {
        String::new()
    }
}

fn addresses(endpoint: &Endpoint) -> String {
    endpoint.addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// What became of a packet, in words.
pub fn fate_text(fate: Fate) -> String {
    match fate {
        Fate::Delivered(ns) => format!("received {:.1} us later", ns as f64 / 1e3),
        Fate::DroppedBadIcrc => "DROPPED by the receiver: bad ICRC".to_string(),
        Fate::NotReceived => "NOT RECEIVED by any traced device: lost".to_string(),
        Fate::ToUntraced => "to a peer not traced".to_string(),
        Fate::FromUntraced { dropped: false } => "received from a peer not traced".to_string(),
        Fate::FromUntraced { dropped: true } => "from a peer not traced; DROPPED: bad ICRC".to_string(),
    }
}

/// Decodes a packet as `softroce dump --explain` does. The packet is rebuilt
/// as on the wire; a packet on another UDP port than 4791 (tests choose
/// their own) is decoded as if on 4791, and its ICRC checked on its own.
fn decode_packet(
    tracker: &mut Tracker,
    explainer: &mut Explainer,
    src: SocketAddr,
    dst: SocketAddr,
    id: u16,
    roce: &[u8],
    fate: Fate,
) -> Option<PacketRow> {
    let wire = wire_packet(src, dst, id, roce)?;
    let ip_len = if src.is_ipv4() { 20 } else { 40 };
    let icrc_ok = match fate {
        Fate::DroppedBadIcrc | Fate::FromUntraced { dropped: true } => false,
        _ => icrc::verify(&wire[..ip_len], &wire[ip_len..ip_len + 8], roce).unwrap_or(false),
    };
    let as_roce = wire_packet(src, SocketAddr::new(dst.ip(), ROCE_UDP_PORT), id, roce)?;
    let Ok(pkt) = Packet::parse(&as_roce) else {
        return Some(PacketRow {
            from: 0,
            to: 0,
            fate,
            summary: format!("{} bytes that do not decode as RoCEv2", roce.len()),
            explanation: Vec::new(),
            rules: vec!["W-21"],
            alarm: true,
            src,
            dst,
        });
    };
    let analysis = tracker.observe(&pkt);
    let mut summary = text::packet_fields(&pkt, &analysis, icrc_ok);
    if dst.port() != ROCE_UDP_PORT {
        let _ = write!(summary, " udp_port={}", dst.port());
    }
    let explanation = explainer.packet(&pkt, &analysis, icrc_ok);
    let aeth = pkt.roce.header.aeth.map(|a| a.syndrome);
    let nak = aeth.is_some_and(|s| !matches!(s, Syndrome::Ack { .. }));
    Some(PacketRow {
        from: 0,
        to: 0,
        fate,
        summary,
        explanation,
        rules: rules(&pkt, &analysis, icrc_ok),
        alarm: nak || !icrc_ok || matches!(fate, Fate::NotReceived | Fate::DroppedBadIcrc),
        src,
        dst,
    })
}

/// The rxe-spec statements that say why this packet looks as it does.
fn rules(pkt: &Packet<'_>, analysis: &Analysis, icrc_ok: bool) -> Vec<&'static str> {
    let bth = &pkt.roce.header.bth;
    let mut rules = Vec::new();
    if decode::gsi(pkt).is_some() {
        rules.extend(["M-1", "M-3"]);
    }
    let op = bth.opcode.operation();
    match bth.opcode.transport() {
        Transport::Ud => rules.push("T-19"),
        Transport::Uc => rules.push("T-18"),
        _ => {}
    }
    match op {
        Operation::ReadRequest => rules.extend(["T-5", "T-8"]),
        Operation::CompareSwap | Operation::FetchAdd => rules.extend(["T-8", "T-26"]),
        Operation::ReadResponseFirst
        | Operation::ReadResponseMiddle
        | Operation::ReadResponseLast
        | Operation::ReadResponseOnly => rules.push("T-25"),
        Operation::AtomicAcknowledge => rules.push("T-26"),
        Operation::Acknowledge => match pkt.roce.header.aeth.map(|a| a.syndrome) {
            Some(Syndrome::RnrNak { .. }) => rules.extend(["T-13", "T-23"]),
            Some(Syndrome::Nak(NakCode::PsnSequenceError)) => rules.extend(["T-11", "T-22"]),
            Some(Syndrome::Nak(NakCode::InvalidRequest)) => rules.extend(["T-14", "T-27"]),
            Some(Syndrome::Nak(NakCode::RemoteAccessError)) => rules.extend(["T-15", "T-27"]),
            Some(Syndrome::Nak(_)) => rules.push("T-27"),
            _ => rules.extend(["T-12", "T-21"]),
        },
        _ if op.is_request() && bth.opcode.transport() == Transport::Rc => rules.extend(["T-4", "T-5", "T-6"]),
        _ if op.is_request() => rules.extend(["T-4", "T-5"]),
        _ => {}
    }
    if pkt.roce.header.aeth.is_some() {
        rules.push("W-4");
    }
    if analysis.retransmission {
        rules.extend(["T-22", "T-24"]);
    }
    if !icrc_ok {
        rules.extend(["W-13", "W-17"]);
    }
    rules
}

/// The rxe-spec pages the statements come from, built into the tool.
const SPEC_PAGES: [(&str, &str); 3] = [
    ("transport.md", include_str!("../../rxe-spec/transport.md")),
    ("wire.md", include_str!("../../rxe-spec/wire.md")),
    ("cm.md", include_str!("../../rxe-spec/cm.md")),
];

/// Statement `id` (`T-22`): its page and the rule it states, without the
/// tests that check it or the discussion of why and of rxe's differences.
pub fn statement(id: &str) -> Option<(&'static str, String)> {
    let opening = format!("**{id}. ");
    SPEC_PAGES.iter().find_map(|(page, text)| {
        let start = text.find(&opening)?;
        let paragraph = text[start..].split("\n\n").next()?.lines().collect::<Vec<_>>().join(" ");
        let end = ["Test:", "Tests:", "Difference:", "Why:"]
            .iter()
            .filter_map(|marker| paragraph.find(marker))
            .min()
            .unwrap_or(paragraph.len());
        Some((*page, paragraph[..end].trim_end().replace("**", "")))
    })
}

/// Runs `command` with `env` plus a trace into a temporary events file,
/// waits for it (and for whatever it started that still traces), then
/// renders the events into `output`. Returns the program's exit code.
pub fn run_traced(
    command: &[std::ffi::OsString],
    env: Vec<(&'static str, std::ffi::OsString)>,
    output: &Path,
) -> ExitCode {
    let events = std::env::temp_dir().join(format!("softroce-trace-{}.events", std::process::id()));
    let _ = std::fs::remove_file(&events);
    let status = crate::run::spawn_and_wait(command, env, &events);
    let text = std::fs::read_to_string(&events).unwrap_or_default();
    let _ = std::fs::remove_file(&events);
    let to = if output.as_os_str() == "-" { Output::Stderr } else { Output::File(output.to_path_buf()) };
    if let Err(e) = Timeline::build(&text).write(&to) {
        eprintln!("softroce run: trace: {e}");
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_found_without_their_tests() {
        let (page, text) = statement("T-22").unwrap();
        assert_eq!(page, "transport.md");
        assert!(text.starts_with("T-22. Go-back-N."), "{text}");
        assert!(!text.contains("Test:"));
        let (_, text) = statement("T-5").unwrap();
        assert!(text.ends_with("the READ's plus ⌈n/m⌉."), "{text}");
        let (_, text) = statement("T-6").unwrap();
        assert!(!text.contains("Difference:") && !text.contains("Why:"), "{text}");
        assert!(statement("T-999").is_none());
    }

    #[test]
    fn every_rule_named_exists() {
        for id in ["M-1", "M-3", "T-4", "T-5", "T-6", "T-8", "T-11", "T-12", "T-13", "T-14", "T-15", "T-18"] {
            assert!(statement(id).is_some(), "{id}");
        }
        for id in ["T-19", "T-21", "T-22", "T-23", "T-24", "T-25", "T-26", "T-27", "W-4", "W-13", "W-17", "W-21"] {
            assert!(statement(id).is_some(), "{id}");
        }
    }

    #[test]
    fn bad_lines_are_counted_not_fatal() {
        let timeline = Timeline::build("garbage\n1 2 dev call ibv_x a=1\n3 4 dev sent 1.2.3.4:1 nope\n");
        assert_eq!(timeline.unreadable, 2);
        assert_eq!(timeline.rows.len(), 1);
    }
}
