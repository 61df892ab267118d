//! What the transport may touch: memory regions named by keys.
//!
//! The transport reaches memory only through the [`Memory`] trait, so the
//! checks a peer's request must pass (key, protection domain, access rights,
//! bounds) sit in one place, and the verbs layer can back regions however it
//! likes. [`MemoryTable`] is a plain implementation over owned buffers, used by
//! the tests and the simulated network.

use std::fmt;

use super::types::{Access, Sge};

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No region has this key (never registered, or deregistered/invalidated).
    InvalidKey(u32),
    /// The region belongs to another protection domain.
    WrongPd,
    /// The region does not grant the access asked for.
    AccessDenied,
    /// `[addr, addr + len)` is not inside the region (or wraps around 2^64).
    OutOfBounds,
    /// Atomics need an 8-byte aligned address.
    Misaligned,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemError::InvalidKey(k) => write!(f, "no memory region with key {k:#x}"),
            MemError::WrongPd => write!(f, "memory region belongs to another protection domain"),
            MemError::AccessDenied => write!(f, "memory region does not grant this access"),
            MemError::OutOfBounds => write!(f, "access outside the memory region"),
            MemError::Misaligned => write!(f, "atomic address not 8-byte aligned"),
        }
    }
}

impl std::error::Error for MemError {}

/// An atomic operation on a 64-bit word in the responder's byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Writes `swap` if the word equals `compare`.
    CompareSwap {
        /// Value the word must hold.
        compare: u64,
        /// Value written when it does.
        swap: u64,
    },
    /// Adds `add` to the word, wrapping at 2^64.
    FetchAdd {
        /// Value added.
        add: u64,
    },
}

/// Access to registered memory. Every method checks the key, the protection
/// domain, the rights and the bounds, and touches nothing when a check fails.
pub trait Memory {
    /// Checks that `key` names a region of `pd` granting `access` that holds
    /// `[addr, addr + len)`.
    fn check(&self, key: u32, pd: u32, addr: u64, len: u64, access: Access) -> Result<(), MemError>;

    /// Copies `out.len()` bytes from `addr`.
    fn read(&self, key: u32, pd: u32, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError>;

    /// Copies `data` to `addr`.
    fn write(&mut self, key: u32, pd: u32, addr: u64, data: &[u8], access: Access) -> Result<(), MemError>;

    /// Executes an atomic at `addr` (8-byte aligned) and returns the value found there.
    fn atomic(&mut self, key: u32, pd: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError>;

    /// Invalidates the region with this R_Key (SEND_WITH_INVALIDATE).
    fn invalidate(&mut self, rkey: u32, pd: u32) -> Result<(), MemError>;
}

/// A registered region backed by an owned buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// The protection domain it belongs to.
    pub pd: u32,
    /// The virtual address the region's first byte has.
    pub addr: u64,
    /// The rights it grants.
    pub access: Access,
    /// Its bytes; the region is `data.len()` bytes long.
    pub data: Vec<u8>,
}

/// Whether a region of protection domain `region_pd` granting
/// `region_access` may be used from `pd` for `access`.
pub fn permit(region_pd: u32, region_access: Access, pd: u32, access: Access) -> Result<(), MemError> {
    if region_pd != pd {
        return Err(MemError::WrongPd);
    }
    if !region_access.contains(access) {
        return Err(MemError::AccessDenied);
    }
    Ok(())
}

/// Where `[addr, addr + len)` starts inside a region of `region_len` bytes at
/// `region_addr`, if it lies wholly inside — ranges wrapping 2^64 never do.
pub fn offset_in(region_addr: u64, region_len: u64, addr: u64, len: u64) -> Result<usize, MemError> {
    let end = addr.checked_add(len).ok_or(MemError::OutOfBounds)?;
    let region_end = region_addr.checked_add(region_len).ok_or(MemError::OutOfBounds)?;
    if addr < region_addr || end > region_end {
        return Err(MemError::OutOfBounds);
    }
    Ok((addr - region_addr) as usize)
}

/// Walks the pieces of an SGE list covering `len` bytes from `offset`:
/// calls `f(sge, address, position in the output, length)` for each.
pub(crate) fn for_each_piece<E>(
    sges: &[Sge],
    offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let mut skip = offset;
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let sge_len = u64::from(sge.length);
        if skip >= sge_len {
            skip -= sge_len;
            continue;
        }
        let n = ((sge_len - skip) as usize).min(len - done);
        f(sge, sge.addr + skip, done, n)?;
        done += n;
        skip = 0;
    }
    Ok(())
}

impl Region {
    /// The byte range of `[addr, addr + len)` inside `data`, if it fits.
    fn range(&self, addr: u64, len: u64) -> Result<std::ops::Range<usize>, MemError> {
        let start = offset_in(self.addr, self.data.len() as u64, addr, len)?;
        Ok(start..start + len as usize)
    }
}

/// Regions by key. A region's lkey and rkey are the same number, as in rxe;
/// keys are the table owner's own, so they need no SipHash (as the engine's registry).
#[derive(Debug, Default, Clone)]
pub struct MemoryTable {
    regions: rustc_hash::FxHashMap<u32, Region>,
}

impl MemoryTable {
    /// An empty table.
    pub fn new() -> MemoryTable {
        MemoryTable::default()
    }

