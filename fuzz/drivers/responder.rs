//! The `responder` fuzz target: one QP in RTS (RC, or UC or UD as the input
//! picks) over three memory regions, fed hand-built requests and exact
//! copies of them (retries), interleaved with receives, deregistrations, timer
//! advances and transmit polls. After every step:
//!
//! - memory changed only where a request of the peer or a posted receive
//!   allowed it: every write, atomic and invalidation goes through [`Audited`],
//!   which checks it against what the peer asked for, and the regions that may
//!   never change (read-only, another PD's, and the canary regions around
//!   them all) are compared byte for byte;
//! - RC executes a request at most once, however often it is retried: no
//!   PSN changes memory or consumes a receive twice;
//! - every packet the QP sends parses and is an RC response to the peer (UC
//!   and UD never answer), a full drain yields at most the responses the
//!   queue can hold, and in ERR the QP sends what it owed the requests
//!   before the error (a sequence NAK included), then the fatal NAK that put
//!   it there, then nothing;
//! - the QP is in RTS, or ERR (RC only) with every receive flushed, and
//!   receives complete once each, in the order they were posted.
//!
//! Shared by `fuzz/fuzz_targets/responder.rs` and the tests in
//! `tests/transport` (through `#[path]`). The input types derive `Arbitrary` only when built by
//! cargo-fuzz (`cfg(fuzzing)`), so the tests need no `arbitrary`.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

#[cfg(fuzzing)]
use arbitrary::Arbitrary;
use softroce::transport::{
    grh_area, Access, AsyncEvent, AtomicOp, CqKind, Incoming, KeyUser, MemError, Memory, MemoryTable, Mtu, MwBind, Qp,
    QpAttr, QpCap, QpState, QpType, RecvWr, Region, Sge, TransmitOrder, WcOpcode, WcStatus, TRANSMIT_HEADROOM,
};
use softroce::wire::opcode::{Position, OPERATIONS};
use softroce::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, Headers, NakCode, Opcode, Operation, Psn,
    RethRepr, RoceRepr, Syndrome, Transport, ROCE_UDP_PORT,
};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
/// Any other address: RC and UC drop its packets, UD takes them.
const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
const QPN: u32 = 0x11;
const PEER_QPN: u32 = 0x22;
const QKEY: u32 = 0x1111_1111;
/// The first PSN the QP expects: close to the wrap, so requests cross it.
const RQ_PSN: u32 = 0xff_fff0;
const SQ_PSN: u32 = 1000;
/// Path MTUs by input index: an empty input gets 1024.
const MTUS: [Mtu; 5] = [Mtu::Mtu1024, Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu2048, Mtu::Mtu4096];
/// Resources for READ/atomic replays (`max_dest_rd_atomic`) are the input's
/// choice modulo this.
const RD_ATOMIC_CHOICES: u8 = 9;

const PD: u32 = 1;
const OTHER_PD: u32 = 2;
/// The canaries' PD: no request can name it.
const CANARY_PD: u32 = 3;
const REMOTE_ALL: Access = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);
const ALL: Access = Access::LOCAL_WRITE.union(REMOTE_ALL);
const CANARY_LEN: u64 = 64;

/// A registered region: key (lkey = rkey), PD, address, length, rights.
#[derive(Debug, Clone, Copy)]
struct Layout {
    key: u32,
    pd: u32,
    addr: u64,
    len: u64,
    access: Access,
}

impl Layout {
    const fn end(&self) -> u64 {
        self.addr + self.len
    }

    /// The canary right after this region.
    const fn canary_after(&self, key: u32) -> Layout {
        Layout { key, pd: CANARY_PD, addr: self.end(), len: CANARY_LEN, access: ALL }
    }

    /// The address right after the canary after this region.
    const fn next(&self) -> u64 {
        self.end() + CANARY_LEN
    }
}

/// Every right, the QP's PD: the target of WRITEs, READs, atomics and receives.
const GRANTED: Layout = Layout { key: 0x100, pd: PD, addr: 0x1_0000, len: 12 * 1024 + 40, access: ALL };
/// Peers may read it, nobody may write it (not even receives).
const READ_ONLY: Layout =
    Layout { key: 0x200, pd: PD, addr: GRANTED.next(), len: 4096 + 8, access: Access::REMOTE_READ };
