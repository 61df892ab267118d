//! Devices, contexts and what they report: the list, open and close, device,
//! port, GID and P_Key queries, and asynchronous events.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::{Mutex, OnceLock};

use std::sync::atomic::{AtomicU32, Ordering};

use softroce::verbs::{AsyncEvent, CaptureOptions, Context, ContextOptions, Device, Gid, PortAttr};

use crate::errno::set_errno;
use crate::guard::{blocking, guard, guard_int, guard_neg, guard_ptr, guard_void, wait_readable_slice};
use crate::sys::*;
use crate::{cq, mw, pd, qp, srq};

pub use softroce::verbs::device::ADDR_ENV;
/// The RoCE UDP port, if not 4791 (tests run on free ports).
pub const PORT_ENV: &str = "SOFTROCE_PORT";
/// A pcap file to record every packet of the devices opened into (the
/// second device a process opens records into `FILE.1`, and so on).
pub const PCAP_ENV: &str = "SOFTROCE_PCAP";
/// The most packets a capture records (a million by default).
pub const PCAP_PACKETS_ENV: &str = "SOFTROCE_PCAP_PACKETS";

/// The capture of the next device opened, from the environment.
fn capture_from_env() -> Option<CaptureOptions> {
    static OPENED: AtomicU32 = AtomicU32::new(0);
    let path = std::path::PathBuf::from(std::env::var_os(PCAP_ENV).filter(|p| !p.is_empty())?);
    let path = match OPENED.fetch_add(1, Ordering::Relaxed) {
        0 => path,
        n => {
            let mut numbered = path.into_os_string();
            numbered.push(format!(".{n}"));
            numbered.into()
        }
    };
    let mut capture = CaptureOptions::new(path);
    if let Some(max) = std::env::var(PCAP_PACKETS_ENV).ok().and_then(|m| m.parse().ok()) {
        capture.max_packets = max;
    }
    Some(capture)
}

/// `ibv_gid_type_sysfs` (rdma-core's driver.h): what sysfs says of a GID.
const GID_TYPE_SYSFS_ROCE_V2: c_int = 1;

/// rdma-core v44's `struct verbs_device` (libibverbs/driver.h), the memory every `ibv_device`
/// of libibverbs starts. Providers tell their own devices by its `ops` (mlx5's `is_mlx5_dev`,
/// which UCX's `mlx5dv_is_supported` calls, and efa's), so softroce's devices carry one too:
/// `ops` NULL, which no provider's ops are, and the rest empty.
#[repr(C)]
pub struct VerbsDevice {
    pub device: ibv_device,
    /// `const struct verbs_device_ops *`: NULL, softroce's devices have no provider.
    pub ops: *const c_void,
    /// `atomic_int refcount`: the one reference of the device list, which lives for the process.
    pub refcount: c_int,
    /// `struct list_node entry`: `next` and `prev` of libibverbs' device list (NULL).
    pub entry: [*mut c_void; 2],
    /// `struct verbs_sysfs_dev *sysfs`: NULL, no sysfs entry was read.
    pub sysfs: *mut c_void,
    /// `uint64_t core_support`: the kernel's optional features (`IB_UVERBS_CORE_SUPPORT_*`), none.
    pub core_support: u64,
}

// SAFETY: the pointers are NULL for the life of the device and never written.
unsafe impl Send for VerbsDevice {}
// SAFETY: as for Send; nothing is written after the device list is made.
unsafe impl Sync for VerbsDevice {}

/// A device as C sees it: a `verbs_device`, whose first member is the `ibv_device`, first, so the
/// pointer is all three.
#[repr(C)]
pub struct Dev {
    verbs: VerbsDevice,
    device: Device,
    index: c_int,
    /// While any `ibv_context` of the device is open: the softroce context
    /// they all share and the addresses of their `Ctx`s. One engine holds
    /// the device's addresses on the RoCE port, so a second
    /// `ibv_open_device` in the process shares it, as every open of a
    /// kernel device shares that device.
    open: Mutex<Option<Opened>>,
    /// The `ibv_context` librdmacm's calls hand out for the device
    /// (`cm_id->verbs`, `rdma_get_devices`) and the PD librdmacm gives its
    /// ids (`cm_id->pd`, for `rdma_create_ep` without one): made on first
    /// use and kept for the life of the process, as librdmacm keeps them.
    cm_context: Mutex<Option<CmContext>>,
}

