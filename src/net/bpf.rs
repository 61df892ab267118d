//! The classic-BPF programs that let a user's processes share one UDP port
//! (`net::share`): the reuseport group's steering program, which picks the
//! socket of the process that owns a datagram's destination QP, and the
//! socket filter that makes census probes countable.
//!
//! In a reuseport program offset 0 is the first byte of the UDP payload
//! (the BTH) and `len` the payload's length; in a socket filter offset 0 is
//! the UDP header. A reuseport program returns an index into the group; one
//! past its end makes the kernel fall back to its 4-tuple hash (it cannot
//! drop), so every rule ends in [`HASH`] where it does not know.

use std::collections::HashMap;

/// A returned index no group reaches: the kernel's hash decides.
pub const HASH: u32 = u32::MAX;
/// First word of a census probe: an opcode in the manufacturer-specific
/// range (no RoCE peer sends 0xFF) and "SRP".
pub const PROBE_MAGIC: u32 = 0xFF53_5250;
/// Bytes of a census probe: magic, nonce, position.
pub const PROBE_LEN: usize = 12;

/// CM attribute IDs (IBTA 12.6), in the MAD header at BTH + DETH + 16.
const CM_REQ: u32 = 0x0010;
const CM_SIDR_REQ: u32 = 0x0017;
const CM_SIDR_REP: u32 = 0x0018;
/// Offsets into the UDP payload of a GSI (QP1) MAD: its attribute ID, the
/// first word of the CM message (Local Comm ID, or SIDR's Request ID), the
/// second (Remote Comm ID) and the Service ID (eight bytes: zero, then the
/// rdma_cm port space and port).
const MAD_ATTR_ID: u32 = 12 + 8 + 16;
const CM_FIRST_ID: u32 = 12 + 8 + 24;
const CM_REMOTE_COMM_ID: u32 = CM_FIRST_ID + 4;
const CM_SERVICE_ID: u32 = CM_FIRST_ID + 8;

/// The rdma_cm service a REQ or SIDR_REQ to QP 1 asks for: the low word
/// of its Service ID, whose high word is zero for rdma_cm's IP services
/// (`None` for any other packet).
#[inline]
pub fn cm_request_service(roce: &[u8]) -> Option<u32> {
    let word = |at: u32| -> Option<u32> {
        let at = at as usize;
        Some(u32::from_be_bytes(roce.get(at..at + 4)?.try_into().ok()?))
    };
    if word(4)? & 0x00ff_ffff != 1 || !matches!(word(MAD_ATTR_ID)? >> 16, CM_REQ | CM_SIDR_REQ) {
        return None;
    }
    let (high, low) = (word(CM_SERVICE_ID)?, word(CM_SERVICE_ID + 4)?);
    (high == 0).then_some(low)
}

/// One classic-BPF instruction, as `struct sock_filter`.
pub type Insn = libc::sock_filter;

// Opcodes (linux/filter.h).
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_W_LEN: u16 = 0x80;
const ALU_AND_K: u16 = 0x54;
const ALU_RSH_K: u16 = 0x74;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;

/// A small assembler: conditional jumps name labels defined later (classic
/// BPF jumps only forward, within 255 instructions; `ja` anywhere ahead).
#[derive(Default)]
struct Asm {
    code: Vec<Insn>,
    labels: HashMap<&'static str, usize>,
    /// (instruction, label if true, label if false; None: the next one).
    jumps: Vec<(usize, Option<&'static str>, Option<&'static str>)>,
}

impl Asm {
    fn op(&mut self, code: u16, k: u32) -> &mut Asm {
        self.code.push(Insn { code, jt: 0, jf: 0, k });
        self
    }

    fn jump(&mut self, code: u16, k: u32, yes: Option<&'static str>, no: Option<&'static str>) -> &mut Asm {
        self.jumps.push((self.code.len(), yes, no));
        self.op(code, k)
    }

    fn label(&mut self, name: &'static str) -> &mut Asm {
        self.labels.insert(name, self.code.len());
        self
    }

