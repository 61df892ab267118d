//! A single-threaded engine: hosts with registered memory and QPs on one
//! [`Link`], driven by one loop in virtual time (simulated networks) or real
//! time (UDP sockets).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tracing::trace;

use crate::net::{Link, Outgoing, Received};
use crate::transport::{
    Access, AsyncEvent, CqKind, Incoming, MemoryTable, ModifyError, Qp, QpAttr, QpCap, QpType, Region, Srq,
    TransmitOrder, WorkCompletion, TRANSMIT_HEADROOM,
};
use crate::wire::packet::rxe_source_port;
use crate::wire::{Bth, Psn, RoceRepr};

/// The protection domain every QP and region of a world belongs to.
pub const PD: u32 = 1;

/// One endpoint: an address, its memory, QPs and SRQs, and what they produced.
#[derive(Debug)]
pub struct Host {
    /// The host's address on the link.
    pub addr: IpAddr,
    /// Its registered memory, all in protection domain [`PD`].
    pub mem: MemoryTable,
    /// Its QPs, by QP number.
    pub qps: BTreeMap<u32, Qp>,
    /// Its SRQs, by id.
    pub srqs: BTreeMap<u32, Srq>,
    /// Completions in the order they were produced: (QPN, queue, completion).
    pub completions: Vec<(u32, CqKind, WorkCompletion)>,
    /// Asynchronous events of its QPs and SRQs, in the order they were raised.
    pub events: Vec<AsyncEvent>,
    /// Packets that passed the link's ICRC check but are not valid RoCE.
    pub malformed: u64,
    /// Packets for a QP this host does not have.
    pub unknown_qp: u64,
}

impl Host {
    fn new(addr: IpAddr) -> Host {
        Host {
            addr,
            mem: MemoryTable::new(),
            qps: BTreeMap::new(),
            srqs: BTreeMap::new(),
            completions: Vec::new(),
            events: Vec::new(),
            malformed: 0,
            unknown_qp: 0,
        }
    }

    /// The QP with this number; panics if the host has none.
    pub fn qp(&mut self, qpn: u32) -> &mut Qp {
        self.qps.get_mut(&qpn).expect("no such QP")
    }

    /// Drains completions and events out of every QP.
    fn collect(&mut self) {
        for qp in self.qps.values_mut() {
            while let Some((cq, wc)) = qp.poll_completion() {
                self.completions.push((qp.qpn(), cq, wc));
            }
            while let Some(ev) = qp.poll_event() {
                self.events.push(ev);
            }
        }
    }
}

/// Where a world's time comes from.
#[derive(Debug, Clone, Copy)]
enum Clock {
    /// Jumps from event to event: deterministic, as fast as the CPU.
    Virtual,
    /// The wall clock since the given start.
    Real(Instant),
}

/// Hosts on a link, with the clock.
pub struct World<L: Link> {
    /// The link the hosts are attached to.
    pub net: L,
    /// The current time: virtual, or elapsed since the world was created.
    pub now: Duration,
    /// The hosts, by the index [`World::add_host`] returned.
    pub hosts: Vec<Host>,
    clock: Clock,
    buf: Vec<u8>,
}

impl<L: Link> World<L> {
    /// A world in virtual time (for simulated links).
    pub fn new(net: L) -> World<L> {
        World {
            net,
            now: Duration::ZERO,
            hosts: Vec::new(),
            clock: Clock::Virtual,
            buf: vec![0; 4096 + TRANSMIT_HEADROOM + 64],
        }
    }

    /// A world in real time (for links to real networks).
    pub fn real_time(net: L) -> World<L> {
        World { clock: Clock::Real(Instant::now()), ..World::new(net) }
    }

    /// Adds a host at `addr` and returns its index.
    pub fn add_host(&mut self, addr: IpAddr) -> std::io::Result<usize> {
        self.net.attach(addr)?;
        self.hosts.push(Host::new(addr));
        Ok(self.hosts.len() - 1)
    }

    /// Creates a QP on host `h` (in RESET).
    pub fn create_qp(&mut self, h: usize, qpn: u32, qp_type: QpType, cap: QpCap, srq: Option<u32>) {
        self.hosts[h].qps.insert(qpn, Qp::new(qpn, qp_type, PD, cap, srq));
    }

    /// Registers `len` zeroed bytes at `addr` on host `h` under `key`.
    pub fn register(&mut self, h: usize, key: u32, addr: u64, len: usize, access: Access) {
        let region = Region { pd: PD, addr, access, data: vec![0; len] };
        self.hosts[h].mem.register(key, region);
    }

