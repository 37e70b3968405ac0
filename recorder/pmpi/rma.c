/*
 * libmrcache_pmpi: RMA.
 *
 * Windows, MPI_Alloc_mem, and the RMA wrappers: origin buffers are
 * released at the window synchronisation that completes them.
 * Part of recorder/pmpi_shim.c, which includes it (one translation unit:
 * the recorder's state is static).
 */

/* RMA windows, MPI_Alloc_mem                                                 */

#define WIN_CAP 64
#define WIN_ATTACH 64
#define WIN_PENDING 256
typedef struct {
    MPI_Win key;
    lr_t mem;
    int nattach;
    struct { uintptr_t base; lr_t l; } att[WIN_ATTACH];
    int npend;
    lr_t pend[WIN_PENDING];
} win_t;
static win_t g_win[WIN_CAP];

static win_t *win_find(MPI_Win w) {
    for (int i = 0; i < WIN_CAP; i++)
        if (g_win[i].key == w) return &g_win[i];
    return NULL;
}
static void win_new(int rc, MPI_Win w, lr_t mem) {
    if (rc != MPI_SUCCESS) { release_lr(mem); return; }
    if (!active()) return;
    int saved = errno;
    t_guard = 1;
    lock();
    win_t *e = NULL;
    for (int i = 0; i < WIN_CAP; i++)
        if (!g_win[i].key) { e = &g_win[i]; break; }
    if (e) {
        memset(e, 0, sizeof *e);
        e->key = w;
        e->mem = mem;
    } else {
        g_win_overflow++;
    }
    unlock();
    t_guard = 0;
    errno = saved;
    if (!e) release_lr(mem);
}
/* An RMA operation's origin buffers stay in use until the window syncs. */
static void win_pending(MPI_Win w, int rc, lr_t r) {
    if (r.n == 0) return;
    if (rc != MPI_SUCCESS) { release_lr(r); return; }
    int saved = errno;
    t_guard = 1;
    lock();
    win_t *e = win_find(w);
    int ok = e && e->npend < WIN_PENDING;
    if (ok) e->pend[e->npend++] = r;
    unlock();
    t_guard = 0;
    errno = saved;
    if (!ok) { g_win_overflow++; release_lr(r); }
}
static void win_sync(MPI_Win w) {
    if (!g_recording) return;
    int saved = errno;
    uint64_t t = now_ns();
    t_guard = 1;
    lock();
    win_t *e = win_find(w);
    if (e) {
        for (int i = 0; i < e->npend; i++) release_locked(e->pend[i], t);
        e->npend = 0;
    }
    unlock();
    t_guard = 0;
    errno = saved;
}

#define AM_CAP 1024
static struct { uintptr_t base; lr_t l; } g_am[AM_CAP];

/* ------------------------------------------------------------------------ */

/* RMA */

MRC_EXPORT int MPI_Win_create(void *base, MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, MPI_Win *win) {
    int _rc;
    lr_t r = LR_NONE;
    if (call_begin()) {
        call_span(base, (size_t)size, ACC_WIN);
        r = call_end();
    }
    IN_MPI(PMPI_Win_create(base, size, disp_unit, info, comm, win));
    win_new(_rc, _rc == MPI_SUCCESS ? *win : MPI_WIN_NULL, r);
    return _rc;
}

