/*
 * libmrcache_pmpi: point to point.
 *
 * Sends and receives: blocking ones release at return, nonblocking and
 * persistent ones at the Wait/Test that completes them.
 * Part of recorder/pmpi_shim.c, which includes it (one translation unit:
 * the recorder's state is static).
 */

/* Point to point */

#define SEND_LIKE(NAME)                                                                                    \
    MRC_EXPORT int MPI_##NAME(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm) { \
        int _rc;                                                                                           \
        lr_t r = dest == MPI_PROC_NULL ? LR_NONE : acq1(buf, count, dt, ACC_SEND);                          \
        IN_MPI(PMPI_##NAME(buf, count, dt, dest, tag, comm));                                              \
        release_lr(r);                                                                                     \
        return _rc;                                                                                        \
    }
SEND_LIKE(Send)
SEND_LIKE(Bsend)
SEND_LIKE(Ssend)
SEND_LIKE(Rsend)

#define ISEND_LIKE(NAME)                                                                                  \
    MRC_EXPORT int MPI_##NAME(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm, \
                              MPI_Request *req) {                                                         \
        int _rc;                                                                                          \
        lr_t r = dest == MPI_PROC_NULL ? LR_NONE : acq1(buf, count, dt, ACC_SEND);                         \
        IN_MPI(PMPI_##NAME(buf, count, dt, dest, tag, comm, req));                                        \
        track(_rc, req, r);                                                                               \
        return _rc;                                                                                       \
    }
ISEND_LIKE(Isend)
ISEND_LIKE(Ibsend)
ISEND_LIKE(Issend)
ISEND_LIKE(Irsend)

#define SEND_INIT_LIKE(NAME)                                                                              \
    MRC_EXPORT int MPI_##NAME(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm, \
                              MPI_Request *req) {                                                         \
        int _rc;                                                                                          \
        IN_MPI(PMPI_##NAME(buf, count, dt, dest, tag, comm, req));                                        \
        persist(_rc, req, buf, count, dt, ACC_SEND, dest);                                                \
        return _rc;                                                                                       \
    }
SEND_INIT_LIKE(Send_init)
SEND_INIT_LIKE(Bsend_init)
SEND_INIT_LIKE(Ssend_init)
SEND_INIT_LIKE(Rsend_init)

MRC_EXPORT int MPI_Recv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    int _rc;
    lr_t r = src == MPI_PROC_NULL ? LR_NONE : acq1(buf, count, dt, ACC_RECV);
    IN_MPI(PMPI_Recv(buf, count, dt, src, tag, comm, st));
    release_lr(r);
    return _rc;
}

MRC_EXPORT int MPI_Irecv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    lr_t r = src == MPI_PROC_NULL ? LR_NONE : acq1(buf, count, dt, ACC_RECV);
    IN_MPI(PMPI_Irecv(buf, count, dt, src, tag, comm, req));
    track(_rc, req, r);
    return _rc;
}

MRC_EXPORT int MPI_Recv_init(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,
                             MPI_Request *req) {
    int _rc;
    IN_MPI(PMPI_Recv_init(buf, count, dt, src, tag, comm, req));
    persist(_rc, req, buf, count, dt, ACC_RECV, src);
    return _rc;
}

MRC_EXPORT int MPI_Mrecv(void *buf, int count, MPI_Datatype dt, MPI_Message *msg, MPI_Status *st) {
    int _rc;
    lr_t r = acq1(buf, count, dt, ACC_RECV);
    IN_MPI(PMPI_Mrecv(buf, count, dt, msg, st));
    release_lr(r);
    return _rc;
}

MRC_EXPORT int MPI_Imrecv(void *buf, int count, MPI_Datatype dt, MPI_Message *msg, MPI_Request *req) {
    int _rc;
    lr_t r = acq1(buf, count, dt, ACC_RECV);
    IN_MPI(PMPI_Imrecv(buf, count, dt, msg, req));
    track(_rc, req, r);
    return _rc;
}

MRC_EXPORT int MPI_Sendrecv(const void *sbuf, int scount, MPI_Datatype stype, int dest, int stag, void *rbuf,
                            int rcount, MPI_Datatype rtype, int src, int rtag, MPI_Comm comm, MPI_Status *st) {
    int _rc;
    lr_t r = LR_NONE;
    if (call_begin()) {
        if (dest != MPI_PROC_NULL) call_buf(sbuf, scount, stype, ACC_SEND);
        if (src != MPI_PROC_NULL) call_buf(rbuf, rcount, rtype, ACC_RECV);
        r = call_end();
    }
    IN_MPI(PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm, st));
    release_lr(r);
    return _rc;
}

MRC_EXPORT int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype dt, int dest, int stag, int src, int rtag,
                                    MPI_Comm comm, MPI_Status *st) {
    int _rc;
    lr_t r = (dest == MPI_PROC_NULL && src == MPI_PROC_NULL) ? LR_NONE : acq1(buf, count, dt, ACC_BOTH);
    IN_MPI(PMPI_Sendrecv_replace(buf, count, dt, dest, stag, src, rtag, comm, st));
    release_lr(r);
    return _rc;
}
