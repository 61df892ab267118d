//! Queue pairs: create, modify, query and destroy, and the post calls
//! behind the `ibv_post_send` and `ibv_post_recv` inlines.

use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Mutex;

use softroce::verbs::{
    Access, AttrMask, Gid, InlineData, Mtu, Psn, QpAttr, QpCap, QpState, QpType, QueuePair, RecvWr, SendFlags, SendOp,
    SendWr, SgList, Sge,
};

use crate::cq::Cq;
use crate::errno::set_errno;
use crate::guard::{guard_int, guard_ptr};
use crate::mw;
use crate::pd::{Ah, Pd};
use crate::srq::Srq;
use crate::sys::*;

/// A queue pair as C sees it. Programs read `qp_num` and `state` from the
/// struct, so `state` follows every change made through `ibv_modify_qp`.
#[repr(C)]
pub struct Qp {
    ibv: ibv_qp_ex,
    qp: QueuePair,
    pd: &'static Pd,
    send_cq: &'static Cq,
    recv_cq: &'static Cq,
    srq: Option<&'static Srq>,
    sq_sig_all: bool,
    /// The address vector last set, which `ibv_query_qp` returns.
    ah_attr: Mutex<ibv_ah_attr>,
    /// Made with `ibv_create_qp_ex` and send ops: the `ibv_wr_*` API works.
    extended: bool,
    building: Mutex<Building>,
}

// SAFETY: the C struct's pointers name objects of this library that live
// at least as long as the QP; the Rust parts are Send and Sync.
unsafe impl Send for Qp {}
unsafe impl Sync for Qp {}

impl Qp {
    unsafe fn from_ibv<'a>(qp: *mut ibv_qp) -> Option<&'a Qp> {
        // SAFETY: ibv_qp opens the ibv_qp_ex that opens a Qp.
        unsafe { qp.cast::<Qp>().as_ref() }
    }

    /// The softroce QP behind a C one, for the connection manager to drive.
    ///
    /// # Safety
    /// `qp` is NULL or from this library's `ibv_create_qp` and not destroyed.
    pub(crate) unsafe fn queue_pair<'a>(qp: *mut ibv_qp) -> Option<&'a QueuePair> {
        // SAFETY: as the caller promises.
        unsafe { Qp::from_ibv(qp) }.map(|found| &found.qp)
    }

    /// Updates the `state` programs read after the connection manager moved the QP.
    ///
    /// # Safety
    /// As [`Qp::queue_pair`].
    pub(crate) unsafe fn refresh_state(qp: *mut ibv_qp) {
        // SAFETY: as the caller promises.
        if let Some(found) = unsafe { Qp::from_ibv(qp) } {
            found.set_state();
        }
    }

    fn set_state(&self) {
        let state = qp_state_to_ibv(self.qp.state());
        // SAFETY: the program reads `state` but writes it only through
        // ibv_modify_qp, which the program serialises with its own reads.
        unsafe { ptr::addr_of!(self.ibv.qp_base.state).cast_mut().write(state) };
    }
}

pub(crate) fn qp_state_to_ibv(state: QpState) -> ibv_qp_state {
    match state {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Sqd => IBV_QPS_SQD,
        QpState::Sqe => IBV_QPS_SQE,
        QpState::Err => IBV_QPS_ERR,
    }
}

