//! `--explain`: what each field of a packet means and why it has its value.
//!
//! Lines are specific to the packet; general background (what RC is, what an
//! R_Key is, what the ICRC covers) is added the first time a topic comes up
//! and not repeated, so a long capture reads like a walk-through.

use std::collections::HashSet;
use std::net::IpAddr;

use softroce::wire::opcode::Position;
use softroce::wire::{
    AethRepr, AtomicEthRepr, BthRepr, NakCode, Operation, Packet, Psn, RethRepr, Syndrome, Transport,
};

use super::cm;
use super::decode::{self, CensusProbe};
use super::flow::{
    read_span, Analysis, Answered, Awaiting, AwaitingRequest, Message, MessageKind, Role, Sequence, PATH_MTUS,
};
use super::text::aeth_byte;

/// Background told once per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Topic {
    Transport(Transport),
    UdpPorts,
    QpNumbers,
    StartPsn,
    PKey,
    RKey,
    Msn,
    Icrc,
    Cm,
}

impl Topic {
    fn background(self) -> &'static str {
        match self {
            Topic::Transport(Transport::Rc) => {
                "RC (Reliable Connected): one QP talks to exactly one QP; every request is \
                 acknowledged, lost packets are resent and order is guaranteed"
            }
            Topic::Transport(Transport::Uc) => {
                "UC (Unreliable Connected): connected like RC, but nothing is acknowledged or \
                 resent; a lost packet loses its whole message"
            }
            Topic::Transport(Transport::Ud) => {
                "UD (Unreliable Datagram): single-packet SENDs to any QP that shares the Q_Key; \
                 no acknowledgements, no retransmission, no ordering"
            }
            Topic::UdpPorts => {
                "4791 is the RoCEv2 port. rxe derives the source port from the flow label the \
                 kernel computes from both QP numbers (0xc000 and up), so ECMP routers spread \
                 connections over paths yet keep each connection's packets in order"
            }
            Topic::QpNumbers => {
                "QP numbers are 24 bits and local to each host; rxe hands them out from 0x11 up \
                 (QP 1 is the management QP). The BTH names only the destination QP: the \
                 sender's is implied by the connection (RC, UC) or carried in the DETH (UD)"
            }
            Topic::StartPsn => {
                "The first PSN is chosen when the QP is connected (perftest and the pingpong \
                 examples pick it at random); every request packet then takes the next one, \
                 modulo 2^24"
            }
            Topic::PKey => {
                "The partition key works like a VLAN: a receiver drops packets whose P_Key its \
                 port does not hold; the top bit means full (not limited) membership"
            }
            Topic::RKey => {
                "The R_Key is the remote key the responder's application got when it \
                 registered that memory; a wrong key, an address outside the region or missing \
                 access rights earns a NAK remote access error"
            }
            Topic::Msn => "The MSN counts the request messages the responder has finished, modulo 2^24",
            Topic::Cm => {
                "QP 1 is the General Services Interface: connections are set up by the communication \
                 manager (CM) in 256-byte MADs sent between the two QP 1s. REQ, REP and RTU connect \
                 (a three-way handshake that trades QP numbers and starting PSNs), DREQ and DREP \
                 disconnect, REJ refuses, MRA asks for more time, SIDR_REQ and SIDR_REP find a UD \
                 service. UD loses packets, so a CM resends a message until its answer comes; \
                 rdma_cm (librdmacm) drives the CM from IP addresses and ports"
            }
            Topic::Icrc => {
                "The ICRC is a CRC-32 over the IP, UDP and transport headers (with the fields \
                 routers may change, such as TTL, TOS and checksums, counted as all ones), \
                 the extended headers, payload and pad: end-to-end protection, since RoCE \
                 sends a zero UDP checksum"
            }
        }
    }
}

/// Explanations for the packets of a run, in order.
#[derive(Debug, Default)]
pub struct Explainer {
    told: HashSet<Topic>,
}

