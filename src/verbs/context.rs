//! The verbs object model: contexts, protection domains, memory regions,
//! completion queues and channels, queue pairs, SRQs and address handles,
//! as libibverbs has them.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memmap2::MmapMut;

use super::device::Device;
use super::error::{Error, Result};
use super::gid::Gid;
use crate::engine::threaded::{lock, Arm, ChannelShared, CqShared, Engine, QpCell};
use crate::engine::{EventFd, RawRegion};
use crate::net::{LinkStats, UdpLink};
use crate::transport::{
    Access, AsyncEvent, AttrMask, Counters, Mtu, Qp, QpAttr, QpCap, QpState, QpType, RecvWr, SendWr, Sge, Srq, UdDest,
    WorkCompletion,
};
use crate::wire::{Psn, ROCE_UDP_PORT};

/// How a context runs its engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl Default for ContextOptions {
    fn default() -> ContextOptions {
        ContextOptions { port: ROCE_UDP_PORT, busy_poll: false, corrupt_icrc_every: 0, socket_buffer: None }
    }
}

/// A 32-bit value from the kernel's CSPRNG: keys and initial PSNs must not be
/// guessable by an off-path attacker (ReDMArk, USENIX Security 2021).
pub(crate) fn random_u32() -> u32 {
    let mut v = [0u8; 4];
    let mut filled = 0;
    while filled < 4 {
        // SAFETY: writes at most the remaining bytes of `v`.
        let n = unsafe { libc::getrandom(v[filled..].as_mut_ptr().cast(), 4 - filled, 0) };
        if n > 0 {
            filled += n as usize;
        }
    }
    u32::from_ne_bytes(v)
}

#[derive(Debug)]
struct ContextInner {
    device: Device,
    engine: Engine,
    next_qpn: AtomicU32,
    next_id: AtomicU32,
}

impl ContextInner {
    fn id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
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
        let mut link = UdpLink::new(options.port);
        link.corrupt_icrc_every(options.corrupt_icrc_every);
        if let Some(bytes) = options.socket_buffer {
            link.socket_buffer(bytes);
        }
        for addr in device.addresses() {
            link.bind(addr).map_err(|e| {
                Error::Io(std::io::Error::new(e.kind(), format!("bind {addr} port {}: {e}", options.port)))
            })?;
        }
        let engine = Engine::start(link, options.busy_poll, device.name())?;
        let port = device.query_port(1)?;
        if port.state == super::device::PortState::Active {
            lock(&engine.shared.events).push_back(AsyncEvent::PortActive { port: 1 });
        }
        let inner =
            ContextInner { device: device.clone(), engine, next_qpn: AtomicU32::new(0x11), next_id: AtomicU32::new(1) };
        Ok(Context { inner: Arc::new(inner) })
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// `ibv_alloc_pd`: a new protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        Ok(ProtectionDomain { ctx: Arc::clone(&self.inner), pd: self.inner.id() })
    }

    /// A completion queue of `cqe` entries; completions beyond that are lost
    /// and the queue reports overflow, as a CQ overrun does.
    pub fn create_cq(&self, cqe: usize, channel: Option<&CompletionChannel>) -> Result<CompletionQueue> {
        let max_cqe = self.inner.device.query_device().max_cqe;
        if cqe == 0 || cqe > max_cqe as usize {
            return Err(Error::Limit { what: "cqe", max: u64::from(max_cqe) });
        }
        let shared = CqShared {
            id: self.inner.id(),
            entries: crossbeam_channel::bounded(cqe),
            arm: AtomicU8::new(Arm::Off as u8),
            overflowed: Default::default(),
            channel: channel.map(|c| Arc::clone(&c.shared)),
            destroyed: Default::default(),
        };
        Ok(CompletionQueue { ctx: Arc::clone(&self.inner), shared: Arc::new(shared) })
    }

    /// `ibv_create_comp_channel`: a channel CQs can signal completion events on.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        let shared = ChannelShared { fd: EventFd::new()?, events: crossbeam_channel::unbounded() };
        Ok(CompletionChannel { ctx: Arc::clone(&self.inner), shared: Arc::new(shared) })
    }

    /// The next asynchronous event (`ibv_get_async_event`, without blocking).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        lock(&self.inner.engine.shared.events).pop_front()
    }

    /// Device-wide counters, like rxe's hw_counters: the sum over every QP
    /// (destroyed ones included) plus the link's.
    pub fn counters(&self) -> DeviceCounters {
        let shared = &self.inner.engine.shared;
        // The QP map's lock is held while reading the retired totals too, so
        // a QP being destroyed is counted exactly once.
        let qps = lock(&shared.qps);
        let mut qp_totals = *lock(&shared.retired);
        for cell in qps.values() {
            add_counters(&mut qp_totals, lock(&cell.qp).counters());
        }
        drop(qps);
        DeviceCounters {
            qp: qp_totals,
            link: *lock(&shared.link_stats),
            malformed: shared.malformed.load(Ordering::Relaxed),
            unknown_qp: shared.unknown_qp.load(Ordering::Relaxed),
            sleeps: shared.sleeps.load(Ordering::Relaxed),
        }
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
    /// destroyed), dropped.
    pub unknown_qp: u64,
    /// Times a thread driving the device's progress (its engine thread, or
    /// an application thread waiting for a completion) went to sleep for
    /// want of packets. Each costs a wake-up: a few µs, or 30–70 µs on a VM
    /// whose CPU went idle meanwhile.
    pub sleeps: u64,
}