pub(crate) fn qp_state_from_ibv(state: ibv_qp_state) -> Option<QpState> {
    Some(match state {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

fn cap_to_ibv(cap: QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard_ptr(|| {
        let Some(init) = (unsafe { init.as_mut() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        match unsafe { create(pd, init, None) } {
            Ok(qp) => qp.cast(),
            Err(errno) => {
                set_errno(errno);
                ptr::null_mut()
            }
        }
    })
}
symver!(ibv_create_qp);

/// `verbs_context::create_qp_ex`, behind `ibv_create_qp_ex`: with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, the QP takes work requests through
/// the `ibv_wr_*` functions of its `ibv_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    _context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard_ptr(|| {
        let Some(attr) = (unsafe { attr.as_mut() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // Creation flags are accepted when none is set: the device claims
        // none of them (device_cap_flags_ex is 0).
        let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
        if attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let flags = if attr.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 { attr.create_flags } else { 0 };
        if attr.comp_mask & !known != 0 || flags != 0 {
            set_errno(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        let send_ops = (attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(attr.send_ops_flags);
        if send_ops.is_some_and(|ops| ops & !SEND_OPS != 0) {
            set_errno(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        // What the extended attributes share with the classic ones.
        let mut request = ibv_qp_init_attr {
            qp_context: attr.qp_context,
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            srq: attr.srq,
            cap: attr.cap,
            qp_type: attr.qp_type,
            sq_sig_all: attr.sq_sig_all,
        };
        match unsafe { create(attr.pd, &mut request, send_ops) } {
            Ok(qp) => {
                attr.cap = request.cap;
                qp.cast()
            }
            Err(errno) => {
                set_errno(errno);
                ptr::null_mut()
            }
        }
    })
}

/// Creates the QP; `request.cap` becomes what it got, which may be more
/// than asked for.
unsafe fn create(pd: *mut ibv_pd, request: &mut ibv_qp_init_attr, send_ops: Option<u64>) -> Result<*mut Qp, c_int> {
    let found = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
    let qp_type = match request.qp_type {
        IBV_QPT_RC => QpType::Rc,
        IBV_QPT_UC => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        _ => return Err(libc::EOPNOTSUPP),
    };
    let send_cq = unsafe { Cq::from_ibv(request.send_cq) }.ok_or(libc::EINVAL)?;
    let recv_cq = unsafe { Cq::from_ibv(request.recv_cq) }.ok_or(libc::EINVAL)?;
    let srq = unsafe { Srq::from_ibv(request.srq) };
    let asked = &request.cap;
    let cap = QpCap {
        max_send_wr: asked.max_send_wr,
        max_recv_wr: asked.max_recv_wr,
        max_send_sge: asked.max_send_sge,
        max_recv_sge: asked.max_recv_sge,
        max_inline_data: asked.max_inline_data,
    };
    let mut builder = found.pd.create_qp(qp_type, &send_cq.cq).recv_cq(&recv_cq.cq).cap(cap);
    if let Some(srq) = srq {
        builder = builder.srq(&srq.srq);
    }
    let qp = builder.sig_all(request.sq_sig_all != 0).build().map_err(|e| e.errno())?;
    request.cap = cap_to_ibv(qp.cap());
    // SAFETY: all zeros is a valid ibv_qp_ex (NULL wr_* functions, an
    // initialised glibc mutex and condition variable).
    let mut ibv: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let base = &mut ibv.qp_base;
    base.context = found.ctx.ibv();
    base.qp_context = request.qp_context;
    base.pd = pd;
    base.send_cq = request.send_cq;
    base.recv_cq = request.recv_cq;
    base.srq = request.srq;
    base.qp_num = qp.qpn();
    base.handle = qp.qpn();
    base.state = IBV_QPS_RESET;
    base.qp_type = request.qp_type;
    if let Some(ops) = send_ops {
        install_wr_functions(&mut ibv, ops);
    }
    // SAFETY: the PD, CQs and SRQ count this QP among their users, so
    // their destroys fail with EBUSY while it lives.
    let (pd_ref, send_ref, recv_ref, srq_ref) = unsafe {
        (&*ptr::from_ref(found), &*ptr::from_ref(send_cq), &*ptr::from_ref(recv_cq), srq.map(|s| &*ptr::from_ref(s)))
    };
    pd_ref.users.hold();
    send_ref.users.hold();
    recv_ref.users.hold();
    if let Some(s) = srq_ref {
        s.users.hold();
    }
    let qpn = qp.qpn();
    let boxed = Box::new(Qp {
        ibv,
        qp,
        pd: pd_ref,
        send_cq: send_ref,
        recv_cq: recv_ref,
        srq: srq_ref,
        sq_sig_all: request.sq_sig_all != 0,
        // SAFETY: all zeros is a valid ibv_ah_attr.
        ah_attr: Mutex::new(unsafe { std::mem::zeroed() }),
        extended: send_ops.is_some(),
        building: Mutex::new(Building::default()),
    });
    let raw = Box::leak(boxed) as *mut Qp;
    found.ctx.qps.lock().unwrap_or_else(|e| e.into_inner()).insert(qpn, raw as usize);
    Ok(raw)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    match unsafe { Qp::from_ibv(qp) } {
        Some(found) if found.extended => qp.cast(),
        _ => {
            set_errno(libc::EOPNOTSUPP);
            ptr::null_mut()
        }
    }
}
symver!(ibv_qp_to_qp_ex);

/// The send operations the `ibv_wr_*` API offers here.
const SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_ATOMIC_WRITE) as u64;

/// The requests between `ibv_wr_start` and `ibv_wr_complete`, and the
/// first mistake made while building them, which fails the whole batch.
#[derive(Default)]
struct Building {
    requests: Vec<SendWr>,
    error: Option<c_int>,
}

fn install_wr_functions(ibv: &mut ibv_qp_ex, ops: u64) {
    let has = |flag: u32| ops & u64::from(flag) != 0;
    ibv.wr_start = Some(wr_start);
    ibv.wr_complete = Some(wr_complete);
    ibv.wr_abort = Some(wr_abort);
    ibv.wr_set_sge = Some(wr_set_sge);
    ibv.wr_set_sge_list = Some(wr_set_sge_list);
    ibv.wr_set_inline_data = Some(wr_set_inline_data);
    ibv.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ibv.wr_set_ud_addr = Some(wr_set_ud_addr);
    // An operation the QP was not created for makes wr_complete fail.
    ibv.wr_send = Some(if has(IBV_QP_EX_WITH_SEND) { wr_send } else { refuse_send });
    ibv.wr_send_imm = Some(if has(IBV_QP_EX_WITH_SEND_WITH_IMM) { wr_send_imm } else { refuse_send_imm });
    ibv.wr_send_inv = Some(if has(IBV_QP_EX_WITH_SEND_WITH_INV) { wr_send_inv } else { refuse_send_inv });
    ibv.wr_rdma_write = Some(if has(IBV_QP_EX_WITH_RDMA_WRITE) { wr_rdma_write } else { refuse_rdma });
    ibv.wr_rdma_write_imm =
        Some(if has(IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) { wr_rdma_write_imm } else { refuse_rdma_imm });
    ibv.wr_rdma_read = Some(if has(IBV_QP_EX_WITH_RDMA_READ) { wr_rdma_read } else { refuse_rdma });
    ibv.wr_atomic_cmp_swp =
        Some(if has(IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) { wr_atomic_cmp_swp } else { refuse_cmp_swp });
    ibv.wr_atomic_fetch_add =
        Some(if has(IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) { wr_atomic_fetch_add } else { refuse_fetch_add });
    ibv.wr_bind_mw = Some(if has(IBV_QP_EX_WITH_BIND_MW) { wr_bind_mw } else { refuse_bind_mw });
    ibv.wr_local_inv = Some(if has(IBV_QP_EX_WITH_LOCAL_INV) { wr_local_inv } else { refuse_send_inv });
    ibv.wr_atomic_write = Some(if has(IBV_QP_EX_WITH_ATOMIC_WRITE) { wr_atomic_write } else { refuse_atomic_write });
}

/// Runs `f` on the QP behind an `ibv_qp_ex` and its batch in progress.
unsafe fn building(qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut Building)) {
    // SAFETY: extended QPs come from create_qp_ex.
    if let Some(found) = unsafe { Qp::from_ibv(qp.cast()) } {
        let mut batch = found.building.lock().unwrap_or_else(|e| e.into_inner());
        f(found, &mut batch);
    }
}

/// Starts a request of `op` with the `wr_id` and `wr_flags` the program
/// set in the `ibv_qp_ex`.
unsafe fn begin(qp: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: the program writes these fields before each wr_* call.
    let (wr_id, flags) = unsafe { ((*qp).wr_id, (*qp).wr_flags) };
    unsafe {
        building(qp, |_, batch| {
            let mut wr = SendWr::new(wr_id, op);
            wr.flags = SendFlags {
                fence: flags & IBV_SEND_FENCE != 0,
                signaled: flags & IBV_SEND_SIGNALED != 0,
                solicited: flags & IBV_SEND_SOLICITED != 0,
                inline: false,
            };
            batch.requests.push(wr);
        })
    }
}

/// Amends the request begun last; setting data with none begun is an error.
unsafe fn amend(qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut SendWr) -> Result<(), c_int>) {
    unsafe {
        building(qp, |found, batch| {
            let result = match batch.requests.last_mut() {
                Some(wr) => f(found, wr),
                None => Err(libc::EINVAL),
            };
            if let Err(errno) = result {
                batch.error.get_or_insert(errno);
            }
        })
    }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    unsafe { building(qp, |_, batch| *batch = Building::default()) }
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    unsafe { building(qp, |_, batch| *batch = Building::default()) }
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Qp::from_ibv(qp.cast()) }) else { return libc::EINVAL };
        let batch = std::mem::take(&mut *found.building.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(errno) = batch.error {
            return errno;
        }
        match found.qp.post_send_list(batch.requests) {
            Ok(()) => 0,
            Err((_, e)) => e.errno(),
        }
    })
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    unsafe { begin(qp, SendOp::Send) }
}
unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: __be32) {
    unsafe { begin(qp, SendOp::SendWithImm(u32::from_be(imm_data))) }
}
unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    unsafe { begin(qp, SendOp::SendWithInv(invalidate_rkey)) }
}
unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    unsafe { begin(qp, SendOp::RdmaWrite { remote_addr, rkey }) }
}
unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm_data: __be32) {
    unsafe { begin(qp, SendOp::RdmaWriteWithImm { remote_addr, rkey, imm: u32::from_be(imm_data) }) }
}
unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    unsafe { begin(qp, SendOp::RdmaRead { remote_addr, rkey }) }
}
unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
    unsafe { begin(qp, SendOp::CompareSwap { remote_addr, rkey, compare, swap }) }
}
unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    unsafe { begin(qp, SendOp::FetchAdd { remote_addr, rkey, add }) }
}

