//! A context's CM service: its GSI QP (QP 1), the [`Protocol`] that speaks
//! through it, and a thread that feeds the protocol received MADs and
//! deadlines. The ids of the context call into the protocol under the same
//! lock, and whoever changed it sends what it queued.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::id::{self, IdInner, Released};
use super::protocol::{CommId, MadPeer, Protocol, ProtocolConfig};
use super::CmOptions;
use crate::engine::EventFd;
use crate::transport::{
    QpCap, QpType, RecvWr, SendFlags, SendOp, SendWr, UdDest, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};
use crate::verbs::{
    Access, CompletionChannel, CompletionQueue, Context, Gid, MemoryRegion, ProtectionDomain, QueuePair, Result,
    GSI_QKEY,
};
use crate::wire::mad::MAD_LEN;

/// Receives kept posted on the GSI QP: MADs that arrive while all are full
/// are dropped, and their senders retry.
const RECEIVES: usize = 256;
/// Bytes of each receive: the GRH area, then the MAD.
const RECEIVE_LEN: usize = GRH_LEN + MAD_LEN;
/// Longest the service thread sleeps without looking at its deadline.
const IDLE: Duration = Duration::from_secs(1);
/// Live connections a context's protocol keeps at most.
const MAX_CONNECTIONS: usize = 4096;

/// The process's CM services, one per context.
static SERVICES: Mutex<Vec<Weak<Service>>> = Mutex::new(Vec::new());
/// Services kept after their last id went, while a DREQ of theirs waits
/// for its DREP: an exit sends it again ([`resend_unanswered_until`]).
static KEPT: Mutex<Vec<Arc<Service>>> = Mutex::new(Vec::new());

pub(super) struct Service {
    pub(super) context: Context,
    gsi: QueuePair,
    cq: CompletionQueue,
    completions: CompletionChannel,
    receives: MemoryRegion,
    _pd: ProtectionDomain,
    /// Wakes the thread: a deadline came earlier, or the service goes away.
    wake: Arc<EventFd>,
    state: Mutex<State>,
    /// Whether [`KEPT`] holds it.
    kept: AtomicBool,
}

/// What the service's lock guards: the protocol and who its ids are.
pub(super) struct State {
    pub(super) protocol: Protocol,
    /// Our ids by their Comm ID (or SIDR request ID).
    pub(super) ids: HashMap<CommId, Weak<IdInner>>,
    /// Listening ids by service ID.
    pub(super) listeners: HashMap<u64, Weak<IdInner>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("device", &self.context.device().name()).finish()
    }
}

impl Service {
    /// The service of `context`, started on first use with `options`' timing.
    pub(super) fn of(context: &Context, options: &CmOptions) -> Result<Arc<Service>> {
        let mut services = SERVICES.lock().unwrap_or_else(PoisonError::into_inner);
        services.retain(|s| s.strong_count() > 0);
        if let Some(service) = services.iter().filter_map(Weak::upgrade).find(|s| s.context.same_as(context)) {
            return Ok(service);
        }
        // The CM's own verbs calls on QP 1 are not the program's: they stay
        // out of the trace, and the MADs they send stay in it as packets.
        let service = crate::trace::quietly(|| Service::start(context, options))?;
        services.push(Arc::downgrade(&service));
        Ok(service)
    }

