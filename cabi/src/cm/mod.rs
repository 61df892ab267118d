//! softroce as `librdmacm.so.1`: rdma-core's connection manager over softroce's (`softroce::cm`).
//!
//! One library is both `libibverbs.so.1` and `librdmacm.so.1`. The cdylib defines the
//! `RDMACM_1.x` symbols too, and `librdmacm.so.1` is a symlink to the same file
//! (`softroce run`). glibc's loader knows a file it has mapped by device and inode
//! (`_dl_map_object_from_fd`), so a program that needs both names gets this library once, with
//! the second name added to it, and one engine per device in the process: `cm_id->verbs` is a
//! context of the very library the program's verbs calls go to.

mod addrinfo;
mod channel;
mod event;
mod id;
mod qp;
mod rsocket;
mod socket_addr;

use std::os::raw::{c_char, c_int};
use std::ptr;

use crate::cm_sys::*;
use crate::errno::set_errno;
use crate::guard::{guard_ptr, guard_void};
use crate::sys::ibv_context;

/// The names librdmacm prints for events (and "UNKNOWN EVENT").
#[no_mangle]
pub unsafe extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    let name: &'static [u8] = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    name.as_ptr().cast()
}
symver!(rdma_event_str);

/// Every device's context, as librdmacm lists the devices it opened (which stay open).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard_ptr(|| {
        let contexts = crate::device::cm_contexts();
        // SAFETY: n+1 pointers, the last NULL; rdma_free_devices frees them.
        let list =
            unsafe { libc::calloc(contexts.len() + 1, size_of::<*mut ibv_context>()) }.cast::<*mut ibv_context>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, context) in contexts.iter().enumerate() {
            // SAFETY: i < n + 1 entries.
            unsafe { *list.add(i) = *context };
        }
        // SAFETY: the caller's int, if any.
        if let Some(n) = unsafe { num_devices.as_mut() } {
            *n = contexts.len() as c_int;
        }
        list
    })
}
symver!(rdma_get_devices);

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the list from rdma_get_devices; the contexts stay open.
    guard_void(|| unsafe { libc::free(list.cast()) })
}
symver!(rdma_free_devices);
