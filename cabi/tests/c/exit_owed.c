/* A program that exits owes its peers nothing (rxe-spec C-23): two processes
 * connected through rdma_cm, one of which goes away as programs do. Built
 * against Debian's librdmacm-dev and libibverbs-dev and run with softroce's
 * library under both sonames (cabi/tests/librdmacm.rs).
 *
 *   exit_owed server PORT MODE        listens on 127.0.0.1:PORT, takes one
 *                                     connection and one SEND, then:
 *     ack    exit(0) at once: the ACK of that SEND is still owed;
 *     drep   waits for the client's DREQ (DISCONNECTED), then exit(0) without
 *            destroying anything: the DREP is owed (qperf's server does this);
 *     stay   waits to be killed (SIGKILL: it owes what it owes).
 *   exit_owed client PORT MODE [PID]  connects, sends one SEND, and checks:
 *     ack    the SEND completes with success within a second;
 *     drep   after rdma_disconnect, DISCONNECTED comes within a second;
 *     kill   kills PID (the server), and a second SEND ends in
 *            IBV_WC_RETRY_EXC_ERR, not a hang.
 * Each prints "MODE: ok" and exits 0, or names what failed and exits 1. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static void die(const char *what)
{
    fprintf(stderr, "exit_owed: %s (errno %d %s)\n", what, errno, strerror(errno));
    exit(1);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* The channel's next event, which must be `want`, within `ms`; acknowledged. */
static struct rdma_cm_id *expect(struct rdma_event_channel *channel, enum rdma_cm_event_type want, int ms)
{
    struct pollfd p = {.fd = channel->fd, .events = POLLIN};
    struct rdma_cm_event *event;
    if (poll(&p, 1, ms) != 1) {
        fprintf(stderr, "exit_owed: no event within %d ms, want %s\n", ms, rdma_event_str(want));
        exit(1);
    }
    if (rdma_get_cm_event(channel, &event))
        die("rdma_get_cm_event");
    if (event->event != want) {
        fprintf(stderr, "exit_owed: event %s (status %d), want %s\n", rdma_event_str(event->event), event->status,
                rdma_event_str(want));
        exit(1);
    }
    struct rdma_cm_id *id = event->id;
    rdma_ack_cm_event(event);
    return id;
}

/* The next completion of `cq`, within `ms`. */
static struct ibv_wc completion(struct ibv_cq *cq, int ms)
{
    struct ibv_wc wc;
    double end = now_s() + ms / 1e3;
    while (now_s() < end) {
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0)
            die("ibv_poll_cq");
        if (n == 1)
            return wc;
    }
    fprintf(stderr, "exit_owed: no completion within %d ms\n", ms);
    exit(1);
}

static struct ibv_qp_init_attr qp_attr(void)
{
    struct ibv_qp_init_attr attr = {
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 64},
    };
    return attr;
}

static void post_send(struct rdma_cm_id *id, uint64_t wr_id)
{
    static char message[] = "owed";
    struct ibv_sge sge = {.addr = (uintptr_t)message, .length = sizeof message};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
    struct ibv_send_wr *bad;
    if (ibv_post_send(id->qp, &wr, &bad))
        die("ibv_post_send");
}

