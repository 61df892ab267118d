//! `rdma_getaddrinfo` and `rdma_freeaddrinfo`, as rdma-core v44's librdmacm gives them without
//! ib_acm (no route or connect data).
//!
//! With a node or a service, the system's `getaddrinfo` resolves them and its first answer is
//! kept: the source with `RAI_PASSIVE` (a wildcard without a node), otherwise the destination.
//! With neither, the answer is the hints themselves: their flags, family, QP type, port space and
//! destination address (libfabric's verbs provider asks this way for every endpoint whose
//! addresses it already holds). Either way a hint's source address fills an empty source.
//!
//! Returns as librdmacm v44's: 0; -1 with errno `EINVAL` when there is nothing to resolve (no
//! node, service or hints) and `ENOMEM` when memory runs out; the resolver's `EAI_*` code itself
//! (a negative number) when it fails. AF_IB is never made: a `RAI_FAMILY` hint for AF_IB gets the
//! resolved IP address, which softroce's ids take.

use std::os::raw::{c_char, c_int};
use std::ptr;

use crate::cm_sys::*;
use crate::errno::set_errno;
use crate::guard::{guard_neg, guard_void};
use crate::sys::{IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_RECV, IBV_QPT_XRC_SEND};

/// `*dst` and `*dst_len` become a `malloc`ed copy of the `len` bytes at `src` (which
/// `rdma_freeaddrinfo` frees); 0, or -1 with errno `ENOMEM` (`EINVAL` for a length without an
/// address, where librdmacm would read through NULL).
unsafe fn copy_addr(dst: &mut *mut sockaddr, dst_len: &mut socklen_t, src: *const sockaddr, len: socklen_t) -> c_int {
    if src.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's `src` is `len` bytes; a fresh block of that size.
    unsafe {
        let copy = libc::malloc(len as usize).cast::<sockaddr>();
        if copy.is_null() {
            set_errno(libc::ENOMEM);
            return -1;
        }
        ptr::copy_nonoverlapping(src.cast::<u8>(), copy.cast::<u8>(), len as usize);
        *dst = copy;
    }
    *dst_len = len;
    0
}

/// The resolver's hints for ours, as librdmacm converts them: flags, family (not AF_IB), the
/// socket type the QP type implies and the protocol the port space implies.
fn system_hints(hints: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: all zeros is an empty addrinfo.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if hints.ai_flags & RAI_PASSIVE as c_int != 0 {
        ai.ai_flags |= libc::AI_PASSIVE;
    }
    if hints.ai_flags & RAI_NUMERICHOST as c_int != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if hints.ai_family != libc::AF_IB {
        ai.ai_family = hints.ai_family;
    }
    ai.ai_socktype = match hints.ai_qp_type as u32 {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
        IBV_QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    ai.ai_protocol = match hints.ai_port_space as u32 {
        RDMA_PS_TCP => libc::IPPROTO_TCP,
        RDMA_PS_IPOIB | RDMA_PS_UDP => libc::IPPROTO_UDP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
        _ => 0,
    };
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
        let given = unsafe { hints.as_ref() };
        if res.is_null() || (node.is_null() && service.is_null() && given.is_none()) {
            set_errno(libc::EINVAL);
            return -1;
        }
        let no_hints = rdma_addrinfo::default();
        let hints = given.unwrap_or(&no_hints);
        // SAFETY: a zeroed block of the struct's size is an empty rdma_addrinfo.
        let rai = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
        if rai.is_null() {
            set_errno(libc::ENOMEM);
            return -1;
        }
        // SAFETY: just allocated and zeroed; each hint address is as long as its length says.
        let r = unsafe { &mut *rai };
        let mut ret = if !node.is_null() || !service.is_null() {
            // SAFETY: C strings (or NULL) from the caller.
            unsafe { resolve(node, service, given, r) }
        } else {
            r.ai_flags = hints.ai_flags;
            r.ai_family = hints.ai_family;
            r.ai_qp_type = hints.ai_qp_type;
            r.ai_port_space = hints.ai_port_space;
            match hints.ai_dst_len {
                0 => 0,
                len => unsafe { copy_addr(&mut r.ai_dst_addr, &mut r.ai_dst_len, hints.ai_dst_addr, len) },
            }
        };
        if ret == 0 && r.ai_src_len == 0 && hints.ai_src_len != 0 {
            ret = unsafe { copy_addr(&mut r.ai_src_addr, &mut r.ai_src_len, hints.ai_src_addr, hints.ai_src_len) };
        }
        if ret != 0 {
            // SAFETY: ours, whole; freeing keeps the errno set above.
            let errno = crate::errno::errno();
            unsafe { rdma_freeaddrinfo(rai) };
            set_errno(errno);
            return ret;
        }
        // SAFETY: the caller's pointer.
        unsafe { *res = rai };
        0
    })
}
symver!(rdma_getaddrinfo);

