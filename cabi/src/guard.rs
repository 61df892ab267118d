//! Panic barriers for the exported functions.
//!
//! A panic must not unwind into C: out of an `extern "C"` function it aborts the whole program
//! (Rust 1.81 and later), where the caller expected an error return. Each entry point runs its
//! body under the helper matching the function's error convention, and a panic becomes `EIO`.
//! The panic message still goes to stderr through the panic hook.

use std::os::raw::c_int;
use std::panic::{catch_unwind, UnwindSafe};
use std::ptr;

use crate::errno::set_errno;

/// Runs `f`; after a panic, sets errno to `EIO` and returns `on_panic`.
pub fn guard<T>(on_panic: T, f: impl FnOnce() -> T + UnwindSafe) -> T {
    catch_unwind(f).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        on_panic
    })
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
