//! Communication identifiers (`rdma_cm_id`): a softroce [`CmId`] behind the C struct, and the
//! calls that create, resolve, listen, connect, accept, reject, disconnect and destroy them.
//!
//! The C struct is the program's to read (`verbs`, `route`, `qp` …) and partly to write
//! (`context`); this library fills it from the [`CmId`] after each call and event that changes
//! it, as librdmacm fills it from the kernel's answers. An id made without a channel
//! (`rdma_create_id(NULL, …)`, `rdma_create_ep`) is synchronous, as in librdmacm: it gets a
//! channel of its own, and each call that starts something waits for the event that ends it,
//! kept in `id->event` until the next such call.

use std::cell::UnsafeCell;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use softroce::cm::{CmId, ConnParam, PortSpace};

use super::channel::Channel;
use super::event::{rdma_ack_cm_event, rdma_get_cm_event};
use super::socket_addr;
use crate::cm_sys::*;
use crate::errno::set_errno;
use crate::guard::guard_neg;
use crate::sys::*;

/// An id as C sees it: `rdma_cm_id` first, so the pointer is both.
#[repr(C)]
pub(super) struct Id {
    c: UnsafeCell<rdma_cm_id>,
    pub(super) id: CmId,
    /// The one path record `route.path_rec` points at once a route is known.
    path: UnsafeCell<ibv_sa_path_rec>,
    /// The channel is the id's own and its calls wait for their events.
    sync: AtomicBool,
    /// Events delivered by `rdma_get_cm_event` and not yet acknowledged: `rdma_destroy_id` and
    /// `rdma_migrate_id` wait for them, as librdmacm's do.
    unacked: Mutex<u64>,
    acked: Condvar,
    /// The QP attributes a passive `rdma_create_ep` was given, for `rdma_get_request`'s QPs.
    pub(super) ep_qp_attr: Mutex<Option<ibv_qp_init_attr>>,
}

// SAFETY: the C struct holds pointers to this library's objects and the program's context,
// which C shares between threads as it shares librdmacm's ids; the Rust parts are Send and Sync.
unsafe impl Send for Id {}
unsafe impl Sync for Id {}

/// The process's ids, so that an event's [`CmId`] finds its C id.
static IDS: Mutex<Vec<(CmId, usize)>> = Mutex::new(Vec::new());

pub(super) fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// -1 with errno `err`: librdmacm's `ERR(err)`.
pub(super) fn fail(err: c_int) -> c_int {
    set_errno(err);
    -1
}

/// 0, or -1 with the error's errno.
pub(super) fn result(r: softroce::verbs::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e.errno()),
    }
}

fn port_space(ps: rdma_port_space) -> Option<PortSpace> {
    Some(match ps {
        RDMA_PS_TCP => PortSpace::Tcp,
        RDMA_PS_UDP => PortSpace::Udp,
        RDMA_PS_IB => PortSpace::Ib,
        RDMA_PS_IPOIB => PortSpace::IpoIb,
        _ => return None,
    })
}

/// The channel to create an id on: the caller's, or (NULL) a new one of the id's own.
fn channel_or_own(channel: *mut rdma_event_channel) -> Result<(*mut rdma_event_channel, bool), c_int> {
    match channel.is_null() {
        false => Ok((channel, false)),
        true => Ok((Channel::create()?, true)),
    }
}

