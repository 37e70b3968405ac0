/*
 * libmrcache_pmpi: requests.
 *
 * MPI_Request -> the leases it holds; the Start, Wait and Test wrappers
 * that complete them.
 * Part of recorder/pmpi_shim.c, which includes it (one translation unit:
 * the recorder's state is static).
 */

/* ------------------------------------------------------------------------ */
/* Requests: MPI_Request -> the leases it holds (and, if persistent, its buffer) */

#define RQ_CAP (1u << 16)
typedef struct {
    MPI_Request key; /* NULL: empty slot */
    lr_t leases;     /* held while the request is active */
    int persistent;
    const void *buf;
    int count;
    MPI_Datatype type; /* a dup of the user's type (or a named type) */
    const char *acc;
} rq_t;
static rq_t g_rq[RQ_CAP];
static unsigned g_nrq;

static unsigned rq_hash(MPI_Request k) {
    uint64_t x = (uint64_t)(uintptr_t)k;
    x ^= x >> 29;
    x *= 0x9e3779b97f4a7c15ull;
    return (unsigned)(x >> 40) & (RQ_CAP - 1);
}
static rq_t *rq_find(MPI_Request k) {
    if (!g_nrq) return NULL;
    for (unsigned i = rq_hash(k), n = 0; n < RQ_CAP; i = (i + 1) & (RQ_CAP - 1), n++) {
        if (g_rq[i].key == k) return &g_rq[i];
        if (!g_rq[i].key) return NULL;
    }
    return NULL;
}
static void rq_delete(rq_t *e) {
    /* backward-shift deletion for linear probing */
    unsigned i = (unsigned)(e - g_rq);
    g_rq[i].key = NULL;
    g_nrq--;
    for (unsigned j = (i + 1) & (RQ_CAP - 1), n = 0; n < RQ_CAP; j = (j + 1) & (RQ_CAP - 1), n++) {
        if (!g_rq[j].key) break;
        unsigned h = rq_hash(g_rq[j].key);
        /* can the entry at j move to i? yes if h is cyclically outside (i, j] */
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            g_rq[i] = g_rq[j];
            g_rq[j].key = NULL;
            i = j;
        }
    }
}
/* Inserts or replaces; returns NULL when the table is full. Lock held. */
static rq_t *rq_insert(MPI_Request k, uint64_t t) {
    rq_t *e = rq_find(k);
    if (e) {
        /* A handle reused without us seeing its completion: close the old leases. */
        release_locked(e->leases, t);
        if (e->persistent && e->type != MPI_DATATYPE_NULL && !is_named(e->type)) PMPI_Type_free(&e->type);
        memset(e, 0, sizeof *e);
        e->key = k;
        return e;
    }
    if (g_nrq + 1 >= RQ_CAP * 3 / 4) return NULL;
    for (unsigned i = rq_hash(k), n = 0; n < RQ_CAP; i = (i + 1) & (RQ_CAP - 1), n++) {
        if (!g_rq[i].key) {
            memset(&g_rq[i], 0, sizeof g_rq[i]);
            g_rq[i].key = k;
            g_nrq++;
            return &g_rq[i];
        }
    }
    return NULL;
}

/* After a nonblocking call: the request holds the leases until it completes. */
static void track(int rc, const MPI_Request *req, lr_t r) {
    if (r.n == 0) return;
    if (rc != MPI_SUCCESS || !req || *req == MPI_REQUEST_NULL) { release_lr(r); return; }
    int saved = errno;
    uint64_t t = now_ns();
    t_guard = 1;
    lock();
    rq_t *e = rq_insert(*req, t);
    if (e) e->leases = r;
    else { g_req_overflow++; if (atomic_load(&g_recording)) release_locked(r, t); }
    unlock();
    t_guard = 0;
    errno = saved;
}

/* A request completed (or was freed): its leases go. */
static void complete_locked(MPI_Request k, int freed, uint64_t t) {
    rq_t *e = rq_find(k);
    if (!e) return;
    if (atomic_load(&g_recording)) release_locked(e->leases, t);
    e->leases = LR_NONE;
    if (!e->persistent || freed) {
        if (e->persistent && e->type != MPI_DATATYPE_NULL && !is_named(e->type)) PMPI_Type_free(&e->type);
        rq_delete(e);
    }
}
static void complete1(MPI_Request k, int freed) {
    if (k == MPI_REQUEST_NULL || !g_nrq) return;
    int saved = errno;
    uint64_t t = now_ns();
    int g = t_guard;
    t_guard = 1;
    lock();
    complete_locked(k, freed, t);
    unlock();
    t_guard = g;
    errno = saved;
}

/* Persistent requests remember their buffer; MPI_Start acquires it. */
static void persist(int rc, const MPI_Request *req, const void *buf, int count, MPI_Datatype dt, const char *acc,
                    int peer) {
    if (rc != MPI_SUCCESS || !req || *req == MPI_REQUEST_NULL || !active()) return;
    if (peer == MPI_PROC_NULL || count <= 0) return;
    int saved = errno;
    uint64_t t = now_ns();
    t_guard = 1;
    MPI_Datatype mine = dt;
    if (!is_named(dt) && PMPI_Type_dup(dt, &mine) != MPI_SUCCESS) mine = MPI_DATATYPE_NULL;
    lock();
    rq_t *e = rq_insert(*req, t);
    if (e) {
        e->persistent = 1;
        e->buf = buf;
        e->count = count;
        e->type = mine;
        e->acc = acc;
    } else {
        g_req_overflow++;
    }
    unlock();
    if (!e && mine != dt && mine != MPI_DATATYPE_NULL) PMPI_Type_free(&mine);
    t_guard = 0;
    errno = saved;
}