    fn start(context: &Context, options: &CmOptions) -> Result<Arc<Service>> {
        let pd = context.alloc_pd()?;
        let completions = context.create_comp_channel()?;
        let cq = context.create_cq(2 * RECEIVES, Some(&completions))?;
        let cap = QpCap {
            max_send_wr: RECEIVES as u32,
            max_recv_wr: RECEIVES as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: MAD_LEN as u32,
        };
        let gsi = pd.create_qp(QpType::Ud, &cq).cap(cap).gsi().build()?;
        gsi.activate(GSI_QKEY)?;
        let receives = pd.alloc_mr(RECEIVES * RECEIVE_LEN, Access::LOCAL_WRITE)?;
        for slot in 0..RECEIVES {
            gsi.post_recv(RecvWr {
                wr_id: slot as u64,
                sg_list: crate::sg_list![receives.sge(slot * RECEIVE_LEN, RECEIVE_LEN)],
            })?;
        }
        let config = ProtocolConfig {
            slot: context.slot(),
            local_ca_guid: context.device().query_device().node_guid,
            max_connections: MAX_CONNECTIONS,
            response_timeout: options.response_timeout,
            max_cm_retries: options.max_cm_retries,
        };
        let state = State {
            protocol: Protocol::new(config, crate::random_u32()),
            ids: HashMap::new(),
            listeners: HashMap::new(),
        };
        let service = Arc::new(Service {
            context: context.clone(),
            gsi,
            cq,
            completions,
            receives,
            _pd: pd,
            wake: Arc::new(EventFd::new()?),
            state: Mutex::new(state),
            kept: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&service);
        let wake = Arc::clone(&service.wake);
        let completions = service.completions.as_raw_fd();
        let name = format!("cm-{}", context.device().name());
        std::thread::Builder::new().name(name).spawn(move || run(&weak, &wake, completions))?;
        Ok(service)
    }

    /// Runs `f` on the protocol, then sends what it queued and hands its
    /// events to the ids. Ids it let go of are dropped only after the lock
    /// is released, as dropping one calls back in.
    pub(super) fn with_state<R>(self: &Arc<Service>, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let mut released = Released::default();
        let result = {
            let mut state = self.lock();
            let now = Instant::now();
            let deadline = state.protocol.poll_timeout();
            let result = f(&mut state, now);
            self.flush(&mut state, now, &mut released);
            self.keep_while_unanswered(state.protocol.has_unanswered());
            if state.protocol.poll_timeout().is_some_and(|t| deadline.is_none_or(|d| t < d)) {
                self.wake.signal();
            }
            result
        };
        drop(released);
        result
    }

    /// Keeps the service (and so its context) alive while a DREQ of an id
    /// destroyed waits for its DREP, and lets it go after.
    fn keep_while_unanswered(self: &Arc<Service>, unanswered: bool) {
        if self.kept.swap(unanswered, Ordering::AcqRel) == unanswered {
            return;
        }
        let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        if unanswered {
            kept.push(Arc::clone(self));
        } else {
            // The caller holds the service: this is never the last handle.
            kept.retain(|s| !Arc::ptr_eq(s, self));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends every queued MAD and dispatches every event, until neither
    /// produces more.
    fn flush(self: &Arc<Service>, state: &mut State, now: Instant, released: &mut Released) {
        loop {
            let mut busy = false;
            while let Some(transmit) = state.protocol.poll_transmit() {
                busy = true;
                self.send(transmit.to, &transmit.mad);
            }
            while let Some(event) = state.protocol.poll_event() {
                busy = true;
                id::dispatch(self, state, now, event, released);
            }
            if !busy {
                return;
            }
        }
    }

    /// One MAD to a peer's GSI QP, inline: nothing to keep until it is sent.
    /// A send the queue refuses is lost like a dropped packet, and the
    /// protocol retries.
    fn send(&self, to: MadPeer, mad: &[u8]) {
        let wr = SendWr {
            flags: SendFlags { inline: true, signaled: false, ..SendFlags::default() },
            inline_data: mad.into(),
            ud: Some(UdDest { dest: to.gid.to_ip(), remote_qpn: to.qpn, remote_qkey: GSI_QKEY }),
            ..SendWr::new(u64::MAX, SendOp::Send)
        };
        if let Err(e) = crate::trace::quietly(|| self.gsi.post_send(wr)) {
            tracing::debug!("CM MAD to {:?} not sent: {e}", to.gid);
        }
    }

    /// Feeds the protocol what arrived and what fell due. The CQ is armed
    /// first, so that what comes after the last poll raises an event.
    fn turn(self: &Arc<Service>) {
        self.cq.req_notify(false);
        self.with_state(|state, now| {
            while let Some(wc) = crate::trace::quietly(|| self.cq.poll_queued()) {
                self.received(state, now, &wc);
            }
            if state.protocol.poll_timeout().is_some_and(|t| t <= now) {
                self.establish_by_traffic(state, now);
                state.protocol.handle_timeout(now);
            }
        });
    }

    /// Before a REP is resent or given up: a connection whose QP has
    /// received from the peer is established (rxe-spec M-24b).
    fn establish_by_traffic(&self, state: &mut State, now: Instant) {
        let due = state.protocol.rep_due(now);
        if due.is_empty() {
            return;
        }
        let counters = self.context.qp_counters();
        for (id, qpn) in due {
            if counters.iter().any(|&(q, c)| q == qpn && c.received_packets > 0) {
                state.protocol.communication_established(id);
            }
        }
    }

    /// Hands a received MAD to the protocol and posts its receive again.
    fn received(&self, state: &mut State, now: Instant, wc: &WorkCompletion) {
        if wc.opcode != WcOpcode::Recv {
            return;
        }
        let slot = wc.wr_id as usize;
        let len = (wc.byte_len as usize).min(RECEIVE_LEN);
        let mut received = [0u8; RECEIVE_LEN];
        if wc.status == WcStatus::Success
            && len > GRH_LEN
            && self.receives.read(slot * RECEIVE_LEN, &mut received[..len]).is_ok()
        {
            let from = MadPeer { gid: source_gid(&received[..GRH_LEN]), qpn: wc.src_qp };
            state.protocol.handle_mad(now, from, &received[GRH_LEN..len]);
        }
        let again =
            RecvWr { wr_id: wc.wr_id, sg_list: crate::sg_list![self.receives.sge(slot * RECEIVE_LEN, RECEIVE_LEN)] };
        if let Err(e) = crate::trace::quietly(|| self.gsi.post_recv(again)) {
            tracing::warn!("GSI receive {slot} not reposted: {e}");
        }
    }

    /// How long the thread may wait for a MAD.
    fn sleep(&self) -> Duration {
        let deadline = self.lock().protocol.poll_timeout();
        deadline.map_or(IDLE, |t| t.saturating_duration_since(Instant::now()).min(IDLE))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.wake.signal();
    }
}

/// How often a process about to exit sends again the DREQs no DREP answered.
const EXIT_RESEND: Duration = Duration::from_millis(40);

/// The process's CM services, on contexts it opened itself (not those a
/// child of `fork` has of its parent's).
fn services() -> Vec<Arc<Service>> {
    let services: Vec<Arc<Service>> =
        SERVICES.lock().unwrap_or_else(PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect();
    services.into_iter().filter(|s| s.context.opened_here()).collect()
}

/// Before the process exits: every context's CM destroys the ids the
/// program still holds and sends what that owes its peers (a DREP to the
/// DREQ a program that exits without destroying its id got, say), as the
/// kernel does for an exiting process.
pub(crate) fn destroy_all_ids() {
    for service in services() {
        service.with_state(|state, now| state.protocol.destroy_all(now));
    }
}

/// Then, until `deadline`, sends again the DREQs no DREP answered yet, so
/// that one lost on the way does not leave the peer waiting for its
/// DISCONNECTED.
pub(crate) fn resend_unanswered_until(deadline: Instant) {
    let services = services();
    while Instant::now() + EXIT_RESEND < deadline {
        std::thread::sleep(EXIT_RESEND);
        let mut unanswered = false;
        for service in &services {
            unanswered |= service.with_state(|state, _| state.protocol.resend_unanswered());
        }
        if !unanswered {
            return;
        }
    }
}

/// The service thread. It sleeps on the CQ's channel and leaves receiving
/// to the engine thread and to the application's threads that wait in
/// their CQs: a thread that polls a CQ drives the engine, which then keeps
/// off the sockets for a while, and would slow their traffic. It holds its
/// service only while it works on it, so the last id to go stops it.
fn run(service: &Weak<Service>, wake: &EventFd, completions: RawFd) {
    while let Some(live) = service.upgrade() {
        live.turn();
        let sleep = live.sleep();
        drop(live);
        crate::net::wait_readable(&[completions, wake.as_raw_fd()], sleep);
        wake.drain();
        if let Some(live) = service.upgrade() {
            live.completions.take_queued_events();
        }
    }
}

/// The sender's GID from a received GRH area: an IPv6 header, or for IPv4
/// twenty zeros and an IPv4 header (`grh_area`).
fn source_gid(grh: &[u8]) -> Gid {
    let ip = if grh[0] >> 4 == 6 {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&grh[8..24]);
        IpAddr::V6(Ipv6Addr::from(octets))
    } else {
        IpAddr::V4(Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]))
    };
    Gid::from_ip(ip)
}