/// See [`Dev::cm_context`].
#[derive(Clone, Copy)]
pub(crate) struct CmContext {
    pub(crate) context: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
}

// SAFETY: pointers to this library's objects, which live for the process.
unsafe impl Send for CmContext {}

struct Opened {
    ctx: Context,
    ctxs: Vec<usize>,
}

/// The process's devices, found once: they live as long as the process.
fn devices() -> &'static [Dev] {
    static DEVICES: OnceLock<Vec<Dev>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let found = find_devices().unwrap_or_else(|e| {
            eprintln!("softroce: no devices: {e}");
            Vec::new()
        });
        // Addresses the connection manager resolves map to these devices,
        // the ones programs see.
        softroce::cm::set_devices(found.clone());
        found.into_iter().enumerate().map(|(index, device)| Dev::new(device, index)).collect()
    })
}

/// Before the connection manager's first call: makes it resolve addresses
/// to this library's devices, and opens every device's librdmacm context,
/// as librdmacm opens all devices on its first call. The manager then finds
/// them open, with the capture `SOFTROCE_PCAP` asks for.
pub(crate) fn open_cm_contexts() {
    static OPENED: std::sync::Once = std::sync::Once::new();
    OPENED.call_once(|| {
        for dev in devices() {
            dev.cm_context();
        }
    });
}

/// The context and PD librdmacm's calls give ids of `device` (see
/// [`Dev::cm_context`]); None with errno set if they cannot be made.
pub(crate) fn cm_context(device: &Device) -> Option<CmContext> {
    match devices().iter().find(|d| &d.device == device) {
        Some(dev) => dev.cm_context(),
        None => {
            set_errno(libc::ENODEV);
            None
        }
    }
}

/// Every device's librdmacm context (`rdma_get_devices`); those that cannot
/// be opened are left out.
pub(crate) fn cm_contexts() -> Vec<*mut ibv_context> {
    devices().iter().filter_map(Dev::cm_context).map(|c| c.context).collect()
}

fn find_devices() -> Result<Vec<Device>, String> {
    Device::list_for(std::env::var(ADDR_ENV).ok().as_deref()).map_err(|e| e.to_string())
}

fn copy_str(dst: &mut [c_char], text: &str) {
    let n = text.len().min(dst.len() - 1);
    for (d, s) in dst.iter_mut().zip(&text.as_bytes()[..n]) {
        *d = *s as c_char;
    }
    dst[n] = 0;
}

impl Dev {
    fn new(device: Device, index: usize) -> Dev {
        // SAFETY: ibv_device is plain data (integers, arrays, and the
        // provider ops, which nothing calls); all zeros is valid.
        let mut ibv: ibv_device = unsafe { std::mem::zeroed() };
        ibv.node_type = IBV_NODE_CA;
        ibv.transport_type = IBV_TRANSPORT_IB;
        copy_str(&mut ibv.name, device.name());
        copy_str(&mut ibv.dev_name, &format!("uverbs{index}"));
        copy_str(&mut ibv.dev_path, &format!("/sys/class/infiniband_verbs/uverbs{index}"));
        copy_str(&mut ibv.ibdev_path, &format!("/sys/class/infiniband/{}", device.name()));
        let verbs = VerbsDevice {
            device: ibv,
            ops: ptr::null(),
            refcount: 1,
            entry: [ptr::null_mut(); 2],
            sysfs: ptr::null_mut(),
            core_support: 0,
        };
        Dev { verbs, device, index: index as c_int, open: Mutex::new(None), cm_context: Mutex::new(None) }
    }

    /// The `ibv_device` C holds: the first member of the `verbs_device`.
    fn ibv(&self) -> &ibv_device {
        &self.verbs.device
    }

    fn cm_context(&self) -> Option<CmContext> {
        let mut opened = self.cm_context.lock().unwrap_or_else(|e| e.into_inner());
        if opened.is_none() {
            // SAFETY: this device's own ibv_device; a PD on the context just opened.
            unsafe {
                let context = ibv_open_device(ptr::from_ref(self.ibv()).cast_mut());
                if context.is_null() {
                    return None;
                }
                let pd = crate::pd::ibv_alloc_pd(context);
                if pd.is_null() {
                    ibv_close_device(context);
                    return None;
                }
                *opened = Some(CmContext { context, pd });
            }
        }
        *opened
    }

