//! A Linux eventfd: a counter with a file descriptor that poll/epoll see as
//! readable while it is nonzero. The engine's doorbell and completion
//! channels are eventfds, so they work with poll, epoll and async runtimes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A nonblocking, close-on-exec eventfd: readable while signalled.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A nonblocking eventfd at zero.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall; a negative result is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Adds one: the descriptor becomes readable.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our descriptor. A full
        // counter (EAGAIN) already means "readable", so the result is moot.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets to zero; returns whether it was signalled.
    pub fn drain(&self) -> bool {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our descriptor.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
        n == 8 && value > 0
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_then_drain() {
        let e = EventFd::new().unwrap();
        assert!(!e.drain());
        e.signal();
        e.signal();
        assert!(e.drain());
        assert!(!e.drain());
    }
}
