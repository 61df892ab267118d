//! Contexts (`ibv_context`): an open device, its engine and its counters.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use super::device::Device;
use super::error::{Error, Result};
use super::stats::Publisher;
use super::{CompletionChannel, CompletionQueue, ProtectionDomain};
use crate::capture::LiveCapture;
use crate::engine::threaded::{lock, ChannelShared, CqShared, Engine, EngineShared};
use crate::engine::{EngineCpus, EventFd};
use crate::net::share::{Member, ShareHandle};
use crate::net::{LinkStats, UdpLink};
use crate::trace::Tracer;
use crate::transport::{AsyncEvent, Counters};
use crate::wire::ROCE_UDP_PORT;

/// How a context runs its engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextOptions {
    /// UDP port of the RoCE link (4791; tests choose free ones).
    pub port: u16,
    /// Application threads in [`CompletionQueue::wait_one`] or
    /// [`CompletionChannel::get_event`] poll instead of sleeping: lowest
    /// latency, a core spent per waiting thread. (The engine thread sleeps
    /// when idle either way.)
    pub busy_poll: bool,
    /// Send every this many packets with a broken ICRC (0: never), to test
    /// that peers drop them ([`UdpLink::corrupt_icrc_every`]).
    pub corrupt_icrc_every: u32,
    /// Bytes of socket buffer each way to ask for, if not the UDP link's
    /// 8 MiB ([`UdpLink::socket_buffer`]).
    pub socket_buffer: Option<usize>,
    /// Keep the device's and QPs' counters in a file `softroce stat` reads
    /// from other processes, rewritten five times a second (on by default,
    /// as kernel rxe's hw_counters always are).
    pub publish_counters: bool,
    /// Record every packet the device sends and receives into a pcap file.
    pub capture: Option<CaptureOptions>,
    /// Trace the program's calls on this device and the packets they cause
    /// into this file, appending ([`crate::trace`]); without it, into the
    /// file `SOFTROCE_TRACE` names, if any.
    pub trace: Option<std::path::PathBuf>,
    /// Where the engine thread runs; without it, where
    /// `SOFTROCE_ENGINE_CPUS` says ([`EngineCpus::from_env`]).
    pub engine_cpus: Option<EngineCpus>,
}

/// Where a device records its packets: one RoCE packet per record, each
/// with the IP and UDP headers it has on the wire (GSO trains cut into
/// their packets, IPv4 IDs as sent or as recovered from received ICRCs),
/// readable by `softroce dump`, Wireshark and tshark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureOptions {
    /// The pcap file, created or truncated.
    pub path: std::path::PathBuf,
    /// Packets to record at most; the capture stops there, the traffic not.
    pub max_packets: u64,
}

impl CaptureOptions {
    /// A million packets: a few GB at most at MTU 4096.
    pub const DEFAULT_MAX_PACKETS: u64 = 1_000_000;

    /// A capture into `path` of at most [`CaptureOptions::DEFAULT_MAX_PACKETS`].
    pub fn new(path: impl Into<std::path::PathBuf>) -> CaptureOptions {
        CaptureOptions { path: path.into(), max_packets: Self::DEFAULT_MAX_PACKETS }
    }
}

impl Default for ContextOptions {
    fn default() -> ContextOptions {
        ContextOptions {
            port: ROCE_UDP_PORT,
            busy_poll: false,
            corrupt_icrc_every: 0,
            socket_buffer: None,
            publish_counters: true,
            capture: None,
            trace: None,
            engine_cpus: None,
        }
    }
}

/// What every object of a context shares: the device and its engine.
#[derive(Debug)]
pub(super) struct ContextInner {
    /// Keeps the counters file of `softroce stat` current; declared first
    /// so that it stops (and removes the file) before the engine does.
    _publisher: Option<Publisher>,
    pub(super) device: Device,
    pub(super) engine: Engine,
    /// Where calls on this device are traced, if anywhere.
    pub(crate) trace: Option<Tracer>,
    /// This context's QPNs are `qpn_base | n`, `n` counted from a random
    /// start: the base is its slot on the shared port, which steers their
    /// packets here.
    qpn_base: u32,
    /// The context's place on the shared port.
    share: Option<ShareHandle>,
    next_qpn: AtomicU32,
    next_id: AtomicU32,
}

