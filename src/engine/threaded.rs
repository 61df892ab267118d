//! The progress engine behind a verbs context: the link, and the work of
//! moving packets between it and the QPs, running their timers and
//! delivering completions to completion queues.
//!
//! Progress is driven by whichever thread is there, one at a time (the
//! [`Progress`] state sits behind a mutex; [`Handover`] holds the rules by
//! which the threads take turns):
//! - an application thread that posts sends its QP's packets itself
//!   ([`Engine::kick`]);
//! - one that waits on or polls an empty CQ receives and handles packets
//!   itself until its completion arrives ([`Engine::wait_completion`],
//!   [`Engine::poll_progress`]);
//! - otherwise the engine thread does it, woken by the sockets, its
//!   doorbell (work an application thread could not take on) or a timer.
//!
//! So a message costs one wake-up, the receiver's, as a UDP datagram does,
//! instead of three hand-offs between application and engine threads; and
//! the engine still runs a passive side (a WRITE target) on its own.
//! Completions reach applications through one queue per CQ, whose
//! emptiness a poll reads without a lock.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rustc_hash::FxHashMap;
use tracing::{debug_span, trace};

use super::budget::SendBudget;
use super::clock::Clock;
use super::dispatch::{self, Egress};
use super::eventfd::EventFd;
use super::handover::Handover;
use super::registry::{Registry, RegistryAccess};
use super::tuning::Tuning;
use crate::net::{wait_readable, Link, LinkStats};
use crate::transport::{
    AsyncEvent, Counters, CqKind, Qp, QpState, QpType, Srq, TransmitOrder, WorkCompletion, TRANSMIT_HEADROOM,
};
use crate::wire::{BthRepr, RoceRepr};

/// Locks a mutex, recovering it if a thread panicked while holding it: the
/// state inside stays consistent because every critical section is a single
/// call into the transport.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a CQ wants to be told about new completions (`ibv_req_notify_cq`),
/// as the `u8` of [`CqShared::arm`]: an atomic, since every completion
/// looks at it and almost none finds it armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Arm {
    Off,
    Next,
    Solicited,
}

/// The link's counters as the thread driving progress last published them,
/// for readers on other threads (the device's counters). Every message
/// publishes them, so neither side takes a lock (two locked instructions,
/// each waiting for the payload just copied to leave the store buffer):
/// the one publisher, which holds the progress lock, stores each field
/// relaxed, and a reader may see one field a message newer than another.
#[derive(Debug, Default)]
pub(crate) struct PublishedLinkStats {
    sent: AtomicU64,
    send_batches: AtomicU64,
    lent: AtomicU64,
    received: AtomicU64,
    icrc_errors: AtomicU64,
    malformed: AtomicU64,
    forwarded: AtomicU64,
    forward_dropped: AtomicU64,
    ownerless: AtomicU64,
    corrupted: AtomicU64,
}

impl PublishedLinkStats {
    pub(crate) fn publish(&self, stats: &LinkStats) {
        let LinkStats {
            sent,
            send_batches,
            lent,
            received,
            icrc_errors,
            malformed,
            forwarded,
            forward_dropped,
            ownerless,
            corrupted,
        } = *stats;
        for (field, value) in [
            (&self.sent, sent),
            (&self.send_batches, send_batches),
            (&self.lent, lent),
            (&self.received, received),
            (&self.icrc_errors, icrc_errors),
            (&self.malformed, malformed),
            (&self.forwarded, forwarded),
            (&self.forward_dropped, forward_dropped),
            (&self.ownerless, ownerless),
            (&self.corrupted, corrupted),
        ] {
            field.store(value, Ordering::Relaxed);
        }
    }

    pub(crate) fn read(&self) -> LinkStats {
        let read = |field: &AtomicU64| field.load(Ordering::Relaxed);
        LinkStats {
            sent: read(&self.sent),
            send_batches: read(&self.send_batches),
            lent: read(&self.lent),
            received: read(&self.received),
            icrc_errors: read(&self.icrc_errors),
            malformed: read(&self.malformed),
            forwarded: read(&self.forwarded),
            forward_dropped: read(&self.forward_dropped),
            ownerless: read(&self.ownerless),
            corrupted: read(&self.corrupted),
        }
    }
}

/// A completion channel's shared half.
#[derive(Debug)]
pub(crate) struct ChannelShared {
    pub fd: EventFd,
    pub events: (Sender<u32>, Receiver<u32>),
}

/// A completion queue's entries, oldest first, and how many it holds at most.
#[derive(Debug)]
struct Entries {
    queue: VecDeque<WorkCompletion>,
    capacity: usize,
}

/// A completion queue's shared half.
#[derive(Debug)]
pub(crate) struct CqShared {
    pub id: u32,
    /// Pushes, polls, purges and resizes take turns at the entries.
    entries: Mutex<Entries>,
    /// How many completions are queued, read without the lock: a poll of an
    /// empty CQ, a spinning program's every poll, takes none.
    queued: AtomicUsize,
    /// Threads blocked in [`CqShared::wait_pop`]; a push wakes them only if
    /// there are any (a wake-up is a system call).
    waiters: AtomicUsize,
    pushed: Condvar,
    /// An [`Arm`].
    pub arm: AtomicU8,
    pub overflowed: AtomicBool,
    pub channel: Option<Arc<ChannelShared>>,
    /// The application dropped the CQ: QPs that still point at it deliver nothing.
    pub destroyed: AtomicBool,
}

impl CqShared {
    /// A queue of `capacity` entries, raising its events on `channel`.
    pub fn new(id: u32, capacity: usize, channel: Option<Arc<ChannelShared>>) -> CqShared {
        CqShared {
            id,
            entries: Mutex::new(Entries { queue: VecDeque::new(), capacity }),
            queued: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            pushed: Condvar::new(),
            arm: AtomicU8::new(Arm::Off as u8),
            overflowed: AtomicBool::new(false),
            channel,
            destroyed: AtomicBool::new(false),
        }
    }

