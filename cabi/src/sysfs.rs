//! `ibv_get_sysfs_path`: where libibverbs and its callers look for sysfs.
//!
//! rdma-core v44's answer (libibverbs/sysfs.c): `$SYSFS_PATH` with its trailing slashes removed
//! (at most `IBV_SYSFS_PATH_MAX` bytes of it, and only in a process that is not set-user-ID), or
//! "/sys"; never NULL, found on the first call and kept. Open MPI's openib BTL looks for
//! `class/infiniband` under it before it uses any device.

use std::ffi::CString;
use std::os::raw::c_char;
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::OnceLock;

use crate::guard::guard;

/// The variable that moves sysfs, as libibverbs reads it.
const SYSFS_PATH_ENV: &str = "SYSFS_PATH";
/// `IBV_SYSFS_PATH_MAX` (verbs.h): the most bytes of the variable that are kept.
const SYSFS_PATH_MAX: usize = 256;

/// The path for a value of `$SYSFS_PATH` (None: unset, or not to be trusted).
fn sysfs_path(env: Option<&[u8]>) -> CString {
    let Some(env) = env else { return c"/sys".to_owned() };
    let mut path = &env[..env.len().min(SYSFS_PATH_MAX)];
    while let [rest @ .., b'/'] = path {
        path = rest;
    }
    // An environment value has no NUL byte; were one there, C would end the string at it.
    let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
    CString::new(&path[..end]).unwrap_or_default()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: OnceLock<CString> = OnceLock::new();
    guard(ptr::null(), || {
        PATH.get_or_init(|| {
            // SAFETY: plain queries of the process's ids.
            let trusted = unsafe { libc::getuid() == libc::geteuid() };
            let env = std::env::var_os(SYSFS_PATH_ENV).filter(|_| trusted);
            sysfs_path(env.as_deref().map(OsStrExt::as_bytes))
        })
        .as_c_str()
        .as_ptr()
    })
}
symver!(ibv_get_sysfs_path);

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn unset_is_sys() {
        assert_eq!(sysfs_path(None).as_bytes(), b"/sys");
    }

    #[test]
    fn trailing_slashes_are_removed() {
        assert_eq!(sysfs_path(Some(b"/tmp/fake-sys//")).as_bytes(), b"/tmp/fake-sys");
        assert_eq!(sysfs_path(Some(b"/tmp/a/b")).as_bytes(), b"/tmp/a/b");
        // As rdma-core's loop: "/" alone becomes the empty string.
        assert_eq!(sysfs_path(Some(b"///")).as_bytes(), b"");
    }

    #[test]
    fn at_most_256_bytes_are_kept() {
        let long = [b'x'; 300];
        assert_eq!(sysfs_path(Some(&long)).as_bytes().len(), SYSFS_PATH_MAX);
    }

    #[test]
    fn one_answer_for_the_process() {
        let first = unsafe { ibv_get_sysfs_path() };
        assert!(!first.is_null());
        assert_eq!(first, unsafe { ibv_get_sysfs_path() });
        let path = unsafe { CStr::from_ptr(first) }.to_bytes();
        assert!(path.is_empty() || !path.ends_with(b"/"), "{path:?}");
    }
}