    /// The program, or `None` if a conditional jump is out of reach.
    fn finish(mut self) -> Option<Vec<Insn>> {
        for &(at, yes, no) in &self.jumps {
            let offset = |label: Option<&'static str>| -> Option<u32> {
                let Some(label) = label else { return Some(0) };
                let target = *self.labels.get(label)?;
                u32::try_from(target.checked_sub(at + 1)?).ok()
            };
            let (jt, jf) = (offset(yes)?, offset(no)?);
            let insn = &mut self.code[at];
            if insn.code == JMP_JA {
                insn.k = jt;
            } else {
                (insn.jt, insn.jf) = (u8::try_from(jt).ok()?, u8::try_from(jf).ok()?);
            }
        }
        Some(self.code)
    }
}

/// What the steering program knows: where each live member's socket is in
/// the group, and which member listens on which rdma_cm service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Steering {
    /// `positions[i]`: the slot of the socket at position `i`, if known.
    pub positions: Vec<Option<u8>>,
    /// rdma_cm services (port space << 16 | port, the Service ID's low
    /// word) and the slot of the member that listens on each.
    pub listeners: Vec<(u32, u8)>,
}

impl Steering {
    fn position(&self, slot: u8) -> Option<u32> {
        self.positions.iter().position(|&s| s == Some(slot)).and_then(|p| u32::try_from(p).ok())
    }

    /// The slot that owns a datagram by the same rules as [`Steering::program`]
    /// (`None`: no rule says, as when the program falls back to the hash).
    pub fn owner(&self, roce: &[u8]) -> Option<u8> {
        let word = |at: u32| -> Option<u32> {
            let at = at as usize;
            Some(u32::from_be_bytes(roce.get(at..at + 4)?.try_into().ok()?))
        };
        let qpn = word(4)? & 0x00ff_ffff;
        if qpn != 1 {
            return Some((qpn >> 16) as u8).filter(|&slot| slot != 0);
        }
        if roce.len() < CM_SERVICE_ID as usize + 8 {
            return None;
        }
        match word(MAD_ATTR_ID)? >> 16 {
            CM_REQ | CM_SIDR_REQ => {
                let service = cm_request_service(roce)?;
                let here = |slot| self.position(slot).is_some();
                self.listeners.iter().find(|&&(s, slot)| s == service && here(slot)).map(|&(_, slot)| slot)
            }
            CM_SIDR_REP => Some(roce[CM_FIRST_ID as usize]),
            _ => Some(roce[CM_REMOTE_COMM_ID as usize]),
        }
    }

