/* softroce as librdmacm.so.1: one library under both sonames, the calls that
 * need no peer, and a connection within the process: listen, resolve,
 * connect, accept, a SEND over the QPs the CM moved, disconnect. Built against Debian's librdmacm-dev and libibverbs-dev
 * (-lrdmacm -libverbs) and run with both names linked to softroce's library
 * first on the loader's path (softroce run; cabi/tests/librdmacm.rs), bound
 * at load (LD_BIND_NOW) so that a symbol missing at its version fails. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <netinet/in.h>
#include <poll.h>
#include <fcntl.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include "common.h"

/* Loaded objects whose name ends in one of our two sonames. */
static int rdma_objects(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *name = info->dlpi_name;
    if (strstr(name, "libibverbs.so.1") || strstr(name, "librdmacm.so.1"))
        ++*(int *)data;
    return 0;
}


/* The channel's next event, which must be `want`; NULL after a failed check. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *channel, enum rdma_cm_event_type want)
{
    struct pollfd p = {.fd = channel->fd, .events = POLLIN};
    struct rdma_cm_event *event = NULL;
    if (poll(&p, 1, 5000) != 1) {
        CHECK(0, "no event within 5 s, want %s", rdma_event_str(want));
        return NULL;
    }
    if (rdma_get_cm_event(channel, &event)) {
        CHECK(0, "rdma_get_cm_event");
        return NULL;
    }
    CHECK(event->event == want, "got %s (status %d), want %s", rdma_event_str(event->event), event->status,
          rdma_event_str(want));
    return event;
}

static struct sockaddr_in loopback(uint16_t port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sin;
}

static int create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq)
{
    struct ibv_qp_init_attr attr = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC};
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    return rdma_create_qp(id, pd, &attr);
}

/* Two ids of this process connect to each other through a listener. */
static void connect_in_process(void)
{
    struct rdma_event_channel *channel = rdma_create_event_channel();
    CHECK(channel != NULL, "rdma_create_event_channel");
    if (!channel)
        return;
    /* The descriptor is the kernel's kind: non-blocking on request. */
    fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
    struct rdma_cm_event *event = NULL;
    errno = 0;
    CHECK(rdma_get_cm_event(channel, &event) == -1 && errno == EAGAIN, "a non-blocking channel: EAGAIN");

    struct rdma_cm_id *listen_id = NULL, *client = NULL, *server = NULL;
    CHECK(rdma_create_id(channel, &listen_id, "listener", RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in any_port = loopback(0);
    CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&any_port) == 0, "rdma_bind_addr 127.0.0.1:0");
    uint16_t port = ntohs(rdma_get_src_port(listen_id));
    CHECK(port != 0, "the bound port");
    CHECK(listen_id->verbs != NULL && strcmp(ibv_get_device_name(listen_id->verbs->device), "sr_lo") == 0,
          "a listener bound to 127.0.0.1 has sr_lo's context");
    int n = 0;
    struct ibv_context **devices = rdma_get_devices(&n);
    int listed = 0;
    for (int i = 0; devices && devices[i]; i++)
        listed |= devices[i] == listen_id->verbs;
    CHECK(listed, "rdma_get_devices lists the id's context");
    rdma_free_devices(devices);
    CHECK(rdma_listen(listen_id, 0) == 0, "rdma_listen");

    CHECK(rdma_create_id(channel, &client, "client", RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in dst = loopback(port);
    CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr");
    if ((event = next_event(channel, RDMA_CM_EVENT_ADDR_RESOLVED))) {
        CHECK(event->id == client && event->status == 0, "ADDR_RESOLVED for the client");
        rdma_ack_cm_event(event);
    }
    CHECK(client->verbs == listen_id->verbs, "one context per device: the client's is the listener's");
    CHECK(ntohs(rdma_get_dst_port(client)) == port, "the destination port");
    CHECK(rdma_resolve_route(client, 2000) == 0, "rdma_resolve_route");
    if ((event = next_event(channel, RDMA_CM_EVENT_ROUTE_RESOLVED))) {
        rdma_ack_cm_event(event);
    }
    CHECK(client->route.num_paths == 1 && client->route.path_rec != NULL, "one path");
    struct sockaddr_in *local = (struct sockaddr_in *)rdma_get_local_addr(client);
    struct sockaddr_in *peer = (struct sockaddr_in *)rdma_get_peer_addr(client);
    CHECK(local->sin_family == AF_INET && local->sin_addr.s_addr == htonl(INADDR_LOOPBACK) &&
              local->sin_port != 0 && peer->sin_port == htons(port),
          "the route's addresses (rdma_get_local_addr, rdma_get_peer_addr)");
    struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT};
    int mask = 0;
    CHECK(rdma_init_qp_attr(client, &init, &mask) == 0 && (mask & IBV_QP_STATE) && (mask & IBV_QP_PORT) &&
              init.port_num == 1,
          "rdma_init_qp_attr for INIT");

    struct ibv_pd *pd = ibv_alloc_pd(client->verbs);
    struct ibv_cq *cq = ibv_create_cq(client->verbs, 16, NULL, NULL, 0);
    CHECK(pd && cq, "a PD and a CQ on the id's context");
    CHECK(create_qp(client, pd, cq) == 0 && client->qp && client->qp->state == IBV_QPS_INIT,
          "rdma_create_qp: a QP in INIT");
    struct rdma_conn_param param = {.private_data = "hello", .private_data_len = 6, .retry_count = 7,
                                    .rnr_retry_count = 7};
    CHECK(rdma_connect(client, &param) == 0, "rdma_connect");

    if ((event = next_event(channel, RDMA_CM_EVENT_CONNECT_REQUEST))) {
        server = event->id;
        CHECK(event->listen_id == listen_id && server != NULL && server != listen_id, "a new id for the request");
        CHECK(server->verbs == client->verbs && server->context == listen_id->context,
              "the new id: the device's context, the listener's user context");
        CHECK(event->param.conn.private_data_len >= 6 &&
                  memcmp(event->param.conn.private_data, "hello", 6) == 0,
              "the request's private data");
        CHECK(create_qp(server, pd, cq) == 0, "rdma_create_qp on the new id");
        struct rdma_conn_param reply = {.private_data = "world", .private_data_len = 6};
        CHECK(rdma_accept(server, &reply) == 0, "rdma_accept");
        rdma_ack_cm_event(event);
    }
    for (int i = 0; i < 2; i++) {
        if (!(event = next_event(channel, RDMA_CM_EVENT_ESTABLISHED)))
            break;
        CHECK(event->id == client || event->id == server, "ESTABLISHED for one of the two");
        if (event->id == client)
            CHECK(event->param.conn.private_data_len >= 6 &&
                      memcmp(event->param.conn.private_data, "world", 6) == 0,
                  "the reply's private data");
        rdma_ack_cm_event(event);
    }

    if (client->qp && server && server->qp) {
        static char buf[64];
        struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
        struct ibv_sge recv_sge = {.addr = (uintptr_t)buf, .length = 32, .lkey = mr->lkey};
        struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &recv_sge, .num_sge = 1}, *bad_rwr;
        CHECK(ibv_post_recv(server->qp, &rwr, &bad_rwr) == 0, "post_recv");
        strcpy(buf + 32, "over rdma_cm");
        struct ibv_sge send_sge = {.addr = (uintptr_t)buf + 32, .length = 13, .lkey = mr->lkey};
        struct ibv_send_wr swr = {.wr_id = 2, .sg_list = &send_sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                  .send_flags = IBV_SEND_SIGNALED}, *bad_swr;
        CHECK(ibv_post_send(client->qp, &swr, &bad_swr) == 0, "post_send");
        struct ibv_wc wc;
        int got = 0;
        for (int i = 0; i < 2 && wait_wc(cq, &wc) == 1; i++)
            got += wc.status == IBV_WC_SUCCESS;
        CHECK(got == 2 && strcmp(buf, "over rdma_cm") == 0, "a SEND between the QPs the CM connected");
        ibv_dereg_mr(mr);
    }

    /* The server learns of the DREQ and answers with its own disconnect
     * (the DREP), which ends the client's side too, as with the kernel's CM. */
    CHECK(rdma_disconnect(client) == 0, "rdma_disconnect");
    for (int i = 0; i < 2; i++) {
        if (!(event = next_event(channel, RDMA_CM_EVENT_DISCONNECTED)))
            break;
        if (event->id == server)
            CHECK(rdma_disconnect(server) == 0, "rdma_disconnect of the server's id");
        rdma_ack_cm_event(event);
    }
    rdma_destroy_qp(client);
    if (server)
        rdma_destroy_qp(server);
    CHECK(rdma_destroy_id(client) == 0 && (!server || rdma_destroy_id(server) == 0) &&
              rdma_destroy_id(listen_id) == 0,
          "rdma_destroy_id");
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    rdma_destroy_event_channel(channel);
    errno = 0;
    CHECK(rdma_get_cm_event(channel, &event) == -1 && errno == EINVAL, "a destroyed channel: EINVAL");
}