fn add_counters(total: &mut Counters, c: &Counters) {
    total.sent_packets += c.sent_packets;
    total.received_packets += c.received_packets;
    total.retries += c.retries;
    total.timeouts += c.timeouts;
    total.rnr_naks_received += c.rnr_naks_received;
    total.rnr_naks_sent += c.rnr_naks_sent;
    total.seq_naks_received += c.seq_naks_received;
    total.seq_naks_sent += c.seq_naks_sent;
    total.duplicate_requests += c.duplicate_requests;
    total.dropped += c.dropped;
}

/// A protection domain (`ibv_pd`).
#[derive(Debug)]
pub struct ProtectionDomain {
    ctx: Arc<ContextInner>,
    pd: u32,
}

impl ProtectionDomain {
    /// Allocates `len` zeroed, page-aligned bytes and registers them.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        if len == 0 {
            return Err(Error::InvalidArgument("memory region length 0".into()));
        }
        let mut map = MmapMut::map_anon(len)?;
        let base = map.as_mut_ptr();
        // SAFETY: the mapping lives in the MemoryRegion, which deregisters
        // before unmapping.
        let mut mr = unsafe { self.reg_mr(base, len, access)? };
        mr.map = Some(map);
        Ok(mr)
    }

    /// Registers `len` bytes at `ptr` (`ibv_reg_mr`); their address is the VA
    /// peers use.
    ///
    /// # Safety
    /// The memory must stay valid until the returned region is dropped, and
    /// the caller must accept that the engine and remote peers read and write
    /// it at any time, as an RDMA NIC would: access it only through raw
    /// pointers or the region's copy methods, never through `&`/`&mut`
    /// references that assume nobody else writes.
    pub unsafe fn reg_mr(&self, ptr: *mut u8, len: usize, access: Access) -> Result<MemoryRegion> {
        if ptr.is_null() || len == 0 {
            return Err(Error::InvalidArgument("null or empty memory region".into()));
        }
        // libibverbs: remote write or atomic rights need local write.
        let remote_writes = access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
        if remote_writes && !access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument("REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE".into()));
        }
        let mut registry = self.ctx.engine.shared.registry.write().unwrap_or_else(|e| e.into_inner());
        let key = loop {
            let k = random_u32();
            if k != 0 && !registry.contains(k) {
                break k;
            }
        };
        let iova = ptr as u64;
        // SAFETY: the caller promised the range stays valid until the region
        // is dropped, and `MemoryRegion::drop` removes the key first.
        unsafe { registry.insert(key, RawRegion { base: ptr, len, iova, pd: self.pd, access }) };
        Ok(MemoryRegion { ctx: Arc::clone(&self.ctx), key, base: ptr, len, map: None })
    }

    /// `ibv_create_qp`: a QP in RESET, with a random first PSN. Its CQs and SRQ
    /// must belong to this context.
    pub fn create_qp(&self, init: &QpInit<'_>) -> Result<QueuePair> {
        let ours = |ctx: &Arc<ContextInner>| Arc::ptr_eq(ctx, &self.ctx);
        if !ours(&init.send_cq.ctx) || !ours(&init.recv_cq.ctx) || init.srq.is_some_and(|s| !ours(&s.ctx)) {
            return Err(Error::InvalidArgument("CQ or SRQ of another context".into()));
        }
        let limits = self.ctx.device.query_device();
        let cap = init.cap;
        for (what, value, max) in [
            ("max_send_wr", cap.max_send_wr, limits.max_qp_wr),
            ("max_recv_wr", cap.max_recv_wr, limits.max_qp_wr),
            ("max_send_sge", cap.max_send_sge, limits.max_sge),
            ("max_recv_sge", cap.max_recv_sge, limits.max_sge),
            ("max_inline_data", cap.max_inline_data, limits.max_inline_data),
        ] {
            if value > max {
                return Err(Error::Limit { what, max: max.into() });
            }
        }
        let qpn = self.ctx.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        let mut qp = Qp::new(qpn, init.qp_type, self.pd, init.cap, init.srq.map(|s| s.id));
        qp.set_peer_buffer(self.ctx.engine.shared.receive_buffer);
        if init.qp_type == QpType::Ud {
            // UD has no path MTU attribute: it uses the port's, as rxe does.
            qp.set_ud_mtu(self.ctx.device.active_mtu());
        }
        let cell = Arc::new(QpCell {
            qp: Mutex::new(qp),
            send_cq: Arc::clone(&init.send_cq.shared),
            recv_cq: Arc::clone(&init.recv_cq.shared),
            srq: init.srq.map(|s| Arc::clone(&s.srq)),
        });
        let shared = &self.ctx.engine.shared;
        lock(&shared.qps).insert(qpn, Arc::clone(&cell));
        shared.qps_version.fetch_add(1, Ordering::Release);
        let psn = Psn::new(random_u32());
        Ok(QueuePair { ctx: Arc::clone(&self.ctx), cell, qpn, psn, sig_all: init.sq_sig_all })
    }

    /// `ibv_create_srq`: an SRQ of `max_wr` receives of up to `max_sge` SGEs,
    /// within the device's limits.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<SharedReceiveQueue> {
        let limits = self.ctx.device.query_device();
        if max_wr == 0 || max_wr > limits.max_srq_wr {
            return Err(Error::Limit { what: "max_wr", max: limits.max_srq_wr.into() });
        }
        if max_sge > limits.max_srq_sge {
            return Err(Error::Limit { what: "max_sge", max: limits.max_srq_sge.into() });
        }
        let id = self.ctx.id();
        let srq = Arc::new(Mutex::new(Srq::new(id, max_wr, max_sge)));
        Ok(SharedReceiveQueue { ctx: Arc::clone(&self.ctx), srq, id })
    }

    /// An address handle for UD sends to `gid`.
    pub fn create_ah(&self, gid: Gid) -> AddressHandle {
        AddressHandle { dest: gid.to_ip() }
    }
}

