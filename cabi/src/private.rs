//! The `IBVERBS_PRIVATE_34` symbols: rdma-core's interface to its provider drivers.
//!
//! No application calls these, but they must exist. Every program checked is linked with
//! `BIND_NOW`, so each symbol it or its libraries import is resolved when it loads, and a missing
//! one aborts the load. perftest has `DT_NEEDED` on `libmlx5.so.1` and `libefa.so.1`, which import
//! 62 of them, and `ibv_devinfo` and pyverbs import `ibv_query_gid_type`. The constructors of
//! those providers do call `verbs_register_driver_34`, which accepts the driver and does nothing:
//! devices come from softroce, never from a provider.
//!
//! So these stay stubs. They fail the way their rdma-core counterparts do: pointer returns are
//! NULL with errno `EOPNOTSUPP`; `ibv_cmd_*` and `execute_ioctl` return the errno value; the
//! others return -1 and set errno. `ibv_query_gid_type`, which `ibv_devinfo` and pyverbs
//! need answered, is implemented with the device queries. Driver-internal structs (`verbs_mr`, the kern-abi
//! command buffers, …) appear as `c_void`. `__verbs_log` and `ibv_read_ibdev_sysfs_file` are
//! variadic in C; on x86-64 a callee that ignores the variadic arguments is compatible.
//!
//! The signatures are those of rdma-core v44's `libibverbs/driver.h` and `cmd_ioctl.h`.

#![allow(clippy::missing_safety_doc)] // The contract of each function is rdma-core's.

use std::os::raw::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::AtomicBool;

use crate::errno::{unsupported_errno, unsupported_neg, unsupported_null};
use crate::sys::{
    ib_uverbs_advise_mr_advice, ibv_ah, ibv_ah_attr, ibv_alloc_dm_attr, ibv_comp_channel, ibv_context,
    ibv_counters_init_attr, ibv_cq, ibv_cq_init_attr_ex, ibv_device, ibv_device_attr_ex, ibv_flow,
    ibv_flow_action_esp_attr, ibv_flow_attr, ibv_gid, ibv_modify_cq_attr, ibv_mw, ibv_mw_type, ibv_pd, ibv_port_attr,
    ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_qp_open_attr, ibv_query_device_ex_input,
    ibv_recv_wr, ibv_rwq_ind_table, ibv_rwq_ind_table_init_attr, ibv_send_wr, ibv_sge, ibv_srq, ibv_srq_attr,
    ibv_srq_init_attr, ibv_srq_init_attr_ex, ibv_wc, ibv_wq, ibv_wq_attr, ibv_wq_init_attr, ibv_xrcd_init_attr,
    verbs_context,
};

#[allow(non_camel_case_types)]
mod opaque {
    //! driver.h types whose layout these stubs never need.
    use std::os::raw::c_void;

    pub type verbs_counters = c_void;
    pub type verbs_cq = c_void;
    pub type verbs_device_ops = c_void;
    pub type verbs_context_ops = c_void;
    pub type verbs_dm = c_void;
    pub type verbs_flow_action = c_void;
    pub type verbs_mr = c_void;
    pub type verbs_qp = c_void;
    pub type verbs_srq = c_void;
    pub type verbs_sysfs_dev = c_void;
    pub type verbs_xrcd = c_void;
    /// `struct ibv_command_buffer` (cmd_ioctl.h).
    pub type ibv_command_buffer = c_void;
    /// A kern-abi command: `struct ibv_alloc_pd`, `struct ibv_create_qp`, ….
    pub type Cmd = c_void;
    /// A kernel response: `struct ib_uverbs_alloc_pd_resp`, ….
    pub type Resp = c_void;
}
use opaque::*;

#[no_mangle]
pub unsafe extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut ibv_command_buffer) -> c_uint {
    // Sizes the caller's attribute array; with no linked buffer that is num_attrs.
    num_attrs
}
symver!(__ioctl_final_num_attrs);

#[no_mangle]
pub unsafe extern "C" fn __verbs_log(_ctx: *mut verbs_context, _level: u32, _fmt: *const c_char) {}
symver!(__verbs_log);

#[no_mangle]
pub unsafe extern "C" fn _verbs_init_and_alloc_context(
    _device: *mut ibv_device,
    _cmd_fd: c_int,
    _alloc_size: usize,
    _context_offset: *mut verbs_context,
    _driver_id: u32,
) -> *mut c_void {
    unsupported_null()
}
symver!(_verbs_init_and_alloc_context);

