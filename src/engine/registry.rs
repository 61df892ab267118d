//! Memory regions the application registered, as the engine reaches them:
//! raw ranges of the process's memory, checked on every access.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::transport::memory::{offset_in, permit};
use crate::transport::{Access, AtomicOp, MemError, Memory};

/// A registered range of process memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawRegion {
    /// Where the first byte is in this process.
    pub base: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// The address peers and SGEs use for the first byte (the VA, as with
    /// `ibv_reg_mr`).
    pub iova: u64,
    /// The protection domain it belongs to.
    pub pd: u32,
    /// The rights it grants.
    pub access: Access,
}

// SAFETY: a RawRegion is an address range; whoever registers it promises the
// memory stays valid until it is deregistered (see `verbs::ProtectionDomain::reg_mr`), and
// every access goes through the checks below under the registry lock.
unsafe impl Send for RawRegion {}
unsafe impl Sync for RawRegion {}

impl RawRegion {
    /// The pointer to `[addr, addr + len)` if it lies inside the region.
    fn range(&self, addr: u64, len: u64) -> Result<*mut u8, MemError> {
        let offset = offset_in(self.iova, self.len as u64, addr, len)?;
        // SAFETY: the offset is inside the registered range.
        Ok(unsafe { self.base.add(offset) })
    }
}

/// Regions by key (lkey and rkey are the same number, as in rxe). Every
/// packet with a payload looks its key up, and the keys are this device's
/// own, so a plain multiplicative hash will do where SipHash cost ~20 ns.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    regions: rustc_hash::FxHashMap<u32, RawRegion>,
}

impl Registry {
    /// Registers `region` under `key`, replacing any region with that key.
    ///
    /// # Safety
    /// `region.base .. region.base + region.len` must stay valid for reads
    /// and writes until the key is removed: the engine copies into and out
    /// of it, and performs atomics on it, from any thread.
    pub(crate) unsafe fn insert(&mut self, key: u32, region: RawRegion) {
        self.regions.insert(key, region);
    }

    /// Deregisters the region with `key` and returns it, if there was one.
    pub(crate) fn remove(&mut self, key: u32) -> Option<RawRegion> {
        self.regions.remove(&key)
    }

    /// Whether a region is registered under `key`.
    pub(crate) fn contains(&self, key: u32) -> bool {
        self.regions.contains_key(&key)
    }

    fn lookup(&self, key: u32, pd: u32, access: Access) -> Result<&RawRegion, MemError> {
        let region = self.regions.get(&key).ok_or(MemError::InvalidKey(key))?;
        permit(region.pd, region.access, pd, access)?;
        Ok(region)
    }
}

/// The registry as the transport's [`Memory`], for one engine step: the
/// caller holds the registry's lock, so no region can go away meanwhile.
pub(crate) struct RegistryAccess<'a>(pub(crate) &'a Registry);

impl Memory for RegistryAccess<'_> {
    fn check(&self, key: u32, pd: u32, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.0.lookup(key, pd, access)?.range(addr, len).map(|_| ())
    }

    fn read(&self, key: u32, pd: u32, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        let src = self.0.lookup(key, pd, access)?.range(addr, out.len() as u64)?;
        // SAFETY: `src` has `out.len()` registered bytes. The application may
        // write them concurrently, as with any RDMA device: bytes, not Rust
        // references, are shared.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn write(&mut self, key: u32, pd: u32, addr: u64, data: &[u8], access: Access) -> Result<(), MemError> {
        let dst = self.0.lookup(key, pd, access)?.range(addr, data.len() as u64)?;
        let Some((&last, body)) = data.split_last() else { return Ok(()) };
        // SAFETY: as in `read`. The last byte is stored after the rest, with
        // release ordering: programs such as `ib_write_lat` poll the last
        // byte of a WRITE's target and then read the rest (rxe-spec C-8).
        unsafe {
            std::ptr::copy_nonoverlapping(body.as_ptr(), dst, body.len());
            std::sync::atomic::AtomicU8::from_ptr(dst.add(body.len())).store(last, Ordering::Release);
        }
        Ok(())
    }

    fn atomic(&mut self, key: u32, pd: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !addr.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let region = self.0.lookup(key, pd, Access::REMOTE_ATOMIC)?;
        let ptr = region.range(addr, 8)?;
        if !(ptr as usize).is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        // SAFETY: 8 aligned registered bytes; a real atomic, so the
        // application's own atomics on the word stay coherent with ours.
        let word = unsafe { AtomicU64::from_ptr(ptr.cast()) };
        Ok(match op {
            AtomicOp::CompareSwap { compare, swap } => {
                match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
            AtomicOp::FetchAdd { add } => word.fetch_add(add, Ordering::SeqCst),
        })
    }

    fn invalidate(&mut self, _rkey: u32, _pd: u32) -> Result<(), MemError> {
        // Remote invalidation needs memory windows or fast-registration MRs,
        // which softroce does not have: plain MRs cannot be invalidated
        // remotely (IBTA o10-37), so the request fails.
        Err(MemError::AccessDenied)
    }
}