    /// The group's program: census probes carrying `probe_nonce` go to the
    /// position they name; a QP's packets to its owner's socket (the slot is
    /// the QPN's top byte); GSI MADs by the CM rules (a REQ or SIDR_REQ to
    /// the member listening on its service, a SIDR_REP by its Request ID's
    /// top byte, any other by its Remote Comm ID's); all else by the hash.
    /// `None` if the table is too large for one program.
    pub fn program(&self, probe_nonce: Option<u32>) -> Option<Vec<Insn>> {
        // Conditional jumps reach 255 ahead at most, so a failed check skips
        // to an `ja` to the end (past up to 255 slots and 255 listeners).
        let mut a = Asm::default();
        a.op(LD_W_LEN, 0).jump(JMP_JGE_K, 8, Some("bth"), None).jump(JMP_JA, 0, Some("hash"), None);
        a.label("bth");
        if let Some(nonce) = probe_nonce {
            a.op(LD_W_ABS, 0).jump(JMP_JEQ_K, PROBE_MAGIC, None, Some("qpn"));
            a.op(LD_W_ABS, 4).jump(JMP_JEQ_K, nonce, Some("probe"), None).jump(JMP_JA, 0, Some("hash"), None);
            a.label("probe").op(LD_W_ABS, 8).op(RET_A, 0);
        }
        a.label("qpn").op(LD_W_ABS, 4).op(ALU_AND_K, 0x00ff_ffff);
        a.jump(JMP_JEQ_K, 1, Some("gsi"), None);
        a.op(ALU_RSH_K, 16).jump(JMP_JA, 0, Some("slots"), None);
        a.label("gsi").op(LD_W_LEN, 0).jump(JMP_JGE_K, CM_SERVICE_ID + 8, Some("mad"), None);
        a.jump(JMP_JA, 0, Some("hash"), None);
        a.label("mad").op(LD_H_ABS, MAD_ATTR_ID);
        a.jump(JMP_JEQ_K, CM_REQ, Some("service"), None);
        a.jump(JMP_JEQ_K, CM_SIDR_REQ, Some("service"), None);
        a.jump(JMP_JEQ_K, CM_SIDR_REP, Some("request"), None);
        a.op(LD_B_ABS, CM_REMOTE_COMM_ID).jump(JMP_JA, 0, Some("slots"), None);
        a.label("request").op(LD_B_ABS, CM_FIRST_ID).jump(JMP_JA, 0, Some("slots"), None);
        a.label("service").op(LD_W_ABS, CM_SERVICE_ID).jump(JMP_JEQ_K, 0, Some("listeners"), None);
        a.jump(JMP_JA, 0, Some("hash"), None);
        a.label("listeners").op(LD_W_ABS, CM_SERVICE_ID + 4);
        for &(service, slot) in &self.listeners {
            if let Some(position) = self.position(slot) {
                a.op(JMP_JEQ_K, service).code.last_mut()?.jf = 1;
                a.op(RET_K, position);
            }
        }
        a.jump(JMP_JA, 0, Some("hash"), None);
        a.label("slots");
        for (position, slot) in self.positions.iter().enumerate() {
            if let Some(slot) = slot {
                a.op(JMP_JEQ_K, u32::from(*slot)).code.last_mut()?.jf = 1;
                a.op(RET_K, u32::try_from(position).ok()?);
            }
        }
        a.label("hash").op(RET_K, HASH);
        let program = a.finish()?;
        (program.len() <= MAX_INSNS).then_some(program)
    }
}

/// The kernel's limit on a classic program's length (BPF_MAXINSNS).
const MAX_INSNS: usize = 4096;

/// The socket filter every member's socket carries: it drops census probes
/// that come from the shared port itself (which only members can send
/// from), so each shows in the socket's drop counter, and keeps all else.
/// A probe is exactly [`PROBE_LEN`] bytes, which no RoCE packet is (a BTH
/// and an ICRC alone are 16), so every RoCE packet is kept after its length
/// is read: the loads of the port and the magic word call into the kernel
/// for each packet that gets that far.
pub fn probe_filter(port: u16) -> Vec<Insn> {
    let mut a = Asm::default();
    a.op(LD_W_LEN, 0).jump(JMP_JEQ_K, 8 + PROBE_LEN as u32, None, Some("keep"));
    a.op(LD_H_ABS, 0).jump(JMP_JEQ_K, u32::from(port), None, Some("keep"));
    a.op(LD_W_ABS, 8).jump(JMP_JEQ_K, PROBE_MAGIC, None, Some("keep"));
    a.op(RET_K, 0);
    a.label("keep").op(RET_K, u32::MAX);
    a.finish().expect("a fixed program within reach")
}

/// A census probe for `position`.
pub fn probe(nonce: u32, position: u32) -> [u8; PROBE_LEN] {
    let mut p = [0; PROBE_LEN];
    p[..4].copy_from_slice(&PROBE_MAGIC.to_be_bytes());
    p[4..8].copy_from_slice(&nonce.to_be_bytes());
    p[8..].copy_from_slice(&position.to_be_bytes());
    p
}

