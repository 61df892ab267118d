//! What the transport may touch: memory regions named by keys.
//!
//! The transport reaches memory only through the [`Memory`] trait, so the
//! checks a peer's request must pass (key, protection domain, access rights,
//! bounds) sit in one place, and the verbs layer can back regions however it
//! likes. [`MemoryTable`] is a plain implementation over owned buffers, used by
//! the tests and the simulated network.

use std::fmt;
use std::ptr::NonNull;

use super::types::{Access, MwBind, Sge};

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
    /// The memory window is not in a state that allows this: a type 2
    /// window bound already or not bound, a type 1 window invalidated.
    WrongState,
    /// An on-demand region's page is not mapped (the page fault found
    /// nothing).
    Unmapped,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemError::InvalidKey(k) => write!(f, "no memory region with key {k:#x}"),
            MemError::WrongPd => write!(f, "memory region belongs to another protection domain"),
            MemError::AccessDenied => write!(f, "memory region does not grant this access"),
            MemError::OutOfBounds => write!(f, "access outside the memory region"),
            MemError::Misaligned => write!(f, "atomic address not 8-byte aligned"),
            MemError::WrongState => write!(f, "memory window not in a state that allows this"),
            MemError::Unmapped => write!(f, "page of an on-demand region not mapped"),
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
    /// Stores `value` whole (ATOMIC WRITE); it needs REMOTE_WRITE, not
    /// REMOTE_ATOMIC.
    Store {
        /// The word's new value.
        value: u64,
    },
}

impl AtomicOp {
    /// The right the operation needs.
    pub const fn access(self) -> Access {
        match self {
            AtomicOp::Store { .. } => Access::REMOTE_WRITE,
            _ => Access::REMOTE_ATOMIC,
        }
    }
}

/// Who uses a key: the protection domain and the QP of the request. A
/// region answers any QP of its domain; a type 2 memory window only the QP
/// it was bound through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyUser {
    /// The QP's protection domain.
    pub pd: u32,
    /// The QP's number.
    pub qpn: u32,
}

/// Registered bytes lent to the link in place of a copy: a packet's payload
/// that the link sends from where the application registered it (rxe-spec
/// T-36). The memory that lends them (the engine's registry) keeps them
/// registered until its link has sent them. The application may write them
/// meanwhile, as it may while a NIC reads them by DMA: the packet then
/// carries some of each, and the ICRC of whatever the link read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lent {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an address and a length; what keeps the bytes there is the
// lender's guard, whichever thread holds the `Lent`.
#[allow(unsafe_code)]
unsafe impl Send for Lent {}

impl Lent {
    /// Lends the `len` bytes at `ptr`.
    ///
    /// # Safety
    /// They must stay mapped and readable until every holder of the `Lent`
    /// (or of a copy) is done with it: for an engine, until its link has
    /// sent the packet (`Link::flush`).
    #[allow(unsafe_code)]
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Lent {
        Lent { ptr, len }
    }

