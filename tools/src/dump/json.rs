//! `--json`: one object per packet, for scripts.

use serde_json::{json, Value};
use softroce::wire::{Packet, Syndrome};

use super::cm;
use super::decode::{self, CensusProbe, Malformed};
use super::flow::Analysis;
use super::text::aeth_byte;

/// Where a packet was found, common to every object.
pub struct Origin<'a> {
    pub file: &'a str,
    pub frame: usize,
    /// Capture timestamp, seconds since the epoch.
    pub time: f64,
    /// Which packet of a GSO/GRO train the frame held, and of how many.
    pub segment: Option<(usize, usize)>,
}

/// The BTH fields, payload and ICRC, one nested object per extended header,
/// and `"mad"` for a packet to QP 1 (with `"cm"` for a CM message).
pub fn packet(origin: &Origin<'_>, pkt: &Packet<'_>, analysis: &Analysis, icrc_ok: bool) -> Value {
    let h = &pkt.roce.header;
    let bth = &h.bth;
    let mut object = json!({
        "file": origin.file,
        "frame": origin.frame,
        "train_packet": origin.segment.map(|(i, _)| i),
        "train_packets": origin.segment.map(|(_, of)| of),
        "time": origin.time,
        "src": pkt.ip.source().to_string(),
        "dst": pkt.ip.destination().to_string(),
        "udp_src_port": pkt.udp.source_port,
        "opcode": bth.opcode.to_u8(),
        "opcode_name": bth.opcode.to_string(),
        "dqpn": bth.dest_qpn,
        "psn": bth.psn.value(),
        "ack_req": bth.ack_req,
        "solicited": bth.solicited,
        "mig_req": bth.mig_req,
        "fecn": bth.fecn,
        "becn": bth.becn,
        "pkey": bth.pkey,
        "payload_len": pkt.roce.payload.len(),
        "pad": pkt.roce.pad,
        "icrc": pkt.roce.icrc,
        "icrc_ok": icrc_ok,
        "retransmission": analysis.retransmission,
    });
    if let Some(r) = h.reth {
        object["reth"] = json!({"va": r.va, "rkey": r.rkey, "dma_len": r.dma_len});
    }
    if let Some(a) = h.aeth {
        let mut aeth = json!({"syndrome": aeth_byte(a.syndrome), "msn": a.msn});
        match a.syndrome {
            Syndrome::Ack { credits } => {
                aeth["kind"] = "ack".into();
                aeth["credits"] = credits.into();
            }
            Syndrome::RnrNak { timer } => {
                aeth["kind"] = "rnr_nak".into();
                aeth["timer"] = timer.into();
                aeth["timer_us"] = Syndrome::rnr_timer_micros(timer).into();
            }
            Syndrome::Nak(code) => {
                aeth["kind"] = "nak".into();
                aeth["nak_code"] = code.code().into();
                aeth["nak_name"] = code.name().into();
            }
        }
        object["aeth"] = aeth;
    }
    if let Some(d) = h.deth {
        object["deth"] = json!({"qkey": d.qkey, "src_qpn": d.src_qpn});
    }
    if let Some(gsi) = decode::gsi(pkt) {
        object["mad"] = cm::json(&gsi);
    }
    if let Some(a) = h.atomic_eth {
        object["atomic_eth"] = json!({"va": a.va, "rkey": a.rkey, "swap_add": a.swap_add, "compare": a.compare});
    }
    if let Some(a) = h.atomic_ack_eth {
        object["atomic_ack_eth"] = json!({"original": a.original});
    }
    if let Some(imm) = h.imm {
        object["imm"] = imm.into();
    }
    if let Some(rkey) = h.ieth {
        object["ieth"] = rkey.into();
    }
    if let Some(f) = h.feth {
        object["feth"] = json!({"selectivity": f.selectivity, "placement_type": f.placement_type});
    }
    object
}

/// `{"malformed": error, "frame": N, ...}`.
pub fn malformed(origin: &Origin<'_>, malformed: &Malformed) -> Value {
    json!({
        "file": origin.file,
        "frame": origin.frame,
        "time": origin.time,
        "src": malformed.src.to_string(),
        "dst": malformed.dst.to_string(),
        "malformed": malformed.error,
    })
}

/// `{"census_probe": {"nonce": N, "position": N}, "frame": N, ...}`.
pub fn census_probe(origin: &Origin<'_>, probe: &CensusProbe) -> Value {
    json!({
        "file": origin.file,
        "frame": origin.frame,
        "time": origin.time,
        "src": probe.src.to_string(),
        "dst": probe.dst.to_string(),
        "census_probe": {"nonce": probe.nonce, "position": probe.position},
    })
}
