/* The recorder's integration test program (tests/record.rs). Prints the
 * addresses it uses so that the test can find them in the trace. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

char *volatile marker;

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int peer = (rank + 1) % size;
    enum { N = 65536 }; /* 256 KiB of int */
    int *sbuf = malloc(N * sizeof(int)), *rbuf = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) sbuf[i] = rank * N + i;

    /* 1. Isend/Irecv/Waitall; a marker allocation between the posts and the wait. */
    MPI_Request reqs[2];
    MPI_Irecv(rbuf, N, MPI_INT, peer, 7, MPI_COMM_WORLD, &reqs[0]);
    MPI_Isend(sbuf, N, MPI_INT, peer, 7, MPI_COMM_WORLD, &reqs[1]);
    marker = malloc(777777);
    marker[0] = 1;
    free((void *)marker);
    MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
    if (rbuf[0] != peer * N) { fprintf(stderr, "bad data\n"); MPI_Abort(MPI_COMM_WORLD, 1); }

    /* 2. Collectives. */
    double x = rank, sum = 0;
    MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    size_t big = 4u << 20; /* served by mmap: its free is a munmap */
    char *b = malloc(big);
    memset(b, rank, big);
    MPI_Bcast(b, (int)big, MPI_CHAR, 0, MPI_COMM_WORLD);

    /* 3. Derived datatypes: a struct of absolute addresses sent from MPI_BOTTOM,
     *    and a 4x4 subarray of an 8x8 array of doubles. */
    double *a1 = malloc(10 * sizeof(double)), *a2 = malloc(20 * sizeof(double));
    MPI_Aint d[2];
    MPI_Get_address(a1, &d[0]);
    MPI_Get_address(a2, &d[1]);
    int bl[2] = {10, 20};
    MPI_Datatype ty[2] = {MPI_DOUBLE, MPI_DOUBLE}, st, sub;
    MPI_Type_create_struct(2, bl, d, ty, &st);
    MPI_Type_commit(&st);
    double recv30[30];
    MPI_Sendrecv(MPI_BOTTOM, 1, st, peer, 8, recv30, 30, MPI_DOUBLE, peer, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    double grid[64], recv16[16];
    int sizes[2] = {8, 8}, subs[2] = {4, 4}, starts[2] = {2, 2};
    MPI_Type_create_subarray(2, sizes, subs, starts, MPI_ORDER_C, MPI_DOUBLE, &sub);
    MPI_Type_commit(&sub);
    MPI_Sendrecv(grid, 1, sub, peer, 9, recv16, 16, MPI_DOUBLE, peer, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Type_free(&st);
    MPI_Type_free(&sub);

    /* 4. Persistent requests, started twice. */
    double psend[512], precv[512];
    MPI_Request preq[2];
    MPI_Send_init(psend, 512, MPI_DOUBLE, peer, 10, MPI_COMM_WORLD, &preq[0]);
    MPI_Recv_init(precv, 512, MPI_DOUBLE, peer, 10, MPI_COMM_WORLD, &preq[1]);
    for (int round = 0; round < 2; round++) {
        MPI_Startall(2, preq);
        MPI_Waitall(2, preq, MPI_STATUSES_IGNORE);
    }
    MPI_Request_free(&preq[0]);
    MPI_Request_free(&preq[1]);

    /* 5. RMA: a window on MPI_Alloc_mem memory, one Put between fences. */
    double *wmem, origin[16];
    MPI_Alloc_mem(65536, MPI_INFO_NULL, &wmem);
    MPI_Win win;
    MPI_Win_create(wmem, 65536, sizeof(double), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    MPI_Win_fence(0, win);
    MPI_Put(origin, 16, MPI_DOUBLE, peer, 0, 16, MPI_DOUBLE, win);
    marker = malloc(555555); /* the Put's origin is in use until the fence */
    marker[0] = 1;
    free((void *)marker);
    MPI_Win_fence(0, win);
    MPI_Win_free(&win);
    MPI_Free_mem(wmem);

    /* 6. An application munmap. */
    void *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(m, 1 << 20);

    printf("ADDR rank=%d sbuf=%p rbuf=%p big=%p a1=%p a2=%p grid=%p mmap=%p x=%p sum=%p psend=%p precv=%p wmem=%p "
           "origin=%p\n",
           rank, (void *)sbuf, (void *)rbuf, (void *)b, (void *)a1, (void *)a2, (void *)grid, m, (void *)&x,
           (void *)&sum, (void *)psend, (void *)precv, (void *)wmem, (void *)origin);
    fflush(stdout);
    free(b);
    free(a1);
    free(a2);
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