impl Id {
    /// Registers a C id for `id`, whose events arrive on `channel` (its own if `sync`).
    fn register(
        id: CmId,
        channel: *mut rdma_event_channel,
        sync: bool,
        context: *mut c_void,
        ps: rdma_port_space,
        qp_type: ibv_qp_type,
    ) -> &'static Id {
        // SAFETY: all zeros is an empty rdma_cm_id and path record.
        let (mut c, path): (rdma_cm_id, ibv_sa_path_rec) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        c.channel = channel;
        c.context = context;
        c.ps = ps;
        c.qp_type = qp_type;
        let leaked: &'static Id = Box::leak(Box::new(Id {
            c: UnsafeCell::new(c),
            id: id.clone(),
            path: UnsafeCell::new(path),
            sync: AtomicBool::new(sync),
            unacked: Mutex::new(0),
            acked: Condvar::new(),
            ep_qp_attr: Mutex::new(None),
        }));
        locked(&IDS).push((id, ptr::from_ref(leaked) as usize));
        leaked.refresh();
        leaked
    }

    /// The C id for a connect request's new `id`, on the listener's channel, or on one of its own
    /// if the listener is synchronous (`rdma_get_request`), as librdmacm makes it.
    pub(super) fn for_request(listen: &Id, id: CmId) -> Result<&'static Id, c_int> {
        // SAFETY: our struct.
        let l = unsafe { &*listen.c() };
        let (channel, sync) = match listen.is_sync() {
            false => (l.channel, false),
            true => {
                let own = Channel::create()?;
                let ch = Channel::from_c(own).expect("a new channel");
                if let Err(e) = id.migrate(&ch.channel) {
                    // SAFETY: used by nothing.
                    unsafe { Channel::free(own) };
                    return Err(e.errno());
                }
                (own, true)
            }
        };
        Ok(Id::register(id, channel, sync, l.context, l.ps, l.qp_type))
    }

    /// The id behind a pointer from `rdma_create_id`: only one this library made and has not
    /// destroyed, so that a stale or foreign pointer is `EINVAL` rather than a crash.
    pub(super) fn from_c<'a>(id: *mut rdma_cm_id) -> Option<&'a Id> {
        let known = locked(&IDS).iter().any(|&(_, p)| p == id as usize);
        // SAFETY: a registered id is a live Id, whose rdma_cm_id (in its UnsafeCell) opens it.
        known.then(|| unsafe { &*id.cast::<Id>() })
    }

    /// The C id of `id`, if it has one (any more), with an event counted as delivered to it, which `rdma_destroy_id` then waits
    /// for the program to acknowledge. Found and counted under the registry's lock: a destroy
    /// unregisters the id before it waits, so none comes between and frees it under the event.
    pub(super) fn of_counted(id: &CmId) -> Option<&'static Id> {
        let ids = locked(&IDS);
        let found = ids.iter().find(|(known, _)| known.same_as(id)).map(|&(_, p)| p)?;
        // SAFETY: ids stay registered until rdma_destroy_id frees them, after unregistering.
        let found = unsafe { &*(found as *const Id) };
        found.delivered();
        Some(found)
    }

    pub(super) fn c(&self) -> *mut rdma_cm_id {
        self.c.get()
    }

    pub(super) fn is_sync(&self) -> bool {
        self.sync.load(Ordering::Acquire)
    }

    /// Fills `verbs`, `port_num` and `route` from the softroce id, as librdmacm's
    /// `ucma_query_route` does after each call and event that may change them, and `pd` with the
    /// device's PD if the program set none, as librdmacm's `ucma_get_device` does.
    pub(super) fn refresh(&self) {
        let c = self.c();
        // SAFETY: our struct; programs read these fields, they do not write them.
        unsafe {
            // A wildcard listener has no one device, and no `verbs`, as in librdmacm.
            let specific = self.id.local_addr().is_some_and(|a| !a.ip().is_unspecified());
            if (*c).verbs.is_null() && specific {
                if let Some(cm) = self.id.context().and_then(|context| crate::device::cm_context(context.device())) {
                    (*c).verbs = cm.context;
                    (*c).port_num = 1;
                    if (*c).pd.is_null() {
                        (*c).pd = cm.pd;
                    }
                }
            }
            let addr = ptr::addr_of_mut!((*c).route.addr);
            if let Some(local) = self.id.local_addr() {
                socket_addr::write(ptr::addr_of_mut!((*addr).__bindgen_anon_1).cast(), local);
            }
            if let Some(peer) = self.id.peer_addr() {
                socket_addr::write(ptr::addr_of_mut!((*addr).__bindgen_anon_2).cast(), peer);
            }
            if let Some(route) = self.id.route() {
                let ib = (*addr).addr.ibaddr.as_mut();
                ib.sgid.raw = route.sgid.into();
                ib.dgid.raw = route.dgid.into();
                ib.pkey = route.pkey.to_be();
                let path = &mut *self.path.get();
                path.sgid.raw = route.sgid.into();
                path.dgid.raw = route.dgid.into();
                path.pkey = route.pkey.to_be();
                path.hop_limit = route.hop_limit;
                path.traffic_class = route.traffic_class;
                path.mtu = route.path_mtu as u8;
                // "Exactly" this MTU, as the kernel reports a RoCE path.
                path.mtu_selector = 2;
                path.reversible = 1;
                path.numb_path = 1;
                (*c).route.path_rec = self.path.get();
                (*c).route.num_paths = 1;
            }
        }
    }

    /// Counts an event about this id delivered to the program.
    pub(super) fn delivered(&self) {
        *locked(&self.unacked) += 1;
    }

    /// Counts an acknowledged event.
    pub(super) fn acknowledged(&self) {
        let mut unacked = locked(&self.unacked);
        *unacked = unacked.saturating_sub(1);
        self.acked.notify_all();
    }

    fn wait_acknowledged(&self) {
        let mut unacked = locked(&self.unacked);
        while *unacked > 0 {
            unacked = self.acked.wait(unacked).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Acknowledges the event a synchronous call left in `id->event`.
    fn ack_kept_event(&self) {
        // SAFETY: our struct; `event` is ours on a synchronous id.
        unsafe {
            let c = self.c();
            if !(*c).event.is_null() {
                rdma_ack_cm_event((*c).event);
                (*c).event = ptr::null_mut();
            }
        }
    }
}

/// The connection parameters of `rdma_connect` and `rdma_accept`, with librdmacm's defaults:
/// `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH` (or no parameters) mean the device's limits;
/// the QP number is the id's QP's when it has one.
fn connection_parameters(found: &Id, param: Option<&rdma_conn_param>) -> Result<ConnParam, c_int> {
    // SAFETY: our struct.
    let c = unsafe { &*found.c() };
    if c.ps == RDMA_PS_TCP && c.qp.is_null() && param.is_none() {
        return Err(libc::EINVAL);
    }
    let attr = found.id.context().map(|context| context.device().query_device());
    let max_responder = attr.as_ref().map_or(u8::MAX, |a| a.max_qp_rd_atom.min(254) as u8);
    let max_initiator = attr.as_ref().map_or(u8::MAX, |a| a.max_qp_init_rd_atom.min(254) as u8);
    let limit = |asked: u8, max: u8| if asked == RDMA_MAX_RESP_RES as u8 { max } else { asked };
    let mut out = ConnParam {
        responder_resources: max_responder,
        initiator_depth: max_initiator,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    };
    if let Some(p) = param {
        out.responder_resources = limit(p.responder_resources, max_responder);
        out.initiator_depth = limit(p.initiator_depth, max_initiator);
        out.flow_control = p.flow_control != 0;
        out.retry_count = p.retry_count;
        out.rnr_retry_count = p.rnr_retry_count;
        out.srq = p.srq != 0;
        out.qp_num = p.qp_num;
        if !p.private_data.is_null() && p.private_data_len > 0 {
            // SAFETY: the caller's private_data_len bytes.
            out.private_data =
                unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into()) }.to_vec();
        }
    }
    // SAFETY: the id's QP, from rdma_create_qp.
    if let Some(qp) = unsafe { c.qp.as_ref() } {
        out.qp_num = qp.qp_num;
        out.srq = !qp.srq.is_null();
    }
    Ok(out)
}