unsafe extern "C" fn wr_bind_mw(qp: *mut ibv_qp_ex, mw: *mut ibv_mw, rkey: u32, info: *const ibv_mw_bind_info) {
    // SAFETY: the program's window and bind description.
    match unsafe { info.as_ref() }.map(|info| unsafe { mw::bind_request(mw, rkey, info) }) {
        Some(Ok(bind)) => unsafe { begin(qp, SendOp::BindMw(bind)) },
        _ => unsafe { refuse(qp) },
    }
}
unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    unsafe { begin(qp, SendOp::LocalInv(invalidate_rkey)) }
}
/// The 8 bytes at `atomic_wr` are copied now, as inline data.
unsafe extern "C" fn wr_atomic_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, atomic_wr: *const c_void) {
    if atomic_wr.is_null() {
        return unsafe { refuse(qp) };
    }
    // SAFETY: the program's 8 bytes of data.
    let data = InlineData::from_slice(unsafe { std::slice::from_raw_parts(atomic_wr.cast::<u8>(), 8) });
    unsafe { begin(qp, SendOp::AtomicWrite { remote_addr, rkey }) };
    unsafe {
        amend(qp, |_, wr| {
            wr.flags.inline = true;
            wr.inline_data = data;
            Ok(())
        })
    }
}