impl Explainer {
    /// The lines under one packet.
    pub fn packet(&mut self, pkt: &Packet<'_>, analysis: &Analysis, icrc_ok: bool) -> Vec<String> {
        let header = &pkt.roce.header;
        let bth = &header.bth;
        let transport = bth.opcode.transport();
        let op = bth.opcode.operation();
        let mut lines = vec![self.opcode(bth)];
        if self.told.insert(Topic::UdpPorts) {
            lines.push(format!(
                "UDP {} > {}: {}",
                pkt.udp.source_port,
                pkt.udp.destination_port,
                Topic::UdpPorts.background()
            ));
        }
        lines.push(self.dest_qp(bth, pkt.ip.destination(), op.is_request()));
        lines.push(self.psn(bth, header.aeth.map(|a| a.syndrome), analysis));
        lines.push(ack_req(transport, op, bth.ack_req));
        lines.extend(flags(bth));
        if let Some(line) = self.pkey(bth.pkey) {
            lines.push(line);
        }
        if let Some(reth) = header.reth {
            lines.push(self.reth(op, &reth));
        }
        if let Some(aeth) = header.aeth {
            lines.push(self.aeth(op, &aeth));
        }
        if let Some(eth) = header.atomic_eth {
            lines.push(atomic_eth(op, &eth));
        }
        if let Some(ack) = header.atomic_ack_eth {
            lines.push(atomic_ack_eth(ack.original, answered_atomic(analysis)));
        }
        if let Some(deth) = header.deth {
            lines.push(deth_line(deth.qkey, deth.src_qpn));
        }
        if let Some(gsi) = decode::gsi(pkt) {
            lines.push(self.with_background(Topic::Cm, cm::header_line(&gsi)));
            lines.extend(cm::message_lines(&gsi, pkt.ip.source(), pkt.ip.destination()));
        }
        if let Some(imm) = header.imm {
            lines.push(imm_line(op, imm));
        }
        if let Some(rkey) = header.ieth {
            lines.push(format!(
                "IETH: R_Key {rkey:#x} to invalidate: once this SEND arrives, the receiver's \
                 key stops granting remote access (the sender is done with that memory)"
            ));
        }
        if let Some(feth) = header.feth {
            lines.push(feth_line(feth.selectivity, feth.placement_type));
        }
        lines.extend(payload(op, pkt.roce.payload.len(), analysis.message));
        if pkt.roce.pad != 0 {
            lines.push(format!(
                "pad {}: {}-byte payload padded to a multiple of 4",
                pkt.roce.pad,
                pkt.roce.payload.len()
            ));
        }
        lines.push(self.icrc(pkt, icrc_ok));
        lines
    }

    /// The line under a RoCE packet that does not decode.
    pub fn malformed(&self, error: &str) -> Vec<String> {
        vec![format!(
            "sent to UDP port 4791, so meant as RoCEv2, but it does not decode ({error}); a \
             receiver drops it as if it had been lost"
        )]
    }

    /// `line`, followed by the topic's background the first time it comes up.
    fn with_background(&mut self, topic: Topic, line: String) -> String {
        if self.told.insert(topic) {
            format!("{line}. {}", topic.background())
        } else {
            line
        }
    }

    fn opcode(&mut self, bth: &BthRepr) -> String {
        let op = bth.opcode.operation();
        let mut line = format!("{} (opcode {:#04x}): {}", bth.opcode, bth.opcode.to_u8(), meaning(op));
        if MessageKind::of(op).is_some() {
            line.push_str(match op.position() {
                Position::First => "; first packet of a multi-packet message",
                Position::Middle => "; a middle packet of a multi-packet message",
                Position::Last => "; last packet of its message",
                Position::Only => "; the whole message in one packet",
            });
        }
        self.with_background(Topic::Transport(bth.opcode.transport()), line)
    }

    fn dest_qp(&mut self, bth: &BthRepr, dst: IpAddr, request: bool) -> String {
        let whose = if request { "" } else { "requester's " };
        let line = format!("dest QP {:#x}: the {whose}queue pair on {dst} this packet is for", bth.dest_qpn);
        self.with_background(Topic::QpNumbers, line)
    }