    /// Adds a completion and raises the channel event if the CQ is armed for it.
    pub fn push(&self, wc: WorkCompletion) {
        if self.destroyed.load(Ordering::Acquire) {
            return;
        }
        let notable = wc.solicited || wc.status != crate::transport::WcStatus::Success;
        {
            let mut entries = lock(&self.entries);
            if entries.queue.len() >= entries.capacity {
                self.overflowed.store(true, Ordering::Relaxed);
                return;
            }
            entries.queue.push_back(wc);
            self.queued.store(entries.queue.len(), Ordering::Release);
        }
        // A waiter counted itself while holding the lock, before this push
        // took it: it is seen here, or it saw the completion.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.pushed.notify_all();
        }
        let arm = self.arm.load(Ordering::Acquire);
        let fire = arm == Arm::Next as u8 || (arm == Arm::Solicited as u8 && notable);
        // One event per arming, should another thread's completion race this one.
        if fire && self.arm.compare_exchange(arm, Arm::Off as u8, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            if let Some(ch) = &self.channel {
                let _ = ch.events.0.send(self.id);
                ch.fd.signal();
            }
        }
    }

    /// The oldest completion, if any.
    pub fn pop(&self) -> Option<WorkCompletion> {
        if self.is_empty() {
            return None;
        }
        let mut entries = lock(&self.entries);
        let wc = entries.queue.pop_front();
        self.queued.store(entries.queue.len(), Ordering::Release);
        wc
    }

    /// The oldest completion, waiting up to `timeout` for one to be pushed.
    pub fn wait_pop(&self, timeout: Duration) -> Option<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        let mut entries = lock(&self.entries);
        loop {
            if let Some(wc) = entries.queue.pop_front() {
                self.queued.store(entries.queue.len(), Ordering::Release);
                return Some(wc);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.destroyed.load(Ordering::Acquire) {
                return None;
            }
            self.waiters.fetch_add(1, Ordering::SeqCst);
            entries = self.pushed.wait_timeout(entries, left).unwrap_or_else(|e| e.into_inner()).0;
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Whether no completion is queued.
    pub fn is_empty(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }

    /// How many completions are queued.
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// How many completions it holds at most.
    pub fn capacity(&self) -> usize {
        lock(&self.entries).capacity
    }

    /// Drops every queued completion.
    pub fn clear(&self) {
        let mut entries = lock(&self.entries);
        entries.queue.clear();
        self.queued.store(0, Ordering::Release);
    }

    /// Removes the completions of QP `qpn` not yet polled: the QP moved to
    /// RESET, and they name work of its past (rxe-spec V-19).
    pub fn purge_qp(&self, qpn: u32) {
        let mut entries = lock(&self.entries);
        entries.queue.retain(|wc| wc.qp_num != qpn);
        self.queued.store(entries.queue.len(), Ordering::Release);
    }

    /// `ibv_resize_cq`: room for `capacity` completions from now on, with
    /// those queued kept in order; refused (with how many are queued) if
    /// they would not fit.
    pub fn resize(&self, capacity: usize) -> Result<(), usize> {
        let mut entries = lock(&self.entries);
        let queued = entries.queue.len();
        if queued > capacity {
            return Err(queued);
        }
        entries.capacity = capacity;
        Ok(())
    }
}

/// A QP as the engine and the application share it.
#[derive(Debug)]
pub(crate) struct QpCell {
    pub qpn: u32,
    pub qp: Mutex<Qp>,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    pub srq: Option<Arc<Mutex<Srq>>>,
    /// On [`EngineShared::ready`]: the application changed the QP and the
    /// engine has not looked at it since.
    queued: AtomicBool,
    /// What the engine knows of the QP, so that a round touches only the
    /// QPs with something to do (written only by whoever drives progress).
    pub(super) marks: Marks,
}

/// A QP's place in the engine's bookkeeping ([`Progress`]).
#[derive(Debug, Default)]
pub(super) struct Marks {
    /// On the list of QPs the next round visits.
    active: AtomicBool,
    /// It had a timer at its last visit: it waits on its peer.
    waiting: AtomicBool,
    /// The earliest of its entries in the timer heap, in nanoseconds on
    /// the transport's clock (`u64::MAX`: none).
    timer_entry: AtomicU64,
    /// The application destroyed the QP: a round no longer visits it (its
    /// last answers are the lingering list's).
    pub(super) destroyed: AtomicBool,
    /// Bytes of the peer's receive buffer its packets in flight take, as
    /// the device's [`SendBudget`] counts them.
    pub(super) charged: AtomicUsize,
    /// Waiting in the [`SendBudget`]'s line for room.
    pub(super) in_line: AtomicBool,
    /// Its ACK timeouts and sequence NAKs as the [`SendBudget`] last saw them.
    pub(super) losses: AtomicU64,
}

/// The mark's value, replaced by `value`, for marks only the thread that
/// drives progress writes: a load and a store, where a swap would be a
/// locked instruction, which waits until the payload just copied into
/// registered memory has left the store buffer (8% of a WRITE stream's
/// CPU time when every packet received did one).
pub(super) fn replace_bool(mark: &AtomicBool, value: bool) -> bool {
    let old = mark.load(Ordering::Relaxed);
    mark.store(value, Ordering::Relaxed);
    old
}

/// [`replace_bool`] for a count.
pub(super) fn replace_usize(mark: &AtomicUsize, value: usize) -> usize {
    let old = mark.load(Ordering::Relaxed);
    mark.store(value, Ordering::Relaxed);
    old
}

/// [`replace_bool`] for a wide count.
pub(super) fn replace_u64(mark: &AtomicU64, value: u64) -> u64 {
    let old = mark.load(Ordering::Relaxed);
    mark.store(value, Ordering::Relaxed);
    old
}

impl Marks {
    fn timer_entry(&self) -> Option<Duration> {
        let nanos = self.timer_entry.load(Ordering::Relaxed);
        (nanos != u64::MAX).then(|| Duration::from_nanos(nanos))
    }

    fn set_timer_entry(&self, at: Option<Duration>) {
        let nanos = at.map_or(u64::MAX, |at| u64::try_from(at.as_nanos()).unwrap_or(u64::MAX - 1));
        self.timer_entry.store(nanos, Ordering::Relaxed);
    }
}

/// A change to the QP table, for the engine to take in ([`EngineShared::qp_changes`]).
#[derive(Debug)]
pub(crate) enum QpChange {
    Created(Arc<QpCell>),
    Destroyed(Arc<QpCell>),
}

impl QpCell {
    pub(crate) fn new(qp: Qp, send_cq: Arc<CqShared>, recv_cq: Arc<CqShared>, srq: Option<Arc<Mutex<Srq>>>) -> QpCell {
        QpCell {
            qpn: qp.qpn(),
            qp: Mutex::new(qp),
            send_cq,
            recv_cq,
            srq,
            queued: AtomicBool::new(false),
            marks: Marks { timer_entry: AtomicU64::new(u64::MAX), ..Marks::default() },
        }
    }

    /// Moves the QP's completions to its CQs and its events to `events`;
    /// says whether there were any.
    pub(crate) fn drain(&self, qp: &mut Qp, events: &AsyncEvents) -> bool {
        let mut moved = false;
        while let Some((cq, wc)) = qp.poll_completion() {
            moved = true;
            match cq {
                CqKind::Send => self.send_cq.push(wc),
                CqKind::Recv => self.recv_cq.push(wc),
            }
        }
        while let Some(ev) = qp.poll_event() {
            moved = true;
            events.push(ev);
        }
        moved
    }
}

/// A device's asynchronous events, with a descriptor that is readable while
/// any wait (libibverbs' `async_fd`), so a program can sleep in `poll` on it.
#[derive(Debug, Default)]
pub(crate) struct AsyncEvents {
    queue: Mutex<VecDeque<AsyncEvent>>,
    fd: Option<EventFd>,
}

impl AsyncEvents {
    fn new() -> std::io::Result<AsyncEvents> {
        Ok(AsyncEvents { queue: Mutex::default(), fd: Some(EventFd::counting()?) })
    }

    pub(crate) fn push(&self, event: AsyncEvent) {
        let mut queue = lock(&self.queue);
        queue.push_back(event);
        if let Some(fd) = &self.fd {
            fd.signal();
        }
    }

    pub(crate) fn pop(&self) -> Option<AsyncEvent> {
        let mut queue = lock(&self.queue);
        let event = queue.pop_front();
        // Signalled under the lock at the push, so the signal is there.
        if let (Some(_), Some(fd)) = (&event, &self.fd) {
            fd.take_one();
        }
        event
    }

    pub(crate) fn fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(AsRawFd::as_raw_fd)
    }
}

/// Everything the engine thread and the application share.
#[derive(Debug, Default)]
pub(crate) struct EngineShared {
    pub registry: RwLock<Registry>,
    pub qps: Mutex<BTreeMap<u32, Arc<QpCell>>>,
    /// What changed in `qps` since the engine last looked, in order: the
    /// engine keeps its own table up to date from these, at a cost that
    /// does not grow with the number of QPs.
    pub qp_changes: Mutex<Vec<QpChange>>,
    /// Bumped whenever `qps` changes, so the engine looks at `qp_changes` only then.
    pub qps_version: AtomicU64,
    /// QPs the application changed (posted to, modified) while another
    /// thread drove progress: the next round looks at them.
    ready: Mutex<Vec<Arc<QpCell>>>,
    pub events: AsyncEvents,
    pub stop: AtomicBool,
    /// Who drives progress, and the doorbell that calls them in.
    pub handover: Handover,
    pub link_stats: PublishedLinkStats,
    /// Destroyed QPs whose queued answers the engine still has to send.
    pub closing: Mutex<Vec<Arc<QpCell>>>,
    /// Counters of QPs that were destroyed, so device totals never go back.
    pub retired: Mutex<Counters>,
    /// Packets with a good ICRC that are not valid RoCE.
    pub malformed: AtomicU64,
    /// Packets for a QP number the device does not have (never created, or destroyed).
    pub unknown_qp: AtomicU64,
    /// Sleeps of the threads driving progress for want of packets.
    pub sleeps: AtomicU64,
    /// Yields of the engine thread that came back late ([`CONTENDED_YIELD`]).
    pub contended_yields: AtomicU64,
    /// The link's receive buffer, which RC windows keep within
    /// ([`Qp::set_peer_buffer`]).
    pub receive_buffer: Option<usize>,
    /// The QPs attached to each multicast group, by group address.
    pub mcast: Mutex<HashMap<IpAddr, Vec<u32>>>,
    /// Held across an attach or detach, so that joining and leaving a
    /// group at the link keep step with `mcast` (never held by the engine).
    mcast_changes: Mutex<()>,
    /// Bumped when the link's descriptors change (a group joined or left).
    link_version: AtomicU64,
}

