//! The verbs objects librdmacm makes for an id: its QP (`rdma_create_qp`), the CQs and
//! completion channels a QP made without CQs gets, an SRQ, endpoints (`rdma_create_ep`), and the
//! QP attributes of `rdma_init_qp_attr`.
//!
//! The QP is an ordinary QP of this library on `id->verbs`; the softroce id it is attached to
//! moves it through its states as the connection goes (INIT now; RTR and RTS when the peer
//! answers or the program accepts; ERR on reject or disconnect), as librdmacm moves it.

use std::os::raw::c_int;
use std::ptr;

use softroce::verbs::Gid;

use super::id::{create_id, fail, locked, with_id, Id};
use crate::cm_sys::*;
use crate::guard::guard_void;
use crate::qp::{qp_state_from_ibv, Qp};
use crate::sys::*;
use crate::{cq, qp, srq};

/// Updates the C QP's `state` after the softroce id moved it.
pub(super) fn refresh_qp_state(id: &Id) {
    // SAFETY: the id's QP, from rdma_create_qp, or NULL.
    unsafe { Qp::refresh_state((*id.c()).qp) };
}

/// librdmacm's `ucma_destroy_cqs`: the CQs and channels `create_cqs` made.
unsafe fn destroy_cqs(c: *mut rdma_cm_id) {
    // SAFETY: our id's objects, made by create_cqs.
    unsafe {
        let c = &mut *c;
        if !c.recv_cq.is_null() {
            cq::ibv_destroy_cq(c.recv_cq);
            if !c.send_cq.is_null() && c.send_cq != c.recv_cq {
                cq::ibv_destroy_cq(c.send_cq);
            }
            c.recv_cq = ptr::null_mut();
        }
        c.send_cq = ptr::null_mut();
        if !c.recv_cq_channel.is_null() {
            cq::ibv_destroy_comp_channel(c.recv_cq_channel);
            if !c.send_cq_channel.is_null() && c.send_cq_channel != c.recv_cq_channel {
                cq::ibv_destroy_comp_channel(c.send_cq_channel);
            }
            c.recv_cq_channel = ptr::null_mut();
        }
        c.send_cq_channel = ptr::null_mut();
    }
}