/// A registered memory region (`ibv_mr`). The bytes are shared with the
/// engine and with remote peers, so they are reached only by copying.
#[derive(Debug)]
pub struct MemoryRegion {
    ctx: Arc<ContextInner>,
    key: u32,
    base: *mut u8,
    len: usize,
    map: Option<MmapMut>,
}

// SAFETY: the region is a raw byte range shared with the engine by design;
// every access copies through raw pointers.
unsafe impl Send for MemoryRegion {}
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// The local key, for SGEs. The same number as the R_Key, as in rxe.
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The remote key a peer names the region by in READs, WRITEs and atomics.
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// The virtual address of the first byte, as peers address it.
    pub fn addr(&self) -> u64 {
        self.base as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes (never: empty regions are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather element for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge { addr: self.addr() + offset as u64, length: len as u32, lkey: self.key }
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "bytes {offset}..{} outside a {}-byte memory region",
                offset.saturating_add(len),
                self.len
            ))),
        }
    }

    /// Copies bytes out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: in bounds of the registered range, which lives as long as self.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies bytes into the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset), data.len()) };
        Ok(())
    }

    /// Reads a 64-bit word atomically (the target of remote atomics).
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        self.check(offset, 8)?;
        // SAFETY: in bounds; alignment checked first.
        let ptr = unsafe { self.base.add(offset) };
        if !(ptr as usize).is_multiple_of(8) {
            return Err(Error::InvalidArgument(format!("offset {offset} is not 8-byte aligned")));
        }
        let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(ptr.cast()) };
        Ok(word.load(Ordering::SeqCst))
    }
}

