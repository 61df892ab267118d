//! The public `IBVERBS_1.x` functions softroce does not implement yet.
//!
//! Each one exists so that programs load, and fails as its rdma-core counterpart would:
//! constructors return NULL with errno `EOPNOTSUPP`; functions documented to return an errno
//! value return `EOPNOTSUPP` (also left in errno); those returning -1 set errno. Each stub stands
//! alone, sorted by name: implementing one means moving it, with its `symver!` line, to the module
//! that implements it. Signatures are those of rdma-core v44's `verbs.h` (kernel-ABI structs of
//! `marshall.h` and `sa.h`'s `ibv_sa_path_rec` as `c_void`).

#![allow(clippy::missing_safety_doc)] // The contract of each function is rdma-core's.

use std::os::raw::{c_char, c_int, c_void};

use crate::errno::{set_errno, unsupported_errno, unsupported_neg, unsupported_null};
use crate::sys::{
    ibv_ah_attr, ibv_context, ibv_dm, ibv_ece, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_rate, ibv_wr_opcode,
    IBV_RATE_MAX,
};

/// `src` is a `struct ib_uverbs_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(_dst: *mut ibv_ah_attr, _src: *mut c_void) {}
symver!(ibv_copy_ah_attr_from_kern);

/// `dst` is a `struct ibv_sa_path_rec`, `src` a `struct ib_user_path_rec`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *mut c_void) {}
symver!(ibv_copy_path_rec_from_kern);

/// `dst` is a `struct ib_user_path_rec`, `src` a `struct ibv_sa_path_rec`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(_dst: *mut c_void, _src: *mut c_void) {}
symver!(ibv_copy_path_rec_to_kern);

/// `src` is a `struct ib_uverbs_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(_dst: *mut ibv_qp_attr, _src: *mut c_void) {}
symver!(ibv_copy_qp_attr_from_kern);

#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    unsupported_null()
}
symver!(ibv_import_device);

#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(_context: *mut ibv_context, _dm_handle: u32) -> *mut ibv_dm {
    unsupported_null()
}
symver!(ibv_import_dm);

#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _mr_handle: u32) -> *mut ibv_mr {
    unsupported_null()
}
symver!(ibv_import_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(_context: *mut ibv_context, _pd_handle: u32) -> *mut ibv_pd {
    unsupported_null()
}
symver!(ibv_import_pd);

#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    unsupported_errno()
}
symver!(ibv_query_ece);

/// Returns the guarantees given (`IBV_QUERY_QP_DATA_IN_ORDER_*` bits), so "unsupported" is 0.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: ibv_wr_opcode, _flags: u32) -> c_int {
    0
}
symver!(ibv_query_qp_data_in_order);

/// -1 is rdma-core's answer for an unknown rate.
#[no_mangle]
pub unsafe extern "C" fn ibv_rate_to_mbps(_rate: ibv_rate) -> c_int {
    unsupported_neg()
}
symver!(ibv_rate_to_mbps);

/// -1 is rdma-core's answer for an unknown rate.
#[no_mangle]
pub unsafe extern "C" fn ibv_rate_to_mult(_rate: ibv_rate) -> c_int {
    unsupported_neg()
}
symver!(ibv_rate_to_mult);

#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    unsupported_neg()
}
symver!(ibv_read_sysfs_file);

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    unsupported_null()
}
symver!(ibv_reg_dmabuf_mr);

/// `eth_mac` is `uint8_t[6]`.
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    _context: *mut ibv_context,
    _attr: *mut ibv_ah_attr,
    _eth_mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    unsupported_neg()
}
symver!(ibv_resolve_eth_l2_from_gid);

#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    unsupported_errno()
}
symver!(ibv_set_ece);

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut ibv_dm) {}
symver!(ibv_unimport_dm);

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}
symver!(ibv_unimport_mr);

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}
symver!(ibv_unimport_pd);

/// `IBV_RATE_MAX` (0) is rdma-core's answer for an unknown rate.
#[no_mangle]
pub unsafe extern "C" fn mbps_to_ibv_rate(_mbps: c_int) -> ibv_rate {
    set_errno(libc::EOPNOTSUPP);
    IBV_RATE_MAX
}
symver!(mbps_to_ibv_rate);

/// `IBV_RATE_MAX` (0) is rdma-core's answer for an unknown rate.
#[no_mangle]
pub unsafe extern "C" fn mult_to_ibv_rate(_mult: c_int) -> ibv_rate {
    set_errno(libc::EOPNOTSUPP);
    IBV_RATE_MAX
}
symver!(mult_to_ibv_rate);
