//! Protection domains, memory regions and address handles.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::raw::{c_int, c_uint, c_void};
use std::ptr;

use softroce::verbs::{Access, AddressHandle, Advice, Gid, MemoryRegion, ProtectionDomain, Rereg};

use crate::device::Ctx;
use crate::errno::set_errno;
use crate::guard::{guard_int, guard_neg, guard_ptr};
use crate::sys::*;
use crate::users::Users;

/// A protection domain as C sees it, with a count of the objects in it so
/// that it cannot be freed under them (`EBUSY`, as the kernel says).
#[repr(C)]
pub struct Pd {
    ibv: ibv_pd,
    pub(crate) pd: ProtectionDomain,
    pub(crate) ctx: &'static Ctx,
    pub(crate) users: Users,
}

impl Pd {
    /// # Safety
    /// `pd` must come from [`ibv_alloc_pd`] and not be freed.
    pub(crate) unsafe fn from_ibv<'a>(pd: *mut ibv_pd) -> Option<&'a Pd> {
        // SAFETY: ibv_pd is the first field of a Pd.
        unsafe { pd.cast::<Pd>().as_ref() }
    }

    pub(crate) fn ibv(&self) -> *mut ibv_pd {
        ptr::addr_of!(self.ibv).cast_mut()
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard_ptr(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let pd = match ctx.ctx.alloc_pd() {
            Ok(pd) => pd,
            Err(e) => {
                set_errno(e.errno());
                return ptr::null_mut();
            }
        };
        // SAFETY: a context lives until ibv_close_device, which programs
        // call after freeing its objects; a PD used after that is the
        // program's use-after-free, as with libibverbs.
        let ctx: &'static Ctx = unsafe { &*ptr::from_ref(ctx) };
        let boxed = Box::new(Pd { ibv: ibv_pd { context, handle: 0 }, pd, ctx, users: Users::default() });
        Box::leak(boxed).ibv()
    })
}
symver!(ibv_alloc_pd);

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard_int(|| {
        let Some(found) = (unsafe { Pd::from_ibv(pd) }) else { return libc::EINVAL };
        if found.users.busy() {
            return libc::EBUSY;
        }
        // SAFETY: leaked from a Box by ibv_alloc_pd.
        drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
        0
    })
}
symver!(ibv_dealloc_pd);

/// A memory region as C sees it: programs read `addr`, `length`, `lkey`
/// and `rkey` straight from the struct.
#[repr(C)]
pub struct Mr {
    ibv: ibv_mr,
    mr: MemoryRegion,
    pd: &'static Pd,
}

impl Mr {
    /// The region behind the C struct.
    pub(crate) fn region(&self) -> &MemoryRegion {
        &self.mr
    }
}

/// Access bits that change nothing here: hints (relaxed ordering and the
/// other optional bits, huge pages).
const IGNORED_ACCESS: c_uint = IBV_ACCESS_HUGETLB | IBV_ACCESS_RELAXED_ORDERING | 0x3ff0_0000;

/// A region's rights from `ibv_access_flags`, or the errno refusing them.
fn region_rights(access: c_uint) -> Result<Access, c_int> {
    let rest = access & !IGNORED_ACCESS;
    if rest & IBV_ACCESS_ZERO_BASED != 0 {
        // Zero-based regions are for device memory and windows.
        return Err(libc::EOPNOTSUPP);
    }
    Access::from_bits(rest).ok_or(libc::EINVAL)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}
symver!(ibv_reg_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}
symver!(ibv_reg_mr_iova);

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard_ptr(|| {
        let Some(found) = (unsafe { Pd::from_ibv(pd) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let rights = match region_rights(access) {
            Ok(rights) => rights,
            Err(errno) => {
                set_errno(errno);
                return ptr::null_mut();
            }
        };
        // SAFETY: the program registered this memory and keeps it until
        // ibv_dereg_mr, as libibverbs requires; the engine reaches it only
        // through the checked registry.
        let mr = match unsafe { found.pd.reg_mr_iova(addr.cast(), length, iova, rights) } {
            Ok(mr) => mr,
            Err(e) => {
                set_errno(e.errno());
                return ptr::null_mut();
            }
        };
        let ibv =
            ibv_mr { context: found.ctx.ibv(), pd, addr, length, handle: mr.lkey(), lkey: mr.lkey(), rkey: mr.rkey() };
        found.users.hold();
        // SAFETY: PDs outlive their regions (dealloc is EBUSY while any lives).
        let pd_ref: &'static Pd = unsafe { &*ptr::from_ref(found) };
        Box::leak(Box::new(Mr { ibv, mr, pd: pd_ref })) as *mut Mr as *mut ibv_mr
    })
}
symver!(ibv_reg_mr_iova2);

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard_int(|| {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ibv_mr is the first field of an Mr leaked by ibv_reg_mr.
        let mr = unsafe { Box::from_raw(mr.cast::<Mr>()) };
        let pd = mr.pd;
        // Deregisters: once this returns the engine no longer touches the memory.
        drop(mr);
        pd.users.release();
        0
    })
}
symver!(ibv_dereg_mr);