/// Runs `f` on the id behind `id` under the panic guard; -1 with `EINVAL` for a NULL id.
pub(super) fn with_id(id: *mut rdma_cm_id, f: impl FnOnce(&'static Id) -> c_int) -> c_int {
    guard_neg(std::panic::AssertUnwindSafe(|| {
        match Id::from_c(id) {
            // SAFETY: ids live until rdma_destroy_id, which the program calls last.
            Some(found) => f(unsafe { &*ptr::from_ref(found) }),
            None => fail(libc::EINVAL),
        }
    }))
}

/// What a call that librdmacm ends with `ucma_complete` did first.
pub(super) enum Then {
    /// Its result, with nothing to wait for.
    Done(c_int),
    /// Started: on a synchronous id, the call waits for the event that ends it.
    Complete,
}

/// [`with_id`] for a call that librdmacm ends with `ucma_complete`: `start` runs guarded, then
/// [`complete`]. The caller must be `extern "C-unwind"` and return what this returns.
fn with_id_completing(id: *mut rdma_cm_id, start: impl FnOnce(&'static Id) -> Then) -> c_int {
    let mut then_complete = false;
    let rc = with_id(id, |found| match start(found) {
        Then::Done(rc) => rc,
        Then::Complete => {
            then_complete = true;
            0
        }
    });
    if rc != 0 || !then_complete {
        return rc;
    }
    complete(id)
}

/// librdmacm's `ucma_complete`: on a synchronous id, waits for the event that ends the call just
/// made and keeps it in `id->event`; its status is the call's. Others return 0 at once. The wait
/// is `rdma_get_cm_event` on the id's own channel from this frame, between two guarded steps,
/// with only raw pointers live: a cancellation point, as librdmacm's `read` is (rxe-spec C-24).
fn complete(id: *mut rdma_cm_id) -> c_int {
    let mut wait: Option<(*mut rdma_event_channel, *mut *mut rdma_cm_event)> = None;
    let rc = with_id(id, |found| {
        if found.is_sync() {
            found.ack_kept_event();
            let c = found.c();
            // SAFETY: our struct and its own channel.
            wait = Some(unsafe { ((*c).channel, ptr::addr_of_mut!((*c).event)) });
        }
        0
    });
    let Some((channel, kept)) = wait else { return rc };
    // SAFETY: the id's own channel and event slot.
    let rc = unsafe { rdma_get_cm_event(channel, kept) };
    if rc != 0 {
        return rc;
    }
    guard_neg(|| {
        // SAFETY: just delivered into the id's slot.
        let event = unsafe { &**kept };
        match event.status {
            0 => 0,
            _ if event.event == RDMA_CM_EVENT_REJECTED => fail(libc::ECONNREFUSED),
            status if status < 0 => fail(-status),
            status => fail(status),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    let qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB { IBV_QPT_UD } else { IBV_QPT_RC };
    // SAFETY: the caller's arguments.
    unsafe { create_id(channel, id, context, ps, qp_type) }
}
symver!(rdma_create_id);

/// `rdma_create_id2`, which librdmacm keeps internal: an id of `ps` for QPs of `qp_type`.
pub(super) unsafe fn create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
) -> c_int {
    guard_neg(|| {
        let Some(space) = port_space(ps).filter(|_| !id.is_null()) else { return fail(libc::EINVAL) };
        let (channel, sync) = match channel_or_own(channel) {
            Ok(found) => found,
            Err(errno) => return fail(errno),
        };
        let Some(ch) = Channel::from_c(channel) else { return fail(libc::EINVAL) };
        match softroce::cm::CmId::new(&ch.channel, space) {
            Ok(cm_id) => {
                let found = Id::register(cm_id, channel, sync, context, ps, qp_type);
                // SAFETY: the caller's pointer.
                unsafe { *id = found.c() };
                0
            }
            Err(e) => {
                if sync {
                    // SAFETY: made above, used by nothing.
                    unsafe { Channel::free(channel) };
                }
                fail(e.errno())
            }
        }
    })
}

/// As librdmacm: waits until every event delivered about the id was acknowledged; the program
/// destroys the id's QP first (`rdma_destroy_qp`). The softroce id goes (rejecting or
/// disconnecting what is open) with its last handle: this one, and those of events about it
/// still queued, which find no C id when read and are dropped.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |found| {
        if found.is_sync() {
            found.ack_kept_event();
        }
        // Unregistered first: no event is delivered to it after the wait.
        locked(&IDS).retain(|&(_, p)| p != ptr::from_ref(found) as usize);
        found.wait_acknowledged();
        // SAFETY: leaked by Id::register and no longer registered; the channel, if the id's
        // own, is used by nothing else.
        unsafe {
            if found.is_sync() {
                Channel::free((*found.c()).channel);
            }
            drop(Box::from_raw(ptr::from_ref(found).cast_mut()));
        }
        0
    })
}
symver!(rdma_destroy_id);

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    with_id(id, |found| {
        // SAFETY: the caller's address.
        let Some(addr) = (unsafe { socket_addr::read(addr) }) else { return fail(libc::EINVAL) };
        let rc = result(found.id.bind_addr(addr));
        found.refresh();
        rc
    })
}
symver!(rdma_bind_addr);

