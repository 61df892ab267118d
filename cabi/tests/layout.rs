//! The offsets and sizes of rdma-core 44's structs that softroce's code and its callers rely on.
//! bindgen's own layout tests in `sys` check every field; these name the ones that matter, so a
//! regenerated `sys.rs` that moved them fails here with a readable message.

use std::mem::{offset_of, size_of};

use softroce_ibverbs::sys::*;

#[test]
fn ibv_device() {
    assert_eq!(size_of::<ibv_device>(), 664);
    assert_eq!(offset_of!(ibv_device, node_type), 16);
    assert_eq!(offset_of!(ibv_device, transport_type), 20);
    assert_eq!(offset_of!(ibv_device, name), 24);
    assert_eq!(offset_of!(ibv_device, ibdev_path), 408);
}

/// rdma-core v44's `struct verbs_device` (driver.h): providers read `ops` from the memory after
/// an `ibv_device` (`verbs_get_device(dev)->ops`) to tell their own devices.
#[test]
fn verbs_device() {
    use softroce_ibverbs::VerbsDevice;
    assert_eq!(size_of::<VerbsDevice>(), 712);
    assert_eq!(offset_of!(VerbsDevice, device), 0);
    assert_eq!(offset_of!(VerbsDevice, ops), size_of::<ibv_device>());
    assert_eq!(offset_of!(VerbsDevice, ops), 664);
    assert_eq!(offset_of!(VerbsDevice, refcount), 672);
    assert_eq!(offset_of!(VerbsDevice, entry), 680);
    assert_eq!(offset_of!(VerbsDevice, sysfs), 696);
    assert_eq!(offset_of!(VerbsDevice, core_support), 704);
}

#[test]
fn ibv_context() {
    assert_eq!(size_of::<ibv_context>(), 328);
    assert_eq!(offset_of!(ibv_context, device), 0);
    assert_eq!(offset_of!(ibv_context, ops), 8);
    assert_eq!(offset_of!(ibv_context, cmd_fd), 264);
    assert_eq!(offset_of!(ibv_context, async_fd), 268);
    assert_eq!(offset_of!(ibv_context, num_comp_vectors), 272);
    assert_eq!(offset_of!(ibv_context, mutex), 280);
    assert_eq!(offset_of!(ibv_context, abi_compat), 320);
}

/// The inline verbs call these through `ctx->ops` without a NULL check (alloc_mw has one).
#[test]
fn ibv_context_ops() {
    assert_eq!(size_of::<ibv_context_ops>(), 256);
    assert_eq!(offset_of!(ibv_context_ops, _compat_query_device), 0);
    assert_eq!(offset_of!(ibv_context_ops, _compat_query_port), 8);
    assert_eq!(offset_of!(ibv_context_ops, alloc_mw), 56);
    assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
    assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
    assert_eq!(offset_of!(ibv_context_ops, post_srq_recv), 160);
    assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
    assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);
}

/// Callers hold `&vctx->context` and reach the extended ops at negative offsets from it.
#[test]
fn verbs_context() {
    assert_eq!(size_of::<verbs_context>(), 648);
    let context = offset_of!(verbs_context, context);
    assert_eq!(context, 320);
    assert_eq!(context + size_of::<ibv_context>(), size_of::<verbs_context>(), "context is the last member");
    let below = |op: usize| context - op;
    assert_eq!(below(offset_of!(verbs_context, query_port)), 320);
    assert_eq!(below(offset_of!(verbs_context, advise_mr)), 312);
    assert_eq!(below(offset_of!(verbs_context, alloc_dm)), 256);
    assert_eq!(below(offset_of!(verbs_context, query_rt_values)), 128);
    assert_eq!(below(offset_of!(verbs_context, create_cq_ex)), 120);
    assert_eq!(below(offset_of!(verbs_context, query_device_ex)), 104);
    assert_eq!(below(offset_of!(verbs_context, open_qp)), 64);
    assert_eq!(below(offset_of!(verbs_context, create_qp_ex)), 56);
    assert_eq!(below(offset_of!(verbs_context, create_srq_ex)), 40);
    assert_eq!(below(offset_of!(verbs_context, sz)), 8);
}