/// Every right, but in another PD: nothing the QP does may touch it.
const FOREIGN: Layout = Layout { key: 0x300, pd: OTHER_PD, addr: READ_ONLY.next(), len: 4096, access: ALL };
/// Regions right before and after each of the others.
const CANARIES: [Layout; 4] = [
    Layout { key: 0xc0, pd: CANARY_PD, addr: GRANTED.addr - CANARY_LEN, len: CANARY_LEN, access: ALL },
    GRANTED.canary_after(0xc1),
    READ_ONLY.canary_after(0xc2),
    FOREIGN.canary_after(0xc3),
];

/// A whole run: the QP's configuration and what happens to it.
#[derive(Debug, Clone)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub struct Input {
    pub service: Service,
    /// Index into the path MTUs (modulo their number).
    pub mtu: u8,
    /// `max_dest_rd_atomic`, modulo 9.
    pub max_dest_rd_atomic: u8,
    pub rights: Rights,
    pub steps: Vec<Step>,
}

/// The remote operations the QP executes (`qp_access_flags`).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum Rights {
    /// REMOTE_WRITE, REMOTE_READ and REMOTE_ATOMIC.
    All,
    /// All but those among these `Access` bits.
    Without(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum Service {
    Rc,
    Uc,
    Ud,
}

#[derive(Debug, Clone)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum Step {
    Request(Request),
    /// The request this many before the last one (modulo how many were
    /// sent), again, byte for byte: a retry, or a copy the network made.
    Resend(u8),
    /// A receive with these scatter/gather elements.
    PostRecv(Vec<Target>),
    /// `ibv_dereg_mr` of the region with this key.
    Deregister(Key),
    /// Time passes, in microseconds, and the QP's timers run.
    Advance(u16),
    /// Sends everything the QP has to send.
    TransmitAll,
    /// Sends at most this many packets.
    Transmit(u8),
}

/// A packet from the peer.
#[derive(Debug, Clone)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub struct Request {
    pub opcode: OpcodeChoice,
    pub psn: PsnChoice,
    pub ack_req: bool,
    pub solicited: bool,
    /// The RETH or AtomicETH: key, address and length.
    pub target: Target,
    /// AtomicETH compare and swap/add values.
    pub compare: u64,
    pub swap_add: u64,
    /// The IETH's R_Key.
    pub invalidate: Key,
    pub payload: PayloadLen,
    /// A DETH with the wrong Q_Key.
    pub wrong_qkey: bool,
    /// Sent from an address that is not the peer's.
    pub stranger: bool,
}

#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum OpcodeChoice {
    /// The QP's transport with the operation of this index (modulo 25), which
    /// that transport may not define.
    Own(u8),
    /// Any byte, most of which are no opcode at all.
    Any(u8),
}

#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum PsnChoice {
    /// The PSN after the last in-sequence request sent.
    Next,
    /// That many PSNs after `Next`, plus one.
    Ahead(u8),
    /// That many PSNs before `Next`, plus one: a duplicate.
    Behind(u8),
    Raw(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum Key {
    Granted,
    ReadOnly,
    Foreign,
    Raw(u32),
}

/// A range of memory named by a key: a RETH, an AtomicETH or an SGE.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub struct Target {
    pub key: Key,
    pub addr: Addr,
    pub len: Len,
}

/// An address relative to the key's region (the granted one for other keys).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum Addr {
    /// This many 8-byte words into the region, modulo its length.
    Inside(u16),
    FromStart(i16),
    FromEnd(i16),
    Raw(u64),
}

#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum Len {
    Short(u8),
    Exact(u16),
    /// Up to the end of the region, plus this (wrapping at 2^32).
    ToEnd(i8),
    Raw(u32),
}

#[derive(Debug, Clone, Copy)]
#[cfg_attr(fuzzing, derive(Arbitrary))]
pub enum PayloadLen {
    /// What the opcode calls for: an MTU for FIRST and MIDDLE; for LAST and
    /// ONLY, what is left of the WRITE being sent (at most an MTU), or half
    /// an MTU for a SEND.
    Fit,
    /// The path MTU plus this.
    Mtu(i8),
    Exact(u16),
}