impl ContextInner {
    /// A QPN of this context's slot that `taken` does not hold.
    pub(super) fn qpn(&self, taken: impl Fn(u32) -> bool) -> Result<u32> {
        for _ in 0..=0xffff {
            let qpn = self.qpn_base | (self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xffff);
            if !taken(qpn) {
                return Ok(qpn);
            }
        }
        Err(Error::Limit { what: "QPs of one context", max: 0x1_0000 })
    }

    /// A number that names a PD, CQ or SRQ of this context.
    pub(super) fn id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// Every context the process opened, while it is open, with the process
/// that opened it: those [`crate::settle_before_exit`] settles.
static OPEN: Mutex<Vec<(u32, Weak<ContextInner>)>> = Mutex::new(Vec::new());

/// The contexts this process opened and has open. A child of `fork` has
/// its parent's too, whose sockets it shares and whose engine threads it
/// does not have: they are the parent's to settle.
pub(crate) fn open_contexts() -> Vec<Context> {
    let mut open = lock(&OPEN);
    open.retain(|(_, inner)| inner.strong_count() > 0);
    let here = std::process::id();
    open.iter()
        .filter(|(pid, _)| *pid == here)
        .filter_map(|(_, inner)| inner.upgrade())
        .map(|inner| Context { inner })
        .collect()
}

/// An open device (`ibv_context`): its engine thread runs while any object
/// of the context lives.
#[derive(Debug, Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl Context {
    /// Opens `device`: binds its addresses on the RoCE port and starts its
    /// engine.
    pub fn open(device: &Device, options: ContextOptions) -> Result<Context> {
        let engine_cpus = match options.engine_cpus {
            Some(cpus) => cpus,
            None => EngineCpus::from_env().map_err(Error::InvalidArgument)?,
        };
        let mut link = UdpLink::new(options.port);
        link.corrupt_icrc_every(options.corrupt_icrc_every);
        if let Some(bytes) = options.socket_buffer {
            link.socket_buffer(bytes);
        }
        let mut recording = match &options.capture {
            Some(capture) => Some(LiveCapture::create(&capture.path, capture.max_packets).map_err(|e| {
                Error::Io(std::io::Error::new(e.kind(), format!("capture to {}: {e}", capture.path.display())))
            })?),
            None => None,
        };
        let trace =
            match &options.trace {
                Some(path) => Some(Tracer::open(path, device.name()).map_err(|e| {
                    Error::Io(std::io::Error::new(e.kind(), format!("trace to {}: {e}", path.display())))
                })?),
                None => Tracer::from_env(device.name()),
            };
        let addrs: Vec<_> = device.addresses().collect();
        if let Some(trace) = &trace {
            trace.device(&addrs);
            recording.get_or_insert_with(LiveCapture::default).trace(trace.clone());
        }
        if let Some(recording) = recording {
            link.capture(recording);
        }
        // The port is shared with the user's other processes on this host,
        // as kernel rxe shares a device (rxe-spec N-1).
        let slot = link.join(&addrs)?;
        let share = link.member().map(Member::handle);
        let engine = Engine::start(link, options.busy_poll, engine_cpus, device.name())?;
        let source = CounterSource { shared: Arc::clone(&engine.shared), device: device.name().to_owned() };
        let publisher = options.publish_counters.then(|| Publisher::start(source)).flatten();
        let inner = ContextInner {
            _publisher: publisher,
            device: device.clone(),
            engine,
            trace,
            qpn_base: u32::from(slot) << 16,
            share,
            next_qpn: AtomicU32::new(crate::random_u32()),
            next_id: AtomicU32::new(1),
        };
        let inner = Arc::new(inner);
        let mut open = lock(&OPEN);
        open.retain(|(_, inner)| inner.strong_count() > 0);
        open.push((std::process::id(), Arc::downgrade(&inner)));
        drop(open);
        Ok(Context { inner })
    }

    /// A reference that does not keep the context open: registries of the
    /// process's contexts (`cm::context_for`) hold these.
    pub(crate) fn downgrade(&self) -> WeakContext {
        WeakContext(Arc::downgrade(&self.inner))
    }