impl MemoryRegion {
    /// What a peer needs to READ, WRITE or run atomics on this region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.addr(), rkey: self.rkey(), len: self.len as u64 }
    }
}

/// A region as a peer addresses it: VA, R_Key and length. 20 bytes on the
/// wire (big-endian), for out-of-band exchange next to an [`Endpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Virtual address of the first byte, as the peer addresses it.
    pub addr: u64,
    /// R_Key of the region.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteRegion {
    /// Bytes of [`RemoteRegion::to_bytes`].
    pub const LEN: usize = 20;

    /// Address, R_Key and length, big-endian.
    pub fn to_bytes(&self) -> [u8; RemoteRegion::LEN] {
        let mut b = [0u8; RemoteRegion::LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Reads what [`RemoteRegion::to_bytes`] wrote.
    pub fn from_bytes(b: &[u8; RemoteRegion::LEN]) -> RemoteRegion {
        let word = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        RemoteRegion { addr: word(0), rkey: u32::from_be_bytes([b[8], b[9], b[10], b[11]]), len: word(12) }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Deregister first: the engine holds the registry lock for each
        // access, so once this returns nothing touches the memory.
        let shared = &self.ctx.engine.shared;
        shared.registry.write().unwrap_or_else(|e| e.into_inner()).remove(self.key);
        drop(self.map.take());
    }
}

/// A completion queue (`ibv_cq`).
#[derive(Debug)]
pub struct CompletionQueue {
    ctx: Arc<ContextInner>,
    shared: Arc<CqShared>,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // QPs may still point at the queue: from now on nothing reaches it
        // and no event fires for it.
        self.shared.destroyed.store(true, Ordering::Release);
        self.shared.arm.store(Arm::Off as u8, Ordering::Release);
        while self.shared.entries.1.try_recv().is_ok() {}
    }
}

impl CompletionQueue {
    /// Moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if self.shared.entries.1.is_empty() {
            self.ctx.engine.poll_progress(&self.shared);
        }
        let mut n = 0;
        while n < out.len() {
            match self.shared.entries.1.try_recv() {
                Ok(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }

    /// The next completion, if one is queued.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        if self.shared.entries.1.is_empty() {
            self.ctx.engine.poll_progress(&self.shared);
        }
        self.shared.entries.1.try_recv().ok()
    }

    /// Waits up to `timeout` for a completion (blocking mode).
    pub fn wait_one(&self, timeout: Duration) -> Option<WorkCompletion> {
        self.ctx.engine.wait_completion(&self.shared, timeout)
    }

    /// `ibv_req_notify_cq`: the next completion (or, with `solicited_only`,
    /// the next solicited or failed one) raises one event on the channel.
    pub fn req_notify(&self, solicited_only: bool) {
        // As in libibverbs, completions already queued raise no event: poll
        // after arming to catch them.
        let arm = if solicited_only { Arm::Solicited } else { Arm::Next };
        self.shared.arm.store(arm as u8, Ordering::Release);
    }

    /// Completions were lost because the queue was full.
    pub fn overflowed(&self) -> bool {
        self.shared.overflowed.load(Ordering::Relaxed)
    }

    /// Identifies this CQ in channel events.
    pub fn id(&self) -> u32 {
        self.shared.id
    }
}

