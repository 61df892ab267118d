//! The default output: one line per packet, tcpdump style.

use std::fmt::Write;

use softroce::wire::{BthRepr, Packet, RoceRepr, Syndrome};

use super::cm;
use super::decode::{self, CensusProbe, Malformed};
use super::flow::Analysis;

/// `frame time src > dst OPCODE qp= psn= ack_req= [headers] len= icrc=`, with
/// rarely set BTH fields (SE, M, FECN, BECN, a non-default P_Key) only when set,
/// and the MAD of a packet to QP 1 after its DETH (`CM REQ(...)`).
pub fn packet_line(frame: usize, seconds: f64, pkt: &Packet<'_>, analysis: &Analysis, icrc_ok: bool) -> String {
    format!(
        "{frame:5} {seconds:10.6} {} > {} {}",
        pkt.ip.source(),
        pkt.ip.destination(),
        packet_fields(pkt, analysis, icrc_ok)
    )
}

/// The packet line without frame, time and addresses: `OPCODE qp= psn= ...
/// icrc=` (what `softroce trace` shows of a packet).
pub fn packet_fields(pkt: &Packet<'_>, analysis: &Analysis, icrc_ok: bool) -> String {
    let h = &pkt.roce.header;
    let bth = &h.bth;
    let mut line = format!("{} qp={:#x} psn={} ack_req={}", bth.opcode, bth.dest_qpn, bth.psn, u8::from(bth.ack_req),);
    for (set, flag) in [(bth.solicited, "se"), (bth.mig_req, "mig_req"), (bth.fecn, "fecn"), (bth.becn, "becn")] {
        if set {
            let _ = write!(line, " {flag}");
        }
    }
    if bth.pkey != BthRepr::DEFAULT_PKEY {
        let _ = write!(line, " pkey={:#06x}", bth.pkey);
    }
    if let Some(d) = h.deth {
        let _ = write!(line, " DETH(qkey={:#010x} src_qp={:#x})", d.qkey, d.src_qpn);
    }
    if let Some(gsi) = decode::gsi(pkt) {
        let _ = write!(line, " {}", cm::summary(&gsi));
    }
    line.push_str(&extended_headers(h));
    let _ = write!(line, " len={}", pkt.roce.payload.len());
    if pkt.roce.pad != 0 {
        let _ = write!(line, " pad={}", pkt.roce.pad);
    }
    let _ = write!(line, " icrc={}", if icrc_ok { "ok" } else { "BAD" });
    if analysis.retransmission {
        line.push_str(" [retransmission]");
    }
    line
}

/// The extended headers after the DETH and any MAD, each as ` NAME(fields)`:
/// FETH, RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH.
pub fn extended_headers(h: &RoceRepr) -> String {
    let mut text = String::new();
    if let Some(f) = h.feth {
        let _ = write!(text, " FETH(selectivity={} placement={})", f.selectivity, f.placement_type);
    }
    if let Some(r) = h.reth {
        let _ = write!(text, " RETH(va={:#x} rkey={:#x} len={})", r.va, r.rkey, r.dma_len);
    }
    if let Some(a) = h.aeth {
        let _ = write!(text, " AETH({:#04x} {} msn={})", aeth_byte(a.syndrome), syndrome_text(a.syndrome), a.msn);
    }
    if let Some(a) = h.atomic_eth {
        let _ = write!(
            text,
            " AtomicETH(va={:#x} rkey={:#x} swap_add={:#x} compare={:#x})",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = h.atomic_ack_eth {
        let _ = write!(text, " AtomicAckETH(orig={:#x})", a.original);
    }
    if let Some(imm) = h.imm {
        let _ = write!(text, " ImmDt({imm:#010x})");
    }
    if let Some(rkey) = h.ieth {
        let _ = write!(text, " IETH(rkey={rkey:#x})");
    }
    text
}

/// `frame time src > dst malformed RoCEv2 packet: error`.
pub fn malformed_line(frame: usize, seconds: f64, malformed: &Malformed) -> String {
    format!(
        "{frame:5} {seconds:10.6} {} > {} malformed RoCEv2 packet: {}",
        malformed.src, malformed.dst, malformed.error
    )
}

/// `frame time src > dst softroce census probe nonce= position=`.
pub fn census_probe_line(frame: usize, seconds: f64, probe: &CensusProbe) -> String {
    format!(
        "{frame:5} {seconds:10.6} {} > {} softroce census probe (shared port, not RoCE) nonce={:#010x} position={}",
        probe.src, probe.dst, probe.nonce, probe.position
    )
}

/// The AETH syndrome byte; syndromes that parsed always encode.
pub fn aeth_byte(syndrome: Syndrome) -> u8 {
    syndrome.to_u8().unwrap_or_default()
}

/// `ACK credits=invalid`, `RNR NAK timer=14 (1280 us)`, `NAK PSN sequence error`.
fn syndrome_text(syndrome: Syndrome) -> String {
    match syndrome {
        Syndrome::Ack { credits: Syndrome::INVALID_CREDITS } => "ACK credits=invalid".to_string(),
        other => other.to_string(),
    }
}
