//! Memory windows: the `alloc_mw`, `dealloc_mw` and `bind_mw` context ops
//! behind libibverbs' inlines, and the bind requests of `ibv_post_send`
//! and `ibv_wr_bind_mw`.

use std::os::raw::{c_int, c_uint};
use std::ptr;

use softroce::verbs::{Access, MemoryWindow, MwBind, SendFlags, WindowType};

use crate::errno::set_errno;
use crate::guard::{guard_int, guard_ptr};
use crate::pd::{Mr, Pd};
use crate::qp::Qp;
use crate::sys::*;

/// A memory window as C sees it: programs read `rkey` from the struct, and
/// `ibv_bind_mw` (type 1) keeps it current, as rxe's provider does.
#[repr(C)]
pub struct Mw {
    ibv: ibv_mw,
    mw: MemoryWindow,
    pd: &'static Pd,
}

impl Mw {
    /// # Safety
    /// `mw` must come from [`alloc_mw`] and not be freed.
    unsafe fn from_ibv<'a>(mw: *mut ibv_mw) -> Option<&'a Mw> {
        // SAFETY: ibv_mw is the first field of an Mw.
        unsafe { mw.cast::<Mw>().as_ref() }
    }
}

/// `ibv_context_ops::alloc_mw`. A type other than 1 and 2 is `EINVAL`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    guard_ptr(|| {
        let kind = match type_ {
            IBV_MW_TYPE_1 => Some(WindowType::Type1),
            IBV_MW_TYPE_2 => Some(WindowType::Type2),
            _ => None,
        };
        // SAFETY: the program's PD, made by this library.
        let (Some(found), Some(kind)) = (unsafe { Pd::from_ibv(pd) }, kind) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let mw = match found.pd.alloc_mw(kind) {
            Ok(mw) => mw,
            Err(e) => {
                set_errno(e.errno());
                return ptr::null_mut();
            }
        };
        let ibv = ibv_mw { context: found.ctx.ibv(), pd, rkey: mw.rkey(), handle: mw.rkey() >> 8, type_ };
        found.users.hold();
        // SAFETY: PDs outlive their windows (dealloc is EBUSY while any lives).
        let pd_ref: &'static Pd = unsafe { &*ptr::from_ref(found) };
        Box::leak(Box::new(Mw { ibv, mw, pd: pd_ref })) as *mut Mw as *mut ibv_mw
    })
}

/// `ibv_context_ops::dealloc_mw`: the window's key stops working at once.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard_int(|| {
        if mw.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ibv_mw is the first field of an Mw leaked by alloc_mw.
        let mw = unsafe { Box::from_raw(mw.cast::<Mw>()) };
        let pd = mw.pd;
        drop(mw);
        pd.users.release();
        0
    })
}

/// The bind `info` asks of `mw`, under `rkey`. Zero-based windows are
/// refused (`EINVAL`, as rxe's provider does for type 1), and so is a
/// length without a region.
///
/// # Safety
/// `mw` and `info.mr` must be NULL or objects of this library.
pub(crate) unsafe fn bind_request(mw: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info) -> Result<MwBind, c_int> {
    // SAFETY: as the caller promises.
    let found = unsafe { Mw::from_ibv(mw) }.ok_or(libc::EINVAL)?;
    let access = window_access(info.mw_access_flags).ok_or(libc::EINVAL)?;
    // SAFETY: as the caller promises.
    let mr_lkey = match unsafe { info.mr.as_ref() } {
        Some(mr) => mr.lkey,
        None if info.length == 0 => 0,
        None => return Err(libc::EINVAL),
    };
    Ok(MwBind { mw_rkey: found.ibv.rkey, rkey, mr_lkey, addr: info.addr, length: info.length, access })
}

/// A window's rights from `ibv_access_flags`: local write and bind rights
/// mean nothing on a window and are dropped; zero-based ones are refused.
fn window_access(flags: c_uint) -> Option<Access> {
    Access::from_bits(flags & !(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND))
}

/// `ibv_context_ops::bind_mw`, behind `ibv_bind_mw` (type 1 windows: the
/// inline refuses others): posts the bind under the next key and, once
/// posted, makes it the window's `rkey`.
pub(crate) unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int {
    guard_int(|| {
        // SAFETY: the program's objects, made by this library.
        let (Some(queue_pair), Some(found), Some(request)) =
            (unsafe { Qp::queue_pair(qp) }, unsafe { Mw::from_ibv(mw) }, unsafe { mw_bind.as_ref() })
        else {
            return libc::EINVAL;
        };
        // SAFETY: `info.mr` is the program's region or NULL.
        let mr = unsafe { request.bind_info.mr.cast::<Mr>().as_ref() };
        let Some(access) = window_access(request.bind_info.mw_access_flags) else { return libc::EINVAL };
        if mr.is_none() && request.bind_info.length != 0 {
            return libc::EINVAL;
        }
        let bind = found.mw.bind_request(mr.map(Mr::region), request.bind_info.addr, request.bind_info.length, access);
        let flags = SendFlags {
            fence: request.send_flags & IBV_SEND_FENCE != 0,
            signaled: request.send_flags & IBV_SEND_SIGNALED != 0,
            ..SendFlags::default()
        };
        if let Err(e) = queue_pair.bind_mw(&found.mw, request.wr_id, bind, flags) {
            return e.errno();
        }
        // SAFETY: the program's window; it reads `rkey`, which only the
        // program's own calls change.
        unsafe { (*mw).rkey = bind.rkey };
        0
    })
}
