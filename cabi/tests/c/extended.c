/* The extended verbs through softroce's libibverbs.so.1: ibv_create_cq_ex
 * polled with start/next/end_poll, ibv_create_qp_ex posted with the
 * ibv_wr_* API (WRITE with immediate, inline SEND, fetch-and-add, an
 * operation the QP was not created for), ibv_query_device_ex, the GID
 * entry queries and the size-aware ibv_query_port. */
#include "common.h"

static struct ibv_qp *create_qp_ex(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq_ex *cq, uint64_t ops)
{
    struct ibv_qp_init_attr_ex a = {
        .send_cq = ibv_cq_ex_to_cq(cq),
        .recv_cq = ibv_cq_ex_to_cq(cq),
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 64},
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = pd,
        .send_ops_flags = ops,
    };
    return ibv_create_qp_ex(ctx, &a);
}

/* The next completion of an extended CQ, within 5 s. */
static int next_wc(struct ibv_cq_ex *cq, uint64_t *wr_id, enum ibv_wc_status *status, enum ibv_wc_opcode *opcode,
                   uint32_t *byte_len, unsigned *flags, __be32 *imm)
{
    struct ibv_poll_cq_attr attr = {0};
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int rc;
    while ((rc = ibv_start_poll(cq, &attr)) == ENOENT) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 5)
            return ENOENT;
    }
    if (rc)
        return rc;
    *wr_id = cq->wr_id;
    *status = cq->status;
    *opcode = ibv_wc_read_opcode(cq);
    *byte_len = ibv_wc_read_byte_len(cq);
    *flags = ibv_wc_read_wc_flags(cq);
    *imm = (*flags & IBV_WC_WITH_IMM) ? ibv_wc_read_imm_data(cq) : 0;
    ibv_end_poll(cq);
    return 0;
}