/// Joins the IPv4 multicast group at `addr` (rxe-spec M-72). The join is
/// done before this returns: MULTICAST_JOIN waits on the channel, with no
/// private data (librdmacm puts `context` there; it is not kept).
#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    _context: *mut std::os::raw::c_void,
) -> c_int {
    with_id_completing(id, |found| {
        // SAFETY: the caller's address.
        let Some(addr) = (unsafe { socket_addr::read(addr) }) else { return Then::Done(fail(libc::EINVAL)) };
        match found.id.join_multicast(addr.ip()) {
            Ok(()) => Then::Complete,
            Err(e) => Then::Done(fail(e.errno())),
        }
    })
}
symver!(rdma_join_multicast);

/// As [`rdma_join_multicast`]; a send-only join is a full join here.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut std::os::raw::c_void,
) -> c_int {
    // SAFETY: the caller's attributes.
    let Some(attr) = (unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
    // SAFETY: as rdma_join_multicast's.
    unsafe { rdma_join_multicast(id, attr.addr, context) }
}
symver!(rdma_join_multicast_ex);

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    with_id(id, |found| {
        // SAFETY: the caller's address.
        let Some(addr) = (unsafe { socket_addr::read(addr) }) else { return fail(libc::EINVAL) };
        result(found.id.leave_multicast(addr.ip()))
    })
}
symver!(rdma_leave_multicast);

