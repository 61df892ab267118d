//! `--ladder FILE.svg`: the capture as a sequence diagram. One lifeline per IP
//! address, time flowing down one row per packet, each packet an arrow from
//! sender to receiver styled by what it is.
//!
//! Each packet is one `<g class="pkt ...">` element, whose `<title>` holds the
//! packet's text line so a browser shows it on hover.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::IpAddr;

use softroce::wire::{Operation, Packet, Syndrome, Transport};

use super::cm;
use super::decode::{self, Malformed};
use super::flow::Analysis;
use super::text;

/// Arrows drawn at most; a bigger capture is cut, and the drawing says so.
pub const MAX_ARROWS: usize = 2000;

const ROW: f64 = 26.0;
const SLANT: f64 = 10.0;
const LANE: f64 = 320.0;
/// x of the first lifeline; the frame number and time column is to its left.
const FIRST_LANE: f64 = 200.0;
const HEADER: f64 = 90.0;
const LEGEND_WIDTH: f64 = 560.0;

/// What an arrow is; decides its colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Request,
    ReadResponse,
    Ack,
    Nak,
    RnrNak,
    Malformed,
}

impl Kind {
    const ALL: [Kind; 6] = [Kind::Request, Kind::ReadResponse, Kind::Ack, Kind::Nak, Kind::RnrNak, Kind::Malformed];

    fn of(pkt: &Packet<'_>) -> Kind {
        let op = pkt.roce.header.bth.opcode.operation();
        match pkt.roce.header.aeth.map(|a| a.syndrome) {
            Some(Syndrome::Nak(_)) => Kind::Nak,
            Some(Syndrome::RnrNak { .. }) => Kind::RnrNak,
            _ if op.is_request() => Kind::Request,
            _ if matches!(op, Operation::Acknowledge | Operation::AtomicAcknowledge) => Kind::Ack,
            _ => Kind::ReadResponse,
        }
    }

    fn class(self) -> &'static str {
        match self {
            Kind::Request => "request",
            Kind::ReadResponse => "read-response",
            Kind::Ack => "ack",
            Kind::Nak => "nak",
            Kind::RnrNak => "rnr-nak",
            Kind::Malformed => "malformed",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Kind::Request => "#1f5fbf",
            Kind::ReadResponse => "#0e8a8a",
            Kind::Ack => "#2e8b3a",
            Kind::Nak => "#d0202a",
            Kind::RnrNak => "#e07b00",
            Kind::Malformed => "#666666",
        }
    }

    fn legend(self) -> &'static str {
        match self {
            Kind::Request => "request (SEND, WRITE, READ request, atomic)",
            Kind::ReadResponse => "READ response",
            Kind::Ack => "ACK, ATOMIC ACK",
            Kind::Nak => "NAK",
            Kind::RnrNak => "RNR NAK (receiver not ready)",
            Kind::Malformed => "malformed packet",
        }
    }
}

#[derive(Debug)]
struct Arrow {
    frame: usize,
    seconds: f64,
    from: usize,
    to: usize,
    kind: Kind,
    label: String,
    /// The packet's text line, shown on hover.
    details: String,
    retransmission: bool,
    /// ICRC failed, or the packet did not decode.
    broken: bool,
}

#[derive(Debug)]
enum Row {
    Arrow(Arrow),
    /// A line across the diagram: a new file, or a damaged one (`alarm`).
    Note {
        text: String,
        alarm: bool,
    },
}

#[derive(Debug)]
struct Host {
    address: IpAddr,
    qpns: BTreeSet<u32>,
}

/// The diagram under construction.
#[derive(Debug, Default)]
pub struct Ladder {
    hosts: Vec<Host>,
    rows: Vec<Row>,
    packets: usize,
}

