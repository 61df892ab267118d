//! The calling thread's `errno`, through which C callers learn why a call failed.

use std::os::raw::c_int;

/// Sets the calling thread's `errno`.
pub fn set_errno(err: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno, valid for its lifetime.
    unsafe { *libc::__errno_location() = err }
}

/// The calling thread's `errno`.
pub fn errno() -> c_int {
    // SAFETY: as in set_errno.
    unsafe { *libc::__errno_location() }
}

/// NULL with errno `EOPNOTSUPP`: a constructor's "not supported".
pub(crate) fn unsupported_null<T>() -> *mut T {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `EOPNOTSUPP`, returned and left in errno: for functions that return an errno value.
pub(crate) fn unsupported_errno() -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// -1 with errno `EOPNOTSUPP`: for functions that return -1 and set errno.
pub(crate) fn unsupported_neg() -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_then_read() {
        set_errno(libc::EOPNOTSUPP);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EOPNOTSUPP));
        set_errno(0);
        assert_eq!(errno(), 0);
    }

    #[test]
    fn unsupported_helpers() {
        set_errno(0);
        assert!(unsupported_null::<u8>().is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        set_errno(0);
        assert_eq!(unsupported_errno(), libc::EOPNOTSUPP);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        set_errno(0);
        assert_eq!(unsupported_neg(), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP);
    }

    #[test]
    fn per_thread() {
        set_errno(libc::EINVAL);
        std::thread::spawn(|| {
            set_errno(libc::EIO);
            assert_eq!(errno(), libc::EIO);
        })
        .join()
        .unwrap();
        assert_eq!(errno(), libc::EINVAL);
    }
}
