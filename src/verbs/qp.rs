//! Queue pairs (`ibv_qp`): how they are built, connected and driven.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::context::{add_counters, ContextInner};
use super::error::{Error, Result};
use super::{Endpoint, Gid, MemoryWindow};
use crate::engine::threaded::{lock, QpCell};
use crate::transport::{
    Access, AttrMask, Mtu, MwBind, QpAttr, QpCap, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr,
};
use crate::wire::Psn;

/// A queue pair (`ibv_qp`).
#[derive(Debug)]
pub struct QueuePair {
    pub(super) ctx: Arc<ContextInner>,
    pub(super) cell: Arc<QpCell>,
    pub(super) qpn: u32,
    /// The first PSN this QP sends with, chosen at random when it was created.
    pub(super) psn: Psn,
    pub(super) sig_all: bool,
    /// What the QP was granted at creation, which nothing changes: read
    /// without the QP's lock, on every inline post of the C ABI.
    pub(super) cap: QpCap,
}

impl QueuePair {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The transport service: RC, UC or UD.
    pub fn qp_type(&self) -> QpType {
        lock(&self.cell.qp).qp_type()
    }

    /// Whether this QP belongs to `context`.
    pub fn belongs_to(&self, context: &super::Context) -> bool {
        Arc::ptr_eq(&self.ctx, context.inner())
    }

    /// A handle that changes this QP's state without owning it: the
    /// connection manager moves a QP the application owns through its
    /// states, and must not keep it alive after the application destroys it.
    pub(crate) fn controller(&self) -> QpController {
        QpController { ctx: Arc::downgrade(&self.ctx), cell: Arc::downgrade(&self.cell), qpn: self.qpn }
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        lock(&self.cell.qp).state()
    }

    /// `ibv_modify_qp`.
    /// A move to RESET also removes the QP's completions not yet polled
    /// from its CQs (rxe-spec V-19).
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        modify_cell(&self.ctx, &self.cell, attr, mask)?;
        self.ctx.engine.shared.mark_ready(&self.cell);
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
            // A copy for the trace, taken only when tracing.
            let traced = self.ctx.trace.as_ref().map(|trace| (trace, wr.clone()));
            let result = qp.post_send(wr);
            if let Some((trace, wr)) = traced {
                trace.post_send(self.qpn, &wr, result.as_ref().map_err(|e| e as &dyn std::fmt::Display).copied());
            }
            if let Err(e) = result {
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

    /// `ibv_bind_mw`: posts `bind` (from [`MemoryWindow::bind_request`])
    /// with `flags`; once posted, [`MemoryWindow::rkey`] is its new key,
    /// which peers may use once the bind completes. The same request posted
    /// with [`QueuePair::post_send`] leaves the window's key as it was, as
    /// `ibv_post_send` does for type 2 windows.
    pub fn bind_mw(&self, mw: &MemoryWindow, wr_id: u64, bind: MwBind, flags: SendFlags) -> Result<()> {
        let wr = SendWr { flags, ..SendWr::new(wr_id, SendOp::BindMw(bind)) };
        self.post_send(wr)?;
        mw.rkey.store(bind.rkey, Ordering::Relaxed);
        Ok(())
    }

    /// `ibv_attach_mcast`: the UD QP receives what is sent to multicast
    /// group `gid` (an IPv4-mapped multicast address, 224.0.0.0/4), with
    /// destination QP 0xffffff and the QP's Q_Key (rxe-spec V-23). Up to
    /// `max_mcast_qp_attach` QPs of a context per group; attaching twice is
    /// nothing.
    pub fn attach_mcast(&self, gid: Gid) -> Result<()> {
        let group = self.multicast_group(gid)?;
        let max = self.ctx.device.query_device().max_mcast_qp_attach as usize;
        self.ctx.engine.attach_mcast(group, self.qpn, max)?;
        Ok(())
    }

    /// `ibv_detach_mcast`: the QP leaves the group (`EINVAL` if it was not
    /// attached).
    pub fn detach_mcast(&self, gid: Gid) -> Result<()> {
        let group = self.multicast_group(gid)?;
        if !self.ctx.engine.detach_mcast(Some(group), self.qpn) {
            return Err(Error::InvalidArgument(format!("QP {:#x} is not attached to {gid}", self.qpn)));
        }
        Ok(())
    }

    fn multicast_group(&self, gid: Gid) -> Result<std::net::IpAddr> {
        if self.qp_type() != QpType::Ud {
            return Err(Error::InvalidArgument("only UD QPs join multicast groups".into()));
        }
        let group = gid.to_ip();
        if !group.is_multicast() {
            return Err(Error::InvalidArgument(format!("{gid} is not a multicast GID")));
        }
        Ok(group)
    }

    /// `ibv_post_recv`. A receive gives the engine nothing to send, so it
    /// is not woken (a peer that met RNR retries on its own timer).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let mut qp = lock(&self.cell.qp);
        let traced = self.ctx.trace.as_ref().map(|trace| (trace, wr.clone()));
        let result = qp.post_recv(wr);
        if let Some((trace, wr)) = traced {
            trace.post_recv(self.qpn, &wr, result.as_ref().map_err(|e| e as &dyn std::fmt::Display).copied());
        }
        result?;
        self.cell.drain(&mut qp, &self.ctx.engine.shared.events);
        Ok(())
    }