int main(void)
{
    struct ibv_context *ctx = open_first_device();

    struct ibv_device_attr_ex dev = {0};
    CHECK_RC(ibv_query_device_ex(ctx, NULL, &dev), 0);
    CHECK(dev.orig_attr.phys_port_cnt == 1 && dev.orig_attr.max_qp > 0, "ibv_query_device_ex");

    struct ibv_port_attr port;
    CHECK_RC(ibv_query_port(ctx, 1, &port), 0);
    CHECK(port.gid_tbl_len > 1 && port.active_mtu >= IBV_MTU_1024, "ibv_query_port");

    struct ibv_gid_entry entry, table[64];
    CHECK_RC(ibv_query_gid_ex(ctx, 1, 1, &entry, 0), 0);
    CHECK(entry.gid_index == 1 && entry.gid_type == IBV_GID_TYPE_ROCE_V2, "GID 1 is RoCE v2");
    CHECK_RC(ibv_query_gid_ex(ctx, 1, port.gid_tbl_len - 1, &entry, 0), ENODATA);
    ssize_t n = ibv_query_gid_table(ctx, table, 64, 0);
    CHECK(n >= 2, "ibv_query_gid_table gave %zd", n);
    for (ssize_t i = 0; i < n; i++)
        CHECK(table[i].gid_index == (uint32_t)i, "the table has no holes");

    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    static uint64_t mem[1024] __attribute__((aligned(64)));
    struct ibv_mr *mr = ibv_reg_mr(pd, mem, sizeof mem,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
    CHECK(pd && mr, "PD and MR");

    struct ibv_cq_init_attr_ex cq_attr = {.cqe = 64, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM};
    struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &cq_attr);
    CHECK(cq != NULL, "ibv_create_cq_ex");
    struct ibv_cq_init_attr_ex stamped = {.cqe = 64, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
    CHECK_NULL_ERRNO(ibv_create_cq_ex(ctx, &stamped), EOPNOTSUPP);

    uint64_t ops = IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    struct ibv_qp *a = create_qp_ex(ctx, pd, cq, ops);
    struct ibv_qp *b = create_qp_ex(ctx, pd, cq, ops);
    CHECK(a && b, "ibv_create_qp_ex");
    struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
    CHECK(ax == (struct ibv_qp_ex *)a, "ibv_qp_to_qp_ex");
    CHECK_RC(connect_rc(a, b->qp_num, 0), 0);
    CHECK_RC(connect_rc(b, a->qp_num, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC), 0);

    /* B's receives: one for the WRITE's immediate, one for the SEND. */
    for (int i = 0; i < 2; i++) {
        struct ibv_sge rsge = {.addr = (uintptr_t)&mem[512 + 64 * i], .length = 256, .lkey = mr->lkey};
        struct ibv_recv_wr rwr = {.wr_id = 100 + i, .sg_list = &rsge, .num_sge = 1}, *rbad;
        CHECK_RC(ibv_post_recv(b, &rwr, &rbad), 0);
    }

    memset(mem, 0, 512);
    for (int i = 0; i < 8; i++)
        mem[i] = 0x1111111111111111ull * (i + 1);
    mem[200] = 40;
    char text[] = "inline through ibv_wr_set_inline_data";

    ibv_wr_start(ax);
    ax->wr_id = 1;
    ax->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write_imm(ax, mr->rkey, (uintptr_t)&mem[100], htobe32(0xabcd));
    ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)&mem[0], 64);
    ax->wr_id = 2;
    ibv_wr_send(ax);
    ibv_wr_set_inline_data(ax, text, sizeof text);
    ax->wr_id = 3;
    ibv_wr_atomic_fetch_add(ax, mr->rkey, (uintptr_t)&mem[200], 2);
    ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)&mem[300], 8);
    CHECK_RC(ibv_wr_complete(ax), 0);

    int seen = 0;
    for (int i = 0; i < 5; i++) {
        uint64_t wr_id;
        enum ibv_wc_status status;
        enum ibv_wc_opcode opcode;
        uint32_t len;
        unsigned flags;
        __be32 imm;
        if (next_wc(cq, &wr_id, &status, &opcode, &len, &flags, &imm)) {
            CHECK(0, "completion %d of 5 did not come", i + 1);
            break;
        }
        CHECK(status == IBV_WC_SUCCESS, "wr_id %llu status %d", (unsigned long long)wr_id, status);
        if (wr_id == 100)
            CHECK(opcode == IBV_WC_RECV_RDMA_WITH_IMM && be32toh(imm) == 0xabcd && (flags & IBV_WC_WITH_IMM),
                  "the WRITE's immediate");
        if (wr_id == 101)
            CHECK(opcode == IBV_WC_RECV && len == sizeof text, "the inline SEND (%u bytes)", len);
        seen |= 1 << (wr_id >= 100 ? wr_id - 97 : wr_id - 1);
    }
    CHECK(seen == 0x1f, "all five completions, got mask %#x", seen);
    CHECK(memcmp(&mem[100], &mem[0], 64) == 0, "the WRITE's data");
    CHECK(memcmp(&mem[512 + 64], text, sizeof text) == 0, "the SEND's data");
    CHECK(mem[300] == 40 && mem[200] == 42, "fetch-and-add returned %llu, left %llu", (unsigned long long)mem[300],
          (unsigned long long)mem[200]);

    /* READ is not among A's send ops: the batch fails as a whole. */
    ibv_wr_start(ax);
    ax->wr_id = 9;
    ibv_wr_rdma_read(ax, mr->rkey, (uintptr_t)&mem[0]);
    ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)&mem[400], 8);
    CHECK_RC(ibv_wr_complete(ax), EINVAL);

    CHECK_RC(ibv_destroy_qp(a), 0);
    CHECK_RC(ibv_destroy_qp(b), 0);
    CHECK_RC(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
    CHECK_RC(ibv_dereg_mr(mr), 0);
    CHECK_RC(ibv_dealloc_pd(pd), 0);
    CHECK_RC(ibv_close_device(ctx), 0);
    return finish("extended");
}
