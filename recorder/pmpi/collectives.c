/*
 * libmrcache_pmpi: collectives.
 *
 * Each collective and its nonblocking twin, from one signature.
 * Part of recorder/pmpi_shim.c, which includes it (one translation unit:
 * the recorder's state is static).
 */

/* Collectives */

static void comm_info(MPI_Comm comm, int *size, int *rank, int *inter) {
    *size = 0;
    *rank = -1;
    *inter = 0;
    if (comm == MPI_COMM_NULL) return;
    PMPI_Comm_test_inter(comm, inter);
    if (*inter) {
        PMPI_Comm_remote_size(comm, size);
    } else {
        PMPI_Comm_size(comm, size);
        PMPI_Comm_rank(comm, rank);
    }
}
static MPI_Aint extent_of(MPI_Datatype dt) {
    MPI_Aint lb = 0, ext = 0;
    if (dt != MPI_DATATYPE_NULL) PMPI_Type_get_extent(dt, &lb, &ext);
    return ext;
}
/* Per-peer segments of a v-variant buffer (displacements in extents); the
 * segment for the caller itself is a local copy, never registered. */
static void call_peers_v(const void *buf, const int counts[], const int displs[], MPI_Datatype dt, const char *acc,
                         int size, int self) {
    if (!g_in_call || !buf || buf == MPI_IN_PLACE || !counts || !displs) return;
    MPI_Aint ext = extent_of(dt);
    for (int j = 0; j < size; j++)
        if (j != self && counts[j] > 0) call_buf((const char *)buf + (MPI_Aint)displs[j] * ext, counts[j], dt, acc);
}
/* w-variants: displacements in bytes, one type per peer. */
static void call_peers_w(const void *buf, const int counts[], const int displs[], const MPI_Datatype types[],
                         const char *acc, int size, int self) {
    if (!g_in_call || !buf || buf == MPI_IN_PLACE || !counts || !displs || !types) return;
    for (int j = 0; j < size; j++)
        if (j != self && counts[j] > 0) call_buf((const char *)buf + displs[j], counts[j], types[j], acc);
}
static int is_root(MPI_Comm comm, int root) {
    int size, rank, inter;
    comm_info(comm, &size, &rank, &inter);
    return inter ? root == MPI_ROOT : rank == root;
}
static int is_nonroot(MPI_Comm comm, int root) {
    int size, rank, inter;
    comm_info(comm, &size, &rank, &inter);
    return inter ? root >= 0 : rank != root;
}

/* One collective and its nonblocking twin from one signature: PARAMS and ARGS
 * are the blocking call's parameters and arguments, parenthesised and without
 * the request; KIND_BODY names the buffers it acquires. */
#define UNPAREN(...) __VA_ARGS__
#define COLLECTIVE(NAME, INAME, KIND, PARAMS, ARGS)                                        \
    MRC_EXPORT int MPI_##NAME(UNPAREN PARAMS) {                                            \
        int _rc;                                                                           \
        BLOCKING(PMPI_##NAME(UNPAREN ARGS), KIND##_BODY);                                  \
        return _rc;                                                                        \
    }                                                                                      \
    MRC_EXPORT int MPI_##INAME(UNPAREN PARAMS, MPI_Request *req) {                         \
        int _rc;                                                                           \
        NONBLOCKING(PMPI_##INAME(UNPAREN ARGS, req), req, KIND##_BODY);                    \
        return _rc;                                                                        \
    }

/* What most bodies start with: the peers (size; rank, -1 on an
 * intercommunicator) and, for rooted collectives, whether this is the root. */
#define PEERS                  \
    int size, rank, inter;     \
    comm_info(comm, &size, &rank, &inter)
#define ROOTED PEERS; int root_ = is_root(comm, root)

/* Bcast */
#define BCAST_BODY                                                                  \
    if (is_root(comm, root)) call_buf(buf, count, dt, ACC_SEND);                    \
    else if (is_nonroot(comm, root)) call_buf(buf, count, dt, ACC_RECV)