/// A completion channel (`ibv_comp_channel`): its file descriptor is
/// readable while events wait, so it works with poll, epoll and async runtimes.
#[derive(Debug)]
pub struct CompletionChannel {
    ctx: Arc<ContextInner>,
    shared: Arc<ChannelShared>,
}

impl CompletionChannel {
    /// The next event: the id of the CQ that fired. Waits up to `timeout`.
    pub fn get_event(&self, timeout: Duration) -> Option<u32> {
        let events = &self.shared.events.1;
        if events.is_empty() {
            // Drives progress meanwhile, if nobody else does.
            self.ctx.engine.wait_event(&self.shared, timeout);
        }
        // Drain before taking an event and signal again while more wait, so
        // the descriptor is readable exactly while events wait.
        self.shared.fd.drain();
        let id = events.try_recv().ok();
        if !events.is_empty() {
            self.shared.fd.signal();
        }
        id
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.fd.as_raw_fd()
    }
}

/// What a QP is created with (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct QpInit<'a> {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// The CQ for completions of send work requests.
    pub send_cq: &'a CompletionQueue,
    /// The CQ for completions of receive work requests (it may be `send_cq`).
    pub recv_cq: &'a CompletionQueue,
    /// The SRQ to take receives from instead of the QP's own receive queue.
    pub srq: Option<&'a SharedReceiveQueue>,
    /// Queue capacities.
    pub cap: QpCap,
    /// Every send completes, signaled flag or not.
    pub sq_sig_all: bool,
}

/// A queue pair (`ibv_qp`).
#[derive(Debug)]
pub struct QueuePair {
    ctx: Arc<ContextInner>,
    cell: Arc<QpCell>,
    qpn: u32,
    /// The first PSN this QP sends with, chosen at random when it was created.
    psn: Psn,
    sig_all: bool,
}

impl QueuePair {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        lock(&self.cell.qp).state()
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        lock(&self.cell.qp).modify(attr, mask)?;
        self.ctx.engine.shared.ring();
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> QpAttr {
        *lock(&self.cell.qp).attr()
    }