    fn psn(&mut self, bth: &BthRepr, aeth_syndrome: Option<Syndrome>, analysis: &Analysis) -> String {
        let psn = bth.psn;
        let op = bth.opcode.operation();
        match analysis.role {
            Role::Request(sequence) => {
                let transport = bth.opcode.transport();
                let mut line = request_psn(psn, bth.dest_qpn, transport, sequence, analysis.retransmission);
                if sequence == Sequence::Start {
                    line = self.with_background(Topic::StartPsn, line);
                }
                if transport == Transport::Ud {
                    line.push_str("; UD receivers do not check PSNs, the sending QP just counts");
                }
                line
            }
            Role::Response { acknowledged, answers } => match op {
                Operation::Acknowledge => match aeth_syndrome {
                    Some(Syndrome::Ack { .. }) | None => ack_psn(psn, acknowledged),
                    Some(Syndrome::RnrNak { .. }) => format!(
                        "PSN {psn}: the request that found no receive request posted; the \
                         requester resends it when the RNR timer expires"
                    ),
                    Some(Syndrome::Nak(NakCode::PsnSequenceError)) => format!(
                        "PSN {psn}: the PSN the responder expected; the requester must resend \
                         from here"
                    ),
                    Some(Syndrome::Nak(_)) => format!("PSN {psn}: the request that failed"),
                },
                Operation::AtomicAcknowledge => atomic_ack_psn(psn, answers, analysis.retransmission),
                _ => read_response_psn(psn, answers, analysis),
            },
        }
    }

    fn pkey(&mut self, pkey: u16) -> Option<String> {
        let membership = if pkey & 0x8000 != 0 { "full" } else { "limited" };
        let partition = match pkey & 0x7fff {
            0x7fff => "the default partition".to_string(),
            other => format!("partition {other:#06x}"),
        };
        let line = format!("P_Key {pkey:#06x}: {partition}, {membership} membership");
        // The default is worth one word; anything else on every packet.
        (pkey != BthRepr::DEFAULT_PKEY || !self.told.contains(&Topic::PKey))
            .then(|| self.with_background(Topic::PKey, line))
    }

    fn reth(&mut self, op: Operation, reth: &RethRepr) -> String {
        let RethRepr { va, rkey, dma_len } = *reth;
        let line = match op {
            Operation::ReadRequest => {
                format!("RETH: read {dma_len} bytes from remote address {va:#x} under R_Key {rkey:#x}")
            }
            Operation::Flush => format!(
                "RETH: the range to flush, {dma_len} bytes at remote address {va:#x} under \
                 R_Key {rkey:#x}"
            ),
            Operation::AtomicWrite => {
                format!("RETH: the 8-byte target at remote address {va:#x} under R_Key {rkey:#x}")
            }
            Operation::WriteFirst => format!(
                "RETH: write {dma_len} bytes to remote address {va:#x} under R_Key {rkey:#x}; \
                 the later packets of the message carry no RETH and continue where this one ends"
            ),
            _ => format!("RETH: write {dma_len} bytes to remote address {va:#x} under R_Key {rkey:#x}"),
        };
        self.with_background(Topic::RKey, line)
    }

    fn aeth(&mut self, op: Operation, aeth: &AethRepr) -> String {
        let verdict = match aeth.syndrome {
            Syndrome::Ack { credits: Syndrome::INVALID_CREDITS } => {
                "ACK, credit field invalid (rxe never advertises credits)".to_string()
            }
            Syndrome::Ack { credits } => format!(
                "ACK with credit code {credits}: end-to-end flow control, the responder tells \
                 how many receive requests it has posted"
            ),
            Syndrome::RnrNak { timer } => format!(
                "RNR NAK (receiver not ready): a SEND found no posted receive request; retry \
                 after timer code {timer} = {}",
                micros(Syndrome::rnr_timer_micros(timer))
            ),
            Syndrome::Nak(code) => format!("NAK, {}: {}", code.name(), nak_meaning(code)),
        };
        let response_note = match op {
            Operation::Acknowledge => "",
            Operation::AtomicAcknowledge => {
                "; on an ATOMIC ACKNOWLEDGE the AETH also acknowledges every earlier request"
            }
            _ => "; on a READ response the AETH also acknowledges every earlier request",
        };
        let line = format!(
            "AETH {:#04x}: {verdict}{response_note}; MSN {} = messages completed by the responder",
            aeth_byte(aeth.syndrome),
            aeth.msn
        );
        self.with_background(Topic::Msn, line)
    }

