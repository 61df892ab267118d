//! Completion queues and completion channels, and how completions look to C.

use std::os::fd::AsRawFd;
use std::os::raw::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use softroce::verbs::{CompletionChannel, CompletionQueue, WcOpcode, WcStatus, WorkCompletion};

use crate::device::{is_nonblocking, wait_readable, Ctx};
use crate::errno::set_errno;
use crate::guard::{guard, guard_int, guard_neg, guard_ptr, guard_void};
use crate::sys::*;

/// A completion channel as C sees it: programs `poll` its `fd`.
#[repr(C)]
pub struct Channel {
    ibv: ibv_comp_channel,
    channel: CompletionChannel,
    ctx: &'static Ctx,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    guard_ptr(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let channel = match ctx.ctx.create_comp_channel() {
            Ok(c) => c,
            Err(e) => {
                set_errno(e.errno());
                return ptr::null_mut();
            }
        };
        let ibv = ibv_comp_channel { context, fd: channel.as_raw_fd(), refcnt: 0 };
        // SAFETY: contexts outlive their objects (see ibv_alloc_pd).
        let ctx: &'static Ctx = unsafe { &*ptr::from_ref(ctx) };
        Box::leak(Box::new(Channel { ibv, channel, ctx })) as *mut Channel as *mut ibv_comp_channel
    })
}
symver!(ibv_create_comp_channel);

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard_neg(|| {
        // SAFETY: ibv_comp_channel is the first field of a Channel.
        let Some(found) = (unsafe { channel.cast::<Channel>().as_ref() }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if found.ibv.refcnt > 0 {
            set_errno(libc::EBUSY);
            return -1;
        }
        // SAFETY: leaked from a Box by ibv_create_comp_channel.
        drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
        0
    })
}
symver!(ibv_destroy_comp_channel);

/// A completion queue as C sees it. rdma-core's destroy waits until every
/// event delivered for the queue has been acknowledged; so does this one.
#[repr(C)]
pub struct Cq {
    ibv: ibv_cq_ex,
    pub(crate) cq: CompletionQueue,
    ctx: &'static Ctx,
    channel: *mut Channel,
    /// Events delivered and acknowledged.
    events: Mutex<(u32, u32)>,
    acked: Condvar,
    /// QPs that complete into the queue.
    users: AtomicU32,
}

// SAFETY: the channel pointer is only read to adjust its count under the
// program's own serialisation of create and destroy calls.
unsafe impl Send for Cq {}
unsafe impl Sync for Cq {}

