//! `rdma_get_cm_event` and `rdma_ack_cm_event`: softroce's [`CmEvent`]s as the
//! `rdma_cm_event`s librdmacm hands out.
//!
//! An event is allocated per delivery and freed by its acknowledgement; it holds its own copy of
//! the private data that `param.conn` or `param.ud` points at. A connect request brings a new C
//! id (`event->id`) for the request's [`softroce::cm::CmId`], with the listener's channel and
//! context; the event counts against the listener, as in librdmacm.

use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use softroce::cm::{CmEvent, CmEventKind};
use softroce::verbs::Gid;

use super::channel::Channel;
use super::id::{fail, Id};
use crate::cm_sys::*;
use crate::device::is_nonblocking;
use crate::guard::{blocking, guard_neg, wait_readable_slice, CANCEL_SLICE_MS};
use crate::sys::*;

/// An event as C sees it: `rdma_cm_event` first, so the pointer is both.
#[repr(C)]
struct Event {
    c: rdma_cm_event,
    private_data: Vec<u8>,
    /// The id whose count of unacknowledged events this one is in.
    counted: &'static Id,
}

/// How long a call on a channel the program destroyed waits before its `EINVAL`. rping's event
/// thread asks for the next event while its main thread, having destroyed the channel, exits;
/// with the kernel the process is gone before it asks, where this library's exit first lets
/// what the devices owe leave (up to `exit::SETTLE_LIMIT`), and the thread's `exit(-1)` on the
/// error would win (rxe-spec C-14).
const DESTROYED_GRACE: Duration = Duration::from_secs(1);

/// Waits for the channel's next event (unless its descriptor is non-blocking: `EAGAIN`) and
/// hands it out; a signal ends the wait with `EINTR`.
#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    // Whether this call waited in the channel already: destroyed since, it
    // is waited on still, as the kernel's whose descriptor was closed under
    // its read (rxe-spec C-23), where a call that comes after is EINVAL.
    let waited = AtomicBool::new(false);
    let waited = &waited;
    blocking(-1, move || {
        let Some(getter) = Channel::enter(channel) else {
            if waited.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(CANCEL_SLICE_MS as u64));
                return None;
            }
            if Channel::was_destroyed(channel) {
                std::thread::sleep(DESTROYED_GRACE);
            }
            return Some(fail(libc::EINVAL));
        };
        waited.store(true, Ordering::Relaxed);
        let ch = getter.0;
        if event.is_null() {
            return Some(fail(libc::EINVAL));
        }
        let fd = ch.channel.fd();
        loop {
            if let Some(found) = ch.channel.try_get_event() {
                // An event of an id destroyed meanwhile has nobody to go to.
                if let Some(delivered) = deliver(found) {
                    // SAFETY: the caller's pointer.
                    unsafe { *event = delivered };
                    return Some(0);
                }
                continue;
            }
            if is_nonblocking(fd) {
                return Some(fail(libc::EAGAIN));
            }
            match wait_readable_slice(fd) {
                Some(true) => {}
                Some(false) => return Some(-1),
                None => return None,
            }
        }
    })
}
symver!(rdma_get_cm_event);

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard_neg(|| {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: leaked from a Box by deliver; the program acknowledges an event once.
        let event = unsafe { Box::from_raw(event.cast::<Event>()) };
        event.counted.acknowledged();
        0
    })
}
symver!(rdma_ack_cm_event);

/// The C event for `found`, or None if its id has no C id (any more).
fn deliver(found: CmEvent) -> Option<*mut rdma_cm_event> {
    let (id, listen) = match (found.kind, &found.listen_id) {
        (CmEventKind::ConnectRequest, Some(listen_id)) => {
            let listen = Id::of_counted(listen_id)?;
            match Id::for_request(listen, found.id.clone()) {
                Ok(id) => (id, Some(listen)),
                Err(_) => {
                    listen.acknowledged();
                    // No C id, no program to answer: refuse the peer (the id goes with the event).
                    let _ = found.id.reject(&[]);
                    return None;
                }
            }
        }
        _ => (Id::of_counted(&found.id)?, None),
    };
    id.refresh();
    super::qp::refresh_qp_state(id);
    // SAFETY: all zeros is an empty rdma_cm_event.
    let mut c: rdma_cm_event = unsafe { std::mem::zeroed() };
    c.id = id.c();
    c.listen_id = listen.map_or(ptr::null_mut(), Id::c);
    c.event = found.kind as rdma_cm_event_type;
    c.status = found.status;
    // SAFETY: our struct.
    let is_ud = unsafe { (*id.c()).qp_type } == IBV_QPT_UD;
    let mut private_data = Vec::new();
    if let (true, Some(ud)) = (is_ud, &found.ud) {
        private_data = ud.private_data.clone();
        // SAFETY: the ud member of a zeroed union.
        let p = unsafe { c.param.ud.as_mut() };
        p.private_data_len = private_data.len().min(u8::MAX.into()) as u8;
        p.ah_attr = ah_attr_to(id, ud.dgid);
        p.qp_num = ud.qp_num;
        p.qkey = ud.qkey;
    } else if let Some(conn) = &found.conn {
        private_data = conn.private_data.clone();
        // SAFETY: the conn member of a zeroed union.
        let p = unsafe { c.param.conn.as_mut() };
        p.private_data_len = private_data.len().min(u8::MAX.into()) as u8;
        p.responder_resources = conn.responder_resources;
        p.initiator_depth = conn.initiator_depth;
        p.flow_control = conn.flow_control.into();
        p.retry_count = conn.retry_count;
        p.rnr_retry_count = conn.rnr_retry_count;
        p.srq = conn.srq.into();
        p.qp_num = conn.qp_num;
    }
    let counted = listen.unwrap_or(id);
    let mut event = Box::new(Event { c, private_data, counted });
    if !event.private_data.is_empty() {
        // Both members start with the private data pointer.
        let data = event.private_data.as_ptr().cast();
        // SAFETY: writing the union's common first field.
        unsafe { event.c.param.conn.as_mut().private_data = data };
    }
    Some(Box::into_raw(event).cast())
}

/// The address handle attributes that reach `dgid` from the id's port (`param.ud.ah_attr`):
/// global, from the GID of the id's source address.
pub(super) fn ah_attr_to(id: &Id, dgid: Gid) -> ibv_ah_attr {
    let route = id.id.route();
    // The route's source GID, or (a multicast join needs no route) the
    // bound address's.
    let sgid = route.map(|r| r.sgid).or_else(|| id.id.local_addr().map(|a| Gid::from_ip(a.ip())));
    let sgid_index = sgid
        .and_then(|sgid| id.id.context().and_then(|c| c.device().gid_table().iter().position(|g| *g == sgid)))
        .unwrap_or(0);
    let mut ah = ibv_ah_attr { is_global: 1, port_num: 1, ..Default::default() };
    ah.grh.dgid.raw = dgid.into();
    ah.grh.sgid_index = sgid_index as u8;
    ah.grh.hop_limit = route.map_or(64, |r| r.hop_limit);
    ah.grh.traffic_class = route.map_or(0, |r| r.traffic_class);
    ah
}
