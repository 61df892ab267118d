//! Event channels (`rdma_event_channel`): a softroce [`EventChannel`] behind the C struct,
//! whose `fd` is the channel's own descriptor, readable while events wait, as the kernel's
//! rdma_cm file is. A program may poll it or make it non-blocking.

use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use softroce::cm::EventChannel;

use super::id::locked;
use crate::cm_sys::rdma_event_channel;
use crate::errno::set_errno;
use crate::guard::{guard_ptr, guard_void};

/// The channels made and not yet freed.
static CHANNELS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The channels the program destroyed last, by address (a new channel at the same address
/// leaves the list): [`Channel::was_destroyed`].
static DESTROYED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// How many destroyed channels [`DESTROYED`] remembers.
const DESTROYED_KEPT: usize = 64;

/// A channel as C sees it: `rdma_event_channel` first, so the pointer is both.
#[repr(C)]
pub(super) struct Channel {
    c: rdma_event_channel,
    pub(super) channel: EventChannel,
    /// Threads inside `rdma_get_cm_event` on it ([`Channel::enter`]).
    getters: AtomicUsize,
}

/// A thread inside `rdma_get_cm_event` on a channel, until dropped.
pub(super) struct Getter<'a>(pub(super) &'a Channel);

impl Drop for Getter<'_> {
    fn drop(&mut self) {
        self.0.getters.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Channel {
    /// A new channel, leaked: [`Channel::free`] takes it back.
    pub(super) fn create() -> Result<*mut rdma_event_channel, c_int> {
        crate::device::open_cm_contexts();
        let channel = EventChannel::new().map_err(|e| e.errno())?;
        let boxed =
            Box::new(Channel { c: rdma_event_channel { fd: channel.fd() }, channel, getters: AtomicUsize::new(0) });
        let leaked = Box::into_raw(boxed);
        locked(&DESTROYED).retain(|&c| c != leaked as usize);
        locked(&CHANNELS).push(leaked as usize);
        Ok(leaked.cast())
    }

    /// The channel behind a pointer from [`Channel::create`]: only one not yet freed, so that a
    /// stale or foreign pointer is `EINVAL` rather than a crash.
    pub(super) fn from_c<'a>(channel: *mut rdma_event_channel) -> Option<&'a Channel> {
        let known = locked(&CHANNELS).contains(&(channel as usize));
        // SAFETY: a listed channel is a live Channel, whose rdma_event_channel opens it.
        known.then(|| unsafe { &*channel.cast::<Channel>() })
    }

    /// [`Channel::from_c`] for `rdma_get_cm_event`, which may block in it: counted, under the
    /// list's lock, so that a destroy meanwhile does not free it under the waiting thread.
    pub(super) fn enter<'a>(channel: *mut rdma_event_channel) -> Option<Getter<'a>> {
        let channels = locked(&CHANNELS);
        let known = channels.contains(&(channel as usize));
        // SAFETY: a listed channel is a live Channel, whose rdma_event_channel opens it.
        let found: &'a Channel = known.then(|| unsafe { &*channel.cast::<Channel>() })?;
        found.getters.fetch_add(1, Ordering::AcqRel);
        Some(Getter(found))
    }

    /// Whether `channel` is one the program destroyed (and no channel made since took its place).
    pub(super) fn was_destroyed(channel: *mut rdma_event_channel) -> bool {
        locked(&DESTROYED).contains(&(channel as usize))
    }

    /// # Safety
    /// No id uses the channel after, as librdmacm asks. A thread still waiting in it (a
    /// program's event thread it never joined, rping's of rdma-core 44) keeps waiting, as on
    /// the kernel's channel whose descriptor was closed under its read: the channel is then
    /// left allocated, never freed under it.
    pub(super) unsafe fn free(channel: *mut rdma_event_channel) {
        let mut channels = locked(&CHANNELS);
        if let Some(at) = channels.iter().position(|&c| c == channel as usize) {
            channels.swap_remove(at);
            let mut destroyed = locked(&DESTROYED);
            if destroyed.len() == DESTROYED_KEPT {
                destroyed.remove(0);
            }
            destroyed.push(channel as usize);
            // SAFETY: leaked from a Box by create, and no longer listed.
            let channel = unsafe { Box::from_raw(channel.cast::<Channel>()) };
            if channel.getters.load(Ordering::Acquire) > 0 {
                Box::leak(channel);
            }
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
