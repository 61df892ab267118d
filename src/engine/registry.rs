//! Memory regions the application registered, as the engine reaches them:
//! raw ranges of the process's memory, checked on every access.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::transport::memory::{offset_in, permit, BindTarget, KeyUser, WindowTable};
use crate::transport::{Access, AtomicOp, Lent, MemError, Memory, MwBind};

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

/// Regions by key (lkey and rkey are the same number, as in rxe) and memory
/// windows. Every packet with a payload looks its key up, and the keys are
/// this device's own, so a plain multiplicative hash will do where SipHash
/// cost ~20 ns. Windows change under the registry's read lock (a bind or
/// invalidate is part of an engine step), so they have a lock of their own;
/// only window keys take it.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    regions: rustc_hash::FxHashMap<u32, RawRegion>,
    windows: Mutex<WindowTable>,
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

    /// Deregisters the region with `key` and returns it, if there was one;
    /// windows bound to it are unbound.
    pub(crate) fn remove(&mut self, key: u32) -> Option<RawRegion> {
        self.windows_mut().unbind_region(key);
        self.regions.remove(&key)
    }

    /// Whether a region is registered under `key`.
    pub(crate) fn contains(&self, key: u32) -> bool {
        self.regions.contains_key(&key)
    }

    /// The windows, to allocate, free and inspect them.
    pub(crate) fn windows_mut(&mut self) -> &mut WindowTable {
        self.windows.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// Frees the type 2 windows bound through QP `qpn`, which goes away;
    /// the registry's read lock is enough (windows have a lock of their own).
    pub(crate) fn unbind_qp(&self, qpn: u32) {
        self.windows().unbind_qp(qpn);
    }

    fn windows(&self) -> MutexGuard<'_, WindowTable> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where `[addr, addr + len)` of the memory `key` names is, checked for
    /// `user` and `access`.
    fn locate(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<*mut u8, MemError> {
        self.locate_paged(key, user, addr, len, access).map(|(ptr, _)| ptr)
    }

    /// As [`Registry::locate`], and whether the region is on demand: its
    /// pages are reached only by [`copy_unfaulting`].
    fn locate_paged(
        &self,
        key: u32,
        user: KeyUser,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(*mut u8, bool), MemError> {
        let region = if WindowTable::is_window_key(key) && access.is_remote() {
            let region_key = self.windows().resolve(key, user, addr, len, access)?;
            self.regions.get(&region_key).ok_or(MemError::InvalidKey(key))?
        } else {
            let region = self.regions.get(&key).ok_or(MemError::InvalidKey(key))?;
            permit(region.pd, region.access, user.pd, access)?;
            region
        };
        Ok((region.range(addr, len)?, region.access.contains(Access::ON_DEMAND)))
    }

    /// `ibv_advise_mr`'s prefetch of `[addr, addr + len)` of an on-demand
    /// region of `pd`: its pages are brought in (for writing, with
    /// `write`), or with `fault` false only checked.
    pub(crate) fn prefetch(
        &self,
        key: u32,
        pd: u32,
        addr: u64,
        len: u64,
        fault: bool,
        write: bool,
    ) -> Result<(), MemError> {
        let region = self.regions.get(&key).ok_or(MemError::InvalidKey(key))?;
        permit(region.pd, region.access, pd, if write { Access::LOCAL_WRITE } else { Access::NONE })?;
        if !region.access.contains(Access::ON_DEMAND) {
            return Err(MemError::AccessDenied);
        }
        let start = region.range(addr, len)? as usize;
        if !fault || len == 0 {
            return Ok(());
        }
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let first = start / page * page;
        let advice = if write { libc::MADV_POPULATE_WRITE } else { libc::MADV_POPULATE_READ };
        // SAFETY: populating changes no byte the program sees; unmapped
        // pages make it fail with EFAULT or ENOMEM, a kernel older than 5.14
        // with EINVAL, when the pages simply come on first use.
        let rc = unsafe { libc::madvise(first as *mut libc::c_void, start + len as usize - first, advice) };
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(MemError::Unmapped);
        }
        Ok(())
    }
}

/// Copies `len` bytes from `src` to `dst`, both in this process, through
/// `process_vm_readv`: a page of either that is not mapped makes it fail
/// instead of faulting the process, as a NIC's page fault on an on-demand
/// region that finds nothing ends in an access error.
fn copy_unfaulting(dst: *mut u8, src: *const u8, len: usize) -> Result<(), MemError> {
    if len == 0 {
        return Ok(());
    }
    let local = libc::iovec { iov_base: dst.cast(), iov_len: len };
    let remote = libc::iovec { iov_base: src.cast_mut().cast(), iov_len: len };
    // SAFETY: the kernel checks both ranges against this process's mappings
    // and copies nothing through a page that is not there.
    let copied = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if copied == len as isize {
        Ok(())
    } else {
        Err(MemError::Unmapped)
    }
}

/// The registry as the transport's [`Memory`], for one engine step: the
/// caller holds the registry's lock, so no region can go away meanwhile.
pub(crate) struct RegistryAccess<'a>(pub(crate) &'a Registry);

