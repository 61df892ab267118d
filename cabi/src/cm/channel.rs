//! Event channels (`rdma_event_channel`): a softroce [`EventChannel`] behind the C struct,
//! whose `fd` is the channel's own descriptor, readable while events wait, as the kernel's
//! rdma_cm file is. A program may poll it or make it non-blocking.

use std::os::raw::c_int;
use std::ptr;

use softroce::cm::EventChannel;

use crate::cm_sys::rdma_event_channel;
use crate::errno::set_errno;
use crate::guard::{guard_ptr, guard_void};

/// A channel as C sees it: `rdma_event_channel` first, so the pointer is both.
#[repr(C)]
pub(super) struct Channel {
    c: rdma_event_channel,
    pub(super) channel: EventChannel,
}

impl Channel {
    /// A new channel, leaked: [`Channel::free`] takes it back.
    pub(super) fn create() -> Result<*mut rdma_event_channel, c_int> {
        crate::device::share_devices_with_cm();
        let channel = EventChannel::new().map_err(|e| e.errno())?;
        let boxed = Box::new(Channel { c: rdma_event_channel { fd: channel.fd() }, channel });
        Ok(Box::into_raw(boxed).cast())
    }

    /// The channel behind a pointer from [`Channel::create`].
    ///
    /// # Safety
    /// `channel` is NULL or came from [`Channel::create`] and was not freed.
    pub(super) unsafe fn from_c<'a>(channel: *mut rdma_event_channel) -> Option<&'a Channel> {
        // SAFETY: rdma_event_channel opens the Channel.
        unsafe { channel.cast::<Channel>().as_ref() }
    }

    /// # Safety
    /// As [`Channel::from_c`], and nothing uses the channel after.
    pub(super) unsafe fn free(channel: *mut rdma_event_channel) {
        if !channel.is_null() {
            // SAFETY: leaked from a Box by create.
            drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard_ptr(|| match Channel::create() {
        Ok(channel) => channel,
        Err(errno) => {
            set_errno(errno);
            ptr::null_mut()
        }
    })
}
symver!(rdma_create_event_channel);

/// As librdmacm: the program destroys the channel's ids first.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    // SAFETY: the caller's channel, from rdma_create_event_channel.
    guard_void(|| unsafe { Channel::free(channel) })
}
symver!(rdma_destroy_event_channel);
