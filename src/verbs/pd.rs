//! Protection domains (`ibv_pd`): what memory regions, queue pairs, SRQs
//! and address handles are created in.

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use memmap2::MmapMut;

use super::context::ContextInner;
use super::error::{Error, Result};
use super::gid::Gid;
use super::{AddressHandle, CompletionQueue, MemoryRegion, MemoryWindow, QueuePair, SharedReceiveQueue};
use crate::engine::threaded::{lock, QpCell};
use crate::engine::RawRegion;
use crate::random_u32;

/// The GSI QP's number (IBTA 3.5.3): QP1, which carries the CM's MADs.
pub const GSI_QPN: u32 = 1;
/// The Q_Key GSI MADs carry (IBTA 13.4.6.2).
pub const GSI_QKEY: u32 = 0x8001_0000;
use crate::transport::memory::{WindowTable, WindowType};
use crate::transport::{Access, MemError, Qp, QpCap, QpType, Sge, Srq};
use crate::wire::Psn;

/// A protection domain (`ibv_pd`).
#[derive(Debug)]
pub struct ProtectionDomain {
    pub(super) ctx: Arc<ContextInner>,
    pd: u32,
}

impl ProtectionDomain {
    pub(super) fn new(ctx: Arc<ContextInner>) -> ProtectionDomain {
        let pd = ctx.id();
        ProtectionDomain { ctx, pd }
    }