/// Runs `input`, checking the invariants after every step.
pub fn run(input: &Input) {
    let mut fuzz = Responder::new(input);
    for step in &input.steps {
        fuzz.step(step);
        fuzz.check();
    }
    fuzz.transmit(usize::MAX);
    fuzz.check();
}

/// `[start, end)` of the region named `key`, as a request of the peer granted it.
#[derive(Debug, Clone, Copy)]
struct Window {
    key: u32,
    start: u64,
    end: u64,
}

impl Window {
    fn new(key: u32, start: u64, len: u64) -> Window {
        Window { key, start, end: start.saturating_add(len) }
    }

    fn holds(&self, key: u32, addr: u64, len: usize) -> bool {
        key == self.key && addr >= self.start && addr.checked_add(len as u64).is_some_and(|end| end <= self.end)
    }
}

/// The packet being handled.
#[derive(Debug)]
struct Current {
    src: IpAddr,
    header: RoceRepr,
    payload: Vec<u8>,
}

/// What the peer's requests and the posted receives allow, and what was done.
#[derive(Debug, Default)]
struct Grants {
    writes: Vec<Window>,
    reads: Vec<Window>,
    receives: Vec<Window>,
    current: Option<Current>,
    /// Bytes written to receive buffers while handling `current`, in order.
    placed: Vec<u8>,
    /// `current` changed memory.
    changed: bool,
    invalidated: Vec<u32>,
}

/// The QP's memory, with every access checked against the grants.
struct Audited<'a> {
    table: &'a mut MemoryTable,
    grants: &'a mut Grants,
}

impl Audited<'_> {
    fn current(&self) -> &Current {
        self.grants.current.as_ref().expect("memory changes only while a packet is handled")
    }
}

impl Memory for Audited<'_> {
    fn check(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.table.check(key, user, addr, len, access)
    }

    fn resolve(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<u32, MemError> {
        self.table.resolve(key, user, addr, len, access)
    }

    fn read(&self, key: u32, user: KeyUser, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        self.table.read(key, user, addr, out, access)?;
        assert_eq!(access, Access::REMOTE_READ, "a QP that posts no sends reads only for READ responses");
        let len = out.len();
        assert!(
            self.grants.reads.iter().any(|w| w.holds(key, addr, len)),
            "read {len} bytes at {addr:#x} of {key:#x}, outside every READ request"
        );
        Ok(())
    }

    fn write(&mut self, key: u32, user: KeyUser, addr: u64, data: &[u8], access: Access) -> Result<(), MemError> {
        self.table.write(key, user, addr, data, access)?;
        let len = data.len();
        if access == Access::REMOTE_WRITE {
            assert!(
                self.grants.writes.iter().any(|w| w.holds(key, addr, len)),
                "wrote {len} bytes at {addr:#x} of {key:#x}, outside every WRITE request"
            );
            assert!(data == self.current().payload, "a WRITE places its packet's payload, whole");
            self.grants.changed = true;
        } else {
            assert_eq!(access, Access::LOCAL_WRITE, "write with {access:?}");
            assert!(
                self.grants.receives.iter().any(|w| w.holds(key, addr, len)),
                "placed {len} bytes at {addr:#x} of {key:#x}, outside every posted receive"
            );
            self.grants.placed.extend_from_slice(data);
            self.grants.changed = true;
        }
        Ok(())
    }

    fn atomic(&mut self, key: u32, user: KeyUser, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        let original = self.table.atomic(key, user, addr, op)?;
        let current = self.current();
        let header = &current.header;
        let (rkey, va, asked) = match header.bth.opcode.operation() {
            Operation::AtomicWrite => {
                let reth = header.reth.expect("an ATOMIC WRITE has a RETH");
                let value = u64::from_ne_bytes(current.payload[..].try_into().expect("8 bytes stored"));
                (reth.rkey, reth.va, AtomicOp::Store { value })
            }
            operation => {
                let eth = header.atomic_eth.expect("an atomic runs only for an atomic request");
                let asked = match operation {
                    Operation::CompareSwap => AtomicOp::CompareSwap { compare: eth.compare, swap: eth.swap_add },
                    _ => AtomicOp::FetchAdd { add: eth.swap_add },
                };
                (eth.rkey, eth.va, asked)
            }
        };
        assert_eq!((key, addr, op), (rkey, va, asked), "the atomic the request asked for");
        self.grants.changed = true;
        Ok(original)
    }

    fn invalidate(&mut self, rkey: u32, user: KeyUser) -> Result<(), MemError> {
        self.table.invalidate(rkey, user)?;
        assert_eq!(self.current().header.ieth, Some(rkey), "invalidated a key no IETH named");
        self.grants.invalidated.push(rkey);
        self.grants.changed = true;
        Ok(())
    }

    fn bind_window(&mut self, _: KeyUser, _: &MwBind) -> Result<(), MemError> {
        panic!("a QP that posts no sends binds no window")
    }

    fn flush(&mut self, key: u32, user: KeyUser, range: Option<(u64, u64)>, access: Access) -> Result<(), MemError> {
        assert_eq!(self.current().header.bth.opcode.operation(), Operation::Flush, "a flush no FLUSH asked for");
        self.table.flush(key, user, range, access)
    }
}

