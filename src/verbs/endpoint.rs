//! What two sides exchange out of band to connect their QPs.

use super::gid::Gid;
use crate::wire::Psn;

/// What one side tells the other to connect QPs: QP number, first PSN and
/// GID. 24 bytes on the wire (QPN and PSN big-endian, then the GID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The QP number (24 bits).
    pub qpn: u32,
    /// The first PSN the QP sends: the peer's `rq_psn`.
    pub psn: Psn,
    /// The GID of the QP's port: the address the peer sends to.
    pub gid: Gid,
}

impl Endpoint {
    /// Bytes of [`Endpoint::to_bytes`].
    pub const LEN: usize = 24;

    /// QPN and PSN big-endian, then the GID.
    pub fn to_bytes(&self) -> [u8; Endpoint::LEN] {
        let mut b = [0u8; Endpoint::LEN];
        b[..4].copy_from_slice(&self.qpn.to_be_bytes());
        b[4..8].copy_from_slice(&self.psn.value().to_be_bytes());
        b[8..].copy_from_slice(&<[u8; 16]>::from(self.gid));
        b
    }

    /// Reads what [`Endpoint::to_bytes`] wrote; bits above 24 in the QPN and PSN
    /// are dropped.
    pub fn from_bytes(b: &[u8; Endpoint::LEN]) -> Endpoint {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..]);
        Endpoint {
            qpn: u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x00ff_ffff,
            psn: Psn::new(u32::from_be_bytes([b[4], b[5], b[6], b[7]])),
            gid: Gid::from(gid),
        }
    }

    /// Sends ours and reads theirs over a stream (a TCP connection, say):
    /// how Rust RDMA programs usually connect QPs.
    pub fn exchange<S: std::io::Read + std::io::Write>(&self, stream: &mut S) -> std::io::Result<Endpoint> {
        stream.write_all(&self.to_bytes())?;
        stream.flush()?;
        let mut theirs = [0u8; Endpoint::LEN];
        stream.read_exact(&mut theirs)?;
        Ok(Endpoint::from_bytes(&theirs))
    }
}