    /// `ibv_post_send`: nothing is queued if it fails.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        self.post_send_list([wr]).map_err(|(_, e)| e)
    }

    /// `ibv_post_send` with a list of work requests: posts them in order
    /// under one lock and sends their packets in one batch, where a post
    /// one by one costs one each. Stops at the first the QP refuses and
    /// returns its index with the error (libibverbs' `bad_wr`); those before
    /// it stay posted, as with `ibv_post_send`.
    pub fn post_send_list(&self, wrs: impl IntoIterator<Item = SendWr>) -> std::result::Result<(), (usize, Error)> {
        let mut qp = lock(&self.cell.qp);
        let mut refused = None;
        let mut posted = 0;
        for (index, mut wr) in wrs.into_iter().enumerate() {
            if self.sig_all {
                wr.flags.signaled = true;
            }
            if let Err(e) = qp.post_send(wr) {
                refused = Some((index, e.into()));
                break;
            }
            posted += 1;
        }
        // A request posted in ERR is flushed at once: hand it to the CQ now,
        // and whatever else the QP holds to the CQ it belongs to.
        self.cell.drain(&mut qp, &self.ctx.engine.shared.events);
        drop(qp);
        if posted > 0 {
            self.ctx.engine.kick(&self.cell);
        }
        refused.map_or(Ok(()), Err)
    }

    /// `ibv_post_recv`. A receive gives the engine nothing to send, so it
    /// is not woken (a peer that met RNR retries on its own timer).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let mut qp = lock(&self.cell.qp);
        qp.post_recv(wr)?;
        self.cell.drain(&mut qp, &self.ctx.engine.shared.events);
        Ok(())
    }

    /// Capacities the QP was created with.
    pub fn cap(&self) -> QpCap {
        lock(&self.cell.qp).cap()
    }

    /// RESET → INIT with `options`' access rights (or Q_Key, for UD), so
    /// receives can be posted before the peer's endpoint is known, as the
    /// classic examples do; [`QueuePair::connect`] continues from there.
    pub fn init(&self, options: &ConnectOptions) -> Result<()> {
        let attr =
            QpAttr { state: QpState::Init, access_flags: options.access, qkey: options.qkey, ..QpAttr::default() };
        let qp_type = lock(&self.cell.qp).qp_type();
        let (required, _) = crate::transport::attr::transition_masks(qp_type, QpState::Reset, QpState::Init)
            .ok_or(crate::transport::ModifyError::InvalidTransition { from: QpState::Reset, to: QpState::Init })?;
        self.modify(&attr, AttrMask::STATE | required)
    }

    /// What a peer needs to connect to this QP, using GID `gid_index` of the
    /// device.
    pub fn endpoint(&self, gid_index: usize) -> Result<Endpoint> {
        let gids = self.ctx.device.gid_table();
        let gid = *gids
            .get(gid_index)
            .ok_or_else(|| Error::InvalidArgument(format!("GID index {gid_index} (the table has {})", gids.len())))?;
        Ok(Endpoint { qpn: self.qpn, psn: self.psn, gid })
    }

    /// Brings an RC or UC QP from RESET (or INIT, after [`QueuePair::init`])
    /// to RTS, connected to `remote`: the INIT, RTR and RTS steps of
    /// `ibv_rc_pingpong`. For UD, `remote` is ignored and the QP is made ready
    /// to send and receive.
    pub fn connect(&self, remote: &Endpoint, options: &ConnectOptions) -> Result<()> {
        let attr = QpAttr {
            access_flags: options.access,
            qkey: options.qkey,
            dest: Some(remote.gid.to_ip()),
            peer_port: options.peer_port,
            path_mtu: options.mtu.unwrap_or_else(|| self.ctx.device.active_mtu()),
            timeout: options.timeout,
            retry_cnt: options.retry_cnt,
            rnr_retry: options.rnr_retry,
            rq_psn: remote.psn,
            sq_psn: self.psn,
            max_rd_atomic: options.max_rd_atomic,
            max_dest_rd_atomic: options.max_dest_rd_atomic,
            min_rnr_timer: options.min_rnr_timer,
            dest_qpn: remote.qpn,
            ..QpAttr::default()
        };
        lock(&self.cell.qp).connect(&attr)?;
        self.ctx.engine.shared.ring();
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let shared = &self.ctx.engine.shared;
        let mut qps = lock(&shared.qps);
        qps.remove(&self.qpn);
        let mut qp = lock(&self.cell.qp);
        add_counters(&mut lock(&shared.retired), qp.counters());
        // What the QP produced so far goes out. Then, in ERR, it executes and
        // completes nothing more (the flush completions of ERR are dropped:
        // the application destroyed the QP), but the answers it had queued —
        // the ACK of the message just received, say — are still owed to the
        // peer: the engine sends them, then forgets the QP. Kernel rxe's
        // destroy likewise lets its tasks finish.
        self.cell.drain(&mut qp, &shared.events);
        let _ = qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() }, AttrMask::STATE);
        while qp.poll_completion().is_some() {}
        while qp.poll_event().is_some() {}
        drop(qp);
        lock(&shared.closing).push(Arc::clone(&self.cell));
        drop(qps);
        shared.qps_version.fetch_add(1, Ordering::Release);
        // Sent from here if this thread can: a thread that just took the
        // last completion may have left the ACK of its message unsent.
        self.ctx.engine.progress_now();
    }
}

