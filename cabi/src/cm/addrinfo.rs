//! `rdma_getaddrinfo` and `rdma_freeaddrinfo`: the system's `getaddrinfo`, turned into an
//! `rdma_addrinfo` as librdmacm does without ib_acm (no route or connect data, AF_IB never).
//!
//! Like librdmacm, only the first address the resolver gives is kept; `RAI_PASSIVE` makes it the
//! source (a wildcard without a node, for `rdma_create_ep` and a listener), otherwise the
//! destination, with the hints' source copied along. Errors are the resolver's `EAI_*` codes, or
//! -1 with errno for arguments and memory.

use std::os::raw::{c_char, c_int};
use std::ptr;

use crate::cm_sys::*;
use crate::errno::set_errno;
use crate::guard::{guard_neg, guard_void};
use crate::sys::{IBV_QPT_RC, IBV_QPT_UD};

/// A copy of `len` bytes at `src` in `malloc`ed memory (which `rdma_freeaddrinfo` frees).
unsafe fn malloc_copy<T>(src: *const T, len: usize) -> *mut T {
    // SAFETY: the caller's `src` is `len` bytes; a fresh block of that size.
    unsafe {
        let copy = libc::malloc(len).cast::<T>();
        if !copy.is_null() {
            ptr::copy_nonoverlapping(src.cast::<u8>(), copy.cast::<u8>(), len);
        }
        copy
    }
}

/// The resolver's hints for ours: flags, family, and the socket type the QP type or port space
/// implies (RC and TCP streams, UD and UDP datagrams).
fn system_hints(hints: Option<&rdma_addrinfo>) -> libc::addrinfo {
    // SAFETY: all zeros is an empty addrinfo.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    let Some(hints) = hints else { return ai };
    if hints.ai_flags & RAI_PASSIVE as c_int != 0 {
        ai.ai_flags |= libc::AI_PASSIVE;
    }
    if hints.ai_flags & RAI_NUMERICHOST as c_int != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if hints.ai_family != libc::AF_IB {
        ai.ai_family = hints.ai_family;
    }
    let qp_type = hints.ai_qp_type as u32;
    let ps = hints.ai_port_space as u32;
    if qp_type == IBV_QPT_RC || ps == RDMA_PS_TCP {
        ai.ai_socktype = libc::SOCK_STREAM;
    } else if qp_type == IBV_QPT_UD || ps == RDMA_PS_UDP {
        ai.ai_socktype = libc::SOCK_DGRAM;
    }
    ai
}

#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard_neg(|| {
        // SAFETY: the caller's hints, if any.
        let hints = unsafe { hints.as_ref() };
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_none_or(|h| h.ai_src_addr.is_null())) {
            set_errno(libc::EINVAL);
            return -1;
        }
        let system = system_hints(hints);
        let mut found: *mut libc::addrinfo = ptr::null_mut();
        // SAFETY: C strings (or NULL) from the caller, our hints, a place for the list.
        let rc = unsafe { libc::getaddrinfo(node, service, &system, &mut found) };
        if rc != 0 {
            return rc;
        }
        // SAFETY: getaddrinfo succeeded: a list of at least one entry, freed below.
        let first = unsafe { &*found };
        let rai = unsafe { convert(first, hints) };
        unsafe { libc::freeaddrinfo(found) };
        match rai {
            Some(rai) => {
                // SAFETY: the caller's pointer.
                unsafe { *res = rai };
                0
            }
            None => {
                set_errno(libc::ENOMEM);
                -1
            }
        }
    })
}
symver!(rdma_getaddrinfo);

