use std::fmt;
use std::io;

use crate::transport::{ModifyError, PostRecvError, PostSendError};

/// Why a verb failed. Each variant says which object, attribute or limit.
#[derive(Debug)]
pub enum Error {
    /// No device by that name (the list of known names is included).
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The names of this host's devices.
        known: Vec<String>,
    },
    /// A value out of range or an object of another context / PD.
    InvalidArgument(String),
    /// A limit of the device was reached (e.g. max_cqe).
    Limit {
        /// The attribute, by its libibverbs name.
        what: &'static str,
        /// The device's limit.
        max: u64,
    },
    /// `ibv_modify_qp` refused the transition or an attribute.
    Modify(ModifyError),
    /// `ibv_post_send` refused the work request; nothing was queued.
    PostSend(PostSendError),
    /// `ibv_post_recv` refused the work request; nothing was queued.
    PostRecv(PostRecvError),
    /// An I/O error: binding sockets, starting the engine, mapping memory,
    /// reading the interfaces; or, as `NotFound`, a host without devices.
    Io(io::Error),
}

/// Result of a verb.
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoSuchDevice { name, known } => {
                write!(f, "no RDMA device named {name:?} (devices: {})", known.join(", "))
            }
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::Limit { what, max } => write!(f, "{what} exceeds the device limit of {max}"),
            Error::Modify(e) => write!(f, "modify QP: {e}"),
            Error::PostSend(e) => write!(f, "post send: {e}"),
            Error::PostRecv(e) => write!(f, "post receive: {e}"),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Modify(e) => Some(e),
            Error::PostSend(e) => Some(e),
            Error::PostRecv(e) => Some(e),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl Error {
    /// The `errno` libibverbs reports for this failure: `ENOMEM` for a full
    /// queue, `EINVAL` for what the caller asked wrongly, `ENODEV` for an
    /// unknown device, the system's own code for I/O failures.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NoSuchDevice { .. } => libc::ENODEV,
            Error::PostSend(PostSendError::QueueFull { .. }) | Error::PostRecv(PostRecvError::QueueFull { .. }) => {
                libc::ENOMEM
            }
            Error::PostSend(PostSendError::UnsupportedOp(_)) => libc::EINVAL,
            Error::InvalidArgument(_)
            | Error::Limit { .. }
            | Error::Modify(_)
            | Error::PostSend(_)
            | Error::PostRecv(_) => libc::EINVAL,
            Error::Io(e) => e.raw_os_error().unwrap_or(match e.kind() {
                // Errors rewrapped with context keep their kind, not their code.
                io::ErrorKind::AddrInUse => libc::EADDRINUSE,
                io::ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
                io::ErrorKind::PermissionDenied => libc::EACCES,
                io::ErrorKind::NotFound => libc::ENOENT,
                io::ErrorKind::OutOfMemory => libc::ENOMEM,
                io::ErrorKind::Unsupported => libc::EOPNOTSUPP,
                io::ErrorKind::InvalidInput => libc::EINVAL,
                _ => libc::EIO,
            }),
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

impl From<ModifyError> for Error {
    fn from(e: ModifyError) -> Error {
        Error::Modify(e)
    }
}

impl From<PostSendError> for Error {
    fn from(e: PostSendError) -> Error {
        Error::PostSend(e)
    }
}

impl From<PostRecvError> for Error {
    fn from(e: PostRecvError) -> Error {
        Error::PostRecv(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_rewrapped_with_context_keeps_its_errno() {
        let bind = io::Error::from_raw_os_error(libc::EADDRINUSE);
        let rewrapped = Error::Io(io::Error::new(bind.kind(), format!("bind 127.0.0.1 port 4791: {bind}")));
        assert_eq!(rewrapped.errno(), libc::EADDRINUSE);
        assert_eq!(Error::Io(bind).errno(), libc::EADDRINUSE);
        assert_eq!(Error::InvalidArgument("x".into()).errno(), libc::EINVAL);
    }
}
