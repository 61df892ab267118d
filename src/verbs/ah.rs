//! Address handles (`ibv_ah`): where UD sends go.

use std::net::IpAddr;

use crate::transport::UdDest;

/// An address handle (`ibv_ah`) for UD sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    pub(super) dest: IpAddr,
}

impl AddressHandle {
    /// The destination of a UD send through this handle.
    pub fn ud_dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest { dest: self.dest, remote_qpn, remote_qkey }
    }
}