/// librdmacm's `ucma_create_cqs`: a completion channel and a CQ on it for each side asked for
/// (size 0: none), with the id as the CQ's context.
unsafe fn create_cqs(c: *mut rdma_cm_id, send_size: u32, recv_size: u32) -> c_int {
    // SAFETY: our id; the objects are made on its context.
    unsafe {
        let verbs = (*c).verbs;
        for (size, channel, cq) in [
            (recv_size, ptr::addr_of_mut!((*c).recv_cq_channel), ptr::addr_of_mut!((*c).recv_cq)),
            (send_size, ptr::addr_of_mut!((*c).send_cq_channel), ptr::addr_of_mut!((*c).send_cq)),
        ] {
            if size == 0 {
                continue;
            }
            *channel = cq::ibv_create_comp_channel(verbs);
            if !(*channel).is_null() {
                *cq = cq::ibv_create_cq(verbs, size as c_int, c.cast(), *channel, 0);
            }
            if (*cq).is_null() {
                destroy_cqs(c);
                return -1;
            }
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    with_id(id, |found| {
        let c = found.c();
        // SAFETY: our struct and the caller's attributes.
        let (id_c, attr) = unsafe { (&mut *c, attr.as_mut()) };
        let Some(attr) = attr else { return fail(libc::EINVAL) };
        if !id_c.qp.is_null() || id_c.verbs.is_null() {
            return fail(libc::EINVAL);
        }
        if attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
            attr.comp_mask |= IBV_QP_INIT_ATTR_PD;
            attr.pd = id_c.pd;
        // SAFETY: the caller's PD.
        } else if unsafe { (*attr.pd).context } != id_c.verbs {
            return fail(libc::EINVAL);
        }
        let conflicts = |ours: *mut ibv_cq, theirs: *mut ibv_cq| !ours.is_null() && !theirs.is_null() && ours != theirs;
        if conflicts(id_c.recv_cq, attr.recv_cq) || conflicts(id_c.send_cq, attr.send_cq) {
            return fail(libc::EINVAL);
        }
        let send = if attr.send_cq.is_null() && id_c.send_cq.is_null() { attr.cap.max_send_wr } else { 0 };
        let recv = if attr.recv_cq.is_null() && id_c.recv_cq.is_null() { attr.cap.max_recv_wr } else { 0 };
        // SAFETY: our id.
        if unsafe { create_cqs(c, send, recv) } != 0 {
            return -1;
        }
        if attr.send_cq.is_null() {
            attr.send_cq = id_c.send_cq;
        }
        if attr.recv_cq.is_null() {
            attr.recv_cq = id_c.recv_cq;
        }
        if attr.srq.is_null() {
            attr.srq = id_c.srq;
        }
        // SAFETY: a QP on the id's context, with the caller's attributes.
        let new_qp = unsafe { qp::create_qp_ex(id_c.verbs, attr) };
        // SAFETY: ours, just made.
        let attached = match unsafe { Qp::queue_pair(new_qp) } {
            None => Err(-1),
            Some(queue_pair) => found.id.attach_qp(queue_pair).map_err(|e| fail(e.errno())),
        };
        if let Err(rc) = attached {
            // SAFETY: ours, just made; the CQs too.
            unsafe {
                if !new_qp.is_null() {
                    qp::ibv_destroy_qp(new_qp);
                }
                destroy_cqs(c);
            }
            return rc;
        }
        // SAFETY: ours.
        unsafe {
            Qp::refresh_state(new_qp);
            id_c.pd = (*new_qp).pd;
        }
        id_c.qp = new_qp;
        0
    })
}
symver!(rdma_create_qp_ex);

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    with_id(id, |found| {
        // SAFETY: the caller's attributes.
        let Some(init) = (unsafe { qp_init_attr.as_mut() }) else { return fail(libc::EINVAL) };
        // SAFETY: all zeros is an empty ibv_qp_init_attr_ex; ibv_qp_init_attr is its start.
        let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.qp_context = init.qp_context;
        ex.send_cq = init.send_cq;
        ex.recv_cq = init.recv_cq;
        ex.srq = init.srq;
        ex.cap = init.cap;
        ex.qp_type = init.qp_type;
        ex.sq_sig_all = init.sq_sig_all;
        ex.comp_mask = IBV_QP_INIT_ATTR_PD;
        // SAFETY: our struct.
        ex.pd = if pd.is_null() { unsafe { (*found.c()).pd } } else { pd };
        // SAFETY: our id and a local struct.
        let rc = unsafe { rdma_create_qp_ex(found.c(), &mut ex) };
        init.send_cq = ex.send_cq;
        init.recv_cq = ex.recv_cq;
        init.srq = ex.srq;
        init.cap = ex.cap;
        rc
    })
}
symver!(rdma_create_qp);

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard_void(|| {
        let Some(found) = Id::from_c(id) else { return };
        found.id.detach_qp();
        // SAFETY: our id and its QP.
        unsafe {
            let c = &mut *found.c();
            if !c.qp.is_null() {
                qp::ibv_destroy_qp(c.qp);
            }
            c.qp = ptr::null_mut();
            destroy_cqs(c);
        }
    })
}
symver!(rdma_destroy_qp);

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> c_int {
    with_id(id, |found| {
        // SAFETY: our struct.
        let c = unsafe { &mut *found.c() };
        let pd = if pd.is_null() { c.pd } else { pd };
        // SAFETY: the caller's attributes on the id's PD.
        let made = unsafe { srq::ibv_create_srq(pd, attr) };
        if made.is_null() {
            return -1;
        }
        if c.pd.is_null() {
            c.pd = pd;
        }
        c.srq = made;
        0
    })
}
symver!(rdma_create_srq);

/// Basic SRQs only: XRC is `EOPNOTSUPP`, as `ibv_create_srq_ex` answers here.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int {
    with_id(id, |found| {
        // SAFETY: the caller's attributes.
        let Some(ex) = (unsafe { attr.as_mut() }) else { return fail(libc::EINVAL) };
        if ex.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
            return fail(libc::EINVAL);
        }
        if ex.srq_type != IBV_SRQT_BASIC {
            return fail(libc::EOPNOTSUPP);
        }
        let pd = if ex.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 { ex.pd } else { ptr::null_mut() };
        let mut basic = ibv_srq_init_attr { srq_context: ex.srq_context, attr: ex.attr };
        // SAFETY: our id and a local struct.
        let rc = unsafe { rdma_create_srq(found.c(), pd, &mut basic) };
        ex.attr = basic.attr;
        rc
    })
}
symver!(rdma_create_srq_ex);

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard_void(|| {
        let Some(found) = Id::from_c(id) else { return };
        // SAFETY: our id and its SRQ.
        unsafe {
            let c = &mut *found.c();
            if !c.srq.is_null() {
                srq::ibv_destroy_srq(c.srq);
            }
            c.srq = ptr::null_mut();
            destroy_cqs(c);
        }
    })
}
symver!(rdma_destroy_srq);