    /// The number the transport knows the domain by.
    pub(super) fn id(&self) -> u32 {
        self.pd
    }

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
        // SAFETY: the caller's promise, passed on.
        unsafe { self.reg_mr_iova(ptr, len, ptr as u64, access) }
    }

    /// Registers `len` bytes at `ptr` that peers and SGEs address as
    /// `iova ..= iova + len - 1` (`ibv_reg_mr_iova`).
    ///
    /// # Safety
    /// As for [`ProtectionDomain::reg_mr`].
    pub unsafe fn reg_mr_iova(&self, ptr: *mut u8, len: usize, iova: u64, access: Access) -> Result<MemoryRegion> {
        check_registration(ptr, len, iova, access)?;
        let mut registry = self.ctx.engine.shared.registry.write().unwrap_or_else(|e| e.into_inner());
        let key = loop {
            // Window keys have the top bit, region keys never.
            let k = random_u32() & !WindowTable::KEY_BIT;
            if k != 0 && !registry.contains(k) {
                break k;
            }
        };
        // SAFETY: the caller promised the range stays valid until the region
        // is dropped, and `MemoryRegion::drop` removes the key first.
        unsafe { registry.insert(key, RawRegion { base: ptr, len, iova, pd: self.pd, access }) };
        if let Some(trace) = &self.ctx.trace {
            // One key serves as both L_Key and R_Key, as in rxe.
            trace.call(
                "ibv_reg_mr",
                format_args!("addr={iova:#x} len={len} access={access:?} lkey={key:#x} rkey={key:#x} -> ok"),
            );
        }
        Ok(MemoryRegion { ctx: Arc::clone(&self.ctx), key, base: ptr, iova, len, access, map: None })
    }

    /// `ibv_advise_mr`: brings in the pages of on-demand regions of this
    /// domain that `sges` name ([`Advice`]), before traffic needs them; it
    /// is done when this returns (the asynchronous advice too). A key of a
    /// region that is not on demand, of another domain, or bytes outside it
    /// are `EINVAL`; pages that are not mapped, `EFAULT`.
    pub fn advise_mr(&self, advice: Advice, sges: &[Sge]) -> Result<()> {
        let registry = self.ctx.engine.shared.registry.read().unwrap_or_else(|e| e.into_inner());
        let (fault, write) = match advice {
            Advice::Prefetch => (true, false),
            Advice::PrefetchWrite => (true, true),
            Advice::PrefetchNoFault => (false, false),
        };
        for sge in sges {
            registry.prefetch(sge.lkey, self.pd, sge.addr, sge.length.into(), fault, write).map_err(|e| match e {
                MemError::Unmapped => Error::Io(std::io::Error::from_raw_os_error(libc::EFAULT)),
                e => Error::InvalidArgument(format!("advise_mr on key {:#x}: {e}", sge.lkey)),
            })?;
        }
        Ok(())
    }

    /// `ibv_alloc_mw`: an unbound memory window of this domain.
    pub fn alloc_mw(&self, kind: WindowType) -> Result<MemoryWindow> {
        let max = self.ctx.device.query_device().max_mw;
        let mut registry = self.ctx.engine.shared.registry.write().unwrap_or_else(|e| e.into_inner());
        if registry.windows_mut().len() >= max as usize {
            return Err(Error::Limit { what: "max_mw", max: max.into() });
        }
        let rkey = registry.windows_mut().alloc(self.pd, kind, random_u32);
        Ok(MemoryWindow { ctx: Arc::clone(&self.ctx), kind, rkey: AtomicU32::new(rkey) })
    }

    /// `ibv_create_qp`: the start of a QP of `qp_type` whose send and receive
    /// completions go to `cq` (see [`QpBuilder`] for the rest).
    pub fn create_qp<'a>(&'a self, qp_type: QpType, cq: &'a CompletionQueue) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sig_all: false,
            gsi: false,
        }
    }

    /// A QP in RESET, with a random first PSN. Its CQs and SRQ must belong to
    /// this context.
    fn build_qp(&self, init: &QpBuilder<'_>) -> Result<QueuePair> {
        let ours = |ctx: &Arc<ContextInner>| Arc::ptr_eq(ctx, &self.ctx);
        if !ours(&init.send_cq.ctx) || !ours(&init.recv_cq.ctx) || init.srq.is_some_and(|s| !ours(&s.ctx)) {
            return Err(Error::InvalidArgument("CQ or SRQ of another context".into()));
        }
        let limits = self.ctx.device.query_device();
        let cap = init.cap;
        let sig_all = init.sig_all;
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
        let cap = granted(cap, init.srq.is_some());
        let shared = &self.ctx.engine.shared;
        let mut qps = lock(&shared.qps);
        let qpn = match (init.gsi, init.qp_type) {
            (false, _) => self.ctx.qpn(|qpn| qps.contains_key(&qpn))?,
            (true, QpType::Ud) if !qps.contains_key(&GSI_QPN) => GSI_QPN,
            (true, QpType::Ud) => return Err(Error::InvalidArgument("the context has a GSI QP already".into())),
            (true, _) => return Err(Error::InvalidArgument("a GSI QP is a UD QP".into())),
        };
        let mut qp = Qp::new(qpn, init.qp_type, self.pd, cap, init.srq.map(|s| s.id));
        qp.set_peer_buffer(self.ctx.engine.shared.receive_buffer);
        if init.qp_type == QpType::Ud {
            // UD has no path MTU attribute: it uses the port's, as rxe does.
            qp.set_ud_mtu(self.ctx.device.active_mtu());
        }
        let cell = Arc::new(QpCell::new(
            qp,
            Arc::clone(&init.send_cq.shared),
            Arc::clone(&init.recv_cq.shared),
            init.srq.map(|s| Arc::clone(&s.srq)),
        ));
        shared.add_qp(&mut qps, Arc::clone(&cell));
        drop(qps);
        let psn = Psn::new(random_u32());
        // The CM's own QP 1 is not the program's call.
        if let Some(trace) = self.ctx.trace.as_ref().filter(|_| !init.gsi) {
            trace.call(
                "ibv_create_qp",
                format_args!(
                    "qp={qpn:#x} type={:?} send_cq={} recv_cq={} max_send_wr={} max_recv_wr={} max_inline_data={} \
                     first_psn={psn} -> ok",
                    init.qp_type,
                    init.send_cq.shared.id,
                    init.recv_cq.shared.id,
                    cap.max_send_wr,
                    cap.max_recv_wr,
                    cap.max_inline_data
                ),
            );
        }
        Ok(QueuePair { ctx: Arc::clone(&self.ctx), cell, qpn, psn, sig_all, cap })
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

/// What [`ProtectionDomain::advise_mr`] is asked (`ibv_advise_mr_advice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: bring the pages in for reading.
    Prefetch,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: bring them in writable.
    PrefetchWrite,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: only those already there
    /// (nothing to do here but the checks).
    PrefetchNoFault,
}

