//! The hostile-peer suite (rxe-spec/security.md): what a peer on the
//! network, or an off-path attacker, can send softroce, and what softroce
//! does about it. No packet makes softroce touch memory outside a granted
//! region; nothing panics, hangs or grows without bound; packets injected
//! from off path are not accepted; QPs that should keep working keep working.
//!
//! Sans-IO tests drive one QP with packets built by hand with `RoceRepr`,
//! for exact control of every field, and check the exact answer (or
//! silence), the QP state, the completions and every byte of memory. Verbs
//! tests aim crafted datagrams at a real context over loopback UDP, where
//! the engine matters: unknown QPs, malformed datagrams, spoofed sources,
//! floods and teardown.
//!
//! One module per section of rxe-spec/security.md. What more than one of
//! them uses is here, imports included: each starts with `use super::*`.

#[path = "../support/mod.rs"]
mod support;

mod bounded;
mod engine;
mod memory;
mod off_path;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use softroce::transport::memory::offset_in;
use softroce::transport::*;
use softroce::verbs::{ConnectOptions, ContextOptions, MemoryRegion, QueuePair};
use softroce::wire::{
    AtomicAckEthRepr, NakCode, Opcode, Operation as Op, Psn, RethRepr, RoceRepr, Syndrome, Transport, ROCE_UDP_PORT,
};
use support::fake_peer::FakePeer;
use support::qp::*;
use support::verbs::{
    assert_holds_only, connect, contents, fill, free_port, next_async_event, next_wc, nodes, options, wait_for, Node,
    ALL_ACCESS, FILL, IP_A, QUIET, WAIT,
};
use support::{pattern, Rng};

/// Duplicates in a flood.
const FLOOD: usize = 10_000;

/// The PSN `n` after (or, negative, before) `psn`, modulo 2^24.
fn psn_plus(psn: u32, n: i64) -> u32 {
    Psn::new((i64::from(psn) + n).rem_euclid(1 << 24) as u32).value()
}

/// (queue, wr_id, status) of each completion.
fn statuses(wcs: &[(CqKind, WorkCompletion)]) -> Vec<(CqKind, u64, WcStatus)> {
    wcs.iter().map(|(cq, wc)| (*cq, wc.wr_id, wc.status)).collect()
}

/// Where the tests post receive buffers in the target's region.
const RECV_AT: u64 = 0x8000;

/// The target of the sans-IO attacks: an RC QP in RTS whose region holds a
/// pattern, not zeros, so that a write of zeros shows too.
fn target() -> TestQp {
    target_with(attr())
}

/// [`target`] with other attributes.
fn target_with(attr: QpAttr) -> TestQp {
    // Made once: a debug build takes a while over 256 KiB.
    static CONTENTS: OnceLock<Vec<u8>> = OnceLock::new();
    let mut t = TestQp::new(QpType::Rc, attr);
    t.fill(0, CONTENTS.get_or_init(|| pattern(REGION_LEN, 0x5a)));
    t
}

/// The UDP payload for opcode `byte`: a valid packet where the byte is an
/// opcode, else a BTH with it followed by zeros.
fn packet_with_opcode(byte: u8, dest_qpn: u32, psn: u32) -> Vec<u8> {
    match Opcode::from_u8(byte) {
        Ok(opcode) => {
            let len = match opcode.operation() {
                _ if !opcode.has_payload() => 0,
                Op::AtomicWrite => 8,
                _ => 16,
            };
            let header = complete(opcode, dest_qpn, psn, len as u32);
            let mut roce = vec![0u8; header.wire_len(len)];
            header.emit(&mut roce, &pattern(len, u32::from(byte))).unwrap();
            roce
        }
        Err(_) => {
            let mut roce = vec![0u8; 12 + 32 + 4];
            roce[0] = byte;
            roce[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
            roce[5..8].copy_from_slice(&dest_qpn.to_be_bytes()[1..]);
            roce[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
            roce
        }
    }
}

/// A context on [`IP_A`] with one RC QP connected to a fake peer, and a
/// region of every access filled with [`FILL`].
struct Victim {
    node: Node,
    peer: FakePeer,
    qp: QueuePair,
    mr: MemoryRegion,
    port: u16,
}

/// The fake peer of a [`Victim`], another loopback address.
const FAKE_PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
/// An off-path attacker's address.
const OFF_PATH: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 66));
/// The fake peer's QP number and first PSN.
const FAKE_QPN: u32 = 0x4242;
const FAKE_PSN: u32 = 0x77_0000;

impl Victim {
    fn new(name: &str) -> Victim {
        Victim::pinned(name, false)
    }

    /// A victim whose QP, if `pin_port`, also insists on the peer's UDP
    /// source port (`ConnectOptions::peer_port`).
    fn pinned(name: &str, pin_port: bool) -> Victim {
        let port = free_port(&[IP_A, FAKE_PEER, OFF_PATH]);
        let node = Node::open(name, IP_A, ContextOptions { port, busy_poll: false, ..ContextOptions::default() });
        let peer = FakePeer::bind(FAKE_PEER, port);
        let qp = node.qp(QpType::Rc);
        let peer_port = pin_port.then_some(port);
        qp.connect(&peer.endpoint(FAKE_QPN, FAKE_PSN), &ConnectOptions { peer_port, ..options(Mtu::Mtu1024) }).unwrap();
        let mr = node.mr(1 << 16);
        fill(&mr, FILL);
        Victim { node, peer, qp, mr, port }
    }

    /// The fake peer's QP number the victim's QP is connected to.
    fn peer_qpn(&self) -> u32 {
        self.qp.query().dest_qpn
    }

    /// Sends `header`, aimed at the victim's QP, from the fake peer.
    fn send(&self, header: RoceRepr, payload: &[u8]) {
        self.peer.send(IP_A, &header.qpn(self.qp.qpn()), payload);
    }

    /// A SEND at `psn` is ACKed: the QP works.
    fn assert_works(&self, psn: u32) {
        let mr = self.node.mr(4096);
        self.qp.post_recv(RecvWr { wr_id: 0x600d, sg_list: softroce::sg_list![mr.sge(0, 64)] }).unwrap();
        self.send(rc(Op::SendOnly, psn).ack_req(), &[7; 16]);
        // Late answers to earlier packets may come first.
        let deadline = Instant::now() + WAIT;
        let acked =
            std::iter::from_fn(|| self.peer.receive(deadline.saturating_duration_since(Instant::now()))).any(|a| {
                (a.op(), a.psn(), a.syndrome(), a.header.bth.dest_qpn) == (Op::Acknowledge, psn, ACK, self.peer_qpn())
            });
        assert!(acked, "no ACK for PSN {psn:#x}");
        // Receives posted before (or flushed by an earlier QP) come first.
        let wc = std::iter::repeat_with(|| next_wc(&self.node.cq))
            .find(|wc| wc.qp_num == self.qp.qpn() && wc.status == WcStatus::Success)
            .unwrap();
        assert_eq!((wc.opcode, wc.byte_len), (WcOpcode::Recv, 16));
    }
}