/// `ai` as an `rdma_addrinfo` (NULL when memory ran out).
unsafe fn convert(ai: &libc::addrinfo, hints: Option<&rdma_addrinfo>) -> Option<*mut rdma_addrinfo> {
    // SAFETY: a zeroed block of the struct's size is an empty rdma_addrinfo.
    let rai = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
    if rai.is_null() {
        return None;
    }
    // SAFETY: just allocated and zeroed.
    let r = unsafe { &mut *rai };
    let passive = hints.is_some_and(|h| h.ai_flags & RAI_PASSIVE as c_int != 0);
    r.ai_flags = hints.map_or(0, |h| h.ai_flags);
    r.ai_family = ai.ai_family;
    r.ai_qp_type = match hints {
        Some(h) if h.ai_qp_type != 0 => h.ai_qp_type,
        _ if ai.ai_socktype == libc::SOCK_DGRAM => IBV_QPT_UD as c_int,
        _ => IBV_QPT_RC as c_int,
    };
    r.ai_port_space = match hints {
        Some(h) if h.ai_port_space != 0 => h.ai_port_space,
        _ if ai.ai_socktype == libc::SOCK_DGRAM => RDMA_PS_UDP as c_int,
        _ => RDMA_PS_TCP as c_int,
    };
    // SAFETY: the resolver's address is ai_addrlen bytes; the hints' source ai_src_len.
    let addr = unsafe { malloc_copy(ai.ai_addr.cast::<sockaddr>(), ai.ai_addrlen as usize) };
    let failed = unsafe {
        if passive {
            r.ai_src_addr = addr;
            r.ai_src_len = ai.ai_addrlen;
            r.ai_src_addr.is_null()
        } else {
            r.ai_dst_addr = addr;
            r.ai_dst_len = ai.ai_addrlen;
            if let Some(h) = hints.filter(|h| !h.ai_src_addr.is_null()) {
                r.ai_src_addr = malloc_copy(h.ai_src_addr, h.ai_src_len as usize);
                r.ai_src_len = h.ai_src_len;
            }
            r.ai_dst_addr.is_null() || hints.is_some_and(|h| !h.ai_src_addr.is_null() && r.ai_src_addr.is_null())
        }
    };
    if failed {
        // SAFETY: ours, whole.
        unsafe { rdma_freeaddrinfo(rai) };
        return None;
    }
    Some(rai)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard_void(|| {
        let mut next = res;
        while !next.is_null() {
            // SAFETY: a list from rdma_getaddrinfo: every pointer malloc'ed or NULL.
            unsafe {
                let rai = &*next;
                let after = rai.ai_next;
                for field in [
                    rai.ai_src_addr.cast::<libc::c_void>(),
                    rai.ai_dst_addr.cast(),
                    rai.ai_src_canonname.cast(),
                    rai.ai_dst_canonname.cast(),
                    rai.ai_route,
                    rai.ai_connect,
                ] {
                    libc::free(field);
                }
                libc::free(next.cast());
                next = after;
            }
        }
    })
}
symver!(rdma_freeaddrinfo);

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn v4(addr: *const sockaddr) -> SocketAddrV4 {
        // SAFETY: an AF_INET address from rdma_getaddrinfo.
        let sin = unsafe { &*addr.cast::<libc::sockaddr_in>() };
        assert_eq!(sin.sin_family as c_int, libc::AF_INET);
        SocketAddrV4::new(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)), u16::from_be(sin.sin_port))
    }

    fn getaddrinfo(node: Option<&str>, service: &str, hints: &rdma_addrinfo) -> *mut rdma_addrinfo {
        let node = node.map(|n| CString::new(n).unwrap());
        let service = CString::new(service).unwrap();
        let mut res = ptr::null_mut();
        let rc = unsafe {
            rdma_getaddrinfo(node.as_ref().map_or(ptr::null(), |n| n.as_ptr()), service.as_ptr(), hints, &mut res)
        };
        assert_eq!(rc, 0);
        res
    }

    #[test]
    fn active_numeric_is_destination() {
        let hints = rdma_addrinfo { ai_port_space: RDMA_PS_TCP as c_int, ..Default::default() };
        let res = getaddrinfo(Some("127.0.0.1"), "7471", &hints);
        let r = unsafe { &*res };
        assert_eq!(v4(r.ai_dst_addr), "127.0.0.1:7471".parse().unwrap());
        assert!(r.ai_src_addr.is_null());
        assert_eq!(r.ai_qp_type, IBV_QPT_RC as c_int);
        assert_eq!(r.ai_port_space, RDMA_PS_TCP as c_int);
        unsafe { rdma_freeaddrinfo(res) };
    }

    #[test]
    fn passive_without_node_is_wildcard_source() {
        let hints = rdma_addrinfo {
            ai_flags: RAI_PASSIVE as c_int,
            ai_family: libc::AF_INET,
            ai_port_space: RDMA_PS_UDP as c_int,
            ..Default::default()
        };
        let res = getaddrinfo(None, "7174", &hints);
        let r = unsafe { &*res };
        assert_eq!(v4(r.ai_src_addr), "0.0.0.0:7174".parse().unwrap());
        assert!(r.ai_dst_addr.is_null());
        assert_eq!(r.ai_qp_type, IBV_QPT_UD as c_int);
        unsafe { rdma_freeaddrinfo(res) };
    }

    #[test]
    fn host_name_resolves() {
        let hints = rdma_addrinfo { ai_family: libc::AF_INET, ..Default::default() };
        let res = getaddrinfo(Some("localhost"), "1", &hints);
        assert!(v4(unsafe { &*res }.ai_dst_addr).ip().is_loopback());
        unsafe { rdma_freeaddrinfo(res) };
    }

    #[test]
    fn unknown_host_is_resolver_error() {
        let node = CString::new("no-such-host.invalid").unwrap();
        let mut res = ptr::null_mut();
        let rc = unsafe { rdma_getaddrinfo(node.as_ptr(), ptr::null(), ptr::null(), &mut res) };
        assert!(rc == libc::EAI_NONAME || rc == libc::EAI_AGAIN || rc == libc::EAI_FAIL, "{rc}");
    }
}
