/* tools/mpi/check.c: an MPI program that checks every byte Open MPI moves
 * over softroce, and measures what MPI benchmarks report.
 *
 *   mpirun -np 2 ... check            every byte of point-to-point and
 *                                     collective traffic; prints one PASS
 *                                     or FAIL line, exits non-zero on any
 *                                     mismatch
 *   mpirun -np 2 ... check figures    8 B half-round-trip latency and
 *                                     1 MiB streaming bandwidth between
 *                                     ranks 0 and 1
 *
 * Point-to-point runs between every pair of ranks at sizes from 0 B to 4 MiB,
 * in both directions, blocking (MPI_Send/MPI_Recv) and nonblocking (both ranks
 * MPI_Isend and MPI_Irecv at once); collectives (bcast from every root,
 * allreduce, alltoall, gather, scatter) run over all ranks. Every buffer is
 * filled from a pattern of (sender, size, round, byte), so data left from
 * an earlier message does not pass. tools/stock-programs runs it through
 * `softroce run` with pml cm + mtl ofi (libfabric verbs;ofi_rxm) and with
 * pml ob1 + btl openib. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, ranks;
static long mismatches;

/* The byte at `i` of a message `sender` sends of `size` bytes in `round`. */
static unsigned char pattern(int sender, size_t size, int round, size_t i)
{
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)sender << 56) ^ ((uint64_t)round << 40) ^ size;
    x ^= x >> 29;
    return (unsigned char)(x * 0xbf58476d1ce4e5b9ull >> 56);
}

static void fill(unsigned char *buf, int sender, size_t size, int round)
{
    for (size_t i = 0; i < size; i++)
        buf[i] = pattern(sender, size, round, i);
}

/* Counts the bytes of `buf` that differ from the pattern; names the first. */
static void expect(const char *what, const unsigned char *buf, int sender, size_t size, int round)
{
    long bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < size; i++) {
        if (buf[i] != pattern(sender, size, round, i)) {
            if (!bad)
                first = i;
            bad++;
        }
    }
    if (bad) {
        fprintf(stderr, "rank %d: %s, %zu bytes from rank %d: %ld bytes wrong, the first at %zu\n", rank, what,
                size, sender, bad, first);
        mismatches += bad;
    }
}

static void expect_count(const char *what, MPI_Status *status, size_t size)
{
    int count = -1;
    MPI_Get_count(status, MPI_BYTE, &count);
    if (count != (int)size) {
        fprintf(stderr, "rank %d: %s: received %d bytes, want %zu\n", rank, what, count, size);
        mismatches++;
    }
}