/// Returns 0 or an `ibv_rereg_mr_err_code` (negative), with errno set:
/// `IBV_REREG_MR_ERR_INPUT` for arguments libibverbs refuses itself,
/// `IBV_REREG_MR_ERR_CMD` for those the device refuses. The keys stay.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard_neg(|| {
        let flags = flags as c_uint;
        let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
        let input_ok = !mr.is_null()
            && flags & !IBV_REREG_MR_FLAGS_SUPPORTED == 0
            && !(translation && (length == 0 || addr.is_null()))
            && (access == 0 || flags & IBV_REREG_MR_CHANGE_ACCESS != 0);
        if !input_ok {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        }
        // SAFETY: ibv_mr is the first field of an Mr leaked by ibv_reg_mr,
        // which the program does not use elsewhere during the call.
        let found = unsafe { &mut *mr.cast::<Mr>() };
        let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            // SAFETY: the program's PD, made by this library.
            match unsafe { Pd::from_ibv(pd) } {
                Some(pd) => Some(pd),
                None => {
                    set_errno(libc::EINVAL);
                    return IBV_REREG_MR_ERR_CMD;
                }
            }
        } else {
            None
        };
        let rights = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            match region_rights(access as c_uint) {
                Ok(rights) => Some(rights),
                Err(errno) => {
                    set_errno(errno);
                    return IBV_REREG_MR_ERR_CMD;
                }
            }
        } else {
            None
        };
        let change =
            Rereg { pd: new_pd.map(|p| &p.pd), memory: translation.then_some((addr.cast(), length)), access: rights };
        // SAFETY: new memory is the program's, registered until ibv_dereg_mr
        // as with ibv_reg_mr.
        if let Err(e) = unsafe { found.mr.rereg(change) } {
            set_errno(e.errno());
            return IBV_REREG_MR_ERR_CMD;
        }
        if let Some(pd) = new_pd {
            pd.users.hold();
            found.pd.users.release();
            // SAFETY: PDs outlive their regions (dealloc is EBUSY while any lives).
            found.pd = unsafe { &*ptr::from_ref(pd) };
            found.ibv.pd = pd.ibv();
        }
        if translation {
            (found.ibv.addr, found.ibv.length) = (addr, length);
        }
        0
    })
}
symver!(ibv_rereg_mr);

