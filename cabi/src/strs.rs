//! The names libibverbs gives enum values (rdma-core's `libibverbs/enum_strs.c`): static strings,
//! `"unknown"` outside each table, never NULL. Programs print them in error paths
//! (`ibv_wc_status_str(wc.status)`), and bindings wrap them as C strings without a NULL check.

use std::ffi::CStr;
use std::os::raw::c_char;

use crate::sys::{
    ibv_event_type, ibv_node_type, ibv_port_state, ibv_wc_status, IBV_EVENT_CQ_ERR, IBV_NODE_CA, IBV_PORT_NOP,
    IBV_WC_SUCCESS,
};

/// The entry of `table`, whose first entry names `first`, for `value`; "unknown" outside it.
fn name(table: &[&'static CStr], first: i64, value: i64) -> *const c_char {
    let entry = usize::try_from(value - first).ok().and_then(|i| table.get(i));
    entry.copied().unwrap_or(c"unknown").as_ptr()
}

/// From `IBV_NODE_CA` (1) to `IBV_NODE_UNSPECIFIED` (7).
const NODE_TYPES: [&CStr; 7] = [
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

/// From `IBV_PORT_NOP` (0) to `IBV_PORT_ACTIVE_DEFER` (5).
const PORT_STATES: [&CStr; 6] = [c"no state change (NOP)", c"down", c"init", c"armed", c"active", c"active defer"];

/// From `IBV_EVENT_CQ_ERR` (0) to `IBV_EVENT_WQ_FATAL` (19).
const EVENT_TYPES: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

/// From `IBV_WC_SUCCESS` (0) to `IBV_WC_TM_RNDV_INCOMPLETE` (23).
const WC_STATUSES: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: ibv_node_type) -> *const c_char {
    name(&NODE_TYPES, IBV_NODE_CA.into(), node_type.into())
}
symver!(ibv_node_type_str);

#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: ibv_port_state) -> *const c_char {
    name(&PORT_STATES, IBV_PORT_NOP.into(), port_state.into())
}
symver!(ibv_port_state_str);

#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: ibv_event_type) -> *const c_char {
    name(&EVENT_TYPES, IBV_EVENT_CQ_ERR.into(), event.into())
}
symver!(ibv_event_type_str);

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    name(&WC_STATUSES, IBV_WC_SUCCESS.into(), status.into())
}
symver!(ibv_wc_status_str);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{IBV_EVENT_WQ_FATAL, IBV_NODE_UNSPECIFIED, IBV_PORT_ACTIVE_DEFER, IBV_WC_TM_RNDV_INCOMPLETE};

    fn text(p: *const c_char) -> &'static str {
        assert!(!p.is_null());
        // SAFETY: every pointer these functions return is a 'static C string.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn the_tables_end_where_the_enums_do() {
        assert_eq!(text(ibv_node_type_str(IBV_NODE_UNSPECIFIED)), "unspecified");
        assert_eq!(text(ibv_port_state_str(IBV_PORT_ACTIVE_DEFER)), "active defer");
        assert_eq!(text(ibv_event_type_str(IBV_EVENT_WQ_FATAL)), "WQ fatal");
        assert_eq!(text(ibv_wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE)), "TM software rendezvous");
    }

    #[test]
    fn outside_a_table_is_unknown_never_null() {
        assert_eq!(text(ibv_node_type_str(0)), "unknown");
        assert_eq!(text(ibv_node_type_str(-1)), "unknown");
        assert_eq!(text(ibv_node_type_str(IBV_NODE_UNSPECIFIED + 1)), "unknown");
        assert_eq!(text(ibv_port_state_str(IBV_PORT_ACTIVE_DEFER + 1)), "unknown");
        assert_eq!(text(ibv_port_state_str(u32::MAX)), "unknown");
        assert_eq!(text(ibv_event_type_str(IBV_EVENT_WQ_FATAL + 1)), "unknown");
        assert_eq!(text(ibv_wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE + 1)), "unknown");
        assert_eq!(text(ibv_wc_status_str(u32::MAX)), "unknown");
    }

    #[test]
    fn a_few_by_name() {
        assert_eq!(text(ibv_node_type_str(IBV_NODE_CA)), "InfiniBand channel adapter");
        assert_eq!(text(ibv_port_state_str(crate::sys::IBV_PORT_ACTIVE)), "active");
        assert_eq!(text(ibv_event_type_str(crate::sys::IBV_EVENT_SRQ_LIMIT_REACHED)), "SRQ limit reached");
        assert_eq!(text(ibv_wc_status_str(crate::sys::IBV_WC_RETRY_EXC_ERR)), "transport retry counter exceeded");
    }
}