impl Cq {
    /// # Safety
    /// `cq` must come from [`ibv_create_cq`] and not be destroyed.
    pub(crate) unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: ibv_cq opens the ibv_cq_ex that opens a Cq.
        unsafe { cq.cast::<Cq>().as_ref() }
    }

    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::Relaxed);
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard_ptr(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if cqe < 1 || comp_vector != 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let channel = channel.cast::<Channel>();
        // SAFETY: a channel from ibv_create_comp_channel, or NULL.
        let rust_channel = unsafe { channel.as_ref() }.map(|c| &c.channel);
        let cq = match ctx.ctx.create_cq(cqe as usize, rust_channel) {
            Ok(cq) => cq,
            Err(e) => {
                set_errno(e.errno());
                return ptr::null_mut();
            }
        };
        // SAFETY: all zeros is a valid ibv_cq_ex (NULL functions, an
        // initialised glibc mutex and condition variable).
        let mut ibv: ibv_cq_ex = unsafe { std::mem::zeroed() };
        ibv.context = context;
        ibv.channel = channel.cast();
        ibv.cq_context = cq_context;
        ibv.cqe = cqe;
        let id = cq.id();
        // SAFETY: contexts outlive their objects.
        let ctx: &'static Ctx = unsafe { &*ptr::from_ref(ctx) };
        let boxed = Box::new(Cq {
            ibv,
            cq,
            ctx,
            channel,
            events: Mutex::new((0, 0)),
            acked: Condvar::new(),
            users: AtomicU32::new(0),
        });
        let raw = Box::leak(boxed) as *mut Cq;
        if let Some(channel) = unsafe { channel.as_mut() } {
            channel.ibv.refcnt += 1;
        }
        ctx.cqs.lock().unwrap_or_else(|e| e.into_inner()).insert(id, raw as usize);
        raw.cast()
    })
}
symver!(ibv_create_cq);

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Cq::from_ibv(cq) }) else { return libc::EINVAL };
        if found.users.load(Ordering::Relaxed) > 0 {
            return libc::EBUSY;
        }
        // As rdma-core: wait until the program acknowledged every event it got.
        let mut events = found.events.lock().unwrap_or_else(|e| e.into_inner());
        while events.1 < events.0 {
            events = found.acked.wait(events).unwrap_or_else(|e| e.into_inner());
        }
        drop(events);
        found.ctx.cqs.lock().unwrap_or_else(|e| e.into_inner()).remove(&found.cq.id());
        if let Some(channel) = unsafe { found.channel.as_mut() } {
            channel.ibv.refcnt -= 1;
        }
        // SAFETY: leaked from a Box by ibv_create_cq.
        drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
        0
    })
}
symver!(ibv_destroy_cq);

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard_neg(|| {
        // SAFETY: ibv_comp_channel is the first field of a Channel.
        let (Some(found), false, false) =
            (unsafe { channel.cast::<Channel>().as_ref() }, cq_out.is_null(), cq_context.is_null())
        else {
            set_errno(libc::EINVAL);
            return -1;
        };
        loop {
            if let Some(id) = found.channel.get_event(Duration::ZERO) {
                let cqs = found.ctx.cqs.lock().unwrap_or_else(|e| e.into_inner());
                // An event of a CQ destroyed since: nobody waits for it.
                let Some(&raw) = cqs.get(&id) else { continue };
                drop(cqs);
                // SAFETY: a live CQ of this context.
                let cq = unsafe { &*(raw as *const Cq) };
                cq.events.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
                // SAFETY: the caller's out-pointers.
                unsafe {
                    *cq_out = raw as *mut ibv_cq;
                    *cq_context = cq.ibv.cq_context;
                }
                return 0;
            }
            // Like the kernel's read: EAGAIN when non-blocking, else sleep
            // until the engine signals (a signal ends the wait with EINTR).
            if is_nonblocking(found.ibv.fd) {
                set_errno(libc::EAGAIN);
                return -1;
            }
            if !wait_readable(found.ibv.fd) {
                return -1;
            }
        }
    })
}
symver!(ibv_get_cq_event);

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard_void(|| {
        if let Some(found) = unsafe { Cq::from_ibv(cq) } {
            found.events.lock().unwrap_or_else(|e| e.into_inner()).1 += nevents;
            found.acked.notify_all();
        }
    })
}
symver!(ibv_ack_cq_events);

/// `ibv_context_ops::req_notify_cq`, behind the `ibv_req_notify_cq` inline.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Cq::from_ibv(cq) }) else { return libc::EINVAL };
        found.cq.req_notify(solicited_only != 0);
        0
    })
}

/// `ibv_context_ops::poll_cq`, behind the `ibv_poll_cq` inline: the number
/// of completions written, or a negative value on error.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        let Some(found) = (unsafe { Cq::from_ibv(cq) }) else { return -1 };
        if num_entries < 0 || (wc.is_null() && num_entries > 0) {
            return -1;
        }
        let mut batch = [WorkCompletion::new(0, 0, WcStatus::Success, WcOpcode::Send); 16];
        let mut written = 0;
        while written < num_entries as usize {
            let want = (num_entries as usize - written).min(batch.len());
            let n = found.cq.poll(&mut batch[..want]);
            for (i, completion) in batch[..n].iter().enumerate() {
                // SAFETY: fewer than num_entries entries of the caller's array.
                unsafe { wc.add(written + i).write(to_ibv_wc(completion)) };
            }
            written += n;
            if n < want {
                break;
            }
        }
        written as c_int
    })
}

/// A completion as `struct ibv_wc` has it. The immediate is in network
/// byte order there, as it was on the wire.
pub(crate) fn to_ibv_wc(wc: &WorkCompletion) -> ibv_wc {
    let mut flags = 0;
    let mut imm_or_rkey = ibv_wc__bindgen_ty_1 { imm_data: 0 };
    if let Some(imm) = wc.imm {
        flags |= IBV_WC_WITH_IMM;
        imm_or_rkey.imm_data = imm.to_be();
    }
    if let Some(rkey) = wc.invalidated_rkey {
        flags |= IBV_WC_WITH_INV;
        imm_or_rkey.invalidated_rkey = rkey;
    }
    if wc.grh {
        flags |= IBV_WC_GRH;
    }
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status as ibv_wc_status,
        opcode: wc.opcode as ibv_wc_opcode,
        vendor_err: 0,
        byte_len: wc.byte_len,
        __bindgen_anon_1: imm_or_rkey,
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}