/// Attributes for [`QueuePair::connect`], with `ibv_rc_pingpong`'s defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// `qp_access_flags`: remote operations the QP executes as responder; add
    /// REMOTE_WRITE, REMOTE_READ or REMOTE_ATOMIC to allow them.
    pub access: Access,
    /// Path MTU; the port's active MTU when `None`.
    pub mtu: Option<Mtu>,
    /// Local ACK timeout: 4.096 µs × 2^timeout; 0 waits forever.
    pub timeout: u8,
    /// Transport retries after a timeout or sequence NAK (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code this QP advertises as responder (0..=31).
    pub min_rnr_timer: u8,
    /// READ/atomic requests this QP may have outstanding as requester.
    pub max_rd_atomic: u8,
    /// READ/atomic requests this QP accepts outstanding as responder.
    pub max_dest_rd_atomic: u8,
    /// Q_Key of a UD QP.
    pub qkey: u32,
    /// Accept packets only from this UDP source port of the peer (see
    /// [`QpAttr::peer_port`]); `None` accepts any, as IBTA and rxe do.
    pub peer_port: Option<u16>,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            access: Access::LOCAL_WRITE,
            mtu: None,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            qkey: 0x1111_1111,
            peer_port: None,
        }
    }
}

/// A shared receive queue (`ibv_srq`).
#[derive(Debug)]
pub struct SharedReceiveQueue {
    ctx: Arc<ContextInner>,
    srq: Arc<Mutex<Srq>>,
    id: u32,
}

impl SharedReceiveQueue {
    /// `ibv_post_srq_recv`: queues a receive for any of the SRQ's QPs.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        lock(&self.srq).post(wr)?;
        self.ctx.engine.shared.ring();
        Ok(())
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn arm_limit(&self, limit: u32) {
        lock(&self.srq).arm_limit(limit);
    }

    /// Identifies this SRQ in [`AsyncEvent::SrqLimitReached`].
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// An address handle (`ibv_ah`) for UD sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    dest: IpAddr,
}

impl AddressHandle {
    /// The destination of a UD send through this handle.
    pub fn ud_dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest { dest: self.dest, remote_qpn, remote_qkey }
    }
}

/// What one side tells the other to connect QPs: QP number, first PSN and
/// GID. 24 bytes on the wire (QPN and PSN big-endian, then the GID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The QP number (24 bits).
    pub qpn: u32,
    /// The first PSN the QP sends: the peer's `rq_psn`.
    pub psn: Psn,
    /// The GID of the QP's port: the address the peer sends to.
    pub gid: Gid,
}

impl Endpoint {
    /// Bytes of [`Endpoint::to_bytes`].
    pub const LEN: usize = 24;

    /// QPN and PSN big-endian, then the GID.
    pub fn to_bytes(&self) -> [u8; Endpoint::LEN] {
        let mut b = [0u8; Endpoint::LEN];
        b[..4].copy_from_slice(&self.qpn.to_be_bytes());
        b[4..8].copy_from_slice(&self.psn.value().to_be_bytes());
        b[8..].copy_from_slice(&<[u8; 16]>::from(self.gid));
        b
    }

    /// Reads what [`Endpoint::to_bytes`] wrote; bits above 24 in the QPN and PSN
    /// are dropped.
    pub fn from_bytes(b: &[u8; Endpoint::LEN]) -> Endpoint {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..]);
        Endpoint {
            qpn: u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x00ff_ffff,
            psn: Psn::new(u32::from_be_bytes([b[4], b[5], b[6], b[7]])),
            gid: Gid::from(gid),
        }
    }

    /// Sends ours and reads theirs over a stream (a TCP connection, say):
    /// how Rust RDMA programs usually connect QPs.
    pub fn exchange<S: std::io::Read + std::io::Write>(&self, stream: &mut S) -> std::io::Result<Endpoint> {
        stream.write_all(&self.to_bytes())?;
        stream.flush()?;
        let mut theirs = [0u8; Endpoint::LEN];
        stream.read_exact(&mut theirs)?;
        Ok(Endpoint::from_bytes(&theirs))
    }
}
