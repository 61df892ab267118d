//! Panic and cancellation barriers for the exported functions.
//!
//! A panic must not unwind into C: out of an `extern "C"` function it aborts the whole program
//! (Rust 1.81 and later), where the caller expected an error return. Each entry point runs its
//! body under the helper matching the function's error convention, and a panic becomes `EIO`.
//! The panic message still goes to stderr through the panic hook.
//!
//! Nor may a thread's cancellation (`pthread_cancel`) act inside softroce's code: it acts at the
//! next cancellation point, any of the system calls softroce makes (a `recvmsg` in `ibv_poll_cq`,
//! a `poll` in `ibv_get_cq_event`), and glibc's forced unwind from there met the panic barrier and
//! aborted the program ("FATAL: exception not rethrown"), where it would have held locks besides.
//! So the body runs with cancellation disabled. rdma-core's calls are cancellation points only
//! where they block in `read` (`ibv_get_cq_event`, `ibv_get_async_event`, `rdma_get_cm_event`);
//! those wait in slices under [`blocking`], and a cancellation requested meanwhile acts between
//! slices, unwinding only through frames that own nothing.

use std::os::raw::c_int;
use std::panic::{catch_unwind, UnwindSafe};
use std::ptr;

use crate::errno::set_errno;

/// glibc's `PTHREAD_CANCEL_DISABLE` (`PTHREAD_CANCEL_ENABLE` is 0), which the libc crate does
/// not have for Linux.
const PTHREAD_CANCEL_DISABLE: c_int = 1;

extern "C" {
    fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
}

extern "C-unwind" {
    /// A cancellation point: a pending cancellation unwinds from here (a forced unwind).
    fn pthread_testcancel();
}

/// The thread's cancellation disabled while it lives; its drop puts back the state it found (a
/// call from inside another, or a program that disabled it itself, keeps it disabled).
struct CancelHeld(c_int);

impl CancelHeld {
    fn new() -> CancelHeld {
        let mut old = 0;
        // SAFETY: a valid out-pointer; the call only sets this thread's state.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        CancelHeld(old)
    }
}

impl Drop for CancelHeld {
    fn drop(&mut self) {
        let mut ignored = 0;
        // SAFETY: as in `new`, with the state `new` found.
        unsafe { pthread_setcancelstate(self.0, &mut ignored) };
    }
}

/// Runs `f` with cancellation disabled; after a panic, sets errno to `EIO` and returns
/// `on_panic`.
pub fn guard<T>(on_panic: T, f: impl FnOnce() -> T + UnwindSafe) -> T {
    let _held = CancelHeld::new();
    catch_unwind(f).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        on_panic
    })
}

/// Longest a [`blocking`] call waits before a cancellation requested meanwhile may act.
pub const CANCEL_SLICE_MS: c_int = 50;

/// A call that blocks as rdma-core's do in `read`, and is a cancellation point as they are: runs
/// `step` under [`guard`] until it returns a result; a step that returns `None` has waited up to
/// [`CANCEL_SLICE_MS`] for nothing, and a cancellation requested meanwhile then acts. The exported
/// function calling this must be `extern "C-unwind"`, own nothing that needs dropping, and return
/// what this returns: the forced unwind goes through its frame and this one into the program, and
/// `step`, being `Copy`, has no destructor to skip.
pub fn blocking<T: Copy>(on_panic: T, step: impl Fn() -> Option<T> + Copy + UnwindSafe) -> T {
    loop {
        if let Some(done) = guard(Some(on_panic), step) {
            return done;
        }
        // SAFETY: nothing of softroce's is held here (`guard` returned, cancellation is back as
        // the program set it), and the frames up to the program's own own nothing.
        unsafe { pthread_testcancel() };
    }
}

/// Waits up to [`CANCEL_SLICE_MS`] for `fd` to be readable: `Some(true)` readable, `None` not
/// yet, `Some(false)` with errno set if the wait failed (EINTR from a signal, as the kernel's
/// read would).
pub fn wait_readable_slice(fd: c_int) -> Option<bool> {
    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    match unsafe { libc::poll(&mut poll, 1, CANCEL_SLICE_MS) } {
        0 => None,
        n => Some(n > 0),
    }
}

/// For functions returning 0 or an errno value (`ibv_modify_qp`, `ibv_post_send`, …).
pub fn guard_int(f: impl FnOnce() -> c_int + UnwindSafe) -> c_int {
    guard(libc::EIO, f)
}

/// For functions returning -1 and setting errno (`ibv_get_cq_event`, `ibv_query_gid`, …).
pub fn guard_neg(f: impl FnOnce() -> c_int + UnwindSafe) -> c_int {
    guard(-1, f)
}

/// For functions returning NULL and setting errno (`ibv_open_device`, `ibv_create_qp`, …).
pub fn guard_ptr<T>(f: impl FnOnce() -> *mut T + UnwindSafe) -> *mut T {
    guard(ptr::null_mut(), f)
}

/// For functions returning nothing (`ibv_ack_cq_events`, …): a panic is only reported in errno.
pub fn guard_void(f: impl FnOnce() + UnwindSafe) {
    guard((), f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno::errno;

    fn boom<T>() -> T {
        panic!("test panic, expected")
    }

    #[test]
    fn values_pass_through() {
        set_errno(0);
        assert_eq!(guard_int(|| 0), 0);
        assert_eq!(guard_int(|| libc::EINVAL), libc::EINVAL);
        assert_eq!(guard_neg(|| 7), 7);
        let mut x = 5u8;
        let p: *mut u8 = &mut x;
        assert_eq!(guard_ptr(|| p), p);
        let mut ran = false;
        guard_void(std::panic::AssertUnwindSafe(|| ran = true));
        assert!(ran);
        assert_eq!(guard(3u64, || 4), 4);
        assert_eq!(errno(), 0);
    }

    #[test]
    fn int_panic_is_eio() {
        set_errno(0);
        assert_eq!(guard_int(boom), libc::EIO);
        assert_eq!(errno(), libc::EIO);
    }

    #[test]
    fn neg_panic_is_minus_one() {
        set_errno(0);
        assert_eq!(guard_neg(boom), -1);
        assert_eq!(errno(), libc::EIO);
    }

    #[test]
    fn ptr_panic_is_null() {
        set_errno(0);
        assert!(guard_ptr::<u8>(boom).is_null());
        assert_eq!(errno(), libc::EIO);
    }

    #[test]
    fn void_panic_sets_errno() {
        set_errno(0);
        guard_void(boom);
        assert_eq!(errno(), libc::EIO);
    }

    #[test]
    fn generic_panic_value() {
        set_errno(0);
        assert_eq!(guard(-(libc::EIO as isize), boom), -(libc::EIO as isize));
        assert_eq!(errno(), libc::EIO);
    }
}