/* Win_allocate and Win_allocate_shared: the window memory the call returns. */
#define WIN_ALLOCATE(NAME)                                                                                     \
    MRC_EXPORT int MPI_##NAME(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void *baseptr,       \
                              MPI_Win *win) {                                                                  \
        int _rc;                                                                                               \
        IN_MPI(PMPI_##NAME(size, disp_unit, info, comm, baseptr, win));                                        \
        lr_t r = LR_NONE;                                                                                      \
        if (_rc == MPI_SUCCESS && call_begin()) {                                                              \
            call_span(*(void **)baseptr, (size_t)size, ACC_WIN);                                               \
            r = call_end();                                                                                    \
        }                                                                                                      \
        win_new(_rc, _rc == MPI_SUCCESS ? *win : MPI_WIN_NULL, r);                                             \
        return _rc;                                                                                            \
    }
WIN_ALLOCATE(Win_allocate)
WIN_ALLOCATE(Win_allocate_shared)

MRC_EXPORT int MPI_Win_create_dynamic(MPI_Info info, MPI_Comm comm, MPI_Win *win) {
    int _rc;
    IN_MPI(PMPI_Win_create_dynamic(info, comm, win));
    win_new(_rc, _rc == MPI_SUCCESS ? *win : MPI_WIN_NULL, LR_NONE);
    return _rc;
}

MRC_EXPORT int MPI_Win_attach(MPI_Win win, void *base, MPI_Aint size) {
    int _rc;
    lr_t r = LR_NONE;
    if (call_begin()) {
        call_span(base, (size_t)size, ACC_WIN);
        r = call_end();
    }
    IN_MPI(PMPI_Win_attach(win, base, size));
    if (_rc != MPI_SUCCESS || r.n == 0) { release_lr(r); return _rc; }
    int ok = 0;
    t_guard = 1;
    lock();
    win_t *e = win_find(win);
    if (e && e->nattach < WIN_ATTACH) {
        e->att[e->nattach].base = (uintptr_t)base;
        e->att[e->nattach].l = r;
        e->nattach++;
        ok = 1;
    }
    unlock();
    t_guard = 0;
    if (!ok) { g_win_overflow++; release_lr(r); }
    return _rc;
}

MRC_EXPORT int MPI_Win_detach(MPI_Win win, const void *base) {
    int _rc;
    IN_MPI(PMPI_Win_detach(win, base));
    if (_rc == MPI_SUCCESS && g_recording) {
        lr_t r = LR_NONE;
        t_guard = 1;
        lock();
        win_t *e = win_find(win);
        for (int i = 0; e && i < e->nattach; i++)
            if (e->att[i].base == (uintptr_t)base) {
                r = e->att[i].l;
                e->att[i] = e->att[--e->nattach];
                break;
            }
        unlock();
        t_guard = 0;
        release_lr(r);
    }
    return _rc;
}

MRC_EXPORT int MPI_Win_free(MPI_Win *win) {
    int _rc;
    MPI_Win w = win ? *win : MPI_WIN_NULL;
    IN_MPI(PMPI_Win_free(win));
    if (_rc == MPI_SUCCESS && g_recording) {
        uint64_t t = now_ns();
        t_guard = 1;
        lock();
        win_t *e = win_find(w);
        if (e && atomic_load(&g_recording)) {
            for (int i = 0; i < e->npend; i++) release_locked(e->pend[i], t);
            for (int i = 0; i < e->nattach; i++) release_locked(e->att[i].l, t);
            release_locked(e->mem, t);
            memset(e, 0, sizeof *e);
        }
        unlock();
        t_guard = 0;
    }
    return _rc;
}

#define RMA_ORIGIN(NAME, PARAMS, ARGS, BODY)            \
    MRC_EXPORT int MPI_##NAME PARAMS {                  \
        int _rc;                                        \
        lr_t r = LR_NONE;                               \
        if (call_begin()) {                             \
            BODY;                                       \
            r = call_end();                             \
        }                                               \
        IN_MPI(PMPI_##NAME ARGS);                       \
        win_pending(win, _rc, r);                       \
        return _rc;                                     \
    }
RMA_ORIGIN(Put,
           (const void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount,
            MPI_Datatype ttype, MPI_Win win),
           (obuf, ocount, otype, trank, tdisp, tcount, ttype, win), call_buf(obuf, ocount, otype, ACC_ORIGIN))
RMA_ORIGIN(Get,
           (void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount, MPI_Datatype ttype,
            MPI_Win win),
           (obuf, ocount, otype, trank, tdisp, tcount, ttype, win), call_buf(obuf, ocount, otype, ACC_RESULT))
RMA_ORIGIN(Accumulate,
           (const void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount,
            MPI_Datatype ttype, MPI_Op op, MPI_Win win),
           (obuf, ocount, otype, trank, tdisp, tcount, ttype, op, win), call_buf(obuf, ocount, otype, ACC_ORIGIN))
RMA_ORIGIN(Get_accumulate,
           (const void *obuf, int ocount, MPI_Datatype otype, void *rbuf, int rcount, MPI_Datatype rtype, int trank,
            MPI_Aint tdisp, int tcount, MPI_Datatype ttype, MPI_Op op, MPI_Win win),
           (obuf, ocount, otype, rbuf, rcount, rtype, trank, tdisp, tcount, ttype, op, win),
           call_buf(obuf, ocount, otype, ACC_ORIGIN);
           call_buf(rbuf, rcount, rtype, ACC_RESULT))
RMA_ORIGIN(Fetch_and_op,
           (const void *obuf, void *rbuf, MPI_Datatype dt, int trank, MPI_Aint tdisp, MPI_Op op, MPI_Win win),
           (obuf, rbuf, dt, trank, tdisp, op, win),
           call_buf(obuf, 1, dt, ACC_ORIGIN);
           call_buf(rbuf, 1, dt, ACC_RESULT))
RMA_ORIGIN(Compare_and_swap,
           (const void *obuf, const void *cbuf, void *rbuf, MPI_Datatype dt, int trank, MPI_Aint tdisp, MPI_Win win),
           (obuf, cbuf, rbuf, dt, trank, tdisp, win),
           call_buf(obuf, 1, dt, ACC_ORIGIN);
           call_buf(cbuf, 1, dt, ACC_ORIGIN);
           call_buf(rbuf, 1, dt, ACC_RESULT))

/* Request-based RMA: complete at Wait/Test. */
MRC_EXPORT int MPI_Rput(const void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount,
                        MPI_Datatype ttype, MPI_Win win, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Rput(obuf, ocount, otype, trank, tdisp, tcount, ttype, win, req), req,
                call_buf(obuf, ocount, otype, ACC_ORIGIN));
    return _rc;
}
MRC_EXPORT int MPI_Rget(void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount,
                        MPI_Datatype ttype, MPI_Win win, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Rget(obuf, ocount, otype, trank, tdisp, tcount, ttype, win, req), req,
                call_buf(obuf, ocount, otype, ACC_RESULT));
    return _rc;
}
MRC_EXPORT int MPI_Raccumulate(const void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp,
                               int tcount, MPI_Datatype ttype, MPI_Op op, MPI_Win win, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Raccumulate(obuf, ocount, otype, trank, tdisp, tcount, ttype, op, win, req), req,
                call_buf(obuf, ocount, otype, ACC_ORIGIN));
    return _rc;
}
MRC_EXPORT int MPI_Rget_accumulate(const void *obuf, int ocount, MPI_Datatype otype, void *rbuf, int rcount,
                                   MPI_Datatype rtype, int trank, MPI_Aint tdisp, int tcount, MPI_Datatype ttype,
                                   MPI_Op op, MPI_Win win, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Rget_accumulate(obuf, ocount, otype, rbuf, rcount, rtype, trank, tdisp, tcount, ttype, op, win,
                                     req),
                req, call_buf(obuf, ocount, otype, ACC_ORIGIN); call_buf(rbuf, rcount, rtype, ACC_RESULT));
    return _rc;
}