    /// The device behind a pointer from `ibv_get_device_list`.
    unsafe fn from_ibv<'a>(device: *mut ibv_device) -> Option<&'a Dev> {
        let found = devices().iter().find(|d| ptr::eq(d.ibv(), device));
        found
    }
}

/// An open device as C sees it: `verbs_context`, whose last member is the
/// `ibv_context` programs hold, comes first.
#[repr(C)]
pub struct Ctx {
    vctx: verbs_context,
    pub(crate) ctx: Context,
    pub(crate) device: &'static Dev,
    /// The C objects by the numbers the engine names them with, so that
    /// events can point at them.
    pub(crate) cqs: Mutex<HashMap<u32, usize>>,
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
    pub(crate) srqs: Mutex<HashMap<u32, usize>>,
    /// `cmd_fd`: the kernel's command channel, which softroce has none of.
    /// Programs only `dup` it (pyverbs, to import a device elsewhere), so it
    /// is a real descriptor that leads nowhere.
    _cmd_fd: std::fs::File,
}

impl Ctx {
    /// The context behind an `ibv_context` pointer this library handed out.
    ///
    /// # Safety
    /// `context` must come from [`ibv_open_device`] and not be closed.
    pub(crate) unsafe fn from_ibv<'a>(context: *mut ibv_context) -> Option<&'a Ctx> {
        if context.is_null() {
            return None;
        }
        // SAFETY: the context is the last member of the verbs_context that
        // opens a Ctx (container_of).
        Some(unsafe { &*context.cast::<u8>().sub(offset_of!(verbs_context, context)).cast::<Ctx>() })
    }

    pub(crate) fn ibv(&self) -> *mut ibv_context {
        ptr::addr_of!(self.vctx.context).cast_mut()
    }

    fn gid(&self, index: usize) -> Option<Gid> {
        self.device.device.gid(index)
    }
}