COLLECTIVE(Bcast, Ibcast, BCAST,
           (void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm),
           (buf, count, dt, root, comm))

/* Reduce */
#define REDUCE_BODY                                                                            \
    if (is_root(comm, root)) {                                                                 \
        call_buf(sbuf, count, dt, ACC_SEND);                                                   \
        call_buf(rbuf, count, dt, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV);                  \
    } else if (is_nonroot(comm, root)) {                                                       \
        call_buf(sbuf, count, dt, ACC_SEND);                                                   \
    }
COLLECTIVE(Reduce, Ireduce, REDUCE,
           (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, int root, MPI_Comm comm),
           (sbuf, rbuf, count, dt, op, root, comm))

/* Allreduce, Scan, Exscan */
#define ALLRED_BODY                                                      \
    call_buf(sbuf, count, dt, ACC_SEND);                                 \
    call_buf(rbuf, count, dt, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
#define ALLRED_PARAMS (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm)
#define ALLRED_ARGS (sbuf, rbuf, count, dt, op, comm)
COLLECTIVE(Allreduce, Iallreduce, ALLRED, ALLRED_PARAMS, ALLRED_ARGS)
COLLECTIVE(Scan, Iscan, ALLRED, ALLRED_PARAMS, ALLRED_ARGS)
COLLECTIVE(Exscan, Iexscan, ALLRED, ALLRED_PARAMS, ALLRED_ARGS)

/* Reduce_scatter_block: sbuf holds size*rcount elements */
#define RSB_BODY                                                             \
    PEERS;                                                                                       \
    call_buf(sbuf, (MPI_Aint)rcount * size, dt, ACC_SEND);                   \
    call_buf(rbuf, rcount, dt, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
COLLECTIVE(Reduce_scatter_block, Ireduce_scatter_block, RSB,
           (const void *sbuf, void *rbuf, int rcount, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
           (sbuf, rbuf, rcount, dt, op, comm))

/* Reduce_scatter: sbuf holds sum(rcounts) elements */
#define RS_BODY                                                                         \
    PEERS;                                                                                       \
    MPI_Aint total = 0;                                                                 \
    for (int j = 0; j < size && rcounts; j++) total += rcounts[j];                      \
    call_buf(sbuf, total, dt, ACC_SEND);                                                \
    if (rank >= 0 && rcounts)                                                           \
        call_buf(rbuf, rcounts[rank], dt, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
COLLECTIVE(Reduce_scatter, Ireduce_scatter, RS,
           (const void *sbuf, void *rbuf, const int rcounts[], MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
           (sbuf, rbuf, rcounts, dt, op, comm))

/* The signature Gather and Scatter share, and (without the root) Allgather
 * and Alltoall. */
#define ROOTED_PARAMS \
    (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount, MPI_Datatype rtype, int root, MPI_Comm comm)
#define ROOTED_ARGS (sbuf, scount, stype, rbuf, rcount, rtype, root, comm)
#define ALL_PARAMS \
    (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm)
#define ALL_ARGS (sbuf, scount, stype, rbuf, rcount, rtype, comm)

/* Gather / Gatherv */
#define GATHER_BODY                                                                              \
    ROOTED;                                                                                      \
    if (!(inter && root_)) call_buf(sbuf, scount, stype, ACC_SEND);                              \
    if (root_) call_buf(rbuf, (MPI_Aint)rcount * size, rtype, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
COLLECTIVE(Gather, Igather, GATHER, ROOTED_PARAMS, ROOTED_ARGS)
#define GATHERV_BODY                                                                             \
    ROOTED;                                                                                      \
    if (!(inter && root_)) call_buf(sbuf, scount, stype, ACC_SEND);                              \
    if (root_) call_peers_v(rbuf, rcounts, displs, rtype, ACC_RECV, size, rank)
COLLECTIVE(Gatherv, Igatherv, GATHERV,
           (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[], const int displs[], MPI_Datatype rtype, int root, MPI_Comm comm),
           (sbuf, scount, stype, rbuf, rcounts, displs, rtype, root, comm))

/* Scatter / Scatterv */
#define SCATTER_BODY                                                                             \
    ROOTED;                                                                                      \
    if (root_) call_buf(sbuf, (MPI_Aint)scount * size, stype, ACC_SEND);                         \
    if (!(inter && root_)) call_buf(rbuf, rcount, rtype, ACC_RECV)
COLLECTIVE(Scatter, Iscatter, SCATTER, ROOTED_PARAMS, ROOTED_ARGS)
#define SCATTERV_BODY                                                                            \
    ROOTED;                                                                                      \
    if (root_) call_peers_v(sbuf, scounts, displs, stype, ACC_SEND, size, rank);                 \
    if (!(inter && root_)) call_buf(rbuf, rcount, rtype, ACC_RECV)
COLLECTIVE(Scatterv, Iscatterv, SCATTERV,
           (const void *sbuf, const int scounts[], const int displs[], MPI_Datatype stype, void *rbuf, int rcount, MPI_Datatype rtype, int root, MPI_Comm comm),
           (sbuf, scounts, displs, stype, rbuf, rcount, rtype, root, comm))

/* Allgather / Allgatherv */
#define ALLGATHER_BODY                                                                           \
    PEERS;                                                                                       \
    call_buf(sbuf, scount, stype, ACC_SEND);                                                     \
    call_buf(rbuf, (MPI_Aint)rcount * size, rtype, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
COLLECTIVE(Allgather, Iallgather, ALLGATHER, ALL_PARAMS, ALL_ARGS)
#define ALLGATHERV_BODY                                                                          \
    PEERS;                                                                                       \
    call_buf(sbuf, scount, stype, ACC_SEND);                                                     \
    call_peers_v(rbuf, rcounts, displs, rtype, ACC_RECV, size, rank)
COLLECTIVE(Allgatherv, Iallgatherv, ALLGATHERV,
           (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[], const int displs[], MPI_Datatype rtype, MPI_Comm comm),
           (sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm))

/* Alltoall / Alltoallv / Alltoallw */
#define ALLTOALL_BODY                                                                            \
    PEERS;                                                                                       \
    call_buf(sbuf, (MPI_Aint)scount * size, stype, ACC_SEND);                                    \
    call_buf(rbuf, (MPI_Aint)rcount * size, rtype, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
COLLECTIVE(Alltoall, Ialltoall, ALLTOALL, ALL_PARAMS, ALL_ARGS)
#define ALLTOALLV_BODY                                                                           \
    PEERS;                                                                                       \
    call_peers_v(sbuf, scounts, sdispls, stype, ACC_SEND, size, rank);                           \
    call_peers_v(rbuf, rcounts, rdispls, rtype, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV, size, rank)
COLLECTIVE(Alltoallv, Ialltoallv, ALLTOALLV,
           (const void *sbuf, const int scounts[], const int sdispls[], MPI_Datatype stype, void *rbuf, const int rcounts[], const int rdispls[], MPI_Datatype rtype, MPI_Comm comm),
           (sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm))
#define ALLTOALLW_BODY                                                                           \
    PEERS;                                                                                       \
    call_peers_w(sbuf, scounts, sdispls, stypes, ACC_SEND, size, rank);                          \
    call_peers_w(rbuf, rcounts, rdispls, rtypes, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV, size, rank)
COLLECTIVE(Alltoallw, Ialltoallw, ALLTOALLW,
           (const void *sbuf, const int scounts[], const int sdispls[], const MPI_Datatype stypes[], void *rbuf, const int rcounts[], const int rdispls[], const MPI_Datatype rtypes[], MPI_Comm comm),
           (sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm))