    /// Where the bytes are, for a system call that reads them.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// How many bytes are lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, for one pass over them (a CRC, a copy).
    #[allow(unsafe_code)]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: mapped and readable while the lender keeps them (`new`).
        // Concurrent writes by the application are bytes changing under a
        // reader that takes each once, as `Memory::read`'s copy does.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// Access to registered memory. Every method checks the key, the protection
/// domain, the rights and the bounds, and touches nothing when a check fails.
/// A key with an access a peer asks for (see [`Access::is_remote`]) may
/// name a memory window; other keys name regions only.
pub trait Memory {
    /// Checks that `key` names memory `user` may use for `access` that
    /// holds `[addr, addr + len)`.
    fn check(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<(), MemError>;

    /// Checks as [`Memory::check`] does and returns the key of the region
    /// `key` reaches: `key` itself, or the region a window is bound to. A
    /// READ's responses, built later, read through it with no right asked
    /// again, so that an invalidate that overtakes them (the request after
    /// the READ, executed before the READ's responses are all sent) does
    /// not take back what the READ was granted.
    fn resolve(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<u32, MemError>;

    /// Copies `out.len()` bytes from `addr`.
    fn read(&self, key: u32, user: KeyUser, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError>;

    /// The `len` bytes at `addr`, lent where they are instead of copied
    /// ([`Lent`]), checked as [`Memory::read`] checks; `None` where this
    /// memory lends nothing (the caller then reads a copy).
    fn lend(&self, key: u32, user: KeyUser, addr: u64, len: usize, access: Access) -> Result<Option<Lent>, MemError> {
        let _ = (key, user, addr, len, access);
        Ok(None)
    }

    /// Copies `data` to `addr`.
    fn write(&mut self, key: u32, user: KeyUser, addr: u64, data: &[u8], access: Access) -> Result<(), MemError>;

    /// Executes an atomic at `addr` (8-byte aligned) and returns the value found there.
    fn atomic(&mut self, key: u32, user: KeyUser, addr: u64, op: AtomicOp) -> Result<u64, MemError>;

    /// Invalidates the memory named by this R_Key (SEND_WITH_INVALIDATE, or
    /// a local invalidate posted by `user`).
    fn invalidate(&mut self, rkey: u32, user: KeyUser) -> Result<(), MemError>;

    /// Binds a memory window as `bind` asks, for `user`'s QP.
    fn bind_window(&mut self, user: KeyUser, bind: &MwBind) -> Result<(), MemError>;

    /// FLUSH: makes what was placed in `[addr, addr + len)` of `key` (or in
    /// the whole region it names, when `range` is `None`) reach
    /// `placement`, once `access` (its FLUSH rights) is checked.
    fn flush(&mut self, key: u32, user: KeyUser, range: Option<(u64, u64)>, access: Access) -> Result<(), MemError>;
}

/// Memory window types (`ibv_mw_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowType {
    /// Type 1: bound by `ibv_bind_mw`, usable from any QP of its domain,
    /// unbound by a bind of length 0, never invalidated.
    Type1,
    /// Type 2 (2B): bound by a BIND_MW work request to the QP that posted
    /// it, usable from that QP only, freed by an invalidate.
    Type2,
}

/// What a window opens: a range of one region, with rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Binding {
    region_key: u32,
    addr: u64,
    len: u64,
    access: Access,
    /// The QP it was bound through (the only one a type 2 window answers).
    qpn: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    rkey: u32,
    pd: u32,
    kind: WindowType,
    binding: Option<Binding>,
}

/// A region as a bind sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindTarget {
    /// Its protection domain.
    pub pd: u32,
    /// The address of its first byte.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its rights.
    pub access: Access,
}

/// Memory windows by index (the upper 24 bits of their R_Key, as in rxe).
/// Window keys have the top bit set and the engine's region keys never do
/// ([`WindowTable::is_window_key`]), so one lookup says which a key names.
#[derive(Debug, Clone, Default)]
pub struct WindowTable {
    windows: rustc_hash::FxHashMap<u32, Window>,
}

impl WindowTable {
    /// The bit every window key has and no region key has.
    pub const KEY_BIT: u32 = 1 << 31;

    /// Whether `key` can only name a window.
    pub const fn is_window_key(key: u32) -> bool {
        key & WindowTable::KEY_BIT != 0
    }

    /// A new, unbound window of `pd`; returns its R_Key, made of `random`'s
    /// bits under the window bit (it is asked again while the index is
    /// taken), so that a peer cannot guess the key of another's window any
    /// better than a region's.
    pub fn alloc(&mut self, pd: u32, kind: WindowType, mut random: impl FnMut() -> u32) -> u32 {
        let rkey = loop {
            let rkey = random() | WindowTable::KEY_BIT;
            if !self.windows.contains_key(&(rkey >> 8)) {
                break rkey;
            }
        };
        self.windows.insert(rkey >> 8, Window { rkey, pd, kind, binding: None });
        rkey
    }

    /// How many windows there are.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Frees the window with this R_Key's index; its key stops working at once.
    pub fn dealloc(&mut self, rkey: u32) -> bool {
        self.windows.remove(&(rkey >> 8)).is_some()
    }

    /// The window's R_Key as it stands (it changes with each bind).
    pub fn rkey(&self, rkey: u32) -> Option<u32> {
        self.windows.get(&(rkey >> 8)).map(|w| w.rkey)
    }

    /// Whether a window is bound to the region with `region_key`.
    pub fn is_bound_to(&self, region_key: u32) -> bool {
        self.windows.values().any(|w| w.binding.is_some_and(|b| b.region_key == region_key))
    }