/// The engine thread, stopped and joined on drop.
#[derive(Debug)]
pub(crate) struct Engine {
    pub shared: Arc<EngineShared>,
    progress: Arc<Mutex<Progress>>,
    /// Threads that drive progress poll instead of sleeping.
    busy_poll: bool,
    tuning: Tuning,
    thread: Option<JoinHandle<()>>,
}

impl EngineShared {
    /// Adds a QP the application just created to the table.
    pub(crate) fn add_qp(&self, qps: &mut BTreeMap<u32, Arc<QpCell>>, cell: Arc<QpCell>) {
        qps.insert(cell.qpn, Arc::clone(&cell));
        lock(&self.qp_changes).push(QpChange::Created(cell));
        self.qps_version.fetch_add(1, Ordering::Release);
    }

    /// Takes a QP the application destroyed out of the table.
    pub(crate) fn remove_qp(&self, qps: &mut BTreeMap<u32, Arc<QpCell>>, qpn: u32) {
        if let Some(cell) = qps.remove(&qpn) {
            cell.marks.destroyed.store(true, Ordering::Release);
            lock(&self.qp_changes).push(QpChange::Destroyed(cell));
        }
    }

    /// Has the engine look at `cell` in its next round, and rings it: the
    /// application changed what the QP has to do.
    pub(crate) fn mark_ready(&self, cell: &Arc<QpCell>) {
        if !cell.queued.swap(true, Ordering::AcqRel) {
            lock(&self.ready).push(Arc::clone(cell));
        }
        self.handover.ring();
    }
}

impl Engine {
    /// Attaches QP `qpn` to multicast group `group`: the link joins the
    /// group with the first QP (rxe-spec V-23). Says whether the QP was
    /// attached already.
    pub fn attach_mcast(&self, group: IpAddr, qpn: u32, max_qps: usize) -> std::io::Result<bool> {
        let _serial = lock(&self.shared.mcast_changes);
        let known = lock(&self.shared.mcast).get(&group).map(|qps| (qps.contains(&qpn), qps.len()));
        match known {
            Some((true, _)) => return Ok(true),
            Some((false, n)) if n >= max_qps => {
                return Err(std::io::Error::new(std::io::ErrorKind::OutOfMemory, "the group has its most QPs"))
            }
            Some(_) => {}
            None => self.change_link(|link| link.join_group(group))?,
        }
        lock(&self.shared.mcast).entry(group).or_default().push(qpn);
        Ok(false)
    }

    /// Detaches QP `qpn` from `group` (from every group with `None`); the
    /// link leaves a group its last QP left. Says whether it was attached.
    pub fn detach_mcast(&self, group: Option<IpAddr>, qpn: u32) -> bool {
        let _serial = lock(&self.shared.mcast_changes);
        let mut left = Vec::new();
        let mut found = false;
        for (&g, qps) in lock(&self.shared.mcast).iter_mut().filter(|(g, _)| group.is_none_or(|x| x == **g)) {
            if let Some(at) = qps.iter().position(|&q| q == qpn) {
                qps.remove(at);
                found = true;
                if qps.is_empty() {
                    left.push(g);
                }
            }
        }
        lock(&self.shared.mcast).retain(|_, qps| !qps.is_empty());
        for g in left {
            let _ = self.change_link(|link| {
                link.leave_group(g);
                Ok(())
            });
        }
        found
    }

    /// Changes the link under the progress lock, and has the engine thread
    /// wait on its descriptors as they now are.
    fn change_link(&self, change: impl FnOnce(&mut dyn Link) -> std::io::Result<()>) -> std::io::Result<()> {
        let mut p = lock(&self.progress);
        change(&mut *p.out.link)?;
        let mut fds = p.out.link.raw_fds();
        fds.extend(self.shared.handover.doorbell_fd());
        p.fds = fds;
        drop(p);
        self.shared.link_version.fetch_add(1, Ordering::Release);
        self.shared.handover.ring();
        Ok(())
    }