/// The rules of `ibv_reg_mr` (and of `ibv_rereg_mr`'s new values).
pub(super) fn check_registration(ptr: *mut u8, len: usize, iova: u64, access: Access) -> Result<()> {
    if iova.checked_add(len as u64).is_none() {
        return Err(Error::InvalidArgument(format!("{len} bytes at iova {iova:#x} wrap around 2^64")));
    }
    if ptr.is_null() || len == 0 {
        return Err(Error::InvalidArgument("null or empty memory region".into()));
    }
    // libibverbs: remote write or atomic rights need local write.
    let remote_writes = access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
    if remote_writes && !access.contains(Access::LOCAL_WRITE) {
        return Err(Error::InvalidArgument("REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE".into()));
    }
    Ok(())
}

/// What kernel rxe grants for `asked` (`rxe_init_sq`, `rxe_init_rq`), which
/// may be more: queues of 2^k − 1 entries (a ring of 2^k slots, one kept
/// empty), and a send WQE of max(SGEs × 16, inline bytes), which either may
/// fill. A program that asks for one SGE and no inline data may send 16
/// bytes inline, as `rdma_xclient` does. With an SRQ the receive side is
/// the SRQ's, as asked.
fn granted(asked: QpCap, srq: bool) -> QpCap {
    let ring = |wr: u32| (wr + 1).next_power_of_two() - 1;
    let wqe = (asked.max_send_sge * SGE_BYTES).max(asked.max_inline_data);
    QpCap {
        max_send_wr: ring(asked.max_send_wr),
        max_recv_wr: if srq { asked.max_recv_wr } else { ring(asked.max_recv_wr) },
        max_send_sge: wqe / SGE_BYTES,
        max_recv_sge: asked.max_recv_sge,
        max_inline_data: wqe,
    }
}

/// Bytes of an SGE in a send WQE (`struct ib_sge`).
const SGE_BYTES: u32 = 16;

/// What a QP is created with (`ibv_qp_init_attr`), from
/// [`ProtectionDomain::create_qp`]: both CQs default to the one given, no
/// SRQ, [`QpCap::default`] and only signaled sends completing.
#[derive(Debug, Clone, Copy)]
#[must_use = "a QP builder does nothing until `build`"]
pub struct QpBuilder<'a> {
    pd: &'a ProtectionDomain,
    qp_type: QpType,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    srq: Option<&'a SharedReceiveQueue>,
    cap: QpCap,
    sig_all: bool,
    gsi: bool,
}

impl<'a> QpBuilder<'a> {
    /// Receive completions go to `cq` instead.
    pub fn recv_cq(mut self, cq: &'a CompletionQueue) -> QpBuilder<'a> {
        self.recv_cq = cq;
        self
    }

    /// Receives come from `srq` instead of the QP's own receive queue.
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> QpBuilder<'a> {
        self.srq = Some(srq);
        self
    }

    /// Queue capacities, within the device's limits.
    pub fn cap(mut self, cap: QpCap) -> QpBuilder<'a> {
        self.cap = cap;
        self
    }

    /// Every send completes, signaled or not (`sq_sig_all`).
    pub fn sig_all(mut self, sig_all: bool) -> QpBuilder<'a> {
        self.sig_all = sig_all;
        self
    }

    /// The context's GSI QP: a UD QP numbered 1, which receives the CM's
    /// MADs (Q_Key [`GSI_QKEY`]) that reach this process (rxe-spec N-5).
    /// One per context.
    pub fn gsi(mut self) -> QpBuilder<'a> {
        self.gsi = true;
        self
    }

    /// Creates the QP, in RESET.
    pub fn build(self) -> Result<QueuePair> {
        self.pd.build_qp(&self)
    }
}