/// The uapi's `IB_UVERBS_ADVISE_MR_FLAG_FLUSH` (synchronous advice), which
/// the generated bindings do not carry.
const ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// `verbs_context::advise_mr`, behind `ibv_advise_mr`: prefetches are done
/// when it returns, with or without `IBV_ADVISE_MR_FLAG_FLUSH`.
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sges: u32,
) -> c_int {
    guard_int(|| {
        // SAFETY: the program's PD, made by this library.
        let Some(found) = (unsafe { Pd::from_ibv(pd) }) else { return libc::EINVAL };
        let advice = match advice {
            IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH => Advice::Prefetch,
            IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE => Advice::PrefetchWrite,
            IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT => Advice::PrefetchNoFault,
            _ => return libc::EOPNOTSUPP,
        };
        if flags & !ADVISE_MR_FLAG_FLUSH != 0 || num_sges == 0 {
            return libc::EINVAL;
        }
        // SAFETY: the program's list of `num_sges` SGEs.
        let sges = match unsafe { crate::qp::sges(sg_list, num_sges as c_int) } {
            Ok(sges) => sges,
            Err(errno) => return errno,
        };
        match found.pd.advise_mr(advice, &sges) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// An address handle as C sees it, with the attributes it was made from.
#[repr(C)]
pub struct Ah {
    ibv: ibv_ah,
    pub(crate) ah: AddressHandle,
    pd: &'static Pd,
}

impl Ah {
    /// # Safety
    /// `ah` must come from [`ibv_create_ah`] and not be destroyed.
    pub(crate) unsafe fn from_ibv<'a>(ah: *mut ibv_ah) -> Option<&'a Ah> {
        // SAFETY: ibv_ah is the first field of an Ah.
        unsafe { ah.cast::<Ah>().as_ref() }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard_ptr(|| {
        let (Some(found), Some(attr)) = (unsafe { Pd::from_ibv(pd) }, unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // A RoCE address is an IP address: without a GRH there is none.
        if attr.is_global == 0 || found.ctx.ctx.device().gid(attr.grh.sgid_index.into()).is_none() {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        // SAFETY: a GID is 16 bytes whichever union member wrote it.
        let gid = Gid::from(unsafe { attr.grh.dgid.raw });
        found.users.hold();
        // SAFETY: PDs outlive their handles (dealloc is EBUSY while any lives).
        let pd_ref: &'static Pd = unsafe { &*ptr::from_ref(found) };
        let ibv = ibv_ah { context: found.ctx.ibv(), pd, handle: 0 };
        Box::leak(Box::new(Ah { ibv, ah: found.pd.create_ah(gid), pd: pd_ref })) as *mut Ah as *mut ibv_ah
    })
}
symver!(ibv_create_ah);

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard_int(|| {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: leaked from a Box by ibv_create_ah.
        let ah = unsafe { Box::from_raw(ah.cast::<Ah>()) };
        ah.pd.users.release();
        0
    })
}
symver!(ibv_destroy_ah);

/// The source and destination addresses of the header a UD receive's GRH
/// area holds: an IPv4 header in its last 20 bytes, or an IPv6 header.
fn grh_addresses(grh: &[u8; 40]) -> Option<(IpAddr, IpAddr, u8)> {
    if grh[20] >> 4 == 4 {
        let v4 = &grh[20..];
        let addr = |at: usize| IpAddr::V4(Ipv4Addr::new(v4[at], v4[at + 1], v4[at + 2], v4[at + 3]));
        return Some((addr(12), addr(16), v4[8]));
    }
    if grh[0] >> 4 == 6 {
        let addr = |at: usize| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&grh[at..at + 16]).expect("16 bytes")));
        return Some((addr(8), addr(24), grh[7]));
    }
    None
}

#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard_neg(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let (Some(wc), false, false) = (unsafe { wc.as_ref() }, grh.is_null(), ah_attr.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if wc.wc_flags & IBV_WC_GRH == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a GRH area is 40 bytes.
        let bytes = unsafe { &*grh.cast::<[u8; 40]>() };
        let Some((source, destination, hop_limit)) = grh_addresses(bytes) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let gids = ctx.ctx.device().gid_table();
        let Some(sgid_index) = gids.iter().position(|g| *g == Gid::from_ip(destination)) else {
            // Not addressed to one of our GIDs.
            set_errno(libc::ENOENT);
            return -1;
        };
        // SAFETY: all zeros is a valid ibv_ah_attr.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        attr.is_global = 1;
        attr.port_num = port_num;
        attr.grh.dgid.raw = Gid::from_ip(source).into();
        attr.grh.sgid_index = sgid_index as u8;
        attr.grh.hop_limit = hop_limit;
        // SAFETY: the caller's struct.
        unsafe { ah_attr.write(attr) };
        0
    })
}
symver!(ibv_init_ah_from_wc);

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard_ptr(|| {
        let Some(found) = (unsafe { Pd::from_ibv(pd) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: all zeros is a valid ibv_ah_attr.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        if unsafe { ibv_init_ah_from_wc(found.ctx.ibv(), port_num, wc, grh, &mut attr) } != 0 {
            return ptr::null_mut();
        }
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}
symver!(ibv_create_ah_from_wc);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grh_area_names_the_ipv4_sender_in_its_last_20_bytes() {
        let mut area = [0u8; 40];
        area[20] = 0x45;
        area[28] = 64;
        area[32..36].copy_from_slice(&[10, 0, 0, 1]);
        area[36..40].copy_from_slice(&[10, 0, 0, 2]);
        let (src, dst, ttl) = grh_addresses(&area).unwrap();
        assert_eq!((src.to_string(), dst.to_string(), ttl), ("10.0.0.1".into(), "10.0.0.2".into(), 64));
        assert_eq!(grh_addresses(&[0; 40]), None);
    }
}