    /// Starts the engine thread over `link`. With `busy_poll`, application
    /// threads that wait for a completion or an event poll instead of
    /// sleeping (lowest latency, a core spent per waiting thread); the
    /// engine thread always sleeps when idle, so idle devices cost nothing.
    /// `cpus` says where the engine thread runs, and so how much it may
    /// poll: [`Tuning::for_cpus`] of the CPUs it has.
    pub fn start<L: Link + Send + 'static>(
        link: L,
        busy_poll: bool,
        cpus: EngineCpus,
        name: &str,
    ) -> std::io::Result<Engine> {
        // The thread starts first: only it can learn which CPUs it gets.
        let (to_thread, from_start) =
            crossbeam_channel::bounded::<(Arc<Mutex<Progress>>, Arc<EngineShared>, Tuning)>(1);
        let (counted, cpu_count) = crossbeam_channel::bounded(1);
        let span_name = name.to_string();
        let thread = std::thread::Builder::new().name(format!("softroce-{name}")).spawn(move || {
            block_async_signals();
            if cpus == EngineCpus::Device {
                widen_affinity();
            }
            let _ = counted.send(std::thread::available_parallelism().map_or(1, usize::from));
            let Ok((progress, shared, tuning)) = from_start.recv() else { return };
            let _span = debug_span!("engine", device = %span_name).entered();
            run(&progress, &shared, &tuning)
        })?;
        let tuning = Tuning::for_cpus(cpu_count.recv().unwrap_or(1));
        let shared = Arc::new(EngineShared {
            handover: Handover::new(Some(EventFd::new()?), &tuning),
            events: AsyncEvents::new()?,
            receive_buffer: link.receive_buffer(),
            ..EngineShared::default()
        });
        let progress = Arc::new(Mutex::new(Progress::new(Box::new(link), &shared, tuning)));
        let _ = to_thread.send((Arc::clone(&progress), Arc::clone(&shared), tuning));
        Ok(Engine { shared, progress, busy_poll, tuning, thread: Some(thread) })
    }

    /// After a post to `cell`'s QP: sends its new packets from this thread
    /// when nobody else is driving progress (no doorbell, no engine wake-up),
    /// else rings the doorbell for whoever is.
    pub fn kick(&self, cell: &Arc<QpCell>) {
        let handover = &self.shared.handover;
        let Some(mut p) = try_lock(&self.progress) else {
            self.shared.mark_ready(cell);
            return;
        };
        let now = p.now();
        // The posts change what the QPs have to send and when they time out.
        p.quiet_until = Duration::ZERO;
        handover.posted(now);
        // The new requests first: the peer waits for them. But while an ACK
        // is on its way to a busy QP, a few wait for it and leave with the
        // packets it lets out, as one batch: a stream of posts each sent
        // alone costs a system call per packet on both sides.
        let tuning = &self.tuning;
        // One registry guard for everything this post sends, held until the
        // last flush: lent payloads go out from registered memory.
        let registry = self.shared.registry.read().unwrap_or_else(|e| e.into_inner());
        let mem = &mut RegistryAccess(&registry);
        let mut qp = lock(&cell.qp);
        let busy = qp.unacked_awaiting_ack().is_some_and(|psns| psns >= tuning.busy_unacked);
        let few = busy && qp.unsent_packets(tuning.send_batch) < tuning.send_batch;
        let order = if few { TransmitOrder::ResponsesOnly } else { TransmitOrder::RequestsFirst };
        p.budget.admit(&mut qp, false);
        let sent = p.out.egress().transmit(&mut qp, mem, now, tuning.kick_limit, order);
        if !p.owed && p.budget.line_is_empty() {
            // Nothing else will join this batch: it leaves before the
            // bookkeeping below, which the peer need not wait for.
            p.out.link.flush();
        }
        cell.drain(&mut qp, &self.shared.events);
        let (timer, ack_coming) = (qp.poll_timeout(), qp.unacked_awaiting_ack().is_some());
        p.note(cell, &qp, now, sent == tuning.kick_limit);
        drop(qp);
        if std::mem::take(&mut p.owed) {
            // What the last waiter left unsent goes out in the same batch
            // (this QP's answers went above, and its requests as decided):
            // the QPs its round handed packets to are the active ones.
            let mut others = std::mem::take(&mut p.spare);
            others.extend(
                p.active
                    .iter()
                    .filter(|other| !Arc::ptr_eq(other, cell) && !other.marks.destroyed.load(Ordering::Acquire))
                    .cloned(),
            );
            for other in others.drain(..) {
                let mut qp = lock(&other.qp);
                p.budget.admit(&mut qp, false);
                p.out.egress().transmit(&mut qp, mem, now, tuning.kick_limit, TransmitOrder::ResponsesFirst);
                other.drain(&mut qp, &self.shared.events);
                p.note(&other, &qp, now, false);
            }
            p.spare = others;
        }
        let line_served = p.serve_line(&self.shared, mem, now);
        p.out.link.flush();
        drop(registry);
        self.shared.link_stats.publish(&p.out.link.stats());
        drop(p);
        // More to send (unless the ACK on its way will send it), a turn
        // given, or a timer the sleeping engine does not know about.
        if (sent == tuning.kick_limit && !ack_coming)
            || line_served
            || timer.is_some_and(|t| handover.engine_sleeps_past(t))
        {
            handover.ring();
        }
    }

    /// Before a poll of an empty `cq` returns nothing: one round of
    /// progress from this thread, if nobody else is driving, so that
    /// applications that spin on the CQ (as perftest and most verbs
    /// programs do) move their own packets instead of waiting for the
    /// engine thread to wake.
    pub fn poll_progress(&self, cq: &CqShared) {
        let Some(mut p) = try_lock(&self.progress) else {
            self.shared.handover.polled_without_driving();
            return;
        };
        p.iterate(&self.shared, Some(&|| !cq.is_empty()));
        self.release(p, !cq.is_empty());
    }

    /// One full round from this thread, for a thread that just changed what
    /// the QPs owe (a destroy whose QP still has an ACK to send) and is not
    /// going to wait: the engine keeps off only as after a post (a whole
    /// handover would delay every packet that arrives meanwhile, a
    /// connection's handshake say). If another thread drives, it is rung and
    /// this one takes over as soon as it lets go, for
    /// [`Tuning::destroy_wait`] at most: a program that destroys its QP and
    /// exits must not leave before the ACK does, as kernel rxe's destroy
    /// waits for its tasks (an rping client in the stock rows did).
    pub fn progress_now(&self) {
        let mut p = match try_lock(&self.progress) {
            Some(p) => p,
            None => {
                self.shared.handover.ring();
                let deadline = Instant::now() + self.tuning.destroy_wait;
                loop {
                    std::thread::yield_now();
                    if let Some(p) = try_lock(&self.progress) {
                        break p;
                    }
                    // A waiter that drives holds on: the ring had it send.
                    if Instant::now() >= deadline {
                        return;
                    }
                }
            }
        };
        p.iterate(&self.shared, None);
        let released_at = self.release(p, false);
        self.shared.handover.drove_once(released_at);
    }

    /// Lets go of driving progress, ringing the engine if the hand-over
    /// says it must hear of it ([`Handover::release`]); `found`: the poll
    /// that drove found a completion. Returns when: when the round just
    /// driven began (every caller drove one), so that a program that spins
    /// on its CQ reads the clock once a poll, not twice.
    fn release(&self, p: MutexGuard<'_, Progress>, found: bool) -> Duration {
        let now = p.round_at;
        let ring = self.shared.handover.release(now, p.owed, found, || p.next_timer());
        drop(p);
        if ring {
            self.shared.handover.ring();
        }
        now
    }

    /// Waits up to `timeout` for the next completion of `cq`. While nobody
    /// else drives progress, this thread does — receives, handles, sends —
    /// so a completion reaches it without a hand-off from the engine thread
    /// (one wake-up per message, as for a plain UDP receive).
    pub fn wait_completion(&self, cq: &CqShared, timeout: Duration) -> Option<WorkCompletion> {
        if let Some(wc) = cq.pop() {
            return Some(wc);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if !self.drive_until(&|| !cq.is_empty(), deadline) {
                // Someone else drives: they hand completions over. Look
                // again soon, in case they stop.
                let left = deadline.saturating_duration_since(Instant::now());
                if let Some(wc) = cq.wait_pop(left.min(self.tuning.handover)) {
                    return Some(wc);
                }
            }
            if let Some(wc) = cq.pop() {
                return Some(wc);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Waits up to `timeout` for `channel` to have an event, driving
    /// progress meanwhile as [`Engine::wait_completion`] does.
    pub fn wait_event(&self, channel: &ChannelShared, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let ready = || !channel.events.1.is_empty();
        while !ready() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            if !self.drive_until(&ready, deadline) {
                wait_readable(&[channel.fd.as_raw_fd()], left.min(self.tuning.handover));
            }
        }
    }

    /// Drives progress from this thread until `ready()` or `deadline`, if
    /// nobody else is driving; returns whether it could.
    fn drive_until(&self, ready: &dyn Fn() -> bool, deadline: Instant) -> bool {
        let Some(mut p) = try_lock(&self.progress) else { return false };
        let driving = self.shared.handover.driving();
        // On the transport's clock, which each round reads once: the loop
        // reads no clock of its own.
        let deadline = p.clock.at(deadline);
        // When the first round of the current idle spell began: about when
        // the last busy round ended (a busy round can take tens of µs, which
        // must not count as idle).
        let mut idle_since = None;
        loop {
            let step = p.iterate(&self.shared, Some(ready));
            if ready() {
                break;
            }
            let now = p.round_at;
            let left = deadline.saturating_sub(now);
            if left.is_zero() {
                break;
            }
            if step.busy {
                idle_since = None;
                continue;
            }
            let idle = now.saturating_sub(*idle_since.get_or_insert(now));
            if self.busy_poll || idle < self.tuning.wait_spin {
                if idle >= self.tuning.yield_after {
                    std::thread::yield_now();
                }
                continue;
            }
            let timer = step.next_timer.map_or(left, |t| t.saturating_sub(now));
            self.shared.sleeps.fetch_add(1, Ordering::Relaxed);
            let ready = wait_readable(&p.fds, left.min(timer));
            self.shared.handover.drain_doorbell(&p.fds, ready);
        }
        drop(driving);
        self.release(p, false);
        true
    }

    /// Before the program goes (it closes the device, or exits): sends
    /// every answer the device owes — the ACK a waiter left for its next
    /// post, responses, what destroyed QPs and the CM queued — in full
    /// rounds until one finds nothing to do. Then, if an RC peer would
    /// resend what got no answer (an ACK lost on the way) before
    /// `deadline`, stays to answer it: a process's QPs go with it, and its
    /// peer's retries would run out into nobody. Returns by `deadline`
    /// whatever happens: if another thread holds progress throughout (the
    /// program exits from a signal handler that interrupted it), that
    /// thread is rung to send instead.
    pub fn settle(&self, deadline: Instant) {
        let mut p = loop {
            if let Some(p) = try_lock(&self.progress) {
                break p;
            }
            self.shared.handover.ring();
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        };
        let end = p.clock.at(deadline);
        loop {
            p.quiet_until = Duration::ZERO;
            let step = p.iterate(&self.shared, None);
            if !step.busy || p.now() >= end {
                break;
            }
        }
        // A peer resends an ACK timeout after its packet arrived here; a
        // second one covers a resend that comes late (a peer short of CPU).
        let resend_at = p.resend_window().map(|window| p.last_received + window);
        if let Some(until) = resend_at.filter(|&at| at < end).map(|at| (at + (at - p.last_received)).min(end)) {
            while p.now() < until {
                let ready = wait_readable(&p.fds, until.saturating_sub(p.now()));
                self.shared.handover.drain_doorbell(&p.fds, ready);
                p.quiet_until = Duration::ZERO;
                p.iterate(&self.shared, None);
            }
        }
        self.release(p, false);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.handover.ring();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // One last full round: what a waiter left owed and what QPs
        // destroyed just before still had to answer (the ACK of the last
        // message a program waited for, say) leave before the device does.
        // Kernel rxe sends an ACK before its completion is seen; without
        // this a program that exits at once leaves its peer resending
        // until its retries run out.
        let mut p = lock(&self.progress);
        p.quiet_until = Duration::ZERO;
        p.iterate(&self.shared, None);
    }
}

/// Locks `m` if no one holds it (a poisoned lock is taken over, as in [`lock`]).
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// The engine's working state: the link, its buffers and a snapshot of the
/// QP table. One thread at a time drives progress with it — the engine
/// thread, or an application thread that would otherwise wait for it.
pub(crate) struct Progress {
    out: Outbox,
    /// The transport's clock.
    clock: Clock,
    /// The transport's clock when the last round began.
    round_at: Duration,
    rx: Vec<u8>,
    /// The QPs by number: every packet received looks its QP up here, so
    /// with a multiplicative hash rather than SipHash (~60 instructions).
    by_qpn: FxHashMap<u32, Arc<QpCell>>,
    version: u64,
    /// The QPs the next round visits: those that received packets, were
    /// posted to or modified, have a timer due, or have more to send. The
    /// others cost a round nothing, however many there are.
    active: Vec<Arc<QpCell>>,
    /// An empty list with capacity, swapped with `active` and the ready
    /// list in turn, so that rounds allocate nothing.
    spare: Vec<Arc<QpCell>>,
    /// When QPs' timers are due, earliest first, by QPN; an entry may be
    /// earlier than its QP's timer is now (a visit finds out and re-files it).
    timers: BinaryHeap<Reverse<(Duration, u32)>>,
    /// QPs whose last visit left them waiting on their peers (packets
    /// unacknowledged): they share the peer's receive buffer.
    waiting_on_peer: usize,
    /// What the device has in flight, within the peers' receive buffers.
    budget: SendBudget,
    /// The link's descriptors and the doorbell: readable when there is work.
    fds: Vec<RawFd>,
    /// A round ended early: QPs may have packets to send.
    owed: bool,
    lingering: Lingering,
    /// Until then a round that receives nothing only looks at the sockets:
    /// the last full round found nothing to do, and nothing has changed
    /// since (see [`Tuning::quiet_span`]).
    quiet_until: Duration,
    /// The earliest QP timer the last full round saw.
    seen_timer: Option<Duration>,
    /// When a round last received a packet: a peer's resend of what it
    /// got no answer to comes an ACK timeout after it ([`Engine::settle`]).
    last_received: Duration,
    tuning: Tuning,
}

/// Where QPs' packets go: the link, the local addresses they leave from,
/// and a buffer to build them in where the link has none to lend.
struct Outbox {
    link: Box<dyn Link + Send>,
    locals: Vec<IpAddr>,
    buf: Vec<u8>,
}

impl Outbox {
    /// The link, its addresses and the buffer, as QPs' packets leave on them.
    fn egress(&mut self) -> Egress<'_> {
        Egress { link: &mut *self.link, locals: &self.locals, buf: &mut self.buf }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").field("locals", &self.out.locals).field("qps", &self.by_qpn.len()).finish()
    }
}