#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    with_id_completing(id, |found| {
        // SAFETY: the caller's addresses.
        let (src, dst) = unsafe { (socket_addr::read(src_addr), socket_addr::read(dst_addr)) };
        let Some(dst) = dst.filter(|_| src_addr.is_null() || src.is_some()) else {
            return Then::Done(fail(libc::EINVAL));
        };
        let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
        if let Err(e) = found.id.resolve_addr(src, dst, timeout) {
            return Then::Done(fail(e.errno()));
        }
        // SAFETY: our struct: the destination is known at once, as librdmacm copies it.
        unsafe { socket_addr::write(ptr::addr_of_mut!((*found.c()).route.addr.__bindgen_anon_2).cast(), dst) };
        Then::Complete
    })
}
symver!(rdma_resolve_addr);

#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    with_id_completing(id, |found| {
        let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
        match found.id.resolve_route(timeout) {
            Ok(()) => Then::Complete,
            Err(e) => Then::Done(fail(e.errno())),
        }
    })
}
symver!(rdma_resolve_route);

/// The kernel's rdma_ucm `max_backlog`: a backlog of 0, negative or above it means this many.
const MAX_BACKLOG: u32 = 1024;

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    with_id(id, |found| {
        let backlog = u32::try_from(backlog).ok().filter(|b| (1..MAX_BACKLOG).contains(b)).unwrap_or(MAX_BACKLOG);
        let rc = result(found.id.listen(backlog));
        found.refresh();
        rc
    })
}
symver!(rdma_listen);