/// Marks the batch failed: the operation is not among the QP's send ops,
/// or its arguments are wrong.
unsafe fn refuse(qp: *mut ibv_qp_ex) {
    unsafe { building(qp, |_, batch| _ = batch.error.get_or_insert(libc::EINVAL)) }
}
unsafe extern "C" fn refuse_send(qp: *mut ibv_qp_ex) {
    unsafe { refuse(qp) }
}
unsafe extern "C" fn refuse_send_imm(qp: *mut ibv_qp_ex, _: __be32) {
    unsafe { refuse(qp) }
}
unsafe extern "C" fn refuse_send_inv(qp: *mut ibv_qp_ex, _: u32) {
    unsafe { refuse(qp) }
}
unsafe extern "C" fn refuse_atomic_write(qp: *mut ibv_qp_ex, _: u32, _: u64, _: *const c_void) {
    unsafe { refuse(qp) }
}
unsafe extern "C" fn refuse_bind_mw(qp: *mut ibv_qp_ex, _: *mut ibv_mw, _: u32, _: *const ibv_mw_bind_info) {
    unsafe { refuse(qp) }
}
unsafe extern "C" fn refuse_rdma(qp: *mut ibv_qp_ex, _: u32, _: u64) {
    unsafe { refuse(qp) }
}
unsafe extern "C" fn refuse_rdma_imm(qp: *mut ibv_qp_ex, _: u32, _: u64, _: __be32) {
    unsafe { refuse(qp) }
}
unsafe extern "C" fn refuse_cmp_swp(qp: *mut ibv_qp_ex, _: u32, _: u64, _: u64, _: u64) {
    unsafe { refuse(qp) }
}
unsafe extern "C" fn refuse_fetch_add(qp: *mut ibv_qp_ex, _: u32, _: u64, _: u64) {
    unsafe { refuse(qp) }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    unsafe {
        amend(qp, |_, wr| {
            wr.sg_list = softroce::sg_list![Sge { addr, length, lkey }];
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    let list = unsafe { sges(sg_list, c_int::try_from(num_sge).unwrap_or(-1)) };
    unsafe {
        amend(qp, |_, wr| {
            wr.sg_list = list?;
            Ok(())
        })
    }
}

/// Copies inline data now, as the call requires.
unsafe fn set_inline(found: &Qp, wr: &mut SendWr, buffers: &[(*const u8, usize)]) -> Result<(), c_int> {
    let total: usize = buffers.iter().map(|(_, len)| len).sum();
    if total > found.qp.cap().max_inline_data as usize || buffers.iter().any(|(p, len)| p.is_null() && *len > 0) {
        return Err(libc::EINVAL);
    }
    wr.inline_data.clear();
    for &(addr, len) in buffers {
        if len > 0 {
            // SAFETY: the program's buffer of `len` bytes.
            wr.inline_data.extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) });
        }
    }
    wr.sg_list.clear();
    wr.flags.inline = true;
    Ok(())
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    unsafe { amend(qp, |found, wr| set_inline(found, wr, &[(addr.cast_const().cast(), length)])) }
}

