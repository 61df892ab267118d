//! A Linux eventfd: a counter with a file descriptor that poll/epoll see as
//! readable while it is nonzero. The engine's doorbell and completion
//! channels are eventfds, so they work with poll, epoll and async runtimes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A close-on-exec eventfd: readable while signalled. The doorbell is a
/// nonblocking flag ([`EventFd::new`]); completion channels and the async
/// event descriptor count their events ([`EventFd::counting`]) and block
/// by default, as the kernel's descriptors do, so that a program that
/// reads them or sets `O_NONBLOCK` on them gets the kernel's behaviour.
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

    /// A blocking eventfd at zero that counts: each [`EventFd::signal`]
    /// adds one and each [`EventFd::take_one`] takes one, so it is readable
    /// exactly while signals outnumber takes.
    pub fn counting() -> io::Result<EventFd> {
        // SAFETY: plain syscall; a negative result is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Takes one signal of a counting eventfd, for an event just taken from
    /// its queue. Its signal may still be on its way (the signaller queues
    /// first, then signals), so this waits for it.
    pub fn take_one(&self) {
        let mut value: u64 = 0;
        loop {
            // SAFETY: reads 8 bytes into a valid u64 from our descriptor.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
            if n == 8 {
                return;
            }
            match io::Error::last_os_error().raw_os_error() {
                // The program made it nonblocking; the signal comes shortly.
                Some(libc::EAGAIN) => std::thread::yield_now(),
                Some(libc::EINTR) => {}
                _ => return,
            }
        }
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
    fn a_counting_eventfd_is_readable_while_signals_outnumber_takes() {
        let e = EventFd::counting().unwrap();
        let readable = || crate::net::wait_readable(&[e.as_raw_fd()], std::time::Duration::ZERO) == 1;
        assert!(!readable());
        e.signal();
        e.signal();
        e.take_one();
        assert!(readable());
        e.take_one();
        assert!(!readable());
    }

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
