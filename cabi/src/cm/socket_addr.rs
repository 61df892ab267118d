//! `struct sockaddr` to and from [`SocketAddr`].

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::cm_sys::sockaddr;

/// The address at `addr` if it is an IPv4 or IPv6 one (librdmacm's `ucma_addrlen`: others,
/// AF_IB among them, are `EINVAL`).
///
/// # Safety
/// `addr` is NULL or points to a socket address as long as its family says.
pub(super) unsafe fn read(addr: *const sockaddr) -> Option<SocketAddr> {
    // SAFETY: the family says how much there is to read.
    unsafe {
        match addr.cast::<libc::sockaddr>().as_ref()?.sa_family as i32 {
            libc::AF_INET => {
                let sin = &*addr.cast::<libc::sockaddr_in>();
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 => {
                let sin6 = &*addr.cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                let port = u16::from_be(sin6.sin6_port);
                Some(SocketAddr::V6(SocketAddrV6::new(ip, port, sin6.sin6_flowinfo, sin6.sin6_scope_id)))
            }
            _ => None,
        }
    }
}

/// Writes `addr` at `dst`, which has room for a `sockaddr_storage`.
///
/// # Safety
/// `dst` points to at least `size_of::<sockaddr_storage>()` writable bytes.
pub(super) unsafe fn write(dst: *mut sockaddr, addr: SocketAddr) {
    // SAFETY: both kinds fit in a sockaddr_storage; written unaligned-safe by value.
    unsafe {
        match addr {
            SocketAddr::V4(a) => {
                let mut sin: libc::sockaddr_in = std::mem::zeroed();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                dst.cast::<libc::sockaddr_in>().write_unaligned(sin);
            }
            SocketAddr::V6(a) => {
                let mut sin6: libc::sockaddr_in6 = std::mem::zeroed();
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr.s6_addr = a.ip().octets();
                sin6.sin6_flowinfo = a.flowinfo();
                sin6.sin6_scope_id = a.scope_id();
                dst.cast::<libc::sockaddr_in6>().write_unaligned(sin6);
            }
        }
    }
}

/// The port of the address at `addr` in network order, 0 if it has none (`rdma_get_src_port`).
///
/// # Safety
/// As [`read`].
pub(super) unsafe fn port_be(addr: *const sockaddr) -> u16 {
    // SAFETY: as the caller promises.
    unsafe { read(addr) }.map_or(0, |a| a.port().to_be())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for text in ["127.0.0.1:7471", "[::1]:20079", "0.0.0.0:0"] {
            let addr: SocketAddr = text.parse().unwrap();
            // SAFETY: all zeros is an empty sockaddr_storage, large enough for either family.
            let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let p = std::ptr::addr_of_mut!(storage).cast::<sockaddr>();
            unsafe { write(p, addr) };
            assert_eq!(unsafe { read(p) }, Some(addr));
            assert_eq!(unsafe { port_be(p) }, addr.port().to_be());
        }
    }
}