/// What one round of progress did.
struct Step {
    /// Packets moved or timers fired: another round may find more.
    busy: bool,
    /// The earliest timer of any QP.
    next_timer: Option<Duration>,
}

/// How a round's receiving ended ([`Progress::receive_batch`]).
enum Batch {
    /// What the driver waits for holds: the round ends here.
    Ready,
    /// The batch is over: whether it `received` anything, and whether the
    /// link is `drained` (else the batch was full).
    Done { received: bool, drained: bool },
}

impl Progress {
    fn new(link: Box<dyn Link + Send>, shared: &EngineShared, tuning: Tuning) -> Progress {
        // A context binds its addresses before the engine starts.
        let locals = link.local_addrs();
        let mut fds = link.raw_fds();
        fds.extend(shared.handover.doorbell_fd());
        Progress {
            out: Outbox { link, locals, buf: vec![0u8; 4096 + TRANSMIT_HEADROOM + 64] },
            clock: Clock::start(),
            round_at: Duration::ZERO,
            rx: vec![0u8; 64 * 1024],
            by_qpn: FxHashMap::default(),
            version: u64::MAX,
            active: Vec::new(),
            spare: Vec::new(),
            timers: BinaryHeap::new(),
            waiting_on_peer: 0,
            budget: SendBudget::new(shared.receive_buffer),
            fds,
            owed: false,
            lingering: Lingering::new(&tuning),
            quiet_until: Duration::ZERO,
            seen_timer: None,
            last_received: Duration::ZERO,
            tuning,
        }
    }

    fn now(&self) -> Duration {
        self.clock.now()
    }

    /// The earliest timer of any QP (or a little earlier).
    fn next_timer(&self) -> Option<Duration> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// Puts `cell` on the list of QPs the next round visits.
    fn activate(&mut self, cell: &Arc<QpCell>) {
        if !replace_bool(&cell.marks.active, true) {
            self.active.push(Arc::clone(cell));
        }
    }

    /// Files what a visit left of `cell`'s QP: whether it waits on its
    /// peer, when its timer is due, and whether it has `more` to send;
    /// `now` is the visit's time (the clock is read once a round).
    fn note(&mut self, cell: &Arc<QpCell>, qp: &Qp, now: Duration, more: bool) {
        self.budget.settle(cell, qp, now);
        let timer = qp.poll_timeout();
        let waiting = timer.is_some();
        if replace_bool(&cell.marks.waiting, waiting) != waiting {
            if waiting {
                self.waiting_on_peer += 1;
            } else {
                self.waiting_on_peer -= 1;
            }
        }
        if let Some(at) = timer {
            // One entry per QP at a time, unless its timer moved earlier:
            // a timer pushed later is found when the older entry comes due.
            if cell.marks.timer_entry().is_none_or(|entry| at < entry) {
                self.timers.push(Reverse((at, cell.qpn)));
                cell.marks.set_timer_entry(Some(at));
            }
        }
        if more {
            self.activate(cell);
        }
    }

    /// One round: receive, run due timers, transmit. With `until`, the
    /// round ends as soon as it holds (a CQ has a completion, say), before timers and
    /// transmission: the waiter gets it first, and the answers owed (an
    /// ACK, say) leave with the waiter's next post, in one batch with it
    /// (see [`Engine::kick`]), or with the next round.
    fn iterate(&mut self, shared: &EngineShared, until: Option<&dyn Fn() -> bool>) -> Step {
        let changed = self.refresh_qps(shared);
        let now = self.now();
        self.round_at = now;
        let wanted = shared.handover.take_full_round_call();
        let quiet = !changed && !wanted && now < self.quiet_until;
        // QPs destroyed since the last round leave the table before this
        // round's packets are read (a destroy pushes them here, then bumps
        // the version), so a resend in this very round finds its lingering QP.
        if changed {
            self.lingering.adopt(now, std::mem::take(&mut *lock(&shared.closing)));
        }
        let (received, drained) = match self.receive_batch(shared, now, until) {
            Batch::Ready => {
                self.owed = true;
                self.quiet_until = Duration::ZERO;
                self.last_received = now;
                shared.link_stats.publish(&self.out.link.stats());
                return Step { busy: true, next_timer: None };
            }
            Batch::Done { received, drained } => (received, drained),
        };
        self.owed = false;
        if received {
            self.last_received = now;
        }
        // The link may hold packets it looks at again later (rdma_cm
        // requests waiting for a listener).
        let link_event = self.out.link.next_event();
        if quiet && !received {
            return Step { busy: false, next_timer: self.seen_timer.into_iter().chain(link_event).min() };
        }
        // One registry guard for the round's sending, held until its flush:
        // payloads lent from registered memory go out from there, however
        // many QPs took turns at the batch.
        let registry = shared.registry.read().unwrap_or_else(|e| e.into_inner());
        let mem = &mut RegistryAccess(&registry);
        let (served, next_timer) = self.run_timers_and_transmit(shared, mem, now, drained);
        let next_timer = next_timer.into_iter().chain(link_event).min();
        let answered = self.lingering.answer(&mut self.out, mem, now);
        self.lingering.expire(now);
        let busy = received || served || answered;
        self.out.link.flush();
        drop(registry);
        shared.link_stats.publish(&self.out.link.stats());
        self.seen_timer = next_timer;
        self.quiet_until =
            if busy { Duration::ZERO } else { (now + self.tuning.quiet_span).min(next_timer.unwrap_or(Duration::MAX)) };
        Step { busy, next_timer }
    }

