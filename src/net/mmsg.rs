//! Batched datagram I/O with `recvmmsg`/`sendmmsg`: one system call moves up
//! to [`BATCH`] datagrams, which is most of what a UDP link's throughput
//! depends on.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;

/// Datagrams per system call.
pub const BATCH: usize = 32;
/// Largest datagram a slot holds: a 4096-byte MTU packet with every header,
/// and room for jumbo frames.
pub const SLOT: usize = 9216;

/// Datagrams to send, from one socket.
pub struct SendBatch {
    data: Vec<u8>,
    lens: [usize; BATCH],
    dests: [libc::sockaddr_storage; BATCH],
    count: usize,
}

/// Datagrams received and not yet handed out.
pub struct RecvBatch {
    data: Vec<u8>,
    lens: [usize; BATCH],
    srcs: [libc::sockaddr_storage; BATCH],
    count: usize,
    next: usize,
}

impl Default for SendBatch {
    fn default() -> SendBatch {
        // SAFETY: sockaddr_storage is plain old data; zero is a valid value.
        SendBatch { data: vec![0; BATCH * SLOT], lens: [0; BATCH], dests: unsafe { zeroed() }, count: 0 }
    }
}

impl Default for RecvBatch {
    fn default() -> RecvBatch {
        // SAFETY: as above.
        RecvBatch { data: vec![0; BATCH * SLOT], lens: [0; BATCH], srcs: unsafe { zeroed() }, count: 0, next: 0 }
    }
}

impl SendBatch {
    pub fn is_full(&self) -> bool {
        self.count == BATCH
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Queues a datagram; the caller flushes when the batch is full.
    pub fn push(&mut self, dest: SocketAddr, datagram: &[u8]) -> io::Result<()> {
        if datagram.len() > SLOT {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "datagram larger than a batch slot"));
        }
        debug_assert!(!self.is_full());
        let at = self.count * SLOT;
        self.data[at..at + datagram.len()].copy_from_slice(datagram);
        self.lens[self.count] = datagram.len();
        self.dests[self.count] = to_storage(dest);
        self.count += 1;
        Ok(())
    }

    /// Sends everything queued on `fd`. Datagrams the kernel refuses (a full
    /// socket buffer) are dropped, as a NIC drops on a full queue; RC
    /// retransmits them.
    pub fn flush(&mut self, fd: RawFd) -> io::Result<usize> {
        let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        for i in 0..self.count {
            iovs[i] = libc::iovec { iov_base: self.data[i * SLOT..].as_mut_ptr().cast(), iov_len: self.lens[i] };
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = (&mut self.dests[i] as *mut libc::sockaddr_storage).cast();
            msgs[i].msg_hdr.msg_namelen = storage_len(&self.dests[i]);
        }
        let mut sent = 0;
        let mut result = Ok(0);
        while sent < self.count {
            // SAFETY: `msgs[sent..count]` point at live iovecs, buffers and
            // addresses owned by self for the duration of the call.
            let n = unsafe {
                libc::sendmmsg(fd, msgs[sent..].as_mut_ptr(), (self.count - sent) as u32, libc::MSG_DONTWAIT)
            };
            if n <= 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock {
                    result = Err(e);
                }
                break;
            }
            sent += n as usize;
        }
        self.count = 0;
        result.map(|_: usize| sent)
    }
}

impl RecvBatch {
    /// Reads up to [`BATCH`] datagrams from `fd` if the batch is used up;
    /// returns how many are waiting.
    pub fn fill(&mut self, fd: RawFd) -> io::Result<usize> {
        if self.next < self.count {
            return Ok(self.count - self.next);
        }
        let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        for i in 0..BATCH {
            iovs[i] = libc::iovec { iov_base: self.data[i * SLOT..].as_mut_ptr().cast(), iov_len: SLOT };
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = (&mut self.srcs[i] as *mut libc::sockaddr_storage).cast();
            msgs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
        }
        // SAFETY: every message points at a live SLOT-sized buffer and address
        // storage owned by self.
        let n = unsafe {
            libc::recvmmsg(fd, msgs.as_mut_ptr(), BATCH as u32, libc::MSG_DONTWAIT, std::ptr::null_mut())
        };
        self.next = 0;
        self.count = 0;
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
        }
        for (i, msg) in msgs.iter().enumerate().take(n as usize) {
            // A datagram larger than the slot was cut: mark it so it is dropped.
            let truncated = msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            self.lens[i] = if truncated { 0 } else { msg.msg_len as usize };
        }
        self.count = n as usize;
        Ok(self.count)
    }

    /// The next datagram and its source; truncated ones come out empty.
    pub fn pop(&mut self) -> Option<(Option<SocketAddr>, &[u8])> {
        if self.next >= self.count {
            return None;
        }
        let i = self.next;
        self.next += 1;
        Some((from_storage(&self.srcs[i]), &self.data[i * SLOT..i * SLOT + self.lens[i]]))
    }
}

fn to_storage(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: zero is a valid sockaddr_storage; the casts write within it.
    unsafe {
        let mut storage: libc::sockaddr_storage = zeroed();
        match addr {
            SocketAddr::V4(a) => {
                let sin = &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
            }
            SocketAddr::V6(a) => {
                let sin6 = &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
                sin6.sin6_scope_id = a.scope_id();
            }
        }
        storage
    }
}

fn storage_len(storage: &libc::sockaddr_storage) -> u32 {
    if i32::from(storage.ss_family) == libc::AF_INET {
        size_of::<libc::sockaddr_in>() as u32
    } else {
        size_of::<libc::sockaddr_in6>() as u32
    }
}

fn from_storage(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the family field says which sockaddr the storage holds.
    unsafe {
        match i32::from(storage.ss_family) {
            libc::AF_INET => {
                let sin = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                let sin6 = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sin6.sin6_port)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn sockaddr_round_trip() {
        for addr in ["127.0.0.2:4791", "[fe80::1]:9"] {
            let addr: SocketAddr = addr.parse().unwrap();
            assert_eq!(from_storage(&to_storage(addr)), Some(addr));
        }
    }

    #[test]
    fn batches_cross_a_socket_pair() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dest = rx.local_addr().unwrap();
        let mut out = SendBatch::default();
        for i in 0..5u8 {
            out.push(dest, &[i; 100]).unwrap();
        }
        assert_eq!(out.flush(tx.as_raw_fd()).unwrap(), 5);
        assert!(out.is_empty());
        let mut inb = RecvBatch::default();
        let mut got = Vec::new();
        for _ in 0..100 {
            if inb.fill(rx.as_raw_fd()).unwrap() > 0 {
                while let Some((src, data)) = inb.pop() {
                    assert_eq!(src, Some(tx.local_addr().unwrap()));
                    got.push(data.to_vec());
                }
            }
            if got.len() == 5 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got, (0..5u8).map(|i| vec![i; 100]).collect::<Vec<_>>());
    }
}