    fn icrc(&mut self, pkt: &Packet<'_>, icrc_ok: bool) -> String {
        let carried = pkt.roce.icrc;
        let line = if icrc_ok {
            format!("ICRC {carried:#010x} verified")
        } else {
            let computed = match pkt.expected_icrc() {
                Ok(icrc) => format!("{icrc:#010x}"),
                Err(e) => format!("nothing ({e})"),
            };
            format!(
                "ICRC BAD: the packet carries {carried:#010x} but its bytes give {computed}: \
                 something changed after the sender computed it; a receiver drops the packet \
                 silently, as if it had been lost"
            )
        };
        self.with_background(Topic::Icrc, line)
    }
}

/// What an operation does, for the opcode line.
fn meaning(op: Operation) -> &'static str {
    use Operation::*;
    match op {
        SendFirst | SendMiddle | SendLast | SendOnly => {
            "SEND: the payload goes into the buffer of the next receive request the responder's \
             application posted"
        }
        SendLastImm | SendOnlyImm => {
            "SEND with immediate: a SEND whose completion also hands the receiver the 32-bit ImmDt"
        }
        SendLastInv | SendOnlyInv => {
            "SEND with invalidate: a SEND that also revokes the R_Key in the IETH at the receiver"
        }
        WriteFirst | WriteMiddle | WriteLast | WriteOnly => {
            "RDMA WRITE: the payload goes straight into remote memory, without the responder's \
             application taking part"
        }
        WriteLastImm | WriteOnlyImm => {
            "RDMA WRITE with immediate: an RDMA WRITE whose ImmDt also tells the responder's \
             application, through a receive request, that the data is there"
        }
        ReadRequest => {
            "RDMA READ request: asks the responder to send back remote memory; the data returns \
             in READ response packets"
        }
        ReadResponseFirst | ReadResponseMiddle | ReadResponseLast | ReadResponseOnly => {
            "RDMA READ response: data a READ request asked for"
        }
        Acknowledge => "ACKNOWLEDGE: the responder's verdict on the requests so far, in the AETH",
        AtomicAcknowledge => {
            "ATOMIC ACKNOWLEDGE: the responder's answer to an atomic request, with the value the \
             memory held before"
        }
        CompareSwap => {
            "COMPARE_SWAP: atomically replace 8 bytes of remote memory if they equal a compare \
             value"
        }
        FetchAdd => "FETCH_ADD: atomically add to 8 bytes of remote memory and return what they held",
        Flush => "FLUSH: make earlier RDMA WRITEs to a memory range globally visible or persistent",
        AtomicWrite => "ATOMIC_WRITE: store 8 bytes of remote memory as one indivisible write",
    }
}

fn request_psn(psn: Psn, dest_qpn: u32, transport: Transport, sequence: Sequence, retransmission: bool) -> String {
    match sequence {
        Sequence::Start => format!("PSN {psn}: first request seen on this flow"),
        Sequence::InOrder { previous } if retransmission => format!(
            "PSN {psn}: next after {previous}, but sent before: the requester is resending \
             everything from the lost packet on (go-back-N)"
        ),
        Sequence::InOrder { previous } => {
            format!("PSN {psn}: next in sequence for QP {dest_qpn:#x} (previous {previous})")
        }
        Sequence::AfterRead { read, dma_len, reserved } => {
            let mut fitting = PATH_MTUS.iter().filter(|mtu| read_span(dma_len, **mtu) == reserved);
            let at_mtu = match (fitting.next(), fitting.next()) {
                (Some(mtu), None) => format!(" at path MTU {mtu}"),
                _ => String::new(),
            };
            format!(
                "PSN {psn}: next in sequence: the READ request at PSN {read} reserved {reserved} \
                 PSN(s), one for each response packet ({dma_len} bytes{at_mtu})"
            )
        }
        Sequence::Behind { expected } if transport == Transport::Rc => format!(
            "PSN {psn} seen before on this flow: retransmission (the flow had reached \
             {expected}); the requester went back after a NAK or a timeout"
        ),
        Sequence::Behind { expected } => format!(
            "PSN {psn} is behind the expected {expected}: a duplicate or reordered packet \
             ({} never retransmits)",
            transport.name()
        ),
        Sequence::Ahead { expected, missing } => {
            let consequence = match transport {
                Transport::Rc => {
                    "; an RC responder answers a gap with a NAK (PSN sequence error) and the \
                     requester resends from the missing PSN"
                }
                Transport::Uc => "; a UC responder drops the rest of the message in progress",
                Transport::Ud => "",
            };
            format!(
                "PSN {psn} skips ahead of the expected {expected}: {missing} PSN(s) missing \
                 from the capture (lost, or not captured){consequence}"
            )
        }
    }
}

