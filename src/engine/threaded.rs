//! The progress engine behind a verbs context: one thread that owns the
//! link, moves packets between it and the QPs, runs their timers and
//! delivers completions to completion queues.
//!
//! Application threads reach a QP directly (post_send locks it, queues the
//! request and rings the doorbell), so posting costs a mutex and an eventfd
//! write, not a round trip. Completions travel to the application through
//! `crossbeam-channel` queues, one per CQ.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tracing::{debug, debug_span, trace};

use super::eventfd::EventFd;
use super::registry::{Registry, RegistryAccess};
use crate::net::{wait_readable, Link, LinkStats, Outgoing};
use crate::transport::{
    AsyncEvent, Counters, CqKind, Incoming, Qp, Srq, WorkCompletion, TRANSMIT_HEADROOM,
};
use crate::wire::packet::{rxe_source_port, rxe_ud_source_port};
use crate::wire::{Bth, RoceRepr};

/// Locks a mutex, recovering it if a thread panicked while holding it: the
/// state inside stays consistent because every critical section is a single
/// call into the transport.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a CQ wants to be told about new completions (`ibv_req_notify_cq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    Off,
    Next,
    Solicited,
}

/// A completion channel's shared half.
#[derive(Debug)]
pub(crate) struct ChannelShared {
    pub fd: EventFd,
    pub events: (Sender<u32>, Receiver<u32>),
}

/// A completion queue's shared half.
#[derive(Debug)]
pub(crate) struct CqShared {
    pub id: u32,
    pub entries: (Sender<WorkCompletion>, Receiver<WorkCompletion>),
    pub arm: Mutex<Arm>,
    pub overflowed: AtomicBool,
    pub channel: Option<Arc<ChannelShared>>,
    /// The application dropped the CQ: QPs that still point at it deliver nothing.
    pub destroyed: AtomicBool,
}

impl CqShared {
    /// Adds a completion and raises the channel event if the CQ is armed for it.
    pub fn push(&self, wc: WorkCompletion) {
        if self.destroyed.load(Ordering::Acquire) {
            return;
        }
        let notable = wc.solicited || wc.status != crate::transport::WcStatus::Success;
        if let Err(TrySendError::Full(_)) = self.entries.0.try_send(wc) {
            self.overflowed.store(true, Ordering::Relaxed);
            return;
        }
        let mut arm = lock(&self.arm);
        let fire = match *arm {
            Arm::Off => false,
            Arm::Next => true,
            Arm::Solicited => notable,
        };
        if fire {
            *arm = Arm::Off;
            if let Some(ch) = &self.channel {
                let _ = ch.events.0.send(self.id);
                ch.fd.signal();
            }
        }
    }
}

/// A QP as the engine and the application share it.
#[derive(Debug)]
pub(crate) struct QpCell {
    pub qp: Mutex<Qp>,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    pub srq: Option<Arc<Mutex<Srq>>>,
}

impl QpCell {
    /// Moves the QP's completions to its CQs and its events to `events`.
    pub(crate) fn drain(&self, qp: &mut Qp, events: &Mutex<VecDeque<AsyncEvent>>) {
        while let Some((cq, wc)) = qp.poll_completion() {
            match cq {
                CqKind::Send => self.send_cq.push(wc),
                CqKind::Recv => self.recv_cq.push(wc),
            }
        }
        while let Some(ev) = qp.poll_event() {
            lock(events).push_back(ev);
        }
    }
}

/// Everything the engine thread and the application share.
#[derive(Debug, Default)]
pub(crate) struct EngineShared {
    pub registry: RwLock<Registry>,
    pub qps: Mutex<BTreeMap<u32, Arc<QpCell>>>,
    /// Bumped whenever `qps` changes, so the engine re-reads it only then.
    pub qps_version: AtomicU64,
    pub events: Mutex<VecDeque<AsyncEvent>>,
    pub stop: AtomicBool,
    pub doorbell: Option<EventFd>,
    pub link_stats: Mutex<LinkStats>,
    /// Destroyed QPs whose queued answers the engine still has to send.
    pub closing: Mutex<Vec<Arc<QpCell>>>,
    /// Counters of QPs that were destroyed, so device totals never go back.
    pub retired: Mutex<Counters>,
    /// Packets with a good ICRC that are not valid RoCE.
    pub malformed: AtomicU64,
    /// Packets for a QP number the device does not have (never created, or destroyed).
    pub unknown_qp: AtomicU64,
}

impl EngineShared {
    pub fn ring(&self) {
        if let Some(d) = &self.doorbell {
            d.signal();
        }
    }
}

/// The engine thread, stopped and joined on drop.
#[derive(Debug)]
pub(crate) struct Engine {
    pub shared: Arc<EngineShared>,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine thread over `link`. With `busy_poll` it never
    /// sleeps: lowest latency, one core spent.
    pub fn start<L: Link + Send + 'static>(link: L, busy_poll: bool, name: &str) -> std::io::Result<Engine> {
        let shared = Arc::new(EngineShared { doorbell: Some(EventFd::new()?), ..EngineShared::default() });
        let thread_shared = Arc::clone(&shared);
        let span_name = name.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("softroce-{name}"))
            .spawn(move || {
                let _span = debug_span!("engine", device = %span_name).entered();
                run(link, &thread_shared, busy_poll)
            })?;
        Ok(Engine { shared, thread: Some(thread) })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.ring();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The engine loop: receive, run timers, transmit, sleep until the link or