/* An id without a channel is synchronous: each call returns after its event. */
static void synchronous_id(void)
{
    struct rdma_cm_id *id = NULL;
    CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0 && id && id->channel, "a synchronous id");
    if (!id)
        return;
    struct sockaddr_in dst = loopback(7);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0 && id->event &&
              id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED,
          "rdma_resolve_addr returns with ADDR_RESOLVED in id->event");
    CHECK(id->verbs != NULL && id->pd != NULL, "the device's context and PD");
    struct sockaddr_in group = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0xe0000101)};
    errno = 0;
    CHECK(rdma_join_multicast(id, (struct sockaddr *)&group, NULL) == -1 && errno == EINVAL,
          "multicast on a TCP id: EINVAL");
    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    /* A stale id is refused, not followed (perftest's connection retry uses ids it destroyed). */
    errno = 0;
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == -1 && errno == EINVAL,
          "a destroyed id: EINVAL");
}

/* rdma_getaddrinfo as librdmacm v44 answers it. */
static void getaddrinfo_checks(void)
{
    struct rdma_addrinfo *res = NULL;
    errno = 0;
    CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL, "nothing to resolve: EINVAL");

    /* libfabric's verbs provider asks with the addresses it holds, as hints alone. */
    struct sockaddr_in src = loopback(0), dst = loopback(7471);
    struct rdma_addrinfo hints = {.ai_flags = RAI_FAMILY, .ai_family = AF_INET, .ai_qp_type = IBV_QPT_RC,
                                  .ai_port_space = RDMA_PS_TCP, .ai_src_len = sizeof src,
                                  .ai_dst_len = sizeof dst, .ai_src_addr = (struct sockaddr *)&src,
                                  .ai_dst_addr = (struct sockaddr *)&dst};
    res = NULL;
    CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res, "hints alone: rdma_getaddrinfo");
    if (res) {
        CHECK(res->ai_flags == RAI_FAMILY && res->ai_family == AF_INET && res->ai_qp_type == IBV_QPT_RC &&
                  res->ai_port_space == RDMA_PS_TCP,
              "hints alone: their flags, family, QP type and port space");
        CHECK(res->ai_dst_addr && res->ai_dst_addr != hints.ai_dst_addr && res->ai_dst_len == sizeof dst &&
                  memcmp(res->ai_dst_addr, &dst, sizeof dst) == 0 && res->ai_src_addr &&
                  res->ai_src_addr != hints.ai_src_addr && res->ai_src_len == sizeof src &&
                  memcmp(res->ai_src_addr, &src, sizeof src) == 0,
              "hints alone: copies of both addresses");
        CHECK(!res->ai_route && !res->ai_connect && !res->ai_next, "hints alone: one answer, no route");
        rdma_freeaddrinfo(res);
    }
    struct rdma_addrinfo passive = {.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP,
                                    .ai_src_len = sizeof src, .ai_src_addr = (struct sockaddr *)&src};
    res = NULL;
    CHECK(rdma_getaddrinfo(NULL, NULL, &passive, &res) == 0 && res && res->ai_flags == RAI_PASSIVE &&
              res->ai_src_len == sizeof src && res->ai_dst_addr == NULL && res->ai_dst_len == 0,
          "hints alone, passive: the source only");
    if (res)
        rdma_freeaddrinfo(res);

    /* With a node: the resolver's answer, the hints' flags not copied, a hint's source kept. */
    struct rdma_addrinfo numeric = {.ai_flags = RAI_NUMERICHOST, .ai_port_space = RDMA_PS_TCP,
                                    .ai_src_len = sizeof src, .ai_src_addr = (struct sockaddr *)&src};
    res = NULL;
    CHECK(rdma_getaddrinfo("127.0.0.1", "7471", &numeric, &res) == 0 && res && res->ai_flags == 0 &&
              res->ai_qp_type == IBV_QPT_RC && res->ai_dst_len == sizeof dst &&
              memcmp(res->ai_dst_addr, &dst, sizeof dst) == 0 && res->ai_src_len == sizeof src,
          "an active answer: the destination, the hint's source, no flags");
    if (res)
        rdma_freeaddrinfo(res);
    /* The resolver's error is returned as it is (v44 does not move it into errno). */
    res = NULL;
    int rc = rdma_getaddrinfo("1.2.3.4.5", NULL, &numeric, &res);
    CHECK(rc == EAI_NONAME && res == NULL, "a resolver error is its EAI code: got %d", rc);
}