/// The attributes that move a QP of the id to `qp_attr->qp_state`, for programs that move their
/// own QP (`ibv_modify_qp` with the mask returned).
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    with_id(id, |found| {
        // SAFETY: the caller's structs.
        let (Some(out), Some(mask_out)) = (unsafe { qp_attr.as_mut() }, unsafe { qp_attr_mask.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        let Some(state) = qp_state_from_ibv(out.qp_state) else { return fail(libc::EINVAL) };
        let (attr, mask) = match found.id.qp_attr(state) {
            Ok(found) => found,
            Err(e) => return fail(e.errno()),
        };
        *out = qp::qp_attr_to_ibv(&attr);
        if let Some(dest) = attr.dest {
            out.ah_attr = super::event::ah_attr_to(found, Gid::from_ip(dest));
        }
        *mask_out = mask.bits() as c_int;
        0
    })
}
symver!(rdma_init_qp_attr);

/// A synchronous id for `res` (from `rdma_getaddrinfo`): passive, bound to the source address,
/// remembering `pd` and `qp_init_attr` for `rdma_get_request`; active, resolved to the
/// destination within 2 s each for address and route, with a QP if `qp_init_attr` is given.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    crate::guard::guard_neg(|| {
        // SAFETY: the caller's result from rdma_getaddrinfo.
        let Some(res) = (unsafe { res.as_ref() }).filter(|_| !id.is_null()) else { return fail(libc::EINVAL) };
        let mut made: *mut rdma_cm_id = ptr::null_mut();
        let (ps, qp_type) = (res.ai_port_space as rdma_port_space, res.ai_qp_type as ibv_qp_type);
        // SAFETY: a new synchronous id.
        let rc = unsafe { create_id(ptr::null_mut(), &mut made, ptr::null_mut(), ps, qp_type) };
        if rc != 0 {
            return rc;
        }
        // SAFETY: the new id, the caller's addresses and attributes.
        let rc = unsafe {
            if res.ai_flags & RAI_PASSIVE as c_int != 0 {
                passive_ep(made, res, pd, qp_init_attr)
            } else {
                active_ep(made, res, pd, qp_init_attr)
            }
        };
        if rc != 0 {
            let errno = crate::errno::errno();
            // SAFETY: ours, made above.
            unsafe { rdma_destroy_ep(made) };
            crate::errno::set_errno(errno);
            return rc;
        }
        // SAFETY: the caller's pointer.
        unsafe { *id = made };
        0
    })
}
symver!(rdma_create_ep);

unsafe fn passive_ep(
    made: *mut rdma_cm_id,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: as rdma_create_ep's caller promises.
    unsafe {
        let rc = super::id::rdma_bind_addr(made, res.ai_src_addr);
        if rc != 0 {
            return rc;
        }
        if !pd.is_null() {
            (*made).pd = pd;
        }
        if let Some(attr) = qp_init_attr.as_ref() {
            let found = Id::from_c(made).expect("our new id");
            *locked(&found.ep_qp_attr) = Some(ibv_qp_init_attr { qp_type: res.ai_qp_type as ibv_qp_type, ..*attr });
        }
    }
    0
}

unsafe fn active_ep(
    made: *mut rdma_cm_id,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: as rdma_create_ep's caller promises.
    unsafe {
        let rc = super::id::rdma_resolve_addr(made, res.ai_src_addr, res.ai_dst_addr, 2000);
        if rc != 0 {
            return rc;
        }
        let rc = super::id::rdma_resolve_route(made, 2000);
        if rc != 0 {
            return rc;
        }
        match qp_init_attr.as_mut() {
            Some(attr) => {
                attr.qp_type = res.ai_qp_type as ibv_qp_type;
                rdma_create_qp(made, pd, attr)
            }
            None => 0,
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard_void(|| {
        let Some(found) = Id::from_c(id) else { return };
        // SAFETY: our id, from rdma_create_ep.
        unsafe {
            let c = &*found.c();
            if !c.qp.is_null() {
                rdma_destroy_qp(id);
            }
            if !c.srq.is_null() {
                rdma_destroy_srq(id);
            }
            super::id::rdma_destroy_id(id);
        }
    })
}
symver!(rdma_destroy_ep);
