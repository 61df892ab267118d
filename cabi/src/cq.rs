//! Completion queues and completion channels, and how completions look to C.

use std::os::fd::AsRawFd;
use std::os::raw::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use softroce::verbs::{CompletionChannel, CompletionQueue, WcOpcode, WcStatus, WorkCompletion};

use crate::device::{is_nonblocking, Ctx};
use crate::errno::set_errno;
use crate::guard::{blocking, guard, guard_int, guard_neg, guard_ptr, guard_void, wait_readable_slice};
use crate::sys::*;
use crate::users::Users;

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
    pub(crate) users: Users,
    /// The completion an extended CQ's `read_*` functions read.
    current: Mutex<ibv_wc>,
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
        if cqe < 1 || comp_vector != 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        match unsafe { create(context, cqe as u32, cq_context, channel, false) } {
            Ok(cq) => cq.cast(),
            Err(errno) => {
                set_errno(errno);
                ptr::null_mut()
            }
        }
    })
}
symver!(ibv_create_cq);

/// The completion fields `ibv_cq_ex` can read here: the rest (timestamps,
/// VLANs, flow tags, tag matching) a software device does not have.
const WC_EX_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// `verbs_context::create_cq_ex`, behind `ibv_create_cq_ex`: a CQ polled
/// one completion at a time through the `ibv_cq_ex` functions.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard_ptr(|| {
        let Some(attr) = (unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let known = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
        if attr.cqe < 1 || attr.comp_vector != 0 || attr.comp_mask & !known != 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        if attr.wc_flags & !WC_EX_FLAGS != 0 || attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            set_errno(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        match unsafe { create(context, attr.cqe, attr.cq_context, attr.channel, true) } {
            Ok(cq) => cq.cast(),
            Err(errno) => {
                set_errno(errno);
                ptr::null_mut()
            }
        }
    })
}

/// `EINVAL` if more completions are queued than `cqe`, as rxe says.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard_int(|| {
        // SAFETY: the program's CQ, made by this library.
        let Some(found) = (unsafe { Cq::from_ibv(cq) }) else { return libc::EINVAL };
        let Ok(wanted) = usize::try_from(cqe) else { return libc::EINVAL };
        if let Err(e) = found.cq.resize(wanted) {
            return e.errno();
        }
        // SAFETY: the program reads `cqe` from its CQ; only its own calls change it.
        unsafe { (*cq).cqe = cqe };
        0
    })
}
symver!(ibv_resize_cq);

unsafe fn create(
    context: *mut ibv_context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    extended: bool,
) -> Result<*mut Cq, c_int> {
    let ctx = unsafe { Ctx::from_ibv(context) }.ok_or(libc::EINVAL)?;
    let channel = channel.cast::<Channel>();
    // SAFETY: a channel from ibv_create_comp_channel, or NULL.
    let rust_channel = unsafe { channel.as_ref() }.map(|c| &c.channel);
    let cq = ctx.ctx.create_cq(cqe as usize, rust_channel).map_err(|e| e.errno())?;
    // SAFETY: all zeros is a valid ibv_cq_ex (NULL functions, an
    // initialised glibc mutex and condition variable).
    let mut ibv: ibv_cq_ex = unsafe { std::mem::zeroed() };
    ibv.context = context;
    ibv.channel = channel.cast();
    ibv.cq_context = cq_context;
    ibv.cqe = cqe.min(c_int::MAX as u32) as c_int;
    if extended {
        ibv.start_poll = Some(start_poll);
        ibv.next_poll = Some(next_poll);
        ibv.end_poll = Some(end_poll);
        ibv.read_opcode = Some(read_opcode);
        ibv.read_vendor_err = Some(read_vendor_err);
        ibv.read_byte_len = Some(read_byte_len);
        ibv.read_imm_data = Some(read_imm_data);
        ibv.read_qp_num = Some(read_qp_num);
        ibv.read_src_qp = Some(read_src_qp);
        ibv.read_wc_flags = Some(read_wc_flags);
        ibv.read_slid = Some(read_slid);
        ibv.read_sl = Some(read_sl);
        ibv.read_dlid_path_bits = Some(read_dlid_path_bits);
    }
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
        users: Users::default(),
        current: Mutex::new(ibv_wc_zero()),
    });
    let raw = Box::leak(boxed) as *mut Cq;
    if let Some(channel) = unsafe { channel.as_mut() } {
        channel.ibv.refcnt += 1;
    }
    ctx.cqs.lock().unwrap_or_else(|e| e.into_inner()).insert(id, raw as usize);
    Ok(raw)
}