#[no_mangle]
pub unsafe extern "C" fn execute_ioctl(_context: *mut ibv_context, _cmd: *mut ibv_command_buffer) -> c_int {
    unsupported_errno()
}
symver!(execute_ioctl);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_advise_mr(
    _pd: *mut ibv_pd,
    _advice: ib_uverbs_advise_mr_advice,
    _flags: u32,
    _sg_list: *mut ibv_sge,
    _num_sge: u32,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_advise_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_alloc_dm(
    _ctx: *mut ibv_context,
    _dm_attr: *const ibv_alloc_dm_attr,
    _dm: *mut verbs_dm,
    _link: *mut ibv_command_buffer,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_alloc_dm);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_alloc_mw(
    _pd: *mut ibv_pd,
    _type: ibv_mw_type,
    _mw: *mut ibv_mw,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_alloc_mw);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_alloc_pd(
    _context: *mut ibv_context,
    _pd: *mut ibv_pd,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_alloc_pd);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_attach_mcast);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_close_xrcd(_xrcd: *mut verbs_xrcd) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_close_xrcd);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_ah(
    _pd: *mut ibv_pd,
    _ah: *mut ibv_ah,
    _attr: *mut ibv_ah_attr,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_ah);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_counters(
    _context: *mut ibv_context,
    _init_attr: *mut ibv_counters_init_attr,
    _vcounters: *mut verbs_counters,
    _link: *mut ibv_command_buffer,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_counters);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_cq(
    _context: *mut ibv_context,
    _cqe: c_int,
    _channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
    _cq: *mut ibv_cq,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_cq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_cq_ex(
    _context: *mut ibv_context,
    _cq_attr: *const ibv_cq_init_attr_ex,
    _cq: *mut verbs_cq,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
    _cmd_flags: u32,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_cq_ex);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_flow(
    _qp: *mut ibv_qp,
    _flow_id: *mut ibv_flow,
    _flow_attr: *mut ibv_flow_attr,
    _ucmd: *mut c_void,
    _ucmd_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_flow);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_flow_action_esp(
    _ctx: *mut ibv_context,
    _attr: *mut ibv_flow_action_esp_attr,
    _flow_action: *mut verbs_flow_action,
    _driver: *mut ibv_command_buffer,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_flow_action_esp);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_qp(
    _pd: *mut ibv_pd,
    _qp: *mut ibv_qp,
    _attr: *mut ibv_qp_init_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_qp);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_qp_ex(
    _context: *mut ibv_context,
    _qp: *mut verbs_qp,
    _attr_ex: *mut ibv_qp_init_attr_ex,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_qp_ex);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_qp_ex2(
    _context: *mut ibv_context,
    _qp: *mut verbs_qp,
    _qp_attr: *mut ibv_qp_init_attr_ex,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_qp_ex2);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_rwq_ind_table(
    _context: *mut ibv_context,
    _init_attr: *mut ibv_rwq_ind_table_init_attr,
    _rwq_ind_table: *mut ibv_rwq_ind_table,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_rwq_ind_table);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_srq(
    _pd: *mut ibv_pd,
    _srq: *mut ibv_srq,
    _attr: *mut ibv_srq_init_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_srq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_srq_ex(
    _context: *mut ibv_context,
    _srq: *mut verbs_srq,
    _attr_ex: *mut ibv_srq_init_attr_ex,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_srq_ex);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_create_wq(
    _context: *mut ibv_context,
    _wq_init_attr: *mut ibv_wq_init_attr,
    _wq: *mut ibv_wq,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_create_wq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_dealloc_mw(_mw: *mut ibv_mw) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_dealloc_mw);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_dealloc_pd(_pd: *mut ibv_pd) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_dealloc_pd);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_dereg_mr(_vmr: *mut verbs_mr) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_dereg_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_ah(_ah: *mut ibv_ah) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_ah);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_counters(_vcounters: *mut verbs_counters) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_counters);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_cq(_cq: *mut ibv_cq) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_cq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_flow(_flow_id: *mut ibv_flow) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_flow);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_flow_action(_action: *mut verbs_flow_action) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_flow_action);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_qp(_qp: *mut ibv_qp) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_qp);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_rwq_ind_table(_rwq_ind_table: *mut ibv_rwq_ind_table) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_rwq_ind_table);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_srq(_srq: *mut ibv_srq) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_srq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_destroy_wq(_wq: *mut ibv_wq) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_destroy_wq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_detach_mcast);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_free_dm(_dm: *mut verbs_dm) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_free_dm);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_get_context(
    _context: *mut verbs_context,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_get_context);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_modify_cq(
    _cq: *mut ibv_cq,
    _attr: *mut ibv_modify_cq_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_modify_cq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_modify_flow_action_esp(
    _flow_action: *mut verbs_flow_action,
    _attr: *mut ibv_flow_action_esp_attr,
    _driver: *mut ibv_command_buffer,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_modify_flow_action_esp);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_modify_qp(
    _qp: *mut ibv_qp,
    _attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    _cmd: *mut Cmd,
    _cmd_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_modify_qp);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_modify_qp_ex(
    _qp: *mut ibv_qp,
    _attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_modify_qp_ex);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_modify_srq(
    _srq: *mut ibv_srq,
    _srq_attr: *mut ibv_srq_attr,
    _srq_attr_mask: c_int,
    _cmd: *mut Cmd,
    _cmd_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_modify_srq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_modify_wq(
    _wq: *mut ibv_wq,
    _attr: *mut ibv_wq_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_modify_wq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_open_qp(
    _context: *mut ibv_context,
    _qp: *mut verbs_qp,
    _vqp_sz: c_int,
    _attr: *mut ibv_qp_open_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_open_qp);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_open_xrcd(
    _context: *mut ibv_context,
    _xrcd: *mut verbs_xrcd,
    _vxrcd_size: c_int,
    _attr: *mut ibv_xrcd_init_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_open_xrcd);

/// Returns a count, so failure is -1 as in rdma-core.
#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_poll_cq(_cq: *mut ibv_cq, _ne: c_int, _wc: *mut ibv_wc) -> c_int {
    unsupported_neg()
}
symver!(ibv_cmd_poll_cq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_post_recv(
    _ibqp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    if !bad_wr.is_null() {
        *bad_wr = wr;
    }
    unsupported_errno()
}
symver!(ibv_cmd_post_recv);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_post_send(
    _ibqp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    if !bad_wr.is_null() {
        *bad_wr = wr;
    }
    unsupported_errno()
}
symver!(ibv_cmd_post_send);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_post_srq_recv(
    _srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    if !bad_wr.is_null() {
        *bad_wr = wr;
    }
    unsupported_errno()
}
symver!(ibv_cmd_post_srq_recv);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_query_context(_ctx: *mut ibv_context, _driver: *mut ibv_command_buffer) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_query_context);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_query_device_any(
    _context: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    _attr: *mut ibv_device_attr_ex,
    _attr_size: usize,
    _resp: *mut Resp,
    _resp_size: *mut usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_query_device_any);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_query_mr(_pd: *mut ibv_pd, _vmr: *mut verbs_mr, _mr_handle: u32) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_query_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_query_port(
    _context: *mut ibv_context,
    _port_num: u8,
    _port_attr: *mut ibv_port_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_query_port);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_query_qp(
    _qp: *mut ibv_qp,
    _qp_attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    _qp_init_attr: *mut ibv_qp_init_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_query_qp);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_query_srq(
    _srq: *mut ibv_srq,
    _srq_attr: *mut ibv_srq_attr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_query_srq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_read_counters(
    _vcounters: *mut verbs_counters,
    _counters_value: *mut u64,
    _ncounters: u32,
    _flags: u32,
    _link: *mut ibv_command_buffer,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_read_counters);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_reg_dm_mr(
    _pd: *mut ibv_pd,
    _dm: *mut verbs_dm,
    _offset: u64,
    _length: usize,
    _access: c_uint,
    _vmr: *mut verbs_mr,
    _link: *mut ibv_command_buffer,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_reg_dm_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
    _vmr: *mut verbs_mr,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_reg_dmabuf_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_reg_mr(
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _hca_va: u64,
    _access: c_int,
    _vmr: *mut verbs_mr,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_reg_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_req_notify_cq(_cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_req_notify_cq);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_rereg_mr(
    _vmr: *mut verbs_mr,
    _flags: u32,
    _addr: *mut c_void,
    _length: usize,
    _hca_va: u64,
    _access: c_int,
    _pd: *mut ibv_pd,
    _cmd: *mut Cmd,
    _cmd_sz: usize,
    _resp: *mut Resp,
    _resp_sz: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_rereg_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_resize_cq(
    _cq: *mut ibv_cq,
    _cqe: c_int,
    _cmd: *mut Cmd,
    _cmd_size: usize,
    _resp: *mut Resp,
    _resp_size: usize,
) -> c_int {
    unsupported_errno()
}
symver!(ibv_cmd_resize_cq);

/// Returns a byte count, so failure is -1 as in rdma-core.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_ibdev_sysfs_file(
    _buf: *mut c_char,
    _size: usize,
    _sysfs_dev: *mut verbs_sysfs_dev,
    _fnfmt: *const c_char,
) -> c_int {
    unsupported_neg()
}
symver!(ibv_read_ibdev_sysfs_file);

/// A `bool` that libmlx5 reads (a data import, `R_X86_64_GLOB_DAT`): rdma-core sets it from
/// `RDMAV_ALLOW_DISASSOC_DESTROY`. Atomic because C may write it; same layout as `bool`.
#[no_mangle]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);
symver!(verbs_allow_disassociate_destroy);

#[no_mangle]
pub unsafe extern "C" fn verbs_init_cq(
    _cq: *mut ibv_cq,
    _context: *mut ibv_context,
    _channel: *mut ibv_comp_channel,
    _cq_context: *mut c_void,
) {
}
symver!(verbs_init_cq);

#[no_mangle]
pub unsafe extern "C" fn verbs_open_device(_device: *mut ibv_device, _private_data: *mut c_void) -> *mut ibv_context {
    unsupported_null()
}
symver!(verbs_open_device);

/// Called by each provider library's constructor; softroce has no use for providers.
#[no_mangle]
pub unsafe extern "C" fn verbs_register_driver_34(_ops: *const verbs_device_ops) {}
symver!(verbs_register_driver_34);

#[no_mangle]
pub unsafe extern "C" fn verbs_set_ops(_vctx: *mut verbs_context, _ops: *const verbs_context_ops) {}
symver!(verbs_set_ops);

#[no_mangle]
pub unsafe extern "C" fn verbs_uninit_context(_context: *mut verbs_context) {}
symver!(verbs_uninit_context);