    /// The shortest local ACK timeout of the RC QPs that have a peer (and
    /// of those destroyed that still answer it): about when a peer whose
    /// last packet got no answer sends it again, if both ends set the same
    /// timeout, as programs do.
    fn resend_window(&self) -> Option<Duration> {
        let connected = |qp: &Qp| {
            qp.is_lingering() || matches!(qp.state(), QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
        };
        self.by_qpn
            .values()
            .chain(self.lingering.cells.values())
            .filter_map(|cell| {
                let qp = lock(&cell.qp);
                (qp.qp_type() == QpType::Rc && connected(&qp)).then(|| qp.ack_timeout()).flatten()
            })
            .min()
    }

    /// Takes in the QP table's changes since the last round; says whether
    /// there were any.
    fn refresh_qps(&mut self, shared: &EngineShared) -> bool {
        let seen = shared.qps_version.load(Ordering::Acquire);
        let changed = seen != self.version;
        if changed {
            self.version = seen;
            for change in std::mem::take(&mut *lock(&shared.qp_changes)) {
                match change {
                    QpChange::Created(cell) => {
                        self.by_qpn.insert(cell.qpn, cell);
                    }
                    QpChange::Destroyed(cell) => {
                        if self.by_qpn.get(&cell.qpn).is_some_and(|known| Arc::ptr_eq(known, &cell)) {
                            self.by_qpn.remove(&cell.qpn);
                        }
                        if replace_bool(&cell.marks.waiting, false) {
                            self.waiting_on_peer -= 1;
                        }
                        self.budget.release(&cell);
                    }
                }
            }
        }
        changed
    }

    /// Receives up to a round's packets and hands each to its QP (or to a
    /// destroyed one that lingers); stops early once `until` holds.
    fn receive_batch(&mut self, shared: &EngineShared, now: Duration, until: Option<&dyn Fn() -> bool>) -> Batch {
        // One registry guard for the whole batch, and a QP's lock kept
        // across its consecutive packets: every lock and unlock is a
        // locked instruction, which waits until the payload copied into
        // registered memory has left the store buffer.
        let registry = shared.registry.read().unwrap_or_else(|e| e.into_inner());
        let mut mem = RegistryAccess(&registry);
        let mut held: Option<(u32, MutexGuard<'_, Qp>)> = None;
        let (mut handled, mut acked_at) = (0, 0);
        let mut received = false;
        // A completion or event moved in this batch: `until` may hold.
        let mut completed = false;
        for _ in 0..self.tuning.round_receive {
            let Some((r, roce)) = self.out.link.receive_in_place(now, &mut self.rx) else {
                return Batch::Done { received, drained: true };
            };
            received = true;
            let Ok(pkt) = RoceRepr::parse(roce) else {
                shared.malformed.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let qpn = pkt.header.bth.dest_qpn;
            if qpn == BthRepr::MULTICAST_QPN {
                drop(held.take());
                deliver_multicast(&self.by_qpn, &mut self.active, shared, now, &r, &pkt, &mut mem);
                continue;
            }
            let (cell, lingering) = match (self.by_qpn.get(&qpn), self.lingering.cells.get(&qpn)) {
                (Some(cell), _) => (cell, false),
                (None, Some(cell)) => (cell, true),
                (None, None) => {
                    trace!(qpn, "packet for an unknown QP");
                    shared.unknown_qp.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            if held.as_ref().is_none_or(|(of, _)| *of != qpn) {
                // One QP lock at a time.
                drop(held.take());
                held = Some((qpn, lock(&cell.qp)));
            }
            let Some((_, qp)) = held.as_mut() else { continue };
            let mut srq = cell.srq.as_ref().map(|s| lock(s));
            let answered = lingering.then(|| qp.counters().duplicate_requests);
            let asks_ack = pkt.header.bth.ack_req;
            dispatch::deliver(qp, now, &r, &pkt, &mut mem, srq.as_deref_mut());
            handled += 1;
            if asks_ack && handled - acked_at >= self.tuning.early_ack_after {
                // The ACK leaves now, not after the rest of the round:
                // a requester whose window is the peer's small socket
                // buffer would otherwise stop and wait for every round.
                acked_at = handled;
                self.out.egress().transmit(qp, &mut mem, now, usize::MAX, TransmitOrder::ResponsesOnly);
                self.out.link.flush();
            }
            if let Some(answered) = answered {
                // A destroyed QP answers only a resend of its last messages;
                // anything else was for a QP the device no longer has.
                if qp.counters().duplicate_requests == answered {
                    shared.unknown_qp.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.lingering.answering.push(Arc::clone(cell));
                }
            }
            drop(srq);
            completed |= cell.drain(qp, &shared.events);
            if !lingering && !replace_bool(&cell.marks.active, true) {
                self.active.push(Arc::clone(cell));
            }
            // The rest of a GRO train first: an ACK behind the answer
            // it came with would wait in the link, signalled to nobody,
            // while the waiter's next post waits for it (a thread that
            // then drives another device left it to the engine's next
            // look, up to 5 ms away).
            // Only a completion or an event can make it hold (asking
            // takes the CQ's lock, a locked instruction: see `replace_bool`).
            if completed && !self.out.link.amid_datagram() {
                if until.is_some_and(|ready| ready()) {
                    return Batch::Ready;
                }
                completed = false;
            }
        }
        Batch::Done { received, drained: false }
    }

    /// Every QP with something to do in turn (packets received, posted
    /// to or modified, a timer due, more to send): its share of the peer's
    /// buffer, its due timers (only once the link is `drained`: an ACK
    /// waiting in the socket must not lose the race to the timeout it would
    /// cancel), its packets and its completions. Says whether any QP did
    /// something, and the earliest timer left.
    fn run_timers_and_transmit(
        &mut self,
        shared: &EngineShared,
        mem: &mut RegistryAccess<'_>,
        now: Duration,
        drained: bool,
    ) -> (bool, Option<Duration>) {
        let mut ready = std::mem::take(&mut self.spare);
        std::mem::swap(&mut *lock(&shared.ready), &mut ready);
        for cell in ready.drain(..) {
            cell.queued.store(false, Ordering::Release);
            self.activate(&cell);
        }
        if drained {
            while let Some(&Reverse((at, qpn))) = self.timers.peek() {
                if at > now {
                    break;
                }
                self.timers.pop();
                let Some(cell) = self.by_qpn.get(&qpn).cloned() else { continue };
                if cell.marks.timer_entry() == Some(at) {
                    cell.marks.set_timer_entry(None);
                }
                self.activate(&cell);
            }
        }
        let mut busy = false;
        // The device's QPs send into one socket buffer at a peer on this
        // host, so each window gets a share of it (rxe-spec T-7).
        let share = self.budget.share(self.waiting_on_peer);
        let mut visiting = std::mem::replace(&mut self.active, ready);
        for cell in visiting.drain(..) {
            cell.marks.active.store(false, Ordering::Relaxed);
            // A QP created since the round took in the table's changes is
            // visited all the same (a post may have put it here).
            if cell.marks.destroyed.load(Ordering::Acquire) {
                continue;
            }
            let mut qp = lock(&cell.qp);
            qp.set_peer_buffer(share);
            if drained {
                busy |= dispatch::run_due_timers(&mut qp, now);
            }
            busy |= self.send_from(shared, mem, now, &cell, &mut qp, false) > 0;
        }
        self.spare = visiting;
        busy |= self.serve_line(shared, mem, now);
        (busy, self.next_timer())
    }

    /// Gives turns to the QPs in the budget's line while the buffer has
    /// room; says whether any sent.
    fn serve_line(&mut self, shared: &EngineShared, mem: &mut RegistryAccess<'_>, now: Duration) -> bool {
        let mut sent_any = false;
        while let Some(cell) = self.budget.next_in_line() {
            let mut qp = lock(&cell.qp);
            if !self.budget.has_room(&qp) {
                drop(qp);
                self.budget.keep_first(cell);
                break;
            }
            sent_any |= self.send_from(shared, mem, now, &cell, &mut qp, true) > 0;
        }
        sent_any
    }

    /// A round's sending for `cell`'s QP: what the budget lets it (a turn,
    /// if `served` from the line), up to a round's share of packets, then
    /// its completions, and what it has left filed. Says how many it sent.
    fn send_from(
        &mut self,
        shared: &EngineShared,
        mem: &mut RegistryAccess<'_>,
        now: Duration,
        cell: &Arc<QpCell>,
        qp: &mut Qp,
        served: bool,
    ) -> usize {
        self.budget.admit(qp, served);
        let limit = self.tuning.round_transmit;
        let sent = self.out.egress().transmit(qp, mem, now, limit, TransmitOrder::ResponsesFirst);
        cell.drain(qp, &shared.events);
        self.note(cell, qp, now, sent == limit);
        sent
    }
}

/// Destroyed QPs that still owe their peers answers.
struct Lingering {
    /// Destroyed RC QPs that still re-acknowledge their peers' resends
    /// ([`Qp::linger`]), by QPN,
    cells: BTreeMap<u32, Arc<QpCell>>,
    /// and when each goes, oldest first.
    until: VecDeque<(Duration, u32)>,
    /// Destroyed QPs that may owe answers: those destroyed since the last
    /// full round, and lingering ones that got a packet.
    answering: Vec<Arc<QpCell>>,
    /// [`Tuning::linger`].
    linger: Duration,
    /// [`Tuning::max_lingering`].
    max: usize,
}

impl Lingering {
    fn new(tuning: &Tuning) -> Lingering {
        Lingering {
            cells: BTreeMap::new(),
            until: VecDeque::new(),
            answering: Vec::new(),
            linger: tuning.linger,
            max: tuning.max_lingering,
        }
    }

    /// Takes in QPs just destroyed: RC ones linger from `now` on, answering
    /// resends of what they executed; all still owe the answers they had
    /// queued.
    fn adopt(&mut self, now: Duration, closing: Vec<Arc<QpCell>>) {
        for cell in closing {
            let lingers = {
                let mut qp = lock(&cell.qp);
                let lingers = qp.qp_type() == QpType::Rc && !qp.is_lingering();
                if lingers {
                    qp.linger();
                }
                lingers
            };
            if lingers {
                self.keep(now, Arc::clone(&cell));
            }
            self.answering.push(cell);
        }
    }

    /// Keeps a destroyed RC QP answering resends for [`Tuning::linger`],
    /// within [`Tuning::max_lingering`] QPs (the oldest goes first).
    fn keep(&mut self, now: Duration, cell: Arc<QpCell>) {
        if self.until.len() >= self.max {
            if let Some((_, qpn)) = self.until.pop_front() {
                self.cells.remove(&qpn);
            }
        }
        let qpn = lock(&cell.qp).qpn();
        self.cells.insert(qpn, cell);
        self.until.push_back((now + self.linger, qpn));
    }

    /// Sends what the QPs that may owe answers owe (the ACK of the last
    /// message, say, or of a resend); says whether they sent anything.
    fn answer(&mut self, out: &mut Outbox, mem: &mut RegistryAccess<'_>, now: Duration) -> bool {
        let mut sent = false;
        for cell in std::mem::take(&mut self.answering) {
            let mut qp = lock(&cell.qp);
            sent |= out.egress().transmit(&mut qp, mem, now, usize::MAX, TransmitOrder::ResponsesFirst) > 0;
        }
        sent
    }

    /// Lets go of the QPs whose time to linger is over.
    fn expire(&mut self, now: Duration) {
        while self.until.front().is_some_and(|&(until, _)| until <= now) {
            if let Some((_, qpn)) = self.until.pop_front() {
                self.cells.remove(&qpn);
            }
        }
    }
}

/// A yield that takes longer than this gave the CPU to a thread that runs
/// on: under the kernel's EEVDF scheduler a yielding thread goes behind
/// every other runnable one for its whole slice (milliseconds), while a
/// sleeping one that wakes takes the CPU at once.
const CONTENDED_YIELD: Duration = Duration::from_micros(200);
/// How long the engine then sleeps as soon as it is idle, before it tries
/// polling again.
const CONTENDED_FOR: Duration = Duration::from_millis(100);

/// The engine loop: drive progress, polling for [`Tuning::engine_spin`]
/// after the last busy round, then sleep until the link or the doorbell has
/// something (or the next timer is due). While an application thread drives
/// progress, the engine keeps off ([`Handover::engine_keeps_off`]).
fn run(progress: &Mutex<Progress>, shared: &EngineShared, tuning: &Tuning) {
    let (mut fds, clock) = {
        let p = lock(progress);
        (p.fds.clone(), p.clock)
    };
    let mut link_version = shared.link_version.load(Ordering::Acquire);
    let handover = &shared.handover;
    let doorbell: Vec<RawFd> = handover.doorbell_fd().into_iter().collect();
    let mut last_busy = Duration::ZERO;
    // Until when the engine sleeps at once instead of polling: a yield that
    // came back late says the CPUs are taken by threads that spin.
    let mut contended_until = Duration::ZERO;
    // Whether the thread's timer slack is the handover slack: it is changed
    // only when a wait wants the other, not twice a wake-up.
    let mut lax_slack = false;
    while !shared.stop.load(Ordering::SeqCst) {
        let now = clock.now();
        // A program that leaves its CQ once a poll finds a completion may
        // have found it in a round of the engine's, and be spinning on
        // memory now: the engine keeps off only while a thread drives.
        let leaves = handover.leaves(now);
        let keep_off = handover.engine_keeps_off(now).filter(|_| !leaves || handover.is_driven());
        if let Some(mut left) = keep_off {
            if leaves {
                left = left.min(tuning.kick_handover);
            }
            // Only a doorbell (work an application thread could not hand
            // over) calls the engine in while the application drives.
            handover.engine_sleeps_until(now + left);
            // While a thread waits or polls, the engine looks again at the
            // first clock tick after the handover, not at its end; after a
            // post alone, when the poster may have gone, it is back on time,
            // and so for a program that leaves its CQ.
            let lax = !leaves && (handover.is_driven() || left > tuning.kick_handover);
            if lax != lax_slack {
                set_timer_slack(if lax { tuning.handover_slack } else { Duration::ZERO });
                lax_slack = lax;
            }
            let ready = wait_readable(&doorbell, left);
            handover.engine_wakes();
            if ready == 0 {
                continue;
            }
            handover.drain_doorbell(&doorbell, ready);
        }
        let step = {
            let mut p = lock(progress);
            let step = p.iterate(shared, None);
            if p.last_received == p.round_at {
                handover.engine_received(p.round_at);
            }
            step
        };
        let now = clock.now();
        if step.busy {
            last_busy = now;
            continue;
        }
        if now.saturating_sub(last_busy) < tuning.engine_spin && now >= contended_until {
            std::thread::yield_now();
            let back = clock.now();
            if back.saturating_sub(now) > CONTENDED_YIELD {
                contended_until = back + CONTENDED_FOR;
                shared.contended_yields.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        let wait = step.next_timer.map_or(tuning.idle, |t| t.saturating_sub(now)).min(tuning.idle);
        if !handover.engine_may_sleep_until(now + wait) {
            // Not asleep after all: a full round sends the answers a driver
            // left first.
            continue;
        }
        if lax_slack {
            // QP timers are due on time.
            set_timer_slack(Duration::ZERO);
            lax_slack = false;
        }
        shared.sleeps.fetch_add(1, Ordering::Relaxed);
        let version = shared.link_version.load(Ordering::Acquire);
        if version != link_version {
            link_version = version;
            fds = lock(progress).fds.clone();
        }
        let ready = wait_readable(&fds, wait);
        handover.engine_wakes();
        handover.drain_doorbell(&fds, ready);
    }
}

/// Which CPUs a device's engine thread runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineCpus {
    /// Any the process's cpuset allows, whatever the thread that opened the
    /// device is bound to, as kernel rxe's work runs in softirqs and work
    /// queues on any CPU: an MPI rank bound to a core does not share it
    /// with its device's progress (rxe-spec T-34).
    #[default]
    Device,
    /// The opening thread's, as any thread it starts: `taskset` then
    /// confines the device's work with the program's.
    Opener,
}

impl EngineCpus {
    /// The environment variable that chooses for contexts whose options do
    /// not: `opener` for [`EngineCpus::Opener`], `device` (or unset) for
    /// [`EngineCpus::Device`].
    pub const ENV: &'static str = "SOFTROCE_ENGINE_CPUS";

    /// The choice `SOFTROCE_ENGINE_CPUS` makes, or an error naming what it
    /// holds if that is neither.
    pub fn from_env() -> Result<EngineCpus, String> {
        match std::env::var(Self::ENV).as_deref() {
            Err(_) | Ok("" | "device") => Ok(EngineCpus::Device),
            Ok("opener") => Ok(EngineCpus::Opener),
            Ok(other) => Err(format!("{}={other}: neither `device` nor `opener`", Self::ENV)),
        }
    }
}

/// Lets the calling thread run on every CPU of the process's cpuset: the
/// kernel keeps of a full mask what the cpuset allows. Where it refuses,
/// the thread keeps the CPUs it had.
#[allow(unsafe_code)]
fn widen_affinity() {
    // SAFETY: a cpu_set_t on the stack, filled by libc's macro and passed
    // with its own size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Keeps the program's signals off this thread: a program that arms
/// `SIGALRM` (perftest's `-D`) or handles `SIGINT` expects it on one of its
/// own threads, whose system calls it interrupts. Faults stay deliverable.
#[allow(unsafe_code)]
fn block_async_signals() {
    // SAFETY: a sigset_t on the stack, filled and edited by libc, then set as
    // this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for fault in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGABRT] {
            libc::sigdelset(&mut set, fault);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Sets how much later than asked the calling thread's timed waits may end
/// (`PR_SET_TIMERSLACK`), so that the kernel can end them with another
/// timer's interrupt; zero restores the thread's default (50 µs).
#[allow(unsafe_code)]
fn set_timer_slack(slack: Duration) {
    let ns = libc::c_ulong::try_from(slack.as_nanos()).unwrap_or(libc::c_ulong::MAX);
    // SAFETY: PR_SET_TIMERSLACK takes a value and changes only this thread's slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) };
}

/// A packet to a multicast group: a copy to each QP of `by_qpn` attached to
/// the group it was sent to (rxe's `rxe_rcv_mcast_pkt`), which then go on
/// the `active` list.
fn deliver_multicast(
    by_qpn: &FxHashMap<u32, Arc<QpCell>>,
    active: &mut Vec<Arc<QpCell>>,
    shared: &EngineShared,
    now: Duration,
    r: &crate::net::Received,
    pkt: &crate::wire::roce::RocePacket<'_>,
    mem: &mut RegistryAccess<'_>,
) {
    let members = lock(&shared.mcast).get(&r.dst).cloned().unwrap_or_default();
    if members.is_empty() {
        shared.unknown_qp.fetch_add(1, Ordering::Relaxed);
    }
    for qpn in members {
        let Some(cell) = by_qpn.get(&qpn) else { continue };
        let mut qp = lock(&cell.qp);
        let mut srq = cell.srq.as_ref().map(|s| lock(s));
        dispatch::deliver(&mut qp, now, r, pkt, mem, srq.as_deref_mut());
        drop(srq);
        cell.drain(&mut qp, &shared.events);
        drop(qp);
        if !replace_bool(&cell.marks.active, true) {
            active.push(Arc::clone(cell));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::net::{Outgoing, Received};

    fn completion(wr_id: u64, qp_num: u32) -> WorkCompletion {
        WorkCompletion::new(wr_id, qp_num, crate::transport::WcStatus::Success, crate::transport::WcOpcode::Recv)
    }

    #[test]
    fn published_link_stats_read_back_as_published() {
        let published = PublishedLinkStats::default();
        assert_eq!(published.read(), LinkStats::default());
        let stats = LinkStats {
            sent: 1,
            send_batches: 2,
            lent: 3,
            received: 4,
            icrc_errors: 5,
            malformed: 6,
            forwarded: 7,
            forward_dropped: 8,
            ownerless: 9,
            corrupted: 10,
        };
        published.publish(&stats);
        assert_eq!(published.read(), stats);
    }

    #[test]
    fn a_cq_keeps_order_counts_without_its_lock_and_overflows_when_full() {
        let cq = CqShared::new(1, 3, None);
        assert!(cq.is_empty() && cq.pop().is_none());
        for (wr_id, qpn) in [(1, 7), (2, 8), (3, 7)] {
            cq.push(completion(wr_id, qpn));
        }
        assert_eq!(cq.len(), 3);
        cq.push(completion(4, 7));
        assert!(cq.overflowed.load(Ordering::Relaxed), "a fourth completion in a CQ of three");
        // A purge keeps the others in order; a resize below what is queued is refused.
        cq.purge_qp(8);
        assert_eq!(cq.len(), 2);
        assert_eq!(cq.resize(1), Err(2));
        assert_eq!(cq.resize(4), Ok(()));
        assert_eq!(cq.capacity(), 4);
        let ids: Vec<u64> = std::iter::from_fn(|| cq.pop()).map(|wc| wc.wr_id).collect();
        assert_eq!(ids, [1, 3]);
        assert!(cq.is_empty());
    }

    #[test]
    fn a_waiter_on_a_cq_gets_a_completion_pushed_from_another_thread() {
        let cq = Arc::new(CqShared::new(1, 16, None));
        assert!(cq.wait_pop(Duration::from_millis(5)).is_none(), "nothing pushed: the wait times out");
        let pusher = {
            let cq = Arc::clone(&cq);
            std::thread::spawn(move || {
                // Until the waiter is asleep in the CQ, so that the push must wake it.
                while cq.waiters.load(Ordering::SeqCst) == 0 {
                    std::thread::yield_now();
                }
                cq.push(completion(9, 1));
            })
        };
        let wc = cq.wait_pop(Duration::from_secs(10)).expect("woken by the push");
        assert_eq!(wc.wr_id, 9);
        pusher.join().unwrap();
    }

    /// A link with nothing to receive that counts the rounds that flush it:
    /// only full rounds (and posts) do.
    struct Counting(Arc<AtomicUsize>);

    impl Link for Counting {
        fn attach(&mut self, _addr: IpAddr) -> std::io::Result<()> {
            Ok(())
        }
        fn transmit(&mut self, _now: Duration, _out: Outgoing<'_>) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn receive(&mut self, _now: Duration, _buf: &mut [u8]) -> Option<Received> {
            None
        }
        fn next_event(&self) -> Option<Duration> {
            None
        }
        fn local_addrs(&self) -> Vec<IpAddr> {
            Vec::new()
        }
        fn raw_fds(&self) -> Vec<RawFd> {
            Vec::new()
        }
        fn stats(&self) -> LinkStats {
            LinkStats::default()
        }
    }

    #[test]
    fn idle_rounds_look_only_at_the_link_until_a_ring() {
        let full_rounds = Arc::new(AtomicUsize::new(0));
        let shared = EngineShared::default();
        let mut p = Progress::new(Box::new(Counting(Arc::clone(&full_rounds))), &shared, Tuning::default());
        p.iterate(&shared, None);
        assert_eq!(full_rounds.load(Ordering::SeqCst), 1, "the first round reads the QP table and walks it");
        assert!(p.quiet_until > p.round_at, "a full round that found nothing starts a quiet span");
        // However long the rounds take here, they stay within the span.
        p.quiet_until = Duration::MAX;
        for _ in 0..3 {
            assert!(!p.iterate(&shared, None).busy);
        }
        assert_eq!(full_rounds.load(Ordering::SeqCst), 1);
        shared.handover.ring();
        p.iterate(&shared, None);
        assert_eq!(full_rounds.load(Ordering::SeqCst), 2, "a ring calls a full round in");
        p.quiet_until = Duration::MAX;
        p.iterate(&shared, None);
        assert_eq!(full_rounds.load(Ordering::SeqCst), 2, "and only one");
        shared.qps_version.fetch_add(1, Ordering::SeqCst);
        p.iterate(&shared, None);
        assert_eq!(full_rounds.load(Ordering::SeqCst), 3, "so does a change of the QP table");
    }
}