    /// Registers `region` under `key`, replacing any region with that key.
    pub fn register(&mut self, key: u32, region: Region) {
        self.regions.insert(key, region);
    }

    /// Removes the region with `key` and returns it, if there was one.
    pub fn deregister(&mut self, key: u32) -> Option<Region> {
        self.regions.remove(&key)
    }

    /// The region with `key`, unchecked (for setting up and inspecting tests).
    pub fn region(&self, key: u32) -> Option<&Region> {
        self.regions.get(&key)
    }

    /// The region with `key`, mutably and unchecked.
    pub fn region_mut(&mut self, key: u32) -> Option<&mut Region> {
        self.regions.get_mut(&key)
    }

    fn lookup(&self, key: u32, pd: u32, access: Access) -> Result<&Region, MemError> {
        let region = self.regions.get(&key).ok_or(MemError::InvalidKey(key))?;
        permit(region.pd, region.access, pd, access)?;
        Ok(region)
    }

    fn lookup_mut(&mut self, key: u32, pd: u32, access: Access) -> Result<&mut Region, MemError> {
        self.lookup(key, pd, access)?;
        Ok(self.regions.get_mut(&key).expect("looked up above"))
    }
}

impl Memory for MemoryTable {
    fn check(&self, key: u32, pd: u32, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.lookup(key, pd, access)?.range(addr, len).map(|_| ())
    }

    fn read(&self, key: u32, pd: u32, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        let region = self.lookup(key, pd, access)?;
        let range = region.range(addr, out.len() as u64)?;
        out.copy_from_slice(&region.data[range]);
        Ok(())
    }

    fn write(&mut self, key: u32, pd: u32, addr: u64, data: &[u8], access: Access) -> Result<(), MemError> {
        let region = self.lookup_mut(key, pd, access)?;
        let range = region.range(addr, data.len() as u64)?;
        region.data[range].copy_from_slice(data);
        Ok(())
    }

    fn atomic(&mut self, key: u32, pd: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !addr.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let region = self.lookup_mut(key, pd, Access::REMOTE_ATOMIC)?;
        let range = region.range(addr, 8)?;
        let word = &mut region.data[range];
        let original = u64::from_ne_bytes(word.try_into().expect("8-byte range"));
        let new = match op {
            AtomicOp::CompareSwap { compare, swap } => {
                if original == compare {
                    swap
                } else {
                    original
                }
            }
            AtomicOp::FetchAdd { add } => original.wrapping_add(add),
        };
        word.copy_from_slice(&new.to_ne_bytes());
        Ok(original)
    }

    fn invalidate(&mut self, rkey: u32, pd: u32) -> Result<(), MemError> {
        self.lookup(rkey, pd, Access::NONE)?;
        self.regions.remove(&rkey);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> MemoryTable {
        let mut t = MemoryTable::new();
        t.register(
            7,
            Region {
                pd: 1,
                addr: 0x1000,
                access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
                data: vec![0; 64],
            },
        );
        t
    }

    #[test]
    fn checks_key_pd_access_bounds() {
        let mut t = table();
        assert_eq!(t.check(7, 1, 0x1000, 64, Access::REMOTE_WRITE), Ok(()));
        assert_eq!(t.check(8, 1, 0x1000, 1, Access::NONE), Err(MemError::InvalidKey(8)));
        assert_eq!(t.check(7, 2, 0x1000, 1, Access::NONE), Err(MemError::WrongPd));
        assert_eq!(t.check(7, 1, 0x1000, 1, Access::REMOTE_READ), Err(MemError::AccessDenied));
        assert_eq!(t.check(7, 1, 0x1001, 64, Access::NONE), Err(MemError::OutOfBounds));
        assert_eq!(t.check(7, 1, 0xfff, 1, Access::NONE), Err(MemError::OutOfBounds));
        assert_eq!(t.check(7, 1, u64::MAX, 2, Access::NONE), Err(MemError::OutOfBounds));
        assert_eq!(t.write(7, 1, 0x103f, &[1, 2], Access::REMOTE_WRITE), Err(MemError::OutOfBounds));
        assert!(t.region(7).unwrap().data.iter().all(|b| *b == 0));
    }

    #[test]
    fn atomics() {
        let mut t = table();
        assert_eq!(t.atomic(7, 1, 0x1008, AtomicOp::FetchAdd { add: 5 }), Ok(0));
        assert_eq!(t.atomic(7, 1, 0x1008, AtomicOp::FetchAdd { add: 5 }), Ok(5));
        assert_eq!(t.atomic(7, 1, 0x1008, AtomicOp::CompareSwap { compare: 10, swap: 99 }), Ok(10));
        assert_eq!(t.atomic(7, 1, 0x1008, AtomicOp::CompareSwap { compare: 10, swap: 1 }), Ok(99));
        assert_eq!(t.atomic(7, 1, 0x1004, AtomicOp::FetchAdd { add: 1 }), Err(MemError::Misaligned));
    }

    #[test]
    fn invalidate_removes_the_key() {
        let mut t = table();
        assert_eq!(t.invalidate(7, 2), Err(MemError::WrongPd));
        assert_eq!(t.invalidate(7, 1), Ok(()));
        assert_eq!(t.check(7, 1, 0x1000, 1, Access::NONE), Err(MemError::InvalidKey(7)));
    }
}