static const size_t sizes[] = {0, 1, 7, 64, 1000, 4096, 4097, 65536, 262147, 1 << 20, 4 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Every size both ways with `peer`: blocking, the lower rank first, then
 * nonblocking in both directions at once. */
static void exchange_with(int peer, unsigned char *send, unsigned char *recv)
{
    MPI_Status status;
    for (int round = 0; round < 2; round++) {
        for (size_t s = 0; s < NSIZES; s++) {
            size_t size = sizes[s];
            for (int turn = 0; turn < 2; turn++) {
                if ((turn == 0) == (rank < peer)) {
                    fill(send, rank, size, round);
                    MPI_Send(send, (int)size, MPI_BYTE, peer, (int)s, MPI_COMM_WORLD);
                } else {
                    memset(recv, 0xa5, size);
                    MPI_Recv(recv, (int)size, MPI_BYTE, peer, (int)s, MPI_COMM_WORLD, &status);
                    expect_count("MPI_Recv", &status, size);
                    expect("MPI_Send/MPI_Recv", recv, peer, size, round);
                }
            }
            MPI_Request requests[2];
            fill(send, rank, size, round + 2);
            memset(recv, 0x5a, size);
            MPI_Irecv(recv, (int)size, MPI_BYTE, peer, 1000 + (int)s, MPI_COMM_WORLD, &requests[0]);
            MPI_Isend(send, (int)size, MPI_BYTE, peer, 1000 + (int)s, MPI_COMM_WORLD, &requests[1]);
            MPI_Status statuses[2];
            MPI_Waitall(2, requests, statuses);
            expect_count("MPI_Irecv", &statuses[0], size);
            expect("MPI_Isend/MPI_Irecv", recv, peer, size, round + 2);
        }
    }
}

/* Every pair of ranks in turn, so that with ranks on several hosts every
 * pair of hosts is crossed. */
static void point_to_point(unsigned char *send, unsigned char *recv)
{
    for (int a = 0; a < ranks; a++)
        for (int b = a + 1; b < ranks; b++)
            if (rank == a || rank == b)
                exchange_with(rank == a ? b : a, send, recv);
}

static void collectives(unsigned char *send, unsigned char *recv)
{
    /* Bcast of 1 MiB + 3 from every root. */
    size_t size = (1 << 20) + 3;
    for (int root = 0; root < ranks; root++) {
        if (rank == root)
            fill(recv, root, size, 10);
        else
            memset(recv, 0, size);
        MPI_Bcast(recv, (int)size, MPI_BYTE, root, MPI_COMM_WORLD);
        expect("MPI_Bcast", recv, root, size, 10);
    }

    /* Allreduce: element i of rank r is i * (r + 1) + r; the sum is known. */
    int n = 1 << 18;
    int64_t *mine = (int64_t *)send, *sum = (int64_t *)recv;
    for (int i = 0; i < n; i++)
        mine[i] = (int64_t)i * (rank + 1) + rank;
    MPI_Allreduce(mine, sum, n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int64_t factor = (int64_t)ranks * (ranks + 1) / 2, offset = (int64_t)ranks * (ranks - 1) / 2;
    long bad = 0;
    for (int i = 0; i < n; i++)
        bad += sum[i] != (int64_t)i * factor + offset;
    if (bad) {
        fprintf(stderr, "rank %d: MPI_Allreduce: %ld of %d sums wrong\n", rank, bad, n);
        mismatches += bad;
    }

    /* Alltoall: the block for rank d from rank r is pattern(r, block, d). */
    size_t block = 65536 + 5;
    for (int d = 0; d < ranks; d++)
        fill(send + d * block, rank, block, 20 + d);
    memset(recv, 0, block * ranks);
    MPI_Alltoall(send, (int)block, MPI_BYTE, recv, (int)block, MPI_BYTE, MPI_COMM_WORLD);
    for (int r = 0; r < ranks; r++)
        expect("MPI_Alltoall", recv + r * block, r, block, 20 + rank);

    /* Gather to the last rank, scatter from it. */
    int root = ranks - 1;
    fill(send, rank, block, 30);
    memset(recv, 0, block * ranks);
    MPI_Gather(send, (int)block, MPI_BYTE, recv, (int)block, MPI_BYTE, root, MPI_COMM_WORLD);
    if (rank == root)
        for (int r = 0; r < ranks; r++)
            expect("MPI_Gather", recv + r * block, r, block, 30);
    if (rank == root)
        for (int d = 0; d < ranks; d++)
            fill(send + d * block, root, block, 40 + d);
    memset(recv, 0, block);
    MPI_Scatter(send, (int)block, MPI_BYTE, recv, (int)block, MPI_BYTE, root, MPI_COMM_WORLD);
    expect("MPI_Scatter", recv, root, block, 40 + rank);
}

/* Half a round trip of a ping-pong of `size` bytes between ranks 0 and 1,
 * in microseconds. */
static double ping_pong(unsigned char *send, unsigned char *recv, size_t size, int iterations)
{
    int peer = 1 - rank;
    double start = 0;
    for (int i = -iterations / 20 - 1; i < iterations; i++) {
        if (i == 0)
            start = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(send, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(recv, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(recv, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(send, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - start) * 1e6 / iterations / 2;
}

/* 8 B half-round-trip latency, 1 MiB ping-pong bandwidth (the message over
 * half a round trip) and 1 MiB streaming bandwidth (a window of
 * nonblocking sends, then a reply), between ranks 0 and 1. */
static void figures(unsigned char *send, unsigned char *recv)
{
    int peer = 1 - rank;
    int iterations = 5000;
    double latency = 0, ping_pong_bandwidth = 0, bandwidth = 0;
    if (rank <= 1) {
        latency = ping_pong(send, recv, 8, iterations);
        ping_pong_bandwidth = (double)(1 << 20) / ping_pong(send, recv, 1 << 20, 200);

        enum { WINDOW = 16 };
        size_t size = 1 << 20;
        int rounds = 20;
        MPI_Request requests[WINDOW];
        for (int r = -2; r < rounds; r++) {
            if (r == 0)
                bandwidth = MPI_Wtime();
            for (int w = 0; w < WINDOW; w++) {
                if (rank == 0)
                    MPI_Isend(send, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &requests[w]);
                else
                    MPI_Irecv(recv + (w % 2) * size, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &requests[w]);
            }
            MPI_Waitall(WINDOW, requests, MPI_STATUSES_IGNORE);
            if (rank == 0)
                MPI_Recv(recv, 4, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else
                MPI_Send(send, 4, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
        }
        bandwidth = (double)size * WINDOW * rounds / (MPI_Wtime() - bandwidth) / 1e6;
    }
    if (rank == 0)
        printf("FIGURES: latency 8 B %.2f us (half round trip, %d iterations), ping-pong 1 MiB %.1f MB/s, "
               "bandwidth 1 MiB %.1f MB/s\n",
               latency, iterations, ping_pong_bandwidth, bandwidth);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks < 2) {
        if (rank == 0)
            fprintf(stderr, "check: needs at least 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    /* 4 MiB for point-to-point, the largest; an alltoall block per rank. */
    size_t biggest = (size_t)4 << 20;
    if ((size_t)(65536 + 5) * ranks > biggest)
        biggest = (size_t)(65536 + 5) * ranks;
    unsigned char *send = malloc(biggest), *recv = malloc(2 * biggest);
    if (!send || !recv) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(send, 0, biggest);

    int status = 0;
    if (argc > 1 && strcmp(argv[1], "figures") == 0) {
        figures(send, recv);
    } else {
        point_to_point(send, recv);
        collectives(send, recv);
        long total = 0;
        MPI_Allreduce(&mismatches, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0) {
            if (total == 0)
                printf("PASS: %d ranks; point-to-point between every pair, 0 B to 4 MiB (%zu sizes, both directions, blocking and "
                       "nonblocking); bcast, allreduce, alltoall, gather, scatter; every byte checked\n",
                       ranks, NSIZES);
            else
                printf("FAIL: %ld bytes or elements wrong (see the ranks' messages)\n", total);
        }
        status = total != 0;
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return status;
}
