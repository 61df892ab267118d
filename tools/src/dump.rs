//! `softroce dump`: decode the RoCEv2 packets of captures, one line (or JSON
//! object) each, optionally explained field by field and drawn as a ladder.

mod cm;
pub(crate) mod decode;
pub(crate) mod explain;
pub(crate) mod flow;
mod json;
mod ladder;
pub(crate) mod text;

use std::io::{self, StdoutLock, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use softroce::capture;
use softroce::wire::train;
use softroce::wire::Packet;

use decode::{CensusProbe, Decoded, Malformed};
use explain::Explainer;
use flow::{Analysis, Tracker};
use json::Origin;
use ladder::Ladder;

#[derive(clap::Args)]
#[command(after_help = "The last line counts packets, ICRC results and malformed packets \
    (a damaged capture file counts as one), the GSO/GRO trains split into packets, and the census \
    probes of softroce's shared port (datagrams to the RoCE port that are not RoCE: programs that \
    share a device's port count each other's sockets with them). A datagram \
    that holds a train of RoCE packets (a capture on lo, or on a NIC that offloads segmentation, \
    sees one before the kernel cuts it) is decoded packet by packet, each with its own ICRC and \
    IPv4 ID. Exits non-zero when a file cannot be read whole.")]
pub struct Args {
    /// pcap or pcapng files (Ethernet, Linux cooked or raw IP).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// One JSON object per packet on stdout; the summary goes to stderr.
    #[arg(long)]
    json: bool,
    /// Explain under each packet what its fields mean and why they have their values.
    #[arg(long)]
    explain: bool,
    /// Also draw the packets as a ladder (sequence) diagram into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    ladder: Option<PathBuf>,
}

/// The longest IP packet one RoCE packet makes: a 4096-byte payload behind
/// IPv6, UDP and the largest set of RoCE headers, with pad and ICRC.
const LONGEST_PACKET: usize = 40 + 8 + 12 + 16 + 28 + 4096 + 3 + 4;

#[derive(Default)]
struct Totals {
    packets: usize,
    /// Datagrams that were trains, split into their packets.
    trains: usize,
    icrc_ok: usize,
    icrc_bad: usize,
    malformed: usize,
    census_probes: usize,
}

pub fn run(args: Args) -> ExitCode {
    let mut dump = Dump {
        out: io::stdout().lock(),
        json: args.json,
        totals: Totals::default(),
        explainer: args.explain.then(Explainer::default),
        ladder: args.ladder.is_some().then(Ladder::default),
        failed: false,
    };
    let several = args.files.len() > 1;
    for path in &args.files {
        dump.file(path, several);
    }
    dump.finish(args.ladder.as_deref())
}

/// The outputs of one run and what they have counted.
struct Dump {
    out: StdoutLock<'static>,
    json: bool,
    totals: Totals,
    explainer: Option<Explainer>,
    ladder: Option<Ladder>,
    /// A file could not be read whole, or the ladder not written.
    failed: bool,
}

impl Dump {
    fn file(&mut self, path: &Path, announce: bool) {
        let name = path.display().to_string();
        if announce {
            if !self.json {
                self.print(&format!("==> {name} <=="));
            }
            if let Some(ladder) = &mut self.ladder {
                ladder.note(name.clone(), false);
            }
        }
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) => {
                eprintln!("softroce dump: {name}: {e}");
                self.failed = true;
                return;
            }
        };
        let (frames, damage) = capture::read(&bytes);
        // Flows do not continue from one capture into the next.
        let mut tracker = Tracker::default();
        let start = frames.first().map(|f| f.timestamp).unwrap_or_default();
        for (index, frame) in frames.iter().enumerate() {
            let origin = Origin { file: &name, frame: index + 1, time: frame.timestamp.as_secs_f64(), segment: None };
            let seconds = frame.timestamp.saturating_sub(start).as_secs_f64();
            let decoded = decode::decode(frame);
            // A datagram that is not one good packet may be a train of them.
            let whole_is_wrong = match &decoded {
                Decoded::Roce(pkt) => !pkt.icrc_ok(),
                Decoded::Malformed(_) => true,
                Decoded::CensusProbe(_) | Decoded::Other => false,
            };
            let segments =
                if whole_is_wrong { capture::ip_bytes(frame.link, &frame.data).and_then(train::split) } else { None };
            if let Some(segments) = segments {
                self.totals.trains += 1;
                for (i, segment) in segments.iter().enumerate() {
                    let Ok(pkt) = Packet::parse(&segment.packet) else { continue };
                    let analysis = tracker.observe(&pkt);
                    let origin = Origin { segment: Some((i + 1, segments.len())), ..origin };
                    self.packet(&origin, seconds, &pkt, &analysis);
                }
                continue;
            }
            match decoded {
                // Longer than any one RoCE packet, yet no train: say so, rather
                // than call it one packet with a bad ICRC.
                Decoded::Roce(pkt) if pkt.bytes().len() > LONGEST_PACKET => {
                    let error = format!(
                        "a datagram of {} bytes, longer than one RoCE packet can be, that does not split \
                         into a GSO/GRO train of packets whose ICRCs verify",
                        pkt.bytes().len()
                    );
                    let malformed = Malformed { src: pkt.ip.source(), dst: pkt.ip.destination(), error };
                    self.malformed(&origin, seconds, &malformed);
                }
                Decoded::Roce(pkt) => {
                    let analysis = tracker.observe(&pkt);
                    self.packet(&origin, seconds, &pkt, &analysis);
                }
                Decoded::Malformed(malformed) => self.malformed(&origin, seconds, &malformed),
                Decoded::CensusProbe(probe) => self.census_probe(&origin, seconds, &probe),
                Decoded::Other => {}
            }
        }
        if let Some(e) = damage {
            let message = match frames.len() {
                0 => format!("{name}: unreadable capture: {e}"),
                read => format!("{name}: damaged capture, stopped after frame {read}: {e}"),
            };
            eprintln!("softroce dump: {message}");
            if let Some(ladder) = &mut self.ladder {
                ladder.note(message, true);
            }
            self.totals.malformed += 1;
            self.failed = true;
        }
    }

    fn packet(&mut self, origin: &Origin<'_>, seconds: f64, pkt: &Packet<'_>, analysis: &Analysis) {
        let icrc_ok = pkt.icrc_ok();
        self.totals.packets += 1;
        if icrc_ok {
            self.totals.icrc_ok += 1;
        } else {
            self.totals.icrc_bad += 1;
        }
        let explanation = self.explainer.as_mut().map(|e| e.packet(pkt, analysis, icrc_ok));
        if self.json {
            self.print_json(json::packet(origin, pkt, analysis, icrc_ok), explanation);
        } else {
            let mut line = text::packet_line(origin.frame, seconds, pkt, analysis, icrc_ok);
            if let Some((i, of)) = origin.segment {
                line.push_str(&format!(" (train packet {i}/{of})"));
            }
            self.print(&line);
            self.print_explanation(explanation);
        }
        if let Some(ladder) = &mut self.ladder {
            ladder.packet(origin.frame, seconds, pkt, analysis, icrc_ok);
        }
    }

    fn malformed(&mut self, origin: &Origin<'_>, seconds: f64, malformed: &Malformed) {
        self.totals.packets += 1;
        self.totals.malformed += 1;
        let explanation = self.explainer.as_mut().map(|e| e.malformed(&malformed.error));
        if self.json {
            self.print_json(json::malformed(origin, malformed), explanation);
        } else {
            self.print(&text::malformed_line(origin.frame, seconds, malformed));
            self.print_explanation(explanation);
        }
        if let Some(ladder) = &mut self.ladder {
            ladder.malformed(origin.frame, seconds, malformed);
        }
    }

    fn census_probe(&mut self, origin: &Origin<'_>, seconds: f64, probe: &CensusProbe) {
        self.totals.census_probes += 1;
        let explanation = self.explainer.as_ref().map(|_| explain::census_probe(probe));
        if self.json {
            self.print_json(json::census_probe(origin, probe), explanation);
        } else {
            self.print(&text::census_probe_line(origin.frame, seconds, probe));
            self.print_explanation(explanation);
        }
    }

    /// Writes a line to stdout. A closed pipe (`| head`) is not worth a
    /// complaint, so write errors are ignored.
    fn print(&mut self, line: &str) {
        let _ = writeln!(self.out, "{line}");
    }

    fn print_json(&mut self, mut object: serde_json::Value, explanation: Option<Vec<String>>) {
        if let Some(lines) = explanation {
            object["explain"] = lines.into();
        }
        self.print(&object.to_string());
    }

    fn print_explanation(&mut self, explanation: Option<Vec<String>>) {
        for line in explanation.into_iter().flatten() {
            self.print(&format!("      {line}"));
        }
    }

    fn finish(mut self, ladder_path: Option<&Path>) -> ExitCode {
        if let (Some(ladder), Some(path)) = (&self.ladder, ladder_path) {
            if let Err(e) = std::fs::write(path, ladder.render()) {
                eprintln!("softroce dump: {}: {e}", path.display());
                self.failed = true;
            }
        }
        let t = &self.totals;
        let mut summary = format!(
            "packets: {}, icrc ok: {}, icrc bad: {}, malformed: {}",
            t.packets, t.icrc_ok, t.icrc_bad, t.malformed
        );
        if t.trains > 0 {
            summary.push_str(&format!(", from GSO/GRO trains: {} datagrams", t.trains));
        }
        if t.census_probes > 0 {
            summary.push_str(&format!(", softroce census probes: {}", t.census_probes));
        }
        if self.json {
            eprintln!("{summary}");
        } else {
            self.print(&summary);
        }
        if self.failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}