struct Responder {
    service: Service,
    qp: Qp,
    mem: MemoryTable,
    grants: Grants,
    /// Contents of the regions that must never change.
    frozen: Vec<(u32, Vec<u8>)>,
    now: Duration,
    buf: Vec<u8>,
    mtu: u64,
    /// The most packets the QP may have queued: every response its queue
    /// holds (`max_dest_rd_atomic + 4`) a READ of the largest region.
    max_queued: usize,
    /// The PSN of the next in-sequence request.
    next_psn: Psn,
    /// Bytes of the current WRITE not sent yet.
    write_left: u64,
    /// Every receive posted, by wr_id.
    posted: Vec<RecvWr>,
    /// Receives completed so far: the first `completed` of `posted`.
    completed: usize,
    deregistered: Vec<u32>,
    /// RC: PSNs of the requests that changed memory or consumed a receive.
    executed: HashSet<Psn>,
    /// Every request delivered, with where it came from.
    history: Vec<(IpAddr, Vec<u8>)>,
    nak_sent_in_err: bool,
    events: usize,
}

impl Responder {
    fn new(input: &Input) -> Responder {
        let mtu = MTUS[usize::from(input.mtu) % MTUS.len()];
        let qp_type = match input.service {
            Service::Rc => QpType::Rc,
            Service::Uc => QpType::Uc,
            Service::Ud => QpType::Ud,
        };
        let max_dest_rd_atomic = input.max_dest_rd_atomic % RD_ATOMIC_CHOICES;
        let access_flags = match input.rights {
            Rights::All => REMOTE_ALL,
            Rights::Without(bits) => Access::from_bits(REMOTE_ALL.bits() & !u32::from(bits)).expect("known bits"),
        };
        let attr = QpAttr {
            access_flags,
            qkey: QKEY,
            dest: Some(PEER),
            dest_qpn: PEER_QPN,
            path_mtu: mtu,
            rq_psn: Psn::new(RQ_PSN),
            sq_psn: Psn::new(SQ_PSN),
            max_dest_rd_atomic,
            ..QpAttr::default()
        };
        let mut qp = Qp::new(QPN, qp_type, PD, QpCap::default(), None);
        qp.set_ud_mtu(mtu);
        qp.connect(&attr).expect("RESET to RTS");

        let mut mem = MemoryTable::new();
        let mut frozen = Vec::new();
        for layout in [GRANTED, READ_ONLY, FOREIGN].iter().chain(&CANARIES) {
            let data: Vec<u8> =
                (0..layout.len).map(|i| (i as u32 ^ layout.key).wrapping_mul(0x9e37_79b9) as u8).collect();
            if layout.key != GRANTED.key {
                frozen.push((layout.key, data.clone()));
            }
            let region = Region { pd: layout.pd, addr: layout.addr, access: layout.access, data };
            mem.register(layout.key, region);
        }
        let mtu = mtu.bytes() as u64;
        let max_queued = (usize::from(max_dest_rd_atomic) + 4) * GRANTED.len.div_ceil(mtu) as usize;
        Responder {
            service: input.service,
            qp,
            mem,
            grants: Grants::default(),
            frozen,
            now: Duration::from_secs(1),
            buf: vec![0; Mtu::Mtu4096.bytes() + TRANSMIT_HEADROOM],
            mtu,
            max_queued,
            next_psn: Psn::new(RQ_PSN),
            write_left: 0,
            posted: Vec::new(),
            completed: 0,
            deregistered: Vec::new(),
            executed: HashSet::new(),
            history: Vec::new(),
            nak_sent_in_err: false,
            events: 0,
        }
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Request(request) => {
                let src = if request.stranger { STRANGER } else { PEER };
                let bytes = self.encode(request);
                self.deliver(src, &bytes);
                self.history.push((src, bytes));
            }
            Step::Resend(back) => {
                if !self.history.is_empty() {
                    let i = self.history.len() - 1 - usize::from(*back) % self.history.len();
                    let (src, bytes) = self.history[i].clone();
                    self.deliver(src, &bytes);
                }
            }
            Step::PostRecv(sges) => self.post_recv(sges),
            Step::Deregister(key) => {
                let key = key_of(*key);
                if self.mem.deregister(key).is_some() {
                    self.deregistered.push(key);
                }
            }
            Step::Advance(micros) => {
                self.now += Duration::from_micros(u64::from(*micros));
                self.qp.handle_timeout(self.now);
            }
            Step::TransmitAll => self.transmit(usize::MAX),
            Step::Transmit(n) => self.transmit(usize::from(*n)),
        }
    }

    fn post_recv(&mut self, targets: &[Target]) {
        let sg_list: Vec<Sge> = targets
            .iter()
            .map(|t| {
                let (lkey, addr, length) = resolve(t);
                Sge { addr, length, lkey }
            })
            .collect();
        let wr = RecvWr { wr_id: self.posted.len() as u64, sg_list: sg_list.into() };
        if self.qp.post_recv(wr.clone()).is_ok() {
            let windows = wr.sg_list.iter().map(|s| Window::new(s.lkey, s.addr, s.length.into()));
            self.grants.receives.extend(windows);
            self.posted.push(wr);
        }
    }

    /// Hands a request's bytes to the QP if they parse, as the engine does.
    fn deliver(&mut self, src: IpAddr, bytes: &[u8]) {
        let Ok(packet) = RoceRepr::parse(bytes) else { return };
        self.grants.current = Some(Current { src, header: packet.header, payload: packet.payload.to_vec() });
        let incoming =
            Incoming { src, src_port: ROCE_UDP_PORT, dst: LOCAL, header: &packet.header, payload: packet.payload };
        let mut mem = Audited { table: &mut self.mem, grants: &mut self.grants };
        self.qp.handle_packet(self.now, incoming, &mut mem, None);
        let current = self.grants.current.take().expect("set above");
        let placed = std::mem::take(&mut self.grants.placed);
        if !placed.is_empty() {
            let mut message = Vec::new();
            if self.service == Service::Ud {
                let roce_len = current.header.wire_len(current.payload.len());
                message.extend_from_slice(&grh_area(current.src, LOCAL, roce_len));
            }
            message.extend_from_slice(&current.payload);
            assert!(message.starts_with(&placed), "receive buffers got bytes that are not the message's, in order");
        }
        let changed = std::mem::take(&mut self.grants.changed);
        let consumed = self.collect_completions();
        if self.service == Service::Rc && (changed || consumed) {
            let psn = current.header.bth.psn;
            assert!(self.executed.insert(psn), "the request at PSN {psn:?} was executed twice");
        }
    }

    fn encode(&mut self, request: &Request) -> Vec<u8> {
        let transport = match self.service {
            Service::Rc => Transport::Rc,
            Service::Uc => Transport::Uc,
            Service::Ud => Transport::Ud,
        };
        let byte = match request.opcode {
            OpcodeChoice::Own(i) => transport.prefix() | OPERATIONS[usize::from(i) % OPERATIONS.len()] as u8,
            OpcodeChoice::Any(byte) => byte,
        };
        let Ok(opcode) = Opcode::from_u8(byte) else {
            // No transport defines it: a BTH and an ICRC that do not parse.
            let mut bytes = vec![0; 16];
            bytes[0] = byte;
            return bytes;
        };
        let psn = match request.psn {
            PsnChoice::Next => self.next_psn,
            PsnChoice::Ahead(n) => self.next_psn.wrapping_add(1 + u32::from(n)),
            PsnChoice::Behind(n) => self.next_psn.wrapping_sub(1 + u32::from(n)),
            PsnChoice::Raw(psn) => Psn::new(psn),
        };
        let (key, va, len) = resolve(&request.target);
        let op = opcode.operation();
        let headers = opcode.headers();
        let mut repr = RoceRepr::new(BthRepr {
            opcode,
            solicited: request.solicited,
            mig_req: false,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: QPN,
            ack_req: request.ack_req,
            psn,
        });
        if headers.contains(Headers::DETH) {
            let qkey = if request.wrong_qkey { !QKEY } else { QKEY };
            repr.deth = Some(DethRepr { qkey, src_qpn: PEER_QPN });
        }
        if headers.contains(Headers::FETH) {
            repr.feth = Some(FethRepr { selectivity: 1, placement_type: 1 });
        }
        if headers.contains(Headers::RETH) {
            repr.reth = Some(RethRepr { va, rkey: key, dma_len: len });
            let window = Window::new(key, va, len.into());
            match op {
                Operation::ReadRequest => self.grants.reads.push(window),
                Operation::WriteFirst | Operation::WriteOnly | Operation::WriteOnlyImm => {
                    self.grants.writes.push(window);
                    self.write_left = len.into();
                }
                _ => {}
            }
        }
        if headers.contains(Headers::AETH) {
            repr.aeth = Some(AethRepr { syndrome: Syndrome::Ack { credits: Syndrome::INVALID_CREDITS }, msn: 0 });
        }
        if headers.contains(Headers::ATOMIC_ETH) {
            repr.atomic_eth =
                Some(AtomicEthRepr { va, rkey: key, swap_add: request.swap_add, compare: request.compare });
        }
        if headers.contains(Headers::ATOMIC_ACK_ETH) {
            repr.atomic_ack_eth = Some(AtomicAckEthRepr { original: 0 });
        }
        if headers.contains(Headers::IMM) {
            repr.imm = Some(psn.value());
        }
        if headers.contains(Headers::IETH) {
            repr.ieth = Some(key_of(request.invalidate));
        }

        let payload_len = match (op, request.payload) {
            _ if !op.has_payload() => 0,
            (Operation::AtomicWrite, _) => 8,
            (_, PayloadLen::Fit) => match op.position() {
                Position::First | Position::Middle => self.mtu,
                _ if is_write(op) => self.write_left.min(self.mtu),
                _ => self.mtu / 2,
            },
            (_, PayloadLen::Mtu(delta)) => self.mtu.saturating_add_signed(delta.into()),
            (_, PayloadLen::Exact(len)) => len.into(),
        };
        if is_write(op) {
            self.write_left = self.write_left.saturating_sub(payload_len);
        }
        let payload: Vec<u8> = (0..payload_len).map(|i| (i as u8).wrapping_mul(31) ^ psn.value() as u8).collect();
        if psn == self.next_psn {
            let psns = if op == Operation::ReadRequest { u64::from(len).div_ceil(self.mtu).max(1) } else { 1 };
            self.next_psn = psn.wrapping_add(psns as u32);
        }
        let mut bytes = vec![0; repr.wire_len(payload.len())];
        repr.emit(&mut bytes, &payload).expect("headers built for their opcode emit");
        bytes
    }

    /// Polls up to `limit` packets and checks each.
    fn transmit(&mut self, limit: usize) {
        let mut sent = 0;
        while sent < limit {
            let mut mem = Audited { table: &mut self.mem, grants: &mut self.grants };
            let Some(tx) = self.qp.poll_transmit(self.now, &mut mem, &mut self.buf, TransmitOrder::ResponsesFirst)
            else {
                break;
            };
            sent += 1;
            assert_eq!(self.service, Service::Rc, "UC and UD responders never answer");
            assert!(sent <= self.max_queued, "more than {} packets queued", self.max_queued);
            let packet = RoceRepr::parse(&self.buf[..tx.len]).expect("the QP's packets parse");
            let bth = packet.header.bth;
            assert_eq!((tx.dest, bth.dest_qpn), (PEER, PEER_QPN), "responses go to the peer");
            assert_eq!(bth.opcode.transport(), Transport::Rc);
            assert!(!bth.opcode.operation().is_request(), "a responder sends only responses: {bth:?}");
            if self.qp.state() == QpState::Err {
                assert!(!self.nak_sent_in_err, "in ERR the QP sends nothing after the NAK that put it there");
                // A sequence NAK queued before the fatal one goes first, as
                // in rxe, which sent it before it saw the next request.
                let fatal = matches!(
                    packet.header.aeth,
                    Some(AethRepr { syndrome: Syndrome::Nak(code), .. }) if code != NakCode::PsnSequenceError
                );
                self.nak_sent_in_err = fatal;
            }
        }
    }

    fn check(&mut self) {
        for (key, data) in &self.frozen {
            match self.mem.region(*key) {
                Some(region) => assert!(region.data == *data, "region {key:#x} changed"),
                None => assert!(
                    self.deregistered.contains(key) || self.grants.invalidated.contains(key),
                    "region {key:#x} vanished"
                ),
            }
        }
        let state = self.qp.state();
        let expected = match self.service {
            Service::Rc => [QpState::Rts, QpState::Err].as_slice(),
            _ => [QpState::Rts].as_slice(),
        };
        assert!(expected.contains(&state), "{:?} QP in {state:?}", self.service);
        self.collect_completions();
        if state == QpState::Err {
            assert_eq!(self.completed, self.posted.len(), "ERR flushes every receive");
        }
        while let Some(event) = self.qp.poll_event() {
            self.events += 1;
            let fatal =
                matches!(event, AsyncEvent::QpRequestError { qpn: QPN } | AsyncEvent::QpAccessError { qpn: QPN });
            assert!(fatal && state == QpState::Err && self.events == 1, "event {event:?} in {state:?}");
        }
    }

    /// Checks the completions the QP produced; returns whether any consumed
    /// a receive (rather than flushing it).
    fn collect_completions(&mut self) -> bool {
        let mut consumed = false;
        while let Some((cq, wc)) = self.qp.poll_completion() {
            assert_eq!((cq, wc.qp_num), (CqKind::Recv, QPN), "{wc:?}");
            let recv = self.posted.get(self.completed).expect("every posted receive completes once");
            assert_eq!(wc.wr_id, recv.wr_id, "receives complete in the order they were posted");
            self.completed += 1;
            match wc.status {
                WcStatus::Success => {
                    assert!(matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm), "{wc:?}");
                    let placed = if wc.opcode == WcOpcode::Recv { u64::from(wc.byte_len) } else { 0 };
                    assert!(placed <= recv.length(), "{wc:?} for a receive of {} bytes", recv.length());
                }
                WcStatus::LocLenErr | WcStatus::LocProtErr | WcStatus::WrFlushErr => {}
                status => panic!("receive completed with {status:?}"),
            }
            consumed |= wc.status != WcStatus::WrFlushErr;
        }
        consumed
    }
}