static void start1(MPI_Request k) {
    if (!call_begin()) return;
    rq_t *e = rq_find(k);
    if (e && e->persistent && e->type != MPI_DATATYPE_NULL) {
        release_locked(e->leases, g_call_t);
        uint64_t first = g_next_lease;
        call_buf(e->buf, e->count, e->type, e->acc);
        e->leases.first = first;
        e->leases.n = (uint32_t)(g_next_lease - first);
    }
    call_end();
}

/* Copies request handles before a Wait/Test-family call overwrites them. */
#define KEYS_STACK 256
typedef struct { MPI_Request *k; MPI_Request stack[KEYS_STACK]; int n; } keys_t;
static void keys_save(keys_t *ks, int count, const MPI_Request *reqs) {
    ks->n = 0;
    ks->k = ks->stack;
    if (count <= 0 || !reqs || !g_nrq || !atomic_load(&g_recording)) return;
    if (count > KEYS_STACK) {
        ks->k = __libc_malloc(sizeof(MPI_Request) * (size_t)count);
        if (!ks->k) { ks->k = ks->stack; return; }
    }
    memcpy(ks->k, reqs, sizeof(MPI_Request) * (size_t)count);
    ks->n = count;
}
static void keys_done(keys_t *ks) {
    if (ks->k != ks->stack) __libc_free(ks->k);
}
static void keys_complete(keys_t *ks, int idx) {
    if (idx >= 0 && idx < ks->n) complete1(ks->k[idx], 0);
}

/* ------------------------------------------------------------------------ */

/* Persistent starts, completion */

MRC_EXPORT int MPI_Start(MPI_Request *req) {
    int _rc;
    if (req && g_nrq) start1(*req);
    IN_MPI(PMPI_Start(req));
    return _rc;
}

MRC_EXPORT int MPI_Startall(int count, MPI_Request reqs[]) {
    int _rc;
    if (reqs && g_nrq)
        for (int i = 0; i < count; i++) start1(reqs[i]);
    IN_MPI(PMPI_Startall(count, reqs));
    return _rc;
}

MRC_EXPORT int MPI_Wait(MPI_Request *req, MPI_Status *st) {
    int _rc;
    MPI_Request k = req ? *req : MPI_REQUEST_NULL;
    IN_MPI(PMPI_Wait(req, st));
    complete1(k, 0);
    return _rc;
}

MRC_EXPORT int MPI_Test(MPI_Request *req, int *flag, MPI_Status *st) {
    int _rc;
    MPI_Request k = req ? *req : MPI_REQUEST_NULL;
    IN_MPI(PMPI_Test(req, flag, st));
    if (_rc == MPI_SUCCESS && flag && *flag) complete1(k, 0);
    return _rc;
}

MRC_EXPORT int MPI_Waitall(int count, MPI_Request reqs[], MPI_Status sts[]) {
    int _rc;
    keys_t ks;
    keys_save(&ks, count, reqs);
    IN_MPI(PMPI_Waitall(count, reqs, sts));
    for (int i = 0; i < ks.n; i++) keys_complete(&ks, i);
    keys_done(&ks);
    return _rc;
}

MRC_EXPORT int MPI_Testall(int count, MPI_Request reqs[], int *flag, MPI_Status sts[]) {
    int _rc;
    keys_t ks;
    keys_save(&ks, count, reqs);
    IN_MPI(PMPI_Testall(count, reqs, flag, sts));
    if (_rc == MPI_SUCCESS && flag && *flag)
        for (int i = 0; i < ks.n; i++) keys_complete(&ks, i);
    keys_done(&ks);
    return _rc;
}

MRC_EXPORT int MPI_Waitany(int count, MPI_Request reqs[], int *index, MPI_Status *st) {
    int _rc;
    keys_t ks;
    keys_save(&ks, count, reqs);
    IN_MPI(PMPI_Waitany(count, reqs, index, st));
    if (index && *index != MPI_UNDEFINED) keys_complete(&ks, *index);
    keys_done(&ks);
    return _rc;
}

MRC_EXPORT int MPI_Testany(int count, MPI_Request reqs[], int *index, int *flag, MPI_Status *st) {
    int _rc;
    keys_t ks;
    keys_save(&ks, count, reqs);
    IN_MPI(PMPI_Testany(count, reqs, index, flag, st));
    if (_rc == MPI_SUCCESS && flag && *flag && index && *index != MPI_UNDEFINED) keys_complete(&ks, *index);
    keys_done(&ks);
    return _rc;
}

/* Waitsome and Testsome: complete the requests the call lists. */
#define SOME_LIKE(NAME)                                                                                        \
    MRC_EXPORT int MPI_##NAME(int incount, MPI_Request reqs[], int *outcount, int indices[], MPI_Status sts[]) { \
        int _rc;                                                                                               \
        keys_t ks;                                                                                             \
        keys_save(&ks, incount, reqs);                                                                         \
        IN_MPI(PMPI_##NAME(incount, reqs, outcount, indices, sts));                                            \
        if (outcount && *outcount != MPI_UNDEFINED && indices)                                                 \
            for (int i = 0; i < *outcount; i++) keys_complete(&ks, indices[i]);                                \
        keys_done(&ks);                                                                                        \
        return _rc;                                                                                            \
    }
SOME_LIKE(Waitsome)
SOME_LIKE(Testsome)

/* A freed active request keeps running in the background; the recorder
 * releases its buffers at the free (the latest point it can see). */
MRC_EXPORT int MPI_Request_free(MPI_Request *req) {
    int _rc;
    MPI_Request k = req ? *req : MPI_REQUEST_NULL;
    IN_MPI(PMPI_Request_free(req));
    complete1(k, 1);
    return _rc;
}
