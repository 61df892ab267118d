//! Captures made up for the tests: the losses, NAKs, retransmissions and
//! damage that the real rxe traffic in tests/data never shows.
//!
//! Packets are built with the library from the IP and UDP headers of a real
//! rxe packet (10.77.0.3 to 10.77.0.2), so every ICRC is right unless a test
//! spoils it, and written as a raw-IP pcap.

use std::time::Duration;

use softroce::capture::{self, IpPcapWriter};
use softroce::wire::packet::{build, IpHeader};
use softroce::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, NakCode, Opcode, Operation, Packet, RethRepr,
    RoceRepr, Syndrome, Transport,
};

pub const REQUESTER_QPN: u32 = 0x12;
pub const RESPONDER_QPN: u32 = 0x11;

/// Which way a packet goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// 10.77.0.3 to 10.77.0.2, the requester's way.
    Forward,
    /// 10.77.0.2 to 10.77.0.3.
    Backward,
}

/// A capture being written, one packet every 10 microseconds.
pub struct Capture {
    writer: IpPcapWriter<Vec<u8>>,
    /// A real rxe packet whose IP and UDP headers are reused.
    template: Vec<u8>,
    frames: u64,
}

impl Capture {
    pub fn new() -> Capture {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/rc_send_mtu1024.pcap");
        let (frames, err) = capture::read(&std::fs::read(path).unwrap());
        assert!(err.is_none());
        let template = capture::ip_bytes(frames[0].link, &frames[0].data).unwrap().to_vec();
        Capture { writer: IpPcapWriter::new(Vec::new()).unwrap(), template, frames: 0 }
    }

    /// The IP bytes of a packet with valid lengths and ICRC.
    pub fn packet(&self, direction: Direction, roce: &RoceRepr, payload: &[u8]) -> Vec<u8> {
        let template = Packet::parse(&self.template).unwrap();
        let mut ip = template.ip.clone();
        if direction == Direction::Backward {
            if let IpHeader::V4(header) = &mut ip {
                std::mem::swap(&mut header.source, &mut header.destination);
            }
        }
        build(&ip, &template.udp, roce, payload).unwrap()
    }

    pub fn push(&mut self, direction: Direction, roce: &RoceRepr, payload: &[u8]) {
        let bytes = self.packet(direction, roce, payload);
        self.push_bytes(&bytes);
    }

    pub fn push_bytes(&mut self, ip_packet: &[u8]) {
        self.frames += 1;
        self.writer.write(Duration::from_micros(1_000_000 + 10 * self.frames), ip_packet).unwrap();
    }

    pub fn finish(self) -> Vec<u8> {
        self.writer.into_inner()
    }
}

pub fn bth(transport: Transport, op: Operation, dest_qpn: u32, psn: u32, ack_req: bool) -> BthRepr {
    BthRepr { ack_req, ..softroce::wire::build::bth(Opcode::new(transport, op).unwrap(), dest_qpn, psn) }
}

/// An RC request to the responder's QP.
pub fn request(op: Operation, psn: u32, ack_req: bool) -> RoceRepr {
    RoceRepr::new(bth(Transport::Rc, op, RESPONDER_QPN, psn, ack_req))
}

/// An ACKNOWLEDGE to the requester's QP.
pub fn acknowledge(psn: u32, syndrome: Syndrome, msn: u32) -> RoceRepr {
    let mut roce = RoceRepr::new(bth(Transport::Rc, Operation::Acknowledge, REQUESTER_QPN, psn, false));
    roce.aeth = Some(AethRepr { syndrome, msn });
    roce
}

pub const ACK: Syndrome = Syndrome::Ack { credits: Syndrome::INVALID_CREDITS };