#[test]
fn ibv_comp_channel() {
    assert_eq!(size_of::<ibv_comp_channel>(), 16);
    assert_eq!(offset_of!(ibv_comp_channel, fd), 8);
}

#[test]
fn ibv_mr() {
    assert_eq!(size_of::<ibv_mr>(), 48);
    assert_eq!(offset_of!(ibv_mr, addr), 16);
    assert_eq!(offset_of!(ibv_mr, length), 24);
    assert_eq!(offset_of!(ibv_mr, lkey), 36);
    assert_eq!(offset_of!(ibv_mr, rkey), 40);
}

#[test]
fn ibv_cq() {
    assert_eq!(size_of::<ibv_cq>(), 128);
    assert_eq!(offset_of!(ibv_cq, mutex), 32);
    assert_eq!(offset_of!(ibv_cq, cond), 72);
}

/// Applications read `status` and `wr_id` directly between the poll calls.
#[test]
fn ibv_cq_ex() {
    assert_eq!(size_of::<ibv_cq_ex>(), 288);
    assert_eq!(offset_of!(ibv_cq_ex, comp_mask), 128);
    assert_eq!(offset_of!(ibv_cq_ex, status), 132);
    assert_eq!(offset_of!(ibv_cq_ex, wr_id), 136);
    assert_eq!(offset_of!(ibv_cq_ex, start_poll), 144);
    // The ibv_cq prefix mirrors struct ibv_cq.
    assert_eq!(offset_of!(ibv_cq_ex, mutex), offset_of!(ibv_cq, mutex));
    assert_eq!(offset_of!(ibv_cq_ex, async_events_completed), offset_of!(ibv_cq, async_events_completed));
}

#[test]
fn ibv_qp() {
    assert_eq!(size_of::<ibv_qp>(), 160);
    assert_eq!(offset_of!(ibv_qp, qp_num), 52);
    assert_eq!(offset_of!(ibv_qp, state), 56);
}

/// v44 ends at `wr_atomic_write`; v45 appends `wr_flush` at 352.
#[test]
fn ibv_qp_ex() {
    assert_eq!(size_of::<ibv_qp_ex>(), 352);
    assert_eq!(offset_of!(ibv_qp_ex, qp_base), 0);
    assert_eq!(offset_of!(ibv_qp_ex, comp_mask), 160);
    assert_eq!(offset_of!(ibv_qp_ex, wr_id), 168);
    assert_eq!(offset_of!(ibv_qp_ex, wr_flags), 176);
    assert_eq!(offset_of!(ibv_qp_ex, wr_atomic_cmp_swp), 184);
    assert_eq!(offset_of!(ibv_qp_ex, wr_send), 240);
    assert_eq!(offset_of!(ibv_qp_ex, wr_start), 320);
    assert_eq!(offset_of!(ibv_qp_ex, wr_atomic_write), 344);
}

/// `___ibv_query_port` passes the size of its `ibv_port_attr`; the `ibv_query_port` export
/// fills rdma-core's private 48-byte `_compat_ibv_port_attr` (opaque in verbs.h), which is the
/// prefix of `ibv_port_attr` up to `port_cap_flags2`.
#[test]
fn port_attr() {
    assert_eq!(size_of::<ibv_port_attr>(), 52);
    assert_eq!(offset_of!(ibv_port_attr, flags), 47);
    assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);
    assert_eq!(size_of::<_compat_ibv_port_attr>(), 0, "declared, not defined, in verbs.h");
}

#[test]
fn enum_values() {
    assert_eq!(IBV_FORK_UNNEEDED, 2);
    assert_eq!(IBV_TRANSPORT_IB, 0);
    assert_eq!(IBV_LINK_LAYER_ETHERNET, 2);
}