fn ibv_wc_zero() -> ibv_wc {
    to_ibv_wc(&WorkCompletion::new(0, 0, WcStatus::Success, WcOpcode::Send))
}

/// Takes the next completion into the queue's current one: `ENOENT` when
/// there is none (and the caller must not call `end_poll`).
unsafe fn poll_next(cq: *mut ibv_cq_ex) -> c_int {
    let Some(found) = (unsafe { Cq::from_ibv(cq.cast()) }) else { return libc::EINVAL };
    let Some(wc) = found.cq.poll_one() else { return libc::ENOENT };
    let converted = to_ibv_wc(&wc);
    // SAFETY: the program polls a CQ from one thread at a time, between
    // start_poll and end_poll, and reads status and wr_id from the struct.
    unsafe {
        ptr::addr_of_mut!((*cq).status).write(converted.status);
        ptr::addr_of_mut!((*cq).wr_id).write(converted.wr_id);
    }
    *found.current.lock().unwrap_or_else(|e| e.into_inner()) = converted;
    0
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    guard_int(|| unsafe { poll_next(cq) })
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard_int(|| unsafe { poll_next(cq) })
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// The current completion of an extended CQ.
unsafe fn current(cq: *mut ibv_cq_ex) -> ibv_wc {
    // SAFETY: extended CQs come from create_cq_ex.
    unsafe { Cq::from_ibv(cq.cast()) }
        .map_or_else(ibv_wc_zero, |c| *c.current.lock().unwrap_or_else(|e| e.into_inner()))
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    unsafe { current(cq) }.opcode
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    unsafe { current(cq) }.vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    unsafe { current(cq) }.byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: both members are 32 bits.
    unsafe { current(cq).__bindgen_anon_1.imm_data }
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    unsafe { current(cq) }.qp_num
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    unsafe { current(cq) }.src_qp
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    unsafe { current(cq) }.wc_flags
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    unsafe { current(cq) }.slid.into()
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    unsafe { current(cq) }.sl
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    unsafe { current(cq) }.dlid_path_bits
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Cq::from_ibv(cq) }) else { return libc::EINVAL };
        if found.users.busy() {
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
pub unsafe extern "C-unwind" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    blocking(-1, move || {
        // SAFETY: ibv_comp_channel is the first field of a Channel.
        let (Some(found), false, false) =
            (unsafe { channel.cast::<Channel>().as_ref() }, cq_out.is_null(), cq_context.is_null())
        else {
            set_errno(libc::EINVAL);
            return Some(-1);
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
                return Some(0);
            }
            // Like the kernel's read: EAGAIN when non-blocking, else sleep
            // until the engine signals (a signal ends the wait with EINTR).
            if is_nonblocking(found.ibv.fd) {
                set_errno(libc::EAGAIN);
                return Some(-1);
            }
            match wait_readable_slice(found.ibv.fd) {
                Some(true) => {}
                Some(false) => return Some(-1),
                None => return None,
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
        // A poll for one, as latency loops make, fills no batch of 16.
        let written = match num_entries {
            1 => unsafe { poll_into::<1>(&found.cq, 1, wc) },
            n => unsafe { poll_into::<16>(&found.cq, n as usize, wc) },
        };
        written as c_int
    })
}

/// Polls up to `num_entries` completions into the program's array `wc`,
/// `N` at a time; how many it wrote.
///
/// # Safety
/// `wc` must have room for `num_entries` entries.
unsafe fn poll_into<const N: usize>(cq: &CompletionQueue, num_entries: usize, wc: *mut ibv_wc) -> usize {
    let mut batch = [WorkCompletion::new(0, 0, WcStatus::Success, WcOpcode::Send); N];
    let mut written = 0;
    while written < num_entries {
        let want = (num_entries - written).min(N);
        let n = cq.poll(&mut batch[..want]);
        for (i, completion) in batch[..n].iter().enumerate() {
            // SAFETY: fewer than num_entries entries of the caller's array.
            unsafe { wc.add(written + i).write(to_ibv_wc(completion)) };
        }
        written += n;
        if n < want {
            break;
        }
    }
    written
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
