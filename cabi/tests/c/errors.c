/* Bad input to softroce's libibverbs.so.1 gets the errno or completion
 * status libibverbs documents, never a crash: wrong attribute masks and
 * transitions, unsupported flags and types, invalid keys, SGEs outside a
 * region, destroys of busy objects, out-of-range queries, a non-blocking
 * channel with nothing to read. */
#include <fcntl.h>
#include "common.h"

int main(void)
{
    struct ibv_context *ctx = open_first_device();
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd != NULL, "ibv_alloc_pd");
    static char buf[8192] __attribute__((aligned(64)));

    /* Memory registration. */
    CHECK_NULL_ERRNO(ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE), EINVAL);
    CHECK_NULL_ERRNO(ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED), EOPNOTSUPP);
    CHECK_NULL_ERRNO(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    CHECK(mr != NULL && mr->addr == buf && mr->length == sizeof buf, "ibv_reg_mr");
    /* A relaxed-ordering hint (perftest sets it at run time) is accepted. */
    struct ibv_mr *relaxed = ibv_reg_mr(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
    CHECK(relaxed != NULL, "ibv_reg_mr with IBV_ACCESS_RELAXED_ORDERING");
    CHECK_RC(ibv_dereg_mr(relaxed), 0);
    /* Re-registration: flags libibverbs refuses, a domain it is not. */
    CHECK(ibv_rereg_mr(mr, 8, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "rereg: unknown flag");
    CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT,
          "rereg: new memory of no length");
    CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_CMD &&
              errno == EINVAL,
          "rereg: remote write without local write");
    CHECK_RC(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE), 0);
    /* Windows: types 1 and 2 only; advice for on-demand regions only. */
    CHECK_NULL_ERRNO(ibv_alloc_mw(pd, 3), EINVAL);
    struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
    CHECK(mw != NULL && mw->type == IBV_MW_TYPE_1, "ibv_alloc_mw type 1");
    CHECK(ibv_dealloc_pd(pd) == EBUSY, "a PD with a window is busy");
    CHECK_RC(ibv_dealloc_mw(mw), 0);
    struct ibv_sge not_on_demand = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
    CHECK_RC(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &not_on_demand, 1), EINVAL);

    /* Queries out of range. */
    union ibv_gid gid;
    struct ibv_port_attr port;
    CHECK(ibv_query_gid(ctx, 1, 100000, &gid) == -1, "ibv_query_gid beyond the table");
    CHECK(ibv_query_gid(ctx, 2, 0, &gid) == -1, "ibv_query_gid of port 2");
    CHECK(ibv_query_port(ctx, 2, &port) != 0, "ibv_query_port of port 2");
    CHECK_RC(ibv_query_port(ctx, 1, &port), 0);
    CHECK(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET, "port 1 active, Ethernet");
    __be16 pkey;
    CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == 0xffff, "P_Key 0 is the default");

    /* CQs and channels. */
    CHECK_NULL_ERRNO(ibv_create_cq(ctx, 0, NULL, NULL, 0), EINVAL);
    CHECK_NULL_ERRNO(ibv_create_cq(ctx, 16, NULL, NULL, 5), EINVAL);
    struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
    CHECK(channel != NULL, "ibv_create_comp_channel");
    struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, channel, 0);
    CHECK(cq != NULL, "ibv_create_cq");
    CHECK(ibv_destroy_comp_channel(channel) != 0 && errno == EBUSY, "a channel with a CQ is busy");
    fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    errno = 0;
    CHECK(ibv_get_cq_event(channel, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN, "a non-blocking channel: EAGAIN");
    CHECK_RC(ibv_resize_cq(cq, 0), EINVAL);
    CHECK(ibv_resize_cq(cq, 128) == 0 && cq->cqe == 128, "ibv_resize_cq to 128");

    /* QPs: types, capacities, transitions, masks. */
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2}};
    struct ibv_qp_init_attr raw = init;
    raw.qp_type = IBV_QPT_RAW_PACKET;
    CHECK_NULL_ERRNO(ibv_create_qp(pd, &raw), EOPNOTSUPP);
    struct ibv_qp_init_attr huge = init;
    huge.cap.max_send_wr = 1u << 30;
    CHECK_NULL_ERRNO(ibv_create_qp(pd, &huge), EINVAL);
    struct ibv_qp *a = ibv_create_qp(pd, &init);
    struct ibv_qp *b = ibv_create_qp(pd, &init);
    CHECK(a && b && a->qp_num != b->qp_num && a->state == IBV_QPS_RESET, "two QPs in RESET");
    /* Multicast: UD QPs and multicast GIDs only (::ffff:239.77.0.9 here). */
    union ibv_gid mgid = {.raw = {[10] = 0xff, [11] = 0xff, [12] = 239, [13] = 77, [15] = 9}};
    CHECK_RC(ibv_attach_mcast(a, &mgid, 0), EINVAL); /* an RC QP */
    struct ibv_qp_init_attr ud_init = init;
    ud_init.qp_type = IBV_QPT_UD;
    struct ibv_qp *u = ibv_create_qp(pd, &ud_init);
    CHECK(u != NULL, "a UD QP");
    CHECK_RC(ibv_detach_mcast(u, &mgid, 0), EINVAL); /* not attached */
    CHECK_RC(ibv_attach_mcast(u, &mgid, 0), 0);
    CHECK_RC(ibv_detach_mcast(u, &mgid, 0), 0);
    union ibv_gid unicast = mgid;
    unicast.raw[12] = 127;
    CHECK_RC(ibv_attach_mcast(u, &unicast, 0), EINVAL);
    CHECK_RC(ibv_destroy_qp(u), 0);

    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RTR};
    CHECK_RC(ibv_modify_qp(a, &attr, IBV_QP_STATE), EINVAL); /* RESET -> RTR */
    attr.qp_state = IBV_QPS_INIT;
    CHECK_RC(ibv_modify_qp(a, &attr, IBV_QP_STATE), EINVAL); /* INIT without its required attributes */
    CHECK(a->state == IBV_QPS_RESET, "a refused modify leaves the state");

    /* A post to a QP in RESET is refused and names the request. */
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED};
    struct ibv_send_wr *bad = NULL;
    CHECK(ibv_post_send(a, &wr, &bad) != 0 && bad == &wr, "post_send in RESET fails at the request");

    /* RTR without a GRH: RoCE has no LIDs (rxe: EINVAL). */
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = 0};
    CHECK_RC(ibv_modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = b->qp_num,
                                .max_dest_rd_atomic = 1, .min_rnr_timer = 12, .ah_attr = {.dlid = 1, .port_num = 1}};
    CHECK_RC(ibv_modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
             EINVAL);

    /* Connected: A may not write into B's region with a wrong R_Key, and
     * SGEs must lie in a region of the QP's PD. */
    CHECK_RC(connect_rc(a, b->qp_num, 0), 0);
    CHECK_RC(connect_rc(b, a->qp_num, IBV_ACCESS_REMOTE_WRITE), 0);
    CHECK(a->state == IBV_QPS_RTS && b->state == IBV_QPS_RTS, "both QPs in RTS (the struct follows)");

    struct ibv_wc wc;
    struct ibv_sge outside = {.addr = (uintptr_t)buf + sizeof buf - 8, .length = 64, .lkey = mr->lkey};
    struct ibv_send_wr write = {.wr_id = 2, .sg_list = &outside, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                                .send_flags = IBV_SEND_SIGNALED,
                                .wr.rdma = {.remote_addr = (uintptr_t)buf, .rkey = mr->rkey}};
    CHECK_RC(ibv_post_send(a, &write, &bad), 0);
    CHECK(wait_wc(cq, &wc) == 1 && wc.wr_id == 2 && wc.status == IBV_WC_LOC_PROT_ERR,
          "an SGE past the region: LOC_PROT_ERR (got status %d)", wc.status);

    /* A fresh pair for the remote error. */
    struct ibv_qp *c = ibv_create_qp(pd, &init);
    struct ibv_qp *d = ibv_create_qp(pd, &init);
    CHECK(c && d, "two more QPs");
    CHECK_RC(connect_rc(c, d->qp_num, 0), 0);
    CHECK_RC(connect_rc(d, c->qp_num, IBV_ACCESS_REMOTE_WRITE), 0);
    write.wr_id = 3;
    write.sg_list = &sge;
    write.wr.rdma.rkey = mr->rkey ^ 0x5a5a;
    CHECK_RC(ibv_post_send(c, &write, &bad), 0);
    CHECK(wait_wc(cq, &wc) == 1 && wc.wr_id == 3 && wc.status == IBV_WC_REM_ACCESS_ERR,
          "a wrong R_Key: REM_ACCESS_ERR (got status %d)", wc.status);

    /* Too many SGEs for the QP. */
    struct ibv_qp *e = ibv_create_qp(pd, &init);
    struct ibv_sge three[3] = {sge, sge, sge};
    struct ibv_recv_wr rwr = {.wr_id = 4, .sg_list = three, .num_sge = 3};
    struct ibv_recv_wr *rbad = NULL;
    CHECK(ibv_post_recv(e, &rwr, &rbad) != 0 && rbad == &rwr, "3 SGEs on a QP of 2");

    /* Busy objects. */
    CHECK_RC(ibv_dealloc_pd(pd), EBUSY);
    CHECK_RC(ibv_destroy_cq(cq), EBUSY);

    /* Everything goes, in order. */
    CHECK_RC(ibv_destroy_qp(a), 0);
    CHECK_RC(ibv_destroy_qp(b), 0);
    CHECK_RC(ibv_destroy_qp(c), 0);
    CHECK_RC(ibv_destroy_qp(d), 0);
    CHECK_RC(ibv_destroy_qp(e), 0);
    CHECK_RC(ibv_destroy_cq(cq), 0);
    CHECK_RC(ibv_destroy_comp_channel(channel), 0);
    CHECK_RC(ibv_dereg_mr(mr), 0);
    CHECK_RC(ibv_dealloc_pd(pd), 0);
    CHECK_RC(ibv_close_device(ctx), 0);
    return finish("errors");
}