    /// Capacities the QP was created with.
    pub fn cap(&self) -> QpCap {
        self.cap
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
    /// `ibv_rc_pingpong`. A UD QP has no peer: it takes [`QueuePair::activate`].
    pub fn connect(&self, remote: &Endpoint, options: &ConnectOptions) -> Result<()> {
        if lock(&self.cell.qp).qp_type() == QpType::Ud {
            return Err(Error::InvalidArgument("a UD QP has no peer to connect to: use activate".into()));
        }
        let attr = QpAttr {
            access_flags: options.access,
            qkey: options.qkey,
            dest: Some(remote.gid.to_ip()),
            peer_port: options.peer_port,
            path_mtu: options.mtu.unwrap_or_else(|| self.ctx.device.active_mtu()),
            timeout: options.timeout.exponent(),
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
        let connected = lock(&self.cell.qp).connect(&attr);
        if let Some(trace) = &self.ctx.trace {
            trace.connect(self.qpn, &attr, connected.as_ref().map_err(|e| e as &dyn std::fmt::Display).copied());
        }
        connected?;
        self.ctx.engine.shared.handover.ring();
        Ok(())
    }
}

impl QueuePair {
    /// Brings a UD QP from RESET (or INIT) to RTS, receiving datagrams that
    /// carry `qkey` and able to send to any address handle.
    pub fn activate(&self, qkey: u32) -> Result<()> {
        if lock(&self.cell.qp).qp_type() != QpType::Ud {
            return Err(Error::InvalidArgument("only a UD QP is activated; connected QPs connect".into()));
        }
        let options = ConnectOptions { qkey, ..ConnectOptions::default() };
        if self.state() == QpState::Reset {
            self.init(&options)?;
        }
        let attr = QpAttr { sq_psn: self.psn, ..QpAttr::default() };
        self.modify(&QpAttr { state: QpState::Rtr, ..attr }, AttrMask::STATE)?;
        self.modify(&QpAttr { state: QpState::Rts, ..attr }, AttrMask::STATE | AttrMask::SQ_PSN)
    }
}

/// See [`QueuePair::controller`].
#[derive(Debug, Clone)]
pub(crate) struct QpController {
    ctx: Weak<ContextInner>,
    cell: Weak<QpCell>,
    qpn: u32,
}

impl QpController {
    /// The QP number.
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    /// `ibv_modify_qp` on the QP, unless it has been destroyed.
    pub(crate) fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let gone = || Error::InvalidArgument(format!("QP {:#x} was destroyed", self.qpn));
        let (ctx, cell) = (self.ctx.upgrade().ok_or_else(gone)?, self.cell.upgrade().ok_or_else(gone)?);
        // A destroyed QP's cell lingers until the engine has sent its last
        // answers; it is no longer in the context's table.
        let live = lock(&ctx.engine.shared.qps).get(&self.qpn).is_some_and(|c| Arc::ptr_eq(c, &cell));
        if !live {
            return Err(gone());
        }
        modify_cell(&ctx, &cell, attr, mask)?;
        // The engine visits the QP: a move to ERR has flush completions
        // for its CQs, and nothing else may bring the engine to it.
        ctx.engine.shared.mark_ready(&cell);
        Ok(())
    }

    /// [`QueuePair::attach_mcast`] (`attach`) or `detach_mcast` on the QP,
    /// which must be a live UD QP; `group` is a multicast address.
    pub(crate) fn multicast(&self, group: std::net::IpAddr, attach: bool) -> Result<()> {
        let gone = || Error::InvalidArgument(format!("QP {:#x} was destroyed", self.qpn));
        let (ctx, cell) = (self.ctx.upgrade().ok_or_else(gone)?, self.cell.upgrade().ok_or_else(gone)?);
        if lock(&cell.qp).qp_type() != QpType::Ud || !group.is_multicast() {
            return Err(Error::InvalidArgument(format!("QP {:#x} joins no group {group}", self.qpn)));
        }
        if attach {
            let max = ctx.device.query_device().max_mcast_qp_attach as usize;
            ctx.engine.attach_mcast(group, self.qpn, max)?;
        } else {
            ctx.engine.detach_mcast(Some(group), self.qpn);
        }
        Ok(())
    }
}

/// `ibv_modify_qp` on the shared QP; a move to RESET purges its CQs of
/// its completions once its queues are gone.
fn modify_cell(ctx: &ContextInner, cell: &QpCell, attr: &QpAttr, mask: AttrMask) -> Result<()> {
    let mut qp = lock(&cell.qp);
    let modified = qp.modify(attr, mask);
    if let Some(trace) = &ctx.trace {
        trace.modify_qp(cell.qpn, attr, mask, modified.as_ref().map_err(|e| e as &dyn std::fmt::Display).copied());
    }
    modified?;
    if mask.contains(AttrMask::STATE) && attr.state == QpState::Reset {
        cell.send_cq.purge_qp(cell.qpn);
        cell.recv_cq.purge_qp(cell.qpn);
    }
    Ok(())
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let shared = &self.ctx.engine.shared;
        let mut qps = lock(&shared.qps);
        shared.remove_qp(&mut qps, self.qpn);
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
        // It leaves its multicast groups, as in rxe.
        self.ctx.engine.detach_mcast(None, self.qpn);
        // Type 2 windows bound through it are free again: no later QP that
        // gets its number inherits them.
        shared.registry.read().unwrap_or_else(|e| e.into_inner()).unbind_qp(self.qpn);
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
    /// Local ACK timeout.
    pub timeout: AckTimeout,
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
            timeout: AckTimeout::from_exponent(14).expect("14 is an exponent"),
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

/// The local ACK timeout of a connected QP: 4.096 µs × 2^exponent, where the
/// exponent (`ibv_qp_attr::timeout`) is 5 bits and 0 means "wait forever".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AckTimeout(u8);

impl AckTimeout {
    /// Never time out: a lost packet is never resent.
    pub const INFINITE: AckTimeout = AckTimeout(0);

    /// The timeout of this exponent (0..=31), or `None` past 31.
    pub const fn from_exponent(exponent: u8) -> Option<AckTimeout> {
        if exponent <= 31 {
            Some(AckTimeout(exponent))
        } else {
            None
        }
    }

    /// The shortest timeout of at least `duration` (at most 4.096 µs × 2^31,
    /// about 2.4 hours).
    pub fn at_least(duration: Duration) -> AckTimeout {
        let units = duration.as_nanos().div_ceil(4096).max(1);
        let exponent = (u128::BITS - (units - 1).leading_zeros()).clamp(1, 31);
        AckTimeout(exponent as u8)
    }

    /// The 5-bit exponent, as `ibv_modify_qp` takes it.
    pub const fn exponent(self) -> u8 {
        self.0
    }

    /// How long it is; `None` for [`AckTimeout::INFINITE`].
    pub fn duration(self) -> Option<Duration> {
        (self.0 != 0).then(|| Duration::from_nanos(4096 << self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeouts_round_up_to_the_next_power_of_two() {
        assert_eq!(AckTimeout::at_least(Duration::ZERO).exponent(), 1);
        assert_eq!(AckTimeout::at_least(Duration::from_nanos(8192)).exponent(), 1);
        assert_eq!(AckTimeout::at_least(Duration::from_nanos(8193)).exponent(), 2);
        // perftest's default of 14 is 67 ms.
        let t = AckTimeout::at_least(Duration::from_millis(67));
        assert_eq!((t.exponent(), t.duration()), (14, Some(Duration::from_nanos(4096 << 14))));
        assert_eq!(AckTimeout::at_least(Duration::from_secs(1 << 20)).exponent(), 31);
        assert_eq!(AckTimeout::from_exponent(32), None);
        assert_eq!(AckTimeout::INFINITE.duration(), None);
    }
}