/* Synchronisation completes the pending origin buffers. */
#define WIN_SYNC(NAME, PARAMS, ARGS)              \
    MRC_EXPORT int MPI_##NAME PARAMS {            \
        int _rc;                                  \
        IN_MPI(PMPI_##NAME ARGS);                 \
        if (_rc == MPI_SUCCESS) win_sync(win);    \
        return _rc;                               \
    }
WIN_SYNC(Win_fence, (int assert, MPI_Win win), (assert, win))
WIN_SYNC(Win_complete, (MPI_Win win), (win))
WIN_SYNC(Win_unlock, (int rank, MPI_Win win), (rank, win))
WIN_SYNC(Win_unlock_all, (MPI_Win win), (win))
WIN_SYNC(Win_flush, (int rank, MPI_Win win), (rank, win))
WIN_SYNC(Win_flush_all, (MPI_Win win), (win))
WIN_SYNC(Win_flush_local, (int rank, MPI_Win win), (rank, win))
WIN_SYNC(Win_flush_local_all, (MPI_Win win), (win))

/* MPI_Alloc_mem: memory meant for RMA, registered by many transports. */
MRC_EXPORT int MPI_Alloc_mem(MPI_Aint size, MPI_Info info, void *baseptr) {
    int _rc;
    IN_MPI(PMPI_Alloc_mem(size, info, baseptr));
    if (_rc != MPI_SUCCESS || size <= 0 || !call_begin()) return _rc;
    void *base = *(void **)baseptr;
    call_span(base, (size_t)size, ACC_WIN);
    int stored = 0;
    for (int i = 0; i < AM_CAP; i++)
        if (!g_am[i].base) {
            g_am[i].base = (uintptr_t)base;
            g_am[i].l.first = g_call_first;
            g_am[i].l.n = (uint32_t)(g_next_lease - g_call_first);
            stored = 1;
            break;
        }
    lr_t r = call_end();
    if (!stored) { g_win_overflow++; release_lr(r); }
    return _rc;
}

MRC_EXPORT int MPI_Free_mem(void *base) {
    int _rc;
    lr_t r = LR_NONE;
    if (base && g_recording) {
        t_guard = 1;
        lock();
        for (int i = 0; i < AM_CAP; i++)
            if (g_am[i].base == (uintptr_t)base) { r = g_am[i].l; g_am[i].base = 0; break; }
        unlock();
        t_guard = 0;
    }
    release_lr(r); /* before the memory goes: the free follows */
    IN_MPI(PMPI_Free_mem(base));
    return _rc;
}