fn ack_psn(psn: Psn, acknowledged: Option<Psn>) -> String {
    match acknowledged {
        None => format!(
            "PSN {psn}: acknowledges every request up to and including PSN {psn} (ACKs are \
             cumulative)"
        ),
        Some(previous) if previous == psn => format!(
            "PSN {psn}: same PSN as the previous acknowledgement: a duplicate ACK, which a \
             responder sends when a request it already executed arrives again"
        ),
        Some(previous) if psn.is_after(previous) => format!(
            "PSN {psn}: acknowledges every request up to and including PSN {psn}; ACKs are \
             cumulative, this one covers the {} PSN(s) after the previous acknowledgement at \
             {previous}",
            psn.diff(previous)
        ),
        Some(previous) => {
            format!(
                "PSN {psn}: older than the previous acknowledgement at {previous}: stale or \
                 reordered"
            )
        }
    }
}

fn read_response_psn(psn: Psn, answers: Option<Answered>, analysis: &Analysis) -> String {
    let Some(Answered { request, index }) = answers else {
        return format!("PSN {psn}: the READ request it answers is not in the capture");
    };
    let total = match (request.request, analysis.message) {
        (AwaitingRequest::Read { dma_len }, Some(Message { path_mtu: Some(mtu), .. })) => {
            format!(" of {}", read_span(dma_len, mtu))
        }
        _ => String::new(),
    };
    let mut line = format!(
        "PSN {psn}: response packet {}{total} to the READ request at PSN {}: each response \
         packet consumes one PSN of the request ({} + {index})",
        index + 1,
        request.psn,
        request.psn
    );
    if analysis.retransmission {
        line.push_str(
            "; sent before: the requester asked again for data it did not get, and the \
             responder reads the memory again",
        );
    }
    line
}

fn atomic_ack_psn(psn: Psn, answers: Option<Answered>, retransmission: bool) -> String {
    let mut line = match answers.map(|a| a.request.request) {
        Some(AwaitingRequest::Atomic { operation, .. }) => {
            format!("PSN {psn}: answers the {} request with the same PSN", operation.name())
        }
        _ => format!("PSN {psn}: the atomic request it answers is not in the capture"),
    };
    if retransmission {
        line.push_str(
            "; sent before: the responder replays its saved result for a repeated request, \
             because an atomic must never be executed twice",
        );
    }
    line
}

fn ack_req(transport: Transport, op: Operation, ack_req: bool) -> String {
    let bit = if ack_req { "AckReq set" } else { "AckReq clear" };
    if !op.is_request() {
        return format!("{bit}: responses are never acknowledged");
    }
    if transport != Transport::Rc {
        return format!("{bit}: {} has no acknowledgements", transport.name());
    }
    match (op, op.position(), ack_req) {
        (Operation::ReadRequest, ..) => {
            format!("{bit}: the READ response packets acknowledge this request anyway")
        }
        (Operation::CompareSwap | Operation::FetchAdd, ..) => {
            format!("{bit}: the ATOMIC ACKNOWLEDGE answers this request anyway")
        }
        (_, Position::Last | Position::Only, true) => {
            "AckReq set: last packet of the message, the responder must acknowledge".to_string()
        }
        (_, Position::Last | Position::Only, false) => {
            "AckReq clear on the last packet of a message: unusual, rxe always asks for an ACK \
             here"
                .to_string()
        }
        (_, Position::First | Position::Middle, false) => {
            "AckReq clear: more of the message follows, and one cumulative ACK at the end will \
             cover it"
                .to_string()
        }
        (_, Position::First | Position::Middle, true) => {
            "AckReq set mid-message: the requester wants an ACK early so it can retire packets \
             (rxe asks at least every 64 packets)"
                .to_string()
        }
    }
}