static int server(int port, const char *mode)
{
    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *listen_id;
    if (!channel || rdma_create_id(channel, &listen_id, NULL, RDMA_PS_TCP))
        die("rdma_create_id");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (rdma_bind_addr(listen_id, (struct sockaddr *)&addr) || rdma_listen(listen_id, 1))
        die("rdma_listen");
    printf("listening\n");
    fflush(stdout);
    struct rdma_cm_id *id = expect(channel, RDMA_CM_EVENT_CONNECT_REQUEST, 10000);
    struct ibv_qp_init_attr attr = qp_attr();
    if (rdma_create_qp(id, NULL, &attr))
        die("rdma_create_qp");
    static char buffer[64];
    struct ibv_mr *mr = ibv_reg_mr(id->qp->pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = sizeof buffer, .lkey = mr ? mr->lkey : 0};
    struct ibv_recv_wr recv = {.wr_id = 1, .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad;
    if (!mr || ibv_post_recv(id->qp, &recv, &bad))
        die("ibv_post_recv");
    struct rdma_conn_param param = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
                                    .rnr_retry_count = 7};
    if (rdma_accept(id, &param))
        die("rdma_accept");
    expect(channel, RDMA_CM_EVENT_ESTABLISHED, 5000);
    struct ibv_wc wc = completion(id->qp->recv_cq, 5000);
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
        fprintf(stderr, "exit_owed: receive %s\n", ibv_wc_status_str(wc.status));
        return 1;
    }
    if (!strcmp(mode, "ack")) {
        printf("ack: ok\n");
        exit(0);
    }
    if (!strcmp(mode, "drep")) {
        expect(channel, RDMA_CM_EVENT_DISCONNECTED, 10000);
        printf("drep: ok\n");
        exit(0);
    }
    printf("received\n");
    fflush(stdout);
    pause();
    return 1;
}

static int client(int port, const char *mode, pid_t server_pid)
{
    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *id;
    if (!channel || rdma_create_id(channel, &id, NULL, RDMA_PS_TCP))
        die("rdma_create_id");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000))
        die("rdma_resolve_addr");
    expect(channel, RDMA_CM_EVENT_ADDR_RESOLVED, 5000);
    if (rdma_resolve_route(id, 2000))
        die("rdma_resolve_route");
    expect(channel, RDMA_CM_EVENT_ROUTE_RESOLVED, 5000);
    struct ibv_qp_init_attr attr = qp_attr();
    if (rdma_create_qp(id, NULL, &attr))
        die("rdma_create_qp");
    /* One try for a SEND nobody answers: its error comes after one ACK timeout. */
    struct rdma_conn_param param = {.responder_resources = 1, .initiator_depth = 1,
                                    .retry_count = !strcmp(mode, "kill") ? 0 : 7, .rnr_retry_count = 7};
    if (rdma_connect(id, &param))
        die("rdma_connect");
    expect(channel, RDMA_CM_EVENT_ESTABLISHED, 5000);
    post_send(id, 1);
    double sent = now_s();
    struct ibv_wc wc = completion(id->qp->send_cq, 30000);
    double took = now_s() - sent;
    if (!strcmp(mode, "ack")) {
        if (wc.status != IBV_WC_SUCCESS || took > 1.0) {
            fprintf(stderr, "exit_owed: the SEND ended %s after %.3f s, want success within 1 s\n",
                    ibv_wc_status_str(wc.status), took);
            return 1;
        }
        printf("ack: ok (%.3f s)\n", took);
        return 0;
    }
    if (wc.status != IBV_WC_SUCCESS)
        die("the first SEND failed");
    if (!strcmp(mode, "drep")) {
        if (rdma_disconnect(id))
            die("rdma_disconnect");
        double asked = now_s();
        expect(channel, RDMA_CM_EVENT_DISCONNECTED, 1000);
        printf("drep: ok (%.3f s)\n", now_s() - asked);
        return 0;
    }
    if (kill(server_pid, SIGKILL))
        die("kill");
    usleep(100 * 1000);
    post_send(id, 2);
    sent = now_s();
    wc = completion(id->qp->send_cq, 30000);
    took = now_s() - sent;
    if (wc.status != IBV_WC_RETRY_EXC_ERR) {
        fprintf(stderr, "exit_owed: the SEND to a killed peer ended %s, want %s\n", ibv_wc_status_str(wc.status),
                ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
        return 1;
    }
    printf("kill: ok (%s after %.3f s)\n", ibv_wc_status_str(wc.status), took);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "server"))
        return server(atoi(argv[2]), argv[3]);
    if (argc >= 4 && !strcmp(argv[1], "client"))
        return client(atoi(argv[2]), argv[3], argc > 4 ? atoi(argv[4]) : 0);
    fprintf(stderr, "usage: exit_owed server PORT ack|drep|stay | exit_owed client PORT ack|drep|kill [PID]\n");
    return 2;
}