unsafe extern "C" fn wr_set_inline_data_list(qp: *mut ibv_qp_ex, num_buf: usize, buf_list: *const ibv_data_buf) {
    let buffers: Vec<(*const u8, usize)> = if buf_list.is_null() {
        Vec::new()
    } else {
        // SAFETY: the program's array of num_buf buffers.
        unsafe { std::slice::from_raw_parts(buf_list, num_buf) }
            .iter()
            .map(|b| (b.addr.cast_const().cast(), b.length))
            .collect()
    };
    unsafe { amend(qp, |found, wr| set_inline(found, wr, &buffers)) }
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    unsafe {
        amend(qp, |_, wr| {
            let ah = Ah::from_ibv(ah).ok_or(libc::EINVAL)?;
            wr.ud = Some(ah.ah.ud_dest(remote_qpn, remote_qkey));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Qp::from_ibv(qp) }) else { return libc::EINVAL };
        found.pd.ctx.qps.lock().unwrap_or_else(|e| e.into_inner()).remove(&found.qp.qpn());
        // SAFETY: leaked from a Box by ibv_create_qp.
        let boxed = unsafe { Box::from_raw(qp.cast::<Qp>()) };
        let (pd, send_cq, recv_cq, srq) = (boxed.pd, boxed.send_cq, boxed.recv_cq, boxed.srq);
        drop(boxed);
        pd.users.release();
        send_cq.users.release();
        recv_cq.users.release();
        if let Some(s) = srq {
            s.users.release();
        }
        0
    })
}
symver!(ibv_destroy_qp);