int main(void)
{
    /* One copy: both names are the one object. */
    Dl_info cm, verbs;
    CHECK(dladdr((void *)rdma_create_id, &cm) && dladdr((void *)ibv_open_device, &verbs), "dladdr");
    CHECK(cm.dli_fbase == verbs.dli_fbase, "rdma_create_id in %s at %p, ibv_open_device in %s at %p",
          cm.dli_fname, cm.dli_fbase, verbs.dli_fname, verbs.dli_fbase);
    void *by_cm = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *by_verbs = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(by_cm != NULL && by_cm == by_verbs, "dlopen of the two names: %p and %p", by_cm, by_verbs);
    int objects = 0;
    dl_iterate_phdr(rdma_objects, &objects);
    CHECK(objects == 1, "%d objects named libibverbs.so.1 or librdmacm.so.1 are loaded", objects);
    /* A symbol at RDMACM_1.2 (the program imports it at that version). */
    CHECK(dlvsym(by_cm, "rdma_establish", "RDMACM_1.2") == (void *)rdma_establish, "rdma_establish@RDMACM_1.2");
    CHECK(dlvsym(by_cm, "rdma_connect", "RDMACM_1.0") == (void *)rdma_connect, "rdma_connect@RDMACM_1.0");

    CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED") == 0, "rdma_event_str");
    CHECK(strcmp(rdma_event_str(99), "UNKNOWN EVENT") == 0, "rdma_event_str of no event");

    /* rsockets are not provided: they fail as a socket call does. */
    errno = 0;
    CHECK(rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == ENOSYS, "rsocket");
    errno = 0;
    CHECK(rpoll(NULL, 0, 0) == -1 && errno == ENOSYS, "rpoll");

    /* Address resolution through the system's resolver. */
    struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP}, *res = NULL;
    CHECK(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res) == 0 && res && res->ai_src_addr, "rdma_getaddrinfo");
    if (res) {
        struct sockaddr_in *sin = (struct sockaddr_in *)res->ai_src_addr;
        CHECK(sin->sin_family == AF_INET && ntohs(sin->sin_port) == 7471 &&
                  sin->sin_addr.s_addr == htonl(INADDR_LOOPBACK) && res->ai_qp_type == IBV_QPT_RC,
              "passive 127.0.0.1:7471 is the source, RC");
        rdma_freeaddrinfo(res);
    }

    getaddrinfo_checks();
    connect_in_process();
    synchronous_id();
    return finish("rdmacm");
}