impl Memory for RegistryAccess<'_> {
    fn check(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.0.locate(key, user, addr, len, access).map(|_| ())
    }

    fn resolve(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<u32, MemError> {
        self.check(key, user, addr, len, access)?;
        if WindowTable::is_window_key(key) && access.is_remote() {
            return self.0.windows().resolve(key, user, addr, len, access);
        }
        Ok(key)
    }

    fn read(&self, key: u32, user: KeyUser, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        let (src, on_demand) = self.0.locate_paged(key, user, addr, out.len() as u64, access)?;
        if on_demand {
            return copy_unfaulting(out.as_mut_ptr(), src, out.len());
        }
        // SAFETY: `src` has `out.len()` registered bytes. The application may
        // write them concurrently, as with any RDMA device: bytes, not Rust
        // references, are shared.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Lends what an ordinary region holds; an on-demand region's pages may
    /// not be mapped, and only [`copy_unfaulting`] reaches them.
    fn lend(&self, key: u32, user: KeyUser, addr: u64, len: usize, access: Access) -> Result<Option<Lent>, MemError> {
        let (src, on_demand) = self.0.locate_paged(key, user, addr, len as u64, access)?;
        if on_demand || len == 0 {
            return Ok(None);
        }
        // SAFETY: `src` has `len` registered bytes, and the registry's lock,
        // which a deregistration waits for, is held for as long as the
        // engine's step that lent them: its link sends them or copies them
        // in before the guard goes (`dispatch::Egress::transmit`).
        Ok(NonNull::new(src).map(|ptr| unsafe { Lent::new(ptr, len) }))
    }

    fn write(&mut self, key: u32, user: KeyUser, addr: u64, data: &[u8], access: Access) -> Result<(), MemError> {
        let (dst, on_demand) = self.0.locate_paged(key, user, addr, data.len() as u64, access)?;
        if on_demand {
            return copy_unfaulting(dst, data.as_ptr(), data.len());
        }
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

    fn atomic(&mut self, key: u32, user: KeyUser, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !addr.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let (ptr, on_demand) = self.0.locate_paged(key, user, addr, 8, op.access())?;
        if !(ptr as usize).is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        if on_demand {
            // The word's page must be there: a page that goes in the
            // moment between is the application's race, as with a NIC.
            copy_unfaulting([0u8; 8].as_mut_ptr(), ptr, 8)?;
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
            AtomicOp::Store { value } => word.swap(value, Ordering::SeqCst),
        })
    }

    fn invalidate(&mut self, rkey: u32, user: KeyUser) -> Result<(), MemError> {
        if WindowTable::is_window_key(rkey) {
            return self.0.windows().invalidate(rkey, user);
        }
        // Regions are never invalidated: softroce has no fast-registration
        // MRs, and a plain MR cannot be invalidated (IBTA o10-37; rxe
        // refuses a user MR too).
        Err(MemError::AccessDenied)
    }

    fn bind_window(&mut self, user: KeyUser, bind: &MwBind) -> Result<(), MemError> {
        let target = self.0.regions.get(&bind.mr_lkey).map(|r| BindTarget {
            pd: r.pd,
            addr: r.iova,
            len: r.len as u64,
            access: r.access,
        });
        self.0.windows().bind(user, bind, target)
    }

    /// Global visibility: a full fence, after which every store the engine
    /// made is visible to every thread. Persistence: `msync(MS_SYNC)` of
    /// the pages, which writes a file-backed region's bytes to its file
    /// (anonymous memory has nowhere more lasting to go: only the fence).
    fn flush(&mut self, key: u32, user: KeyUser, range: Option<(u64, u64)>, access: Access) -> Result<(), MemError> {
        let (addr, len) = match range {
            Some(range) => range,
            None => self.0.regions.get(&key).map(|r| (r.iova, r.len as u64)).ok_or(MemError::InvalidKey(key))?,
        };
        let start = self.0.locate(key, user, addr, len, access)?;
        std::sync::atomic::fence(Ordering::SeqCst);
        if access.contains(Access::FLUSH_PERSISTENT) && len > 0 {
            // SAFETY: sysconf has no memory effects.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
            let first = start as usize / page * page;
            let end = start as usize + len as usize;
            // SAFETY: msync reads the page tables of registered memory and
            // writes nothing the program sees; a failure (pages not mapped
            // any more) is a refusal, not a fault.
            if unsafe { libc::msync(first as *mut libc::c_void, end - first, libc::MS_SYNC) } != 0 {
                return Err(MemError::AccessDenied);
            }
        }
        Ok(())
    }
}