    /// Unbinds every window bound to the region with `region_key`, which
    /// goes away.
    pub fn unbind_region(&mut self, region_key: u32) {
        for w in self.windows.values_mut() {
            if w.binding.is_some_and(|b| b.region_key == region_key) {
                w.binding = None;
            }
        }
    }

    /// Frees every type 2 window bound through QP `qpn`, which goes away.
    pub fn unbind_qp(&mut self, qpn: u32) {
        for w in self.windows.values_mut() {
            if w.kind == WindowType::Type2 && w.binding.is_some_and(|b| b.qpn == qpn) {
                w.binding = None;
            }
        }
    }

    fn get(&self, rkey: u32) -> Result<&Window, MemError> {
        self.windows.get(&(rkey >> 8)).filter(|w| w.rkey == rkey).ok_or(MemError::InvalidKey(rkey))
    }

    fn get_mut(&mut self, rkey: u32) -> Result<&mut Window, MemError> {
        self.windows.get_mut(&(rkey >> 8)).filter(|w| w.rkey == rkey).ok_or(MemError::InvalidKey(rkey))
    }

    /// Binds as `bind` asks (rxe's `rxe_check_bind_mw`, IBTA C10-72..75):
    /// `region` is what `bind.mr_lkey` names, if it names a region.
    /// A type 1 window is named by its current R_Key (which `ibv_bind_mw`
    /// keeps up to date), a type 2 window by its index alone: IBTA names it
    /// by handle, and `ibv_mw.rkey` keeps the key it was allocated with
    /// (rxe compares the whole key, so it cannot bind a type 2 window
    /// twice).
    pub fn bind(&mut self, user: KeyUser, bind: &MwBind, region: Option<BindTarget>) -> Result<(), MemError> {
        let unknown = MemError::InvalidKey(bind.mw_rkey);
        let window = self.windows.get_mut(&(bind.mw_rkey >> 8)).ok_or(unknown)?;
        if window.kind == WindowType::Type1 && window.rkey != bind.mw_rkey {
            return Err(unknown);
        }
        if window.pd != user.pd {
            return Err(MemError::WrongPd);
        }
        if window.kind == WindowType::Type2 && (window.binding.is_some() || bind.length == 0) {
            return Err(MemError::WrongState);
        }
        let binding = if bind.length == 0 {
            None
        } else {
            let region = region.ok_or(MemError::InvalidKey(bind.mr_lkey))?;
            if region.pd != window.pd {
                return Err(MemError::WrongPd);
            }
            let writes = bind.access.contains(Access::REMOTE_WRITE) || bind.access.contains(Access::REMOTE_ATOMIC);
            if !region.access.contains(Access::MW_BIND) || (writes && !region.access.contains(Access::LOCAL_WRITE)) {
                return Err(MemError::AccessDenied);
            }
            offset_in(region.addr, region.len, bind.addr, bind.length)?;
            Some(Binding {
                region_key: bind.mr_lkey,
                addr: bind.addr,
                len: bind.length,
                access: bind.access,
                qpn: user.qpn,
            })
        };
        window.rkey = (window.rkey & !0xff) | (bind.rkey & 0xff);
        window.binding = binding;
        Ok(())
    }

    /// Invalidates a bound type 2 window, which `user` must be the QP of
    /// (o10-37.2.26: type 1 windows are not invalidated).
    pub fn invalidate(&mut self, rkey: u32, user: KeyUser) -> Result<(), MemError> {
        let window = self.get_mut(rkey)?;
        if window.pd != user.pd {
            return Err(MemError::WrongPd);
        }
        match window.binding {
            Some(b) if window.kind == WindowType::Type2 && b.qpn == user.qpn => {
                window.binding = None;
                Ok(())
            }
            _ => Err(MemError::WrongState),
        }
    }

