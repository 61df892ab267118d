//! Checks of the peer's responder: we play the requester, with packets
//! built by hand, against QPs of a perftest server.

use softroce::wire::build::{bth, Build};
use softroce::wire::{NakCode, Opcode, Operation, RoceRepr, Transport};

use super::probe::{Answer, Probe};
use super::session::{Program, Remote};
use super::{list, Step, Stop, Verdict};

/// One of the peer's QPs under test, and how to talk to it.
pub struct Target<'a> {
    pub probe: &'a mut Probe,
    pub r: Remote,
    /// Path MTU in bytes.
    pub mtu: usize,
}

/// A check of the responder.
pub struct Check {
    pub id: &'static str,
    /// The rxe-spec statements (and IBTA rules) it checks.
    pub spec: &'static str,
    pub title: &'static str,
    /// The server whose QPs it needs (their access rights differ).
    pub program: Program,
    /// It needs the QP whose first PSN is 3 short of the 2^24 wrap.
    pub wrap: bool,
    /// It puts the QP in error, which ends a SEND server's run (perftest
    /// exits on the flushed receives): such a check comes last in a session.
    pub fatal: bool,
    pub run: fn(&mut Target) -> Step,
}

pub fn ack(psn: u32, msn: u32) -> String {
    format!("ACK psn={psn} msn={msn}")
}

pub fn nak(code: NakCode, psn: u32) -> String {
    format!("NAK({}) psn={psn}", code.name())
}

pub fn rnr(timer: u8, psn: u32) -> String {
    format!("RNR-NAK({timer}) psn={psn}")
}

fn response(op: Operation, psn: u32, len: usize) -> String {
    format!("{} psn={psn} len={len}", op.name())
}

fn atomic_ack(psn: u32, orig: u64) -> String {
    format!("ATOMIC_ACK psn={psn} orig={orig:#x}")
}

/// `perftest`'s `MIN_RNR_TIMER`, which its QPs send in RNR NAKs.
const PERFTEST_RNR_TIMER: u8 = 12;
/// An R_Key nobody registered, for lengths that check none.
const BOGUS_RKEY: u32 = 0x0bad_cafe;

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

impl Target<'_> {
    /// The PSN `k` after the first one the peer expects.
    pub fn psn(&self, k: u32) -> u32 {
        self.r.psn.wrapping_add(k) & 0x00ff_ffff
    }

    pub fn req(&self, op: Operation, k: u32) -> RoceRepr {
        let opcode = Opcode::new(Transport::Rc, op).expect("an RC operation");
        RoceRepr::new(bth(opcode, self.r.qpn, self.psn(k)))
    }

    /// A WRITE_ONLY of `len` bytes to the peer's buffer, asking for an ACK.
    pub fn write(&self, k: u32, len: u32) -> RoceRepr {
        self.req(Operation::WriteOnly, k).reth(self.r.vaddr, self.r.rkey, len).ack_req()
    }

    fn read(&self, k: u32, offset: u64, len: u32) -> RoceRepr {
        self.req(Operation::ReadRequest, k).reth(self.r.vaddr + offset, self.r.rkey, len)
    }

    fn fetch_add(&self, k: u32, add: u64) -> RoceRepr {
        self.req(Operation::FetchAdd, k).atomic_eth(self.r.vaddr, self.r.rkey, add, 0)
    }

    pub fn send(&mut self, h: RoceRepr, payload: &[u8]) -> Step {
        Ok(self.probe.send(self.r.ours, &h, payload)?)
    }

    /// Waits until the peer has answered as many packets as `expected`
    /// lists (or stayed quiet for the probe's quiet time) and compares.
    /// What comes after is seen by the next step or the check's end.
    pub fn expect(&mut self, expected: &[String]) -> Step<Vec<Answer>> {
        let answers = self.probe.answers_upto(self.r.ours, expected.len())?;
        let seen: Vec<String> = answers.iter().map(Answer::describe).collect();
        if seen == expected {
            Ok(answers)
        } else {
            Err(Stop(Verdict::Deviation { expected: list(expected), seen: list(&seen) }))
        }
    }

    /// One atomic ACK for PSN `k`: its original value.
    fn atomic_value(&mut self, k: u32) -> Step<u64> {
        let psn = self.psn(k);
        let answers = self.probe.answers_upto(self.r.ours, 1)?;
        match answers.as_slice() {
            [a] if a.op() == Operation::AtomicAcknowledge && a.psn() == psn => {
                Ok(a.header.atomic_ack_eth.map_or(0, |e| e.original))
            }
            _ => Err(Stop(Verdict::Deviation {
                expected: format!("ATOMIC_ACK psn={psn} orig=(the word's value)"),
                seen: list(&answers.iter().map(Answer::describe).collect::<Vec<_>>()),
            })),
        }
    }

    /// Sends a WRITE at PSN `k` and expects its ACK as message `msn`: the
    /// QP still works and nothing before was executed.
    fn still_works(&mut self, k: u32, msn: u32) -> Step {
        self.send(self.write(k, 64), &data(64, 1))?;
        self.expect(&[ack(self.psn(k), msn)])?;
        Ok(())
    }
}