/// `ibv_qp_attr` and its mask as the transport takes them. The mask bits
/// are libibverbs' (`AttrMask` uses the same numbering).
fn qp_attr_from_ibv(qp: &Qp, attr: &ibv_qp_attr, mask: c_int) -> Result<(QpAttr, AttrMask), c_int> {
    let mask = AttrMask::from_bits(mask as u32);
    let mut out = QpAttr::default();
    if mask.contains(AttrMask::STATE) {
        out.state = qp_state_from_ibv(attr.qp_state).ok_or(libc::EINVAL)?;
    }
    if mask.contains(AttrMask::CUR_STATE) {
        out.cur_state = qp_state_from_ibv(attr.cur_qp_state).ok_or(libc::EINVAL)?;
    }
    // Binding windows is allowed and changes nothing here.
    out.access_flags = Access::from_bits(attr.qp_access_flags & !IBV_ACCESS_MW_BIND).ok_or(libc::EINVAL)?;
    out.pkey_index = attr.pkey_index;
    out.port = attr.port_num;
    out.qkey = attr.qkey;
    if mask.contains(AttrMask::AV) {
        let av = &attr.ah_attr;
        // RoCE has no LIDs: an address vector without a GRH names nobody (rxe: EINVAL).
        if av.is_global == 0 {
            return Err(libc::EINVAL);
        }
        if qp.pd.ctx.ctx.device().gid(av.grh.sgid_index.into()).is_none() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a GID is 16 bytes whichever union member wrote it.
        out.dest = Some(Gid::from(unsafe { av.grh.dgid.raw }).to_ip());
    }
    if mask.contains(AttrMask::PATH_MTU) {
        out.path_mtu = Mtu::from_ibv(attr.path_mtu).ok_or(libc::EINVAL)?;
    }
    out.timeout = attr.timeout;
    out.retry_cnt = attr.retry_cnt;
    out.rnr_retry = attr.rnr_retry;
    out.rq_psn = Psn::new(attr.rq_psn);
    out.sq_psn = Psn::new(attr.sq_psn);
    out.max_rd_atomic = attr.max_rd_atomic;
    out.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    out.min_rnr_timer = attr.min_rnr_timer;
    out.dest_qpn = attr.dest_qp_num;
    out.en_sqd_async_notify = attr.en_sqd_async_notify != 0;
    Ok((out, mask))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
    guard_int(|| {
        let (Some(found), Some(attr)) = (unsafe { Qp::from_ibv(qp) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let (converted, mask) = match qp_attr_from_ibv(found, attr, attr_mask) {
            Ok(v) => v,
            Err(errno) => return errno,
        };
        if let Err(e) = found.qp.modify(&converted, mask) {
            return e.errno();
        }
        if mask.contains(AttrMask::AV) {
            *found.ah_attr.lock().unwrap_or_else(|e| e.into_inner()) = attr.ah_attr;
        }
        found.set_state();
        0
    })
}
symver!(ibv_modify_qp);

/// The attributes of `q` that have a field of their own in `ibv_qp_attr`; the
/// rest (address vector, capabilities, current state) is each caller's.
pub(crate) fn qp_attr_to_ibv(q: &QpAttr) -> ibv_qp_attr {
    // SAFETY: all zeros is a valid ibv_qp_attr.
    let mut out: ibv_qp_attr = unsafe { std::mem::zeroed() };
    out.qp_state = qp_state_to_ibv(q.state);
    out.path_mtu = q.path_mtu as ibv_mtu;
    out.qkey = q.qkey;
    out.rq_psn = q.rq_psn.value();
    out.sq_psn = q.sq_psn.value();
    out.dest_qp_num = q.dest_qpn;
    out.qp_access_flags = q.access_flags.bits();
    out.pkey_index = q.pkey_index;
    out.max_rd_atomic = q.max_rd_atomic;
    out.max_dest_rd_atomic = q.max_dest_rd_atomic;
    out.min_rnr_timer = q.min_rnr_timer;
    out.port_num = q.port;
    out.timeout = q.timeout;
    out.retry_cnt = q.retry_cnt;
    out.rnr_retry = q.rnr_retry;
    out
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Qp::from_ibv(qp) }) else { return libc::EINVAL };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let q = found.qp.query();
        let cap = cap_to_ibv(found.qp.cap());
        let mut out = qp_attr_to_ibv(&q);
        out.cur_qp_state = out.qp_state;
        out.cap = cap;
        out.ah_attr = *found.ah_attr.lock().unwrap_or_else(|e| e.into_inner());
        out.en_sqd_async_notify = q.en_sqd_async_notify.into();
        out.sq_draining = u8::from(q.state == QpState::Sqd);
        let base = &found.ibv.qp_base;
        let init = ibv_qp_init_attr {
            qp_context: base.qp_context,
            send_cq: base.send_cq,
            recv_cq: base.recv_cq,
            srq: base.srq,
            cap,
            qp_type: base.qp_type,
            sq_sig_all: found.sq_sig_all.into(),
        };
        // SAFETY: the caller's structs.
        unsafe {
            attr.write(out);
            init_attr.write(init);
        }
        0
    })
}
symver!(ibv_query_qp);

