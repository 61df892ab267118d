//! rsockets, librdmacm's sockets over RDMA (`<rdma/rsocket.h>`), which softroce does not provide.
//!
//! The calls exist because programs import them without using them: Debian's rping, ucmatose
//! and udaddy are linked `BIND_NOW` against `rpoll`, so the library must define it to load them.
//! Each one fails as a socket call does: -1 (or the type's all-ones value) with errno `ENOSYS`.
//! Arguments are declared only as far as the calling convention needs them.

#![allow(clippy::missing_safety_doc)] // The contract of each function is rdma-core's.

use std::os::raw::{c_int, c_void};

use crate::errno::set_errno;

/// What every rsockets call returns: -1, errno `ENOSYS`.
fn no_rsockets<T: From<i8>>() -> T {
    set_errno(libc::ENOSYS);
    T::from(-1)
}

#[no_mangle]
pub unsafe extern "C" fn rsocket(_domain: c_int, _kind: c_int, _protocol: c_int) -> c_int {
    no_rsockets()
}
symver!(rsocket);

#[no_mangle]
pub unsafe extern "C" fn rbind(_socket: c_int, _addr: *const libc::sockaddr, _len: libc::socklen_t) -> c_int {
    no_rsockets()
}
symver!(rbind);

#[no_mangle]
pub unsafe extern "C" fn rlisten(_socket: c_int, _backlog: c_int) -> c_int {
    no_rsockets()
}
symver!(rlisten);

#[no_mangle]
pub unsafe extern "C" fn raccept(_socket: c_int, _addr: *mut libc::sockaddr, _len: *mut libc::socklen_t) -> c_int {
    no_rsockets()
}
symver!(raccept);

#[no_mangle]
pub unsafe extern "C" fn rconnect(_socket: c_int, _addr: *const libc::sockaddr, _len: libc::socklen_t) -> c_int {
    no_rsockets()
}
symver!(rconnect);

#[no_mangle]
pub unsafe extern "C" fn rshutdown(_socket: c_int, _how: c_int) -> c_int {
    no_rsockets()
}
symver!(rshutdown);

#[no_mangle]
pub unsafe extern "C" fn rclose(_socket: c_int) -> c_int {
    no_rsockets()
}
symver!(rclose);

#[no_mangle]
pub unsafe extern "C" fn rrecv(_socket: c_int, _buf: *mut c_void, _len: usize, _flags: c_int) -> isize {
    no_rsockets()
}
symver!(rrecv);

#[no_mangle]
pub unsafe extern "C" fn rrecvfrom(
    _socket: c_int,
    _buf: *mut c_void,
    _len: usize,
    _flags: c_int,
    _from: *mut libc::sockaddr,
    _from_len: *mut libc::socklen_t,
) -> isize {
    no_rsockets()
}
symver!(rrecvfrom);

#[no_mangle]
pub unsafe extern "C" fn rrecvmsg(_socket: c_int, _msg: *mut libc::msghdr, _flags: c_int) -> isize {
    no_rsockets()
}
symver!(rrecvmsg);

#[no_mangle]
pub unsafe extern "C" fn rsend(_socket: c_int, _buf: *const c_void, _len: usize, _flags: c_int) -> isize {
    no_rsockets()
}
symver!(rsend);

#[no_mangle]
pub unsafe extern "C" fn rsendto(
    _socket: c_int,
    _buf: *const c_void,
    _len: usize,
    _flags: c_int,
    _to: *const libc::sockaddr,
    _to_len: libc::socklen_t,
) -> isize {
    no_rsockets()
}
symver!(rsendto);

#[no_mangle]
pub unsafe extern "C" fn rsendmsg(_socket: c_int, _msg: *const libc::msghdr, _flags: c_int) -> isize {
    no_rsockets()
}
symver!(rsendmsg);

#[no_mangle]
pub unsafe extern "C" fn rread(_socket: c_int, _buf: *mut c_void, _count: usize) -> isize {
    no_rsockets()
}
symver!(rread);

#[no_mangle]
pub unsafe extern "C" fn rreadv(_socket: c_int, _iov: *const libc::iovec, _iovcnt: c_int) -> isize {
    no_rsockets()
}
symver!(rreadv);