use NakCode::{InvalidRequest as INV, PsnSequenceError as SEQ, RemoteAccessError as ACC};
use Operation::*;

macro_rules! check {
    ($id:literal, $spec:literal, $program:ident, $title:literal, $run:expr) => {
        Check { id: $id, spec: $spec, title: $title, program: Program::$program, wrap: false, fatal: false, run: $run }
    };
    (fatal $id:literal, $spec:literal, $program:ident, $title:literal, $run:expr) => {
        Check { id: $id, spec: $spec, title: $title, program: Program::$program, wrap: false, fatal: true, run: $run }
    };
}

/// Every check of the responder, in the order they run.
pub const CHECKS: &[Check] = &[
    check!("resp.write.ack", "T-12", Write, "a WRITE_ONLY asking for an ACK gets one with its PSN and MSN 1", |t| {
        t.send(t.write(0, 64), &data(64, 0))?;
        t.expect(&[ack(t.psn(0), 1)])?;
        Ok(())
    }),
    check!(
        "resp.write.no-ackreq",
        "T-12",
        Write,
        "a WRITE without AckReq gets no ACK; the next one that asks acknowledges both",
        |t| {
            let h = t.write(0, 64);
            t.send(RoceRepr { bth: softroce::wire::BthRepr { ack_req: false, ..h.bth }, ..h }, &data(64, 0))?;
            t.expect(&[])?;
            t.send(t.write(1, 64), &data(64, 1))?;
            t.expect(&[ack(t.psn(1), 2)])?;
            Ok(())
        }
    ),
    check!(
        "resp.write.multi",
        "T-4 T-12",
        Write,
        "FIRST, MIDDLE and LAST of one WRITE draw one ACK, for the LAST",
        |t| {
            let (mtu, len) = (t.mtu, 2 * t.mtu + 100);
            t.send(t.req(WriteFirst, 0).reth(t.r.vaddr, t.r.rkey, len as u32), &data(mtu, 0))?;
            t.send(t.req(WriteMiddle, 1), &data(mtu, 1))?;
            t.send(t.req(WriteLast, 2).ack_req(), &data(100, 2))?;
            t.expect(&[ack(t.psn(2), 1)])?;
            Ok(())
        }
    ),
    check!(
        "resp.psn.gap",
        "T-11",
        Write,
        "a PSN gap draws one sequence NAK with the expected PSN, then silence until that PSN comes",
        |t| {
            t.send(t.write(2, 64), &data(64, 2))?;
            t.expect(&[nak(SEQ, t.psn(0))])?;
            t.send(t.write(3, 64), &data(64, 3))?;
            t.expect(&[])?;
            t.still_works(0, 1)
        }
    ),
    check!("resp.dup.write", "T-16", Write, "a duplicate WRITE is acknowledged again and not executed", |t| {
        t.send(t.write(0, 64), &data(64, 0))?;
        t.expect(&[ack(t.psn(0), 1)])?;
        t.send(t.write(0, 64), &data(64, 0))?;
        t.expect(&[ack(t.psn(0), 1)])?;
        t.still_works(1, 2)
    }),
    check!(
        "resp.psn.half-space",
        "S-11 W-12 T-16",
        Write,
        "a PSN 2^23 + 1 ahead reads as the past: a duplicate, re-ACKed",
        |t| {
            t.send(t.write(0, 64), &data(64, 0))?;
            t.expect(&[ack(t.psn(0), 1)])?;
            t.send(t.write(1 + 0x80_0001, 64), &data(64, 9))?;
            t.expect(&[ack(t.psn(0), 1)])?;
            t.still_works(1, 2)
        }
    ),
    Check {
        id: "resp.psn.wrap",
        spec: "T-5 W-12",
        title: "PSNs 2^24 - 3, - 2, - 1, 0, 1: every one acknowledged across the wrap",
        program: Program::Write,
        wrap: true,
        fatal: false,
        run: |t| {
            for k in 0..5 {
                t.send(t.write(k, 64), &data(64, k as u8))?;
                t.expect(&[ack(t.psn(k), k + 1)])?;
            }
            Ok(())
        },
    },
    check!(
        "resp.write.zero-length",
        "T-15 S-4",
        Write,
        "a zero-length WRITE checks no R_Key and is acknowledged",
        |t| {
            t.send(t.req(WriteOnly, 0).reth(0, BOGUS_RKEY, 0).ack_req(), &[])?;
            t.expect(&[ack(t.psn(0), 1)])?;
            Ok(())
        }
    ),
    check!("resp.write.bad-rkey", "T-15", Write, "a WRITE with an unknown R_Key: NAK remote access error", |t| {
        t.send(t.write(0, 64).reth(t.r.vaddr, t.r.rkey ^ 0xff, 64), &data(64, 0))?;
        t.expect(&[nak(ACC, t.psn(0))])?;
        Ok(())
    }),
    check!(
        "resp.err.silent",
        "T-15a T-27",
        Write,
        "after a fatal NAK the QP answers nothing, even a valid next request",
        |t| {
            t.send(t.write(0, 64).reth(t.r.vaddr, t.r.rkey ^ 0xff, 64), &data(64, 0))?;
            t.expect(&[nak(ACC, t.psn(0))])?;
            t.send(t.write(1, 64), &data(64, 1))?;
            t.send(t.write(0, 64), &data(64, 0))?;
            t.expect(&[])?;
            Ok(())
        }
    ),
    check!("resp.write.out-of-bounds", "T-15", Write, "a WRITE 1 TiB past the buffer: NAK remote access error", |t| {
        t.send(t.write(0, 64).reth(t.r.vaddr + (1 << 40), t.r.rkey, 64), &data(64, 0))?;
        t.expect(&[nak(ACC, t.psn(0))])?;
        Ok(())
    }),
    check!("resp.write.wraps-2^64", "T-15", Write, "a WRITE whose range wraps 2^64: NAK remote access error", |t| {
        t.send(t.write(0, 64).reth(u64::MAX - 31, t.r.rkey, 64), &data(64, 0))?;
        t.expect(&[nak(ACC, t.psn(0))])?;
        Ok(())
    }),
    check!(
        "resp.write.longer-than-reth",
        "T-14",
        Write,
        "a WRITE_ONLY carrying 64 bytes of a 32-byte RETH length: NAK invalid request",
        |t| {
            t.send(t.write(0, 32), &data(64, 0))?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!(
        "resp.write.shorter-than-reth",
        "T-14",
        Write,
        "a WRITE_ONLY carrying 32 bytes of a 64-byte RETH length: NAK invalid request",
        |t| {
            t.send(t.write(0, 64), &data(32, 0))?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!(
        "resp.write.pad-mismatch",
        "T-14 W-11",
        Write,
        "a pad count of 3 makes a 12-byte WRITE's payload 9, short of its RETH length 12: NAK invalid request",
        |t| {
            let mut roce = t.probe.emit(&t.write(0, 12), &data(12, 0))?;
            roce[1] = (roce[1] & !0x30) | (3 << 4);
            t.probe.send_bytes(t.r.ours, roce, true, "pad count 3")?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!("resp.seq.first-short", "T-14 S-8", Write, "a WRITE_FIRST shorter than the MTU: NAK invalid request", |t| {
        let len = 3 * t.mtu as u32;
        t.send(t.req(WriteFirst, 0).reth(t.r.vaddr, t.r.rkey, len).ack_req(), &data(100, 0))?;
        t.expect(&[nak(INV, t.psn(0))])?;
        Ok(())
    }),
    check!(
        "resp.seq.middle-short",
        "T-14",
        Write,
        "a WRITE_MIDDLE of half an MTU: NAK invalid request for its PSN",
        |t| {
            let (mtu, len) = (t.mtu, 3 * t.mtu as u32);
            t.send(t.req(WriteFirst, 0).reth(t.r.vaddr, t.r.rkey, len), &data(mtu, 0))?;
            t.send(t.req(WriteMiddle, 1), &data(mtu / 2, 1))?;
            t.expect(&[nak(INV, t.psn(1))])?;
            Ok(())
        }
    ),
    check!(
        "resp.seq.middle-without-first",
        "T-14 S-9",
        Write,
        "a WRITE_MIDDLE with no FIRST before it: NAK invalid request",
        |t| {
            let mtu = t.mtu;
            t.send(t.req(WriteMiddle, 0).ack_req(), &data(mtu, 0))?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!(
        "resp.seq.last-without-first",
        "T-14 S-9",
        Write,
        "a WRITE_LAST with no FIRST before it: NAK invalid request",
        |t| {
            t.send(t.req(WriteLast, 0).ack_req(), &data(64, 0))?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!(
        "resp.seq.first-in-first",
        "T-14 S-9",
        Write,
        "a WRITE_FIRST inside an unfinished WRITE: NAK invalid request for the second",
        |t| {
            let (mtu, len) = (t.mtu, 2 * t.mtu as u32);
            t.send(t.req(WriteFirst, 0).reth(t.r.vaddr, t.r.rkey, len), &data(mtu, 0))?;
            t.send(t.req(WriteFirst, 1).reth(t.r.vaddr, t.r.rkey, len), &data(mtu, 1))?;
            t.expect(&[nak(INV, t.psn(1))])?;
            Ok(())
        }
    ),
    check!(
        "resp.seq.ackreq-middle",
        "T-12",
        Write,
        "AckReq on a MIDDLE draws an ACK for it with the MSN unchanged; the LAST's ACK counts the message",
        |t| {
            let (mtu, len) = (t.mtu, 2 * t.mtu + 64);
            t.send(t.req(WriteFirst, 0).reth(t.r.vaddr, t.r.rkey, len as u32), &data(mtu, 0))?;
            t.send(t.req(WriteMiddle, 1).ack_req(), &data(mtu, 1))?;
            t.expect(&[ack(t.psn(1), 0)])?;
            t.send(t.req(WriteLast, 2).ack_req(), &data(64, 2))?;
            t.expect(&[ack(t.psn(2), 1)])?;
            Ok(())
        }
    ),
    check!(
        "resp.access.read-on-write-qp",
        "T-14",
        Write,
        "a READ at a QP without remote read access: NAK invalid request",
        |t| {
            t.send(t.read(0, 0, 64), &[])?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!(
        "resp.access.atomic-on-write-qp",
        "T-14",
        Write,
        "a FETCH_ADD at a QP without remote atomic access: NAK invalid request",
        |t| {
            t.send(t.fetch_add(0, 1), &[])?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!(
        "resp.rnr.send",
        "T-13",
        Write,
        "a SEND with no receive posted: RNR NAK with the QP's timer, again when resent, and the QP works on",
        |t| {
            t.send(t.req(SendOnly, 0).ack_req(), &data(64, 0))?;
            t.expect(&[rnr(PERFTEST_RNR_TIMER, t.psn(0))])?;
            t.send(t.req(SendOnly, 0).ack_req(), &data(64, 0))?;
            t.expect(&[rnr(PERFTEST_RNR_TIMER, t.psn(0))])?;
            t.still_works(0, 1)
        }
    ),
    check!("resp.rnr.write-imm", "T-13", Write, "a WRITE with immediate and no receive posted: RNR NAK", |t| {
        let h = t.req(WriteOnlyImm, 0).reth(t.r.vaddr, t.r.rkey, 64).imm(7).ack_req();
        t.send(h, &data(64, 0))?;
        t.expect(&[rnr(PERFTEST_RNR_TIMER, t.psn(0))])?;
        Ok(())
    }),
    check!(
        "resp.drop.bad-icrc",
        "W-14 S-7",
        Write,
        "a WRITE with a bad ICRC is dropped unexecuted; resent intact it is message 1",
        |t| {
            let mut roce = t.probe.emit(&t.write(0, 64), &data(64, 0))?;
            let last = roce.len() - 1;
            roce[last] ^= 0x5a;
            t.probe.send_bytes(t.r.ours, roce, false, "ICRC corrupted")?;
            t.expect(&[])?;
            t.still_works(0, 1)
        }
    ),
    check!(
        "resp.drop.wrong-source",
        "T-29 S-14",
        Write,
        "a WRITE from another address than the connected peer's is dropped",
        |t| {
            if !t.probe.has_alt() {
                return Err(Stop(Verdict::Skipped("needs a second local address (--alt-addr)".into())));
            }
            let h = t.write(0, 64);
            t.probe.send_from_alt(t.r.ours, &h, &data(64, 0))?;
            t.expect(&[])?;
            t.still_works(0, 1)
        }
    ),
    check!("resp.drop.unknown-qpn", "S-13", Write, "a WRITE to a QP number nobody has is dropped", |t| {
        t.send(t.write(0, 64).qpn(t.r.qpn ^ 0x40_0000), &data(64, 0))?;
        t.expect(&[])?;
        t.still_works(0, 1)
    }),
    check!(
        "resp.drop.bad-pkey",
        "S-10",
        Write,
        "a WRITE with P_Key 0x1234 (not the default partition) is dropped",
        |t| {
            let mut h = t.write(0, 64);
            h.bth.pkey = 0x1234;
            t.send(h, &data(64, 0))?;
            t.expect(&[])?;
            t.still_works(0, 1)
        }
    ),
    check!("resp.drop.bth-version", "W-2", Write, "a WRITE with BTH version 1 is dropped", |t| {
        let mut roce = t.probe.emit(&t.write(0, 64), &data(64, 0))?;
        roce[1] |= 1;
        t.probe.send_bytes(t.r.ours, roce, true, "TVer 1")?;
        t.expect(&[])?;
        t.still_works(0, 1)
    }),
    check!("resp.drop.truncated", "W-5 S-7", Write, "10 bytes, shorter than a BTH, are dropped", |t| {
        let roce = t.probe.emit(&t.write(0, 64), &data(64, 0))?;
        t.probe.send_bytes(t.r.ours, roce[..10].to_vec(), false, "truncated to 10 bytes")?;
        t.expect(&[])?;
        t.still_works(0, 1)
    }),
    check!("resp.drop.ud-opcode", "S-8 W-7", Write, "a UD SEND_ONLY (with DETH) at an RC QP is dropped", |t| {
        let opcode = Opcode::new(Transport::Ud, SendOnly).expect("UD SEND_ONLY");
        let h = RoceRepr::new(bth(opcode, t.r.qpn, t.psn(0))).deth(0x1111_1111, 0x123);
        t.send(h, &data(64, 0))?;
        t.expect(&[])?;
        t.still_works(0, 1)
    }),
    check!(
        "resp.fault.drop",
        "T-11 T-28",
        Write,
        "a stream with one PSN lost: one sequence NAK, silence, then the resent tail acknowledged",
        |t| {
            for k in 0..3 {
                t.send(t.write(k, 64), &data(64, k as u8))?;
                t.expect(&[ack(t.psn(k), k + 1)])?;
            }
            t.send(t.write(4, 64), &data(64, 4))?;
            t.expect(&[nak(SEQ, t.psn(3))])?;
            t.send(t.write(5, 64), &data(64, 5))?;
            t.expect(&[])?;
            for k in 3..6 {
                t.send(t.write(k, 64), &data(64, k as u8))?;
                t.expect(&[ack(t.psn(k), k + 1)])?;
            }
            Ok(())
        }
    ),
    check!(
        "resp.fault.duplicate",
        "T-16 T-28",
        Write,
        "a stream with one packet duplicated: the copy re-ACKed, executed once",
        |t| {
            for k in [0, 1, 1, 2] {
                let msn = k + 1;
                t.send(t.write(k, 64), &data(64, k as u8))?;
                t.expect(&[ack(t.psn(k), msn)])?;
            }
            Ok(())
        }
    ),
    check!(
        "resp.fault.reorder",
        "T-11 T-28",
        Write,
        "a stream with two packets swapped: a sequence NAK for the first, which is then taken",
        |t| {
            t.send(t.write(0, 64), &data(64, 0))?;
            t.expect(&[ack(t.psn(0), 1)])?;
            t.send(t.write(2, 64), &data(64, 2))?;
            t.expect(&[nak(SEQ, t.psn(1))])?;
            t.send(t.write(1, 64), &data(64, 1))?;
            t.expect(&[ack(t.psn(1), 2)])?;
            t.send(t.write(2, 64), &data(64, 2))?;
            t.expect(&[ack(t.psn(2), 3)])?;
            Ok(())
        }
    ),
    check!(
        "resp.fault.corrupt",
        "T-11 W-14",
        Write,
        "a stream with one packet corrupted: dropped, so the next draws a sequence NAK",
        |t| {
            t.send(t.write(0, 64), &data(64, 0))?;
            t.expect(&[ack(t.psn(0), 1)])?;
            let mut roce = t.probe.emit(&t.write(1, 64), &data(64, 1))?;
            roce[40] ^= 0x01;
            t.probe.send_bytes(t.r.ours, roce, false, "a payload bit flipped")?;
            t.send(t.write(2, 64), &data(64, 2))?;
            t.expect(&[nak(SEQ, t.psn(1))])?;
            for k in 1..3 {
                t.send(t.write(k, 64), &data(64, k as u8))?;
                t.expect(&[ack(t.psn(k), k + 1)])?;
            }
            Ok(())
        }
    ),
    check!("resp.read.only", "T-4 T-12", Read, "a READ of 64 bytes: one READ_RESPONSE_ONLY with its PSN", |t| {
        t.send(t.read(0, 0, 64), &[])?;
        t.expect(&[response(ReadResponseOnly, t.psn(0), 64)])?;
        Ok(())
    }),
    check!(
        "resp.read.multi",
        "T-4 T-5",
        Read,
        "a READ of 2 MTU + 100 bytes: FIRST, MIDDLE, LAST on consecutive PSNs; the next request takes the PSN after",
        |t| {
            let mtu = t.mtu;
            t.send(t.read(0, 0, 2 * mtu as u32 + 100), &[])?;
            t.expect(&[
                response(ReadResponseFirst, t.psn(0), mtu),
                response(ReadResponseMiddle, t.psn(1), mtu),
                response(ReadResponseLast, t.psn(2), 100),
            ])?;
            t.send(t.read(3, 0, 64), &[])?;
            t.expect(&[response(ReadResponseOnly, t.psn(3), 64)])?;
            Ok(())
        }
    ),
    check!("resp.dup.read", "T-16", Read, "a duplicate READ is answered again, with the same PSN and bytes", |t| {
        t.send(t.read(0, 0, 64), &[])?;
        let first = t.expect(&[response(ReadResponseOnly, t.psn(0), 64)])?;
        t.send(t.read(0, 0, 64), &[])?;
        let again = t.expect(&[response(ReadResponseOnly, t.psn(0), 64)])?;
        if first[0].payload != again[0].payload {
            return Err(Stop(Verdict::Deviation {
                expected: "the replayed bytes equal the first answer's".into(),
                seen: "different bytes".into(),
            }));
        }
        Ok(())
    }),
    check!(
        "resp.dup.read-tail",
        "T-16",
        Read,
        "a duplicate READ asking only the tail of a 3-packet READ gets the tail, starting with FIRST",
        |t| {
            let mtu = t.mtu;
            t.send(t.read(0, 0, 2 * mtu as u32 + 100), &[])?;
            t.expect(&[
                response(ReadResponseFirst, t.psn(0), mtu),
                response(ReadResponseMiddle, t.psn(1), mtu),
                response(ReadResponseLast, t.psn(2), 100),
            ])?;
            t.send(t.read(1, mtu as u64, mtu as u32 + 100), &[])?;
            t.expect(&[response(ReadResponseFirst, t.psn(1), mtu), response(ReadResponseLast, t.psn(2), 100)])?;
            Ok(())
        }
    ),
    check!(
        "resp.read.zero-length",
        "T-15 S-4",
        Read,
        "a zero-length READ checks no R_Key: an empty READ_RESPONSE_ONLY",
        |t| {
            t.send(t.req(ReadRequest, 0).reth(0, BOGUS_RKEY, 0), &[])?;
            t.expect(&[response(ReadResponseOnly, t.psn(0), 0)])?;
            Ok(())
        }
    ),
    check!("resp.read.bad-rkey", "T-15", Read, "a READ with an unknown R_Key: NAK remote access error", |t| {
        t.send(t.read(0, 0, 64).reth(t.r.vaddr, t.r.rkey ^ 0xff, 64), &[])?;
        t.expect(&[nak(ACC, t.psn(0))])?;
        Ok(())
    }),
    check!("resp.read.out-of-bounds", "T-15", Read, "a READ 1 TiB past the buffer: NAK remote access error", |t| {
        t.send(t.read(0, 1 << 40, 64), &[])?;
        t.expect(&[nak(ACC, t.psn(0))])?;
        Ok(())
    }),
    check!(
        "resp.access.write-on-read-qp",
        "T-14",
        Read,
        "a WRITE at a QP without remote write access: NAK invalid request",
        |t| {
            t.send(t.write(0, 64), &data(64, 0))?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!(
        "resp.atomic.fetch-add",
        "T-26",
        Atomic,
        "FETCH_ADD returns the word before the add, and the add is there for the next",
        |t| {
            t.send(t.fetch_add(0, 0), &[])?;
            let v = t.atomic_value(0)?;
            t.send(t.fetch_add(1, 5), &[])?;
            t.expect(&[atomic_ack(t.psn(1), v)])?;
            t.send(t.fetch_add(2, 0), &[])?;
            t.expect(&[atomic_ack(t.psn(2), v.wrapping_add(5))])?;
            Ok(())
        }
    ),
    check!(
        "resp.atomic.compare-swap",
        "T-26",
        Atomic,
        "COMPARE_SWAP swaps when the word matches, not when it does not, and returns the word either way",
        |t| {
            t.send(t.fetch_add(0, 0), &[])?;
            let v = t.atomic_value(0)?;
            let cas =
                |t: &Target, k, swap, compare| t.req(CompareSwap, k).atomic_eth(t.r.vaddr, t.r.rkey, swap, compare);
            t.send(cas(t, 1, v ^ 0xff, v), &[])?;
            t.expect(&[atomic_ack(t.psn(1), v)])?;
            t.send(cas(t, 2, 1, v), &[])?;
            t.expect(&[atomic_ack(t.psn(2), v ^ 0xff)])?;
            t.send(t.fetch_add(3, 0), &[])?;
            t.expect(&[atomic_ack(t.psn(3), v ^ 0xff)])?;
            Ok(())
        }
    ),
    check!(
        "resp.dup.atomic",
        "T-16",
        Atomic,
        "a duplicate FETCH_ADD is answered with the saved value and not executed again",
        |t| {
            t.send(t.fetch_add(0, 0), &[])?;
            let v = t.atomic_value(0)?;
            t.send(t.fetch_add(1, 1), &[])?;
            t.expect(&[atomic_ack(t.psn(1), v)])?;
            t.send(t.fetch_add(1, 1), &[])?;
            t.expect(&[atomic_ack(t.psn(1), v)])?;
            t.send(t.fetch_add(2, 0), &[])?;
            t.expect(&[atomic_ack(t.psn(2), v.wrapping_add(1))])?;
            Ok(())
        }
    ),
    check!(
        "resp.atomic.misaligned",
        "T-14 S-2",
        Atomic,
        "a FETCH_ADD at an address 4 bytes off alignment: NAK invalid request",
        |t| {
            t.send(t.fetch_add(0, 1).atomic_eth(t.r.vaddr + 4, t.r.rkey, 1, 0), &[])?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!("resp.atomic.bad-rkey", "T-15", Atomic, "a FETCH_ADD with an unknown R_Key: NAK remote access error", |t| {
        t.send(t.fetch_add(0, 1).atomic_eth(t.r.vaddr, t.r.rkey ^ 0xff, 1, 0), &[])?;
        t.expect(&[nak(ACC, t.psn(0))])?;
        Ok(())
    }),
    check!(
        "resp.access.read-on-atomic-qp",
        "T-14",
        Atomic,
        "a READ at a QP with only remote atomic access: NAK invalid request",
        |t| {
            t.send(t.read(0, 0, 8), &[])?;
            t.expect(&[nak(INV, t.psn(0))])?;
            Ok(())
        }
    ),
    check!("resp.send.only", "T-12", Send, "a SEND_ONLY into a posted receive: ACK, MSN 1", |t| {
        t.send(t.req(SendOnly, 0).ack_req(), &data(64, 0))?;
        t.expect(&[ack(t.psn(0), 1)])?;
        Ok(())
    }),
    check!(
        "resp.send.multi",
        "T-4 T-12",
        Send,
        "a SEND of 2 MTU + 100 bytes in three packets: one ACK, for the LAST",
        |t| {
            let mtu = t.mtu;
            t.send(t.req(SendFirst, 0), &data(mtu, 0))?;
            t.send(t.req(SendMiddle, 1), &data(mtu, 1))?;
            t.send(t.req(SendLast, 2).ack_req(), &data(100, 2))?;
            t.expect(&[ack(t.psn(2), 1)])?;
            Ok(())
        }
    ),
    check!("resp.dup.send", "T-16", Send, "a duplicate SEND is acknowledged again and takes no second receive", |t| {
        t.send(t.req(SendOnly, 0).ack_req(), &data(64, 0))?;
        t.expect(&[ack(t.psn(0), 1)])?;
        t.send(t.req(SendOnly, 0).ack_req(), &data(64, 0))?;
        t.expect(&[ack(t.psn(0), 1)])?;
        t.send(t.req(SendOnly, 1).ack_req(), &data(64, 1))?;
        t.expect(&[ack(t.psn(1), 2)])?;
        Ok(())
    }),
    check!("resp.send.zero-length", "T-31", Send, "a zero-length SEND is acknowledged", |t| {
        t.send(t.req(SendOnly, 0).ack_req(), &[])?;
        t.expect(&[ack(t.psn(0), 1)])?;
        Ok(())
    }),
    check!(fatal "resp.access.write-without-mr-right", "T-15", Send, "a WRITE the QP allows into a buffer registered without remote write: NAK remote access error", |t| {
        t.send(t.write(0, 64), &data(64, 0))?;
        t.expect(&[nak(ACC, t.psn(0))])?;
        Ok(())
    }),
    check!(fatal "resp.seq.send-in-send", "T-14 S-9", Send, "a SEND_ONLY inside an unfinished SEND: NAK invalid request for it", |t| {
        let mtu = t.mtu;
        t.send(t.req(SendFirst, 0), &data(mtu, 0))?;
        t.send(t.req(SendOnly, 1).ack_req(), &data(64, 1))?;
        t.expect(&[nak(INV, t.psn(1))])?;
        Ok(())
    }),
];

/// Puts a SEND server's QP in error (a MIDDLE with no FIRST at each PSN a
/// check may have left it expecting), which flushes its receives and ends
/// the program, as its run would never end otherwise.
pub fn retire(probe: &mut Probe, r: Remote) -> std::io::Result<()> {
    let t = Target { probe, r, mtu: 256 };
    for k in 0..16 {
        let h = t.req(SendMiddle, k);
        t.probe.send(r.ours, &h, &data(256, 0))?;
    }
    t.probe.answers(r.ours)?;
    t.probe.take_ladder(r.ours);
    Ok(())
}