impl Ladder {
    pub fn packet(&mut self, frame: usize, seconds: f64, pkt: &Packet<'_>, analysis: &Analysis, icrc_ok: bool) {
        let header = &pkt.roce.header;
        let from = self.host(pkt.ip.source());
        let to = self.host(pkt.ip.destination());
        self.hosts[to].qpns.insert(header.bth.dest_qpn);
        if let Some(deth) = header.deth {
            self.hosts[from].qpns.insert(deth.src_qpn);
        }
        self.push(|| {
            let mut label = match decode::gsi(pkt) {
                Some(gsi) => cm::label(&gsi),
                None => format!(
                    "{} {}",
                    short_name(header.bth.opcode.transport(), header.bth.opcode.operation()),
                    header.bth.psn
                ),
            };
            if let (Operation::Acknowledge, Some(aeth)) = (header.bth.opcode.operation(), header.aeth) {
                let _ = write!(label, " [{}]", syndrome_label(aeth.syndrome));
            }
            if analysis.retransmission {
                label.push_str(" retransmitted");
            }
            if !icrc_ok {
                label.push_str(" ICRC BAD");
            }
            Arrow {
                frame,
                seconds,
                from,
                to,
                kind: Kind::of(pkt),
                label,
                details: text::packet_line(frame, seconds, pkt, analysis, icrc_ok),
                retransmission: analysis.retransmission,
                broken: !icrc_ok,
            }
        });
    }

    pub fn malformed(&mut self, frame: usize, seconds: f64, malformed: &Malformed) {
        let from = self.host(malformed.src);
        let to = self.host(malformed.dst);
        self.push(|| Arrow {
            frame,
            seconds,
            from,
            to,
            kind: Kind::Malformed,
            label: "malformed".to_string(),
            details: text::malformed_line(frame, seconds, malformed),
            retransmission: false,
            broken: true,
        });
    }

    /// A line across the diagram, before the packets that follow.
    pub fn note(&mut self, text: String, alarm: bool) {
        if self.packets < MAX_ARROWS {
            self.rows.push(Row::Note { text, alarm });
        }
    }

    fn host(&mut self, address: IpAddr) -> usize {
        match self.hosts.iter().position(|h| h.address == address) {
            Some(index) => index,
            None => {
                self.hosts.push(Host { address, qpns: BTreeSet::new() });
                self.hosts.len() - 1
            }
        }
    }

    /// Counts a packet, and draws it while under the limit (only then is
    /// its arrow worth making).
    fn push(&mut self, arrow: impl FnOnce() -> Arrow) {
        if self.packets < MAX_ARROWS {
            self.rows.push(Row::Arrow(arrow()));
        }
        self.packets += 1;
    }

    /// The whole SVG document.
    pub fn render(&self) -> String {
        let lanes = self.hosts.len().max(2) as f64;
        let width = (FIRST_LANE + (lanes - 1.0) * LANE + 260.0).max(LEGEND_WIDTH + 40.0);
        let rows_end = row_y(self.rows.len());
        let legend_top = rows_end + 40.0;
        let height = legend_top + 30.0 + (Kind::ALL.len() + 2) as f64 * 20.0 + 20.0;

        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">"#
        );
        svg.push_str("<defs>\n");
        for kind in Kind::ALL {
            let _ = writeln!(
                svg,
                r#"<marker id="head-{}" viewBox="0 0 10 10" refX="10" refY="5" markerUnits="userSpaceOnUse" markerWidth="11" markerHeight="11" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{}"/></marker>"#,
                kind.class(),
                kind.color()
            );
        }
        svg.push_str("</defs>\n");
        let _ = writeln!(svg, r#"<rect width="{width}" height="{height}" fill="white"/>"#);
        self.render_header(&mut svg, width, rows_end);
        // Bands go underneath everything, so no arrow is hidden by its neighbour's.
        for (index, row) in self.rows.iter().enumerate() {
            if let Row::Arrow(arrow) = row {
                render_band(&mut svg, arrow, row_y(index), width);
            }
        }
        for (index, row) in self.rows.iter().enumerate() {
            let y = row_y(index);
            match row {
                Row::Arrow(arrow) => render_arrow(&mut svg, arrow, y),
                Row::Note { text, alarm } => {
                    let color = if *alarm { "#d0202a" } else { "#777777" };
                    let _ = writeln!(
                        svg,
                        r#"<line x1="10" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-dasharray="2 3"/><text x="14" y="{}" fill="{color}">{}</text>"#,
                        width - 10.0,
                        y - 3.0,
                        escape(text)
                    );
                }
            }
        }
        if self.packets > MAX_ARROWS {
            let _ = writeln!(
                svg,
                r##"<text x="10" y="{}" fill="#d0202a" font-weight="bold">{} more packets not drawn: the diagram stops at {MAX_ARROWS}</text>"##,
                rows_end + 14.0,
                self.packets - MAX_ARROWS
            );
        }
        render_legend(&mut svg, legend_top);
        svg.push_str("</svg>\n");
        svg
    }