fn port_is_valid(port: u32) -> bool {
    port == 1
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard_ptr(|| {
        let devices = devices();
        // SAFETY: calloc of n+1 pointers; the list ends with NULL, and
        // ibv_free_device_list frees it.
        let list = unsafe { libc::calloc(devices.len() + 1, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, dev) in devices.iter().enumerate() {
            // SAFETY: i < n + 1 entries.
            unsafe { *list.add(i) = ptr::from_ref(dev.ibv()).cast_mut() };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller's int.
            unsafe { *num_devices = devices.len() as c_int };
        }
        list
    })
}
symver!(ibv_get_device_list);

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the list came from calloc in ibv_get_device_list.
    guard_void(|| unsafe { libc::free(list.cast()) })
}
symver!(ibv_free_device_list);

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    match unsafe { Dev::from_ibv(device) } {
        Some(dev) => dev.ibv().name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            ptr::null()
        }
    }
}
symver!(ibv_get_device_name);

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> __be64 {
    match unsafe { Dev::from_ibv(device) } {
        Some(dev) => dev.device.query_device().node_guid.to_be(),
        None => 0,
    }
}
symver!(ibv_get_device_guid);

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    unsafe { Dev::from_ibv(device) }.map_or(-1, |dev| dev.index)
}
symver!(ibv_get_device_index);

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard_ptr(|| {
        let Some(dev) = (unsafe { Dev::from_ibv(device) }) else {
            set_errno(libc::ENODEV);
            return ptr::null_mut();
        };
        let mut options = ContextOptions::default();
        if let Some(port) = std::env::var(PORT_ENV).ok().and_then(|p| p.parse().ok()) {
            options.port = port;
        }
        let port = options.port;
        let mut open = dev.open.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = match &*open {
            Some(opened) => Ok(opened.ctx.clone()),
            // The process's context of the device, which the connection
            // manager shares; only a device opened afresh starts a capture.
            None => softroce::cm::context_for(&dev.device, &ContextOptions { capture: capture_from_env(), ..options }),
        };
        let ctx = match ctx {
            Ok(ctx) => ctx,
            Err(e) => {
                eprintln!("softroce: cannot open {}: {e}", dev.device.name());
                if e.errno() == libc::EADDRINUSE {
                    // A user's programs share the port (as kernel rxe's share
                    // a device); what holds it is not this user's softroce.
                    eprintln!(
                        "softroce: this user's programs share {name}'s UDP port {port}, as programs share \
                         a kernel rxe device, but another user's program, kernel rxe, or a program that \
                         did not ask to share it holds it there (`ss -ulpn 'sport = :{port}'` names \
                         programs; kernel rxe shows in `rdma link`). Another user's programs need an \
                         address of their own: {ADDR_ENV}=127.0.0.2, say, or `softroce run --addr \
                         127.0.0.2 -- ...`",
                        name = dev.device.name()
                    );
                }
                set_errno(e.errno());
                return ptr::null_mut();
            }
        };
        // SAFETY: verbs_context is plain data; all zeros is a valid start
        // (NULL ops, an initialised glibc mutex).
        let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
        vctx.sz = size_of::<verbs_context>();
        vctx.query_port = Some(query_port_op);
        vctx.create_cq_ex = Some(cq::create_cq_ex);
        vctx.query_device_ex = Some(query_device_ex_op);
        vctx.advise_mr = Some(pd::advise_mr);
        vctx.create_qp_ex = Some(qp::create_qp_ex);
        let c = &mut vctx.context;
        c.device = device;
        let cmd_fd = match std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
            Ok(file) => file,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                return ptr::null_mut();
            }
        };
        c.cmd_fd = std::os::fd::AsRawFd::as_raw_fd(&cmd_fd);
        c.async_fd = ctx.async_event_fd();
        c.num_comp_vectors = 1;
        // libibverbs' mark of a context that has the extended ops.
        c.abi_compat = usize::MAX as *mut c_void;
        c.ops.poll_cq = Some(cq::poll_cq);
        c.ops.req_notify_cq = Some(cq::req_notify_cq);
        c.ops.post_send = Some(qp::post_send);
        c.ops.post_recv = Some(qp::post_recv);
        c.ops.post_srq_recv = Some(srq::post_srq_recv);
        c.ops.alloc_mw = Some(mw::alloc_mw);
        c.ops.dealloc_mw = Some(mw::dealloc_mw);
        c.ops.bind_mw = Some(mw::bind_mw);
        let boxed = Box::new(Ctx {
            vctx,
            ctx: ctx.clone(),
            device: dev,
            cqs: Mutex::default(),
            qps: Mutex::default(),
            srqs: Mutex::default(),
            _cmd_fd: cmd_fd,
        });
        crate::exit::settle_at_exit();
        let leaked = Box::leak(boxed);
        open.get_or_insert_with(|| Opened { ctx, ctxs: Vec::new() }).ctxs.push(ptr::from_ref(leaked) as usize);
        leaked.ibv()
    })
}
symver!(ibv_open_device);

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard_neg(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let mut open = ctx.device.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(opened) = open.as_mut() {
            opened.ctxs.retain(|&c| c != ptr::from_ref(ctx) as usize);
            if opened.ctxs.is_empty() {
                crate::exit::settle_before_close(&ctx.ctx);
                // The last one: the next open starts afresh.
                *open = None;
            }
        }
        // SAFETY: the Ctx was leaked from a Box by ibv_open_device and is no
        // longer listed in its device. Objects still open keep the engine
        // alive through their own handles; if there are none, the engine
        // stops here, under the lock, so an open waiting for it binds the
        // port after this one let go of it.
        drop(unsafe { Box::from_raw(ptr::from_ref(ctx).cast_mut()) });
        drop(open);
        0
    })
}
symver!(ibv_close_device);

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    guard_int(|| {
        let (Some(ctx), false) = (unsafe { Ctx::from_ibv(context) }, attr.is_null()) else {
            return libc::EINVAL;
        };
        let a = ctx.device.device.query_device();
        // SAFETY: the caller's struct; zeroed first, so nothing is left undefined.
        let out = unsafe {
            attr.write(std::mem::zeroed());
            &mut *attr
        };
        copy_str(&mut out.fw_ver, &a.fw_ver);
        out.node_guid = a.node_guid.to_be();
        out.sys_image_guid = a.sys_image_guid.to_be();
        out.max_mr_size = a.max_mr_size;
        out.page_size_cap = a.page_size_cap;
        out.vendor_id = a.vendor_id;
        out.vendor_part_id = a.vendor_part_id;
        out.hw_ver = a.hw_ver;
        let int = |v: u32| v.min(c_int::MAX as u32) as c_int;
        out.max_qp = int(a.max_qp);
        out.max_qp_wr = int(a.max_qp_wr);
        out.device_cap_flags = a.device_cap_flags.bits();
        out.max_sge = int(a.max_sge);
        out.max_sge_rd = int(a.max_sge_rd);
        out.max_cq = int(a.max_cq);
        out.max_cqe = int(a.max_cqe);
        out.max_mr = int(a.max_mr);
        out.max_pd = int(a.max_pd);
        out.max_qp_rd_atom = int(a.max_qp_rd_atom);
        out.max_ee_rd_atom = int(a.max_ee_rd_atom);
        out.max_res_rd_atom = int(a.max_res_rd_atom);
        out.max_qp_init_rd_atom = int(a.max_qp_init_rd_atom);
        out.max_ee_init_rd_atom = int(a.max_ee_init_rd_atom);
        out.atomic_cap = a.atomic_cap as ibv_atomic_cap;
        out.max_ee = int(a.max_ee);
        out.max_rdd = int(a.max_rdd);
        out.max_mw = int(a.max_mw);
        out.max_raw_ipv6_qp = int(a.max_raw_ipv6_qp);
        out.max_raw_ethy_qp = int(a.max_raw_ethy_qp);
        out.max_mcast_grp = int(a.max_mcast_grp);
        out.max_mcast_qp_attach = int(a.max_mcast_qp_attach);
        out.max_total_mcast_qp_attach = int(a.max_total_mcast_qp_attach);
        out.max_ah = int(a.max_ah);
        out.max_fmr = int(a.max_fmr);
        out.max_map_per_fmr = int(a.max_map_per_fmr);
        out.max_srq = int(a.max_srq);
        out.max_srq_wr = int(a.max_srq_wr);
        out.max_srq_sge = int(a.max_srq_sge);
        out.max_pkeys = a.max_pkeys;
        out.local_ca_ack_delay = a.local_ca_ack_delay;
        out.phys_port_cnt = a.phys_port_cnt;
        0
    })
}
symver!(ibv_query_device);