#[no_mangle]
pub unsafe extern "C" fn rwrite(_socket: c_int, _buf: *const c_void, _count: usize) -> isize {
    no_rsockets()
}
symver!(rwrite);

#[no_mangle]
pub unsafe extern "C" fn rwritev(_socket: c_int, _iov: *const libc::iovec, _iovcnt: c_int) -> isize {
    no_rsockets()
}
symver!(rwritev);

#[no_mangle]
pub unsafe extern "C" fn rpoll(_fds: *mut libc::pollfd, _nfds: libc::nfds_t, _timeout: c_int) -> c_int {
    no_rsockets()
}
symver!(rpoll);

#[no_mangle]
pub unsafe extern "C" fn rselect(
    _nfds: c_int,
    _readfds: *mut libc::fd_set,
    _writefds: *mut libc::fd_set,
    _exceptfds: *mut libc::fd_set,
    _timeout: *mut libc::timeval,
) -> c_int {
    no_rsockets()
}
symver!(rselect);

#[no_mangle]
pub unsafe extern "C" fn rgetpeername(_socket: c_int, _addr: *mut libc::sockaddr, _len: *mut libc::socklen_t) -> c_int {
    no_rsockets()
}
symver!(rgetpeername);

#[no_mangle]
pub unsafe extern "C" fn rgetsockname(_socket: c_int, _addr: *mut libc::sockaddr, _len: *mut libc::socklen_t) -> c_int {
    no_rsockets()
}
symver!(rgetsockname);

#[no_mangle]
pub unsafe extern "C" fn rsetsockopt(
    _socket: c_int,
    _level: c_int,
    _optname: c_int,
    _optval: *const c_void,
    _optlen: libc::socklen_t,
) -> c_int {
    no_rsockets()
}
symver!(rsetsockopt);

#[no_mangle]
pub unsafe extern "C" fn rgetsockopt(
    _socket: c_int,
    _level: c_int,
    _optname: c_int,
    _optval: *mut c_void,
    _optlen: *mut libc::socklen_t,
) -> c_int {
    no_rsockets()
}
symver!(rgetsockopt);

/// Variadic in C (`int rfcntl(int socket, int cmd, ...)`); it reads no argument past `cmd`, so
/// the x86-64 calling convention lets it be declared without them.
#[no_mangle]
pub unsafe extern "C" fn rfcntl(_socket: c_int, _cmd: c_int) -> c_int {
    no_rsockets()
}
symver!(rfcntl);

#[no_mangle]
pub unsafe extern "C" fn riomap(
    _socket: c_int,
    _buf: *mut c_void,
    _len: usize,
    _prot: c_int,
    _flags: c_int,
    _offset: libc::off_t,
) -> libc::off_t {
    no_rsockets()
}
symver!(riomap);

#[no_mangle]
pub unsafe extern "C" fn riounmap(_socket: c_int, _buf: *mut c_void, _len: usize) -> c_int {
    no_rsockets()
}
symver!(riounmap);

/// Returns `size_t`: the failure is `(size_t)-1`, as rsockets' own.
#[no_mangle]
pub unsafe extern "C" fn riowrite(
    _socket: c_int,
    _buf: *const c_void,
    _count: usize,
    _offset: libc::off_t,
    _flags: c_int,
) -> usize {
    set_errno(libc::ENOSYS);
    usize::MAX
}
symver!(riowrite);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno::errno;

    #[test]
    fn calls_fail_with_enosys() {
        // SAFETY: the calls read none of their arguments.
        unsafe {
            assert_eq!(rsocket(libc::AF_INET, libc::SOCK_STREAM, 0), -1);
            assert_eq!(errno(), libc::ENOSYS);
            assert_eq!(rpoll(std::ptr::null_mut(), 0, 0), -1);
            assert_eq!(rread(3, std::ptr::null_mut(), 0), -1);
            assert_eq!(riomap(3, std::ptr::null_mut(), 0, 0, 0, 0), -1);
            assert_eq!(riowrite(3, std::ptr::null(), 0, 0, 0), usize::MAX);
            assert_eq!(errno(), libc::ENOSYS);
        }
    }
}