/// `rdma_cm_id` as rdma-core 44's librdmacm lays it out: programs read `verbs`, `qp`, `route`,
/// `event` and the endpoint fields `rdma_create_ep` fills.
#[test]
fn rdma_cm_id() {
    use softroce_ibverbs::cm_sys::rdma_cm_id;
    assert_eq!(size_of::<rdma_cm_id>(), 416);
    assert_eq!(offset_of!(rdma_cm_id, verbs), 0);
    assert_eq!(offset_of!(rdma_cm_id, channel), 8);
    assert_eq!(offset_of!(rdma_cm_id, context), 16);
    assert_eq!(offset_of!(rdma_cm_id, qp), 24);
    assert_eq!(offset_of!(rdma_cm_id, route), 32);
    assert_eq!(offset_of!(rdma_cm_id, ps), 344);
    assert_eq!(offset_of!(rdma_cm_id, port_num), 348);
    assert_eq!(offset_of!(rdma_cm_id, event), 352);
    assert_eq!(offset_of!(rdma_cm_id, send_cq), 368);
    assert_eq!(offset_of!(rdma_cm_id, pd), 400);
    assert_eq!(offset_of!(rdma_cm_id, qp_type), 408);
}

#[test]
fn rdma_route_and_addr() {
    use softroce_ibverbs::cm_sys::{rdma_addr, rdma_route};
    assert_eq!(size_of::<rdma_addr>(), 296);
    assert_eq!(offset_of!(rdma_addr, __bindgen_anon_2), 128, "dst_addr");
    assert_eq!(offset_of!(rdma_addr, addr), 256, "ibaddr: sgid, dgid, pkey");
    assert_eq!(size_of::<rdma_route>(), 312);
    assert_eq!(offset_of!(rdma_route, path_rec), 296);
    assert_eq!(offset_of!(rdma_route, num_paths), 304);
}

#[test]
fn rdma_cm_event() {
    use softroce_ibverbs::cm_sys::{rdma_cm_event, rdma_conn_param, rdma_event_channel, rdma_ud_param};
    assert_eq!(size_of::<rdma_cm_event>(), 80);
    assert_eq!(offset_of!(rdma_cm_event, id), 0);
    assert_eq!(offset_of!(rdma_cm_event, listen_id), 8);
    assert_eq!(offset_of!(rdma_cm_event, event), 16);
    assert_eq!(offset_of!(rdma_cm_event, status), 20);
    assert_eq!(offset_of!(rdma_cm_event, param), 24);
    assert_eq!(size_of::<rdma_conn_param>(), 24);
    assert_eq!(offset_of!(rdma_conn_param, private_data_len), 8);
    assert_eq!(offset_of!(rdma_conn_param, qp_num), 16);
    assert_eq!(size_of::<rdma_ud_param>(), 56);
    assert_eq!(offset_of!(rdma_ud_param, ah_attr), 16);
    assert_eq!(offset_of!(rdma_ud_param, qp_num), 48);
    assert_eq!(offset_of!(rdma_ud_param, qkey), 52);
    assert_eq!(size_of::<rdma_event_channel>(), 4);
}

#[test]
fn rdma_addrinfo_and_path_rec() {
    use softroce_ibverbs::cm_sys::{ibv_sa_path_rec, rdma_addrinfo};
    assert_eq!(size_of::<rdma_addrinfo>(), 96);
    assert_eq!(offset_of!(rdma_addrinfo, ai_src_len), 16);
    assert_eq!(offset_of!(rdma_addrinfo, ai_src_addr), 24);
    assert_eq!(offset_of!(rdma_addrinfo, ai_dst_addr), 32);
    assert_eq!(offset_of!(rdma_addrinfo, ai_route_len), 56);
    assert_eq!(offset_of!(rdma_addrinfo, ai_next), 88);
    assert_eq!(size_of::<ibv_sa_path_rec>(), 64);
    assert_eq!(offset_of!(ibv_sa_path_rec, dgid), 0);
    assert_eq!(offset_of!(ibv_sa_path_rec, sgid), 16);
}