fn is_write(op: Operation) -> bool {
    use Operation::*;
    matches!(op, WriteFirst | WriteMiddle | WriteLast | WriteLastImm | WriteOnly | WriteOnlyImm)
}

fn key_of(key: Key) -> u32 {
    match key {
        Key::Granted => GRANTED.key,
        Key::ReadOnly => READ_ONLY.key,
        Key::Foreign => FOREIGN.key,
        Key::Raw(key) => key,
    }
}

/// Key, address and length of a target.
fn resolve(target: &Target) -> (u32, u64, u32) {
    let region = match target.key {
        Key::ReadOnly => READ_ONLY,
        Key::Foreign => FOREIGN,
        Key::Granted | Key::Raw(_) => GRANTED,
    };
    let addr = match target.addr {
        Addr::Inside(words) => region.addr + (u64::from(words) * 8) % region.len,
        Addr::FromStart(offset) => region.addr.wrapping_add_signed(offset.into()),
        Addr::FromEnd(offset) => region.end().wrapping_add_signed(offset.into()),
        Addr::Raw(addr) => addr,
    };
    let len = match target.len {
        Len::Short(len) => len.into(),
        Len::Exact(len) => len.into(),
        Len::ToEnd(delta) => region.end().wrapping_sub(addr).wrapping_add_signed(delta.into()) as u32,
        Len::Raw(len) => len,
    };
    (key_of(target.key), addr, len)
}
