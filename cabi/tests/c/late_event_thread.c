/* rping's exit (rxe-spec C-14): the main thread destroys its event channel and
 * exits while its event thread, which it never joins, asks the destroyed channel
 * for the next event and calls exit(-1) on the error. With the kernel the
 * process is gone before the thread asks; here the thread's question must not
 * end the process before the main thread's exit, which first settles what the
 * devices owe. Built against Debian's librdmacm-dev (cabi/tests/librdmacm.rs).
 * Exits 0 if the main thread's exit wins, 3 if the event thread's does. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static struct rdma_event_channel *channel;

static void *event_thread(void *arg)
{
    (void)arg;
    /* After the main thread destroyed the channel. */
    usleep(20000);
    struct rdma_cm_event *event;
    if (rdma_get_cm_event(channel, &event)) {
        perror("rdma_get_cm_event");
        exit(3);
    }
    return NULL;
}

int main(void)
{
    channel = rdma_create_event_channel();
    if (!channel) {
        perror("rdma_create_event_channel");
        return 2;
    }
    rdma_destroy_event_channel(channel);
    pthread_t thread;
    if (pthread_create(&thread, NULL, event_thread, NULL)) {
        perror("pthread_create");
        return 2;
    }
    /* An exit that takes as long as a settle may. */
    usleep(150000);
    printf("late_event_thread: the main thread exits\n");
    return 0;
}