    fn render_header(&self, svg: &mut String, width: f64, rows_end: f64) {
        let drawn = self.packets.min(MAX_ARROWS);
        let mut title = format!("RoCEv2 ladder: {} packet(s)", self.packets);
        if drawn < self.packets {
            let _ = write!(title, ", showing the first {drawn}");
        }
        let _ = writeln!(svg, r#"<text x="10" y="20" font-size="14" font-weight="bold">{title}</text>"#);
        let _ = writeln!(
            svg,
            r##"<text x="44" y="{HEADER}" text-anchor="end" fill="#777777">frame</text><text x="54" y="{HEADER}" fill="#777777">time (s)</text>"##
        );
        if self.hosts.is_empty() {
            let _ = writeln!(svg, r#"<text x="{}" y="{HEADER}">no RoCEv2 packets</text>"#, width / 2.0);
        }
        for (index, host) in self.hosts.iter().enumerate() {
            let x = lane_x(index);
            let qpns: Vec<String> = host.qpns.iter().map(|q| format!("{q:#x}")).collect();
            let _ = writeln!(
                svg,
                r##"<text x="{x}" y="50" text-anchor="middle" font-weight="bold" font-size="12">{}</text><text x="{x}" y="66" text-anchor="middle" fill="#444444">QP {}</text><line x1="{x}" y1="{}" x2="{x}" y2="{rows_end}" stroke="#999999" stroke-width="1.5"/>"##,
                host.address,
                if qpns.is_empty() { "-".to_string() } else { qpns.join(", ") },
                HEADER - 12.0,
            );
        }
    }
}

fn lane_x(index: usize) -> f64 {
    FIRST_LANE + index as f64 * LANE
}

/// Where a row's arrow starts; its label sits just above.
fn row_y(index: usize) -> f64 {
    HEADER + 20.0 + index as f64 * ROW
}

/// The highlight behind a broken or retransmitted packet's row.
fn render_band(svg: &mut String, arrow: &Arrow, y: f64, width: f64) {
    let fill = if arrow.broken {
        "#ffd9d9"
    } else if arrow.retransmission {
        "#fff3b0"
    } else {
        return;
    };
    let _ = writeln!(
        svg,
        r#"<rect x="4" y="{}" width="{}" height="{ROW}" fill="{fill}"/>"#,
        y - ROW / 2.0 + SLANT / 2.0 - 2.0,
        width - 8.0
    );
}

fn render_arrow(svg: &mut String, arrow: &Arrow, y: f64) {
    let kind = arrow.kind;
    let mut classes = format!("pkt {}", kind.class());
    if arrow.retransmission {
        classes.push_str(" retransmission");
    }
    if arrow.broken {
        classes.push_str(" broken");
    }
    let _ = writeln!(svg, r#"<g class="{classes}"><title>{}</title>"#, escape(&arrow.details));
    let _ = writeln!(
        svg,
        r##"<text x="44" y="{}" text-anchor="end" fill="#777777">{}</text><text x="54" y="{}" fill="#777777">{:.6}</text>"##,
        y + 4.0,
        arrow.frame,
        y + 4.0,
        arrow.seconds
    );
    let dash = match (kind, arrow.retransmission) {
        (Kind::Malformed, _) => r#" stroke-dasharray="2 3""#,
        (_, true) => r#" stroke-dasharray="7 4""#,
        _ => "",
    };
    let (x1, x2) = (lane_x(arrow.from), lane_x(arrow.to));
    let stroke = format!(
        r#"fill="none" stroke="{}" stroke-width="{}"{dash} marker-end="url(#head-{})""#,
        kind.color(),
        if arrow.retransmission { 2.5 } else { 1.5 },
        kind.class()
    );
    // A host talking to itself (loopback rxe) gets a small loop.
    let (mid_x, label_x, anchor) = if x1 == x2 {
        let _ = writeln!(svg, r#"<path d="M{x1},{y} h40 v{SLANT} h-40" {stroke}/>"#);
        (x1 + 40.0, x1 + 46.0, "start")
    } else {
        let _ = writeln!(svg, r#"<line x1="{x1}" y1="{y}" x2="{x2}" y2="{}" {stroke}/>"#, y + SLANT);
        ((x1 + x2) / 2.0, (x1 + x2) / 2.0, "middle")
    };
    let _ = writeln!(
        svg,
        r#"<text x="{label_x}" y="{}" text-anchor="{anchor}" fill="{}">{}</text>"#,
        y - 3.0,
        kind.color(),
        escape(&arrow.label)
    );
    if arrow.broken {
        cross(svg, mid_x, y + SLANT / 2.0);
    }
    svg.push_str("</g>\n");
}

/// The red × that marks a broken packet.
fn cross(svg: &mut String, x: f64, y: f64) {
    let r = 6.0;
    let _ = writeln!(
        svg,
        r##"<path d="M{},{} L{},{} M{},{} L{},{}" stroke="#d0202a" stroke-width="3"/>"##,
        x - r,
        y - r,
        x + r,
        y + r,
        x - r,
        y + r,
        x + r,
        y - r
    );
}

fn render_legend(svg: &mut String, top: f64) {
    let _ = writeln!(svg, r#"<text x="10" y="{top}" font-weight="bold" font-size="12">Legend</text>"#);
    let line = |svg: &mut String, y: f64, kind: Kind, dash: &str, text: &str| {
        let _ = writeln!(
            svg,
            r#"<line x1="20" y1="{y}" x2="90" y2="{y}" stroke="{}" stroke-width="1.5"{dash} marker-end="url(#head-{})"/><text x="100" y="{}">{text}</text>"#,
            kind.color(),
            kind.class(),
            y + 4.0
        );
    };
    let mut y = top + 20.0;
    for kind in Kind::ALL {
        let dash = if kind == Kind::Malformed { r#" stroke-dasharray="2 3""# } else { "" };
        if kind == Kind::Malformed {
            cross(svg, 55.0, y);
        }
        line(svg, y, kind, dash, kind.legend());
        y += 20.0;
    }
    let _ = writeln!(svg, r##"<rect x="14" y="{}" width="82" height="16" fill="#fff3b0"/>"##, y - 8.0);
    line(
        svg,
        y,
        Kind::Request,
        r#" stroke-dasharray="7 4""#,
        "retransmission: a PSN sent before (dashed, yellow band)",
    );
    y += 20.0;
    let _ = writeln!(svg, r##"<rect x="14" y="{}" width="82" height="16" fill="#ffd9d9"/>"##, y - 8.0);
    line(svg, y, Kind::Request, "", "ICRC failure (red cross, pink band)");
    cross(svg, 55.0, y);
}

/// `SEND_FIRST`, `READ_RESP_LAST`, `ACK`; UC and UD opcodes keep their transport.
fn short_name(transport: Transport, op: Operation) -> String {
    let name = [
        ("RDMA_", ""),
        ("_WITH_IMMEDIATE", "_IMM"),
        ("_WITH_INVALIDATE", "_INV"),
        ("RESPONSE", "RESP"),
        ("REQUEST", "REQ"),
        ("ACKNOWLEDGE", "ACK"),
        ("COMPARE", "CMP"),
    ]
    .iter()
    .fold(op.name().to_string(), |name, (long, short)| name.replace(long, short));
    match transport {
        Transport::Rc => name,
        other => format!("{} {name}", other.name()),
    }
}

/// `ACK 0x1f`, `NAK 0x60 PSN sequence error`, `RNR 0x2e 1280us`.
fn syndrome_label(syndrome: Syndrome) -> String {
    let byte = text::aeth_byte(syndrome);
    match syndrome {
        Syndrome::Ack { .. } => format!("ACK {byte:#04x}"),
        Syndrome::RnrNak { timer } => {
            format!("RNR {byte:#04x} {}us", Syndrome::rnr_timer_micros(timer))
        }
        Syndrome::Nak(code) => format!("NAK {byte:#04x} {}", code.name()),
    }
}

/// Text made safe for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            _ => escaped.push(c),
        }
    }
    escaped
}