/// Lines for the BTH bits that are normally clear, when they are set.
fn flags(bth: &BthRepr) -> Vec<String> {
    [
        (
            bth.solicited,
            "SE (solicited event) set: a receiver waiting for solicited completions only is woken \
             by this message",
        ),
        (
            bth.mig_req,
            "M (MigReq) set: the sender's QP reports its automatic path migration state as \
             migrated",
        ),
        (
            bth.fecn,
            "FECN set: congestion was met on the way here (RoCEv2 normally signals it with IP \
             ECN bits instead)",
        ),
        (bth.becn, "BECN set: the receiver of earlier packets reports congestion back to the sender"),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .map(|(_, line)| line.to_string())
    .collect()
}

fn atomic_eth(op: Operation, eth: &AtomicEthRepr) -> String {
    let AtomicEthRepr { va, rkey, swap_add, compare } = *eth;
    let mut line = if op == Operation::FetchAdd {
        format!(
            "AtomicETH: add {swap_add} ({swap_add:#x}) to the 8 bytes at remote address {va:#x} \
             under R_Key {rkey:#x}; the compare field ({compare:#x}) is unused by FETCH_ADD; the \
             ATOMIC ACKNOWLEDGE returns the old value"
        )
    } else {
        format!(
            "AtomicETH: if the 8 bytes at remote address {va:#x} (R_Key {rkey:#x}) equal \
             {compare:#x}, replace them with {swap_add:#x}; the ATOMIC ACKNOWLEDGE returns the \
             old value either way"
        )
    };
    if va % 8 != 0 {
        line.push_str(
            "; the address is not 8-byte aligned, so the responder refuses it (NAK invalid \
             request)",
        );
    }
    line
}

/// The atomic request an ATOMIC ACKNOWLEDGE answers, when captured.
fn answered_atomic(analysis: &Analysis) -> Option<(Operation, AtomicEthRepr)> {
    match analysis.role {
        Role::Response {
            answers:
                Some(Answered { request: Awaiting { request: AwaitingRequest::Atomic { operation, eth }, .. }, .. }),
            ..
        } => Some((operation, eth)),
        _ => None,
    }
}

fn atomic_ack_eth(original: u64, request: Option<(Operation, AtomicEthRepr)>) -> String {
    let outcome = match request {
        Some((Operation::FetchAdd, eth)) => {
            format!("; the FETCH_ADD of {} left {:#x} there", eth.swap_add, original.wrapping_add(eth.swap_add))
        }
        Some((_, eth)) if original == eth.compare => {
            format!("; it equals the compare value, so {:#x} was stored", eth.swap_add)
        }
        Some((_, eth)) => {
            format!("; it differs from the compare value {:#x}, so memory was left unchanged", eth.compare)
        }
        None => String::new(),
    };
    format!(
        "AtomicAckETH: original value {original} ({original:#x}), what the remote 8 bytes held \
         before the operation{outcome}"
    )
}

fn deth_line(qkey: u32, src_qpn: u32) -> String {
    let mut line = format!(
        "DETH: Q_Key {qkey:#010x}, source QP {src_qpn:#x}: the receiving UD QP accepts the \
         datagram only if its own Q_Key matches; the source QP tells the receiver whom to reply to"
    );
    if qkey == 0x1111_1111 {
        line.push_str(" (0x11111111 is the Q_Key of ibv_ud_pingpong and many examples)");
    }
    if qkey & 0x8000_0000 != 0 {
        line.push_str("; the top bit marks a controlled Q_Key, which only privileged senders may use");
    }
    line
}

fn imm_line(op: Operation, imm: u32) -> String {
    let write_note = if MessageKind::of(op) == Some(MessageKind::Write) {
        ", although the data of the RDMA WRITE itself goes straight to memory"
    } else {
        ""
    };
    format!(
        "ImmDt {imm:#010x}: 32 bits handed to the receiving application in its work completion \
         (wc.imm_data); it consumes a receive request{write_note}"
    )
}

fn feth_line(selectivity: u8, placement_type: u8) -> String {
    let scope = match selectivity {
        0 => "just the range in the RETH",
        1 => "the whole memory region",
        _ => "reserved",
    };
    let placement = match placement_type & 0x3 {
        0 => "nothing",
        1 => "global visibility",
        2 => "persistence",
        _ => "global visibility and persistence",
    };
    format!(
        "FETH: selectivity {selectivity} ({scope}), placement type {placement_type} (asks for \
         {placement})"
    )
}

/// The payload line, which tells how far the message has got.
fn payload(op: Operation, len: usize, message: Option<Message>) -> Option<String> {
    let Some(m) = message else {
        return (len != 0).then(|| format!("payload {len} bytes"));
    };
    let kind = m.kind.name();
    let of_announced = m.announced.map(|total| format!(" of {total}")).unwrap_or_default();
    Some(match op.position() {
        Position::First => format!(
            "payload {len} bytes: a FIRST packet carries exactly one path MTU, so this QP's path \
             MTU is {len}"
        ),
        Position::Middle if m.from_start => format!(
            "payload {len} bytes (one path MTU): packet {} of the {kind}, {} bytes so \
             far{of_announced}",
            m.packets, m.bytes
        ),
        Position::Middle => format!(
            "payload {len} bytes (one path MTU) of a {kind} whose first packet is not in the \
             capture"
        ),
        Position::Last if m.from_start => format!(
            "payload {len} bytes: completes a {}-byte {kind} in {} packet(s){}",
            m.bytes,
            m.packets,
            match m.announced {
                Some(total) if u64::from(total) != m.bytes => format!(" (announced {total})"),
                _ => String::new(),
            }
        ),
        Position::Last => {
            format!("payload {len} bytes: ends a {kind} whose first packet is not in the capture")
        }
        Position::Only => format!("payload {len} bytes: the whole {kind} in one packet"),
    })
}

fn nak_meaning(code: NakCode) -> &'static str {
    match code {
        NakCode::PsnSequenceError => {
            "a request arrived with a later PSN than expected, so something was lost; the \
             requester resends from the PSN of this NAK (not fatal)"
        }
        NakCode::InvalidRequest => {
            "the request is malformed or not allowed on this QP (an unsupported opcode, a length \
             over the limit, a misaligned atomic); fatal: the requester's QP goes to the error \
             state"
        }
        NakCode::RemoteAccessError => {
            "the R_Key, address range or access rights of an RDMA or atomic request did not check \
             out; fatal for the QP"
        }
        NakCode::RemoteOperationalError => {
            "the responder could not complete a valid request (a local error on its side); fatal \
             for the QP"
        }
        NakCode::InvalidRdRequest => "a Reliable Datagram error; rxe does not implement RD and never sends it",
    }
}

/// `1280 us (1.28 ms)`.
fn micros(us: u32) -> String {
    if us >= 1000 {
        format!("{us} us ({} ms)", f64::from(us) / 1000.0)
    } else {
        format!("{us} us")
    }
}

/// What a census probe is for.
pub fn census_probe(probe: &CensusProbe) -> Vec<String> {
    vec![format!(
        "not RoCE: softroce's programs that share a device's UDP port take a census of each other's \
         sockets with such probes, sent from the port to itself; every member's socket filter drops \
         them, and the coordinator sends {} to steer to socket position {}, so each socket's drop \
         count says where it sits (nonce {:#010x} tells this census from older ones). No RoCE peer \
         sees them: they never leave the host",
        probe.position + 1,
        probe.position,
        probe.nonce
    )]
}
