/* pthread_cancel of a thread inside the library (rxe-spec C-24). rdma-core's
 * calls are cancellation points only where they block in read(): a thread
 * waiting in ibv_get_cq_event, ibv_get_async_event, rdma_get_cm_event, a
 * synchronous listener's rdma_get_request or a synchronous id's rdma_connect
 * is cancelled there, and one that spins on ibv_poll_cq is cancelled at its own
 * pthread_testcancel, never inside the library, whose system calls would
 * otherwise be cancellation points. A thread that disabled cancellation is not
 * cancelled in a wait. Built against Debian's libibverbs-dev and librdmacm-dev
 * (cabi/tests/librdmacm.rs); prints "cancel: all checks passed". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include "common.h"

static struct ibv_context *ctx;
static struct ibv_comp_channel *comp;
static struct ibv_cq *cq;
static struct rdma_event_channel *cm_channel;
static struct rdma_cm_id *listener;
/* A listener nobody accepts for: a synchronous rdma_connect to it waits. */
static struct rdma_event_channel *deaf_channel;
static struct rdma_cm_id *deaf;
static struct sockaddr_in deaf_addr;

static void *wait_cq_event(void *arg)
{
    (void)arg;
    struct ibv_cq *got;
    void *got_context;
    ibv_get_cq_event(comp, &got, &got_context);
    return NULL;
}

static void *wait_async_event(void *arg)
{
    (void)arg;
    struct ibv_async_event event;
    ibv_get_async_event(ctx, &event);
    return NULL;
}

static void *wait_cm_event(void *arg)
{
    (void)arg;
    struct rdma_cm_event *event;
    rdma_get_cm_event(cm_channel, &event);
    return NULL;
}

static void *wait_request(void *arg)
{
    (void)arg;
    struct rdma_cm_id *id;
    rdma_get_request(listener, &id);
    return NULL;
}

static void *wait_connect(void *arg)
{
    (void)arg;
    struct rdma_cm_id *id;
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
        return (void *)1;
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&deaf_addr, 2000) || rdma_resolve_route(id, 2000))
        return (void *)2;
    /* A QP number of its own each time: the listener refuses a REQ that
     * names the QP of one it still holds (a stale connection). */
    static int next_qp_num = 1000;
    struct rdma_conn_param param = {
        .qp_num = __atomic_add_fetch(&next_qp_num, 1, __ATOMIC_RELAXED),
        .responder_resources = 1,
        .initiator_depth = 1,
    };
    rdma_connect(id, &param);
    return (void *)3;
}

static void *spin_on_cq(void *arg)
{
    (void)arg;
    struct ibv_wc wc;
    for (;;) {
        ibv_poll_cq(cq, 1, &wc);
        pthread_testcancel();
    }
    return NULL;
}

/* Waits for a CQ event with cancellation disabled, for 300 ms at most. */
static void *wait_uncancellable(void *arg)
{
    (void)arg;
    int old;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    int fd = comp->fd, flags = fcntl(fd, F_GETFL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    do {
        struct ibv_cq *got;
        void *got_context;
        ibv_get_cq_event(comp, &got, &got_context);
        usleep(10000);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < 300);
    fcntl(fd, F_SETFL, flags);
    return (void *)1;
}

/* Starts `body`, lets it reach its wait, cancels it and joins it: whether it
 * ended cancelled, within 5 s (a thread the cancellation never reaches is
 * left behind, and the check fails rather than hangs). */
static int cancelled(void *(*body)(void *))
{
    pthread_t thread;
    void *result = NULL;
    if (pthread_create(&thread, NULL, body, NULL))
        return 0;
    usleep(30000);
    pthread_cancel(thread);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 5;
    if (pthread_timedjoin_np(thread, &result, &deadline))
        return 0;
    return result == PTHREAD_CANCELED;
}

int main(void)
{
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n > 0, "a device");
    if (!list || n == 0)
        return 1;
    ctx = ibv_open_device(list[0]);
    comp = ctx ? ibv_create_comp_channel(ctx) : NULL;
    cq = comp ? ibv_create_cq(ctx, 16, NULL, comp, 0) : NULL;
    cm_channel = rdma_create_event_channel();
    CHECK(ctx && comp && cq && cm_channel, "a context, a channel, a CQ and an event channel");
    if (!ctx || !comp || !cq || !cm_channel)
        return 1;
    CHECK(ibv_req_notify_cq(cq, 0) == 0, "armed");
    /* A synchronous listener (no channel) on a port of the kernel's choice. */
    struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP}, *res = NULL;
    CHECK(rdma_getaddrinfo("127.0.0.1", "0", &hints, &res) == 0 && res, "passive address");
    CHECK(res && rdma_create_ep(&listener, res, NULL, NULL) == 0, "a synchronous id");
    CHECK(listener && rdma_listen(listener, 1) == 0, "listening");
    if (res)
        rdma_freeaddrinfo(res);
    deaf_channel = rdma_create_event_channel();
    deaf_addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(deaf_channel && rdma_create_id(deaf_channel, &deaf, NULL, RDMA_PS_TCP) == 0, "a listener's id");
    CHECK(deaf && rdma_bind_addr(deaf, (struct sockaddr *)&deaf_addr) == 0 && rdma_listen(deaf, 8) == 0,
          "a listener nobody accepts for");
    if (deaf)
        deaf_addr.sin_port = rdma_get_src_port(deaf);
    for (int round = 0; round < 5; round++) {
        CHECK(cancelled(wait_cq_event), "round %d: a thread in ibv_get_cq_event", round);
        CHECK(cancelled(wait_async_event), "round %d: a thread in ibv_get_async_event", round);
        CHECK(cancelled(wait_cm_event), "round %d: a thread in rdma_get_cm_event", round);
        if (listener)
            CHECK(cancelled(wait_request), "round %d: a thread in rdma_get_request", round);
        if (deaf)
            CHECK(cancelled(wait_connect), "round %d: a thread in a synchronous rdma_connect", round);
        CHECK(cancelled(spin_on_cq), "round %d: a thread spinning on ibv_poll_cq", round);
    }
    CHECK(!cancelled(wait_uncancellable), "a thread that disabled cancellation");
    /* The library still works after all that: nothing was left locked. */
    struct ibv_wc wc;
    CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "an empty CQ polls empty");
    CHECK(ibv_destroy_cq(cq) == 0, "destroy the CQ");
    CHECK(ibv_destroy_comp_channel(comp) == 0, "destroy the channel");
    rdma_destroy_event_channel(cm_channel);
    if (listener)
        rdma_destroy_ep(listener);
    if (deaf)
        CHECK(rdma_destroy_id(deaf) == 0, "destroy the listener nobody accepted for");
    if (deaf_channel)
        rdma_destroy_event_channel(deaf_channel);
    CHECK(ibv_close_device(ctx) == 0, "close");
    ibv_free_device_list(list);
    return finish("cancel");
}
