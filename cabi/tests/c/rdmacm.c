/* softroce as librdmacm.so.1: one library under both sonames, and the calls
 * that need no peer. Built against Debian's librdmacm-dev and libibverbs-dev
 * (-lrdmacm -libverbs) and run with both names linked to softroce's library
 * first on the loader's path (softroce run; cabi/tests/librdmacm.rs), bound
 * at load (LD_BIND_NOW) so that a symbol missing at its version fails. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <netinet/in.h>
#include <poll.h>
#include <fcntl.h>
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

    return finish("rdmacm");
}