/// `verbs_context::query_device_ex`: the classic attributes and the
/// extended ones a software device has (one port; no ODP, timestamps, TSO,
/// RSS, tag matching or device memory), written up to the caller's size.
unsafe extern "C" fn query_device_ex_op(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard_int(|| {
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        if unsafe { input.as_ref() }.is_some_and(|i| i.comp_mask != 0) {
            return libc::EINVAL;
        }
        // SAFETY: all zeros is a valid ibv_device_attr_ex.
        let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        let rc = unsafe { ibv_query_device(context, &mut ex.orig_attr) };
        if rc != 0 {
            return rc;
        }
        ex.phys_port_cnt_ex = ex.orig_attr.phys_port_cnt.into();
        // The classic flags, and the kernel's IB_UVERBS_DEVICE_FLUSH_GLOBAL,
        // _FLUSH_PERSISTENT and _ATOMIC_WRITE (bits 38 to 40), as rxe 6.2.
        ex.device_cap_flags_ex = u64::from(ex.orig_attr.device_cap_flags) | 0x7 << 38;
        // Every region is reached page by page as it is used: on-demand
        // paging is how a userspace device works anyway (V-22). Implicit
        // regions (the whole address space) are not offered.
        ex.odp_caps.general_caps = IBV_ODP_SUPPORT.into();
        let rc = IBV_ODP_SUPPORT_SEND
            | IBV_ODP_SUPPORT_RECV
            | IBV_ODP_SUPPORT_WRITE
            | IBV_ODP_SUPPORT_READ
            | IBV_ODP_SUPPORT_ATOMIC
            | IBV_ODP_SUPPORT_SRQ_RECV;
        ex.odp_caps.per_transport_caps = ibv_odp_caps__bindgen_ty_1 {
            rc_odp_caps: rc,
            uc_odp_caps: IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV,
            ud_odp_caps: IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV,
        };
        // SAFETY: the caller's struct is attr_size bytes.
        unsafe {
            ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            ptr::copy_nonoverlapping(
                ptr::from_ref(&ex).cast::<u8>(),
                attr.cast::<u8>(),
                attr_size.min(size_of::<ibv_device_attr_ex>()),
            );
        }
        0
    })
}

fn port_attr(p: &PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: p.state as ibv_port_state,
        max_mtu: p.max_mtu as ibv_mtu,
        active_mtu: p.active_mtu as ibv_mtu,
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: p.sm_sl,
        subnet_timeout: p.subnet_timeout,
        init_type_reply: p.init_type_reply,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state as u8,
        link_layer: p.link_layer as u8,
        flags: 0,
        port_cap_flags2: p.port_cap_flags2,
    }
}