    /// Brings a QP pair, given as (host, QPN), through INIT, RTR and RTS the
    /// way `ibv_rc_pingpong` does (UC and UD take the attributes their type
    /// requires); `psns` are the initial send PSNs of `a` and `b`.
    pub fn connect(
        &mut self,
        a: (usize, u32),
        b: (usize, u32),
        attr: &QpAttr,
        psns: (Psn, Psn),
    ) -> Result<(), ModifyError> {
        for (me, peer, my_psn, peer_psn) in [(a, b, psns.0, psns.1), (b, a, psns.1, psns.0)] {
            let peer_addr = self.hosts[peer.0].addr;
            let at = QpAttr { dest: Some(peer_addr), dest_qpn: peer.1, rq_psn: peer_psn, sq_psn: my_psn, ..*attr };
            self.hosts[me.0].qp(me.1).connect(&at)?;
        }
        Ok(())
    }

    /// Runs until `done` holds (true) or the world has nothing left to do
    /// before `deadline` (false).
    pub fn run_until(&mut self, deadline: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        loop {
            self.tick();
            if done(self) {
                return true;
            }
            if self.step() {
                continue;
            }
            let next = self.next_event();
            match self.clock {
                Clock::Virtual => match next {
                    Some(t) if t <= deadline => self.now = self.now.max(t),
                    _ => return done(self),
                },
                Clock::Real(_) => {
                    if self.now >= deadline {
                        return done(self);
                    }
                    let until = next.unwrap_or(deadline).min(deadline);
                    let wait = until.saturating_sub(self.now).min(Duration::from_millis(10));
                    crate::net::wait_readable(&self.net.raw_fds(), wait);
                }
            }
        }
    }

    /// Runs until nothing is left to do (or `deadline`).
    pub fn run_idle(&mut self, deadline: Duration) {
        self.run_until(deadline, |_| false);
    }

    /// Reads the wall clock, in real time.
    fn tick(&mut self) {
        if let Clock::Real(start) = self.clock {
            self.now = start.elapsed();
        }
    }

    /// Does everything due at the current time; says whether anything happened.
    pub fn step(&mut self) -> bool {
        let mut busy = false;
        let now = self.now;
        for host in &mut self.hosts {
            for qp in host.qps.values_mut() {
                if qp.poll_timeout().is_some_and(|t| t <= now) {
                    qp.handle_timeout(now);
                    busy = true;
                }
            }
        }
        for h in 0..self.hosts.len() {
            busy |= self.transmit_all(h);
        }
        self.net.flush();
        while let Some(rx) = self.net.receive(now, &mut self.buf) {
            busy = true;
            if let Some(h) = self.hosts.iter().position(|h| h.addr == rx.dst) {
                deliver(&mut self.hosts[h], now, &rx, &self.buf[..rx.len]);
            }
        }
        for host in &mut self.hosts {
            host.collect();
        }
        busy
    }

    /// The next time something is due: a delivery or a QP timer.
    pub fn next_event(&self) -> Option<Duration> {
        let timers = self.hosts.iter().flat_map(|h| h.qps.values().filter_map(Qp::poll_timeout));
        timers.chain(self.net.next_event()).min()
    }

    fn transmit_all(&mut self, h: usize) -> bool {
        let now = self.now;
        let host = &mut self.hosts[h];
        let mut sent = false;
        for qp in host.qps.values_mut() {
            while let Some(tx) = qp.poll_transmit(now, &host.mem, &mut self.buf, TransmitOrder::ResponsesFirst) {
                sent = true;
                let roce = &mut self.buf[..tx.len];
                let remote_qpn = Bth::new_unchecked(&*roce).dest_qpn();
                let out =
                    Outgoing { src: host.addr, dst: tx.dest, src_port: rxe_source_port(qp.qpn(), remote_qpn), roce };
                if let Err(e) = self.net.transmit(now, out) {
                    trace!(error = %e, "link refused a packet");
                }
            }
        }
        sent
    }
}

/// Hands a received packet to the QP it names.
fn deliver(host: &mut Host, now: Duration, rx: &Received, roce: &[u8]) {
    let Ok(pkt) = RoceRepr::parse(roce) else {
        host.malformed += 1;
        return;
    };
    let qpn = pkt.header.bth.dest_qpn;
    let Some(qp) = host.qps.get_mut(&qpn) else {
        host.unknown_qp += 1;
        return;
    };
    let srq = qp.srq().and_then(|id| host.srqs.get_mut(&id));
    let incoming =
        Incoming { src: rx.src, src_port: rx.src_port, dst: rx.dst, header: &pkt.header, payload: pkt.payload };
    qp.handle_packet(now, incoming, &mut host.mem, srq);
}