    /// Whether both are the same open context (clones of one `Context::open`).
    pub fn same_as(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(super) fn inner(&self) -> &Arc<ContextInner> {
        &self.inner
    }

    /// Where calls on this context are traced, if they are.
    pub fn tracer(&self) -> Option<&Tracer> {
        self.inner.trace.as_ref()
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// `ibv_alloc_pd`: a new protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let pd = ProtectionDomain::new(Arc::clone(&self.inner));
        if let Some(trace) = &self.inner.trace {
            trace.call("ibv_alloc_pd", format_args!("pd={} -> ok", pd.id()));
        }
        Ok(pd)
    }

    /// A completion queue of `cqe` entries; completions beyond that are lost
    /// and the queue reports overflow, as a CQ overrun does.
    pub fn create_cq(&self, cqe: usize, channel: Option<&CompletionChannel>) -> Result<CompletionQueue> {
        let max_cqe = self.inner.device.query_device().max_cqe;
        if cqe == 0 || cqe > max_cqe as usize {
            return Err(Error::Limit { what: "cqe", max: u64::from(max_cqe) });
        }
        let shared = CqShared::new(self.inner.id(), cqe, channel.map(|c| Arc::clone(&c.shared)));
        if let Some(trace) = &self.inner.trace {
            trace.call("ibv_create_cq", format_args!("cq={} cqe={cqe} -> ok", shared.id));
        }
        Ok(CompletionQueue { ctx: Arc::clone(&self.inner), shared: Arc::new(shared) })
    }

    /// `ibv_create_comp_channel`: a channel CQs can signal completion events on.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        let shared = ChannelShared { fd: EventFd::counting()?, events: crossbeam_channel::unbounded() };
        Ok(CompletionChannel { ctx: Arc::clone(&self.inner), shared: Arc::new(shared) })
    }

    /// The next asynchronous event (`ibv_get_async_event`, without blocking).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        let event = self.inner.engine.shared.events.pop();
        if let (Some(trace), Some(event)) = (&self.inner.trace, &event) {
            // A QP the transport moved to ERR by itself says so here.
            trace.call("ibv_get_async_event", format_args!("-> {event:?}"));
        }
        event
    }

    /// A descriptor that is readable while asynchronous events wait
    /// (libibverbs' `async_fd`), for `poll` and event loops.
    pub fn async_event_fd(&self) -> RawFd {
        self.inner.engine.shared.events.fd().expect("a started engine has an event descriptor")
    }

    /// This context's slot on its shared port: the top byte of its QPNs,
    /// which a CM built on it also gives its Comm IDs and SIDR Request IDs
    /// so that answers reach it (rxe-spec N-5).
    pub fn slot(&self) -> u8 {
        self.inner.share.as_ref().map_or(0, ShareHandle::slot)
    }

    /// Steers connection requests (CM REQ and SIDR_REQ) for an rdma_cm
    /// `service` (port space << 16 | port) that reach any process sharing
    /// the port to this context's GSI QP.
    pub fn listen_cm(&self, service: u32) -> Result<()> {
        let share = self.inner.share.as_ref().ok_or_else(|| Error::InvalidArgument("no shared port".into()))?;
        Ok(share.listen(service)?)
    }

    /// Stops [`Context::listen_cm`] for `service`.
    pub fn unlisten_cm(&self, service: u32) -> Result<()> {
        let share = self.inner.share.as_ref().ok_or_else(|| Error::InvalidArgument("no shared port".into()))?;
        Ok(share.unlisten(service)?)
    }

    /// Whether this process opened it, rather than the parent it was forked from.
    pub(crate) fn opened_here(&self) -> bool {
        lock(&OPEN).iter().any(|(pid, inner)| *pid == std::process::id() && inner.as_ptr() == Arc::as_ptr(&self.inner))
    }

    /// Sends what the device owes its peers before the program lets it go
    /// or exits — the ACKs, responses and CM messages queued, then, for a
    /// short while, answers to the resends of peers whose last answer was
    /// lost — and returns by `deadline` (rxe-spec T-33). Closing a context
    /// or exiting does not wait for this by itself: the C library calls it
    /// from `ibv_close_device` and at exit ([`crate::settle_before_exit`]).
    pub fn settle(&self, deadline: Instant) {
        self.inner.engine.settle(deadline);
    }

    /// Device-wide counters, like rxe's hw_counters: the sum over every QP
    /// (destroyed ones included) plus the link's.
    pub fn counters(&self) -> DeviceCounters {
        device_counters(&self.inner.engine.shared)
    }

    /// Each live QP's number and counters, like `rdma statistic qp`.
    pub fn qp_counters(&self) -> Vec<(u32, Counters)> {
        qp_counters(&self.inner.engine.shared)
    }
}

