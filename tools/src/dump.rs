//! `softroce dump`: one line per RoCEv2 packet of a capture.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use softroce::capture;
use softroce::wire::{Error, Packet};

#[derive(clap::Args)]
pub struct Args {
    /// pcap or pcapng files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

#[derive(Default)]
struct Totals {
    packets: usize,
    icrc_ok: usize,
    icrc_bad: usize,
    malformed: usize,
}

pub fn run(args: Args) -> ExitCode {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut totals = Totals::default();
    let mut failed = false;
    for path in &args.files {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("softroce dump: {}: {e}", path.display());
                failed = true;
                continue;
            }
        };
        let (frames, err) = capture::read(&bytes);
        for frame in &frames {
            let Some(ip) = capture::ip_bytes(frame.link, &frame.data) else { continue };
            match Packet::parse(ip) {
                Ok(pkt) => {
                    totals.packets += 1;
                    let ok = pkt.icrc_ok();
                    if ok {
                        totals.icrc_ok += 1;
                    } else {
                        totals.icrc_bad += 1;
                    }
                    let _ = writeln!(out, "{}", line(&pkt, ok));
                }
                Err(Error::NotRoce) => {}
                Err(e) => {
                    totals.packets += 1;
                    totals.malformed += 1;
                    let _ = writeln!(out, "malformed: {e}");
                }
            }
        }
        if let Some(e) = err {
            eprintln!("softroce dump: {}: {e}", path.display());
            totals.malformed += 1;
            failed = true;
        }
    }
    let _ = writeln!(
        out,
        "packets: {}, icrc ok: {}, icrc bad: {}, malformed: {}",
        totals.packets, totals.icrc_ok, totals.icrc_bad, totals.malformed
    );
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn line(pkt: &Packet<'_>, icrc_ok: bool) -> String {
    let h = &pkt.roce.header;
    format!(
        "{} > {} {} qp={:#x} psn={} ack_req={} len={} icrc={}",
        pkt.ip.source(),
        pkt.ip.destination(),
        h.bth.opcode,
        h.bth.dest_qpn,
        h.bth.psn,
        u8::from(h.bth.ack_req),
        pkt.roce.payload.len(),
        if icrc_ok { "ok" } else { "BAD" }
    )
}