#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    with_id_completing(id, |found| {
        // SAFETY: the caller's parameters, if any.
        let param = match connection_parameters(found, unsafe { conn_param.as_ref() }) {
            Ok(param) => param,
            Err(errno) => return Then::Done(fail(errno)),
        };
        match found.id.connect(&param) {
            Ok(()) => Then::Complete,
            Err(e) => Then::Done(fail(e.errno())),
        }
    })
}
symver!(rdma_connect);

#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    with_id_completing(id, |found| {
        // SAFETY: the caller's parameters, if any.
        let param = match connection_parameters(found, unsafe { conn_param.as_ref() }) {
            Ok(param) => param,
            Err(errno) => return Then::Done(fail(errno)),
        };
        if let Err(e) = found.id.accept(&param) {
            return Then::Done(fail(e.errno()));
        }
        super::qp::refresh_qp_state(found);
        // SAFETY: our struct.
        if unsafe { (*found.c()).qp_type } == IBV_QPT_UD {
            // A SIDR reply completes nothing to wait for.
            if found.is_sync() {
                found.ack_kept_event();
            }
            return Then::Done(0);
        }
        Then::Complete
    })
}
symver!(rdma_accept);

fn private_data<'a>(data: *const c_void, len: u8) -> &'a [u8] {
    match data.is_null() {
        true => &[],
        // SAFETY: the caller's `len` bytes.
        false => unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len.into()) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int {
    with_id(id, |found| result(found.id.reject(self::private_data(private_data, private_data_len))))
}
symver!(rdma_reject);

/// Rejecting for an unsupported ECE option is a reject: softroce has no ECE.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { rdma_reject(id, private_data, private_data_len) }
}
symver!(rdma_reject_ece);

#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    with_id_completing(id, |found| {
        let rc = result(found.id.disconnect());
        super::qp::refresh_qp_state(found);
        match rc {
            0 => Then::Complete,
            failed => Then::Done(failed),
        }
    })
}
symver!(rdma_disconnect);

/// For a program that moves its own QP: after CONNECT_RESPONSE, sends the RTU.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |found| {
        // SAFETY: our struct.
        if !unsafe { (*found.c()).qp }.is_null() {
            return fail(libc::EINVAL);
        }
        result(found.id.establish())
    })
}
symver!(rdma_establish);

