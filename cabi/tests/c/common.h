/* Shared by the C checks of softroce's libibverbs.so.1: a device, two RC
 * QPs on it connected to each other through GID 1, and check macros that
 * name the failing line. Build against Debian's libibverbs-dev and run with
 * softroce's library first on the loader's path (tools/stock-programs). */
#ifndef SOFTROCE_C_COMMON_H
#define SOFTROCE_C_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

static int failures;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno));        \
            failures++;                                                         \
        }                                                                       \
    } while (0)

/* A pointer that must be NULL with this errno. */
#define CHECK_NULL_ERRNO(expr, want)                                            \
    do {                                                                        \
        errno = 0;                                                              \
        void *got_ = (void *)(expr);                                            \
        CHECK(got_ == NULL && errno == (want), "%s gave %p, want NULL with errno %d", #expr, got_, (want)); \
    } while (0)

/* A call returning 0 or an errno value that must return this one. */
#define CHECK_RC(expr, want)                                                    \
    do {                                                                        \
        int rc_ = (expr);                                                       \
        CHECK(rc_ == (want), "%s returned %d, want %d", #expr, rc_, (want));   \
    } while (0)

struct env {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
};

static inline struct ibv_context *open_first_device(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n < 1) {
        fprintf(stderr, "no RDMA device (is softroce's libibverbs.so.1 first on LD_LIBRARY_PATH?)\n");
        exit(2);
    }
    struct ibv_context *ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (!ctx) {
        perror("ibv_open_device");
        exit(2);
    }
    return ctx;
}

/* RESET -> INIT -> RTR -> RTS, connected to `remote` through GID 1. */
static inline int connect_rc(struct ibv_qp *qp, uint32_t remote_qpn, int access)
{
    union ibv_gid gid;
    if (ibv_query_gid(qp->context, 1, 1, &gid))
        return errno;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qp_access_flags = access};
    int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc)
        return rc;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return rc;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Polls `cq` until one completion arrives or 5 s pass. */
static inline int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n != 0)
            return n;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 5)
            return 0;
    }
}

static int finish(const char *name)
{
    if (failures) {
        fprintf(stderr, "%s: %d checks failed\n", name, failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

#endif