    /// The region key and address `[addr, addr + len)` through the window
    /// `rkey` reaches for `user` and `access`.
    pub fn resolve(&self, rkey: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<u32, MemError> {
        let window = self.get(rkey)?;
        let binding = window.binding.ok_or(MemError::InvalidKey(rkey))?;
        if window.pd != user.pd {
            return Err(MemError::WrongPd);
        }
        if window.kind == WindowType::Type2 && binding.qpn != user.qpn {
            return Err(MemError::InvalidKey(rkey));
        }
        if !binding.access.contains(access) {
            return Err(MemError::AccessDenied);
        }
        offset_in(binding.addr, binding.len, addr, len)?;
        Ok(binding.region_key)
    }
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

/// Regions by key (a region's lkey and rkey are the same number, as in rxe)
/// and memory windows. Keys are the table owner's own, so they need no
/// SipHash (as the engine's registry). Unlike the engine, which has no
/// fast-registration regions, the table lets a SEND_WITH_INVALIDATE or a
/// local invalidate remove a region, as a model of those.
#[derive(Debug, Default, Clone)]
pub struct MemoryTable {
    regions: rustc_hash::FxHashMap<u32, Region>,
    windows: WindowTable,
}

impl MemoryTable {
    /// An empty table.
    pub fn new() -> MemoryTable {
        MemoryTable::default()
    }

    /// Registers `region` under `key`, replacing any region with that key.
    /// A region's key shadows a window's.
    pub fn register(&mut self, key: u32, region: Region) {
        self.regions.insert(key, region);
    }

    /// Removes the region with `key` and returns it, if there was one;
    /// windows bound to it are unbound.
    pub fn deregister(&mut self, key: u32) -> Option<Region> {
        self.windows.unbind_region(key);
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

    /// The table's memory windows, to allocate and free them.
    pub fn windows_mut(&mut self) -> &mut WindowTable {
        &mut self.windows
    }

    /// The region and byte range `[addr, addr + len)` of `key` is, checked.
    fn locate(
        &self,
        key: u32,
        user: KeyUser,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(u32, std::ops::Range<usize>), MemError> {
        let window = WindowTable::is_window_key(key) && access.is_remote() && !self.regions.contains_key(&key);
        let key = if window {
            self.windows.resolve(key, user, addr, len, access)?
        } else {
            let region = self.regions.get(&key).ok_or(MemError::InvalidKey(key))?;
            permit(region.pd, region.access, user.pd, access)?;
            key
        };
        let region = self.regions.get(&key).ok_or(MemError::InvalidKey(key))?;
        Ok((key, region.range(addr, len)?))
    }
}

impl Memory for MemoryTable {
    fn check(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.locate(key, user, addr, len, access).map(|_| ())
    }

    fn resolve(&self, key: u32, user: KeyUser, addr: u64, len: u64, access: Access) -> Result<u32, MemError> {
        self.locate(key, user, addr, len, access).map(|(key, _)| key)
    }

    fn read(&self, key: u32, user: KeyUser, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        let (key, range) = self.locate(key, user, addr, out.len() as u64, access)?;
        out.copy_from_slice(&self.regions[&key].data[range]);
        Ok(())
    }

    fn write(&mut self, key: u32, user: KeyUser, addr: u64, data: &[u8], access: Access) -> Result<(), MemError> {
        let (key, range) = self.locate(key, user, addr, data.len() as u64, access)?;
        self.regions.get_mut(&key).expect("located").data[range].copy_from_slice(data);
        Ok(())
    }

    fn atomic(&mut self, key: u32, user: KeyUser, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !addr.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let (key, range) = self.locate(key, user, addr, 8, op.access())?;
        let word = &mut self.regions.get_mut(&key).expect("located").data[range];
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
            AtomicOp::Store { value } => value,
        };
        word.copy_from_slice(&new.to_ne_bytes());
        Ok(original)
    }

    fn invalidate(&mut self, rkey: u32, user: KeyUser) -> Result<(), MemError> {
        let Some(region) = self.regions.get(&rkey) else { return self.windows.invalidate(rkey, user) };
        permit(region.pd, region.access, user.pd, Access::NONE)?;
        self.deregister(rkey);
        Ok(())
    }

    fn bind_window(&mut self, user: KeyUser, bind: &MwBind) -> Result<(), MemError> {
        let target = self.regions.get(&bind.mr_lkey).map(|r| BindTarget {
            pd: r.pd,
            addr: r.addr,
            len: r.data.len() as u64,
            access: r.access,
        });
        self.windows.bind(user, bind, target)
    }

    /// Owned buffers are as placed as they will ever be: only the checks.
    fn flush(&mut self, key: u32, user: KeyUser, range: Option<(u64, u64)>, access: Access) -> Result<(), MemError> {
        let (addr, len) = match range {
            Some(range) => range,
            None => self.regions.get(&key).map(|r| (r.addr, r.data.len() as u64)).ok_or(MemError::InvalidKey(key))?,
        };
        self.locate(key, user, addr, len, access).map(|_| ())
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

    const USER: KeyUser = KeyUser { pd: 1, qpn: 0x11 };
    const OTHER_PD: KeyUser = KeyUser { pd: 2, qpn: 0x11 };

    #[test]
    fn checks_key_pd_access_bounds() {
        let mut t = table();
        assert_eq!(t.check(7, USER, 0x1000, 64, Access::REMOTE_WRITE), Ok(()));
        assert_eq!(t.check(8, USER, 0x1000, 1, Access::NONE), Err(MemError::InvalidKey(8)));
        assert_eq!(t.check(7, OTHER_PD, 0x1000, 1, Access::NONE), Err(MemError::WrongPd));
        assert_eq!(t.check(7, USER, 0x1000, 1, Access::REMOTE_READ), Err(MemError::AccessDenied));
        assert_eq!(t.check(7, USER, 0x1001, 64, Access::NONE), Err(MemError::OutOfBounds));
        assert_eq!(t.check(7, USER, 0xfff, 1, Access::NONE), Err(MemError::OutOfBounds));
        assert_eq!(t.check(7, USER, u64::MAX, 2, Access::NONE), Err(MemError::OutOfBounds));
        assert_eq!(t.write(7, USER, 0x103f, &[1, 2], Access::REMOTE_WRITE), Err(MemError::OutOfBounds));
        assert!(t.region(7).unwrap().data.iter().all(|b| *b == 0));
    }

    #[test]
    fn atomics() {
        let mut t = table();
        assert_eq!(t.atomic(7, USER, 0x1008, AtomicOp::FetchAdd { add: 5 }), Ok(0));
        assert_eq!(t.atomic(7, USER, 0x1008, AtomicOp::FetchAdd { add: 5 }), Ok(5));
        assert_eq!(t.atomic(7, USER, 0x1008, AtomicOp::CompareSwap { compare: 10, swap: 99 }), Ok(10));
        assert_eq!(t.atomic(7, USER, 0x1008, AtomicOp::CompareSwap { compare: 10, swap: 1 }), Ok(99));
        assert_eq!(t.atomic(7, USER, 0x1004, AtomicOp::FetchAdd { add: 1 }), Err(MemError::Misaligned));
    }

    #[test]
    fn invalidate_removes_the_key() {
        let mut t = table();
        assert_eq!(t.invalidate(7, OTHER_PD), Err(MemError::WrongPd));
        assert_eq!(t.invalidate(7, USER), Ok(()));
        assert_eq!(t.check(7, USER, 0x1000, 1, Access::NONE), Err(MemError::InvalidKey(7)));
    }

    /// A window on bytes 16..48 of region 7, granting `access`.
    fn bind(t: &mut MemoryTable, kind: WindowType, access: Access) -> u32 {
        let old = t.windows_mut().alloc(1, kind, || 0x1234_5640);
        t.region_mut(7).unwrap().access = t.region(7).unwrap().access | Access::MW_BIND;
        let bind = MwBind { mw_rkey: old, rkey: old + 1, mr_lkey: 7, addr: 0x1010, length: 32, access };
        assert_eq!(t.bind_window(USER, &bind), Ok(()));
        assert!(WindowTable::is_window_key(old + 1));
        old + 1
    }

    #[test]
    fn a_window_opens_its_range_with_its_rights_only() {
        let mut t = table();
        let rkey = bind(&mut t, WindowType::Type1, Access::REMOTE_READ);
        assert_eq!(t.check(rkey, USER, 0x1010, 32, Access::REMOTE_READ), Ok(()));
        // Its own rights, not the region's; its own range; remote use only.
        assert_eq!(t.check(rkey, USER, 0x1010, 8, Access::REMOTE_WRITE), Err(MemError::AccessDenied));
        assert_eq!(t.check(rkey, USER, 0x1008, 8, Access::REMOTE_READ), Err(MemError::OutOfBounds));
        assert_eq!(t.check(rkey, USER, 0x1030, 1, Access::REMOTE_READ), Err(MemError::OutOfBounds));
        assert_eq!(t.check(rkey, USER, 0x1010, 8, Access::NONE), Err(MemError::InvalidKey(rkey)));
        assert_eq!(t.check(rkey, OTHER_PD, 0x1010, 8, Access::REMOTE_READ), Err(MemError::WrongPd));
        // The old key is dead; a type 1 window answers any QP of its domain.
        assert_eq!(t.check(rkey - 1, USER, 0x1010, 8, Access::REMOTE_READ), Err(MemError::InvalidKey(rkey - 1)));
        let other_qp = KeyUser { qpn: 0x22, ..USER };
        assert_eq!(t.check(rkey, other_qp, 0x1010, 8, Access::REMOTE_READ), Ok(()));
        // Type 1 windows are unbound by a zero-length bind, never invalidated.
        assert_eq!(t.invalidate(rkey, USER), Err(MemError::WrongState));
        let unbind = MwBind { mw_rkey: rkey, rkey: rkey + 1, mr_lkey: 0, addr: 0, length: 0, access: Access::NONE };
        assert_eq!(t.bind_window(USER, &unbind), Ok(()));
        assert_eq!(t.check(rkey + 1, USER, 0x1010, 8, Access::REMOTE_READ), Err(MemError::InvalidKey(rkey + 1)));
    }

    #[test]
    fn a_type_2_window_answers_its_qp_until_invalidated() {
        let mut t = table();
        let rkey = bind(&mut t, WindowType::Type2, Access::REMOTE_WRITE);
        assert_eq!(t.write(rkey, USER, 0x1010, &[9; 4], Access::REMOTE_WRITE), Ok(()));
        assert_eq!(t.region(7).unwrap().data[16..20], [9; 4]);
        let other_qp = KeyUser { qpn: 0x22, ..USER };
        assert_eq!(t.check(rkey, other_qp, 0x1010, 4, Access::REMOTE_WRITE), Err(MemError::InvalidKey(rkey)));
        // Bound already: a second bind fails until an invalidate frees it.
        let again = MwBind { mw_rkey: rkey, rkey: rkey + 1, mr_lkey: 7, addr: 0x1000, length: 8, access: Access::NONE };
        assert_eq!(t.bind_window(USER, &again), Err(MemError::WrongState));
        assert_eq!(t.invalidate(rkey, other_qp), Err(MemError::WrongState));
        assert_eq!(t.invalidate(rkey, USER), Ok(()));
        assert_eq!(t.check(rkey, USER, 0x1010, 4, Access::REMOTE_WRITE), Err(MemError::InvalidKey(rkey)));
        assert_eq!(t.bind_window(USER, &again), Ok(()));
    }

    #[test]
    fn a_bind_checks_the_region() {
        let mut t = table();
        let w = t.windows_mut().alloc(1, WindowType::Type2, || 0x1234_5600);
        let bind = MwBind { mw_rkey: w, rkey: w, mr_lkey: 7, addr: 0x1000, length: 8, access: Access::REMOTE_READ };
        // C10-73: the region must allow binding.
        assert_eq!(t.bind_window(USER, &bind), Err(MemError::AccessDenied));
        t.region_mut(7).unwrap().access = Access::MW_BIND;
        // C10-74: a writable window needs a locally writable region.
        let write = MwBind { access: Access::REMOTE_WRITE, ..bind };
        assert_eq!(t.bind_window(USER, &write), Err(MemError::AccessDenied));
        // C10-75: inside the region; zero length is no type 2 bind.
        assert_eq!(t.bind_window(USER, &MwBind { length: 65, ..bind }), Err(MemError::OutOfBounds));
        assert_eq!(t.bind_window(USER, &MwBind { length: 0, ..bind }), Err(MemError::WrongState));
        assert_eq!(t.bind_window(USER, &MwBind { mr_lkey: 8, ..bind }), Err(MemError::InvalidKey(8)));
        assert_eq!(t.bind_window(OTHER_PD, &bind), Err(MemError::WrongPd));
        let elsewhere = w ^ 0x100;
        assert_eq!(t.bind_window(USER, &MwBind { mw_rkey: elsewhere, ..bind }), Err(MemError::InvalidKey(elsewhere)));
        // A type 2 window is named by its index: the key byte may be stale.
        assert_eq!(t.bind_window(USER, &MwBind { mw_rkey: w + 1, ..bind }), Ok(()));
        // A deregistered region takes its windows with it.
        t.deregister(7);
        assert_eq!(t.check(w, USER, 0x1000, 8, Access::REMOTE_READ), Err(MemError::InvalidKey(w)));
    }
}
