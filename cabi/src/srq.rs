//! Shared receive queues.

use std::os::raw::c_int;
use std::ptr;

use softroce::verbs::{RecvWr, SharedReceiveQueue};

use crate::errno::set_errno;
use crate::guard::{guard_int, guard_ptr};
use crate::pd::Pd;
use crate::qp::sges;
use crate::sys::*;
use crate::users::Users;

/// A shared receive queue as C sees it, with a count of the QPs on it.
#[repr(C)]
pub struct Srq {
    ibv: ibv_srq,
    pub(crate) srq: SharedReceiveQueue,
    pd: &'static Pd,
    pub(crate) users: Users,
}

impl Srq {
    /// # Safety
    /// `srq` must be NULL or come from [`ibv_create_srq`] and not be destroyed.
    pub(crate) unsafe fn from_ibv<'a>(srq: *mut ibv_srq) -> Option<&'a Srq> {
        // SAFETY: ibv_srq is the first field of an Srq.
        unsafe { srq.cast::<Srq>().as_ref() }
    }

    fn write_attr(&self, attr: &mut ibv_srq_attr) {
        let (max_wr, max_sge, srq_limit) = self.srq.attr();
        *attr = ibv_srq_attr { max_wr, max_sge, srq_limit };
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard_ptr(|| {
        let (Some(found), Some(init)) = (unsafe { Pd::from_ibv(pd) }, unsafe { init.as_mut() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let srq = match found.pd.create_srq(init.attr.max_wr, init.attr.max_sge) {
            Ok(srq) => srq,
            Err(e) => {
                set_errno(e.errno());
                return ptr::null_mut();
            }
        };
        if init.attr.srq_limit > 0 {
            srq.arm_limit(init.attr.srq_limit);
        }
        // SAFETY: all zeros is a valid ibv_srq (an initialised glibc mutex
        // and condition variable).
        let mut ibv: ibv_srq = unsafe { std::mem::zeroed() };
        ibv.context = found.ctx.ibv();
        ibv.srq_context = init.srq_context;
        ibv.pd = pd;
        let id = srq.id();
        found.users.hold();
        // SAFETY: PDs outlive their SRQs (dealloc is EBUSY while any lives).
        let pd_ref: &'static Pd = unsafe { &*ptr::from_ref(found) };
        let raw = Box::leak(Box::new(Srq { ibv, srq, pd: pd_ref, users: Users::default() }));
        raw.write_attr(&mut init.attr);
        found.ctx.srqs.lock().unwrap_or_else(|e| e.into_inner()).insert(id, raw as *mut Srq as usize);
        (raw as *mut Srq).cast()
    })
}
symver!(ibv_create_srq);

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Srq::from_ibv(srq) }) else { return libc::EINVAL };
        if found.users.busy() {
            return libc::EBUSY;
        }
        found.pd.ctx.srqs.lock().unwrap_or_else(|e| e.into_inner()).remove(&found.srq.id());
        let pd = found.pd;
        // SAFETY: leaked from a Box by ibv_create_srq.
        drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
        pd.users.release();
        0
    })
}
symver!(ibv_destroy_srq);

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, attr_mask: c_int) -> c_int {
    guard_int(|| {
        let (Some(found), Some(attr)) = (unsafe { Srq::from_ibv(srq) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let mask = attr_mask as u32;
        if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return libc::EINVAL;
        }
        // The queue is not resized (the device does not claim SRQ_RESIZE).
        if mask & IBV_SRQ_MAX_WR != 0 {
            return libc::EINVAL;
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            let (max_wr, _, _) = found.srq.attr();
            if attr.srq_limit > max_wr {
                return libc::EINVAL;
            }
            found.srq.arm_limit(attr.srq_limit);
        }
        0
    })
}
symver!(ibv_modify_srq);

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard_int(|| {
        let (Some(found), Some(attr)) = (unsafe { Srq::from_ibv(srq) }, unsafe { attr.as_mut() }) else {
            return libc::EINVAL;
        };
        found.write_attr(attr);
        0
    })
}
symver!(ibv_query_srq);

/// `ibv_context_ops::post_srq_recv`, behind the `ibv_post_srq_recv` inline.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Srq::from_ibv(srq) }) else { return libc::EINVAL };
        let mut cur = wr;
        // SAFETY: the program's chain of requests, ended by a NULL `next`.
        while let Some(request) = unsafe { cur.as_ref() } {
            let posted = unsafe { sges(request.sg_list, request.num_sge) }.and_then(|sg_list| {
                found.srq.post_recv(RecvWr { wr_id: request.wr_id, sg_list }).map_err(|e| e.errno())
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