/// Reads `n` SGEs of a C work request.
pub(crate) unsafe fn sges(list: *const ibv_sge, n: c_int) -> Result<SgList, c_int> {
    // SAFETY: as the caller promises.
    let c = unsafe { c_sges(list, n) }?;
    Ok(c.iter().map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect())
}

/// The program's array of `n` SGEs at `list`, as it passed them.
///
/// # Safety
/// `list` must point at `n` SGEs (or be anything, if `n` is 0).
unsafe fn c_sges<'a>(list: *const ibv_sge, n: c_int) -> Result<&'a [ibv_sge], c_int> {
    match n {
        0 => Ok(&[]),
        n if n < 0 || list.is_null() => Err(libc::EINVAL),
        // SAFETY: as the caller promises.
        n => Ok(unsafe { std::slice::from_raw_parts(list, n as usize) }),
    }
}

/// A C send work request as the verbs API takes it. Inline data is copied
/// now, from the program's buffers, as the call requires.
unsafe fn send_wr(qp: &Qp, wr: &ibv_send_wr) -> Result<SendWr, c_int> {
    // SAFETY: the members of the unions are read as the opcode says they were written.
    let (rdma, atomic, ud, imm) = unsafe { (wr.wr.rdma, wr.wr.atomic, wr.wr.ud, wr.__bindgen_anon_1.imm_data) };
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm(u32::from_be(imm)),
        // SAFETY: as above.
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv(unsafe { wr.__bindgen_anon_1.invalidate_rkey }),
        IBV_WR_RDMA_WRITE => SendOp::RdmaWrite { remote_addr: rdma.remote_addr, rkey: rdma.rkey },
        IBV_WR_RDMA_WRITE_WITH_IMM => {
            SendOp::RdmaWriteWithImm { remote_addr: rdma.remote_addr, rkey: rdma.rkey, imm: u32::from_be(imm) }
        }
        IBV_WR_RDMA_READ => SendOp::RdmaRead { remote_addr: rdma.remote_addr, rkey: rdma.rkey },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => {
            SendOp::FetchAdd { remote_addr: atomic.remote_addr, rkey: atomic.rkey, add: atomic.compare_add }
        }
        IBV_WR_BIND_MW => {
            // SAFETY: as above; the window and region are the program's.
            let bind = unsafe { wr.__bindgen_anon_2.bind_mw };
            SendOp::BindMw(unsafe { mw::bind_request(bind.mw, bind.rkey, &bind.bind_info) }?)
        }
        // SAFETY: as above.
        IBV_WR_LOCAL_INV => SendOp::LocalInv(unsafe { wr.__bindgen_anon_1.invalidate_rkey }),
        // Its 8 bytes come from its one SGE, or inline.
        IBV_WR_ATOMIC_WRITE => SendOp::AtomicWrite { remote_addr: rdma.remote_addr, rkey: rdma.rkey },
        _ => return Err(libc::EINVAL),
    };
    let flags = SendFlags {
        fence: wr.send_flags & IBV_SEND_FENCE != 0,
        signaled: wr.send_flags & IBV_SEND_SIGNALED != 0,
        solicited: wr.send_flags & IBV_SEND_SOLICITED != 0,
        inline: wr.send_flags & IBV_SEND_INLINE != 0,
    };
    let mut out =
        SendWr { wr_id: wr.wr_id, op, sg_list: SgList::new(), flags, inline_data: InlineData::new(), ud: None };
    if flags.inline && !op.is_atomic() {
        // SAFETY: the program's SGEs.
        let c = unsafe { c_sges(wr.sg_list, wr.num_sge) }?;
        let total: usize = c.iter().map(|s| s.length as usize).sum();
        if total > qp.qp.cap().max_inline_data as usize {
            return Err(libc::EINVAL);
        }
        out.inline_data.reserve_exact(total);
        for sge in c {
            // SAFETY: an inline SGE names the program's own bytes by their
            // address, registered or not; they are copied before the call returns.
            let bytes = unsafe { std::slice::from_raw_parts(sge.addr as *const u8, sge.length as usize) };
            out.inline_data.extend_from_slice(bytes);
        }
    } else {
        out.sg_list = unsafe { sges(wr.sg_list, wr.num_sge) }?;
    }
    if qp.ibv.qp_base.qp_type == IBV_QPT_UD {
        let Some(ah) = (unsafe { Ah::from_ibv(ud.ah) }) else { return Err(libc::EINVAL) };
        out.ud = Some(ah.ah.ud_dest(ud.remote_qpn, ud.remote_qkey));
    }
    Ok(out)
}