/// A context that may have been closed since: [`WeakContext::upgrade`]
/// gives it back while any handle keeps it open.
#[derive(Debug, Clone)]
pub(crate) struct WeakContext(Weak<ContextInner>);

impl WeakContext {
    /// The context, if something still holds it open.
    pub(crate) fn upgrade(&self) -> Option<Context> {
        self.0.upgrade().map(|inner| Context { inner })
    }
}

fn device_counters(shared: &EngineShared) -> DeviceCounters {
    // The QP map's lock is held while reading the retired totals too, so
    // a QP being destroyed is counted exactly once.
    let qps = lock(&shared.qps);
    let mut qp_totals = *lock(&shared.retired);
    for cell in qps.values() {
        add_counters(&mut qp_totals, lock(&cell.qp).counters());
    }
    drop(qps);
    let link = shared.link_stats.read();
    DeviceCounters {
        qp: qp_totals,
        link,
        malformed: shared.malformed.load(Ordering::Relaxed),
        unknown_qp: shared.unknown_qp.load(Ordering::Relaxed) + link.ownerless,
        sleeps: shared.sleeps.load(Ordering::Relaxed),
        contended_yields: shared.contended_yields.load(Ordering::Relaxed),
    }
}

fn qp_counters(shared: &EngineShared) -> Vec<(u32, Counters)> {
    let mut all = Vec::new();
    qp_counters_into(shared, &mut all);
    all
}

fn qp_counters_into(shared: &EngineShared, out: &mut Vec<(u32, Counters)>) {
    out.clear();
    out.extend(lock(&shared.qps).iter().map(|(&qpn, cell)| (qpn, *lock(&cell.qp).counters())));
}

/// What a context's counters publisher reads, without owning the context:
/// the engine's shared state outlives neither the context nor the thread.
#[derive(Debug, Clone)]
pub(super) struct CounterSource {
    shared: Arc<EngineShared>,
    pub(super) device: String,
}

impl CounterSource {
    pub(super) fn device_counters(&self) -> DeviceCounters {
        device_counters(&self.shared)
    }

    /// Each live QP's counters into `out`, whose capacity is reused.
    pub(super) fn qp_counters_into(&self, out: &mut Vec<(u32, Counters)>) {
        qp_counters_into(&self.shared, out)
    }
}

/// Counters of a device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Sums of the QP counters, over every QP the context has had.
    pub qp: Counters,
    /// The UDP link's packet and error counts.
    pub link: LinkStats,
    /// Packets with a good ICRC that are not valid RoCE (an unknown opcode,
    /// a bad pad count, headers cut short…), dropped.
    pub malformed: u64,
    /// Packets for a QP number the device does not have (never created, or
    /// destroyed; or of a slot on the shared port no process holds), dropped.
    pub unknown_qp: u64,
    /// Times a thread driving the device's progress (its engine thread, or
    /// an application thread waiting for a completion) went to sleep for
    /// want of packets. Each costs a wake-up: a few µs, or 30–70 µs on a VM
    /// whose CPU went idle meanwhile.
    pub sleeps: u64,
    /// Times the engine thread, polling after its last packet, yielded its
    /// CPU and got it back more than 200 µs later: the CPUs are taken by
    /// threads that spin, and it then sleeps at once when idle for 100 ms
    /// (rxe-spec T-35), each gap between packets a sleep.
    pub contended_yields: u64,
}

pub(super) fn add_counters(total: &mut Counters, c: &Counters) {
    total.sent_packets += c.sent_packets;
    total.received_packets += c.received_packets;
    total.retries += c.retries;
    total.timeouts += c.timeouts;
    total.rnr_naks_received += c.rnr_naks_received;
    total.rnr_naks_sent += c.rnr_naks_sent;
    total.seq_naks_received += c.seq_naks_received;
    total.seq_naks_sent += c.seq_naks_sent;
    total.duplicate_requests += c.duplicate_requests;
    total.fatal_naks_sent.add(&c.fatal_naks_sent);
    total.fatal_naks_received.add(&c.fatal_naks_received);
    total.dropped += c.dropped;
}