/// An RC conversation with a loss, a NAK, an RNR NAK, retransmissions, a
/// spoilt ICRC, a duplicate ACK, a COMPARE_SWAP, a DNS packet and an
/// undecodable packet:
///
/// | frame | direction | packet |
/// | --- | --- | --- |
/// | 1 | > | SEND_FIRST 100 |
/// | 2 | > | SEND_LAST 102 (101 lost) |
/// | 3 | < | NAK PSN sequence error 101 |
/// | 4, 5 | > | SEND_MIDDLE 101, SEND_LAST 102 again |
/// | 6 | < | ACK 102 |
/// | 7 | > | SEND_ONLY_WITH_IMMEDIATE 103, 1022 bytes (pad 2) |
/// | 8 | < | RNR NAK 103, timer 14 |
/// | 9 | > | SEND_ONLY_WITH_IMMEDIATE 103 again |
/// | 10 | < | ACK 103 |
/// | 11 | > | RDMA_WRITE_ONLY 104, ICRC spoilt |
/// | 12 | > | RDMA_WRITE_ONLY 104 again, after a timeout |
/// | 13 | < | ACK 104 (lost after the capture point) |
/// | 14 | > | RDMA_WRITE_ONLY 104 once more |
/// | 15 | < | ACK 104, a duplicate |
/// | 16 | > | COMPARE_SWAP 105: compare 5, swap 7 |
/// | 17 | < | ATOMIC_ACKNOWLEDGE 105, original 5 |
/// | 18 | > | UDP to port 53, not RoCE |
/// | 19 | > | BTH version 1: malformed |
pub fn lossy_rc() -> Vec<u8> {
    use Direction::{Backward, Forward};
    let mut c = Capture::new();
    c.push(Forward, &request(Operation::SendFirst, 100, false), &[1; 1024]);
    c.push(Forward, &request(Operation::SendLast, 102, true), &[2; 500]);
    c.push(Backward, &acknowledge(101, Syndrome::Nak(NakCode::PsnSequenceError), 0), &[]);
    c.push(Forward, &request(Operation::SendMiddle, 101, false), &[1; 1024]);
    c.push(Forward, &request(Operation::SendLast, 102, true), &[2; 500]);
    c.push(Backward, &acknowledge(102, ACK, 1), &[]);

    let mut with_imm = request(Operation::SendOnlyImm, 103, true);
    with_imm.imm = Some(0xdead_beef);
    c.push(Forward, &with_imm, &[3; 1022]);
    c.push(Backward, &acknowledge(103, Syndrome::RnrNak { timer: 14 }, 1), &[]);
    c.push(Forward, &with_imm, &[3; 1022]);
    c.push(Backward, &acknowledge(103, ACK, 2), &[]);

    let mut write = request(Operation::WriteOnly, 104, true);
    write.reth = Some(RethRepr { va: 0x7000, rkey: 0x99, dma_len: 64 });
    let mut spoilt = c.packet(Forward, &write, &[4; 64]);
    *spoilt.last_mut().unwrap() ^= 0xff;
    c.push_bytes(&spoilt);
    c.push(Forward, &write, &[4; 64]);
    c.push(Backward, &acknowledge(104, ACK, 3), &[]);
    c.push(Forward, &write, &[4; 64]);
    c.push(Backward, &acknowledge(104, ACK, 3), &[]);

    let mut swap = request(Operation::CompareSwap, 105, true);
    swap.atomic_eth = Some(AtomicEthRepr { va: 0x8000, rkey: 0x42, swap_add: 7, compare: 5 });
    c.push(Forward, &swap, &[]);
    let mut atomic_ack = acknowledge(105, ACK, 4);
    atomic_ack.bth.opcode = Opcode::new(Transport::Rc, Operation::AtomicAcknowledge).unwrap();
    atomic_ack.atomic_ack_eth = Some(AtomicAckEthRepr { original: 5 });
    c.push(Backward, &atomic_ack, &[]);

    let send = request(Operation::SendOnly, 106, true);
    let mut dns = c.packet(Forward, &send, b"query");
    dns[22..24].copy_from_slice(&53u16.to_be_bytes());
    c.push_bytes(&dns);
    let mut bad_version = c.packet(Forward, &send, b"data");
    bad_version[20 + 8 + 1] |= 1;
    c.push_bytes(&bad_version);
    c.finish()
}

/// `count` UD datagrams in one direction.
pub fn many_ud_sends(count: u32) -> Vec<u8> {
    let mut c = Capture::new();
    for psn in 0..count {
        let mut roce = RoceRepr::new(bth(Transport::Ud, Operation::SendOnly, RESPONDER_QPN, psn, false));
        roce.deth = Some(DethRepr { qkey: 0x1111_1111, src_qpn: REQUESTER_QPN });
        c.push(Direction::Forward, &roce, &[0; 16]);
    }
    c.finish()
}

/// The records of a little-endian pcap file: (seconds, microseconds, data).
fn pcap_records(pcap: &[u8]) -> Vec<(u32, u32, &[u8])> {
    let u32_at = |at: usize| u32::from_le_bytes(pcap[at..at + 4].try_into().unwrap());
    let mut records = Vec::new();
    let mut at = 24;
    while at < pcap.len() {
        let captured = u32_at(at + 8) as usize;
        records.push((u32_at(at), u32_at(at + 4), &pcap[at + 16..at + 16 + captured]));
        at += 16 + captured;
    }
    records
}

/// An Ethernet pcap rewritten as pcapng with the Linux cooked (SLL) link
/// type, as `tcpdump -i any` records it. Timestamps are in nanoseconds, said
/// so with `if_tsresol` (pcap-file 2.0 reads every pcapng timestamp as
/// nanoseconds, ignoring the option and its microsecond default).
pub fn ethernet_pcap_to_cooked_pcapng(pcap: &[u8]) -> Vec<u8> {
    const LINKTYPE_LINUX_SLL: u16 = 113;
    fn block(out: &mut Vec<u8>, kind: u32, body: &[u8]) {
        let total = (12 + body.len().next_multiple_of(4)) as u32;
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&total.to_le_bytes());
        out.extend_from_slice(body);
        out.resize(out.len() + body.len().next_multiple_of(4) - body.len(), 0);
        out.extend_from_slice(&total.to_le_bytes());
    }
    let mut out = Vec::new();
    // Section header: byte-order magic, version 1.0, unknown section length.
    let mut section = Vec::new();
    section.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    section.extend_from_slice(&[1, 0, 0, 0]);
    section.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut out, 0x0a0d_0d0a, &section);
    // Interface 0: link type, reserved, snap length, then the options
    // if_tsresol = 10^-9 (code 9, length 1, padded) and end of options.
    let mut interface = LINKTYPE_LINUX_SLL.to_le_bytes().to_vec();
    interface.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    interface.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    block(&mut out, 1, &interface);
    for (seconds, micros, frame) in pcap_records(pcap) {
        // Cooked header: packet type, ARPHRD_ETHER, address length and
        // address (the Ethernet source), protocol (the EtherType).
        let mut data = vec![0, 0, 0, 1, 0, 6];
        data.extend_from_slice(&frame[6..12]);
        data.extend_from_slice(&[0, 0]);
        data.extend_from_slice(&frame[12..]);
        let timestamp = (u64::from(seconds) * 1_000_000 + u64::from(micros)) * 1000;
        let mut packet = 0u32.to_le_bytes().to_vec();
        packet.extend_from_slice(&((timestamp >> 32) as u32).to_le_bytes());
        packet.extend_from_slice(&(timestamp as u32).to_le_bytes());
        packet.extend_from_slice(&(data.len() as u32).to_le_bytes());
        packet.extend_from_slice(&(data.len() as u32).to_le_bytes());
        packet.extend_from_slice(&data);
        block(&mut out, 6, &packet);
    }
    out
}