/// A synchronous listener's next connect request, with a QP made as `rdma_create_ep` was told.
/// Its wait is a cancellation point, as librdmacm's `read` of the listener's channel is (rxe-spec
/// C-24): it happens in this frame, between two guarded steps, with only raw pointers live.
#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    let mut channel: *mut rdma_event_channel = ptr::null_mut();
    let rc = with_id(listen, |found| {
        if !found.is_sync() || id.is_null() {
            return fail(libc::EINVAL);
        }
        found.ack_kept_event();
        // SAFETY: our struct.
        channel = unsafe { (*found.c()).channel };
        0
    });
    if rc != 0 {
        return rc;
    }
    let mut event: *mut rdma_cm_event = ptr::null_mut();
    // SAFETY: the listener's own channel.
    let rc = unsafe { rdma_get_cm_event(channel, &mut event) };
    if rc != 0 {
        return rc;
    }
    with_id(listen, |found| {
        let c = found.c();
        // SAFETY: just delivered.
        let e = unsafe { &*event };
        let rc = if e.status != 0 {
            fail(e.status.abs())
        } else if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            fail(libc::EINVAL)
        } else if let Some(mut attr) = *locked(&found.ep_qp_attr) {
            // SAFETY: the new id, and our listener's PD.
            unsafe { super::qp::rdma_create_qp(e.id, (*c).pd, &mut attr) }
        } else {
            0
        };
        if rc != 0 {
            // SAFETY: our struct: the failed event stays with the listener.
            unsafe { (*c).event = event };
            return rc;
        }
        // SAFETY: the new id and the caller's pointer.
        unsafe {
            (*e.id).event = event;
            *id = e.id;
        }
        0
    })
}
symver!(rdma_get_request);

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    with_id(id, |found| {
        if found.is_sync() && channel.is_null() {
            return fail(libc::EINVAL);
        }
        let (channel, sync) = match channel_or_own(channel) {
            Ok(found) => found,
            Err(errno) => return fail(errno),
        };
        let Some(ch) = Channel::from_c(channel) else { return fail(libc::EINVAL) };
        if let Err(e) = found.id.migrate(&ch.channel) {
            if sync {
                // SAFETY: made above, used by nothing.
                unsafe { Channel::free(channel) };
            }
            return fail(e.errno());
        }
        let c = found.c();
        if found.is_sync() {
            found.ack_kept_event();
            // SAFETY: the id's own channel, which nothing else uses.
            unsafe { Channel::free((*c).channel) };
        }
        // Events already read from the old channel are the program's to acknowledge first.
        found.wait_acknowledged();
        // SAFETY: our struct.
        unsafe { (*c).channel = channel };
        found.sync.store(sync, Ordering::Release);
        0
    })
}
symver!(rdma_migrate_id);

/// The options programs set before connecting: type of service, address reuse, IPv6-only and
/// the ACK timeout, which the kernel's rdma_cm takes too; softroce's routes ignore them.
/// Path records (`RDMA_OPTION_IB_PATH`) are `ENOSYS`, as the kernel answers for options it
/// does not know.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    with_id(id, |_| {
        let size = match (level as u32, optname as u32) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT) => size_of::<u8>(),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => size_of::<c_int>(),
            _ => return fail(libc::ENOSYS),
        };
        if optval.is_null() || optlen != size {
            return fail(libc::EINVAL);
        }
        0
    })
}
symver!(rdma_set_option);

/// Data arrived before the RTU (`IBV_EVENT_COMM_EST`): the connection is up when the RTU
/// arrives or is lost, which softroce's CM decides by itself. Other events are `EINVAL`, as
/// the kernel's CM answers.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int {
    with_id(id, |_| if event == IBV_EVENT_COMM_EST { 0 } else { fail(libc::EINVAL) })
}
symver!(rdma_notify);

#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> __be16 {
    // SAFETY: our id's route's source address.
    Id::from_c(id).map_or(0, |found| unsafe {
        socket_addr::port_be(ptr::addr_of!((*found.c()).route.addr.__bindgen_anon_1).cast())
    })
}
symver!(rdma_get_src_port);

#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> __be16 {
    // SAFETY: our id's route's destination address.
    Id::from_c(id).map_or(0, |found| unsafe {
        socket_addr::port_be(ptr::addr_of!((*found.c()).route.addr.__bindgen_anon_2).cast())
    })
}
symver!(rdma_get_dst_port);

/// Enhanced Connection Establishment is a vendor extension softroce does not negotiate: setting
/// local options is `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    with_id(id, |_| fail(if ece.is_null() { libc::EINVAL } else { libc::EOPNOTSUPP }))
}
symver!(rdma_set_local_ece);

/// No ECE was received: vendor 0, no options (as librdmacm reports a peer without ECE).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    with_id(id, |_| {
        // SAFETY: the caller's struct.
        match unsafe { ece.as_mut() } {
            Some(ece) => {
                *ece = ibv_ece::default();
                0
            }
            None => fail(libc::EINVAL),
        }
    })
}
symver!(rdma_get_remote_ece);