/// The nonce and position of a census probe, if the UDP payload `datagram`
/// is one: what `softroce dump` names instead of a malformed RoCE packet.
pub fn parse_probe(datagram: &[u8]) -> Option<(u32, u32)> {
    let probe: &[u8; PROBE_LEN] = datagram.try_into().ok()?;
    let word = |at: usize| u32::from_be_bytes([probe[at], probe[at + 1], probe[at + 2], probe[at + 3]]);
    (word(0) == PROBE_MAGIC).then(|| (word(4), word(8)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for the instructions above, over a packet.
    fn run(program: &[Insn], packet: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = program[pc];
            let load = |at: u32, n: usize| -> Option<u32> {
                let bytes = packet.get(at as usize..at as usize + n)?;
                Some(bytes.iter().fold(0, |v, &b| v << 8 | u32::from(b)))
            };
            let taken = |cond: bool| if cond { i.jt as usize } else { i.jf as usize };
            pc += 1;
            match i.code {
                LD_W_ABS | LD_H_ABS | LD_B_ABS => {
                    let n = match i.code {
                        LD_W_ABS => 4,
                        LD_H_ABS => 2,
                        _ => 1,
                    };
                    // An out-of-bounds load ends the program with 0, as the kernel's does.
                    let Some(v) = load(i.k, n) else { return 0 };
                    a = v;
                }
                LD_W_LEN => a = packet.len() as u32,
                ALU_AND_K => a &= i.k,
                ALU_RSH_K => a >>= i.k,
                JMP_JA => pc += i.k as usize,
                JMP_JEQ_K => pc += taken(a == i.k),
                JMP_JGE_K => pc += taken(a >= i.k),
                RET_K => return i.k,
                RET_A => return a,
                other => panic!("unknown opcode {other:#x}"),
            }
        }
    }

    fn packet(qpn: u32, len: usize) -> Vec<u8> {
        let mut p = vec![0; len];
        p[4..8].copy_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
        p
    }

    /// A GSI MAD with attribute `attr`, first CM word `first`, second
    /// `second`, and Service ID `service`.
    fn mad(attr: u16, first: u32, second: u32, service: u64) -> Vec<u8> {
        let mut p = packet(1, 256);
        p[MAD_ATTR_ID as usize..][..2].copy_from_slice(&attr.to_be_bytes());
        p[CM_FIRST_ID as usize..][..4].copy_from_slice(&first.to_be_bytes());
        p[CM_REMOTE_COMM_ID as usize..][..4].copy_from_slice(&second.to_be_bytes());
        p[CM_SERVICE_ID as usize..][..8].copy_from_slice(&service.to_be_bytes());
        p
    }

    fn table() -> Steering {
        Steering { positions: vec![Some(7), None, Some(3), Some(200)], listeners: vec![(0x0106_4e20, 3)] }
    }

    #[test]
    fn qps_go_to_the_position_of_their_owner_slot() {
        let t = table();
        let program = t.program(None).unwrap();
        for (qpn, position) in [(0x07_0011, 0), (0x03_ffff, 2), (0xc8_0000, 3), (0x05_0001, HASH), (0x11, HASH)] {
            assert_eq!(run(&program, &packet(qpn, 64)), position, "QPN {qpn:#x}");
            let owner = t.owner(&packet(qpn, 64));
            assert_eq!(owner.and_then(|s| t.position(s)).unwrap_or(HASH), position);
        }
        // Too short for a BTH: the hash.
        assert_eq!(run(&program, &[0; 7]), HASH);
    }

    #[test]
    fn cm_messages_go_to_their_listener_or_comm_id_owner() {
        let t = table();
        let program = t.program(None).unwrap();
        let cases = [
            (mad(0x0010, 0x0900_0001, 0, 0x0106_4e20), 2), // REQ to the listener (slot 3)
            (mad(0x0010, 0x0900_0001, 0, 0x0106_4e21), HASH), // REQ to nobody's service
            (mad(0x0017, 0x0900_0001, 0, 0x0106_4e20), 2), // SIDR_REQ
            (mad(0x0010, 0, 0, 0x1_0106_4e20), HASH),      // a Service ID that is not rdma_cm's
            (mad(0x0018, 0xc800_0004, 0, 0), 3),           // SIDR_REP by our Request ID
            (mad(0x0014, 0x1234_5678, 0x0700_0009, 0), 0), // RTU by our Comm ID
            (mad(0x0011, 0x1234_5678, 0x0500_0009, 0), HASH), // REP for a slot nobody holds
        ];
        for (i, (p, position)) in cases.iter().enumerate() {
            assert_eq!(run(&program, p), *position, "case {i}");
            assert_eq!(t.owner(p).and_then(|s| t.position(s)).unwrap_or(HASH), *position, "case {i}");
        }
        assert_eq!(run(&program, &packet(1, 40)), HASH, "a GSI packet too short for a CM header");
    }

    /// A wildcard listener has a member on each address: the group's own
    /// one takes the request, the others' are not in its positions.
    #[test]
    fn a_service_listened_on_several_addresses_goes_to_this_groups_member() {
        let mut t = table();
        t.listeners = vec![(0x0106_4e20, 99), (0x0106_4e20, 200)];
        let req = mad(0x0010, 0x0900_0001, 0, 0x0106_4e20);
        assert_eq!(run(&t.program(None).unwrap(), &req), 3, "slot 200, at position 3");
        assert_eq!(t.owner(&req), Some(200));
        assert_eq!(cm_request_service(&req), Some(0x0106_4e20));
        assert_eq!(cm_request_service(&mad(0x0014, 1, 2, 0x0106_4e20)), None, "an RTU asks for no service");
    }

    #[test]
    fn probes_go_where_they_say_only_with_the_nonce() {
        let t = table();
        let program = t.program(Some(0xabcd)).unwrap();
        assert_eq!(run(&program, &probe(0xabcd, 1)), 1);
        assert_eq!(run(&program, &probe(0xabce, 1)), HASH);
        assert_eq!(run(&program, &packet(0x07_0001, 64)), 0);
        assert_eq!(run(&t.program(None).unwrap(), &probe(0xabcd, 1)), HASH);
    }

    #[test]
    fn the_probe_filter_drops_probes_from_the_port_only() {
        let filter = probe_filter(4791);
        let udp = |src: u16, payload: &[u8]| [&src.to_be_bytes()[..], &[0x12, 0xb7, 0, 0, 0, 0], payload].concat();
        assert_eq!(run(&filter, &udp(4791, &probe(1, 0))), 0);
        assert_eq!(run(&filter, &udp(4792, &probe(1, 0))), u32::MAX);
        assert_eq!(run(&filter, &udp(4791, &packet(0x07_0001, 64))), u32::MAX);
        assert_eq!(run(&filter, &udp(4791, &[0xff])), u32::MAX);
        let longer = [&probe(1, 0)[..], &[0; 4]].concat();
        assert_eq!(run(&filter, &udp(4791, &longer)), u32::MAX, "a probe is exactly PROBE_LEN bytes");
    }

    #[test]
    fn a_probe_reads_back_and_nothing_else_reads_as_one() {
        assert_eq!(parse_probe(&probe(0xabcd, 7)), Some((0xabcd, 7)));
        assert_eq!(parse_probe(&probe(0xabcd, 7)[..PROBE_LEN - 1]), None, "too short");
        assert_eq!(parse_probe(&[&probe(1, 2)[..], &[0]].concat()), None, "too long");
        assert_eq!(parse_probe(&packet(0x07_0001, 64)[..PROBE_LEN]), None, "a RoCE packet's start");
    }

    #[test]
    fn a_full_table_fits_one_program() {
        let t = Steering {
            positions: (1..=255).map(Some).collect(),
            listeners: (0..255).map(|i| (0x0106_0000 + i, i as u8 + 1)).collect(),
        };
        let program = t.program(Some(1)).unwrap();
        assert!(program.len() <= MAX_INSNS);
        assert_eq!(run(&program, &packet(0xff_0001, 64)), 254);
        assert_eq!(run(&program, &mad(0x0010, 0, 0, 0x0106_00fe)), 254);
    }
}