/// the doorbell has something (or the next timer is due).
fn run<L: Link>(mut link: L, shared: &EngineShared, busy_poll: bool) {
    let start = Instant::now();
    let mut rx = vec![0u8; 64 * 1024];
    let mut tx = vec![0u8; 4096 + TRANSMIT_HEADROOM + 64];
    let mut qps: Vec<Arc<QpCell>> = Vec::new();
    let mut by_qpn: BTreeMap<u32, Arc<QpCell>> = BTreeMap::new();
    let mut version = u64::MAX;
    // A context binds its addresses before the engine starts.
    let locals = link.local_addrs();
    let mut fds = link.raw_fds();
    if let Some(d) = &shared.doorbell {
        fds.push(d.as_raw_fd());
    }
    while !shared.stop.load(Ordering::SeqCst) {
        let seen = shared.qps_version.load(Ordering::Acquire);
        if seen != version {
            by_qpn = lock(&shared.qps).clone();
            qps = by_qpn.values().cloned().collect();
            version = seen;
        }
        let now = start.elapsed();
        let mut busy = false;

        // Timers run only once the link is drained: an ACK waiting in the
        // socket must not lose the race to the timeout it would cancel.
        let mut drained = false;
        for _ in 0..64 {
            let Some(r) = link.receive(now, &mut rx) else {
                drained = true;
                break;
            };
            busy = true;
            let Ok(pkt) = RoceRepr::parse(&rx[..r.len]) else {
                shared.malformed.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let Some(cell) = by_qpn.get(&pkt.header.bth.dest_qpn) else {
                trace!(qpn = pkt.header.bth.dest_qpn, "packet for an unknown QP");
                shared.unknown_qp.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let mut qp = lock(&cell.qp);
            let registry = shared.registry.read().unwrap_or_else(|e| e.into_inner());
            let mut mem = RegistryAccess(&registry);
            let mut srq = cell.srq.as_ref().map(|s| lock(s));
            let incoming = Incoming { src: r.src, src_port: r.src_port, dst: r.dst, header: &pkt.header, payload: pkt.payload };
            qp.handle_packet(now, incoming, &mut mem, srq.as_deref_mut());
            drop(srq);
            drop(registry);
            cell.drain(&mut qp, &shared.events);
        }

        let mut next: Option<Duration> = None;
        for cell in &qps {
            let mut qp = lock(&cell.qp);
            if drained && qp.poll_timeout().is_some_and(|t| t <= now) {
                qp.handle_timeout(now);
                busy = true;
            }
            let sent = transmit(&mut qp, &mut link, shared, &locals, now, &mut tx, 64);
            busy |= sent > 0;
            cell.drain(&mut qp, &shared.events);
            next = match (next, qp.poll_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        // Destroyed QPs still owe their peers the answers they had queued
        // (the ACK of the last message, say); then they are gone.
        for cell in std::mem::take(&mut *lock(&shared.closing)) {
            let mut qp = lock(&cell.qp);
            busy |= transmit(&mut qp, &mut link, shared, &locals, now, &mut tx, usize::MAX) > 0;
        }
        link.flush();
        *lock(&shared.link_stats) = link.stats();

        if !busy && !busy_poll {
            let wait = next.map_or(Duration::from_millis(100), |t| t.saturating_sub(start.elapsed()));
            wait_readable(&fds, wait.min(Duration::from_millis(100)));
            if let Some(d) = &shared.doorbell {
                d.drain();
            }
        }
    }
}

/// Hands up to `limit` of the QP's packets to the link; returns how many.
fn transmit<L: Link>(
    qp: &mut Qp,
    link: &mut L,
    shared: &EngineShared,
    locals: &[std::net::IpAddr],
    now: Duration,
    buf: &mut [u8],
    limit: usize,
) -> usize {
    let registry = shared.registry.read().unwrap_or_else(|e| e.into_inner());
    let mem = RegistryAccess(&registry);
    let mut sent = 0;
    while sent < limit {
        let Some(t) = qp.poll_transmit(now, &mem, buf) else { break };
        let roce = &mut buf[..t.len];
        let remote_qpn = Bth::new_unchecked(&*roce).dest_qpn();
        let src_port = match qp.qp_type() {
            crate::transport::QpType::Ud => rxe_ud_source_port(qp.qpn()),
            _ => rxe_source_port(qp.qpn(), remote_qpn),
        };
        let src = source_for(locals, t.dest);
        if let Err(e) = link.transmit(now, Outgoing { src, dst: t.dest, src_port, roce }) {
            debug!(qpn = qp.qpn(), error = %e, "send failed");
        }
        sent += 1;
    }
    sent
}

/// The local address a packet to `dest` leaves from: the first of the same
/// IP version.
fn source_for(locals: &[std::net::IpAddr], dest: std::net::IpAddr) -> std::net::IpAddr {
    locals.iter().copied().find(|a| a.is_ipv4() == dest.is_ipv4()).unwrap_or(dest)
}