/// `verbs_context::query_port`, which the `ibv_query_port` macro calls with
/// the size of the caller's struct: older programs have a shorter one,
/// newer ones a longer. The lesser of the sizes is written, the rest zeroed.
unsafe extern "C" fn query_port_op(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    guard_int(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else { return libc::EINVAL };
        if port_attr_out.is_null() || !port_is_valid(port_num.into()) {
            return libc::EINVAL;
        }
        let attr = match ctx.device.device.query_port(port_num) {
            Ok(p) => port_attr(&p),
            Err(e) => return e.errno(),
        };
        let ours = size_of::<ibv_port_attr>();
        // SAFETY: the caller's struct is port_attr_len bytes.
        unsafe {
            ptr::write_bytes(port_attr_out.cast::<u8>(), 0, port_attr_len);
            ptr::copy_nonoverlapping(ptr::from_ref(&attr).cast::<u8>(), port_attr_out.cast(), ours.min(port_attr_len));
        }
        0
    })
}

/// The export for programs built against libibverbs 1.1.8, whose
/// `struct ibv_port_attr` ends before `port_cap_flags2` (48 bytes).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut c_void) -> c_int {
    unsafe { query_port_op(context, port_num, port_attr.cast(), offset_of!(ibv_port_attr, port_cap_flags2)) }
}
symver!(ibv_query_port);

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard_neg(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let table_len = ctx.device.device.query_port(1).map_or(0, |p| p.gid_tbl_len as c_int);
        if gid.is_null() || !port_is_valid(port_num.into()) || index < 0 || index >= table_len {
            set_errno(libc::EINVAL);
            return -1;
        }
        // Entries past the addresses exist and are zero, as in rxe's table.
        let raw = ctx.gid(index as usize).map_or([0; 16], <[u8; 16]>::from);
        // SAFETY: the caller's GID.
        unsafe { (*gid).raw = raw };
        0
    })
}
symver!(ibv_query_gid);

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut __be16,
) -> c_int {
    guard_neg(|| {
        if unsafe { Ctx::from_ibv(context) }.is_none()
            || pkey.is_null()
            || !port_is_valid(port_num.into())
            || index != 0
        {
            set_errno(libc::EINVAL);
            return -1;
        }
        // The one P_Key, the default full-membership one.
        // SAFETY: the caller's value.
        unsafe { *pkey = 0xffff_u16.to_be() };
        0
    })
}
symver!(ibv_query_pkey);

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(context: *mut ibv_context, port_num: u8, pkey: __be16) -> c_int {
    if unsafe { Ctx::from_ibv(context) }.is_none() || !port_is_valid(port_num.into()) || u16::from_be(pkey) != 0xffff {
        set_errno(libc::ENOENT);
        return -1;
    }
    0
}
symver!(ibv_get_pkey_index);

fn gid_entry(ctx: &Ctx, index: usize) -> Option<ibv_gid_entry> {
    let gid = ctx.gid(index)?;
    let ifindex = ctx.device.device.netdev().and_then(|name| {
        let name = std::ffi::CString::new(name).ok()?;
        // SAFETY: a NUL-terminated name.
        Some(unsafe { libc::if_nametoindex(name.as_ptr()) })
    });
    Some(ibv_gid_entry {
        gid: ibv_gid { raw: gid.into() },
        gid_index: index as u32,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ifindex.unwrap_or(0),
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard_int(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else { return libc::EINVAL };
        if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() || !port_is_valid(port_num) {
            return libc::EINVAL;
        }
        match gid_entry(ctx, gid_index as usize) {
            // SAFETY: the caller's entry, at least as large as ours.
            Some(e) => unsafe { entry.write(e) },
            None => return libc::ENODATA,
        }
        0
    })
}
symver!(_ibv_query_gid_ex);

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else { return -(libc::EINVAL as isize) };
        if flags != 0 || entry_size < size_of::<ibv_gid_entry>() || (entries.is_null() && max_entries > 0) {
            return -(libc::EINVAL as isize);
        }
        // The table has no holes: its valid entries are its first ones.
        let valid = ctx.device.device.gid_table().len();
        if valid > max_entries {
            return -(libc::EINVAL as isize);
        }
        for index in 0..valid {
            let e = gid_entry(ctx, index).expect("an index below the table's length");
            // SAFETY: index < max_entries entries of entry_size bytes.
            unsafe { entries.cast::<u8>().add(index * entry_size).cast::<ibv_gid_entry>().write_unaligned(e) };
        }
        valid as isize
    })
}
symver!(_ibv_query_gid_table);

