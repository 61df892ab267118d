//! Memory regions (`ibv_mr`): registered bytes the engine and peers reach.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use memmap2::MmapMut;

use super::context::ContextInner;
use super::error::{Error, Result};
use super::pd::check_registration;
use super::ProtectionDomain;
use crate::engine::RawRegion;
use crate::transport::{Access, Sge};

/// A registered memory region (`ibv_mr`). The bytes are shared with the
/// engine and with remote peers, so they are reached only by copying.
#[derive(Debug)]
pub struct MemoryRegion {
    pub(super) ctx: Arc<ContextInner>,
    pub(super) key: u32,
    pub(super) base: *mut u8,
    pub(super) iova: u64,
    pub(super) access: Access,
    pub(super) len: usize,
    pub(super) map: Option<MmapMut>,
}

// SAFETY: the region is a raw byte range shared with the engine by design;
// every access copies through raw pointers.
unsafe impl Send for MemoryRegion {}
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// The local key, for SGEs. The same number as the R_Key, as in rxe.
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The remote key a peer names the region by in READs, WRITEs and atomics.
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// The address of the first byte as peers and SGEs name it: its
    /// virtual address, unless registered with another iova.
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// Where the first byte is in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    /// The rights the region was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes (never: empty regions are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather element for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge { addr: self.addr() + offset as u64, length: len as u32, lkey: self.key }
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "bytes {offset}..{} outside a {}-byte memory region",
                offset.saturating_add(len),
                self.len
            ))),
        }
    }

    /// Copies bytes out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: in bounds of the registered range, which lives as long as self.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies bytes into the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset), data.len()) };
        Ok(())
    }

    /// Reads a 64-bit word atomically (the target of remote atomics).
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        self.check(offset, 8)?;
        // SAFETY: in bounds; alignment checked first.
        let ptr = unsafe { self.base.add(offset) };
        if !(ptr as usize).is_multiple_of(8) {
            return Err(Error::InvalidArgument(format!("offset {offset} is not 8-byte aligned")));
        }
        let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(ptr.cast()) };
        Ok(word.load(Ordering::SeqCst))
    }
}

impl MemoryRegion {
    /// What a peer needs to READ, WRITE or run atomics on this region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.addr(), rkey: self.rkey(), len: self.len as u64 }
    }
}

/// A region as a peer addresses it: VA, R_Key and length. 20 bytes on the
/// wire (big-endian), for out-of-band exchange next to an [`Endpoint`](super::Endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Virtual address of the first byte, as the peer addresses it.
    pub addr: u64,
    /// R_Key of the region.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteRegion {
    /// Bytes of [`RemoteRegion::to_bytes`].
    pub const LEN: usize = 20;

    /// Address, R_Key and length, big-endian.
    pub fn to_bytes(&self) -> [u8; RemoteRegion::LEN] {
        let mut b = [0u8; RemoteRegion::LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Reads what [`RemoteRegion::to_bytes`] wrote.
    pub fn from_bytes(b: &[u8; RemoteRegion::LEN]) -> RemoteRegion {
        let word = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        RemoteRegion { addr: word(0), rkey: u32::from_be_bytes([b[8], b[9], b[10], b[11]]), len: word(12) }
    }
}

/// What [`MemoryRegion::rereg`] changes (`ibv_rereg_mr`'s flags); `None`
/// keeps it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rereg<'a> {
    /// `IBV_REREG_MR_CHANGE_PD`: the domain it moves to, of the same context.
    pub pd: Option<&'a ProtectionDomain>,
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`: other memory, as (pointer,
    /// length); its address is its virtual address.
    pub memory: Option<(*mut u8, usize)>,
    /// `IBV_REREG_MR_CHANGE_ACCESS`: other rights.
    pub access: Option<Access>,
}

impl MemoryRegion {
    /// `ibv_rereg_mr`: changes the region in place, under the same keys.
    /// Requests that name what it no longer has fail their checks from then
    /// on (a receive posted on its old bytes, a peer of its old domain);
    /// windows bound to it are unbound. Nothing changes if it fails.
    ///
    /// # Safety
    /// New memory must be valid as for [`ProtectionDomain::reg_mr`]; memory
    /// the region had from [`ProtectionDomain::alloc_mr`] is freed.
    pub unsafe fn rereg(&mut self, change: Rereg<'_>) -> Result<()> {
        if change.pd.is_some_and(|pd| !Arc::ptr_eq(&pd.ctx, &self.ctx)) {
            return Err(Error::InvalidArgument("protection domain of another context".into()));
        }
        let (base, len, iova) = match change.memory {
            Some((ptr, len)) => (ptr, len, ptr as u64),
            None => (self.base, self.len, self.iova),
        };
        let access = change.access.unwrap_or(self.access);
        check_registration(base, len, iova, access)?;
        let mut registry = self.ctx.engine.shared.registry.write().unwrap_or_else(|e| e.into_inner());
        let old = registry.remove(self.key).expect("a live region is registered");
        let pd = change.pd.map_or(old.pd, ProtectionDomain::id);
        // SAFETY: the caller's promise for new memory; the old memory is
        // what was registered already.
        unsafe { registry.insert(self.key, RawRegion { base, len, iova, pd, access }) };
        drop(registry);
        if change.memory.is_some() {
            drop(self.map.take());
        }
        (self.base, self.len, self.iova, self.access) = (base, len, iova, access);
        Ok(())
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Deregister first: the engine holds the registry lock for each
        // access, so once this returns nothing touches the memory.
        let shared = &self.ctx.engine.shared;
        shared.registry.write().unwrap_or_else(|e| e.into_inner()).remove(self.key);
        drop(self.map.take());
    }
}
