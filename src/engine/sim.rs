//! A deterministic world: hosts with registered memory and QPs on a
//! [`SimNet`], driven in virtual time by one loop.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::IpAddr;
use std::time::Duration;

use etherparse::UdpHeader;
use tracing::trace;

use crate::net::SimNet;
use crate::transport::{
    Access, AsyncEvent, AttrMask, CqKind, Incoming, MemoryTable, ModifyError, Qp, QpAttr, QpCap,
    QpState, QpType, Region, Srq, WorkCompletion,
};
use crate::wire::Psn;
use crate::wire::packet::{encapsulate, ip_header, rxe_source_port};
use crate::wire::{Error, Packet, ROCE_UDP_PORT};

/// The protection domain every simulated QP and region belongs to.
pub const PD: u32 = 1;

/// One endpoint: an address, its memory, QPs and SRQs, and what they produced.
#[derive(Debug)]
pub struct Host {
    pub addr: IpAddr,
    pub mem: MemoryTable,
    pub qps: BTreeMap<u32, Qp>,
    pub srqs: BTreeMap<u32, Srq>,
    /// Completions in the order they were produced: (QPN, queue, completion).
    pub completions: Vec<(u32, CqKind, WorkCompletion)>,
    pub events: Vec<AsyncEvent>,
    /// Packets dropped before reaching a QP, by reason.
    pub icrc_errors: u64,
    pub malformed: u64,
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
            icrc_errors: 0,
            malformed: 0,
            unknown_qp: 0,
        }
    }

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

/// Hosts on a simulated network, with the virtual clock.
pub struct SimWorld<W: Write = io::Sink> {
    pub net: SimNet<W>,
    pub now: Duration,
    pub hosts: Vec<Host>,
    buf: Vec<u8>,
}

impl<W: Write> SimWorld<W> {
    pub fn new(net: SimNet<W>) -> SimWorld<W> {
        SimWorld { net, now: Duration::ZERO, hosts: Vec::new(), buf: vec![0; 4096 + 128] }
    }

    /// Adds a host and returns its index.
    pub fn add_host(&mut self, addr: IpAddr) -> usize {
        self.net.attach(addr);
        self.hosts.push(Host::new(addr));
        self.hosts.len() - 1
    }

    /// Runs until `done` holds (true) or the world has nothing left to do
    /// before `deadline` (false).
    pub fn run_until(&mut self, deadline: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.step() {
                continue;
            }
            match self.next_event() {
                Some(t) if t <= deadline => self.now = self.now.max(t),
                _ => return done(self),
            }
        }
    }

    /// Runs until nothing is left to do (or `deadline`).
    pub fn run_idle(&mut self, deadline: Duration) {
        self.run_until(deadline, |_| false);
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
        while let Some(delivery) = self.net.poll_deliver(now) {
            busy = true;
            if let Some(h) = self.hosts.iter().position(|h| h.addr == delivery.to) {
                self.deliver(h, &delivery.packet);
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
        timers.chain(self.net.next_delivery()).min()
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
            let qp = self.hosts[me.0].qp(me.1);
            let ty = qp.qp_type();
            let mut at = *attr;
            at.dest = Some(peer_addr);
            at.dest_qpn = peer.1;
            at.state = QpState::Init;
            let init = match ty {
                QpType::Ud => AttrMask::QKEY,
                _ => AttrMask::ACCESS_FLAGS,
            };
            qp.modify(&at, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | init)?;
            at.state = QpState::Rtr;
            at.rq_psn = peer_psn;
            let rtr = match ty {
                QpType::Rc => {
                    AttrMask::AV
                        | AttrMask::PATH_MTU
                        | AttrMask::DEST_QPN
                        | AttrMask::RQ_PSN
                        | AttrMask::MAX_DEST_RD_ATOMIC
                        | AttrMask::MIN_RNR_TIMER
                }
                QpType::Uc => AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN,
                QpType::Ud => AttrMask::empty(),
            };
            qp.modify(&at, AttrMask::STATE | rtr)?;
            at.state = QpState::Rts;
            let rts = match ty {
                QpType::Rc => {
                    AttrMask::TIMEOUT
                        | AttrMask::RETRY_CNT
                        | AttrMask::RNR_RETRY
                        | AttrMask::SQ_PSN
                        | AttrMask::MAX_QP_RD_ATOMIC
                }
                _ => AttrMask::SQ_PSN,
            };
            at.sq_psn = my_psn;
            qp.modify(&at, AttrMask::STATE | rts)?;
        }
        Ok(())
    }

    fn transmit_all(&mut self, h: usize) -> bool {
        let now = self.now;
        let host = &mut self.hosts[h];
        let mut sent = false;
        for qp in host.qps.values_mut() {
            while let Some(tx) = qp.poll_transmit(now, &host.mem, &mut self.buf) {
                sent = true;
                let roce = &self.buf[..tx.len];
                let remote_qpn = crate::wire::Bth::new_unchecked(roce).dest_qpn();
                let udp = UdpHeader {
                    source_port: rxe_source_port(qp.qpn(), remote_qpn),
                    destination_port: ROCE_UDP_PORT,
                    length: 0,
                    checksum: 0,
                };
                let packet = ip_header(host.addr, tx.dest).and_then(|ip| encapsulate(&ip, &udp, roce));
                match packet {
                    Ok(p) => self.net.send(now, p),
                    Err(e) => trace!(error = %e, "cannot encapsulate"),
                }
            }
        }
        sent
    }

    fn deliver(&mut self, h: usize, bytes: &[u8]) {
        let now = self.now;
        let host = &mut self.hosts[h];
        let pkt = match Packet::parse(bytes) {
            Ok(p) => p,
            Err(Error::NotRoce) => return,
            Err(_) => {
                host.malformed += 1;
                return;
            }
        };
        if !pkt.icrc_ok() {
            host.icrc_errors += 1;
            return;
        }
        let qpn = pkt.roce.header.bth.dest_qpn;
        let Some(qp) = host.qps.get_mut(&qpn) else {
            host.unknown_qp += 1;
            return;
        };
        let srq = qp.srq().and_then(|id| host.srqs.get_mut(&id));
        let incoming = Incoming {
            src: pkt.ip.source(),
            dst: pkt.ip.destination(),
            header: &pkt.roce.header,
            payload: pkt.roce.payload,
        };
        qp.handle_packet(now, incoming, &mut host.mem, srq);
    }
}
