//! Failures the fuzz targets' drivers found, replayed through the same
//! drivers: `fuzz/drivers/*.rs`, included in this crate with `#[path]`, run
//! a value of the target's input type and check every invariant the target
//! checks. Each test is a minimised input written out as the value
//! `cargo fuzz fmt` prints.

use crate::fuzz_responder as responder;
use crate::fuzz_stack as stack;

/// A request to the responder, in sequence and with ACK requested, that
/// names no memory and invalidates nothing.
fn request(opcode: u8, psn: responder::PsnChoice, target: responder::Target) -> responder::Step {
    use responder::*;
    Step::Request(Request {
        opcode: OpcodeChoice::Own(opcode),
        psn,
        ack_req: true,
        solicited: false,
        target,
        compare: 0,
        swap_add: 0,
        invalidate: Key::Raw(0),
        payload: PayloadLen::Fit,
        wrong_qkey: false,
        stranger: false,
    })
}

/// A UC SEND cut short by a lost packet keeps its receive for the next
/// message, as rxe does. A WRITE_WITH_IMMEDIATE arriving next must complete
/// that receive, the oldest, not the one after it: receives complete in the
/// order they were posted. (Fixed in `Qp::write`, src/transport/qp/responder.rs.)
#[test]
fn uc_write_with_immediate_takes_the_receive_a_dropped_send_kept() {
    use responder::*;
    let buffer = Target { key: Key::Granted, addr: Addr::FromStart(0), len: Len::Exact(4096) };
    let nothing = Target { key: Key::Granted, addr: Addr::FromStart(0), len: Len::Short(0) };
    run(&Input {
        service: Service::Uc,
        mtu: 0,
        max_dest_rd_atomic: 0,
        rights: Rights::All,
        steps: vec![
            Step::PostRecv(vec![buffer]),
            Step::PostRecv(vec![buffer]),
            // SEND_FIRST, then a gap: the message is dropped.
            request(0x00, PsnChoice::Next, nothing),
            // RDMA_WRITE_ONLY_WITH_IMMEDIATE of no bytes starts the next one.
            request(0x0b, PsnChoice::Ahead(3), nothing),
        ],
    });
}

/// One SEND that completes: the responder's receive completion counts among
/// those of the requests that succeeded (the driver once expected only those
/// after them).
#[test]
fn stack_single_send() {
    use stack::*;
    run(&Input {
        seed: 17016267269420663882,
        faults: FaultRates {
            drop: 236,
            duplicate: 236,
            reorder: 236,
            corrupt: 236,
            reorder_delay: 236,
            latency: 236,
            jitter: 236,
        },
        mtu: 236,
        psns: [StartPsn::NearWrap(236), StartPsn::NearWrap(236)],
        timeout: 236,
        retry_cnt: 236,
        rd_atomic: 236,
        ops: vec![OpInput {
            from_b: false,
            kind: Kind::Send,
            size: Size::Mtus { mtus: 0, delta: 0 },
            pieces: 0,
            operand: 0,
            matching: false,
        }],
    });
}