/// The resolver's first answer for `node` and `service` into `r`, as librdmacm's
/// `ucma_getaddrinfo`: 0, the resolver's `EAI_*` code, or -1 with errno `ENOMEM`.
unsafe fn resolve(
    node: *const c_char,
    service: *const c_char,
    hints: Option<&rdma_addrinfo>,
    r: &mut rdma_addrinfo,
) -> c_int {
    let system = hints.map(system_hints);
    let mut found: *mut libc::addrinfo = ptr::null_mut();
    // SAFETY: C strings (or NULL) from the caller, our hints or none, a place for the list.
    let rc =
        unsafe { libc::getaddrinfo(node, service, system.as_ref().map_or(ptr::null(), |s| s as *const _), &mut found) };
    if rc != 0 {
        return rc;
    }
    // SAFETY: getaddrinfo succeeded: a list of at least one entry, freed below.
    let ai = unsafe { &*found };
    let ret = unsafe { convert(ai, hints.copied().unwrap_or_default(), r) };
    unsafe { libc::freeaddrinfo(found) };
    ret
}

/// `ai` into `r`, as librdmacm's `ucma_convert_to_rai`: the hints' QP type and port space, or the
/// ones the answer's socket type and protocol imply; the address (and canonical name) as the
/// source when the answer is passive, the destination otherwise.
unsafe fn convert(ai: &libc::addrinfo, hints: rdma_addrinfo, r: &mut rdma_addrinfo) -> c_int {
    r.ai_qp_type = match (hints.ai_qp_type, ai.ai_socktype) {
        (0, libc::SOCK_STREAM) => IBV_QPT_RC as c_int,
        (0, libc::SOCK_DGRAM) => IBV_QPT_UD as c_int,
        (0, _) => 0,
        (given, _) => given,
    };
    r.ai_port_space = match (hints.ai_port_space, ai.ai_protocol) {
        (0, libc::IPPROTO_TCP) => RDMA_PS_TCP as c_int,
        (0, libc::IPPROTO_UDP) => RDMA_PS_UDP as c_int,
        (0, _) => 0,
        (given, _) => given,
    };
    r.ai_family = ai.ai_family;
    let passive = ai.ai_flags & libc::AI_PASSIVE != 0;
    let canonname = if ai.ai_canonname.is_null() {
        ptr::null_mut()
    } else {
        // SAFETY: the resolver's C string.
        unsafe { libc::strdup(ai.ai_canonname) }
    };
    // SAFETY: the resolver's address is ai_addrlen bytes.
    unsafe {
        if passive {
            r.ai_flags = RAI_PASSIVE as c_int;
            r.ai_src_canonname = canonname;
            copy_addr(&mut r.ai_src_addr, &mut r.ai_src_len, ai.ai_addr.cast(), ai.ai_addrlen)
        } else {
            r.ai_dst_canonname = canonname;
            copy_addr(&mut r.ai_dst_addr, &mut r.ai_dst_len, ai.ai_addr.cast(), ai.ai_addrlen)
        }
    }
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

    /// librdmacm would read through NULL; softroce refuses.
    #[test]
    fn hint_length_without_address_is_einval() {
        let hints = rdma_addrinfo { ai_dst_len: 16, ..Default::default() };
        let mut res = ptr::null_mut();
        crate::errno::set_errno(0);
        let rc = unsafe { rdma_getaddrinfo(ptr::null(), ptr::null(), &hints, &mut res) };
        assert_eq!((rc, crate::errno::errno()), (-1, libc::EINVAL));
        assert!(res.is_null());
    }

    #[test]
    fn unknown_host_is_resolver_error() {
        let node = CString::new("no-such-host.invalid").unwrap();
        let mut res = ptr::null_mut();
        let rc = unsafe { rdma_getaddrinfo(node.as_ptr(), ptr::null(), ptr::null(), &mut res) };
        assert!(rc == libc::EAI_NONAME || rc == libc::EAI_AGAIN || rc == libc::EAI_FAIL, "{rc}");
    }
}