/// The QP joins multicast group `gid` (rxe-spec V-23); `lid` means nothing
/// on RoCE.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    unsafe { with_group(qp, gid, QueuePair::attach_mcast) }
}
symver!(ibv_attach_mcast);

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    unsafe { with_group(qp, gid, QueuePair::detach_mcast) }
}
symver!(ibv_detach_mcast);

/// Runs `f` (attach or detach) on the QP and group GID a program passed.
///
/// # Safety
/// `qp` and `gid` must be NULL or the program's QP and GID.
unsafe fn with_group(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    f: fn(&QueuePair, Gid) -> softroce::verbs::Result<()>,
) -> c_int {
    guard_int(|| {
        // SAFETY: as the caller promises.
        let (Some(found), Some(gid)) = (unsafe { Qp::queue_pair(qp) }, unsafe { gid.as_ref() }) else {
            return libc::EINVAL;
        };
        // SAFETY: a GID is 16 bytes whichever union member wrote it.
        match f(found, Gid::from(unsafe { gid.raw })) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_context_ops::post_send`: posts the chain in order; at the first
/// request that fails, `*bad_wr` names it and the ones before it stay posted.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Qp::from_ibv(qp) }) else { return libc::EINVAL };
        let report = |at: *mut ibv_send_wr, errno: c_int| {
            if !bad_wr.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { *bad_wr = at };
            }
            errno
        };
        // SAFETY: the program's chain of requests, ended by a NULL `next`.
        if let Some(only) = unsafe { wr.as_ref() }.filter(|request| request.next.is_null()) {
            // One request, as most posts are: no lists to gather.
            let posted = unsafe { send_wr(found, only) }.and_then(|w| found.qp.post_send(w).map_err(|e| e.errno()));
            return posted.map_or_else(|errno| report(wr, errno), |()| 0);
        }
        let mut converted = Vec::new();
        let mut sources = Vec::new();
        let mut failed = None;
        let mut cur = wr;
        // SAFETY: the program's chain of requests, ended by a NULL `next`.
        while let Some(request) = unsafe { cur.as_ref() } {
            match unsafe { send_wr(found, request) } {
                Ok(w) => {
                    converted.push(w);
                    sources.push(cur);
                }
                Err(errno) => {
                    failed = Some((cur, errno));
                    break;
                }
            }
            cur = request.next;
        }
        if let Err((index, e)) = found.qp.post_send_list(converted) {
            return report(sources[index], e.errno());
        }
        match failed {
            Some((at, errno)) => report(at, errno),
            None => 0,
        }
    })
}

/// `ibv_context_ops::post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Qp::from_ibv(qp) }) else { return libc::EINVAL };
        let mut cur = wr;
        // SAFETY: the program's chain of requests, ended by a NULL `next`.
        while let Some(request) = unsafe { cur.as_ref() } {
            let posted = unsafe { sges(request.sg_list, request.num_sge) }.and_then(|sg_list| {
                found.qp.post_recv(RecvWr { wr_id: request.wr_id, sg_list }).map_err(|e| e.errno())
            });
            if let Err(errno) = posted {
                if !bad_wr.is_null() {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *bad_wr = cur };
                }
                return errno;
            }
            cur = request.next;
        }
        0
    })
}
