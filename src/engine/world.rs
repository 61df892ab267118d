//! A single-threaded engine: hosts with registered memory and QPs on one
//! [`Link`], driven by one loop in virtual time (simulated networks) or real
//! time (UDP sockets).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::dispatch::{self, Egress};
use crate::net::{Link, Received};
use crate::transport::{
    Access, AsyncEvent, CqKind, MemoryTable, ModifyError, Qp, QpAttr, QpCap, QpType, Region, Srq, TransmitOrder,
    WorkCompletion, TRANSMIT_HEADROOM,
};
use crate::wire::{Psn, RoceRepr};

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
                busy |= dispatch::run_due_timers(qp, now);
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

    /// Hands every packet of host `h`'s QPs to the link, from the host's
    /// address; says whether there were any.
    fn transmit_all(&mut self, h: usize) -> bool {
        let now = self.now;
        let host = &mut self.hosts[h];
        let mut out = Egress { link: &mut self.net, locals: std::slice::from_ref(&host.addr), buf: &mut self.buf };
        let mut sent = false;
        for qp in host.qps.values_mut() {
            sent |= out.transmit(qp, &mut host.mem, now, usize::MAX, TransmitOrder::ResponsesFirst) > 0;
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
    dispatch::deliver(qp, now, rx, &pkt, &mut host.mem, srq);
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::capture::{self, IpPcapWriter};
    use crate::net::{Faults, SimNet};
    use crate::transport::{RecvWr, SendOp, SendWr, Sge, UdDest, GRH_LEN};
    use crate::wire::packet::{rxe_source_port, rxe_ud_source_port, Packet};
    use crate::wire::Transport;

    /// A UD QP's packets leave from kernel rxe's port for its own QPN, a
    /// connected QP's from the port of its two QPNs (rxe-spec W-22): a
    /// world sends as the threaded engine does.
    #[test]
    fn qps_send_from_kernel_rxe_source_ports() {
        const RC: (u32, u32) = (0x11, 0x12);
        const UD: (u32, u32) = (0x21, 0x22);
        const QKEY: u32 = 0x77;
        let addrs = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))];
        let pcap = IpPcapWriter::new(Vec::new()).unwrap();
        let mut w = World::new(SimNet::new(1, Faults::default()).with_pcap(pcap));
        for (h, (&addr, (rc, ud))) in addrs.iter().zip([(RC.0, UD.0), (RC.1, UD.1)]).enumerate() {
            w.add_host(addr).unwrap();
            w.register(h, 1, 0x1000, 4096, Access::LOCAL_WRITE);
            w.create_qp(h, rc, QpType::Rc, QpCap::default(), None);
            w.create_qp(h, ud, QpType::Ud, QpCap::default(), None);
        }
        let attr = QpAttr { qkey: QKEY, ..QpAttr::default() };
        let psns = (Psn::new(1), Psn::new(1));
        w.connect((0, RC.0), (1, RC.1), &attr, psns).unwrap();
        w.connect((0, UD.0), (1, UD.1), &attr, psns).unwrap();
        let sge = |len| Sge { addr: 0x1000, length: len, lkey: 1 };
        for qpn in [RC.1, UD.1] {
            w.hosts[1]
                .qp(qpn)
                .post_recv(RecvWr { wr_id: 1, sg_list: crate::sg_list![sge(GRH_LEN as u32 + 64)] })
                .unwrap();
        }
        w.hosts[0].qp(RC.0).post_send(SendWr::new(1, SendOp::Send).with_sge(sge(64))).unwrap();
        let to_b = UdDest { dest: addrs[1], remote_qpn: UD.1, remote_qkey: QKEY };
        w.hosts[0].qp(UD.0).post_send(SendWr::new(2, SendOp::Send).with_sge(sge(64)).with_ud(to_b)).unwrap();
        assert!(w.run_until(Duration::from_secs(1), |w| w.hosts[1].completions.len() == 2));

        let (frames, error) = capture::read(&w.net.into_pcap().unwrap().unwrap());
        assert!(error.is_none(), "{error:?}");
        let mut transports = Vec::new();
        for frame in &frames {
            let pkt = Packet::parse(capture::ip_bytes(frame.link, &frame.data).unwrap()).unwrap();
            let transport = pkt.roce.header.bth.opcode.transport();
            let port = match transport {
                Transport::Ud => rxe_ud_source_port(UD.0),
                _ => rxe_source_port(RC.0, RC.1),
            };
            assert_eq!(pkt.udp.source_port, port, "{transport:?}");
            transports.push(transport);
        }
        assert!(transports.contains(&Transport::Ud) && transports.contains(&Transport::Rc), "{transports:?}");
    }
}