/// rdma-core's private call behind `ibv_devinfo`'s and pyverbs' GID types.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_int,
) -> c_int {
    guard_neg(|| {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if gid_type.is_null() || !port_is_valid(port_num.into()) || ctx.gid(index as usize).is_none() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's value.
        unsafe { *gid_type = GID_TYPE_SYSFS_ROCE_V2 };
        0
    })
}
symver!(ibv_query_gid_type);

/// Whether the program made `fd` non-blocking (`fcntl(fd, F_SETFL, O_NONBLOCK)`).
pub(crate) fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL reads flags only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

#[no_mangle]
pub unsafe extern "C-unwind" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    blocking(-1, move || {
        let Some(ctx) = (unsafe { Ctx::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return Some(-1);
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return Some(-1);
        }
        let fd = ctx.ctx.async_event_fd();
        loop {
            if let Some(found) = ctx.ctx.poll_async_event() {
                if let Some(converted) = async_event(ctx, found) {
                    // SAFETY: the caller's struct.
                    unsafe { event.write(converted) };
                    return Some(0);
                }
                // An event of an object already destroyed: nobody to tell.
                continue;
            }
            if is_nonblocking(fd) {
                set_errno(libc::EAGAIN);
                return Some(-1);
            }
            match wait_readable_slice(fd) {
                Some(true) => {}
                Some(false) => return Some(-1),
                None => return None,
            }
        }
    })
}
symver!(ibv_get_async_event);

/// The C object a context of `ctx`'s device registered under `id` in the
/// map `which` picks: the device's contexts share one engine and so one
/// queue of async events, and an event read through one context may be of
/// another's object.
fn object_of(ctx: &Ctx, which: fn(&Ctx) -> &Mutex<HashMap<u32, usize>>, id: u32) -> Option<usize> {
    let lookup = |c: &Ctx| which(c).lock().ok()?.get(&id).copied();
    lookup(ctx).or_else(|| {
        let open = ctx.device.open.lock().unwrap_or_else(|e| e.into_inner());
        open.as_ref()?.ctxs.iter().find_map(|&c| {
            // SAFETY: a Ctx stays listed in its device until ibv_close_device
            // unlists it, under this lock, before freeing it.
            lookup(unsafe { &*(c as *const Ctx) })
        })
    })
}

fn async_event(ctx: &Ctx, event: AsyncEvent) -> Option<ibv_async_event> {
    let qp = |qpn: u32| object_of(ctx, |c| &c.qps, qpn).map(|p| p as *mut ibv_qp);
    let (element, event_type) = match event {
        AsyncEvent::QpFatal { qpn } => (ibv_async_event__bindgen_ty_1 { qp: qp(qpn)? }, IBV_EVENT_QP_FATAL),
        AsyncEvent::QpRequestError { qpn } => (ibv_async_event__bindgen_ty_1 { qp: qp(qpn)? }, IBV_EVENT_QP_REQ_ERR),
        AsyncEvent::QpAccessError { qpn } => (ibv_async_event__bindgen_ty_1 { qp: qp(qpn)? }, IBV_EVENT_QP_ACCESS_ERR),
        AsyncEvent::SqDrained { qpn } => (ibv_async_event__bindgen_ty_1 { qp: qp(qpn)? }, IBV_EVENT_SQ_DRAINED),
        AsyncEvent::LastWqeReached { qpn } => {
            (ibv_async_event__bindgen_ty_1 { qp: qp(qpn)? }, IBV_EVENT_QP_LAST_WQE_REACHED)
        }
        AsyncEvent::SrqLimitReached { srq } => {
            let srq = object_of(ctx, |c| &c.srqs, srq).map(|p| p as *mut ibv_srq)?;
            (ibv_async_event__bindgen_ty_1 { srq }, IBV_EVENT_SRQ_LIMIT_REACHED)
        }
        AsyncEvent::PortActive { port } => {
            (ibv_async_event__bindgen_ty_1 { port_num: port.into() }, IBV_EVENT_PORT_ACTIVE)
        }
    };
    Some(ibv_async_event { element, event_type })
}

/// Nothing waits for async events to be acknowledged: destroying a QP or
/// SRQ drops its pending events instead.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}
symver!(ibv_ack_async_event);
